#include "nn/activation_offload.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/ops.h"
#include "core/status.h"
#include "nn/module.h"

namespace ze {
namespace nn {
namespace {

std::pair<int, int64_t> PoolKey(const Tensor& like) {
  return {static_cast<int>(like.dtype()), like.numel()};
}

bool SameLayout(const Tensor& slot, const Tensor& like) {
  return slot.dtype() == like.dtype() && slot.numel() == like.numel();
}

// Makes `copy` wait for the work queued on `compute` so far: a copy that
// reads what that work wrote, or overwrites what it reads, must not start
// before it.
absl::Status OrderAfter(const Stream& compute, const Stream& copy) {
  ZE_ASSIGN_OR_RETURN(Event event, Event::Create(compute.device()));
  ZE_RETURN_IF_ERROR(event.Record(compute));
  return event.StreamWait(copy);
}

}  // namespace

absl::StatusOr<std::shared_ptr<ActivationOffload>> ActivationOffload::Create(
    const Device& device, const ActivationOffloadOptions& options) {
  if (options.ring_slots < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ActivationOffload: ring_slots must be at least 1, got ",
                     options.ring_slots));
  }
  ZE_ASSIGN_OR_RETURN(Stream copy, Stream::Create(device));
  return std::shared_ptr<ActivationOffload>(
      new ActivationOffload(device, options, std::move(copy)));
}

ActivationOffload::ActivationOffload(const Device& device,
                                     const ActivationOffloadOptions& options,
                                     Stream copy)
    : device_(device), options_(options), copy_stream_(std::move(copy)) {}

ActivationOffload::~ActivationOffload() {
  // Pinned buffers must not be freed under a copy still reading or writing
  // them. A failure here has no caller to go to; the CUDA error stays
  // sticky for the next call that checks.
  copy_stream_.Synchronize().IgnoreError();
}

absl::StatusOr<Tensor> ActivationOffload::TakeHostBuffer(const Tensor& like) {
  auto it = host_pool_.find(PoolKey(like));
  if (it != host_pool_.end()) {
    Tensor host = std::move(it->second);
    host_pool_.erase(it);
    return host.View(like.shape());
  }
  Allocator* allocator = device_.is_cuda() ? PinnedHostMemory() : HostMemory();
  ZE_ASSIGN_OR_RETURN(Tensor host, Tensor::Empty(like.shape(), like.dtype(),
                                                 Device::Cpu(), allocator));
  stats_.host_bytes += static_cast<int64_t>(host.nbytes());
  return host;
}

void ActivationOffload::ReturnHostBuffer(Tensor host) {
  // Reuse is safe without an event: every copy into or out of a host
  // buffer runs on copy_stream_, in issue order.
  const auto key = PoolKey(host);
  host_pool_.emplace(key, std::move(host));
}

absl::StatusOr<int64_t> ActivationOffload::Save(const Tensor& input,
                                                const Stream& stream) {
  if (input.device() != device_) {
    return absl::InvalidArgumentError(
        absl::StrCat("ActivationOffload::Save: input ", input.DebugString(),
                     " is not on the offload's device ", device_.ToString()));
  }
  Entry entry;
  entry.slot = CurrentSavedStateSlot();
  if (backward_slots_.count(entry.slot) > 0) {
    // A recomputation's save: restored within the same outer backward.
    entry.device = input;
  } else {
    ZE_ASSIGN_OR_RETURN(entry.host, TakeHostBuffer(input));
    ZE_RETURN_IF_ERROR(OrderAfter(stream, copy_stream_));
    absl::Status copied = Copy(input, entry.host, copy_stream_);
    if (copied.ok()) copied = input.RecordStream(copy_stream_);
    if (!copied.ok()) {
      ReturnHostBuffer(std::move(entry.host));
      return copied;
    }
    ++stats_.offloaded;
    stats_.offloaded_bytes += static_cast<int64_t>(input.nbytes());
    // Only the newest input stays on the device (file comment).
    auto previous = entries_.find(newest_ticket_);
    if (previous != entries_.end() && previous->second.newest) {
      previous->second.device = Tensor();
      previous->second.newest = false;
    }
    entry.device = input;
    entry.newest = true;
  }
  ++stats_.saved;
  const int64_t ticket = next_ticket_++;
  if (entry.newest) newest_ticket_ = ticket;
  entries_.emplace(ticket, std::move(entry));
  return ticket;
}

absl::StatusOr<int> ActivationOffload::FreeSlot(const Tensor& like,
                                                const Stream& stream) {
  // A slot is free when only the ring refers to its storage: no entry was
  // prefetched into it and nobody holds a restored view of it.
  int free_other = -1;
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
    if (slots_[i].storage().use_count() != 1) continue;
    if (SameLayout(slots_[i], like)) return i;
    if (free_other < 0) free_other = i;
  }
  int slot = free_other;
  if (slot < 0) {
    if (static_cast<int>(slots_.size()) >= options_.ring_slots) return -1;
    slots_.emplace_back();
    slot = static_cast<int>(slots_.size()) - 1;
  }
  // Owned by the compute stream, written by the copy stream: the allocator
  // then orders the reuse of a replaced slot's bytes after both.
  Tensor fresh;
  {
    StreamGuard guard(stream);
    ZE_ASSIGN_OR_RETURN(fresh,
                        Tensor::Empty(like.shape(), like.dtype(), device_));
  }
  ZE_RETURN_IF_ERROR(fresh.RecordStream(copy_stream_));
  slots_[slot] = std::move(fresh);
  stats_.ring_slots_allocated = static_cast<int>(slots_.size());
  stats_.ring_bytes = 0;
  for (const Tensor& held : slots_) {
    if (held.defined())
      stats_.ring_bytes += static_cast<int64_t>(held.nbytes());
  }
  return slot;
}

absl::Status ActivationOffload::FetchToDevice(Entry& entry,
                                              const Stream& stream, bool must) {
  ZE_ASSIGN_OR_RETURN(int slot, FreeSlot(entry.host, stream));
  Tensor target;
  if (slot >= 0) {
    target = slots_[slot].View(entry.host.shape());
  } else if (!must) {
    return absl::OkStatus();  // fetched on demand by its Restore instead
  } else {
    ++stats_.ring_misses;
    StreamGuard guard(stream);
    ZE_ASSIGN_OR_RETURN(
        target, Tensor::Empty(entry.host.shape(), entry.host.dtype(), device_));
    ZE_RETURN_IF_ERROR(target.RecordStream(copy_stream_));
  }
  // The target's bytes may still be read (a slot's previous restore) or
  // have been freed (a fresh block) by work queued on `stream`.
  ZE_RETURN_IF_ERROR(OrderAfter(stream, copy_stream_));
  ZE_RETURN_IF_ERROR(Copy(entry.host, target, copy_stream_));
  ZE_ASSIGN_OR_RETURN(entry.ready, Event::Create(device_));
  ZE_RETURN_IF_ERROR(entry.ready.Record(copy_stream_));
  entry.device = std::move(target);
  return absl::OkStatus();
}

absl::StatusOr<Tensor> ActivationOffload::Restore(int64_t ticket,
                                                  const Stream& stream) {
  auto it = entries_.find(ticket);
  if (it == entries_.end()) {
    return absl::NotFoundError(
        absl::StrCat("ActivationOffload::Restore: no saved input under ticket ",
                     ticket, " (restored or discarded already?)"));
  }
  Entry entry = std::move(it->second);
  entries_.erase(it);
  backward_slots_.insert(entry.slot);
  ++stats_.restored;
  const bool offloaded = entry.host.defined();
  if (entry.newest) {
    ++stats_.kept_newest;
  } else if (offloaded && entry.device.defined()) {
    ++stats_.prefetched;
  }
  absl::Status status = absl::OkStatus();
  if (offloaded && !entry.device.defined()) {
    status = FetchToDevice(entry, stream, /*must=*/true);
  }
  // (A kept newest input has no copy back: `ready` is a CPU event, a no-op.)
  if (status.ok() && offloaded) status = entry.ready.StreamWait(stream);
  // The copy back is queued on copy_stream_, so the host buffer may go
  // back to the pool at once (see ReturnHostBuffer).
  if (offloaded) ReturnHostBuffer(std::move(entry.host));
  // The next restore in LIFO order within the slot: the previous layer's
  // input of the same forward.
  Entry* next = Newest(entry.slot);
  if (status.ok() && next != nullptr && !next->device.defined()) {
    status = FetchToDevice(*next, stream, /*must=*/false);
  }
  if (next == nullptr) backward_slots_.erase(entry.slot);
  if (!status.ok()) return status;
  return std::move(entry.device);
}

void ActivationOffload::Discard(int64_t ticket) {
  auto it = entries_.find(ticket);
  if (it == entries_.end()) return;
  if (it->second.host.defined()) ReturnHostBuffer(std::move(it->second.host));
  const int64_t slot = it->second.slot;
  entries_.erase(it);
  if (Newest(slot) == nullptr) backward_slots_.erase(slot);
}

ActivationOffload::Entry* ActivationOffload::Newest(int64_t slot) {
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    if (it->second.slot == slot) return &it->second;
  }
  return nullptr;
}

bool ActivationOffload::OnDevice(int64_t ticket) const {
  auto it = entries_.find(ticket);
  return it != entries_.end() && it->second.device.defined();
}

}  // namespace nn
}  // namespace ze
