// Validation and device dispatch for nn/functional.h.
//
// Every check happens here, once, so both backends can trust their inputs.
// Tensors whose leading dimensions are folded into rows ((..., K) for Linear,
// LayerNorm and cross-entropy) are handed to the backends as 2-D views.
#include "nn/functional.h"

#include <algorithm>
#include <initializer_list>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/ops.h"
#include "core/status.h"
#include "nn/cuda/functional_cuda.h"
#include "nn/functional_cpu.h"

namespace ze {
namespace nn {
namespace {

absl::Status Invalid(const char *op, const std::string &message) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", message));
}

absl::Status RequireDefined(const char *op, const char *name,
                            const Tensor &tensor) {
  if (!tensor.defined()) {
    return Invalid(op, absl::StrCat(name, " is undefined"));
  }
  return absl::OkStatus();
}

// A tensor argument and the name an error gives it.
struct NamedTensor {
  const char *name;
  const Tensor &tensor;
};

// Each of `tensors` must be defined; the error names the first that is not.
absl::Status RequireDefined(const char *op,
                            std::initializer_list<NamedTensor> tensors) {
  for (const NamedTensor &named : tensors) {
    ZE_RETURN_IF_ERROR(RequireDefined(op, named.name, named.tensor));
  }
  return absl::OkStatus();
}

// `tensor` must have exactly `shape`.
absl::Status RequireShape(const char *op, const char *name,
                          const Tensor &tensor, const Shape &shape) {
  if (tensor.shape() != shape) {
    return Invalid(op,
                   absl::StrCat(name, " must have shape ", ShapeToString(shape),
                                ", got ", ShapeToString(tensor.shape())));
  }
  return absl::OkStatus();
}

absl::Status RequireDType(const char *op, const char *name,
                          const Tensor &tensor, DType dtype) {
  if (tensor.dtype() != dtype) {
    return Invalid(op, absl::StrCat(name, " must be ", DTypeName(dtype),
                                    ", got ", DTypeName(tensor.dtype())));
  }
  return absl::OkStatus();
}

absl::Status RequireFloat(const char *op, const char *name,
                          const Tensor &tensor) {
  if (!IsFloatingPoint(tensor.dtype())) {
    return Invalid(op, absl::StrCat(name, " must be a float dtype, got ",
                                    DTypeName(tensor.dtype())));
  }
  return absl::OkStatus();
}

// Each defined tensor of `tensors` must have a float dtype.
absl::Status RequireFloatWhereDefined(
    const char *op, std::initializer_list<NamedTensor> tensors) {
  for (const NamedTensor &named : tensors) {
    if (named.tensor.defined()) {
      ZE_RETURN_IF_ERROR(RequireFloat(op, named.name, named.tensor));
    }
  }
  return absl::OkStatus();
}

// All defined tensors among `tensors` must sit on `reference`'s device.
absl::Status RequireSameDevice(const char *op, const char *reference_name,
                               const Tensor &reference,
                               std::initializer_list<NamedTensor> tensors) {
  for (const auto &[name, tensor] : tensors) {
    if (tensor.defined() && tensor.device() != reference.device()) {
      return Invalid(
          op, absl::StrCat(name, " is on ", tensor.device().ToString(), " but ",
                           reference_name, " is on ",
                           reference.device().ToString()));
    }
  }
  return absl::OkStatus();
}

// Rows when the last dimension is folded away: (..., last) -> (rows, last).
absl::StatusOr<int64_t> RowsOf(const char *op, const char *name,
                               const Tensor &tensor, int64_t last) {
  if (tensor.dim() < 1 || tensor.shape().back() != last) {
    return Invalid(op, absl::StrCat(name, " must have shape (..., ", last,
                                    "), got ", ShapeToString(tensor.shape())));
  }
  return last == 0 ? 0 : tensor.numel() / last;
}

Tensor View2D(const Tensor &tensor, int64_t rows, int64_t columns) {
  return tensor.defined() ? tensor.View({rows, columns}) : tensor;
}

}  // namespace

namespace {

// Sizes of a Linear: input (M, K), weight (N, K), output (M, N).
struct LinearSizes {
  int64_t m = 0, k = 0, n = 0;
};

// The checks LinearForward and LinearGeluForward share.
absl::StatusOr<LinearSizes> CheckLinearForward(const char *op,
                                               const Tensor &input,
                                               const Tensor &weight,
                                               const Tensor &bias,
                                               const Tensor &output) {
  ZE_RETURN_IF_ERROR(RequireDefined(
      op, {{"input", input}, {"weight", weight}, {"output", output}}));
  if (weight.dim() != 2) {
    return Invalid(op, absl::StrCat("weight must be (N, K), got ",
                                    ShapeToString(weight.shape())));
  }
  LinearSizes sizes;
  sizes.n = weight.size(0);
  sizes.k = weight.size(1);
  ZE_ASSIGN_OR_RETURN(sizes.m, RowsOf(op, "input", input, sizes.k));
  ZE_ASSIGN_OR_RETURN(const int64_t output_rows,
                      RowsOf(op, "output", output, sizes.n));
  if (output_rows != sizes.m) {
    return Invalid(
        op, absl::StrCat("output ", ShapeToString(output.shape()), " has ",
                         output_rows, " rows, input ",
                         ShapeToString(input.shape()), " has ", sizes.m));
  }
  if (bias.defined()) {
    ZE_RETURN_IF_ERROR(RequireShape(op, "bias", bias, {sizes.n}));
  }
  ZE_RETURN_IF_ERROR(RequireFloatWhereDefined(
      op, {{"input", input}, {"weight", weight}, {"output", output}}));
  if (bias.defined()) ZE_RETURN_IF_ERROR(RequireFloat(op, "bias", bias));
  ZE_RETURN_IF_ERROR(RequireSameDevice(
      op, "input", input,
      {{"weight", weight}, {"bias", bias}, {"output", output}}));
  if (input.data() == output.data() && input.numel() > 0) {
    return Invalid(op, "output must not alias input");
  }
  return sizes;
}

bool Aliases(const Tensor &a, const Tensor &b) {
  return a.defined() && b.defined() && a.numel() > 0 && b.numel() > 0 &&
         a.data() == b.data();
}

// The one alias some ops allow: an output that is an input itself (same
// data, shape and dtype), each of its elements read before it is written.
bool SameTensor(const Tensor &a, const Tensor &b) {
  return Aliases(a, b) && a.shape() == b.shape() && a.dtype() == b.dtype();
}

// The checks LinearBackward and GeluLinearBackward share; `grad_input_name`
// names grad_input in messages.
absl::StatusOr<LinearSizes> CheckLinearBackward(
    const char *op, const Tensor &grad_output, const Tensor &input,
    const Tensor &weight, const char *grad_input_name, const Tensor &grad_input,
    const Tensor &grad_weight, const Tensor &grad_bias) {
  ZE_RETURN_IF_ERROR(
      RequireDefined(op, {{"grad_output", grad_output}, {"weight", weight}}));
  if (weight.dim() != 2) {
    return Invalid(op, absl::StrCat("weight must be (N, K), got ",
                                    ShapeToString(weight.shape())));
  }
  LinearSizes sizes;
  sizes.n = weight.size(0);
  sizes.k = weight.size(1);
  ZE_ASSIGN_OR_RETURN(sizes.m, RowsOf(op, "grad_output", grad_output, sizes.n));
  if (grad_weight.defined()) {
    ZE_RETURN_IF_ERROR(RequireDefined(op, "input", input));
  }
  if (input.defined()) {
    ZE_ASSIGN_OR_RETURN(const int64_t input_rows,
                        RowsOf(op, "input", input, sizes.k));
    if (input_rows != sizes.m) {
      return Invalid(op, absl::StrCat("input ", ShapeToString(input.shape()),
                                      " and grad_output ",
                                      ShapeToString(grad_output.shape()),
                                      " have different row counts"));
    }
  }
  if (grad_input.defined()) {
    ZE_ASSIGN_OR_RETURN(const int64_t grad_input_rows,
                        RowsOf(op, grad_input_name, grad_input, sizes.k));
    if (grad_input_rows != sizes.m) {
      return Invalid(op, absl::StrCat(grad_input_name, " ",
                                      ShapeToString(grad_input.shape()),
                                      " must have ", sizes.m, " rows"));
    }
  }
  if (Aliases(grad_input, input) && !SameTensor(grad_input, input)) {
    return Invalid(op,
                   absl::StrCat(grad_input_name,
                                " may be input itself (same shape and "
                                "dtype) but must not overlap it otherwise"));
  }
  if (grad_weight.defined()) {
    ZE_RETURN_IF_ERROR(
        RequireShape(op, "grad_weight", grad_weight, weight.shape()));
  }
  if (grad_bias.defined()) {
    ZE_RETURN_IF_ERROR(RequireShape(op, "grad_bias", grad_bias, {sizes.n}));
  }
  ZE_RETURN_IF_ERROR(
      RequireFloatWhereDefined(op, {{"grad_output", grad_output},
                                    {"input", input},
                                    {"weight", weight},
                                    {grad_input_name, grad_input},
                                    {"grad_weight", grad_weight},
                                    {"grad_bias", grad_bias}}));
  ZE_RETURN_IF_ERROR(RequireSameDevice(op, "grad_output", grad_output,
                                       {{"input", input},
                                        {"weight", weight},
                                        {grad_input_name, grad_input},
                                        {"grad_weight", grad_weight},
                                        {"grad_bias", grad_bias}}));
  return sizes;
}

}  // namespace

absl::Status LinearForward(const Tensor &input, const Tensor &weight,
                           const Tensor &bias, const Tensor &output,
                           const Stream &stream) {
  ZE_ASSIGN_OR_RETURN(
      const LinearSizes sizes,
      CheckLinearForward("LinearForward", input, weight, bias, output));
  const Tensor input_2d = View2D(input, sizes.m, sizes.k);
  const Tensor output_2d = View2D(output, sizes.m, sizes.n);
  if (input.device().is_cuda()) {
    return cuda_backend::LinearForward(input_2d, weight, bias, output_2d,
                                       stream);
  }
  return cpu_backend::LinearForward(input_2d, weight, bias, output_2d);
}

absl::Status LinearForwardAdd(const Tensor &input, const Tensor &weight,
                              const Tensor &bias, const Tensor &residual,
                              const Tensor &output, const Stream &stream) {
  const char *op = "LinearForwardAdd";
  ZE_ASSIGN_OR_RETURN(const LinearSizes sizes,
                      CheckLinearForward(op, input, weight, bias, output));
  ZE_RETURN_IF_ERROR(RequireDefined(op, "residual", residual));
  ZE_RETURN_IF_ERROR(RequireShape(op, "residual", residual, output.shape()));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "residual", residual));
  ZE_RETURN_IF_ERROR(
      RequireSameDevice(op, "output", output, {{"residual", residual}}));
  if (Aliases(residual, output) || Aliases(residual, input)) {
    return Invalid(op, "residual must not alias output or input");
  }
  const Tensor input_2d = View2D(input, sizes.m, sizes.k);
  const Tensor output_2d = View2D(output, sizes.m, sizes.n);
  if (input.device().is_cuda()) {
    return cuda_backend::LinearForward(input_2d, weight, bias, output_2d,
                                       stream,
                                       View2D(residual, sizes.m, sizes.n));
  }
  ZE_RETURN_IF_ERROR(
      cpu_backend::LinearForward(input_2d, weight, bias, output_2d));
  // The order the transformer block used before the fusion: residual + y.
  return Add(residual, output, output, stream);
}

absl::Status LinearBackward(const Tensor &grad_output, const Tensor &input,
                            const Tensor &weight, const Tensor &grad_input,
                            const Tensor &grad_weight, const Tensor &grad_bias,
                            const Stream &stream) {
  ZE_ASSIGN_OR_RETURN(
      const LinearSizes sizes,
      CheckLinearBackward("LinearBackward", grad_output, input, weight,
                          "grad_input", grad_input, grad_weight, grad_bias));
  const Tensor grad_output_2d = View2D(grad_output, sizes.m, sizes.n);
  const Tensor input_2d = View2D(input, sizes.m, sizes.k);
  const Tensor grad_input_2d = View2D(grad_input, sizes.m, sizes.k);
  if (grad_output.device().is_cuda()) {
    return cuda_backend::LinearBackward(grad_output_2d, input_2d, weight,
                                        grad_input_2d, grad_weight, grad_bias,
                                        stream);
  }
  return cpu_backend::LinearBackward(grad_output_2d, input_2d, weight,
                                     grad_input_2d, grad_weight, grad_bias);
}

namespace {

// The *BackwardAdd ops' extra argument: grad_addend (shaped like
// grad_input, a float, on its device) aliasing neither grad_input nor
// grad_output, both required.
absl::Status CheckGradAddend(const char *op, const Tensor &grad_addend,
                             const Tensor &grad_input,
                             const Tensor &grad_output) {
  ZE_RETURN_IF_ERROR(RequireDefined(
      op, {{"grad_addend", grad_addend}, {"grad_input", grad_input}}));
  ZE_RETURN_IF_ERROR(
      RequireShape(op, "grad_addend", grad_addend, grad_input.shape()));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "grad_addend", grad_addend));
  ZE_RETURN_IF_ERROR(RequireSameDevice(op, "grad_input", grad_input,
                                       {{"grad_addend", grad_addend}}));
  if (Aliases(grad_addend, grad_input) || Aliases(grad_addend, grad_output)) {
    return Invalid(op, "grad_addend must not alias grad_input or grad_output");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LinearBackwardAdd(const Tensor &grad_output, const Tensor &input,
                               const Tensor &weight, const Tensor &grad_addend,
                               const Tensor &grad_input,
                               const Tensor &grad_weight,
                               const Tensor &grad_bias, const Stream &stream) {
  const char *op = "LinearBackwardAdd";
  ZE_ASSIGN_OR_RETURN(
      const LinearSizes sizes,
      CheckLinearBackward(op, grad_output, input, weight, "grad_input",
                          grad_input, grad_weight, grad_bias));
  ZE_RETURN_IF_ERROR(CheckGradAddend(op, grad_addend, grad_input, grad_output));
  const Tensor grad_output_2d = View2D(grad_output, sizes.m, sizes.n);
  const Tensor input_2d = View2D(input, sizes.m, sizes.k);
  const Tensor grad_input_2d = View2D(grad_input, sizes.m, sizes.k);
  if (grad_output.device().is_cuda()) {
    return cuda_backend::LinearBackward(
        grad_output_2d, input_2d, weight, grad_input_2d, grad_weight, grad_bias,
        stream, View2D(grad_addend, sizes.m, sizes.k));
  }
  ZE_RETURN_IF_ERROR(cpu_backend::LinearBackward(
      grad_output_2d, input_2d, weight, grad_input_2d, grad_weight, grad_bias));
  // The order the decoder layers summed the branches in before the fusion.
  return Add(grad_addend, grad_input, grad_input, stream);
}

absl::Status LinearGeluForward(const Tensor &input, const Tensor &weight,
                               const Tensor &bias, const Tensor &output,
                               const Tensor &pre_activation,
                               const Stream &stream) {
  const char *op = "LinearGeluForward";
  ZE_ASSIGN_OR_RETURN(const LinearSizes sizes,
                      CheckLinearForward(op, input, weight, bias, output));
  ZE_RETURN_IF_ERROR(RequireDefined(op, "pre_activation", pre_activation));
  ZE_RETURN_IF_ERROR(
      RequireShape(op, "pre_activation", pre_activation, output.shape()));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "pre_activation", pre_activation));
  ZE_RETURN_IF_ERROR(RequireSameDevice(op, "input", input,
                                       {{"pre_activation", pre_activation}}));
  if (Aliases(pre_activation, input) || Aliases(pre_activation, output)) {
    return Invalid(op, "pre_activation must not alias input or output");
  }
  const Tensor input_2d = View2D(input, sizes.m, sizes.k);
  const Tensor output_2d = View2D(output, sizes.m, sizes.n);
  const Tensor pre_2d = View2D(pre_activation, sizes.m, sizes.n);
  if (input.device().is_cuda()) {
    return cuda_backend::LinearGeluForward(input_2d, weight, bias, output_2d,
                                           pre_2d, stream);
  }
  return cpu_backend::LinearGeluForward(input_2d, weight, bias, output_2d,
                                        pre_2d);
}

absl::Status GeluLinearBackward(
    const Tensor &grad_output, const Tensor &input, const Tensor &weight,
    const Tensor &pre_activation, const Tensor &grad_pre_activation,
    const Tensor &grad_weight, const Tensor &grad_bias,
    const Tensor &grad_pre_activation_bias, const Stream &stream) {
  const char *op = "GeluLinearBackward";
  ZE_RETURN_IF_ERROR(
      RequireDefined(op, "grad_pre_activation", grad_pre_activation));
  ZE_RETURN_IF_ERROR(RequireDefined(op, "pre_activation", pre_activation));
  ZE_ASSIGN_OR_RETURN(
      const LinearSizes sizes,
      CheckLinearBackward(op, grad_output, input, weight, "grad_pre_activation",
                          grad_pre_activation, grad_weight, grad_bias));
  ZE_RETURN_IF_ERROR(RequireShape(op, "pre_activation", pre_activation,
                                  grad_pre_activation.shape()));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "pre_activation", pre_activation));
  if (grad_pre_activation_bias.defined()) {
    ZE_RETURN_IF_ERROR(RequireShape(op, "grad_pre_activation_bias",
                                    grad_pre_activation_bias, {sizes.k}));
    ZE_RETURN_IF_ERROR(
        RequireFloat(op, "grad_pre_activation_bias", grad_pre_activation_bias));
  }
  ZE_RETURN_IF_ERROR(RequireSameDevice(
      op, "grad_output", grad_output,
      {{"pre_activation", pre_activation},
       {"grad_pre_activation_bias", grad_pre_activation_bias}}));
  if (Aliases(grad_pre_activation, grad_output) ||
      Aliases(grad_pre_activation, pre_activation)) {
    return Invalid(op,
                   "grad_pre_activation must not alias grad_output or "
                   "pre_activation");
  }
  const Tensor grad_output_2d = View2D(grad_output, sizes.m, sizes.n);
  const Tensor input_2d = View2D(input, sizes.m, sizes.k);
  const Tensor pre_2d = View2D(pre_activation, sizes.m, sizes.k);
  const Tensor grad_pre_2d = View2D(grad_pre_activation, sizes.m, sizes.k);
  if (grad_output.device().is_cuda()) {
    return cuda_backend::GeluLinearBackward(
        grad_output_2d, input_2d, weight, pre_2d, grad_pre_2d, grad_weight,
        grad_bias, grad_pre_activation_bias, stream);
  }
  return cpu_backend::GeluLinearBackward(grad_output_2d, input_2d, weight,
                                         pre_2d, grad_pre_2d, grad_weight,
                                         grad_bias, grad_pre_activation_bias);
}

namespace {

// LayerNormBackward, plus grad_addend into grad_input when defined.
absl::Status LayerNormBackwardImpl(
    const char *op, const Tensor &grad_output, const Tensor &input,
    const Tensor &weight, const Tensor &mean, const Tensor &rstd,
    const Tensor &grad_input, const Tensor &grad_weight,
    const Tensor &grad_bias, const Stream &stream, const Tensor &grad_addend) {
  ZE_RETURN_IF_ERROR(RequireDefined(op, {{"grad_output", grad_output},
                                         {"input", input},
                                         {"weight", weight},
                                         {"mean", mean},
                                         {"rstd", rstd}}));
  if (weight.dim() != 1) {
    return Invalid(op, absl::StrCat("weight must be (C), got ",
                                    ShapeToString(weight.shape())));
  }
  const int64_t c = weight.size(0);
  ZE_ASSIGN_OR_RETURN(const int64_t m, RowsOf(op, "input", input, c));
  ZE_RETURN_IF_ERROR(
      RequireShape(op, "grad_output", grad_output, input.shape()));
  ZE_RETURN_IF_ERROR(RequireShape(op, "mean", mean, {m}));
  ZE_RETURN_IF_ERROR(RequireShape(op, "rstd", rstd, {m}));
  ZE_RETURN_IF_ERROR(RequireDType(op, "mean", mean, DType::kF32));
  ZE_RETURN_IF_ERROR(RequireDType(op, "rstd", rstd, DType::kF32));
  if (grad_input.defined()) {
    ZE_RETURN_IF_ERROR(
        RequireShape(op, "grad_input", grad_input, input.shape()));
  }
  if (grad_weight.defined()) {
    ZE_RETURN_IF_ERROR(RequireShape(op, "grad_weight", grad_weight, {c}));
  }
  if (grad_bias.defined()) {
    ZE_RETURN_IF_ERROR(RequireShape(op, "grad_bias", grad_bias, {c}));
  }
  ZE_RETURN_IF_ERROR(RequireFloatWhereDefined(op, {{"grad_output", grad_output},
                                                   {"input", input},
                                                   {"weight", weight},
                                                   {"grad_input", grad_input},
                                                   {"grad_weight", grad_weight},
                                                   {"grad_bias", grad_bias}}));
  ZE_RETURN_IF_ERROR(RequireSameDevice(op, "grad_output", grad_output,
                                       {{"input", input},
                                        {"weight", weight},
                                        {"mean", mean},
                                        {"rstd", rstd},
                                        {"grad_input", grad_input},
                                        {"grad_weight", grad_weight},
                                        {"grad_bias", grad_bias}}));
  const Tensor grad_output_2d = View2D(grad_output, m, c);
  const Tensor input_2d = View2D(input, m, c);
  const Tensor grad_input_2d = View2D(grad_input, m, c);
  if (input.device().is_cuda()) {
    return cuda_backend::LayerNormBackward(
        grad_output_2d, input_2d, weight, mean, rstd, grad_input_2d,
        grad_weight, grad_bias, stream,
        grad_addend.defined() ? View2D(grad_addend, m, c) : Tensor());
  }
  ZE_RETURN_IF_ERROR(cpu_backend::LayerNormBackward(
      grad_output_2d, input_2d, weight, mean, rstd, grad_input_2d, grad_weight,
      grad_bias));
  if (!grad_addend.defined()) return absl::OkStatus();
  // Two steps, exactly as LayerNormBackward followed by an add.
  return Add(grad_input, grad_addend, grad_input, stream);
}

}  // namespace

absl::Status LayerNormForward(const Tensor &input, const Tensor &weight,
                              const Tensor &bias, const Tensor &output,
                              const Tensor &mean, const Tensor &rstd,
                              const Stream &stream) {
  const char *op = "LayerNormForward";
  ZE_RETURN_IF_ERROR(RequireDefined(op, {{"input", input},
                                         {"weight", weight},
                                         {"bias", bias},
                                         {"output", output},
                                         {"mean", mean},
                                         {"rstd", rstd}}));
  if (weight.dim() != 1) {
    return Invalid(op, absl::StrCat("weight must be (C), got ",
                                    ShapeToString(weight.shape())));
  }
  const int64_t c = weight.size(0);
  ZE_ASSIGN_OR_RETURN(const int64_t m, RowsOf(op, "input", input, c));
  ZE_RETURN_IF_ERROR(RequireShape(op, "bias", bias, {c}));
  ZE_RETURN_IF_ERROR(RequireShape(op, "output", output, input.shape()));
  ZE_RETURN_IF_ERROR(RequireShape(op, "mean", mean, {m}));
  ZE_RETURN_IF_ERROR(RequireShape(op, "rstd", rstd, {m}));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "input", input));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "weight", weight));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "bias", bias));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "output", output));
  ZE_RETURN_IF_ERROR(RequireDType(op, "mean", mean, DType::kF32));
  ZE_RETURN_IF_ERROR(RequireDType(op, "rstd", rstd, DType::kF32));
  ZE_RETURN_IF_ERROR(RequireSameDevice(op, "input", input,
                                       {{"weight", weight},
                                        {"bias", bias},
                                        {"output", output},
                                        {"mean", mean},
                                        {"rstd", rstd}}));
  const Tensor input_2d = View2D(input, m, c);
  const Tensor output_2d = View2D(output, m, c);
  if (input.device().is_cuda()) {
    return cuda_backend::LayerNormForward(input_2d, weight, bias, output_2d,
                                          mean, rstd, stream);
  }
  return cpu_backend::LayerNormForward(input_2d, weight, bias, output_2d, mean,
                                       rstd);
}

absl::Status LayerNormBackward(const Tensor &grad_output, const Tensor &input,
                               const Tensor &weight, const Tensor &mean,
                               const Tensor &rstd, const Tensor &grad_input,
                               const Tensor &grad_weight,
                               const Tensor &grad_bias, const Stream &stream) {
  return LayerNormBackwardImpl("LayerNormBackward", grad_output, input, weight,
                               mean, rstd, grad_input, grad_weight, grad_bias,
                               stream, Tensor());
}

absl::Status LayerNormBackwardAdd(
    const Tensor &grad_output, const Tensor &input, const Tensor &weight,
    const Tensor &mean, const Tensor &rstd, const Tensor &grad_addend,
    const Tensor &grad_input, const Tensor &grad_weight,
    const Tensor &grad_bias, const Stream &stream) {
  const char *op = "LayerNormBackwardAdd";
  ZE_RETURN_IF_ERROR(CheckGradAddend(op, grad_addend, grad_input, grad_output));
  return LayerNormBackwardImpl(op, grad_output, input, weight, mean, rstd,
                               grad_input, grad_weight, grad_bias, stream,
                               grad_addend);
}

absl::Status GeluForward(const Tensor &input, const Tensor &output,
                         const Stream &stream) {
  const char *op = "GeluForward";
  ZE_RETURN_IF_ERROR(
      RequireDefined(op, {{"input", input}, {"output", output}}));
  ZE_RETURN_IF_ERROR(RequireShape(op, "output", output, input.shape()));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "input", input));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "output", output));
  ZE_RETURN_IF_ERROR(
      RequireSameDevice(op, "input", input, {{"output", output}}));
  if (input.device().is_cuda()) {
    return cuda_backend::GeluForward(input, output, stream);
  }
  return cpu_backend::GeluForward(input, output);
}

absl::Status GeluBackward(const Tensor &grad_output, const Tensor &input,
                          const Tensor &grad_input, const Stream &stream) {
  const char *op = "GeluBackward";
  ZE_RETURN_IF_ERROR(RequireDefined(op, {{"grad_output", grad_output},
                                         {"input", input},
                                         {"grad_input", grad_input}}));
  ZE_RETURN_IF_ERROR(
      RequireShape(op, "grad_output", grad_output, input.shape()));
  ZE_RETURN_IF_ERROR(RequireShape(op, "grad_input", grad_input, input.shape()));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "grad_output", grad_output));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "input", input));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "grad_input", grad_input));
  ZE_RETURN_IF_ERROR(RequireSameDevice(
      op, "input", input,
      {{"grad_output", grad_output}, {"grad_input", grad_input}}));
  if (input.device().is_cuda()) {
    return cuda_backend::GeluBackward(grad_output, input, grad_input, stream);
  }
  return cpu_backend::GeluBackward(grad_output, input, grad_input);
}

namespace {

// Shared checks of the attention forward/backward arguments; returns C.
absl::StatusOr<int64_t> CheckAttentionShapes(const char *op, const Tensor &qkv,
                                             int num_heads,
                                             const Tensor &output,
                                             const Tensor &logsumexp) {
  ZE_RETURN_IF_ERROR(RequireDefined(
      op, {{"qkv", qkv}, {"output", output}, {"logsumexp", logsumexp}}));
  if (qkv.dim() != 3 || qkv.size(2) % 3 != 0) {
    return Invalid(op, absl::StrCat("qkv must be (B, T, 3 * C), got ",
                                    ShapeToString(qkv.shape())));
  }
  const int64_t batch = qkv.size(0), seq = qkv.size(1);
  const int64_t channels = qkv.size(2) / 3;
  if (num_heads <= 0 || channels % num_heads != 0) {
    return Invalid(op,
                   absl::StrCat("num_heads = ", num_heads,
                                " must be positive and divide C = ", channels));
  }
  ZE_RETURN_IF_ERROR(
      RequireShape(op, "output", output, {batch, seq, channels}));
  ZE_RETURN_IF_ERROR(
      RequireShape(op, "logsumexp", logsumexp, {batch, num_heads, seq}));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "qkv", qkv));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "output", output));
  ZE_RETURN_IF_ERROR(RequireDType(op, "logsumexp", logsumexp, DType::kF32));
  return channels;
}

}  // namespace

absl::Status AttentionForward(const Tensor &qkv, int num_heads,
                              const Tensor &output, const Tensor &logsumexp,
                              const Stream &stream) {
  const char *op = "AttentionForward";
  ZE_RETURN_IF_ERROR(
      CheckAttentionShapes(op, qkv, num_heads, output, logsumexp).status());
  ZE_RETURN_IF_ERROR(RequireSameDevice(
      op, "qkv", qkv, {{"output", output}, {"logsumexp", logsumexp}}));
  if (qkv.device().is_cuda()) {
    return cuda_backend::AttentionForward(qkv, num_heads, output, logsumexp,
                                          stream);
  }
  return cpu_backend::AttentionForward(qkv, num_heads, output, logsumexp);
}

absl::Status AttentionBackward(const Tensor &grad_output, const Tensor &qkv,
                               const Tensor &output, const Tensor &logsumexp,
                               int num_heads, const Tensor &grad_qkv,
                               const Stream &stream) {
  const char *op = "AttentionBackward";
  ZE_RETURN_IF_ERROR(
      CheckAttentionShapes(op, qkv, num_heads, output, logsumexp).status());
  ZE_RETURN_IF_ERROR(RequireDefined(
      op, {{"grad_output", grad_output}, {"grad_qkv", grad_qkv}}));
  ZE_RETURN_IF_ERROR(
      RequireShape(op, "grad_output", grad_output, output.shape()));
  ZE_RETURN_IF_ERROR(RequireShape(op, "grad_qkv", grad_qkv, qkv.shape()));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "grad_output", grad_output));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "grad_qkv", grad_qkv));
  ZE_RETURN_IF_ERROR(RequireSameDevice(op, "qkv", qkv,
                                       {{"grad_output", grad_output},
                                        {"output", output},
                                        {"logsumexp", logsumexp},
                                        {"grad_qkv", grad_qkv}}));
  if (qkv.device().is_cuda()) {
    return cuda_backend::AttentionBackward(grad_output, qkv, output, logsumexp,
                                           num_heads, grad_qkv, stream);
  }
  return cpu_backend::AttentionBackward(grad_output, qkv, output, logsumexp,
                                        num_heads, grad_qkv);
}

namespace {

// The KV-cache ops' cache checks (GPT's and the grouped ones): caches
// (B, kv_heads, T_max, D) of `dtype` that do not alias, rows and starts (N)
// i32, all on key_cache's device.
absl::Status CheckCacheTensors(const char *op, int64_t n, int64_t kv_heads,
                               int64_t head_dim, DType dtype,
                               const Tensor &rows, const Tensor &starts,
                               const Tensor &key_cache,
                               const Tensor &value_cache) {
  ZE_RETURN_IF_ERROR(RequireDefined(op, {{"rows", rows},
                                         {"starts", starts},
                                         {"key_cache", key_cache},
                                         {"value_cache", value_cache}}));
  if (key_cache.dim() != 4 || key_cache.size(1) != kv_heads ||
      key_cache.size(3) != head_dim || key_cache.size(0) < 1) {
    return Invalid(op, absl::StrCat("key_cache must be (B, ", kv_heads,
                                    ", T_max, ", head_dim, "), got ",
                                    ShapeToString(key_cache.shape())));
  }
  ZE_RETURN_IF_ERROR(
      RequireShape(op, "value_cache", value_cache, key_cache.shape()));
  ZE_RETURN_IF_ERROR(RequireShape(op, "rows", rows, {n}));
  ZE_RETURN_IF_ERROR(RequireShape(op, "starts", starts, {n}));
  ZE_RETURN_IF_ERROR(RequireDType(op, "rows", rows, DType::kI32));
  ZE_RETURN_IF_ERROR(RequireDType(op, "starts", starts, DType::kI32));
  ZE_RETURN_IF_ERROR(RequireDType(op, "key_cache", key_cache, dtype));
  ZE_RETURN_IF_ERROR(RequireDType(op, "value_cache", value_cache, dtype));
  if (key_cache.data() == value_cache.data()) {
    return Invalid(op, "key_cache and value_cache must not alias");
  }
  return RequireSameDevice(
      op, "key_cache", key_cache,
      {{"rows", rows}, {"starts", starts}, {"value_cache", value_cache}});
}

// KvCacheWrite's and CachedAttentionForward's common checks.
absl::Status CheckKvCacheArguments(const char *op, const Tensor &qkv,
                                   const Tensor &rows, const Tensor &starts,
                                   int num_heads, const Tensor &key_cache,
                                   const Tensor &value_cache) {
  ZE_RETURN_IF_ERROR(RequireDefined(op, "qkv", qkv));
  if (qkv.dim() != 3 || qkv.size(2) % 3 != 0) {
    return Invalid(op, absl::StrCat("qkv must be (N, T, 3 * C), got ",
                                    ShapeToString(qkv.shape())));
  }
  const int64_t n = qkv.size(0), channels = qkv.size(2) / 3;
  if (num_heads <= 0 || channels % num_heads != 0) {
    return Invalid(op,
                   absl::StrCat("num_heads = ", num_heads,
                                " must be positive and divide C = ", channels));
  }
  ZE_RETURN_IF_ERROR(RequireFloat(op, "qkv", qkv));
  ZE_RETURN_IF_ERROR(CheckCacheTensors(op, n, num_heads, channels / num_heads,
                                       qkv.dtype(), rows, starts, key_cache,
                                       value_cache));
  return RequireSameDevice(op, "qkv", qkv, {{"key_cache", key_cache}});
}

}  // namespace

absl::Status KvCacheWrite(const Tensor &qkv, const Tensor &rows,
                          const Tensor &starts, int num_heads,
                          const Tensor &key_cache, const Tensor &value_cache,
                          const Stream &stream) {
  ZE_RETURN_IF_ERROR(CheckKvCacheArguments("KvCacheWrite", qkv, rows, starts,
                                           num_heads, key_cache, value_cache));
  if (qkv.device().is_cuda()) {
    return cuda_backend::KvCacheWrite(qkv, rows, starts, num_heads, key_cache,
                                      value_cache, stream);
  }
  return cpu_backend::KvCacheWrite(qkv, rows, starts, num_heads, key_cache,
                                   value_cache);
}

absl::Status CachedAttentionForward(const Tensor &qkv, const Tensor &rows,
                                    const Tensor &starts, int num_heads,
                                    const Tensor &key_cache,
                                    const Tensor &value_cache,
                                    const Tensor &output,
                                    const Stream &stream) {
  const char *op = "CachedAttentionForward";
  ZE_RETURN_IF_ERROR(CheckKvCacheArguments(op, qkv, rows, starts, num_heads,
                                           key_cache, value_cache));
  ZE_RETURN_IF_ERROR(RequireDefined(op, "output", output));
  ZE_RETURN_IF_ERROR(RequireShape(op, "output", output,
                                  {qkv.size(0), qkv.size(1), qkv.size(2) / 3}));
  ZE_RETURN_IF_ERROR(RequireDType(op, "output", output, qkv.dtype()));
  ZE_RETURN_IF_ERROR(RequireSameDevice(op, "qkv", qkv, {{"output", output}}));
  if (qkv.device().is_cuda()) {
    return cuda_backend::CachedAttentionForward(
        qkv, rows, starts, num_heads, key_cache, value_cache, output, stream);
  }
  return cpu_backend::CachedAttentionForward(qkv, rows, starts, num_heads,
                                             key_cache, value_cache, output);
}

namespace {

// EmbeddingForward's and EmbeddingForwardAt's common checks.
absl::Status CheckEmbeddingForward(const char *op, const Tensor &tokens,
                                   const Tensor &token_table,
                                   const Tensor &position_table,
                                   const Tensor &output) {
  ZE_RETURN_IF_ERROR(RequireDefined(
      op,
      {{"tokens", tokens}, {"token_table", token_table}, {"output", output}}));
  if (tokens.dim() != 2) {
    return Invalid(op, absl::StrCat("tokens must be (B, T), got ",
                                    ShapeToString(tokens.shape())));
  }
  ZE_RETURN_IF_ERROR(RequireDType(op, "tokens", tokens, DType::kI32));
  if (token_table.dim() != 2) {
    return Invalid(op, absl::StrCat("token_table must be (V, C), got ",
                                    ShapeToString(token_table.shape())));
  }
  const int64_t batch = tokens.size(0), seq = tokens.size(1);
  const int64_t channels = token_table.size(1);
  if (position_table.defined()) {
    if (position_table.dim() != 2 || position_table.size(1) != channels ||
        position_table.size(0) < seq) {
      return Invalid(op, absl::StrCat("position_table must be (max_T >= ", seq,
                                      ", ", channels, "), got ",
                                      ShapeToString(position_table.shape())));
    }
    ZE_RETURN_IF_ERROR(RequireFloat(op, "position_table", position_table));
  }
  ZE_RETURN_IF_ERROR(
      RequireShape(op, "output", output, {batch, seq, channels}));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "token_table", token_table));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "output", output));
  return RequireSameDevice(op, "tokens", tokens,
                           {{"token_table", token_table},
                            {"position_table", position_table},
                            {"output", output}});
}

}  // namespace

absl::Status EmbeddingForward(const Tensor &tokens, const Tensor &token_table,
                              const Tensor &position_table,
                              const Tensor &output, const Stream &stream) {
  ZE_RETURN_IF_ERROR(CheckEmbeddingForward(
      "EmbeddingForward", tokens, token_table, position_table, output));
  if (tokens.device().is_cuda()) {
    return cuda_backend::EmbeddingForward(tokens, token_table, position_table,
                                          output, stream);
  }
  return cpu_backend::EmbeddingForward(tokens, token_table, position_table,
                                       output);
}

absl::Status EmbeddingForwardAt(const Tensor &tokens, const Tensor &starts,
                                const Tensor &token_table,
                                const Tensor &position_table,
                                const Tensor &output, const Stream &stream) {
  const char *op = "EmbeddingForwardAt";
  ZE_RETURN_IF_ERROR(RequireDefined(op, "position_table", position_table));
  ZE_RETURN_IF_ERROR(
      CheckEmbeddingForward(op, tokens, token_table, position_table, output));
  ZE_RETURN_IF_ERROR(RequireDefined(op, "starts", starts));
  ZE_RETURN_IF_ERROR(RequireShape(op, "starts", starts, {tokens.size(0)}));
  ZE_RETURN_IF_ERROR(RequireDType(op, "starts", starts, DType::kI32));
  ZE_RETURN_IF_ERROR(
      RequireSameDevice(op, "tokens", tokens, {{"starts", starts}}));
  if (tokens.device().is_cuda()) {
    return cuda_backend::EmbeddingForwardAt(tokens, starts, token_table,
                                            position_table, output, stream);
  }
  return cpu_backend::EmbeddingForwardAt(tokens, starts, token_table,
                                         position_table, output);
}

absl::Status EmbeddingBackward(const Tensor &grad_output, const Tensor &tokens,
                               const Tensor &grad_token_table,
                               const Tensor &grad_position_table,
                               const Stream &stream) {
  const char *op = "EmbeddingBackward";
  ZE_RETURN_IF_ERROR(
      RequireDefined(op, {{"grad_output", grad_output}, {"tokens", tokens}}));
  if (tokens.dim() != 2) {
    return Invalid(op, absl::StrCat("tokens must be (B, T), got ",
                                    ShapeToString(tokens.shape())));
  }
  ZE_RETURN_IF_ERROR(RequireDType(op, "tokens", tokens, DType::kI32));
  if (grad_output.dim() != 3 || grad_output.size(0) != tokens.size(0) ||
      grad_output.size(1) != tokens.size(1)) {
    return Invalid(op, absl::StrCat("grad_output must be (B, T, C) matching "
                                    "tokens ",
                                    ShapeToString(tokens.shape()), ", got ",
                                    ShapeToString(grad_output.shape())));
  }
  ZE_RETURN_IF_ERROR(RequireFloat(op, "grad_output", grad_output));
  const int64_t channels = grad_output.size(2);
  if (grad_token_table.defined()) {
    if (grad_token_table.dim() != 2 || grad_token_table.size(1) != channels) {
      return Invalid(
          op, absl::StrCat("grad_token_table must be (V, ", channels, "), got ",
                           ShapeToString(grad_token_table.shape())));
    }
    ZE_RETURN_IF_ERROR(RequireFloat(op, "grad_token_table", grad_token_table));
  }
  if (grad_position_table.defined()) {
    if (grad_position_table.dim() != 2 ||
        grad_position_table.size(1) != channels ||
        grad_position_table.size(0) < tokens.size(1)) {
      return Invalid(op,
                     absl::StrCat("grad_position_table must be (max_T >= ",
                                  tokens.size(1), ", ", channels, "), got ",
                                  ShapeToString(grad_position_table.shape())));
    }
    ZE_RETURN_IF_ERROR(
        RequireFloat(op, "grad_position_table", grad_position_table));
  }
  ZE_RETURN_IF_ERROR(
      RequireSameDevice(op, "grad_output", grad_output,
                        {{"tokens", tokens},
                         {"grad_token_table", grad_token_table},
                         {"grad_position_table", grad_position_table}}));
  if (tokens.device().is_cuda()) {
    return cuda_backend::EmbeddingBackward(
        grad_output, tokens, grad_token_table, grad_position_table, stream);
  }
  return cpu_backend::EmbeddingBackward(grad_output, tokens, grad_token_table,
                                        grad_position_table);
}

namespace {

// Checks logits (..., V) against targets (...); returns the row count.
absl::StatusOr<int64_t> CheckCrossEntropyShapes(const char *op,
                                                const Tensor &logits,
                                                const Tensor &targets) {
  ZE_RETURN_IF_ERROR(
      RequireDefined(op, {{"logits", logits}, {"targets", targets}}));
  if (logits.dim() < 2) {
    return Invalid(op, absl::StrCat("logits must be (M, V), got ",
                                    ShapeToString(logits.shape())));
  }
  const int64_t vocab = logits.shape().back();
  ZE_ASSIGN_OR_RETURN(const int64_t rows, RowsOf(op, "logits", logits, vocab));
  if (targets.numel() != rows) {
    return Invalid(
        op, absl::StrCat("targets ", ShapeToString(targets.shape()),
                         " must hold one id per logits row (", rows, ")"));
  }
  ZE_RETURN_IF_ERROR(RequireFloat(op, "logits", logits));
  ZE_RETURN_IF_ERROR(RequireDType(op, "targets", targets, DType::kI32));
  return rows;
}

// The softmax's column count: `classes`, or V when it is 0.
absl::StatusOr<int64_t> CheckClasses(const char *op, const Tensor &logits,
                                     int64_t classes) {
  const int64_t vocab = logits.shape().back();
  if (classes < 0 || classes > vocab) {
    return Invalid(
        op, absl::StrCat("classes = ", classes, " is outside [0, ", vocab,
                         "] (logits ", ShapeToString(logits.shape()), ")"));
  }
  return classes == 0 ? vocab : classes;
}

}  // namespace

absl::Status CrossEntropyForward(const Tensor &logits, const Tensor &targets,
                                 const Tensor &losses, const Stream &stream,
                                 int64_t classes, const Tensor &logsumexp) {
  const char *op = "CrossEntropyForward";
  ZE_ASSIGN_OR_RETURN(const int64_t rows,
                      CheckCrossEntropyShapes(op, logits, targets));
  ZE_ASSIGN_OR_RETURN(classes, CheckClasses(op, logits, classes));
  ZE_RETURN_IF_ERROR(RequireDefined(op, "losses", losses));
  if (losses.numel() != rows) {
    return Invalid(op,
                   absl::StrCat("losses ", ShapeToString(losses.shape()),
                                " must hold one value per row (", rows, ")"));
  }
  ZE_RETURN_IF_ERROR(RequireDType(op, "losses", losses, DType::kF32));
  if (logsumexp.defined()) {
    ZE_RETURN_IF_ERROR(RequireShape(op, "logsumexp", logsumexp, {rows}));
    ZE_RETURN_IF_ERROR(RequireDType(op, "logsumexp", logsumexp, DType::kF32));
  }
  ZE_RETURN_IF_ERROR(RequireSameDevice(
      op, "logits", logits,
      {{"targets", targets}, {"losses", losses}, {"logsumexp", logsumexp}}));
  const int64_t vocab = logits.shape().back();
  const Tensor logits_2d = View2D(logits, rows, vocab);
  const Tensor targets_1d = targets.View({rows});
  const Tensor losses_1d = losses.View({rows});
  if (logits.device().is_cuda()) {
    return cuda_backend::CrossEntropyForward(logits_2d, targets_1d, losses_1d,
                                             classes, stream, logsumexp);
  }
  return cpu_backend::CrossEntropyForward(logits_2d, targets_1d, losses_1d,
                                          classes, logsumexp);
}

absl::Status CrossEntropySliceBackward(const Tensor &logits,
                                       const Tensor &logsumexp,
                                       const Tensor &targets, int64_t offset,
                                       int64_t classes, float grad_scale,
                                       const Tensor &grad_logits,
                                       const Stream &stream) {
  const char *op = "CrossEntropySliceBackward";
  ZE_ASSIGN_OR_RETURN(const int64_t rows,
                      CheckCrossEntropyShapes(op, logits, targets));
  if (logits.dim() != 2) {
    return Invalid(op, absl::StrCat("logits must be (M, W), got ",
                                    ShapeToString(logits.shape())));
  }
  if (offset < 0 || classes < 1) {
    return Invalid(op, absl::StrCat("offset ", offset, " must be >= 0 and ",
                                    "classes ", classes, " >= 1"));
  }
  ZE_RETURN_IF_ERROR(RequireDefined(op, "logsumexp", logsumexp));
  ZE_RETURN_IF_ERROR(RequireShape(op, "logsumexp", logsumexp, {rows}));
  ZE_RETURN_IF_ERROR(RequireDType(op, "logsumexp", logsumexp, DType::kF32));
  ZE_RETURN_IF_ERROR(RequireDefined(op, "grad_logits", grad_logits));
  ZE_RETURN_IF_ERROR(
      RequireShape(op, "grad_logits", grad_logits, logits.shape()));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "grad_logits", grad_logits));
  ZE_RETURN_IF_ERROR(RequireSameDevice(op, "logits", logits,
                                       {{"targets", targets},
                                        {"logsumexp", logsumexp},
                                        {"grad_logits", grad_logits}}));
  const Tensor targets_1d = targets.View({rows});
  if (logits.device().is_cuda()) {
    return cuda_backend::CrossEntropySliceBackward(
        logits, logsumexp, targets_1d, grad_scale, grad_logits, offset, classes,
        stream);
  }
  return cpu_backend::CrossEntropySliceBackward(
      logits, logsumexp, targets_1d, grad_scale, grad_logits, offset, classes);
}

absl::Status CrossEntropyBackward(const Tensor &logits, const Tensor &targets,
                                  float grad_scale, const Tensor &grad_logits,
                                  const Stream &stream, int64_t classes) {
  const char *op = "CrossEntropyBackward";
  ZE_ASSIGN_OR_RETURN(const int64_t rows,
                      CheckCrossEntropyShapes(op, logits, targets));
  ZE_ASSIGN_OR_RETURN(classes, CheckClasses(op, logits, classes));
  ZE_RETURN_IF_ERROR(RequireDefined(op, "grad_logits", grad_logits));
  ZE_RETURN_IF_ERROR(
      RequireShape(op, "grad_logits", grad_logits, logits.shape()));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "grad_logits", grad_logits));
  ZE_RETURN_IF_ERROR(
      RequireSameDevice(op, "logits", logits,
                        {{"targets", targets}, {"grad_logits", grad_logits}}));
  const int64_t vocab = logits.shape().back();
  const Tensor logits_2d = View2D(logits, rows, vocab);
  const Tensor targets_1d = targets.View({rows});
  const Tensor grad_logits_2d = View2D(grad_logits, rows, vocab);
  if (logits.device().is_cuda()) {
    return cuda_backend::CrossEntropyBackward(logits_2d, targets_1d, grad_scale,
                                              grad_logits_2d, classes, stream);
  }
  return cpu_backend::CrossEntropyBackward(logits_2d, targets_1d, grad_scale,
                                           grad_logits_2d, classes);
}

namespace {

// LinearCrossEntropyForward's shape checks; the per-chunk ops check
// dtypes, devices and targets themselves. Returns (M, K, V, R).
struct ChunkedHeadSizes {
  int64_t rows = 0, in = 0, vocab = 0, chunk = 0;
};

absl::StatusOr<ChunkedHeadSizes> CheckLinearCrossEntropy(const char *op,
                                                         const Tensor &input,
                                                         const Tensor &weight,
                                                         const Tensor &targets,
                                                         const Tensor &logits) {
  ZE_RETURN_IF_ERROR(RequireDefined(op, {{"input", input},
                                         {"weight", weight},
                                         {"targets", targets},
                                         {"logits", logits}}));
  if (weight.dim() != 2) {
    return Invalid(op, absl::StrCat("weight must be (V, K), got ",
                                    ShapeToString(weight.shape())));
  }
  ChunkedHeadSizes sizes;
  sizes.vocab = weight.size(0);
  sizes.in = weight.size(1);
  ZE_ASSIGN_OR_RETURN(sizes.rows, RowsOf(op, "input", input, sizes.in));
  if (targets.numel() != sizes.rows) {
    return Invalid(
        op, absl::StrCat("targets ", ShapeToString(targets.shape()),
                         " must hold one id per input row (", sizes.rows, ")"));
  }
  if (logits.dim() != 2 || logits.size(1) != sizes.vocab ||
      (logits.size(0) < 1 && sizes.rows > 0)) {
    return Invalid(
        op, absl::StrCat("the logits workspace must be (R, ", sizes.vocab,
                         ") with R >= 1, got ", ShapeToString(logits.shape())));
  }
  if (logits.dtype() != input.dtype()) {
    return Invalid(op, absl::StrCat("the logits workspace must have input's "
                                    "dtype ",
                                    DTypeName(input.dtype()), ", got ",
                                    DTypeName(logits.dtype())));
  }
  sizes.chunk = logits.size(0);
  return sizes;
}

// Rows [begin, begin + count) of a tensor whose rows have `width` elements.
Tensor Rows(const Tensor &tensor, int64_t width, int64_t begin, int64_t count) {
  return tensor.Flat().Slice(begin * width, count * width).View({count, width});
}

}  // namespace

absl::Status LinearCrossEntropyForward(
    const Tensor &input, const Tensor &weight, const Tensor &targets,
    const Tensor &logits, const Tensor &losses, const Stream &stream,
    int64_t classes, const Tensor &grad_input, const Tensor &grad_weight,
    const Tensor &logsumexp) {
  const char *op = "LinearCrossEntropyForward";
  ZE_ASSIGN_OR_RETURN(
      const ChunkedHeadSizes sizes,
      CheckLinearCrossEntropy(op, input, weight, targets, logits));
  ZE_RETURN_IF_ERROR(RequireDefined(op, "losses", losses));
  if (losses.numel() != sizes.rows) {
    return Invalid(
        op, absl::StrCat("losses ", ShapeToString(losses.shape()),
                         " must hold one value per row (", sizes.rows, ")"));
  }
  if (grad_input.defined()) {
    ZE_RETURN_IF_ERROR(
        RequireShape(op, "grad_input", grad_input, input.shape()));
  }
  if (grad_weight.defined()) {
    ZE_RETURN_IF_ERROR(
        RequireShape(op, "grad_weight", grad_weight, weight.shape()));
  }
  if (logsumexp.defined()) {
    ZE_RETURN_IF_ERROR(RequireShape(op, "logsumexp", logsumexp, {sizes.rows}));
  }
  const bool gradients = grad_input.defined() || grad_weight.defined();
  for (int64_t begin = 0; begin < sizes.rows; begin += sizes.chunk) {
    const int64_t count = std::min(sizes.chunk, sizes.rows - begin);
    const Tensor chunk_input = Rows(input, sizes.in, begin, count);
    const Tensor chunk_logits = Rows(logits, sizes.vocab, 0, count);
    const Tensor chunk_targets = targets.Flat().Slice(begin, count);
    ZE_RETURN_IF_ERROR(
        LinearForward(chunk_input, weight, Tensor(), chunk_logits, stream));
    ZE_RETURN_IF_ERROR(CrossEntropyForward(
        chunk_logits, chunk_targets, losses.Flat().Slice(begin, count), stream,
        classes,
        logsumexp.defined() ? logsumexp.Slice(begin, count) : Tensor()));
    if (!gradients) continue;
    // In place: the chunk's logits are not needed once their gradient is
    // formed.
    ZE_RETURN_IF_ERROR(CrossEntropyBackward(chunk_logits, chunk_targets, 1.0f,
                                            chunk_logits, stream, classes));
    ZE_RETURN_IF_ERROR(LinearBackward(
        chunk_logits, chunk_input, weight,
        grad_input.defined() ? Rows(grad_input, sizes.in, begin, count)
                             : Tensor(),
        grad_weight, Tensor(), stream));
  }
  return absl::OkStatus();
}

absl::Status LinearCrossEntropyWeightGradient(
    const Tensor &input, const Tensor &weight, const Tensor &targets,
    const Tensor &logsumexp, float grad_scale, const Tensor &workspace,
    const Tensor &grad_weight, const Stream &stream, int64_t classes) {
  const char *op = "LinearCrossEntropyWeightGradient";
  ZE_RETURN_IF_ERROR(RequireDefined(op, {{"input", input},
                                         {"weight", weight},
                                         {"targets", targets},
                                         {"logsumexp", logsumexp},
                                         {"workspace", workspace},
                                         {"grad_weight", grad_weight}}));
  if (weight.dim() != 2) {
    return Invalid(op, absl::StrCat("weight must be (V, K), got ",
                                    ShapeToString(weight.shape())));
  }
  const int64_t vocab = weight.size(0), in = weight.size(1);
  ZE_ASSIGN_OR_RETURN(const int64_t rows, RowsOf(op, "input", input, in));
  if (targets.numel() != rows) {
    return Invalid(
        op, absl::StrCat("targets ", ShapeToString(targets.shape()),
                         " must hold one id per input row (", rows, ")"));
  }
  ZE_RETURN_IF_ERROR(RequireShape(op, "logsumexp", logsumexp, {rows}));
  ZE_RETURN_IF_ERROR(
      RequireShape(op, "grad_weight", grad_weight, weight.shape()));
  if (workspace.dim() != 2 || workspace.size(0) != rows ||
      workspace.size(1) < 1 || workspace.dtype() != input.dtype()) {
    return Invalid(op, absl::StrCat("the workspace must be (", rows,
                                    ", S) with S >= 1 in input's dtype ",
                                    DTypeName(input.dtype()), ", got ",
                                    ShapeToString(workspace.shape()), " ",
                                    DTypeName(workspace.dtype())));
  }
  if (classes == 0) classes = vocab;
  if (classes < 1 || classes > vocab) {
    return Invalid(
        op, absl::StrCat("classes ", classes, " must be in [1, ", vocab, "]"));
  }
  const Tensor input_2d = View2D(input, rows, in);
  const Tensor targets_1d = targets.View({rows});
  const int64_t width = workspace.size(1);
  // Slices from `classes` on have no gradient (padding columns).
  for (int64_t begin = 0; begin < classes && rows > 0; begin += width) {
    const int64_t count = std::min(width, vocab - begin);
    const Tensor slice_weight = Rows(weight, in, begin, count);
    const Tensor logits =
        workspace.Flat().Slice(0, rows * count).View({rows, count});
    ZE_RETURN_IF_ERROR(
        LinearForward(input_2d, slice_weight, Tensor(), logits, stream));
    ZE_RETURN_IF_ERROR(CrossEntropySliceBackward(logits, logsumexp, targets_1d,
                                                 begin, classes, grad_scale,
                                                 logits, stream));
    ZE_RETURN_IF_ERROR(LinearBackward(logits, input_2d, slice_weight, Tensor(),
                                      Rows(grad_weight, in, begin, count),
                                      Tensor(), stream));
  }
  return absl::OkStatus();
}

// ---- Decoder (Llama-family) ops.

namespace {

// A (B, T, H, D) tensor: defined, 4-D, float.
absl::Status RequireHeads(const char *op, const char *name,
                          const Tensor &tensor) {
  ZE_RETURN_IF_ERROR(RequireDefined(op, name, tensor));
  if (tensor.dim() != 4) {
    return Invalid(op, absl::StrCat(name, " must be (B, T, H, D), got ",
                                    ShapeToString(tensor.shape())));
  }
  return RequireFloat(op, name, tensor);
}

// starts (B) i32 on `reference`'s device, or undefined.
absl::Status CheckStarts(const char *op, const Tensor &starts, int64_t batch) {
  if (!starts.defined()) return absl::OkStatus();
  ZE_RETURN_IF_ERROR(RequireShape(op, "starts", starts, {batch}));
  return RequireDType(op, "starts", starts, DType::kI32);
}

absl::Status CheckRotary(const char *op, const Tensor &input,
                         const char *input_name, const Tensor &inv_freq,
                         const Tensor &starts, const Tensor &output,
                         const char *output_name) {
  ZE_RETURN_IF_ERROR(RequireHeads(op, input_name, input));
  ZE_RETURN_IF_ERROR(RequireDefined(op, output_name, output));
  ZE_RETURN_IF_ERROR(RequireShape(op, output_name, output, input.shape()));
  ZE_RETURN_IF_ERROR(RequireFloat(op, output_name, output));
  const int64_t head_dim = input.size(3);
  if (head_dim % 2 != 0) {
    return Invalid(op, absl::StrCat(input_name, " has odd D = ", head_dim,
                                    " (rotary embedding rotates pairs)"));
  }
  ZE_RETURN_IF_ERROR(RequireDefined(op, "inv_freq", inv_freq));
  ZE_RETURN_IF_ERROR(RequireShape(op, "inv_freq", inv_freq, {head_dim / 2}));
  ZE_RETURN_IF_ERROR(RequireDType(op, "inv_freq", inv_freq, DType::kF32));
  ZE_RETURN_IF_ERROR(CheckStarts(op, starts, input.size(0)));
  if (Aliases(input, output) && input.dtype() != output.dtype()) {
    return Invalid(op, "an in-place rotation needs one dtype");
  }
  return RequireSameDevice(
      op, input_name, input,
      {{"inv_freq", inv_freq}, {"starts", starts}, {output_name, output}});
}

// q (B, T, Hq, D), k and v (B, T, Hkv, D) with Hkv dividing Hq.
absl::Status CheckGroupedQkv(const char *op, const Tensor &q, const Tensor &k,
                             const Tensor &v) {
  ZE_RETURN_IF_ERROR(RequireHeads(op, "q", q));
  ZE_RETURN_IF_ERROR(RequireHeads(op, "k", k));
  ZE_RETURN_IF_ERROR(RequireHeads(op, "v", v));
  if (k.size(0) != q.size(0) || k.size(1) != q.size(1) ||
      k.size(3) != q.size(3) || k.size(2) < 1 || q.size(2) % k.size(2) != 0) {
    return Invalid(op, absl::StrCat("k ", ShapeToString(k.shape()),
                                    " must be (B, T, Hkv, D) with Hkv "
                                    "dividing Hq for q ",
                                    ShapeToString(q.shape())));
  }
  ZE_RETURN_IF_ERROR(RequireShape(op, "v", v, k.shape()));
  return RequireSameDevice(op, "q", q, {{"k", k}, {"v", v}});
}

}  // namespace

absl::Status RmsNormForward(const Tensor &input, const Tensor &weight,
                            float eps, const Tensor &output, const Tensor &rstd,
                            const Stream &stream) {
  const char *op = "RmsNormForward";
  ZE_RETURN_IF_ERROR(RequireDefined(op, {{"input", input},
                                         {"weight", weight},
                                         {"output", output},
                                         {"rstd", rstd}}));
  if (weight.dim() != 1) {
    return Invalid(op, absl::StrCat("weight must be (C), got ",
                                    ShapeToString(weight.shape())));
  }
  const int64_t channels = weight.size(0);
  ZE_ASSIGN_OR_RETURN(const int64_t rows, RowsOf(op, "input", input, channels));
  ZE_RETURN_IF_ERROR(RequireShape(op, "output", output, input.shape()));
  ZE_RETURN_IF_ERROR(RequireShape(op, "rstd", rstd, {rows}));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "input", input));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "weight", weight));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "output", output));
  ZE_RETURN_IF_ERROR(RequireDType(op, "rstd", rstd, DType::kF32));
  if (!(eps > 0)) return Invalid(op, absl::StrCat("eps = ", eps));
  ZE_RETURN_IF_ERROR(RequireSameDevice(
      op, "input", input,
      {{"weight", weight}, {"output", output}, {"rstd", rstd}}));
  if (input.device().is_cuda()) {
    return cuda_backend::RmsNormForward(View2D(input, rows, channels), weight,
                                        eps, View2D(output, rows, channels),
                                        rstd, stream);
  }
  return cpu_backend::RmsNormForward(View2D(input, rows, channels), weight, eps,
                                     View2D(output, rows, channels), rstd);
}

namespace {

// RmsNormBackward and RmsNormBackwardAdd (grad_addend defined).
absl::Status RmsNormBackwardImpl(const char *op, const Tensor &grad_output,
                                 const Tensor &input, const Tensor &weight,
                                 const Tensor &rstd, const Tensor &grad_input,
                                 const Tensor &grad_weight,
                                 const Stream &stream,
                                 const Tensor &grad_addend) {
  ZE_RETURN_IF_ERROR(RequireDefined(op, {{"grad_output", grad_output},
                                         {"input", input},
                                         {"weight", weight},
                                         {"rstd", rstd}}));
  if (weight.dim() != 1) {
    return Invalid(op, absl::StrCat("weight must be (C), got ",
                                    ShapeToString(weight.shape())));
  }
  const int64_t channels = weight.size(0);
  ZE_ASSIGN_OR_RETURN(const int64_t rows, RowsOf(op, "input", input, channels));
  ZE_RETURN_IF_ERROR(
      RequireShape(op, "grad_output", grad_output, input.shape()));
  ZE_RETURN_IF_ERROR(RequireShape(op, "rstd", rstd, {rows}));
  ZE_RETURN_IF_ERROR(RequireDType(op, "rstd", rstd, DType::kF32));
  ZE_RETURN_IF_ERROR(
      RequireFloatWhereDefined(op, {{"grad_output", grad_output},
                                    {"input", input},
                                    {"weight", weight},
                                    {"grad_input", grad_input},
                                    {"grad_weight", grad_weight}}));
  if (grad_input.defined()) {
    ZE_RETURN_IF_ERROR(
        RequireShape(op, "grad_input", grad_input, input.shape()));
    if (Aliases(grad_input, grad_output) &&
        grad_input.dtype() != grad_output.dtype()) {
      return Invalid(op, "grad_input aliases grad_output with another dtype");
    }
  }
  if (grad_weight.defined()) {
    ZE_RETURN_IF_ERROR(
        RequireShape(op, "grad_weight", grad_weight, weight.shape()));
  }
  ZE_RETURN_IF_ERROR(RequireSameDevice(op, "input", input,
                                       {{"grad_output", grad_output},
                                        {"weight", weight},
                                        {"rstd", rstd},
                                        {"grad_input", grad_input},
                                        {"grad_weight", grad_weight}}));
  if (input.device().is_cuda()) {
    return cuda_backend::RmsNormBackward(
        View2D(grad_output, rows, channels), View2D(input, rows, channels),
        weight, rstd, View2D(grad_input, rows, channels), grad_weight, stream,
        grad_addend.defined() ? View2D(grad_addend, rows, channels) : Tensor());
  }
  ZE_RETURN_IF_ERROR(cpu_backend::RmsNormBackward(
      View2D(grad_output, rows, channels), View2D(input, rows, channels),
      weight, rstd, View2D(grad_input, rows, channels), grad_weight));
  if (!grad_addend.defined()) return absl::OkStatus();
  // The order the decoder block summed in before the fusion.
  return Add(grad_input, grad_addend, grad_input, stream);
}

}  // namespace

absl::Status RmsNormBackward(const Tensor &grad_output, const Tensor &input,
                             const Tensor &weight, const Tensor &rstd,
                             const Tensor &grad_input,
                             const Tensor &grad_weight, const Stream &stream) {
  return RmsNormBackwardImpl("RmsNormBackward", grad_output, input, weight,
                             rstd, grad_input, grad_weight, stream, Tensor());
}

absl::Status RmsNormBackwardAdd(const Tensor &grad_output, const Tensor &input,
                                const Tensor &weight, const Tensor &rstd,
                                const Tensor &grad_addend,
                                const Tensor &grad_input,
                                const Tensor &grad_weight,
                                const Stream &stream) {
  const char *op = "RmsNormBackwardAdd";
  ZE_RETURN_IF_ERROR(CheckGradAddend(op, grad_addend, grad_input, grad_output));
  return RmsNormBackwardImpl(op, grad_output, input, weight, rstd, grad_input,
                             grad_weight, stream, grad_addend);
}

absl::Status RotaryEmbeddingForward(const Tensor &input, const Tensor &inv_freq,
                                    const Tensor &starts, const Tensor &output,
                                    const Stream &stream) {
  const char *op = "RotaryEmbeddingForward";
  ZE_RETURN_IF_ERROR(
      CheckRotary(op, input, "input", inv_freq, starts, output, "output"));
  if (input.device().is_cuda()) {
    return cuda_backend::RotaryEmbedding(input, inv_freq, starts, output,
                                         /*inverse=*/false, stream);
  }
  return cpu_backend::RotaryEmbedding(input, inv_freq, starts, output,
                                      /*inverse=*/false);
}

absl::Status RotaryEmbeddingBackward(const Tensor &grad_output,
                                     const Tensor &inv_freq,
                                     const Tensor &starts,
                                     const Tensor &grad_input,
                                     const Stream &stream) {
  const char *op = "RotaryEmbeddingBackward";
  ZE_RETURN_IF_ERROR(CheckRotary(op, grad_output, "grad_output", inv_freq,
                                 starts, grad_input, "grad_input"));
  if (grad_output.device().is_cuda()) {
    return cuda_backend::RotaryEmbedding(grad_output, inv_freq, starts,
                                         grad_input, /*inverse=*/true, stream);
  }
  return cpu_backend::RotaryEmbedding(grad_output, inv_freq, starts, grad_input,
                                      /*inverse=*/true);
}

absl::Status SwiGluForward(const Tensor &gate, const Tensor &up,
                           const Tensor &output, const Stream &stream) {
  const char *op = "SwiGluForward";
  ZE_RETURN_IF_ERROR(
      RequireDefined(op, {{"gate", gate}, {"up", up}, {"output", output}}));
  ZE_RETURN_IF_ERROR(RequireShape(op, "up", up, gate.shape()));
  ZE_RETURN_IF_ERROR(RequireShape(op, "output", output, gate.shape()));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "gate", gate));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "up", up));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "output", output));
  if (Aliases(output, gate) || Aliases(output, up)) {
    return Invalid(op, "output must not alias gate or up");
  }
  ZE_RETURN_IF_ERROR(
      RequireSameDevice(op, "gate", gate, {{"up", up}, {"output", output}}));
  if (gate.device().is_cuda()) {
    return cuda_backend::SwiGluForward(gate, up, output, stream);
  }
  return cpu_backend::SwiGluForward(gate, up, output);
}

absl::Status SwiGluBackward(const Tensor &grad_output, const Tensor &gate,
                            const Tensor &up, const Tensor &grad_gate,
                            const Tensor &grad_up, const Stream &stream) {
  const char *op = "SwiGluBackward";
  ZE_RETURN_IF_ERROR(RequireDefined(
      op, {{"grad_output", grad_output}, {"gate", gate}, {"up", up}}));
  for (const auto &[name, tensor] :
       {std::pair<const char *, const Tensor *>{"grad_output", &grad_output},
        {"up", &up},
        {"grad_gate", &grad_gate},
        {"grad_up", &grad_up}}) {
    if (!tensor->defined()) continue;
    ZE_RETURN_IF_ERROR(RequireShape(op, name, *tensor, gate.shape()));
    ZE_RETURN_IF_ERROR(RequireFloat(op, name, *tensor));
  }
  ZE_RETURN_IF_ERROR(RequireFloat(op, "gate", gate));
  // Each gradient may be its own input itself (read before written).
  if (Aliases(grad_gate, grad_output) || Aliases(grad_gate, up) ||
      (Aliases(grad_gate, gate) && !SameTensor(grad_gate, gate)) ||
      Aliases(grad_up, grad_output) || Aliases(grad_up, gate) ||
      Aliases(grad_up, grad_gate) ||
      (Aliases(grad_up, up) && !SameTensor(grad_up, up))) {
    return Invalid(op,
                   "grad_gate and grad_up must not alias an input or each "
                   "other, except each its own input itself (grad_gate gate, "
                   "grad_up up)");
  }
  ZE_RETURN_IF_ERROR(RequireSameDevice(op, "gate", gate,
                                       {{"grad_output", grad_output},
                                        {"up", up},
                                        {"grad_gate", grad_gate},
                                        {"grad_up", grad_up}}));
  if (gate.device().is_cuda()) {
    return cuda_backend::SwiGluBackward(grad_output, gate, up, grad_gate,
                                        grad_up, stream);
  }
  return cpu_backend::SwiGluBackward(grad_output, gate, up, grad_gate, grad_up);
}

absl::Status GroupedAttentionForward(const Tensor &q, const Tensor &k,
                                     const Tensor &v, const Tensor &output,
                                     const Tensor &logsumexp,
                                     const Stream &stream) {
  const char *op = "GroupedAttentionForward";
  ZE_RETURN_IF_ERROR(CheckGroupedQkv(op, q, k, v));
  ZE_RETURN_IF_ERROR(
      RequireDefined(op, {{"output", output}, {"logsumexp", logsumexp}}));
  ZE_RETURN_IF_ERROR(RequireShape(op, "output", output, q.shape()));
  ZE_RETURN_IF_ERROR(RequireFloat(op, "output", output));
  ZE_RETURN_IF_ERROR(RequireShape(op, "logsumexp", logsumexp,
                                  {q.size(0), q.size(2), q.size(1)}));
  ZE_RETURN_IF_ERROR(RequireDType(op, "logsumexp", logsumexp, DType::kF32));
  if (Aliases(output, q) || Aliases(output, k) || Aliases(output, v)) {
    return Invalid(op, "output must not alias q, k or v");
  }
  ZE_RETURN_IF_ERROR(RequireSameDevice(
      op, "q", q, {{"output", output}, {"logsumexp", logsumexp}}));
  if (q.device().is_cuda()) {
    return cuda_backend::GroupedAttentionForward(q, k, v, output, logsumexp,
                                                 stream);
  }
  return cpu_backend::GroupedAttentionForward(q, k, v, output, logsumexp);
}

absl::Status GroupedAttentionBackward(
    const Tensor &grad_output, const Tensor &q, const Tensor &k,
    const Tensor &v, const Tensor &output, const Tensor &logsumexp,
    const Tensor &grad_q, const Tensor &grad_k, const Tensor &grad_v,
    const Stream &stream) {
  const char *op = "GroupedAttentionBackward";
  ZE_RETURN_IF_ERROR(CheckGroupedQkv(op, q, k, v));
  for (const auto &[name, tensor, shape] :
       {std::tuple<const char *, const Tensor *, Shape>{
            "grad_output", &grad_output, q.shape()},
        {"output", &output, q.shape()},
        {"grad_q", &grad_q, q.shape()},
        {"grad_k", &grad_k, k.shape()},
        {"grad_v", &grad_v, k.shape()}}) {
    ZE_RETURN_IF_ERROR(RequireDefined(op, name, *tensor));
    ZE_RETURN_IF_ERROR(RequireShape(op, name, *tensor, shape));
    ZE_RETURN_IF_ERROR(RequireFloat(op, name, *tensor));
  }
  ZE_RETURN_IF_ERROR(RequireDefined(op, "logsumexp", logsumexp));
  ZE_RETURN_IF_ERROR(RequireShape(op, "logsumexp", logsumexp,
                                  {q.size(0), q.size(2), q.size(1)}));
  ZE_RETURN_IF_ERROR(RequireDType(op, "logsumexp", logsumexp, DType::kF32));
  for (const Tensor *grad : {&grad_q, &grad_k, &grad_v}) {
    for (const Tensor *other :
         {&grad_output, &q, &k, &v, &output, &grad_q, &grad_k, &grad_v}) {
      if (grad != other && Aliases(*grad, *other)) {
        return Invalid(op,
                       "grad_q, grad_k and grad_v must not alias each "
                       "other or an input");
      }
    }
  }
  ZE_RETURN_IF_ERROR(RequireSameDevice(op, "q", q,
                                       {{"grad_output", grad_output},
                                        {"output", output},
                                        {"logsumexp", logsumexp},
                                        {"grad_q", grad_q},
                                        {"grad_k", grad_k},
                                        {"grad_v", grad_v}}));
  if (q.device().is_cuda()) {
    return cuda_backend::GroupedAttentionBackward(grad_output, q, k, v, output,
                                                  logsumexp, grad_q, grad_k,
                                                  grad_v, stream);
  }
  return cpu_backend::GroupedAttentionBackward(
      grad_output, q, k, v, output, logsumexp, grad_q, grad_k, grad_v);
}

absl::Status GroupedKvCacheWrite(const Tensor &k, const Tensor &v,
                                 const Tensor &rows, const Tensor &starts,
                                 const Tensor &key_cache,
                                 const Tensor &value_cache,
                                 const Stream &stream) {
  const char *op = "GroupedKvCacheWrite";
  ZE_RETURN_IF_ERROR(RequireHeads(op, "k", k));
  ZE_RETURN_IF_ERROR(RequireHeads(op, "v", v));
  ZE_RETURN_IF_ERROR(RequireShape(op, "v", v, k.shape()));
  ZE_RETURN_IF_ERROR(RequireDType(op, "v", v, k.dtype()));
  ZE_RETURN_IF_ERROR(CheckCacheTensors(op, k.size(0), k.size(2), k.size(3),
                                       k.dtype(), rows, starts, key_cache,
                                       value_cache));
  ZE_RETURN_IF_ERROR(
      RequireSameDevice(op, "k", k, {{"v", v}, {"key_cache", key_cache}}));
  if (k.device().is_cuda()) {
    return cuda_backend::GroupedKvCacheWrite(k, v, rows, starts, key_cache,
                                             value_cache, stream);
  }
  return cpu_backend::GroupedKvCacheWrite(k, v, rows, starts, key_cache,
                                          value_cache);
}

absl::Status GroupedCachedAttentionForward(const Tensor &q, const Tensor &rows,
                                           const Tensor &starts,
                                           const Tensor &key_cache,
                                           const Tensor &value_cache,
                                           const Tensor &output,
                                           const Stream &stream) {
  const char *op = "GroupedCachedAttentionForward";
  ZE_RETURN_IF_ERROR(RequireHeads(op, "q", q));
  ZE_RETURN_IF_ERROR(RequireDefined(op, "key_cache", key_cache));
  if (key_cache.dim() != 4 || key_cache.size(1) < 1 ||
      q.size(2) % key_cache.size(1) != 0) {
    return Invalid(op, absl::StrCat("key_cache must be (B, Hkv, T_max, D) "
                                    "with Hkv dividing Hq = ",
                                    q.size(2), ", got ",
                                    ShapeToString(key_cache.shape())));
  }
  ZE_RETURN_IF_ERROR(CheckCacheTensors(op, q.size(0), key_cache.size(1),
                                       q.size(3), q.dtype(), rows, starts,
                                       key_cache, value_cache));
  ZE_RETURN_IF_ERROR(RequireDefined(op, "output", output));
  ZE_RETURN_IF_ERROR(RequireShape(op, "output", output, q.shape()));
  ZE_RETURN_IF_ERROR(RequireDType(op, "output", output, q.dtype()));
  if (Aliases(output, q)) return Invalid(op, "output must not alias q");
  ZE_RETURN_IF_ERROR(RequireSameDevice(
      op, "q", q, {{"key_cache", key_cache}, {"output", output}}));
  if (q.device().is_cuda()) {
    return cuda_backend::GroupedCachedAttentionForward(
        q, rows, starts, key_cache, value_cache, output, stream);
  }
  return cpu_backend::GroupedCachedAttentionForward(q, rows, starts, key_cache,
                                                    value_cache, output);
}

}  // namespace nn
}  // namespace ze
