#include "nn/loss_model.h"

#include "absl/strings/str_cat.h"
#include "core/ops.h"
#include "core/status.h"

namespace ze {
namespace nn {

absl::Status MeanCrossEntropy::CheckTokensAndTargets(const char* op,
                                                     const Tensor& tokens,
                                                     const Tensor& targets) {
  if (!tokens.defined() || tokens.dim() != 2 || tokens.dtype() != DType::kI32) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": tokens must be (B, T) i32, got ",
                     tokens.defined() ? tokens.DebugString() : "undefined"));
  }
  if (!targets.defined() || targets.shape() != tokens.shape() ||
      targets.dtype() != DType::kI32) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": targets must be i32 with the shape of tokens ",
                     ShapeToString(tokens.shape()), ", got ",
                     targets.defined() ? targets.DebugString() : "undefined"));
  }
  return absl::OkStatus();
}

absl::StatusOr<float> MeanCrossEntropy::Forward(const Tensor& losses,
                                                const Tensor& targets,
                                                const Stream& stream) {
  Clear();
  if (!losses.defined() || losses.dtype() != DType::kF32 ||
      losses.numel() != targets.numel() ||
      losses.device() != targets.device()) {
    return absl::InternalError(absl::StrCat(
        "MeanCrossEntropy: per-row losses must be f32 with one value per "
        "target on the targets' device, got ",
        losses.defined() ? losses.DebugString() : "undefined", " for targets ",
        targets.DebugString()));
  }
  // One read back per step: the per-row losses and which rows count.
  Tensor host_losses = losses;
  Tensor host_targets = targets;
  if (losses.device().is_cuda()) {
    ZE_ASSIGN_OR_RETURN(
        host_losses, Tensor::Empty(losses.shape(), DType::kF32, Device::Cpu()));
    ZE_ASSIGN_OR_RETURN(
        host_targets,
        Tensor::Empty(targets.shape(), DType::kI32, Device::Cpu()));
    ZE_RETURN_IF_ERROR(Copy(losses, host_losses, stream));
    ZE_RETURN_IF_ERROR(Copy(targets, host_targets, stream));
    ZE_RETURN_IF_ERROR(stream.Synchronize());
  }
  const float* loss_values = host_losses.data_as<const float>();
  const int32_t* target_ids = host_targets.data_as<const int32_t>();
  double sum = 0.0;
  int64_t counted = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) {
    if (target_ids[i] < 0) continue;
    sum += loss_values[i];
    ++counted;
  }
  pending_ = true;
  counted_ = counted;
  return counted > 0 ? static_cast<float>(sum / counted) : 0.0f;
}

absl::StatusOr<Tensor> MeanCrossEntropy::Backward(const char* op,
                                                  float loss_scale) {
  if (!pending_) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, " without a preceding ForwardLoss"));
  }
  Clear();
  ZE_ASSIGN_OR_RETURN(Tensor grad,
                      Tensor::Empty({1}, DType::kF32, Device::Cpu()));
  *grad.data_as<float>() =
      counted_ > 0 ? loss_scale / static_cast<float>(counted_) : 0.0f;
  return grad;
}

}  // namespace nn
}  // namespace ze
