// Key/value cache of incremental decoding (nn/cuda/kernels.h): the write of
// a step's keys and values into the cache, and the attention of the step's
// queries over the cached positions.
//
// Decoding is memory-bound (one query per sequence and head reads the
// whole cached prefix once), so the attention kernel is a plain
// flash-decoding loop rather than a tensor-core one: a block per (query,
// head), its warps taking every kWarps-th key with an online softmax each,
// merged through shared memory at the end. A lane holds the head dimensions
// lane, lane + 32, ... so a key row is read with coalesced accesses.
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "nn/cuda/cuda_common.cuh"
#include "nn/cuda/kernels.h"
#include "nn/cuda/kernels_common.cuh"

namespace ze {
namespace nn {
namespace cuda_kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxPerLane = kMaxCachedAttentionHeadDim / 32;

// Whether entry i addresses positions [start, start + seq_len) of a row of
// the cache.
__device__ __forceinline__ bool ValidSlot(int32_t row, int32_t start,
                                          int64_t seq_len, int64_t batch,
                                          int64_t capacity) {
  return row >= 0 && row < batch && start >= 0 && start + seq_len <= capacity;
}

// Thread per element of the new keys (N, T, C): moves it and its value.
template <typename T>
__global__ void KvCacheWriteKernel(const T* __restrict__ qkv,
                                   const int32_t* __restrict__ rows,
                                   const int32_t* __restrict__ starts,
                                   T* __restrict__ key_cache,
                                   T* __restrict__ value_cache, int64_t n,
                                   int64_t seq_len, int heads, int head_dim,
                                   int64_t batch, int64_t capacity) {
  const int64_t channels = static_cast<int64_t>(heads) * head_dim;
  const int64_t idx =
      static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * seq_len * channels) return;
  const int64_t token = idx / channels;  // i * T + t
  const int64_t c = idx % channels;
  const int64_t i = token / seq_len, t = token % seq_len;
  const int32_t row = rows[i], start = starts[i];
  if (!ValidSlot(row, start, seq_len, batch, capacity)) return;
  const int64_t h = c / head_dim, d = c % head_dim;
  const int64_t cache_index =
      ((row * static_cast<int64_t>(heads) + h) * capacity + start + t) *
          head_dim +
      d;
  const T* source = qkv + token * 3 * channels + channels + c;
  key_cache[cache_index] = source[0];
  value_cache[cache_index] = source[channels];
}

// Block per (query token, head), kWarps warps. Each warp runs an online
// softmax over keys warp, warp + kWarps, ...; the partial (max, sum,
// accumulator) triples are merged at the end.
template <typename T>
__global__ void __launch_bounds__(kWarps * 32) CachedAttentionKernel(
    const T* __restrict__ qkv, const int32_t* __restrict__ rows,
    const int32_t* __restrict__ starts, const T* __restrict__ key_cache,
    const T* __restrict__ value_cache, T* __restrict__ out, int64_t seq_len,
    int heads, int head_dim, int64_t batch, int64_t capacity, float scale) {
  __shared__ float warp_max[kWarps];
  __shared__ float warp_sum[kWarps];
  __shared__ float warp_acc[kWarps][kMaxCachedAttentionHeadDim];
  const int64_t token = blockIdx.x;  // i * T + t
  const int h = blockIdx.y;
  const int64_t i = token / seq_len, t = token % seq_len;
  const int32_t row = rows[i], start = starts[i];
  if (!ValidSlot(row, start, seq_len, batch, capacity)) return;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t channels = static_cast<int64_t>(heads) * head_dim;
  const int64_t keys = start + t + 1;  // causal: positions [0, start + t]

  // The query, pre-scaled, and the accumulator: dimensions lane + 32 e.
  float q[kMaxPerLane], acc[kMaxPerLane];
  const T* query =
      qkv + token * 3 * channels + static_cast<int64_t>(h) * head_dim;
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int d = lane + 32 * e;
    q[e] = d < head_dim ? ToFloat(query[d]) * scale : 0.0f;
    acc[e] = 0.0f;
  }
  const int64_t block =
      (static_cast<int64_t>(row) * heads + h) * capacity * head_dim;
  const T* k_block = key_cache + block;
  const T* v_block = value_cache + block;
  float running_max = -INFINITY, running_sum = 0.0f;
  for (int64_t j = warp; j < keys; j += kWarps) {
    const T* k_row = k_block + j * head_dim;
    float score = 0.0f;
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int d = lane + 32 * e;
      if (d < head_dim) score += q[e] * ToFloat(k_row[d]);
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
  // Position 0 always exists, so warp 0's maximum is finite; a warp that saw
  // no key (max -inf) weighs 0.
  float global_max = warp_max[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) global_max = fmaxf(global_max, warp_max[w]);
  float weight[kWarps];
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    weight[w] = expf(warp_max[w] - global_max);
    total += warp_sum[w] * weight[w];
  }
  const float inverse_total = 1.0f / total;
  T* o = out + token * channels + static_cast<int64_t>(h) * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float value = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) value += warp_acc[w][d] * weight[w];
    o[d] = FromFloat<T>(value * inverse_total);
  }
}

}  // namespace

int LaunchKvCacheWrite(const void* qkv, const int32_t* rows,
                       const int32_t* starts, void* key_cache,
                       void* value_cache, int64_t n, int64_t seq_len, int heads,
                       int head_dim, int64_t batch, int64_t capacity, int dtype,
                       void* stream) {
  const int64_t count = n * seq_len * heads * head_dim;
  if (count == 0) return 0;
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    KvCacheWriteKernel<T>
        <<<GridFor(count, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<const T*>(qkv), rows, starts,
            static_cast<T*>(key_cache), static_cast<T*>(value_cache), n,
            seq_len, heads, head_dim, batch, capacity);
    return LastError();
  });
}

int LaunchCachedAttentionForward(const void* qkv, const int32_t* rows,
                                 const int32_t* starts, const void* key_cache,
                                 const void* value_cache, void* out, int64_t n,
                                 int64_t seq_len, int heads, int head_dim,
                                 int64_t batch, int64_t capacity, int dtype,
                                 void* stream) {
  if (n * seq_len == 0 || heads == 0) return 0;
  if (head_dim < 1 || head_dim > kMaxCachedAttentionHeadDim || heads > 65535) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
  const dim3 grid(static_cast<unsigned>(n * seq_len),
                  static_cast<unsigned>(heads));
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    CachedAttentionKernel<T>
        <<<grid, kWarps * 32, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<const T*>(qkv), rows, starts,
            static_cast<const T*>(key_cache),
            static_cast<const T*>(value_cache), static_cast<T*>(out), seq_len,
            heads, head_dim, batch, capacity, scale);
    return LastError();
  });
}

}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze
