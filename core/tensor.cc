#include "core/tensor.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"

namespace ze {

int64_t NumElements(const Shape& shape) {
  int64_t count = 1;
  for (int64_t dimension : shape) count *= dimension;
  return count;
}

std::string ShapeToString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

Storage::~Storage() {
  if (allocator_ != nullptr) allocator_->Deallocate(data_, bytes_);
}

absl::StatusOr<Tensor> Tensor::Empty(const Shape& shape, DType dtype,
                                     const Device& device,
                                     Allocator* allocator) {
  for (int64_t dimension : shape) {
    if (dimension < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("negative dimension in shape ", ShapeToString(shape)));
    }
  }
  // A shape whose byte count does not fit in 63 bits (a micro-batch of
  // 2^40 rows, say) is more memory than any allocator has: the same
  // ResourceExhausted an allocation failure gives, not a wrapped size.
  int64_t limit =
      std::numeric_limits<int64_t>::max() / static_cast<int64_t>(SizeOf(dtype));
  for (int64_t dimension : shape) {
    if (dimension > 0 && limit / dimension == 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("Tensor::Empty: shape ", ShapeToString(shape), " of ",
                       DTypeName(dtype), " on ", device.ToString(),
                       " asks for more than 2^63 bytes"));
    }
    if (dimension > 0) limit /= dimension;
  }
  if (allocator == nullptr) allocator = GetAllocator(device);
  Tensor tensor;
  tensor.dtype_ = dtype;
  tensor.device_ = device;
  tensor.shape_ = shape;
  tensor.numel_ = NumElements(shape);
  const size_t bytes = tensor.nbytes();
  ZE_ASSIGN_OR_RETURN(void* data, allocator->Allocate(bytes));
  tensor.storage_ = std::make_shared<Storage>(data, bytes, device, allocator);
  return tensor;
}

absl::StatusOr<Tensor> Tensor::Zeros(const Shape& shape, DType dtype,
                                     const Device& device,
                                     Allocator* allocator) {
  if (device.is_cpu()) {
    ZE_ASSIGN_OR_RETURN(Tensor tensor, Empty(shape, dtype, device, allocator));
    if (tensor.nbytes() > 0) std::memset(tensor.data(), 0, tensor.nbytes());
    return tensor;
  }
  // On this thread's current stream (a StreamGuard's, else the legacy
  // default stream), then waiting for that stream alone: work queued on any
  // stream after this returns sees the zeros.
  const Stream stream = CurrentStream(device);
  ZE_ASSIGN_OR_RETURN(Tensor tensor,
                      Zeros(shape, dtype, device, stream, allocator));
  ZE_RETURN_IF_ERROR(stream.Synchronize());
  return tensor;
}

absl::StatusOr<Tensor> Tensor::Zeros(const Shape& shape, DType dtype,
                                     const Device& device, const Stream& stream,
                                     Allocator* allocator) {
  if (stream.device() != device) {
    return absl::InvalidArgumentError(
        absl::StrCat("Tensor::Zeros on ", device.ToString(),
                     " was given a stream on ", stream.device().ToString()));
  }
  if (device.is_cpu()) return Zeros(shape, dtype, device, allocator);
  Tensor tensor;
  {
    // The block is then free of other users once `stream` reaches the fill
    // (core/allocator.h), so the fill needs no wait before it.
    StreamGuard guard(stream);
    ZE_ASSIGN_OR_RETURN(tensor, Empty(shape, dtype, device, allocator));
  }
  if (tensor.nbytes() == 0) return tensor;
  ZE_RETURN_IF_ERROR(SetCurrentDevice(device));
  ZE_RETURN_IF_ERROR(
      CudaStatus(cudaMemsetAsync(tensor.data(), 0, tensor.nbytes(),
                                 static_cast<cudaStream_t>(stream.native())),
                 absl::StrCat("cudaMemsetAsync of ", tensor.nbytes(),
                              " bytes on ", device.ToString())));
  return tensor;
}

absl::Status Tensor::RecordStream(const Stream& stream) const {
  if (storage_ == nullptr || storage_->allocator() == nullptr) {
    return absl::OkStatus();
  }
  return storage_->allocator()->RecordStream(storage_->data(), stream);
}

Tensor Tensor::Wrap(void* data, const Shape& shape, DType dtype,
                    const Device& device) {
  Tensor tensor;
  tensor.dtype_ = dtype;
  tensor.device_ = device;
  tensor.shape_ = shape;
  tensor.numel_ = NumElements(shape);
  tensor.storage_ =
      std::make_shared<Storage>(data, tensor.nbytes(), device, nullptr);
  return tensor;
}

int64_t Tensor::size(int axis) const {
  if (axis < 0) axis += dim();
  ZE_CHECK(axis >= 0 && axis < dim());
  return shape_[axis];
}

Tensor Tensor::Slice(int64_t offset, int64_t count) const {
  ZE_CHECK(offset >= 0 && count >= 0 && offset + count <= numel_);
  Tensor view = *this;
  view.offset_bytes_ =
      offset_bytes_ + static_cast<size_t>(offset) * SizeOf(dtype_);
  view.shape_ = {count};
  view.numel_ = count;
  return view;
}

Tensor Tensor::View(const Shape& shape) const {
  ZE_CHECK(NumElements(shape) == numel_);
  Tensor view = *this;
  view.shape_ = shape;
  return view;
}

std::string Tensor::DebugString() const {
  if (!defined()) return "Tensor(undefined)";
  return absl::StrCat("Tensor(", DTypeName(dtype_), ", ", ShapeToString(shape_),
                      ", ", device_.ToString(), ")");
}

}  // namespace ze
