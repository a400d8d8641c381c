// Grouped-query causal attention over token-major (B, T, H, D) tensors
// (nn/cuda/decoder_kernels.h): q (B, T, Hq, D), k and v (B, T, Hkv, D),
// query head h reading key/value head h / (Hq / Hkv).
//
// Plain tiled kernels, any dtype and any head size up to 256: a block of
// kThreads threads stages 16-row tiles of its operands in shared memory as
// f32 (row stride D + 1, so the per-pair dot products read distinct banks)
// and walks the causal key (or query) tiles in phases separated by
// barriers: pair phase (a thread per (query, key) pair of the tile: the
// score and what the softmax needs of it), then the row phase (a thread per
// (row, dimension) element of the accumulator). No tensor cores: these are
// the correct, general kernels; nn/cuda/attention.h's tensor-core family
// reads the packed (B, T, 3C) layout of GPT's attention only.
//
// Forward: FlashAttention-2's online softmax per query tile; logsumexp
// saved. Backward: delta = rowwise dO . O, then dQ per query tile, then dK
// and dV per key tile of a key/value head, looping over the group's query
// heads and the query tiles at or after the key tile inside the block: each
// gradient element has one writer, no atomics, the same sums every run.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "nn/cuda/cuda_common.cuh"
#include "nn/cuda/decoder_kernels.h"
#include "nn/cuda/kernels_common.cuh"

namespace ze {
namespace nn {
namespace cuda_kernels {
namespace {

constexpr int kThreads = 128;
constexpr int kTile = 16;           // queries and keys per tile
constexpr int kPairLd = kTile + 1;  // row stride of the (16, 16) tiles

// Sizes and strides of one launch.
struct Grouped {
  int seq_len, q_heads, kv_heads, head_dim;
  __host__ __device__ int group() const { return q_heads / kv_heads; }
  __host__ __device__ int64_t q_ld() const {
    return static_cast<int64_t>(q_heads) * head_dim;
  }
  __host__ __device__ int64_t kv_ld() const {
    return static_cast<int64_t>(kv_heads) * head_dim;
  }
  __host__ __device__ int tiles() const {
    return (seq_len + kTile - 1) / kTile;
  }
};

// Stages rows [first, first + kTile) of one head (src points at row 0 of
// it; rows `ld` elements apart) as f32 into dst (kTile, D + 1); rows at or
// past seq_len become 0.
template <typename T>
__device__ __forceinline__ void StageTile(float* dst, const T* src, int64_t ld,
                                          int first, int seq_len,
                                          int head_dim) {
  const int stride = head_dim + 1;
  for (int e = threadIdx.x; e < kTile * head_dim; e += kThreads) {
    const int r = e / head_dim, d = e % head_dim;
    const int row = first + r;
    dst[r * stride + d] =
        row < seq_len ? ToFloat(src[static_cast<int64_t>(row) * ld + d]) : 0.0f;
  }
}

__device__ __forceinline__ float Dot(const float* a, const float* b, int n) {
  float sum = 0.0f;
  for (int d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

// Shared floats per kernel (see the layouts in each kernel).
__host__ __device__ inline int ForwardSharedFloats(int head_dim) {
  return 4 * kTile * (head_dim + 1) + kTile * kPairLd + 3 * kTile;
}
__host__ __device__ inline int GradQuerySharedFloats(int head_dim) {
  return 5 * kTile * (head_dim + 1) + kTile * kPairLd + 2 * kTile;
}
__host__ __device__ inline int GradKeyValueSharedFloats(int head_dim) {
  return 6 * kTile * (head_dim + 1) + 2 * kTile * kPairLd + 2 * kTile;
}

// Block per (b, h, query tile), later query tiles (more keys) first.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    GroupedForwardKernel(const T* __restrict__ q, const T* __restrict__ k,
                         const T* __restrict__ v, T* __restrict__ out,
                         float* __restrict__ logsumexp, Grouped g,
                         float scale) {
  extern __shared__ float shared[];
  const int ld = g.head_dim + 1;
  float* sq = shared;                     // (16, ld) queries
  float* sk = sq + kTile * ld;            // (16, ld) keys
  float* sv = sk + kTile * ld;            // (16, ld) values
  float* so = sv + kTile * ld;            // (16, ld) output accumulators
  float* sp = so + kTile * ld;            // (16, 17) scores, then probabilities
  float* row_max = sp + kTile * kPairLd;  // (16) running max
  float* row_sum = row_max + kTile;       // (16) running sum
  float* row_scale = row_sum + kTile;     // (16) this tile's correction

  const int tiles = g.tiles();
  const int64_t block = blockIdx.x;
  const int qt = tiles - 1 - static_cast<int>(block % tiles);
  const int64_t bh = block / tiles;
  const int b = static_cast<int>(bh / g.q_heads);
  const int h = static_cast<int>(bh % g.q_heads);
  const int kv = h / g.group();
  const int64_t q_ld = g.q_ld(), kv_ld = g.kv_ld();
  const T* qb = q + static_cast<int64_t>(b) * g.seq_len * q_ld +
                static_cast<int64_t>(h) * g.head_dim;
  const int64_t kv_base = static_cast<int64_t>(b) * g.seq_len * kv_ld +
                          static_cast<int64_t>(kv) * g.head_dim;
  const int q0 = qt * kTile;
  const int rows_here = min(kTile, g.seq_len - q0);

  StageTile(sq, qb, q_ld, q0, g.seq_len, g.head_dim);
  for (int e = threadIdx.x; e < kTile * g.head_dim; e += kThreads) {
    so[(e / g.head_dim) * ld + e % g.head_dim] = 0.0f;
  }
  if (threadIdx.x < kTile) {
    row_max[threadIdx.x] = -INFINITY;
    row_sum[threadIdx.x] = 0.0f;
  }
  const int last_query = q0 + rows_here - 1;
  for (int k0 = 0; k0 <= last_query; k0 += kTile) {
    __syncthreads();  // the previous tile's readers are done
    StageTile(sk, k + kv_base, kv_ld, k0, g.seq_len, g.head_dim);
    StageTile(sv, v + kv_base, kv_ld, k0, g.seq_len, g.head_dim);
    __syncthreads();
    // Pair phase: raw scaled scores, -inf above the diagonal (and for rows
    // past the sequence).
    for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
      const int r = e / kTile, j = e % kTile;
      float s = -INFINITY;
      if (r < rows_here && k0 + j <= q0 + r) {
        s = scale * Dot(sq + r * ld, sk + j * ld, g.head_dim);
      }
      sp[r * kPairLd + j] = s;
    }
    __syncthreads();
    // Row phase: the online softmax update of each row.
    if (threadIdx.x < kTile) {
      const int r = threadIdx.x;
      float* pr = sp + r * kPairLd;
      float m = row_max[r];
      for (int j = 0; j < kTile; ++j) m = fmaxf(m, pr[j]);
      float correction = 1.0f, sum = 0.0f;
      if (m == -INFINITY) {  // a row past the sequence: nothing to add
        for (int j = 0; j < kTile; ++j) pr[j] = 0.0f;
      } else {
        // row_max is -inf before the row's first key: the factor is 0.
        correction = expf(row_max[r] - m);
        for (int j = 0; j < kTile; ++j) {
          const float p = expf(pr[j] - m);
          pr[j] = p;
          sum += p;
        }
      }
      row_sum[r] = row_sum[r] * correction + sum;
      row_max[r] = m;
      row_scale[r] = correction;
    }
    __syncthreads();
    // Element phase: o = o * correction + p v.
    for (int e = threadIdx.x; e < kTile * g.head_dim; e += kThreads) {
      const int r = e / g.head_dim, d = e % g.head_dim;
      const float* pr = sp + r * kPairLd;
      float acc = so[r * ld + d] * row_scale[r];
      for (int j = 0; j < kTile; ++j) acc += pr[j] * sv[j * ld + d];
      so[r * ld + d] = acc;
    }
  }
  __syncthreads();
  T* ob = out + static_cast<int64_t>(b) * g.seq_len * q_ld +
          static_cast<int64_t>(h) * g.head_dim;
  for (int e = threadIdx.x; e < rows_here * g.head_dim; e += kThreads) {
    const int r = e / g.head_dim, d = e % g.head_dim;
    ob[static_cast<int64_t>(q0 + r) * q_ld + d] =
        FromFloat<T>(so[r * ld + d] / row_sum[r]);
  }
  if (threadIdx.x < rows_here) {
    const int r = threadIdx.x;
    logsumexp[bh * g.seq_len + q0 + r] = row_max[r] + logf(row_sum[r]);
  }
}

// delta (B, Hq, T) = rowwise dO . O; warp per (b, t, h) row.
template <typename T>
__global__ void DeltaKernel(const T* __restrict__ dout,
                            const T* __restrict__ out,
                            float* __restrict__ delta, int64_t rows,
                            Grouped g) {
  const int lane = threadIdx.x & 31;
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;  // row = (b * T + t) * Hq + h
  const T* dr = dout + row * g.head_dim;
  const T* orow = out + row * g.head_dim;
  float sum = 0.0f;
  for (int d = lane; d < g.head_dim; d += 32) {
    sum += ToFloat(dr[d]) * ToFloat(orow[d]);
  }
  sum = WarpSum(sum);
  if (lane == 0) {
    const int64_t token = row / g.q_heads;
    const int h = static_cast<int>(row % g.q_heads);
    const int64_t b = token / g.seq_len, t = token % g.seq_len;
    delta[(b * g.q_heads + h) * g.seq_len + t] = sum;
  }
}

// The pair phase both backward kernels share: for query rows [q0, q0 + 16)
// staged in sq / sdo (with their logsumexp and delta) and keys [k0, k0 + 16)
// in sk / sv, p = exp(scale q.k - lse) and ds = p (dO.v - delta), both 0
// outside the causal triangle and the sequence. sp may be null (dQ needs
// only ds).
__device__ __forceinline__ void GradPairs(const float* sq, const float* sdo,
                                          const float* sk, const float* sv,
                                          const float* lse, const float* delta,
                                          float* sp, float* sds, int q0, int k0,
                                          int seq_len, int head_dim,
                                          float scale) {
  const int ld = head_dim + 1;
  for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
    const int r = e / kTile, j = e % kTile;
    const int query = q0 + r, key = k0 + j;
    float p = 0.0f, ds = 0.0f;
    if (query < seq_len && key <= query) {
      p = expf(scale * Dot(sq + r * ld, sk + j * ld, head_dim) - lse[r]);
      ds = p * (Dot(sdo + r * ld, sv + j * ld, head_dim) - delta[r]);
    }
    if (sp != nullptr) sp[r * kPairLd + j] = p;
    sds[r * kPairLd + j] = ds;
  }
}

// dQ: block per (b, h, query tile); dq = scale * sum over keys of ds k.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    GradQueryKernel(const T* __restrict__ dout, const T* __restrict__ q,
                    const T* __restrict__ k, const T* __restrict__ v,
                    const float* __restrict__ logsumexp,
                    const float* __restrict__ delta, T* __restrict__ dq,
                    Grouped g, float scale) {
  extern __shared__ float shared[];
  const int ld = g.head_dim + 1;
  float* sq = shared;                   // (16, ld)
  float* sdo = sq + kTile * ld;         // (16, ld)
  float* sk = sdo + kTile * ld;         // (16, ld)
  float* sv = sk + kTile * ld;          // (16, ld)
  float* sdq = sv + kTile * ld;         // (16, ld) accumulators
  float* sds = sdq + kTile * ld;        // (16, 17)
  float* slse = sds + kTile * kPairLd;  // (16)
  float* sdelta = slse + kTile;         // (16)

  const int tiles = g.tiles();
  const int64_t block = blockIdx.x;
  const int qt = tiles - 1 - static_cast<int>(block % tiles);
  const int64_t bh = block / tiles;
  const int b = static_cast<int>(bh / g.q_heads);
  const int h = static_cast<int>(bh % g.q_heads);
  const int kv = h / g.group();
  const int64_t q_ld = g.q_ld(), kv_ld = g.kv_ld();
  const int64_t q_base = static_cast<int64_t>(b) * g.seq_len * q_ld +
                         static_cast<int64_t>(h) * g.head_dim;
  const int64_t kv_base = static_cast<int64_t>(b) * g.seq_len * kv_ld +
                          static_cast<int64_t>(kv) * g.head_dim;
  const int q0 = qt * kTile;
  const int rows_here = min(kTile, g.seq_len - q0);

  StageTile(sq, q + q_base, q_ld, q0, g.seq_len, g.head_dim);
  StageTile(sdo, dout + q_base, q_ld, q0, g.seq_len, g.head_dim);
  for (int e = threadIdx.x; e < kTile * g.head_dim; e += kThreads) {
    sdq[(e / g.head_dim) * ld + e % g.head_dim] = 0.0f;
  }
  if (threadIdx.x < kTile) {
    const int r = threadIdx.x;
    slse[r] = r < rows_here ? logsumexp[bh * g.seq_len + q0 + r] : 0.0f;
    sdelta[r] = r < rows_here ? delta[bh * g.seq_len + q0 + r] : 0.0f;
  }
  const int last_query = q0 + rows_here - 1;
  for (int k0 = 0; k0 <= last_query; k0 += kTile) {
    __syncthreads();
    StageTile(sk, k + kv_base, kv_ld, k0, g.seq_len, g.head_dim);
    StageTile(sv, v + kv_base, kv_ld, k0, g.seq_len, g.head_dim);
    __syncthreads();
    GradPairs(sq, sdo, sk, sv, slse, sdelta, nullptr, sds, q0, k0, g.seq_len,
              g.head_dim, scale);
    __syncthreads();
    for (int e = threadIdx.x; e < kTile * g.head_dim; e += kThreads) {
      const int r = e / g.head_dim, d = e % g.head_dim;
      const float* dsr = sds + r * kPairLd;
      float acc = sdq[r * ld + d];
      for (int j = 0; j < kTile; ++j) acc += dsr[j] * sk[j * ld + d];
      sdq[r * ld + d] = acc;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < rows_here * g.head_dim; e += kThreads) {
    const int r = e / g.head_dim, d = e % g.head_dim;
    dq[q_base + static_cast<int64_t>(q0 + r) * q_ld + d] =
        FromFloat<T>(scale * sdq[r * ld + d]);
  }
}

// dK, dV: block per (b, kv head, key tile), first key tiles (most queries)
// first. Loops over the group's query heads and the query tiles from the
// key tile's on: dv += p^T dO, dk += scale ds^T q.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    GradKeyValueKernel(const T* __restrict__ dout, const T* __restrict__ q,
                       const T* __restrict__ k, const T* __restrict__ v,
                       const float* __restrict__ logsumexp,
                       const float* __restrict__ delta, T* __restrict__ dk,
                       T* __restrict__ dv, Grouped g, float scale) {
  extern __shared__ float shared[];
  const int ld = g.head_dim + 1;
  float* sk = shared;                   // (16, ld)
  float* sv = sk + kTile * ld;          // (16, ld)
  float* sq = sv + kTile * ld;          // (16, ld)
  float* sdo = sq + kTile * ld;         // (16, ld)
  float* sdk = sdo + kTile * ld;        // (16, ld) accumulators
  float* sdv = sdk + kTile * ld;        // (16, ld) accumulators
  float* sp = sdv + kTile * ld;         // (16, 17)
  float* sds = sp + kTile * kPairLd;    // (16, 17)
  float* slse = sds + kTile * kPairLd;  // (16)
  float* sdelta = slse + kTile;         // (16)

  const int tiles = g.tiles();
  const int64_t block = blockIdx.x;
  const int kt = static_cast<int>(block % tiles);
  const int64_t bkv = block / tiles;
  const int b = static_cast<int>(bkv / g.kv_heads);
  const int kv = static_cast<int>(bkv % g.kv_heads);
  const int64_t q_ld = g.q_ld(), kv_ld = g.kv_ld();
  const int64_t kv_base = static_cast<int64_t>(b) * g.seq_len * kv_ld +
                          static_cast<int64_t>(kv) * g.head_dim;
  const int k0 = kt * kTile;
  const int keys_here = min(kTile, g.seq_len - k0);

  StageTile(sk, k + kv_base, kv_ld, k0, g.seq_len, g.head_dim);
  StageTile(sv, v + kv_base, kv_ld, k0, g.seq_len, g.head_dim);
  for (int e = threadIdx.x; e < kTile * g.head_dim; e += kThreads) {
    const int r = e / g.head_dim, d = e % g.head_dim;
    sdk[r * ld + d] = 0.0f;
    sdv[r * ld + d] = 0.0f;
  }
  for (int h = kv * g.group(); h < (kv + 1) * g.group(); ++h) {
    const int64_t bh = static_cast<int64_t>(b) * g.q_heads + h;
    const int64_t q_base = static_cast<int64_t>(b) * g.seq_len * q_ld +
                           static_cast<int64_t>(h) * g.head_dim;
    for (int q0 = k0; q0 < g.seq_len; q0 += kTile) {
      __syncthreads();  // the previous query tile's readers are done
      StageTile(sq, q + q_base, q_ld, q0, g.seq_len, g.head_dim);
      StageTile(sdo, dout + q_base, q_ld, q0, g.seq_len, g.head_dim);
      if (threadIdx.x < kTile) {
        const int r = threadIdx.x;
        const bool valid = q0 + r < g.seq_len;
        slse[r] = valid ? logsumexp[bh * g.seq_len + q0 + r] : 0.0f;
        sdelta[r] = valid ? delta[bh * g.seq_len + q0 + r] : 0.0f;
      }
      __syncthreads();
      GradPairs(sq, sdo, sk, sv, slse, sdelta, sp, sds, q0, k0, g.seq_len,
                g.head_dim, scale);
      __syncthreads();
      for (int e = threadIdx.x; e < kTile * g.head_dim; e += kThreads) {
        const int j = e / g.head_dim, d = e % g.head_dim;
        float acc_v = sdv[j * ld + d], acc_k = sdk[j * ld + d];
        for (int r = 0; r < kTile; ++r) {
          acc_v += sp[r * kPairLd + j] * sdo[r * ld + d];
          acc_k += sds[r * kPairLd + j] * sq[r * ld + d];
        }
        sdv[j * ld + d] = acc_v;
        sdk[j * ld + d] = acc_k;
      }
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < keys_here * g.head_dim; e += kThreads) {
    const int j = e / g.head_dim, d = e % g.head_dim;
    const int64_t index = kv_base + static_cast<int64_t>(k0 + j) * kv_ld + d;
    dk[index] = FromFloat<T>(scale * sdk[j * ld + d]);
    dv[index] = FromFloat<T>(sdv[j * ld + d]);
  }
}

// Launches `kernel` with `floats` of dynamic shared memory, raising the
// kernel's limit past the default 48 KB when needed.
template <typename Kernel, typename... Args>
int LaunchShared(Kernel kernel, int64_t blocks, int floats, cudaStream_t stream,
                 Args... args) {
  const size_t bytes = sizeof(float) * static_cast<size_t>(floats);
  if (bytes > 48 * 1024) {
    const cudaError_t error = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(bytes));
    if (error != cudaSuccess) return static_cast<int>(error);
  }
  kernel<<<static_cast<unsigned>(blocks), kThreads, bytes, stream>>>(args...);
  return LastError();
}

bool ValidSizes(const Grouped& g, int batch) {
  return g.head_dim >= 1 && g.head_dim <= kMaxGroupedAttentionHeadDim &&
         g.kv_heads >= 1 && g.q_heads % g.kv_heads == 0 &&
         static_cast<int64_t>(batch) * g.q_heads * g.tiles() <= 0x7fffffff;
}

}  // namespace

int LaunchGroupedAttentionForward(const void* q, const void* k, const void* v,
                                  void* out, float* logsumexp, int batch,
                                  int seq_len, int q_heads, int kv_heads,
                                  int head_dim, int dtype, void* stream) {
  if (batch == 0 || seq_len == 0 || q_heads == 0) return 0;
  const Grouped g{seq_len, q_heads, kv_heads, head_dim};
  if (!ValidSizes(g, batch)) return static_cast<int>(cudaErrorInvalidValue);
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
  const int64_t blocks = static_cast<int64_t>(batch) * q_heads * g.tiles();
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return LaunchShared(
        GroupedForwardKernel<T>, blocks, ForwardSharedFloats(head_dim),
        static_cast<cudaStream_t>(stream), static_cast<const T*>(q),
        static_cast<const T*>(k), static_cast<const T*>(v),
        static_cast<T*>(out), logsumexp, g, scale);
  });
}

size_t GroupedAttentionBackwardWorkspaceBytes(int batch, int seq_len,
                                              int q_heads) {
  const size_t bytes = sizeof(float) * static_cast<size_t>(batch) * q_heads *
                       static_cast<size_t>(seq_len);
  return (bytes + 255) / 256 * 256;
}

int LaunchGroupedAttentionBackward(const void* dout, const void* q,
                                   const void* k, const void* v,
                                   const void* out, const float* logsumexp,
                                   void* dq, void* dk, void* dv,
                                   void* workspace, int batch, int seq_len,
                                   int q_heads, int kv_heads, int head_dim,
                                   int dtype, void* stream) {
  if (batch == 0 || seq_len == 0 || q_heads == 0) return 0;
  const Grouped g{seq_len, q_heads, kv_heads, head_dim};
  if (!ValidSizes(g, batch)) return static_cast<int>(cudaErrorInvalidValue);
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
  float* delta = static_cast<float*>(workspace);
  auto s = static_cast<cudaStream_t>(stream);
  return DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const int64_t rows = static_cast<int64_t>(batch) * seq_len * q_heads;
    DeltaKernel<T><<<GridFor(rows, 8), 256, 0, s>>>(static_cast<const T*>(dout),
                                                    static_cast<const T*>(out),
                                                    delta, rows, g);
    int error = LastError();
    if (error != 0) return error;
    error = LaunchShared(
        GradQueryKernel<T>, static_cast<int64_t>(batch) * q_heads * g.tiles(),
        GradQuerySharedFloats(head_dim), s, static_cast<const T*>(dout),
        static_cast<const T*>(q), static_cast<const T*>(k),
        static_cast<const T*>(v), logsumexp, static_cast<const float*>(delta),
        static_cast<T*>(dq), g, scale);
    if (error != 0) return error;
    return LaunchShared(GradKeyValueKernel<T>,
                        static_cast<int64_t>(batch) * kv_heads * g.tiles(),
                        GradKeyValueSharedFloats(head_dim), s,
                        static_cast<const T*>(dout), static_cast<const T*>(q),
                        static_cast<const T*>(k), static_cast<const T*>(v),
                        logsumexp, static_cast<const float*>(delta),
                        static_cast<T*>(dk), static_cast<T*>(dv), g, scale);
  });
}

}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze
