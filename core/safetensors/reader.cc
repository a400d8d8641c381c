#include "core/safetensors/reader.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/safetensors/file_io.h"
#include "core/status.h"

namespace ze {
namespace safetensors {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; this reader copies bytes "
              "as they are");

absl::StatusOr<std::unique_ptr<Reader>> Reader::Open(const std::string &path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "open", path);
  // Closes the descriptor on every early return below.
  struct FdCloser {
    int fd;
    ~FdCloser() {
      if (fd >= 0) close(fd);
    }
  } closer{fd};

  struct stat file_stat;
  if (fstat(fd, &file_stat) != 0) {
    return ErrnoToStatus(errno, "stat", path);
  }
  if (!S_ISREG(file_stat.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t file_size = static_cast<uint64_t>(file_stat.st_size);
  if (file_size < kHeaderLengthBytes) {
    return absl::DataLossError(absl::StrCat(
        path, ": file is ", file_size,
        " bytes, too short for the 8-byte safetensors header length"));
  }
  unsigned char length_bytes[kHeaderLengthBytes];
  ZE_RETURN_IF_ERROR(
      internal::ReadFullyAt(fd, length_bytes, sizeof(length_bytes), 0, path));
  uint64_t header_length = 0;
  for (int i = kHeaderLengthBytes - 1; i >= 0; --i) {
    header_length = (header_length << 8) | length_bytes[i];
  }
  // Checked before allocating anything for the header: a hostile length
  // must not make us allocate gigabytes.
  if (header_length > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": safetensors header length ", header_length,
        " is over the format's limit of ", kMaxHeaderBytes, " bytes"));
  }
  if (header_length > file_size - kHeaderLengthBytes) {
    return absl::DataLossError(
        absl::StrCat(path, ": truncated safetensors header: it claims ",
                     header_length, " bytes but only ",
                     file_size - kHeaderLengthBytes, " follow the length"));
  }
  std::string header_text(header_length, '\0');
  ZE_RETURN_IF_ERROR(internal::ReadFullyAt(
      fd, header_text.data(), header_length, kHeaderLengthBytes, path));
  ZE_ASSIGN_OR_RETURN(Header header, ParseHeader(header_text, path));

  const uint64_t data_start = kHeaderLengthBytes + header_length;
  const uint64_t data_in_file = file_size - data_start;
  if (data_in_file != header.data_bytes) {
    return absl::DataLossError(absl::StrCat(
        path, ": file size ", file_size, " does not match its header: 8 + ",
        header_length, " header bytes + ", header.data_bytes,
        " data bytes = ", data_start + header.data_bytes,
        data_in_file < header.data_bytes ? " (file truncated)"
                                         : " (trailing bytes after the data)"));
  }
  closer.fd = -1;
  return std::unique_ptr<Reader>(
      new Reader(path, fd, std::move(header), data_start));
}

Reader::Reader(std::string path, int fd, Header header, uint64_t data_start)
    : path_(std::move(path)),
      fd_(fd),
      header_(std::move(header)),
      data_start_(data_start) {
  for (size_t i = 0; i < header_.tensors.size(); ++i) {
    index_.emplace(header_.tensors[i].name, i);
  }
}

Reader::~Reader() { close(fd_); }

const TensorInfo *Reader::Find(absl::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

absl::StatusOr<const TensorInfo *> Reader::Get(absl::string_view name) const {
  const TensorInfo *info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(path_, ": no tensor named \"", name, "\""));
  }
  return info;
}

absl::Status Reader::ReadBytes(absl::string_view name, uint64_t byte_begin,
                               uint64_t byte_count, void *destination) const {
  ZE_ASSIGN_OR_RETURN(const TensorInfo *info, Get(name));
  if (byte_begin > info->num_bytes() ||
      byte_count > info->num_bytes() - byte_begin) {
    return absl::OutOfRangeError(absl::StrCat(
        path_, ": tensor \"", name, "\": bytes [", byte_begin, ", +",
        byte_count, ") are outside its ", info->num_bytes(), " bytes"));
  }
  return Annotate(
      internal::ReadFullyAt(fd_, destination, byte_count,
                            data_start_ + info->begin + byte_begin, path_),
      absl::StrCat("reading tensor \"", name, "\""));
}

absl::Status Reader::CheckDestination(const TensorInfo &info,
                                      const Tensor &destination,
                                      int64_t element_count) const {
  if (!destination.defined() || !destination.device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": tensor \"", info.name,
        "\": the destination must be a defined CPU tensor, got ",
        destination.defined() ? destination.DebugString() : "undefined",
        " (read into host memory, then copy to the device)"));
  }
  if (ElementTypeOf(destination.dtype()) != info.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": tensor \"", info.name, "\" is ", ElementTypeName(info.dtype),
        " but the destination is ", destination.DebugString()));
  }
  if (destination.numel() != element_count) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor \"", info.name, "\": reading ",
                     element_count, " elements into ",
                     destination.DebugString(), " of ", destination.numel()));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Reader::ReadTensor(absl::string_view name,
                                          Allocator *allocator) const {
  ZE_ASSIGN_OR_RETURN(const TensorInfo *info, Get(name));
  absl::StatusOr<DType> dtype = DTypeOf(info->dtype);
  if (!dtype.ok()) {
    return Annotate(dtype.status(),
                    absl::StrCat(path_, ": tensor \"", name, "\""));
  }
  ZE_ASSIGN_OR_RETURN(Tensor tensor, Tensor::Empty(info->shape, *dtype,
                                                   Device::Cpu(), allocator));
  ZE_RETURN_IF_ERROR(ReadBytes(name, 0, info->num_bytes(), tensor.data()));
  return tensor;
}

absl::Status Reader::ReadTensorInto(absl::string_view name,
                                    const Tensor &destination) const {
  ZE_ASSIGN_OR_RETURN(const TensorInfo *info, Get(name));
  ZE_RETURN_IF_ERROR(
      CheckDestination(*info, destination, info->num_elements()));
  if (destination.shape() != info->shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": tensor \"", name, "\" has shape ", ShapeToString(info->shape),
        " but the destination is ", destination.DebugString()));
  }
  return ReadBytes(name, 0, info->num_bytes(), destination.data());
}

absl::Status Reader::ReadRange(absl::string_view name, int64_t element_begin,
                               int64_t element_count,
                               const Tensor &destination) const {
  ZE_ASSIGN_OR_RETURN(const TensorInfo *info, Get(name));
  const int64_t total = info->num_elements();
  if (element_begin < 0 || element_count < 0 || element_begin > total ||
      element_count > total - element_begin) {
    return absl::OutOfRangeError(absl::StrCat(
        path_, ": tensor \"", name, "\": elements [", element_begin, ", +",
        element_count, ") are outside its ", total, " elements"));
  }
  ZE_RETURN_IF_ERROR(CheckDestination(*info, destination, element_count));
  const uint64_t element_size = ElementSize(info->dtype);
  return ReadBytes(name, static_cast<uint64_t>(element_begin) * element_size,
                   static_cast<uint64_t>(element_count) * element_size,
                   destination.data());
}

}  // namespace safetensors
}  // namespace ze
