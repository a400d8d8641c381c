// Causal self-attention, FlashAttention-2 algorithm (Dao, 2023), own code.
//
// Tensor-core path (bf16/f16): a CTA of 4 warps works on a 64-row tile; each
// warp owns 16 rows and keeps its scores, probabilities and accumulators in
// mma.sync m16n8k16 fragments (registers), so softmax needs no shared-memory
// round trip. Fragment layouts (g = lane / 4, t = lane % 4):
//   A (16x16, row-major): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..),
//                         a3 (g+8, 2t+8..)
//   B (16x8, k x n):      b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g)
//   C (16x8, f32):        c0,c1 (g, 2t..2t+1), c2,c3 (g+8, 2t..2t+1)
// A C fragment pair of one 16-row x 16-column block, rounded to 16 bits, is
// exactly an A fragment: that is how P feeds P @ V.
// Operands whose k index runs along shared-memory rows (V, dO, Q, K as "B"
// of a product over rows) are loaded with ldmatrix .trans.
//
// The wide kernels (default for padded D 64 and 128, see attention.h) use
// the same fragments with 8 warps and 128 resident rows per CTA.
//
// Shared-memory rows are padded by 8 elements (16 bytes) so the 8 rows a
// quad-group or ldmatrix touches fall in distinct banks.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "nn/cuda/attention.h"
#include "nn/cuda/attention_common.cuh"
#include "nn/cuda/attention_sm90.h"
#include "nn/cuda/cuda_common.cuh"

namespace ze {
namespace nn {
namespace cuda_kernels {
namespace {

constexpr int kTile = 64;  // query rows and key rows per tile
constexpr int kWarps = 4;  // 16 rows each
constexpr int kThreads = kWarps * 32;
using attention::kLn2;
using attention::kLog2e;
using attention::Pack;
using attention::SharedAddress;

template <typename T>
struct Mma;

template <>
struct Mma<__nv_bfloat16> {
  __device__ __forceinline__ static void Run(float (&c)[4],
                                             const uint32_t (&a)[4],
                                             uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct Mma<__half> {
  __device__ __forceinline__ static void Run(float (&c)[4],
                                             const uint32_t (&a)[4],
                                             uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// Four transposed 8x8 matrices: lanes 0-7, 8-15, 16-23, 24-31 give the row
// addresses of matrices 0..3; r[i] is this lane's fragment of matrix i.
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4],
                                                const void* p) {
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(SharedAddress(p)));
}

// Four 8x8 matrices, untransposed: lanes 0-7, 8-15, 16-23, 24-31 give the
// row addresses of matrices 0..3; lane (g, t) receives row g, columns
// 2t..2t+1 of each.
// `address`: a shared-memory address (SharedAddress).
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

__device__ __forceinline__ uint32_t Lds32(const void* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// Loads rows [row0, row0 + kRows) x columns [0, DP) of a (T, ld) slice into
// a padded shared tile, zero-filling rows >= seq_len and columns >= head_dim.
// Vector path (16-byte cp.async) when head_dim % 8 == 0 and ld % 8 == 0.
// kNumThreads: the CTA size (all threads take part).
template <typename T, int DP, int kRows = kTile, int kNumThreads = kThreads>
__device__ __forceinline__ void LoadTile(T* tile, const T* src, int64_t ld,
                                         int row0, int seq_len, int head_dim,
                                         bool vector) {
  constexpr int kStride = DP + 8;
  if (vector) {
    constexpr int kChunks = DP / 8;
    for (int idx = threadIdx.x; idx < kRows * kChunks; idx += kNumThreads) {
      const int r = idx / kChunks;
      const int c = (idx % kChunks) * 8;
      const bool valid = row0 + r < seq_len && c < head_dim;
      const T* g = valid ? src + static_cast<int64_t>(row0 + r) * ld + c : src;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                       SharedAddress(tile + r * kStride + c)),
                   "l"(g), "r"(valid ? 16 : 0));
    }
    asm volatile("cp.async.commit_group;\n" ::);
  } else {
    for (int idx = threadIdx.x; idx < kRows * DP; idx += kNumThreads) {
      const int r = idx / DP;
      const int c = idx % DP;
      const bool valid = row0 + r < seq_len && c < head_dim;
      tile[r * kStride + c] = valid
                                  ? src[static_cast<int64_t>(row0 + r) * ld + c]
                                  : FromFloat<T>(0.0f);
    }
  }
}

// One f32 copied global -> shared through the async unit; `valid` false
// zero-fills. The caller commits the group.
__device__ __forceinline__ void CopyFloatAsync(float* dst, const float* src,
                                               bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(
                   SharedAddress(dst)),
               "l"(src), "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void WaitTiles() {
  asm volatile("cp.async.wait_group 0;\n" ::);
  __syncthreads();
}

// acc (16 x 8 kNTiles) += A rows [arow0, arow0+16) of `a` (stride kStride)
// times B^T where B rows are `b` rows [0, 8 kNTiles) (a "k-contiguous" B:
// element (k, n) is b[n * stride + k]). Reduction over DP columns.
// Operands come in through ldmatrix: one instruction per 16x16 A block and
// per pair of B n-tiles, a quarter of the shared-memory instructions of
// 32-bit loads for the same bytes (the products were issue-bound).
template <typename T, int DP, int kNTiles = 8>
__device__ __forceinline__ void MatmulABt(float (&acc)[kNTiles][4], const T* a,
                                          const T* b, int arow0) {
  static_assert(kNTiles % 2 == 0, "B n-tiles are loaded in pairs");
  constexpr int kStride = DP + 8;
  constexpr int kRowBytes = kStride * static_cast<int>(sizeof(T));
  const int lane = threadIdx.x & 31;
  // A: matrix m = lane / 8 covers rows 8 (m & 1), columns 8 (m >> 1).
  const uint32_t a_lane =
      SharedAddress(a + (arow0 + (lane & 15)) * kStride + (lane >> 4) * 8);
  // B pair: matrices (n-tile j, k 0-7), (j, k 8-15), (j + 1, 0-7), (j + 1,
  // 8-15), so r[0..1] feed n-tile j and r[2..3] n-tile j + 1.
  const uint32_t b_lane = SharedAddress(
      b + (((lane >> 4) << 3) + (lane & 7)) * kStride + ((lane >> 3) & 1) * 8);
#pragma unroll
  for (int kk = 0; kk < DP / 16; ++kk) {
    uint32_t af[4];
    LdMatrixX4(af, a_lane + kk * 32);
#pragma unroll
    for (int nt = 0; nt < kNTiles; nt += 2) {
      uint32_t bf[4];
      LdMatrixX4(bf, b_lane + nt * 8 * kRowBytes + kk * 32);
      Mma<T>::Run(acc[nt], af, bf[0], bf[1]);
      Mma<T>::Run(acc[nt + 1], af, bf[2], bf[3]);
    }
  }
}

// acc (16 x DP) += P (16 x 16 kChunks, given as packed A fragments for
// kChunks k-chunks) times rows [0, 16 kChunks) of `b` (element (k, n) =
// b[k * stride + n]).
template <typename T, int DP, int kChunks = 4>
__device__ __forceinline__ void MatmulPB(float (&acc)[DP / 8][4],
                                         const uint32_t (&pf)[kChunks][4],
                                         const T* b) {
  constexpr int kStride = DP + 8;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kc = 0; kc < kChunks; ++kc) {
#pragma unroll
    for (int dt = 0; dt < DP / 8; dt += 2) {
      uint32_t bf[4];
      LdMatrixX4Trans(
          bf, b + (kc * 16 + (lane & 15)) * kStride + dt * 8 + (lane >> 4) * 8);
      Mma<T>::Run(acc[dt], pf[kc], bf[0], bf[1]);
      Mma<T>::Run(acc[dt + 1], pf[kc], bf[2], bf[3]);
    }
  }
}

// Rounds a 16 x 8 kNTiles C-fragment tile into A fragments for kNTiles / 2
// k-chunks of 16.
template <typename T, int kNTiles = 8>
__device__ __forceinline__ void PackA(const float (&c)[kNTiles][4],
                                      uint32_t (&a)[kNTiles / 2][4]) {
#pragma unroll
  for (int kc = 0; kc < kNTiles / 2; ++kc) {
    a[kc][0] = Pack<T>(c[2 * kc][0], c[2 * kc][1]);
    a[kc][1] = Pack<T>(c[2 * kc][2], c[2 * kc][3]);
    a[kc][2] = Pack<T>(c[2 * kc + 1][0], c[2 * kc + 1][1]);
    a[kc][3] = Pack<T>(c[2 * kc + 1][2], c[2 * kc + 1][3]);
  }
}

// grid (num_tiles, B*H); block kThreads. scale_log2 = log2(e) / sqrt(D).
// kPipelined: K/V tiles are double-buffered, the next tile's cp.async runs
// under this tile's matrix products (one barrier per tile instead of two
// and no exposed load latency; with only a few CTAs per SM the other CTAs
// could not hide it). false: the original load-wait-compute loop, kept
// selectable with ZE_ATTENTION_LEGACY=1.
template <typename T, int DP, bool kPipelined>
__global__ void __launch_bounds__(kThreads)
    FlashForwardKernel(const T* __restrict__ qkv, T* __restrict__ out,
                       float* __restrict__ logsumexp, int seq_len, int heads,
                       int head_dim, float scale_log2) {
  constexpr int kStride = DP + 8;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  // (64, DP) queries, then per stage (64, DP) keys and (64, DP) values;
  // kPipelined has two stages.
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
  if constexpr (kPipelined) {
    LoadTile<T, DP>(sq + kTile * kStride, k_src, ld, 0, seq_len, head_dim,
                    vector);
    LoadTile<T, DP>(sq + 2 * kTile * kStride, v_src, ld, 0, seq_len, head_dim,
                    vector);
  }

  float o[DP / 8][4];
#pragma unroll
  for (int i = 0; i < DP / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};                // this thread's columns only
  const int q_row0 = qt * kTile + warp * 16 + g;  // and q_row0 + 8

  for (int kt = 0; kt <= qt; ++kt) {
    const int stage = kPipelined ? (kt & 1) : 0;
    const T* sk = sq + (1 + 2 * stage) * kTile * kStride;
    const T* sv = sk + kTile * kStride;
    if constexpr (kPipelined) {
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
    } else {
      __syncthreads();  // everyone is done with the previous K/V tile
      T* wk = sq + kTile * kStride;
      LoadTile<T, DP>(wk, k_src, ld, kt * kTile, seq_len, head_dim, vector);
      LoadTile<T, DP>(wk + kTile * kStride, v_src, ld, kt * kTile, seq_len,
                      head_dim, vector);
      WaitTiles();
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
// kPipelined: the next query tile's Q, dO, logsumexp and delta are copied
// (cp.async, double-buffered) under this tile's products, and dQ goes out as
// paired f32 reductions (red.global.add.v2.f32) when head_dim is even.
// false: the original loop (ZE_ATTENTION_LEGACY=1).
template <typename T, int DP, bool kPipelined>
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
  constexpr int kStages = kPipelined ? 2 : 1;
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
  if constexpr (kPipelined) load_stage(0, kt);

  float dk[DP / 8][4], dv[DP / 8][4];
#pragma unroll
  for (int i = 0; i < DP / 8; ++i) {
    dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.0f;
    dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
  }

  for (int qt = kt; qt < num_tiles; ++qt) {
    const int stage = kPipelined ? ((qt - kt) & 1) : 0;
    const T* sq = sstage + stage * 2 * kTile * kStride;
    const T* sdo = sq + kTile * kStride;
    const float* slse = sstats + stage * 2 * kTile;  // natural log
    const float* sdelta = slse + kTile;
    if constexpr (kPipelined) {
      // Tile qt (the only copies in flight) has landed, and everyone is done
      // with tile qt - 1 (its stage and dS), whose stage receives qt + 1.
      WaitTiles();
      if (qt + 1 < num_tiles) load_stage(stage ^ 1, qt + 1);
    } else {
      __syncthreads();  // everyone is done with the previous Q/dO/dS tiles
      load_stage(0, qt);
      WaitTiles();
    }

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
      if (kPipelined && head_dim % 2 == 0) {
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

// ---- Wide kernels (default for D <= 128 after padding to 64 or 128): 8 warps
// per CTA and 128-row tiles on the side that stays resident, so each tile
// streamed through shared memory feeds twice the tensor-core work of the
// 4-warp kernels, and the backward pass issues half the dQ reductions.
constexpr int kWideTile = 128;  // resident rows (queries fwd, keys bwd)
constexpr int kWideWarps = 8;   // 16 resident rows each
constexpr int kWideThreads = kWideWarps * 32;

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

// grid (B*H, ceil(T / 128)); block kWideThreads. A CTA owns 128 keys (warp
// w the keys [16w, 16w + 16) of the tile, dK and dV in registers) and loops
// over the 64-query tiles that can see them, Q, dO and the row statistics
// double-buffered as in FlashBackwardKernel. dQ of a query tile is the
// product of dS (64 queries x 128 keys, through shared memory) and K; warp
// w computes query rows [16 (w % 4), +16) x columns [(w / 4) DP / 2, +DP/2)
// and adds them to the f32 accumulator: one reduction per element per
// 128 keys instead of per 64. Key tile 0 (the heaviest) is grid.y 0.
// Warps whose keys all follow the query tile skip it; the matching 16-key
// chunk of the dQ product is skipped by every warp (same condition), so
// their stale dS entries are never read.
// kWithDq false: dK and dV only (first kernel of the "split" backward; dQ
// comes from FlashBackwardDqKernel): no dS tile, no second barrier per query
// tile, no atomics, and dq_accum is not touched. The rest is the same code,
// so it inherits the tested masking and pipelining.
template <typename T, int DP, int kMinBlocks, bool kWithDq = true>
__global__ void __launch_bounds__(kWideThreads, kMinBlocks)
    FlashBackwardWideKernel(const T* __restrict__ dout,
                            const T* __restrict__ qkv,
                            const float* __restrict__ logsumexp,
                            const float* __restrict__ delta,
                            float* __restrict__ dq_accum, T* __restrict__ dqkv,
                            int seq_len, int heads, int head_dim, float scale,
                            float scale_log2) {
  static_assert(DP % 32 == 0, "dQ splits DP in halves of whole 16-col pairs");
  constexpr int kStride = DP + 8;
  constexpr int kDsStride = kWideTile + 8;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* sk = reinterpret_cast<T*>(shared_bytes);  // (128 keys, DP)
  T* sv = sk + kWideTile * kStride;            // (128 keys, DP)
  T* sds = sv + kWideTile * kStride;           // (64 queries, 128 keys)
  // Per stage: Q, dO (64 queries, DP); no dS tile without dQ.
  T* sstage = sds + (kWithDq ? kTile * kDsStride : 0);
  // Per stage: logsumexp (64), delta (64), f32.
  float* sstats = reinterpret_cast<float*>(sstage + 2 * 2 * kTile * kStride);

  const int bh = blockIdx.x;
  const int kt = blockIdx.y;
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
  const int dq_rows = (warp & 3) * 16;               // dQ block of the warp
  constexpr int kDqCols = DP / 16;                   // n-tiles per warp
  const int dq_tile0 = (warp >> 2) * kDqCols;

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
    const T* sq = sstage + stage * 2 * kTile * kStride;
    const T* sdo = sq + kTile * kStride;
    const float* slse = sstats + stage * 2 * kTile;  // natural log
    const float* sdelta = slse + kTile;
    const int q0 = qt * kTile;
    // Tile qt (the only copies in flight) has landed, and everyone is done
    // with tile qt - 1 (its stage and dS), whose stage receives qt + 1.
    WaitTiles();
    if (qt + 1 < num_q) load_stage(stage ^ 1, qt + 1);

    if (warp_key0 <= q0 + kTile - 1) {
      // Mask only where some key follows some query of the tile, or the
      // tile runs past the sequence (zero-filled statistics).
      const bool need_mask = warp_key0 + 15 > q0 || q0 + kTile > seq_len;
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
          float v = exp2f(p[nt][e] * scale_log2 - slse[local_q] * kLog2e);
          if (need_mask) {
            const int key = key_row0 + (e >> 1) * 8;
            const int query = q0 + local_q;
            if (key > query || query >= seq_len) v = 0.0f;
          }
          p[nt][e] = v;
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
      if constexpr (kWithDq) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int local_q = nt * 8 + 2 * t + (e & 1);
            const int local_key = warp * 16 + g + (e >> 1) * 8;
            sds[local_q * kDsStride + local_key] = FromFloat<T>(ds[nt][e]);
          }
        }
      }
    }
    // Without dQ the next iteration's WaitTiles is the only barrier needed.
    if constexpr (!kWithDq) continue;
    __syncthreads();

    // dQ block of this warp += scale * dS K over the key chunks that any
    // query of the tile can see (chunk c is warp c's keys: same test).
    float dq[kDqCols][4];
#pragma unroll
    for (int i = 0; i < kDqCols; ++i)
      dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < kWideTile / 16; ++kc) {
      if (kt * kWideTile + kc * 16 > q0 + kTile - 1) continue;
      const T* ap = sds + (dq_rows + g) * kDsStride + kc * 16 + 2 * t;
      uint32_t a[4] = {Lds32(ap), Lds32(ap + 8 * kDsStride), Lds32(ap + 8),
                       Lds32(ap + 8 * kDsStride + 8)};
#pragma unroll
      for (int j = 0; j < kDqCols; j += 2) {
        uint32_t bf[4];
        LdMatrixX4Trans(bf, sk + (kc * 16 + (lane & 15)) * kStride +
                                (dq_tile0 + j) * 8 + (lane >> 4) * 8);
        Mma<T>::Run(dq[j], a, bf[0], bf[1]);
        Mma<T>::Run(dq[j + 1], a, bf[2], bf[3]);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int query = q0 + dq_rows + g + r * 8;
      if (query >= seq_len) continue;
      float* dst =
          dq_accum + (static_cast<int64_t>(bh) * seq_len + query) * head_dim;
      if (head_dim % 2 == 0) {
        // col and the row offset are even: 8-byte aligned pairs, one
        // reduction each (sm_90 float2 atomicAdd).
#pragma unroll
        for (int j = 0; j < kDqCols; ++j) {
          const int col = (dq_tile0 + j) * 8 + 2 * t;
          if (col < head_dim) {
            atomicAdd(
                reinterpret_cast<float2*>(dst + col),
                make_float2(dq[j][2 * r] * scale, dq[j][2 * r + 1] * scale));
          }
        }
        continue;
      }
#pragma unroll
      for (int j = 0; j < kDqCols; ++j) {
        const int col = (dq_tile0 + j) * 8 + 2 * t;
        if (col < head_dim) atomicAdd(dst + col, dq[j][2 * r] * scale);
        if (col + 1 < head_dim)
          atomicAdd(dst + col + 1, dq[j][2 * r + 1] * scale);
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
// dS^T, 16 keys x 32 queries) are half those of FlashBackwardWideKernel and
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

// ---- f32 reference-speed path: a warp per query row, lanes over D.
constexpr int kMaxPerLane = kMaxAttentionHeadDim / 32;

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

// Q plus one (legacy) or two (pipelined) stages of K and V.
template <int DP, bool kPipelined>
constexpr size_t ForwardSharedBytes() {
  return (kPipelined ? 5 : 3) * kTile * (DP + 8) * 2;
}
// K, V, dS, then one or two stages of Q, dO, logsumexp and delta.
template <int DP, bool kPipelined>
constexpr size_t BackwardSharedBytes() {
  constexpr int kStages = kPipelined ? 2 : 1;
  return 2 * kTile * (DP + 8) * 2 + kTile * (kTile + 8) * 2 +
         kStages * (2 * kTile * (DP + 8) * 2 + 2 * kTile * 4);
}

// Q (128 queries), two stages of K and V (64 keys each).
template <int DP>
constexpr size_t ForwardWideSharedBytes() {
  return (kWideTile + 4 * kTile) * (DP + 8) * 2;
}
// K, V (128 keys), dS (64 x 128, only with dQ), two stages of Q, dO,
// logsumexp, delta.
template <int DP, bool kWithDq = true>
constexpr size_t BackwardWideSharedBytes() {
  return 2 * kWideTile * (DP + 8) * 2 +
         (kWithDq ? kTile * (kWideTile + 8) * 2 : 0) +
         2 * (2 * kTile * (DP + 8) * 2 + 2 * kTile * 4);
}
// Q, dO (128 queries), two stages of K and V (64 keys each).
template <int DP>
constexpr size_t BackwardDqSharedBytes() {
  return (2 * kWideTile + 4 * kTile) * (DP + 8) * 2;
}

// Which kernels run. kWide (default) exists for padded head sizes 64 and
// 128; other head sizes use kPipelined.
// kWide2: kWide with the D-64 backward capped at 128 registers (two CTAs,
// 16 warps per SM, at the price of some spilling), for measuring.
// kSplit: the wide forward; backward as two kernels (dK/dV per key tile,
// then dQ per query tile, see FlashBackwardDqKernel) for padded D 64 and
// 128, kPipelined otherwise.
// kSplitV1: kSplit with FlashBackwardWideKernel (full 64-query tiles, one
// CTA per SM) as its dK/dV kernel, for measuring.
// kWgmma: the Hopper kernels of attention_sm90.cu where they apply (head
// size exactly 64, a compute capability 9.0 device, 16-byte aligned
// tensors), kSplit everywhere else.
enum class Variant {
  kWgmma,
  kWide,
  kWide2,
  kSplit,
  kSplitV1,
  kPipelined,
  kLegacy
};

// Read at every launch (a getenv is cheap next to a kernel launch) so tests
// and benchmarks can switch variants within one process.
// Precedence: `specific` (ZE_ATTENTION_FWD_KERNEL / ZE_ATTENTION_BWD_KERNEL),
// then ZE_ATTENTION_KERNEL, each "wgmma" | "wide" | "wide2" | "split" |
// "split1" | "v1" | "legacy"; then ZE_ATTENTION_LEGACY=1 (legacy, as
// before); default wgmma (split where the Hopper kernels do not apply).
// Backward at B=16, T=1024, H=32, D=64, bf16 on the H200: wgmma 0.87 ms,
// split 1.23 (1.73 before its dK/dV rework), wide 1.85, v1 1.91, legacy
// 2.18.
Variant SelectVariant(const char* specific) {
  for (const char* name : {specific, "ZE_ATTENTION_KERNEL"}) {
    const char* v = std::getenv(name);
    if (v == nullptr || v[0] == '\0') continue;
    if (std::strcmp(v, "v1") == 0 || std::strcmp(v, "pipelined") == 0) {
      return Variant::kPipelined;
    }
    if (std::strcmp(v, "legacy") == 0) return Variant::kLegacy;
    if (std::strcmp(v, "wgmma") == 0) return Variant::kWgmma;
    if (std::strcmp(v, "wide2") == 0) return Variant::kWide2;
    if (std::strcmp(v, "split") == 0) return Variant::kSplit;
    if (std::strcmp(v, "split1") == 0) return Variant::kSplitV1;
    if (std::strcmp(v, "wide") == 0 || std::strcmp(v, "v2") == 0) {
      return Variant::kWide;
    }
  }
  const char* v = std::getenv("ZE_ATTENTION_LEGACY");
  if (v != nullptr && v[0] != '\0' && v[0] != '0') return Variant::kLegacy;
  return Variant::kWgmma;
}

// Whether kWgmma's Hopper kernel runs for these tensors; otherwise kWgmma
// behaves as kSplit.
bool UseSm90Kernel(Variant variant, int head_dim, int seq_len,
                   std::initializer_list<const void*> tensors) {
  if (variant != Variant::kWgmma || head_dim != 64) return false;
  // One CTA row of the grid per 64 positions, and grid.y <= 65535.
  if (seq_len > 65535 * 64) return false;
  for (const void* p : tensors) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return Sm90AttentionAvailable();
}

Variant WithoutWgmma(Variant variant) {
  return variant == Variant::kWgmma ? Variant::kSplit : variant;
}

// Calls body(std::integral_constant<int, DP>) with the smallest instantiated
// padded head size >= head_dim.
template <typename Body>
int DispatchHeadDim(int head_dim, Body&& body) {
  if (head_dim <= 64) return body(std::integral_constant<int, 64>());
  if (head_dim <= 80) return body(std::integral_constant<int, 80>());
  if (head_dim <= 128) return body(std::integral_constant<int, 128>());
  if (head_dim <= 256) return body(std::integral_constant<int, 256>());
  return static_cast<int>(cudaErrorInvalidValue);
}

template <typename T>
int ForwardTensorCore(const void* qkv, void* out, float* logsumexp, int batch,
                      int seq_len, int heads, int head_dim,
                      cudaStream_t stream) {
  return DispatchHeadDim(head_dim, [&](auto dp) {
    constexpr int DP = decltype(dp)::value;
    auto launch = [&](auto pipelined) {
      constexpr bool kPipelined = decltype(pipelined)::value;
      constexpr size_t shared = ForwardSharedBytes<DP, kPipelined>();
      auto kernel = FlashForwardKernel<T, DP, kPipelined>;
      if (shared > 48 * 1024) {
        cudaFuncSetAttribute(kernel,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(shared));
      }
      const dim3 grid((seq_len + kTile - 1) / kTile, batch * heads);
      kernel<<<grid, kThreads, shared, stream>>>(
          static_cast<const T*>(qkv), static_cast<T*>(out), logsumexp, seq_len,
          heads, head_dim, kLog2e / sqrtf(static_cast<float>(head_dim)));
      return static_cast<int>(cudaGetLastError());
    };
    const Variant variant =
        WithoutWgmma(SelectVariant("ZE_ATTENTION_FWD_KERNEL"));
    // split (the default) runs the 4-warp pipelined forward at D 64, where
    // it measured 166 TFLOP/s against the wide kernel's 158 on the H200
    // (B 16, T 1024, H 32), and the wide one at D 128 (190 against 163).
    const bool split =
        variant == Variant::kSplit || variant == Variant::kSplitV1;
    if constexpr (DP == 64 || DP == 128) {
      if (variant == Variant::kWide || variant == Variant::kWide2 ||
          (split && DP == 128)) {
        constexpr size_t shared = ForwardWideSharedBytes<DP>();
        auto kernel = FlashForwardWideKernel<T, DP>;
        if (shared > 48 * 1024) {
          cudaFuncSetAttribute(kernel,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(shared));
        }
        const dim3 grid(batch * heads, (seq_len + kWideTile - 1) / kWideTile);
        kernel<<<grid, kWideThreads, shared, stream>>>(
            static_cast<const T*>(qkv), static_cast<T*>(out), logsumexp,
            seq_len, heads, head_dim,
            kLog2e / sqrtf(static_cast<float>(head_dim)));
        return static_cast<int>(cudaGetLastError());
      }
    }
    if (variant == Variant::kLegacy) return launch(std::false_type());
    return launch(std::true_type());
  });
}

// Raises the kernel's dynamic shared-memory limit when `bytes` is past the
// 48 KB default.
template <typename Kernel>
void AllowSharedBytes(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(bytes));
  }
}

// The padded head size DispatchHeadDim picks (so callers agree with it).
int PaddedHeadDim(int head_dim) {
  return DispatchHeadDim(head_dim, [](auto dp) { return decltype(dp)::value; });
}

// Whether `variant` runs the split backward at this head size; it writes dQ
// itself, so the f32 accumulator is neither zeroed nor converted.
bool IsSplitBackward(Variant variant, int head_dim) {
  if (variant != Variant::kSplit && variant != Variant::kSplitV1) return false;
  const int dp = PaddedHeadDim(head_dim);
  return dp == 64 || dp == 128;
}

// `variant`: SelectVariant("ZE_ATTENTION_BWD_KERNEL"), read once by the
// caller so its choice of workspace passes matches the kernels run here.
// dq_accum is unused (may be anything) when IsSplitBackward.
template <typename T>
int BackwardTensorCore(Variant variant, const void* dout, const void* qkv,
                       const float* logsumexp, const float* delta,
                       float* dq_accum, void* dqkv, int batch, int seq_len,
                       int heads, int head_dim, cudaStream_t stream) {
  return DispatchHeadDim(head_dim, [&](auto dp) {
    constexpr int DP = decltype(dp)::value;
    auto launch = [&](auto pipelined) {
      constexpr bool kPipelined = decltype(pipelined)::value;
      constexpr size_t shared = BackwardSharedBytes<DP, kPipelined>();
      auto kernel = FlashBackwardKernel<T, DP, kPipelined>;
      if (shared > 48 * 1024) {
        cudaFuncSetAttribute(kernel,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(shared));
      }
      const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
      const dim3 grid((seq_len + kTile - 1) / kTile, batch * heads);
      kernel<<<grid, kThreads, shared, stream>>>(
          static_cast<const T*>(dout), static_cast<const T*>(qkv), logsumexp,
          delta, dq_accum, static_cast<T*>(dqkv), seq_len, heads, head_dim,
          scale, scale * kLog2e);
      return static_cast<int>(cudaGetLastError());
    };
    if constexpr (DP == 64 || DP == 128) {
      if (variant == Variant::kSplit || variant == Variant::kSplitV1) {
        const bool split_v1 = variant == Variant::kSplitV1;
        const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
        const dim3 grid(batch * heads, (seq_len + kWideTile - 1) / kWideTile);
        // dK, dV: FlashBackwardKvKernel (half query tiles; two CTAs per SM
        // at D 64), or, for split1, the wide kernel without its dQ part.
        // Both use the same shared-memory layout.
        constexpr size_t kv_shared = BackwardWideSharedBytes<DP, false>();
        constexpr int kKvMinBlocks = DP == 64 ? 2 : 1;
        if (split_v1) {
          auto kv_kernel = FlashBackwardWideKernel<T, DP, 1, false>;
          AllowSharedBytes(kv_kernel, kv_shared);
          kv_kernel<<<grid, kWideThreads, kv_shared, stream>>>(
              static_cast<const T*>(dout), static_cast<const T*>(qkv),
              logsumexp, delta, nullptr, static_cast<T*>(dqkv), seq_len, heads,
              head_dim, scale, scale * kLog2e);
        } else {
          auto kv_kernel = FlashBackwardKvKernel<T, DP, kKvMinBlocks>;
          AllowSharedBytes(kv_kernel, kv_shared);
          kv_kernel<<<grid, kWideThreads, kv_shared, stream>>>(
              static_cast<const T*>(dout), static_cast<const T*>(qkv),
              logsumexp, delta, static_cast<T*>(dqkv), seq_len, heads, head_dim,
              scale, scale * kLog2e);
        }
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
      }
      if (variant == Variant::kWide || variant == Variant::kWide2) {
        // Uncapped, the D-64 kernel takes ~234 registers (one CTA, 8 warps
        // per SM, no spills); kWide2 caps it for two CTAs. D 128 needs the
        // whole register file for one CTA either way.
        constexpr size_t shared = BackwardWideSharedBytes<DP>();
        auto kernel = FlashBackwardWideKernel<T, DP, 1, true>;
        if constexpr (DP == 64) {
          if (variant == Variant::kWide2) {
            kernel = FlashBackwardWideKernel<T, DP, 2, true>;
          }
        }
        if (shared > 48 * 1024) {
          cudaFuncSetAttribute(kernel,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(shared));
        }
        const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
        const dim3 grid(batch * heads, (seq_len + kWideTile - 1) / kWideTile);
        kernel<<<grid, kWideThreads, shared, stream>>>(
            static_cast<const T*>(dout), static_cast<const T*>(qkv), logsumexp,
            delta, dq_accum, static_cast<T*>(dqkv), seq_len, heads, head_dim,
            scale, scale * kLog2e);
        return static_cast<int>(cudaGetLastError());
      }
    }
    if (variant == Variant::kLegacy) return launch(std::false_type());
    return launch(std::true_type());
  });
}

int64_t RoundUp256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

int LaunchAttentionForward(const void* qkv, void* out, float* logsumexp,
                           int batch, int seq_len, int heads, int head_dim,
                           int dtype, void* stream) {
  if (batch == 0 || seq_len == 0 || heads == 0) return 0;
  if (head_dim <= 0 || head_dim > kMaxAttentionHeadDim) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  auto s = static_cast<cudaStream_t>(stream);
  if ((dtype == kBF16 || dtype == kF16) &&
      UseSm90Kernel(SelectVariant("ZE_ATTENTION_FWD_KERNEL"), head_dim, seq_len,
                    {qkv, out})) {
    return LaunchAttentionForwardSm90(qkv, out, logsumexp, batch, seq_len,
                                      heads, dtype, s);
  }
  switch (dtype) {
    case kBF16:
      return ForwardTensorCore<__nv_bfloat16>(qkv, out, logsumexp, batch,
                                              seq_len, heads, head_dim, s);
    case kF16:
      return ForwardTensorCore<__half>(qkv, out, logsumexp, batch, seq_len,
                                       heads, head_dim, s);
    case kF32: {
      const int64_t rows = static_cast<int64_t>(batch) * heads * seq_len;
      SimpleForwardKernel<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, s>>>(
          static_cast<const float*>(qkv), static_cast<float*>(out), logsumexp,
          batch, seq_len, heads, head_dim,
          1.0f / sqrtf(static_cast<float>(head_dim)));
      return static_cast<int>(cudaGetLastError());
    }
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

const char* AttentionKernelName(bool backward, const void* qkv,
                                const void* out_or_dout, const void* dqkv,
                                int seq_len, int head_dim, int dtype) {
  if (dtype != kBF16 && dtype != kF16) return "f32";
  const Variant selected = SelectVariant(
      backward ? "ZE_ATTENTION_BWD_KERNEL" : "ZE_ATTENTION_FWD_KERNEL");
  const bool sm90 =
      backward
          ? UseSm90Kernel(selected, head_dim, seq_len, {out_or_dout, qkv, dqkv})
          : UseSm90Kernel(selected, head_dim, seq_len, {qkv, out_or_dout});
  return sm90 ? "wgmma" : "mma.sync";
}

size_t AttentionBackwardWorkspaceBytes(int batch, int seq_len, int heads,
                                       int head_dim) {
  const int64_t rows = static_cast<int64_t>(batch) * heads * seq_len;
  return static_cast<size_t>(RoundUp256(rows * head_dim * 4) +
                             RoundUp256(rows * 4));
}

int LaunchAttentionBackward(const void* dout, const void* qkv, const void* out,
                            const float* logsumexp, void* dqkv, void* workspace,
                            int batch, int seq_len, int heads, int head_dim,
                            int dtype, void* stream) {
  if (batch == 0 || seq_len == 0 || heads == 0) return 0;
  if (head_dim <= 0 || head_dim > kMaxAttentionHeadDim) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t rows = static_cast<int64_t>(batch) * heads * seq_len;
  float* dq_accum = static_cast<float*>(workspace);
  float* delta = reinterpret_cast<float*>(static_cast<char*>(workspace) +
                                          RoundUp256(rows * head_dim * 4));
  const unsigned delta_grid = static_cast<unsigned>((rows + 7) / 8);
  // AttentionDeltaKernel: 256 threads, 8 per row.
  const unsigned delta_rows_grid = static_cast<unsigned>((rows + 31) / 32);
  const int64_t channels = static_cast<int64_t>(heads) * head_dim;
  const int64_t dq_count = static_cast<int64_t>(batch) * seq_len * channels;
  const unsigned dq_grid = static_cast<unsigned>((dq_count + 255) / 256);
  int error = 0;
  switch (dtype) {
    case kBF16:
    case kF16: {
      const Variant selected = SelectVariant("ZE_ATTENTION_BWD_KERNEL");
      const bool sm90 =
          UseSm90Kernel(selected, head_dim, seq_len, {dout, qkv, dqkv});
      const Variant variant = WithoutWgmma(selected);
      const bool split = sm90 || IsSplitBackward(variant, head_dim);
      if (!split) {
        error = static_cast<int>(
            cudaMemsetAsync(dq_accum, 0, rows * head_dim * 4, s));
        if (error != 0) return error;
      }
      auto run = [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        AttentionDeltaKernel<T><<<delta_rows_grid, 256, 0, s>>>(
            static_cast<const T*>(dout), static_cast<const T*>(out), delta,
            batch, seq_len, heads, head_dim);
        if (sm90) {
          return LaunchAttentionBackwardSm90(dout, qkv, logsumexp, delta, dqkv,
                                             batch, seq_len, heads, dtype, s);
        }
        int e = BackwardTensorCore<T>(variant, dout, qkv, logsumexp, delta,
                                      dq_accum, dqkv, batch, seq_len, heads,
                                      head_dim, s);
        if (e != 0) return e;
        if (split) return 0;
        WriteDqKernel<T><<<dq_grid, 256, 0, s>>>(
            dq_accum, static_cast<T*>(dqkv), batch, seq_len, heads, head_dim);
        return static_cast<int>(cudaGetLastError());
      };
      if (dtype == kBF16) return run(static_cast<__nv_bfloat16*>(nullptr));
      return run(static_cast<__half*>(nullptr));
    }
    case kF32: {
      error = static_cast<int>(cudaMemsetAsync(dqkv, 0, dq_count * 3 * 4, s));
      if (error != 0) return error;
      AttentionDeltaKernel<float><<<delta_rows_grid, 256, 0, s>>>(
          static_cast<const float*>(dout), static_cast<const float*>(out),
          delta, batch, seq_len, heads, head_dim);
      SimpleBackwardKernel<<<delta_grid, 256, 0, s>>>(
          static_cast<const float*>(dout), static_cast<const float*>(qkv),
          logsumexp, delta, static_cast<float*>(dqkv), batch, seq_len, heads,
          head_dim, 1.0f / sqrtf(static_cast<float>(head_dim)));
      return static_cast<int>(cudaGetLastError());
    }
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze
