// Device pieces both attention implementations use: attention_mma.cuh
// (mma.sync, any sm_90 build) and attention_sm90.cu (wgmma, sm_90a). Only for
// .cu files of nn/cuda.
#ifndef ZE_NN_CUDA_ATTENTION_COMMON_CUH_
#define ZE_NN_CUDA_ATTENTION_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace ze {
namespace nn {
namespace cuda_kernels {
namespace attention {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The 32-bit shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Rounds two f32 values to T (bf16 or f16, round to nearest even) and packs
// them into one 32-bit register, lo in the low half: the layout of a tensor
// core operand pair.
template <typename T>
__device__ __forceinline__ uint32_t Pack(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t Pack<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t Pack<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

}  // namespace attention
}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_CUDA_ATTENTION_COMMON_CUH_
