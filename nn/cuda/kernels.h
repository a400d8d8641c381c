// CUDA launchers for the GPT building blocks other than matrix products and
// attention (see attention.h): LayerNorm, GELU, embedding, cross-entropy and
// the column reductions behind bias and LayerNorm parameter gradients.
// Host-only header: plain C++ includes it; layer_norm.cu, column_sums.cu,
// gelu.cu, embedding.cu, kv_cache.cu and cross_entropy.cu implement it.
//
// Conventions: pointers are device memory, `dtype` is a ze::DType value
// (0 f32, 1 bf16, 2 f16), `stream` is a cudaStream_t as void*. Each launcher
// queues its work and returns the cudaError_t of the launch as int (0 =
// success); nothing synchronises. Row-major, contiguous; M rows.
#ifndef ZE_NN_CUDA_KERNELS_H_
#define ZE_NN_CUDA_KERNELS_H_

#include <cstdint>

namespace ze {
namespace nn {
namespace cuda_kernels {

// y (M, C) = (x - mean) * rstd * weight (C) + bias (C), eps 1e-5.
// x, weight, bias, y share `dtype`; bias may be null. mean, rstd (M) f32,
// either may be null (not saved).
int LaunchLayerNormForward(const void* x, const void* weight, const void* bias,
                           void* y, float* mean, float* rstd, int64_t rows,
                           int64_t cols, int dtype, void* stream);

// Number of partial rows LaunchLayerNormBackward writes for these rows,
// columns and dtype; size the partial buffers (num_partials, C) f32 with it.
int LayerNormBackwardNumPartials(int64_t rows, int64_t cols, int dtype);

// dx (M, C) = LayerNorm input gradient (overwritten; null: skipped), plus
// dx_addend (M, C) when given (the residual branch's gradient, fused; needs
// dx, must not alias it).
// weight_partials / bias_partials (num_partials, C) f32 receive per-block
// sums of dy * xhat and dy (null: skipped); reduce them with
// LaunchAddColumnSums. dy, x, weight, dx share `dtype`.
int LaunchLayerNormBackward(const void* dy, const void* x, const void* weight,
                            const float* mean, const float* rstd, void* dx,
                            float* weight_partials, float* bias_partials,
                            int64_t rows, int64_t cols, int dtype, void* stream,
                            const void* dx_addend = nullptr);

// target (cols) of `target_dtype` += sum over rows of partials (rows, cols)
// f32, summed in a fixed order: deterministic.
int LaunchAddColumnSums(const float* partials, int64_t rows, int64_t cols,
                        void* target, int target_dtype, void* stream);

// Number of partial rows LaunchColumnPartialSums writes for `rows` rows.
int ColumnPartialSumsCount(int64_t rows);
// partials (ColumnPartialSumsCount(rows), cols) f32 = sums of row chunks of
// x (rows, cols) of `dtype` (used for a Linear's bias gradient).
int LaunchColumnPartialSums(const void* x, int64_t rows, int64_t cols,
                            int dtype, float* partials, void* stream);

// dx (rows, cols) = dy * gelu_tanh'(x), and partials
// (ColumnPartialSumsCount(rows), cols) f32 = column sums of row chunks of dx
// as stored (finish with LaunchAddColumnSums): the GELU backward and the
// bias gradient of the Linear that produced x in one pass. dx may alias dy.
// Needs GeluBackwardColumnSumsSupported (16-byte vectors); otherwise
// returns cudaErrorInvalidValue and queues nothing.
int LaunchGeluBackwardColumnSums(const void* dy, const void* x, void* dx,
                                 int64_t rows, int64_t cols, int dtype,
                                 float* partials, void* stream);
bool GeluBackwardColumnSumsSupported(const void* dy, const void* x,
                                     const void* dx, int64_t cols, int dtype);

// y = gelu_tanh(x), count elements.
int LaunchGeluForward(const void* x, void* y, int64_t count, int dtype,
                      void* stream);
// dx = dy * gelu_tanh'(x); dx may alias dy.
int LaunchGeluBackward(const void* dy, const void* x, void* dx, int64_t count,
                       int dtype, void* stream);

// out (B*T, C) = token_table[clamp(tokens)] + position_table[t] (position
// table may be null). Token ids outside [0, V) are clamped.
// With position_starts (B) int32 (incremental decoding), row (b, t) takes
// position_table[clamp(position_starts[b] + t)] with the clamp into
// [0, max_positions); position_table is then required.
int LaunchEmbeddingForward(const int32_t* tokens, const void* token_table,
                           const void* position_table, void* out, int64_t batch,
                           int64_t seq_len, int64_t cols, int64_t vocab,
                           int dtype, void* stream,
                           const int32_t* position_starts = nullptr,
                           int64_t max_positions = 0);

// grad_position_table (>= T, C) of `dtype` += sum over batch of dy (B, T, C).
int LaunchEmbeddingPositionBackward(const void* dy, void* grad_position_table,
                                    int64_t batch, int64_t seq_len,
                                    int64_t cols, int dtype, int grad_dtype,
                                    void* stream);

// grad_token_table (V, C) of grad_dtype += dy (rows, C) of `dtype`, row r
// added to token tokens[r]'s row (ids clamped into [0, V) as the forward
// does). The rows are grouped by token with a stable radix sort, and each
// touched gradient element is read once, summed in f32 with its token's dy
// rows in ascending row order, and written once: deterministic, the CPU
// backend's order (so equal to it bit for bit), and no (V, C) scratch.
// `workspace` (device) holds at least
// EmbeddingTokenBackwardWorkspaceBytes(rows, vocab) bytes, used on `stream`
// until the launch's work completes. cudaErrorInvalidValue for a small
// workspace, rows or V above 2^31 - 1, or C above 65535 * 256.
size_t EmbeddingTokenBackwardWorkspaceBytes(int64_t rows, int64_t vocab);
int LaunchEmbeddingTokenBackward(const void* dy, int dtype,
                                 const int32_t* tokens, int64_t rows,
                                 int64_t cols, int64_t vocab, void* workspace,
                                 size_t workspace_bytes, void* grad_token_table,
                                 int grad_dtype, void* stream);

// Key/value cache of incremental decoding (kv_cache.cu). qkv (N, T, 3C)
// with C = heads * head_dim; rows, starts (N) int32; key_cache, value_cache
// (B, heads, capacity, head_dim); all of `dtype`. An entry i whose row is
// outside [0, B) or whose positions [starts[i], starts[i] + T) leave
// [0, capacity) is skipped (its output rows are left as they were).
//
// key_cache[rows[i], h, starts[i] + t] = k[i, t, h] (and v).
int LaunchKvCacheWrite(const void* qkv, const int32_t* rows,
                       const int32_t* starts, void* key_cache,
                       void* value_cache, int64_t n, int64_t seq_len, int heads,
                       int head_dim, int64_t batch, int64_t capacity, int dtype,
                       void* stream);
// out (N, T, C): query (i, t) of head h attends over cache positions
// [0, starts[i] + t] of row rows[i] (softmax(q k^T / sqrt(D)) v, f32
// accumulation, online softmax). head_dim <= kMaxCachedAttentionHeadDim.
constexpr int kMaxCachedAttentionHeadDim = 256;
int LaunchCachedAttentionForward(const void* qkv, const int32_t* rows,
                                 const int32_t* starts, const void* key_cache,
                                 const void* value_cache, void* out, int64_t n,
                                 int64_t seq_len, int heads, int head_dim,
                                 int64_t batch, int64_t capacity, int dtype,
                                 void* stream);

// Rows of `vocab` logits, of which the first `classes` (1..vocab) take
// part in the softmax. losses (M) f32 = logsumexp(row[0, classes)) -
// row[target]; 0 where target < 0. logsumexp (M) f32, when not null,
// receives each row's logsumexp (0 where target < 0).
int LaunchCrossEntropyForward(const void* logits, const int32_t* targets,
                              float* losses, float* logsumexp, int64_t rows,
                              int64_t vocab, int64_t classes, int dtype,
                              void* stream);
// A (M, width) slice of logits, its column c the vocabulary's column
// offset + c: grad = scale * (exp(logit - logsumexp[row]) - onehot(target))
// where target >= 0 and offset + c < classes, else 0. grad may alias
// logits.
int LaunchCrossEntropySliceBackward(const void* logits, const float* logsumexp,
                                    const int32_t* targets, float scale,
                                    void* grad, int64_t rows, int64_t width,
                                    int64_t offset, int64_t classes, int dtype,
                                    void* stream);
// grad (M, V) = scale * (softmax(row[0, classes)) - onehot(target)) in the
// first `classes` columns, 0 in the rest and for target < 0. grad may alias
// logits.
int LaunchCrossEntropyBackward(const void* logits, const int32_t* targets,
                               float scale, void* grad, int64_t rows,
                               int64_t vocab, int64_t classes, int dtype,
                               void* stream);

}  // namespace cuda_kernels
}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_CUDA_KERNELS_H_
