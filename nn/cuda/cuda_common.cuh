// Device-side helpers shared by the nn/cuda kernels: f32 conversion of the
// element types, 16-byte vector packs, warp and block reductions.
#ifndef ZE_NN_CUDA_CUDA_COMMON_CUH_
#define ZE_NN_CUDA_CUDA_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace ze {
namespace nn {
namespace cuda_kernels {

enum : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}

// Element access by run-time dtype, for small tensors whose dtype may differ
// from the activations' (parameter gradients).
__device__ __forceinline__ float LoadAny(const void* p, int dtype, int64_t i) {
  switch (dtype) {
    case kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}
__device__ __forceinline__ void StoreAny(void* p, int dtype, int64_t i,
                                         float v) {
  switch (dtype) {
    case kBF16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      return;
    case kF16:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      return;
    default:
      static_cast<float*>(p)[i] = v;
  }
}

// VEC consecutive elements moved as one (VEC * sizeof(T))-byte access.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

template <typename T, int VEC>
__device__ __forceinline__ void LoadFloats(const T* p, float (&out)[VEC]) {
  const Pack<T, VEC> pack = *reinterpret_cast<const Pack<T, VEC>*>(p);
#pragma unroll
  for (int i = 0; i < VEC; ++i) out[i] = ToFloat(pack.v[i]);
}

template <typename T, int VEC>
__device__ __forceinline__ void StoreFloats(T* p, const float (&in)[VEC]) {
  Pack<T, VEC> pack;
#pragma unroll
  for (int i = 0; i < VEC; ++i) pack.v[i] = FromFloat<T>(in[i]);
  *reinterpret_cast<Pack<T, VEC>*>(p) = pack;
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds 32
// floats; the function syncs so scratch may be reused right after.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = (blockDim.x + 31) >> 5;
  v = WarpSum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = lane < num_warps ? scratch[lane] : 0.0f;
  total = WarpSum(total);
  __syncthreads();
  return total;
}

__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = (blockDim.x + 31) >> 5;
  v = WarpMax(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = lane < num_warps ? scratch[lane] : -INFINITY;
  total = WarpMax(total);
  __syncthreads();
  return total;
}

// True when every pointer is aligned to `bytes`.
__host__ __forceinline__ bool Aligned(const void* p, int bytes) {
  return (reinterpret_cast<uintptr_t>(p) % bytes) == 0;
}

}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_CUDA_CUDA_COMMON_CUH_
