// The decoder's elementwise and row-wise kernels (nn/cuda/decoder_kernels.h):
// RMSNorm, rotate-half RoPE, SwiGLU, and the grouped-query KV-cache write and
// decoding attention. All arithmetic in f32; storage dtype I/O. Each
// computes what nn/functional_cpu.cc computes, in the same order of f32
// operations where that order is visible in the rounding (the RoPE angle,
// RMSNorm's weight * (x * rstd)).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <type_traits>

#include "nn/cuda/cuda_common.cuh"
#include "nn/cuda/decoder_kernels.h"
#include "nn/cuda/kernels.h"
#include "nn/cuda/kernels_common.cuh"

namespace ze {
namespace nn {
namespace cuda_kernels {
namespace {

// ------------------------------------------------------------------ RMSNorm
// One warp per row (8 per block): the row is read twice (sum of squares,
// output), the second time from L1/L2.
constexpr int kRowWarps = 8;

template <typename T, int VEC>
__global__ void __launch_bounds__(kRowWarps * 32)
    RmsNormForwardKernel(const T* __restrict__ x, const T* __restrict__ weight,
                         T* __restrict__ y, float* __restrict__ rstd_out,
                         int64_t rows, int cols, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * kRowWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T* xr = x + row * cols;
  float squares = 0.0f;
  for (int c = lane * VEC; c < cols; c += 32 * VEC) {
    float v[VEC];
    LoadFloats<T, VEC>(xr + c, v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) squares += v[i] * v[i];
  }
  // Hugging Face's LlamaRMSNorm: the f32 mean of squares plus eps, then
  // rsqrt (here an IEEE square root and division, as the CPU's).
  const float variance = WarpSum(squares) / static_cast<float>(cols);
  const float rstd = 1.0f / sqrtf(variance + eps);
  T* yr = y + row * cols;
  for (int c = lane * VEC; c < cols; c += 32 * VEC) {
    float v[VEC], w[VEC], out[VEC];
    LoadFloats<T, VEC>(xr + c, v);
    LoadFloats<T, VEC>(weight + c, w);
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = w[i] * (v[i] * rstd);
    StoreFloats<T, VEC>(yr + c, out);
  }
  if (lane == 0 && rstd_out != nullptr) rstd_out[row] = rstd;
}

// dx may alias dy: each element is read, by the lane that writes it, before
// it is written.
template <typename T, int VEC>
__global__ void __launch_bounds__(kRowWarps * 32)
    RmsNormBackwardKernel(const T* dy, const T* __restrict__ x,
                          const T* __restrict__ weight,
                          const float* __restrict__ rstd, const T* addend,
                          T* dx, int64_t rows, int cols) {
  const int lane = threadIdx.x & 31;
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * kRowWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T* dyr = dy + row * cols;
  const T* xr = x + row * cols;
  const float r = rstd[row];
  float dot = 0.0f;  // sum of dxhat * xhat
  for (int c = lane * VEC; c < cols; c += 32 * VEC) {
    float g[VEC], v[VEC], w[VEC];
    LoadFloats<T, VEC>(dyr + c, g);
    LoadFloats<T, VEC>(xr + c, v);
    LoadFloats<T, VEC>(weight + c, w);
#pragma unroll
    for (int i = 0; i < VEC; ++i) dot += (g[i] * w[i]) * (v[i] * r);
  }
  const float mean_dot = WarpSum(dot) / static_cast<float>(cols);
  T* dxr = dx + row * cols;
  for (int c = lane * VEC; c < cols; c += 32 * VEC) {
    float g[VEC], v[VEC], w[VEC], out[VEC];
    LoadFloats<T, VEC>(dyr + c, g);
    LoadFloats<T, VEC>(xr + c, v);
    LoadFloats<T, VEC>(weight + c, w);
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      out[i] = r * (g[i] * w[i] - v[i] * r * mean_dot);
    }
    if (addend != nullptr) {
      float a[VEC];
      LoadFloats<T, VEC>(addend + row * cols + c, a);
#pragma unroll
      for (int i = 0; i < VEC; ++i) out[i] += a[i];
    }
    StoreFloats<T, VEC>(dxr + c, out);
  }
}

// grid (columns / 256, chunks): thread per column, summing its chunk's
// kColumnChunkRows rows in row order (coalesced across the block, and the
// same order every run: no atomics).
template <typename T>
__global__ void RmsNormWeightPartialsKernel(const T* __restrict__ dy,
                                            const T* __restrict__ x,
                                            const float* __restrict__ rstd,
                                            float* __restrict__ partials,
                                            int64_t rows, int64_t cols) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * kColumnChunkRows;
  const int64_t last =
      rows < first + kColumnChunkRows ? rows : first + kColumnChunkRows;
  float sum = 0.0f;
  for (int64_t row = first; row < last; ++row) {
    sum +=
        ToFloat(dy[row * cols + c]) * (ToFloat(x[row * cols + c]) * rstd[row]);
  }
  partials[static_cast<int64_t>(blockIdx.y) * cols + c] = sum;
}

// --------------------------------------------------------------------- RoPE
// Thread per (token, i < D / 2): one angle, its cos and sin, applied to
// pair (i, i + D / 2) of every head of the token (consecutive threads touch
// consecutive elements of a head). y may alias x: each pair is read before
// the same thread writes it.
template <typename T>
__global__ void RotaryKernel(const T* x, const float* __restrict__ inv_freq,
                             const int32_t* __restrict__ starts, T* y,
                             int64_t tokens, int64_t seq_len, int heads,
                             int half, bool inverse) {
  const int64_t idx =
      static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= tokens * half) return;
  const int64_t token = idx / half;  // b * T + t
  const int i = static_cast<int>(idx % half);
  const int64_t b = token / seq_len, t = token % seq_len;
  const int64_t position = (starts != nullptr ? starts[b] : 0) + t;
  // As transformers (and the CPU op): the f32 product, then cos and sin of
  // it in f32 (sincosf, not the intrinsic: large angles stay accurate).
  const float angle = inv_freq[i] * static_cast<float>(position);
  float sine, cosine;
  sincosf(angle, &sine, &cosine);
  if (inverse) sine = -sine;
  const int64_t head_dim = 2 * static_cast<int64_t>(half);
  for (int h = 0; h < heads; ++h) {
    const int64_t offset = (token * heads + h) * head_dim + i;
    const float x1 = ToFloat(x[offset]), x2 = ToFloat(x[offset + half]);
    y[offset] = FromFloat<T>(x1 * cosine - x2 * sine);
    y[offset + half] = FromFloat<T>(x2 * cosine + x1 * sine);
  }
}

// ------------------------------------------------------------------- SwiGLU
__device__ __forceinline__ float Sigmoid(float v) {
  return 1.0f / (1.0f + expf(-v));
}

// Thread per VEC consecutive elements (one 16-byte access per operand when
// VEC > 1: the launcher picks VEC = 1 for misaligned or ragged tensors),
// grid-striding over count / VEC groups.
template <typename T, int VEC>
__global__ void SwiGluForwardKernel(const T* __restrict__ gate,
                                    const T* __restrict__ up, T* __restrict__ y,
                                    int64_t groups) {
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       g < groups; g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = g * VEC;
    float a[VEC], u[VEC], out[VEC];
    LoadFloats<T, VEC>(gate + i, a);
    LoadFloats<T, VEC>(up + i, u);
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] = (a[j] * Sigmoid(a[j])) * u[j];
    StoreFloats<T, VEC>(y + i, out);
  }
}

// dgate may be gate and dup up (in place: a thread loads its group of
// every input before it stores either output), so no __restrict__ there.
template <typename T, int VEC>
__global__ void SwiGluBackwardKernel(const T* __restrict__ dy, const T* gate,
                                     const T* up, T* dgate, T* dup,
                                     int64_t groups) {
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       g < groups; g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = g * VEC;
    float a[VEC], d[VEC], u[VEC], out_gate[VEC], out_up[VEC];
    LoadFloats<T, VEC>(gate + i, a);
    LoadFloats<T, VEC>(dy + i, d);
    if (dgate != nullptr) LoadFloats<T, VEC>(up + i, u);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float s = Sigmoid(a[j]);
      // silu(a) = a s; silu'(a) = s (1 + a (1 - s)).
      if (dgate != nullptr) {
        out_gate[j] = d[j] * u[j] * (s * (1.0f + a[j] * (1.0f - s)));
      }
      out_up[j] = d[j] * (a[j] * s);
    }
    if (dgate != nullptr) StoreFloats<T, VEC>(dgate + i, out_gate);
    if (dup != nullptr) StoreFloats<T, VEC>(dup + i, out_up);
  }
}

int ElementwiseGrid(int64_t count) {
  return static_cast<int>(std::min<int64_t>(
      GridFor(count, 256), 16 * static_cast<int64_t>(NumSms())));
}

// ----------------------------------------------- Packed-layout adapters
// Thread per VEC consecutive elements of the packed (tokens, 3, Hq, D)
// (VEC divides D, so a group lies inside one head; the launcher picks
// VEC = 1 when it does not or a pointer is misaligned). One 64-bit division
// per group, the rest in 32 bits: the packing is a copy and must run at
// memory speed.
template <typename T, int VEC>
__global__ void PackGroupedQkvKernel(const T* __restrict__ q,
                                     const T* __restrict__ k,
                                     const T* __restrict__ v,
                                     T* __restrict__ qkv, int64_t tokens,
                                     int q_heads, int kv_heads, int head_dim) {
  const int channels = q_heads * head_dim;
  const int groups_per_token = 3 * channels / VEC;
  const int64_t idx =
      static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= tokens * groups_per_token) return;
  const int64_t token = idx / groups_per_token;
  const int within = static_cast<int>(idx - token * groups_per_token) * VEC;
  const int part = within / channels;
  const int c = within - part * channels;
  const T* source;
  if (part == 0) {
    source = q + token * channels + c;
  } else {
    const int h = c / head_dim, d = c - h * head_dim;
    const int kv = h / (q_heads / kv_heads);
    source = (part == 1 ? k : v) +
             (token * kv_heads + kv) * static_cast<int64_t>(head_dim) + d;
  }
  *reinterpret_cast<Pack<T, VEC>*>(qkv + idx * VEC) =
      *reinterpret_cast<const Pack<T, VEC>*>(source);
}

// Thread per VEC consecutive elements of dq (tokens, Hq, D) and of dk
// (tokens, Hkv, D) (dv alongside dk), as PackGroupedQkvKernel's groups; dk
// and dv sum the group's query heads in head order.
template <typename T, int VEC>
__global__ void UnpackGroupedQkvGradKernel(const T* __restrict__ dqkv,
                                           T* __restrict__ dq,
                                           T* __restrict__ dk,
                                           T* __restrict__ dv, int64_t tokens,
                                           int q_heads, int kv_heads,
                                           int head_dim) {
  const int channels = q_heads * head_dim;
  const int kv_channels = kv_heads * head_dim;
  const int64_t idx =
      static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t q_groups = tokens * (channels / VEC);
  if (idx < q_groups) {
    const int64_t token = idx / (channels / VEC);
    const int c = static_cast<int>(idx - token * (channels / VEC)) * VEC;
    *reinterpret_cast<Pack<T, VEC>*>(dq + idx * VEC) =
        *reinterpret_cast<const Pack<T, VEC>*>(dqkv + token * 3 * channels + c);
    return;
  }
  const int64_t i = idx - q_groups;
  if (i >= tokens * (kv_channels / VEC)) return;
  const int64_t token = i / (kv_channels / VEC);
  const int c = static_cast<int>(i - token * (kv_channels / VEC)) * VEC;
  const int kv = c / head_dim, d = c - kv * head_dim;
  const int group = q_heads / kv_heads;
  const T* row = dqkv + token * 3 * channels;
  float key_sum[VEC] = {}, value_sum[VEC] = {};
  for (int g = 0; g < group; ++g) {
    const int c_q = (kv * group + g) * head_dim + d;
    float key[VEC], value[VEC];
    LoadFloats<T, VEC>(row + channels + c_q, key);
    LoadFloats<T, VEC>(row + 2 * channels + c_q, value);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      key_sum[j] += key[j];
      value_sum[j] += value[j];
    }
  }
  StoreFloats<T, VEC>(dk + i * VEC, key_sum);
  StoreFloats<T, VEC>(dv + i * VEC, value_sum);
}

// ---------------------------------------------------------------- KV cache
constexpr int kDecodeWarps = 4;
constexpr int kMaxPerLane = kMaxCachedAttentionHeadDim / 32;

// Whether entry i addresses positions [start, start + seq_len) of a row of
// the cache (kv_cache.cu's rule).
__device__ __forceinline__ bool ValidSlot(int32_t row, int32_t start,
                                          int64_t seq_len, int64_t batch,
                                          int64_t capacity) {
  return row >= 0 && row < batch && start >= 0 && start + seq_len <= capacity;
}

// Thread per element of k (N, T, Hkv, D): moves it and v's.
template <typename T>
__global__ void GroupedKvCacheWriteKernel(
    const T* __restrict__ k, const T* __restrict__ v,
    const int32_t* __restrict__ rows, const int32_t* __restrict__ starts,
    T* __restrict__ key_cache, T* __restrict__ value_cache, int64_t n,
    int64_t seq_len, int kv_heads, int head_dim, int64_t batch,
    int64_t capacity) {
  const int64_t channels = static_cast<int64_t>(kv_heads) * head_dim;
  const int64_t idx =
      static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * seq_len * channels) return;
  const int64_t token = idx / channels;  // i * T + t
  const int64_t c = idx % channels;
  const int64_t i = token / seq_len, t = token % seq_len;
  const int32_t row = rows[i], start = starts[i];
  if (!ValidSlot(row, start, seq_len, batch, capacity)) return;
  const int64_t h = c / head_dim, d = c % head_dim;
  const int64_t target =
      ((row * static_cast<int64_t>(kv_heads) + h) * capacity + start + t) *
          head_dim +
      d;
  key_cache[target] = k[idx];
  value_cache[target] = v[idx];
}

// kv_cache.cu's flash-decoding loop with the grouped head mapping: block per
// (query token, query head), kDecodeWarps warps each running an online
// softmax over every kDecodeWarps-th key, merged through shared memory; a
// lane holds dimensions lane, lane + 32, ...
template <typename T>
__global__ void __launch_bounds__(kDecodeWarps * 32)
    GroupedCachedAttentionKernel(const T* __restrict__ q,
                                 const int32_t* __restrict__ rows,
                                 const int32_t* __restrict__ starts,
                                 const T* __restrict__ key_cache,
                                 const T* __restrict__ value_cache,
                                 T* __restrict__ out, int64_t seq_len,
                                 int q_heads, int kv_heads, int head_dim,
                                 int64_t batch, int64_t capacity, float scale) {
  __shared__ float warp_max[kDecodeWarps];
  __shared__ float warp_sum[kDecodeWarps];
  __shared__ float warp_acc[kDecodeWarps][kMaxCachedAttentionHeadDim];
  const int64_t token = blockIdx.x;  // i * T + t
  const int h = blockIdx.y;
  const int kv = h / (q_heads / kv_heads);
  const int64_t i = token / seq_len, t = token % seq_len;
  const int32_t row = rows[i], start = starts[i];
  if (!ValidSlot(row, start, seq_len, batch, capacity)) return;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t keys = start + t + 1;  // causal: positions [0, start + t]
  const int64_t q_offset =
      (token * q_heads + h) * static_cast<int64_t>(head_dim);

  float qv[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int d = lane + 32 * e;
    qv[e] = d < head_dim ? ToFloat(q[q_offset + d]) * scale : 0.0f;
    acc[e] = 0.0f;
  }
  const int64_t block =
      (static_cast<int64_t>(row) * kv_heads + kv) * capacity * head_dim;
  const T* k_block = key_cache + block;
  const T* v_block = value_cache + block;
  float running_max = -INFINITY, running_sum = 0.0f;
  for (int64_t j = warp; j < keys; j += kDecodeWarps) {
    const T* k_row = k_block + j * head_dim;
    float score = 0.0f;
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int d = lane + 32 * e;
      if (d < head_dim) score += qv[e] * ToFloat(k_row[d]);
    }
    score = WarpSum(score);
    const float new_max = fmaxf(running_max, score);
    // running_max is -inf only before the first key: the factor is then 0.
    const float correction = expf(running_max - new_max);
    const float p = expf(score - new_max);
    running_sum = running_sum * correction + p;
    const T* v_row = v_block + j * head_dim;
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int d = lane + 32 * e;
      if (d < head_dim) acc[e] = acc[e] * correction + p * ToFloat(v_row[d]);
    }
    running_max = new_max;
  }
  if (lane == 0) {
    warp_max[warp] = running_max;
    warp_sum[warp] = running_sum;
  }
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int d = lane + 32 * e;
    if (d < head_dim) warp_acc[warp][d] = acc[e];
  }
  __syncthreads();
  // Key 0 always exists, so warp 0's maximum is finite; a warp that saw no
  // key (max -inf) weighs 0.
  float global_max = warp_max[0];
#pragma unroll
  for (int w = 1; w < kDecodeWarps; ++w) {
    global_max = fmaxf(global_max, warp_max[w]);
  }
  float weight[kDecodeWarps];
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kDecodeWarps; ++w) {
    weight[w] = expf(warp_max[w] - global_max);
    total += warp_sum[w] * weight[w];
  }
  const float inverse_total = 1.0f / total;
  T* o = out + q_offset;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float value = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) value += warp_acc[w][d] * weight[w];
    o[d] = FromFloat<T>(value * inverse_total);
  }
}

}  // namespace

int LaunchRmsNormForward(const void* x, const void* weight, void* y,
                         float* rstd, int64_t rows, int64_t cols, float eps,
                         int dtype, void* stream) {
  if (rows == 0) return 0;
  if (cols <= 0 || cols > (int64_t{1} << 30)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const int grid = GridFor(rows, kRowWarps);
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    auto s = static_cast<cudaStream_t>(stream);
    const int c = static_cast<int>(cols);
    if (cols % kVec == 0 && Aligned(x, 16) && Aligned(weight, 16) &&
        Aligned(y, 16)) {
      RmsNormForwardKernel<T, kVec><<<grid, kRowWarps * 32, 0, s>>>(
          static_cast<const T*>(x), static_cast<const T*>(weight),
          static_cast<T*>(y), rstd, rows, c, eps);
    } else {
      RmsNormForwardKernel<T, 1><<<grid, kRowWarps * 32, 0, s>>>(
          static_cast<const T*>(x), static_cast<const T*>(weight),
          static_cast<T*>(y), rstd, rows, c, eps);
    }
    return LastError();
  });
}

int LaunchRmsNormBackward(const void* dy, const void* x, const void* weight,
                          const float* rstd, const void* addend, void* dx,
                          int64_t rows, int64_t cols, int dtype, void* stream) {
  if (rows == 0) return 0;
  if (cols <= 0 || cols > (int64_t{1} << 30)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const int grid = GridFor(rows, kRowWarps);
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    auto s = static_cast<cudaStream_t>(stream);
    const int c = static_cast<int>(cols);
    const T* add = static_cast<const T*>(addend);
    if (cols % kVec == 0 && Aligned(dy, 16) && Aligned(x, 16) &&
        Aligned(weight, 16) && Aligned(dx, 16) &&
        (addend == nullptr || Aligned(addend, 16))) {
      RmsNormBackwardKernel<T, kVec><<<grid, kRowWarps * 32, 0, s>>>(
          static_cast<const T*>(dy), static_cast<const T*>(x),
          static_cast<const T*>(weight), rstd, add, static_cast<T*>(dx), rows,
          c);
    } else {
      RmsNormBackwardKernel<T, 1><<<grid, kRowWarps * 32, 0, s>>>(
          static_cast<const T*>(dy), static_cast<const T*>(x),
          static_cast<const T*>(weight), rstd, add, static_cast<T*>(dx), rows,
          c);
    }
    return LastError();
  });
}

int LaunchRmsNormWeightPartials(const void* dy, const void* x,
                                const float* rstd, float* partials,
                                int64_t rows, int64_t cols, int dtype,
                                void* stream) {
  if (cols == 0) return 0;
  const int chunks = ColumnPartialSumsCount(rows);
  if (chunks > 65535) return static_cast<int>(cudaErrorInvalidValue);
  const dim3 grid(GridFor(cols, 256), chunks);
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    RmsNormWeightPartialsKernel<T>
        <<<grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<const T*>(dy), static_cast<const T*>(x), rstd, partials,
            rows, cols);
    return LastError();
  });
}

int LaunchRotaryEmbedding(const void* x, const float* inv_freq,
                          const int32_t* starts, void* y, int64_t batch,
                          int64_t seq_len, int64_t heads, int64_t head_dim,
                          bool inverse, int dtype, void* stream) {
  const int64_t tokens = batch * seq_len;
  const int64_t half = head_dim / 2;
  if (tokens == 0 || heads == 0 || half == 0) return 0;
  if (head_dim % 2 != 0 || heads > (int64_t{1} << 30) ||
      half > (int64_t{1} << 30)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    RotaryKernel<T><<<GridFor(tokens * half, 256), 256, 0,
                      static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(x), inv_freq, starts, static_cast<T*>(y), tokens,
        seq_len, static_cast<int>(heads), static_cast<int>(half), inverse);
    return LastError();
  });
}

// The widest group (16 bytes of T) every pointer's alignment and `count`
// allow, else 1.
template <typename T>
bool Vectorizable(int64_t count, std::initializer_list<const void*> pointers) {
  constexpr int kVec = 16 / sizeof(T);
  if (count % kVec != 0) return false;
  for (const void* p : pointers) {
    if (p != nullptr && !Aligned(p, 16)) return false;
  }
  return true;
}

// Calls launch(std::integral_constant<int, VEC>()) with VEC = 16 bytes of
// T when `wide`, else 1, so one launch statement serves both of a kernel's
// instantiations.
template <typename T, typename Launch>
void WithGroupWidth(bool wide, Launch&& launch) {
  if (wide) {
    launch(std::integral_constant<int, 16 / sizeof(T)>());
  } else {
    launch(std::integral_constant<int, 1>());
  }
}

int LaunchSwiGluForward(const void* gate, const void* up, void* y,
                        int64_t count, int dtype, void* stream) {
  if (count == 0) return 0;
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    WithGroupWidth<T>(Vectorizable<T>(count, {gate, up, y}), [&](auto vec) {
      constexpr int kVec = decltype(vec)::value;
      SwiGluForwardKernel<T, kVec><<<ElementwiseGrid(count / kVec), 256, 0,
                                     static_cast<cudaStream_t>(stream)>>>(
          static_cast<const T*>(gate), static_cast<const T*>(up),
          static_cast<T*>(y), count / kVec);
    });
    return LastError();
  });
}

int LaunchSwiGluBackward(const void* dy, const void* gate, const void* up,
                         void* dgate, void* dup, int64_t count, int dtype,
                         void* stream) {
  if (count == 0 || (dgate == nullptr && dup == nullptr)) return 0;
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    WithGroupWidth<T>(
        Vectorizable<T>(count, {dy, gate, up, dgate, dup}), [&](auto vec) {
          constexpr int kVec = decltype(vec)::value;
          SwiGluBackwardKernel<T, kVec><<<ElementwiseGrid(count / kVec), 256, 0,
                                          static_cast<cudaStream_t>(stream)>>>(
              static_cast<const T*>(dy), static_cast<const T*>(gate),
              static_cast<const T*>(up), static_cast<T*>(dgate),
              static_cast<T*>(dup), count / kVec);
        });
    return LastError();
  });
}

int LaunchPackGroupedQkv(const void* q, const void* k, const void* v, void* qkv,
                         int64_t tokens, int q_heads, int kv_heads,
                         int head_dim, int dtype, void* stream) {
  const int64_t count = tokens * 3 * q_heads * head_dim;
  if (count == 0) return 0;
  if (kv_heads < 1 || q_heads % kv_heads != 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    WithGroupWidth<T>(Vectorizable<T>(head_dim, {q, k, v, qkv}), [&](auto vec) {
      constexpr int kVec = decltype(vec)::value;
      PackGroupedQkvKernel<T, kVec><<<GridFor(count / kVec, 256), 256, 0,
                                      static_cast<cudaStream_t>(stream)>>>(
          static_cast<const T*>(q), static_cast<const T*>(k),
          static_cast<const T*>(v), static_cast<T*>(qkv), tokens, q_heads,
          kv_heads, head_dim);
    });
    return LastError();
  });
}

int LaunchUnpackGroupedQkvGrad(const void* dqkv, void* dq, void* dk, void* dv,
                               int64_t tokens, int q_heads, int kv_heads,
                               int head_dim, int dtype, void* stream) {
  const int64_t count =
      tokens * (static_cast<int64_t>(q_heads) + kv_heads) * head_dim;
  if (count == 0) return 0;
  if (kv_heads < 1 || q_heads % kv_heads != 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    WithGroupWidth<T>(
        Vectorizable<T>(head_dim, {dqkv, dq, dk, dv}), [&](auto vec) {
          constexpr int kVec = decltype(vec)::value;
          UnpackGroupedQkvGradKernel<T, kVec>
              <<<GridFor(count / kVec, 256), 256, 0,
                 static_cast<cudaStream_t>(stream)>>>(
                  static_cast<const T*>(dqkv), static_cast<T*>(dq),
                  static_cast<T*>(dk), static_cast<T*>(dv), tokens, q_heads,
                  kv_heads, head_dim);
        });
    return LastError();
  });
}

int LaunchGroupedKvCacheWrite(const void* k, const void* v, const int32_t* rows,
                              const int32_t* starts, void* key_cache,
                              void* value_cache, int64_t n, int64_t seq_len,
                              int kv_heads, int head_dim, int64_t batch,
                              int64_t capacity, int dtype, void* stream) {
  const int64_t count = n * seq_len * kv_heads * head_dim;
  if (count == 0) return 0;
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    GroupedKvCacheWriteKernel<T>
        <<<GridFor(count, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<const T*>(k), static_cast<const T*>(v), rows, starts,
            static_cast<T*>(key_cache), static_cast<T*>(value_cache), n,
            seq_len, kv_heads, head_dim, batch, capacity);
    return LastError();
  });
}

int LaunchGroupedCachedAttentionForward(
    const void* q, const int32_t* rows, const int32_t* starts,
    const void* key_cache, const void* value_cache, void* out, int64_t n,
    int64_t seq_len, int q_heads, int kv_heads, int head_dim, int64_t batch,
    int64_t capacity, int dtype, void* stream) {
  if (n * seq_len == 0 || q_heads == 0) return 0;
  if (head_dim < 1 || head_dim > kMaxCachedAttentionHeadDim ||
      q_heads > 65535 || kv_heads < 1 || q_heads % kv_heads != 0 ||
      n * seq_len > 0x7fffffff) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
  const dim3 grid(static_cast<unsigned>(n * seq_len),
                  static_cast<unsigned>(q_heads));
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    GroupedCachedAttentionKernel<T>
        <<<grid, kDecodeWarps * 32, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<const T*>(q), rows, starts,
            static_cast<const T*>(key_cache),
            static_cast<const T*>(value_cache), static_cast<T*>(out), seq_len,
            q_heads, kv_heads, head_dim, batch, capacity, scale);
    return LastError();
  });
}

}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze
