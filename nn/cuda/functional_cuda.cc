// Placeholder: real implementations follow.
#include "nn/cuda/functional_cuda.h"

#include "absl/strings/str_cat.h"

namespace ze {
namespace nn {
namespace cuda_backend {

namespace {
absl::Status NotYet(const char* op) {
  return absl::UnimplementedError(absl::StrCat("CUDA ", op, " not yet implemented"));
}
}  // namespace

absl::Status LinearForward(const Tensor&, const Tensor&, const Tensor&,
                           const Tensor&, const Stream&) {
  return NotYet("LinearForward");
}
absl::Status LinearBackward(const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, const Tensor&, const Tensor&,
                            const Stream&) {
  return NotYet("LinearBackward");
}
absl::Status LayerNormForward(const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, const Tensor&,
                              const Stream&) {
  return NotYet("LayerNormForward");
}
absl::Status LayerNormBackward(const Tensor&, const Tensor&, const Tensor&,
                               const Tensor&, const Tensor&, const Tensor&,
                               const Tensor&, const Tensor&, const Stream&) {
  return NotYet("LayerNormBackward");
}
absl::Status GeluForward(const Tensor&, const Tensor&, const Stream&) {
  return NotYet("GeluForward");
}
absl::Status GeluBackward(const Tensor&, const Tensor&, const Tensor&,
                          const Stream&) {
  return NotYet("GeluBackward");
}
absl::Status AttentionForward(const Tensor&, int, const Tensor&, const Tensor&,
                              const Stream&) {
  return NotYet("AttentionForward");
}
absl::Status AttentionBackward(const Tensor&, const Tensor&, const Tensor&,
                               const Tensor&, int, const Tensor&,
                               const Stream&) {
  return NotYet("AttentionBackward");
}
absl::Status EmbeddingForward(const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Stream&) {
  return NotYet("EmbeddingForward");
}
absl::Status EmbeddingBackward(const Tensor&, const Tensor&, const Tensor&,
                               const Tensor&, const Stream&) {
  return NotYet("EmbeddingBackward");
}
absl::Status CrossEntropyForward(const Tensor&, const Tensor&, const Tensor&,
                                 const Stream&) {
  return NotYet("CrossEntropyForward");
}
absl::Status CrossEntropyBackward(const Tensor&, const Tensor&, float,
                                  const Tensor&, const Stream&) {
  return NotYet("CrossEntropyBackward");
}

}  // namespace cuda_backend
}  // namespace nn
}  // namespace ze
