// Device-side loads and stores of ze::DType elements in f32.
#ifndef ZE_CORE_CUDA_DTYPE_CUDA_CUH_
#define ZE_CORE_CUDA_DTYPE_CUDA_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace ze {
namespace cuda {

enum : int { kF32 = 0, kBF16 = 1, kF16 = 2, kI32 = 3 };

__device__ __forceinline__ float LoadF32(const void* data, int dtype,
                                         int64_t index) {
  switch (dtype) {
    case kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(data)[index]);
    case kF16:
      return __half2float(static_cast<const __half*>(data)[index]);
    case kI32:
      return static_cast<float>(static_cast<const int*>(data)[index]);
    default:
      return static_cast<const float*>(data)[index];
  }
}

// Rounds to nearest even, as the CPU conversions in core/dtype.h do.
__device__ __forceinline__ void StoreF32(void* data, int dtype, int64_t index,
                                         float value) {
  switch (dtype) {
    case kBF16:
      static_cast<__nv_bfloat16*>(data)[index] = __float2bfloat16_rn(value);
      return;
    case kF16:
      static_cast<__half*>(data)[index] = __float2half_rn(value);
      return;
    case kI32:
      static_cast<int*>(data)[index] = static_cast<int>(value);
      return;
    default:
      static_cast<float*>(data)[index] = value;
  }
}

}  // namespace cuda
}  // namespace ze

#endif  // ZE_CORE_CUDA_DTYPE_CUDA_CUH_
