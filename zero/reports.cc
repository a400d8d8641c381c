#include "zero/reports.h"

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ze {
namespace zero {

std::string FormatGiB(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3f GiB",
                static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return text;
}

std::string FormatGiBOrMiB(double bytes) {
  constexpr double kMiB = 1024.0 * 1024.0;
  if (bytes >= 1024.0 * kMiB) {
    return absl::StrFormat("%.1f GiB", bytes / (1024.0 * kMiB));
  }
  return absl::StrFormat("%.1f MiB", bytes / kMiB);
}

const char* SpeculationOutcomeName(SpeculationOutcome outcome) {
  switch (outcome) {
    case SpeculationOutcome::kNone:
      return "none";
    case SpeculationOutcome::kNotSpeculated:
      return "not_speculated";
    case SpeculationOutcome::kCommitted:
      return "committed";
    case SpeculationOutcome::kRedone:
      return "redone";
  }
  return "unknown";
}

std::string MemoryBreakdown::ToString() const {
  std::string text = absl::StrFormat(
      "Psi=%d parameters; per rank: weights %s, gradients %s, master weights "
      "%s, optimizer state %s, total %s (ZeRO paper: %s)",
      parameter_elements, FormatGiB(model_weight_bytes),
      FormatGiB(gradient_bytes), FormatGiB(master_weight_bytes),
      FormatGiB(optimizer_state_bytes), FormatGiB(total_bytes()),
      FormatGiB(static_cast<int64_t>(paper_bytes)));
  if (host_bytes > 0) {
    absl::StrAppend(&text, "; device ", FormatGiB(device_bytes), ", host ",
                    FormatGiB(host_bytes), " (pinned ",
                    FormatGiB(pinned_host_bytes), ", transfer staging ",
                    FormatGiB(staging_bytes), ")");
    if (speculation_bytes > 0) {
      absl::StrAppend(&text, ", speculation backup ",
                      FormatGiB(speculation_bytes));
    }
    if (nvme_bytes > 0) {
      absl::StrAppend(&text, ", NVMe ", FormatGiB(nvme_bytes));
    }
    // Part by part, where each lives (the tiers named only where they hold
    // something).
    const auto tiers = [](int64_t device, int64_t host, int64_t nvme) {
      std::string where;
      for (const auto& [name, bytes] :
           {std::pair<const char*, int64_t>{"device", device},
            {"host", host},
            {"NVMe", nvme}}) {
        if (bytes == 0) continue;
        absl::StrAppend(&where, where.empty() ? "" : " + ", name, " ",
                        FormatGiB(bytes));
      }
      return where.empty() ? std::string("none") : where;
    };
    absl::StrAppend(
        &text, "; master weights and optimizer state: ",
        tiers(device_optimizer_bytes, host_optimizer_bytes,
              nvme_optimizer_bytes),
        "; weights: ",
        tiers(device_weight_bytes, host_weight_bytes, nvme_weight_bytes));
    if (swap_buffer_bytes > 0) {
      absl::StrAppend(&text, "; swap buffers (host) ",
                      FormatGiB(swap_buffer_bytes));
    }
  }
  return text;
}

}  // namespace zero
}  // namespace ze
