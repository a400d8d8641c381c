#include "comm/bootstrap.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ze {
namespace comm {
namespace {

// Reads an integer variable; `*value` keeps its default when unset.
absl::Status ReadInt(const std::function<const char *(const char *)> &getenv,
                     const char *name, int *value, bool *was_set) {
  const char *text = getenv(name);
  *was_set = text != nullptr;
  if (text == nullptr) return absl::OkStatus();
  if (!absl::SimpleAtoi(text, value) || *value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name, "=\"", text,
                     "\" is not a non-negative integer"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LaunchInfo> ParseLaunchInfo(
    const std::function<const char *(const char *)> &getenv) {
  LaunchInfo info;
  bool has_size = false, has_rank = false, has_local_rank = false,
       has_local_size = false;
  absl::Status status =
      ReadInt(getenv, "OMPI_COMM_WORLD_SIZE", &info.world_size, &has_size);
  if (status.ok()) {
    status = ReadInt(getenv, "OMPI_COMM_WORLD_RANK", &info.rank, &has_rank);
  }
  if (status.ok()) {
    status = ReadInt(getenv, "OMPI_COMM_WORLD_LOCAL_RANK", &info.local_rank,
                     &has_local_rank);
  }
  if (status.ok()) {
    status = ReadInt(getenv, "OMPI_COMM_WORLD_LOCAL_SIZE", &info.local_size,
                     &has_local_size);
  }
  if (!status.ok()) return status;
  if (!has_size) {
    if (has_rank) {
      return absl::InvalidArgumentError(
          "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not");
    }
    return LaunchInfo{};
  }
  info.launched = true;
  if (!has_rank) {
    return absl::InvalidArgumentError(
        "OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not");
  }
  if (info.world_size < 1 || info.rank >= info.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("OMPI_COMM_WORLD_RANK=", info.rank,
                     " is not below OMPI_COMM_WORLD_SIZE=", info.world_size));
  }
  if (!has_local_rank) info.local_rank = info.rank;
  if (!has_local_size) info.local_size = info.world_size;
  if (info.local_size < 1 || info.local_rank >= info.local_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "OMPI_COMM_WORLD_LOCAL_RANK=", info.local_rank,
        " is not below OMPI_COMM_WORLD_LOCAL_SIZE=", info.local_size));
  }
  return info;
}

absl::StatusOr<LaunchInfo> LaunchInfoFromEnvironment() {
  return ParseLaunchInfo([](const char *name) { return std::getenv(name); });
}

int DeviceIndexForRank(int local_rank, int device_count) {
  if (device_count <= 0) return -1;
  return local_rank % device_count;
}

absl::StatusOr<double> ResolveTimeoutSeconds(
    double option_seconds,
    const std::function<const char *(const char *)> &getenv) {
  if (option_seconds > 0) return option_seconds;
  const char *text = getenv("ZE_COMM_TIMEOUT_SECONDS");
  if (text == nullptr || *text == '\0') return 600.0;
  double seconds = 0;
  if (!absl::SimpleAtod(text, &seconds) || !(seconds > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ZE_COMM_TIMEOUT_SECONDS=\"", text,
                     "\" is not a positive number of seconds"));
  }
  return seconds;
}

}  // namespace comm
}  // namespace ze
