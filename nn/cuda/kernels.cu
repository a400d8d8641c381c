// LayerNorm, GELU, embedding, cross-entropy and column-sum kernels. All
// arithmetic in f32; inputs and outputs in the tensors' storage dtype.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>

#include "nn/cuda/cuda_common.cuh"
#include "nn/cuda/kernels.h"

namespace ze {
namespace nn {
namespace cuda_kernels {
namespace {

constexpr float kLayerNormEps = 1e-5f;

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

int LastError() { return static_cast<int>(cudaGetLastError()); }

int NumSms() {
  static int count = [] {
    int device = 0, sms = 132;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    return sms;
  }();
  return count;
}

// ---------------------------------------------------------------- LayerNorm
// One warp per row. The row is read three times (mean, variance, output);
// the second and third reads hit L1/L2, and the two-pass variance avoids the
// cancellation of E[x^2] - E[x]^2.
template <typename T, int VEC>
__global__ void LayerNormForwardKernel(const T* __restrict__ x,
                                       const T* __restrict__ weight,
                                       const T* __restrict__ bias,
                                       T* __restrict__ y, float* mean_out,
                                       float* rstd_out, int64_t rows,
                                       int cols) {
  const int lane = threadIdx.x & 31;
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T* xr = x + row * cols;
  float sum = 0.0f;
  for (int c = lane * VEC; c < cols; c += 32 * VEC) {
    float v[VEC];
    LoadFloats<T, VEC>(xr + c, v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) sum += v[i];
  }
  const float mean = WarpSum(sum) / cols;
  float sq = 0.0f;
  for (int c = lane * VEC; c < cols; c += 32 * VEC) {
    float v[VEC];
    LoadFloats<T, VEC>(xr + c, v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) sq += (v[i] - mean) * (v[i] - mean);
  }
  const float rstd = rsqrtf(WarpSum(sq) / cols + kLayerNormEps);
  T* yr = y + row * cols;
  for (int c = lane * VEC; c < cols; c += 32 * VEC) {
    float v[VEC], w[VEC], b[VEC];
    LoadFloats<T, VEC>(xr + c, v);
    LoadFloats<T, VEC>(weight + c, w);
    if (bias != nullptr) {
      LoadFloats<T, VEC>(bias + c, b);
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) b[i] = 0.0f;
    }
    float out[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = (v[i] - mean) * rstd * w[i] + b[i];
    StoreFloats<T, VEC>(yr + c, out);
  }
  if (lane == 0) {
    if (mean_out != nullptr) mean_out[row] = mean;
    if (rstd_out != nullptr) rstd_out[row] = rstd;
  }
}

// One warp per row, rows strided over a grid of a few blocks per SM. Weight
// and bias gradients accumulate in shared memory (f32 atomics, cheap there)
// and each block writes one partial row; LaunchAddColumnSums finishes them.
template <typename T, int VEC>
__global__ void LayerNormBackwardKernel(
    const T* __restrict__ dy, const T* __restrict__ x,
    const T* __restrict__ weight, const float* __restrict__ mean,
    const float* __restrict__ rstd, T* __restrict__ dx,
    const T* __restrict__ dx_addend, float* weight_partials,
    float* bias_partials, int64_t rows, int cols) {
  extern __shared__ float shared[];
  const bool param_grads =
      weight_partials != nullptr || bias_partials != nullptr;
  float* dweight = shared;       // (C)
  float* dbias = shared + cols;  // (C)
  if (param_grads) {
    for (int c = threadIdx.x; c < 2 * cols; c += blockDim.x) shared[c] = 0.0f;
    __syncthreads();
  }
  const int lane = threadIdx.x & 31;
  const int warps = blockDim.x >> 5;
  for (int64_t row =
           static_cast<int64_t>(blockIdx.x) * warps + (threadIdx.x >> 5);
       row < rows; row += static_cast<int64_t>(gridDim.x) * warps) {
    const T* dyr = dy + row * cols;
    const T* xr = x + row * cols;
    const float m = mean[row];
    const float rs = rstd[row];
    float sum_g = 0.0f, sum_gx = 0.0f;  // sums of dy*w and dy*w*xhat
    for (int c = lane * VEC; c < cols; c += 32 * VEC) {
      float g[VEC], v[VEC], w[VEC];
      LoadFloats<T, VEC>(dyr + c, g);
      LoadFloats<T, VEC>(xr + c, v);
      LoadFloats<T, VEC>(weight + c, w);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float xhat = (v[i] - m) * rs;
        sum_g += g[i] * w[i];
        sum_gx += g[i] * w[i] * xhat;
        if (param_grads) {
          atomicAdd(&dweight[c + i], g[i] * xhat);
          atomicAdd(&dbias[c + i], g[i]);
        }
      }
    }
    if (dx == nullptr) continue;
    sum_g = WarpSum(sum_g) / cols;
    sum_gx = WarpSum(sum_gx) / cols;
    T* dxr = dx + row * cols;
    for (int c = lane * VEC; c < cols; c += 32 * VEC) {
      float g[VEC], v[VEC], w[VEC], out[VEC];
      LoadFloats<T, VEC>(dyr + c, g);
      LoadFloats<T, VEC>(xr + c, v);
      LoadFloats<T, VEC>(weight + c, w);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float xhat = (v[i] - m) * rs;
        out[i] = rs * (g[i] * w[i] - sum_g - xhat * sum_gx);
      }
      if (dx_addend != nullptr) {
        float a[VEC];
        LoadFloats<T, VEC>(dx_addend + row * cols + c, a);
#pragma unroll
        for (int i = 0; i < VEC; ++i) out[i] += a[i];
      }
      StoreFloats<T, VEC>(dxr + c, out);
    }
  }
  if (param_grads) {
    __syncthreads();
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      if (weight_partials != nullptr) {
        weight_partials[static_cast<int64_t>(blockIdx.x) * cols + c] =
            dweight[c];
      }
      if (bias_partials != nullptr) {
        bias_partials[static_cast<int64_t>(blockIdx.x) * cols + c] = dbias[c];
      }
    }
  }
}

// Fused backward for rows a whole number of 16-byte vectors wide: a team of
// `threads_per_row` threads (a multiple of 32) owns one row at a time, each
// thread ITEMS vectors of VEC columns at fixed positions, so the weight stays
// in registers and the weight/bias gradient partials accumulate in registers
// (f32) with no atomics. A block holds blockDim / threads_per_row teams and
// each team writes one partial row at the end (see LayerNormBackwardPlan).
// The row sums cross the team's warps through shared memory, double-buffered
// so one barrier per row suffices; the next row's dy and x are loaded before
// that barrier to keep memory busy.
template <typename T, int VEC, int ITEMS>
__global__ void __launch_bounds__(256, ITEMS == 1 ? 4 : 2)
    LayerNormBackwardTeamKernel(
        const T* __restrict__ dy, const T* __restrict__ x,
        const T* __restrict__ weight, const float* __restrict__ mean,
        const float* __restrict__ rstd, T* __restrict__ dx,
        const T* __restrict__ dx_addend, float* __restrict__ weight_partials,
        float* __restrict__ bias_partials, int64_t rows, int cols,
        int threads_per_row) {
  __shared__ float2 sums[2][8];  // [buffer][warp]: (sum dy*w, sum dy*w*xhat)
  const int teams = blockDim.x / threads_per_row;
  const int team = threadIdx.x / threads_per_row;
  const int member = threadIdx.x % threads_per_row;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int team_warps = threads_per_row >> 5;
  const int first_warp = team * team_warps;
  const float inv_cols = 1.0f / cols;

  float w[ITEMS][VEC], dw[ITEMS][VEC], db[ITEMS][VEC];
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    LoadFloats<T, VEC>(weight + (it * threads_per_row + member) * VEC, w[it]);
#pragma unroll
    for (int i = 0; i < VEC; ++i) dw[it][i] = db[it][i] = 0.0f;
  }

  using P = Pack<T, VEC>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * teams;
  int64_t row = static_cast<int64_t>(blockIdx.x) * teams + team;
  // Every thread runs the same number of passes (barriers inside); rows past
  // the end are computed on zeros and not stored.
  const int64_t first = static_cast<int64_t>(blockIdx.x) * teams;
  const int64_t passes = first < rows ? (rows - first + step - 1) / step : 0;
  P next_g[ITEMS], next_v[ITEMS];
  auto load = [&](int64_t r) {
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
      if (r < rows) {
        const int64_t off = r * cols + (it * threads_per_row + member) * VEC;
        next_g[it] = *reinterpret_cast<const P*>(dy + off);
        next_v[it] = *reinterpret_cast<const P*>(x + off);
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          next_g[it].v[i] = FromFloat<T>(0.0f);
          next_v[it].v[i] = FromFloat<T>(0.0f);
        }
      }
    }
  };
  load(row);
  for (int64_t pass = 0; pass < passes; ++pass, row += step) {
    const bool valid = row < rows;
    const float m = valid ? mean[row] : 0.0f;
    const float rs = valid ? rstd[row] : 0.0f;
    // The row stays packed (16-bit values for bf16/f16) and is converted
    // again for dx: registers, not arithmetic, bound the blocks per SM.
    P cur_g[ITEMS], cur_v[ITEMS];
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
      cur_g[it] = next_g[it];
      cur_v[it] = next_v[it];
    }
    load(row + step);
    float sum_g = 0.0f, sum_gx = 0.0f;
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float g = ToFloat(cur_g[it].v[i]);
        const float xhat = (ToFloat(cur_v[it].v[i]) - m) * rs;
        const float gw = g * w[it][i];
        sum_g += gw;
        sum_gx += gw * xhat;
        dw[it][i] += g * xhat;
        db[it][i] += g;
      }
    }
    sum_g = WarpSum(sum_g);
    sum_gx = WarpSum(sum_gx);
    if (team_warps > 1) {
      float2* buffer = sums[pass & 1];
      if (lane == 0) buffer[warp] = make_float2(sum_g, sum_gx);
      __syncthreads();
      sum_g = 0.0f;
      sum_gx = 0.0f;
      for (int k = 0; k < team_warps; ++k) {
        const float2 s = buffer[first_warp + k];
        sum_g += s.x;
        sum_gx += s.y;
      }
    }
    if (dx == nullptr || !valid) continue;
    sum_g *= inv_cols;
    sum_gx *= inv_cols;
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
      const int64_t off = row * cols + (it * threads_per_row + member) * VEC;
      float addend[VEC];
      if (dx_addend != nullptr) {
        LoadFloats<T, VEC>(dx_addend + off, addend);
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) addend[i] = 0.0f;
      }
      float out[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float g = ToFloat(cur_g[it].v[i]);
        const float xhat = (ToFloat(cur_v[it].v[i]) - m) * rs;
        out[i] = rs * (g * w[it][i] - sum_g - xhat * sum_gx) + addend[i];
      }
      StoreFloats<T, VEC>(dx + off, out);
    }
  }
  const int64_t partial = static_cast<int64_t>(blockIdx.x) * teams + team;
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    const int c = (it * threads_per_row + member) * VEC;
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      if (weight_partials != nullptr) {
        weight_partials[partial * cols + c + i] = dw[it][i];
      }
      if (bias_partials != nullptr) {
        bias_partials[partial * cols + c + i] = db[it][i];
      }
    }
  }
}

// Block (32, kColumnSumSlices): threadIdx.x picks one of 32 consecutive
// columns (coalesced reads), threadIdx.y one of kColumnSumSlices interleaved
// row slices, so the hundreds of partial rows are read by many independent
// loads instead of one serial chain per column. The slices are combined in a
// fixed order: the result is deterministic.
constexpr int kColumnSumSlices = 32;

__global__ void __launch_bounds__(32 * kColumnSumSlices)
    AddColumnSumsKernel(const float* __restrict__ partials, int64_t rows,
                        int64_t cols, void* target, int target_dtype) {
  __shared__ float slice_sums[kColumnSumSlices][33];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float sum = 0.0f;
  if (c < cols) {
    int64_t r = threadIdx.y;
    // Four loads in flight per thread before their adds.
    for (; r + 3 * kColumnSumSlices < rows; r += 4 * kColumnSumSlices) {
      const float a = partials[r * cols + c];
      const float b = partials[(r + kColumnSumSlices) * cols + c];
      const float d = partials[(r + 2 * kColumnSumSlices) * cols + c];
      const float e = partials[(r + 3 * kColumnSumSlices) * cols + c];
      sum += (a + b) + (d + e);
    }
    for (; r < rows; r += kColumnSumSlices) sum += partials[r * cols + c];
  }
  slice_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  float total = 0.0f;
  for (int k = 0; k < kColumnSumSlices; ++k)
    total += slice_sums[k][threadIdx.x];
  StoreAny(target, target_dtype, c, LoadAny(target, target_dtype, c) + total);
}

constexpr int kColumnChunkRows = 128;

// partials[chunk, c] = sum of x[r, c] over the chunk's rows. Thread per
// column; a warp reads 32 consecutive elements of a row (coalesced).
template <typename T>
__global__ void ColumnPartialSumsKernel(const T* __restrict__ x, int64_t rows,
                                        int64_t cols, float* partials) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * kColumnChunkRows;
  const int64_t end = min(rows, begin + kColumnChunkRows);
  float sum = 0.0f;
  for (int64_t r = begin; r < end; ++r) sum += ToFloat(x[r * cols + c]);
  partials[static_cast<int64_t>(blockIdx.y) * cols + c] = sum;
}

// ColumnPartialSumsKernel with VEC consecutive columns per thread (16-byte
// loads) and UNROLL rows loaded before they are added. The scalar kernel
// issues a 2-byte load per thread and row, so for bf16 it keeps too few
// bytes in flight to stream the (M, N) gradient at HBM speed; a Linear's
// bias gradient reads all of grad_output (14.5 GB per 1.3B step). Every
// column is still summed over the chunk's rows in ascending order into one
// f32, so the partials are bit-identical to the scalar kernel's.
template <typename T, int VEC, int UNROLL>
__global__ void ColumnPartialSumsVecKernel(const T* __restrict__ x,
                                           int64_t rows, int64_t cols,
                                           float* partials) {
  const int64_t c =
      (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
  if (c >= cols) return;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * kColumnChunkRows;
  const int64_t end = min(rows, begin + kColumnChunkRows);
  float sum[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) sum[k] = 0.0f;
  int64_t r = begin;
  for (; r + UNROLL <= end; r += UNROLL) {
    float v[UNROLL][VEC];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      LoadFloats<T, VEC>(x + (r + u) * cols + c, v[u]);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) sum[k] += v[u][k];
    }
  }
  for (; r < end; ++r) {
    float v[VEC];
    LoadFloats<T, VEC>(x + r * cols + c, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) sum[k] += v[k];
  }
  float* out = partials + static_cast<int64_t>(blockIdx.y) * cols + c;
#pragma unroll
  for (int k = 0; k < VEC; ++k) out[k] = sum[k];
}

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

// ---------------------------------------------------------------- Embedding
__device__ __forceinline__ int64_t ClampToken(int32_t token, int64_t vocab) {
  return token < 0 ? 0 : (token >= vocab ? vocab - 1 : token);
}

template <typename T, int VEC>
__global__ void EmbeddingForwardKernel(const int32_t* __restrict__ tokens,
                                       const T* __restrict__ token_table,
                                       const T* __restrict__ position_table,
                                       T* __restrict__ out, int64_t rows,
                                       int64_t seq_len, int64_t cols,
                                       int64_t vocab) {
  const int64_t chunks = cols / VEC;
  const int64_t idx =
      static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * chunks) return;
  const int64_t row = idx / chunks;
  const int64_t c = (idx % chunks) * VEC;
  const int64_t token = ClampToken(tokens[row], vocab);
  float v[VEC];
  LoadFloats<T, VEC>(token_table + token * cols + c, v);
  if (position_table != nullptr) {
    float p[VEC];
    LoadFloats<T, VEC>(position_table + (row % seq_len) * cols + c, p);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] += p[k];
  }
  StoreFloats<T, VEC>(out + row * cols + c, v);
}

// Thread per (t, c): owns one element of the position gradient.
template <typename T>
__global__ void EmbeddingPositionBackwardKernel(const T* __restrict__ dy,
                                                void* grad, int64_t batch,
                                                int64_t seq_len, int64_t cols,
                                                int grad_dtype) {
  const int64_t idx =
      static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= seq_len * cols) return;
  float sum = 0.0f;
  for (int64_t b = 0; b < batch; ++b)
    sum += ToFloat(dy[b * seq_len * cols + idx]);
  StoreAny(grad, grad_dtype, idx, LoadAny(grad, grad_dtype, idx) + sum);
}

template <typename T>
__global__ void EmbeddingScatterAddKernel(const T* __restrict__ dy,
                                          const int32_t* __restrict__ tokens,
                                          int64_t rows, int64_t cols,
                                          int64_t vocab, float* table) {
  const int64_t idx =
      static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * cols) return;
  const int64_t row = idx / cols;
  const int64_t c = idx % cols;
  const int64_t token = ClampToken(tokens[row], vocab);
  atomicAdd(&table[token * cols + c], ToFloat(dy[idx]));
}

__global__ void MarkTokensKernel(const int32_t* __restrict__ tokens,
                                 int64_t rows, int64_t vocab,
                                 int32_t* touched) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows) touched[ClampToken(tokens[i], vocab)] = 1;
}

// Block per vocabulary row; untouched rows return at once.
__global__ void ZeroTouchedRowsKernel(const int32_t* __restrict__ touched,
                                      int64_t cols, float* scratch) {
  if (touched[blockIdx.x] == 0) return;
  float* row = scratch + static_cast<int64_t>(blockIdx.x) * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) row[c] = 0.0f;
}

__global__ void AddTouchedRowsKernel(const int32_t* __restrict__ touched,
                                     int64_t cols,
                                     const float* __restrict__ scratch,
                                     void* grad, int grad_dtype) {
  if (touched[blockIdx.x] == 0) return;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    StoreAny(grad, grad_dtype, base + c,
             LoadAny(grad, grad_dtype, base + c) + scratch[base + c]);
  }
}

// ------------------------------------------------------------ CrossEntropy
// Online (max, sum of exp) per thread, merged across the block: one read of
// the row computes its logsumexp.
template <typename T, int VEC>
__device__ float RowLogSumExp(const T* row, int64_t vocab, float* scratch) {
  float m = -INFINITY, s = 0.0f;
  const int64_t vec_end = (vocab / VEC) * VEC;
  for (int64_t c = threadIdx.x * VEC; c < vec_end; c += blockDim.x * VEC) {
    float v[VEC];
    LoadFloats<T, VEC>(row + c, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      if (v[k] > m) {
        s = s * __expf(m - v[k]) + 1.0f;
        m = v[k];
      } else {
        s += __expf(v[k] - m);
      }
    }
  }
  for (int64_t c = vec_end + threadIdx.x; c < vocab; c += blockDim.x) {
    const float v = ToFloat(row[c]);
    if (v > m) {
      s = s * __expf(m - v) + 1.0f;
      m = v;
    } else {
      s += __expf(v - m);
    }
  }
  const float block_max = BlockMax(m, scratch);
  const float scaled = m == -INFINITY ? 0.0f : s * __expf(m - block_max);
  const float total = BlockSum(scaled, scratch);
  return block_max + logf(total);
}

template <typename T, int VEC>
__global__ void CrossEntropyForwardKernel(const T* __restrict__ logits,
                                          const int32_t* __restrict__ targets,
                                          float* losses, int64_t vocab) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int32_t target = targets[row];
  if (target < 0) {
    if (threadIdx.x == 0) losses[row] = 0.0f;
    return;
  }
  const T* r = logits + row * vocab;
  const float lse = RowLogSumExp<T, VEC>(r, vocab, scratch);
  if (threadIdx.x == 0) {
    const int64_t t = target >= vocab ? vocab - 1 : target;
    losses[row] = lse - ToFloat(r[t]);
  }
}

// grad may alias logits: every element is read (for the logsumexp) before
// any is written (BlockSum syncs), then read and written by one thread.
template <typename T, int VEC>
__global__ void CrossEntropyBackwardKernel(const T* logits,
                                           const int32_t* __restrict__ targets,
                                           float scale, T* grad,
                                           int64_t vocab) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int32_t target = targets[row];
  const T* r = logits + row * vocab;
  T* g = grad + row * vocab;
  const int64_t vec_end = (vocab / VEC) * VEC;
  if (target < 0) {
    for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
      g[c] = FromFloat<T>(0.0f);
    }
    return;
  }
  const float lse = RowLogSumExp<T, VEC>(r, vocab, scratch);
  for (int64_t c = threadIdx.x * VEC; c < vec_end; c += blockDim.x * VEC) {
    float v[VEC];
    LoadFloats<T, VEC>(r + c, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      v[k] = scale * (__expf(v[k] - lse) - (c + k == target ? 1.0f : 0.0f));
    }
    StoreFloats<T, VEC>(g + c, v);
  }
  for (int64_t c = vec_end + threadIdx.x; c < vocab; c += blockDim.x) {
    const float v = ToFloat(r[c]);
    g[c] =
        FromFloat<T>(scale * (__expf(v - lse) - (c == target ? 1.0f : 0.0f)));
  }
}

int GridFor(int64_t count, int threads) {
  return static_cast<int>((count + threads - 1) / threads);
}

}  // namespace

int LaunchLayerNormForward(const void* x, const void* weight, const void* bias,
                           void* y, float* mean, float* rstd, int64_t rows,
                           int64_t cols, int dtype, void* stream) {
  if (rows == 0) return 0;
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    const bool vec = cols % kVec == 0 && Aligned(x, 16) && Aligned(y, 16) &&
                     Aligned(weight, 16) &&
                     (bias == nullptr || Aligned(bias, 16));
    const int threads = 256;
    const int grid = GridFor(rows, threads / 32);
    auto s = static_cast<cudaStream_t>(stream);
    if (vec) {
      LayerNormForwardKernel<T, kVec><<<grid, threads, 0, s>>>(
          static_cast<const T*>(x), static_cast<const T*>(weight),
          static_cast<const T*>(bias), static_cast<T*>(y), mean, rstd, rows,
          static_cast<int>(cols));
    } else {
      LayerNormForwardKernel<T, 1><<<grid, threads, 0, s>>>(
          static_cast<const T*>(x), static_cast<const T*>(weight),
          static_cast<const T*>(bias), static_cast<T*>(y), mean, rstd, rows,
          static_cast<int>(cols));
    }
    return LastError();
  });
}

namespace {

// How LaunchLayerNormBackward splits the rows. The team kernel needs whole
// 16-byte vectors per thread and teams of whole warps of at most 256
// threads; other shapes take the warp-per-row kernel, which accepts any grid
// size, so the partial count never depends on pointer alignment (checked only
// at launch).
struct LayerNormBackwardPlan {
  bool team = false;
  int items = 1;            // vectors per thread per row
  int threads_per_row = 0;  // team size
  int teams = 1;            // teams (rows in flight) per block
  int grid = 1;
  int partials = 1;  // grid * teams (team kernel) or grid (warp per row)
};

LayerNormBackwardPlan PlanLayerNormBackward(int64_t rows, int64_t cols,
                                            int dtype) {
  LayerNormBackwardPlan plan;
  const int elem = dtype == kF32 ? 4 : 2;
  const int vec = 16 / elem;
  for (int items = 1; items <= 2; items *= 2) {
    const int64_t width = static_cast<int64_t>(vec) * items;
    if (cols % (32 * width) != 0 || cols / width > 256) continue;
    plan.team = true;
    plan.items = items;
    plan.threads_per_row = static_cast<int>(cols / width);
    plan.teams = 256 / plan.threads_per_row;
    break;
  }
  if (plan.team) {
    // As many blocks as __launch_bounds__ guarantees resident per SM (4 for
    // one vector per thread, 2 for two): about 32 KB of loads in flight per
    // SM, what HBM3e needs to stream, for ~528 partial rows.
    const int per_sm = plan.items == 1 ? 4 : 2;
    const int64_t needed = (rows + plan.teams - 1) / plan.teams;
    plan.grid = static_cast<int>(
        std::max<int64_t>(1, std::min<int64_t>(needed, per_sm * NumSms())));
    plan.partials = plan.grid * plan.teams;
  } else {
    const int64_t warps_per_block = 8;
    const int64_t needed = (rows + warps_per_block - 1) / warps_per_block;
    plan.grid = static_cast<int>(
        std::max<int64_t>(1, std::min<int64_t>(needed, 2 * NumSms())));
    plan.partials = plan.grid;
  }
  return plan;
}

}  // namespace

int LayerNormBackwardNumPartials(int64_t rows, int64_t cols, int dtype) {
  return PlanLayerNormBackward(rows, cols, dtype).partials;
}

int LaunchLayerNormBackward(const void* dy, const void* x, const void* weight,
                            const float* mean, const float* rstd, void* dx,
                            float* weight_partials, float* bias_partials,
                            int64_t rows, int64_t cols, int dtype, void* stream,
                            const void* dx_addend) {
  if (rows == 0) return 0;
  if (dx_addend != nullptr && (dx == nullptr || dx_addend == dx)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const LayerNormBackwardPlan plan = PlanLayerNormBackward(rows, cols, dtype);
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    const bool vec = cols % kVec == 0 && Aligned(dy, 16) && Aligned(x, 16) &&
                     Aligned(weight, 16) &&
                     (dx == nullptr || Aligned(dx, 16)) &&
                     (dx_addend == nullptr || Aligned(dx_addend, 16));
    auto s = static_cast<cudaStream_t>(stream);
    if (plan.team && vec) {
      const int threads = plan.teams * plan.threads_per_row;
      auto launch = [&](auto kernel) {
        kernel<<<plan.grid, threads, 0, s>>>(
            static_cast<const T*>(dy), static_cast<const T*>(x),
            static_cast<const T*>(weight), mean, rstd, static_cast<T*>(dx),
            static_cast<const T*>(dx_addend), weight_partials, bias_partials,
            rows, static_cast<int>(cols), plan.threads_per_row);
      };
      if (plan.items == 1) {
        launch(LayerNormBackwardTeamKernel<T, kVec, 1>);
      } else {
        launch(LayerNormBackwardTeamKernel<T, kVec, 2>);
      }
      return LastError();
    }
    // Warp-per-row kernel: one partial row per block, any grid size.
    const int threads = 256;
    const size_t shared = 2 * cols * sizeof(float);
    auto launch = [&](auto kernel) {
      if (shared > 48 * 1024) {
        cudaFuncSetAttribute(kernel,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(shared));
      }
      kernel<<<plan.partials, threads, shared, s>>>(
          static_cast<const T*>(dy), static_cast<const T*>(x),
          static_cast<const T*>(weight), mean, rstd, static_cast<T*>(dx),
          static_cast<const T*>(dx_addend), weight_partials, bias_partials,
          rows, static_cast<int>(cols));
    };
    if (vec) {
      launch(LayerNormBackwardKernel<T, kVec>);
    } else {
      launch(LayerNormBackwardKernel<T, 1>);
    }
    return LastError();
  });
}

int LaunchAddColumnSums(const float* partials, int64_t rows, int64_t cols,
                        void* target, int target_dtype, void* stream) {
  if (cols == 0) return 0;
  AddColumnSumsKernel<<<GridFor(cols, 32), dim3(32, kColumnSumSlices), 0,
                        static_cast<cudaStream_t>(stream)>>>(
      partials, rows, cols, target, target_dtype);
  return LastError();
}

int ColumnPartialSumsCount(int64_t rows) {
  return static_cast<int>(
      std::max<int64_t>(1, (rows + kColumnChunkRows - 1) / kColumnChunkRows));
}

int LaunchColumnPartialSums(const void* x, int64_t rows, int64_t cols,
                            int dtype, float* partials, void* stream) {
  if (cols == 0) return 0;
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    auto s = static_cast<cudaStream_t>(stream);
    if (cols % kVec == 0 && Aligned(x, 16)) {
      // 128 threads: at N = 2048 (bf16) that is still 2 x 128 blocks.
      constexpr int kThreads = 128;
      const dim3 grid(GridFor(cols / kVec, kThreads),
                      ColumnPartialSumsCount(rows));
      ColumnPartialSumsVecKernel<T, kVec, 8><<<grid, kThreads, 0, s>>>(
          static_cast<const T*>(x), rows, cols, partials);
      return LastError();
    }
    const dim3 grid(GridFor(cols, 256), ColumnPartialSumsCount(rows));
    ColumnPartialSumsKernel<T>
        <<<grid, 256, 0, s>>>(static_cast<const T*>(x), rows, cols, partials);
    return LastError();
  });
}

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

int LaunchEmbeddingForward(const int32_t* tokens, const void* token_table,
                           const void* position_table, void* out, int64_t batch,
                           int64_t seq_len, int64_t cols, int64_t vocab,
                           int dtype, void* stream) {
  const int64_t rows = batch * seq_len;
  if (rows == 0 || cols == 0) return 0;
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    auto s = static_cast<cudaStream_t>(stream);
    const bool vec = cols % kVec == 0 && Aligned(token_table, 16) &&
                     Aligned(out, 16) &&
                     (position_table == nullptr || Aligned(position_table, 16));
    if (vec) {
      EmbeddingForwardKernel<T, kVec>
          <<<GridFor(rows * cols / kVec, 256), 256, 0, s>>>(
              tokens, static_cast<const T*>(token_table),
              static_cast<const T*>(position_table), static_cast<T*>(out), rows,
              seq_len, cols, vocab);
    } else {
      EmbeddingForwardKernel<T, 1><<<GridFor(rows * cols, 256), 256, 0, s>>>(
          tokens, static_cast<const T*>(token_table),
          static_cast<const T*>(position_table), static_cast<T*>(out), rows,
          seq_len, cols, vocab);
    }
    return LastError();
  });
}

int LaunchEmbeddingPositionBackward(const void* dy, void* grad_position_table,
                                    int64_t batch, int64_t seq_len,
                                    int64_t cols, int dtype, int grad_dtype,
                                    void* stream) {
  if (seq_len * cols == 0) return 0;
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    EmbeddingPositionBackwardKernel<T><<<GridFor(seq_len * cols, 256), 256, 0,
                                         static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(dy), grad_position_table, batch, seq_len, cols,
        grad_dtype);
    return LastError();
  });
}

int LaunchEmbeddingScatterAddF32(const void* dy, int dtype,
                                 const int32_t* tokens, int64_t rows,
                                 int64_t cols, int64_t vocab,
                                 float* grad_token_table, void* stream) {
  if (rows * cols == 0) return 0;
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    EmbeddingScatterAddKernel<T><<<GridFor(rows * cols, 256), 256, 0,
                                   static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(dy), tokens, rows, cols, vocab, grad_token_table);
    return LastError();
  });
}

int LaunchEmbeddingScatterAddViaScratch(const void* dy, int dtype,
                                        const int32_t* tokens, int64_t rows,
                                        int64_t cols, int64_t vocab,
                                        int32_t* touched, float* scratch,
                                        void* grad_token_table, int grad_dtype,
                                        void* stream) {
  if (rows * cols == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  MarkTokensKernel<<<GridFor(rows, 256), 256, 0, s>>>(tokens, rows, vocab,
                                                      touched);
  ZeroTouchedRowsKernel<<<static_cast<unsigned>(vocab), 256, 0, s>>>(
      touched, cols, scratch);
  const int error = LaunchEmbeddingScatterAddF32(dy, dtype, tokens, rows, cols,
                                                 vocab, scratch, stream);
  if (error != 0) return error;
  AddTouchedRowsKernel<<<static_cast<unsigned>(vocab), 256, 0, s>>>(
      touched, cols, scratch, grad_token_table, grad_dtype);
  return LastError();
}

int LaunchCrossEntropyForward(const void* logits, const int32_t* targets,
                              float* losses, int64_t rows, int64_t vocab,
                              int dtype, void* stream) {
  if (rows == 0) return 0;
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    auto s = static_cast<cudaStream_t>(stream);
    if (vocab % kVec == 0 && Aligned(logits, 16)) {
      CrossEntropyForwardKernel<T, kVec>
          <<<static_cast<unsigned>(rows), 512, 0, s>>>(
              static_cast<const T*>(logits), targets, losses, vocab);
    } else {
      CrossEntropyForwardKernel<T, 1>
          <<<static_cast<unsigned>(rows), 512, 0, s>>>(
              static_cast<const T*>(logits), targets, losses, vocab);
    }
    return LastError();
  });
}

int LaunchCrossEntropyBackward(const void* logits, const int32_t* targets,
                               float scale, void* grad, int64_t rows,
                               int64_t vocab, int dtype, void* stream) {
  if (rows == 0) return 0;
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    auto s = static_cast<cudaStream_t>(stream);
    if (vocab % kVec == 0 && Aligned(logits, 16) && Aligned(grad, 16)) {
      CrossEntropyBackwardKernel<T, kVec>
          <<<static_cast<unsigned>(rows), 512, 0, s>>>(
              static_cast<const T*>(logits), targets, scale,
              static_cast<T*>(grad), vocab);
    } else {
      CrossEntropyBackwardKernel<T, 1>
          <<<static_cast<unsigned>(rows), 512, 0, s>>>(
              static_cast<const T*>(logits), targets, scale,
              static_cast<T*>(grad), vocab);
    }
    return LastError();
  });
}

}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze
