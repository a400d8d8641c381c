#include "zero/optimizer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/ops.h"
#include "core/status.h"
#include "zero/optimizer_kernels.h"

namespace ze {
namespace zero {
namespace {

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
                  : !IsFloatingPoint(tensor.dtype())) {
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
  switch (options.moments) {
    case MomentFormat::kBf16:
      return 4;
    case MomentFormat::kBlockwise8:
      return 2;
    case MomentFormat::kF32:
      break;
  }
  return 8;
}

FlatOptimizer::FlatOptimizer(const OptimizerOptions& options,
                             int64_t num_elements, const Device& device)
    : options_(options), num_elements_(num_elements), device_(device) {}

absl::StatusOr<std::unique_ptr<FlatOptimizer>> FlatOptimizer::Create(
    const OptimizerOptions& options, int64_t num_elements, const Device& device,
    Allocator* allocator, int64_t format_elements) {
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
    // f32 or bf16 moments as themselves; 8-bit codes as bytes in a 2-byte
    // container, and one f32 step per block of each.
    const MomentFormat format = offload::EffectiveMomentFormat(
        options, format_elements >= 0 ? format_elements : num_elements);
    optimizer->moment_format_ = format;
    const Shape moments = format == MomentFormat::kBlockwise8
                              ? Shape{(num_elements + 1) / 2}
                              : shape;
    const DType dtype =
        format == MomentFormat::kF32 ? DType::kF32 : DType::kBF16;
    ZE_ASSIGN_OR_RETURN(optimizer->exp_avg_,
                        Tensor::Zeros(moments, dtype, device, allocator));
    ZE_ASSIGN_OR_RETURN(optimizer->exp_avg_sq_,
                        Tensor::Zeros(moments, dtype, device, allocator));
    if (format == MomentFormat::kBlockwise8) {
      const Shape steps = {(num_elements + offload::kMomentBlock - 1) /
                           offload::kMomentBlock};
      ZE_ASSIGN_OR_RETURN(optimizer->exp_avg_steps_,
                          Tensor::Zeros(steps, DType::kF32, device, allocator));
      ZE_ASSIGN_OR_RETURN(optimizer->exp_avg_sq_steps_,
                          Tensor::Zeros(steps, DType::kF32, device, allocator));
    }
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
  const int64_t granule = offload::MomentGranule(moment_format_);
  if (state_offset % granule != 0 ||
      (count % granule != 0 && state_offset + count != num_elements_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer step: range [", state_offset, ", ",
                     state_offset + count, ") does not cover whole blocks of ",
                     granule, " elements, as 8-bit moments need"));
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
    const int64_t bytes = moment_format_ == MomentFormat::kF32    ? 4
                          : moment_format_ == MomentFormat::kBf16 ? 2
                                                                  : 1;
    at.state0 = static_cast<char*>(exp_avg_.data()) + state_offset * bytes;
    at.state1 = static_cast<char*>(exp_avg_sq_.data()) + state_offset * bytes;
    if (moment_format_ == MomentFormat::kBlockwise8) {
      at.step0 = exp_avg_steps_.data_as<float>() +
                 state_offset / offload::kMomentBlock;
      at.step1 = exp_avg_sq_steps_.data_as<float>() +
                 state_offset / offload::kMomentBlock;
    }
  }
  return at;
}

void FlatOptimizer::SetState(const StateAt& state, int64_t state_offset,
                             offload::StepBuffers* buffers) const {
  buffers->state0 = state.state0;
  buffers->state1 = state.state1;
  buffers->step0 = state.step0;
  buffers->step1 = state.step1;
  buffers->moment_format = moment_format_;
  buffers->first_index = state_offset;
}

cuda::Moments FlatOptimizer::MomentsOf(const StateAt& state,
                                       int64_t state_offset) const {
  cuda::Moments moments;
  moments.state0 = state.state0;
  moments.state1 = state.state1;
  moments.step0 = state.step0;
  moments.step1 = state.step1;
  moments.format = static_cast<int>(moment_format_);
  moments.first_index = state_offset;
  return moments;
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
  const StateAt state = StateFrom(state_offset);

  offload::StepBuffers buffers;
  buffers.master = master_weights.data_as<float>();
  SetState(state, state_offset, &buffers);
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
          coefficients, buffers.master,
          cuda::Moments{buffers.state0, buffers.state1, buffers.step0,
                        buffers.step1, static_cast<int>(buffers.moment_format),
                        buffers.first_index},
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
  const StateAt state = StateFrom(state_offset);
  if (count == 0) return absl::OkStatus();
  uint16_t* hi = static_cast<uint16_t*>(master_hi.data());
  uint16_t* lo = static_cast<uint16_t*>(master_lo.data());
  if (device_.is_cpu()) {
    static const offload::SimdPath path = offload::BestSimdPath();
    offload::StepBuffers buffers;
    SetState(state, state_offset, &buffers);
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
      cuda::LaunchSplitMasterStep(
          coefficients, hi, lo, MomentsOf(state, state_offset), grads.data(),
          static_cast<int>(grads.dtype()), count, stream.native()),
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

absl::StatusOr<FlatOptimizer::HostState> FlatOptimizer::StateToHost(
    int array, int64_t begin, const Tensor& values,
    const Stream& stream) const {
  const std::vector<NamedStateTensor> state = StateTensors();
  const int64_t count = values.numel();
  if (array < 0 || array >= static_cast<int>(state.size()) || begin < 0 ||
      begin + count > num_elements_ || !values.device().is_cpu() ||
      values.dtype() != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer state: array ", array, " elements [", begin,
                     ", ", begin + count, ") of ", num_elements_, " through ",
                     values.DebugString(), " (host f32 needed)"));
  }
  const Tensor& tensor = state[array].tensor;
  HostState host;
  host.low = begin;
  host.high = begin + count;
  host.format = options_.type == OptimizerType::kSgd ? MomentFormat::kF32
                                                     : moment_format_;
  if (count == 0) return host;
  const bool blocks = moment_format_ == MomentFormat::kBlockwise8 &&
                      options_.type != OptimizerType::kSgd;
  if (blocks) {
    constexpr int64_t kBlock = offload::kMomentBlock;
    host.low = begin / kBlock * kBlock;
    host.high =
        std::min(num_elements_, (begin + count + kBlock - 1) / kBlock * kBlock);
    // Bytes [low, high) in 2-byte units (low is even; the last unit may
    // hold the state's last byte alone).
    const Tensor source =
        tensor.Slice(host.low / 2, (host.high + 1) / 2 - host.low / 2);
    ZE_ASSIGN_OR_RETURN(host.data, Tensor::Empty(source.shape(), source.dtype(),
                                                 Device::Cpu()));
    ZE_RETURN_IF_ERROR(Copy(source, host.data, stream));
    const Tensor& steps = array == 0 ? exp_avg_steps_ : exp_avg_sq_steps_;
    const Tensor step_source = steps.Slice(
        host.low / kBlock, (host.high - host.low + kBlock - 1) / kBlock);
    ZE_ASSIGN_OR_RETURN(host.steps, Tensor::Empty(step_source.shape(),
                                                  DType::kF32, Device::Cpu()));
    ZE_RETURN_IF_ERROR(Copy(step_source, host.steps, stream));
  } else {
    const Tensor source = tensor.Slice(begin, count);
    ZE_ASSIGN_OR_RETURN(host.data, Tensor::Empty(source.shape(), source.dtype(),
                                                 Device::Cpu()));
    ZE_RETURN_IF_ERROR(Copy(source, host.data, stream));
  }
  ZE_RETURN_IF_ERROR(stream.Synchronize());
  return host;
}

absl::Status FlatOptimizer::StateFromHost(int array, const HostState& host,
                                          const Stream& stream) {
  const Tensor& tensor = StateTensors()[array].tensor;
  if (host.steps.defined()) {
    ZE_RETURN_IF_ERROR(
        Copy(host.data, tensor.Slice(host.low / 2, host.data.numel()), stream));
    const Tensor& steps = array == 0 ? exp_avg_steps_ : exp_avg_sq_steps_;
    ZE_RETURN_IF_ERROR(
        Copy(host.steps,
             steps.Slice(host.low / offload::kMomentBlock, host.steps.numel()),
             stream));
  } else {
    ZE_RETURN_IF_ERROR(
        Copy(host.data, tensor.Slice(host.low, host.data.numel()), stream));
  }
  return stream.Synchronize();  // the host copies are freed on return
}

absl::Status FlatOptimizer::ReadState(int array, int64_t begin,
                                      const Tensor& out,
                                      const Stream& stream) const {
  ZE_ASSIGN_OR_RETURN(const HostState host,
                      StateToHost(array, begin, out, stream));
  if (out.numel() == 0) return absl::OkStatus();
  offload::DecodeMoments(host.format, array == 1, host.data.data(),
                         host.steps_data(), begin - host.low, out.numel(),
                         out.data_as<float>());
  return absl::OkStatus();
}

absl::Status FlatOptimizer::WriteState(int array, int64_t begin,
                                       const Tensor& values,
                                       const Stream& stream) {
  ZE_ASSIGN_OR_RETURN(const HostState host,
                      StateToHost(array, begin, values, stream));
  if (values.numel() == 0) return absl::OkStatus();
  offload::EncodeMoments(host.format, array == 1, host.data.data(),
                         host.steps_data(), host.high - host.low,
                         begin - host.low, values.numel(),
                         values.data_as<float>());
  return StateFromHost(array, host, stream);
}

}  // namespace zero
}  // namespace ze
