#include "zero/optimizer.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "zero/optimizer_kernels.h"

namespace ze {
namespace zero {
namespace {

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
  ZE_RETURN_IF_ERROR(offload::ValidateOptimizerOptions(options, num_elements));

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

absl::Status FlatOptimizer::CheckRange(int64_t state_offset,
                                       int64_t count) const {
  if (state_offset < 0 || state_offset + count > num_elements_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer step: range [", state_offset, ", ", state_offset + count,
        ") leaves the optimizer state of ", num_elements_, " elements"));
  }
  return absl::OkStatus();
}

FlatOptimizer::StateAt FlatOptimizer::StateFrom(int64_t state_offset) const {
  StateAt at;
  if (options_.type == OptimizerType::kSgd) {
    if (momentum_buffer_.defined()) {
      at.state0 = momentum_buffer_.data_as<float>() + state_offset;
    }
  } else {
    at.state0 = exp_avg_.data_as<float>() + state_offset;
    at.state1 = exp_avg_sq_.data_as<float>() + state_offset;
  }
  return at;
}

absl::Status FlatOptimizer::EnterDevice(const Stream& stream) const {
  if (stream.device() != device_) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer step: stream on ", stream.device().ToString(),
                     ", optimizer on ", device_.ToString()));
  }
  return SetCurrentDevice(device_);
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
  ZE_RETURN_IF_ERROR(CheckRange(state_offset, count));
  ZE_RETURN_IF_ERROR(
      CheckTensor(master_weights, "master_weights", count, device_, true));
  ZE_RETURN_IF_ERROR(CheckTensor(grads, "grads", count, device_, false));
  if (model_weights.defined()) {
    ZE_RETURN_IF_ERROR(
        CheckTensor(model_weights, "model_weights", count, device_, false));
  }
  ZE_ASSIGN_OR_RETURN(
      const offload::StepCoefficients coefficients,
      offload::ComputeStepCoefficients(options_, step_count_, step_args,
                                       momentum_buffer_.defined()));
  const auto [state0, state1] = StateFrom(state_offset);

  offload::StepBuffers buffers;
  buffers.master = master_weights.data_as<float>();
  buffers.state0 = state0;
  buffers.state1 = state1;
  buffers.grads = grads.data();
  buffers.grad_dtype = grads.dtype();
  if (model_weights.defined()) {
    buffers.out = model_weights.data();
    buffers.out_dtype = model_weights.dtype();
  }
  buffers.count = count;
  if (count > 0 && !device_.is_cpu()) ZE_RETURN_IF_ERROR(EnterDevice(stream));
  return RunStepKernelOn(device_, options_.type, coefficients, buffers, stream);
}

absl::Status RunStepKernelOn(const Device& device, OptimizerType type,
                             const offload::StepCoefficients& coefficients,
                             const offload::StepBuffers& buffers,
                             const Stream& stream) {
  if (buffers.count == 0) return absl::OkStatus();
  if (buffers.master == nullptr || buffers.master_lo != nullptr ||
      buffers.bf16_ties_away) {
    return absl::InvalidArgumentError(
        "optimizer step kernel: an f32 master is required (the 16+16 forms "
        "are StepSplitRange's)");
  }
  if (device.is_cpu()) {
    // offload/'s kernel, the one CPU implementation (AVX-512, AVX2 or
    // scalar by the CPU; one thread: the engine steps bucket by bucket).
    static const offload::SimdPath path = offload::BestSimdPath();
    offload::RunStepKernel(path, coefficients, buffers);
    return absl::OkStatus();
  }
  return CudaStatus(
      cuda::LaunchOptimizerStep(
          coefficients, buffers.master, buffers.state0, buffers.state1,
          buffers.grads, static_cast<int>(buffers.grad_dtype), buffers.out,
          buffers.out != nullptr ? static_cast<int>(buffers.out_dtype)
                                 : kNoOutput,
          buffers.count, stream.native()),
      absl::StrCat(OptimizerTypeName(type), " step kernel on ",
                   device.ToString()));
}

absl::Status FlatOptimizer::StepSplitRange(
    int64_t state_offset, const Tensor& master_hi, const Tensor& master_lo,
    const Tensor& grads, const StepArgs& step_args, const Stream& stream) {
  if (!master_hi.defined()) {
    return absl::InvalidArgumentError("optimizer step: master_hi is undefined");
  }
  const int64_t count = master_hi.numel();
  ZE_RETURN_IF_ERROR(CheckRange(state_offset, count));
  ZE_RETURN_IF_ERROR(
      CheckTensor(master_hi, "master_hi", count, device_, false));
  ZE_RETURN_IF_ERROR(
      CheckTensor(master_lo, "master_lo", count, device_, false));
  if (master_hi.dtype() != DType::kBF16 || SizeOf(master_lo.dtype()) != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer step: a 16+16 master needs bf16 master_hi and 2-byte "
        "master_lo, got ",
        master_hi.DebugString(), " and ", master_lo.DebugString()));
  }
  ZE_RETURN_IF_ERROR(CheckTensor(grads, "grads", count, device_, false));
  ZE_ASSIGN_OR_RETURN(
      const offload::StepCoefficients coefficients,
      offload::ComputeStepCoefficients(options_, step_count_, step_args,
                                       momentum_buffer_.defined()));
  const auto [state0, state1] = StateFrom(state_offset);
  if (count == 0) return absl::OkStatus();
  uint16_t* hi = static_cast<uint16_t*>(master_hi.data());
  uint16_t* lo = static_cast<uint16_t*>(master_lo.data());
  if (device_.is_cpu()) {
    static const offload::SimdPath path = offload::BestSimdPath();
    offload::StepBuffers buffers;
    buffers.state0 = state0;
    buffers.state1 = state1;
    buffers.grads = grads.data();
    buffers.grad_dtype = grads.dtype();
    buffers.out = hi;
    buffers.out_dtype = DType::kBF16;
    buffers.master_lo = lo;
    buffers.count = count;
    offload::RunStepKernel(path, coefficients, buffers);
    return absl::OkStatus();
  }
  ZE_RETURN_IF_ERROR(EnterDevice(stream));
  return CudaStatus(
      cuda::LaunchSplitMasterStep(coefficients, hi, lo, state0, state1,
                                  grads.data(), static_cast<int>(grads.dtype()),
                                  count, stream.native()),
      absl::StrCat(OptimizerTypeName(options_.type),
                   " 16+16 master step kernel on ", device_.ToString()));
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
