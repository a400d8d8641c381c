#include "zero/stage3.h"

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
#include "zero/bucket_binding.h"

namespace ze {
namespace zero {

Stage3::~Stage3() {
  for (nn::Parameter* parameter : params_) parameter->ReleaseGrad();
}

absl::StatusOr<std::unique_ptr<ZeroStrategy>> Stage3::Create(
    const StrategyContext& context) {
  std::unique_ptr<Stage3> stage3(new Stage3(context));
  ZE_ASSIGN_OR_RETURN(PartitionedLayout layout, stage3->Layout());
  ZE_RETURN_IF_ERROR(stage3->Allocate(layout));
  ZE_RETURN_IF_ERROR(stage3->InstallHooks());
  return std::unique_ptr<ZeroStrategy>(std::move(stage3));
}

// The plan's stage-3 layout (a bucket of trainable and one of frozen
// parameters per module), persistent buckets and fetch limits.
absl::StatusOr<PartitionedLayout> Stage3::Layout() {
  nn::LossModel& model = *context_.model;
  const Plan& plan = *context_.plan;
  const PartitionedLayout& layout = plan.layout.layout;
  params_ = plan.layout.params;
  const std::vector<bool>& group_trainable = plan.layout.trainable;
  buckets_.resize(layout.num_buckets());
  bucket_uses_ = ForwardUses(layout.num_buckets());
  std::vector<int64_t> bucket_elements;
  for (int b = 0; b < layout.num_buckets(); ++b) {
    buckets_[b].trainable = group_trainable[b];
    buckets_[b].persistent = plan.persistent[b];
    bucket_elements.push_back(layout.bucket(b).padded_elements);
  }
  schedule_ = std::make_unique<FetchSchedule>(plan.fetch, bucket_elements,
                                              plan.persistent);
  std::unordered_map<const nn::Parameter*, int> bucket_of;
  for (int i = 0; i < layout.num_params(); ++i) {
    bucket_of[params_[i]] = layout.placement(i).bucket;
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
  return layout;
}

absl::Status Stage3::Allocate(const PartitionedLayout& layout) {
  ZE_ASSIGN_OR_RETURN(
      partition_,
      PartitionState::Create(layout, RankPartitionStateOptions(), stream()));

  // This rank's pieces of every parameter: sliced from full data when the
  // model has it (then dropped), else generated for this range only.
  const uint64_t seed = context_.plan->seed;
  std::vector<ParamShard> shards = layout.RankShards(rank());
  // offload_param nvme: a swapped bucket's slice is put together in host
  // memory, one bucket at a time, and written to the swap file.
  const bool nvme = partition_->weights_placement() == Placement::kNvme;
  if (nvme) {
    std::stable_sort(shards.begin(), shards.end(),
                     [](const ParamShard& a, const ParamShard& b) {
                       return a.bucket < b.bucket;
                     });
  }
  Tensor staged;
  int staged_bucket = -1;
  const auto write_staged = [&]() -> absl::Status {
    if (staged_bucket < 0) return absl::OkStatus();
    ZE_RETURN_IF_ERROR(stream().Synchronize());
    ZE_RETURN_IF_ERROR(
        partition_->WriteWeights(staged_bucket, 0, staged, stream()));
    staged = Tensor();
    staged_bucket = -1;
    return absl::OkStatus();
  };
  for (const ParamShard& shard : shards) {
    nn::Parameter* parameter = params_[shard.param_index];
    Tensor own;
    if (!nvme) {
      own = partition_->weights().Slice(shard.partition_offset, shard.count);
    } else {
      const int b = shard.bucket;
      const int64_t at =
          shard.bucket_offset - layout.BucketSlice(b, rank()).begin;
      if (!partition_->weights_swapped(b)) {
        own = partition_->OwnWeights(b).Slice(at, shard.count);
      } else {
        if (staged_bucket != b) {
          ZE_RETURN_IF_ERROR(write_staged());
          ZE_ASSIGN_OR_RETURN(
              staged, Tensor::Zeros({layout.bucket(b).slice_elements},
                                    partition_->model_dtype(), Device::Cpu()));
          staged_bucket = b;
        }
        own = staged.Slice(at, shard.count);
      }
    }
    if (parameter->state() == nn::ParameterState::kFull) {
      ZE_ASSIGN_OR_RETURN(Tensor full, parameter->data());
      ZE_RETURN_IF_ERROR(Copy(full.Flat().Slice(shard.param_begin, shard.count),
                              own, stream()));
      // Freed below with the copy still queued: the allocator hands the
      // block to another stream only after this one passes the copy.
      ZE_RETURN_IF_ERROR(full.RecordStream(stream()));
    } else {
      ZE_RETURN_IF_ERROR(
          parameter->InitializeSlice(seed, shard.param_begin, own, stream()));
    }
  }
  ZE_RETURN_IF_ERROR(write_staged());
  // Each parameter's piece of this rank's slice becomes its shard (none
  // for a bucket in the swap file: its shard lives there).
  for (int b = 0; b < layout.num_buckets(); ++b) {
    ZE_RETURN_IF_ERROR(BindBucket(layout, b, params_, ParameterSlot::kShard,
                                  partition_->OwnWeights(b),
                                  layout.BucketSlice(b, rank()).begin));
  }
  for (nn::Parameter* parameter : params_) parameter->ReleaseData();
  ZE_RETURN_IF_ERROR(partition_->AllocateTrainingState(stream()));

  GradientReducerOptions reducer = context_.plan->reducer;
  reducer.communication_dtype = context_.communication_dtype;
  // With overlap_comm on a GPU the collectives get a high-priority stream of
  // their own (see Streams in the header).
  communication_stream_ = stream();
  if (context_.plan->overlap_comm && device().is_cuda()) {
    ZE_ASSIGN_OR_RETURN(communication_stream_,
                        Stream::Create(device(), /*high_priority=*/true));
    overlaps_communication_ = true;
  }
  reducer_ = std::make_unique<GradientReducer>(
      reducer, partition_.get(), context_.comm, context_.compute_stream,
      &communication_stream_, [this](int bucket) -> absl::Status {
        // Final for the step at the boundary: an offloaded update begun
        // early takes the bucket now.
        ZE_RETURN_IF_ERROR(partition_->GradientsFinal(bucket, stream()));
        return ReleaseBucketGradients(bucket);
      });
  return absl::OkStatus();
}

absl::Status Stage3::OnBeginBackward(bool boundary) {
  const nn::BackwardPart part = backward_part();
  if (part == nn::BackwardPart::kWeight) {
    // A split backward's second part gathers nothing (its modules kept
    // their parameters from the first part): not a micro-step of the
    // fetch schedule. Its gradients are final: an update may begin.
    return BeginUpdateEarly(boundary);
  }
  // Before the accumulation boundary the next micro-step runs on the same
  // weights: what this backward releases may stay for its forward
  // (OnEndBackward reads the flag back and clears it).
  schedule_->set_next_micro_step_follows(!boundary);
  // A backward whose forward did not come right before it (a pipeline's
  // 1F1B cool-down: B after B) is a micro-step of its own for the fetch
  // schedule, with a record of its own (its first request is another
  // bucket than a forward's). The engine's micro-steps and 1F1B's steady
  // state (F(m + w), then B(m)) begin at the forward, as before.
  if (schedule_->phase() == FetchSchedule::Phase::kIdle) {
    schedule_->BeginMicroStep();
  }
  // A first part's gradients are not final.
  if (part == nn::BackwardPart::kInput) return absl::OkStatus();
  return BeginUpdateEarly(boundary);
}

absl::Status Stage3::BeginUpdateEarly(bool boundary) {
  if (!boundary || !partition_->CanBeginEarly() ||
      !WorthBeginningEarly(config(), *context_.training)) {
    return absl::OkStatus();
  }
  ZE_ASSIGN_OR_RETURN(
      const EarlyStepArgs early,
      ArgsBeforeStatistics(config(), *context_.training, world()));
  return partition_->BeginUpdate(early.args, stream(), early.speculation);
}

absl::Status Stage3::InstallHooks() {
  for (int e = 0; e < static_cast<int>(entries_.size()); ++e) {
    nn::Module* module = entries_[e].module;
    AddHook(module, nn::HookKind::kPreForward,
            [this, e](nn::Module&, const Stream&) -> absl::Status {
              // A use is a forward call that will be backpropagated; the
              // recomputation of a checkpointed module (in backward) is not.
              if (phase_ == Phase::kForward) {
                for (int b : entries_[e].buckets) {
                  if (buckets_[b].trainable) bucket_uses_.Count(b);
                }
              }
              return Acquire(e, /*backward=*/false);
            });
    AddHook(module, nn::HookKind::kPostForward,
            [this, e](nn::Module&, const Stream&) { return Release(e); });
    // A split module (nn/module.h BackwardPart) gathers at its first part
    // and keeps the parameters to the end of its second, whose weight
    // gradients need a buffer again (another slot's second part may have
    // reduced and freed the one the first part made) and are final after
    // it.
    AddHook(module, nn::HookKind::kPreBackward,
            [this, e](nn::Module&, const Stream&) -> absl::Status {
              if (nn::CurrentBackwardPart() != nn::BackwardPart::kWeight) {
                return Acquire(e, /*backward=*/true);
              }
              for (int b : entries_[e].buckets) {
                if (buckets_[b].trainable) ZE_RETURN_IF_ERROR(EnsureGrads(b));
              }
              return absl::OkStatus();
            });
    AddHook(module, nn::HookKind::kPostBackward,
            [this, e](nn::Module&, const Stream&) -> absl::Status {
              if (nn::CurrentBackwardPart() == nn::BackwardPart::kInput) {
                return absl::OkStatus();
              }
              ZE_RETURN_IF_ERROR(Release(e));
              return AfterBackward(e);
            });
  }
  return absl::OkStatus();
}

absl::Status Stage3::OnBeginForward() {
  if (scopes_ > 0) {
    // The gathered copies would go stale when the optimizer updates the
    // shards they came from.
    return absl::FailedPreconditionError(absl::StrCat(
        "ZeRO-3 on rank ", rank(), ": a training forward started while ",
        scopes_, " GatherParameters scope(s) are open; release them first"));
  }
  // Forward uses left by a forward of this saved-state slot that was never
  // backpropagated do not count; other slots' (a pipeline's in-flight
  // micro-batches) keep theirs.
  bucket_uses_.BeginForward();
  // Whatever ran since the last micro-step (an optimizer step, a load, a
  // GatherParameters scope) may have written the weights; this micro-step's
  // gathers wait for one event recorded now, not for its own compute.
  NoteWeightsWritten();
  schedule_->BeginMicroStep();
  return absl::OkStatus();
}

void Stage3::Fold(uint64_t value) {
  // FNV-1a over 64-bit words.
  schedule_hash_ ^= value + 0x9e3779b97f4a7c15ull;
  schedule_hash_ *= 0x100000001b3ull;
}

absl::Status Stage3::Acquire(int entry, bool backward) {
  if (phase_ == Phase::kEvaluation) {
    // Not part of the training schedule: gathered on demand, unrecorded.
    for (int b : entries_[entry].buckets) {
      if (!buckets_[b].gathered.defined()) {
        ZE_RETURN_IF_ERROR(MakeRoom(layout().bucket(b).padded_elements));
        ZE_RETURN_IF_ERROR(IssueGather(b));
        buckets_[b].gathered_for_evaluation = true;
      }
      ZE_RETURN_IF_ERROR(WaitGather(b));
      ++buckets_[b].users;
    }
    return absl::OkStatus();
  }
  step_entries_.push_back(entry);
  for (int b : entries_[entry].buckets) {
    Fold(static_cast<uint64_t>(b) * 2 + (backward ? 1 : 0));
    if (schedule_->OnRequest(b)) {
      ZE_LOG_RANK0(INFO) << "ZeRO-3: module order changed at request "
                         << schedule_->position() - 1 << " ("
                         << entries_[entry].module->DisplayName()
                         << "); fetching on demand for this step and "
                            "recording the new order";
    }
    Bucket& bucket = buckets_[b];
    if (!bucket.gathered.defined()) {
      ZE_RETURN_IF_ERROR(MakeRoom(layout().bucket(b).padded_elements));
      ZE_RETURN_IF_ERROR(IssueGather(b));
    }
    ZE_RETURN_IF_ERROR(WaitGather(b));
    ++bucket.users;
    if (backward && bucket.trainable) ZE_RETURN_IF_ERROR(EnsureGrads(b));
  }
  ZE_RETURN_IF_ERROR(Prefetch());
  return absl::OkStatus();
}

absl::Status Stage3::Release(int entry) {
  for (int b : entries_[entry].buckets) {
    Bucket& bucket = buckets_[b];
    if (bucket.users > 0) --bucket.users;
    if (bucket.users == 0 && !bucket.persistent) {
      if (phase_ != Phase::kEvaluation && schedule_->ShouldKeep(b)) {
        ++step_counters_.kept_for_reuse;
        continue;
      }
      // An evaluation between micro-steps leaves what training keeps.
      if (phase_ == Phase::kEvaluation && !bucket.gathered_for_evaluation) {
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
    if (!bucket.trainable) continue;
    if (bucket_uses_.CountDown(b) && bucket.grads.defined()) {
      ZE_RETURN_IF_ERROR(IssueReduce(b));
    }
  }
  return absl::OkStatus();
}

const Stream& Stage3::GatherStream() const {
  // Evaluation and scope gathers are waited for at once: another stream
  // would only add an event to each.
  return phase_ == Phase::kEvaluation ? stream() : communication_stream_;
}

absl::Status Stage3::OrderGatherAfterWeightWrites(const Stream& gather) {
  if (gather.native() == stream().native()) return absl::OkStatus();
  if (!weights_written_current_) {
    ZE_ASSIGN_OR_RETURN(weights_written_, Event::Create(device()));
    ZE_RETURN_IF_ERROR(weights_written_.Record(stream()));
    weights_written_current_ = true;
  }
  return weights_written_.StreamWait(gather);
}

absl::Status Stage3::IssueGather(int b, bool copy) {
  Bucket& bucket = buckets_[b];
  const BucketLayout& bucket_layout = layout().bucket(b);
  const Stream& communication = GatherStream();
  ZE_RETURN_IF_ERROR(OrderGatherAfterWeightWrites(communication));
  // The buffer, and an upload's staging, belong to the stream that writes
  // them.
  StreamGuard guard(communication);
  // With offload_param the slice is first uploaded from host memory.
  ZE_ASSIGN_OR_RETURN(bucket.gather_source,
                      partition_->WeightsForGather(b, communication));
  if (!copy && world() == 1 &&
      bucket.gather_source.numel() == bucket_layout.padded_elements) {
    // One rank's slice is the whole bucket: the parameters read it where it
    // is. An all-gather would copy it (2 bytes a parameter read and
    // written, in every forward and backward) for nothing; the gradient
    // side skips its reduction on one rank the same way
    // (GradientReducer::ReducesInPartition).
    bucket.gathered = bucket.gather_source;
    bucket.aliased = true;
    ZE_ASSIGN_OR_RETURN(bucket.alias_ready, Event::Create(device()));
    ZE_RETURN_IF_ERROR(bucket.alias_ready.Record(communication));
  } else {
    ZE_ASSIGN_OR_RETURN(bucket.gathered,
                        Tensor::Empty({bucket_layout.padded_elements},
                                      partition_->model_dtype(), device()));
    ZE_ASSIGN_OR_RETURN(
        bucket.gather_work,
        comm().AllGather(bucket.gather_source, bucket.gathered, communication));
  }
  bucket.in_flight = true;
  // Evaluation and scoped gathers are not part of the training step; a
  // persistent bucket's first gather is (training would have made it and
  // it stays), so counters do not depend on who gathered it first.
  if (phase_ != Phase::kEvaluation || bucket.persistent) {
    step_counters_.all_gathered_elements += bucket_layout.padded_elements;
    step_counters_.all_gathers += 1;
    if (bucket.aliased) step_counters_.all_gathers_in_place += 1;
  }
  schedule_->OnGathered(b);
  step_counters_.peak_gathered_elements = std::max(
      step_counters_.peak_gathered_elements, schedule_->live_elements());
  // offload_param nvme: the next buckets the record asks for start coming
  // from the swap file while this one gathers.
  if (const int ahead = partition_->weights_read_ahead(); ahead > 0) {
    ZE_RETURN_IF_ERROR(partition_->ReadAheadWeights(schedule_->UpcomingBuckets(
        static_cast<size_t>(ahead),
        [this](int bucket) { return partition_->WantsWeightsRead(bucket); })));
  }
  return absl::OkStatus();
}

absl::Status Stage3::MakeRoom(int64_t incoming) {
  while (schedule_->OverLiveLimit(incoming)) {
    const int victim = schedule_->EvictionVictim(
        [this](int b) { return buckets_[b].users > 0; });
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
  // The compute stream waits for the all-gather, or (one rank, in place)
  // for what produced the weights it reads.
  const auto wait = [&] {
    return bucket.aliased ? bucket.alias_ready.StreamWait(stream())
                          : bucket.gather_work.StreamWait(stream());
  };
  if (device().is_cuda()) {
    // The stall of the compute stream: from reaching the wait to passing it.
    ZE_ASSIGN_OR_RETURN(Event before, Event::Create(device(), /*timing=*/true));
    ZE_ASSIGN_OR_RETURN(Event after, Event::Create(device(), /*timing=*/true));
    ZE_RETURN_IF_ERROR(before.Record(stream()));
    ZE_RETURN_IF_ERROR(wait());
    ZE_RETURN_IF_ERROR(after.Record(stream()));
    wait_events_.emplace_back(std::move(before), std::move(after));
  } else {
    const auto start = std::chrono::steady_clock::now();
    ZE_RETURN_IF_ERROR(wait());
    step_counters_.wait_ms += std::chrono::duration<double, std::milli>(
                                  std::chrono::steady_clock::now() - start)
                                  .count();
  }
  bucket.gather_work = comm::Work();
  bucket.gather_source = Tensor();
  bucket.in_flight = false;
  // From here the compute stream reads (and a scope's broadcast writes) the
  // buffer the communication stream owns.
  if (overlaps_communication_) {
    ZE_RETURN_IF_ERROR(bucket.gathered.RecordStream(stream()));
  }
  return BindBucket(layout(), b, params_, ParameterSlot::kData,
                    bucket.gathered);
}

absl::Status Stage3::FreeGathered(int b) {
  Bucket& bucket = buckets_[b];
  if (!bucket.gathered.defined()) return absl::OkStatus();
  // The buffer may only be reused once the all-gather writing it is done
  // (an aliased one is the weights or their upload: nothing writes it).
  if (bucket.in_flight && !bucket.aliased) {
    ZE_RETURN_IF_ERROR(bucket.gather_work.Wait());
  }
  bucket.gather_work = comm::Work();
  bucket.gather_source = Tensor();
  bucket.in_flight = false;
  bucket.aliased = false;
  bucket.alias_ready = Event();
  bucket.gathered_for_evaluation = false;
  ZE_RETURN_IF_ERROR(
      BindBucket(layout(), b, params_, ParameterSlot::kData, Tensor()));
  bucket.gathered = Tensor();
  schedule_->OnFreed(b);
  return absl::OkStatus();
}

// Issues the gathers the schedule asks for ahead of their requests.
absl::Status Stage3::Prefetch() {
  for (int b : schedule_->PrefetchCandidates()) {
    ZE_RETURN_IF_ERROR(IssueGather(b));
  }
  return absl::OkStatus();
}

absl::Status Stage3::EnsureGrads(int b) {
  Bucket& bucket = buckets_[b];
  if (bucket.grads.defined()) return absl::OkStatus();
  const BucketLayout& bucket_layout = layout().bucket(b);
  ZE_ASSIGN_OR_RETURN(bucket.grads,
                      Tensor::Empty({bucket_layout.padded_elements},
                                    partition_->model_dtype(), device()));
  ZE_RETURN_IF_ERROR(Fill(bucket.grads, 0.0f, stream()));
  return BindBucket(layout(), b, params_, ParameterSlot::kGrad, bucket.grads);
}

// Hands a bucket whose forward uses are all backpropagated to the reducer.
absl::Status Stage3::IssueReduce(int b) {
  Fold(0x5253000000000000ull + static_cast<uint64_t>(b));
  ZE_RETURN_IF_ERROR(reducer_->Issue(b, buckets_[b].grads));
  step_counters_.reduce_scattered_elements +=
      layout().bucket(b).padded_elements;
  step_counters_.reduce_scatters += 1;
  return absl::OkStatus();
}

// The bucket's reduced slice is in the partition: free its full gradients.
absl::Status Stage3::ReleaseBucketGradients(int b) {
  ZE_RETURN_IF_ERROR(
      BindBucket(layout(), b, params_, ParameterSlot::kGrad, Tensor()));
  buckets_[b].grads = Tensor();
  return absl::OkStatus();
}

absl::Status Stage3::OnEndBackward() {
  const nn::BackwardPart part = backward_part();
  if (part != nn::BackwardPart::kInput) {
    // A bucket whose uses were not all backpropagated (a module the loss
    // did not reach) still holds gradients: reduce them, in bucket order.
    // Not after a split backward's first part: its split modules' uses are
    // the second part's to count down.
    for (int b = 0; b < layout().num_buckets(); ++b) {
      if (buckets_[b].grads.defined() && bucket_uses_.pending(b) > 0) {
        ZE_RETURN_IF_ERROR(IssueReduce(b));
      }
    }
    bucket_uses_.EndBackward();
  }
  ZE_RETURN_IF_ERROR(reducer_->FinishAll());
  // A second part was no micro-step of the fetch schedule.
  if (part == nn::BackwardPart::kWeight) return absl::OkStatus();
  // Prefetched buckets the micro-step did not reach, and kept ones: at the
  // boundary the optimizer step will change the weights; before it, the
  // next micro-step reads them as they are (within the live limit, which
  // its gathers enforce by eviction).
  if (!schedule_->next_micro_step_follows()) {
    for (int b = 0; b < layout().num_buckets(); ++b) {
      if (buckets_[b].users == 0 && !buckets_[b].persistent) {
        ZE_RETURN_IF_ERROR(FreeGathered(b));
      }
    }
  }
  schedule_->set_next_micro_step_follows(false);
  if (schedule_->EndMicroStep()) {
    ZE_LOG_RANK0(INFO) << "ZeRO-3: recorded a new module order of "
                       << schedule_->record().size() << " requests";
  }
  return absl::OkStatus();
}

absl::Status Stage3::ReleaseStaleGathered() {
  for (int b = 0; b < layout().num_buckets(); ++b) {
    Bucket& bucket = buckets_[b];
    if (!bucket.gathered.defined() || bucket.users > 0) continue;
    ZE_RETURN_IF_ERROR(FreeGathered(b));
  }
  return absl::OkStatus();
}

absl::Status Stage3::ScheduleMismatch(uint64_t max, uint64_t min,
                                      uint64_t own) {
  std::string order;
  const size_t shown = std::min<size_t>(step_entries_.size(), 48);
  for (size_t i = 0; i < shown; ++i) {
    absl::StrAppend(&order, i == 0 ? "" : ", ",
                    entries_[step_entries_[i]].module->DisplayName());
  }
  if (shown < step_entries_.size()) {
    absl::StrAppend(&order, ", ... (", step_entries_.size() - shown, " more)");
  }
  return absl::AbortedError(absl::StrFormat(
      "ZeRO-3: ranks took different module paths in optimizer step %d: the "
      "hash of the parameter fetch/reduce order differs across ranks (max "
      "%012x, min %012x; rank %d has %012x). Rank %d fetched, in order: %s",
      *context_.global_steps + 1, max, min, rank(), own, rank(), order));
}

absl::StatusOr<StepReport> Stage3::BoundaryStep(double loss_sum) {
  // A bucket no backward in this window reached has zero gradients.
  ZE_RETURN_IF_ERROR(partition_->ZeroStaleGradients(stream()));
  BoundaryStepHooks hooks;
  hooks.schedule_hash = schedule_hash_;
  hooks.schedule_mismatch = [this](uint64_t max, uint64_t min, uint64_t own) {
    return ScheduleMismatch(max, min, own);
  };
  hooks.after_statistics = [this]() -> absl::Status {
    schedule_hash_ = 0;
    step_entries_.clear();
    ZE_RETURN_IF_ERROR(FinishWaitTiming());
    last_step_counters_ = step_counters_;
    step_counters_ = CommunicationCounters();
    return absl::OkStatus();
  };
  // Every bucket is gathered afresh by the next forward, the persistent
  // ones too (once, then kept): gathering them here would wait for the
  // whole of an offloaded update, which the next forward can instead
  // follow bucket by bucket.
  hooks.after_update = [this] {
    NoteWeightsWritten();
    return ReleaseStaleGathered();
  };
  return RunBoundaryStep(MakeBoundaryStepContext(), loss_sum, hooks);
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

absl::Status Stage3::OnEndEval() {
  // A failed forward may leave buckets held: let them go. What training
  // kept for its next micro-step (gathered before the evaluation) stays.
  for (int b = 0; b < layout().num_buckets(); ++b) {
    Bucket& bucket = buckets_[b];
    if (scopes_ == 0) bucket.users = 0;
    if (bucket.users == 0 && !bucket.persistent &&
        bucket.gathered_for_evaluation) {
      ZE_RETURN_IF_ERROR(FreeGathered(b));
    }
  }
  return absl::OkStatus();
}

absl::Status Stage3::GatherScope(const std::vector<std::string>& names) {
  std::vector<int> buckets;
  for (const std::string& name : names) {
    absl::StatusOr<int> index = layout().FindParam(name);
    if (!index.ok()) {
      return absl::NotFoundError(absl::StrCat(
          "GatherParameters on rank ", rank(), ": no parameter named '", name,
          "' in the ZeRO-3 layout: ", index.status().message()));
    }
    const int b = layout().placement(*index).bucket;
    if (std::find(buckets.begin(), buckets.end(), b) == buckets.end()) {
      buckets.push_back(b);
    }
  }
  // Gathered like an evaluation's requests: not part of the step.
  const Phase phase = phase_;
  phase_ = Phase::kEvaluation;
  absl::Status status;
  for (int b : buckets) {
    // A scope's buffers are copies, also on one rank: a bucket the
    // training step left as the weights themselves is gathered afresh.
    if (buckets_[b].aliased && buckets_[b].users == 0) {
      status = FreeGathered(b);
      if (!status.ok()) break;
    }
    if (!buckets_[b].gathered.defined()) {
      status = IssueGather(b, /*copy=*/true);
    }
    if (status.ok()) status = WaitGather(b);
    if (!status.ok()) break;
    ++buckets_[b].users;
  }
  phase_ = phase;
  ZE_RETURN_IF_ERROR(status);
  ++scopes_;
  return stream().Synchronize();
}

absl::Status Stage3::ReleaseScope(const std::vector<std::string>& names,
                                  int modifier_rank) {
  std::vector<int> indices;
  std::vector<int> buckets;
  for (const std::string& name : names) {
    ZE_ASSIGN_OR_RETURN(int index, layout().FindParam(name));
    indices.push_back(index);
    const int b = layout().placement(index).bucket;
    if (std::find(buckets.begin(), buckets.end(), b) == buckets.end()) {
      buckets.push_back(b);
    }
  }
  if (modifier_rank >= 0) {
    NoteWeightsWritten();
    ZE_ASSIGN_OR_RETURN(const offload::UpdateJoined joined,
                        partition_->FinishUpdate(stream()));
    // The modifier's full values to every rank, parameter by parameter (a
    // bucket's other parameters were not modified and need not travel).
    std::vector<Tensor> values;
    for (int index : indices) {
      const ParamPlacement& place = layout().placement(index);
      Tensor full =
          buckets_[place.bucket].gathered.Slice(place.offset, place.numel);
      if (world() > 1) {
        ZE_ASSIGN_OR_RETURN(comm::Work work,
                            comm().Broadcast(full, modifier_rank, stream()));
        ZE_RETURN_IF_ERROR(work.StreamWait(stream()));
      }
      values.push_back(full);
    }
    // Re-partition through the import: this rank's pieces into its shard
    // and master. Only the named parameters' pieces: a bf16 copy of the
    // others would round their f32 masters.
    ZE_RETURN_IF_ERROR(ImportScope(indices, values, joined));
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

absl::StatusOr<LoadReport> Stage3::LoadWeights(
    const safetensors::TensorSource& reader) {
  ZE_RETURN_IF_ERROR(RequireIdle("LoadWeights"));
  if (scopes_ > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "LoadWeights on rank ", rank(),
        ": not between optimizer steps (a GatherParameters scope is open)"));
  }
  ZE_RETURN_IF_ERROR(CheckLoadable(reader, params_));
  NoteWeightsWritten();
  ZE_ASSIGN_OR_RETURN(const offload::UpdateJoined joined,
                      partition_->FinishUpdate(stream()));
  LoadReport report;
  report.tensors = static_cast<int64_t>(context_.model->Parameters().size());
  // What this rank reads: its own pieces, in the file's dtype.
  for (const ParamShard& shard : layout().RankShards(rank())) {
    const std::string name = params_[shard.param_index]->name();
    ZE_ASSIGN_OR_RETURN(DType file_dtype,
                        safetensors::DTypeOf(reader.Find(name)->dtype));
    report.bytes_read += shard.count * static_cast<int64_t>(SizeOf(file_dtype));
  }
  ZE_RETURN_IF_ERROR(ImportWeights(reader, joined));
  ZE_RETURN_IF_ERROR(OnStateLoaded());
  return report;
}

absl::Status Stage3::OnStateLoaded() {
  NoteWeightsWritten();
  // Persistent buckets hold the old values.
  ZE_RETURN_IF_ERROR(ReleaseStaleGathered());
  return stream().Synchronize();
}

}  // namespace zero
}  // namespace ze
