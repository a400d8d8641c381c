// Hopper (sm_90a) attention kernels on warpgroup matrix products (wgmma),
// for head size 64 in bf16/f16. Internal to nn/cuda: attention_dispatch.cu
// decides when they run (see attention.h) and falls back to its mma.sync
// kernels elsewhere. Same layouts and results contract as attention.h; the
// launchers return the cudaError_t of the launch as int (0 = success).
#ifndef ZE_NN_CUDA_ATTENTION_SM90_H_
#define ZE_NN_CUDA_ATTENTION_SM90_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace ze {
namespace nn {
namespace cuda_kernels {

// Whether the current device can run the kernels below (compute capability
// 9.0 exactly: sm_90a code runs nowhere else). Cached per device.
bool Sm90AttentionAvailable();

// Where a batch's queries, keys and values (or their gradients) live, so
// one kernel serves GPT's packed qkv and grouped-query attention's three
// tensors without copying either into the other's layout. Token r of
// sequence b: its query head h at q + (b T + r) q_stride + 64 h, its
// key/value head j at k (v) + (b T + r) kv_stride + 64 j; query head h
// reads key/value head h / (heads / kv_heads). Packed (B, T, 3C): q = qkv,
// k = qkv + C, v = qkv + 2C, both strides 3C, kv_heads = heads.
template <typename Pointer>
struct Sm90Qkv {
  Pointer q, k, v;
  int64_t q_stride;   // elements between consecutive tokens' query rows
  int64_t kv_stride;  // the same for keys and values
};

// in -> out (B, T, H * 64), logsumexp (B, H, T) f32 natural log of the
// scaled scores. dtype kBF16 or kF16; B, T, H and kv_heads positive, H a
// multiple of kv_heads, ceil(T / 64) <= 65535 (the grid's y extent); every
// pointer 16-byte aligned and both strides multiples of 8.
// attention_dispatch.cu checks all of this before calling.
int LaunchAttentionForwardSm90(const Sm90Qkv<const void*>& in, void* out,
                               float* logsumexp, int batch, int seq_len,
                               int heads, int kv_heads, int dtype,
                               cudaStream_t stream);

// grad's q, k and v overwritten from dout (B, T, H * 64), in, the
// forward's logsumexp and delta (B, H, T) f32 = rowwise dout . out; grad
// has in's shapes (its own strides). Two kernels: dK/dV per key tile and
// key/value head (summing that head's query heads in f32, in head order,
// before one rounding), then dQ per query tile (no atomics, no f32
// accumulator in memory). Same requirements as the forward.
int LaunchAttentionBackwardSm90(const void* dout,
                                const Sm90Qkv<const void*>& in,
                                const float* logsumexp, const float* delta,
                                const Sm90Qkv<void*>& grad, int batch,
                                int seq_len, int heads, int kv_heads, int dtype,
                                cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_CUDA_ATTENTION_SM90_H_
