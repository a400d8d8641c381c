// Memory allocators with statistics and an optional byte cap.
//
// Three kinds: plain host memory, pinned (page-locked) host memory for fast
// and asynchronous host<->device copies, and a caching CUDA allocator that
// keeps freed blocks for reuse (cudaMalloc/cudaFree synchronise the device).
//
// Every allocator counts the bytes its callers hold (rounded block sizes),
// their peak, and how many allocations were made. A byte cap, when set, makes
// any allocation that would push the bytes in use past it fail with
// ResourceExhausted naming the request and the cap: that is how a test
// emulates a small GPU (or host) and shows that partitioning lets a model fit.
//
// Device blocks are stream-ordered (see CudaCachingAllocator): a block
// belongs to the stream that was current (core/stream.h, StreamGuard) when
// it was allocated, and other streams that use it are declared with
// RecordStream. Host allocators ignore streams.
//
// Peak attribution (for benchmarks, off by default): where the bytes in use
// at the peak came from, by the AllocationScope each block was allocated
// under (nn::Module labels its forward, recompute and backward with its
// type name), so a memory target can be chased to the buffers that set it.
//
// Allocators are thread-safe. They are not copyable; the process-wide ones
// returned by the accessors below live until exit.
#ifndef ZE_CORE_ALLOCATOR_H_
#define ZE_CORE_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/stream.h"

namespace ze {

// Names the blocks this thread allocates while it lives (the innermost
// scope wins), for Allocator::EnablePeakAttribution. `what` and `phase`
// must outlive the scope (a module's type name and a string literal); the
// label is "what phase". Costs two thread-local stores; the allocator
// reads the label only when attribution is on.
class AllocationScope {
 public:
  AllocationScope(const std::string* what, const char* phase);
  ~AllocationScope();
  AllocationScope(const AllocationScope&) = delete;
  AllocationScope& operator=(const AllocationScope&) = delete;

  // This thread's innermost label; empty outside every scope.
  static std::string CurrentLabel();
  // The innermost scope's phase; "" outside every scope.
  static const char* CurrentPhase();

 private:
  const std::string* previous_what_;
  const char* previous_phase_;
};

struct AllocatorStats {
  int64_t bytes_in_use = 0;       // held by callers now
  int64_t peak_bytes_in_use = 0;  // most ever held at once (since ResetPeak)
  int64_t num_allocations = 0;    // Allocate calls that succeeded, ever
  int64_t live_allocations = 0;   // blocks held by callers now
  int64_t bytes_reserved = 0;     // held from the system (>= in use if caching)
  int64_t byte_cap = 0;           // 0: no cap
};

class Allocator {
 public:
  Allocator(std::string name, Device device);
  virtual ~Allocator() = default;
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Returns a block of at least `bytes` bytes aligned to 256 bytes (a
  // zero-byte request returns a valid unique pointer). The caller owns it
  // until it passes it, with the same `bytes`, to Deallocate.
  // Fails with ResourceExhausted when the cap would be exceeded or the
  // system has no memory left; the message names the allocator, the request,
  // the bytes in use and the cap.
  absl::StatusOr<void*> Allocate(size_t bytes);

  // Returns a block from Allocate. `ptr` may be null (no-op). Work already
  // queued that uses the block may still be running: a stream-aware
  // allocator hands the block out again only once that is safe.
  void Deallocate(void* ptr, size_t bytes);

  // Declares that work queued on `stream` uses the block `ptr` (returned by
  // Allocate and not yet deallocated), so that freeing it does not let
  // another user write it before that work is done. Call it for every
  // stream other than the allocating one that reads or writes the block,
  // any time before Deallocate. No-op for host allocators and CPU streams.
  // Fails with InvalidArgument (naming the allocator and the pointer) when
  // `ptr` is not a live block of this allocator.
  virtual absl::Status RecordStream(void* ptr, const Stream& stream);

  // A cap of 0 removes it. Lowering the cap below the bytes in use does not
  // free anything; later allocations fail until usage drops.
  void SetByteCap(int64_t cap);
  // Also restarts peak attribution's snapshot at the current usage.
  void ResetPeak();

  // Peak attribution. From this call on, each block is recorded with its
  // label (AllocationScope::CurrentLabel; "(no scope)" outside any) and,
  // each time the bytes in use pass their highest since the call (or
  // ResetPeak), the live bytes per label are copied: blocks live before
  // the call count as "(before attribution)". Every Allocate and
  // Deallocate then also updates a table under the allocator's mutex.
  void EnablePeakAttribution();
  // The copy at the peak, largest first; its bytes add up to the peak's
  // bytes in use. Empty when attribution is off.
  std::vector<std::pair<std::string, int64_t>> PeakAttribution() const;
  AllocatorStats stats() const;
  const std::string& name() const { return name_; }
  Device device() const { return device_; }

  // Releases cached blocks back to the system (no-op unless caching).
  virtual void ReleaseCache() {}

 protected:
  // Rounds a request up to the size actually handed out.
  virtual size_t RoundSize(size_t bytes) const;
  // Obtains / returns `bytes` (already rounded) from the underlying source.
  virtual absl::StatusOr<void*> RawAllocate(size_t bytes) = 0;
  virtual void RawDeallocate(void* ptr, size_t bytes) = 0;

  // Called with mutex_ held, after a block is reserved or released.
  void AddReserved(int64_t delta) { stats_.bytes_reserved += delta; }

  mutable std::mutex mutex_;

 private:
  // Peak attribution's state, under mutex_ (see EnablePeakAttribution).
  struct Attribution {
    std::map<std::string, int> label_ids;
    std::vector<std::string> labels;
    std::vector<int64_t> live;     // bytes per label id now
    std::vector<int64_t> at_peak;  // bytes per label id at the peak
    int64_t peak = 0;              // bytes in use when at_peak was copied
    std::unordered_map<void*, int> blocks;  // live block -> its label id
    int IdOf(const std::string& label);
  };
  void RecordAllocation(void* block, int64_t rounded);
  void RecordDeallocation(void* block, int64_t rounded);

  std::string name_;
  Device device_;
  AllocatorStats stats_;
  std::unique_ptr<Attribution> attribution_;  // null: off
};

// malloc-backed host memory.
class HostAllocator : public Allocator {
 public:
  explicit HostAllocator(std::string name = "host");

 protected:
  absl::StatusOr<void*> RawAllocate(size_t bytes) override;
  void RawDeallocate(void* ptr, size_t bytes) override;
};

// Page-locked host memory (cudaMallocHost). Fails with FailedPrecondition on
// a machine with no CUDA device.
class PinnedHostAllocator : public Allocator {
 public:
  explicit PinnedHostAllocator(std::string name = "pinned_host");

 protected:
  absl::StatusOr<void*> RawAllocate(size_t bytes) override;
  void RawDeallocate(void* ptr, size_t bytes) override;
};

// Page-locks host memory allocated elsewhere (cudaHostRegister) for as long
// as the object lives, so that device copies to and from it run
// asynchronously at the link's full speed, as from PinnedHostMemory: for
// large host arrays whose owner allocates them (the CPU optimizer's state)
// and of which only a part travels. Move-only; the destructor unregisters.
//
// The runtime locks whole pages, and small host arrays share pages with
// their neighbours (HostMemory is aligned_alloc): Create merges spans that
// overlap or share a page into one range (from the first's start to the
// last's end, exact, never rounded out to pages: a neighbour's buffer that
// began inside a registered range and ran past its end could not be copied
// with cudaMemcpyDefault), so that one registration covers them. A range
// overlapping bytes registered elsewhere in the process (the runtime's
// cudaErrorHostMemoryAlreadyRegistered) is left as it is: locking only speeds
// copies up, and copies from pageable memory are as correct, only synchronous.
// On a machine with no CUDA device nothing is registered and Create succeeds.
class HostRegistration {
 public:
  struct Span {
    void* data = nullptr;
    size_t bytes = 0;
  };

  HostRegistration() = default;
  // Errors: the runtime's (the host cannot lock that much), naming the
  // range's size; nothing stays registered then.
  static absl::StatusOr<HostRegistration> Create(std::vector<Span> spans);
  HostRegistration(HostRegistration&& other) noexcept;
  HostRegistration& operator=(HostRegistration&& other) noexcept;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  ~HostRegistration();

  // Bytes this object locked (whole pages; 0 without a CUDA device).
  size_t locked_bytes() const;
  // Bytes every live HostRegistration of the process holds locked: the
  // page-locked host memory beside PinnedHostMemory's (benchmarks report
  // both against the plan's pinned bytes). Thread-safe.
  static int64_t ProcessLockedBytes();

 private:
  void Release();
  std::vector<Span> ranges_;  // page-aligned, registered by this object
};

// Device memory with a cache of freed blocks, stream-ordered the way
// PyTorch's c10 CUDACachingAllocator is. Requests are rounded to 512 bytes
// (small) or 2 MiB (over 1 MiB); only a block of the same rounded size is
// reused.
//
// Streams: a block belongs to its owner, the stream current on the
// allocating thread (CurrentStream(device()), set with StreamGuard). Freeing
// a block that no other stream was recorded on returns it to its owner's
// cache at once: the owner's later work runs after the work already queued
// on it, so the next allocation on the owner stream may reuse it with no
// event and no wait (the hot path). A block that other streams were
// recorded on (RecordStream) is freed with an event recorded on each of
// them, and is cached again only when the next allocation of its size finds
// every event complete (events are queried only then, never waited on).
// Another stream gets a cached block only (a) once the block's owner stream
// is destroyed and the work queued on it has finished, or (b) when
// cudaMalloc fails: then the other stream is made to wait (on the device,
// not the host) for an event recorded on the owner. If cudaMalloc still
// fails, the device is synchronised, the whole cache released and the
// request retried once.
//
// So the caller's contract is: allocate under a StreamGuard of the stream
// that uses the memory, and RecordStream every other stream that does; then
// memory may be freed without waiting for queued work.
class CudaCachingAllocator : public Allocator {
 public:
  CudaCachingAllocator(std::string name, int device_index);
  ~CudaCachingAllocator() override;
  void ReleaseCache() override;
  absl::Status RecordStream(void* ptr, const Stream& stream) override;

  // Called (through AddStreamReleaseCallback) before `native_stream` is
  // destroyed: the blocks it owns or was recorded on get an event on it, so
  // that no later free records on, or orders by, a dead stream.
  void OnStreamReleased(void* native_stream);

 protected:
  size_t RoundSize(size_t bytes) const override;
  absl::StatusOr<void*> RawAllocate(size_t bytes) override;
  void RawDeallocate(void* ptr, size_t bytes) override;

 private:
  // A block handed out and not yet freed.
  struct LiveBlock {
    size_t size = 0;
    void* owner = nullptr;  // cudaStream_t; meaningless when orphaned
    bool orphaned = false;  // the owner stream was destroyed
    std::vector<void*> recorded_streams;  // other users, no duplicates
    std::vector<void*> events;  // cudaEvent_t, from streams already gone
  };
  // A freed block waiting for events on streams that used it.
  struct PendingBlock {
    void* ptr = nullptr;
    void* owner = nullptr;
    bool orphaned = false;
    std::vector<void*> events;
  };
  using StreamAndSize = std::pair<void*, size_t>;

  // Takes a cached block of `size` for `stream`, or returns null.
  void* TakeCachedLocked(void* stream, size_t size);
  // Caches pending blocks of `size` whose events have all completed.
  void CollectPendingLocked(size_t size);
  // Hands `stream` a block cached for another stream, after making
  // `stream` wait for the owner's queued work; null when none is cached.
  void* TakeFromOtherStreamLocked(void* stream, size_t size);
  // An event recorded on `stream` now (from the pool), or null on failure.
  void* RecordEventLocked(void* stream);
  void ReleaseCacheLocked();

  // Blocks no work references: any stream may take them at once.
  std::multimap<size_t, void*> idle_blocks_;
  // Blocks freed by, and reusable at once on, their owner stream.
  std::multimap<StreamAndSize, void*> stream_blocks_;
  std::multimap<size_t, PendingBlock> pending_blocks_;  // by size
  std::unordered_map<void*, LiveBlock> live_blocks_;
  std::vector<void*> event_pool_;  // completed cudaEvent_t for reuse
};

// Process-wide allocators. GetAllocator picks host memory for the CPU and
// the caching allocator of the matching device for CUDA.
Allocator* HostMemory();
Allocator* PinnedHostMemory();
Allocator* CudaMemory(int device_index);
Allocator* GetAllocator(const Device& device);

}  // namespace ze

#endif  // ZE_CORE_ALLOCATOR_H_
