// CUDA implementations of nn/functional.h. Called by nn/functional.cc after
// it has validated shapes, dtypes and devices (all tensors on one CUDA
// device), so these functions only check what the kernels themselves need.
// Same contracts as nn/functional.h; work is queued on `stream`.
//
// Matrix-product epilogue fusion. Besides the bias of LinearForward
// (CUBLASLT_EPILOGUE_BIAS), three cuBLASLt epilogues replace separate
// kernels:
//   - LinearBackward with grad_weight and grad_bias: BGRADB on the weight
//     gradient product (the bias gradient is the column sum of its B
//     operand, grad_output).
//   - LinearGeluForward: GELU_AUX_BIAS (GELU_AUX without bias) writes
//     gelu(x W^T + b) to the output and x W^T + b to pre_activation.
//   - GeluLinearBackward: DGELU_BGRAD (DGELU without the bias output) on the
//     input gradient product, with pre_activation as the auxiliary input.
// cuBLASLt's GELU is taken to be the tanh approximation our kernels and the
// CPU compute (GPT-2's): its documentation only says "GELU", and PyTorch,
// which uses the same epilogue for addmm + gelu, applies
// gelu(approximate="tanh") where it cannot. An exact-erf GELU would differ
// by at most ~5e-4, within bf16 tolerance;
// FunctionalCudaTest.GeluEpilogueIsTheTanhApproximation measures which.
// A bias gradient is written by cuBLASLt into f32 scratch (or in the
// output's dtype where cuBLASLt refuses an f32 bias vector) and added into
// the caller's tensor by one small kernel, keeping the accumulate contract.
// When cuBLASLt offers no algorithm for, or rejects, an epilogue with a given
// problem (shape, dtypes, leading dimensions, alignments), that problem falls
// back to the unfused path (the plain product plus the column-sum or GELU
// kernels) from then on; the decision is cached per problem, so the
// heuristic is asked once. Fused and fallen-back calls are counted
// (MatmulEpilogueStats); ZE_LOG_LEVEL=DEBUG logs each rejected problem once.
// GELU_AUX_BIAS and DGELU (followed by the column-sum kernel) are used;
// DGELU_BGRAD and BGRADB are not, as they measured slower on the
// power-capped H200 (see FusionEnabledInProduction in functional_cuda.cc;
// the BIAS epilogue is always used). Tests switch every fusion on or off
// with functional_cuda_testing.h.
#ifndef ZE_NN_CUDA_FUNCTIONAL_CUDA_H_
#define ZE_NN_CUDA_FUNCTIONAL_CUDA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/stream.h"
#include "core/tensor.h"

namespace ze {
namespace nn {
namespace cuda_backend {

// residual: LinearForwardAdd's (added by the product itself: beta 1 with
// C = residual); must not alias output.
absl::Status LinearForward(const Tensor& input, const Tensor& weight,
                           const Tensor& bias, const Tensor& output,
                           const Stream& stream,
                           const Tensor& residual = Tensor());
// grad_addend, when defined: added to grad_input by the product (C, beta
// 1); must not alias grad_input.
absl::Status LinearBackward(const Tensor& grad_output, const Tensor& input,
                            const Tensor& weight, const Tensor& grad_input,
                            const Tensor& grad_weight, const Tensor& grad_bias,
                            const Stream& stream,
                            const Tensor& grad_addend = Tensor());
absl::Status LayerNormForward(const Tensor& input, const Tensor& weight,
                              const Tensor& bias, const Tensor& output,
                              const Tensor& mean, const Tensor& rstd,
                              const Stream& stream);
// grad_addend: LayerNormBackwardAdd's (added to grad_input).
absl::Status LayerNormBackward(const Tensor& grad_output, const Tensor& input,
                               const Tensor& weight, const Tensor& mean,
                               const Tensor& rstd, const Tensor& grad_input,
                               const Tensor& grad_weight,
                               const Tensor& grad_bias, const Stream& stream,
                               const Tensor& grad_addend = Tensor());
absl::Status GeluForward(const Tensor& input, const Tensor& output,
                         const Stream& stream);
absl::Status GeluBackward(const Tensor& grad_output, const Tensor& input,
                          const Tensor& grad_input, const Stream& stream);
absl::Status LinearGeluForward(const Tensor& input, const Tensor& weight,
                               const Tensor& bias, const Tensor& output,
                               const Tensor& pre_activation,
                               const Stream& stream);
absl::Status GeluLinearBackward(
    const Tensor& grad_output, const Tensor& input, const Tensor& weight,
    const Tensor& pre_activation, const Tensor& grad_pre_activation,
    const Tensor& grad_weight, const Tensor& grad_bias,
    const Tensor& grad_pre_activation_bias, const Stream& stream);
absl::Status AttentionForward(const Tensor& qkv, int num_heads,
                              const Tensor& output, const Tensor& logsumexp,
                              const Stream& stream);
absl::Status AttentionBackward(const Tensor& grad_output, const Tensor& qkv,
                               const Tensor& output, const Tensor& logsumexp,
                               int num_heads, const Tensor& grad_qkv,
                               const Stream& stream);
absl::Status EmbeddingForward(const Tensor& tokens, const Tensor& token_table,
                              const Tensor& position_table,
                              const Tensor& output, const Stream& stream);
absl::Status EmbeddingForwardAt(const Tensor& tokens, const Tensor& starts,
                                const Tensor& token_table,
                                const Tensor& position_table,
                                const Tensor& output, const Stream& stream);
// Incremental decoding (nn/cuda/kv_cache.cu): plain kernels, any head size
// up to 256 (Unimplemented beyond).
absl::Status KvCacheWrite(const Tensor& qkv, const Tensor& rows,
                          const Tensor& starts, int num_heads,
                          const Tensor& key_cache, const Tensor& value_cache,
                          const Stream& stream);
absl::Status CachedAttentionForward(const Tensor& qkv, const Tensor& rows,
                                    const Tensor& starts, int num_heads,
                                    const Tensor& key_cache,
                                    const Tensor& value_cache,
                                    const Tensor& output, const Stream& stream);
absl::Status EmbeddingBackward(const Tensor& grad_output, const Tensor& tokens,
                               const Tensor& grad_token_table,
                               const Tensor& grad_position_table,
                               const Stream& stream);
// The softmax over the first `classes` (1..V) columns of each row.
absl::Status CrossEntropyForward(const Tensor& logits, const Tensor& targets,
                                 const Tensor& losses, int64_t classes,
                                 const Stream& stream,
                                 const Tensor& logsumexp = Tensor());
absl::Status CrossEntropySliceBackward(const Tensor& logits,
                                       const Tensor& logsumexp,
                                       const Tensor& targets, float grad_scale,
                                       const Tensor& grad_logits,
                                       int64_t offset, int64_t classes,
                                       const Stream& stream);
absl::Status CrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                                  float grad_scale, const Tensor& grad_logits,
                                  int64_t classes, const Stream& stream);

// Decoder (Llama / Mistral / Qwen) ops (decoder_kernels.h). Every tensor of
// a call in one dtype except rstd / logsumexp (f32), inv_freq (f32), starts
// and rows (i32) and grad_weight (any float dtype). RmsNorm takes input,
// output and their gradients as (M, C). The grouped-attention kernels take
// head_dim <= 256 (Unimplemented beyond). As KvCacheWrite and
// CachedAttentionForward above, the KV-cache ops do not read rows and starts
// back to the host: an entry outside the cache is skipped by the kernels.
absl::Status RmsNormForward(const Tensor& input, const Tensor& weight,
                            float eps, const Tensor& output, const Tensor& rstd,
                            const Stream& stream);
// grad_addend, when defined, is added to grad_input inside the kernel.
absl::Status RmsNormBackward(const Tensor& grad_output, const Tensor& input,
                             const Tensor& weight, const Tensor& rstd,
                             const Tensor& grad_input,
                             const Tensor& grad_weight, const Stream& stream,
                             const Tensor& grad_addend = Tensor());
// RotaryEmbeddingForward (inverse false) and RotaryEmbeddingBackward
// (inverse true, input = grad_output, output = grad_input).
absl::Status RotaryEmbedding(const Tensor& input, const Tensor& inv_freq,
                             const Tensor& starts, const Tensor& output,
                             bool inverse, const Stream& stream);
absl::Status SwiGluForward(const Tensor& gate, const Tensor& up,
                           const Tensor& output, const Stream& stream);
absl::Status SwiGluBackward(const Tensor& grad_output, const Tensor& gate,
                            const Tensor& up, const Tensor& grad_gate,
                            const Tensor& grad_up, const Stream& stream);
absl::Status GroupedAttentionForward(const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& output,
                                     const Tensor& logsumexp,
                                     const Stream& stream);
absl::Status GroupedAttentionBackward(
    const Tensor& grad_output, const Tensor& q, const Tensor& k,
    const Tensor& v, const Tensor& output, const Tensor& logsumexp,
    const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
    const Stream& stream);
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

// Process-wide counts since start (or ResetMatmulEpilogueStats), per fused
// epilogue: calls that ran fused, and calls that took the unfused path
// because cuBLASLt rejected the problem or its documented limits exclude it
// (the GELU aux leading dimension, N of LinearGeluForward and K of
// GeluLinearBackward, must be a multiple of 8). Calls made while fusion is
// disabled, or that never qualify (grad_bias without grad_weight, empty
// products), are not counted.
struct MatmulEpilogueStats {
  int64_t bgradb_fused = 0, bgradb_fallback = 0;
  int64_t gelu_aux_fused = 0, gelu_aux_fallback = 0;
  int64_t dgelu_fused = 0, dgelu_fallback = 0;
};
MatmulEpilogueStats GetMatmulEpilogueStats();
void ResetMatmulEpilogueStats();

}  // namespace cuda_backend
}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_CUDA_FUNCTIONAL_CUDA_H_
