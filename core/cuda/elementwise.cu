#include <cuda_runtime.h>

#include "core/cuda/dtype_cuda.cuh"
#include "core/cuda/elementwise.h"

namespace ze {
namespace cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t count) {
  int64_t blocks = (count + kThreads - 1) / kThreads;
  if (blocks > 65535 * 8) blocks = 65535 * 8;  // grid-stride beyond this
  return static_cast<int>(blocks < 1 ? 1 : blocks);
}

__global__ void FillKernel(void* dst, int dtype, int64_t count, float value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    StoreF32(dst, dtype, i, value);
  }
}

__global__ void CastKernel(const void* src, int src_dtype, void* dst,
                           int dst_dtype, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    StoreF32(dst, dst_dtype, i, LoadF32(src, src_dtype, i));
  }
}

__global__ void AxpbyKernel(const void* a, int a_dtype, float alpha,
                            const void* b, int b_dtype, float beta, void* out,
                            int out_dtype, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float value =
        LoadF32(a, a_dtype, i) * alpha + LoadF32(b, b_dtype, i) * beta;
    StoreF32(out, out_dtype, i, value);
  }
}

__global__ void ScaleKernel(void* x, int dtype, int64_t count, float factor) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    StoreF32(x, dtype, i, LoadF32(x, dtype, i) * factor);
  }
}

__device__ float WarpSum(float value) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value += __shfl_down_sync(0xffffffffu, value, offset);
  }
  return value;
}

__global__ void SumOfSquaresKernel(const void* x, int dtype, int64_t count,
                                   float* result) {
  float partial = 0.0f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float value = LoadF32(x, dtype, i);
    partial += value * value;
  }
  __shared__ float warp_sums[kThreads / 32];
  partial = WarpSum(partial);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = partial;
  __syncthreads();
  if (threadIdx.x < 32) {
    float value = threadIdx.x < kThreads / 32 ? warp_sums[threadIdx.x] : 0.0f;
    value = WarpSum(value);
    if (threadIdx.x == 0) atomicAdd(result, value);
  }
}

__global__ void HasInfOrNanKernel(const void* x, int dtype, int64_t count,
                                  float* flag) {
  bool found = false;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    found |= !isfinite(LoadF32(x, dtype, i));
  }
  if (__syncthreads_or(found) && threadIdx.x == 0) *flag = 1.0f;
}

}  // namespace

int LaunchFill(void* dst, int dtype, int64_t count, float value, void* stream) {
  if (count == 0) return 0;
  FillKernel<<<Blocks(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      dst, dtype, count, value);
  return static_cast<int>(cudaGetLastError());
}

int LaunchCast(const void* src, int src_dtype, void* dst, int dst_dtype,
               int64_t count, void* stream) {
  if (count == 0) return 0;
  CastKernel<<<Blocks(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      src, src_dtype, dst, dst_dtype, count);
  return static_cast<int>(cudaGetLastError());
}

int LaunchAxpby(const void* a, int a_dtype, float alpha, const void* b,
                int b_dtype, float beta, void* out, int out_dtype,
                int64_t count, void* stream) {
  if (count == 0) return 0;
  AxpbyKernel<<<Blocks(count), kThreads, 0,
                static_cast<cudaStream_t>(stream)>>>(
      a, a_dtype, alpha, b, b_dtype, beta, out, out_dtype, count);
  return static_cast<int>(cudaGetLastError());
}

int LaunchScale(void* x, int dtype, int64_t count, float factor, void* stream) {
  if (count == 0) return 0;
  ScaleKernel<<<Blocks(count), kThreads, 0,
                static_cast<cudaStream_t>(stream)>>>(x, dtype, count, factor);
  return static_cast<int>(cudaGetLastError());
}

int LaunchSumOfSquares(const void* x, int dtype, int64_t count,
                       float* result_f32, void* stream) {
  if (count == 0) return 0;
  int blocks = Blocks(count);
  if (blocks > 1024) blocks = 1024;
  SumOfSquaresKernel<<<blocks, kThreads, 0,
                       static_cast<cudaStream_t>(stream)>>>(x, dtype, count,
                                                            result_f32);
  return static_cast<int>(cudaGetLastError());
}

int LaunchHasInfOrNan(const void* x, int dtype, int64_t count, float* flag_f32,
                      void* stream) {
  if (count == 0) return 0;
  int blocks = Blocks(count);
  if (blocks > 1024) blocks = 1024;
  HasInfOrNanKernel<<<blocks, kThreads, 0,
                      static_cast<cudaStream_t>(stream)>>>(x, dtype, count,
                                                           flag_f32);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace cuda
}  // namespace ze
