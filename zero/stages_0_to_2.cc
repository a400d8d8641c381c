#include "zero/stages_0_to_2.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/ops.h"
#include "core/status.h"
#include "zero/bucket_binding.h"

namespace ze {
namespace zero {

absl::StatusOr<std::unique_ptr<ZeroStrategy>> Stages0To2::Create(
    const StrategyContext& context) {
  std::unique_ptr<Stages0To2> strategy(new Stages0To2(context));
  ZE_RETURN_IF_ERROR(strategy->Setup());
  ZE_RETURN_IF_ERROR(strategy->InstallHooks());
  return std::unique_ptr<ZeroStrategy>(std::move(strategy));
}

absl::Status Stages0To2::Setup() {
  nn::LossModel& model = *context_.model;
  // Materialise any absent parameter (shapes-only construction) first:
  // stages 0-2 keep full weights on every rank.
  for (nn::Parameter* parameter : model.Parameters()) {
    if (parameter->state() == nn::ParameterState::kAbsent) {
      ZE_RETURN_IF_ERROR(parameter->Materialize(context_.plan->seed, stream()));
    }
  }
  const StageLayout& stage_layout = context_.plan->layout;
  const PartitionedLayout& layout = stage_layout.layout;
  params_ = stage_layout.params;
  for (int i = 0; i < static_cast<int>(params_.size()); ++i) {
    index_of_[params_[i]] = i;
  }

  // The plan's memory figure was computed before allocating, so a model
  // that does not fit fails with it.
  ZE_ASSIGN_OR_RETURN(
      partition_,
      PartitionState::Create(layout, RankPartitionStateOptions(), stream()));
  // Move the model's weights into the flat buffer and make each parameter a
  // view of it.
  for (int b = 0; b < layout.num_buckets(); ++b) {
    const BucketLayout& bucket = layout.bucket(b);
    for (int i = bucket.first_param; i < bucket.end_param; ++i) {
      ZE_ASSIGN_OR_RETURN(Tensor current, params_[i]->data());
      ZE_RETURN_IF_ERROR(
          Copy(current,
               ParameterView(layout, i, partition_->FullWeights(b),
                             params_[i]->shape()),
               stream()));
      // The old storage goes back to the allocator with the copy out of it
      // still queued: it is handed to another stream only after this one
      // passes the copy.
      ZE_RETURN_IF_ERROR(current.RecordStream(stream()));
    }
    ZE_RETURN_IF_ERROR(BindBucket(layout, b, params_, ParameterSlot::kData,
                                  partition_->FullWeights(b)));
  }
  ZE_RETURN_IF_ERROR(partition_->AllocateTrainingState(stream()));
  const StagePolicy& stage_policy = context_.plan->policy;
  if (!stage_policy.partition_gradients) {
    // The parameters' grad slots are views of the replicated gradients.
    for (int b = 0; b < layout.num_buckets(); ++b) {
      ZE_RETURN_IF_ERROR(BindBucket(layout, b, params_, ParameterSlot::kGrad,
                                    partition_->FullGradients(b)));
    }
  }

  // With overlap_comm on a GPU, gradient collectives run on a separate
  // high-priority stream (so reduction overlaps the rest of backward).
  communication_stream_ = stream();
  if (context_.plan->overlap_comm && device().is_cuda()) {
    ZE_ASSIGN_OR_RETURN(communication_stream_,
                        Stream::Create(device(), /*high_priority=*/true));
  }
  GradientReducerOptions reducer = context_.plan->reducer;
  reducer.communication_dtype = context_.communication_dtype;
  reducer_ = std::make_unique<GradientReducer>(
      reducer, partition_.get(), context_.comm, context_.compute_stream,
      &communication_stream_, [this](int bucket) -> absl::Status {
        // Final for the step at the boundary: an offloaded update begun
        // early takes the bucket now.
        ZE_RETURN_IF_ERROR(partition_->GradientsFinal(bucket, stream()));
        // Stage 2 frees the full gradients; stages 0-1 keep them bound.
        if (!policy().partition_gradients) return absl::OkStatus();
        return ReleaseBucketGradients(bucket);
      });
  bucket_gradients_.resize(layout.num_buckets());
  pending_uses_ = ForwardUses(layout.num_params());
  return absl::OkStatus();
}

// Gradient readiness: see the header comment.
absl::Status Stages0To2::InstallHooks() {
  for (nn::Module* module : context_.model->Modules()) {
    std::vector<int> indices;
    for (nn::Parameter* parameter : module->DirectParameters()) {
      auto found = index_of_.find(parameter);
      if (found != index_of_.end()) indices.push_back(found->second);
    }
    if (indices.empty()) continue;
    AddHook(
        module, nn::HookKind::kPreForward,
        [this, indices](nn::Module&, const Stream&) -> absl::Status {
          // An offloaded update may still be writing weights.
          for (int index : indices) {
            ZE_RETURN_IF_ERROR(partition_->WaitForParameter(index, stream()));
          }
          // Counted whether or not the call saves activations: inside a
          // checkpointed block the first forward saves nothing, yet its
          // backward (after the recompute) will produce these gradients.
          if (phase_ != Phase::kForward) return absl::OkStatus();
          for (int index : indices) pending_uses_.Count(index);
          return absl::OkStatus();
        });
    if (policy().partition_gradients) {
      AddHook(module, nn::HookKind::kPreBackward,
              [this, indices](nn::Module&, const Stream&) -> absl::Status {
                // A split module's first part writes no gradient.
                if (nn::CurrentBackwardPart() == nn::BackwardPart::kInput) {
                  return absl::OkStatus();
                }
                for (int index : indices) {
                  ZE_RETURN_IF_ERROR(EnsureBucketGradients(
                      partition_->layout().placement(index).bucket));
                }
                return absl::OkStatus();
              });
    }
    AddHook(
        module, nn::HookKind::kPostBackward,
        [this, indices](nn::Module&, const Stream&) -> absl::Status {
          // A split module's use is backpropagated after its second part.
          if (nn::CurrentBackwardPart() == nn::BackwardPart::kInput) {
            return absl::OkStatus();
          }
          for (int index : indices) {
            if (pending_uses_.CountDown(index)) {
              --bucket_unready_[partition_->layout().placement(index).bucket];
            }
          }
          return IssueReadyBuckets(/*flush=*/false);
        });
  }
  return absl::OkStatus();
}

absl::Status Stages0To2::EnsureBucketGradients(int bucket) {
  if (bucket_gradients_[bucket].defined()) return absl::OkStatus();
  const PartitionedLayout& layout = partition_->layout();
  const BucketLayout& bucket_layout = layout.bucket(bucket);
  if (reducer_->ReducesInPartition(bucket)) {
    // One rank's slice is the whole bucket and the reduce-scatter is the
    // identity: the layers accumulate straight into the partition, which
    // after the window's first micro-batch holds the sum so far.
    bucket_gradients_[bucket] = partition_->OwnGradients(bucket);
    if (partition_->gradients_current(bucket)) {
      return BindBucket(layout, bucket, params_, ParameterSlot::kGrad,
                        bucket_gradients_[bucket]);
    }
  } else {
    ZE_ASSIGN_OR_RETURN(bucket_gradients_[bucket],
                        Tensor::Empty({bucket_layout.padded_elements},
                                      partition_->model_dtype(), device()));
  }
  // Zeroed on the compute stream, ordered before the layers accumulate.
  ZE_RETURN_IF_ERROR(Fill(bucket_gradients_[bucket], 0.0f, stream()));
  return BindBucket(layout, bucket, params_, ParameterSlot::kGrad,
                    bucket_gradients_[bucket]);
}

absl::Status Stages0To2::ReleaseBucketGradients(int bucket) {
  ZE_RETURN_IF_ERROR(BindBucket(partition_->layout(), bucket, params_,
                                ParameterSlot::kGrad, Tensor()));
  bucket_gradients_[bucket] = Tensor();
  return absl::OkStatus();
}

absl::Status Stages0To2::OnBeginForward() {
  // Forgets uses counted by a forward of this slot that had no backward,
  // so this micro-step's counting starts clean; other slots' forwards
  // (a pipeline's in-flight micro-batches) keep theirs.
  pending_uses_.BeginForward();
  return absl::OkStatus();
}

absl::Status Stages0To2::OnBeginBackward(bool boundary) {
  // A split backward's first part reduces nothing: its split modules'
  // gradients come in the second part, whose bracket issues every bucket
  // (strategy.h). The others' uses are counted down here already, so the
  // second part starts from the slot's remaining counts.
  const bool first_part = backward_part() == nn::BackwardPart::kInput;
  if (!first_part && (policy().partition_gradients || boundary)) {
    window_ = WindowReduction::kReducing;
  }
  if (!first_part && policy().partition_optimizer && boundary &&
      partition_->CanBeginEarly() &&
      WorthBeginningEarly(config(), *context_.training)) {
    // Offloaded buckets are updated as backward finishes them: exactly
    // without clipping or an overflow check, else speculatively (as if
    // nothing clips), validated at the boundary.
    ZE_ASSIGN_OR_RETURN(
        const EarlyStepArgs early,
        ArgsBeforeStatistics(config(), *context_.training, world()));
    ZE_RETURN_IF_ERROR(
        partition_->BeginUpdate(early.args, stream(), early.speculation));
  }
  next_bucket_ = 0;
  const PartitionedLayout& layout = partition_->layout();
  bucket_unready_.assign(layout.num_buckets(), 0);
  for (int i = 0; i < layout.num_params(); ++i) {
    // A parameter no module used in this forward has its final (zero)
    // gradient already.
    if (pending_uses_.pending(i) > 0) {
      ++bucket_unready_[layout.placement(i).bucket];
    }
  }
  return absl::OkStatus();
}

absl::Status Stages0To2::IssueReadyBuckets(bool flush) {
  if (window_ != WindowReduction::kReducing) return absl::OkStatus();
  while (next_bucket_ < partition_->num_buckets() &&
         (flush || bucket_unready_[next_bucket_] == 0)) {
    ZE_RETURN_IF_ERROR(IssueBucket(next_bucket_));
    ++next_bucket_;
  }
  return absl::OkStatus();
}

absl::Status Stages0To2::IssueBucket(int bucket) {
  if (policy().partition_gradients) {
    // A bucket no module touched this micro-step still contributes zeros,
    // so every rank issues the same collectives.
    ZE_RETURN_IF_ERROR(EnsureBucketGradients(bucket));
    return reducer_->Issue(bucket, bucket_gradients_[bucket]);
  }
  return reducer_->Issue(bucket, partition_->FullGradients(bucket));
}

absl::Status Stages0To2::OnEndBackward() {
  // The slot's counts wait for its second part.
  if (backward_part() == nn::BackwardPart::kInput) return absl::OkStatus();
  pending_uses_.EndBackward();
  if (window_ != WindowReduction::kReducing) return absl::OkStatus();
  ZE_RETURN_IF_ERROR(IssueReadyBuckets(/*flush=*/true));
  if (policy().partition_gradients) {
    // Every bucket was reduced (untouched ones as zeros) into the partition.
    window_ = WindowReduction::kNotYet;
    return reducer_->FinishAll();
  }
  window_ = WindowReduction::kReduced;
  return absl::OkStatus();
}

absl::StatusOr<StepReport> Stages0To2::BoundaryStep(double loss_sum) {
  if (!policy().partition_gradients && window_ != WindowReduction::kReduced) {
    // The boundary micro-step had no Backward, so nothing reduced the
    // window's gradients: without this each rank would step with its own.
    window_ = WindowReduction::kReducing;
    next_bucket_ = 0;
    ZE_RETURN_IF_ERROR(IssueReadyBuckets(/*flush=*/true));
  }
  window_ = WindowReduction::kNotYet;
  ZE_RETURN_IF_ERROR(reducer_->FinishAll());
  // Stage 2, a window with no backward: its gradients are zero.
  ZE_RETURN_IF_ERROR(partition_->ZeroStaleGradients(stream()));

  BoundaryStepHooks hooks;
  if (policy().partition_optimizer && world() > 1) {
    hooks.after_update = [this] { return GatherUpdatedWeights(); };
  }
  return RunBoundaryStep(MakeBoundaryStepContext(), loss_sum, hooks);
}

// Stages 1-2: every rank updated its slice of each bucket's weights; an
// in-place all-gather per bucket, grouped up to allgather_bucket_size
// elements per call, rebuilds the full weights everywhere.
absl::Status Stages0To2::GatherUpdatedWeights() {
  // A delayed update was applied at the start of this step's update (the
  // previous step's); the one just started is gathered next step.
  if (!partition_->delays_update()) {
    ZE_RETURN_IF_ERROR(partition_->FinishUpdate(stream()).status());
  }
  const int64_t group_limit = context_.plan->allgather_bucket_elements;
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
  for (int b = 0; b < partition_->num_buckets(); ++b) {
    const int64_t padded = partition_->layout().bucket(b).padded_elements;
    if (group_elements > 0 && group_elements + padded > group_limit) {
      ZE_RETURN_IF_ERROR(flush());
    }
    group.push_back(comm::CollectiveOp::AllGather(partition_->OwnWeights(b),
                                                  partition_->FullWeights(b)));
    group_elements += padded;
  }
  ZE_RETURN_IF_ERROR(flush());
  for (comm::Work& work : works) ZE_RETURN_IF_ERROR(work.StreamWait(stream()));
  return absl::OkStatus();
}

absl::Status Stages0To2::OnStateLoaded() {
  if (!partition_->split_master() || !policy().partition_optimizer ||
      world() == 1) {
    return absl::OkStatus();
  }
  return GatherUpdatedWeights();
}

absl::Status Stages0To2::ReleaseScope(const std::vector<std::string>& names,
                                      int modifier_rank) {
  if (modifier_rank < 0) return absl::OkStatus();
  ZE_ASSIGN_OR_RETURN(const offload::UpdateJoined joined,
                      partition_->FinishUpdate(stream()));
  // The partition's parameters among `names`, and their broadcast values.
  std::vector<int> indices;
  std::vector<Tensor> values;
  for (const std::string& name : names) {
    ZE_ASSIGN_OR_RETURN(nn::Parameter * parameter,
                        context_.model->FindParameter(name));
    ZE_ASSIGN_OR_RETURN(Tensor data, parameter->data());
    if (world() > 1) {
      ZE_ASSIGN_OR_RETURN(comm::Work work,
                          comm().Broadcast(data, modifier_rank, stream()));
      ZE_RETURN_IF_ERROR(work.StreamWait(stream()));
    }
    // A frozen parameter keeps its own tensor, outside the partition: the
    // broadcast wrote it.
    auto found = index_of_.find(parameter);
    if (found == index_of_.end()) continue;
    indices.push_back(found->second);
    values.push_back(data);
  }
  // The weights are the parameters' data, written by the broadcast; the
  // import brings the f32 master along (rewriting the weights with the
  // values they hold).
  ZE_RETURN_IF_ERROR(ImportScope(indices, values, joined));
  return stream().Synchronize();
}

absl::StatusOr<LoadReport> Stages0To2::LoadWeights(
    const safetensors::TensorSource& reader) {
  ZE_RETURN_IF_ERROR(RequireIdle("LoadWeights"));
  ZE_ASSIGN_OR_RETURN(const offload::UpdateJoined joined,
                      partition_->FinishUpdate(stream()));
  const std::vector<nn::Parameter*> parameters = context_.model->Parameters();
  ZE_RETURN_IF_ERROR(CheckLoadable(reader, parameters));
  LoadReport report;
  for (nn::Parameter* parameter : parameters) {
    const std::string name = parameter->name();
    report.bytes_read += static_cast<int64_t>(reader.Find(name)->num_bytes());
    ++report.tensors;
    if (index_of_.count(parameter) > 0) continue;  // in the partition
    // A frozen parameter keeps its own tensor, outside the partition.
    ZE_ASSIGN_OR_RETURN(Tensor host, reader.ReadTensor(name));
    ZE_ASSIGN_OR_RETURN(Tensor data, parameter->data());
    ZE_RETURN_IF_ERROR(CopyConverting(host, data, stream()));
    ZE_RETURN_IF_ERROR(stream().Synchronize());  // `host` dies here
  }
  ZE_RETURN_IF_ERROR(ImportWeights(reader, joined));
  return report;
}

}  // namespace zero
}  // namespace ze
