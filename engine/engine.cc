#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/factory.h"
#include "core/logging.h"
#include "core/ops.h"
#include "core/safetensors/reader.h"
#include "core/status.h"
#include "engine/stage3.h"
#include "engine/training_state.h"
#include "zero/flat_layout.h"
#include "zero/optimizer.h"

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

// Every rank learns whether `local` failed on any rank (one one-element
// all-reduce), so an error on one rank (a directory rank 0 cannot create)
// does not leave the others waiting in a later collective. Returns `local`
// where it failed, and a FailedPrecondition saying so on the other ranks.
absl::Status AgreeAcrossRanks(comm::Communicator& comm,
                              const absl::Status& local, const Stream& stream,
                              const std::string& what) {
  if (comm.world_size() == 1) return local;
  ZE_ASSIGN_OR_RETURN(Tensor flag,
                      Tensor::Zeros({1}, DType::kF32, comm.device()));
  ZE_RETURN_IF_ERROR(Fill(flag, local.ok() ? 0.0f : 1.0f, stream));
  ZE_ASSIGN_OR_RETURN(comm::Work work,
                      comm.AllReduce(flag, flag, comm::ReduceOp::kMax, stream));
  ZE_RETURN_IF_ERROR(work.Wait());
  ZE_ASSIGN_OR_RETURN(std::vector<float> any_failed,
                      ToHostFloats(flag, stream));
  if (!local.ok()) return local;
  if (any_failed[0] > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " failed on another rank (its error is in its log); rank ",
        comm.rank(), " stops too"));
  }
  return absl::OkStatus();
}

std::string Gib(double bytes) {
  return absl::StrFormat("%.3f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
}

// A view of `count` elements at `offset` of `flat`.
Tensor Region(const Tensor& flat, int64_t offset, int64_t count) {
  return flat.Slice(offset, count);
}

}  // namespace

std::string MemoryBreakdown::ToString() const {
  return absl::StrFormat(
      "Psi=%d parameters; per rank: weights %s, gradients %s, master weights "
      "%s, optimizer state %s, total %s (ZeRO paper: %s)",
      parameter_elements, Gib(model_weight_bytes), Gib(gradient_bytes),
      Gib(master_weight_bytes), Gib(optimizer_state_bytes), Gib(total_bytes()),
      Gib(paper_bytes));
}

// Everything about partitioning and reduction. Engine keeps the public
// surface; Impl the buffers and the backward bookkeeping.
class Engine::Impl {
 public:
  explicit Impl(Engine* engine) : engine_(*engine) {}

  absl::Status Setup();
  absl::Status BeginBackward();
  absl::Status EndBackward();
  absl::StatusOr<StepReport> BoundaryStep();
  absl::StatusOr<std::vector<float>> GatherMasterWeights(
      const std::string& name);
  std::vector<std::string> ParameterNames() const;

  // See Engine::EvalForward: brackets an evaluation forward.
  absl::Status BeginEval();
  absl::Status EndEval();
  absl::Status GatherScope(const std::vector<std::string>& names,
                           int modifier_rank);
  absl::Status ReleaseScope(const std::vector<std::string>& names,
                            int modifier_rank);
  absl::StatusOr<LoadReport> LoadWeights(const std::string& path);

  TrainingState& state() { return *state_; }
  CommunicationCounters communication_counters() const {
    return stage3_ ? stage3_->last_step_counters() : CommunicationCounters();
  }
  bool reducing_this_micro_step() const { return reduce_now_; }
  void set_loss_sum(double sum) { loss_sum_ = sum; }
  void add_loss(double loss) { loss_sum_ += loss; }
  // Forgets uses counted by forwards that had no backward (an evaluation
  // forward between steps), so this micro-step's counting starts clean.
  void BeginForward() {
    if (!stage3_) std::fill(pending_uses_.begin(), pending_uses_.end(), 0);
  }

 private:
  const config::Config& config() const { return engine_.config_; }
  comm::Communicator& comm() const { return *engine_.communicator_; }
  const Stream& stream() const { return engine_.compute_stream_; }
  // Where gradient collectives run: a separate high-priority stream with
  // overlap_comm on a GPU (so reduction overlaps the rest of backward),
  // otherwise the compute stream.
  const Stream& comm_stream() const { return comm_stream_; }
  Device device() const { return engine_.model_->device(); }
  int world() const { return comm().world_size(); }
  int rank() const { return comm().rank(); }

  absl::Status AllocateBuffers();
  absl::Status InstallHooks();
  absl::Status OnParameterUsed(int index);
  absl::Status OnParameterReady(int index);
  absl::Status EnsureBucketGrads(int bucket);
  absl::Status IssueReadyBuckets(bool flush);
  absl::Status IssueBucket(int bucket);
  absl::Status FinishBucket(int bucket);
  absl::Status ZeroGradients();
  // Stage 2 at world size 1 in a micro-step that overwrites the partition:
  // each bucket's gradients are computed in the partition itself.
  // (Not when communication_data_type differs: the gradients are then
  // rounded through it at every world size, as in the other stages.)
  bool AliasesPartition() const {
    return OverwritesPartition() && world() == 1 && comm_dtype_ == model_dtype_;
  }
  // Stage 2, during a backward: whether its reduce-scatters write the
  // partition (the window's first micro-step) rather than add into it.
  bool OverwritesPartition() const {
    return stage_ == 2 && !partition_holds_gradients_;
  }
  // The gradient elements this rank's optimizer for `bucket` reads.
  Tensor OwnGrads(int bucket) const;
  Tensor OwnMaster(int bucket) const;
  Tensor OwnModelWeights(int bucket) const;
  absl::Status GatherUpdatedWeights();
  // The part of parameter `index`'s f32 master this rank holds: elements
  // [*begin, *begin + view.numel()) of the parameter (undefined view: none).
  Tensor MasterPiece(int index, int64_t* begin) const;

  Engine& engine_;
  Stream comm_stream_;
  int stage_ = 0;
  DType model_dtype_ = DType::kF32;
  bool master_aliases_weights_ = false;  // f32 training: no separate copy

  zero::PartitionedLayout layout_;
  std::vector<nn::Parameter*> params_;  // layout order
  std::unordered_map<const nn::Parameter*, int> index_of_;
  std::vector<int64_t> bucket_offsets_;  // bucket b's start in the flat buffer

  Tensor weights_;         // (padded_total) model dtype, all stages
  Tensor grads_;           // stages 0-1: (padded_total) model dtype
  Tensor grad_partition_;  // stage 2: (partition) model dtype
  Tensor master_;          // f32: stage 0 (padded_total), 1-2 (partition)
  std::vector<std::unique_ptr<zero::FlatOptimizer>> optimizers_;  // per bucket

  // Backward bookkeeping (see InstallHooks).
  std::vector<int> pending_uses_;    // per parameter
  std::vector<int> bucket_unready_;  // parameters not yet final, per bucket
  std::vector<bool> bucket_issued_;
  int next_bucket_ = 0;                 // buckets are issued in index order
  std::vector<Tensor> bucket_grads_;    // stage 2: in-flight full gradients
  std::vector<Tensor> bucket_outputs_;  // stage 2: reduce-scatter outputs
  // communication_data_type, when it differs from the model's dtype: the
  // bucket's gradients cast to it, which the collective reads (and for
  // stages 0-1 writes); kept until the compute stream has waited for it.
  DType comm_dtype_ = DType::kF32;
  std::vector<Tensor> bucket_wire_;
  // Stage 2: whether grad_partition_ holds this accumulation window's
  // gradients so far. When it does not (the window's first micro-step, or
  // after a step), its contents are stale and the reduce-scatters write the
  // partition directly instead of into a temporary that is then added: no
  // zero fill, no temporary, no addition.
  bool partition_holds_gradients_ = false;
  std::vector<comm::Work> bucket_work_;
  std::vector<nn::HookHandle> hooks_;
  bool in_backward_ = false;
  bool evaluating_ = false;
  bool reduce_now_ = false;
  // Stages 0-1: whether this window's gradients were reduced (by the
  // boundary micro-step's Backward). If the boundary micro-step had no
  // Backward, BoundaryStep reduces them itself.
  bool window_reduced_ = false;
  double loss_sum_ = 0;

  std::unique_ptr<TrainingState> state_;
  // Stage 3 lives in engine/stage3.h; when set, the methods above route to
  // it and the members for stages 0-2 stay empty.
  std::unique_ptr<Stage3> stage3_;
};

absl::Status Engine::Impl::Setup() {
  const config::Config& cfg = config();
  stage_ = static_cast<int>(cfg.zero_optimization.stage);
  if (cfg.zero_optimization.offload_optimizer.device !=
          config::OffloadDevice::kNone ||
      cfg.zero_optimization.offload_param.device !=
          config::OffloadDevice::kNone) {
    return absl::UnimplementedError(absl::StrCat(
        cfg.source,
        ": zero_optimization.offload_optimizer/offload_param is not available "
        "in this build; set device to \"none\""));
  }
  const config::TrainingPrecision precision = config::GetTrainingPrecision(cfg);
  const DType wanted =
      precision == config::TrainingPrecision::kBf16   ? DType::kBF16
      : precision == config::TrainingPrecision::kFp16 ? DType::kF16
                                                      : DType::kF32;
  model_dtype_ = engine_.model_->dtype();
  if (model_dtype_ != wanted) {
    return absl::InvalidArgumentError(absl::StrCat(
        cfg.source, ": the config trains in ", DTypeName(wanted),
        " (fp16.enabled / bf16.enabled) but the model was built with dtype ",
        DTypeName(model_dtype_), "; build the model with ", DTypeName(wanted)));
  }
  master_aliases_weights_ = model_dtype_ == DType::kF32;
  comm_dtype_ = model_dtype_;
  if (cfg.communication_data_type.has_value()) {
    switch (*cfg.communication_data_type) {
      case config::CommDataType::kFp32:
        comm_dtype_ = DType::kF32;
        break;
      case config::CommDataType::kFp16:
        comm_dtype_ = DType::kF16;
        break;
      case config::CommDataType::kBf16:
        comm_dtype_ = DType::kBF16;
        break;
    }
  }
  comm_stream_ = stream();
  if (cfg.zero_optimization.overlap_comm && device().is_cuda()) {
    ZE_ASSIGN_OR_RETURN(comm_stream_,
                        Stream::Create(device(), /*high_priority=*/true));
  }
  ZE_ASSIGN_OR_RETURN(state_, TrainingState::Create(cfg, world()));
  if (stage_ == 3) {
    Stage3Context context;
    context.config = &engine_.config_;
    context.comm = engine_.communicator_.get();
    context.stream = &engine_.compute_stream_;
    context.model = engine_.model_.get();
    context.state = state_.get();
    context.memory = &engine_.memory_;
    context.counters = &engine_.counters_;
    context.communication_dtype = comm_dtype_;
    ZE_ASSIGN_OR_RETURN(stage3_, Stage3::Create(context));
    return absl::OkStatus();
  }
  ZE_RETURN_IF_ERROR(AllocateBuffers());
  return InstallHooks();
}

absl::Status Engine::Impl::AllocateBuffers() {
  nn::LossModel& model = *engine_.model_;
  // Materialise any absent parameter (shapes-only construction) first:
  // stages 0-2 keep full weights on every rank.
  for (nn::Parameter* parameter : model.Parameters()) {
    if (parameter->state() == nn::ParameterState::kAbsent) {
      ZE_RETURN_IF_ERROR(parameter->Materialize(
          static_cast<uint64_t>(config().seed), stream()));
    }
  }
  // Layout order = reverse of the model's order, so buckets complete in
  // index order during backward (the last layers' gradients come first).
  std::vector<nn::Parameter*> trainable;
  for (nn::Parameter* parameter : model.Parameters()) {
    if (parameter->requires_grad()) trainable.push_back(parameter);
  }
  std::reverse(trainable.begin(), trainable.end());
  std::vector<zero::ParamSpec> specs;
  for (nn::Parameter* parameter : trainable) {
    specs.push_back({parameter->name(), parameter->numel()});
  }
  zero::LayoutOptions options;
  options.world_size = world();
  options.bucket_max_elements =
      config().zero_optimization.reduce_bucket_size.value();
  ZE_ASSIGN_OR_RETURN(layout_, zero::PartitionedLayout::Build(specs, options));
  params_ = trainable;
  for (int i = 0; i < static_cast<int>(params_.size()); ++i) {
    index_of_[params_[i]] = i;
  }
  int64_t offset = 0;
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    bucket_offsets_.push_back(offset);
    offset += layout_.bucket(b).padded_elements;
  }

  // The memory this rank will hold, computed before allocating so a model
  // that does not fit fails with the full figure.
  const int64_t psi = layout_.total_param_elements();
  const int64_t padded = layout_.padded_total_elements();
  const int64_t partition = layout_.partition_elements();
  const int64_t element_bytes = static_cast<int64_t>(SizeOf(model_dtype_));
  zero::OptimizerOptions optimizer_options = state_->optimizer_options();
  MemoryBreakdown& memory = engine_.memory_;
  memory.parameter_elements = psi;
  memory.model_weight_bytes = padded * element_bytes;
  memory.gradient_bytes = (stage_ == 2 ? partition : padded) * element_bytes;
  const int64_t master_elements = stage_ == 0 ? padded : partition;
  memory.master_weight_bytes =
      master_aliases_weights_ ? 0 : master_elements * 4;
  memory.optimizer_state_bytes =
      master_elements * zero::StateBytesPerElement(optimizer_options);
  const double n = world();
  if (stage_ == 0) memory.paper_bytes = 16.0 * psi;
  if (stage_ == 1) memory.paper_bytes = 4.0 * psi + 12.0 * psi / n;
  if (stage_ == 2) memory.paper_bytes = 2.0 * psi + 14.0 * psi / n;

  auto annotate = [&](const absl::Status& status) {
    return absl::Status(
        status.code(),
        absl::StrCat("model state does not fit on rank ", rank(), " (",
                     device().ToString(), "): ZeRO stage ", stage_, " needs ",
                     memory.total_bytes(), " bytes per rank (",
                     memory.ToString(), "): ", status.message()));
  };
  auto allocate = [&](int64_t count, DType dtype) -> absl::StatusOr<Tensor> {
    absl::StatusOr<Tensor> tensor = Tensor::Zeros({count}, dtype, device());
    if (!tensor.ok()) return annotate(tensor.status());
    return tensor;
  };

  ZE_ASSIGN_OR_RETURN(weights_, allocate(padded, model_dtype_));
  // Move the model's weights into the flat buffer and make each parameter a
  // view of it.
  for (int i = 0; i < layout_.num_params(); ++i) {
    const zero::ParamPlacement& place = layout_.placement(i);
    Tensor view = Region(weights_, bucket_offsets_[place.bucket] + place.offset,
                         place.numel)
                      .View(params_[i]->shape());
    ZE_ASSIGN_OR_RETURN(Tensor current, params_[i]->data());
    ZE_RETURN_IF_ERROR(Copy(current, view, stream()));
    ZE_RETURN_IF_ERROR(params_[i]->SetData(view));
  }
  // Each parameter's old storage went back to the caching allocator with
  // the copy out of it still queued: let the copies run before anything can
  // be handed that memory (Tensor::Zeros below works on the legacy default
  // stream, which is not ordered with this one).
  ZE_RETURN_IF_ERROR(stream().Synchronize());
  if (stage_ == 2) {
    ZE_ASSIGN_OR_RETURN(grad_partition_, allocate(partition, model_dtype_));
    bucket_grads_.resize(layout_.num_buckets());
    bucket_outputs_.resize(layout_.num_buckets());
  } else {
    ZE_ASSIGN_OR_RETURN(grads_, allocate(padded, model_dtype_));
    for (int i = 0; i < layout_.num_params(); ++i) {
      const zero::ParamPlacement& place = layout_.placement(i);
      ZE_RETURN_IF_ERROR(params_[i]->SetGrad(
          Region(grads_, bucket_offsets_[place.bucket] + place.offset,
                 place.numel)
              .View(params_[i]->shape())));
    }
  }
  if (!master_aliases_weights_) {
    ZE_ASSIGN_OR_RETURN(master_, allocate(master_elements, DType::kF32));
  }
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    const int64_t count = stage_ == 0 ? layout_.bucket(b).padded_elements
                                      : layout_.bucket(b).slice_elements;
    absl::StatusOr<std::unique_ptr<zero::FlatOptimizer>> optimizer =
        zero::FlatOptimizer::Create(optimizer_options, count, device());
    if (!optimizer.ok()) return annotate(optimizer.status());
    optimizers_.push_back(std::move(optimizer).value());
    if (!master_aliases_weights_) {
      ZE_RETURN_IF_ERROR(Copy(OwnModelWeights(b), OwnMaster(b), stream()));
    }
  }
  ZE_RETURN_IF_ERROR(stream().Synchronize());
  bucket_work_.resize(layout_.num_buckets());
  bucket_wire_.resize(layout_.num_buckets());
  bucket_issued_.assign(layout_.num_buckets(), false);
  pending_uses_.assign(layout_.num_params(), 0);
  return absl::OkStatus();
}

Tensor Engine::Impl::OwnModelWeights(int bucket) const {
  const zero::BucketLayout& layout = layout_.bucket(bucket);
  if (stage_ == 0) {
    return Region(weights_, bucket_offsets_[bucket], layout.padded_elements);
  }
  return Region(weights_,
                bucket_offsets_[bucket] + rank() * layout.slice_elements,
                layout.slice_elements);
}

Tensor Engine::Impl::OwnMaster(int bucket) const {
  if (master_aliases_weights_) return OwnModelWeights(bucket);
  const zero::BucketLayout& layout = layout_.bucket(bucket);
  if (stage_ == 0) {
    return Region(master_, bucket_offsets_[bucket], layout.padded_elements);
  }
  return Region(master_, layout.partition_offset, layout.slice_elements);
}

Tensor Engine::Impl::OwnGrads(int bucket) const {
  const zero::BucketLayout& layout = layout_.bucket(bucket);
  if (stage_ == 0) {
    return Region(grads_, bucket_offsets_[bucket], layout.padded_elements);
  }
  if (stage_ == 1) {
    return Region(grads_,
                  bucket_offsets_[bucket] + rank() * layout.slice_elements,
                  layout.slice_elements);
  }
  return Region(grad_partition_, layout.partition_offset,
                layout.slice_elements);
}

// Gradient readiness. A parameter's gradient is final in this backward when
// every module call that read it during forward has run its backward: a
// pre-forward hook counts the uses of each module's direct parameters (not
// while backward recomputes a checkpointed forward, which is not a new use),
// and a post-backward hook counts them down. A tied parameter used by the
// embedding and the output head becomes final only after the embedding's
// backward, the last one. Buckets are issued strictly in index order (the
// layout is in reverse model order, so they complete in about that order),
// which keeps every rank's collective sequence identical.
absl::Status Engine::Impl::InstallHooks() {
  for (nn::Module* module : engine_.model_->Modules()) {
    std::vector<int> indices;
    for (nn::Parameter* parameter : module->DirectParameters()) {
      auto found = index_of_.find(parameter);
      if (found != index_of_.end()) indices.push_back(found->second);
    }
    if (indices.empty()) continue;
    hooks_.push_back(module->AddHook(
        nn::HookKind::kPreForward,
        [this, indices](nn::Module&, const Stream&) -> absl::Status {
          // Counted whether or not the call saves activations: inside a
          // checkpointed block the first forward saves nothing, yet its
          // backward (after the recompute) will produce these gradients.
          if (in_backward_ || evaluating_) return absl::OkStatus();
          for (int index : indices) ZE_RETURN_IF_ERROR(OnParameterUsed(index));
          return absl::OkStatus();
        }));
    if (stage_ == 2) {
      hooks_.push_back(module->AddHook(
          nn::HookKind::kPreBackward,
          [this, indices](nn::Module&, const Stream&) -> absl::Status {
            for (int index : indices) {
              ZE_RETURN_IF_ERROR(
                  EnsureBucketGrads(layout_.placement(index).bucket));
            }
            return absl::OkStatus();
          }));
    }
    hooks_.push_back(module->AddHook(
        nn::HookKind::kPostBackward,
        [this, indices](nn::Module&, const Stream&) -> absl::Status {
          for (int index : indices) {
            if (pending_uses_[index] > 0 && --pending_uses_[index] == 0) {
              ZE_RETURN_IF_ERROR(OnParameterReady(index));
            }
          }
          return IssueReadyBuckets(/*flush=*/false);
        }));
  }
  return absl::OkStatus();
}

absl::Status Engine::Impl::OnParameterUsed(int index) {
  ++pending_uses_[index];
  return absl::OkStatus();
}

absl::Status Engine::Impl::OnParameterReady(int index) {
  --bucket_unready_[layout_.placement(index).bucket];
  return absl::OkStatus();
}

absl::Status Engine::Impl::EnsureBucketGrads(int bucket) {
  if (bucket_grads_[bucket].defined()) return absl::OkStatus();
  const zero::BucketLayout& layout = layout_.bucket(bucket);
  if (AliasesPartition()) {
    // One rank's slice is the whole bucket and the reduce-scatter is the
    // identity: the layers accumulate straight into the partition.
    bucket_grads_[bucket] = Region(grad_partition_, layout.partition_offset,
                                   layout.padded_elements);
  } else {
    ZE_ASSIGN_OR_RETURN(
        bucket_grads_[bucket],
        Tensor::Empty({layout.padded_elements}, model_dtype_, device()));
  }
  // Zeroed on the compute stream, ordered before the layers accumulate.
  ZE_RETURN_IF_ERROR(Fill(bucket_grads_[bucket], 0.0f, stream()));
  for (int i = layout.first_param; i < layout.end_param; ++i) {
    const zero::ParamPlacement& place = layout_.placement(i);
    ZE_RETURN_IF_ERROR(params_[i]->SetGrad(
        Region(bucket_grads_[bucket], place.offset, place.numel)
            .View(params_[i]->shape())));
  }
  return absl::OkStatus();
}

absl::Status Engine::Impl::BeginBackward() {
  if (stage3_) return stage3_->BeginBackward();
  in_backward_ = true;
  reduce_now_ = stage_ == 2 || engine_.IsGradientAccumulationBoundary();
  next_bucket_ = 0;
  bucket_issued_.assign(layout_.num_buckets(), false);
  bucket_unready_.assign(layout_.num_buckets(), 0);
  for (int i = 0; i < layout_.num_params(); ++i) {
    const int bucket = layout_.placement(i).bucket;
    // A parameter no module used in this forward has its final (zero)
    // gradient already.
    if (pending_uses_[i] > 0) ++bucket_unready_[bucket];
  }
  return absl::OkStatus();
}

absl::Status Engine::Impl::IssueReadyBuckets(bool flush) {
  if (!reduce_now_) return absl::OkStatus();
  while (next_bucket_ < layout_.num_buckets() &&
         (flush || bucket_unready_[next_bucket_] == 0)) {
    ZE_RETURN_IF_ERROR(IssueBucket(next_bucket_));
    ++next_bucket_;
  }
  return absl::OkStatus();
}

absl::Status Engine::Impl::IssueBucket(int bucket) {
  const zero::BucketLayout& layout = layout_.bucket(bucket);
  Tensor full;
  if (stage_ == 2) {
    // A bucket no module touched this micro-step still contributes zeros,
    // so every rank issues the same collectives.
    ZE_RETURN_IF_ERROR(EnsureBucketGrads(bucket));
    full = bucket_grads_[bucket];
  } else {
    full = Region(grads_, bucket_offsets_[bucket], layout.padded_elements);
  }
  if (config().prescale_gradients) {
    ZE_RETURN_IF_ERROR(Scale(
        full, static_cast<float>(1.0 / config().gradient_predivide_factor),
        stream()));
  }
  // What the collective reads: the gradients, or (communication_data_type
  // other than the model's) a copy cast to that dtype; the sums are then
  // formed in it and rounded to the model's dtype once, on the way back
  // (BoundaryStep for stages 0-1, FinishBucket for stage 2).
  Tensor wire = full;
  const bool cast = comm_dtype_ != model_dtype_ && !AliasesPartition();
  if (cast) {
    if (bucket_wire_[bucket].defined()) {
      // Stages 0-1, a boundary backward run twice before its step: the
      // earlier collective may still write the old buffer, which is freed
      // below and whose block the new one may get.
      ZE_RETURN_IF_ERROR(bucket_work_[bucket].StreamWait(stream()));
    }
    ZE_ASSIGN_OR_RETURN(
        wire, Tensor::Empty({layout.padded_elements}, comm_dtype_, device()));
    ZE_RETURN_IF_ERROR(Copy(full, wire, stream()));
    bucket_wire_[bucket] = wire;
  }
  if (comm_stream().native() != stream().native()) {
    // The collective must read the gradients only after the backward
    // kernels that produced them.
    ZE_ASSIGN_OR_RETURN(Event produced, Event::Create(device()));
    ZE_RETURN_IF_ERROR(produced.Record(stream()));
    ZE_RETURN_IF_ERROR(produced.StreamWait(comm_stream()));
  }
  comm::Work work;
  if (stage_ == 0) {
    ZE_ASSIGN_OR_RETURN(work, comm().AllReduce(wire, wire, comm::ReduceOp::kSum,
                                               comm_stream()));
  } else if (stage_ == 1) {
    Tensor own =
        Region(wire, rank() * layout.slice_elements, layout.slice_elements);
    ZE_ASSIGN_OR_RETURN(
        work,
        comm().ReduceScatter(wire, own, comm::ReduceOp::kSum, comm_stream()));
  } else if (AliasesPartition()) {
    // The gradients are already in place (EnsureBucketGrads): nothing to
    // reduce over one rank.
  } else if (OverwritesPartition() && !cast) {
    ZE_ASSIGN_OR_RETURN(
        work,
        comm().ReduceScatter(wire,
                             Region(grad_partition_, layout.partition_offset,
                                    layout.slice_elements),
                             comm::ReduceOp::kSum, comm_stream()));
  } else {
    // Allocated before the collective is queued and freed only after the
    // compute stream has waited for it (FinishBucket), so the caching
    // allocator cannot hand it out while the comm stream still writes it.
    ZE_ASSIGN_OR_RETURN(
        bucket_outputs_[bucket],
        Tensor::Empty({layout.slice_elements}, wire.dtype(), device()));
    ZE_ASSIGN_OR_RETURN(
        work, comm().ReduceScatter(wire, bucket_outputs_[bucket],
                                   comm::ReduceOp::kSum, comm_stream()));
  }
  bucket_work_[bucket] = work;
  bucket_issued_[bucket] = true;
  if (stage_ < 2) window_reduced_ = true;
  if (stage_ == 2) {
    // Bound the gradients in flight: finish the bucket two behind.
    if (bucket >= 2 && bucket_grads_[bucket - 2].defined()) {
      ZE_RETURN_IF_ERROR(FinishBucket(bucket - 2));
    }
  }
  return absl::OkStatus();
}

// Stage 2: waits for the bucket's reduce-scatter, accumulates this rank's
// reduced slice into its gradient partition (unless the reduce-scatter wrote
// the partition itself), and frees the bucket.
absl::Status Engine::Impl::FinishBucket(int bucket) {
  ZE_RETURN_IF_ERROR(bucket_work_[bucket].StreamWait(stream()));
  const zero::BucketLayout& layout = layout_.bucket(bucket);
  Tensor partition =
      Region(grad_partition_, layout.partition_offset, layout.slice_elements);
  if (!OverwritesPartition()) {
    ZE_RETURN_IF_ERROR(
        Add(partition, bucket_outputs_[bucket], partition, stream()));
  } else if (bucket_outputs_[bucket].defined()) {
    // Reduced in communication_data_type: rounded into the partition.
    ZE_RETURN_IF_ERROR(Copy(bucket_outputs_[bucket], partition, stream()));
  }
  for (int i = layout.first_param; i < layout.end_param; ++i) {
    params_[i]->ReleaseGrad();
  }
  // The caching allocator may hand these blocks out again at once; work
  // queued on the compute stream is ordered after the reads above.
  bucket_grads_[bucket] = Tensor();
  bucket_outputs_[bucket] = Tensor();
  bucket_wire_[bucket] = Tensor();
  bucket_work_[bucket] = comm::Work();
  return absl::OkStatus();
}

absl::Status Engine::Impl::EndBackward() {
  if (stage3_) return stage3_->EndBackward();
  in_backward_ = false;
  for (int& uses : pending_uses_) uses = 0;
  if (reduce_now_) {
    ZE_RETURN_IF_ERROR(IssueReadyBuckets(/*flush=*/true));
    if (stage_ == 2) {
      for (int b = 0; b < layout_.num_buckets(); ++b) {
        if (bucket_grads_[b].defined()) ZE_RETURN_IF_ERROR(FinishBucket(b));
      }
      // Every bucket was reduced (untouched ones as zeros), so the whole
      // partition now holds this window's gradients.
      partition_holds_gradients_ = true;
    }
  }
  return absl::OkStatus();
}

absl::Status Engine::Impl::ZeroGradients() {
  if (stage_ == 2) {
    // The next micro-step's reduce-scatters overwrite the partition.
    partition_holds_gradients_ = false;
    return absl::OkStatus();
  }
  return Fill(grads_, 0.0f, stream());
}

absl::StatusOr<StepReport> Engine::Impl::BoundaryStep() {
  if (stage3_) {
    const double loss_sum = loss_sum_;
    loss_sum_ = 0;
    return stage3_->BoundaryStep(loss_sum);
  }
  StepReport report;
  report.boundary = true;
  report.loss_scale = state_->loss_scale();
  if (stage_ < 2 && !window_reduced_) {
    // The boundary micro-step had no Backward, so nothing reduced the
    // window's gradients: without this each rank would step with its own.
    reduce_now_ = true;
    next_bucket_ = 0;
    bucket_issued_.assign(layout_.num_buckets(), false);
    ZE_RETURN_IF_ERROR(IssueReadyBuckets(/*flush=*/true));
    reduce_now_ = false;
  }
  window_reduced_ = false;
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    ZE_RETURN_IF_ERROR(bucket_work_[b].StreamWait(stream()));
    bucket_work_[b] = comm::Work();
    if (stage_ < 2 && bucket_wire_[b].defined()) {
      // Reduced in communication_data_type: round this rank's part back.
      const zero::BucketLayout& layout = layout_.bucket(b);
      Tensor reduced =
          stage_ == 0 ? bucket_wire_[b]
                      : Region(bucket_wire_[b], rank() * layout.slice_elements,
                               layout.slice_elements);
      ZE_RETURN_IF_ERROR(Copy(reduced, OwnGrads(b), stream()));
      bucket_wire_[b] = Tensor();
    }
  }
  if (stage_ == 2 && !partition_holds_gradients_) {
    // A step with no backward in its window: the gradients are zero.
    ZE_RETURN_IF_ERROR(Fill(grad_partition_, 0.0f, stream()));
    partition_holds_gradients_ = true;
  }

  // One all-reduce carries what every rank must agree on:
  //   [0] sum of squares of the gradients (stage 0: each rank holds all of
  //       them, so each contributes 1/N of its sum),
  //   [1] overflow flag (fp16), [2] this rank's summed micro-batch losses.
  ZE_ASSIGN_OR_RETURN(Tensor stats, Tensor::Empty({3}, DType::kF32, device()));
  ZE_RETURN_IF_ERROR(Fill(stats, 0.0f, stream()));
  Tensor sum_of_squares = stats.Slice(0, 1);
  Tensor overflow = stats.Slice(1, 1);
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    Tensor own = OwnGrads(b);
    ZE_RETURN_IF_ERROR(SumOfSquares(own, sum_of_squares, stream()));
    if (state_->checks_overflow()) {
      ZE_RETURN_IF_ERROR(HasInfOrNan(own, overflow, stream()));
    }
  }
  if (stage_ == 0) {
    ZE_RETURN_IF_ERROR(Scale(sum_of_squares, 1.0f / world(), stream()));
  }
  ZE_RETURN_IF_ERROR(
      Fill(stats.Slice(2, 1), static_cast<float>(loss_sum_), stream()));
  ZE_ASSIGN_OR_RETURN(
      comm::Work work,
      comm().AllReduce(stats, stats, comm::ReduceOp::kSum, stream()));
  ZE_RETURN_IF_ERROR(work.Wait());
  ZE_ASSIGN_OR_RETURN(std::vector<float> values, ToHostFloats(stats, stream()));
  const int64_t accumulation = config().gradient_accumulation_steps.value();
  report.loss = values[2] / (static_cast<double>(world()) * accumulation);
  loss_sum_ = 0;

  const bool overflowed = values[1] > 0 || !std::isfinite(values[0]);
  const double loss_scale = state_->loss_scale();
  // The buffers hold the sum over ranks of loss_scale * (mean over the
  // accumulation window) gradients; the true gradient divides by both.
  double unscale = 1.0 / (loss_scale * world());
  if (config().prescale_gradients) {
    unscale *= config().gradient_predivide_factor;
  }
  report.grad_norm = std::sqrt(static_cast<double>(values[0])) * unscale;
  report.learning_rate = state_->learning_rate();
  if (state_->checks_overflow()) {
    ZE_RETURN_IF_ERROR(state_->UpdateLossScale(
        overflowed, engine_.counters_.global_steps + 1));
  }
  if (overflowed && state_->checks_overflow()) {
    report.skipped = true;
    ZE_RETURN_IF_ERROR(ZeroGradients());
    return report;
  }
  double clip = 1.0;
  const double max_norm = config().gradient_clipping.value();
  if (max_norm > 0 && report.grad_norm > max_norm) {
    clip = max_norm / (report.grad_norm + 1e-6);
  }
  zero::StepArgs args;
  args.lr = report.learning_rate;
  args.grad_scale = static_cast<float>(unscale * clip);
  state_->FillMomentum(&args);
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    ZE_RETURN_IF_ERROR(optimizers_[b]->Step(
        OwnMaster(b), OwnGrads(b), args, stream(),
        master_aliases_weights_ ? Tensor() : OwnModelWeights(b)));
  }
  if (stage_ > 0 && world() > 1) ZE_RETURN_IF_ERROR(GatherUpdatedWeights());
  ZE_RETURN_IF_ERROR(ZeroGradients());
  state_->AdvanceSchedule();
  return report;
}

// Stages 1-2: every rank updated its slice of each bucket's weights; an
// in-place all-gather per bucket, grouped up to allgather_bucket_size
// elements per call, rebuilds the full weights everywhere.
absl::Status Engine::Impl::GatherUpdatedWeights() {
  const int64_t group_limit =
      std::max<int64_t>(1, config().zero_optimization.allgather_bucket_size);
  std::vector<comm::CollectiveOp> group;
  int64_t group_elements = 0;
  std::vector<comm::Work> works;
  auto flush = [&]() -> absl::Status {
    if (group.empty()) return absl::OkStatus();
    ZE_ASSIGN_OR_RETURN(comm::Work work, comm().Coalesced(group, stream()));
    works.push_back(work);
    group.clear();
    group_elements = 0;
    return absl::OkStatus();
  };
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    const zero::BucketLayout& layout = layout_.bucket(b);
    Tensor full = Region(weights_, bucket_offsets_[b], layout.padded_elements);
    if (group_elements > 0 &&
        group_elements + layout.padded_elements > group_limit) {
      ZE_RETURN_IF_ERROR(flush());
    }
    group.push_back(comm::CollectiveOp::AllGather(OwnModelWeights(b), full));
    group_elements += layout.padded_elements;
  }
  ZE_RETURN_IF_ERROR(flush());
  for (comm::Work& work : works) ZE_RETURN_IF_ERROR(work.StreamWait(stream()));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> Engine::Impl::GatherMasterWeights(
    const std::string& name) {
  if (stage3_) return stage3_->GatherMasterWeights(name);
  ZE_ASSIGN_OR_RETURN(int index, layout_.FindParam(name));
  // Gather each bucket's master slices (a collective on every rank), then
  // read the parameter's range.
  const zero::ParamPlacement& place = layout_.placement(index);
  const zero::BucketLayout& layout = layout_.bucket(place.bucket);
  ZE_ASSIGN_OR_RETURN(Tensor full, Tensor::Empty({layout.padded_elements},
                                                 DType::kF32, device()));
  // The master slice is f32 in every mode (in f32 training it is the
  // weights themselves), so it gathers as it is.
  Tensor own = OwnMaster(place.bucket);
  if (stage_ == 0 || world() == 1) {
    ZE_RETURN_IF_ERROR(Copy(own, full, stream()));
  } else {
    ZE_ASSIGN_OR_RETURN(comm::Work work, comm().AllGather(own, full, stream()));
    ZE_RETURN_IF_ERROR(work.Wait());
  }
  ZE_ASSIGN_OR_RETURN(std::vector<float> values, ToHostFloats(full, stream()));
  return std::vector<float>(values.begin() + place.offset,
                            values.begin() + place.offset + place.numel);
}

std::vector<std::string> Engine::Impl::ParameterNames() const {
  if (stage3_) return stage3_->ParameterNames();
  std::vector<std::string> names;
  for (const nn::Parameter* parameter : params_)
    names.push_back(parameter->name());
  return names;
}

absl::Status Engine::Impl::BeginEval() {
  if (stage3_) return stage3_->BeginEval();
  evaluating_ = true;
  return absl::OkStatus();
}

absl::Status Engine::Impl::EndEval() {
  if (stage3_) return stage3_->EndEval();
  evaluating_ = false;
  return absl::OkStatus();
}

Tensor Engine::Impl::MasterPiece(int index, int64_t* begin) const {
  const zero::ParamPlacement& place = layout_.placement(index);
  const zero::BucketLayout& layout = layout_.bucket(place.bucket);
  if (stage_ == 0) {
    *begin = 0;
    return Region(OwnMaster(place.bucket), place.offset, place.numel);
  }
  // Stages 1-2: this rank owns [rank * slice, (rank + 1) * slice) of the
  // bucket; the parameter lies at [offset, offset + numel).
  const int64_t slice = layout.slice_elements;
  const int64_t low = std::max<int64_t>(place.offset, rank() * slice);
  const int64_t high =
      std::min<int64_t>(place.offset + place.numel, (rank() + 1) * slice);
  if (high <= low) return Tensor();
  *begin = low - place.offset;
  return Region(OwnMaster(place.bucket), low - rank() * slice, high - low);
}

absl::Status Engine::Impl::GatherScope(const std::vector<std::string>& names,
                                       int modifier_rank) {
  if (modifier_rank >= world()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GatherParameters on rank ", rank(), ": modifier_rank ", modifier_rank,
        " is not a rank of this job (world size ", world(), ")"));
  }
  for (const std::string& name : names) {
    absl::StatusOr<nn::Parameter*> parameter =
        engine_.model_->FindParameter(name);
    if (!parameter.ok()) {
      return absl::NotFoundError(absl::StrCat("GatherParameters on rank ",
                                              rank(), ": no parameter named '",
                                              name, "'"));
    }
  }
  if (stage3_) return stage3_->GatherScope(names);
  return absl::OkStatus();  // stages 0-2 hold full weights already
}

absl::Status Engine::Impl::ReleaseScope(const std::vector<std::string>& names,
                                        int modifier_rank) {
  if (stage3_) return stage3_->ReleaseScope(names, modifier_rank);
  if (modifier_rank < 0) return absl::OkStatus();
  for (const std::string& name : names) {
    ZE_ASSIGN_OR_RETURN(nn::Parameter * parameter,
                        engine_.model_->FindParameter(name));
    ZE_ASSIGN_OR_RETURN(Tensor data, parameter->data());
    if (world() > 1) {
      ZE_ASSIGN_OR_RETURN(comm::Work work,
                          comm().Broadcast(data, modifier_rank, stream()));
      ZE_RETURN_IF_ERROR(work.StreamWait(stream()));
    }
    auto found = index_of_.find(parameter);
    if (found == index_of_.end() || master_aliases_weights_) continue;
    int64_t begin = 0;
    Tensor master = MasterPiece(found->second, &begin);
    if (!master.defined()) continue;
    ZE_RETURN_IF_ERROR(
        Copy(data.Flat().Slice(begin, master.numel()), master, stream()));
  }
  return stream().Synchronize();
}

absl::StatusOr<LoadReport> Engine::Impl::LoadWeights(const std::string& path) {
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<safetensors::Reader> reader,
                      safetensors::Reader::Open(path));
  LoadReport report;
  if (stage3_) {
    ZE_ASSIGN_OR_RETURN(report.bytes_read, stage3_->LoadWeights(*reader));
    for (nn::Parameter* parameter : engine_.model_->Parameters()) {
      (void)parameter;
      ++report.tensors;
    }
    return report;
  }
  for (nn::Parameter* parameter : engine_.model_->Parameters()) {
    const std::string name = parameter->name();
    const safetensors::TensorInfo* info = reader->Find(name);
    if (info == nullptr) {
      return absl::NotFoundError(absl::StrCat("LoadWeights on rank ", rank(),
                                              ": parameter '", name,
                                              "' is not in ", path));
    }
    if (info->shape != parameter->shape()) {
      return absl::InvalidArgumentError(
          absl::StrCat("LoadWeights on rank ", rank(), ": parameter '", name,
                       "' is ", ShapeToString(parameter->shape()), " but ",
                       path, " has ", ShapeToString(info->shape)));
    }
    ZE_ASSIGN_OR_RETURN(Tensor host, reader->ReadTensor(name));
    report.bytes_read += static_cast<int64_t>(info->num_bytes());
    ++report.tensors;
    ZE_ASSIGN_OR_RETURN(Tensor data, parameter->data());
    Tensor staged = host;
    if (data.device().is_cuda() && host.dtype() != data.dtype()) {
      ZE_ASSIGN_OR_RETURN(
          staged, Tensor::Empty(host.shape(), data.dtype(), Device::Cpu()));
      ZE_RETURN_IF_ERROR(Copy(host, staged, stream()));
    }
    ZE_RETURN_IF_ERROR(Copy(staged, data, stream()));
    auto found = index_of_.find(parameter);
    if (found != index_of_.end() && !master_aliases_weights_) {
      int64_t begin = 0;
      Tensor master = MasterPiece(found->second, &begin);
      if (master.defined()) {
        Tensor source = host.Flat().Slice(begin, master.numel());
        if (master.device().is_cuda() && host.dtype() != DType::kF32) {
          ZE_ASSIGN_OR_RETURN(
              Tensor f32,
              Tensor::Empty({master.numel()}, DType::kF32, Device::Cpu()));
          ZE_RETURN_IF_ERROR(Copy(source, f32, stream()));
          source = f32;
          ZE_RETURN_IF_ERROR(Copy(source, master, stream()));
          ZE_RETURN_IF_ERROR(stream().Synchronize());
        } else {
          ZE_RETURN_IF_ERROR(Copy(source, master, stream()));
        }
      }
    }
    ZE_RETURN_IF_ERROR(stream().Synchronize());
  }
  return report;
}

// ------------------------------------------------------------------ Engine

Engine::~Engine() = default;

bool Engine::IsGradientAccumulationBoundary() const {
  const int64_t accumulation = config_.gradient_accumulation_steps.value();
  return (counters_.micro_steps + 1) % accumulation == 0;
}

double Engine::current_learning_rate() const {
  return impl_->state().learning_rate();
}

double Engine::current_loss_scale() const {
  return impl_->state().loss_scale();
}

absl::StatusOr<float> Engine::Forward(const Tensor& tokens,
                                      const Tensor& targets) {
  const int64_t micro = config_.train_micro_batch_size_per_gpu.value();
  if (tokens.dim() != 2 || tokens.size(0) != micro ||
      targets.shape() != tokens.shape()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Engine::Forward on rank ", communicator_->rank(),
        ": tokens and targets must both be (train_micro_batch_size_per_gpu=",
        micro, ", T) i32, got ", tokens.DebugString(), " and ",
        targets.DebugString()));
  }
  Tensor device_tokens = tokens;
  Tensor device_targets = targets;
  const Device device = model_->device();
  if (tokens.device() != device) {
    ZE_ASSIGN_OR_RETURN(device_tokens,
                        Tensor::Empty(tokens.shape(), tokens.dtype(), device));
    ZE_RETURN_IF_ERROR(Copy(tokens, device_tokens, compute_stream_));
  }
  if (targets.device() != device) {
    ZE_ASSIGN_OR_RETURN(device_targets, Tensor::Empty(targets.shape(),
                                                      targets.dtype(), device));
    ZE_RETURN_IF_ERROR(Copy(targets, device_targets, compute_stream_));
  }
  const Clock::time_point start = Clock::now();
  impl_->BeginForward();
  ZE_ASSIGN_OR_RETURN(
      float loss,
      model_->ForwardLoss(device_tokens, device_targets, compute_stream_));
  impl_->add_loss(loss);
  last_tokens_ = tokens.numel();
  ZE_RETURN_IF_ERROR(EndPhase(0, start));
  return loss;
}

absl::Status Engine::Backward() {
  const Clock::time_point start = Clock::now();
  ZE_RETURN_IF_ERROR(impl_->BeginBackward());
  const double scale =
      impl_->state().loss_scale() / config_.gradient_accumulation_steps.value();
  absl::Status status =
      model_->BackwardLoss(static_cast<float>(scale), compute_stream_);
  absl::Status end = impl_->EndBackward();
  ZE_RETURN_IF_ERROR(status);
  ZE_RETURN_IF_ERROR(end);
  return EndPhase(1, start);
}

absl::StatusOr<StepReport> Engine::Step() {
  const bool boundary = IsGradientAccumulationBoundary();
  const int64_t micro = config_.train_micro_batch_size_per_gpu.value();
  counters_.micro_steps += 1;
  counters_.global_samples += micro * communicator_->world_size();
  window_tokens_ += last_tokens_ * communicator_->world_size();
  if (!boundary) return StepReport{};
  const Clock::time_point start = Clock::now();
  ZE_ASSIGN_OR_RETURN(StepReport report, impl_->BoundaryStep());
  counters_.global_steps += 1;
  if (report.skipped) {
    counters_.skipped_steps += 1;
  }
  ZE_RETURN_IF_ERROR(EndPhase(2, start));
  ZE_RETURN_IF_ERROR(ReportStep(report));
  return report;
}

absl::Status Engine::EndPhase(int phase, Clock::time_point start) {
  if (config_.wall_clock_breakdown) {
    // The phase's queued work is part of its time.
    ZE_RETURN_IF_ERROR(compute_stream_.Synchronize());
    const double ms =
        std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    window_phase_ms_[phase] += ms;
    window_phase_count_[phase] += 1;
    step_phase_ms_[phase] += ms;
  }
  if (config_.memory_breakdown) {
    phase_memory_[phase] = GetAllocator(model_->device())->stats();
  }
  return absl::OkStatus();
}

absl::Status Engine::ReportStep(const StepReport& report) {
  // A failed csv write (a full disk, a removed directory) must not fail the
  // step: the update has been applied, and only rank 0 writes, so an error
  // here would stop rank 0 alone and leave the others waiting in the next
  // collective. It is logged once and monitoring stops; training goes on.
  absl::Status monitor_status;
  if (monitor_.enabled()) {
    const int64_t samples = counters_.global_samples;
    auto write = [&](const char* name, double value) {
      if (monitor_status.ok()) {
        monitor_status = monitor_.Write(name, value, samples);
      }
    };
    write("Train/Samples/train_loss", report.loss);
    write("Train/Samples/lr", report.learning_rate);
    if (config::GetTrainingPrecision(config_) ==
        config::TrainingPrecision::kFp16) {
      write("Train/Samples/loss_scale", report.loss_scale);
    }
    if (config_.wall_clock_breakdown) {
      write("Train/Samples/elapsed_time_ms_forward", step_phase_ms_[0]);
      write("Train/Samples/elapsed_time_ms_backward", step_phase_ms_[1]);
      write("Train/Samples/elapsed_time_ms_step", step_phase_ms_[2]);
    }
    if (!monitor_status.ok()) {
      ZE_LOG(WARNING) << monitor_status.message()
                      << "; csv_monitor stops here, training goes on (rows "
                         "written before stay in "
                      << monitor_.directory() << ")";
      monitor_ = CsvMonitor();
    }
  }
  for (double& ms : step_phase_ms_) ms = 0;
  const int64_t every = config_.steps_per_print;
  if (every <= 0 || counters_.global_steps % every != 0) {
    return absl::OkStatus();
  }
  const double seconds =
      std::chrono::duration<double>(Clock::now() - window_start_).count();
  const double samples =
      static_cast<double>(every) * config_.train_batch_size.value();
  ZE_LOG_RANK0(INFO) << absl::StrFormat(
      "step %d loss %.6f lr %.6g loss_scale %g skipped %d samples/s %.1f "
      "tokens/s %.1f",
      counters_.global_steps, report.loss, report.learning_rate,
      report.loss_scale, counters_.skipped_steps, samples / seconds,
      window_tokens_ / seconds);
  window_start_ = Clock::now();
  window_tokens_ = 0;
  if (config_.wall_clock_breakdown) {
    auto mean = [&](int phase) {
      return window_phase_count_[phase] > 0
                 ? window_phase_ms_[phase] / window_phase_count_[phase]
                 : 0.0;
    };
    ZE_LOG_RANK0(INFO) << absl::StrFormat(
        "time (ms) | forward: %.2f | backward: %.2f | step: %.2f (means per "
        "micro-step and per step since the last print)",
        mean(0), mean(1), mean(2));
    for (int phase = 0; phase < 3; ++phase) {
      window_phase_ms_[phase] = 0;
      window_phase_count_[phase] = 0;
    }
  }
  if (config_.memory_breakdown) {
    Allocator* allocator = GetAllocator(model_->device());
    const AllocatorStats now = allocator->stats();
    constexpr double kGib = 1024.0 * 1024.0 * 1024.0;
    ZE_LOG_RANK0(INFO) << absl::StrFormat(
        "memory (GiB, %s) | after forward: %.3f | after backward: %.3f | "
        "after step: %.3f | peak since last print: %.3f | reserved: %.3f",
        allocator->name(), phase_memory_[0].bytes_in_use / kGib,
        phase_memory_[1].bytes_in_use / kGib,
        phase_memory_[2].bytes_in_use / kGib, now.peak_bytes_in_use / kGib,
        now.bytes_reserved / kGib);
    allocator->ResetPeak();
  }
  return absl::OkStatus();
}

absl::StatusOr<StepReport> Engine::TrainBatch(
    const std::vector<std::pair<Tensor, Tensor>>& micro_batches) {
  const int64_t accumulation = config_.gradient_accumulation_steps.value();
  if (static_cast<int64_t>(micro_batches.size()) != accumulation) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TrainBatch takes gradient_accumulation_steps=", accumulation,
        " micro-batches, got ", micro_batches.size()));
  }
  StepReport report;
  for (const auto& [tokens, targets] : micro_batches) {
    ZE_RETURN_IF_ERROR(Forward(tokens, targets).status());
    ZE_RETURN_IF_ERROR(Backward());
    ZE_ASSIGN_OR_RETURN(report, Step());
  }
  return report;
}

absl::StatusOr<std::vector<float>> Engine::GatherMasterWeights(
    const std::string& name) {
  return impl_->GatherMasterWeights(name);
}

absl::StatusOr<Tensor> Engine::OnModelDevice(const Tensor& tensor) {
  if (tensor.device() == model_->device()) return tensor;
  ZE_ASSIGN_OR_RETURN(Tensor copy, Tensor::Empty(tensor.shape(), tensor.dtype(),
                                                 model_->device()));
  ZE_RETURN_IF_ERROR(Copy(tensor, copy, compute_stream_));
  return copy;
}

absl::Status Engine::RequireNoPendingBackward(const char* what) const {
  if (model_->PendingBackwardCalls() == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, " on rank ", communicator_->rank(),
      ": the last Forward has not been backpropagated yet; call Backward "
      "first (its saved activations would be lost)"));
}

absl::StatusOr<float> Engine::EvalForward(const Tensor& tokens,
                                          const Tensor& targets) {
  ZE_RETURN_IF_ERROR(RequireNoPendingBackward("EvalForward"));
  if (tokens.dim() != 2 || targets.shape() != tokens.shape() ||
      tokens.dtype() != DType::kI32 || targets.dtype() != DType::kI32) {
    return absl::InvalidArgumentError(
        absl::StrCat("EvalForward on rank ", communicator_->rank(),
                     ": tokens and targets must both be (B, T) i32, got ",
                     tokens.DebugString(), " and ", targets.DebugString()));
  }
  ZE_ASSIGN_OR_RETURN(Tensor device_tokens, OnModelDevice(tokens));
  ZE_ASSIGN_OR_RETURN(Tensor device_targets, OnModelDevice(targets));
  ZE_RETURN_IF_ERROR(impl_->BeginEval());
  absl::StatusOr<float> loss;
  {
    nn::NoSaveScope no_save;
    loss = model_->ForwardLoss(device_tokens, device_targets, compute_stream_);
  }
  // What the loss keeps for a backward (e.g. GPT's logits) must not be
  // mistaken for a training forward's.
  model_->ClearSavedState();
  const absl::Status end = impl_->EndEval();
  ZE_RETURN_IF_ERROR(loss.status());
  ZE_RETURN_IF_ERROR(end);
  return *loss;
}

absl::StatusOr<std::vector<int32_t>> Engine::Generate(
    const std::vector<int32_t>& prompt_tokens, int max_new_tokens,
    const GenerateOptions& options) {
  const int rank = communicator_->rank();
  if (prompt_tokens.empty() || max_new_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Generate on rank ", rank, ": needs a non-empty prompt (got ",
        prompt_tokens.size(), " tokens) and max_new_tokens >= 0 (got ",
        max_new_tokens, ")"));
  }
  ZE_RETURN_IF_ERROR(RequireNoPendingBackward("Generate"));
  ZE_RETURN_IF_ERROR(impl_->BeginEval());
  std::vector<int32_t> sequence = prompt_tokens;
  std::vector<int32_t> generated;
  auto decode = [&]() -> absl::Status {
    for (int i = 0; i < max_new_tokens; ++i) {
      const int64_t length = static_cast<int64_t>(sequence.size());
      const int64_t first =
          options.max_context > 0
              ? std::max<int64_t>(0, length - options.max_context)
              : 0;
      const int64_t t = length - first;
      ZE_ASSIGN_OR_RETURN(Tensor host,
                          Tensor::Empty({1, t}, DType::kI32, Device::Cpu()));
      std::copy(sequence.begin() + first, sequence.end(),
                host.data_as<int32_t>());
      ZE_ASSIGN_OR_RETURN(Tensor tokens, OnModelDevice(host));
      absl::StatusOr<Tensor> logits;
      {
        nn::NoSaveScope no_save;
        logits = model_->Forward(tokens, compute_stream_);  // (1, t, V)
      }
      ZE_RETURN_IF_ERROR(logits.status());
      if (logits->dim() != 3 || logits->size(0) != 1 || logits->size(1) != t) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Generate on rank ", rank,
            ": the model's Forward must return logits (1, ", t,
            ", V) for tokens (1, ", t, "), got ", logits->DebugString()));
      }
      const int64_t columns = logits->size(2);
      const int64_t vocab = options.vocab_size > 0
                                ? std::min(options.vocab_size, columns)
                                : columns;
      ZE_ASSIGN_OR_RETURN(
          std::vector<float> last,
          ToHostFloats(logits->Flat().Slice((t - 1) * columns, vocab),
                       compute_stream_));
      // The first maximum: every rank holds the same logits and picks the
      // same token, so the next step's collectives stay in step.
      const int32_t next = static_cast<int32_t>(
          std::max_element(last.begin(), last.end()) - last.begin());
      sequence.push_back(next);
      generated.push_back(next);
    }
    return absl::OkStatus();
  };
  const absl::Status status = decode();
  model_->ClearSavedState();
  const absl::Status end = impl_->EndEval();
  ZE_RETURN_IF_ERROR(status);
  ZE_RETURN_IF_ERROR(end);
  return generated;
}

absl::StatusOr<std::unique_ptr<GatheredParameters>> Engine::GatherParameters(
    const std::vector<std::string>& names, int modifier_rank) {
  ZE_RETURN_IF_ERROR(RequireNoPendingBackward("GatherParameters"));
  ZE_RETURN_IF_ERROR(impl_->GatherScope(names, modifier_rank));
  return std::unique_ptr<GatheredParameters>(
      new GatheredParameters(this, names, modifier_rank));
}

absl::StatusOr<LoadReport> Engine::LoadWeights(const std::string& path) {
  ZE_RETURN_IF_ERROR(RequireNoPendingBackward("LoadWeights"));
  return impl_->LoadWeights(path);
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
  status_ = engine_->impl_->ReleaseScope(names_, modifier_rank_);
  return status_;
}

std::vector<std::string> Engine::ParameterNames() const {
  return impl_->ParameterNames();
}

CommunicationCounters Engine::communication_counters() const {
  return impl_->communication_counters();
}

absl::StatusOr<std::unique_ptr<Engine>> Initialize(
    std::shared_ptr<nn::LossModel> model, const config::Config& config,
    std::shared_ptr<comm::Communicator> communicator) {
  if (model == nullptr) {
    return absl::InvalidArgumentError("engine::Initialize: model is null");
  }
  ZE_ASSIGN_OR_RETURN(communicator,
                      CommunicatorFor(*model, std::move(communicator)));
  if (config.world_size != communicator->world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.source, ": the config was checked for world size ",
                     config.world_size, " but the job has ",
                     communicator->world_size(), " ranks"));
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
  std::unique_ptr<Engine> engine(new Engine());
  engine->config_ = config;
  engine->model_ = std::move(model);
  engine->communicator_ = std::move(communicator);
  if (engine->model_->device().is_cuda()) {
    ZE_ASSIGN_OR_RETURN(engine->compute_stream_,
                        Stream::Create(engine->model_->device()));
  }
  if (config.csv_monitor.enabled) {
    // Only rank 0 writes; every rank learns whether it could (the config,
    // and so this branch, is the same on every rank).
    absl::StatusOr<CsvMonitor> monitor =
        CsvMonitor::Create(config.csv_monitor, engine->communicator_->rank());
    ZE_RETURN_IF_ERROR(AgreeAcrossRanks(
        *engine->communicator_, monitor.status(), engine->compute_stream_,
        absl::StrCat(config.source, ": csv_monitor")));
    engine->monitor_ = std::move(monitor).value();
  }
  engine->impl_ = std::make_unique<Engine::Impl>(engine.get());
  ZE_RETURN_IF_ERROR(engine->impl_->Setup());
  engine->window_start_ = Clock::now();
  if (engine->communicator_->rank() == 0) {
    ZE_LOG_RANK0(INFO) << "config (" << config.source << "):\n"
                       << config::ToJson(config);
    ZE_LOG_RANK0(INFO) << "ZeRO stage " << config.zero_optimization.stage
                       << ", world size " << engine->communicator_->world_size()
                       << ", " << engine->memory_.ToString();
  }
  return engine;
}

absl::StatusOr<std::unique_ptr<Engine>> Initialize(
    std::shared_ptr<nn::LossModel> model,
    const std::string& config_path_or_json,
    std::shared_ptr<comm::Communicator> communicator) {
  if (model == nullptr) {
    return absl::InvalidArgumentError("engine::Initialize: model is null");
  }
  ZE_ASSIGN_OR_RETURN(communicator,
                      CommunicatorFor(*model, std::move(communicator)));
  const int world = communicator->world_size();
  absl::StatusOr<config::Config> loaded =
      !config_path_or_json.empty() && config_path_or_json[0] == '{'
          ? config::LoadConfigString(config_path_or_json, world)
          : config::LoadConfigFile(config_path_or_json, world);
  ZE_RETURN_IF_ERROR(loaded.status());
  config::ResolutionContext context;
  context.world_size = world;
  ZE_ASSIGN_OR_RETURN(config::Config resolved,
                      config::Resolve(*loaded, context));
  return Initialize(std::move(model), resolved, std::move(communicator));
}

}  // namespace engine
}  // namespace ze
