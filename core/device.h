// Where a tensor lives: the host, or one CUDA device.
#ifndef ZE_CORE_DEVICE_H_
#define ZE_CORE_DEVICE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ze {

enum class DeviceType { kCpu = 0, kCuda = 1 };

// A small value type: "cpu" or "cuda:N".
struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  static Device Cpu() { return Device{DeviceType::kCpu, 0}; }
  static Device Cuda(int index) { return Device{DeviceType::kCuda, index}; }

  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  std::string ToString() const;

  friend bool operator==(const Device& a, const Device& b) {
    return a.type == b.type &&
           (a.type == DeviceType::kCpu || a.index == b.index);
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

// Parses "cpu", "cuda" (= cuda:0) or "cuda:N".
absl::StatusOr<Device> ParseDevice(const std::string& text);

// Number of CUDA devices visible to this process; 0 when there is no driver
// or no GPU (never an error: CPU-only machines are normal here).
int CudaDeviceCount();

// Translates a CUDA runtime error code into a Status naming `what` failed
// (e.g. "cudaMalloc of 1048576 bytes on cuda:0"). OK for cudaSuccess.
// This is the one place CUDA runtime errors become Statuses.
absl::Status CudaStatus(int cuda_error, const std::string& what);

// Makes `device` current for this thread (cudaSetDevice); no-op for CPU.
absl::Status SetCurrentDevice(const Device& device);

// The bytes the CUDA device has free now (cudaMemGetInfo; makes it current
// for this thread). Memory this process's caching allocator holds counts
// as used. FailedPrecondition for a CPU device or one not visible.
absl::StatusOr<int64_t> CudaFreeMemoryBytes(const Device& device);

}  // namespace ze

#endif  // ZE_CORE_DEVICE_H_
