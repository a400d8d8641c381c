// Stage3: ZeRO stage 3 (zero/strategy.h). Parameters, gradients, master weights
// and optimizer state are all partitioned; a module's parameters exist in
// full only while the module runs.
//
// Layout: one bucket per module (zero::PartitionedLayout::BuildFromGroups),
// made of the parameters the module lists first among all modules (a tied
// parameter belongs to the first module that uses it, e.g. embed.wte to the
// embedding; the output head then needs the embedding's bucket as well).
// Frozen parameters (requires_grad false) of a module form a second bucket
// of their own: gathered like the others, never reduced or updated. Rank r
// owns slice r of every bucket:
//   weights   (partition) model dtype: this rank's 16-bit (or f32) shard
//   grads     (partition) model dtype: reduced gradients, accumulated over
//             the micro-steps of one optimizer step
//   master    (partition) f32 (aliases the weights when training in f32)
//   optimizer state, one FlatOptimizer per trainable bucket
// (all in a zero::PartitionState).
// So model state per rank is 16 Psi / N bytes for mixed-precision Adam, plus
// padding and whatever buckets are gathered at the moment.
//
// The fetcher is module hooks (see nn/module.h):
//   pre-forward, pre-backward:  all-gather the buckets the module reads into
//                               gather buffers; its parameters become views.
//                               Pre-backward also gives trainable buckets a
//                               zeroed full-size gradient buffer.
//   post-forward, post-backward: release the buckets (the parameters' data
//                               goes away) unless another running module
//                               holds them or they are persistent.
//   post-backward:              once every forward use of a bucket has been
//                               backpropagated (counted as stages 0-2 count
//                               parameter uses, per saved-state slot: a
//                               backward counts down its own forward's; a
//                               tied table is final after the embedding's
//                               backward), hand its gradient
//                               buffer to the GradientReducer, which
//                               reduce-scatters it into this rank's gradient
//                               partition (two buckets in flight).
//   A split backward (nn/module.h BackwardPart; zero/strategy.h): a split
//   module's kInput part gathers (pre-backward) and releases nothing; its
//   kWeight part gives its buckets a gradient buffer again (pre-backward),
//   then releases, counts down and reduces (post-backward).
// Streams: on a GPU with overlap_comm (DeepSpeed's default at stage 3), the
// all-gathers and reduce-scatters run on a communication stream of their
// own, so they overlap the compute stream's forward and backward kernels:
//   gather   the communication stream waits for the last write of the
//            weight partition (an event on the compute stream: recorded at
//            the micro-step's BeginForward, or anew after anything that
//            writes the weights), allocates the gathered buffer and
//            all-gathers into it; the compute stream waits for the gather
//            before the module's kernels read the buffer (recorded on the
//            compute stream, so the allocator reuses the block only after
//            them). Evaluation and scope gathers, waited for at once, stay
//            on the compute stream.
//   reduce   the GradientReducer's communication stream is the same one.
// One stream for both, not two: NCCL does not promise that two collectives
// of one communicator on different streams progress together, and one
// stream runs them in the issue order every rank shares. Without
// overlap_comm, or on the CPU, everything runs on the compute stream.
//
// Activation checkpointing needs nothing special: the recomputation fires
// the children's forward hooks (gathers again) but is not counted as a use.
//
// Persistence: a bucket whose parameters total fewer elements than
// stage3_param_persistence_threshold stays gathered once fetched, while the
// persistent buckets' total (in layout order) stays within
// stage3_model_persistence_threshold; after each optimizer step it is
// all-gathered again (one gather per step).
//
// Prefetch: the bucket request order of the first micro-step is recorded.
// Later micro-steps, after each request, issue the all-gathers of the next
// buckets of the recorded order, up to stage3_prefetch_bucket_size elements
// ahead and while gathered elements stay within stage3_max_live_parameters.
// When a request differs from the record, prefetching stops for the rest of
// the micro-step (requests are served on demand), the engine logs it, and the
// new order is recorded. One record is kept per first module (FetchSchedule),
// so micro-steps over a pipeline rank's several stages (interleaved 1F1B)
// each follow their stage's record. A micro-step for the schedule begins
// at BeginForward (or at BeginBackward when none is open) and ends at
// EndBackward: with 1F1B's forwards in flight (pipeline/executor.h) a
// warm-up forward's micro-step is left open and the next BeginForward
// starts another (nothing recorded), the steady state's are F(m + w) then
// B(m), and the cool-down's backwards are micro-steps of their own. Prefetched
// buffers are only read after waiting for their all-gather, so a changed order
// costs time, never correctness.
//
// Reuse (stage3_max_reuse_distance, in bucket requests): when a bucket's
// last user releases it while this micro-step follows the recorded order
// and the record requests the bucket again within that many requests, it
// stays gathered (e.g. the tied table between the embedding and the head,
// or the last modules between forward and backward). Live limit
// (stage3_max_live_parameters): before an on-demand gather that would take
// the gathered elements beyond it, unused gathered buckets (kept or
// prefetched) are released, the one needed farthest ahead first. Every
// decision depends only on the record and the requests so far, so all
// ranks decide alike. At the end of backward every unused bucket is freed,
// so nothing gathered outlives an optimizer step (except persistent ones).
//
// Outside training: BeginEval/EndEval bracket an evaluation forward whose
// requests gather on demand and release after use but are not recorded,
// hashed, counted as uses or counted in the step's counters. GatherScope /
// ReleaseScope implement Engine::GatherParameters; LoadWeights fills this
// rank's ranges from a safetensors file.
//
// Schedule check: every request and reduce-scatter is folded into a running
// 48-bit hash. At each optimizer step the hash's maximum and minimum over
// ranks ride along with the step's statistics all-reduce (one coalesced
// call); if they differ, every rank fails with Aborted "ranks took different
// module paths" listing its own module order, before anything is updated.
//
// Not thread-safe; driven by the Engine's thread.
#ifndef ZE_ZERO_STAGE3_H_
#define ZE_ZERO_STAGE3_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "nn/module.h"
#include "zero/fetch_schedule.h"
#include "zero/flat_layout.h"
#include "zero/forward_uses.h"
#include "zero/gradient_reducer.h"
#include "zero/partition_state.h"
#include "zero/strategy.h"

namespace ze {
namespace zero {

class Stage3 : public ZeroStrategy {
 public:
  // See CreateZeroStrategy. Parameters without storage are filled with
  // Parameter::InitializeSlice(config.seed) for this rank's range only;
  // parameters that have full data are sliced and their full data dropped.
  static absl::StatusOr<std::unique_ptr<ZeroStrategy>> Create(
      const StrategyContext& context);
  // Leaves no parameter pointing at a gradient buffer it owned.
  ~Stage3() override;

  // A training micro-step begins: forgets uses of an unbackpropagated
  // forward and starts following (or recording) the fetch order.
  // FailedPrecondition while a GatherParameters scope is open.
  absl::Status OnBeginForward() override;
  // Checks the schedule hash across ranks with the statistics; refreshes
  // persistent buckets after the update.
  absl::StatusOr<StepReport> BoundaryStep(double loss_sum) override;
  // All-gathers the buckets holding `names` and holds them until
  // ReleaseScope; a training forward fails while a scope is open.
  absl::Status GatherScope(const std::vector<std::string>& names) override;
  // Broadcasts the modifier's values and re-partitions them into every
  // rank's weight shard and master slice.
  absl::Status ReleaseScope(const std::vector<std::string>& names,
                            int modifier_rank) override;
  // Reads only this rank's range of every parameter
  // (TensorSource::ReadRange) and regathers persistent buckets.
  absl::StatusOr<LoadReport> LoadWeights(
      const safetensors::TensorSource& reader) override;
  CommunicationCounters communication_counters() const override {
    return last_step_counters_;
  }

 private:
  struct Bucket {
    bool trainable = false;
    bool persistent = false;
    Tensor gathered;         // (padded) model dtype while gathered/in flight
    comm::Work gather_work;  // in flight: issued ahead, not waited yet
    // One rank: `gathered` is the weights slice itself (or its upload), no
    // all-gather; `alias_ready` orders the compute stream after what
    // produced it (the weight writes, the upload).
    bool aliased = false;
    Event alias_ready;
    // Gathered by an evaluation (or scope) request: its release frees it.
    // One training kept (for reuse, or for the next micro-step) stays.
    bool gathered_for_evaluation = false;
    // What the in-flight gather reads: the weights slice, or its upload
    // from host memory (offload_param), alive until the gather is waited.
    Tensor gather_source;
    bool in_flight = false;
    int users = 0;  // running module calls holding it
    Tensor grads;   // (padded) during backward, until reduced
  };
  struct ModuleEntry {
    nn::Module* module = nullptr;
    std::vector<int> buckets;  // every bucket its DirectParameters live in
  };

  explicit Stage3(const StrategyContext& context) : ZeroStrategy(context) {}
  // The boundary micro-step's backward begins an offloaded update
  // (exactly, or speculatively under clipping or fp16: zero/boundary_step.h)
  // that takes each bucket as its reduction finishes.
  // With `boundary`, begins the offloaded update early where it may.
  absl::Status BeginUpdateEarly(bool boundary);
  absl::Status OnBeginBackward(bool boundary) override;
  // Reduces what the loss did not reach, frees unused gathered buckets and
  // adopts the micro-step's request order as the record when it changed.
  absl::Status OnEndBackward() override;
  // Releases buckets a failed evaluation forward left held.
  absl::Status OnEndEval() override;
  bool HasOpenScope() const override { return scopes_ > 0; }
  absl::Status OnStateLoaded() override;

  absl::StatusOr<PartitionedLayout> Layout();
  absl::Status Allocate(const PartitionedLayout& layout);
  absl::Status InstallHooks();

  // Hook bodies.
  absl::Status Acquire(int entry, bool backward);
  absl::Status Release(int entry);
  absl::Status AfterBackward(int entry);

  // `copy`: gather into a buffer of its own even on one rank (a
  // GatherParameters scope, whose values must not be the weights: what a
  // read-only scope's caller writes is discarded).
  absl::Status IssueGather(int bucket, bool copy = false);
  // Where IssueGather runs: the communication stream, or the compute stream
  // for evaluation and scope gathers (phase kEvaluation).
  const Stream& GatherStream() const;
  // Makes `gather` (GatherStream()) wait for every write of the weight
  // partition queued on the compute stream so far (see Streams above);
  // nothing when it is the compute stream.
  absl::Status OrderGatherAfterWeightWrites(const Stream& gather);
  // The weight partition was (or is about to be) written on the compute
  // stream: the next gather records a fresh event instead of reusing one.
  void NoteWeightsWritten() { weights_written_current_ = false; }
  // Frees unused gathered buckets until `incoming` more elements fit under
  // stage3_max_live_parameters (or none is left to free).
  absl::Status MakeRoom(int64_t incoming);
  absl::Status FinishWaitTiming();
  absl::Status WaitGather(int bucket);
  absl::Status FreeGathered(int bucket);
  absl::Status Prefetch();
  absl::Status EnsureGrads(int bucket);
  absl::Status IssueReduce(int bucket);
  absl::Status ReleaseBucketGradients(int bucket);
  // Frees the gathered copies no module is using (persistent buckets, and
  // those kept from one micro-step for the next) after their weights
  // changed (an update, a load); their next use gathers them again.
  absl::Status ReleaseStaleGathered();
  void Fold(uint64_t value);
  absl::Status ScheduleMismatch(uint64_t max, uint64_t min, uint64_t own);

  // The all-gathers' and reduce-scatters' stream: its own with overlap_comm
  // on a GPU, else the compute stream (same handle).
  Stream communication_stream_;
  bool overlaps_communication_ = false;  // communication_stream_ is its own
  // Recorded on the compute stream after the last write of the weight
  // partition; valid while weights_written_current_.
  Event weights_written_;
  bool weights_written_current_ = false;
  std::unique_ptr<GradientReducer> reducer_;
  std::vector<nn::Parameter*> params_;  // layout order
  std::vector<Bucket> buckets_;
  // Forward uses of each trainable bucket not yet backpropagated, per
  // saved-state slot (zero/forward_uses.h).
  ForwardUses bucket_uses_;
  std::vector<ModuleEntry> entries_;

  // Recorded order, prefetch, reuse, live limit and eviction decisions.
  std::unique_ptr<FetchSchedule> schedule_;
  int scopes_ = 0;  // GatherScope calls not yet released
  // The schedule check: a running hash of this step's requests and
  // reductions, and the module order (for the mismatch error).
  uint64_t schedule_hash_ = 0;
  std::vector<int> step_entries_;
  // All-gather stalls of the step: CUDA timing events around each stream
  // wait (read at the boundary); on the CPU the host time of the wait.
  std::vector<std::pair<Event, Event>> wait_events_;
  CommunicationCounters step_counters_;
  CommunicationCounters last_step_counters_;
};

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_STAGE3_H_
