#include "engine/stage3.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/logging.h"
#include "core/ops.h"
#include "core/status.h"

namespace ze {
namespace engine {
namespace {

Tensor Region(const Tensor& flat, int64_t offset, int64_t count) {
  return flat.Slice(offset, count);
}

// 2^24: integers below it are exact in f32, so the hash travels as two
// 24-bit halves through an f32 all-reduce.
constexpr uint64_t kHalf = uint64_t{1} << 24;

}  // namespace

Stage3::~Stage3() {
  for (size_t i = 0; i < hooks_.size(); ++i) {
    hook_modules_[i]->RemoveHook(hooks_[i]);
  }
  for (nn::Parameter* parameter : params_) parameter->ReleaseGrad();
}

absl::StatusOr<std::unique_ptr<Stage3>> Stage3::Create(
    const Stage3Context& context) {
  std::unique_ptr<Stage3> stage3(new Stage3(context));
  stage3->model_dtype_ = context.model->dtype();
  stage3->master_aliases_weights_ = stage3->model_dtype_ == DType::kF32;
  ZE_RETURN_IF_ERROR(stage3->Layout());
  ZE_RETURN_IF_ERROR(stage3->Allocate());
  ZE_RETURN_IF_ERROR(stage3->InstallHooks());
  return stage3;
}

// One bucket of trainable and one of frozen parameters per module, in
// Modules() order; a parameter goes to the first module listing it.
absl::Status Stage3::Layout() {
  nn::LossModel& model = *context_.model;
  std::unordered_set<const nn::Parameter*> placed;
  std::vector<std::vector<zero::ParamSpec>> groups;
  std::vector<bool> group_trainable;
  for (nn::Module* module : model.Modules()) {
    std::vector<zero::ParamSpec> trainable, frozen;
    std::vector<nn::Parameter*> trainable_params, frozen_params;
    for (nn::Parameter* parameter : module->DirectParameters()) {
      if (!placed.insert(parameter).second) continue;
      if (parameter->requires_grad()) {
        trainable.push_back({parameter->name(), parameter->numel()});
        trainable_params.push_back(parameter);
      } else {
        frozen.push_back({parameter->name(), parameter->numel()});
        frozen_params.push_back(parameter);
      }
    }
    if (!trainable.empty()) {
      groups.push_back(trainable);
      group_trainable.push_back(true);
      params_.insert(params_.end(), trainable_params.begin(),
                     trainable_params.end());
    }
    if (!frozen.empty()) {
      groups.push_back(frozen);
      group_trainable.push_back(false);
      params_.insert(params_.end(), frozen_params.begin(), frozen_params.end());
    }
  }
  zero::LayoutOptions options;
  options.world_size = world();
  ZE_ASSIGN_OR_RETURN(
      layout_, zero::PartitionedLayout::BuildFromGroups(groups, options));
  buckets_.resize(layout_.num_buckets());
  const int64_t threshold =
      zero_config().stage3_param_persistence_threshold.value();
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    buckets_[b].trainable = group_trainable[b];
    int64_t elements = 0;
    for (int i = layout_.bucket(b).first_param; i < layout_.bucket(b).end_param;
         ++i) {
      elements += layout_.param(i).numel;
    }
    buckets_[b].persistent = elements < threshold;
  }
  std::unordered_map<const nn::Parameter*, int> bucket_of;
  for (int i = 0; i < layout_.num_params(); ++i) {
    bucket_of[params_[i]] = layout_.placement(i).bucket;
  }
  for (nn::Module* module : model.Modules()) {
    ModuleEntry entry;
    entry.module = module;
    for (nn::Parameter* parameter : module->DirectParameters()) {
      const int bucket = bucket_of.at(parameter);
      if (std::find(entry.buckets.begin(), entry.buckets.end(), bucket) ==
          entry.buckets.end()) {
        entry.buckets.push_back(bucket);
      }
    }
    if (!entry.buckets.empty()) entries_.push_back(entry);
  }
  return absl::OkStatus();
}

absl::Status Stage3::Allocate() {
  const int64_t psi_all = layout_.total_param_elements();
  const int64_t partition = layout_.partition_elements();
  const int64_t element_bytes = static_cast<int64_t>(SizeOf(model_dtype_));
  const zero::OptimizerOptions& optimizer_options =
      context_.state->optimizer_options();
  int64_t psi = 0;  // trainable, as stages 0-2 count it
  for (int i = 0; i < layout_.num_params(); ++i) {
    if (params_[i]->requires_grad()) psi += layout_.param(i).numel;
  }
  (void)psi_all;
  MemoryBreakdown& memory = *context_.memory;
  memory.parameter_elements = psi;
  memory.model_weight_bytes = partition * element_bytes;
  memory.gradient_bytes = partition * element_bytes;
  memory.master_weight_bytes = master_aliases_weights_ ? 0 : partition * 4;
  memory.optimizer_state_bytes =
      partition * zero::StateBytesPerElement(optimizer_options);
  memory.paper_bytes = 16.0 * psi / world();

  auto annotate = [&](const absl::Status& status) {
    return absl::Status(
        status.code(),
        absl::StrCat("model state does not fit on rank ", rank(), " (",
                     device().ToString(), "): ZeRO stage 3 needs ",
                     memory.total_bytes(), " bytes per rank (",
                     memory.ToString(), "): ", status.message()));
  };
  auto allocate = [&](int64_t count, DType dtype) -> absl::StatusOr<Tensor> {
    absl::StatusOr<Tensor> tensor = Tensor::Zeros({count}, dtype, device());
    if (!tensor.ok()) return annotate(tensor.status());
    return tensor;
  };
  ZE_ASSIGN_OR_RETURN(weights_, allocate(partition, model_dtype_));
  ZE_ASSIGN_OR_RETURN(grads_, allocate(partition, model_dtype_));

  // This rank's pieces of every parameter: sliced from full data when the
  // model has it (then dropped), else generated for this range only.
  const uint64_t seed = static_cast<uint64_t>(context_.config->seed);
  for (const zero::ParamShard& shard : layout_.RankShards(rank())) {
    nn::Parameter* parameter = params_[shard.param_index];
    Tensor own = Region(weights_, shard.partition_offset, shard.count);
    if (parameter->state() == nn::ParameterState::kFull) {
      ZE_ASSIGN_OR_RETURN(Tensor full, parameter->data());
      ZE_RETURN_IF_ERROR(Copy(full.Flat().Slice(shard.param_begin, shard.count),
                              own, stream()));
    } else {
      ZE_RETURN_IF_ERROR(
          parameter->InitializeSlice(seed, shard.param_begin, own, stream()));
    }
    ZE_RETURN_IF_ERROR(parameter->SetShard(own, shard.param_begin));
  }
  ZE_RETURN_IF_ERROR(stream().Synchronize());
  for (nn::Parameter* parameter : params_) parameter->ReleaseData();

  if (!master_aliases_weights_) {
    ZE_ASSIGN_OR_RETURN(master_, allocate(partition, DType::kF32));
  }
  optimizers_.resize(layout_.num_buckets());
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    if (!buckets_[b].trainable) continue;
    absl::StatusOr<std::unique_ptr<zero::FlatOptimizer>> optimizer =
        zero::FlatOptimizer::Create(optimizer_options,
                                    layout_.bucket(b).slice_elements, device());
    if (!optimizer.ok()) return annotate(optimizer.status());
    optimizers_[b] = std::move(optimizer).value();
    if (!master_aliases_weights_) {
      ZE_RETURN_IF_ERROR(Copy(OwnWeights(b), OwnMaster(b), stream()));
    }
  }
  return stream().Synchronize();
}

Tensor Stage3::OwnWeights(int bucket) const {
  const zero::BucketLayout& layout = layout_.bucket(bucket);
  return Region(weights_, layout.partition_offset, layout.slice_elements);
}

Tensor Stage3::OwnMaster(int bucket) const {
  if (master_aliases_weights_) return OwnWeights(bucket);
  const zero::BucketLayout& layout = layout_.bucket(bucket);
  return Region(master_, layout.partition_offset, layout.slice_elements);
}

Tensor Stage3::OwnGrads(int bucket) const {
  const zero::BucketLayout& layout = layout_.bucket(bucket);
  return Region(grads_, layout.partition_offset, layout.slice_elements);
}

absl::Status Stage3::InstallHooks() {
  nn::LossModel& model = *context_.model;
  auto add = [&](nn::Module* module, nn::HookKind kind, nn::Hook hook) {
    hooks_.push_back(module->AddHook(kind, std::move(hook)));
    hook_modules_.push_back(module);
  };
  // First of the root's hooks: a training (or evaluation) forward starts.
  add(&model, nn::HookKind::kPreForward,
      [this](nn::Module&, const Stream&) -> absl::Status {
        if (in_backward_) return absl::OkStatus();
        return BeginMicroStep();
      });
  for (int e = 0; e < static_cast<int>(entries_.size()); ++e) {
    nn::Module* module = entries_[e].module;
    add(module, nn::HookKind::kPreForward,
        [this, e](nn::Module&, const Stream&) -> absl::Status {
          // A use is a forward call that will be backpropagated; the
          // recomputation of a checkpointed module (in backward) is not.
          if (!in_backward_) {
            for (int b : entries_[e].buckets) {
              if (buckets_[b].trainable) ++buckets_[b].pending_uses;
            }
          }
          return Acquire(e, /*backward=*/false);
        });
    add(module, nn::HookKind::kPostForward,
        [this, e](nn::Module&, const Stream&) { return Release(e); });
    add(module, nn::HookKind::kPreBackward,
        [this, e](nn::Module&, const Stream&) {
          return Acquire(e, /*backward=*/true);
        });
    add(module, nn::HookKind::kPostBackward,
        [this, e](nn::Module&, const Stream&) -> absl::Status {
          ZE_RETURN_IF_ERROR(Release(e));
          return AfterBackward(e);
        });
  }
  return absl::OkStatus();
}

absl::Status Stage3::BeginMicroStep() {
  // Forward uses left by an evaluation forward that was never
  // backpropagated do not count.
  for (Bucket& bucket : buckets_) bucket.pending_uses = 0;
  position_ = 0;
  observed_.clear();
  observed_entries_.clear();
  order_changed_ = false;
  prefetching_ =
      trace_valid_ && zero_config().stage3_prefetch_bucket_size.value() > 0;
  return absl::OkStatus();
}

void Stage3::Fold(uint64_t value) {
  // FNV-1a over 64-bit words.
  schedule_hash_ ^= value + 0x9e3779b97f4a7c15ull;
  schedule_hash_ *= 0x100000001b3ull;
}

absl::Status Stage3::Acquire(int entry, bool backward) {
  observed_entries_.push_back(entry);
  step_entries_.push_back(entry);
  for (int b : entries_[entry].buckets) {
    Fold(static_cast<uint64_t>(b) * 2 + (backward ? 1 : 0));
    if (prefetching_ &&
        (position_ >= trace_.size() || trace_[position_] != b)) {
      // Every rank on the same path notices at the same request, so the
      // collectives stay in step.
      ZE_LOG_RANK0(INFO) << "ZeRO-3: module order changed at request "
                         << position_ << " ("
                         << entries_[entry].module->DisplayName()
                         << "); fetching on demand for this step and "
                            "recording the new order";
      prefetching_ = false;
      order_changed_ = true;
    }
    ++position_;
    observed_.push_back(b);
    Bucket& bucket = buckets_[b];
    if (!bucket.gathered.defined()) ZE_RETURN_IF_ERROR(IssueGather(b));
    ZE_RETURN_IF_ERROR(WaitGather(b));
    ++bucket.users;
    if (backward && bucket.trainable) ZE_RETURN_IF_ERROR(EnsureGrads(b));
  }
  if (prefetching_) ZE_RETURN_IF_ERROR(Prefetch());
  return absl::OkStatus();
}

absl::Status Stage3::Release(int entry) {
  for (int b : entries_[entry].buckets) {
    Bucket& bucket = buckets_[b];
    if (bucket.users > 0) --bucket.users;
    if (bucket.users == 0 && !bucket.persistent) {
      ZE_RETURN_IF_ERROR(FreeGathered(b));
    }
  }
  return absl::OkStatus();
}

absl::Status Stage3::AfterBackward(int entry) {
  for (int b : entries_[entry].buckets) {
    Bucket& bucket = buckets_[b];
    if (!bucket.trainable || bucket.pending_uses == 0) continue;
    if (--bucket.pending_uses == 0 && bucket.grads.defined()) {
      ZE_RETURN_IF_ERROR(IssueReduce(b));
    }
  }
  return absl::OkStatus();
}

absl::Status Stage3::IssueGather(int b) {
  Bucket& bucket = buckets_[b];
  const zero::BucketLayout& layout = layout_.bucket(b);
  ZE_ASSIGN_OR_RETURN(bucket.gathered, Tensor::Empty({layout.padded_elements},
                                                     model_dtype_, device()));
  ZE_ASSIGN_OR_RETURN(
      bucket.gather_work,
      comm().AllGather(OwnWeights(b), bucket.gathered, stream()));
  bucket.in_flight = true;
  step_counters_.all_gathered_elements += layout.padded_elements;
  step_counters_.all_gathers += 1;
  live_elements_ += layout.padded_elements;
  peak_live_elements_ = std::max(peak_live_elements_, live_elements_);
  return absl::OkStatus();
}

// Waits for an issued gather and points the parameters at the buffer.
absl::Status Stage3::WaitGather(int b) {
  Bucket& bucket = buckets_[b];
  if (!bucket.in_flight) return absl::OkStatus();
  ZE_RETURN_IF_ERROR(bucket.gather_work.StreamWait(stream()));
  bucket.gather_work = comm::Work();
  bucket.in_flight = false;
  const zero::BucketLayout& layout = layout_.bucket(b);
  for (int i = layout.first_param; i < layout.end_param; ++i) {
    const zero::ParamPlacement& place = layout_.placement(i);
    ZE_RETURN_IF_ERROR(
        params_[i]->SetData(Region(bucket.gathered, place.offset, place.numel)
                                .View(params_[i]->shape())));
  }
  return absl::OkStatus();
}

absl::Status Stage3::FreeGathered(int b) {
  Bucket& bucket = buckets_[b];
  if (!bucket.gathered.defined()) return absl::OkStatus();
  // The buffer may only be reused once the all-gather writing it is done.
  if (bucket.in_flight) ZE_RETURN_IF_ERROR(bucket.gather_work.Wait());
  bucket.gather_work = comm::Work();
  bucket.in_flight = false;
  const zero::BucketLayout& layout = layout_.bucket(b);
  for (int i = layout.first_param; i < layout.end_param; ++i) {
    params_[i]->ReleaseData();
  }
  bucket.gathered = Tensor();
  live_elements_ -= layout.padded_elements;
  return absl::OkStatus();
}

// Issues the gathers of the recorded order's next buckets. Deterministic in
// the record and the gathered set, so every rank issues the same ones.
absl::Status Stage3::Prefetch() {
  int64_t budget = zero_config().stage3_prefetch_bucket_size.value();
  const int64_t max_live = zero_config().stage3_max_live_parameters;
  for (size_t q = position_; q < trace_.size(); ++q) {
    const int b = trace_[q];
    if (buckets_[b].gathered.defined()) continue;
    const int64_t elements = layout_.bucket(b).padded_elements;
    if (elements > budget || live_elements_ + elements > max_live) break;
    budget -= elements;
    ZE_RETURN_IF_ERROR(IssueGather(b));
  }
  return absl::OkStatus();
}

absl::Status Stage3::EnsureGrads(int b) {
  Bucket& bucket = buckets_[b];
  if (bucket.grads.defined()) return absl::OkStatus();
  const zero::BucketLayout& layout = layout_.bucket(b);
  ZE_ASSIGN_OR_RETURN(bucket.grads, Tensor::Empty({layout.padded_elements},
                                                  model_dtype_, device()));
  ZE_RETURN_IF_ERROR(Fill(bucket.grads, 0.0f, stream()));
  for (int i = layout.first_param; i < layout.end_param; ++i) {
    const zero::ParamPlacement& place = layout_.placement(i);
    ZE_RETURN_IF_ERROR(
        params_[i]->SetGrad(Region(bucket.grads, place.offset, place.numel)
                                .View(params_[i]->shape())));
  }
  return absl::OkStatus();
}

absl::Status Stage3::IssueReduce(int b) {
  Bucket& bucket = buckets_[b];
  const zero::BucketLayout& layout = layout_.bucket(b);
  Fold(0x5253000000000000ull + static_cast<uint64_t>(b));
  if (context_.config->prescale_gradients) {
    ZE_RETURN_IF_ERROR(Scale(
        bucket.grads,
        static_cast<float>(1.0 / context_.config->gradient_predivide_factor),
        stream()));
  }
  ZE_ASSIGN_OR_RETURN(bucket.reduced, Tensor::Empty({layout.slice_elements},
                                                    model_dtype_, device()));
  ZE_ASSIGN_OR_RETURN(bucket.reduce_work,
                      comm().ReduceScatter(bucket.grads, bucket.reduced,
                                           comm::ReduceOp::kSum, stream()));
  step_counters_.reduce_scattered_elements += layout.padded_elements;
  step_counters_.reduce_scatters += 1;
  reduce_queue_.push_back(b);
  // Bound the gradient buffers in flight: finish the one two behind.
  if (reduce_queue_.size() > 2) {
    const int oldest = reduce_queue_.front();
    reduce_queue_.erase(reduce_queue_.begin());
    ZE_RETURN_IF_ERROR(FinishReduce(oldest));
  }
  return absl::OkStatus();
}

// Adds this rank's reduced slice into its gradient partition (accumulating
// over micro-steps) and frees the bucket's full gradients.
absl::Status Stage3::FinishReduce(int b) {
  Bucket& bucket = buckets_[b];
  ZE_RETURN_IF_ERROR(bucket.reduce_work.StreamWait(stream()));
  Tensor own = OwnGrads(b);
  ZE_RETURN_IF_ERROR(Add(own, bucket.reduced, own, stream()));
  const zero::BucketLayout& layout = layout_.bucket(b);
  for (int i = layout.first_param; i < layout.end_param; ++i) {
    params_[i]->ReleaseGrad();
  }
  bucket.grads = Tensor();
  bucket.reduced = Tensor();
  bucket.reduce_work = comm::Work();
  return absl::OkStatus();
}

absl::Status Stage3::BeginBackward() {
  in_backward_ = true;
  return absl::OkStatus();
}

absl::Status Stage3::EndBackward() {
  in_backward_ = false;
  // A bucket whose uses were not all backpropagated (a module the loss did
  // not reach) still holds gradients: reduce them, in bucket order.
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    Bucket& bucket = buckets_[b];
    if (bucket.grads.defined() && bucket.pending_uses > 0) {
      bucket.pending_uses = 0;
      ZE_RETURN_IF_ERROR(IssueReduce(b));
    }
    bucket.pending_uses = 0;
  }
  for (int b : reduce_queue_) ZE_RETURN_IF_ERROR(FinishReduce(b));
  reduce_queue_.clear();
  // Prefetched buckets the micro-step did not reach.
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    if (buckets_[b].users == 0 && !buckets_[b].persistent) {
      ZE_RETURN_IF_ERROR(FreeGathered(b));
    }
  }
  if (!trace_valid_ || order_changed_ || observed_ != trace_) {
    if (trace_valid_) {
      ZE_LOG_RANK0(INFO) << "ZeRO-3: recorded a new module order of "
                         << observed_.size() << " requests";
    }
    trace_ = observed_;
    trace_valid_ = true;
  }
  return absl::OkStatus();
}

absl::Status Stage3::RefreshPersistent() {
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    Bucket& bucket = buckets_[b];
    if (!bucket.persistent || !bucket.gathered.defined()) continue;
    ZE_RETURN_IF_ERROR(FreeGathered(b));
    ZE_RETURN_IF_ERROR(IssueGather(b));
    ZE_RETURN_IF_ERROR(WaitGather(b));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepReport> Stage3::BoundaryStep(double loss_sum) {
  TrainingState& state = *context_.state;
  StepReport report;
  report.boundary = true;
  report.loss_scale = state.loss_scale();

  // The statistics all-reduce (sum): [0] sum of squares of this rank's
  // gradient partition, [1] overflow flag, [2] summed losses. Coalesced
  // with it, an all-reduce (max) of the schedule hash and its negation,
  // giving every rank the hash's maximum and minimum over ranks.
  ZE_ASSIGN_OR_RETURN(Tensor stats, Tensor::Empty({3}, DType::kF32, device()));
  ZE_RETURN_IF_ERROR(Fill(stats, 0.0f, stream()));
  Tensor sum_of_squares = stats.Slice(0, 1);
  Tensor overflow = stats.Slice(1, 1);
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    if (!buckets_[b].trainable) continue;
    Tensor own = OwnGrads(b);
    ZE_RETURN_IF_ERROR(SumOfSquares(own, sum_of_squares, stream()));
    if (state.checks_overflow()) {
      ZE_RETURN_IF_ERROR(HasInfOrNan(own, overflow, stream()));
    }
  }
  ZE_RETURN_IF_ERROR(
      Fill(stats.Slice(2, 1), static_cast<float>(loss_sum), stream()));
  const uint64_t hash = schedule_hash_ & ((kHalf * kHalf) - 1);
  const float high = static_cast<float>(hash / kHalf);
  const float low = static_cast<float>(hash % kHalf);
  std::vector<float> hash_values = {high, low, -high, -low};
  ZE_ASSIGN_OR_RETURN(
      Tensor hashes,
      FromHostFloats(hash_values, {4}, DType::kF32, device(), stream()));
  ZE_ASSIGN_OR_RETURN(
      comm::Work work,
      comm().Coalesced(
          {comm::CollectiveOp::AllReduce(stats, stats, comm::ReduceOp::kSum),
           comm::CollectiveOp::AllReduce(hashes, hashes, comm::ReduceOp::kMax)},
          stream()));
  ZE_RETURN_IF_ERROR(work.Wait());
  ZE_ASSIGN_OR_RETURN(std::vector<float> values, ToHostFloats(stats, stream()));
  ZE_ASSIGN_OR_RETURN(std::vector<float> extremes,
                      ToHostFloats(hashes, stream()));
  if (extremes[0] != -extremes[2] || extremes[1] != -extremes[3]) {
    std::string order;
    const size_t shown = std::min<size_t>(step_entries_.size(), 48);
    for (size_t i = 0; i < shown; ++i) {
      absl::StrAppend(&order, i == 0 ? "" : ", ",
                      entries_[step_entries_[i]].module->DisplayName());
    }
    if (shown < step_entries_.size()) {
      absl::StrAppend(&order, ", ... (", step_entries_.size() - shown,
                      " more)");
    }
    return absl::AbortedError(absl::StrFormat(
        "ZeRO-3: ranks took different module paths in optimizer step %d: the "
        "hash of the parameter fetch/reduce order differs across ranks (max "
        "%012x, min %012x; rank %d has %012x). Rank %d fetched, in order: %s",
        context_.counters->global_steps + 1,
        static_cast<uint64_t>(extremes[0]) * kHalf +
            static_cast<uint64_t>(extremes[1]),
        static_cast<uint64_t>(-extremes[2]) * kHalf +
            static_cast<uint64_t>(-extremes[3]),
        rank(), hash, rank(), order));
  }
  schedule_hash_ = 0;
  step_entries_.clear();

  const int64_t accumulation =
      context_.config->gradient_accumulation_steps.value();
  report.loss = values[2] / (static_cast<double>(world()) * accumulation);
  const bool overflowed = values[1] > 0 || !std::isfinite(values[0]);
  const double loss_scale = state.loss_scale();
  double unscale = 1.0 / (loss_scale * world());
  if (context_.config->prescale_gradients) {
    unscale *= context_.config->gradient_predivide_factor;
  }
  report.grad_norm = std::sqrt(static_cast<double>(values[0])) * unscale;
  report.learning_rate = state.learning_rate();
  if (state.checks_overflow()) {
    ZE_RETURN_IF_ERROR(
        state.UpdateLossScale(overflowed, context_.counters->global_steps + 1));
  }
  last_step_counters_ = step_counters_;
  step_counters_ = CommunicationCounters();
  if (overflowed && state.checks_overflow()) {
    report.skipped = true;
    ZE_RETURN_IF_ERROR(Fill(grads_, 0.0f, stream()));
    return report;
  }
  double clip = 1.0;
  const double max_norm = context_.config->gradient_clipping.value();
  if (max_norm > 0 && report.grad_norm > max_norm) {
    clip = max_norm / (report.grad_norm + 1e-6);
  }
  zero::StepArgs args;
  args.lr = report.learning_rate;
  args.grad_scale = static_cast<float>(unscale * clip);
  state.FillMomentum(&args);
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    if (!buckets_[b].trainable) continue;
    ZE_RETURN_IF_ERROR(optimizers_[b]->Step(
        OwnMaster(b), OwnGrads(b), args, stream(),
        master_aliases_weights_ ? Tensor() : OwnWeights(b)));
  }
  // Non-persistent buckets are gathered afresh by the next forward; the
  // persistent ones are refreshed now (counted in the next step).
  ZE_RETURN_IF_ERROR(RefreshPersistent());
  ZE_RETURN_IF_ERROR(Fill(grads_, 0.0f, stream()));
  state.AdvanceSchedule();
  return report;
}

absl::StatusOr<std::vector<float>> Stage3::GatherMasterWeights(
    const std::string& name) {
  ZE_ASSIGN_OR_RETURN(int index, layout_.FindParam(name));
  const zero::ParamPlacement& place = layout_.placement(index);
  const zero::BucketLayout& layout = layout_.bucket(place.bucket);
  ZE_ASSIGN_OR_RETURN(Tensor full, Tensor::Empty({layout.padded_elements},
                                                 DType::kF32, device()));
  ZE_ASSIGN_OR_RETURN(Tensor own, Tensor::Empty({layout.slice_elements},
                                                DType::kF32, device()));
  ZE_RETURN_IF_ERROR(Copy(OwnMaster(place.bucket), own, stream()));
  ZE_ASSIGN_OR_RETURN(comm::Work work, comm().AllGather(own, full, stream()));
  ZE_RETURN_IF_ERROR(work.Wait());
  ZE_ASSIGN_OR_RETURN(std::vector<float> values, ToHostFloats(full, stream()));
  return std::vector<float>(values.begin() + place.offset,
                            values.begin() + place.offset + place.numel);
}

// Trainable parameters in the order stages 0-2 report them (reverse model
// order), so callers see the same list at every stage.
std::vector<std::string> Stage3::ParameterNames() const {
  std::vector<std::string> names;
  for (nn::Parameter* parameter : context_.model->Parameters()) {
    if (parameter->requires_grad()) names.push_back(parameter->name());
  }
  std::reverse(names.begin(), names.end());
  return names;
}

}  // namespace engine
}  // namespace ze
