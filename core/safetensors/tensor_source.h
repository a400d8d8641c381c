// TensorSource: named tensors, read whole or by element range, that
// Engine::LoadWeights loads weights from. A safetensors::Reader is one (one
// file, named as the file names them); a Hugging Face model directory read
// under this project's parameter names (nn/pretrained) is another. Stage 3
// reads only each rank's element ranges through it, so no rank ever holds
// the whole model.
//
// Reads are const and may run concurrently from several threads.
#ifndef ZE_CORE_SAFETENSORS_TENSOR_SOURCE_H_
#define ZE_CORE_SAFETENSORS_TENSOR_SOURCE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/allocator.h"
#include "core/safetensors/format.h"
#include "core/tensor.h"

namespace ze {
namespace safetensors {

class TensorSource {
 public:
  virtual ~TensorSource() = default;

  // What an error names as the tensors' origin: a file's path, or a
  // directory and its format.
  virtual std::string description() const = 0;
  // The entry for `name` (its shape, dtype and size in the source), or null
  // when absent. The pointer lives as long as the source.
  virtual const TensorInfo* Find(absl::string_view name) const = 0;
  // Tensor `name` as a new CPU tensor of its shape and source dtype, from
  // `allocator` (null: host memory). NotFound when absent; read errors name
  // the file and the tensor.
  virtual absl::StatusOr<Tensor> ReadTensor(
      absl::string_view name, Allocator* allocator = nullptr) const = 0;
  // Elements [element_begin, element_begin + element_count) of tensor
  // `name`, flattened row-major, into `destination` (a CPU tensor of the
  // source dtype with exactly element_count elements). OutOfRange when the
  // range leaves the tensor; InvalidArgument for a mismatched destination.
  virtual absl::Status ReadRange(absl::string_view name, int64_t element_begin,
                                 int64_t element_count,
                                 const Tensor& destination) const = 0;
};

}  // namespace safetensors
}  // namespace ze

#endif  // ZE_CORE_SAFETENSORS_TENSOR_SOURCE_H_
