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
// The 128-row kernels (the forward at padded D 128, the two backward kernels
// at padded D 64 and 128) use the same fragments with 8 warps and 128
// resident rows per CTA.
//
// Shared-memory rows are padded by 8 elements (16 bytes) so the 8 rows a
// quad-group or ldmatrix touches fall in distinct banks.
//
// This header holds the device pieces the forward (attention_forward.cu) and
// backward (attention_backward.cu) mma.sync kernels share, and the host
// helpers both launch paths use. Only for .cu files of nn/cuda.
#ifndef ZE_NN_CUDA_ATTENTION_MMA_CUH_
#define ZE_NN_CUDA_ATTENTION_MMA_CUH_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "nn/cuda/attention.h"
#include "nn/cuda/attention_common.cuh"
#include "nn/cuda/cuda_common.cuh"

namespace ze {
namespace nn {
namespace cuda_kernels {
namespace mma_attention {

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

// 128-row ("wide") kernels: 8 warps per CTA and 128-row tiles on the side
// that stays resident, so each tile streamed through shared memory feeds
// twice the tensor-core work of the 4-warp kernels.
constexpr int kWideTile = 128;  // resident rows (queries fwd, keys bwd)
constexpr int kWideWarps = 8;   // 16 resident rows each
constexpr int kWideThreads = kWideWarps * 32;

// ---- f32 reference-speed path: a warp per query row, lanes over D.
constexpr int kMaxPerLane = kMaxAttentionHeadDim / 32;

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

// Raises the kernel's dynamic shared-memory limit when `bytes` is past the
// 48 KB default.
template <typename Kernel>
void AllowSharedBytes(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(bytes));
  }
}

}  // namespace mma_attention
}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_CUDA_ATTENTION_MMA_CUH_
