// Parameter: a named, shaped tensor of a model whose data may be absent.
//
// A parameter always knows its name, shape, dtype, device and initializer.
// Its data is in one of three states:
//   - absent:   nothing materialised (shapes-only construction, or a ZeRO-3
//               rank between uses);
//   - shard:    only elements [shard_offset, shard_offset + shard.numel()) of
//               the flattened parameter are held (this rank's partition);
//   - full:     the whole tensor is present (materialised or gathered).
// A full tensor and a shard can be held together (ZeRO-3 gathers into full
// while keeping the shard); `state()` reports the most complete one.
// Reading data that is not there is a FailedPrecondition Status naming the
// parameter, never a crash.
//
// The grad slot holds a tensor of the parameter's full shape (or nothing).
// Layers ACCUMULATE into it, so a parameter used twice (tied embedding and
// output head, or a module run twice) sums its contributions. Who owns the
// grad memory is up to the caller: SetGrad can hand in a view of a flat
// bucket; when the slot is empty and the parameter requires grad, the layer
// allocates a zero-filled tensor on the parameter's device and dtype. A
// grad may have another float dtype than the data (f32 grads of bf16
// weights, for exact accumulation): the CPU backend accepts any float
// dtype; for CUDA see nn/cuda/functional_cuda.cc (its kernels take the
// grad dtype separately).
//
// Parameters are owned by the module that created them (shared_ptr, so a
// second module can use the same parameter) and are not copyable.
#ifndef ZE_NN_PARAMETER_H_
#define ZE_NN_PARAMETER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "nn/init.h"

namespace ze {
namespace nn {

class Module;

enum class ParameterState { kAbsent, kShard, kFull };
const char *ParameterStateName(ParameterState state);

class Parameter {
 public:
  // Created by Module::RegisterParameter; `owner` names it.
  Parameter(const Module *owner, std::string local_name, Shape shape,
            DType dtype, Device device, Initializer initializer);
  Parameter(const Parameter &) = delete;
  Parameter &operator=(const Parameter &) = delete;

  // Full dotted name from the root module, e.g. "blocks.3.attn.qkv.weight".
  // Stable for the life of the tree (computed from the owner's path).
  std::string name() const;
  const std::string &local_name() const { return local_name_; }
  const Module *owner() const { return owner_; }
  const Shape &shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  const Device &device() const { return device_; }
  const Initializer &initializer() const { return initializer_; }
  bool requires_grad() const { return requires_grad_; }
  void set_requires_grad(bool requires_grad) { requires_grad_ = requires_grad; }

  ParameterState state() const;

  // The full tensor. FailedPrecondition naming the parameter and its state
  // when it is absent or only a shard.
  absl::StatusOr<Tensor> data() const;
  // Makes `full` the parameter's data (shares it; no copy). InvalidArgument
  // when its shape, dtype or device differ from the parameter's.
  absl::Status SetData(const Tensor &full);
  // Drops the full tensor (a shard, if any, stays).
  void ReleaseData() { full_ = Tensor(); }

  // This rank's slice [offset, offset + shard.numel()) of the flattened
  // parameter. The shard may live on any device (e.g. host for offload).
  // InvalidArgument when the range leaves [0, numel) or the dtype differs.
  absl::Status SetShard(const Tensor &shard, int64_t offset);
  absl::StatusOr<Tensor> shard() const;
  int64_t shard_offset() const { return shard_offset_; }
  void ReleaseShard() {
    shard_ = Tensor();
    shard_offset_ = 0;
  }

  // The grad slot (may be undefined).
  const Tensor &grad() const { return grad_; }
  // InvalidArgument when `grad` is defined and its shape or device differ.
  absl::Status SetGrad(const Tensor &grad);
  void ReleaseGrad() { grad_ = Tensor(); }
  // The tensor a layer accumulates this parameter's gradient into:
  // undefined when requires_grad is false (skip), the grad slot if set,
  // otherwise a new zero-filled tensor (queued on `stream`) placed in the
  // slot. ResourceExhausted when it cannot be allocated.
  absl::StatusOr<Tensor> GradForAccumulation(const Stream &stream);

  // Writes the initial values of elements [begin, begin + dst.numel()) to
  // `dst` (any device, any float dtype; values are generated on the host in
  // f32 and rounded). Bit-identical to the same range of a whole-parameter
  // initialisation. InvalidArgument when the range leaves [0, numel).
  absl::Status InitializeSlice(uint64_t seed, int64_t begin, const Tensor &dst,
                               const Stream &stream) const;
  // Allocates the full tensor on the parameter's device and initialises it
  // (state becomes full). `stream` orders the host-to-device copy; the host
  // staging buffer is freed after the stream is synchronised.
  absl::Status Materialize(uint64_t seed, const Stream &stream);

 private:
  const Module *owner_;
  std::string local_name_;
  Shape shape_;
  int64_t numel_;
  DType dtype_;
  Device device_;
  Initializer initializer_;
  bool requires_grad_ = true;
  Tensor full_;
  Tensor shard_;
  int64_t shard_offset_ = 0;
  Tensor grad_;
};

}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_PARAMETER_H_
