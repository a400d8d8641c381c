// ActivationOffload: where checkpointed modules keep their saved inputs
// when activation_checkpointing.cpu_checkpointing is on.
//
// A checkpointed module (nn/module.h) keeps only its input from the forward
// and recomputes the rest in backward. With an ActivationOffload installed
// (Module::set_activation_offload), that input does not stay on the device:
//
//   Forward, after the module's forward was queued on `stream`:
//     Save(input) copies it into a host buffer (pinned on CUDA) on the
//     offload's own copy stream, after an event on `stream`, and keeps the
//     device tensor only until the next Save: the newest input is the
//     first backward asks for (after the head and the loss, which run
//     between), so it need not come back at all; keeping it costs one
//     input during the next layer's forward, whose peak (nothing saved) is
//     below the backward's. Dropped, the device bytes go
//     back to the allocator once the copy is done (Tensor::RecordStream
//     orders their reuse after it), so the device holds one saved input at
//     most.
//   Backward, before the module's pre-backward hooks:
//     Restore(ticket) returns the input on the device, in a buffer of a
//     ring of `ring_slots` device buffers, and starts copying back the next
//     input backward will ask for (the most recent saved one still held:
//     the previous layer's, in a chain of layers) into another free slot.
//     So layer i-1's input travels while layer i recomputes and
//     backpropagates, and `stream` waits (on the device, not the host) only
//     for a copy that has not finished yet.
//
// Ring slots: a slot is free when nobody but the ring holds its storage
// (the module that restored from it has dropped its views, i.e. finished
// its backward). Before a copy overwrites a free slot the copy stream waits
// for an event recorded on the compute stream at that moment, which orders
// the copy after every kernel that read the slot. A restore that finds no
// free slot (nested checkpointed modules, or a caller holding a restored
// tensor) gets a fresh device buffer instead (stats().ring_misses): slower,
// never wrong. A slot is reallocated when an input of another shape or
// dtype needs it, so the ring's device memory is ring_slots inputs of the
// size last restored: 2 x (B, T, C) for a transformer.
//
// Inputs saved while a restored input is in use (a checkpointed module
// nested inside another one, saving during the outer one's recomputation)
// stay on the device: they are restored a few calls later, within the same
// outer backward, and a round trip through the host would only cost time.
//
// Ownership: the offload owns the host buffers (pooled by dtype and size
// and reused from step to step, so pinned memory is allocated once: the
// saved inputs of one forward) and the ring slots. A tensor Restore returns
// shares its slot's storage; the caller may keep it as long as it likes
// (its slot just is not reused meanwhile).
//
// Streams: copies run on a stream the offload creates (the CPU stream on
// the CPU, where every copy is a memcpy done when the call returns and every
// event is complete, so the same code runs in CI). Kernels that read a
// saved or restored input must run on the stream passed to Save/Restore.
//
// Saved-state slots (nn/module.h): several forwards' inputs may be held at
// once, each forward in a slot of its own, and backpropagated in any order
// between the slots (a pipeline's 1F1B runs F(m + w) before B(m)). The
// backward state above is per slot: a Save in a slot whose backward has
// begun (and that still holds inputs) is a recomputation's and stays on
// the device, while a forward's Save in another slot is offloaded as
// usual; the next input prefetched is the slot's own next one. Only the
// newest input overall stays on the device, so a backward of a slot other
// than the newest input's fetches its first input on demand (the copy is
// not prefetched: nothing says which slot's backward comes next).
//
// Thread: one thread drives it (the one running the model's forward and
// backward); not thread-safe. Not copyable.
#ifndef ZE_NN_ACTIVATION_OFFLOAD_H_
#define ZE_NN_ACTIVATION_OFFLOAD_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/stream.h"
#include "core/tensor.h"

namespace ze {
namespace nn {

struct ActivationOffloadOptions {
  // Device buffers restored inputs live in: the one the running module
  // reads plus the one the next input is prefetched into. At least 1; with
  // 1 nothing is prefetched.
  int ring_slots = 2;
};

struct ActivationOffloadStats {
  int64_t saved = 0;      // Save calls
  int64_t offloaded = 0;  // of them, copied to the host (the rest: nested)
  int64_t restored = 0;   // Restore calls
  // Restores whose copy back had already been started by an earlier
  // Restore (the prefetch worked).
  int64_t prefetched = 0;
  // Restores of the newest input, still on the device (see Save).
  int64_t kept_newest = 0;
  // Restores that found no free ring slot and used a fresh device buffer.
  int64_t ring_misses = 0;
  int ring_slots_allocated = 0;
  int64_t ring_bytes = 0;  // device bytes the ring holds now
  // Host bytes allocated (in use and pooled; the pool keeps them until the
  // offload goes): the saved inputs of the largest forward so far.
  int64_t host_bytes = 0;
  int64_t offloaded_bytes = 0;  // bytes copied to the host, ever
};

class ActivationOffload {
 public:
  // An offload for inputs on `device` (CUDA: a copy stream is created on it
  // and host buffers are pinned; CPU: plain host memory). InvalidArgument
  // for ring_slots < 1; the CUDA error when the stream cannot be created.
  static absl::StatusOr<std::shared_ptr<ActivationOffload>> Create(
      const Device& device, const ActivationOffloadOptions& options = {});
  // Waits for the copy stream (host buffers must outlive the copies).
  ~ActivationOffload();
  ActivationOffload(const ActivationOffload&) = delete;
  ActivationOffload& operator=(const ActivationOffload&) = delete;

  // Keeps `input` (on this offload's device) for backward, after the work
  // queued so far on `stream` (which produced it). Returns the ticket that
  // Restore or Discard takes. On failure (host memory exhausted, a CUDA
  // error) nothing is kept. InvalidArgument for an input on another device.
  absl::StatusOr<int64_t> Save(const Tensor& input, const Stream& stream);

  // The input saved under `ticket`, on the device, usable by work queued on
  // `stream` from now on; the ticket is spent. Starts the prefetch of the
  // next input (see the file comment). NotFound for a ticket not held.
  absl::StatusOr<Tensor> Restore(int64_t ticket, const Stream& stream);

  // Drops what `ticket` holds (a forward that will not be backpropagated).
  // No-op for a ticket not held.
  void Discard(int64_t ticket);

  // Whether `ticket`'s input is on its way back or back on the device (a
  // prefetch was issued, or it never left). False for a ticket not held.
  bool OnDevice(int64_t ticket) const;
  // Tickets held now.
  int held() const { return static_cast<int>(entries_.size()); }
  const Device& device() const { return device_; }
  const ActivationOffloadOptions& options() const { return options_; }
  const ActivationOffloadStats& stats() const { return stats_; }

 private:
  struct Entry {
    Tensor host;          // the host copy; undefined when the input stayed
    Tensor device;        // the input on the device: kept, or copied back
    bool newest = false;  // `device` is the input itself, kept until a Save
    Event ready;          // recorded on the copy stream after the copy back
    int64_t slot = 0;     // the saved-state slot it was saved in
  };

  ActivationOffload(const Device& device,
                    const ActivationOffloadOptions& options, Stream copy);
  // Starts copying `entry` back into a free ring slot (or, when `must` and
  // none is free, a fresh buffer). Leaves the entry on the host when !must
  // and no slot is free.
  absl::Status FetchToDevice(Entry& entry, const Stream& stream, bool must);
  // A free slot able to hold `like`'s shape and dtype (reallocated if
  // needed), or -1 when every slot is in use.
  absl::StatusOr<int> FreeSlot(const Tensor& like, const Stream& stream);
  absl::StatusOr<Tensor> TakeHostBuffer(const Tensor& like);
  void ReturnHostBuffer(Tensor host);

  Device device_;
  ActivationOffloadOptions options_;
  Stream copy_stream_;
  int64_t next_ticket_ = 1;
  // The held entry of `slot` with the largest ticket (its next LIFO
  // restore), or null.
  Entry* Newest(int64_t slot);

  // Held inputs by ticket: within a slot, the largest ticket is the next
  // LIFO restore.
  std::map<int64_t, Entry> entries_;
  // Slots from their first Restore until they hold nothing: a Save in one
  // of them comes from a recomputation and stays on the device.
  std::set<int64_t> backward_slots_;
  // The input kept on the device as the newest (see Save), if still held.
  int64_t newest_ticket_ = 0;
  std::vector<Tensor> slots_;
  // Free host buffers keyed by (dtype, element count).
  std::multimap<std::pair<int, int64_t>, Tensor> host_pool_;
  ActivationOffloadStats stats_;
};

}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_ACTIVATION_OFFLOAD_H_
