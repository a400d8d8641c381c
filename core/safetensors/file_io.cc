#include "core/safetensors/file_io.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace ze {
namespace safetensors {
namespace internal {
namespace {

// Linux caps one read/write at about 2 GiB; larger requests just loop.
constexpr size_t kMaxTransferBytes = size_t{1} << 30;

}  // namespace

absl::Status ReadFullyAt(int fd, void *destination, size_t bytes,
                         uint64_t offset, absl::string_view path) {
  char *cursor = static_cast<char *>(destination);
  while (bytes > 0) {
    const ssize_t got = pread(fd, cursor, std::min(bytes, kMaxTransferBytes),
                              static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("read at byte ", offset, " of"),
                           path);
    }
    if (got == 0) {
      return absl::DataLossError(
          absl::StrCat(path, ": file ended at byte ", offset, " with ", bytes,
                       " bytes still to read (truncated while open?)"));
    }
    cursor += got;
    offset += static_cast<uint64_t>(got);
    bytes -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

absl::Status WriteFully(int fd, const void *source, size_t bytes,
                        absl::string_view path) {
  const char *cursor = static_cast<const char *>(source);
  while (bytes > 0) {
    const ssize_t put = write(fd, cursor, std::min(bytes, kMaxTransferBytes));
    if (put < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "write", path);
    }
    cursor += put;
    bytes -= static_cast<size_t>(put);
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace safetensors
}  // namespace ze
