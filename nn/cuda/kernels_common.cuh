// Helpers every kernel file of nn/cuda/kernels.h shares: dtype dispatch,
// launch errors, grid sizes. Device code only (nvcc); internal to nn/cuda.
#ifndef ZE_NN_CUDA_KERNELS_COMMON_CUH_
#define ZE_NN_CUDA_KERNELS_COMMON_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "nn/cuda/cuda_common.cuh"
#include "nn/cuda/kernels.h"

namespace ze {
namespace nn {
namespace cuda_kernels {
namespace {

// Calls `body` with a null pointer of the element type named by `dtype`.
template <typename Body>
int DispatchFloat(int dtype, Body&& body) {
  switch (dtype) {
    case kBF16:
      return body(static_cast<__nv_bfloat16*>(nullptr));
    case kF16:
      return body(static_cast<__half*>(nullptr));
    case kF32:
      return body(static_cast<float*>(nullptr));
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

inline int LastError() { return static_cast<int>(cudaGetLastError()); }

inline int NumSms() {
  static int count = [] {
    int device = 0, sms = 132;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    return sms;
  }();
  return count;
}

inline int GridFor(int64_t count, int threads) {
  return static_cast<int>((count + threads - 1) / threads);
}

// Rows per partial row of a column sum (LaunchColumnPartialSums and the
// fused GELU backward share the chunking, so ColumnPartialSumsCount serves
// both).
constexpr int kColumnChunkRows = 128;

}  // namespace
}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_CUDA_KERNELS_COMMON_CUH_
