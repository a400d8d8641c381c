#include "core/status.h"

#include <cerrno>
#include <cstring>
#include <string>

namespace ze {

absl::Status ErrnoToStatus(int error_number, absl::string_view action,
                           absl::string_view path) {
  const std::string message =
      absl::StrCat(action, " ", path, ": ", std::strerror(error_number));
  switch (error_number) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::ResourceExhaustedError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace ze
