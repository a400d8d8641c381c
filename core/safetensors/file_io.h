// POSIX file helpers shared by the safetensors reader and writer: whole
// reads/writes that retry short transfers and EINTR, and errno -> Status
// translation that names the file. Internal to core/safetensors.
#ifndef ZE_CORE_SAFETENSORS_FILE_IO_H_
#define ZE_CORE_SAFETENSORS_FILE_IO_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ze {
namespace safetensors {
namespace internal {

// Translates `error_number` (an errno) from `action` ("write", "open", ...)
// on `path` into the most specific Status: ResourceExhausted for a full disk,
// quota or file size limit (ENOSPC, EDQUOT, EFBIG); PermissionDenied for
// EACCES, EPERM, EROFS; NotFound for ENOENT, ENOTDIR; Internal otherwise.
// The message names the action, the path and strerror.
absl::Status FileErrorStatus(int error_number, absl::string_view action,
                             absl::string_view path);

// Reads exactly `bytes` bytes at `offset` of `fd` into `destination`.
// DataLoss naming `path` if the file ends first (it was truncated); the
// translated errno otherwise.
absl::Status ReadFullyAt(int fd, void *destination, size_t bytes,
                         uint64_t offset, absl::string_view path);

// Writes all `bytes` bytes of `source` at the current position of `fd`.
// The translated errno (naming `path`) on failure.
absl::Status WriteFully(int fd, const void *source, size_t bytes,
                        absl::string_view path);

}  // namespace internal
}  // namespace safetensors
}  // namespace ze

#endif  // ZE_CORE_SAFETENSORS_FILE_IO_H_
