// Device-dispatching building blocks of the GPT layers, forward and backward.
//
// Each function checks shapes/dtypes/devices (InvalidArgument naming the
// argument otherwise) and dispatches on the tensors' device:
//   - CPU (nn/functional_cpu.cc): f32 math, OpenBLAS for matrix products.
//     bf16/f16 tensors are storage only: values are widened to f32, computed,
//     and outputs rounded to nearest even.
//   - CUDA (nn/functional_cuda.cc, kernels in nn/cuda/): bf16/f16 (or f32)
//     storage and compute with f32 accumulation; cuBLASLt for matrix products,
//     the bias added in its epilogue, and GELU in LinearGeluForward's; the
//     other fused epilogues are chosen in code by what measured faster
//     (nn/cuda/functional_cuda.h; tests switch them with
//     nn/cuda/functional_cuda_testing.h).
// All work is queued on `stream` (CPU: done on return). No function
// allocates tensors visible to the caller; temporary workspace is internal.
//
// Conventions
//   - Weights use PyTorch's layout: a Linear weight is (out_features,
//     in_features).
//   - Parameter gradients ACCUMULATE (+=) into the given tensors, so a tied
//     parameter or a module run twice sums its contributions; callers zero
//     them at the start of an accumulation window.
//   - Input gradients are OVERWRITTEN, unless documented otherwise.
//   - An undefined Tensor() for an optional output means "not needed"
//     (e.g. grad_input of the first layer, grad_bias of a bias-free Linear).
//   - Token ids and targets are DType::kI32. Statistics saved for backward
//     (mean, rstd, logsumexp, losses) are f32.
//   - M is the number of rows (B*T); all tensors are contiguous.
#ifndef ZE_NN_FUNCTIONAL_H_
#define ZE_NN_FUNCTIONAL_H_

#include "absl/status/status.h"
#include "core/stream.h"
#include "core/tensor.h"

namespace ze {
namespace nn {

// output (M, N) = input (M, K) @ weight (N, K)^T + bias (N).
// `bias` may be undefined. `output` must not alias `input`.
absl::Status LinearForward(const Tensor& input, const Tensor& weight,
                           const Tensor& bias, const Tensor& output,
                           const Stream& stream);

// output (M, N) = input @ weight^T + bias + residual (M, N): a Linear whose
// output joins a residual stream. On CUDA the product adds the residual
// itself (C of the GEMM, beta 1), so no separate pass over the activations;
// on the CPU the Linear then an add. residual must not alias output or
// input. Backward is LinearBackward's (the residual's gradient is
// grad_output itself).
absl::Status LinearForwardAdd(const Tensor& input, const Tensor& weight,
                              const Tensor& bias, const Tensor& residual,
                              const Tensor& output, const Stream& stream);

// grad_input (M, K)   = grad_output (M, N) @ weight (N, K)      (overwritten)
// grad_weight (N, K) += grad_output^T @ input (M, K)           (accumulated)
// grad_bias (N)      += sum over rows of grad_output           (accumulated)
// Each output may be undefined (skipped). grad_input may be `input` itself
// (the same tensor: data, shape and dtype), which then receives its own
// gradient: the weight gradient, input's only reader, is formed first on
// the stream. A layer whose input is its own (a block's (M, 4C) hidden
// activation) saves that buffer at the backward's peak this way. Any
// other overlap of grad_input with an input is refused.
// CUDA: with both grad_weight and grad_bias, the bias sum is fused into the
// weight-gradient product (cuBLASLt BGRADB epilogue into f32 scratch, then
// one small add); otherwise, or where cuBLASLt rejects that epilogue, or
// with fusion disabled, a separate column-sum reduction.
absl::Status LinearBackward(const Tensor& grad_output, const Tensor& input,
                            const Tensor& weight, const Tensor& grad_input,
                            const Tensor& grad_weight, const Tensor& grad_bias,
                            const Stream& stream);

// LinearBackward whose input gradient also receives another branch's
// gradient of the same input (q, k and v projections of one hidden state,
// SwiGLU's gate and up): grad_input (M, K) = grad_output @ weight +
// grad_addend (M, K), grad_addend required and aliasing neither grad_input
// nor grad_output; grad_input may be input itself, as there. On CUDA the
// product adds grad_addend as its C (beta 1, rounded once), so no separate pass
// over the activations; on the CPU LinearBackward then an add.
absl::Status LinearBackwardAdd(const Tensor& grad_output, const Tensor& input,
                               const Tensor& weight, const Tensor& grad_addend,
                               const Tensor& grad_input,
                               const Tensor& grad_weight,
                               const Tensor& grad_bias, const Stream& stream);

// output (M, C) = (input - mean) * rstd * weight (C) + bias (C), with
// eps = 1e-5 as GPT-2. Saves mean (M) and rstd (M), f32, for backward.
absl::Status LayerNormForward(const Tensor& input, const Tensor& weight,
                              const Tensor& bias, const Tensor& output,
                              const Tensor& mean, const Tensor& rstd,
                              const Stream& stream);

// grad_input (M, C) overwritten; grad_weight (C), grad_bias (C) accumulated.
absl::Status LayerNormBackward(const Tensor& grad_output, const Tensor& input,
                               const Tensor& weight, const Tensor& mean,
                               const Tensor& rstd, const Tensor& grad_input,
                               const Tensor& grad_weight,
                               const Tensor& grad_bias, const Stream& stream);

// LayerNormBackward whose input gradient also receives the gradient of a
// residual branch joining at the LayerNorm's input:
// grad_input (M, C) = LayerNorm'(grad_output) + grad_addend (M, C), both
// required and not aliased; grad_weight, grad_bias accumulated as there.
absl::Status LayerNormBackwardAdd(
    const Tensor& grad_output, const Tensor& input, const Tensor& weight,
    const Tensor& mean, const Tensor& rstd, const Tensor& grad_addend,
    const Tensor& grad_input, const Tensor& grad_weight,
    const Tensor& grad_bias, const Stream& stream);

// GELU, tanh approximation (GPT-2):
// output = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Any shape.
absl::Status GeluForward(const Tensor& input, const Tensor& output,
                         const Stream& stream);
// grad_input = grad_output * gelu'(input). grad_input may alias grad_output.
absl::Status GeluBackward(const Tensor& grad_output, const Tensor& input,
                          const Tensor& grad_input, const Stream& stream);

// A Linear followed by GELU (tanh approximation), in one step:
//   pre_activation (M, N) = input (M, K) @ weight (N, K)^T + bias (N)
//   output (M, N)         = gelu(pre_activation)
// Both outputs are overwritten; pre_activation is what GeluLinearBackward
// (or GeluBackward) needs later. `bias` may be undefined. output and
// pre_activation must not alias each other or input. On CUDA,
// pre_activation must have output's dtype.
// CUDA: one cuBLASLt product with the GELU_AUX(_BIAS) epilogue (GELU of the
// f32 accumulator; pre_activation is that accumulator rounded); where
// cuBLASLt rejects it (N not a multiple of 8, dtype, alignment) or fusion is
// disabled, LinearForward into pre_activation then GeluForward.
// CPU: f32 product, GELU of the f32 pre-activation, both rounded once.
absl::Status LinearGeluForward(const Tensor& input, const Tensor& weight,
                               const Tensor& bias, const Tensor& output,
                               const Tensor& pre_activation,
                               const Stream& stream);

// Backward of a Linear whose input was gelu(pre_activation) (e.g. the
// output of LinearGeluForward), fusing GELU's backward into the input
// gradient. With input = gelu(pre_activation) (M, K):
//   grad_pre_activation (M, K) = (grad_output (M, N) @ weight (N, K))
//                                * gelu'(pre_activation)     (overwritten)
//   grad_pre_activation_bias (K) += sum over rows of grad_pre_activation
//                                                            (accumulated)
//   grad_weight (N, K) += grad_output^T @ input               (accumulated)
//   grad_bias (N)      += sum over rows of grad_output        (accumulated)
// grad_pre_activation_bias is the bias gradient of the Linear that produced
// pre_activation (any float dtype). grad_pre_activation and pre_activation
// are required; input only with grad_weight; grad_weight, grad_bias and
// grad_pre_activation_bias may be undefined (skipped). grad_pre_activation
// must not alias grad_output or pre_activation; it may be input itself
// (same shape and dtype; the weight gradient, input's only reader, is then
// formed first), so that the (M, K) activation's buffer takes its
// gradient.
// CUDA: the input-gradient product uses the DGELU_BGRAD epilogue (DGELU
// without grad_pre_activation_bias), the bias sum going through f32 scratch
// and one small add; where cuBLASLt rejects it (K not a multiple of 8, ...)
// or fusion is disabled: LinearBackward's product, GeluBackward and a column
// sum. grad_weight/grad_bias as in LinearBackward.
absl::Status GeluLinearBackward(
    const Tensor& grad_output, const Tensor& input, const Tensor& weight,
    const Tensor& pre_activation, const Tensor& grad_pre_activation,
    const Tensor& grad_weight, const Tensor& grad_bias,
    const Tensor& grad_pre_activation_bias, const Stream& stream);

// Causal multi-head self-attention core.
//   qkv (B, T, 3 * C): per token [q | k | v], each (H, D) with C = H * D
//                      (the layout of GPT-2's fused c_attn output).
//   output (B, T, C):  softmax(q k^T / sqrt(D) + causal mask) v, heads
//                      concatenated.
//   logsumexp (B, H, T) f32: per query row, saved for backward.
// On CUDA, bf16/f16 tensors must start at 16-byte aligned addresses (all
// allocations do; a view starting mid-row may not): InvalidArgument naming
// the tensor otherwise.
absl::Status AttentionForward(const Tensor& qkv, int num_heads,
                              const Tensor& output, const Tensor& logsumexp,
                              const Stream& stream);
// grad_qkv (B, T, 3 * C) overwritten.
absl::Status AttentionBackward(const Tensor& grad_output, const Tensor& qkv,
                               const Tensor& output, const Tensor& logsumexp,
                               int num_heads, const Tensor& grad_qkv,
                               const Stream& stream);

// Incremental decoding over a key/value cache (nn/kv_cache.h).
//   qkv (N, T, 3 * C):  the new positions of N sequences, [q | k | v] per
//                       token as in AttentionForward.
//   rows (N) i32:       each sequence's row (batch index) of the cache;
//                       distinct.
//   starts (N) i32:     the position of each sequence's first new token.
//   key_cache, value_cache (B, H, T_max, D) with C = H * D, qkv's dtype
//                       (the cache's layout: one contiguous (T_max, D)
//                       block per row and head).
// rows and starts live on qkv's device. On the CPU a row outside [0, B) or
// a start outside [0, T_max - T] is InvalidArgument naming the index; on
// CUDA they are not read back to the host: the kernels skip such entries
// (callers check on the host, as GptModel::ForwardCached does).
//
// KvCacheWrite stores the new keys and values, overwriting
//   key_cache[rows[i], h, starts[i] + t, :] = k[i, t, h, :] (and v)
// for every t < T; no other position changes.
absl::Status KvCacheWrite(const Tensor& qkv, const Tensor& rows,
                          const Tensor& starts, int num_heads,
                          const Tensor& key_cache, const Tensor& value_cache,
                          const Stream& stream);
// CachedAttentionForward: for each new query (i, t), causal attention over
// positions [0, starts[i] + t] of cache row rows[i], which must already
// hold them (this step's KvCacheWrite first):
//   output (N, T, C) = softmax(q k^T / sqrt(D)) v, heads concatenated.
// Equal to AttentionForward over the whole sequence up to rounding (f32
// accumulation in another order). Reads only q of qkv. output must not
// alias qkv or the caches.
absl::Status CachedAttentionForward(const Tensor& qkv, const Tensor& rows,
                                    const Tensor& starts, int num_heads,
                                    const Tensor& key_cache,
                                    const Tensor& value_cache,
                                    const Tensor& output, const Stream& stream);

// output (B, T, C) = token_table[tokens[b, t]] + position_table[t].
//   tokens (B, T) i32; token_table (V, C); position_table (max_T >= T, C).
//   position_table may be undefined (no position embedding).
// A token id outside [0, V) is InvalidArgument on CPU; on CUDA it is
// clamped-and-flagged by the kernel (checked by the caller's data loader).
absl::Status EmbeddingForward(const Tensor& tokens, const Tensor& token_table,
                              const Tensor& position_table,
                              const Tensor& output, const Stream& stream);
// EmbeddingForward at given positions (incremental decoding):
//   output (B, T, C) = token_table[tokens[b, t]] + position_table[starts[b] +
//   t]
// with starts (B) i32 on tokens' device and position_table required. On the
// CPU a start outside [0, max_T - T] is InvalidArgument naming the row; on
// CUDA positions are clamped into the table (and token ids as above).
absl::Status EmbeddingForwardAt(const Tensor& tokens, const Tensor& starts,
                                const Tensor& token_table,
                                const Tensor& position_table,
                                const Tensor& output, const Stream& stream);
// grad_token_table (V, C) += scatter-add of grad_output rows by token id;
// grad_position_table (max_T, C) += sum over the batch (rows t < T only).
// Either may be undefined.
absl::Status EmbeddingBackward(const Tensor& grad_output, const Tensor& tokens,
                               const Tensor& grad_token_table,
                               const Tensor& grad_position_table,
                               const Stream& stream);

// Per-row softmax cross-entropy over the first `classes` columns.
//   logits (M, V); targets (M) i32, a target < 0 marks an ignored row
//   (loss 0, gradient 0); losses (M) f32 = logsumexp(row[0, classes)) -
//   row[target]. classes: 0 means V; fewer leaves a padded vocabulary's
//   columns [classes, V) out of the softmax (a model whose token table is
//   padded for speed computes the unpadded model's loss). InvalidArgument
//   for classes outside [0, V], or (CPU) a target >= classes.
// logsumexp (M) f32, when defined, receives each row's logsumexp (0 for
// ignored rows), what CrossEntropySliceBackward needs.
absl::Status CrossEntropyForward(const Tensor& logits, const Tensor& targets,
                                 const Tensor& losses, const Stream& stream,
                                 int64_t classes = 0,
                                 const Tensor& logsumexp = Tensor());
// grad_logits (M, V) = grad_scale * (softmax(logits) - onehot(target)) over
// the first `classes` columns for rows with target >= 0; 0 for ignored rows
// and for the columns from `classes` on. grad_scale is dLoss/dloss_i (e.g.
// loss_scale / number_of_counted_rows). grad_logits MAY alias logits
// (computed in place, saving a (M, V) buffer).
absl::Status CrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                                  float grad_scale, const Tensor& grad_logits,
                                  const Stream& stream, int64_t classes = 0);
// CrossEntropyBackward over a slice of the vocabulary, from the rows'
// logsumexp (CrossEntropyForward's) instead of a pass over whole rows:
//   logits (M, W): columns [offset, offset + W) of the logits;
//   grad_logits (M, W) = grad_scale * (exp(logits - logsumexp) -
//   onehot(target)) for rows with target >= 0 and columns below `classes`
//   (the vocabulary's unpadded size, >= 1), 0 elsewhere. grad_logits MAY
//   alias logits. Equal to CrossEntropyBackward's columns when logits and
//   logsumexp are the same values.
absl::Status CrossEntropySliceBackward(const Tensor& logits,
                                       const Tensor& logsumexp,
                                       const Tensor& targets, int64_t offset,
                                       int64_t classes, float grad_scale,
                                       const Tensor& grad_logits,
                                       const Stream& stream);

// An output head and its cross-entropy, a chunk of rows at a time, so that
// the logits input @ weight^T (M, V) never exist as a whole: only R rows of
// them, in `logits` (R, V), the caller's workspace in input's dtype
// (1 <= R; R >= M is one chunk). Composed of LinearForward/Backward and
// CrossEntropyForward/Backward on row slices, so every device runs it.
//   input (M, K) (or (..., K)), weight (V, K), targets (M) i32 (any shape of
//   M elements; < 0 ignored), classes as CrossEntropyForward's.
// losses (M) f32 = CrossEntropyForward(input @ weight^T), a chunk of R rows
// at a time; with grad_input or grad_weight defined, the gradients of the
// SUM of the rows' losses are formed while each chunk's logits exist: the
// chunk's logits are turned in place into g = CrossEntropyBackward(scale 1),
// then
//   grad_input (M, K)   = g @ weight            (overwritten; may be undefined)
//   grad_weight (V, K) += g^T @ input           (accumulated; may be
//                                                undefined; any float dtype)
// so that no logits are ever formed twice and none outlive the call. A
// caller scales both by the objective's derivative w.r.t. each row's loss
// when it is known (OutputHead's backward; see nn/layers.h for why that
// costs no precision: g is in [-1, 1] and f32 keeps the weight's sum).
// Gradients equal the whole-matrix path's up to the order of the weight
// gradient's summation over chunks and that final scaling's rounding.
// logsumexp (M) f32, when defined, receives the rows' logsumexp for
// LinearCrossEntropyWeightGradient (a caller that forms the weight's
// gradient later passes grad_weight undefined).
absl::Status LinearCrossEntropyForward(
    const Tensor& input, const Tensor& weight, const Tensor& targets,
    const Tensor& logits, const Tensor& losses, const Stream& stream,
    int64_t classes = 0, const Tensor& grad_input = Tensor(),
    const Tensor& grad_weight = Tensor(), const Tensor& logsumexp = Tensor());

// The output head's weight gradient after its loss forward, a slice of the
// vocabulary at a time, so that neither the (M, V) logits nor a (V, K) f32
// sum exist:
//   grad_weight (V, K) += grad_scale * g^T @ input,  g = softmax gradient
// where for each slice of S columns (S = workspace's columns; the last
// slice narrower) the logits input @ weight[slice]^T (M, S) are formed
// again in `workspace` (M, S) (input's dtype), turned in place into
// CrossEntropySliceBackward(grad_scale) from the forward's logsumexp, and
// multiplied into grad_weight's rows of the slice: one product over all M
// rows per slice, so each gradient element is rounded once into
// grad_weight (any float dtype). Costs one more (M x K) x (K x V) product
// than forming the gradient in the forward (LinearCrossEntropyForward's
// grad_weight). targets, classes as there; logsumexp (M) f32 from it.
// grad_scale multiplies the softmax terms before their rounding into the
// workspace's dtype (f16's range may flush them: use f32 or bf16).
absl::Status LinearCrossEntropyWeightGradient(
    const Tensor& input, const Tensor& weight, const Tensor& targets,
    const Tensor& logsumexp, float grad_scale, const Tensor& workspace,
    const Tensor& grad_weight, const Stream& stream, int64_t classes = 0);

// ---- Decoder (Llama / Mistral / Qwen) ops.
// On CUDA (nn/cuda/decoder_kernels.h) every tensor of a call shares one
// dtype (except the f32 rstd, logsumexp and inv_freq, the i32 starts and
// rows, and grad_weight), and the attention ops take head_dim <= 256
// (Unimplemented beyond). Attention tensors are token-major,
// (B, T, H, D), what the q/k/v projections write (viewed as (B, T, H, D)) and
// what the attention output projection reads, so no transposes are needed.

// RMSNorm over the last dimension, math in f32 (Hugging Face's
// LlamaRMSNorm):
//   rstd (M) f32     = 1 / sqrt(mean(input^2) + eps)
//   output (M, C)    = weight (C) * (input * rstd)
// input and output (..., C), folded into M rows. Qwen3's per-head q/k norm
// is this op with C = head_dim over (B * T * H) rows.
absl::Status RmsNormForward(const Tensor& input, const Tensor& weight,
                            float eps, const Tensor& output, const Tensor& rstd,
                            const Stream& stream);
// grad_input (M, C) overwritten (may alias grad_output); grad_weight (C)
// accumulated; either may be undefined (skipped).
absl::Status RmsNormBackward(const Tensor& grad_output, const Tensor& input,
                             const Tensor& weight, const Tensor& rstd,
                             const Tensor& grad_input,
                             const Tensor& grad_weight, const Stream& stream);
// RmsNormBackward whose input gradient also receives the gradient of a
// residual branch joining at the norm's input: grad_input (M, C) =
// RMSNorm'(grad_output) + grad_addend (M, C), both required, grad_addend
// aliasing neither grad_input nor grad_output. On CUDA the kernel adds it
// before its one rounding (no separate pass); on the CPU the backward then
// an add.
absl::Status RmsNormBackwardAdd(const Tensor& grad_output, const Tensor& input,
                                const Tensor& weight, const Tensor& rstd,
                                const Tensor& grad_addend,
                                const Tensor& grad_input,
                                const Tensor& grad_weight,
                                const Stream& stream);

// Rotary position embedding in Hugging Face's rotate-half layout: each
// head's vector x (D) = [x1 | x2] (two halves of D / 2) of a token at
// position p becomes
//   [x1 * cos(a) - x2 * sin(a) | x2 * cos(a) + x1 * sin(a)],
//   a_i = p * inv_freq[i] (an f32 product, as transformers computes it).
//   input, output (B, T, H, D), D even; output may alias input (in place).
//   inv_freq (D / 2) f32 (RopeInverseFrequencies, nn/decoder_config.h).
//   starts (B) i32 or undefined: token (b, t) is at position starts[b] + t
//   (t without; incremental decoding passes each row's cached length).
absl::Status RotaryEmbeddingForward(const Tensor& input, const Tensor& inv_freq,
                                    const Tensor& starts, const Tensor& output,
                                    const Stream& stream);
// The transpose (rotation by -a): grad_input (B, T, H, D) overwritten, may
// alias grad_output.
absl::Status RotaryEmbeddingBackward(const Tensor& grad_output,
                                     const Tensor& inv_freq,
                                     const Tensor& starts,
                                     const Tensor& grad_input,
                                     const Stream& stream);

// SwiGLU's gating: output = silu(gate) * up, silu(x) = x * sigmoid(x);
// gate, up, output of one shape. output must not alias gate or up.
absl::Status SwiGluForward(const Tensor& gate, const Tensor& up,
                           const Tensor& output, const Stream& stream);
// grad_gate = grad_output * up * silu'(gate), grad_up = grad_output *
// silu(gate); both overwritten, either may be undefined. grad_gate may be
// gate itself and grad_up up itself (same dtype: each element is read
// before it is written), so that a block's gate and up buffers take their
// own gradients; any other alias is refused.
absl::Status SwiGluBackward(const Tensor& grad_output, const Tensor& gate,
                            const Tensor& up, const Tensor& grad_gate,
                            const Tensor& grad_up, const Stream& stream);

// Grouped-query causal attention:
//   q (B, T, Hq, D); k, v (B, T, Hkv, D) with Hkv dividing Hq: query head h
//   reads key/value head h / (Hq / Hkv) (transformers' repeat_kv).
//   output (B, T, Hq, D) = softmax(q k^T / sqrt(D) + causal mask) v.
//   logsumexp (B, Hq, T) f32: per query row, saved for backward.
// output must not alias q, k or v.
absl::Status GroupedAttentionForward(const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& output,
                                     const Tensor& logsumexp,
                                     const Stream& stream);
// grad_q (B, T, Hq, D), grad_k, grad_v (B, T, Hkv, D): all required and
// overwritten (each key/value head's gradient sums its group's query heads).
absl::Status GroupedAttentionBackward(
    const Tensor& grad_output, const Tensor& q, const Tensor& k,
    const Tensor& v, const Tensor& output, const Tensor& logsumexp,
    const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
    const Stream& stream);

// Incremental decoding with grouped-query attention (nn/kv_cache.h), as
// KvCacheWrite / CachedAttentionForward above but for separate tensors:
//   k, v (N, T, Hkv, D): the new positions' keys (after RoPE) and values.
//   q (N, T, Hq, D), output (N, T, Hq, D).
//   rows, starts (N) i32: cache row and first new position of each sequence.
//   key_cache, value_cache (B, Hkv, T_max, D) of k's dtype.
// GroupedKvCacheWrite overwrites key_cache[rows[i], h, starts[i] + t, :] =
// k[i, t, h, :] (and v); GroupedCachedAttentionForward attends query (i, t)
// over cache positions [0, starts[i] + t] of row rows[i], which must hold
// them already. On the CPU a row outside [0, B) or a start outside
// [0, T_max - T] is InvalidArgument naming the index; on CUDA, as for
// KvCacheWrite, rows and starts are not read back: such entries are skipped.
absl::Status GroupedKvCacheWrite(const Tensor& k, const Tensor& v,
                                 const Tensor& rows, const Tensor& starts,
                                 const Tensor& key_cache,
                                 const Tensor& value_cache,
                                 const Stream& stream);
absl::Status GroupedCachedAttentionForward(const Tensor& q, const Tensor& rows,
                                           const Tensor& starts,
                                           const Tensor& key_cache,
                                           const Tensor& value_cache,
                                           const Tensor& output,
                                           const Stream& stream);

}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_FUNCTIONAL_H_
