// The optimizer step at the accumulation boundary, once for every stage.
//
// On entry the gradients of the window are reduced and in place in the
// PartitionState (the strategy finished its reductions). Then:
//   0. the previous step's offloaded update (if one is still running) is
//      finished; whether it failed on some rank is part of step 1's
//      all-reduce, and then every rank fails (Aborted, naming the count; the
//      failing rank returns its own error);
//   1. one all-reduce carries what every rank must agree on: the sum of
//      squares of the gradients (replicated gradients: each rank contributes
//      1/N of its sum), the fp16 overflow flag, the summed micro-batch
//      losses and step 0's failure flag; with a schedule hash (stage 3), a
//      coalesced all-reduce (max) of the hash and its negation gives every rank
//      its maximum and minimum; with a pipeline, a second all-reduce sums
//      the squares and the overflow flag over the stages (a tied
//      parameter's copy counted once);
//   2. differing hashes fail every rank with the strategy's Aborted error;
//   3. the loss scaler updates (fp16); an overflow skips the step; in bf16
//      and f32 a non-finite loss or gradient norm skips it too (unless an
//      exact offloaded update already began), so the weights stay finite;
//      a skipped step rolls back a speculative update begun during backward
//      (PartitionState::DropSpeculation);
//   4. zero::ComputeGradClip turns the global norm into the one factor that
//      unscales (loss scale, world size, predivide factor) and clips;
//   5. each trainable bucket's optimizer updates its master slice and writes
//      the 16-bit weights in the same pass (PartitionState::UpdateWeights: on
//      the device, or on the CPU for offloaded buckets, finished by the next
//      step's step 0 or by whoever reads the weights first; a speculative
//      update begun during backward is committed when its arguments are
//      these, else rolled back and redone; StepReport::speculation says
//      which);
//   6. the strategy's after-update work (stages 1-2 all-gather the updated
//      weights; stage 3 refreshes persistent buckets);
//   7. gradients are reset (zeroed or marked stale) and the schedule advances.
// Everything runs on the compute stream (offloaded buckets: see
// PartitionState::UpdateWeights); the host waits once, for the
// statistics.
#ifndef ZE_ZERO_BOUNDARY_STEP_H_
#define ZE_ZERO_BOUNDARY_STEP_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "core/stream.h"
#include "zero/partition_state.h"
#include "zero/reports.h"
#include "zero/training_state.h"

namespace ze {
namespace zero {

// Where the step runs and what it updates; all outlive the call.
struct BoundaryStepContext {
  const config::Config* config = nullptr;
  comm::Communicator* comm = nullptr;
  const Stream* stream = nullptr;  // the compute stream
  TrainingState* training = nullptr;
  PartitionState* partition = nullptr;
  int64_t step_number = 0;  // the step being taken, 1-based, for messages
  // A pipeline's replica across the stages (StrategyContext::pipeline):
  // the sum of squares and the overflow flag are then summed over it too,
  // after `comm`'s all-reduce, so every stage clips by the whole model's
  // norm. Null: no pipeline.
  comm::Communicator* pipeline = nullptr;
  // Parameters (by name) whose gradients another stage counts: left out of
  // this rank's sum of squares. May be null.
  const std::vector<std::string>* gradients_counted_elsewhere = nullptr;
};

// What differs between the stages, as data and callbacks (each optional).
struct BoundaryStepHooks {
  // Stage 3: the running hash of this step's fetch/reduce order.
  std::optional<uint64_t> schedule_hash;
  // Called when ranks' hashes differ (max, min over ranks, this rank's);
  // returns the error every rank reports.
  std::function<absl::Status(uint64_t max, uint64_t min, uint64_t own)>
      schedule_mismatch;
  // After the statistics, whether or not the step is then skipped.
  std::function<absl::Status()> after_statistics;
  // After the optimizer updated every bucket (not on a skipped step).
  std::function<absl::Status()> after_update;
};

// The optimizer's arguments of the step about to be taken as far as they
// are known before step 1's all-reduce, so that an offloaded update may
// start while backward still runs (PartitionState::BeginUpdate).
struct EarlyStepArgs {
  // Those of a step that clips nothing (RunBoundaryStep computes the same
  // values when it does not clip).
  StepArgs args;
  // Set when the step's arguments depend on the statistics (gradient
  // clipping, fp16's overflow check): the update is then speculative, and
  // stops speculating once this rank's own gradients' sum of squares (as
  // stored) exceeds the clip limit (gradient_clipping times the gradient
  // scale, squared; infinity without clipping).
  std::optional<offload::Speculation> speculation;
};
absl::StatusOr<EarlyStepArgs> ArgsBeforeStatistics(
    const config::Config& config, const TrainingState& training, int world);

// Whether a step's optimizer arguments may depend on its statistics
// (gradient clipping, or fp16's overflow check): an update begun before
// them is then speculative.
bool StepArgsNeedStatistics(const config::Config& config,
                            const TrainingState& training);

// Whether an offloaded update should begin during this step's backward.
// Exactly (no clipping, no overflow check): always. Speculatively: not
// after a step whose arguments its statistics changed (it clipped, or was
// skipped): clipping tends to last from one step to the next (early
// training, a loss spike), and a speculation undone costs restoring its
// backup and then the whole update after the boundary (run 63: 124M GPT,
// stage 2, 2 of 10 steps redone, 14% slower than never speculating). Such
// a step waits for the norm; the next speculates again if it clipped
// nothing. Either way the results are the same, bit for bit.
bool WorthBeginningEarly(const config::Config& config,
                         const TrainingState& training);

// Runs steps 1-7 above. `loss_sum`: this rank's summed micro-batch losses
// of the window. Errors from the collectives and kernels, or the
// schedule-mismatch error; on those the weights are not updated.
absl::StatusOr<StepReport> RunBoundaryStep(const BoundaryStepContext& context,
                                           double loss_sum,
                                           const BoundaryStepHooks& hooks);

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_BOUNDARY_STEP_H_
