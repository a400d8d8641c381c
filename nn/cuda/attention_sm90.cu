// Causal attention, forward and backward, on Hopper warpgroup products
// (wgmma), head size 64. Same algorithm as the mma.sync FlashAttention-2
// kernels (online softmax, the (T, T) scores never leave the chip); what
// changes is the matrix unit: one warpgroup issues 64 x 64 x 16 products that
// read the key and value tiles straight from (swizzled) shared memory, instead
// of four warps each loading mma.sync fragments through ldmatrix.
//
// CTA = one warpgroup (128 threads) owning 64 query rows; warp w holds rows
// 16w..16w+15 in the accumulator layout of wgmma.cuh. Q stays in shared
// memory (A operand of S = Q K^T); the probabilities P are rounded in
// registers into the A operand of O += P V. Key/value tiles of 64 rows are
// double-buffered: tile j + 1 is copied (cp.async) while tile j is used.
// Small CTAs (41 KB of shared memory, <= 128 registers) let four run per
// SM, so one CTA's softmax overlaps another's products. (FlashAttention-3's
// intra-warpgroup pipelining, S_j issued with P_{j-1} V_{j-1} and softmax
// under the second product, measured no faster on the H200: 241.6 against
// 241.5 ms per GPT-1.3B step.)
//
// Backward: FlashBackwardKvSm90Kernel (dK, dV per key tile) then
// FlashBackwardDqSm90Kernel (dQ per query tile), the split of
// attention_backward.cu (each recomputes S and dP; no atomics) with the same
// products as warpgroup products. Measured at B 16, T 1024, H 32 on the H200:
// forward 0.31 ms (219 TFLOP/s) against 0.41, backward 0.87 ms (198)
// against 1.23.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "nn/cuda/attention_common.cuh"
#include "nn/cuda/attention_sm90.h"
#include "nn/cuda/cuda_common.cuh"
#include "nn/cuda/wgmma.cuh"

namespace ze {
namespace nn {
namespace cuda_kernels {
namespace {

using attention::kLn2;
using attention::kLog2e;
using attention::Pack;
using attention::SharedAddress;
using sm90::Descriptor;
using sm90::Swizzle128;

constexpr int kRows = 64;      // query rows per CTA, key rows per tile
constexpr int kHeadDim = 64;   // one 128-byte swizzled row per token
constexpr int kThreads = 128;  // one warpgroup
constexpr uint32_t kTileBytes = kRows * kHeadDim * 2;
// Q, then two stages of (K, V); plus slack to align the tiles to 1024
// bytes (the swizzle pattern's period, which descriptors assume).
constexpr size_t kForwardSharedBytes = 5 * kTileBytes + 1024;
// dK/dV: K, V, two stages of (Q, dO), two stages of 64 logsumexp + 64
// delta. dQ: Q, dO, two stages of (K, V).
constexpr size_t kBackwardKvSharedBytes = 6 * kTileBytes + 2 * 512 + 1024;
constexpr size_t kBackwardDqSharedBytes = 6 * kTileBytes + 1024;

// Copies rows [row0, row0 + 64) x 64 columns of a (T, ld) slice into the
// swizzled tile at shared address `tile` (cp.async, 16 bytes a copy, rows
// >= seq_len zero-filled). The caller commits. All 128 threads take part.
template <typename T>
__device__ __forceinline__ void LoadTile(uint32_t tile, const T* src,
                                         int64_t ld, int row0, int seq_len) {
#pragma unroll
  for (int i = 0; i < kRows * 8 / kThreads; ++i) {
    const int index = threadIdx.x + i * kThreads;
    const int r = index >> 3, c = (index & 7) * 8;
    const bool valid = row0 + r < seq_len;
    const T* g = valid ? src + static_cast<int64_t>(row0 + r) * ld + c : src;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                     tile + Swizzle128(r, c)),
                 "l"(g), "r"(valid ? 16 : 0));
  }
}

__device__ __forceinline__ void CommitCopies() {
  asm volatile("cp.async.commit_group;\n" ::);
}

__device__ __forceinline__ void WaitCopies() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// Every copy this thread issued has landed and is visible to the async
// proxy the products read through, for every thread of the CTA (which also
// means everyone is past its earlier products on the buffers about to be
// refilled).
__device__ __forceinline__ void CopiesLanded() {
  WaitCopies();
  sm90::FenceProxyAsync();
  __syncthreads();
}

// Row 0 of query head h of sequence b in `qkv` (Sm90Qkv's addressing).
template <typename Pointer>
__device__ __forceinline__ Pointer QueryRows(const Sm90Qkv<Pointer>& qkv, int b,
                                             int h, int seq_len) {
  return qkv.q + static_cast<int64_t>(b) * seq_len * qkv.q_stride +
         h * kHeadDim;
}

// Row 0 of key/value head j of sequence b, in `base` (qkv.k or qkv.v).
template <typename Pointer>
__device__ __forceinline__ Pointer KeyRows(Pointer base,
                                           const Sm90Qkv<Pointer>& qkv, int b,
                                           int j, int seq_len) {
  return base + static_cast<int64_t>(b) * seq_len * qkv.kv_stride +
         j * kHeadDim;
}

// d (64 x 64) = A B^T over the 64-element rows of two swizzled tiles, both
// K-major (A rows = d's rows, B rows = d's columns). Issue only: the caller
// fences before and commits and waits after.
template <typename T>
__device__ __forceinline__ void IssueRowProduct(float (&d)[32], uint32_t a_tile,
                                                uint32_t b_tile) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    sm90::WgmmaM64N64K16<T, 0, 0>(d, Descriptor(a_tile + kk * 32),
                                  Descriptor(b_tile + kk * 32), kk > 0);
  }
}

// d (64 x 64) += A B, A (64 x 64) as register fragments (PackOperandA), B
// the 64 rows of a swizzled tile taken MN-major (16 rows per k16 slice).
// Issue only, as above.
template <typename T>
__device__ __forceinline__ void IssueOperandProduct(float (&d)[32],
                                                    const uint32_t (&a)[4][4],
                                                    uint32_t b_tile) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    sm90::WgmmaM64N64K16<T, 1>(d, a[kk], Descriptor(b_tile + kk * 2048), true);
  }
}

// One online-softmax step over a 64 x 64 score tile held in the
// accumulator layout: masks keys past the query on the diagonal tile,
// raises the running row maxima (log2 domain), turns s into the
// probabilities exp2(s * scale_log2 - max) in place, adds them to the
// running row sums (this thread's columns only) and returns in
// `correction` the factor the earlier sums and outputs must be scaled by.
// q_row0: this thread's first query row (the second is q_row0 + 8).
__device__ __forceinline__ void SoftmaxStep(float (&s)[32], float (&row_max)[2],
                                            float (&row_sum)[2],
                                            float (&correction)[2],
                                            bool diagonal, int q_row0, int key0,
                                            int t, float scale_log2) {
  // Key 0 of a tile is never past its query, so no row is all -inf.
  if (diagonal) {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int query = q_row0 + ((i >> 1) & 1) * 8;
      const int key = key0 + (i >> 2) * 8 + 2 * t + (i & 1);
      if (key > query) s[i] = -INFINITY;
    }
  }
  // Maxima of the raw scores; the scale into the log2 domain rides on the
  // exponent's FMA.
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    tile_max[(i >> 1) & 1] = fmaxf(tile_max[(i >> 1) & 1], s[i]);
  }
  float neg_max[2];
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
  for (int i = 0; i < 32; ++i) {
    const int r = (i >> 1) & 1;
    s[i] = exp2f(fmaf(s[i], scale_log2, neg_max[r]));
    row_sum[r] += s[i];
  }
}

// Rounds a 64 x 64 accumulator tile into the A operand of a product over
// its columns: k16 slice kk is D blocks 2kk and 2kk + 1.
template <typename T>
__device__ __forceinline__ void PackOperandA(const float (&d)[32],
                                             uint32_t (&a)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      a[kk][q] = Pack<T>(d[8 * kk + 2 * q], d[8 * kk + 2 * q + 1]);
    }
  }
}

// Writes this thread's two rows of the normalised output and their
// logsumexp (natural log) once all key tiles are in.
template <typename T>
__device__ __forceinline__ void StoreForwardOutput(
    const float (&o)[32], float (&row_sum)[2], const float (&row_max)[2],
    T* out_base, int64_t channels, float* logsumexp_row, int q_row0,
    int seq_len, int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int query = q_row0 + r * 8;
    if (query >= seq_len) continue;
    const float inverse = 1.0f / row_sum[r];
    T* destination = out_base + static_cast<int64_t>(query) * channels;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      *reinterpret_cast<uint32_t*>(destination + j * 8 + 2 * t) =
          Pack<T>(o[4 * j + 2 * r] * inverse, o[4 * j + 2 * r + 1] * inverse);
    }
    if (t == 0) {
      logsumexp_row[query] = (row_max[r] + log2f(row_sum[r])) * kLn2;
    }
  }
}

// grid (B*H, query tiles), the last (most expensive) tiles first; block
// 128. scale_log2 = log2(e) / sqrt(64). group = H / kv_heads.
template <typename T>
__global__ void __launch_bounds__(kThreads, 4)
    FlashForwardSm90Kernel(const Sm90Qkv<const T*> in, T* __restrict__ out,
                           float* __restrict__ logsumexp, int seq_len,
                           int heads, int group, float scale_log2) {
  extern __shared__ unsigned char shared_raw[];
  const uint32_t q_tile = (SharedAddress(shared_raw) + 1023) & ~1023u;
  auto key_tile = [&](int stage) {
    return q_tile + (1 + 2 * stage) * kTileBytes;
  };
  auto value_tile = [&](int stage) {
    return q_tile + (2 + 2 * stage) * kTileBytes;
  };

  const int bh = blockIdx.x;
  const int qt = gridDim.y - 1 - blockIdx.y;
  const int b = bh / heads, h = bh % heads;
  const int64_t channels = static_cast<int64_t>(heads) * kHeadDim;
  const T* q_src = QueryRows(in, b, h, seq_len);
  const T* k_src = KeyRows(in.k, in, b, h / group, seq_len);
  const T* v_src = KeyRows(in.v, in, b, h / group, seq_len);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;

  LoadTile(q_tile, q_src, in.q_stride, qt * kRows, seq_len);
  LoadTile(key_tile(0), k_src, in.kv_stride, 0, seq_len);
  LoadTile(value_tile(0), v_src, in.kv_stride, 0, seq_len);
  CommitCopies();
  WaitCopies();
  __syncthreads();

  float o[32];
  float s[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i] = s[i] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};      // log2 domain
  float row_sum[2] = {0.0f, 0.0f};                // this thread's columns only
  const int q_row0 = qt * kRows + warp * 16 + g;  // and q_row0 + 8

  for (int kt = 0; kt <= qt; ++kt) {
    const int stage = kt & 1;
    // Tile kt has landed for every thread and is visible to the async
    // proxy; everyone is done with tile kt - 1, whose stage now receives
    // tile kt + 1.
    CopiesLanded();
    if (kt < qt) {
      LoadTile(key_tile(stage ^ 1), k_src, in.kv_stride, (kt + 1) * kRows,
               seq_len);
      LoadTile(value_tile(stage ^ 1), v_src, in.kv_stride, (kt + 1) * kRows,
               seq_len);
      CommitCopies();
    }

    // S (64 queries x 64 keys) = Q K^T, both K-major operands read from
    // shared memory. (Q held in registers as the A operand would halve the
    // shared-memory reads, but ptxas 13.0 reused those registers inside
    // the loop, so later key tiles saw garbage queries.) The
    // pins keep the compiler from moving reads of s or o across the
    // asynchronous products (it sees no dependency on the wait).
    sm90::PinRegisters(s);
    sm90::WgmmaFence();
    IssueRowProduct<T>(s, q_tile, key_tile(stage));
    sm90::WgmmaCommit();
    sm90::WgmmaWait<0>();
    sm90::PinRegisters(s);

    float correction[2];
    SoftmaxStep(s, row_max, row_sum, correction, kt == qt, q_row0, kt * kRows,
                t, scale_log2);
#pragma unroll
    for (int i = 0; i < 32; ++i) o[i] *= correction[(i >> 1) & 1];
    uint32_t p_fragments[4][4];
    PackOperandA<T>(s, p_fragments);

    // O (64 queries x 64) += P V; V (keys x D, D contiguous) is an
    // MN-major B operand, 16 key rows per k16 slice.
    sm90::PinRegisters(o);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) sm90::PinRegisters(p_fragments[kk]);
    sm90::WgmmaFence();
    IssueOperandProduct<T>(o, p_fragments, value_tile(stage));
    sm90::WgmmaCommit();
    sm90::WgmmaWait<0>();
    sm90::PinRegisters(o);
    // The product read p_fragments asynchronously: the pins keep the
    // compiler from reusing those registers before the wait, instead of
    // relying on ptxas to track it (it did not for Q, see above).
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) sm90::PinRegisters(p_fragments[kk]);
  }

  StoreForwardOutput<T>(
      o, row_sum, row_max,
      out + static_cast<int64_t>(b) * seq_len * channels + h * kHeadDim,
      channels, logsumexp + static_cast<int64_t>(bh) * seq_len, q_row0, seq_len,
      t);
}

// Copies the two 64-element f32 rows logsumexp[row0..] and delta[row0..]
// of one (b, h) into `stats` (shared: 64 logsumexp then 64 delta), one
// 4-byte cp.async per thread, zero for rows >= seq_len. The caller commits.
__device__ __forceinline__ void LoadRowStats(uint32_t stats,
                                             const float* logsumexp,
                                             const float* delta, int row0,
                                             int seq_len) {
  const int i = threadIdx.x & 63;
  const float* source = threadIdx.x < 64 ? logsumexp : delta;
  const bool valid = row0 + i < seq_len;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(
                   stats + threadIdx.x * 4),
               "l"(valid ? source + row0 + i : source), "r"(valid ? 4 : 0));
}

// dK and dV of one 64-key tile: loops over the query tiles that see it,
// S^T = K Q^T and dP^T = V dO^T (both operands K-major in shared memory),
// P^T = exp(S^T scale - logsumexp[query]), dS^T = P^T (dP^T - delta[query]),
// dV += P^T dO and dK += dS^T Q (P^T and dS^T from registers, dO and Q
// MN-major). Rows are keys here, so a thread's per-query statistics are
// per column: 16 of each. Q, dO and their statistics are double-buffered.
// With group > 1 the loop runs over the query tiles of each of the key/value
// head's query heads in turn (one sequence of steps, so the prefetch crosses
// from one head to the next), dK and dV summing them in f32.
// grid (B*kv_heads, key tiles), the first (most query tiles) first; block
// 128.
template <typename T>
__global__ void __launch_bounds__(kThreads, 2)
    FlashBackwardKvSm90Kernel(const T* __restrict__ dout,
                              const Sm90Qkv<const T*> in,
                              const float* __restrict__ logsumexp,
                              const float* __restrict__ delta,
                              const Sm90Qkv<T*> grad, int seq_len, int heads,
                              int group, float scale, float scale_log2) {
  extern __shared__ unsigned char shared_raw[];
  const uint32_t key_tile = (SharedAddress(shared_raw) + 1023) & ~1023u;
  const uint32_t value_tile = key_tile + kTileBytes;
  auto query_tile = [&](int stage) {
    return key_tile + (2 + 2 * stage) * kTileBytes;
  };
  auto grad_out_tile = [&](int stage) {
    return key_tile + (3 + 2 * stage) * kTileBytes;
  };
  auto stats_tile = [&](int stage) {
    return key_tile + 6 * kTileBytes + stage * 512;
  };
  const unsigned char* stats_base =
      shared_raw + (key_tile + 6 * kTileBytes - SharedAddress(shared_raw));

  const int kv_heads = heads / group;
  const int bj = blockIdx.x;
  const int kt = blockIdx.y;
  const int b = bj / kv_heads, j = bj % kv_heads;
  const int64_t channels = static_cast<int64_t>(heads) * kHeadDim;
  const int query_tiles = (seq_len + kRows - 1) / kRows;
  const int tiles_per_head = query_tiles - kt;
  const int steps = group * tiles_per_head;
  // Step i: query head j * group + i / tiles_per_head, query tile
  // kt + i % tiles_per_head. Issues its copies into `stage`.
  auto load_step = [&](int i, int stage) {
    const int h = j * group + i / tiles_per_head;
    const int row0 = (kt + i % tiles_per_head) * kRows;
    const int64_t bh = static_cast<int64_t>(b) * heads + h;
    LoadTile(query_tile(stage), QueryRows(in, b, h, seq_len), in.q_stride, row0,
             seq_len);
    LoadTile(grad_out_tile(stage),
             dout + static_cast<int64_t>(b) * seq_len * channels + h * kHeadDim,
             channels, row0, seq_len);
    LoadRowStats(stats_tile(stage), logsumexp + bh * seq_len,
                 delta + bh * seq_len, row0, seq_len);
  };

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;

  LoadTile(key_tile, KeyRows(in.k, in, b, j, seq_len), in.kv_stride, kt * kRows,
           seq_len);
  LoadTile(value_tile, KeyRows(in.v, in, b, j, seq_len), in.kv_stride,
           kt * kRows, seq_len);
  load_step(0, 0);
  CommitCopies();

  float dk[32], dv[32], s[32], dp[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) dk[i] = dv[i] = s[i] = dp[i] = 0.0f;
  const int key_row0 = kt * kRows + warp * 16 + g;  // and key_row0 + 8

  for (int step = 0; step < steps; ++step) {
    const int qt = kt + step % tiles_per_head;
    const int stage = step & 1;
    CopiesLanded();
    if (step + 1 < steps) {
      load_step(step + 1, stage ^ 1);
      CommitCopies();
    }

    // S^T (64 keys x 64 queries) and dP^T, one batch of products.
    sm90::PinRegisters(s);
    sm90::PinRegisters(dp);
    sm90::WgmmaFence();
    IssueRowProduct<T>(s, key_tile, query_tile(stage));
    IssueRowProduct<T>(dp, value_tile, grad_out_tile(stage));
    sm90::WgmmaCommit();
    sm90::WgmmaWait<0>();
    sm90::PinRegisters(s);
    sm90::PinRegisters(dp);

    // P^T in place of S^T, from the per-column (query) logsumexp of this
    // thread's 16 columns.
    const float* stats =
        reinterpret_cast<const float*>(stats_base + stage * 512);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 lse =
          *reinterpret_cast<const float2*>(stats + 8 * j + 2 * t);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 4 * j + e;
        const float column_lse = (e & 1) ? lse.y : lse.x;
        float value = exp2f(fmaf(s[i], scale_log2, -column_lse * kLog2e));
        if (qt == kt) {
          const int key = key_row0 + (e >> 1) * 8;
          const int query = qt * kRows + 8 * j + 2 * t + (e & 1);
          if (key > query) value = 0.0f;
        }
        s[i] = value;
      }
    }
    uint32_t p_fragments[4][4], ds_fragments[4][4];
    PackOperandA<T>(s, p_fragments);

    // dS^T = P^T (dP^T - delta[query]), in place of dP^T.
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 column_delta =
          *reinterpret_cast<const float2*>(stats + 64 + 8 * j + 2 * t);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 4 * j + e;
        dp[i] = s[i] * (dp[i] - ((e & 1) ? column_delta.y : column_delta.x));
      }
    }
    PackOperandA<T>(dp, ds_fragments);

    // dV += P^T dO and dK += dS^T Q (dO and Q MN-major: 16 query rows per
    // k16 slice). Issuing dV's product before dS^T is formed, so that it
    // runs under that work, measured no faster (241.4 against 241.5 ms per
    // GPT-1.3B step): the other CTA on the SM already fills those gaps.
    sm90::PinRegisters(dv);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) sm90::PinRegisters(p_fragments[kk]);
    sm90::WgmmaFence();
    IssueOperandProduct<T>(dv, p_fragments, grad_out_tile(stage));
    sm90::PinRegisters(dk);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) sm90::PinRegisters(ds_fragments[kk]);
    sm90::WgmmaFence();
    IssueOperandProduct<T>(dk, ds_fragments, query_tile(stage));
    sm90::WgmmaCommit();
    sm90::WgmmaWait<0>();
    sm90::PinRegisters(dv);
    sm90::PinRegisters(dk);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      sm90::PinRegisters(p_fragments[kk]);
      sm90::PinRegisters(ds_fragments[kk]);
    }
  }

  T* dk_base = KeyRows(grad.k, grad, b, j, seq_len);
  T* dv_base = KeyRows(grad.v, grad, b, j, seq_len);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key_row0 + r * 8;
    if (key >= seq_len) continue;
    T* dk_row = dk_base + static_cast<int64_t>(key) * grad.kv_stride;
    T* dv_row = dv_base + static_cast<int64_t>(key) * grad.kv_stride;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      *reinterpret_cast<uint32_t*>(dk_row + j * 8 + 2 * t) =
          Pack<T>(dk[4 * j + 2 * r] * scale, dk[4 * j + 2 * r + 1] * scale);
      *reinterpret_cast<uint32_t*>(dv_row + j * 8 + 2 * t) =
          Pack<T>(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
    }
  }
}

// dQ of one 64-query tile: loops over the key tiles it sees, S = Q K^T and
// dP = dO V^T (K-major operands in shared memory), P and dS as above (now
// per row), dQ += dS K (dS from registers, K MN-major). Q and dO are
// loaded once; K and V are double-buffered.
// grid (B*H, query tiles), the last (most key tiles) first; block 128.
template <typename T>
__global__ void __launch_bounds__(kThreads, 2)
    FlashBackwardDqSm90Kernel(const T* __restrict__ dout,
                              const Sm90Qkv<const T*> in,
                              const float* __restrict__ logsumexp,
                              const float* __restrict__ delta,
                              const Sm90Qkv<T*> grad, int seq_len, int heads,
                              int group, float scale, float scale_log2) {
  extern __shared__ unsigned char shared_raw[];
  const uint32_t query_tile = (SharedAddress(shared_raw) + 1023) & ~1023u;
  const uint32_t grad_out_tile = query_tile + kTileBytes;
  auto key_tile = [&](int stage) {
    return query_tile + (2 + 2 * stage) * kTileBytes;
  };
  auto value_tile = [&](int stage) {
    return query_tile + (3 + 2 * stage) * kTileBytes;
  };

  const int bh = blockIdx.x;
  const int qt = gridDim.y - 1 - blockIdx.y;
  const int b = bh / heads, h = bh % heads;
  const int64_t channels = static_cast<int64_t>(heads) * kHeadDim;
  const T* q_src = QueryRows(in, b, h, seq_len);
  const T* k_src = KeyRows(in.k, in, b, h / group, seq_len);
  const T* v_src = KeyRows(in.v, in, b, h / group, seq_len);
  const T* do_src =
      dout + static_cast<int64_t>(b) * seq_len * channels + h * kHeadDim;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;

  LoadTile(query_tile, q_src, in.q_stride, qt * kRows, seq_len);
  LoadTile(grad_out_tile, do_src, channels, qt * kRows, seq_len);
  LoadTile(key_tile(0), k_src, in.kv_stride, 0, seq_len);
  LoadTile(value_tile(0), v_src, in.kv_stride, 0, seq_len);
  CommitCopies();

  const int q_row0 = qt * kRows + warp * 16 + g;  // and q_row0 + 8
  float neg_lse_log2[2], row_delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = q_row0 + r * 8;
    const bool valid = row < seq_len;
    const int64_t index = static_cast<int64_t>(bh) * seq_len + row;
    neg_lse_log2[r] = valid ? -logsumexp[index] * kLog2e : 0.0f;
    row_delta[r] = valid ? delta[index] : 0.0f;
  }

  float dq[32], s[32], dp[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) dq[i] = s[i] = dp[i] = 0.0f;

  for (int kt = 0; kt <= qt; ++kt) {
    const int stage = kt & 1;
    CopiesLanded();
    if (kt < qt) {
      LoadTile(key_tile(stage ^ 1), k_src, in.kv_stride, (kt + 1) * kRows,
               seq_len);
      LoadTile(value_tile(stage ^ 1), v_src, in.kv_stride, (kt + 1) * kRows,
               seq_len);
      CommitCopies();
    }

    sm90::PinRegisters(s);
    sm90::PinRegisters(dp);
    sm90::WgmmaFence();
    IssueRowProduct<T>(s, query_tile, key_tile(stage));
    IssueRowProduct<T>(dp, grad_out_tile, value_tile(stage));
    sm90::WgmmaCommit();
    sm90::WgmmaWait<0>();
    sm90::PinRegisters(s);
    sm90::PinRegisters(dp);

    uint32_t ds_fragments[4][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 4 * j + e, r = e >> 1;
        float p = exp2f(fmaf(s[i], scale_log2, neg_lse_log2[r]));
        if (kt == qt) {
          const int query = q_row0 + r * 8;
          const int key = kt * kRows + 8 * j + 2 * t + (e & 1);
          if (key > query) p = 0.0f;
        }
        ds[e] = p * (dp[i] - row_delta[r]);
      }
      const int kk = j >> 1, half = (j & 1) * 2;
      ds_fragments[kk][half] = Pack<T>(ds[0], ds[1]);
      ds_fragments[kk][half + 1] = Pack<T>(ds[2], ds[3]);
    }

    // dQ += dS K; K (keys x D) MN-major, 16 key rows per k16 slice.
    sm90::PinRegisters(dq);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) sm90::PinRegisters(ds_fragments[kk]);
    sm90::WgmmaFence();
    IssueOperandProduct<T>(dq, ds_fragments, key_tile(stage));
    sm90::WgmmaCommit();
    sm90::WgmmaWait<0>();
    sm90::PinRegisters(dq);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) sm90::PinRegisters(ds_fragments[kk]);
  }

  T* dq_base = QueryRows(grad, b, h, seq_len);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int query = q_row0 + r * 8;
    if (query >= seq_len) continue;
    T* dq_row = dq_base + static_cast<int64_t>(query) * grad.q_stride;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      *reinterpret_cast<uint32_t*>(dq_row + j * 8 + 2 * t) =
          Pack<T>(dq[4 * j + 2 * r] * scale, dq[4 * j + 2 * r + 1] * scale);
    }
  }
}

}  // namespace

bool Sm90AttentionAvailable() {
  constexpr int kMaxDevices = 64;
  // Per device: 0 not asked yet, 1 no, 2 yes (static zero-initialised).
  static std::atomic<int> cached[kMaxDevices];
  // A failed query answers "no" without caching it, and its error is
  // cleared so the fallback kernels' launch check does not report it.
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 ||
      device >= kMaxDevices) {
    cudaGetLastError();
    return false;
  }
  int known = cached[device].load(std::memory_order_relaxed);
  if (known == 0) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                               device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor,
                               device) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    known = major == 9 && minor == 0 ? 2 : 1;
    cached[device].store(known, std::memory_order_relaxed);
  }
  return known == 2;
}

namespace {

template <typename T, typename Pointer>
Sm90Qkv<T*> Typed(const Sm90Qkv<Pointer>& qkv) {
  return {static_cast<T*>(qkv.q), static_cast<T*>(qkv.k),
          static_cast<T*>(qkv.v), qkv.q_stride, qkv.kv_stride};
}

}  // namespace

int LaunchAttentionForwardSm90(const Sm90Qkv<const void*>& in, void* out,
                               float* logsumexp, int batch, int seq_len,
                               int heads, int kv_heads, int dtype,
                               cudaStream_t stream) {
  const dim3 grid(batch * heads, (seq_len + kRows - 1) / kRows);
  const float scale_log2 = kLog2e / 8.0f;  // 1 / sqrt(64)
  const int group = heads / kv_heads;
  auto launch = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    FlashForwardSm90Kernel<T><<<grid, kThreads, kForwardSharedBytes, stream>>>(
        Typed<const T>(in), static_cast<T*>(out), logsumexp, seq_len, heads,
        group, scale_log2);
    return static_cast<int>(cudaGetLastError());
  };
  if (dtype == kBF16) return launch(static_cast<__nv_bfloat16*>(nullptr));
  if (dtype == kF16) return launch(static_cast<__half*>(nullptr));
  return static_cast<int>(cudaErrorInvalidValue);
}

int LaunchAttentionBackwardSm90(const void* dout,
                                const Sm90Qkv<const void*>& in,
                                const float* logsumexp, const float* delta,
                                const Sm90Qkv<void*>& grad, int batch,
                                int seq_len, int heads, int kv_heads, int dtype,
                                cudaStream_t stream) {
  const int tiles = (seq_len + kRows - 1) / kRows;
  const int group = heads / kv_heads;
  const float scale = 0.125f;  // 1 / sqrt(64)
  auto launch = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    auto kv_kernel = FlashBackwardKvSm90Kernel<T>;
    auto dq_kernel = FlashBackwardDqSm90Kernel<T>;
    // Past the 48 KB default; setting the attribute is cheap and idempotent.
    cudaFuncSetAttribute(kv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(kBackwardKvSharedBytes));
    cudaFuncSetAttribute(dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(kBackwardDqSharedBytes));
    kv_kernel<<<dim3(batch * kv_heads, tiles), kThreads, kBackwardKvSharedBytes,
                stream>>>(static_cast<const T*>(dout), Typed<const T>(in),
                          logsumexp, delta, Typed<T>(grad), seq_len, heads,
                          group, scale, scale * kLog2e);
    const int error = static_cast<int>(cudaGetLastError());
    if (error != 0) return error;
    dq_kernel<<<dim3(batch * heads, tiles), kThreads, kBackwardDqSharedBytes,
                stream>>>(static_cast<const T*>(dout), Typed<const T>(in),
                          logsumexp, delta, Typed<T>(grad), seq_len, heads,
                          group, scale, scale * kLog2e);
    return static_cast<int>(cudaGetLastError());
  };
  if (dtype == kBF16) return launch(static_cast<__nv_bfloat16*>(nullptr));
  if (dtype == kF16) return launch(static_cast<__half*>(nullptr));
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze
