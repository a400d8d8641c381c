// Attention forward on the mma.sync kernels (bf16/f16) and the simple f32
// kernel; see attention_mma.h for the contract and attention_mma.cuh for the
// fragment layouts. attention_dispatch.cu decides when these run.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "nn/cuda/attention_mma.cuh"
#include "nn/cuda/attention_mma.h"

namespace ze {
namespace nn {
namespace cuda_kernels {
namespace mma_attention {
namespace {

// grid (num_tiles, B*H); block kThreads. scale_log2 = log2(e) / sqrt(D).
// K/V tiles are double-buffered, the next tile's cp.async runs under this
// tile's matrix products (one barrier per tile instead of two and no exposed
// load latency; with only a few CTAs per SM the other CTAs could not hide
// it).
template <typename T, int DP>
__global__ void __launch_bounds__(kThreads)
    FlashForwardKernel(const T* __restrict__ qkv, T* __restrict__ out,
                       float* __restrict__ logsumexp, int seq_len, int heads,
                       int head_dim, float scale_log2) {
  constexpr int kStride = DP + 8;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  // (64, DP) queries, then per stage (64, DP) keys and (64, DP) values;
  // two stages.
  T* sq = reinterpret_cast<T*>(shared_bytes);

  // Later query tiles see more keys: schedule them first.
  const int qt = gridDim.x - 1 - blockIdx.x;
  const int bh = blockIdx.y;
  const int b = bh / heads, h = bh % heads;
  const int64_t channels = static_cast<int64_t>(heads) * head_dim;
  const int64_t ld = 3 * channels;
  const T* q_src = qkv + static_cast<int64_t>(b) * seq_len * ld + h * head_dim;
  const T* k_src = q_src + channels;
  const T* v_src = q_src + 2 * channels;
  const bool vector = head_dim % 8 == 0;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;

  LoadTile<T, DP>(sq, q_src, ld, qt * kTile, seq_len, head_dim, vector);
  LoadTile<T, DP>(sq + kTile * kStride, k_src, ld, 0, seq_len, head_dim,
                  vector);
  LoadTile<T, DP>(sq + 2 * kTile * kStride, v_src, ld, 0, seq_len, head_dim,
                  vector);

  float o[DP / 8][4];
#pragma unroll
  for (int i = 0; i < DP / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};                // this thread's columns only
  const int q_row0 = qt * kTile + warp * 16 + g;  // and q_row0 + 8

  for (int kt = 0; kt <= qt; ++kt) {
    const int stage = kt & 1;
    const T* sk = sq + (1 + 2 * stage) * kTile * kStride;
    const T* sv = sk + kTile * kStride;
    // Tile kt (the only copies in flight) has landed, and everyone is done
    // with tile kt - 1, whose buffers now receive tile kt + 1.
    WaitTiles();
    if (kt < qt) {
      T* nk = sq + (1 + 2 * (stage ^ 1)) * kTile * kStride;
      LoadTile<T, DP>(nk, k_src, ld, (kt + 1) * kTile, seq_len, head_dim,
                      vector);
      LoadTile<T, DP>(nk + kTile * kStride, v_src, ld, (kt + 1) * kTile,
                      seq_len, head_dim, vector);
    }

    float s[8][4];  // (16 queries, 64 keys)
#pragma unroll
    for (int i = 0; i < 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
    MatmulABt<T, DP>(s, sq, sk, warp * 16);

    // Mask future keys (only the diagonal tile has any; key 0 never is, so
    // no row is ever all -inf) and take the row maxima of the raw scores;
    // the scale into the log2 domain is folded into the exponent's FMA
    // below (scale_log2 > 0 keeps the maxima where they are).
    float tile_max[2] = {-INFINITY, -INFINITY};
    if (kt == qt) {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int query = q_row0 + (e >> 1) * 8;
          const int key = kt * kTile + nt * 8 + 2 * t + (e & 1);
          if (key > query) s[nt][e] = -INFINITY;
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[nt][e]);
      }
    }
    float correction[2], neg_max[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] =
          fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] =
          fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float new_max = fmaxf(row_max[r], tile_max[r] * scale_log2);
      correction[r] = exp2f(row_max[r] - new_max);
      row_max[r] = new_max;
      neg_max[r] = -new_max;
      row_sum[r] *= correction[r];
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(fmaf(s[nt][e], scale_log2, neg_max[e >> 1]));
        s[nt][e] = p;
        row_sum[e >> 1] += p;
      }
    }
#pragma unroll
    for (int dt = 0; dt < DP / 8; ++dt) {
      o[dt][0] *= correction[0];
      o[dt][1] *= correction[0];
      o[dt][2] *= correction[1];
      o[dt][3] *= correction[1];
    }
    uint32_t pf[4][4];
    PackA<T>(s, pf);
    MatmulPB<T, DP>(o, pf, sv);
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
  }
  T* out_base =
      out + static_cast<int64_t>(b) * seq_len * channels + h * head_dim;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int query = q_row0 + r * 8;
    if (query >= seq_len) continue;
    const float inv = 1.0f / row_sum[r];
    T* dst = out_base + static_cast<int64_t>(query) * channels;
#pragma unroll
    for (int dt = 0; dt < DP / 8; ++dt) {
      const int col = dt * 8 + 2 * t;
      if (col < head_dim) dst[col] = FromFloat<T>(o[dt][2 * r] * inv);
      if (col + 1 < head_dim)
        dst[col + 1] = FromFloat<T>(o[dt][2 * r + 1] * inv);
    }
    if (t == 0) {
      logsumexp[static_cast<int64_t>(bh) * seq_len + query] =
          (row_max[r] + log2f(row_sum[r])) * kLn2;
    }
  }
}

// grid (B*H, ceil(T / 128)); block kWideThreads. A CTA owns 128 queries and
// streams 64-key K/V tiles through two shared-memory stages (the copy of
// tile kt + 1 runs under tile kt's products). Query tiles are in grid.y
// reversed, so the heaviest tiles of every head start in the first wave and
// the light ones fill the tail. Warps whose 16 rows all precede a key tile
// skip it; only tiles crossing the warp's diagonal apply the causal mask.
template <typename T, int DP>
__global__ void __launch_bounds__(kWideThreads, 2)
    FlashForwardWideKernel(const T* __restrict__ qkv, T* __restrict__ out,
                           float* __restrict__ logsumexp, int seq_len,
                           int heads, int head_dim, float scale_log2) {
  constexpr int kStride = DP + 8;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* sq = reinterpret_cast<T*>(shared_bytes);  // (128 queries, DP)
  T* skv = sq + kWideTile * kStride;  // per stage: K (64, DP), V (64, DP)

  const int bh = blockIdx.x;
  const int qt = gridDim.y - 1 - blockIdx.y;
  const int b = bh / heads, h = bh % heads;
  const int64_t channels = static_cast<int64_t>(heads) * head_dim;
  const int64_t ld = 3 * channels;
  const T* q_src = qkv + static_cast<int64_t>(b) * seq_len * ld + h * head_dim;
  const T* k_src = q_src + channels;
  const T* v_src = q_src + 2 * channels;
  const bool vector = head_dim % 8 == 0;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int warp_row0 = qt * kWideTile + warp * 16;  // first query of warp
  const int q_row0 = warp_row0 + g;                  // and q_row0 + 8
  // Key tiles up to the CTA's last query, and none past the sequence.
  const int num_kv = min(2 * qt + 2, (seq_len + kTile - 1) / kTile);

  LoadTile<T, DP, kWideTile, kWideThreads>(sq, q_src, ld, qt * kWideTile,
                                           seq_len, head_dim, vector);
  LoadTile<T, DP, kTile, kWideThreads>(skv, k_src, ld, 0, seq_len, head_dim,
                                       vector);
  LoadTile<T, DP, kTile, kWideThreads>(skv + kTile * kStride, v_src, ld, 0,
                                       seq_len, head_dim, vector);

  float o[DP / 8][4];
#pragma unroll
  for (int i = 0; i < DP / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};  // this thread's columns only

  for (int kt = 0; kt < num_kv; ++kt) {
    const T* sk = skv + (kt & 1) * 2 * kTile * kStride;
    const T* sv = sk + kTile * kStride;
    // Tile kt (the only copies in flight) has landed and every warp is done
    // with tile kt - 1, whose stage now receives tile kt + 1.
    WaitTiles();
    if (kt + 1 < num_kv) {
      T* nk = skv + ((kt + 1) & 1) * 2 * kTile * kStride;
      LoadTile<T, DP, kTile, kWideThreads>(nk, k_src, ld, (kt + 1) * kTile,
                                           seq_len, head_dim, vector);
      LoadTile<T, DP, kTile, kWideThreads>(nk + kTile * kStride, v_src, ld,
                                           (kt + 1) * kTile, seq_len, head_dim,
                                           vector);
    }
    // Every key of this tile is in the future of all 16 rows: nothing to
    // add. Warp-uniform, and no barrier follows inside the iteration. Tile 0
    // is never skipped, so row_max is finite from the first tile on.
    if (kt * kTile > warp_row0 + 15) continue;
    const bool diagonal = kt * kTile + kTile - 1 > warp_row0;

    float s[8][4];  // (16 queries, 64 keys)
#pragma unroll
    for (int i = 0; i < 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
    MatmulABt<T, DP>(s, sq, sk, warp * 16);

    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[nt][e] * scale_log2;
        if (diagonal) {
          const int query = q_row0 + (e >> 1) * 8;
          const int key = kt * kTile + nt * 8 + 2 * t + (e & 1);
          if (key > query) v = -INFINITY;
        }
        s[nt][e] = v;
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], v);
      }
    }
    float correction[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] =
          fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] =
          fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float new_max = fmaxf(row_max[r], tile_max[r]);
      correction[r] = exp2f(row_max[r] - new_max);
      row_max[r] = new_max;
      row_sum[r] *= correction[r];
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[nt][e] - row_max[e >> 1]);
        s[nt][e] = p;
        row_sum[e >> 1] += p;
      }
    }
#pragma unroll
    for (int dt = 0; dt < DP / 8; ++dt) {
      o[dt][0] *= correction[0];
      o[dt][1] *= correction[0];
      o[dt][2] *= correction[1];
      o[dt][3] *= correction[1];
    }
    uint32_t pf[4][4];
    PackA<T>(s, pf);
    MatmulPB<T, DP>(o, pf, sv);
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
  }
  T* out_base =
      out + static_cast<int64_t>(b) * seq_len * channels + h * head_dim;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int query = q_row0 + r * 8;
    if (query >= seq_len) continue;
    const float inv = 1.0f / row_sum[r];
    T* dst = out_base + static_cast<int64_t>(query) * channels;
#pragma unroll
    for (int dt = 0; dt < DP / 8; ++dt) {
      const int col = dt * 8 + 2 * t;
      if (col < head_dim) dst[col] = FromFloat<T>(o[dt][2 * r] * inv);
      if (col + 1 < head_dim)
        dst[col + 1] = FromFloat<T>(o[dt][2 * r + 1] * inv);
    }
    if (t == 0) {
      logsumexp[static_cast<int64_t>(bh) * seq_len + query] =
          (row_max[r] + log2f(row_sum[r])) * kLn2;
    }
  }
}

__global__ void SimpleForwardKernel(const float* __restrict__ qkv,
                                    float* __restrict__ out, float* logsumexp,
                                    int batch, int seq_len, int heads,
                                    int head_dim, float scale) {
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= static_cast<int64_t>(batch) * heads * seq_len) return;
  const int64_t bh = row / seq_len;
  const int query = static_cast<int>(row % seq_len);
  const int64_t b = bh / heads, h = bh % heads;
  const int64_t channels = static_cast<int64_t>(heads) * head_dim;
  const float* base = qkv + b * seq_len * 3 * channels + h * head_dim;
  float q[kMaxPerLane], o[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + 32 * i;
    q[i] = d < head_dim ? base[query * 3 * channels + d] : 0.0f;
    o[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int key = 0; key <= query; ++key) {
    const float* k = base + static_cast<int64_t>(key) * 3 * channels + channels;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < head_dim) dot += q[i] * k[d];
    }
    const float s = WarpSum(dot) * scale;
    const float new_m = fmaxf(m, s);
    const float corr = expf(m - new_m);
    const float p = expf(s - new_m);
    l = l * corr + p;
    m = new_m;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane + 32 * i;
      o[i] = o[i] * corr + (d < head_dim ? p * k[channels + d] : 0.0f);
    }
  }
  float* dst = out + (b * seq_len + query) * channels + h * head_dim;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < head_dim) dst[d] = o[i] / l;
  }
  if (lane == 0) logsumexp[row] = m + logf(l);
}

// Q plus two stages of K and V.
template <int DP>
constexpr size_t ForwardSharedBytes() {
  return 5 * kTile * (DP + 8) * 2;
}

// Q (128 queries), two stages of K and V (64 keys each).
template <int DP>
constexpr size_t ForwardWideSharedBytes() {
  return (kWideTile + 4 * kTile) * (DP + 8) * 2;
}

// The 4-warp pipelined kernel at padded D 64, where it measured 166 TFLOP/s
// against the wide kernel's 158 on the H200 (B 16, T 1024, H 32), and at the
// padded sizes without a wide instantiation (80, 256); the wide kernel at
// D 128 (190 against 163).
template <typename T>
int ForwardTensorCore(const void* qkv, void* out, float* logsumexp, int batch,
                      int seq_len, int heads, int head_dim,
                      cudaStream_t stream) {
  return DispatchHeadDim(head_dim, [&](auto dp) {
    constexpr int DP = decltype(dp)::value;
    if constexpr (DP == 128) {
      constexpr size_t shared = ForwardWideSharedBytes<DP>();
      auto kernel = FlashForwardWideKernel<T, DP>;
      AllowSharedBytes(kernel, shared);
      const dim3 grid(batch * heads, (seq_len + kWideTile - 1) / kWideTile);
      kernel<<<grid, kWideThreads, shared, stream>>>(
          static_cast<const T*>(qkv), static_cast<T*>(out), logsumexp, seq_len,
          heads, head_dim, kLog2e / sqrtf(static_cast<float>(head_dim)));
      return static_cast<int>(cudaGetLastError());
    } else {
      constexpr size_t shared = ForwardSharedBytes<DP>();
      auto kernel = FlashForwardKernel<T, DP>;
      AllowSharedBytes(kernel, shared);
      const dim3 grid((seq_len + kTile - 1) / kTile, batch * heads);
      kernel<<<grid, kThreads, shared, stream>>>(
          static_cast<const T*>(qkv), static_cast<T*>(out), logsumexp, seq_len,
          heads, head_dim, kLog2e / sqrtf(static_cast<float>(head_dim)));
      return static_cast<int>(cudaGetLastError());
    }
  });
}

}  // namespace

int LaunchForward(const void* qkv, void* out, float* logsumexp, int batch,
                  int seq_len, int heads, int head_dim, int dtype,
                  cudaStream_t stream) {
  switch (dtype) {
    case kBF16:
      return ForwardTensorCore<__nv_bfloat16>(qkv, out, logsumexp, batch,
                                              seq_len, heads, head_dim, stream);
    case kF16:
      return ForwardTensorCore<__half>(qkv, out, logsumexp, batch, seq_len,
                                       heads, head_dim, stream);
    case kF32: {
      const int64_t rows = static_cast<int64_t>(batch) * heads * seq_len;
      SimpleForwardKernel<<<static_cast<unsigned>((rows + 7) / 8), 256, 0,
                            stream>>>(
          static_cast<const float*>(qkv), static_cast<float*>(out), logsumexp,
          batch, seq_len, heads, head_dim,
          1.0f / sqrtf(static_cast<float>(head_dim)));
      return static_cast<int>(cudaGetLastError());
    }
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace mma_attention
}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze
