// CPU implementations of nn/functional.h (namespace ze::nn::cpu_backend).
//
// Called by nn/functional.cc after validation, so shapes, dtypes and devices
// are already checked: inputs are 2-D (M, ...) views where functional.h says
// so, and every tensor is on the host. Math is f32 (OpenBLAS sgemm for matrix
// products); bf16/f16 tensors are widened to f32 and outputs rounded back to
// nearest even. Work is done when a function returns. Same contracts as
// nn/functional.h (parameter grads accumulate, input grads are overwritten).
#ifndef ZE_NN_FUNCTIONAL_CPU_H_
#define ZE_NN_FUNCTIONAL_CPU_H_

#include "absl/status/status.h"
#include "core/tensor.h"

namespace ze {
namespace nn {
namespace cpu_backend {

// input (M, K), weight (N, K), bias (N) or undefined, output (M, N).
absl::Status LinearForward(const Tensor &input, const Tensor &weight,
                           const Tensor &bias, const Tensor &output);
absl::Status LinearBackward(const Tensor &grad_output, const Tensor &input,
                            const Tensor &weight, const Tensor &grad_input,
                            const Tensor &grad_weight, const Tensor &grad_bias);
// input (M, C); mean, rstd (M) f32.
absl::Status LayerNormForward(const Tensor &input, const Tensor &weight,
                              const Tensor &bias, const Tensor &output,
                              const Tensor &mean, const Tensor &rstd);
absl::Status LayerNormBackward(const Tensor &grad_output, const Tensor &input,
                               const Tensor &weight, const Tensor &mean,
                               const Tensor &rstd, const Tensor &grad_input,
                               const Tensor &grad_weight,
                               const Tensor &grad_bias);
absl::Status GeluForward(const Tensor &input, const Tensor &output);
absl::Status GeluBackward(const Tensor &grad_output, const Tensor &input,
                          const Tensor &grad_input);
// input (M, K), weight (N, K), bias (N) or undefined; output and
// pre_activation (M, N).
absl::Status LinearGeluForward(const Tensor &input, const Tensor &weight,
                               const Tensor &bias, const Tensor &output,
                               const Tensor &pre_activation);
// grad_output (M, N), input (M, K) or undefined, weight (N, K),
// pre_activation and grad_pre_activation (M, K), grad_pre_activation_bias
// (K) or undefined.
absl::Status GeluLinearBackward(const Tensor &grad_output, const Tensor &input,
                                const Tensor &weight,
                                const Tensor &pre_activation,
                                const Tensor &grad_pre_activation,
                                const Tensor &grad_weight,
                                const Tensor &grad_bias,
                                const Tensor &grad_pre_activation_bias);
// qkv (B, T, 3C), output (B, T, C), logsumexp (B, H, T) f32.
absl::Status AttentionForward(const Tensor &qkv, int num_heads,
                              const Tensor &output, const Tensor &logsumexp);
absl::Status AttentionBackward(const Tensor &grad_output, const Tensor &qkv,
                               const Tensor &output, const Tensor &logsumexp,
                               int num_heads, const Tensor &grad_qkv);
// qkv (N, T, 3C), rows and starts (N) i32, caches (B, H, T_max, D) of
// qkv's dtype, output (N, T, C). InvalidArgument for a row outside [0, B)
// or a start outside [0, T_max - T].
absl::Status KvCacheWrite(const Tensor &qkv, const Tensor &rows,
                          const Tensor &starts, int num_heads,
                          const Tensor &key_cache, const Tensor &value_cache);
absl::Status CachedAttentionForward(const Tensor &qkv, const Tensor &rows,
                                    const Tensor &starts, int num_heads,
                                    const Tensor &key_cache,
                                    const Tensor &value_cache,
                                    const Tensor &output);
// tokens (B, T) i32; InvalidArgument for an id outside [0, V).
absl::Status EmbeddingForward(const Tensor &tokens, const Tensor &token_table,
                              const Tensor &position_table,
                              const Tensor &output);
// starts (B) i32; InvalidArgument for a start outside [0, max_T - T].
absl::Status EmbeddingForwardAt(const Tensor &tokens, const Tensor &starts,
                                const Tensor &token_table,
                                const Tensor &position_table,
                                const Tensor &output);
absl::Status EmbeddingBackward(const Tensor &grad_output, const Tensor &tokens,
                               const Tensor &grad_token_table,
                               const Tensor &grad_position_table);
// logits (M, V), targets (M) i32, losses (M) f32; the softmax over the
// first `classes` (1..V) columns. InvalidArgument for a target >= classes.
absl::Status CrossEntropyForward(const Tensor &logits, const Tensor &targets,
                                 const Tensor &losses, int64_t classes,
                                 const Tensor &logsumexp);
absl::Status CrossEntropySliceBackward(const Tensor &logits,
                                       const Tensor &logsumexp,
                                       const Tensor &targets, float grad_scale,
                                       const Tensor &grad_logits,
                                       int64_t offset, int64_t classes);
absl::Status CrossEntropyBackward(const Tensor &logits, const Tensor &targets,
                                  float grad_scale, const Tensor &grad_logits,
                                  int64_t classes);

// ---- Decoder (Llama-family) ops.
// input (M, C), weight (C), output (M, C), rstd (M) f32.
absl::Status RmsNormForward(const Tensor &input, const Tensor &weight,
                            float eps, const Tensor &output,
                            const Tensor &rstd);
absl::Status RmsNormBackward(const Tensor &grad_output, const Tensor &input,
                             const Tensor &weight, const Tensor &rstd,
                             const Tensor &grad_input,
                             const Tensor &grad_weight);
// input, output (B, T, H, D); inv_freq (D / 2) f32; starts (B) i32 or
// undefined. `inverse` rotates by minus the angle (the backward).
absl::Status RotaryEmbedding(const Tensor &input, const Tensor &inv_freq,
                             const Tensor &starts, const Tensor &output,
                             bool inverse);
// Elementwise over equal shapes.
absl::Status SwiGluForward(const Tensor &gate, const Tensor &up,
                           const Tensor &output);
absl::Status SwiGluBackward(const Tensor &grad_output, const Tensor &gate,
                            const Tensor &up, const Tensor &grad_gate,
                            const Tensor &grad_up);
// q, output (B, T, Hq, D); k, v (B, T, Hkv, D); logsumexp (B, Hq, T) f32.
absl::Status GroupedAttentionForward(const Tensor &q, const Tensor &k,
                                     const Tensor &v, const Tensor &output,
                                     const Tensor &logsumexp);
absl::Status GroupedAttentionBackward(
    const Tensor &grad_output, const Tensor &q, const Tensor &k,
    const Tensor &v, const Tensor &output, const Tensor &logsumexp,
    const Tensor &grad_q, const Tensor &grad_k, const Tensor &grad_v);
// k, v (N, T, Hkv, D); caches (B, Hkv, T_max, D); q, output (N, T, Hq, D).
// InvalidArgument for a row outside [0, B) or a start outside
// [0, T_max - T].
absl::Status GroupedKvCacheWrite(const Tensor &k, const Tensor &v,
                                 const Tensor &rows, const Tensor &starts,
                                 const Tensor &key_cache,
                                 const Tensor &value_cache);
absl::Status GroupedCachedAttentionForward(const Tensor &q, const Tensor &rows,
                                           const Tensor &starts,
                                           const Tensor &key_cache,
                                           const Tensor &value_cache,
                                           const Tensor &output);

}  // namespace cpu_backend
}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_FUNCTIONAL_CPU_H_
