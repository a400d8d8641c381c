#include "examples/progress.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ze {
namespace examples {

double TrainingFlopsPerToken(double num_parameters, int num_layers,
                             int64_t channels, int64_t sequence_length) {
  return 6.0 * num_parameters + 12.0 * num_layers *
                                    static_cast<double>(channels) *
                                    static_cast<double>(sequence_length);
}

double ModelFlopsUtilization(double flops_per_token, double tokens_per_second,
                             int num_devices, double peak_flops_per_device) {
  if (flops_per_token <= 0 || tokens_per_second <= 0 || num_devices <= 0 ||
      peak_flops_per_device <= 0) {
    return 0;
  }
  return flops_per_token * tokens_per_second /
         (num_devices * peak_flops_per_device);
}

std::optional<double> EstimateRemainingSeconds(int64_t steps_done,
                                               int64_t total_steps,
                                               double elapsed_seconds) {
  if (steps_done <= 0) return std::nullopt;
  if (steps_done >= total_steps) return 0.0;
  return elapsed_seconds * static_cast<double>(total_steps - steps_done) /
         static_cast<double>(steps_done);
}

std::string FormatDuration(double seconds) {
  const int64_t total = seconds > 0 ? static_cast<int64_t>(seconds) : 0;
  const int64_t hours = total / 3600;
  const int64_t minutes = (total % 3600) / 60;
  const int64_t secs = total % 60;
  if (hours > 0) return absl::StrFormat("%dh%02dm", hours, minutes);
  if (minutes > 0) return absl::StrFormat("%dm%02ds", minutes, secs);
  return absl::StrFormat("%ds", secs);
}

std::string FormatBytes(int64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  // Three significant figures: 1.50, 15.0, 150.
  const int decimals = value < 10 ? 2 : value < 100 ? 1 : 0;
  return absl::StrFormat("%.*f %s", decimals, value, kUnits[unit]);
}

namespace {

// "812", "15.2k", "1.23M": throughput at a glance.
std::string FormatCount(double value) {
  if (value >= 1e6) return absl::StrFormat("%.2fM", value / 1e6);
  if (value >= 1e4) return absl::StrFormat("%.1fk", value / 1e3);
  return absl::StrFormat("%.0f", value);
}

}  // namespace

std::string FormatProgressLine(const ProgressSnapshot& snapshot) {
  std::string line = absl::StrFormat(
      "step %d/%d | loss %.4f | %s tok/s", snapshot.step, snapshot.total_steps,
      snapshot.loss, FormatCount(snapshot.tokens_per_second));
  if (snapshot.mfu.has_value()) {
    absl::StrAppendFormat(&line, " | MFU %.1f%%", *snapshot.mfu * 100);
  }
  if (snapshot.remaining_seconds.has_value()) {
    absl::StrAppend(&line, " | ETA ",
                    FormatDuration(*snapshot.remaining_seconds));
  }
  absl::StrAppend(&line, " | mem ",
                  FormatBytes(snapshot.memory_allocated_bytes), " (peak ",
                  FormatBytes(snapshot.memory_peak_bytes), ")");
  return line;
}

void ProgressPrinter::Update(const ProgressSnapshot& snapshot) {
  const std::string line = FormatProgressLine(snapshot);
  if (in_place_) {
    // Back to the line's start, the new text, then clear what a longer
    // previous line left to the right.
    std::fprintf(out_, "\r%s\x1b[K", line.c_str());
    line_open_ = true;
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

void ProgressPrinter::Finish() {
  if (line_open_) {
    std::fputc('\n', out_);
    std::fflush(out_);
  }
  line_open_ = false;
}

}  // namespace examples
}  // namespace ze
