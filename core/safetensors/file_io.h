// POSIX file helpers shared by the safetensors reader and writer: whole
// reads/writes that retry short transfers and EINTR (errors translated by
// ze::ErrnoToStatus, core/status.h). Internal to core/safetensors.
#ifndef ZE_CORE_SAFETENSORS_FILE_IO_H_
#define ZE_CORE_SAFETENSORS_FILE_IO_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ze {
namespace safetensors {
namespace internal {

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
