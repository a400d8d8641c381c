// Hopper (sm_90a) warpgroup matrix products: wgmma.mma_async wrappers,
// shared-memory matrix descriptors, and the fences they need. Only for .cu
// files compiled for sm_90a (cuda_library gencode "sm_90a"); elsewhere the
// include is an error rather than a silent fallback.
//
// A warpgroup is 4 consecutive warps (128 threads, the first warp's index a
// multiple of 4). One m64nNk16 product: D (64 x N, f32) += A (64 x 16) x
// B (16 x N). Register layouts, per warp w of the warpgroup and lane
// (g = lane / 4, t = lane % 4), the same as mma.sync m16n8k16's:
//   D: d[4j + e] is row 16w + g + 8 (e >> 1), column 8j + 2t + (e & 1).
//   A (from registers): a[0] rows 16w + g, columns 2t..2t+1; a[1] row
//     16w + g + 8; a[2], a[3] the same rows at columns 2t + 8..2t + 9. So a
//     pair of 8-column D blocks rounded to 16 bits is an A operand.
// Shared-memory operands are described by a 64-bit descriptor. This file
// only uses the 128-byte swizzle with 64-element (128-byte) rows: a tile of
// R rows x 64 16-bit elements, 1024-byte aligned, row r at byte r * 128,
// its 16-byte chunk c stored at chunk position c ^ (r % 8) (Swizzle128).
// Such a tile serves as
//   - a "K-major" operand (the reduction index runs along the row): A rows
//     = M, or B rows = N; the k16 slice s starts 32 s bytes into the tile;
//   - an "MN-major" operand, transposed (the reduction index runs down the
//     rows, N along the row): B with rows = K, N = 64; the k16 slice s
//     starts 2048 s bytes (16 rows) into the tile.
// In both, consecutive 8-row groups are 1024 bytes apart.
//
// Ordering rules the callers follow (PTX ISA, "asynchronous warpgroup
// level matrix multiply"): shared memory written by ordinary stores or
// cp.async must be followed by FenceProxyAsync() (by the writing threads)
// and a barrier before a wgmma reads it; WgmmaFence() before the first
// wgmma that reads registers written by ordinary instructions; the
// accumulators are valid only after WgmmaCommit() and WgmmaWait<0>().
#ifndef ZE_NN_CUDA_WGMMA_CUH_
#define ZE_NN_CUDA_WGMMA_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "wgmma.cuh needs sm_90a (cuda_library(..., gencode = \"sm_90a\"))"
#endif

namespace ze {
namespace nn {
namespace cuda_kernels {
namespace sm90 {

// Byte offset of element `column` (a multiple of 8) of `row` in a swizzled
// 64-element-row tile (see above).
__device__ __forceinline__ uint32_t Swizzle128(int row, int column) {
  return static_cast<uint32_t>(row * 128 +
                               ((((column >> 3) ^ (row & 7))) << 4));
}

// Descriptor of a 128-byte-swizzled operand starting at shared address
// `address` (a k-slice start as above; the tile itself 1024-byte aligned).
// Both byte offsets are 1024 (8-row groups): the one the layout does not
// use is ignored, so the same value serves K- and MN-major operands.
__device__ __forceinline__ uint64_t Descriptor(uint32_t address) {
  constexpr uint64_t kGroupBytes = 1024 >> 4;
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) | (kGroupBytes << 16) |
         (kGroupBytes << 32) |
         (static_cast<uint64_t>(1) << 62);  // 128-byte swizzle
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Waits until at most kPending committed groups are still running.
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending)
               : "memory");
}

// Makes this thread's generic-proxy shared-memory writes (st.shared,
// cp.async) visible to the async proxy that wgmma reads through.
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Keeps the compiler from moving accesses to `d` across the point where
// it is used (the asynchronous product owns the registers in between).
template <int N>
__device__ __forceinline__ void PinRegisters(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

template <int N>
__device__ __forceinline__ void PinRegisters(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

template <typename T>
struct WgmmaType;
template <>
struct WgmmaType<__nv_bfloat16> {
  static constexpr bool kIsBf16 = true;
};
template <>
struct WgmmaType<__half> {
  static constexpr bool kIsBf16 = false;
};

#define ZE_WGMMA_D32                                                        \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, "  \
  "%30, %31}"
#define ZE_WGMMA_D32_OPERANDS(d)                                          \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), \
      "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]),        \
      "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),    \
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),    \
      "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),    \
      "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),    \
      "+f"(d[31])

// The two products' asm statements; TYPE is the operand type's PTX name
// ("bf16" or "f16"), the only part that differs between the types.
#define ZE_WGMMA_REGISTER_A(TYPE)                                      \
  asm volatile(                                                        \
      "{\n"                                                            \
      ".reg .pred p;\n"                                                \
      "setp.ne.b32 p, %37, 0;\n"                                       \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE      \
      " " ZE_WGMMA_D32                                                 \
      ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n"                   \
      "}\n"                                                            \
      : ZE_WGMMA_D32_OPERANDS(d)                                       \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(descriptor_b), \
        "r"(static_cast<int>(accumulate)), "n"(kTransposeB))
#define ZE_WGMMA_SHARED_A(TYPE)                                   \
  asm volatile(                                                   \
      "{\n"                                                       \
      ".reg .pred p;\n"                                           \
      "setp.ne.b32 p, %34, 0;\n"                                  \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE \
      " " ZE_WGMMA_D32                                            \
      ", %32, %33, p, 1, 1, %35, %36;\n"                          \
      "}\n"                                                       \
      : ZE_WGMMA_D32_OPERANDS(d)                                  \
      : "l"(descriptor_a), "l"(descriptor_b),                     \
        "r"(static_cast<int>(accumulate)), "n"(kTransposeA), "n"(kTransposeB))

// d (64 x 64, f32) = (accumulate ? d : 0) + A (registers) x B (descriptor).
// kTransposeB: B is MN-major (rows = K), see the file comment.
template <typename T, int kTransposeB>
__device__ __forceinline__ void WgmmaM64N64K16(float (&d)[32],
                                               const uint32_t (&a)[4],
                                               uint64_t descriptor_b,
                                               bool accumulate) {
  if constexpr (WgmmaType<T>::kIsBf16) {
    ZE_WGMMA_REGISTER_A("bf16");
  } else {
    ZE_WGMMA_REGISTER_A("f16");
  }
}

// d (64 x 64, f32) = (accumulate ? d : 0) + A (descriptor) x B
// (descriptor). kTransposeA: A is MN-major (rows = K, M along the row).
template <typename T, int kTransposeA, int kTransposeB>
__device__ __forceinline__ void WgmmaM64N64K16(float (&d)[32],
                                               uint64_t descriptor_a,
                                               uint64_t descriptor_b,
                                               bool accumulate) {
  if constexpr (WgmmaType<T>::kIsBf16) {
    ZE_WGMMA_SHARED_A("bf16");
  } else {
    ZE_WGMMA_SHARED_A("f16");
  }
}

#undef ZE_WGMMA_REGISTER_A
#undef ZE_WGMMA_SHARED_A
#undef ZE_WGMMA_D32
#undef ZE_WGMMA_D32_OPERANDS

}  // namespace sm90
}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_CUDA_WGMMA_CUH_
