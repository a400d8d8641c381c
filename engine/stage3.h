// Stage3: ZeRO stage 3 for the Engine. Parameters, gradients, master weights
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
//   optimizer state, one FlatOptimizer per trainable bucket.
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
//                               parameter uses; a tied table is final after
//                               the embedding's backward), reduce-scatter its
//                               gradient buffer; the reduced slice is added
//                               to this rank's gradient partition when the
//                               next-but-one bucket is issued or at the end
//                               of backward, so reductions overlap backward.
// Activation checkpointing needs nothing special: the recomputation fires
// the children's forward hooks (gathers again) but is not counted as a use.
//
// Persistence: a bucket whose parameters total fewer elements than
// stage3_param_persistence_threshold stays gathered once fetched; after
// each optimizer step it is all-gathered again (one gather per step).
//
// Prefetch: the bucket request order of the first micro-step is recorded.
// Later micro-steps, after each request, issue the all-gathers of the next
// buckets of the recorded order, up to stage3_prefetch_bucket_size elements
// ahead and while gathered elements stay within stage3_max_live_parameters.
// When a request differs from the record, prefetching stops for the rest of
// the micro-step (requests are served on demand), the engine logs it, and the
// new order is recorded. Prefetched buffers are only read after waiting for
// their all-gather, so a changed order costs time, never correctness.
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
#ifndef ZE_ENGINE_STAGE3_H_
#define ZE_ENGINE_STAGE3_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "core/safetensors/reader.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "engine/engine.h"
#include "engine/training_state.h"
#include "nn/loss_model.h"
#include "zero/flat_layout.h"
#include "zero/optimizer.h"

namespace ze {
namespace engine {

// What Stage3 borrows from its Engine (all outlive it).
struct Stage3Context {
  const config::Config* config = nullptr;
  comm::Communicator* comm = nullptr;
  const Stream* stream = nullptr;
  nn::LossModel* model = nullptr;
  TrainingState* state = nullptr;
  MemoryBreakdown* memory = nullptr;  // filled by Create
  const Counters* counters = nullptr;
  // communication_data_type resolved (the model's dtype when unset): the
  // dtype gradients are reduce-scattered in.
  DType communication_dtype = DType::kF32;
};

class Stage3 {
 public:
  // Lays out, allocates and initialises this rank's partition and installs
  // the hooks. Parameters without storage are filled with
  // Parameter::InitializeSlice(config.seed) for this rank's range only;
  // parameters that have full data are sliced and their full data dropped.
  // ResourceExhausted naming the bytes per rank when the partition does not
  // fit; InvalidArgument for a model whose parameters cannot be laid out.
  static absl::StatusOr<std::unique_ptr<Stage3>> Create(
      const Stage3Context& context);
  ~Stage3();  // removes the hooks
  Stage3(const Stage3&) = delete;
  Stage3& operator=(const Stage3&) = delete;

  // Around the model's BackwardLoss.
  absl::Status BeginBackward();
  absl::Status EndBackward();
  // The optimizer step at the accumulation boundary; `loss_sum` is this
  // rank's summed micro-batch losses of the step. Aborted (named schedule
  // mismatch) when ranks fetched different module sequences.
  absl::StatusOr<StepReport> BoundaryStep(double loss_sum);
  // As Engine::GatherMasterWeights (a collective).
  absl::StatusOr<std::vector<float>> GatherMasterWeights(
      const std::string& name);
  std::vector<std::string> ParameterNames() const;

  // Evaluation (Engine::EvalForward, Generate): between them, module calls
  // gather on demand and release, leaving the training bookkeeping (uses,
  // recorded order, schedule hash, step counters) as it was.
  // FailedPrecondition when called during backward or nested.
  absl::Status BeginEval();
  absl::Status EndEval();

  // Engine::GatherParameters. GatherScope all-gathers the buckets holding
  // `names` (a collective) and holds them until ReleaseScope, which, with
  // modifier_rank >= 0, broadcasts that rank's values of the named
  // parameters and writes them into every rank's weight shard and f32
  // master before releasing. NotFound naming an unknown parameter.
  absl::Status GatherScope(const std::vector<std::string>& names);
  absl::Status ReleaseScope(const std::vector<std::string>& names,
                            int modifier_rank);

  // Reads this rank's range of every parameter (our names) from `reader`
  // into the weight shard and the f32 master (from the file's values, so an
  // f32 file gives exact masters under bf16), and regathers persistent
  // buckets. Returns the tensor bytes read. NotFound / InvalidArgument
  // naming the parameter when the file lacks it or its shape differs.
  absl::StatusOr<int64_t> LoadWeights(const safetensors::Reader& reader);

  // Counted over the last completed optimizer step (see engine.h).
  const CommunicationCounters& last_step_counters() const {
    return last_step_counters_;
  }
  // The most gathered-buffer elements alive at once since Create.
  int64_t peak_gathered_elements() const { return peak_live_elements_; }
  int64_t padded_elements() const { return layout_.padded_total_elements(); }

 private:
  struct Bucket {
    bool trainable = false;
    bool persistent = false;
    Tensor gathered;         // (padded) model dtype while gathered/in flight
    comm::Work gather_work;  // in flight: issued ahead, not waited yet
    bool in_flight = false;
    int users = 0;         // running module calls holding it
    int pending_uses = 0;  // forward uses not yet backpropagated
    Tensor grads;          // (padded) during backward
    Tensor reduced;        // (slice) reduce-scatter output, when adding
                           // or reducing in another dtype
    Tensor wire;           // (padded) grads cast to the communication dtype
    comm::Work reduce_work;
    // Whether this rank's slice of grads_ holds gradients of the current
    // accumulation window. Until it does, its contents are stale and the
    // bucket's first reduce-scatter writes the slice itself (no zero fill,
    // no temporary, no addition); later ones add through `reduced`.
    bool partition_written = false;
    bool reduce_overwrites = false;  // the reduce in flight writes the slice
  };
  struct ModuleEntry {
    nn::Module* module = nullptr;
    std::vector<int> buckets;  // every bucket its DirectParameters live in
  };

  explicit Stage3(const Stage3Context& context) : context_(context) {}

  const config::ZeroConfig& zero_config() const {
    return context_.config->zero_optimization;
  }
  comm::Communicator& comm() const { return *context_.comm; }
  const Stream& stream() const { return *context_.stream; }
  Device device() const { return context_.model->device(); }
  int rank() const { return comm().rank(); }
  int world() const { return comm().world_size(); }

  absl::Status Layout();
  absl::Status Allocate();
  absl::Status InstallHooks();

  // Hook bodies.
  absl::Status BeginMicroStep();
  absl::Status Acquire(int entry, bool backward);
  absl::Status Release(int entry);
  absl::Status AfterBackward(int entry);

  absl::Status IssueGather(int bucket);
  // Next request of `bucket` in the record at or after position_, or
  // trace_.size() when none (or the step does not follow the record).
  size_t NextUse(int bucket) const;
  bool ShouldKeep(int bucket) const;
  // Frees unused gathered buckets until `incoming` more elements fit under
  // stage3_max_live_parameters (or none is left to free).
  absl::Status MakeRoom(int64_t incoming);
  absl::Status FinishWaitTiming();
  absl::Status WaitGather(int bucket);
  absl::Status FreeGathered(int bucket);
  absl::Status Prefetch();
  absl::Status EnsureGrads(int bucket);
  absl::Status IssueReduce(int bucket);
  absl::Status FinishReduce(int bucket);
  absl::Status RefreshPersistent();
  void Fold(uint64_t value);

  Tensor OwnWeights(int bucket) const;
  Tensor OwnMaster(int bucket) const;
  Tensor OwnGrads(int bucket) const;
  // After a step (or a skipped one): the next window's first reduce of each
  // bucket overwrites its gradient slice (see Bucket::partition_written).
  void MarkGradientsStale();

  Stage3Context context_;
  DType model_dtype_ = DType::kF32;
  bool master_aliases_weights_ = false;

  zero::PartitionedLayout layout_;
  std::vector<nn::Parameter*> params_;  // layout order
  std::vector<Bucket> buckets_;
  std::vector<ModuleEntry> entries_;
  std::vector<nn::HookHandle> hooks_;  // with the module each is on
  std::vector<nn::Module*> hook_modules_;

  Tensor weights_;  // (partition) model dtype
  Tensor grads_;    // (partition) model dtype
  Tensor master_;   // (partition) f32 unless aliased
  std::vector<std::unique_ptr<zero::FlatOptimizer>> optimizers_;  // per bucket

  bool in_backward_ = false;
  std::vector<int> reduce_queue_;  // issued, not yet added to grads_

  // Prefetch and the schedule check.
  std::vector<int> trace_;             // recorded request order (bucket ids)
  std::vector<int> observed_;          // this micro-step's requests
  std::vector<int> observed_entries_;  // and the modules that made them
  bool trace_valid_ = false;
  bool following_ = false;    // this micro-step follows the record
  bool prefetching_ = false;  // and prefetches along it
  bool evaluating_ = false;   // inside BeginEval/EndEval
  int scopes_ = 0;            // GatherScope calls not yet released
  bool order_changed_ = false;
  size_t position_ = 0;  // requests so far this micro-step
  uint64_t schedule_hash_ = 0;
  std::vector<int> step_entries_;  // module order this step (for errors)

  int64_t live_elements_ = 0;
  int64_t peak_live_elements_ = 0;
  // All-gather stalls of the step: CUDA timing events around each stream
  // wait (read at the boundary); on the CPU the host time of the wait.
  std::vector<std::pair<Event, Event>> wait_events_;
  CommunicationCounters step_counters_;
  CommunicationCounters last_step_counters_;
};

}  // namespace engine
}  // namespace ze

#endif  // ZE_ENGINE_STAGE3_H_
