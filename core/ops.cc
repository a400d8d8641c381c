#include "core/ops.h"

#include <cuda_runtime_api.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/cuda/elementwise.h"
#include "core/status.h"

namespace ze {
namespace {

absl::Status CheckSameCount(const Tensor& a, const Tensor& b,
                            const char* operation) {
  if (!a.defined() || !b.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat(operation, ": undefined tensor"));
  }
  if (a.numel() != b.numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat(operation, ": element counts differ: ", a.DebugString(),
                     " vs ", b.DebugString()));
  }
  return absl::OkStatus();
}

absl::Status CheckSameDevice(const Tensor& a, const Tensor& b,
                             const char* operation) {
  if (a.device() != b.device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        operation, ": tensors on different devices: ", a.DebugString(), " vs ",
        b.DebugString()));
  }
  return absl::OkStatus();
}

absl::Status CheckScalarF32(const Tensor& x, const Tensor& result,
                            const char* operation) {
  if (!result.defined() || result.numel() != 1 ||
      result.dtype() != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat(operation, ": result must be one f32 element, got ",
                     result.DebugString()));
  }
  return CheckSameDevice(x, result, operation);
}

absl::Status Launched(int error, const char* operation, const Tensor& x) {
  return CudaStatus(error,
                    absl::StrCat(operation, " kernel on ", x.DebugString()));
}

int Code(DType dtype) { return static_cast<int>(dtype); }

}  // namespace

absl::Status Fill(const Tensor& dst, float value, const Stream& stream) {
  if (!dst.defined())
    return absl::InvalidArgumentError("Fill: undefined tensor");
  if (dst.device().is_cuda()) {
    return Launched(cuda::LaunchFill(dst.data(), Code(dst.dtype()), dst.numel(),
                                     value, stream.native()),
                    "Fill", dst);
  }
  const int64_t count = dst.numel();
  if (dst.dtype() == DType::kF32) {
    float* data = dst.data_as<float>();
    for (int64_t i = 0; i < count; ++i) data[i] = value;
  } else if (dst.dtype() == DType::kI32) {
    int32_t* data = dst.data_as<int32_t>();
    for (int64_t i = 0; i < count; ++i) data[i] = static_cast<int32_t>(value);
  } else {
    const uint16_t bits = dst.dtype() == DType::kBF16 ? FloatToBf16Bits(value)
                                                      : FloatToF16Bits(value);
    uint16_t* data = dst.data_as<uint16_t>();
    for (int64_t i = 0; i < count; ++i) data[i] = bits;
  }
  return absl::OkStatus();
}

absl::Status Copy(const Tensor& src, const Tensor& dst, const Stream& stream) {
  ZE_RETURN_IF_ERROR(CheckSameCount(src, dst, "Copy"));
  const int64_t count = src.numel();
  if (count == 0) return absl::OkStatus();
  const bool src_cuda = src.device().is_cuda();
  const bool dst_cuda = dst.device().is_cuda();
  if (!src_cuda && !dst_cuda) {
    ConvertElements(src.data(), src.dtype(), dst.data(), dst.dtype(), count);
    return absl::OkStatus();
  }
  if (src_cuda && dst_cuda && src.device() == dst.device() &&
      src.dtype() != dst.dtype()) {
    return Launched(cuda::LaunchCast(src.data(), Code(src.dtype()), dst.data(),
                                     Code(dst.dtype()), count, stream.native()),
                    "Cast", src);
  }
  if (src.dtype() != dst.dtype()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Copy: a transfer between devices needs equal dtypes: ",
                     src.DebugString(), " -> ", dst.DebugString()));
  }
  return CudaStatus(
      cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDefault,
                      static_cast<cudaStream_t>(stream.native())),
      absl::StrCat("cudaMemcpyAsync ", src.DebugString(), " -> ",
                   dst.DebugString()));
}

absl::Status CopyConverting(const Tensor& src, const Tensor& dst,
                            const Stream& stream) {
  const bool transfer = src.device() != dst.device();
  if (!transfer || src.dtype() == dst.dtype()) return Copy(src, dst, stream);
  // A transfer needs equal dtypes: convert on the source's side first.
  ZE_ASSIGN_OR_RETURN(Tensor converted,
                      Tensor::Empty(src.shape(), dst.dtype(), src.device()));
  ZE_RETURN_IF_ERROR(Copy(src, converted, stream));
  ZE_RETURN_IF_ERROR(Copy(converted, dst, stream));
  return stream.Synchronize();  // `converted` dies here
}

absl::Status Axpby(float alpha, const Tensor& a, float beta, const Tensor& b,
                   const Tensor& out, const Stream& stream) {
  ZE_RETURN_IF_ERROR(CheckSameCount(a, b, "Axpby"));
  ZE_RETURN_IF_ERROR(CheckSameCount(a, out, "Axpby"));
  ZE_RETURN_IF_ERROR(CheckSameDevice(a, b, "Axpby"));
  ZE_RETURN_IF_ERROR(CheckSameDevice(a, out, "Axpby"));
  if (a.device().is_cuda()) {
    return Launched(
        cuda::LaunchAxpby(a.data(), Code(a.dtype()), alpha, b.data(),
                          Code(b.dtype()), beta, out.data(), Code(out.dtype()),
                          a.numel(), stream.native()),
        "Axpby", a);
  }
  const int64_t count = a.numel();
  if (a.dtype() == DType::kF32 && b.dtype() == DType::kF32 &&
      out.dtype() == DType::kF32) {
    const float* x = a.data_as<float>();
    const float* y = b.data_as<float>();
    float* z = out.data_as<float>();
    // Spelled as the CUDA kernel computes it, so the compiler's own
    // contraction cannot pair the multiply-add differently per loop.
    for (int64_t i = 0; i < count; ++i)
      z[i] = std::fma(x[i], alpha, y[i] * beta);
    return absl::OkStatus();
  }
  for (int64_t i = 0; i < count; ++i) {
    const float value = std::fma(LoadAsFloat(a.data(), a.dtype(), i), alpha,
                                 LoadAsFloat(b.data(), b.dtype(), i) * beta);
    StoreFromFloat(out.data(), out.dtype(), i, value);
  }
  return absl::OkStatus();
}

absl::Status Scale(const Tensor& x, float factor, const Stream& stream) {
  if (!x.defined())
    return absl::InvalidArgumentError("Scale: undefined tensor");
  if (x.device().is_cuda()) {
    return Launched(cuda::LaunchScale(x.data(), Code(x.dtype()), x.numel(),
                                      factor, stream.native()),
                    "Scale", x);
  }
  const int64_t count = x.numel();
  if (x.dtype() == DType::kF32) {
    float* data = x.data_as<float>();
    for (int64_t i = 0; i < count; ++i) data[i] *= factor;
    return absl::OkStatus();
  }
  for (int64_t i = 0; i < count; ++i) {
    StoreFromFloat(x.data(), x.dtype(), i,
                   LoadAsFloat(x.data(), x.dtype(), i) * factor);
  }
  return absl::OkStatus();
}

absl::Status SumOfSquares(const Tensor& x, const Tensor& result,
                          const Stream& stream) {
  if (!x.defined()) {
    return absl::InvalidArgumentError("SumOfSquares: undefined tensor");
  }
  ZE_RETURN_IF_ERROR(CheckScalarF32(x, result, "SumOfSquares"));
  if (x.device().is_cuda()) {
    // Per-block partials, added in a fixed order (no float atomics), so the
    // sum and every gradient norm built from it repeat bit for bit. Storage
    // of `stream`: freeing it at once is safe (core/allocator.h).
    StreamGuard guard(stream);
    ZE_ASSIGN_OR_RETURN(Tensor partials,
                        Tensor::Empty({cuda::SumOfSquaresBlocks(x.numel())},
                                      DType::kF32, x.device()));
    return Launched(
        cuda::LaunchSumOfSquares(x.data(), Code(x.dtype()), x.numel(),
                                 partials.data_as<float>(),
                                 result.data_as<float>(), stream.native()),
        "SumOfSquares", x);
  }
  // Double accumulation on the CPU: the reference the CUDA path is held to.
  double sum = 0.0;
  const int64_t count = x.numel();
  for (int64_t i = 0; i < count; ++i) {
    const double value = LoadAsFloat(x.data(), x.dtype(), i);
    sum += value * value;
  }
  *result.data_as<float>() += static_cast<float>(sum);
  return absl::OkStatus();
}

absl::Status HasInfOrNan(const Tensor& x, const Tensor& flag,
                         const Stream& stream) {
  if (!x.defined()) {
    return absl::InvalidArgumentError("HasInfOrNan: undefined tensor");
  }
  ZE_RETURN_IF_ERROR(CheckScalarF32(x, flag, "HasInfOrNan"));
  if (x.device().is_cuda()) {
    return Launched(
        cuda::LaunchHasInfOrNan(x.data(), Code(x.dtype()), x.numel(),
                                flag.data_as<float>(), stream.native()),
        "HasInfOrNan", x);
  }
  const int64_t count = x.numel();
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(LoadAsFloat(x.data(), x.dtype(), i))) {
      *flag.data_as<float>() = 1.0f;
      break;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> ToHostFloats(const Tensor& x,
                                                const Stream& stream) {
  std::vector<float> values(x.numel());
  Tensor host = x;
  if (x.device().is_cuda()) {
    ZE_ASSIGN_OR_RETURN(host,
                        Tensor::Empty(x.shape(), x.dtype(), Device::Cpu()));
    ZE_RETURN_IF_ERROR(Copy(x, host, stream));
    ZE_RETURN_IF_ERROR(stream.Synchronize());
  }
  for (int64_t i = 0; i < x.numel(); ++i) {
    values[i] = LoadAsFloat(host.data(), host.dtype(), i);
  }
  return values;
}

absl::StatusOr<Tensor> FromHostFloats(const std::vector<float>& values,
                                      const Shape& shape, DType dtype,
                                      const Device& device,
                                      const Stream& stream) {
  if (static_cast<int64_t>(values.size()) != NumElements(shape)) {
    return absl::InvalidArgumentError(
        absl::StrCat("FromHostFloats: ", values.size(), " values for shape ",
                     ShapeToString(shape)));
  }
  ZE_ASSIGN_OR_RETURN(Tensor host, Tensor::Empty(shape, dtype, Device::Cpu()));
  for (size_t i = 0; i < values.size(); ++i) {
    StoreFromFloat(host.data(), dtype, i, values[i]);
  }
  if (device.is_cpu()) return host;
  ZE_ASSIGN_OR_RETURN(Tensor result, Tensor::Empty(shape, dtype, device));
  ZE_RETURN_IF_ERROR(Copy(host, result, stream));
  ZE_RETURN_IF_ERROR(stream.Synchronize());
  return result;
}

}  // namespace ze
