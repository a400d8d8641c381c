// HostUpdate: ZeRO-Offload's optimizer step on the CPU as a pipeline over
// plain per-bucket tensors ("slots"): each slot's gradients go down from the
// device to a host staging buffer chunk by chunk, a worker thread runs the
// CPU optimizer over the chunks as their copies land (CpuOptimizer::
// StepRanges for master weights in host memory; one chunk at a time through
// SwappedState for master weights and moments on NVMe), and each chunk's
// 16-bit weights go back up while the next is worked on. It knows no ZeRO
// stage and no partition: the caller (zero::PartitionState) cuts its
// buffers into slots and names them by index.
//
// One step's update is an InFlightUpdate, returned by Start: the caller
// hands slots over as their gradients are final (HandOver, Close), waits
// for single chunks' weights (WaitForWeights) and ends it with Join, which
// is the only way to obtain an UpdateJoined: the proof that nothing is
// writing the master weights, the optimizer state or the weights any more,
// which the readers of that state (zero::PartitionState's master and
// checkpoint accessors) take as an argument. So "finish the update before
// reading the state" is a type, not a convention.
//
// The order of work and every arithmetic operation are those of the
// pipeline as it ran inside PartitionState (bit for bit the same results):
// slots handed over all at once are taken in the forward's reading order
// (HostUpdateSlot::forward_position), slots handed over during backward as
// ChooseBucketToUpdate picks, each slot's chunks from its end down.
//
// Speculation (issue 27): an update begun early may be speculative, its
// arguments those of a step that clips nothing (the global gradient norm,
// hence the clip factor and, in fp16, whether the step is skipped at all,
// is known only at the boundary). Each tile of a chunk updated
// speculatively first has its master weights and optimizer state copied
// into a backup of HostUpdateOptions::speculation_elements elements and its
// gradients' squares added to a running sum, on the optimizer's threads in
// parallel (RangeToUpdate::before_update). At the boundary the
// caller either commits (Commit: the speculative arguments are the step's,
// bit for bit, and the update goes on as an early start) or rolls back
// (Rollback: the worker stops, every speculated chunk gets its master and
// state back and its 16-bit weights re-sent from the restored master
// (unless the redo will write them anyway), and
// the optimizer's step count is not advanced; the caller then starts the
// exact update, or skips the step). Speculation stops (the worker waits for
// the decision before its next chunk) once the backup is full or the
// running sum (of the tiles backed up so far) exceeds
// Speculation::sum_of_squares_limit (this rank's
// gradients alone already clip the step, or are not finite); what it has
// not taken by then is updated after the decision, with the step's
// arguments. The running sum only decides when to stop: the step's norm is
// the caller's, so no summation order changes a result.
//
// The CPU/GPU split (issue 27): a slot may be updated on the device instead
// (HostUpdateSlot::update_on_device; zero/plan.h chooses which by a model
// of the two costs). Its master weights and optimizer state stay in host
// memory (page-locked for the update's life) and travel up a chunk at a
// time into one of two device buffers, HostUpdateOptions::device_step
// updates them with the gradients where they lie on the device and writes
// the weights in place, and the state goes back down while the next chunk
// goes up: the link's traffic instead of the CPU's, with the same
// arithmetic bit for bit (zero::RunStepKernelOn). A device-updated slot is
// never speculated: its chunks go up as soon as it is handed over, and
// their kernels wait for the decision (so a rollback has nothing of it to
// restore) or, not speculating, run at once.
//
// Threading:
//   - The caller's thread (the engine's; "engine thread" below) calls
//     everything public: Create, Start, and every InFlightUpdate method,
//     one at a time. None of it is safe to call from two threads at once.
//   - Start launches one worker thread per update; it lives until Join (or
//     the handle's destruction) joins it. The worker picks slots, waits on
//     the host for their gradient copies, and drives the CPU optimizer.
//   - The CPU optimizer's pool threads (CpuOptimizer::StepRanges) ask the
//     worker's chunk source for the next chunk and report finished chunks;
//     a finished chunk's upload is queued from whichever pool thread
//     finished it (in chunk order, under the optimizer's stream lock).
//   - The engine thread and the worker meet under one mutex: the hand-over
//     queue, per-slot progress ("written from"), the failure flag and the
//     timing totals. WaitForWeights blocks the engine thread on a condition
//     variable until a chunk is written; Join blocks it until the worker
//     ends. times() and last_order() may be read from the engine thread at
//     any time (under the mutex).
//   - Device-updated slots: Start launches a second thread, the device
//     worker, when there are any. It takes them as they are handed over,
//     queues each chunk's copies and kernel on the update's own "state up"
//     stream (copies up, then the kernel after the gradients' event) and the
//     copies down on a "state down" stream, and waits on the host only for
//     a buffer's previous chunk to be down. It ends after every chunk's
//     state is back in host memory.
//   - Speculation: the optimizer's threads back up and sum tiles
//     (BackUp, the running sum under the mutex); the worker's chunk source
//     waits on the condition variable for Commit or Rollback once stopped;
//     Rollback, after joining the worker, restores and re-sends on a pool
//     of the optimizer's thread count made for the call.
//   - Streams: the gradients go down on a "to host" stream that first waits
//     for the caller's stream (HandOver's); uploads run on a "to device"
//     stream; WaitForWeights, Close and Join order the caller's stream after
//     them with events. On the CPU (no CUDA device) all copies are
//     immediate and every event is complete.
#ifndef ZE_OFFLOAD_HOST_UPDATE_H_
#define ZE_OFFLOAD_HOST_UPDATE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "offload/cpu_optimizer.h"
#include "offload/swapped_state.h"

namespace ze {
namespace offload {

// One bucket of the update. Every tensor is (elements) long, elements =
// gradients.numel(), and stays alive, unmoved, for the HostUpdate's life.
struct HostUpdateSlot {
  // Model dtype, on the device: the slot's gradients (read once per update,
  // after the work HandOver's stream has queued so far).
  Tensor gradients;
  // Model dtype, host memory (pinned for asynchronous copies): receives the
  // gradients, then, in place, the updated weights that go up.
  Tensor staging;
  // f32, host memory: the master weights, updated in place, at
  // `state_offset` in the CpuOptimizer's state. Undefined for a swapped
  // slot (first_swapped_chunk >= 0): its master is on NVMe.
  Tensor master;
  int64_t state_offset = 0;
  // Model dtype: the weights this update writes. With the weights on the
  // device, the uploads' destination (or `delayed`'s, see below). With
  // HostUpdateOptions::weights_on_host, written by the CPU directly, and
  // undefined where `master` is the weights themselves (f32 training).
  Tensor weights;
  // HostUpdateOptions::delayed_update only: a device buffer the uploads go
  // to instead of `weights`; Join copies it over `weights`.
  Tensor delayed;
  // Swapped slots: the SwappedState chunk that holds this slot's chunk 0
  // (its chunks follow in order); -1 otherwise.
  int first_swapped_chunk = -1;
  // Where the next forward reads this slot: 0 for the first read.
  int forward_position = 0;
  // Updated on the device (the header's CPU/GPU split): `staging` is then
  // unused. Needs a host master, f32 moments (the compressed formats stay
  // on the CPU), the weights on the device, no delayed
  // update and no ties-away rounding (the CUDA kernel rounds to even).
  bool update_on_device = false;
};

struct HostUpdateOptions {
  // The model's device: where gradients and (unless weights_on_host)
  // weights live; CUDA gets transfer streams and events.
  Device device = Device::Cpu();
  // Slots travel and are updated in chunks of at most this many elements
  // (>= 1). SwappedState's chunks must be the same.
  int64_t chunk_elements = int64_t{1} << 24;
  // The weights are in host memory (offload_param): nothing is uploaded.
  bool weights_on_host = false;
  // With weights_on_host: they live in swap files (offload_param nvme) and
  // each slot's `weights` is its `staging` buffer, from which the caller
  // writes them back. No early start then: the caller reads the next
  // forward's weights ahead along the whole step's plan.
  bool weights_swapped = false;
  // ZeRO-Offload's delayed parameter update: uploads go to each slot's
  // `delayed` buffer and replace the weights at Join; WaitForWeights never
  // waits (the weights in use are the previous ones).
  bool delayed_update = false;
  // Speculation's backup (see the header comment): how many elements'
  // master weights and optimizer state it holds (host memory of
  // BackupBytesPerElement() each, allocated by Create). 0: no speculation.
  int64_t speculation_elements = 0;
  // bf16 weights round ties away from zero (the 16+16 master's high half,
  // bf16.master_weights_16_plus_16), in the update and in a rollback's
  // re-sent weights alike.
  bool bf16_ties_away = false;
  // Device-updated slots' element update: `buffers` (master and state in a
  // device buffer, gradients and weights on the device) queued on `stream`,
  // the device current. zero::RunStepKernelOn bound to the device; required
  // iff a slot is update_on_device. Called on the device worker.
  std::function<absl::Status(const StepCoefficients& coefficients,
                             const StepBuffers& buffers, const Stream& stream)>
      device_step;
};

// A speculative start's limit (Start's `speculation`).
struct Speculation {
  // Speculation stops once this rank's running sum of squares of its
  // gradients, as they are stored (loss scale and all), exceeds this (or is
  // not finite): the step will clip (or be skipped) whatever the other
  // ranks hold. Infinity: never on the norm (no clipping; fp16 stops on a
  // non-finite sum only).
  double sum_of_squares_limit = std::numeric_limits<double>::infinity();
};

// What the last speculative update did (zeros for one that was not).
struct SpeculationReport {
  int64_t chunks = 0;    // chunks updated speculatively (backed up)
  int64_t elements = 0;  // their elements
  // Why speculation stopped before the decision, if it did.
  bool stopped_by_norm = false;
  bool stopped_by_budget = false;
  // The caller's decision: committed, or rolled back (Rollback).
  bool committed = false;
  bool rolled_back = false;
};

// Where the worker spent its time, summed over every update so far.
struct HostUpdateTimes {
  int64_t updates = 0;
  double worker_seconds = 0;  // from the worker's start to its end
  // In the CPU optimizer: host slots, the stream's span less its waits for
  // gradients; swapped slots, the sum of the chunks' steps.
  double optimizer_seconds = 0;
  double gradient_wait_seconds = 0;  // waiting for gradients to land
  // The engine thread blocked on the worker (Join's join and
  // WaitForWeights): the part of the update the GPU work did not hide.
  double engine_wait_seconds = 0;
  // The device worker (device-updated slots): from its start to its end,
  // and the part spent waiting for the speculation's decision.
  double device_seconds = 0;
  double device_decision_wait_seconds = 0;
  // Elements of every slot, by where they are updated (fixed at Create).
  int64_t cpu_elements = 0;
  int64_t device_elements = 0;
};

// The worker's choice of the next slot to update, from `ready` (slots handed
// over, oldest first; not empty). Pure. `handed_over_all`: no more will come
// this step. `begun_early`: they are handed over as backward finishes them.
// `landed(s)`: slot s's first chunk of gradients is on the host.
// `forward_position(s)`: 0 for the slot the next forward reads first.
//   - all handed over: the one the forward reads first;
//   - begun early, more to come: the newest that has landed, else the oldest
//     (its copy lands first);
//   - otherwise the oldest (handed over in the forward's order).
// Returns an index into `ready`.
size_t ChooseBucketToUpdate(const std::deque<int>& ready, bool handed_over_all,
                            bool begun_early,
                            const std::function<bool(int)>& landed,
                            const std::function<int(int)>& forward_position);

// What the CPU/GPU split's model needs, each side alone and while the other
// runs (zero::ChooseUpdateSplit). The CPU update and the link both move host
// memory: where the CPU update alone already fills the host's memory
// bandwidth, streaming state over the link slows it, so the split gains
// less than the two rates alone promise, or nothing.
struct UpdateRates {
  double cpu_seconds_per_element = 0;         // the CPU update alone
  double cpu_seconds_per_element_shared = 0;  // while the link streams
  double link_bytes_per_second = 0;           // each way, alone
  double link_bytes_per_second_shared = 0;    // while the CPU updates
};
// Measures them: the CPU update over `cpu_elements` of scratch
// (UpdateTimer: `optimizer`'s threads, its state untouched; it must be
// idle) and the link over `link_bytes` each way (page-locked host memory,
// both directions at once on two streams), each alone, then each while the
// other runs on a second thread; each rate the best of a few rounds. Blocks
// the caller for a few tenths of a second at 16 M elements and 64 MiB.
// Errors: those of UpdateTimer::Create (f32 moments only) and of
// allocating and copying (FailedPrecondition off CUDA).
absl::StatusOr<UpdateRates> MeasureUpdateRates(const Device& device,
                                               CpuOptimizer* optimizer,
                                               int64_t cpu_elements,
                                               int64_t link_bytes);

class InFlightUpdate;

// Proof that no update is in flight: the master weights, optimizer state
// and weights of every slot may be read and written. Only
// InFlightUpdate::Join makes one. Not copyable, so that a reader cannot keep
// one from an earlier step; take it by const reference.
class UpdateJoined {
 public:
  UpdateJoined(UpdateJoined&&) = default;
  UpdateJoined& operator=(UpdateJoined&&) = default;
  UpdateJoined(const UpdateJoined&) = delete;
  UpdateJoined& operator=(const UpdateJoined&) = delete;

 private:
  friend class InFlightUpdate;
  UpdateJoined() = default;
};

class HostUpdate {
 public:
  // Checks the slots (matching sizes and dtypes, host staging, a master or
  // a swapped chunk per slot, `delayed` iff delayed_update, weights on the
  // device unless weights_on_host) and creates the per-chunk events and,
  // on CUDA, the transfer streams. `optimizer` (required) and `swapped`
  // (required iff some slot is swapped) are borrowed and must outlive the
  // HostUpdate; the optimizer's state holds the host slots at their
  // state_offset. InvalidArgument naming the slot and field otherwise;
  // errors from creating streams and events.
  static absl::StatusOr<std::unique_ptr<HostUpdate>> Create(
      const HostUpdateOptions& options, std::vector<HostUpdateSlot> slots,
      CpuOptimizer* optimizer, SwappedState* swapped);
  HostUpdate(const HostUpdate&) = delete;
  HostUpdate& operator=(const HostUpdate&) = delete;
  // Every InFlightUpdate it started must be gone first.
  ~HostUpdate();

  int num_slots() const { return static_cast<int>(slots_.size()); }
  // Whether slots may be handed over during backward (Start's
  // begun_early): not with swapped slots (their reads are planned over the
  // whole step), a delayed update or swapped weights. Host weights
  // (offload_param cpu) may: a slot is handed over once its gradients are
  // final, after the step's last read of its weights, so the CPU writing
  // them in place races no reader; the next forward's reads wait for them
  // (WaitForWeights, once Close has ended the early phase).
  bool CanBeginEarly() const;

  // Starts one step's update on a new worker thread with `step_args`
  // (valid ones: ComputeStepCoefficients' checks are the caller's) and
  // returns its handle; nothing is handed over yet. `begun_early`: slots
  // come as backward finishes them (CanBeginEarly must hold), and until
  // Close WaitForWeights does not wait (backward's recompute reads the
  // weights from before the update). FailedPrecondition while an earlier
  // update's handle is still active, or for an early start that is not
  // possible. Engine thread.
  // `speculation` (needs begun_early and speculation_elements > 0): the
  // arguments are those of a step that clips nothing, to be confirmed by
  // InFlightUpdate::Commit or undone by Rollback (header comment).
  absl::StatusOr<InFlightUpdate> Start(
      const StepArgs& step_args, bool begun_early,
      std::optional<Speculation> speculation = std::nullopt);
  // Whether Start may speculate: an early start is possible and there is a
  // backup.
  bool CanSpeculate() const {
    return CanBeginEarly() && options_.speculation_elements > 0;
  }
  // Host bytes one element of speculation's backup takes: the f32 master
  // weights and each optimizer state array in its format (8-bit moments'
  // per-block steps rounded up to a byte an element).
  static int64_t BackupBytesPerElement(const OptimizerOptions& optimizer);
  SpeculationReport last_speculation() const;

  HostUpdateTimes times() const;
  // The slots in the order the worker took them in the last finished (or
  // current) update.
  std::vector<int> last_order() const;

 private:
  friend class InFlightUpdate;
  // A speculated range: `slot`'s elements [begin, begin + count), backed up
  // at element `at` of each of the backup's arrays.
  struct Backup {
    int slot = 0;
    int64_t begin = 0;
    int64_t count = 0;
    int64_t at = 0;
  };
  HostUpdate(const HostUpdateOptions& options,
             std::vector<HostUpdateSlot> slots, CpuOptimizer* optimizer,
             SwappedState* swapped);
  int64_t elements(int slot) const { return slots_[slot].gradients.numel(); }
  int64_t num_chunks(int slot) const;
  // The slot's elements [begin, begin + count) in chunk `chunk`.
  struct ChunkSpan {
    int64_t begin = 0;
    int64_t count = 0;
  };
  ChunkSpan chunk_span(int slot, int64_t chunk) const;

  // Engine thread: queues `slot`'s gradients to the host after `stream`'s
  // work so far and puts the slot in the worker's queue.
  absl::Status SendGradientsDown(int slot, const Stream& stream);
  // Worker thread: the whole update; the next slot to take (-1: none left).
  absl::Status Run(const StepArgs& step_args);
  int NextSlot();
  // One chunk, in three parts run in this order: waits (blocking this
  // thread) until its gradients are on the host; the CPU optimizer's range
  // for it; once the range is written, queues the upload and tells
  // WaitForWeights. ChunkUpdated runs on any of the optimizer's threads.
  absl::Status WaitForHostGradients(int slot, int64_t chunk);
  RangeToUpdate ChunkRange(int slot, int64_t chunk) const;
  absl::Status ChunkUpdated(int slot, int64_t chunk);
  // A swapped chunk, whole, with master and state in swap buffers.
  absl::Status UpdateSwappedChunk(int slot, int64_t chunk,
                                  const StepArgs& step_args, float* master,
                                  float* state0, float* state1);
  // Worker thread, before a chunk is given to the optimizer as `range`
  // (its gradients on the host): true to update it now. Speculating:
  // reserves its backup and sets range->before_update to fill it (BackUp),
  // or (stopped) waits for the decision, and returns false once rolled back.
  absl::StatusOr<bool> Speculate(int slot, int64_t chunk, RangeToUpdate* range);
  // The device worker's whole update (device-updated slots), and its next
  // slot (-1: none left, or rolled back).
  absl::Status RunOnDevice(const StepCoefficients& coefficients);
  int NextDeviceSlot();
  // Removes from `queue` (ready_ or device_ready_) the slot
  // ChooseBucketToUpdate picks with `landed`, records it in taken_ and
  // returns it. Under mutex_; `queue` not empty.
  int TakeChosen(std::deque<int>* queue,
                 const std::function<bool(int)>& landed);
  // Queues one chunk through device buffer `buffer`: state up, (the
  // decision,) the kernel, state down. false: rolled back, nothing queued
  // after the copies up.
  absl::StatusOr<bool> UpdateChunkOnDevice(
      int slot, int64_t chunk, int buffer,
      const StepCoefficients& coefficients);
  // Records the worker's first error and wakes the waiters.
  void Fail(const absl::Status& status);
  // Any optimizer thread, before a tile of a speculated chunk is updated:
  // copies `slot`'s elements [begin, begin + count) of every state array to
  // the backup at `at`, and adds their gradients' squares to the running
  // sum.
  void BackUp(int slot, int64_t begin, int64_t at, int64_t count);
  // The optimizer's state arrays (master first) of `slot`'s elements from
  // `begin` on: where a backup's arrays go back to.
  // The bytes of `count` state elements of slot `slot` from its element
  // `begin`: the master weights, then each of the optimizer's raw arrays
  // (CpuOptimizer::RawStateArrays: moments, and 8-bit steps whole blocks
  // at a time), with where each sits in backup_ for backup element `at`.
  struct StateSpan {
    char* data = nullptr;
    int64_t bytes = 0;
    int64_t backup_offset = 0;
  };
  std::vector<StateSpan> StateSpans(int slot, int64_t begin, int64_t count,
                                    int64_t at) const;
  // Create: the device-updated slots' streams, buffers, events and
  // page-locks (nothing without such slots).
  absl::Status PrepareDeviceSlots();
  // Engine thread, the worker joined: puts every backed-up chunk's arrays
  // back, on the optimizer's thread count. The weights are the caller's
  // (Rollback re-sends them).
  void RestoreBackups();
  // Backup elements a range of `count` takes: whole blocks for 8-bit
  // moments, so every backup starts on one.
  int64_t Reserved(int64_t count) const;
  // The backed-up chunks cut into pieces for a parallel loop.
  std::vector<Backup> BackupPieces() const;

  HostUpdateOptions options_;
  std::vector<HostUpdateSlot> slots_;
  CpuOptimizer* optimizer_;
  SwappedState* swapped_;
  // Device <-> host copies (CUDA only): gradients down, weights up, each on
  // its own stream so both directions overlap.
  std::optional<Stream> to_host_stream_;
  std::optional<Stream> to_device_stream_;
  // Device-updated slots: the state's streams, the two device buffers
  // (f32, (arrays x chunk_elements) each), per buffer "updated" (on state
  // up) and "back down" (on state down) events, per slot the event after
  // its gradients were final (HandOver's stream), and the page-locks of
  // their host state.
  std::optional<Stream> state_up_stream_;
  std::optional<Stream> state_down_stream_;
  std::vector<Tensor> device_buffers_;
  std::vector<Event> buffer_updated_;
  std::vector<Event> buffer_down_;
  std::vector<Event> gradients_final_;
  HostRegistration registration_;
  int num_device_slots_ = 0;
  // Per slot, per chunk: its gradients copied down and its weights up.
  std::vector<std::vector<Event>> gradients_on_host_;
  std::vector<std::vector<Event>> weights_uploaded_;
  bool active_ = false;  // an InFlightUpdate holds the worker (engine thread)

  // Shared by the engine thread, the worker and the optimizer's threads.
  mutable std::mutex mutex_;
  std::condition_variable progress_;
  // `written_from[s]`: slot s's elements from there to its end are written
  // (uploads queued).
  std::vector<int64_t> written_from_;
  std::deque<int> ready_;         // slots handed over, not yet taken
  std::deque<int> device_ready_;  // the same, device-updated slots
  std::vector<int> taken_;        // slots taken, in order, this update
  bool begun_early_ = false;      // handed over during backward
  bool closed_ = false;           // every slot of the step is handed over
  bool failed_ = false;
  absl::Status status_;
  HostUpdateTimes times_;  // totals over finished updates
  // Speculation, this update: the decision (kNone: not speculative), the
  // limit, the running sum, whether it stopped, the chunks backed up (in
  // order) and the report.
  enum class Decision { kNone, kPending, kCommitted, kRolledBack };
  Decision decision_ = Decision::kNone;
  Speculation speculation_;
  double running_sum_of_squares_ = 0;
  bool speculation_stopped_ = false;
  std::vector<Backup> backups_;
  int64_t backup_used_ = 0;  // elements
  SpeculationReport speculation_report_;
  // f32, (arrays x speculation_elements), from the host allocator.
  Tensor backup_;
  // Where each array of StateSpans' order starts in backup_ (bytes).
  std::vector<int64_t> backup_regions_;
};

// One step's update in flight, from HostUpdate::Start to Join. Move-only; a
// default-constructed handle holds nothing (Join returns the proof at once).
// Engine thread only (see HostUpdate's Threading).
class InFlightUpdate {
 public:
  InFlightUpdate() = default;
  InFlightUpdate(InFlightUpdate&& other) noexcept;
  InFlightUpdate& operator=(InFlightUpdate&& other) noexcept;
  InFlightUpdate(const InFlightUpdate&) = delete;
  InFlightUpdate& operator=(const InFlightUpdate&) = delete;
  // (Device-updated slots only.) Makes `stream`'s later work wait until the
  // device kernels of every slot handed over so far have read their
  // gradients: before the gradients are zeroed or overwritten outside a
  // forward (a forward waits for the weights, hence the kernels, anyway).
  // Blocks the engine thread until the device worker has queued them.
  // Immediate when nothing is active or no device slot was handed over; OK
  // at once when the worker failed (Join reports it).
  absl::Status WaitForGradientsRead(const Stream& stream);

  // An update never joined (a failed backward, an error before Join) is
  // closed and waited for here; its status is dropped. A speculative one
  // not committed is rolled back (master and state; the weights on the
  // device are then not re-sent: only error paths drop a handle).
  ~InFlightUpdate();

  // Whether a worker runs for this handle (until Join).
  bool active() const { return owner_ != nullptr; }
  // Begun early and not yet closed: slots may still be handed over.
  bool open() const { return active() && open_; }

  // Sends `slot`'s gradients down after `stream`'s work so far and lets the
  // worker take it. Does nothing when the slot was handed over already this
  // update or nothing is active. Errors from the copies and events.
  absl::Status HandOver(int slot, const Stream& stream);
  // Hands over every slot not handed over yet, in the forward's reading
  // order, tells the worker none will follow, and makes `stream`'s later
  // work (which may overwrite the gradients) wait for the copies down.
  absl::Status Close(const Stream& stream);
  // Makes `stream`'s later work see the slot's updated weights from
  // element `own_begin` on (the worker writes a slot from its end down, so
  // that is the chunk of `own_begin`): waits on the host until the worker
  // has written the chunk, then orders `stream` after its upload.
  // Immediate when nothing is active, the update is delayed, or it is open
  // (begun early). When the worker failed before the chunk, returns OK at
  // once (the weights are then partly updated): the failure is Join's to
  // report. Errors only from the stream wait.
  absl::Status WaitForWeights(int slot, int64_t own_begin,
                              const Stream& stream);
  // Whether the worker has written every chunk of `slot`'s weights (true
  // when nothing is active). After WaitForWeights(slot, 0) returned, false
  // means the update failed before the slot was done (its staged weights
  // are partly gradients: zero::PartitionState does not write them back).
  bool SlotWritten(int slot) const;
  // Waits for the worker to end (after closing the hand-over, should Close
  // have failed halfway), orders `stream` after every upload, and,
  // for a delayed update, copies each slot's `delayed` buffer over its
  // weights on `stream`. Afterwards the handle is empty, whatever the
  // result. Returns the proof, or the worker's error (then the state is
  // partly updated); FailedPrecondition, with nothing done, while the
  // update is open (begun early, not closed: joining would wait forever).
  absl::StatusOr<UpdateJoined> Join(const Stream& stream);

  // Speculative updates (Start's `speculation`) only; engine thread.
  // Commit: the step's arguments are the speculative ones, bit for bit; the
  // update goes on as an early start (Close, Join as usual).
  // FailedPrecondition when the update is not speculative or already
  // decided.
  absl::Status Commit();
  // Rollback: stops the worker after the chunks it has begun, waits for
  // it, restores every speculated chunk's master weights and optimizer
  // state and, with `resend_weights`, writes their 16-bit weights from the
  // restored master into staging and uploads them again (`stream`'s later
  // work waits for those uploads); the optimizer's step count is unchanged.
  // Afterwards the handle is empty and the state is as before Start (the
  // weights too only with resend_weights: without, the caller's next
  // update must write every slot, as the exact update that redoes the step
  // does, saving an upload of the speculated weights); the caller starts
  // the exact update or skips the step. The worker's error, if it failed
  // (the backups are restored all the same); FailedPrecondition, with
  // nothing done, when the update is not speculative or already decided.
  absl::StatusOr<UpdateJoined> Rollback(const Stream& stream,
                                        bool resend_weights = true);
  // A speculative update not yet committed or rolled back.
  bool speculating() const;

 private:
  friend class HostUpdate;
  // Closes the queue and joins the worker, without streams.
  void Abandon();
  // Join and Rollback: closes the queue (with roll_back, decided rolled
  // back first), joins both workers, detaches from the update (owner_
  // null) and returns the workers' status, the wait counted as the
  // engine's. Engine thread; owner_ set.
  absl::Status CloseAndJoin(bool roll_back);

  HostUpdate* owner_ = nullptr;
  std::thread worker_;
  std::thread device_worker_;  // only with device-updated slots
  bool open_ = false;
  std::vector<bool> handed_over_;  // per slot, this update
};

}  // namespace offload
}  // namespace ze

#endif  // ZE_OFFLOAD_HOST_UPDATE_H_
