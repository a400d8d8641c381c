// CsvMonitor: DeepSpeed's csv_monitor. On rank 0, each metric is a CSV file
// <output_path>/<job_name>/<name>.csv, the name's '/' and ' ' turned into
// '_' (so "Train/Samples/train_loss" is Train_Samples_train_loss.csv), with
// a "step,<last part of the name>" header and one "step,value" row per
// write; the engine's step is the global sample count, as DeepSpeed's.
// Files are appended to, so a resumed job continues them (a header is
// written the first time this monitor writes a file, as DeepSpeed does).
#ifndef ZE_ENGINE_MONITOR_H_
#define ZE_ENGINE_MONITOR_H_

#include <cstdint>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config/config.h"

namespace ze {
namespace engine {

class CsvMonitor {
 public:
  // Writes nothing.
  CsvMonitor() = default;

  // Enabled when config.enabled and rank is 0; creates the directory
  // (parents too). An error names the directory and the config key.
  static absl::StatusOr<CsvMonitor> Create(
      const config::CsvMonitorConfig& config, int rank);

  bool enabled() const { return !directory_.empty(); }
  const std::string& directory() const { return directory_; }

  // Appends one row (no-op when disabled). The row is flushed before
  // returning; an error (a full disk, a removed directory) names the file,
  // and the file keeps every row written before.
  absl::Status Write(const std::string& name, double value, int64_t step);

 private:
  std::string directory_;          // empty: disabled
  std::set<std::string> started_;  // files this monitor has written
};

}  // namespace engine
}  // namespace ze

#endif  // ZE_ENGINE_MONITOR_H_
