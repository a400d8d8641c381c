// CUDA launchers for causal multi-head self-attention (FlashAttention-2
// style: tiled online softmax, the (T, T) score matrix never reaches device
// memory). Host-only header; attention_dispatch.cu implements it.
//
// Layouts: qkv (B, T, 3C) with per token [q | k | v], each (H, D), C = H*D;
// out (B, T, C); logsumexp (B, H, T) f32 (natural log, of the scaled scores).
// dtype is a ze::DType value (0 f32, 1 bf16, 2 f16). bf16/f16 use tensor
// cores with f32 accumulation: warpgroup products (wgmma, attention_sm90.h)
// on compute capability 9.0 at D = 64, otherwise mma.sync m16n8k16 for any
// D <= 256 (D a multiple of 16, 64 or 128 best; other D are zero-padded to
// the next instantiated size); f32 uses a simple, slow kernel meant for
// tests.
// Launchers return the cudaError_t of the launch as int (0 = success).
//
// Kernel choice (fixed, one production family per GPU and head size): on a
// compute capability 9.0 GPU at head size exactly 64 with 16-byte aligned
// tensors, the Hopper warpgroup-product kernels of attention_sm90.cu;
// everywhere else the mma.sync kernels (attention_mma.h: at padded D 64 a
// 4-warp pipelined forward, at 128 an 8-warp 128-query forward; at padded
// D 64 and 128 FlashAttention-2's two-kernel backward, dK/dV per 128-key
// tile in two query halves, then dQ per 128-query tile written straight
// into dqkv, with no f32 accumulator or atomics; at 80 and 256 the 4-warp
// pipelined kernels). Tests force the mma.sync kernels on Hopper with
// attention_testing.h.
#ifndef ZE_NN_CUDA_ATTENTION_H_
#define ZE_NN_CUDA_ATTENTION_H_

#include <cstddef>
#include <cstdint>

namespace ze {
namespace nn {
namespace cuda_kernels {

constexpr int kMaxAttentionHeadDim = 256;

int LaunchAttentionForward(const void* qkv, void* out, float* logsumexp,
                           int batch, int seq_len, int heads, int head_dim,
                           int dtype, void* stream);

// Bytes of device workspace LaunchAttentionBackward needs (f32 dQ
// accumulator (B, H, T, D) and the row sums D_i = dO_i . O_i (B, H, T)).
// The two-kernel backwards (wgmma, and mma.sync at padded D 64 and 128) leave
// the accumulator part unused; the size does not depend on the kernel
// choice, so callers may allocate once.
size_t AttentionBackwardWorkspaceBytes(int batch, int seq_len, int heads,
                                       int head_dim);

// dqkv (B, T, 3C) overwritten. `workspace` holds at least
// AttentionBackwardWorkspaceBytes bytes, 256-byte aligned, contents ignored.
int LaunchAttentionBackward(const void* dout, const void* qkv, const void* out,
                            const float* logsumexp, void* dqkv, void* workspace,
                            int batch, int seq_len, int heads, int head_dim,
                            int dtype, void* stream);

// Which implementation the launcher runs for these arguments: "wgmma" (the
// Hopper kernels), "mma.sync" (attention_mma.h's kernels) or "f32" (the
// simple kernels). backward false: LaunchAttentionForward with
// (qkv, out); true: LaunchAttentionBackward with (dout, qkv, dqkv). So tests
// can tell a silent fallback from the kernel they meant to check.
const char* AttentionKernelName(bool backward, const void* qkv,
                                const void* out_or_dout, const void* dqkv,
                                int seq_len, int head_dim, int dtype);

// Grouped-query attention straight from its three tensors, where the Hopper
// kernels run: q, out (B, T, Hq, 64) and k, v (B, T, Hkv, 64), query head h
// reading key/value head h / (Hq / Hkv), with no packed copy. dq (B, T, Hq,
// 64), dk and dv (B, T, Hkv, 64) are overwritten; each key/value head's
// gradient sums its query heads in f32 (head order) before one rounding.
// GroupedAttentionRunsDirect says whether these launchers may be called for
// the given sizes (bf16/f16, head size 64, Hkv dividing Hq, compute
// capability 9.0); the caller also checks that every pointer is 16-byte
// aligned. Where it is false, callers pack into LaunchAttentionForward's
// layout instead.
// The backward's `workspace` holds at least
// GroupedAttentionDirectWorkspaceBytes, 256-byte aligned (delta, f32).
bool GroupedAttentionRunsDirect(int head_dim, int seq_len, int heads,
                                int kv_heads, int dtype);
size_t GroupedAttentionDirectWorkspaceBytes(int batch, int seq_len, int heads);
int LaunchGroupedAttentionForwardDirect(const void* q, const void* k,
                                        const void* v, void* out,
                                        float* logsumexp, int batch,
                                        int seq_len, int heads, int kv_heads,
                                        int dtype, void* stream);
int LaunchGroupedAttentionBackwardDirect(const void* dout, const void* q,
                                         const void* k, const void* v,
                                         const void* out,
                                         const float* logsumexp, void* dq,
                                         void* dk, void* dv, void* workspace,
                                         int batch, int seq_len, int heads,
                                         int kv_heads, int dtype, void* stream);

}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_CUDA_ATTENTION_H_
