// CUDA implementations of nn/functional.h. Called by nn/functional.cc after
// it has validated shapes, dtypes and devices (all tensors on one CUDA
// device), so these functions only check what the kernels themselves need.
// Same contracts as nn/functional.h; work is queued on `stream`.
#ifndef ZE_NN_CUDA_FUNCTIONAL_CUDA_H_
#define ZE_NN_CUDA_FUNCTIONAL_CUDA_H_

#include "absl/status/status.h"
#include "core/stream.h"
#include "core/tensor.h"

namespace ze {
namespace nn {
namespace cuda_backend {

absl::Status LinearForward(const Tensor& input, const Tensor& weight,
                           const Tensor& bias, const Tensor& output,
                           const Stream& stream);
absl::Status LinearBackward(const Tensor& grad_output, const Tensor& input,
                            const Tensor& weight, const Tensor& grad_input,
                            const Tensor& grad_weight, const Tensor& grad_bias,
                            const Stream& stream);
// residual/sum: AddLayerNormForward's (both or neither).
absl::Status LayerNormForward(const Tensor& input, const Tensor& weight,
                              const Tensor& bias, const Tensor& output,
                              const Tensor& mean, const Tensor& rstd,
                              const Stream& stream,
                              const Tensor& residual = Tensor(),
                              const Tensor& sum = Tensor());
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
absl::Status EmbeddingBackward(const Tensor& grad_output, const Tensor& tokens,
                               const Tensor& grad_token_table,
                               const Tensor& grad_position_table,
                               const Stream& stream);
absl::Status CrossEntropyForward(const Tensor& logits, const Tensor& targets,
                                 const Tensor& losses, const Stream& stream);
absl::Status CrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                                  float grad_scale, const Tensor& grad_logits,
                                  const Stream& stream);

}  // namespace cuda_backend
}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_CUDA_FUNCTIONAL_CUDA_H_
