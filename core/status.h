// Status helpers shared by every layer.
//
// The installed Abseil (20220623) has absl::Status/StatusOr but no status
// macros, so the project defines its own. Library APIs return absl::Status or
// absl::StatusOr<T>; aborting is reserved for broken invariants (ZE_CHECK).
#ifndef ZE_CORE_STATUS_H_
#define ZE_CORE_STATUS_H_

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define ZE_STATUS_CONCAT_INNER_(a, b) a##b
#define ZE_STATUS_CONCAT_(a, b) ZE_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the enclosing function
// when it is not OK.
#define ZE_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status ze_status_ = (expr);      \
    if (!ze_status_.ok()) return ze_status_; \
  } while (0)

// `ZE_ASSIGN_OR_RETURN(auto x, MakeX());` evaluates an absl::StatusOr<T>;
// on error returns its status, otherwise moves the value into `lhs`.
#define ZE_ASSIGN_OR_RETURN(lhs, expr)                                      \
  ZE_ASSIGN_OR_RETURN_IMPL_(ZE_STATUS_CONCAT_(ze_statusor_, __LINE__), lhs, \
                            expr)

#define ZE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)     \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

// Aborts with file:line and the message when an invariant is broken. Not for
// errors a caller could cause: those return a Status.
#define ZE_CHECK(condition)                                             \
  do {                                                                  \
    if (!(condition)) {                                                 \
      std::fprintf(stderr, "%s:%d: invariant violated: %s\n", __FILE__, \
                   __LINE__, #condition);                               \
      std::abort();                                                     \
    }                                                                   \
  } while (0)

// Aborts when `expr` (an absl::Status) is not OK. For tests, examples and
// places where an error means a bug in this project.
#define ZE_CHECK_OK(expr)                                                \
  do {                                                                   \
    ::absl::Status ze_check_status_ = (expr);                            \
    if (!ze_check_status_.ok()) {                                        \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, \
                   #expr, ze_check_status_.ToString().c_str());          \
      std::abort();                                                      \
    }                                                                    \
  } while (0)

namespace ze {

// The one translation of an errno into a Status, naming what failed:
// `action` ("write", "open", ...) on `path`, and strerror. The code is the
// most specific one: ResourceExhausted for a full disk, quota or file size
// limit (ENOSPC, EDQUOT, EFBIG); PermissionDenied for EACCES, EPERM, EROFS;
// NotFound for ENOENT, ENOTDIR; Internal otherwise.
absl::Status ErrnoToStatus(int error_number, absl::string_view action,
                           absl::string_view path);

// Adds context in front of a non-OK status's message, keeping its code.
inline absl::Status Annotate(const absl::Status& status,
                             absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(context, ": ", status.message()));
}

}  // namespace ze

#endif  // ZE_CORE_STATUS_H_
