// Attention backward on the mma.sync kernels (bf16/f16) and the simple f32
// kernel, and the delta pass the Hopper backward shares; see attention_mma.h
// for the contract and attention_mma.cuh for the fragment layouts.
// attention_dispatch.cu decides when these run.
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

// delta[bh, t] = dO[b, t, h, :] . O[b, t, h, :]. Eight lanes per row (four
// rows per warp), each lane reading 16 bytes of each operand per step when
// head_dim and the row offsets allow it: a warp per row left half of every
// 128-byte line idle at D = 64.
template <typename T>
__global__ void AttentionDeltaKernel(const T* __restrict__ dout,
                                     const T* __restrict__ out, float* delta,
                                     int batch, int seq_len, int heads,
                                     int head_dim) {
  constexpr int kLanesPerRow = 8;
  constexpr int kVector = 16 / sizeof(T);  // elements per 16-byte load
  const int64_t row =
      (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) /
      kLanesPerRow;
  const int sub = threadIdx.x % kLanesPerRow;
  const bool active = row < static_cast<int64_t>(batch) * heads * seq_len;
  float sum = 0.0f;
  if (active) {
    const int64_t bh = row / seq_len;
    const int tpos = static_cast<int>(row % seq_len);
    const int b = static_cast<int>(bh / heads),
              h = static_cast<int>(bh % heads);
    const int64_t offset =
        (static_cast<int64_t>(b) * seq_len + tpos) * heads * head_dim +
        static_cast<int64_t>(h) * head_dim;
    const bool aligned =
        (reinterpret_cast<uintptr_t>(dout) | reinterpret_cast<uintptr_t>(out)) %
            16 ==
        0;
    if (aligned && head_dim % kVector == 0) {
      for (int d = sub * kVector; d < head_dim; d += kLanesPerRow * kVector) {
        const uint4 a = *reinterpret_cast<const uint4*>(dout + offset + d);
        const uint4 c = *reinterpret_cast<const uint4*>(out + offset + d);
        const T* av = reinterpret_cast<const T*>(&a);
        const T* cv = reinterpret_cast<const T*>(&c);
#pragma unroll
        for (int i = 0; i < kVector; ++i) {
          sum += ToFloat(av[i]) * ToFloat(cv[i]);
        }
      }
    } else {
      for (int d = sub; d < head_dim; d += kLanesPerRow) {
        sum += ToFloat(dout[offset + d]) * ToFloat(out[offset + d]);
      }
    }
  }
#pragma unroll
  for (int step = kLanesPerRow / 2; step > 0; step /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, step);
  }
  if (active && sub == 0) delta[row] = sum;
}

// grid (num_tiles, B*H): one CTA per 64-key tile, looping over the query
// tiles that can see it. dK and dV stay in registers; dQ contributions go
// to an f32 accumulator with atomics (several key tiles share a query row).
// The next query tile's Q, dO, logsumexp and delta are copied (cp.async,
// double-buffered) under this tile's products, and dQ goes out as paired f32
// reductions (red.global.add.v2.f32) when head_dim is even.
template <typename T, int DP>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardKernel(const T* __restrict__ dout, const T* __restrict__ qkv,
                        const float* __restrict__ logsumexp,
                        const float* __restrict__ delta,
                        float* __restrict__ dq_accum, T* __restrict__ dqkv,
                        int seq_len, int heads, int head_dim, float scale,
                        float scale_log2) {
  constexpr int kStride = DP + 8;
  constexpr int kDsStride = kTile + 8;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  constexpr int kStages = 2;
  T* sk = reinterpret_cast<T*>(shared_bytes);  // (64 keys, DP)
  T* sv = sk + kTile * kStride;                // (64 keys, DP)
  T* sds = sv + kTile * kStride;               // (64 queries, 64 keys)
  // Per stage: Q (64 queries, DP), dO (64 queries, DP).
  T* sstage = sds + kTile * kDsStride;
  // Per stage: logsumexp (64), delta (64), f32.
  float* sstats =
      reinterpret_cast<float*>(sstage + kStages * 2 * kTile * kStride);

  const int kt = blockIdx.x;
  const int num_tiles = gridDim.x;
  const int bh = blockIdx.y;
  const int b = bh / heads, h = bh % heads;
  const int64_t channels = static_cast<int64_t>(heads) * head_dim;
  const int64_t ld = 3 * channels;
  const int64_t token0 = static_cast<int64_t>(b) * seq_len;
  const T* q_src = qkv + token0 * ld + h * head_dim;
  const T* k_src = q_src + channels;
  const T* v_src = q_src + 2 * channels;
  const T* do_src = dout + token0 * channels + h * head_dim;
  const bool vector = head_dim % 8 == 0;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int key_row0 = kt * kTile + warp * 16 + g;  // and key_row0 + 8

  // Copies query tile `tile` into stage `stage`, asynchronously (Q and dO
  // by LoadTile's cp.async when `vector`, the statistics always).
  auto load_stage = [&](int stage, int tile) {
    T* q_dst = sstage + stage * 2 * kTile * kStride;
    LoadTile<T, DP>(q_dst, q_src, ld, tile * kTile, seq_len, head_dim, vector);
    LoadTile<T, DP>(q_dst + kTile * kStride, do_src, channels, tile * kTile,
                    seq_len, head_dim, vector);
    float* stats = sstats + stage * 2 * kTile;
    for (int i = threadIdx.x; i < kTile; i += kThreads) {
      const int query = tile * kTile + i;
      const bool valid = query < seq_len;
      const int64_t at =
          static_cast<int64_t>(bh) * seq_len + (valid ? query : 0);
      CopyFloatAsync(stats + i, logsumexp + at, valid);
      CopyFloatAsync(stats + kTile + i, delta + at, valid);
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };

  LoadTile<T, DP>(sk, k_src, ld, kt * kTile, seq_len, head_dim, vector);
  LoadTile<T, DP>(sv, v_src, ld, kt * kTile, seq_len, head_dim, vector);
  load_stage(0, kt);

  float dk[DP / 8][4], dv[DP / 8][4];
#pragma unroll
  for (int i = 0; i < DP / 8; ++i) {
    dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.0f;
    dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
  }

  for (int qt = kt; qt < num_tiles; ++qt) {
    const int stage = (qt - kt) & 1;
    const T* sq = sstage + stage * 2 * kTile * kStride;
    const T* sdo = sq + kTile * kStride;
    const float* slse = sstats + stage * 2 * kTile;  // natural log
    const float* sdelta = slse + kTile;
    // Tile qt (the only copies in flight) has landed, and everyone is done
    // with tile qt - 1 (its stage and dS), whose stage receives qt + 1.
    WaitTiles();
    if (qt + 1 < num_tiles) load_stage(stage ^ 1, qt + 1);

    // P^T (16 keys, 64 queries) = exp(scale * K Q^T - logsumexp).
    float p[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) p[i][0] = p[i][1] = p[i][2] = p[i][3] = 0.0f;
    MatmulABt<T, DP>(p, sk, sq, warp * 16);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int local_q = nt * 8 + 2 * t + (e & 1);
        const int key = key_row0 + (e >> 1) * 8;
        const int query = qt * kTile + local_q;
        // Padded query rows (zero-filled statistics) get probability 0 too.
        p[nt][e] = key > query || query >= seq_len
                       ? 0.0f
                       : exp2f(p[nt][e] * scale_log2 - slse[local_q] * kLog2e);
      }
    }
    // dV (16 keys, DP) += P^T dO.
    uint32_t af[4][4];
    PackA<T>(p, af);
    MatmulPB<T, DP>(dv, af, sdo);

    // dP^T (16 keys, 64 queries) = V dO^T; dS^T = P^T (dP^T - delta).
    float ds[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i)
      ds[i][0] = ds[i][1] = ds[i][2] = ds[i][3] = 0.0f;
    MatmulABt<T, DP>(ds, sv, sdo, warp * 16);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int local_q = nt * 8 + 2 * t + (e & 1);
        ds[nt][e] = p[nt][e] * (ds[nt][e] - sdelta[local_q]);
      }
    }
    // dK (16 keys, DP) += dS^T Q (scaled at the end).
    PackA<T>(ds, af);
    MatmulPB<T, DP>(dk, af, sq);

    // dS to shared memory as (queries, keys) for dQ = dS K.
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int local_q = nt * 8 + 2 * t + (e & 1);
        const int local_key = warp * 16 + g + (e >> 1) * 8;
        sds[local_q * kDsStride + local_key] = FromFloat<T>(ds[nt][e]);
      }
    }
    __syncthreads();

    // dQ rows [warp*16, warp*16+16) of this query tile += scale * dS K.
    float dq[DP / 8][4];
#pragma unroll
    for (int i = 0; i < DP / 8; ++i)
      dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < 4; ++kc) {
      const T* ap = sds + (warp * 16 + g) * kDsStride + kc * 16 + 2 * t;
      uint32_t a[4] = {Lds32(ap), Lds32(ap + 8 * kDsStride), Lds32(ap + 8),
                       Lds32(ap + 8 * kDsStride + 8)};
#pragma unroll
      for (int dt = 0; dt < DP / 8; dt += 2) {
        uint32_t bf[4];
        LdMatrixX4Trans(bf, sk + (kc * 16 + (lane & 15)) * kStride + dt * 8 +
                                (lane >> 4) * 8);
        Mma<T>::Run(dq[dt], a, bf[0], bf[1]);
        Mma<T>::Run(dq[dt + 1], a, bf[2], bf[3]);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int query = qt * kTile + warp * 16 + g + r * 8;
      if (query >= seq_len) continue;
      float* dst =
          dq_accum + (static_cast<int64_t>(bh) * seq_len + query) * head_dim;
      if (head_dim % 2 == 0) {
        // col is even and so is the row offset: 8-byte aligned pairs, one
        // reduction each (sm_90 float2 atomicAdd), half the L2 atomics.
#pragma unroll
        for (int dt = 0; dt < DP / 8; ++dt) {
          const int col = dt * 8 + 2 * t;
          if (col < head_dim) {
            atomicAdd(
                reinterpret_cast<float2*>(dst + col),
                make_float2(dq[dt][2 * r] * scale, dq[dt][2 * r + 1] * scale));
          }
        }
        continue;
      }
#pragma unroll
      for (int dt = 0; dt < DP / 8; ++dt) {
        const int col = dt * 8 + 2 * t;
        if (col < head_dim) atomicAdd(dst + col, dq[dt][2 * r] * scale);
        if (col + 1 < head_dim)
          atomicAdd(dst + col + 1, dq[dt][2 * r + 1] * scale);
      }
    }
  }

  // dK, dV rows of this key tile into dqkv's k and v parts.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key_row0 + r * 8;
    if (key >= seq_len) continue;
    T* dk_dst = dqkv + (token0 + key) * ld + channels + h * head_dim;
    T* dv_dst = dk_dst + channels;
#pragma unroll
    for (int dt = 0; dt < DP / 8; ++dt) {
      const int col = dt * 8 + 2 * t;
      if (col < head_dim) {
        dk_dst[col] = FromFloat<T>(dk[dt][2 * r] * scale);
        dv_dst[col] = FromFloat<T>(dv[dt][2 * r]);
      }
      if (col + 1 < head_dim) {
        dk_dst[col + 1] = FromFloat<T>(dk[dt][2 * r + 1] * scale);
        dv_dst[col + 1] = FromFloat<T>(dv[dt][2 * r + 1]);
      }
    }
  }
}

// Second kernel of the "split" backward (FlashAttention-2's dQ pass): grid
// (B*H, ceil(T / 128)), block kWideThreads. A CTA owns 128 queries (warp w
// the rows [16w, 16w + 16), with their Q and dO resident in shared memory)
// and streams the 64-key K/V tiles they can see through two stages, as the
// wide forward kernel does. Per tile it recomputes P from the saved
// logsumexp, forms dS = P (dO V^T - delta) and adds dS K to dQ, which stays
// in registers: each dQ element is produced by exactly one thread and
// written once, in T, straight into dqkv's q part. That removes the f32
// workspace, its zeroing, the atomics and the conversion pass of the
// single-kernel backward, at the price of computing S and dP twice (once
// here, once in the dK/dV kernel).
// Row statistics: the two rows of a thread (g, g + 8) never change, so their
// logsumexp and delta live in registers. Rows past the sequence read 0 and
// are never written; a row's dQ depends on that row only.
template <typename T, int DP, int kMinBlocks>
__global__ void __launch_bounds__(kWideThreads, kMinBlocks)
    FlashBackwardDqKernel(const T* __restrict__ dout, const T* __restrict__ qkv,
                          const float* __restrict__ logsumexp,
                          const float* __restrict__ delta, T* __restrict__ dqkv,
                          int seq_len, int heads, int head_dim, float scale,
                          float scale_log2) {
  constexpr int kStride = DP + 8;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* sq = reinterpret_cast<T*>(shared_bytes);  // (128 queries, DP)
  T* sdo = sq + kWideTile * kStride;           // (128 queries, DP)
  T* skv = sdo + kWideTile * kStride;  // per stage: K (64, DP), V (64, DP)

  const int bh = blockIdx.x;
  // Heaviest query tiles (most keys) first, as in the forward kernel.
  const int qt = gridDim.y - 1 - blockIdx.y;
  const int b = bh / heads, h = bh % heads;
  const int64_t channels = static_cast<int64_t>(heads) * head_dim;
  const int64_t ld = 3 * channels;
  const int64_t token0 = static_cast<int64_t>(b) * seq_len;
  const T* q_src = qkv + token0 * ld + h * head_dim;
  const T* k_src = q_src + channels;
  const T* v_src = q_src + 2 * channels;
  const T* do_src = dout + token0 * channels + h * head_dim;
  const bool vector = head_dim % 8 == 0;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int warp_row0 = qt * kWideTile + warp * 16;  // first query of warp
  const int q_row0 = warp_row0 + g;                  // and q_row0 + 8
  const int num_kv = min(2 * qt + 2, (seq_len + kTile - 1) / kTile);

  LoadTile<T, DP, kWideTile, kWideThreads>(sq, q_src, ld, qt * kWideTile,
                                           seq_len, head_dim, vector);
  LoadTile<T, DP, kWideTile, kWideThreads>(
      sdo, do_src, channels, qt * kWideTile, seq_len, head_dim, vector);
  LoadTile<T, DP, kTile, kWideThreads>(skv, k_src, ld, 0, seq_len, head_dim,
                                       vector);
  LoadTile<T, DP, kTile, kWideThreads>(skv + kTile * kStride, v_src, ld, 0,
                                       seq_len, head_dim, vector);

  // Issued under the tile copies; logsumexp pre-scaled to the log2 domain.
  float lse2[2], row_delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int query = q_row0 + r * 8;
    const bool valid = query < seq_len;
    const int64_t at = static_cast<int64_t>(bh) * seq_len + query;
    lse2[r] = valid ? logsumexp[at] * kLog2e : 0.0f;
    row_delta[r] = valid ? delta[at] : 0.0f;
  }

  float dq[DP / 8][4];
#pragma unroll
  for (int i = 0; i < DP / 8; ++i)
    dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;

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
    // All keys of the tile follow all 16 rows of the warp: no contribution.
    // Warp-uniform, and no barrier follows inside the iteration.
    if (kt * kTile > warp_row0 + 15) continue;
    // Only tiles crossing the warp's diagonal mask; keys past the sequence
    // (zero-filled) lie there too, after every valid query.
    const bool diagonal = kt * kTile + kTile - 1 > warp_row0;

    // S (16 queries, 64 keys) = Q K^T; dP (16 queries, 64 keys) = dO V^T.
    float s[8][4], dp[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
      dp[i][0] = dp[i][1] = dp[i][2] = dp[i][3] = 0.0f;
    }
    MatmulABt<T, DP>(s, sq, sk, warp * 16);
    MatmulABt<T, DP>(dp, sdo, sv, warp * 16);
    // dS = P (dP - delta), with P = exp(scale S - logsumexp), into s.
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float p = exp2f(s[nt][e] * scale_log2 - lse2[e >> 1]);
        if (diagonal) {
          const int query = q_row0 + (e >> 1) * 8;
          const int key = kt * kTile + nt * 8 + 2 * t + (e & 1);
          if (key > query) p = 0.0f;
        }
        s[nt][e] = p * (dp[nt][e] - row_delta[e >> 1]);
      }
    }
    // dQ (16 queries, DP) += dS K (scaled at the end).
    uint32_t af[4][4];
    PackA<T>(s, af);
    MatmulPB<T, DP>(dq, af, sk);
  }

  T* dq_base = dqkv + token0 * ld + h * head_dim;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int query = q_row0 + r * 8;
    if (query >= seq_len) continue;
    T* dst = dq_base + static_cast<int64_t>(query) * ld;
    if (head_dim % 2 == 0) {
      // col, h * head_dim and ld are all even: 4-byte aligned pairs.
#pragma unroll
      for (int dt = 0; dt < DP / 8; ++dt) {
        const int col = dt * 8 + 2 * t;
        if (col < head_dim) {
          *reinterpret_cast<uint32_t*>(dst + col) =
              Pack<T>(dq[dt][2 * r] * scale, dq[dt][2 * r + 1] * scale);
        }
      }
      continue;
    }
#pragma unroll
    for (int dt = 0; dt < DP / 8; ++dt) {
      const int col = dt * 8 + 2 * t;
      if (col < head_dim) dst[col] = FromFloat<T>(dq[dt][2 * r] * scale);
      if (col + 1 < head_dim)
        dst[col + 1] = FromFloat<T>(dq[dt][2 * r + 1] * scale);
    }
  }
}

// First kernel of the "split" backward: dK and dV. grid (B*H, ceil(T /
// 128)), block kWideThreads. A CTA owns 128 keys (warp w the keys [16w,
// 16w + 16), dK and dV in registers) and streams the 64-query tiles that can
// see them (Q, dO, logsumexp, delta; two cp.async stages). Each query tile
// is taken in two halves of 32 queries, so the per-warp score tiles (P^T and
// dS^T, 16 keys x 32 queries) are half those of a full 64-query tile and
// the D-64 kernel fits 128 registers: two CTAs (16 warps) per SM hide the
// latency of the dependent products and exponentials that one CTA could
// not. Row statistics are read as pairs (a thread's two columns).
// Query halves wholly before the warp's keys are skipped (warp-uniform);
// only halves crossing the diagonal, or running past the sequence (whose
// statistics are zero-filled), are masked.
template <typename T, int DP, int kMinBlocks>
__global__ void __launch_bounds__(kWideThreads, kMinBlocks)
    FlashBackwardKvKernel(const T* __restrict__ dout, const T* __restrict__ qkv,
                          const float* __restrict__ logsumexp,
                          const float* __restrict__ delta, T* __restrict__ dqkv,
                          int seq_len, int heads, int head_dim, float scale,
                          float scale_log2) {
  constexpr int kStride = DP + 8;
  constexpr int kHalf = kTile / 2;  // queries per half tile
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* sk = reinterpret_cast<T*>(shared_bytes);  // (128 keys, DP)
  T* sv = sk + kWideTile * kStride;            // (128 keys, DP)
  T* sstage = sv + kWideTile * kStride;  // per stage: Q, dO (64 queries, DP)
  // Per stage: logsumexp (64, natural log), delta (64), f32.
  float* sstats = reinterpret_cast<float*>(sstage + 2 * 2 * kTile * kStride);

  const int bh = blockIdx.x;
  const int kt = blockIdx.y;  // key tile 0 (the heaviest) first
  const int num_q = (seq_len + kTile - 1) / kTile;
  const int q_begin = 2 * kt;  // first 64-query tile that sees these keys
  const int b = bh / heads, h = bh % heads;
  const int64_t channels = static_cast<int64_t>(heads) * head_dim;
  const int64_t ld = 3 * channels;
  const int64_t token0 = static_cast<int64_t>(b) * seq_len;
  const T* q_src = qkv + token0 * ld + h * head_dim;
  const T* k_src = q_src + channels;
  const T* v_src = q_src + 2 * channels;
  const T* do_src = dout + token0 * channels + h * head_dim;
  const bool vector = head_dim % 8 == 0;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int warp_key0 = kt * kWideTile + warp * 16;  // first key of warp
  const int key_row0 = warp_key0 + g;                // and key_row0 + 8

  auto load_stage = [&](int stage, int tile) {
    T* q_dst = sstage + stage * 2 * kTile * kStride;
    LoadTile<T, DP, kTile, kWideThreads>(q_dst, q_src, ld, tile * kTile,
                                         seq_len, head_dim, vector);
    LoadTile<T, DP, kTile, kWideThreads>(q_dst + kTile * kStride, do_src,
                                         channels, tile * kTile, seq_len,
                                         head_dim, vector);
    float* stats = sstats + stage * 2 * kTile;
    if (threadIdx.x < kTile) {
      const int i = threadIdx.x;
      const int query = tile * kTile + i;
      const bool valid = query < seq_len;
      const int64_t at =
          static_cast<int64_t>(bh) * seq_len + (valid ? query : 0);
      CopyFloatAsync(stats + i, logsumexp + at, valid);
      CopyFloatAsync(stats + kTile + i, delta + at, valid);
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };

  LoadTile<T, DP, kWideTile, kWideThreads>(sk, k_src, ld, kt * kWideTile,
                                           seq_len, head_dim, vector);
  LoadTile<T, DP, kWideTile, kWideThreads>(sv, v_src, ld, kt * kWideTile,
                                           seq_len, head_dim, vector);
  load_stage(0, q_begin);

  float dk[DP / 8][4], dv[DP / 8][4];
#pragma unroll
  for (int i = 0; i < DP / 8; ++i) {
    dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.0f;
    dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
  }

  for (int qt = q_begin; qt < num_q; ++qt) {
    const int stage = (qt - q_begin) & 1;
    const T* sq_tile = sstage + stage * 2 * kTile * kStride;
    const T* sdo_tile = sq_tile + kTile * kStride;
    const float* slse_tile = sstats + stage * 2 * kTile;
    const float* sdelta_tile = slse_tile + kTile;
    // Tile qt (the only copies in flight) has landed and every warp is done
    // with tile qt - 1, whose stage receives qt + 1.
    WaitTiles();
    if (qt + 1 < num_q) load_stage(stage ^ 1, qt + 1);

#pragma unroll 1
    for (int half = 0; half < 2; ++half) {
      const int q0 = qt * kTile + half * kHalf;
      if (warp_key0 > q0 + kHalf - 1) continue;  // keys after every query
      const bool need_mask = warp_key0 + 15 > q0 || q0 + kHalf > seq_len;
      const T* sq = sq_tile + half * kHalf * kStride;
      const T* sdo = sdo_tile + half * kHalf * kStride;
      const float* slse = slse_tile + half * kHalf;
      const float* sdelta = sdelta_tile + half * kHalf;

      // P^T (16 keys, 32 queries) = exp(scale K Q^T - logsumexp).
      float p[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) p[i][0] = p[i][1] = p[i][2] = p[i][3] = 0.0f;
      MatmulABt<T, DP, 4>(p, sk, sq, warp * 16);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const float2 lse =
            *reinterpret_cast<const float2*>(slse + nt * 8 + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float row_lse = (e & 1) ? lse.y : lse.x;
          float v = exp2f(p[nt][e] * scale_log2 - row_lse * kLog2e);
          if (need_mask) {
            const int key = key_row0 + (e >> 1) * 8;
            const int query = q0 + nt * 8 + 2 * t + (e & 1);
            if (key > query || query >= seq_len) v = 0.0f;
          }
          p[nt][e] = v;
        }
      }
      // dV (16 keys, DP) += P^T dO.
      uint32_t af[2][4];
      PackA<T, 4>(p, af);
      MatmulPB<T, DP, 2>(dv, af, sdo);

      // dP^T (16 keys, 32 queries) = V dO^T; dS^T = P^T (dP^T - delta).
      // (dS from the f32 P: forming it from the 16-bit P packed above freed
      // 16 registers but measured slower, 134 against 140 TFLOP/s.)
      float ds[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        ds[i][0] = ds[i][1] = ds[i][2] = ds[i][3] = 0.0f;
      MatmulABt<T, DP, 4>(ds, sv, sdo, warp * 16);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const float2 row_delta =
            *reinterpret_cast<const float2*>(sdelta + nt * 8 + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          ds[nt][e] =
              p[nt][e] * (ds[nt][e] - ((e & 1) ? row_delta.y : row_delta.x));
        }
      }
      // dK (16 keys, DP) += dS^T Q (scaled at the end).
      PackA<T, 4>(ds, af);
      MatmulPB<T, DP, 2>(dk, af, sq);
    }
  }

  // dK, dV rows of this key tile into dqkv's k and v parts.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key_row0 + r * 8;
    if (key >= seq_len) continue;
    T* dk_dst = dqkv + (token0 + key) * ld + channels + h * head_dim;
    T* dv_dst = dk_dst + channels;
    if (head_dim % 2 == 0) {
      // col, h * head_dim, channels and ld are all even: 4-byte pairs.
#pragma unroll
      for (int dt = 0; dt < DP / 8; ++dt) {
        const int col = dt * 8 + 2 * t;
        if (col < head_dim) {
          *reinterpret_cast<uint32_t*>(dk_dst + col) =
              Pack<T>(dk[dt][2 * r] * scale, dk[dt][2 * r + 1] * scale);
          *reinterpret_cast<uint32_t*>(dv_dst + col) =
              Pack<T>(dv[dt][2 * r], dv[dt][2 * r + 1]);
        }
      }
      continue;
    }
#pragma unroll
    for (int dt = 0; dt < DP / 8; ++dt) {
      const int col = dt * 8 + 2 * t;
      if (col < head_dim) {
        dk_dst[col] = FromFloat<T>(dk[dt][2 * r] * scale);
        dv_dst[col] = FromFloat<T>(dv[dt][2 * r]);
      }
      if (col + 1 < head_dim) {
        dk_dst[col + 1] = FromFloat<T>(dk[dt][2 * r + 1] * scale);
        dv_dst[col + 1] = FromFloat<T>(dv[dt][2 * r + 1]);
      }
    }
  }
}

// dqkv's q part = dq_accum (B, H, T, D) rearranged to (B, T, H, D).
template <typename T>
__global__ void WriteDqKernel(const float* __restrict__ dq_accum,
                              T* __restrict__ dqkv, int batch, int seq_len,
                              int heads, int head_dim) {
  const int64_t channels = static_cast<int64_t>(heads) * head_dim;
  const int64_t idx =
      static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(batch) * seq_len * channels) return;
  const int64_t token = idx / channels;  // b * T + t
  const int64_t c = idx % channels;
  const int64_t b = token / seq_len, tpos = token % seq_len;
  const int64_t h = c / head_dim, d = c % head_dim;
  dqkv[token * 3 * channels + c] =
      FromFloat<T>(dq_accum[((b * heads + h) * seq_len + tpos) * head_dim + d]);
}

// dqkv must be zeroed first (dK, dV are accumulated with atomics).
__global__ void SimpleBackwardKernel(const float* __restrict__ dout,
                                     const float* __restrict__ qkv,
                                     const float* __restrict__ logsumexp,
                                     const float* __restrict__ delta,
                                     float* dqkv, int batch, int seq_len,
                                     int heads, int head_dim, float scale) {
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= static_cast<int64_t>(batch) * heads * seq_len) return;
  const int64_t bh = row / seq_len;
  const int query = static_cast<int>(row % seq_len);
  const int64_t b = bh / heads, h = bh % heads;
  const int64_t channels = static_cast<int64_t>(heads) * head_dim;
  const int64_t ld = 3 * channels;
  const float* base = qkv + b * seq_len * ld + h * head_dim;
  float* dbase = dqkv + b * seq_len * ld + h * head_dim;
  const float* dorow = dout + (b * seq_len + query) * channels + h * head_dim;
  float q[kMaxPerLane], dov[kMaxPerLane], dq[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + 32 * i;
    q[i] = d < head_dim ? base[query * ld + d] : 0.0f;
    dov[i] = d < head_dim ? dorow[d] : 0.0f;
    dq[i] = 0.0f;
  }
  const float lse = logsumexp[row];
  const float dlt = delta[row];
  for (int key = 0; key <= query; ++key) {
    const float* k = base + static_cast<int64_t>(key) * ld + channels;
    const float* v = k + channels;
    float dot = 0.0f, dp = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < head_dim) {
        dot += q[i] * k[d];
        dp += dov[i] * v[d];
      }
    }
    const float p = expf(WarpSum(dot) * scale - lse);
    const float ds = p * (WarpSum(dp) - dlt);
    float* dk = dbase + static_cast<int64_t>(key) * ld + channels;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < head_dim) {
        dq[i] += ds * k[d] * scale;
        atomicAdd(dk + d, ds * q[i] * scale);
        atomicAdd(dk + channels + d, p * dov[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < head_dim) dbase[query * ld + d] = dq[i];
  }
}

// K, V, dS, then two stages of Q, dO, logsumexp and delta.
template <int DP>
constexpr size_t BackwardSharedBytes() {
  return 2 * kTile * (DP + 8) * 2 + kTile * (kTile + 8) * 2 +
         2 * (2 * kTile * (DP + 8) * 2 + 2 * kTile * 4);
}
// K, V (128 keys), two stages of Q, dO, logsumexp, delta.
template <int DP>
constexpr size_t BackwardKvSharedBytes() {
  return 2 * kWideTile * (DP + 8) * 2 +
         2 * (2 * kTile * (DP + 8) * 2 + 2 * kTile * 4);
}
// Q, dO (128 queries), two stages of K and V (64 keys each).
template <int DP>
constexpr size_t BackwardDqSharedBytes() {
  return (2 * kWideTile + 4 * kTile) * (DP + 8) * 2;
}

// Whether the two-kernel backward (dK/dV, then dQ) runs at this head size:
// padded D 64 and 128. It writes dQ itself, so the f32 accumulator is
// neither zeroed nor converted; other head sizes run the 4-warp pipelined
// kernel with dQ reductions into the accumulator.
bool IsSplitBackward(int head_dim) {
  const int dp =
      DispatchHeadDim(head_dim, [](auto dp) { return decltype(dp)::value; });
  return dp == 64 || dp == 128;
}

// dq_accum is unused (may be anything) when IsSplitBackward.
template <typename T>
int BackwardTensorCore(const void* dout, const void* qkv,
                       const float* logsumexp, const float* delta,
                       float* dq_accum, void* dqkv, int batch, int seq_len,
                       int heads, int head_dim, cudaStream_t stream) {
  return DispatchHeadDim(head_dim, [&](auto dp) {
    constexpr int DP = decltype(dp)::value;
    const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
    if constexpr (DP == 64 || DP == 128) {
      const dim3 grid(batch * heads, (seq_len + kWideTile - 1) / kWideTile);
      // dK, dV: FlashBackwardKvKernel (half query tiles; two CTAs per SM at
      // D 64).
      constexpr size_t kv_shared = BackwardKvSharedBytes<DP>();
      constexpr int kKvMinBlocks = DP == 64 ? 2 : 1;
      auto kv_kernel = FlashBackwardKvKernel<T, DP, kKvMinBlocks>;
      AllowSharedBytes(kv_kernel, kv_shared);
      kv_kernel<<<grid, kWideThreads, kv_shared, stream>>>(
          static_cast<const T*>(dout), static_cast<const T*>(qkv), logsumexp,
          delta, static_cast<T*>(dqkv), seq_len, heads, head_dim, scale,
          scale * kLog2e);
      const int error = static_cast<int>(cudaGetLastError());
      if (error != 0) return error;
      // dQ. At D 64 two CTAs fit an SM (72 KB of shared memory each, and
      // the accumulators are half those of dK+dV); at D 128 shared memory
      // (139 KB) allows one anyway.
      constexpr size_t dq_shared = BackwardDqSharedBytes<DP>();
      constexpr int kDqMinBlocks = DP == 64 ? 2 : 1;
      auto dq_kernel = FlashBackwardDqKernel<T, DP, kDqMinBlocks>;
      AllowSharedBytes(dq_kernel, dq_shared);
      dq_kernel<<<grid, kWideThreads, dq_shared, stream>>>(
          static_cast<const T*>(dout), static_cast<const T*>(qkv), logsumexp,
          delta, static_cast<T*>(dqkv), seq_len, heads, head_dim, scale,
          scale * kLog2e);
      return static_cast<int>(cudaGetLastError());
    } else {
      constexpr size_t shared = BackwardSharedBytes<DP>();
      auto kernel = FlashBackwardKernel<T, DP>;
      AllowSharedBytes(kernel, shared);
      const dim3 grid((seq_len + kTile - 1) / kTile, batch * heads);
      kernel<<<grid, kThreads, shared, stream>>>(
          static_cast<const T*>(dout), static_cast<const T*>(qkv), logsumexp,
          delta, dq_accum, static_cast<T*>(dqkv), seq_len, heads, head_dim,
          scale, scale * kLog2e);
      return static_cast<int>(cudaGetLastError());
    }
  });
}

int64_t RoundUp256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

size_t BackwardWorkspaceBytes(int batch, int seq_len, int heads, int head_dim) {
  const int64_t rows = static_cast<int64_t>(batch) * heads * seq_len;
  return static_cast<size_t>(RoundUp256(rows * head_dim * 4) +
                             RoundUp256(rows * 4));
}

float* DeltaInWorkspace(void* workspace, int batch, int seq_len, int heads,
                        int head_dim) {
  const int64_t rows = static_cast<int64_t>(batch) * heads * seq_len;
  return reinterpret_cast<float*>(static_cast<char*>(workspace) +
                                  RoundUp256(rows * head_dim * 4));
}

void LaunchDelta(const void* dout, const void* out, float* delta, int batch,
                 int seq_len, int heads, int head_dim, int dtype,
                 cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(batch) * heads * seq_len;
  // AttentionDeltaKernel: 256 threads, 8 per row.
  const unsigned grid = static_cast<unsigned>((rows + 31) / 32);
  auto run = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    AttentionDeltaKernel<T><<<grid, 256, 0, stream>>>(
        static_cast<const T*>(dout), static_cast<const T*>(out), delta, batch,
        seq_len, heads, head_dim);
  };
  switch (dtype) {
    case kBF16:
      return run(static_cast<__nv_bfloat16*>(nullptr));
    case kF16:
      return run(static_cast<__half*>(nullptr));
    case kF32:
      return run(static_cast<float*>(nullptr));
    default:
      return;
  }
}

int LaunchBackward(const void* dout, const void* qkv, const void* out,
                   const float* logsumexp, void* dqkv, void* workspace,
                   int batch, int seq_len, int heads, int head_dim, int dtype,
                   cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(batch) * heads * seq_len;
  float* dq_accum = static_cast<float*>(workspace);
  float* delta = DeltaInWorkspace(workspace, batch, seq_len, heads, head_dim);
  const unsigned delta_grid = static_cast<unsigned>((rows + 7) / 8);
  const int64_t channels = static_cast<int64_t>(heads) * head_dim;
  const int64_t dq_count = static_cast<int64_t>(batch) * seq_len * channels;
  const unsigned dq_grid = static_cast<unsigned>((dq_count + 255) / 256);
  int error = 0;
  switch (dtype) {
    case kBF16:
    case kF16: {
      const bool split = IsSplitBackward(head_dim);
      if (!split) {
        error = static_cast<int>(
            cudaMemsetAsync(dq_accum, 0, rows * head_dim * 4, stream));
        if (error != 0) return error;
      }
      LaunchDelta(dout, out, delta, batch, seq_len, heads, head_dim, dtype,
                  stream);
      auto run = [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        int e =
            BackwardTensorCore<T>(dout, qkv, logsumexp, delta, dq_accum, dqkv,
                                  batch, seq_len, heads, head_dim, stream);
        if (e != 0) return e;
        if (split) return 0;
        WriteDqKernel<T><<<dq_grid, 256, 0, stream>>>(
            dq_accum, static_cast<T*>(dqkv), batch, seq_len, heads, head_dim);
        return static_cast<int>(cudaGetLastError());
      };
      if (dtype == kBF16) return run(static_cast<__nv_bfloat16*>(nullptr));
      return run(static_cast<__half*>(nullptr));
    }
    case kF32: {
      error =
          static_cast<int>(cudaMemsetAsync(dqkv, 0, dq_count * 3 * 4, stream));
      if (error != 0) return error;
      LaunchDelta(dout, out, delta, batch, seq_len, heads, head_dim, dtype,
                  stream);
      SimpleBackwardKernel<<<delta_grid, 256, 0, stream>>>(
          static_cast<const float*>(dout), static_cast<const float*>(qkv),
          logsumexp, delta, static_cast<float*>(dqkv), batch, seq_len, heads,
          head_dim, 1.0f / sqrtf(static_cast<float>(head_dim)));
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
