// The mma.sync (any sm_90 build, bf16/f16) and simple f32 attention
// launchers behind attention.h, internal to nn/cuda: attention_dispatch.cu
// validates the arguments (B, T, H positive, 0 < head_dim <=
// kMaxAttentionHeadDim) and picks these or the Hopper kernels
// (attention_sm90.h). Layouts and results as in attention.h. Launchers
// enqueue on `stream` and return the cudaError_t of the launch as int
// (0 = success).
//
// Kernels: bf16/f16 forward, the 4-warp pipelined kernel (64 queries per
// CTA) at padded head size 64, 80 and 256 and the 8-warp kernel (128
// queries per CTA) at 128; backward at padded 64 and 128, FlashAttention-2's
// two kernels (dK/dV per 128-key tile in two query halves, then dQ per
// 128-query tile written straight into dqkv), at 80 and 256 the 4-warp
// pipelined kernel with f32 dQ reductions into the workspace and a
// conversion pass. Head sizes are zero-padded to the next of 64, 80, 128,
// 256.
#ifndef ZE_NN_CUDA_ATTENTION_MMA_H_
#define ZE_NN_CUDA_ATTENTION_MMA_H_

#include <cuda_runtime.h>

#include <cstddef>

namespace ze {
namespace nn {
namespace cuda_kernels {
namespace mma_attention {

// qkv (B, T, 3C) -> out (B, T, C), logsumexp (B, H, T). dtype kF32, kBF16
// or kF16 (anything else: cudaErrorInvalidValue).
int LaunchForward(const void* qkv, void* out, float* logsumexp, int batch,
                  int seq_len, int heads, int head_dim, int dtype,
                  cudaStream_t stream);

// Bytes of workspace LaunchBackward needs: the f32 dQ accumulator
// (B, H, T, D), then the row sums delta (B, H, T), each 256-byte aligned.
size_t BackwardWorkspaceBytes(int batch, int seq_len, int heads, int head_dim);

// Where delta lives in such a workspace (so the Hopper backward, which
// needs only delta, uses the same layout).
float* DeltaInWorkspace(void* workspace, int batch, int seq_len, int heads,
                        int head_dim);

// delta (B, H, T) f32 = rowwise dout . out, for dtype kF32, kBF16 or kF16
// (anything else launches nothing). A launch error surfaces at the next
// cudaGetLastError, i.e. in the launcher that consumes delta.
void LaunchDelta(const void* dout, const void* out, float* delta, int batch,
                 int seq_len, int heads, int head_dim, int dtype,
                 cudaStream_t stream);

// dqkv (B, T, 3C) overwritten, from dout (B, T, C), qkv, out and the
// forward's logsumexp; computes delta itself. `workspace`: at least
// BackwardWorkspaceBytes, 256-byte aligned, contents ignored.
int LaunchBackward(const void* dout, const void* qkv, const void* out,
                   const float* logsumexp, void* dqkv, void* workspace,
                   int batch, int seq_len, int heads, int head_dim, int dtype,
                   cudaStream_t stream);

}  // namespace mma_attention
}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_CUDA_ATTENTION_MMA_H_
