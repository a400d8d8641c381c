// GELU forward and backward, and the backward fused with the column sums
// of its result (nn/cuda/kernels.h). f32 arithmetic, storage dtype I/O.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "nn/cuda/cuda_common.cuh"
#include "nn/cuda/kernels.h"
#include "nn/cuda/kernels_common.cuh"

namespace ze {
namespace nn {
namespace cuda_kernels {
namespace {

// --------------------------------------------------------------------- GELU
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ float Gelu(float x) {
  const float inner = kGeluScale * (x + kGeluCubic * x * x * x);
  return 0.5f * x * (1.0f + tanhf(inner));
}

__device__ __forceinline__ float GeluGrad(float x) {
  const float inner = kGeluScale * (x + kGeluCubic * x * x * x);
  const float t = tanhf(inner);
  const float sech2 = 1.0f - t * t;
  return 0.5f * (1.0f + t) +
         0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
}

template <typename T, int VEC>
__global__ void GeluForwardKernel(const T* __restrict__ x, T* __restrict__ y,
                                  int64_t count) {
  const int64_t i =
      (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
  if (i >= count) return;
  float v[VEC];
  LoadFloats<T, VEC>(x + i, v);
#pragma unroll
  for (int k = 0; k < VEC; ++k) v[k] = Gelu(v[k]);
  StoreFloats<T, VEC>(y + i, v);
}

// dx may alias dy: each element is read before it is written by one thread.
template <typename T, int VEC>
__global__ void GeluBackwardKernel(const T* dy, const T* __restrict__ x, T* dx,
                                   int64_t count) {
  const int64_t i =
      (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
  if (i >= count) return;
  float g[VEC], v[VEC];
  LoadFloats<T, VEC>(dy + i, g);
  LoadFloats<T, VEC>(x + i, v);
#pragma unroll
  for (int k = 0; k < VEC; ++k) g[k] *= GeluGrad(v[k]);
  StoreFloats<T, VEC>(dx + i, g);
}

// dx = dy * gelu'(x) over a (rows, cols) matrix, and per chunk of
// kColumnChunkRows rows the column sums of dx as stored (rounded to T), the
// partials of the bias gradient of the Linear that produced x: one pass
// instead of the GELU backward plus a second read for the column sums.
// Thread layout as ColumnPartialSumsVecKernel (grid.y = row chunk). dx may
// alias dy (each element is read before it is written, by one thread).
template <typename T, int VEC, int UNROLL>
__global__ void GeluBackwardColumnSumsKernel(const T* dy,
                                             const T* __restrict__ x, T* dx,
                                             int64_t rows, int64_t cols,
                                             float* __restrict__ partials) {
  const int64_t c =
      (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
  if (c >= cols) return;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * kColumnChunkRows;
  const int64_t end = min(rows, begin + kColumnChunkRows);
  float sum[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) sum[k] = 0.0f;
  auto one_row = [&](const float(&g)[VEC], const float(&v)[VEC], int64_t r) {
    float out[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      out[k] = ToFloat(FromFloat<T>(g[k] * GeluGrad(v[k])));
      sum[k] += out[k];
    }
    StoreFloats<T, VEC>(dx + r * cols + c, out);
  };
  int64_t r = begin;
  for (; r + UNROLL <= end; r += UNROLL) {
    float g[UNROLL][VEC], v[UNROLL][VEC];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      LoadFloats<T, VEC>(dy + (r + u) * cols + c, g[u]);
      LoadFloats<T, VEC>(x + (r + u) * cols + c, v[u]);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) one_row(g[u], v[u], r + u);
  }
  for (; r < end; ++r) {
    float g[VEC], v[VEC];
    LoadFloats<T, VEC>(dy + r * cols + c, g);
    LoadFloats<T, VEC>(x + r * cols + c, v);
    one_row(g, v, r);
  }
  float* out = partials + static_cast<int64_t>(blockIdx.y) * cols + c;
#pragma unroll
  for (int k = 0; k < VEC; ++k) out[k] = sum[k];
}

}  // namespace

int LaunchGeluBackwardColumnSums(const void* dy, const void* x, void* dx,
                                 int64_t rows, int64_t cols, int dtype,
                                 float* partials, void* stream) {
  if (rows == 0 || cols == 0) return 0;
  return DispatchFloat(dtype, [&](auto* tag) -> int {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    if (cols % kVec != 0 || !Aligned(dy, 16) || !Aligned(x, 16) ||
        !Aligned(dx, 16)) {
      return static_cast<int>(cudaErrorInvalidValue);
    }
    constexpr int kThreads = 128;
    const dim3 grid(GridFor(cols / kVec, kThreads),
                    ColumnPartialSumsCount(rows));
    GeluBackwardColumnSumsKernel<T, kVec, 4>
        <<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<const T*>(dy), static_cast<const T*>(x),
            static_cast<T*>(dx), rows, cols, partials);
    return LastError();
  });
}

bool GeluBackwardColumnSumsSupported(const void* dy, const void* x,
                                     const void* dx, int64_t cols, int dtype) {
  const int vec = dtype == kF32 ? 4 : 8;
  return cols % vec == 0 && Aligned(dy, 16) && Aligned(x, 16) &&
         Aligned(dx, 16);
}

int LaunchGeluForward(const void* x, void* y, int64_t count, int dtype,
                      void* stream) {
  if (count == 0) return 0;
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    auto s = static_cast<cudaStream_t>(stream);
    if (count % kVec == 0 && Aligned(x, 16) && Aligned(y, 16)) {
      GeluForwardKernel<T, kVec><<<GridFor(count / kVec, 256), 256, 0, s>>>(
          static_cast<const T*>(x), static_cast<T*>(y), count);
    } else {
      GeluForwardKernel<T, 1><<<GridFor(count, 256), 256, 0, s>>>(
          static_cast<const T*>(x), static_cast<T*>(y), count);
    }
    return LastError();
  });
}

int LaunchGeluBackward(const void* dy, const void* x, void* dx, int64_t count,
                       int dtype, void* stream) {
  if (count == 0) return 0;
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    auto s = static_cast<cudaStream_t>(stream);
    if (count % kVec == 0 && Aligned(x, 16) && Aligned(dy, 16) &&
        Aligned(dx, 16)) {
      GeluBackwardKernel<T, kVec><<<GridFor(count / kVec, 256), 256, 0, s>>>(
          static_cast<const T*>(dy), static_cast<const T*>(x),
          static_cast<T*>(dx), count);
    } else {
      GeluBackwardKernel<T, 1><<<GridFor(count, 256), 256, 0, s>>>(
          static_cast<const T*>(dy), static_cast<const T*>(x),
          static_cast<T*>(dx), count);
    }
    return LastError();
  });
}

}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze
