// PipelineExecutor: runs one rank's action list (pipeline/schedule.h) for
// a training step: its stage's forwards and backwards under the ZeRO
// strategy's brackets, the point-to-point messages to the neighbouring
// stages, and at the end the tied parameters' gradient sum across stages.
//
// One step, as the engine drives it (Engine::TrainBatch):
//   RunStep(micro-batches)     the rank's actions in order:
//     recv/send groups         issued together (one Coalesced call); the
//                              group's receives are waited on at once, its
//                              sends at the step's end (eager, as the
//                              schedule's check assumes)
//     F(m)                     strategy BeginForward; ForwardStage; the last
//                              stage reduces the per-row losses to micro-
//                              batch m's mean (MeanCrossEntropy)
//     B(m)                     when F(m) did not save (1F1B's warm-up),
//                              F(m) again first, saving, between the
//                              strategy's BeginForward and EndForward (so
//                              stage 2 counts this micro-batch's uses);
//                              then strategy BeginBackward(boundary =
//                              false); BackwardStage
//     reduce                   waits for the sends; sums each tied
//                              parameter's gradient with the other stage
//                              holding it (an all-reduce over `tied`)
//   then the caller's strategy BoundaryStep reduces the stage's gradients
//   over its data-parallel group and updates (the micro-batches are its
//   gradient accumulation steps; none is a boundary, so stages 0-1 keep the
//   accumulated gradients whole until BoundaryStep reduces them).
//
// Saved state: a stage's modules keep one record per forward and backward
// pops the most recent (nn/module.h). F(m) saves only when the next
// forward or backward of the stage in the list is B(m); otherwise it runs
// under NoSaveScope keeping only its input, and B(m) runs the forward again
// (with saving) just before its backward: gradients are the same
// deterministic computation, so bit-identical (as activation checkpointing
// is), at the cost of one more forward for 1F1B's warm-up micro-batches.
//
// One stage per rank (the schedule's stages_per_rank 1): interleaved
// schedules are refused. Not thread-safe; one thread drives it.
#ifndef ZE_PIPELINE_EXECUTOR_H_
#define ZE_PIPELINE_EXECUTOR_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "nn/pipeline_stage.h"
#include "pipeline/schedule.h"
#include "zero/strategy.h"

namespace ze {
namespace pipeline {

// What the executor borrows; everything outlives it.
struct ExecutorContext {
  nn::PipelineStage *stage = nullptr;
  // The stage's strategy over its data-parallel group.
  zero::ZeroStrategy *strategy = nullptr;
  // This replica's pipeline: rank() is the stage (pipeline/layout.h).
  comm::Communicator *pipeline = nullptr;
  // The first and the last stage of this replica, when the stage has tied
  // parameters (nn::PipelineStage::TiedParameters); else null.
  comm::Communicator *tied = nullptr;
  const Stream *stream = nullptr;
};

struct MicroBatch {
  Tensor inputs;   // the model's inputs (the first stage reads them)
  Tensor targets;  // the last stage reads them
};

class PipelineExecutor {
 public:
  // Checks the pieces fit: the schedule has one stage per rank and as many
  // ranks as the pipeline communicator, this rank's stage is the stage's
  // (first/last agree with the rank), a stage with tied parameters has a
  // `tied` communicator of 2 ranks. InvalidArgument naming what differs.
  // Then agrees with the pipeline's other ranks on the schedule (an
  // all-gather of a digest of every rank's action lists and micro-batch
  // count: collective over `pipeline`), so ranks that built different
  // schedules (another gradient_accumulation_steps or pipeline.schedule)
  // fail here, on every rank, with FailedPrecondition naming the ranks and
  // their schedules, instead of hanging in a mismatched send or receive.
  static absl::StatusOr<std::unique_ptr<PipelineExecutor>> Create(
      const ExecutorContext &context, Schedule schedule);

  // Runs this rank's actions for one step. micro_batches: the schedule's
  // micro_batches of them, the same on every rank of the pipeline (each
  // stage reads what it needs; middle stages size their buffers from the
  // inputs' shape). backward_scale multiplies each micro-batch's mean loss
  // before backward (the engine's loss_scale / gradient_accumulation_steps).
  // Returns the sum of the micro-batches' mean losses, on every stage (the
  // last stage's, broadcast over the pipeline). Errors from the stage, the
  // strategy or the communicators; the step is then unusable (the caller
  // fails).
  absl::StatusOr<double> RunStep(const std::vector<MicroBatch> &micro_batches,
                                 float backward_scale);

  // Micro-batches whose forward runs twice per step on this rank (not
  // saved at F, recomputed at B).
  int recomputed_per_step() const;
  const Schedule &schedule() const { return schedule_; }

 private:
  PipelineExecutor(const ExecutorContext &context, Schedule schedule);

  ExecutorContext context_;
  Schedule schedule_;
  int rank_ = 0;
  // Per micro-batch: whether F saves its state for B.
  std::vector<bool> saved_;
};

}  // namespace pipeline
}  // namespace ze

#endif  // ZE_PIPELINE_EXECUTOR_H_
