#include "nn/parameter.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "nn/module.h"

namespace ze {
namespace nn {

namespace {

// GenerateInitialValues over host threads for large ranges. Each element is
// a pure function of its index, so splitting the range cannot change a bit.
void GenerateInParallel(const Initializer &initializer, uint64_t seed,
                        const std::string &name, int64_t begin, int64_t count,
                        float *dst) {
  constexpr int64_t kElementsPerThread = 1 << 20;
  const int64_t threads =
      std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()),
                        (count + kElementsPerThread - 1) / kElementsPerThread);
  if (threads <= 1) {
    GenerateInitialValues(initializer, seed, name, begin, count, dst);
    return;
  }
  const int64_t chunk = (count + threads - 1) / threads;
  ThreadPool pool(static_cast<int>(threads));
  pool.ParallelFor((count + chunk - 1) / chunk, [&](int64_t piece) {
    const int64_t start = piece * chunk;
    GenerateInitialValues(initializer, seed, name, begin + start,
                          std::min(chunk, count - start), dst + start);
  });
}

}  // namespace

const char *ParameterStateName(ParameterState state) {
  switch (state) {
    case ParameterState::kAbsent:
      return "absent";
    case ParameterState::kShard:
      return "shard";
    case ParameterState::kFull:
      return "full";
  }
  return "unknown";
}

Parameter::Parameter(const Module *owner, std::string local_name, Shape shape,
                     DType dtype, Device device, Initializer initializer)
    : owner_(owner),
      local_name_(std::move(local_name)),
      shape_(std::move(shape)),
      numel_(NumElements(shape_)),
      dtype_(dtype),
      device_(device),
      initializer_(initializer) {}

std::string Parameter::name() const {
  const std::string prefix = owner_ != nullptr ? owner_->FullName() : "";
  return prefix.empty() ? local_name_ : absl::StrCat(prefix, ".", local_name_);
}

ParameterState Parameter::state() const {
  if (full_.defined()) return ParameterState::kFull;
  if (shard_.defined()) return ParameterState::kShard;
  return ParameterState::kAbsent;
}

absl::StatusOr<Tensor> Parameter::data() const {
  if (!full_.defined()) {
    std::string detail = ParameterStateName(state());
    if (shard_.defined()) {
      absl::StrAppend(&detail, " [", shard_offset_, ", ",
                      shard_offset_ + shard_.numel(), ") of ", numel_);
    }
    return absl::FailedPreconditionError(
        absl::StrCat("parameter '", name(), "' ", ShapeToString(shape_),
                     " has no full data (state: ", detail,
                     "); materialise or gather it first"));
  }
  return full_;
}

absl::Status Parameter::SetData(const Tensor &full) {
  if (!full.defined() || full.shape() != shape_ || full.dtype() != dtype_ ||
      full.device() != device_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter '", name(), "' expects ", DTypeName(dtype_), " ",
        ShapeToString(shape_), " on ", device_.ToString(), ", got ",
        full.defined() ? full.DebugString() : "an undefined tensor"));
  }
  full_ = full;
  return absl::OkStatus();
}

absl::Status Parameter::SetShard(const Tensor &shard, int64_t offset) {
  if (!shard.defined() || shard.dtype() != dtype_ || offset < 0 ||
      offset + shard.numel() > numel_) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter '", name(), "' (", DTypeName(dtype_), ", ",
                     numel_, " elements): shard ",
                     shard.defined() ? shard.DebugString() : "undefined",
                     " at offset ", offset, " does not fit"));
  }
  shard_ = shard;
  shard_offset_ = offset;
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Parameter::shard() const {
  if (!shard_.defined()) {
    return absl::FailedPreconditionError(
        absl::StrCat("parameter '", name(), "' holds no shard"));
  }
  return shard_;
}

absl::Status Parameter::SetGrad(const Tensor &grad) {
  if (grad.defined() && (grad.numel() != numel_ || grad.device() != device_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter '", name(), "' ", ShapeToString(shape_), " on ",
        device_.ToString(), ": grad ", grad.DebugString(), " does not match"));
  }
  grad_ = grad.defined() ? grad.View(shape_) : grad;
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Parameter::GradForAccumulation(const Stream &stream) {
  if (!requires_grad_) return Tensor();
  if (!grad_.defined()) {
    ZE_ASSIGN_OR_RETURN(Tensor grad, Tensor::Empty(shape_, dtype_, device_));
    ZE_RETURN_IF_ERROR(Fill(grad, 0.0f, stream));
    grad_ = grad;
  }
  return grad_;
}

absl::Status Parameter::InitializeSlice(uint64_t seed, int64_t begin,
                                        const Tensor &dst,
                                        const Stream &stream) const {
  if (!dst.defined() || begin < 0 || begin + dst.numel() > numel_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter '", name(), "' has ", numel_,
        " elements; cannot initialise ", dst.defined() ? dst.numel() : 0,
        " elements from ", begin));
  }
  if (dst.dtype() == DType::kI32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter '", name(), "': cannot initialise an i32 tensor"));
  }
  const std::string full_name = name();
  if (dst.device().is_cpu() && dst.dtype() == DType::kF32) {
    GenerateInParallel(initializer_, seed, full_name, begin, dst.numel(),
                       dst.data_as<float>());
    return absl::OkStatus();
  }
  // Generate in f32 on the host, round to dst's dtype on the host (the
  // host<->device copy needs equal dtypes), then copy.
  std::vector<float> values(dst.numel());
  GenerateInParallel(initializer_, seed, full_name, begin, dst.numel(),
                     values.data());
  Tensor host_f32 =
      Tensor::Wrap(values.data(), {dst.numel()}, DType::kF32, Device::Cpu());
  if (dst.device().is_cpu()) {
    return Copy(host_f32, dst.Flat(), stream);
  }
  ZE_ASSIGN_OR_RETURN(Tensor host_rounded,
                      Tensor::Empty({dst.numel()}, dst.dtype(), Device::Cpu()));
  ZE_RETURN_IF_ERROR(Copy(host_f32, host_rounded, stream));
  ZE_RETURN_IF_ERROR(Copy(host_rounded, dst.Flat(), stream));
  // The staging buffers die with this frame; the copy must be done first.
  // A CPU stream (the default argument) queued it on the device's legacy
  // default stream, whose Synchronize a CPU Stream would skip.
  if (stream.device().is_cpu()) {
    return Stream::Default(dst.device()).Synchronize();
  }
  return stream.Synchronize();
}

absl::Status Parameter::Materialize(uint64_t seed, const Stream &stream) {
  ZE_ASSIGN_OR_RETURN(Tensor full, Tensor::Empty(shape_, dtype_, device_));
  ZE_RETURN_IF_ERROR(InitializeSlice(seed, 0, full, stream));
  full_ = full;
  return absl::OkStatus();
}

}  // namespace nn
}  // namespace ze
