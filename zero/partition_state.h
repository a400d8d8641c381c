// PartitionState: the model state one rank owns under ZeRO, bucket by
// bucket, for every stage: the 16-bit (or f32) weights, the f32 master
// weights, the gradients and the optimizer state. Both stage strategies
// (zero/stages_0_to_2.h, zero/stage3.h) keep their state here, the boundary
// step (zero/boundary_step.h) updates it, and checkpoints will read it.
//
// What is replicated and what is this rank's slice depends on the stage:
//
//   stage  weights            gradients          master + optimizer state
//   0      replicated         replicated         replicated (whole buckets)
//   1      replicated         replicated         rank slice
//   2      replicated         rank slice         rank slice
//   3      rank slice         rank slice         rank slice
//
// A replicated buffer is (padded_total) elements, bucket b at
// bucket_offset(b); a partitioned one is (partition) elements, bucket b's
// slice at layout.bucket(b).partition_offset (zero/flat_layout.h). In f32
// training the master weights are the weights themselves (no copy).
//
// Placement: where each kind of state lives (ZeRO-Offload). The gradients
// are always on the model's device (the reductions write them there). With
// offload_optimizer, a bucket's f32 master slice and optimizer state may live
// in host memory (or on NVMe), updated by offload::CpuOptimizer: its
// gradients go to a host staging buffer, the CPU updates the master weights
// and writes the 16-bit weights, which go back to the device
// (UpdateWeights). That pipeline is offload::HostUpdate's
// (offload/host_update.h): PartitionState hands it each offloaded bucket's
// buffers as a slot and holds the step's offload::InFlightUpdate. With
// offload_param (stage 3) the weights partition itself lives in host memory
// and is uploaded before each all-gather (WeightsForGather); with
// offload_param nvme (kNvme) it lives in a swap file (offload::
// SwappedWeights), a record per bucket, except the first buckets the
// forward reads up to max_in_cpu elements, which stay in host memory
// (ChooseResidentWeights). A swapped bucket is read into a swap buffer
// before its all-gather (read ahead in the fetch schedule's order:
// ReadAheadWeights); the update writes its new weights into the host
// staging buffer, from where they go back to the file when the bucket is
// next gathered or the update is joined (FinishUpdate), whichever is
// first. A bucket whose optimizer stays on the device (offload_optimizer's
// ratio < 1, or none) while its weights are offloaded is updated by its
// device kernel into a device buffer, and the new weights are then copied
// to their tier: host memory, or a swap buffer that is written to the file
// (UpdateWeights). Buffers of one placement are packed: bucket b's slice at
// its own offset in them.
//
// Not thread-safe: owned and driven by one strategy on the engine's thread,
// which calls every method. It runs no thread of its own; the offloaded
// update's worker and the CPU optimizer's threads are HostUpdate's and
// touch only the buffers handed to it (see its Threading section).
#ifndef ZE_ZERO_PARTITION_STATE_H_
#define ZE_ZERO_PARTITION_STATE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "offload/cpu_optimizer.h"
#include "offload/host_update.h"
#include "offload/swapped_state.h"
#include "offload/swapped_weights.h"
#include "zero/flat_layout.h"
#include "zero/optimizer.h"
#include "zero/reports.h"
#include "zero/stage_policy.h"

namespace ze {
namespace zero {

// Where a kind of model state lives.
enum class Placement {
  kDevice,  // the model's device (GPU memory, or host memory on CPU)
  kHost,    // host memory (pinned with pin_memory), worked on by the CPU
  kNvme,    // a swap file (offload::SwappedState for optimizer state,
            // offload::SwappedWeights for stage 3's weights), worked on by
            // the CPU in host buffers
};
const char* PlacementName(Placement placement);

// Which buckets' master weights and optimizer state go to the host for
// offload_optimizer's `ratio` (DeepSpeed: the fraction of the optimizer
// state offloaded to CPU Adam): trainable buckets in the order their
// gradients are final in backward (the last layers first) until at least
// `ratio` of the trainable elements are on the host; the rest stay on the
// device. The CPU update of those buckets then starts earliest in backward
// and the next forward reads their weights last, so both ends of the update
// overlap compute. `bucket_zero_read_first` (stage 3's model order) means
// bucket 0's gradients are final last: the choice starts from the last
// bucket; otherwise (stages 0-2's backward order) from bucket 0. ratio 1:
// every trainable bucket; ratio 0: none. Frozen buckets stay on the device.
std::vector<Placement> ChooseOptimizerPlacement(
    const PartitionedLayout& layout, const std::vector<bool>& trainable,
    double ratio, bool bucket_zero_read_first,
    Placement offloaded = Placement::kHost);

// The CPU/GPU split of the offloaded update (issue 27; offload::HostUpdate's
// header): which host buckets the device updates, their state streamed up
// and down through it, while the CPU updates the rest. The CPU's part costs
// an element what the CPU update takes (alone with nothing on the device;
// while the link streams otherwise); the device's costs the link's
// traffic, state_bytes_per_element each way at the link's rate while the
// CPU updates (the kernel itself is negligible beside it). Both sides move
// host memory, so the rates measured while the other side runs are what
// a split gets: on a host whose memory bandwidth the CPU update already
// fills, the first bucket moved slows the CPU as much as it relieves it
// and nothing is split. Buckets are taken in the next forward's reading
// order (the device's part runs once the step's arguments are known, at
// the boundary, and the forward reads those first), each while moving it
// to the device makes the later of the two finish earlier: the two sides
// finish together, to a bucket. The CPU's head start during backward is
// not counted, which errs toward the device.
struct UpdateSplit {
  std::vector<bool> on_device;  // per bucket
  int64_t host_elements = 0;    // every host bucket's own elements
  int64_t device_elements = 0;  // of them, updated on the device
  offload::UpdateRates rates;   // measured (all 0: none, nothing split)
  int64_t state_bytes_per_element = 0;
  double cpu_seconds() const;     // the CPU's part
  double device_seconds() const;  // the link's part
  // "device updates X of Y host elements (Z%): CPU A ms, link B ms (CPU
  // C ns/element alone, C' while the link streams; link D GB/s each way
  // alone, D' while the CPU updates; ...)".
  std::string ToString() const;
};
// `host_elements[b]`: bucket b's own elements if its state is on the host
// (0 otherwise); `forward_position[b]`: 0 for the bucket the next forward
// reads first. Nothing is split unless every rate is positive. Pure.
UpdateSplit ChooseUpdateSplit(const std::vector<int64_t>& host_elements,
                              const std::vector<int>& forward_position,
                              int64_t state_bytes_per_element,
                              const offload::UpdateRates& rates);

// offload_param nvme's max_in_cpu (DeepSpeed: parameter elements kept in
// CPU memory rather than swapped): per bucket, whether its weights slice
// stays in host memory. Buckets in the forward's reading order (stage 3:
// bucket 0 first) while their slices total at most `max_in_cpu` elements;
// the rest live in the swap file. Pure; the plan and the state both use it.
std::vector<bool> ChooseResidentWeights(const PartitionedLayout& layout,
                                        int64_t max_in_cpu);

struct PartitionStateOptions {
  int stage = 0;  // 0-3: which quantities are replicated (table above)
  int rank = 0;   // in the data-parallel group the state is partitioned over
  // This rank's number in the job: what names its swap files (SwapFileName
  // below), since every rank of a job may create them in the same
  // nvme_path. `rank` cannot: with a pipeline each stage's group
  // numbers its ranks from 0, and the stages hold different parameters.
  // -1: `rank` (no pipeline: the group is the job).
  int job_rank = -1;
  DType model_dtype = DType::kF32;
  Device device = Device::Cpu();
  OptimizerOptions optimizer;
  // Per bucket: false for stage 3's frozen buckets (no gradients, no
  // optimizer, never updated). Empty: every bucket is trainable.
  std::vector<bool> trainable;
  // Per bucket (empty: all kDevice): where its master weights and optimizer
  // state live (ChooseOptimizerPlacement).
  std::vector<Placement> optimizer_placement;
  // kHost (offload_param cpu, stage 3 only): the weights partition in host
  // memory. kNvme (offload_param nvme, stage 3 only): in a swap file
  // (weights_nvme, weights_max_in_cpu below). Stage 3 is a rule of the
  // config's keys, checked in config/ at load, so the plan (zero/plan.h)
  // never asks otherwise and Create does not check again. The optimizer
  // may be anywhere: a host bucket's CPU update writes the weights where
  // they live; a device bucket's (offload_optimizer ratio < 1) kernel
  // writes them into a device buffer that UpdateWeights then copies to
  // their tier (OffloadDeviceUpdatedWeights).
  Placement weights_placement = Placement::kDevice;
  // Host buffers the device copies to and from are page-locked (faster,
  // asynchronous copies); otherwise pageable.
  bool pin_memory = false;
  // Threads of the CPU optimizer (the caller's included); 0: every hardware
  // thread.
  int host_threads = 0;
  // Where its pinned workers start in the process's affinity mask
  // (offload::CpuExecutionOptions::first_cpu).
  int host_first_cpu = 0;
  // Host buckets travel and are updated in chunks of at most this many
  // elements (sub_group_size, capped at kMaxChunkElements: a few
  // milliseconds of CPU work), so the CPU starts as soon as the first chunk's
  // gradients arrive and the next forward as soon as the first layers'
  // chunk is uploaded.
  int64_t chunk_elements = kMaxChunkElements;
  // The forward reads bucket 0 first (stage 3's model order) rather than
  // last (stages 0-2's backward order). Once every bucket is handed over,
  // the worker takes the one the next forward reads first
  // (ChooseBucketToUpdate), so that forward follows the update instead of
  // waiting for all of it; within a bucket it goes from the end (stages
  // 0-2: the first layers).
  bool bucket_zero_read_first = false;
  // ZeRO-Offload's delayed parameter update (offload_optimizer's
  // delayed_update; host optimizer with weights on the device): the worker
  // uploads updated weights into a second device buffer, and they replace
  // the weights when the update is next joined (FinishUpdate), so forwards
  // and backwards until
  // then use the weights from before the update.
  bool delayed_update = false;
  // Speculation's backup (offload::HostUpdateOptions::speculation_elements):
  // how many host elements' master weights and optimizer state an update
  // begun during backward may back up (zero/plan.h sizes it). 0: an update
  // whose arguments depend on the global norm is not begun early.
  int64_t speculation_elements = 0;
  // bf16.master_weights_16_plus_16: the master weights of device buckets
  // are the bf16 weights plus a 16-bit remainder each (core/dtype.h's
  // Bf16Split), so the master costs 2 bytes an element; host buckets keep
  // f32 (the same bits in the same 4 bytes) and upload weights rounded as
  // hi. Values equal an f32 master's bit for bit, the weights rounding ties
  // away from zero. Needs model_dtype bf16, the weights on the device and
  // no kNvme placement (InvalidArgument from Create otherwise; config/
  // refuses those).
  bool split_master = false;
  // The CPU/GPU split of the host buckets' update: measure the CPU
  // optimizer and the link once the state is allocated and split by
  // ChooseUpdateSplit (on a CUDA device; nothing on the CPU). The plan sets
  // it where a device-updated bucket is possible: host (not NVMe) buckets,
  // stages 2-3 (gradients partitioned, so only a forward, which waits for
  // the weights anyway, follows the update before they are written
  // again), no delayed update, the weights on the device, an f32 master
  // and f32 moments.
  bool split_update = false;
  // Per bucket, the split chosen already (tests; empty: split_update
  // decides). Only host buckets may be true.
  std::vector<bool> update_on_device;
  // kNvme buckets: the swap file's directory, aio settings and host
  // buffers (file_name and arrays are set by PartitionState).
  offload::SwappedStateOptions nvme;
  // weights_placement kNvme: the weights' swap file (directory, aio
  // settings, buffer_count, buffer_size, pinning; file_name and
  // element_bytes are set by PartitionState) and max_in_cpu.
  offload::SwappedWeightsOptions weights_nvme;
  int64_t weights_max_in_cpu = 0;
  static constexpr int64_t kMaxChunkElements = int64_t{1} << 24;
  // Turns an allocation failure into the error the user sees (the engine
  // states the bytes the plan needs). May be null.
  std::function<absl::Status(const absl::Status&)> annotate_allocation_error;
};

// The name of a rank's swap file of `what` ("optimizer_state",
// "parameters") inside nvme_path: zero_engine_rank<R>_<what>.swp, R its
// job_rank (else its rank), so the ranks of one job, which may share an
// nvme_path, never name the same file (NvmeStore refuses one a live store
// holds). Pure.
std::string SwapFileName(const PartitionStateOptions& options,
                         const std::string& what);

class PartitionState {
 public:
  // Allocates the weights (zero-filled) only: the strategy moves or
  // initialises the model's values into them before AllocateTrainingState,
  // so the model's own storage can be freed before the rest is allocated
  // (what keeps the peak at the plan). ResourceExhausted (annotated) when
  // the device cannot hold them.
  static absl::StatusOr<std::unique_ptr<PartitionState>> Create(
      const PartitionedLayout& layout, const PartitionStateOptions& options,
      const Stream& stream);
  PartitionState(const PartitionState&) = delete;
  PartitionState& operator=(const PartitionState&) = delete;
  // Waits for an update in progress (the InFlightUpdate's destructor).
  ~PartitionState();

  // Allocates the gradients (zeroed), the master weights (a copy of this
  // rank's weights, unless f32 training aliases them), one device optimizer
  // per trainable device bucket and one CPU optimizer over every host
  // bucket, with the host staging buffers; queued on `stream` (the host
  // copies are complete on return). Errors as Create.
  absl::Status AllocateTrainingState(const Stream& stream);

  const PartitionedLayout& layout() const { return layout_; }
  int num_buckets() const { return layout_.num_buckets(); }
  bool trainable(int bucket) const { return trainable_[bucket]; }
  StagePolicy policy() const { return StagePolicy::ForStage(options_.stage); }
  DType model_dtype() const { return options_.model_dtype; }
  // The model's device (gradients, and state placed kDevice, live there).
  const Device& device() const { return options_.device; }
  // f32 training keeps no separate master copy where the optimizer works
  // on the weights where they live (every bucket's optimizer placed with
  // the weights).
  bool master_aliases_weights() const { return master_aliases_weights_; }
  // Start of bucket b in a replicated (padded_total) buffer.
  int64_t bucket_offset(int bucket) const { return bucket_offsets_[bucket]; }

  // The whole weights buffer: (padded_total) when replicated, (partition)
  // at stage 3, on weights_placement()'s memory. Parameters' data are views
  // into it at stages 0-2. Undefined with kNvme weights (ReadWeights and
  // WriteWeights reach every placement).
  const Tensor& weights() const { return weights_; }
  // (padded) bucket b of the replicated weights (stages 0-2 only).
  Tensor FullWeights(int bucket) const;
  // (padded) bucket b of the replicated gradients (stages 0-1 only).
  Tensor FullGradients(int bucket) const;
  // What this rank's optimizer for bucket b reads and writes: the whole
  // bucket at stage 0, this rank's (slice) from stage 1 on. Undefined for a
  // bucket whose weights are in the swap file (weights_swapped).
  Tensor OwnWeights(int bucket) const;
  // kNvme weights: bucket b's slice lives in the swap file (not kept in
  // host memory by max_in_cpu).
  bool weights_swapped(int bucket) const {
    return !weights_resident_.empty() && !weights_resident_[bucket];
  }
  // f32, on optimizer_placement(bucket)'s memory; OwnWeights when aliased;
  // undefined for kNvme (see ReadOwnState and WriteOwnState). A frozen
  // bucket has one too (its weights' values, or what an import gave it).
  Tensor OwnMaster(int bucket) const;
  // With split_on_device(b): the f32 master is JoinBf16Split(OwnWeights,
  // OwnMasterLow) element by element, and OwnMaster is undefined; this is
  // the remainders ((own elements), 2-byte raw bits in a bf16-typed
  // tensor, on the device). Undefined otherwise.
  Tensor OwnMasterLow(int bucket) const;
  bool split_master() const { return options_.split_master; }
  const OptimizerOptions& optimizer_options() const {
    return options_.optimizer;
  }
  // The CPU/GPU split chosen at AllocateTrainingState (empty on_device: no
  // host buckets, or none split).
  const UpdateSplit& update_split() const { return update_split_; }
  // split_master() and bucket b's master on the device: hi and lo.
  bool split_on_device(int bucket) const {
    return options_.split_master &&
           optimizer_placement_[bucket] == Placement::kDevice;
  }
  Tensor OwnGradients(int bucket) const;
  // The part of OwnGradients that is parameter `param_index`'s (its
  // bucket's elements in both the parameter's range and OwnRange): a
  // view, undefined when this rank owns none of it; `*param_begin`
  // (non-null) is set to the view's first element within the parameter.
  Tensor OwnGradientsOf(int param_index, int64_t* param_begin) const;
  // The partitioned gradient buffer (stages 2-3): (partition).
  const Tensor& gradient_partition() const { return gradients_; }

  // The optimizer step of every trainable bucket with `step_args` (the
  // boundary step's clip and unscale factor in grad_scale): device buckets'
  // FlatOptimizer kernels are queued on `stream`. Offloaded buckets go to
  // the HostUpdate (offload/host_update.h): their gradients are copied to
  // the host on a transfer stream (`stream`'s later work, which may
  // overwrite the gradients, waits for those copies); then its worker
  // thread updates them with the CPU optimizer bucket by bucket as they
  // arrive, in the order offload::ChooseBucketToUpdate picks (here, handed
  // over at once: the order the next forward reads them), chunk by chunk as
  // one stream of tiles over the optimizer's threads (CpuOptimizer::
  // StepRanges; NVMe chunks one at a time), and copies each chunk's 16-bit
  // weights back while it works on the next. UpdateWeights
  // returns without waiting for the worker: whoever reads a host bucket's
  // weights calls WaitForWeights first; the master weights and optimizer
  // state are read only with the UpdateJoined that FinishUpdate returns.
  // Runs FinishUpdate itself first (one update at a time). InvalidArgument
  // for bad step_args (nothing updated), kernel or copy errors otherwise;
  // an error of the worker is returned when the update is next joined.
  // A device bucket whose weights live off the device (offload_param with
  // offload_optimizer's ratio < 1) is updated by its kernel into a device
  // buffer, then copied to its tier: into host memory on `stream` (the next
  // gather's upload is ordered after it), or, swapped, into a swap buffer
  // whose write to the file starts once the copy is done, so the next
  // gather reads the new weights from that buffer or the file. Never
  // speculative: the boundary's arguments are known here. A swap file
  // error in that write is deferred like WeightsForGather's: the next
  // FinishUpdate returns it (every rank stops at the next boundary).
  absl::Status UpdateWeights(const StepArgs& step_args, const Stream& stream);
  // Makes `stream`'s later work see bucket b's updated weights: waits (on
  // the host) until the worker has written them, then orders `stream` after
  // their upload. Immediate when no update is in progress, the bucket's
  // optimizer is on the device, or the update is delayed (the weights in
  // use are the previous ones). When the worker failed before the chunk,
  // returns OK at once (the weights are then partly updated): the failure
  // is the join's to report, which the next boundary step does on every
  // rank (FinishPreviousUpdate). Errors only from the stream wait.
  // `own_begin`: wait only for the bucket's own elements from there on (the
  // worker writes a bucket from its end down, so a parameter needs the
  // chunk of its first element); 0: the whole bucket.
  absl::Status WaitForWeights(int bucket, const Stream& stream,
                              int64_t own_begin = 0);
  // WaitForWeights for the part of parameter `index` (layout index) this
  // rank updates (stages 0-2's pre-forward hooks).
  absl::Status WaitForParameter(int index, const Stream& stream);
  // Joins the update in flight (if any): waits for the whole of it and
  // orders `stream` after every upload; with kNvme weights writes the
  // weights it wrote back to the swap file and waits for every write (an
  // I/O error is returned, naming the file; after a failed update the
  // staged weights are not written: the file keeps the weights from before
  // it for the buckets not gathered since), and returns a read error that
  // WeightsForGather deferred; a delayed update is applied here
  // (its weights copied into place on `stream`). Returns the proof the
  // state readers take (ReadOwnState, WriteOwnState; the import and export
  // doors, zero/partition_import.h and zero/partition_export.h), so a
  // reader cannot forget it. The worker's
  // error, if it failed (the update is over either way). FailedPrecondition,
  // with the update left running, between BeginUpdate and UpdateWeights:
  // that update is this step's and still takes gradients.
  absl::StatusOr<offload::UpdateJoined> FinishUpdate(const Stream& stream);
  // The boundary step's first act: FinishUpdate for the previous step's
  // update, while one begun during this step's backward (BeginUpdate) runs
  // on. The worker's error, if it failed.
  absl::Status FinishPreviousUpdate(const Stream& stream);
  // Early start (the boundary micro-step's backward, when the step's
  // arguments do not depend on the global gradient norm: no clipping, no
  // fp16 overflow check): BeginUpdate starts the worker with `step_args`;
  // GradientsFinal(b), called when bucket b's gradients for the step are
  // final on `stream`, sends them down and lets the worker update them
  // while backward goes on; UpdateWeights (with the same arguments, else
  // Internal) hands over the rest. Until then FinishPreviousUpdate leaves
  // the worker running (FinishUpdate refuses) and WaitForWeights does not wait
  // (backward's recompute reads the weights before the update). BeginUpdate
  // does nothing where an early start is not possible (NVMe, delayed update,
  // host weights).
  //
  // Speculation (issue 27): with `speculation`, step_args are those of a
  // step that clips nothing and the worker backs up what it updates
  // (offload::HostUpdate's header comment). UpdateWeights then commits when
  // the boundary's arguments are the same, bit for bit, and otherwise rolls
  // back and runs the exact update; a skipped step rolls back
  // (DropSpeculation). Without a backup (speculation_elements 0) a
  // speculative BeginUpdate does nothing.
  bool CanBeginEarly() const;
  absl::Status BeginUpdate(
      const StepArgs& step_args, const Stream& stream,
      std::optional<offload::Speculation> speculation = std::nullopt);
  // A skipped step: a speculative update begun early is rolled back (the
  // weights on `stream` are those from before). Nothing otherwise. Errors
  // from the worker or the copies.
  absl::Status DropSpeculation(const Stream& stream);
  // What became of this step's update begun early: set by UpdateWeights and
  // DropSpeculation.
  SpeculationOutcome speculation_outcome() const { return outcome_; }
  // This step's speculation as decided, in offload/'s terms (zeros when
  // none began): set with speculation_outcome().
  const offload::SpeculationReport& last_speculation() const {
    return decided_;
  }
  // Between BeginUpdate and UpdateWeights: the worker already applies this
  // step's gradients.
  bool update_begun_early() const { return early_args_.has_value(); }
  absl::Status GradientsFinal(int bucket, const Stream& stream);
  bool delays_update() const { return options_.delayed_update; }
  // Where the offloaded update's worker spent its time, summed over every
  // update so far (zeros without host buckets): what bounds an offloaded
  // step, for benchmarks.
  using OffloadTimes = offload::HostUpdateTimes;
  OffloadTimes offload_times() const;
  // The host buckets in the order the worker took them in the last finished
  // (or current) update.
  std::vector<int> last_update_order() const;
  // The swap files' I/O since creation, summed: the optimizer state's and
  // the weights' (weights_nvme_counters alone); zeros without either. Its
  // `busy` is the union of both files' in-flight intervals (they share one
  // IoActivity), not a sum.
  offload::NvmeStore::Counters nvme_counters() const;
  // Steps taken by the optimizers (every trainable bucket's agree).
  int64_t optimizer_step_count() const;
  // Restores it on every optimizer (checkpoints).
  void set_optimizer_step_count(int64_t count);

  // Checkpoints: this rank's own optimizer state of a bucket (the elements
  // its optimizer updates: the whole bucket at stage 0, its slice from
  // stage 1 on), wherever it lives. Array 0 is the f32 master weights, then
  // the optimizer's state tensors (StateArrayNames). Both take
  // FinishUpdate's proof and are synchronous on return.
  //   "master", then "exp_avg", "exp_avg_sq" (Adam/AdamW) or
  //   "momentum_buffer" (SGD with momentum), or nothing more (plain SGD).
  std::vector<std::string> StateArrayNames() const;
  // Copies own elements [own_begin, own_begin + out.numel()) of `array` of
  // `bucket` into `out` (a CPU f32 tensor; bf16 for a moment array whose
  // values are bf16, bf16 moments: exact). A frozen bucket (no optimizer)
  // reads its f32 master copy (OwnMaster) as master and zeros as state.
  // OutOfRange when the range leaves the bucket; copy or NVMe read errors
  // otherwise.
  absl::Status ReadOwnState(const offload::UpdateJoined& joined, int bucket,
                            int array, int64_t own_begin, const Tensor& out,
                            const Stream& stream) const;
  // Writes `values` (a CPU f32 tensor) over own elements [own_begin, ...)
  // of `array` of `bucket`. With master_aliases_weights() array 0 is the
  // weights themselves. A frozen bucket ignores its state arrays.
  absl::Status WriteOwnState(const offload::UpdateJoined& joined, int bucket,
                             int array, int64_t own_begin, const Tensor& values,
                             const Stream& stream);
  // The weights a checkpoint saves and loads for `bucket`: at stages 0-2
  // the whole replicated bucket (padded), at stage 3 this rank's slice
  // (bucket elements [BucketSlice.begin, end)). `*bucket_begin`: the first
  // bucket element the returned tensor holds. On weights_placement()'s
  // memory, in the model's dtype.
  // Undefined for a swapped bucket: CheckpointWeightsRange, ReadWeights
  // and WriteWeights reach it.
  Tensor CheckpointWeights(int bucket, int64_t* bucket_begin) const;
  // CheckpointWeights' range: its first bucket element and its length.
  PartitionSlice CheckpointWeightsRange(int bucket) const;
  // Elements [begin, begin + n) of CheckpointWeights' range (begin counted
  // from its start) into `out` (n elements, any device and float dtype,
  // converted as CopyConverting does), or from `values` into it, wherever
  // the weights live: for a swapped bucket through a swap buffer (a write
  // is read-modify-write of its record, on disk on return). Synchronous.
  // The caller holds FinishUpdate's proof (nothing else writes them).
  // OutOfRange for a range outside; copy and NVMe errors (naming the file).
  absl::Status ReadWeights(int bucket, int64_t begin, const Tensor& out,
                           const Stream& stream) const;
  absl::Status WriteWeights(int bucket, int64_t begin, const Tensor& values,
                            const Stream& stream);
  // Bucket elements this rank's optimizer owns: [0, padded) at stage 0,
  // its slice otherwise.
  PartitionSlice OwnRange(int bucket) const;

  // Stage 3: bucket b's (slice) weights on the model's device for its
  // all-gather, on `stream`: OwnWeights(b) itself, or with host weights a
  // device copy uploaded on a transfer stream that `stream` then waits for.
  // The caller keeps the returned tensor alive until the all-gather that
  // reads it has been waited for.
  // A swapped bucket (kNvme): its slice comes from the swap file through a
  // swap buffer (already there when read ahead), or, when the update has
  // written it since, from the staging buffer, and then goes back to the
  // file; the result is a device copy (CUDA) or a host copy (CPU), so the
  // swap buffer is free for the next bucket once the copy is done. Its I/O
  // errors are not returned here (this rank alone would leave the others
  // in the all-gather): the slice is served as zeros and the error, naming
  // the file, is the next FinishUpdate's, which the boundary step reports
  // on every rank before the step is applied.
  absl::StatusOr<Tensor> WeightsForGather(int bucket, const Stream& stream);
  // kNvme: starts reading the swapped buckets among `buckets` (the fetch
  // schedule's next requests, in order) into free swap buffers, as many as
  // are free. Nothing for other placements or buckets the update wrote
  // (their values are in the staging buffer). Errors from submitting.
  absl::Status ReadAheadWeights(const std::vector<int>& buckets);
  // The weights' swap file's I/O since creation (zeros without one).
  offload::NvmeStore::Counters weights_nvme_counters() const;
  // How many buckets to read ahead (buffer_count - 1, at least 1: the
  // gather in progress may hold a buffer); 0 without a weights swap file.
  int weights_read_ahead() const;
  // Whether bucket b's weights would be read from the swap file: swapped,
  // and not written by an update since (the staging buffer holds those).
  bool WantsWeightsRead(int bucket) const;

  // Whether bucket b's gradients hold this accumulation window's values.
  // Stages 2-3: until they do, the slice is stale and the window's first
  // reduction writes it instead of adding (no zero fill, no temporary).
  bool gradients_current(int bucket) const {
    return gradients_current_[bucket];
  }
  void set_gradients_current(int bucket) { gradients_current_[bucket] = true; }
  // After a step (taken or skipped): replicated gradients are zero-filled
  // on `stream`; partitioned ones are marked stale.
  absl::Status ResetGradients(const Stream& stream);
  // Before the boundary step: a partitioned bucket no reduction reached in
  // this window has zero gradients; fill them (on `stream`).
  absl::Status ZeroStaleGradients(const Stream& stream);

  Placement weights_placement() const { return options_.weights_placement; }
  Placement gradients_placement() const { return Placement::kDevice; }
  // Master weights and optimizer state of `bucket`.
  Placement optimizer_placement(int bucket) const {
    return optimizer_placement_[bucket];
  }
  bool has_host_optimizer() const { return host_optimizer_ != nullptr; }

  // Device optimizer of a trainable device bucket (checkpoints, tests).
  FlatOptimizer& device_optimizer(int bucket) { return *optimizers_[bucket]; }
  // The CPU optimizer over every host bucket (null when none).
  offload::CpuOptimizer* host_optimizer() { return host_optimizer_.get(); }

 private:
  PartitionState(const PartitionedLayout& layout,
                 const PartitionStateOptions& options);
  bool weights_replicated() const { return !policy().partition_parameters; }
  bool gradients_replicated() const { return !policy().partition_gradients; }
  bool updates_whole_buckets() const { return !policy().partition_optimizer; }
  // Elements bucket b's optimizer updates: padded bucket (stage 0) or slice.
  int64_t own_elements(int bucket) const;
  // What this rank's optimizer of bucket b reads and writes of `buffer`
  // (the weights or the gradients; `replicated`: (padded_total) elements,
  // else (partition)): the whole bucket at stage 0, else its slice.
  Tensor OwnSlice(const Tensor& buffer, bool replicated, int bucket) const;
  // Zero-filled. `transferred`: host memory the device copies from and to
  // (pinned with pin_memory on a GPU).
  absl::StatusOr<Tensor> Allocate(int64_t elements, DType dtype,
                                  Placement placement, const Stream& stream,
                                  bool transferred = false) const;
  // Where bucket b comes in the order the forward reads the buckets: 0 for
  // the first read.
  int ForwardReadPosition(int bucket) const;
  // The HostUpdate's slots: every trainable offloaded bucket's buffers.
  absl::Status CreateHostUpdate();
  // update_split_: options_.update_on_device, or measured and modelled
  // (split_update on CUDA), or none.
  absl::Status ChooseSplit();
  bool offloaded(int bucket) const {
    return optimizer_placement_[bucket] != Placement::kDevice;
  }
  // Elements [own_begin, own_begin + count) of `array` of NVMe bucket
  // `bucket`, read into or written from `data`, chunk by chunk.
  absl::Status SwappedRange(int bucket, int array, int64_t own_begin,
                            int64_t count, float* data, bool write) const;
  // InvalidArgument (naming `what`) unless `tensor` is host f32: the
  // optimizer state's conversions read and write through it.
  static absl::Status CheckHostF32(const Tensor& tensor, const char* what);
  // ReadOwnState / WriteOwnState of a 16+16 master (split_master): joins
  // the weights and remainders into host f32 `out`, or splits host f32
  // `values` into both. InvalidArgument for a tensor not host f32.
  absl::Status ReadSplitMaster(int bucket, int64_t own_begin, const Tensor& out,
                               const Stream& stream) const;
  absl::Status WriteSplitMaster(int bucket, int64_t own_begin,
                                const Tensor& values, const Stream& stream);
  int64_t num_chunks(int bucket) const;
  // The bucket's own elements [begin, begin + count) in chunk `chunk`.
  struct ChunkSpan {
    int64_t begin = 0;
    int64_t count = 0;
  };
  ChunkSpan chunk_span(int bucket, int64_t chunk) const;

  PartitionedLayout layout_;
  PartitionStateOptions options_;
  std::vector<bool> trainable_;
  std::vector<Placement> optimizer_placement_;  // per bucket
  bool master_aliases_weights_ = false;
  std::vector<int64_t> bucket_offsets_;
  Tensor weights_;    // (padded_total) stages 0-2, (partition) stage 3
  Tensor gradients_;  // (padded_total) stages 0-1, (partition) stages 2-3
  // f32 master weights, packed per placement: bucket b's own elements at
  // master_offsets_[b] in the buffer of its placement. With every bucket on
  // the device that is the replicated (stage 0) or partition layout.
  Tensor device_master_;
  Tensor host_master_;
  std::vector<int64_t> master_offsets_;
  std::vector<std::unique_ptr<FlatOptimizer>> optimizers_;  // device buckets
  // Host buckets: one CPU optimizer over host_master_'s elements, and a
  // model-dtype staging buffer with host_master_'s packing that receives
  // the gradients and then (in place) the updated 16-bit weights.
  std::unique_ptr<offload::CpuOptimizer> host_optimizer_;
  // kNvme buckets' master weights and moments, and each such bucket's
  // first chunk index in it.
  std::unique_ptr<offload::SwappedState> swapped_;
  std::vector<int> first_swapped_chunk_;
  Tensor host_staging_;
  // delayed_update: host_staging_'s packing on the device, in the model's
  // dtype: the worker's uploads, applied when the update is joined.
  Tensor delayed_weights_;
  // kNvme weights: per bucket, kept in host memory (max_in_cpu; the rest
  // swapped), where in weights_ a kept bucket's slice starts, the swap
  // file (records per bucket, 0 elements for kept ones), and per bucket
  // whether the update wrote its new weights into host_staging_ that are
  // not in the file yet (until WeightsForGather or FinishUpdate writes
  // them back).
  std::vector<bool> weights_resident_;
  std::vector<int64_t> resident_offsets_;
  std::unique_ptr<offload::SwappedWeights> swapped_weights_;
  std::vector<bool> weights_dirty_;
  // The in-flight clock both swap files (swapped_, swapped_weights_)
  // share: one disk's traffic, its overlaps counted once (nvme_counters'
  // `busy`).
  std::shared_ptr<offload::IoActivity> io_activity_ =
      std::make_shared<offload::IoActivity>();
  // A swapped bucket's read (or write-back) failed in WeightsForGather,
  // which served zeros: the next FinishUpdate returns it (so the boundary
  // step stops every rank before the step is applied).
  absl::Status deferred_weights_error_;
  // The staging slice of bucket b (offloaded buckets' packing).
  Tensor StagingOf(int bucket) const;
  // Create's part for kNvme weights: the kept buckets' host buffer and the
  // swap file (its errors prefixed with the rank and the config section).
  absl::Status CreateSwappedWeights(const Stream& stream);
  // Own elements [own_begin, ...) of bucket b's weights into `out`
  // (converted), wherever they live.
  absl::Status ReadOwnWeights(int bucket, int64_t own_begin, const Tensor& out,
                              const Stream& stream) const;
  // FinishUpdate's part: every dirty bucket written back (`update_ok`) or
  // dropped (a failed update), then every write waited for.
  absl::Status FlushSwappedWeights(bool update_ok);
  // WeightsForGather for a swapped bucket; its errors are deferred there.
  absl::StatusOr<Tensor> SwappedWeightsForGather(int bucket,
                                                 const Stream& stream);
  // WeightsForGather's upload of host `own` to a device buffer on the
  // upload stream; `*uploaded_event` is set to the upload's end.
  absl::StatusOr<Tensor> UploadForGather(const Tensor& own,
                                         const Stream& stream,
                                         std::optional<Event>* uploaded_event);
  // Writes a dirty bucket's new weights from the staging buffer back to
  // the swap file (asynchronously; the record stays in its swap buffer).
  absl::Status WriteBackWeights(int bucket);
  // UpdateWeights' device buckets with the weights off the device: a swapped
  // bucket's new weights on their way from the device into its swap buffer
  // (acquired for overwrite); once `copied` is done the buffer is released
  // dirty, which starts its write to the file.
  struct PendingWeightsWrite {
    int bucket = -1;
    Event copied;
  };
  // Bucket b (trainable, optimizer on the device, weights off it): its
  // update into a device buffer of the model's dtype, then the copy to the
  // weights' tier (host memory, on `stream`; or a swap buffer, appended to
  // `pending`, at most `window` of them held at once: the oldest are
  // released first).
  absl::Status OffloadDeviceUpdatedWeights(
      int bucket, const StepArgs& step_args, const Stream& stream,
      size_t window, std::deque<PendingWeightsWrite>* pending);
  // Releases the oldest of `pending` until at most `keep` remain: waits for
  // each copy, then releases its buffer dirty (the write starts). `ok`
  // false (a failed step): the buffers are released clean and forgotten,
  // so the file's previous record is read next. Swap-file errors are
  // deferred (deferred_weights_error_); a copy's error is returned.
  absl::Status ReleasePendingWeights(size_t keep, bool ok,
                                     std::deque<PendingWeightsWrite>* pending);
  // Records `status` (a swap-file error of bucket b's weights, `what`
  // being done) as the next FinishUpdate's, unless one is recorded already.
  void DeferWeightsError(int bucket, const char* what,
                         const absl::Status& status);
  // offload_param (CUDA): the stream WeightsForGather uploads host weights
  // on, created at the first gather.
  std::optional<Stream> gather_upload_stream_;
  std::optional<StepArgs> early_args_;  // set between BeginUpdate and
                                        // UpdateWeights
  SpeculationOutcome outcome_ = SpeculationOutcome::kNone;
  offload::SpeculationReport decided_;
  // What became of the speculation in flight now that it is decided.
  SpeculationOutcome SpeculatedOutcome(bool committed) const;
  std::vector<bool> gradients_current_;
  // The offloaded update's pipeline (null without offloaded buckets) and,
  // per bucket, its slot there (-1: not offloaded or frozen).
  std::unique_ptr<offload::HostUpdate> host_update_;
  UpdateSplit update_split_;
  std::vector<int> host_slot_;
  // The update in flight (empty when none). Last: destroyed first, so the
  // worker is joined while the buffers it writes are alive.
  offload::InFlightUpdate in_flight_;
};

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_PARTITION_STATE_H_
