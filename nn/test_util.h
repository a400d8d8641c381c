// Test helpers for nn: random host tensors and finite-difference gradient
// checks of modules.
#ifndef ZE_NN_TEST_UTIL_H_
#define ZE_NN_TEST_UTIL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "nn/loss_model.h"
#include "nn/module.h"

namespace ze {
namespace nn {
namespace testing {

// An f32 CPU tensor with uniform values in [-scale, scale) from `seed`.
Tensor RandomTensor(const Shape &shape, uint64_t seed, float scale = 1.0f);
// An i32 CPU tensor of ids in [0, limit).
Tensor RandomIds(const Shape &shape, uint64_t seed, int32_t limit);
// The values of a tensor (any device, any float dtype) as f32.
std::vector<float> Values(const Tensor &tensor);
// A copy of `tensor` on the CPU in f32.
Tensor CopyToCpuF32(const Tensor &tensor);
// One plain SGD step: every parameter of `model` -= learning_rate * its
// gradient (Axpby on `stream`). Fails as Axpby, or for a parameter without
// data.
absl::Status SgdStep(Module &model, float learning_rate, const Stream &stream);
// `steps` SGD steps of `model` on one batch: each zeroes the gradients, runs
// ForwardLoss, BackwardLoss(1) and SgdStep. Returns each step's loss (before
// its update), or the first failure.
absl::StatusOr<std::vector<float>> SgdLosses(LossModel &model,
                                             const Tensor &inputs,
                                             const Tensor &targets, int steps,
                                             float learning_rate,
                                             const Stream &stream);

struct GradCheckOptions {
  float epsilon = 1e-2f;       // central difference step
  float absolute_tol = 2e-3f;  // |analytic - numeric| <= abs + rel * max(|.|)
  float relative_tol = 2e-2f;
  int samples_per_tensor = 6;  // elements checked per parameter / input
  uint64_t seed = 7;
};

// Central-difference check of every parameter gradient of `module` (CPU, f32)
// and, with `check_input`, of the input gradient.
//   loss(x) = sum(Forward(x) * projection), projection a fixed random tensor,
//   analytic: Backward(projection) accumulating into fresh grads.
// Forward is run once with saving (for the analytic pass) and the perturbed
// passes under NoSaveScope. `forward` replaces module.Forward when given
// (e.g. a loss head). Returns a description of every mismatch (empty: pass).
std::vector<std::string> CheckGradients(Module &module, const Tensor &input,
                                        bool check_input,
                                        const GradCheckOptions &options = {});

// For models whose scalar loss is computed by the caller: `loss()` runs a
// forward (saving nothing needed) and returns the loss; `backward()` runs the
// analytic backward once (after one saving forward) accumulating grads.
std::vector<std::string> CheckGradientsOfLoss(
    const std::vector<Parameter *> &parameters,
    const std::function<double()> &loss, const std::function<void()> &backward,
    const GradCheckOptions &options = {});

}  // namespace testing
}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_TEST_UTIL_H_
