// PipelineExecutor: runs one rank's action list (pipeline/schedule.h) for
// a training step: its stages' forwards and backwards under the ZeRO
// strategy's brackets, the point-to-point messages to the ranks holding the
// neighbouring stages, and at the end the tied parameters' gradient sum
// across the first and the last stage.
//
// Stages of a rank. With one stage per rank (gpipe, 1f1b) the rank's model
// is that stage; with the interleaved schedule (v stages per rank) it is an
// nn::InterleavedStages of v chunks, chunk c being pipeline stage
// rank + c * ranks. Either way ONE ZeRO strategy holds all the rank's
// parameters: every bracket below is the strategy's, around one chunk's
// forward or backward (the other chunks' parameters are then simply not
// used, as an unused layer's are: they add nothing to the gradients).
//
// One step, as the engine drives it (Engine::TrainBatch):
//   RunStep(micro-batches)     the rank's actions in order:
//     recv/send groups         issued together: over mpi its receives
//                              as one Coalesced call and its sends as
//                              another (eager, as SimulateSchedule
//                              assumes); over nccl, whose sends block until
//                              received (sends_wait_for_receiver), both as
//                              ONE call, one NCCL group, else two ranks
//                              exchanging would each block in its send
//                              (Create refuses lists that would hang so:
//                              CheckBlockingMessages, interleaved). The
//                              group's receives are waited on at once, its
//                              sends at the rank's first reduce
//     F(s,m)                   strategy BeginForward; stage s's
//                              ForwardStage; the last stage reduces the
//                              per-row losses to micro-batch m's mean
//                              (MeanCrossEntropy); EndForward
//     B(s,m)                   strategy BeginBackward(boundary = false);
//                              stage s's BackwardStage; EndBackward
//                              (F(s,m) and B(s,m) both run in the
//                              saved-state slot of (s,m), below)
//     Bi(s,m)                  (zb_h1) B(s,m) split (nn/module.h): the
//                              bracket's part kInput, BackwardStage under
//                              nn::SplitBackwardScope, so the stage's
//                              Linears compute their input gradients only
//                              and keep their weight gradients' inputs in
//                              (s,m)'s slot; its input gradient is sent on
//     Bw(s,m)                  the bracket's part kWeight around the
//                              stage's BackwardStageWeights in (s,m)'s
//                              slot: the weight gradients, after which
//                              the strategy counts their uses down and
//                              reduces what is final (zero/strategy.h)
//     reduce(s)                (first of the rank's) waits for the sends;
//                              for stage s's tied parameters, sums each
//                              one's gradient with the other stage holding
//                              it (an all-reduce over `tied`)
//   then the caller's strategy BoundaryStep reduces the rank's gradients
//   over its data-parallel group and updates (the micro-batches are its
//   gradient accumulation steps; none is a boundary, so stages 0-1 keep the
//   accumulated gradients whole until BoundaryStep reduces them).
//
// Saved state, and the strategy's invariant. Every F(s,m) saves what its
// backward needs, and B(s,m) backpropagates micro-batch m's own records:
// both run inside nn::SavedStateSlot(slot of (s,m)) (nn/module.h), so the
// stage's modules push F(s,m)'s records onto that slot's stacks and B(s,m)
// pops them from there, whatever other forwards ran in between (1F1B runs
// F(m + w) before B(m), which a single LIFO stack per module would pop
// first). The strategy keys its per-forward bookkeeping by the same slot
// (zero/strategy.h, zero/forward_uses.h): the uses F(s,m) counts are those
// B(s,m) counts down, so stage 2 issues a bucket's reduction, and stage 3
// a bucket's reduce-scatter, once micro-batch m's own uses are
// backpropagated, never on another micro-batch's count. Activation
// checkpointing works per slot too: a checkpointed layer keeps its input
// in the slot's record and recomputes in B(s,m) as it would without a
// pipeline; with cpu_checkpointing the offload keeps a slot's inputs on the
// host until its backward and prefetches within the slot
// (nn/activation_offload.h).
//
// So no forward runs twice (recomputed_per_step() is 0 for every
// schedule), and the gradients are the same computation as
// with the recompute this replaced (a deterministic forward, repeated), in
// the same order: bit-identical. The memory is the schedule's:
// a rank holds the saved state of the micro-batches whose forward ran and
// whose backward has not, at most ActivationBound(schedule, rank)
// (pipeline/schedule.h: m for GPipe, min(m, p - rank) for 1F1B and
// ZB-H1); the executor measures it from the modules
// (peak_saved_micro_batches()). ZB-H1 holds besides, from Bi(s,m) to
// Bw(s,m), each Linear's input and output gradient of the micro-batch
// (InFlightBound: min(m, p) micro-batches with either). A
// step that fails part-way leaves its slots' records behind (the caller
// fails the run); a later step's forward in a slot pushes above them and
// its backward pops its own, so they cost memory, never correctness.
// Stage 3 keeps gathered parameters from one bracket to the next (no
// boundary in the step) as its fetch schedule decides; which chunk's
// modules come next changes only what it keeps, never what it computes.
//
// Time. Each RunStep splits this rank's wall time (from its first action
// to the end of the closing loss exchange, an all-reduce over the
// pipeline, so every rank's step ends with the slowest rank's) into busy
// time, its compute actions (F, B, Bi, Bw, and reduce), and idle time, the
// rest: blocked in a group's receives, in the wait for its sends at the
// first reduce, in the tied parameters' gradient sum there (communication:
// tied_sum_ms, synchronised on a GPU so the interval covers it), in the
// closing exchange (all of these wait_ms), and the executor's own work
// between actions (last_step_times(),
// pipeline/step_time.h). Idle over wall is the rank's measured bubble,
// what SimulateSchedule's rank_bubble predicts. On a GPU the kernels run
// after the host queued them, so the executor synchronises its compute
// stream at the end of every compute action: the interval is the host's
// wall time until the action's kernels finished. Over the mpi backend
// every message group synchronises the stream anyway before staging
// through host memory, so this adds a synchronisation only between two
// compute actions with no message between them (1F1B's last rank, Bi then
// Bw), exposing one kernel launch's latency there. Over nccl the messages
// run on the communicator's own stream; the synchronisation keeps the
// compute intervals measured the same way. With ranks sharing one GPU, "busy"
// includes the time the GPU ran another rank's kernels while this rank's
// waited. The strategy's BoundaryStep (the data-parallel reduction and the
// optimizer) is the caller's, outside the step timed here.
//
// Not thread-safe; one thread drives it.
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
#include "pipeline/step_time.h"
#include "zero/strategy.h"

namespace ze {
namespace pipeline {

// What the executor borrows; everything outlives it.
struct ExecutorContext {
  // This rank's stages in model order: schedule.StagesOfRank(rank) (one
  // with one stage per rank; nn::PipelineStagesOf the engine's model).
  std::vector<nn::PipelineStage *> stages;
  // The stage's strategy over its data-parallel group.
  zero::ZeroStrategy *strategy = nullptr;
  // This replica's pipeline: rank() is the stage (pipeline/layout.h).
  comm::Communicator *pipeline = nullptr;
  // The ranks of this replica holding the first and the last stage, when
  // one of this rank's stages has tied parameters
  // (nn::PipelineStage::TiedParameters); else null.
  comm::Communicator *tied = nullptr;
  const Stream *stream = nullptr;
};

struct MicroBatch {
  Tensor inputs;   // the model's inputs (the first stage reads them)
  Tensor targets;  // the last stage reads them
};

class PipelineExecutor {
 public:
  // Checks the pieces fit: the schedule has as many ranks as the pipeline
  // communicator and as many stages per rank as `stages` holds, each of
  // this rank's stages is where the schedule puts it (the first stage,
  // and only it, on rank 0's chunk 0; the last on rank ranks-1's last
  // chunk), a rank with tied parameters has a `tied` communicator of 2
  // ranks. InvalidArgument naming what differs. Then agrees with the
  // pipeline's other ranks on the schedule (an all-gather of a digest of
  // the kind, the stages per rank, the micro-batch count and every rank's
  // action lists: collective over `pipeline`), so ranks that built
  // different schedules (another gradient_accumulation_steps,
  // pipeline.schedule or pipeline.stages_per_rank) fail here, on every
  // rank, with FailedPrecondition naming the ranks and their schedules,
  // instead of hanging in a mismatched send or receive. Over a backend
  // whose sends wait for their receiver (nccl), first FailedPrecondition
  // on every rank for a schedule that would deadlock there
  // (CheckBlockingMessages: interleaved_1f1b).
  static absl::StatusOr<std::unique_ptr<PipelineExecutor>> Create(
      const ExecutorContext &context, Schedule schedule);

  // Runs this rank's actions for one step. micro_batches: the schedule's
  // micro_batches of them, the same on every rank of the pipeline (each
  // stage reads what it needs; middle stages size their buffers from the
  // inputs' shape). backward_scale multiplies each micro-batch's mean loss
  // before backward (the engine's loss_scale / gradient_accumulation_steps).
  // Returns the sum of the micro-batches' mean losses, on every stage (the
  // last stage's, sent to every rank by an all-reduce over the pipeline).
  // Errors from the stage, the strategy or the communicators; the step is then
  // unusable (the caller fails).
  absl::StatusOr<double> RunStep(const std::vector<MicroBatch> &micro_batches,
                                 float backward_scale);

  // Of the last RunStep on this rank: forwards of a (stage, micro-batch)
  // that ran more than once (a recompute at B), counted as the stages'
  // ForwardStage calls beyond the first per slot; 0 by design (see the
  // file comment), measured so a change that brings recomputes back shows.
  int recomputed_per_step() const { return recomputed_per_step_; }
  // Of the last RunStep on this rank: the most micro-batches (over all its
  // stages) whose saved state the stages' modules held at once, counted
  // from the modules' saved-state slots (nn::Module::SavedSlots of each
  // stage's first layer) after each forward. At most
  // ActivationBound(schedule(), rank) (pipeline/schedule.h).
  int peak_saved_micro_batches() const { return peak_saved_micro_batches_; }
  const Schedule &schedule() const { return schedule_; }
  // Of the last RunStep on this rank: its wall time split into compute and
  // idle time (the file comment's "Time"). Of a step that failed, what was
  // counted until it did (wall_ms 0).
  const StepTimes &last_step_times() const { return timer_.last(); }

 private:
  PipelineExecutor(const ExecutorContext &context, Schedule schedule);

  ExecutorContext context_;
  Schedule schedule_;
  int rank_ = 0;
  int recomputed_per_step_ = 0;
  int peak_saved_micro_batches_ = 0;
  StepTimer timer_;
  // The chunk (index into context_.stages) of model stage `stage` here.
  int ChunkOf(int stage) const { return stage / schedule_.ranks; }
  // Per (chunk, micro-batch): the index of the executor's buffers, and
  // (plus one, slot 0 being everyone else's) the saved-state slot F and B
  // run in.
  int Slot(int stage, int micro_batch) const {
    return ChunkOf(stage) * schedule_.micro_batches + micro_batch;
  }
};

}  // namespace pipeline
}  // namespace ze

#endif  // ZE_PIPELINE_EXECUTOR_H_
