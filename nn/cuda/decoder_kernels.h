// CUDA launchers for the decoder's (Llama / Mistral / Qwen) building blocks
// of nn/functional.h: RMSNorm, rotate-half RoPE, SwiGLU, grouped-query
// causal attention and its KV-cache path. Host-only header: plain C++
// includes it; decoder_ops.cu and grouped_attention.cu implement it.
//
// Conventions as kernels.h: pointers are device memory, `dtype` a ze::DType
// value (0 f32, 1 bf16, 2 f16) shared by every tensor of a launch unless
// said otherwise, all arithmetic in f32, `stream` a cudaStream_t as void*,
// returns the cudaError_t of the launch as int (0 = success), nothing
// synchronises. Attention tensors are token-major (B, T, H, D), contiguous.
#ifndef ZE_NN_CUDA_DECODER_KERNELS_H_
#define ZE_NN_CUDA_DECODER_KERNELS_H_

#include <cstddef>
#include <cstdint>

namespace ze {
namespace nn {
namespace cuda_kernels {

// rstd (M) f32 = 1 / sqrt(mean(x^2) + eps); y (M, C) = weight (C) * (x *
// rstd). rstd may be null (not saved).
int LaunchRmsNormForward(const void* x, const void* weight, void* y,
                         float* rstd, int64_t rows, int64_t cols, float eps,
                         int dtype, void* stream);

// dx (M, C) = rstd * (dxhat - xhat * mean(dxhat * xhat)) + addend (M, C),
// dxhat = dy * weight, xhat = x * rstd, one rounding; addend may be null
// (nothing added). dx may alias dy (and addend: each element is read by
// the thread that writes it).
int LaunchRmsNormBackward(const void* dy, const void* x, const void* weight,
                          const float* rstd, const void* addend, void* dx,
                          int64_t rows, int64_t cols, int dtype, void* stream);

// partials (ColumnPartialSumsCount(rows), C) f32 = sums over row chunks of
// dy * x * rstd (the weight gradient's terms), in a fixed order; finish with
// LaunchAddColumnSums (kernels.h) for a deterministic grad_weight. Must run
// before a LaunchRmsNormBackward whose dx aliases dy.
int LaunchRmsNormWeightPartials(const void* dy, const void* x,
                                const float* rstd, float* partials,
                                int64_t rows, int64_t cols, int dtype,
                                void* stream);

// Rotate-half rotary embedding: y (B, T, H, D) from x (B, T, H, D), token
// (b, t) at position p = (starts ? starts[b] : 0) + t, angle a_i = f32
// product p * inv_freq[i] (inv_freq (D / 2) f32), cos/sin of it in f32;
// `inverse` rotates by -a (the backward). y may alias x. D even.
int LaunchRotaryEmbedding(const void* x, const float* inv_freq,
                          const int32_t* starts, void* y, int64_t batch,
                          int64_t seq_len, int64_t heads, int64_t head_dim,
                          bool inverse, int dtype, void* stream);

// y = silu(gate) * up over `count` elements.
int LaunchSwiGluForward(const void* gate, const void* up, void* y,
                        int64_t count, int dtype, void* stream);
// dgate = dy * up * silu'(gate), dup = dy * silu(gate); either may be null.
int LaunchSwiGluBackward(const void* dy, const void* gate, const void* up,
                         void* dgate, void* dup, int64_t count, int dtype,
                         void* stream);

// Grouped-query causal attention, q (B, T, Hq, D), k, v (B, T, Hkv, D),
// query head h reading key/value head h / (Hq / Hkv); out (B, T, Hq, D);
// logsumexp (B, Hq, T) f32 (natural log of the scaled scores). Tiled
// kernels with f32 tiles in shared memory: 0 < head_dim <=
// kMaxGroupedAttentionHeadDim, Hkv dividing Hq.
constexpr int kMaxGroupedAttentionHeadDim = 256;
int LaunchGroupedAttentionForward(const void* q, const void* k, const void* v,
                                  void* out, float* logsumexp, int batch,
                                  int seq_len, int q_heads, int kv_heads,
                                  int head_dim, int dtype, void* stream);

// Bytes of device workspace LaunchGroupedAttentionBackward needs (the row
// sums delta (B, Hq, T) f32).
size_t GroupedAttentionBackwardWorkspaceBytes(int batch, int seq_len,
                                              int q_heads);

// dq (B, T, Hq, D), dk, dv (B, T, Hkv, D) overwritten (each key/value head
// sums its group's query heads inside one block: no atomics,
// deterministic). `workspace`: at least
// GroupedAttentionBackwardWorkspaceBytes, contents ignored.
int LaunchGroupedAttentionBackward(const void* dout, const void* q,
                                   const void* k, const void* v,
                                   const void* out, const float* logsumexp,
                                   void* dq, void* dk, void* dv,
                                   void* workspace, int batch, int seq_len,
                                   int q_heads, int kv_heads, int head_dim,
                                   int dtype, void* stream);

// Adapters to nn/cuda/attention.h's tensor-core family, which reads GPT's
// packed layout: qkv (B, T, 3 * Hq * D) = per token [q | k | v] with every
// key/value head repeated for its group (transformers' repeat_kv). `tokens`
// = B * T.
int LaunchPackGroupedQkv(const void* q, const void* k, const void* v, void* qkv,
                         int64_t tokens, int q_heads, int kv_heads,
                         int head_dim, int dtype, void* stream);
// The inverse for gradients: dq = dqkv's q part; dk (dv) = the sum, in f32
// and in head order, of the group's repeated k (v) parts.
int LaunchUnpackGroupedQkvGrad(const void* dqkv, void* dq, void* dk, void* dv,
                               int64_t tokens, int q_heads, int kv_heads,
                               int head_dim, int dtype, void* stream);

// KV cache of grouped-query decoding. k, v (N, T, Hkv, D); rows, starts (N)
// int32; key_cache, value_cache (B, Hkv, capacity, D). As kernels.h's
// LaunchKvCacheWrite, an entry whose row is outside [0, B) or whose
// positions [starts[i], starts[i] + T) leave [0, capacity) is skipped.
int LaunchGroupedKvCacheWrite(const void* k, const void* v, const int32_t* rows,
                              const int32_t* starts, void* key_cache,
                              void* value_cache, int64_t n, int64_t seq_len,
                              int kv_heads, int head_dim, int64_t batch,
                              int64_t capacity, int dtype, void* stream);
// out (N, T, Hq, D): query (i, t) of head h attends over cache positions
// [0, starts[i] + t] of row rows[i], key/value head h / (Hq / Hkv); skipped
// entries (as above) leave their output rows as they were. head_dim <=
// kMaxCachedAttentionHeadDim (kernels.h).
int LaunchGroupedCachedAttentionForward(
    const void* q, const int32_t* rows, const int32_t* starts,
    const void* key_cache, const void* value_cache, void* out, int64_t n,
    int64_t seq_len, int q_heads, int kv_heads, int head_dim, int64_t batch,
    int64_t capacity, int dtype, void* stream);

}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_CUDA_DECODER_KERNELS_H_
