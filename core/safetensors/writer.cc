#include "core/safetensors/writer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/crc32c.h"
#include "core/safetensors/file_io.h"
#include "core/status.h"

namespace ze {
namespace safetensors {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; this writer copies bytes "
              "as they are");

// Appends smaller than this are batched; larger ones go straight to write().
constexpr size_t kBufferBytes = size_t{1} << 20;

std::string DirectoryOf(const std::string &path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Makes the rename durable: without it a crash could forget the new name.
absl::Status SyncDirectory(const std::string &directory) {
  const int fd = open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return internal::FileErrorStatus(errno, "open directory", directory);
  const int result = fsync(fd);
  const int error = errno;
  close(fd);
  // Some file systems cannot fsync a directory (EINVAL); the data itself is
  // already synced, so that is not a failure.
  if (result != 0 && error != EINVAL) {
    return internal::FileErrorStatus(error, "fsync directory", directory);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Writer>> Writer::Create(
    std::string path, std::vector<TensorSpec> tensors,
    const Metadata &metadata) {
  std::vector<TensorInfo> layout;
  ZE_ASSIGN_OR_RETURN(std::string header,
                      SerializeHeader(tensors, metadata, path, &layout));

  // mkstemp in the destination's directory: rename is only atomic within
  // one file system, and a unique name lets writers of the same path race
  // without corrupting each other's temporary files.
  std::string temp_path = path + ".tmp.XXXXXX";
  const int fd = mkostemp(temp_path.data(), O_CLOEXEC);
  if (fd < 0) {
    return internal::FileErrorStatus(
        errno,
        absl::StrCat("create a temporary file in ", DirectoryOf(path), " for"),
        path);
  }
  // mkstemp creates 0600; a weights file is ordinarily world-readable.
  fchmod(fd, 0644);
  std::unique_ptr<Writer> writer(
      new Writer(path, std::move(temp_path), fd, std::move(layout)));

  unsigned char length_bytes[kHeaderLengthBytes];
  uint64_t length = header.size();
  for (size_t i = 0; i < kHeaderLengthBytes; ++i) {
    length_bytes[i] = static_cast<unsigned char>(length & 0xff);
    length >>= 8;
  }
  ZE_RETURN_IF_ERROR(writer->Write(length_bytes, sizeof(length_bytes)));
  ZE_RETURN_IF_ERROR(writer->Write(header.data(), header.size()));
  writer->AdvancePastCompleteTensors();
  return writer;
}

Writer::Writer(std::string path, std::string temp_path, int fd,
               std::vector<TensorInfo> layout)
    : path_(std::move(path)),
      temp_path_(std::move(temp_path)),
      fd_(fd),
      layout_(std::move(layout)) {}

Writer::~Writer() {
  if (fd_ >= 0) close(fd_);
  if (!finished_ && failure_.ok()) unlink(temp_path_.c_str());
}

absl::Status Writer::Fail(absl::Status status) {
  failure_ = status;
  if (fd_ >= 0) {
    close(fd_);
    fd_ = -1;
  }
  unlink(temp_path_.c_str());
  return status;
}

void Writer::AdvancePastCompleteTensors() {
  while (current_ < layout_.size() &&
         written_in_current_ == layout_[current_].num_bytes()) {
    ++current_;
    written_in_current_ = 0;
  }
}

absl::Status Writer::Flush() {
  if (buffer_.empty()) return absl::OkStatus();
  absl::Status status =
      internal::WriteFully(fd_, buffer_.data(), buffer_.size(), temp_path_);
  buffer_.clear();
  if (!status.ok()) return Fail(status);
  return absl::OkStatus();
}

absl::Status Writer::Write(const void *data, size_t bytes) {
  // Every byte of the file passes here once, in order.
  crc32c_ = Crc32cExtend(crc32c_, data, bytes);
  bytes_written_ += bytes;
  if (buffer_.size() + bytes <= kBufferBytes) {
    buffer_.append(static_cast<const char *>(data), bytes);
    return absl::OkStatus();
  }
  ZE_RETURN_IF_ERROR(Flush());
  if (bytes < kBufferBytes) {
    buffer_.append(static_cast<const char *>(data), bytes);
    return absl::OkStatus();
  }
  absl::Status status = internal::WriteFully(fd_, data, bytes, temp_path_);
  if (!status.ok()) return Fail(status);
  return absl::OkStatus();
}

absl::Status Writer::AppendBytes(absl::string_view name, const void *data,
                                 size_t bytes) {
  if (!failure_.ok()) return failure_;
  if (finished_) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": Append after Finish (tensor \"", name, "\")"));
  }
  if (bytes == 0) {
    // Nothing to write; zero-size tensors are complete from the start, so
    // this is valid for any declared tensor (WriteFile appends them too).
    for (const TensorInfo &info : layout_) {
      if (info.name == name) return absl::OkStatus();
    }
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": no tensor \"", name, "\" was declared"));
  }
  if (current_ >= layout_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path_, ": every declared tensor is complete; cannot append to \"", name,
        "\""));
  }
  const TensorInfo &info = layout_[current_];
  if (name != info.name) {
    return absl::FailedPreconditionError(absl::StrCat(
        path_,
        ": tensors are written in declaration order: expected data "
        "for \"",
        info.name, "\" next, got \"", name, "\""));
  }
  const size_t element_size = ElementSize(info.dtype);
  if (bytes % element_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor \"", name, "\": ", bytes,
                     " bytes is not a whole number of ",
                     ElementTypeName(info.dtype), " elements"));
  }
  const uint64_t remaining = info.num_bytes() - written_in_current_;
  if (bytes > remaining) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": tensor \"", name, "\": appending ", bytes / element_size,
        " elements but only ", remaining / element_size, " of its ",
        info.num_elements(), " remain"));
  }
  ZE_RETURN_IF_ERROR(Write(data, bytes));
  written_in_current_ += bytes;
  AdvancePastCompleteTensors();
  return absl::OkStatus();
}

absl::Status Writer::Append(absl::string_view name, const Tensor &values) {
  if (!values.defined() || !values.device().is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor \"", name,
                     "\": values must be a defined CPU tensor, got ",
                     values.defined() ? values.DebugString() : "undefined"));
  }
  if (failure_.ok() && !finished_ && current_ < layout_.size() &&
      name == layout_[current_].name &&
      ElementTypeOf(values.dtype()) != layout_[current_].dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor \"", name, "\" is declared ",
                     ElementTypeName(layout_[current_].dtype), " but got ",
                     values.DebugString()));
  }
  return AppendBytes(name, values.data(), values.nbytes());
}

absl::Status Writer::Finish() {
  if (!failure_.ok()) return failure_;
  if (finished_) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": Finish called twice"));
  }
  if (current_ < layout_.size()) {
    const TensorInfo &info = layout_[current_];
    // Not sticky: the caller may still append the rest and Finish again.
    return absl::FailedPreconditionError(absl::StrCat(
        path_, ": Finish before all data was written: tensor \"", info.name,
        "\" has ", written_in_current_, " of its ", info.num_bytes(),
        " bytes (", layout_.size() - current_, " tensors incomplete)"));
  }
  ZE_RETURN_IF_ERROR(Flush());
  if (fsync(fd_) != 0) {
    return Fail(internal::FileErrorStatus(errno, "fsync", temp_path_));
  }
  const int fd = fd_;
  fd_ = -1;
  if (close(fd) != 0) {
    return Fail(internal::FileErrorStatus(errno, "close", temp_path_));
  }
  if (rename(temp_path_.c_str(), path_.c_str()) != 0) {
    return Fail(internal::FileErrorStatus(
        errno, absl::StrCat("rename ", temp_path_, " to"), path_));
  }
  finished_ = true;
  return SyncDirectory(DirectoryOf(path_));
}

absl::Status WriteFile(
    const std::string &path,
    const std::vector<std::pair<std::string, Tensor>> &tensors,
    const Metadata &metadata) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const auto &[name, tensor] : tensors) {
    if (!tensor.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor \"", name, "\" is undefined"));
    }
    specs.push_back({name, ElementTypeOf(tensor.dtype()), tensor.shape()});
  }
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<Writer> writer,
                      Writer::Create(path, std::move(specs), metadata));
  for (const auto &[name, tensor] : tensors) {
    ZE_RETURN_IF_ERROR(writer->Append(name, tensor));
  }
  return writer->Finish();
}

}  // namespace safetensors
}  // namespace ze
