// Stages0To2: ZeRO stages 0, 1 and 2 (zero/strategy.h). Every rank holds
// the full 16-bit weights; the parameters become views of one flat buffer.
//
// Layout: trainable parameters in *reverse* model order (so buckets
// complete in index order during backward) in reduce_bucket_size-element
// buckets (zero::PartitionedLayout::Build).
//
// Gradient readiness: hooks on every module with trainable direct
// parameters. Pre-forward counts each parameter's uses (not during a
// checkpointed recompute, which is not a new use), post-backward counts them
// down; a parameter is final at zero (so a tied embedding is final only
// after the embedding's backward, the last one). The counts are the
// forward's saved state: kept per saved-state slot (zero/forward_uses.h),
// so a backward counts down its own forward's uses even when other
// forwards ran in between (a pipeline's 1F1B). In a split backward
// (zero/strategy.h) a split module's uses are counted down in its kWeight
// part, stage 2's bucket buffers made there too, and the kInput bracket
// issues nothing. Buckets are issued to the
// GradientReducer strictly in index order as they complete, which keeps
// every rank's collective sequence identical.
//
// Reduction, by stage:
//   0: at the window's boundary micro-step, each bucket of the replicated
//      gradient buffer is all-reduced in place;
//   1: likewise reduce-scattered in place (each rank keeps its slice);
//   2: every micro-step, a bucket's gradients are allocated when its first
//      module's backward starts, reduce-scattered into this rank's gradient
//      partition and freed (at most two buckets in flight). At world size 1
//      the window's first micro-step lets the layers write the partition.
// If the boundary micro-step had no Backward, BoundaryStep reduces the
// window's gradients itself (stages 0-1).
//
// After the update, stages 1-2 all-gather the updated weights in groups of
// allgather_bucket_size elements.
//
// Not thread-safe; driven by the Engine's thread.
#ifndef ZE_ZERO_STAGES_0_TO_2_H_
#define ZE_ZERO_STAGES_0_TO_2_H_

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nn/module.h"
#include "zero/flat_layout.h"
#include "zero/forward_uses.h"
#include "zero/gradient_reducer.h"
#include "zero/partition_state.h"
#include "zero/stage_policy.h"
#include "zero/strategy.h"

namespace ze {
namespace zero {

class Stages0To2 : public ZeroStrategy {
 public:
  // See CreateZeroStrategy. Materialises parameters without storage (every
  // rank keeps full weights at these stages).
  static absl::StatusOr<std::unique_ptr<ZeroStrategy>> Create(
      const StrategyContext& context);

  // Forgets parameter uses counted by a forward of the same saved-state
  // slot that had no backward.
  absl::Status OnBeginForward() override;
  // Reduces the window's gradients first when the boundary micro-step had
  // no Backward; stages 1-2 then all-gather the updated weights.
  absl::StatusOr<StepReport> BoundaryStep(double loss_sum) override;
  // Broadcasts the modifier's values of the named parameters (in place in
  // the replicated weights) and copies them into this rank's master piece.
  absl::Status ReleaseScope(const std::vector<std::string>& names,
                            int modifier_rank) override;
  // Reads whole tensors (every rank holds every parameter).
  absl::StatusOr<LoadReport> LoadWeights(
      const safetensors::TensorSource& reader) override;

 private:
  // Which gradients this window's backward passes reduce.
  enum class WindowReduction {
    kNotYet,    // stages 0-1 before the boundary micro-step's backward
    kReducing,  // this backward issues buckets as they complete
    kReduced,   // stages 0-1: the boundary backward reduced the window
  };

  explicit Stages0To2(const StrategyContext& context) : ZeroStrategy(context) {}
  StagePolicy policy() const { return partition_->policy(); }
  absl::Status OnBeginBackward(bool boundary) override;
  absl::Status OnEndBackward() override;
  absl::Status Setup();
  absl::Status InstallHooks();
  // Stage 2: gives `bucket` a zeroed full-size gradient buffer (or, see
  // GradientReducer::ReducesInPartition, the partition slice itself) and
  // points its parameters' grad slots at it.
  absl::Status EnsureBucketGradients(int bucket);
  absl::Status IssueReadyBuckets(bool flush);
  absl::Status IssueBucket(int bucket);
  // Stage 2, once a bucket's slice is in the partition.
  absl::Status ReleaseBucketGradients(int bucket);
  absl::Status GatherUpdatedWeights();
  // A 16+16 master at stages 1-2 over several ranks: a checkpoint load
  // wrote each rank's own slice of the weights from its master's split, the
  // other slices from the file (which may round ties differently), so the
  // owners' slices are gathered again.
  absl::Status OnStateLoaded() override;

  std::unique_ptr<GradientReducer> reducer_;
  Stream communication_stream_;
  std::vector<nn::Parameter*> params_;  // layout order
  std::unordered_map<const nn::Parameter*, int> index_of_;

  // Backward bookkeeping (see the header comment). Uses per parameter,
  // per saved-state slot (the forward's: zero/forward_uses.h).
  ForwardUses pending_uses_;
  std::vector<int> bucket_unready_;  // parameters not yet final, per bucket
  int next_bucket_ = 0;              // buckets are issued in index order
  std::vector<Tensor> bucket_gradients_;  // stage 2: in-flight full buffers
  WindowReduction window_ = WindowReduction::kNotYet;
};

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_STAGES_0_TO_2_H_
