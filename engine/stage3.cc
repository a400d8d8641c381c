#include "engine/stage3.h"

#include <algorithm>
#include <chrono>
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

void Stage3::MarkGradientsStale() {
  for (Bucket& bucket : buckets_) bucket.partition_written = false;
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
        if (in_backward_ || evaluating_) return absl::OkStatus();
        return BeginMicroStep();
      });
  for (int e = 0; e < static_cast<int>(entries_.size()); ++e) {
    nn::Module* module = entries_[e].module;
    add(module, nn::HookKind::kPreForward,
        [this, e](nn::Module&, const Stream&) -> absl::Status {
          // A use is a forward call that will be backpropagated; the
          // recomputation of a checkpointed module (in backward) is not.
          if (!in_backward_ && !evaluating_) {
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
  if (scopes_ > 0) {
    // The gathered copies would go stale when the optimizer updates the
    // shards they came from.
    return absl::FailedPreconditionError(absl::StrCat(
        "ZeRO-3 on rank ", rank(), ": a training forward started while ",
        scopes_, " GatherParameters scope(s) are open; release them first"));
  }
  // Forward uses left by an evaluation forward that was never
  // backpropagated do not count.
  for (Bucket& bucket : buckets_) bucket.pending_uses = 0;
  position_ = 0;
  observed_.clear();
  observed_entries_.clear();
  order_changed_ = false;
  following_ = trace_valid_;
  prefetching_ =
      following_ && zero_config().stage3_prefetch_bucket_size.value() > 0;
  return absl::OkStatus();
}

void Stage3::Fold(uint64_t value) {
  // FNV-1a over 64-bit words.
  schedule_hash_ ^= value + 0x9e3779b97f4a7c15ull;
  schedule_hash_ *= 0x100000001b3ull;
}

absl::Status Stage3::Acquire(int entry, bool backward) {
  if (evaluating_) {
    // Not part of the training schedule: gathered on demand, unrecorded.
    for (int b : entries_[entry].buckets) {
      if (!buckets_[b].gathered.defined()) {
        ZE_RETURN_IF_ERROR(MakeRoom(layout_.bucket(b).padded_elements));
        ZE_RETURN_IF_ERROR(IssueGather(b));
      }
      ZE_RETURN_IF_ERROR(WaitGather(b));
      ++buckets_[b].users;
    }
    return absl::OkStatus();
  }
  observed_entries_.push_back(entry);
  step_entries_.push_back(entry);
  for (int b : entries_[entry].buckets) {
    Fold(static_cast<uint64_t>(b) * 2 + (backward ? 1 : 0));
    if (following_ && (position_ >= trace_.size() || trace_[position_] != b)) {
      // Every rank on the same path notices at the same request, so the
      // collectives stay in step.
      ZE_LOG_RANK0(INFO) << "ZeRO-3: module order changed at request "
                         << position_ << " ("
                         << entries_[entry].module->DisplayName()
                         << "); fetching on demand for this step and "
                            "recording the new order";
      following_ = false;
      prefetching_ = false;
      order_changed_ = true;
    }
    ++position_;
    observed_.push_back(b);
    Bucket& bucket = buckets_[b];
    if (!bucket.gathered.defined()) {
      ZE_RETURN_IF_ERROR(MakeRoom(layout_.bucket(b).padded_elements));
      ZE_RETURN_IF_ERROR(IssueGather(b));
    }
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
      if (!evaluating_ && ShouldKeep(b)) {
        ++step_counters_.kept_for_reuse;
        continue;
      }
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
  // Evaluation and scoped gathers are not part of the training step; a
  // persistent bucket's first gather is (training would have made it and
  // it stays), so counters do not depend on who gathered it first.
  if (!evaluating_ || bucket.persistent) {
    step_counters_.all_gathered_elements += layout.padded_elements;
    step_counters_.all_gathers += 1;
  }
  live_elements_ += layout.padded_elements;
  peak_live_elements_ = std::max(peak_live_elements_, live_elements_);
  step_counters_.peak_gathered_elements =
      std::max(step_counters_.peak_gathered_elements, live_elements_);
  return absl::OkStatus();
}

size_t Stage3::NextUse(int b) const {
  if (!following_) return trace_.size();
  for (size_t q = position_; q < trace_.size(); ++q) {
    if (trace_[q] == b) return q;
  }
  return trace_.size();
}

// Keeps a just-released bucket when the record needs it again within
// stage3_max_reuse_distance requests and the live limit allows.
bool Stage3::ShouldKeep(int b) const {
  const int64_t distance = zero_config().stage3_max_reuse_distance;
  if (!following_ || distance <= 0) return false;
  if (live_elements_ > zero_config().stage3_max_live_parameters) return false;
  const size_t next = NextUse(b);
  return next < trace_.size() &&
         static_cast<int64_t>(next - position_) < distance;
}

absl::Status Stage3::MakeRoom(int64_t incoming) {
  const int64_t max_live = zero_config().stage3_max_live_parameters;
  while (live_elements_ + incoming > max_live) {
    // Belady: the unused bucket needed farthest ahead (never: farthest).
    int victim = -1;
    size_t victim_next = 0;
    for (int b = 0; b < layout_.num_buckets(); ++b) {
      const Bucket& bucket = buckets_[b];
      if (!bucket.gathered.defined() || bucket.persistent || bucket.users > 0) {
        continue;
      }
      const size_t next = NextUse(b);
      if (victim < 0 || next >= victim_next) {
        victim = b;
        victim_next = next;
      }
    }
    if (victim < 0) break;  // everything gathered is in use
    ZE_RETURN_IF_ERROR(FreeGathered(victim));
    ++step_counters_.early_releases;
  }
  return absl::OkStatus();
}

// Waits for an issued gather and points the parameters at the buffer.
absl::Status Stage3::WaitGather(int b) {
  Bucket& bucket = buckets_[b];
  if (!bucket.in_flight) return absl::OkStatus();
  if (device().is_cuda()) {
    // The stall of the compute stream: from reaching the wait to passing it.
    ZE_ASSIGN_OR_RETURN(Event before, Event::Create(device(), /*timing=*/true));
    ZE_ASSIGN_OR_RETURN(Event after, Event::Create(device(), /*timing=*/true));
    ZE_RETURN_IF_ERROR(before.Record(stream()));
    ZE_RETURN_IF_ERROR(bucket.gather_work.StreamWait(stream()));
    ZE_RETURN_IF_ERROR(after.Record(stream()));
    wait_events_.emplace_back(std::move(before), std::move(after));
  } else {
    const auto start = std::chrono::steady_clock::now();
    ZE_RETURN_IF_ERROR(bucket.gather_work.StreamWait(stream()));
    step_counters_.wait_ms += std::chrono::duration<double, std::milli>(
                                  std::chrono::steady_clock::now() - start)
                                  .count();
  }
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
  // communication_data_type other than the model's: reduce a cast copy
  // (the sums formed in that dtype, rounded once into the partition).
  Tensor input = bucket.grads;
  const DType comm_dtype = context_.communication_dtype;
  if (comm_dtype != model_dtype_) {
    ZE_ASSIGN_OR_RETURN(bucket.wire, Tensor::Empty({layout.padded_elements},
                                                   comm_dtype, device()));
    ZE_RETURN_IF_ERROR(Copy(bucket.grads, bucket.wire, stream()));
    input = bucket.wire;
  }
  bucket.reduce_overwrites = !bucket.partition_written;
  Tensor output = OwnGrads(b);
  if (!bucket.reduce_overwrites || comm_dtype != model_dtype_) {
    ZE_ASSIGN_OR_RETURN(bucket.reduced, Tensor::Empty({layout.slice_elements},
                                                      comm_dtype, device()));
    output = bucket.reduced;
  }
  bucket.partition_written = true;
  ZE_ASSIGN_OR_RETURN(
      bucket.reduce_work,
      comm().ReduceScatter(input, output, comm::ReduceOp::kSum, stream()));
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
// over micro-steps) unless the reduce-scatter wrote the partition itself,
// and frees the bucket's full gradients.
absl::Status Stage3::FinishReduce(int b) {
  Bucket& bucket = buckets_[b];
  ZE_RETURN_IF_ERROR(bucket.reduce_work.StreamWait(stream()));
  Tensor own = OwnGrads(b);
  if (!bucket.reduce_overwrites) {
    ZE_RETURN_IF_ERROR(Add(own, bucket.reduced, own, stream()));
  } else if (bucket.reduced.defined()) {
    ZE_RETURN_IF_ERROR(Copy(bucket.reduced, own, stream()));  // rounds
  }
  const zero::BucketLayout& layout = layout_.bucket(b);
  for (int i = layout.first_param; i < layout.end_param; ++i) {
    params_[i]->ReleaseGrad();
  }
  bucket.grads = Tensor();
  bucket.reduced = Tensor();
  bucket.wire = Tensor();
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
  // and kept ones: the optimizer step will change the weights.
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    if (buckets_[b].users == 0 && !buckets_[b].persistent) {
      ZE_RETURN_IF_ERROR(FreeGathered(b));
    }
  }
  following_ = false;
  prefetching_ = false;
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
    if (!buckets_[b].partition_written) {
      // No backward in this window reached the bucket: its gradient is 0.
      ZE_RETURN_IF_ERROR(Fill(own, 0.0f, stream()));
      buckets_[b].partition_written = true;
    }
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
  ZE_RETURN_IF_ERROR(FinishWaitTiming());
  last_step_counters_ = step_counters_;
  step_counters_ = CommunicationCounters();
  if (overflowed && state.checks_overflow()) {
    report.skipped = true;
    MarkGradientsStale();
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
  MarkGradientsStale();
  state.AdvanceSchedule();
  return report;
}

absl::Status Stage3::FinishWaitTiming() {
  for (const auto& [before, after] : wait_events_) {
    ZE_RETURN_IF_ERROR(after.Synchronize());
    ZE_ASSIGN_OR_RETURN(float ms, Event::ElapsedMs(before, after));
    step_counters_.wait_ms += ms;
  }
  wait_events_.clear();
  return absl::OkStatus();
}

absl::Status Stage3::BeginEval() {
  if (in_backward_ || evaluating_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ZeRO-3 on rank ", rank(),
        ": an evaluation forward cannot start during backward or another "
        "evaluation"));
  }
  evaluating_ = true;
  return absl::OkStatus();
}

absl::Status Stage3::EndEval() {
  evaluating_ = false;
  // A failed forward may leave buckets held: let them go.
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    Bucket& bucket = buckets_[b];
    if (scopes_ == 0) bucket.users = 0;
    if (bucket.users == 0 && !bucket.persistent) {
      ZE_RETURN_IF_ERROR(FreeGathered(b));
    }
  }
  return absl::OkStatus();
}

absl::Status Stage3::GatherScope(const std::vector<std::string>& names) {
  std::vector<int> buckets;
  for (const std::string& name : names) {
    absl::StatusOr<int> index = layout_.FindParam(name);
    if (!index.ok()) {
      return absl::NotFoundError(absl::StrCat(
          "GatherParameters on rank ", rank(), ": no parameter named '", name,
          "' in the ZeRO-3 layout: ", index.status().message()));
    }
    const int b = layout_.placement(*index).bucket;
    if (std::find(buckets.begin(), buckets.end(), b) == buckets.end()) {
      buckets.push_back(b);
    }
  }
  // Gathered like an evaluation's requests: not part of the step.
  const bool was_evaluating = evaluating_;
  evaluating_ = true;
  absl::Status status;
  for (int b : buckets) {
    if (!buckets_[b].gathered.defined()) status = IssueGather(b);
    if (status.ok()) status = WaitGather(b);
    if (!status.ok()) break;
    ++buckets_[b].users;
  }
  evaluating_ = was_evaluating;
  ZE_RETURN_IF_ERROR(status);
  ++scopes_;
  return stream().Synchronize();
}

absl::Status Stage3::ReleaseScope(const std::vector<std::string>& names,
                                  int modifier_rank) {
  std::vector<int> indices;
  std::vector<int> buckets;
  for (const std::string& name : names) {
    ZE_ASSIGN_OR_RETURN(int index, layout_.FindParam(name));
    indices.push_back(index);
    const int b = layout_.placement(index).bucket;
    if (std::find(buckets.begin(), buckets.end(), b) == buckets.end()) {
      buckets.push_back(b);
    }
  }
  if (modifier_rank >= 0) {
    // The modifier's full values to every rank, parameter by parameter (a
    // bucket's other parameters were not modified and need not travel).
    for (int index : indices) {
      const zero::ParamPlacement& place = layout_.placement(index);
      Tensor full =
          Region(buckets_[place.bucket].gathered, place.offset, place.numel);
      if (world() > 1) {
        ZE_ASSIGN_OR_RETURN(comm::Work work,
                            comm().Broadcast(full, modifier_rank, stream()));
        ZE_RETURN_IF_ERROR(work.StreamWait(stream()));
      }
    }
    // Re-partition: this rank's pieces into its shard and master. Only the
    // named parameters' pieces: a bf16 copy of the others would round their
    // f32 masters.
    for (const zero::ParamShard& shard : layout_.RankShards(rank())) {
      if (std::find(indices.begin(), indices.end(), shard.param_index) ==
          indices.end()) {
        continue;
      }
      const zero::ParamPlacement& place = layout_.placement(shard.param_index);
      Tensor source = Region(buckets_[place.bucket].gathered,
                             place.offset + shard.param_begin, shard.count);
      ZE_RETURN_IF_ERROR(
          Copy(source, Region(weights_, shard.partition_offset, shard.count),
               stream()));
      if (!master_aliases_weights_) {
        ZE_RETURN_IF_ERROR(
            Copy(source, Region(master_, shard.partition_offset, shard.count),
                 stream()));
      }
    }
  }
  for (int b : buckets) {
    Bucket& bucket = buckets_[b];
    if (bucket.users > 0) --bucket.users;
    if (bucket.users == 0 && !bucket.persistent) {
      ZE_RETURN_IF_ERROR(FreeGathered(b));
    }
  }
  if (scopes_ > 0) --scopes_;
  return stream().Synchronize();
}

namespace {

// dst (any device, model dtype) = src (host, any float dtype), converting on
// the host first when a transfer would otherwise need equal dtypes.
absl::Status CopyFromHost(const Tensor& src, const Tensor& dst,
                          const Stream& stream) {
  if (dst.device().is_cuda() && src.dtype() != dst.dtype()) {
    ZE_ASSIGN_OR_RETURN(Tensor converted,
                        Tensor::Empty(src.shape(), dst.dtype(), Device::Cpu()));
    ZE_RETURN_IF_ERROR(Copy(src, converted, stream));
    ZE_RETURN_IF_ERROR(Copy(converted, dst, stream));
    return stream.Synchronize();  // `converted` dies here
  }
  return Copy(src, dst, stream);
}

}  // namespace

absl::StatusOr<int64_t> Stage3::LoadWeights(const safetensors::Reader& reader) {
  if (in_backward_ || evaluating_ || scopes_ > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "LoadWeights on rank ", rank(),
        ": not between optimizer steps (inside backward, an evaluation or a "
        "GatherParameters scope)"));
  }
  // Check every parameter before writing any.
  for (int i = 0; i < layout_.num_params(); ++i) {
    const std::string name = params_[i]->name();
    absl::StatusOr<const safetensors::TensorInfo*> info = reader.Get(name);
    if (!info.ok()) {
      return absl::NotFoundError(absl::StrCat("LoadWeights on rank ", rank(),
                                              ": parameter '", name,
                                              "' is not in ", reader.path()));
    }
    if ((*info)->shape != params_[i]->shape()) {
      return absl::InvalidArgumentError(
          absl::StrCat("LoadWeights on rank ", rank(), ": parameter '", name,
                       "' is ", ShapeToString(params_[i]->shape()), " but ",
                       reader.path(), " has ", ShapeToString((*info)->shape)));
    }
    ZE_RETURN_IF_ERROR(safetensors::DTypeOf((*info)->dtype).status());
  }
  int64_t bytes = 0;
  for (const zero::ParamShard& shard : layout_.RankShards(rank())) {
    const std::string name = params_[shard.param_index]->name();
    const safetensors::TensorInfo* info = reader.Find(name);
    ZE_ASSIGN_OR_RETURN(DType file_dtype, safetensors::DTypeOf(info->dtype));
    ZE_ASSIGN_OR_RETURN(
        Tensor host, Tensor::Empty({shard.count}, file_dtype, Device::Cpu()));
    ZE_RETURN_IF_ERROR(
        reader.ReadRange(name, shard.param_begin, shard.count, host));
    bytes += shard.count * static_cast<int64_t>(SizeOf(file_dtype));
    ZE_RETURN_IF_ERROR(CopyFromHost(
        host, Region(weights_, shard.partition_offset, shard.count), stream()));
    if (!master_aliases_weights_) {
      ZE_RETURN_IF_ERROR(CopyFromHost(
          host, Region(master_, shard.partition_offset, shard.count),
          stream()));
    }
    ZE_RETURN_IF_ERROR(stream().Synchronize());
  }
  // Persistent buckets hold the old values.
  ZE_RETURN_IF_ERROR(RefreshPersistent());
  ZE_RETURN_IF_ERROR(stream().Synchronize());
  return bytes;
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
