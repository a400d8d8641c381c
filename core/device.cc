#include "core/device.h"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace ze {

std::string Device::ToString() const {
  if (is_cpu()) return "cpu";
  return absl::StrCat("cuda:", index);
}

absl::StatusOr<Device> ParseDevice(const std::string& text) {
  if (text == "cpu") return Device::Cpu();
  if (text == "cuda") return Device::Cuda(0);
  if (absl::StartsWith(text, "cuda:")) {
    int index = 0;
    if (absl::SimpleAtoi(text.substr(5), &index) && index >= 0) {
      return Device::Cuda(index);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown device \"", text, "\" (expected cpu, cuda or cuda:N)"));
}

int CudaDeviceCount() {
  static const int count = [] {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no device" error
      return 0;
    }
    return devices;
  }();
  return count;
}

absl::Status CudaStatus(int cuda_error, const std::string& what) {
  if (cuda_error == cudaSuccess) return absl::OkStatus();
  const auto error = static_cast<cudaError_t>(cuda_error);
  const std::string message =
      absl::StrCat(what, " failed: ", cudaGetErrorName(error), " (",
                   cudaGetErrorString(error), ")");
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
      return absl::InvalidArgumentError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status SetCurrentDevice(const Device& device) {
  if (device.is_cpu()) return absl::OkStatus();
  if (device.index >= CudaDeviceCount()) {
    return absl::FailedPreconditionError(
        absl::StrCat("device ", device.ToString(), " requested but ",
                     CudaDeviceCount(), " CUDA device(s) are visible"));
  }
  return CudaStatus(cudaSetDevice(device.index),
                    absl::StrCat("cudaSetDevice(", device.index, ")"));
}

absl::StatusOr<int64_t> CudaFreeMemoryBytes(const Device& device) {
  if (!device.is_cuda()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CudaFreeMemoryBytes: ", device.ToString(), " is not a CUDA device"));
  }
  ZE_RETURN_IF_ERROR(SetCurrentDevice(device));
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  ZE_RETURN_IF_ERROR(
      CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes),
                 absl::StrCat("cudaMemGetInfo on ", device.ToString())));
  return static_cast<int64_t>(free_bytes);
}

}  // namespace ze
