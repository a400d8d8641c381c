// ZeroStrategy: the one seam between the Engine and a ZeRO stage. The
// Engine (engine/engine.h) drives a micro-step through it; a strategy owns
// the stage's buffers (a PartitionState), installs its module hooks, and
// reduces, gathers and steps as its stage requires.
//
// Two implementations, created by CreateZeroStrategy (zero/create_strategy.h):
//   Stages0To2 (zero/stages_0_to_2.h): full 16-bit weights on every rank;
//     gradients all-reduced (0), or reduce-scattered into a replicated (1)
//     or partitioned (2) buffer; master weights and optimizer state
//     replicated (0) or partitioned (1, 2).
//   Stage3 (zero/stage3.h): everything partitioned; module hooks gather a
//     module's parameters before it runs and release them after, in the
//     order a FetchSchedule predicts.
// Both share the GradientReducer, the boundary step (RunBoundaryStep), the
// PartitionState and the plan (zero/plan.h), which the engine builds once.
//
// One micro-step, as the Engine calls it (all on the engine's thread):
//   BeginForward; the model's ForwardLoss (module hooks fire); EndForward;
//   BeginBackward; the model's BackwardLoss (hooks fire); EndBackward;
//   at the accumulation boundary, BoundaryStep.
// Per-forward bookkeeping (the parameter uses a forward counts, which its
// backward counts down to know when a gradient is final) is kept per
// saved-state slot (nn/module.h SavedStateSlot; zero/forward_uses.h), like
// the modules' saved records: BeginForward starts the current slot's
// count afresh, BeginBackward..EndBackward counts down and then drops the
// current slot's. So brackets of different slots may interleave, as long
// as each backward runs in its forward's slot and brackets do not nest: a
// pipeline rank's 1F1B runs F(m + w) before B(m), each micro-batch in a
// slot of its own (pipeline/executor.h). The engine's micro-steps all run
// in slot 0, one forward then its backward.
// Split backward (nn/module.h BackwardPart; a pipeline's zero-bubble
// schedule): a micro-batch's backward may be two brackets of its slot,
// BeginBackward(boundary, kInput)..EndBackward, in which split modules
// compute their input's gradient only, then later, with other slots'
// brackets between, BeginBackward(boundary, kWeight)..EndBackward, which
// runs the deferred weight gradients (nn::Module::BackwardWeights). A
// gradient is final, and so reduced, only when every use of it is
// backpropagated: the strategies count a split module's use down in its
// kWeight part and leave the slot's counts, and every reduction that waits
// for the backward's end, to the kWeight bracket; the kInput bracket
// reduces nothing it would not reduce mid-backward. Stage 3 keeps a split
// module's parameters gathered from its kInput part to its kWeight part
// (which reads the weight's shape), and gives it a gradient buffer in both
// (another slot's kWeight bracket may reduce and free it in between).
// Evaluation (EvalForward, Generate) is bracketed by BeginEval / EndEval.
// Checkpoints are a second protocol over the same state, handed out by
// checkpoint() and declared apart (zero/strategy_checkpoint.h).
#ifndef ZE_ZERO_STRATEGY_H_
#define ZE_ZERO_STRATEGY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "core/dtype.h"
#include "core/safetensors/tensor_source.h"
#include "core/status.h"
#include "core/stream.h"
#include "nn/loss_model.h"
#include "nn/module.h"
#include "offload/host_update.h"
#include "zero/boundary_step.h"
#include "zero/memory_estimate.h"
#include "zero/partition_state.h"
#include "zero/plan.h"
#include "zero/reports.h"
#include "zero/training_state.h"

namespace ze {
namespace zero {

class StateCheckpoint;  // zero/strategy_checkpoint.h

// What a strategy borrows from its Engine; everything outlives it.
struct StrategyContext {
  const config::Config* config = nullptr;
  comm::Communicator* comm = nullptr;
  const Stream* compute_stream = nullptr;
  nn::LossModel* model = nullptr;
  TrainingState* training = nullptr;
  // Optimizer steps taken so far (the Engine's counter), for messages.
  const int64_t* global_steps = nullptr;
  // communication_data_type resolved (the model's dtype when unset).
  DType communication_dtype = DType::kF32;
  // The plan for this model, config and world size (zero/plan.h BuildPlan,
  // with the host's facts): the strategy allocates by it instead of
  // deciding layout, placement or memory itself.
  const Plan* plan = nullptr;
  // With a pipeline (pipeline/, docs/pipeline.md): this rank's replica
  // across the stages (`comm` is the stage's data-parallel group), over
  // which the boundary step sums the gradients' squares and the fp16
  // overflow flag, since each stage holds other parameters; and the
  // parameters whose gradients this stage holds as a copy of another
  // stage's (the last stage's tied embedding), which the norm counts once.
  // Null and empty without a pipeline.
  comm::Communicator* pipeline = nullptr;
  std::vector<std::string> gradients_counted_elsewhere;
  // This rank's number in the job (its world rank), for what must differ
  // across all of the job's ranks (PartitionStateOptions::job_rank: the
  // swap files' names). With a pipeline `comm` numbers each stage's ranks
  // from 0. -1: `comm`'s rank (no pipeline: `comm` is the job).
  int job_rank = -1;
};

// Where a strategy is within a micro-step.
enum class Phase {
  kIdle,        // outside the engine's calls: the model must not run (its
                // modules' pre-forward/pre-backward hooks fail)
  kForward,     // between BeginForward and EndForward (a training forward)
  kBackward,    // between BeginBackward and EndBackward
  kEvaluation,  // between BeginEval and EndEval
};

class ZeroStrategy {
 public:
  // Removes the hooks the strategy installed (AddHook).
  virtual ~ZeroStrategy();
  ZeroStrategy(const ZeroStrategy&) = delete;
  ZeroStrategy& operator=(const ZeroStrategy&) = delete;

  // Around the model's ForwardLoss in a training micro-step (phase kForward
  // between them; EndForward returns to kIdle even when the forward
  // failed). The forward's uses are counted in the current saved-state
  // slot (see the file comment).
  absl::Status BeginForward() {
    ZE_RETURN_IF_ERROR(OnBeginForward());
    phase_ = Phase::kForward;
    return absl::OkStatus();
  }
  void EndForward() { phase_ = Phase::kIdle; }
  // Around the model's BackwardLoss (phase kBackward between them; EndBackward
  // returns to kIdle even when it fails), in the saved-state slot of the
  // forward it backpropagates. `boundary`: this micro-step ends the
  // accumulation window. `part`: the whole backward, or one part of a split
  // one (see the file comment); kInput and then kWeight, in the same slot,
  // for one micro-batch.
  absl::Status BeginBackward(bool boundary,
                             nn::BackwardPart part = nn::BackwardPart::kWhole) {
    phase_ = Phase::kBackward;
    backward_part_ = part;
    return OnBeginBackward(boundary);
  }
  absl::Status EndBackward() {
    phase_ = Phase::kIdle;
    return OnEndBackward();
  }
  // The optimizer step at the accumulation boundary; `loss_sum` is this
  // rank's summed micro-batch losses of the window. Stage 3: Aborted (named
  // schedule mismatch) when ranks fetched different module sequences.
  virtual absl::StatusOr<StepReport> BoundaryStep(double loss_sum) = 0;

  // Evaluation forwards: parameters are available as the stage needs, and
  // the training bookkeeping is left as it was. FailedPrecondition during
  // backward or another evaluation.
  absl::Status BeginEval() {
    ZE_RETURN_IF_ERROR(RequireIdle("an evaluation forward"));
    phase_ = Phase::kEvaluation;
    return absl::OkStatus();
  }
  absl::Status EndEval() {
    phase_ = Phase::kIdle;
    return OnEndEval();
  }

  // Engine::GatherParameters: GatherScope makes the named parameters' full
  // data readable on every rank (a collective); ReleaseScope, with
  // modifier_rank >= 0, writes that rank's values into every rank's weights
  // and f32 master weights, then releases. NotFound naming an unknown
  // parameter.
  // The default suits stages whose ranks hold the full weights already.
  virtual absl::Status GatherScope(const std::vector<std::string>& names) {
    return absl::OkStatus();
  }
  virtual absl::Status ReleaseScope(const std::vector<std::string>& names,
                                    int modifier_rank) = 0;
  // Engine::LoadWeights: every parameter from `reader` into the weights and
  // f32 master weights (optimizer state kept). Errors name the file and the
  // parameter; nothing is written unless every parameter is present with
  // its shape.
  virtual absl::StatusOr<LoadReport> LoadWeights(
      const safetensors::TensorSource& reader) = 0;

  // A pipeline's tied parameters (pipeline/executor.h, the schedule's
  // reduce): sums the gradients of `parameters` accumulated over the
  // window so far with those of the same parameters on the other ranks of
  // `other` (the stages holding a copy), so that every copy then updates
  // alike. Stages 0-1: each parameter's whole gradient, before it is
  // reduced over comm(); stage 2 (gradients reduced into the partition
  // every micro-step): this rank's reduced pieces, assembled whole over
  // comm() first and written back after. Between micro-steps, on the
  // compute stream; a collective over comm() and `other`. FailedPrecondition
  // naming a parameter without a gradient (stages 0-1); NotFound naming
  // one not in the layout; errors from the collectives.
  absl::Status SumGradientsWith(const std::vector<nn::Parameter*>& parameters,
                                comm::Communicator& other);

  // Parameter `name`'s f32 master values gathered from every rank (a
  // collective). NotFound naming an unknown parameter.
  absl::StatusOr<std::vector<float>> GatherMasterWeights(
      const std::string& name);
  // Every trainable parameter's name, in reverse model order at every stage.
  std::vector<std::string> ParameterNames() const;
  // Over the last completed optimizer step.
  virtual CommunicationCounters communication_counters() const {
    return CommunicationCounters();
  }
  const MemoryBreakdown& memory() const { return context_.plan->memory; }
  // Bytes moved to and from NVMe swap files so far (offload_optimizer nvme).
  offload::NvmeStore::Counters nvme_counters() const {
    return partition_->nvme_counters();
  }
  PartitionState::OffloadTimes offload_times() const {
    return partition_->offload_times();
  }
  // The offloaded update's CPU/GPU split (PartitionState::update_split).
  const UpdateSplit& update_split() const { return partition_->update_split(); }
  Phase phase() const { return phase_; }

  const PartitionedLayout& layout() const { return partition_->layout(); }

  // The checkpoint protocol over this strategy's state
  // (zero/strategy_checkpoint.h: save, and load from any layout). A handle
  // borrowing the strategy; valid while the strategy lives.
  StateCheckpoint checkpoint();

 protected:
  explicit ZeroStrategy(const StrategyContext& context) : context_(context) {}
  // The stage's part of the phase changes above; OnBeginBackward and
  // OnEndBackward read backward_part().
  virtual absl::Status OnBeginForward() = 0;
  virtual absl::Status OnBeginBackward(bool boundary) = 0;
  virtual absl::Status OnEndBackward() = 0;
  virtual absl::Status OnEndEval() { return absl::OkStatus(); }
  // Whether a GatherParameters scope is open (checkpoints refuse then).
  virtual bool HasOpenScope() const { return false; }
  // After LoadState wrote new weights: refresh anything derived from them
  // (stage 3's persistent gathered parameters).
  virtual absl::Status OnStateLoaded() { return absl::OkStatus(); }
  // The part of the backward the current (or last) bracket runs.
  nn::BackwardPart backward_part() const { return backward_part_; }
  const config::Config& config() const { return *context_.config; }
  comm::Communicator& comm() const { return *context_.comm; }
  const Stream& stream() const { return *context_.compute_stream; }
  Device device() const { return context_.model->device(); }
  int rank() const { return comm().rank(); }
  int world() const { return comm().world_size(); }
  // The error an allocation failure becomes: the bytes the plan needs.
  absl::Status AnnotateAllocationError(const absl::Status& status) const;
  // FailedPrecondition naming `what` unless the phase is kIdle.
  absl::Status RequireIdle(const char* what) const;
  // RequireIdle, no open scope, then FinishUpdate: its proof, which the
  // partition's state readers take (StateCheckpoint::Access).
  absl::StatusOr<offload::UpdateJoined> RequireCheckpointable(const char* what);
  // LoadWeights's check before writing anything: every one of `parameters`
  // is in `reader` with its shape and a float dtype. NotFound /
  // InvalidArgument naming the rank, the parameter and the file.
  absl::Status CheckLoadable(
      const safetensors::TensorSource& reader,
      const std::vector<nn::Parameter*>& parameters) const;
  // LoadWeights's import (zero/partition_import.h) of every bucket's
  // weights and f32 master weights from `reader`: each reads the file's
  // values of the range, converted, so an f32 file gives exact masters
  // under bf16. Call CheckLoadable first. `joined`: FinishUpdate's proof.
  // Read or copy errors; synchronous on return.
  absl::Status ImportWeights(const safetensors::TensorSource& reader,
                             const offload::UpdateJoined& joined);
  // A GatherParameters scope release's write, through the same import
  // filtered to the parameters named: parameter indices[i] (layout index)
  // takes values[i] (its full elements, model dtype, any device, complete
  // on stream()) into this rank's weights (CheckpointWeights' range) and
  // f32 master; every other parameter's elements, and the padding, keep
  // theirs. Copies the named parameters to the host first (the import's
  // sources run on its reader threads). `joined`: FinishUpdate's proof.
  // Copy errors; synchronous on return.
  absl::Status ImportScope(const std::vector<int>& indices,
                           const std::vector<Tensor>& values,
                           const offload::UpdateJoined& joined);
  // The plan's PartitionState options (Plan::state) for this rank: its
  // rank and device, the allocation-error annotation, and with a CPU
  // optimizer this rank's share of the host's cores (unless
  // OMP_NUM_THREADS set the threads).
  PartitionStateOptions RankPartitionStateOptions() const;
  // The boundary step's context over this strategy's state.
  BoundaryStepContext MakeBoundaryStepContext() const;
  // Installs `hook` on `module`; the destructor removes it. Pre-forward and
  // pre-backward hooks first check that an engine call is running the
  // model (phase not kIdle): a user's own model->Forward after Initialize
  // fails at once, naming the module, instead of gathering, saving
  // activations and counting uses that break the next training step.
  void AddHook(nn::Module* module, nn::HookKind kind, nn::Hook hook);

  StrategyContext context_;
  // This rank's model state; created by the strategy's Create.
  std::unique_ptr<PartitionState> partition_;
  Phase phase_ = Phase::kIdle;

 private:
  nn::BackwardPart backward_part_ = nn::BackwardPart::kWhole;
  std::vector<std::pair<nn::Module*, nn::HookHandle>> hooks_;
};

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_STRATEGY_H_
