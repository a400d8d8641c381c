// Hopper (sm_90a) attention kernels on warpgroup matrix products (wgmma),
// for head size 64 in bf16/f16. Internal to nn/cuda: attention_dispatch.cu
// decides when they run (see attention.h) and falls back to its mma.sync
// kernels elsewhere. Same layouts and results contract as attention.h; the
// launchers return the cudaError_t of the launch as int (0 = success).
#ifndef ZE_NN_CUDA_ATTENTION_SM90_H_
#define ZE_NN_CUDA_ATTENTION_SM90_H_

#include <cuda_runtime.h>

namespace ze {
namespace nn {
namespace cuda_kernels {

// Whether the current device can run the kernels below (compute capability
// 9.0 exactly: sm_90a code runs nowhere else). Cached per device.
bool Sm90AttentionAvailable();

// qkv (B, T, 3C) -> out (B, T, C), logsumexp (B, H, T) f32 natural log of
// the scaled scores. head_dim must be 64; dtype kBF16 or kF16; B, T and H
// positive with ceil(T / 64) <= 65535 (the grid's y extent); qkv and out
// 16-byte aligned. attention_dispatch.cu checks all of this before calling.
int LaunchAttentionForwardSm90(const void* qkv, void* out, float* logsumexp,
                               int batch, int seq_len, int heads, int dtype,
                               cudaStream_t stream);

// dqkv (B, T, 3C) overwritten from dout (B, T, C), qkv, the forward's
// logsumexp and delta (B, H, T) f32 = rowwise dout . out. head_dim 64;
// dtype kBF16 or kF16. Two kernels: dK/dV per key tile, then dQ per query
// tile (no atomics, no f32 accumulator).
int LaunchAttentionBackwardSm90(const void* dout, const void* qkv,
                                const float* logsumexp, const float* delta,
                                void* dqkv, int batch, int seq_len, int heads,
                                int dtype, cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_CUDA_ATTENTION_SM90_H_
