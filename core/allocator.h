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
// Allocators are thread-safe. They are not copyable; the process-wide ones
// returned by the accessors below live until exit.
#ifndef ZE_CORE_ALLOCATOR_H_
#define ZE_CORE_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "core/device.h"

namespace ze {

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

  // Returns a block from Allocate. `ptr` may be null (no-op).
  void Deallocate(void* ptr, size_t bytes);

  // A cap of 0 removes it. Lowering the cap below the bytes in use does not
  // free anything; later allocations fail until usage drops.
  void SetByteCap(int64_t cap);
  void ResetPeak();
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
  std::string name_;
  Device device_;
  AllocatorStats stats_;
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

// Device memory with a cache of freed blocks. Requests are rounded to 512
// bytes (small) or 2 MiB (over 1 MiB); a free block of the same rounded size
// is reused. When cudaMalloc fails, the cache is released and the request
// retried once. Freed blocks may be reused by the next Allocate at once, so a
// caller that frees memory still in use by queued kernels must synchronise
// (or record an event) first: the engine frees only stream-ordered after use.
class CudaCachingAllocator : public Allocator {
 public:
  CudaCachingAllocator(std::string name, int device_index);
  ~CudaCachingAllocator() override;
  void ReleaseCache() override;

 protected:
  size_t RoundSize(size_t bytes) const override;
  absl::StatusOr<void*> RawAllocate(size_t bytes) override;
  void RawDeallocate(void* ptr, size_t bytes) override;

 private:
  void ReleaseCacheLocked();
  std::multimap<size_t, void*> free_blocks_;  // rounded size -> block
};

// Process-wide allocators. GetAllocator picks host memory for the CPU and
// the caching allocator of the matching device for CUDA.
Allocator* HostMemory();
Allocator* PinnedHostMemory();
Allocator* CudaMemory(int device_index);
Allocator* GetAllocator(const Device& device);

}  // namespace ze

#endif  // ZE_CORE_ALLOCATOR_H_
