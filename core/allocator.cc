#include "core/allocator.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ze {
namespace {

constexpr size_t kAlignment = 256;

std::string Bytes(int64_t bytes) {
  return absl::StrCat(bytes, " bytes");
}

}  // namespace

Allocator::Allocator(std::string name, Device device)
    : name_(std::move(name)), device_(device) {}

size_t Allocator::RoundSize(size_t bytes) const {
  if (bytes == 0) bytes = 1;
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

absl::StatusOr<void*> Allocator::Allocate(size_t bytes) {
  const size_t rounded = RoundSize(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  if (stats_.byte_cap > 0 &&
      stats_.bytes_in_use + static_cast<int64_t>(rounded) > stats_.byte_cap) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "allocator '", name_, "' on ", device_.ToString(), ": request of ",
        Bytes(bytes), " (", rounded, " rounded) exceeds the cap of ",
        Bytes(stats_.byte_cap), " with ", Bytes(stats_.bytes_in_use),
        " already in use"));
  }
  absl::StatusOr<void*> block = RawAllocate(rounded);
  if (!block.ok()) {
    return absl::Status(
        block.status().code(),
        absl::StrCat("allocator '", name_, "' on ", device_.ToString(),
                     ": request of ", Bytes(bytes), " with ",
                     Bytes(stats_.bytes_in_use), " in use: ",
                     block.status().message()));
  }
  stats_.bytes_in_use += rounded;
  if (stats_.bytes_in_use > stats_.peak_bytes_in_use) {
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }
  ++stats_.num_allocations;
  ++stats_.live_allocations;
  return *block;
}

void Allocator::Deallocate(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  const size_t rounded = RoundSize(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  RawDeallocate(ptr, rounded);
  stats_.bytes_in_use -= rounded;
  --stats_.live_allocations;
}

void Allocator::SetByteCap(int64_t cap) {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.byte_cap = cap < 0 ? 0 : cap;
}

void Allocator::ResetPeak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_bytes_in_use = stats_.bytes_in_use;
}

AllocatorStats Allocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

HostAllocator::HostAllocator(std::string name)
    : Allocator(std::move(name), Device::Cpu()) {}

absl::StatusOr<void*> HostAllocator::RawAllocate(size_t bytes) {
  void* ptr = std::aligned_alloc(kAlignment, bytes);
  if (ptr == nullptr) {
    return absl::ResourceExhaustedError("host memory exhausted (aligned_alloc)");
  }
  AddReserved(static_cast<int64_t>(bytes));
  return ptr;
}

void HostAllocator::RawDeallocate(void* ptr, size_t bytes) {
  std::free(ptr);
  AddReserved(-static_cast<int64_t>(bytes));
}

PinnedHostAllocator::PinnedHostAllocator(std::string name)
    : Allocator(std::move(name), Device::Cpu()) {}

absl::StatusOr<void*> PinnedHostAllocator::RawAllocate(size_t bytes) {
  if (CudaDeviceCount() == 0) {
    return absl::FailedPreconditionError(
        "pinned host memory needs a CUDA device and none is visible");
  }
  void* ptr = nullptr;
  absl::Status status = CudaStatus(cudaMallocHost(&ptr, bytes),
                                   absl::StrCat("cudaMallocHost(", bytes, ")"));
  if (!status.ok()) return status;
  AddReserved(static_cast<int64_t>(bytes));
  return ptr;
}

void PinnedHostAllocator::RawDeallocate(void* ptr, size_t bytes) {
  cudaFreeHost(ptr);
  AddReserved(-static_cast<int64_t>(bytes));
}

CudaCachingAllocator::CudaCachingAllocator(std::string name, int device_index)
    : Allocator(std::move(name), Device::Cuda(device_index)) {}

CudaCachingAllocator::~CudaCachingAllocator() {
  // Process-wide instances outlive the CUDA context at exit; freeing then
  // would fail harmlessly, so the cache is simply dropped.
}

size_t CudaCachingAllocator::RoundSize(size_t bytes) const {
  constexpr size_t kSmall = 512;
  constexpr size_t kLarge = 2 << 20;
  if (bytes == 0) bytes = 1;
  if (bytes <= (1 << 20)) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

absl::StatusOr<void*> CudaCachingAllocator::RawAllocate(size_t bytes) {
  auto cached = free_blocks_.find(bytes);
  if (cached != free_blocks_.end()) {
    void* ptr = cached->second;
    free_blocks_.erase(cached);
    return ptr;
  }
  if (device().index >= CudaDeviceCount()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA device ", device().index, " (", CudaDeviceCount(),
        " visible)"));
  }
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device().index);
  void* ptr = nullptr;
  cudaError_t error = cudaMalloc(&ptr, bytes);
  if (error == cudaErrorMemoryAllocation && !free_blocks_.empty()) {
    cudaGetLastError();
    ReleaseCacheLocked();
    error = cudaMalloc(&ptr, bytes);
  }
  cudaSetDevice(previous);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(error, absl::StrCat("cudaMalloc(", bytes, ")"));
  }
  AddReserved(static_cast<int64_t>(bytes));
  return ptr;
}

void CudaCachingAllocator::RawDeallocate(void* ptr, size_t bytes) {
  free_blocks_.emplace(bytes, ptr);
}

void CudaCachingAllocator::ReleaseCache() {
  std::lock_guard<std::mutex> lock(mutex_);
  ReleaseCacheLocked();
}

void CudaCachingAllocator::ReleaseCacheLocked() {
  if (free_blocks_.empty()) return;
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device().index);
  cudaDeviceSynchronize();
  for (auto& [size, ptr] : free_blocks_) {
    cudaFree(ptr);
    AddReserved(-static_cast<int64_t>(size));
  }
  free_blocks_.clear();
  cudaSetDevice(previous);
}

Allocator* HostMemory() {
  static HostAllocator* allocator = new HostAllocator("host");
  return allocator;
}

Allocator* PinnedHostMemory() {
  static PinnedHostAllocator* allocator = new PinnedHostAllocator("pinned_host");
  return allocator;
}

Allocator* CudaMemory(int device_index) {
  static std::mutex mutex;
  static std::vector<std::unique_ptr<CudaCachingAllocator>>* allocators =
      new std::vector<std::unique_ptr<CudaCachingAllocator>>();
  std::lock_guard<std::mutex> lock(mutex);
  if (device_index < 0) device_index = 0;
  while (static_cast<int>(allocators->size()) <= device_index) {
    const int index = static_cast<int>(allocators->size());
    allocators->push_back(std::make_unique<CudaCachingAllocator>(
        absl::StrCat("cuda:", index), index));
  }
  return (*allocators)[device_index].get();
}

Allocator* GetAllocator(const Device& device) {
  if (device.is_cpu()) return HostMemory();
  return CudaMemory(device.index);
}

}  // namespace ze
