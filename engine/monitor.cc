#include "engine/monitor.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ze {
namespace engine {

absl::StatusOr<CsvMonitor> CsvMonitor::Create(
    const config::CsvMonitorConfig& config, int rank) {
  CsvMonitor monitor;
  if (!config.enabled || rank != 0) return monitor;
  // DeepSpeed joins the two: an empty output_path means the working
  // directory.
  const std::filesystem::path directory =
      std::filesystem::path(config.output_path) / config.job_name;
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error || !std::filesystem::is_directory(directory)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "csv_monitor: cannot create the directory '", directory.string(),
        "' (csv_monitor.output_path '", config.output_path,
        "', csv_monitor.job_name '", config.job_name,
        "'): ", error ? error.message() : "not a directory"));
  }
  monitor.directory_ = directory.string();
  return monitor;
}

absl::Status CsvMonitor::Write(const std::string& name, double value,
                               int64_t step) {
  if (!enabled()) return absl::OkStatus();
  std::string file_name = name;
  for (char& c : file_name) {
    if (c == '/' || c == ' ') c = '_';
  }
  const std::string path = absl::StrCat(directory_, "/", file_name, ".csv");
  std::FILE* file = std::fopen(path.c_str(), "a");
  if (file == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "csv_monitor: cannot open '", path, "': ", std::strerror(errno)));
  }
  std::string text;
  if (started_.count(file_name) == 0) {
    const size_t slash = name.rfind('/');
    absl::StrAppend(&text, "step,",
                    slash == std::string::npos ? name : name.substr(slash + 1),
                    "\n");
  }
  // %.9g: every f32 metric exactly, doubles to nine digits.
  absl::StrAppend(&text, step, ",", absl::StrFormat("%.9g", value), "\n");
  const bool written =
      std::fwrite(text.data(), 1, text.size(), file) == text.size();
  const int write_errno = errno;
  const bool flushed = std::fflush(file) == 0;
  const int flush_errno = errno;
  const bool closed = std::fclose(file) == 0;
  if (!written || !flushed || !closed) {
    return absl::UnavailableError(
        absl::StrCat("csv_monitor: writing '", path, "' failed: ",
                     std::strerror(!written   ? write_errno
                                   : !flushed ? flush_errno
                                              : errno)));
  }
  started_.insert(file_name);
  return absl::OkStatus();
}

}  // namespace engine
}  // namespace ze
