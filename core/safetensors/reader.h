// Reading safetensors files without loading them whole.
//
//   ZE_ASSIGN_OR_RETURN(auto reader, safetensors::Reader::Open(path));
//   for (const TensorInfo& info : reader->tensors()) ...        // file order
//   ZE_ASSIGN_OR_RETURN(Tensor wte, reader->ReadTensor("wte.weight"));
//   ZE_RETURN_IF_ERROR(reader->ReadRange("w", rank_begin, count, shard));
//
// Open reads and validates only the header (see format.h for the rules) and
// checks the file size against it; every read afterwards is a pread of just
// the bytes asked for. Reads are const and may run concurrently from several
// threads. Data is little-endian, as is every machine this project targets.
#ifndef ZE_CORE_SAFETENSORS_READER_H_
#define ZE_CORE_SAFETENSORS_READER_H_

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/allocator.h"
#include "core/safetensors/format.h"
#include "core/safetensors/tensor_source.h"
#include "core/tensor.h"

namespace ze {
namespace safetensors {

// A TensorSource over one file, under the names the file gives.
class Reader : public TensorSource {
 public:
  // Opens `path` and validates its header. Errors name the path:
  // NotFound / PermissionDenied when it cannot be opened; InvalidArgument
  // when it is not a regular file, the header length is over 100,000,000
  // bytes, or the header is invalid (format.h); DataLoss when the file is
  // shorter than 8 bytes, shorter than its header, or its size differs from
  // 8 + header + the data the header describes (truncated or trailing bytes).
  // The returned reader owns the open file descriptor.
  static absl::StatusOr<std::unique_ptr<Reader>> Open(const std::string &path);

  ~Reader() override;
  Reader(const Reader &) = delete;
  Reader &operator=(const Reader &) = delete;

  const std::string &path() const { return path_; }
  std::string description() const override { return path_; }
  // Every tensor, in the order its bytes lie in the file.
  const std::vector<TensorInfo> &tensors() const { return header_.tensors; }
  // "__metadata__" (empty when the file has none).
  const Metadata &metadata() const { return header_.metadata; }
  // Absolute file offset where the data section starts (8 + N).
  uint64_t data_start() const { return data_start_; }

  // The entry for `name`, or null when absent. The pointer lives as long as
  // the reader.
  const TensorInfo *Find(absl::string_view name) const override;
  // Like Find, but NotFound naming the file and the tensor when absent.
  absl::StatusOr<const TensorInfo *> Get(absl::string_view name) const;

  // Reads tensor `name` into a new CPU tensor of its shape and dtype,
  // allocated from `allocator` (default: host memory). NotFound when absent;
  // Unimplemented when its dtype has no ze::DType (use ReadBytes);
  // the allocator's error; read errors naming the file and the tensor.
  absl::StatusOr<Tensor> ReadTensor(
      absl::string_view name, Allocator *allocator = nullptr) const override;

  // Reads tensor `name` into `destination`, which must be a CPU tensor of the
  // same dtype and exactly the same shape (a transposed shape with the same
  // element count is an error, not a silent reinterpretation).
  // InvalidArgument naming both otherwise. `destination` is the caller's.
  absl::Status ReadTensorInto(absl::string_view name,
                              const Tensor &destination) const;

  // Reads elements [element_begin, element_begin + element_count) of tensor
  // `name`, flattened row-major, into `destination` (a CPU tensor of the
  // same dtype with exactly element_count elements, any shape). This is how
  // a rank loads only its slice of a parameter. OutOfRange when the range
  // is not inside the tensor; InvalidArgument for a mismatched destination.
  absl::Status ReadRange(absl::string_view name, int64_t element_begin,
                         int64_t element_count,
                         const Tensor &destination) const override;

  // Reads `byte_count` raw bytes starting `byte_begin` bytes into tensor
  // `name`'s data, for any dtype (BOOL, I64, F64, ...). `destination` must
  // hold byte_count bytes. OutOfRange when the range leaves the tensor.
  absl::Status ReadBytes(absl::string_view name, uint64_t byte_begin,
                         uint64_t byte_count, void *destination) const;

 private:
  Reader(std::string path, int fd, Header header, uint64_t data_start);
  absl::Status CheckDestination(const TensorInfo &info,
                                const Tensor &destination,
                                int64_t element_count) const;

  std::string path_;
  int fd_;
  Header header_;
  uint64_t data_start_;
  std::unordered_map<std::string, size_t> index_;  // name -> tensors() index
};

}  // namespace safetensors
}  // namespace ze

#endif  // ZE_CORE_SAFETENSORS_READER_H_
