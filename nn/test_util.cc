#include "nn/test_util.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "core/ops.h"
#include "core/status.h"

namespace ze {
namespace nn {
namespace testing {

Tensor RandomTensor(const Shape &shape, uint64_t seed, float scale) {
  Tensor tensor = Tensor::Empty(shape, DType::kF32, Device::Cpu()).value();
  std::mt19937_64 generator(seed);
  std::uniform_real_distribution<float> uniform(-scale, scale);
  float *data = tensor.data_as<float>();
  for (int64_t i = 0; i < tensor.numel(); ++i) data[i] = uniform(generator);
  return tensor;
}

Tensor RandomIds(const Shape &shape, uint64_t seed, int32_t limit) {
  Tensor tensor = Tensor::Empty(shape, DType::kI32, Device::Cpu()).value();
  std::mt19937_64 generator(seed);
  std::uniform_int_distribution<int32_t> uniform(0, limit - 1);
  int32_t *data = tensor.data_as<int32_t>();
  for (int64_t i = 0; i < tensor.numel(); ++i) data[i] = uniform(generator);
  return tensor;
}

std::vector<float> Values(const Tensor &tensor) {
  return ToHostFloats(tensor, Stream::Default(tensor.device())).value();
}

Tensor CopyToCpuF32(const Tensor &tensor) {
  const std::vector<float> values = Values(tensor);
  return FromHostFloats(values, tensor.shape(), DType::kF32, Device::Cpu(),
                        Stream())
      .value();
}

namespace {

// Checks `count` sampled elements of `values` (perturbed in place) against
// `analytic`.
void CheckTensor(const std::string &name, float *values, int64_t numel,
                 const std::vector<float> &analytic,
                 const std::function<double()> &loss,
                 const GradCheckOptions &options, std::mt19937_64 &generator,
                 std::vector<std::string> &failures) {
  std::uniform_int_distribution<int64_t> pick(0, numel - 1);
  const int samples =
      static_cast<int>(std::min<int64_t>(options.samples_per_tensor, numel));
  for (int s = 0; s < samples; ++s) {
    const int64_t index = samples == numel ? s : pick(generator);
    const float original = values[index];
    values[index] = original + options.epsilon;
    const double loss_plus = loss();
    values[index] = original - options.epsilon;
    const double loss_minus = loss();
    values[index] = original;
    const double numeric = (loss_plus - loss_minus) / (2.0 * options.epsilon);
    const double expected = analytic[index];
    const double error = std::fabs(numeric - expected);
    const double bound = options.absolute_tol +
                         options.relative_tol *
                             std::max(std::fabs(numeric), std::fabs(expected));
    if (!(error <= bound)) {
      failures.push_back(absl::StrCat(name, "[", index, "]: analytic ",
                                      expected, " numeric ", numeric));
    }
  }
}

}  // namespace

std::vector<std::string> CheckGradientsOfLoss(
    const std::vector<Parameter *> &parameters,
    const std::function<double()> &loss, const std::function<void()> &backward,
    const GradCheckOptions &options) {
  std::vector<std::string> failures;
  for (Parameter *parameter : parameters) parameter->ReleaseGrad();
  backward();
  std::mt19937_64 generator(options.seed);
  for (Parameter *parameter : parameters) {
    if (!parameter->requires_grad()) continue;
    if (!parameter->grad().defined()) {
      failures.push_back(absl::StrCat(parameter->name(), ": no gradient"));
      continue;
    }
    const std::vector<float> analytic = Values(parameter->grad());
    Tensor data = parameter->data().value();
    ZE_CHECK(data.device().is_cpu() && data.dtype() == DType::kF32);
    CheckTensor(parameter->name(), data.data_as<float>(), data.numel(),
                analytic, loss, options, generator, failures);
  }
  return failures;
}

std::vector<std::string> CheckGradients(Module &module, const Tensor &input,
                                        bool check_input,
                                        const GradCheckOptions &options) {
  const Stream stream;
  Tensor output = module.Forward(input, stream).value();
  const Tensor projection =
      RandomTensor(output.shape(), options.seed + 1, 1.0f);
  auto loss = [&]() {
    NoSaveScope no_save;
    const Tensor out = module.Forward(input, stream).value();
    const std::vector<float> values = Values(out);
    const float *weights = projection.data_as<const float>();
    double sum = 0.0;
    for (size_t i = 0; i < values.size(); ++i) sum += values[i] * weights[i];
    return sum;
  };
  Tensor grad_input;
  std::vector<Parameter *> parameters = module.Parameters();
  std::vector<std::string> failures = CheckGradientsOfLoss(
      parameters, loss,
      [&]() { grad_input = module.Backward(projection, stream).value(); },
      options);
  if (check_input) {
    std::mt19937_64 generator(options.seed + 2);
    ZE_CHECK(grad_input.defined() && input.dtype() == DType::kF32);
    CheckTensor("input", input.data_as<float>(), input.numel(),
                Values(grad_input), loss, options, generator, failures);
  }
  if (module.PendingBackwardCalls() != 0) {
    failures.push_back("saved forward state left after backward");
  }
  return failures;
}

absl::Status SgdStep(Module &model, float learning_rate, const Stream &stream) {
  for (Parameter *parameter : model.Parameters()) {
    ZE_ASSIGN_OR_RETURN(Tensor data, parameter->data());
    ZE_RETURN_IF_ERROR(
        Axpby(1.0f, data, -learning_rate, parameter->grad(), data, stream));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> SgdLosses(LossModel &model,
                                             const Tensor &inputs,
                                             const Tensor &targets, int steps,
                                             float learning_rate,
                                             const Stream &stream) {
  std::vector<float> losses;
  for (int step = 0; step < steps; ++step) {
    ZE_RETURN_IF_ERROR(model.ZeroGrad(stream));
    ZE_ASSIGN_OR_RETURN(const float loss,
                        model.ForwardLoss(inputs, targets, stream));
    losses.push_back(loss);
    ZE_RETURN_IF_ERROR(model.BackwardLoss(1.0f, stream));
    ZE_RETURN_IF_ERROR(SgdStep(model, learning_rate, stream));
  }
  return losses;
}

}  // namespace testing
}  // namespace nn
}  // namespace ze
