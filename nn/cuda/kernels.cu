// LayerNorm, GELU, embedding, cross-entropy and column-sum kernels. All
// arithmetic in f32; inputs and outputs in the tensors' storage dtype.
#include <cuda_runtime.h>

#include <algorithm>

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
    const float* __restrict__ rstd, T* __restrict__ dx, float* weight_partials,
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

__global__ void AddColumnSumsKernel(const float* __restrict__ partials,
                                    int64_t rows, int64_t cols, void* target,
                                    int target_dtype) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float sum = 0.0f;
  for (int64_t r = 0; r < rows; ++r) sum += partials[r * cols + c];
  StoreAny(target, target_dtype, c, LoadAny(target, target_dtype, c) + sum);
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

int LayerNormBackwardNumPartials(int64_t rows) {
  const int64_t warps_per_block = 8;
  const int64_t needed = (rows + warps_per_block - 1) / warps_per_block;
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(needed, 2 * NumSms())));
}

int LaunchLayerNormBackward(const void* dy, const void* x, const void* weight,
                            const float* mean, const float* rstd, void* dx,
                            float* weight_partials, float* bias_partials,
                            int64_t rows, int64_t cols, int dtype,
                            void* stream) {
  if (rows == 0) return 0;
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    const bool vec = cols % kVec == 0 && Aligned(dy, 16) && Aligned(x, 16) &&
                     Aligned(weight, 16) && (dx == nullptr || Aligned(dx, 16));
    const int threads = 256;
    const int grid = LayerNormBackwardNumPartials(rows);
    const size_t shared = 2 * cols * sizeof(float);
    auto s = static_cast<cudaStream_t>(stream);
    auto launch = [&](auto kernel) {
      if (shared > 48 * 1024) {
        cudaFuncSetAttribute(kernel,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(shared));
      }
      kernel<<<grid, threads, shared, s>>>(
          static_cast<const T*>(dy), static_cast<const T*>(x),
          static_cast<const T*>(weight), mean, rstd, static_cast<T*>(dx),
          weight_partials, bias_partials, rows, static_cast<int>(cols));
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
  AddColumnSumsKernel<<<GridFor(cols, 256), 256, 0,
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
    const dim3 grid(GridFor(cols, 256), ColumnPartialSumsCount(rows));
    ColumnPartialSumsKernel<T>
        <<<grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<const T*>(x), rows, cols, partials);
    return LastError();
  });
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
