// Tensor: a typed, shaped, contiguous view into shared storage.
//
// A Tensor is a cheap value (copying shares the storage). Views (Slice,
// View) alias the same bytes. Storage is returned to its allocator when the
// last tensor referring to it goes away. Tensors made by Wrap do not own
// their bytes; the caller keeps them alive.
//
// All tensors are contiguous, row-major; there are no strides. That keeps
// flat partitioned buffers (zero/) and their per-parameter views trivial.
#ifndef ZE_CORE_TENSOR_H_
#define ZE_CORE_TENSOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/stream.h"

namespace ze {

using Shape = std::vector<int64_t>;

// Product of the dimensions (1 for a scalar shape {}).
int64_t NumElements(const Shape& shape);
// "[2, 3, 4]".
std::string ShapeToString(const Shape& shape);

// Owns one allocation.
class Storage {
 public:
  // Takes ownership of `data` (of `bytes` bytes) from `allocator`; a null
  // allocator means the bytes are borrowed and never freed.
  Storage(void* data, size_t bytes, Device device, Allocator* allocator)
      : data_(data), bytes_(bytes), device_(device), allocator_(allocator) {}
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  const Device& device() const { return device_; }
  Allocator* allocator() const { return allocator_; }

 private:
  void* data_;
  size_t bytes_;
  Device device_;
  Allocator* allocator_;
};

class Tensor {
 public:
  // An undefined tensor (no storage); defined() is false.
  Tensor() = default;

  // Allocates uninitialised storage for `shape` x `dtype` on `device` from
  // `allocator` (default: GetAllocator(device)). Fails with the allocator's
  // ResourceExhausted when the memory (or cap) is exhausted (naming the
  // bytes asked for), and with ResourceExhausted naming the shape when its
  // byte count does not fit in 63 bits; InvalidArgument for a negative
  // dimension. Device storage
  // belongs to the calling thread's current stream (CurrentStream, set with
  // StreamGuard; see core/allocator.h): work on other streams that uses it
  // must be declared with RecordStream.
  static absl::StatusOr<Tensor> Empty(const Shape& shape, DType dtype,
                                      const Device& device,
                                      Allocator* allocator = nullptr);
  // Like Empty, with storage belonging to `stream` (allocated under a
  // StreamGuard of it), then zero-filled asynchronously on `stream`: no host
  // wait. Work on `stream` sees the zeros; other streams must wait for an
  // event on it. On the CPU it fills at once. Fails with InvalidArgument
  // when `stream` is on neither `device` nor the CPU of a CPU tensor.
  static absl::StatusOr<Tensor> Zeros(const Shape& shape, DType dtype,
                                      const Device& device,
                                      const Stream& stream,
                                      Allocator* allocator = nullptr);
  // Like Empty, then zero-filled synchronously: on CUDA, allocated and
  // filled on this thread's CurrentStream(device) (a StreamGuard's, else the
  // legacy default stream), then that stream alone is waited for, so work
  // queued on any stream afterwards sees the zeros. For setup and tests; a
  // caller on a hot path passes its stream to the overload above.
  static absl::StatusOr<Tensor> Zeros(const Shape& shape, DType dtype,
                                      const Device& device,
                                      Allocator* allocator = nullptr);
  // A non-owning view of caller memory.
  static Tensor Wrap(void* data, const Shape& shape, DType dtype,
                     const Device& device);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Device& device() const { return device_; }
  const Shape& shape() const { return shape_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int axis) const;
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * SizeOf(dtype_); }
  size_t element_size() const { return SizeOf(dtype_); }

  void* data() const {
    return storage_ ? static_cast<char*>(storage_->data()) + offset_bytes_
                    : nullptr;
  }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data());
  }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // Declares that work queued on `stream` uses this tensor's storage (all
  // of it, whatever this view covers), so that freeing it does not let the
  // allocator hand the bytes to anyone else before that work is done
  // (Allocator::RecordStream). Needed for every stream other than the one
  // the storage was allocated on; a no-op for host tensors, wrapped memory
  // and undefined tensors. Fails only for storage its allocator does not
  // know (a bug).
  absl::Status RecordStream(const Stream& stream) const;

  // A 1-D view of elements [offset, offset + count) of the flattened tensor.
  // Aborts when out of range (a bug, not an input error).
  Tensor Slice(int64_t offset, int64_t count) const;
  // The same bytes with another shape of equal element count (aborts
  // otherwise). View({-1}) is not supported; use Flat().
  Tensor View(const Shape& shape) const;
  Tensor Flat() const { return View({numel_}); }

  // "Tensor(bf16, [2, 3], cuda:0)".
  std::string DebugString() const;

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_bytes_ = 0;
  DType dtype_ = DType::kF32;
  Device device_ = Device::Cpu();
  Shape shape_;
  int64_t numel_ = 0;
};

}  // namespace ze

#endif  // ZE_CORE_TENSOR_H_
