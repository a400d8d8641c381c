#include "core/allocator.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace ze {
namespace {

constexpr size_t kAlignment = 256;

std::string Bytes(int64_t bytes) { return absl::StrCat(bytes, " bytes"); }

// Makes `device_index` the calling thread's current CUDA device for the
// scope, then restores the previous one.
class DeviceScope {
 public:
  explicit DeviceScope(int device_index) {
    cudaGetDevice(&previous_);
    if (previous_ != device_index) cudaSetDevice(device_index);
    changed_ = previous_ != device_index;
  }
  ~DeviceScope() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

thread_local const std::string* scope_what = nullptr;
thread_local const char* scope_phase = nullptr;

}  // namespace

AllocationScope::AllocationScope(const std::string* what, const char* phase)
    : previous_what_(scope_what), previous_phase_(scope_phase) {
  scope_what = what;
  scope_phase = phase;
}

AllocationScope::~AllocationScope() {
  scope_what = previous_what_;
  scope_phase = previous_phase_;
}

std::string AllocationScope::CurrentLabel() {
  if (scope_what == nullptr) return "";
  return scope_phase == nullptr ? *scope_what
                                : absl::StrCat(*scope_what, " ", scope_phase);
}

const char* AllocationScope::CurrentPhase() {
  return scope_phase == nullptr ? "" : scope_phase;
}

int Allocator::Attribution::IdOf(const std::string& label) {
  auto [it, added] = label_ids.emplace(label, static_cast<int>(labels.size()));
  if (added) {
    labels.push_back(label);
    live.push_back(0);
    at_peak.push_back(0);
  }
  return it->second;
}

void Allocator::RecordAllocation(void* block, int64_t rounded) {
  Attribution& a = *attribution_;
  const std::string label = AllocationScope::CurrentLabel();
  const int id = a.IdOf(label.empty() ? "(no scope)" : label);
  a.blocks[block] = id;
  a.live[static_cast<size_t>(id)] += rounded;
  if (stats_.bytes_in_use > a.peak) {
    a.peak = stats_.bytes_in_use;
    a.at_peak = a.live;
  }
}

void Allocator::RecordDeallocation(void* block, int64_t rounded) {
  Attribution& a = *attribution_;
  auto it = a.blocks.find(block);
  int id;
  if (it == a.blocks.end()) {
    id = a.IdOf("(before attribution)");
  } else {
    id = it->second;
    a.blocks.erase(it);
  }
  a.live[static_cast<size_t>(id)] -= rounded;
}

void Allocator::EnablePeakAttribution() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (attribution_ != nullptr) return;
  attribution_ = std::make_unique<Attribution>();
  const int before = attribution_->IdOf("(before attribution)");
  attribution_->live[static_cast<size_t>(before)] = stats_.bytes_in_use;
  attribution_->at_peak = attribution_->live;
  attribution_->peak = stats_.bytes_in_use;
}

std::vector<std::pair<std::string, int64_t>> Allocator::PeakAttribution()
    const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<std::string, int64_t>> out;
  if (attribution_ == nullptr) return out;
  for (size_t i = 0; i < attribution_->labels.size(); ++i) {
    if (attribution_->at_peak[i] != 0) {
      out.emplace_back(attribution_->labels[i], attribution_->at_peak[i]);
    }
  }
  std::sort(out.begin(), out.end(),
            [](const auto& x, const auto& y) { return x.second > y.second; });
  return out;
}

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
    return absl::ResourceExhaustedError(
        absl::StrCat("allocator '", name_, "' on ", device_.ToString(),
                     ": request of ", Bytes(bytes), " (", rounded,
                     " rounded) exceeds the cap of ", Bytes(stats_.byte_cap),
                     " with ", Bytes(stats_.bytes_in_use), " already in use"));
  }
  absl::StatusOr<void*> block = RawAllocate(rounded);
  if (!block.ok()) {
    return absl::Status(
        block.status().code(),
        absl::StrCat("allocator '", name_, "' on ", device_.ToString(),
                     ": request of ", Bytes(bytes), " with ",
                     Bytes(stats_.bytes_in_use),
                     " in use: ", block.status().message()));
  }
  stats_.bytes_in_use += rounded;
  if (stats_.bytes_in_use > stats_.peak_bytes_in_use) {
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }
  ++stats_.num_allocations;
  ++stats_.live_allocations;
  if (attribution_ != nullptr) {
    RecordAllocation(*block, static_cast<int64_t>(rounded));
  }
  return *block;
}

void Allocator::Deallocate(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  const size_t rounded = RoundSize(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  RawDeallocate(ptr, rounded);
  stats_.bytes_in_use -= rounded;
  --stats_.live_allocations;
  if (attribution_ != nullptr) {
    RecordDeallocation(ptr, static_cast<int64_t>(rounded));
  }
}

absl::Status Allocator::RecordStream(void* ptr, const Stream& stream) {
  return absl::OkStatus();
}

void Allocator::SetByteCap(int64_t cap) {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.byte_cap = cap < 0 ? 0 : cap;
}

void Allocator::ResetPeak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_bytes_in_use = stats_.bytes_in_use;
  if (attribution_ != nullptr) {
    attribution_->at_peak = attribution_->live;
    attribution_->peak = stats_.bytes_in_use;
  }
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
    return absl::ResourceExhaustedError(
        "host memory exhausted (aligned_alloc)");
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

namespace {

// Every live HostRegistration's locked bytes (HostRegistration::
// ProcessLockedBytes).
std::atomic<int64_t> process_locked_bytes{0};

}  // namespace

int64_t HostRegistration::ProcessLockedBytes() {
  return process_locked_bytes.load(std::memory_order_relaxed);
}

absl::StatusOr<HostRegistration> HostRegistration::Create(
    std::vector<Span> spans) {
  HostRegistration registration;
  if (CudaDeviceCount() == 0) return registration;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  // Exact [begin, end) byte ranges, sorted, then merged where they overlap
  // or share a page (the gap between two such spans is inside one page).
  // Not rounded out to pages: a copy with cudaMemcpyDefault to host memory
  // that starts inside a registered range and runs past its end fails
  // (cudaErrorInvalidValue), and a neighbour's buffer in a rounded-out page
  // would be such memory.
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  for (const Span& span : spans) {
    if (span.bytes == 0) continue;
    const uintptr_t begin = reinterpret_cast<uintptr_t>(span.data);
    ranges.emplace_back(begin, begin + span.bytes);
  }
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uintptr_t, uintptr_t>> merged;
  for (const auto& range : ranges) {
    if (!merged.empty() &&
        range.first / page <= (merged.back().second - 1) / page) {
      merged.back().second = std::max(merged.back().second, range.second);
    } else {
      merged.push_back(range);
    }
  }
  for (const auto& [begin, end] : merged) {
    void* data = reinterpret_cast<void*>(begin);
    const size_t bytes = end - begin;
    const cudaError_t error =
        cudaHostRegister(data, bytes, cudaHostRegisterDefault);
    if (error == cudaErrorHostMemoryAlreadyRegistered) {
      // Bytes another registration holds (see the header): leave the
      // range pageable, and clear the error so that no later check of the
      // runtime's last error reports it.
      cudaGetLastError();
      continue;
    }
    // On failure `registration` unregisters what it holds so far.
    ZE_RETURN_IF_ERROR(
        CudaStatus(error, absl::StrCat("cudaHostRegister(", bytes, " bytes)")));
    registration.ranges_.push_back({data, bytes});
    process_locked_bytes.fetch_add(static_cast<int64_t>(bytes),
                                   std::memory_order_relaxed);
  }
  return registration;
}

HostRegistration::HostRegistration(HostRegistration&& other) noexcept
    : ranges_(std::exchange(other.ranges_, {})) {}

HostRegistration& HostRegistration::operator=(
    HostRegistration&& other) noexcept {
  if (this != &other) {
    Release();
    ranges_ = std::exchange(other.ranges_, {});
  }
  return *this;
}

HostRegistration::~HostRegistration() { Release(); }

size_t HostRegistration::locked_bytes() const {
  size_t bytes = 0;
  for (const Span& range : ranges_) bytes += range.bytes;
  return bytes;
}

void HostRegistration::Release() {
  for (const Span& range : ranges_) {
    cudaHostUnregister(range.data);
    process_locked_bytes.fetch_sub(static_cast<int64_t>(range.bytes),
                                   std::memory_order_relaxed);
  }
  ranges_.clear();
}

namespace {

// Every live CudaCachingAllocator, so that a stream's release reaches those
// it used. Leaked: streams may be destroyed during static destruction.
struct CachingAllocators {
  std::mutex mutex;
  std::vector<CudaCachingAllocator*> allocators;
};

CachingAllocators& LiveCachingAllocators() {
  static auto* registry = [] {
    auto* created = new CachingAllocators;
    AddStreamReleaseCallback([](int device_index, void* native_stream) {
      CachingAllocators& live = LiveCachingAllocators();
      std::lock_guard<std::mutex> lock(live.mutex);
      for (CudaCachingAllocator* allocator : live.allocators) {
        if (allocator->device().index == device_index) {
          allocator->OnStreamReleased(native_stream);
        }
      }
    });
    return created;
  }();
  return *registry;
}

}  // namespace

CudaCachingAllocator::CudaCachingAllocator(std::string name, int device_index)
    : Allocator(std::move(name), Device::Cuda(device_index)) {
  CachingAllocators& live = LiveCachingAllocators();
  std::lock_guard<std::mutex> lock(live.mutex);
  live.allocators.push_back(this);
}

CudaCachingAllocator::~CudaCachingAllocator() {
  // Process-wide instances outlive the CUDA context at exit; freeing then
  // would fail harmlessly, so the cache is simply dropped.
  CachingAllocators& live = LiveCachingAllocators();
  std::lock_guard<std::mutex> lock(live.mutex);
  live.allocators.erase(
      std::find(live.allocators.begin(), live.allocators.end(), this));
}

size_t CudaCachingAllocator::RoundSize(size_t bytes) const {
  constexpr size_t kSmall = 512;
  constexpr size_t kLarge = 2 << 20;
  if (bytes == 0) bytes = 1;
  if (bytes <= (1 << 20)) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

absl::StatusOr<void*> CudaCachingAllocator::RawAllocate(size_t bytes) {
  void* const stream = CurrentStream(device()).native();
  void* ptr = TakeCachedLocked(stream, bytes);
  if (ptr == nullptr && !pending_blocks_.empty()) {
    CollectPendingLocked(bytes);
    ptr = TakeCachedLocked(stream, bytes);
  }
  if (ptr == nullptr) {
    if (device().index >= CudaDeviceCount()) {
      return absl::FailedPreconditionError(
          absl::StrCat("no CUDA device ", device().index, " (",
                       CudaDeviceCount(), " visible)"));
    }
    DeviceScope scope(device().index);
    cudaError_t error = cudaMalloc(&ptr, bytes);
    if (error == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      void* reused = TakeFromOtherStreamLocked(stream, bytes);
      if (reused != nullptr) {
        ptr = reused;
      } else {
        if (!idle_blocks_.empty() || !stream_blocks_.empty() ||
            !pending_blocks_.empty()) {
          ReleaseCacheLocked();
          error = cudaMalloc(&ptr, bytes);
        }
        if (error != cudaSuccess) {
          cudaGetLastError();
          return CudaStatus(error, absl::StrCat("cudaMalloc(", bytes, ")"));
        }
        AddReserved(static_cast<int64_t>(bytes));
      }
    } else if (error != cudaSuccess) {
      cudaGetLastError();
      return CudaStatus(error, absl::StrCat("cudaMalloc(", bytes, ")"));
    } else {
      AddReserved(static_cast<int64_t>(bytes));
    }
  }
  LiveBlock& block = live_blocks_[ptr];
  block = LiveBlock();
  block.size = bytes;
  block.owner = stream;
  return ptr;
}

void* CudaCachingAllocator::TakeCachedLocked(void* stream, size_t size) {
  auto own = stream_blocks_.find(StreamAndSize(stream, size));
  if (own != stream_blocks_.end()) {
    void* ptr = own->second;
    stream_blocks_.erase(own);
    return ptr;
  }
  auto idle = idle_blocks_.find(size);
  if (idle != idle_blocks_.end()) {
    void* ptr = idle->second;
    idle_blocks_.erase(idle);
    return ptr;
  }
  return nullptr;
}

void CudaCachingAllocator::CollectPendingLocked(size_t size) {
  auto [begin, end] = pending_blocks_.equal_range(size);
  for (auto it = begin; it != end;) {
    PendingBlock& pending = it->second;
    bool done = true;
    for (void* event : pending.events) {
      const cudaError_t state = cudaEventQuery(static_cast<cudaEvent_t>(event));
      if (state == cudaErrorNotReady) {
        cudaGetLastError();
        done = false;
        break;
      }
    }
    if (!done) {
      ++it;
      continue;
    }
    event_pool_.insert(event_pool_.end(), pending.events.begin(),
                       pending.events.end());
    if (pending.orphaned) {
      idle_blocks_.emplace(size, pending.ptr);
    } else {
      stream_blocks_.emplace(StreamAndSize(pending.owner, size), pending.ptr);
    }
    it = pending_blocks_.erase(it);
  }
}

void* CudaCachingAllocator::TakeFromOtherStreamLocked(void* stream,
                                                      size_t size) {
  for (auto it = stream_blocks_.begin(); it != stream_blocks_.end(); ++it) {
    if (it->first.second != size) continue;
    void* const owner = it->first.first;
    void* const event = RecordEventLocked(owner);
    if (event == nullptr) return nullptr;
    // The wait captures the owner's queue as of now, which holds every use
    // of the block (it was freed before now); the event may then be reused.
    const cudaError_t error = cudaStreamWaitEvent(
        static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0);
    event_pool_.push_back(event);
    if (error != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    void* ptr = it->second;
    stream_blocks_.erase(it);
    return ptr;
  }
  return nullptr;
}

void* CudaCachingAllocator::RecordEventLocked(void* stream) {
  DeviceScope scope(device().index);
  cudaEvent_t event = nullptr;
  if (!event_pool_.empty()) {
    event = static_cast<cudaEvent_t>(event_pool_.back());
    event_pool_.pop_back();
  } else if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) !=
             cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  if (cudaEventRecord(event, static_cast<cudaStream_t>(stream)) !=
      cudaSuccess) {
    cudaGetLastError();
    event_pool_.push_back(event);
    return nullptr;
  }
  return event;
}

void CudaCachingAllocator::RawDeallocate(void* ptr, size_t bytes) {
  auto found = live_blocks_.find(ptr);
  ZE_CHECK(found != live_blocks_.end());
  LiveBlock block = std::move(found->second);
  live_blocks_.erase(found);
  PendingBlock pending;
  pending.ptr = ptr;
  pending.owner = block.owner;
  pending.orphaned = block.orphaned;
  pending.events = std::move(block.events);
  for (void* stream : block.recorded_streams) {
    void* event = RecordEventLocked(stream);
    if (event == nullptr) {
      // Without the event nothing tells when that stream is done with the
      // block: wait for it here rather than risk handing it out early.
      DeviceScope scope(device().index);
      cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
      cudaGetLastError();
      continue;
    }
    pending.events.push_back(event);
  }
  if (!pending.events.empty()) {
    pending_blocks_.emplace(bytes, std::move(pending));
  } else if (pending.orphaned) {
    idle_blocks_.emplace(bytes, ptr);
  } else {
    stream_blocks_.emplace(StreamAndSize(pending.owner, bytes), ptr);
  }
}

absl::Status CudaCachingAllocator::RecordStream(void* ptr,
                                                const Stream& stream) {
  if (stream.device().is_cpu()) return absl::OkStatus();
  if (stream.device() != device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "allocator '", name(), "': RecordStream of a block on ",
        device().ToString(), " with a stream on ", stream.device().ToString()));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = live_blocks_.find(ptr);
  if (found == live_blocks_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("allocator '", name(), "': RecordStream of ",
                     absl::Hex(reinterpret_cast<uintptr_t>(ptr)),
                     ", which is not a live block of this allocator"));
  }
  LiveBlock& block = found->second;
  void* const native = stream.native();
  if (!block.orphaned && native == block.owner) return absl::OkStatus();
  for (void* recorded : block.recorded_streams) {
    if (recorded == native) return absl::OkStatus();
  }
  block.recorded_streams.push_back(native);
  return absl::OkStatus();
}

void CudaCachingAllocator::OnStreamReleased(void* native_stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Blocks its work may still use get an event each (rare: streams are
  // long-lived), so the stream may be destroyed without waiting for it.
  auto event_or_wait = [&]() -> void* {
    void* event = RecordEventLocked(native_stream);
    if (event == nullptr) {
      DeviceScope scope(device().index);
      cudaStreamSynchronize(static_cast<cudaStream_t>(native_stream));
      cudaGetLastError();
    }
    return event;
  };
  for (auto it = stream_blocks_.begin(); it != stream_blocks_.end();) {
    if (it->first.first != native_stream) {
      ++it;
      continue;
    }
    PendingBlock pending;
    pending.ptr = it->second;
    pending.orphaned = true;
    if (void* event = event_or_wait()) pending.events.push_back(event);
    pending_blocks_.emplace(it->first.second, std::move(pending));
    it = stream_blocks_.erase(it);
  }
  for (auto& [size, pending] : pending_blocks_) {
    if (pending.orphaned || pending.owner != native_stream) continue;
    pending.orphaned = true;
    if (void* event = event_or_wait()) pending.events.push_back(event);
  }
  for (auto& [ptr, block] : live_blocks_) {
    bool used = !block.orphaned && block.owner == native_stream;
    auto recorded = std::find(block.recorded_streams.begin(),
                              block.recorded_streams.end(), native_stream);
    if (recorded != block.recorded_streams.end()) {
      block.recorded_streams.erase(recorded);
      used = true;
    }
    if (!used) continue;
    if (!block.orphaned && block.owner == native_stream) block.orphaned = true;
    if (void* event = event_or_wait()) block.events.push_back(event);
  }
}

void CudaCachingAllocator::ReleaseCache() {
  std::lock_guard<std::mutex> lock(mutex_);
  ReleaseCacheLocked();
}

void CudaCachingAllocator::ReleaseCacheLocked() {
  if (idle_blocks_.empty() && stream_blocks_.empty() &&
      pending_blocks_.empty()) {
    return;
  }
  DeviceScope scope(device().index);
  // Every stream's queued work finishes, so every cached block (pending
  // ones too) is unused and every pooled event complete.
  cudaDeviceSynchronize();
  auto release = [this](size_t size, void* ptr) {
    cudaFree(ptr);
    AddReserved(-static_cast<int64_t>(size));
  };
  for (auto& [size, ptr] : idle_blocks_) release(size, ptr);
  for (auto& [key, ptr] : stream_blocks_) release(key.second, ptr);
  for (auto& [size, pending] : pending_blocks_) {
    release(size, pending.ptr);
    event_pool_.insert(event_pool_.end(), pending.events.begin(),
                       pending.events.end());
  }
  idle_blocks_.clear();
  stream_blocks_.clear();
  pending_blocks_.clear();
}

Allocator* HostMemory() {
  static HostAllocator* allocator = new HostAllocator("host");
  return allocator;
}

Allocator* PinnedHostMemory() {
  static PinnedHostAllocator* allocator =
      new PinnedHostAllocator("pinned_host");
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
