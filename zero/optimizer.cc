#include "zero/optimizer.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "zero/optimizer_kernels.h"

namespace ze {
namespace zero {
namespace {

bool IsBeta(double beta) { return beta >= 0.0 && beta < 1.0; }

bool IsFloatFormat(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}

absl::Status CheckTensor(const Tensor& tensor, const char* what,
                         int64_t num_elements, const Device& device,
                         bool must_be_f32) {
  if (!tensor.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer step: ", what, " is undefined"));
  }
  if (tensor.numel() != num_elements) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer step: ", what, " ", tensor.DebugString(), " has ",
        tensor.numel(), " elements, the optimizer state has ", num_elements));
  }
  if (tensor.device() != device) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer step: ", what, " ", tensor.DebugString(),
                     " is not on the optimizer's device ", device.ToString()));
  }
  if (must_be_f32 ? tensor.dtype() != DType::kF32
                  : !IsFloatFormat(tensor.dtype())) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer step: ", what, " ", tensor.DebugString(),
                     " must be ", must_be_f32 ? "f32" : "f32, bf16 or f16"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* OptimizerTypeName(OptimizerType type) {
  switch (type) {
    case OptimizerType::kAdam:
      return "adam";
    case OptimizerType::kAdamW:
      return "adamw";
    case OptimizerType::kSgd:
      return "sgd";
  }
  return "unknown";
}

int64_t StateBytesPerElement(const OptimizerOptions& options) {
  if (options.type == OptimizerType::kSgd) {
    return options.momentum != 0.0 ? 4 : 0;
  }
  return 8;
}

FlatOptimizer::FlatOptimizer(const OptimizerOptions& options,
                             int64_t num_elements, const Device& device)
    : options_(options), num_elements_(num_elements), device_(device) {}

absl::StatusOr<std::unique_ptr<FlatOptimizer>> FlatOptimizer::Create(
    const OptimizerOptions& options, int64_t num_elements, const Device& device,
    Allocator* allocator) {
  const std::string name = OptimizerTypeName(options.type);
  if (num_elements < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": num_elements must be >= 0, got ", num_elements));
  }
  if (!(options.weight_decay >= 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": weight_decay must be >= 0, got ", options.weight_decay));
  }
  if (options.type == OptimizerType::kSgd) {
    if (!(options.momentum >= 0.0) || !(options.dampening >= 0.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": momentum and dampening must be >= 0, got ",
                       options.momentum, " and ", options.dampening));
    }
    if (options.nesterov &&
        (options.momentum <= 0.0 || options.dampening != 0.0)) {
      return absl::InvalidArgumentError(
          "sgd: nesterov requires a momentum and zero dampening");
    }
  } else {
    if (!IsBeta(options.beta1) || !IsBeta(options.beta2)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": betas must be in [0, 1), got (", options.beta1,
                       ", ", options.beta2, ")"));
    }
    if (!(options.eps > 0.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": eps must be > 0, got ", options.eps));
    }
  }

  std::unique_ptr<FlatOptimizer> optimizer(
      new FlatOptimizer(options, num_elements, device));
  const Shape shape = {num_elements};
  if (options.type == OptimizerType::kSgd) {
    if (options.momentum != 0.0) {
      ZE_ASSIGN_OR_RETURN(optimizer->momentum_buffer_,
                          Tensor::Zeros(shape, DType::kF32, device, allocator));
    }
  } else {
    ZE_ASSIGN_OR_RETURN(optimizer->exp_avg_,
                        Tensor::Zeros(shape, DType::kF32, device, allocator));
    ZE_ASSIGN_OR_RETURN(optimizer->exp_avg_sq_,
                        Tensor::Zeros(shape, DType::kF32, device, allocator));
  }
  return optimizer;
}

absl::Status FlatOptimizer::Step(const Tensor& master_weights,
                                 const Tensor& grads, const StepArgs& step_args,
                                 const Stream& stream,
                                 const Tensor& model_weights) {
  ZE_RETURN_IF_ERROR(CheckTensor(master_weights, "master_weights",
                                 num_elements_, device_, true));
  ZE_RETURN_IF_ERROR(
      StepRange(0, master_weights, grads, step_args, stream, model_weights));
  AdvanceStep();
  return absl::OkStatus();
}

absl::Status FlatOptimizer::StepRange(int64_t state_offset,
                                      const Tensor& master_weights,
                                      const Tensor& grads,
                                      const StepArgs& step_args,
                                      const Stream& stream,
                                      const Tensor& model_weights) {
  if (!master_weights.defined()) {
    return absl::InvalidArgumentError(
        "optimizer step: master_weights is undefined");
  }
  const int64_t count = master_weights.numel();
  if (state_offset < 0 || state_offset + count > num_elements_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer step: range [", state_offset, ", ", state_offset + count,
        ") leaves the optimizer state of ", num_elements_, " elements"));
  }
  ZE_RETURN_IF_ERROR(
      CheckTensor(master_weights, "master_weights", count, device_, true));
  ZE_RETURN_IF_ERROR(CheckTensor(grads, "grads", count, device_, false));
  if (model_weights.defined()) {
    ZE_RETURN_IF_ERROR(
        CheckTensor(model_weights, "model_weights", count, device_, false));
  }
  if (!std::isfinite(step_args.lr) || !std::isfinite(step_args.grad_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer step: lr ", step_args.lr, " and grad_scale ",
                     step_args.grad_scale, " must be finite"));
  }
  const double beta1 = step_args.beta1.value_or(
      options_.type == OptimizerType::kSgd ? options_.momentum
                                           : options_.beta1);
  const double beta2 = step_args.beta2.value_or(options_.beta2);
  if (step_args.beta1.has_value() && !IsBeta(beta1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer step: beta1 override ", beta1, " is outside [0, 1)"));
  }
  if (step_args.beta2.has_value() && !IsBeta(beta2)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer step: beta2 override ", beta2, " is outside [0, 1)"));
  }

  // Per-step scalars in double, rounded once to f32, so CPU and CUDA see
  // identical coefficients.
  const double lr = step_args.lr;
  const double weight_decay = options_.weight_decay;
  const int64_t t = step_count_ + 1;
  OptimizerCoefficients c;
  c.grad_scale = step_args.grad_scale;
  float* state0 = nullptr;
  float* state1 = nullptr;
  if (options_.type == OptimizerType::kSgd) {
    c.kind = kKernelSgd;
    c.l2 = static_cast<float>(weight_decay);
    c.neg_step_size = static_cast<float>(-lr);
    c.momentum = static_cast<float>(beta1);
    c.one_minus_dampening = static_cast<float>(1.0 - options_.dampening);
    c.has_momentum_buffer = momentum_buffer_.defined() ? 1 : 0;
    c.nesterov = options_.nesterov ? 1 : 0;
    c.first_step = step_count_ == 0 ? 1 : 0;
    if (momentum_buffer_.defined()) {
      state0 = momentum_buffer_.data_as<float>() + state_offset;
    }
  } else {
    c.kind = kKernelAdam;
    const bool decoupled = options_.type == OptimizerType::kAdamW;
    c.l2 = decoupled ? 0.0f : static_cast<float>(weight_decay);
    c.decay_factor =
        decoupled ? static_cast<float>(1.0 - lr * weight_decay) : 1.0f;
    const double bias_correction1 = 1.0 - std::pow(beta1, t);
    const double bias_correction2 = 1.0 - std::pow(beta2, t);
    c.neg_step_size = static_cast<float>(-lr / bias_correction1);
    c.inv_sqrt_bias_correction2 =
        static_cast<float>(1.0 / std::sqrt(bias_correction2));
    c.beta1 = static_cast<float>(beta1);
    c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
    c.beta2 = static_cast<float>(beta2);
    c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
    c.eps = static_cast<float>(options_.eps);
    state0 = exp_avg_.data_as<float>() + state_offset;
    state1 = exp_avg_sq_.data_as<float>() + state_offset;
  }

  const int grad_dtype = static_cast<int>(grads.dtype());
  void* out = model_weights.defined() ? model_weights.data() : nullptr;
  const int out_dtype = model_weights.defined()
                            ? static_cast<int>(model_weights.dtype())
                            : kNoOutput;
  if (count > 0) {
    if (device_.is_cpu()) {
      CpuOptimizerStep(c, master_weights.data_as<float>(), state0, state1,
                       grads.data(), grad_dtype, out, out_dtype, count);
    } else {
      if (stream.device() != device_) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer step: stream on ", stream.device().ToString(),
            ", optimizer on ", device_.ToString()));
      }
      ZE_RETURN_IF_ERROR(SetCurrentDevice(device_));
      ZE_RETURN_IF_ERROR(CudaStatus(
          cuda::LaunchOptimizerStep(c, master_weights.data_as<float>(), state0,
                                    state1, grads.data(), grad_dtype, out,
                                    out_dtype, count, stream.native()),
          absl::StrCat(OptimizerTypeName(options_.type), " step kernel on ",
                       device_.ToString())));
    }
  }
  return absl::OkStatus();
}

std::vector<NamedStateTensor> FlatOptimizer::StateTensors() const {
  std::vector<NamedStateTensor> state;
  if (exp_avg_.defined()) state.push_back({"exp_avg", exp_avg_});
  if (exp_avg_sq_.defined()) state.push_back({"exp_avg_sq", exp_avg_sq_});
  if (momentum_buffer_.defined()) {
    state.push_back({"momentum_buffer", momentum_buffer_});
  }
  return state;
}

}  // namespace zero
}  // namespace ze
