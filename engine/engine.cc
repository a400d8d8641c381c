#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/factory.h"
#include "core/file_cleanup.h"
#include "core/host_facts.h"
#include "core/logging.h"
#include "core/ops.h"
#include "core/safetensors/reader.h"
#include "core/status.h"
#include "engine/agreement.h"
#include "engine/auto_offload_ratio.h"
#include "engine/checkpoint/orchestration.h"
#include "engine/engine_impl.h"
#include "nn/pipeline_stage.h"
#include "pipeline/partition.h"
#include "pipeline/schedule.h"
#include "zero/create_strategy.h"
#include "zero/plan.h"

namespace ze {
namespace engine {
namespace {

using Clock = std::chrono::steady_clock;

// The communicator Initialize uses: the caller's, or one bootstrapped from
// mpirun's environment on the model's kind of device.
absl::StatusOr<std::shared_ptr<comm::Communicator>> CommunicatorFor(
    const nn::LossModel& model,
    std::shared_ptr<comm::Communicator> communicator) {
  if (communicator != nullptr) return communicator;
  comm::CommOptions options;
  options.device = model.device().is_cuda() ? "cuda" : "cpu";
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> created,
                      comm::CreateCommunicator(options));
  return std::shared_ptr<comm::Communicator>(std::move(created));
}

// One line on rank 0 at startup: which strategy runs and where state
// lives, so "what am I running" is never a question (the whole resolved
// config is logged at DEBUG: ZE_LOG_LEVEL=DEBUG).
std::string StartupSummary(const config::Config& config,
                           const comm::Communicator& communicator,
                           DType dtype) {
  const config::ZeroConfig& zero = config.zero_optimization;
  const int world_size = communicator.world_size();
  const zero::StagePolicy policy = zero::PolicyOf(config);
  const char* partitioned =
      policy.partition_parameters  ? "optimizer state, gradients and parameters"
      : policy.partition_gradients ? "optimizer state and gradients"
      : policy.partition_optimizer ? "optimizer state"
                                   : "nothing";
  std::string text = absl::StrFormat(
      "%s: world size %d (%s backend, rank 0 on %s), ZeRO stage %d "
      "(partitioned: %s), %s, batch %d x %d x %d = %d (micro x accumulation x "
      "ranks), reduce_bucket_size %d, allgather_bucket_size %d, overlap_comm "
      "%s",
      config.source, world_size, communicator.backend_name(),
      communicator.device().ToString(), zero.stage, partitioned,
      DTypeName(dtype), config.train_micro_batch_size_per_gpu.value(),
      config.gradient_accumulation_steps.value(), world_size,
      config.train_batch_size.value(), zero.reduce_bucket_size.value(),
      zero.allgather_bucket_size,
      !zero.overlap_comm                ? "off"
      : communicator.device().is_cuda() ? "on (collectives on their own stream)"
                                        : "on (no effect on the CPU)");
  if (policy.partition_parameters) {
    absl::StrAppend(&text, ", stage3_prefetch_bucket_size ",
                    zero.stage3_prefetch_bucket_size.value(),
                    ", stage3_param_persistence_threshold ",
                    zero.stage3_param_persistence_threshold.value());
  }
  const auto device_name = [](config::OffloadDevice device) {
    return device == config::OffloadDevice::kCpu ? "cpu" : "nvme";
  };
  if (zero.offload_optimizer.device != config::OffloadDevice::kNone) {
    absl::StrAppend(&text, ", offload_optimizer ",
                    device_name(zero.offload_optimizer.device), " (ratio ",
                    zero.offload_optimizer.ratio.value(),
                    zero.offload_optimizer.pin_memory ? ", pinned" : "",
                    zero.offload_optimizer.delayed_update ? ", delayed" : "",
                    ")");
  }
  if (zero.offload_param.device != config::OffloadDevice::kNone) {
    absl::StrAppend(&text, ", offload_param ",
                    device_name(zero.offload_param.device));
  }
  return text;
}

}  // namespace

// -------------------------------------------------------------- EngineImpl

bool EngineImpl::IsGradientAccumulationBoundary() const {
  const int64_t accumulation = config_.gradient_accumulation_steps.value();
  return (counters_.micro_steps + 1) % accumulation == 0;
}

double EngineImpl::current_learning_rate() const {
  return training_->learning_rate();
}

double EngineImpl::current_loss_scale() const {
  return training_->loss_scale();
}

absl::StatusOr<float> EngineImpl::Forward(const Tensor& inputs,
                                          const Tensor& targets) {
  // Device memory allocated here belongs to the compute stream
  // (core/allocator.h): freed, it is reused in that stream's order.
  StreamGuard guard(compute_stream_);
  // Its saved activations would be overwritten and the gradient-readiness
  // counts of the owed backward lost.
  ZE_RETURN_IF_ERROR(RequireNoPendingBackward("Forward"));
  ZE_RETURN_IF_ERROR(RequireNoPipeline("Forward"));
  const int64_t micro = config_.train_micro_batch_size_per_gpu.value();
  if (!inputs.defined() || !targets.defined() || inputs.dim() < 1 ||
      targets.dim() < 1 || inputs.size(0) != micro ||
      targets.size(0) != micro) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Engine::Forward on rank ", communicator_->rank(),
        ": inputs and targets must both have train_micro_batch_size_per_gpu=",
        micro, " rows (their first dimension), got ",
        inputs.defined() ? inputs.DebugString() : "undefined", " and ",
        targets.defined() ? targets.DebugString() : "undefined"));
  }
  ZE_ASSIGN_OR_RETURN(Tensor device_inputs, OnModelDevice(inputs));
  ZE_ASSIGN_OR_RETURN(Tensor device_targets, OnModelDevice(targets));
  const Clock::time_point start = Clock::now();
  ZE_RETURN_IF_ERROR(strategy_->BeginForward());
  absl::StatusOr<float> forward =
      model_->ForwardLoss(device_inputs, device_targets, compute_stream_);
  strategy_->EndForward();
  ZE_ASSIGN_OR_RETURN(float loss, std::move(forward));
  loss_sum_ += loss;
  // Token ids count one token each; other inputs count samples.
  monitor_->RecordMicroBatch(inputs.dtype() == DType::kI32 ? inputs.numel()
                                                           : micro);
  ZE_RETURN_IF_ERROR(
      monitor_->EndPhase(StepMonitor::kForward, start, compute_stream_));
  return loss;
}

absl::Status EngineImpl::Backward() {
  StreamGuard guard(compute_stream_);
  ZE_RETURN_IF_ERROR(RequireNoPipeline("Backward"));
  const Clock::time_point start = Clock::now();
  ZE_RETURN_IF_ERROR(
      strategy_->BeginBackward(IsGradientAccumulationBoundary()));
  const double scale =
      training_->loss_scale() / config_.gradient_accumulation_steps.value();
  absl::Status status =
      model_->BackwardLoss(static_cast<float>(scale), compute_stream_);
  absl::Status end = strategy_->EndBackward();
  ZE_RETURN_IF_ERROR(status);
  ZE_RETURN_IF_ERROR(end);
  return monitor_->EndPhase(StepMonitor::kBackward, start, compute_stream_);
}

absl::StatusOr<StepReport> EngineImpl::Step() {
  StreamGuard guard(compute_stream_);
  const bool boundary = IsGradientAccumulationBoundary();
  const int64_t micro = config_.train_micro_batch_size_per_gpu.value();
  counters_.micro_steps += 1;
  counters_.global_samples += micro * communicator_->world_size();
  monitor_->CountMicroStep(communicator_->world_size());
  if (!boundary) return StepReport{};
  const Clock::time_point start = Clock::now();
  const double loss_sum = loss_sum_;
  loss_sum_ = 0;
  ZE_ASSIGN_OR_RETURN(StepReport report, strategy_->BoundaryStep(loss_sum));
  counters_.global_steps += 1;
  if (report.skipped) {
    counters_.skipped_steps += 1;
  }
  switch (report.speculation) {
    case zero::SpeculationOutcome::kCommitted:
      counters_.speculation_committed += 1;
      break;
    case zero::SpeculationOutcome::kRedone:
      counters_.speculation_redone += 1;
      break;
    case zero::SpeculationOutcome::kNotSpeculated:
      counters_.speculation_not_speculated += 1;
      break;
    case zero::SpeculationOutcome::kNone:
      break;
  }
  ZE_RETURN_IF_ERROR(
      monitor_->EndPhase(StepMonitor::kStep, start, compute_stream_));
  // wall_clock_breakdown: this step's collective time (every rank takes it,
  // so each rank's sum stays its own), and the offloaded update's times.
  const config::OffloadOptimizerConfig& offload =
      config_.zero_optimization.offload_optimizer;
  OffloadTotals offload_totals;
  const bool report_offload = monitor_->wall_clock_breakdown() &&
                              offload.device != config::OffloadDevice::kNone;
  if (report_offload) {
    const OffloadTimes times = offload_times();
    const MemoryBreakdown& memory = memory_breakdown();
    offload_totals = {times.updates,
                      times.optimizer_seconds,
                      times.engine_wait_seconds,
                      offload.ratio.value(),
                      memory.host_optimizer_bytes + memory.nvme_optimizer_bytes,
                      offload.device == config::OffloadDevice::kNvme};
  }
  monitor_->ReportStep(report, counters_,
                       monitor_->wall_clock_breakdown()
                           ? communicator_->TakeCommunicationMilliseconds()
                           : 0.0,
                       report_offload ? &offload_totals : nullptr);
  ZE_RETURN_IF_ERROR(CheckFinite(report));
  return report;
}

absl::Status EngineImpl::CheckFinite(const StepReport& report) {
  last_update_nonfinite_ = report.nonfinite && !report.skipped;
  last_nonfinite_loss_ = report.loss;
  if (!report.nonfinite) {
    nonfinite_streak_ = 0;
    return absl::OkStatus();
  }
  // Every rank holds the same all-reduced loss and norm, so every rank
  // counts alike and fails at the same step.
  nonfinite_streak_ += 1;
  const int64_t limit = config_.max_consecutive_nonfinite_steps;
  const std::string what = absl::StrFormat(
      "step %d: the loss (%g) or the gradient norm (%g) is not finite; %s "
      "(%d in a row; training stops at %d, max_consecutive_nonfinite_steps "
      "in %s)",
      counters_.global_steps, report.loss, report.grad_norm,
      report.skipped ? "the update is skipped"
                     : "the offloaded update had already begun and was "
                       "applied",
      nonfinite_streak_, limit, config_.source);
  if (nonfinite_streak_ < limit) {
    ZE_LOG_RANK0(WARNING) << what;
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      what,
      ": the training has diverged or its data is broken; lower the "
      "learning rate, clip gradients (gradient_clipping) or check the "
      "data"));
}

absl::StatusOr<StepReport> EngineImpl::TrainBatch(
    const std::vector<std::pair<Tensor, Tensor>>& micro_batches) {
  const int64_t accumulation = config_.gradient_accumulation_steps.value();
  if (static_cast<int64_t>(micro_batches.size()) != accumulation) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TrainBatch takes gradient_accumulation_steps=", accumulation,
        " micro-batches, got ", micro_batches.size()));
  }
  if (pipeline_ != nullptr) return TrainPipelineBatch(micro_batches);
  StepReport report;
  for (const auto& [tokens, targets] : micro_batches) {
    ZE_RETURN_IF_ERROR(Forward(tokens, targets).status());
    ZE_RETURN_IF_ERROR(Backward());
    ZE_ASSIGN_OR_RETURN(report, Step());
  }
  return report;
}

absl::StatusOr<std::vector<float>> EngineImpl::GatherMasterWeights(
    const std::string& name) {
  StreamGuard guard(compute_stream_);
  return strategy_->GatherMasterWeights(name);
}

absl::StatusOr<Tensor> EngineImpl::OnModelDevice(const Tensor& tensor) {
  if (tensor.device() == model_->device()) return tensor;
  ZE_ASSIGN_OR_RETURN(Tensor copy, Tensor::Empty(tensor.shape(), tensor.dtype(),
                                                 model_->device()));
  ZE_RETURN_IF_ERROR(Copy(tensor, copy, compute_stream_));
  return copy;
}

absl::Status EngineImpl::RequireNoPendingBackward(const char* what) const {
  if (model_->PendingBackwardCalls() == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, " on rank ", communicator_->rank(),
      ": the last Forward has not been backpropagated yet; call Backward "
      "first (its saved activations would be lost)"));
}

absl::StatusOr<std::unique_ptr<GatheredParameters>>
EngineImpl::GatherParameters(const std::vector<std::string>& names,
                             int modifier_rank) {
  StreamGuard guard(compute_stream_);
  ZE_RETURN_IF_ERROR(RequireNoPendingBackward("GatherParameters"));
  const int world = communicator_->world_size();
  if (modifier_rank >= world) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GatherParameters on rank ", communicator_->rank(), ": modifier_rank ",
        modifier_rank, " is not a rank of this job (world size ", world, ")"));
  }
  for (const std::string& name : names) {
    if (!model_->FindParameter(name).ok()) {
      return absl::NotFoundError(
          absl::StrCat("GatherParameters on rank ", communicator_->rank(),
                       ": no parameter named '", name, "'"));
    }
  }
  ZE_RETURN_IF_ERROR(strategy_->GatherScope(names));
  return std::unique_ptr<GatheredParameters>(
      new GatheredParameters(this, names, modifier_rank));
}

absl::Status EngineImpl::ReleaseScope(const std::vector<std::string>& names,
                                      int modifier_rank) {
  StreamGuard guard(compute_stream_);
  return strategy_->ReleaseScope(names, modifier_rank);
}

absl::StatusOr<LoadReport> EngineImpl::LoadWeights(const std::string& path) {
  StreamGuard guard(compute_stream_);
  ZE_RETURN_IF_ERROR(RequireNoPendingBackward("LoadWeights"));
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<safetensors::Reader> reader,
                      safetensors::Reader::Open(path));
  return strategy_->LoadWeights(*reader);
}

absl::StatusOr<LoadReport> EngineImpl::LoadWeights(
    const safetensors::TensorSource& source) {
  StreamGuard guard(compute_stream_);
  ZE_RETURN_IF_ERROR(RequireNoPendingBackward("LoadWeights"));
  return strategy_->LoadWeights(source);
}

GatheredParameters::~GatheredParameters() {
  const absl::Status status = Release();
  if (!status.ok()) {
    ZE_LOG(ERROR) << "GatheredParameters: releasing failed: " << status;
  }
}

absl::Status GatheredParameters::Release() {
  if (released_) return status_;
  released_ = true;
  status_ = engine_->ReleaseScope(names_, modifier_rank_);
  return status_;
}

std::vector<std::string> EngineImpl::ParameterNames() const {
  return strategy_->ParameterNames();
}

NvmeCounters EngineImpl::nvme_counters() const {
  return NvmeCounters{strategy_->nvme_counters()};
}

OffloadTimes EngineImpl::offload_times() const {
  return OffloadTimes{strategy_->offload_times()};
}

CheckpointedState EngineImpl::CheckpointState() {
  CheckpointedState state;
  state.config = &config_;
  state.comm = communicator_.get();
  state.stream = &compute_stream_;
  state.model = model_.get();
  state.strategy = strategy_.get();
  state.training = training_.get();
  state.counters = &counters_;
  state.last_update_nonfinite = last_update_nonfinite_;
  state.last_nonfinite_loss = last_nonfinite_loss_;
  state.host = &host_facts_;
  return state;
}

PipelineCheckpointLayout EngineImpl::PipelineCheckpoint() const {
  PipelineCheckpointLayout layout;
  layout.world = world_.get();
  layout.stage = pipeline_groups_.pipeline->rank();
  layout.stages_per_rank = static_cast<int>(config_.pipeline.stages_per_rank);
  for (const pipeline::LayerRange& range : pipeline_ranges_) {
    layout.layer_ranges.emplace_back(range.first, range.last);
  }
  return layout;
}

absl::Status EngineImpl::SaveCheckpoint(const std::string& directory,
                                        const std::string& tag,
                                        const nlohmann::json& client_state) {
  last_save_report_ = CheckpointSaveReport();
  ZE_RETURN_IF_ERROR(RequireNoPendingBackward("save_checkpoint"));
  if (pipeline_ != nullptr) {
    return engine::SavePipelineCheckpoint(CheckpointState(),
                                          PipelineCheckpoint(), directory, tag,
                                          client_state, &last_save_report_);
  }
  return engine::SaveCheckpoint(CheckpointState(), directory, tag, client_state,
                                &last_save_report_);
}

absl::StatusOr<LoadedCheckpoint> EngineImpl::LoadCheckpoint(
    const std::string& directory, const std::string& tag,
    bool load_optimizer_states) {
  ZE_RETURN_IF_ERROR(RequireNoPendingBackward("load_checkpoint"));
  ZE_ASSIGN_OR_RETURN(LoadedCheckpoint loaded,
                      pipeline_ != nullptr
                          ? engine::LoadPipelineCheckpoint(
                                CheckpointState(), PipelineCheckpoint(),
                                directory, tag, load_optimizer_states)
                          : engine::LoadCheckpoint(CheckpointState(), directory,
                                                   tag, load_optimizer_states));
  // Not checkpointed: a window's summed loss and the throughput window.
  loss_sum_ = 0;
  monitor_->RestartWindow();
  return loaded;
}

CommunicationCounters EngineImpl::communication_counters() const {
  return strategy_->communication_counters();
}

PipelineCounters EngineImpl::pipeline_counters() const {
  PipelineCounters counters;
  if (pipeline_ == nullptr) return counters;
  counters.recomputed_forwards = pipeline_->recomputed_per_step();
  counters.peak_saved_micro_batches = pipeline_->peak_saved_micro_batches();
  const int rank = pipeline_groups_.pipeline->rank();
  counters.activation_bound =
      pipeline::ActivationBound(pipeline_->schedule(), rank);
  counters.times = pipeline_->last_step_times();
  counters.boundary_ms = pipeline_boundary_ms_;
  // The schedule checked at Setup simulates again (microseconds at the
  // sizes that train).
  const absl::StatusOr<pipeline::ScheduleStats> simulated =
      pipeline::SimulateSchedule(pipeline_->schedule());
  if (simulated.ok()) {
    counters.schedule_rank_bubble = simulated->rank_bubble[rank];
    counters.schedule_bubble = simulated->bubble_fraction;
  }
  return counters;
}

EngineImpl::~EngineImpl() {
  if (activation_offload_ == nullptr || model_ == nullptr) return;
  for (nn::Module* module : model_->Modules()) {
    if (module->activation_offload() == activation_offload_) {
      module->set_activation_offload(nullptr);
    }
  }
}

absl::Status EngineImpl::Setup() {
  const config::Config& cfg = config_;
  // What this build cannot run (config/config.h); a loaded config passed
  // the rest of the cross-key rules at load.
  ZE_RETURN_IF_ERROR(config::CheckSupported(cfg));
  const config::TrainingPrecision precision = config::GetTrainingPrecision(cfg);
  const DType wanted = config::PrecisionDType(precision);
  const DType model_dtype = model_->dtype();
  if (model_dtype != wanted) {
    return absl::InvalidArgumentError(absl::StrCat(
        cfg.source, ": the config trains in ", DTypeName(wanted),
        " (fp16.enabled / bf16.enabled) but the model was built with dtype ",
        DTypeName(model_dtype), "; build the model with ", DTypeName(wanted)));
  }
  zero::StrategyContext context;
  context.config = &config_;
  context.comm = communicator_.get();
  context.compute_stream = &compute_stream_;
  context.model = model_.get();
  context.global_steps = &counters_.global_steps;
  if (pipeline_groups_.pipeline != nullptr) {
    // The gradient norm spans the stages; the last stage's copy of a tied
    // table (its gradient made equal to the first stage's at the
    // schedule's reduce) is counted by the first stage only.
    context.pipeline = pipeline_groups_.pipeline.get();
    context.job_rank = world_->rank();
    if (context.pipeline->world_size() > 1 &&
        context.pipeline->rank() == context.pipeline->world_size() - 1) {
      // The last rank's last chunk holds the copy (also interleaved: the
      // last stage is on the last pipeline rank).
      for (nn::PipelineStage* stage : nn::PipelineStagesOf(*model_)) {
        for (nn::Parameter* tied : stage->TiedParameters()) {
          context.gradients_counted_elsewhere.push_back(tied->name());
        }
      }
    }
  }
  // The environment is read here, once, and passed down.
  host_facts_ = ReadProcessHostFacts(communicator_->local_size());
  context.communication_dtype = model_dtype;
  if (cfg.communication_data_type.has_value()) {
    context.communication_dtype =
        config::CommDataTypeDType(*cfg.communication_data_type);
  }
  ZE_ASSIGN_OR_RETURN(
      training_, zero::TrainingState::Create(cfg, communicator_->world_size()));
  context.training = training_.get();
  // The plan is built once, here; the strategy allocates by it. A rank that
  // cannot create its state (no room for it, an NVMe directory it cannot
  // write) stops every rank, not only itself.
  absl::StatusOr<std::unique_ptr<zero::ZeroStrategy>> strategy =
      [&]() -> absl::StatusOr<std::unique_ptr<zero::ZeroStrategy>> {
    ZE_ASSIGN_OR_RETURN(
        plan_, zero::BuildPlan(*model_, cfg, communicator_->world_size(),
                               host_facts_));
    context.plan = &plan_;
    return zero::CreateZeroStrategy(context);
  }();
  ZE_RETURN_IF_ERROR(AgreeAcrossRanks(*communicator_, strategy.status(),
                                      compute_stream_,
                                      "creating the ZeRO partition state"));
  strategy_ = std::move(strategy).value();
  // cpu_checkpointing: checkpointed modules keep their inputs in host
  // memory (nn/activation_offload.h). Set on every module, null included,
  // so a model reused by an engine without the key keeps them on the GPU
  // again.
  activation_offload_ = nullptr;
  if (plan_.activation_ring_slots > 0) {
    nn::ActivationOffloadOptions options;
    options.ring_slots = plan_.activation_ring_slots;
    ZE_ASSIGN_OR_RETURN(activation_offload_, nn::ActivationOffload::Create(
                                                 model_->device(), options));
  }
  for (nn::Module* module : model_->Modules()) {
    module->set_activation_offload(activation_offload_);
  }
  // After the pipeline's setup, which may checkpoint the blocks itself
  // (pipeline.activation_checkpoint_interval).
  if (pipeline_layout_.has_value()) ZE_RETURN_IF_ERROR(SetUpPipeline());
  checkpointed_modules_ = 0;
  for (nn::Module* module : model_->Modules()) {
    if (module->activation_checkpointing()) ++checkpointed_modules_;
  }
  return absl::OkStatus();
}

absl::Status EngineImpl::SetUpPipelineGroups(
    std::shared_ptr<comm::Communicator> world) {
  ZE_ASSIGN_OR_RETURN(
      pipeline::PipelineLayout layout,
      pipeline::PipelineLayout::Create(
          world->world_size(), config_.pipeline.stages, "pipeline.stages"));
  ZE_ASSIGN_OR_RETURN(pipeline_groups_,
                      pipeline::CreatePipelineGroups(*world, layout));
  pipeline_layout_ = layout;
  world_ = std::move(world);
  // The strategy, the batch and the engine's collectives are the stage's
  // data-parallel group's.
  communicator_ = std::shared_ptr<comm::Communicator>(
      std::move(pipeline_groups_.data_parallel));
  return absl::OkStatus();
}

absl::Status EngineImpl::SetUpPipeline() {
  const config::PipelineConfig& pipe = config_.pipeline;
  const pipeline::PipelineLayout& layout = *pipeline_layout_;
  const int rank = pipeline_groups_.pipeline->rank();
  const int ranks = layout.stages;
  const int per_rank = static_cast<int>(pipe.stages_per_rank);
  const std::vector<nn::PipelineStage*> stages = nn::PipelineStagesOf(*model_);
  if (stages.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        config_.source, ": pipeline.stages ", pipe.stages, ": the model (",
        model_->type_name(),
        ") is not a pipeline stage (nn::PipelineStage; GptModel built with "
        "GptOptions::first_layer/last_layer is; with "
        "pipeline.stages_per_rank > 1, an nn::InterleavedStages of them)"));
  }
  if (static_cast<int>(stages.size()) != per_rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        config_.source, ": pipeline.stages_per_rank ", per_rank,
        " but world rank ", world_->rank(), "'s model holds ", stages.size(),
        " stage(s); build each rank's stages ",
        per_rank > 1 ? "(pipeline stages rank + c x pipeline.stages) as one "
                       "nn::InterleavedStages"
                     : "as one model",
        " from pipeline::PartitionLayers"));
  }
  // The model is cut into ranks x per_rank stages; stage s is on pipeline
  // rank s % ranks (pipeline/schedule.h), so chunk c here is stage
  // rank + c * ranks.
  ZE_ASSIGN_OR_RETURN(
      const std::vector<pipeline::LayerRange> ranges,
      pipeline::PartitionLayers(
          stages[0]->PipelineLayerWeights(), ranks * per_rank, pipe.partition,
          per_rank > 1 ? "pipeline.stages x pipeline.stages_per_rank"
                       : "pipeline.stages"));
  pipeline_ranges_ = ranges;
  for (int c = 0; c < per_rank; ++c) {
    const int stage_index = rank + c * ranks;
    const pipeline::LayerRange& mine = ranges[stage_index];
    const nn::PipelineStage& stage = *stages[c];
    if (stage.first_layer() != mine.first || stage.last_layer() != mine.last) {
      return absl::InvalidArgumentError(absl::StrCat(
          config_.source, ": pipeline.partition \"", pipe.partition,
          "\" gives stage ", stage_index, " (world rank ", world_->rank(),
          per_rank > 1 ? absl::StrCat(", its stage ", c) : "",
          ") pipeline layers [", mine.first, ", ", mine.last,
          ") but the model holds [", stage.first_layer(), ", ",
          stage.last_layer(),
          "); build each rank's stage from pipeline::PartitionLayers"));
    }
  }
  if (pipe.activation_checkpoint_interval == 1) {
    for (nn::PipelineStage* stage : stages) {
      for (nn::Module* layer : stage->BlockLayers()) {
        layer->set_activation_checkpointing(true);
      }
    }
  }
  const pipeline::ScheduleKind kind = pipeline::ScheduleKindOf(pipe.schedule);
  ZE_ASSIGN_OR_RETURN(
      pipeline::Schedule schedule,
      pipeline::BuildSchedule(
          kind, ranks,
          static_cast<int>(config_.gradient_accumulation_steps.value()),
          per_rank));
  const double bubble = pipeline::ExpectedBubbleFraction(schedule);
  pipeline::ExecutorContext context;
  context.stages = stages;
  context.strategy = strategy_.get();
  context.pipeline = pipeline_groups_.pipeline.get();
  context.tied = pipeline_groups_.tied.get();
  context.stream = &compute_stream_;
  ZE_ASSIGN_OR_RETURN(pipeline_, pipeline::PipelineExecutor::Create(
                                     context, std::move(schedule)));
  // Every stage's parameters and every rank's model-state memory for the
  // startup line: each rank's plan (its own stages) and its stages'
  // parameter counts all-gathered over its pipeline, in f32 (display only;
  // the collectives carry float types). With one stage per rank the
  // plan's count is the stage's.
  std::vector<float> mine = {static_cast<float>(plan_.memory.device_bytes),
                             static_cast<float>(plan_.memory.host_bytes)};
  for (int c = 0; c < per_rank; ++c) {
    int64_t parameters = plan_.memory.parameter_elements;
    if (per_rank > 1) {
      parameters = 0;
      for (nn::Module* layer : stages[c]->StageLayers()) {
        parameters += layer->NumParameterElements();
      }
    }
    mine.push_back(static_cast<float>(parameters));
  }
  ZE_ASSIGN_OR_RETURN(
      const std::vector<float> all,
      AllGatherFloats(*pipeline_groups_.pipeline, mine, compute_stream_));
  const int row = 2 + per_rank;
  std::vector<pipeline::StageSummary> summaries;
  for (size_t s = 0; s < ranges.size(); ++s) {
    const int holder = static_cast<int>(s) % ranks;
    const int chunk = static_cast<int>(s) / ranks;
    pipeline::StageSummary summary;
    summary.layers = ranges[s];
    summary.rank = holder;
    summary.parameters = all[holder * row + 2 + chunk];
    summary.device_bytes = all[holder * row];
    summary.host_bytes = all[holder * row + 1];
    summaries.push_back(summary);
  }
  if (world_->rank() == 0) {
    ZE_LOG_RANK0(INFO) << "pipeline: " << layout.ToString()
                       << (per_rank > 1 ? absl::StrCat(", ", per_rank,
                                                       " stages per rank")
                                        : "")
                       << ", schedule " << pipeline::ScheduleName(kind)
                       << " over "
                       << config_.gradient_accumulation_steps.value()
                       << " micro-batches (bubble "
                       << absl::StrFormat("%.3f", bubble) << "); "
                       << pipeline::FormatStages(summaries, per_rank);
  }
  return absl::OkStatus();
}

absl::Status EngineImpl::RequireNoPipeline(const char* what) const {
  if (pipeline_ == nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, " on world rank ", world_->rank(),
      ": a pipeline engine (pipeline.stages ", config_.pipeline.stages,
      ") trains through TrainBatch, one step of all its micro-batches"));
}

absl::StatusOr<StepReport> EngineImpl::TrainPipelineBatch(
    const std::vector<std::pair<Tensor, Tensor>>& micro_batches) {
  StreamGuard guard(compute_stream_);
  const int64_t micro = config_.train_micro_batch_size_per_gpu.value();
  std::vector<pipeline::MicroBatch> batches;
  for (const auto& [inputs, targets] : micro_batches) {
    if (!inputs.defined() || !targets.defined() || inputs.dim() < 1 ||
        targets.dim() < 1 || inputs.size(0) != micro ||
        targets.size(0) != micro) {
      return absl::InvalidArgumentError(
          absl::StrCat("Engine::TrainBatch on world rank ", world_->rank(),
                       ": inputs and targets must both have "
                       "train_micro_batch_size_per_gpu=",
                       micro, " rows"));
    }
    pipeline::MicroBatch batch;
    ZE_ASSIGN_OR_RETURN(batch.inputs, OnModelDevice(inputs));
    ZE_ASSIGN_OR_RETURN(batch.targets, OnModelDevice(targets));
    batches.push_back(std::move(batch));
  }
  const double scale =
      training_->loss_scale() / config_.gradient_accumulation_steps.value();
  const Clock::time_point start = Clock::now();
  ZE_ASSIGN_OR_RETURN(const double loss_sum,
                      pipeline_->RunStep(batches, static_cast<float>(scale)));
  ZE_RETURN_IF_ERROR(
      monitor_->EndPhase(StepMonitor::kForward, start, compute_stream_));
  loss_sum_ = loss_sum;
  StepReport report;
  const Clock::time_point boundary = Clock::now();
  for (const pipeline::MicroBatch& batch : batches) {
    monitor_->RecordMicroBatch(
        batch.inputs.dtype() == DType::kI32 ? batch.inputs.numel() : micro);
    ZE_ASSIGN_OR_RETURN(report, Step());
  }
  pipeline_boundary_ms_ =
      std::chrono::duration<double, std::milli>(Clock::now() - boundary)
          .count();
  return report;
}

absl::StatusOr<std::unique_ptr<Engine>> Initialize(
    std::shared_ptr<nn::LossModel> model, const config::Config& config,
    std::shared_ptr<comm::Communicator> communicator) {
  if (model == nullptr) {
    return absl::InvalidArgumentError("engine::Initialize: model is null");
  }
  // The job's files that must not outlive it (NVMe swap files) go on
  // SIGINT/SIGTERM/SIGHUP too; a program's own handlers are kept.
  InstallFileRemovalSignalHandlers();
  ZE_ASSIGN_OR_RETURN(communicator,
                      CommunicatorFor(*model, std::move(communicator)));
  if (config.world_size != communicator->world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.source, ": the config was checked for world size ",
        config.world_size, " but the job has ", communicator->world_size(),
        communicator->world_size() == 1 ? " rank" : " ranks"));
  }
  if (config.HasUnresolvedAuto()) {
    std::string paths;
    for (const std::string& path : config.UnresolvedAutoPaths()) {
      absl::StrAppend(&paths, paths.empty() ? "" : ", ", path);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        config.source,
        ": \"auto\" values must be resolved before training: ", paths));
  }
  // Every collective runs on the communicator's device. A model built on
  // another GPU (every rank on cuda:0, say) would fail at its first
  // collective on some ranks and leave the others waiting in it.
  absl::Status placement = absl::OkStatus();
  if (model->device().is_cuda() && model->device() != communicator->device()) {
    placement = absl::FailedPreconditionError(absl::StrCat(
        "engine::Initialize on rank ", communicator->rank(),
        ": the model is on ", model->device().ToString(),
        " but this rank's communicator uses ",
        communicator->device().ToString(), " (local rank ",
        communicator->local_rank(),
        " of this host takes cuda:(local rank % visible GPUs)); build the "
        "model on communicator->device(), creating the communicator first "
        "(comm::CreateCommunicator, as examples/custom_model does)"));
  }
  ZE_RETURN_IF_ERROR(AgreeAcrossRanks(*communicator, placement,
                                      Stream::Default(communicator->device()),
                                      "checking the model's device"));
  std::unique_ptr<EngineImpl> engine(new EngineImpl());
  engine->config_ = config;
  engine->model_ = std::move(model);
  if (config.pipeline.stages > 1) {
    ZE_RETURN_IF_ERROR(engine->SetUpPipelineGroups(std::move(communicator)));
  } else {
    engine->communicator_ = std::move(communicator);
  }
  // wall_clock_breakdown reports the collectives' time too.
  if (config.wall_clock_breakdown) engine->communicator_->set_timing(true);
  if (engine->model_->device().is_cuda()) {
    ZE_ASSIGN_OR_RETURN(engine->compute_stream_,
                        Stream::Create(engine->model_->device()));
  }
  CsvMonitor csv;
  if (config.csv_monitor.enabled) {
    // Only rank 0 writes; every rank learns whether it could (the config,
    // and so this branch, is the same on every rank).
    absl::StatusOr<CsvMonitor> monitor =
        CsvMonitor::Create(config.csv_monitor, engine->communicator_->rank());
    ZE_RETURN_IF_ERROR(AgreeAcrossRanks(
        *engine->communicator_, monitor.status(), engine->compute_stream_,
        absl::StrCat(config.source, ": csv_monitor")));
    csv = std::move(monitor).value();
  }
  {
    StreamGuard guard(engine->compute_stream_);
    ZE_RETURN_IF_ERROR(engine->Setup());
  }
  // The throughput windows start once the engine is ready.
  engine->monitor_.emplace(config, std::move(csv), engine->model_->device());
  if (engine->communicator_->rank() == 0) {
    ZE_LOG_RANK0(DEBUG) << "config (" << config.source << "):\n"
                        << config::ToJson(config);
    ZE_LOG_RANK0(INFO) << StartupSummary(config, *engine->communicator_,
                                         engine->model_->dtype());
    ZE_LOG_RANK0(INFO) << "ZeRO stage " << config.zero_optimization.stage
                       << ", world size " << engine->communicator_->world_size()
                       << ", " << engine->memory_breakdown().ToString();
    if (const std::optional<std::string> note =
            zero::OffloadBucketsNote(engine->plan_, config);
        note.has_value()) {
      ZE_LOG_RANK0(INFO) << config.source << ": " << *note;
    }
    const zero::UpdateSplit& split = engine->strategy_->update_split();
    if (split.device_elements > 0 || split.rates.link_bytes_per_second > 0) {
      ZE_LOG_RANK0(INFO) << "offload_optimizer: the update split between "
                            "CPU and GPU by a model: "
                         << split.ToString();
    }
    if (engine->activation_offload_ != nullptr) {
      if (engine->checkpointed_modules_ > 0) {
        ZE_LOG_RANK0(INFO)
            << "activation_checkpointing.cpu_checkpointing: the inputs of "
            << engine->checkpointed_modules_
            << " checkpointed modules go to host memory (pinned on a GPU) "
               "after their forward and come back through a ring of "
            << engine->plan_.activation_ring_slots
            << " device buffers, one module ahead";
      } else {
        ZE_LOG_RANK0(WARNING)
            << config.source
            << ": activation_checkpointing.cpu_checkpointing is set but no "
               "module of the model is checkpointed, so nothing is "
               "offloaded; checkpoint the blocks (GptConfig / DecoderConfig "
               "activation_checkpointing, train_gpt "
               "--activation_checkpointing, "
               "Module::set_activation_checkpointing)";
      }
    }
    // A DeepSpeed user must not believe a setting took effect when it did
    // not (ZeRO++ quantization, activation_checkpointing, ignored keys, ...),
    // nor miss that a spelling is deprecated.
    for (const config::ConfigWarning& warning :
         config::ConfigWarnings(config)) {
      ZE_LOG_RANK0(WARNING)
          << config.source << ": " << warning.key << " " << warning.message;
    }
  }
  return std::unique_ptr<Engine>(new Engine(std::move(engine)));
}

absl::StatusOr<config::Config> ResolveConfig(
    const config::Config& loaded, nn::LossModel& model,
    comm::Communicator& communicator, const config::ResolutionContext& hints,
    AutoOffloadRatio* auto_ratio) {
  const int world = communicator.world_size();
  // What the model and the job tell, unless the caller's hints say.
  config::ResolutionContext context = hints;
  context.world_size = world;
  if (!context.hidden_size.has_value() && model.hidden_size() > 0) {
    context.hidden_size = model.hidden_size();
  }
  if (!context.precision.has_value()) {
    context.precision = config::PrecisionOfDType(model.dtype());
  }
  if (loaded.zero_optimization.offload_optimizer.ratio.is_auto() &&
      !context.offload_optimizer_ratio.has_value()) {
    if (!context.activation_bytes.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          loaded.source,
          ": zero_optimization.offload_optimizer.ratio is \"auto\" but "
          "ResolutionContext::activation_bytes was not given: the engine "
          "keeps on the GPU what fits beside one micro-batch's "
          "activations, so it needs their size (train_gpt and train_bench "
          "pass zero::EstimateActivations'; or give "
          "ResolutionContext::offload_optimizer_ratio, or a number)"));
    }
    // Every other value resolved first: the plans the choice compares
    // need them (the ratio's own is replaced for each).
    config::ResolutionContext any_ratio = context;
    any_ratio.offload_optimizer_ratio = 1.0;
    ZE_ASSIGN_OR_RETURN(const config::Config others,
                        config::Resolve(loaded, any_ratio));
    ZE_ASSIGN_OR_RETURN(const AutoOffloadRatio chosen,
                        ChooseAutoOffloadRatio(model, others, communicator,
                                               *context.activation_bytes,
                                               context.device_memory_bytes));
    ZE_LOG_RANK0(INFO) << loaded.source
                       << ": offload_optimizer.ratio \"auto\": "
                       << chosen.ToString();
    context.offload_optimizer_ratio = chosen.ratio;
    if (auto_ratio != nullptr) *auto_ratio = chosen;
  }
  ZE_ASSIGN_OR_RETURN(config::Config resolved,
                      config::Resolve(loaded, context));
  return resolved;
}

absl::StatusOr<std::unique_ptr<Engine>> Initialize(
    std::shared_ptr<nn::LossModel> model,
    const std::string& config_path_or_json,
    std::shared_ptr<comm::Communicator> communicator,
    const config::ResolutionContext& hints) {
  if (model == nullptr) {
    return absl::InvalidArgumentError("engine::Initialize: model is null");
  }
  // The job's files that must not outlive it (NVMe swap files) go on
  // SIGINT/SIGTERM/SIGHUP too; a program's own handlers are kept.
  InstallFileRemovalSignalHandlers();
  ZE_ASSIGN_OR_RETURN(communicator,
                      CommunicatorFor(*model, std::move(communicator)));
  const int world = communicator->world_size();
  absl::StatusOr<config::Config> loaded =
      !config_path_or_json.empty() && config_path_or_json[0] == '{'
          ? config::LoadConfigString(config_path_or_json, world)
          : config::LoadConfigFile(config_path_or_json, world);
  ZE_RETURN_IF_ERROR(loaded.status());
  ZE_ASSIGN_OR_RETURN(config::Config resolved,
                      ResolveConfig(*loaded, *model, *communicator, hints));
  return Initialize(std::move(model), resolved, std::move(communicator));
}

// ------------------------------------------------------------------ Engine
// The public surface (engine/engine.h): every call goes to the EngineImpl.

Engine::Engine(std::unique_ptr<EngineImpl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() = default;

absl::StatusOr<float> Engine::Forward(const Tensor& inputs,
                                      const Tensor& targets) {
  return impl_->Forward(inputs, targets);
}

absl::Status Engine::Backward() { return impl_->Backward(); }

absl::StatusOr<StepReport> Engine::Step() { return impl_->Step(); }

absl::StatusOr<StepReport> Engine::TrainBatch(
    const std::vector<std::pair<Tensor, Tensor>>& micro_batches) {
  return impl_->TrainBatch(micro_batches);
}

bool Engine::IsGradientAccumulationBoundary() const {
  return impl_->IsGradientAccumulationBoundary();
}

const Counters& Engine::counters() const { return impl_->counters(); }

double Engine::current_learning_rate() const {
  return impl_->current_learning_rate();
}

double Engine::current_loss_scale() const {
  return impl_->current_loss_scale();
}

const config::Config& Engine::config() const { return impl_->config(); }

comm::Communicator& Engine::communicator() const {
  return impl_->communicator();
}

nn::LossModel& Engine::model() const { return impl_->model(); }

const MemoryBreakdown& Engine::memory_breakdown() const {
  return impl_->memory_breakdown();
}

const Stream& Engine::compute_stream() const { return impl_->compute_stream(); }

CommunicationCounters Engine::communication_counters() const {
  return impl_->communication_counters();
}

PipelineCounters Engine::pipeline_counters() const {
  return impl_->pipeline_counters();
}

NvmeCounters Engine::nvme_counters() const { return impl_->nvme_counters(); }

OffloadTimes Engine::offload_times() const { return impl_->offload_times(); }

absl::StatusOr<std::vector<float>> Engine::GatherMasterWeights(
    const std::string& name) {
  return impl_->GatherMasterWeights(name);
}

std::vector<std::string> Engine::ParameterNames() const {
  return impl_->ParameterNames();
}

absl::StatusOr<float> Engine::EvalForward(const Tensor& inputs,
                                          const Tensor& targets) {
  return impl_->EvalForward(inputs, targets);
}

absl::StatusOr<Tensor> Engine::EvalOutputs(const Tensor& inputs) {
  return impl_->EvalOutputs(inputs);
}

absl::StatusOr<std::vector<std::vector<int32_t>>> Engine::Generate(
    const std::vector<std::vector<int32_t>>& prompts, int max_new_tokens,
    const GenerateOptions& options) {
  return impl_->Generate(prompts, max_new_tokens, options);
}

absl::StatusOr<std::unique_ptr<GatheredParameters>> Engine::GatherParameters(
    const std::vector<std::string>& names, int modifier_rank) {
  return impl_->GatherParameters(names, modifier_rank);
}

absl::StatusOr<LoadReport> Engine::LoadWeights(const std::string& path) {
  return impl_->LoadWeights(path);
}

absl::StatusOr<LoadReport> Engine::LoadWeights(
    const safetensors::TensorSource& source) {
  return impl_->LoadWeights(source);
}

absl::Status Engine::SaveCheckpoint(const std::string& directory,
                                    const std::string& tag,
                                    const nlohmann::json& client_state) {
  return impl_->SaveCheckpoint(directory, tag, client_state);
}

const CheckpointSaveReport& Engine::last_save_report() const {
  return impl_->last_save_report();
}

absl::StatusOr<LoadedCheckpoint> Engine::LoadCheckpoint(
    const std::string& directory, const std::string& tag,
    bool load_optimizer_states) {
  return impl_->LoadCheckpoint(directory, tag, load_optimizer_states);
}

}  // namespace engine
}  // namespace ze
