#include "pipeline/partition.h"

#include <algorithm>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "zero/reports.h"

namespace ze {
namespace pipeline {
namespace {

std::vector<LayerRange> FromBoundaries(const std::vector<int> &bounds) {
  std::vector<LayerRange> ranges;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    ranges.push_back({bounds[s], bounds[s + 1]});
  }
  return ranges;
}

// The contiguous cut minimising the heaviest stage (dynamic programming
// over prefixes; n and stages are small). Among equally heavy cuts, the
// one whose earlier stages end earliest (fewer layers first), so the first
// stage, which also holds the embedding's lookups, is not overfilled.
std::vector<LayerRange> Balanced(const std::vector<int64_t> &weights,
                                 int stages) {
  const int n = static_cast<int>(weights.size());
  std::vector<int64_t> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + weights[i];
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  // best[s][i]: the lightest heaviest stage cutting layers [i, n) into s
  // stages; next[s][i]: where the first of them ends.
  std::vector<std::vector<int64_t>> best(stages + 1,
                                         std::vector<int64_t>(n + 1, kInf));
  std::vector<std::vector<int>> next(stages + 1, std::vector<int>(n + 1, -1));
  best[0][n] = 0;
  for (int s = 1; s <= stages; ++s) {
    for (int i = n - s; i >= 0; --i) {
      // The first stage takes [i, j); the rest s - 1 stages [j, n).
      for (int j = i + 1; j <= n - (s - 1); ++j) {
        if (best[s - 1][j] == kInf) continue;
        const int64_t heaviest =
            std::max(prefix[j] - prefix[i], best[s - 1][j]);
        if (heaviest < best[s][i]) {
          best[s][i] = heaviest;
          next[s][i] = j;
        }
      }
    }
  }
  std::vector<int> bounds = {0};
  int i = 0;
  for (int s = stages; s >= 1; --s) {
    i = next[s][i];
    bounds.push_back(i);
  }
  return FromBoundaries(bounds);
}

}  // namespace

absl::StatusOr<std::vector<LayerRange>> PartitionLayers(
    const std::vector<int64_t> &weights, int stages, const std::string &method,
    const std::string &stages_key, const std::string &method_key) {
  const int n = static_cast<int>(weights.size());
  if (stages < 1 || stages > n) {
    return absl::InvalidArgumentError(
        absl::StrCat(stages_key, " = ", stages, ": the model has ", n,
                     " pipeline layers, and every stage needs at least one"));
  }
  for (int i = 0; i < n; ++i) {
    if (weights[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", i, " has negative weight ", weights[i]));
    }
  }
  if (method == "parameters" || method == "best") {
    return Balanced(weights, stages);
  }
  if (method == "uniform") {
    const int chunk = n / stages;
    const int extra = n % stages;
    std::vector<int> bounds;
    for (int s = 0; s <= stages; ++s) {
      bounds.push_back(s * chunk + std::min(s, extra));
    }
    return FromBoundaries(bounds);
  }
  if (!method.empty() && method[0] >= '0' && method[0] <= '9') {
    std::vector<int> bounds;
    for (absl::string_view part : absl::StrSplit(method, ',')) {
      int value = 0;
      if (!absl::SimpleAtoi(part, &value)) {
        return absl::InvalidArgumentError(
            absl::StrCat(method_key, " = \"", method, "\": \"", part,
                         "\" is not a layer index"));
      }
      bounds.push_back(value);
    }
    if (static_cast<int>(bounds.size()) != stages + 1 || bounds.front() != 0 ||
        bounds.back() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat(method_key, " = \"", method, "\": expected ", stages + 1,
                       " boundaries from 0 to ", n, " (", stages_key, " = ",
                       stages, ", ", n, " layers)"));
    }
    for (size_t s = 0; s + 1 < bounds.size(); ++s) {
      if (bounds[s + 1] <= bounds[s]) {
        return absl::InvalidArgumentError(absl::StrCat(
            method_key, " = \"", method,
            "\": boundaries must increase (every stage non-empty)"));
      }
    }
    return FromBoundaries(bounds);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      method_key, " = \"", method,
      "\": expected \"parameters\" (or \"best\"), \"uniform\", or boundaries "
      "such as \"0,4,8,12\""));
}

namespace {

// "1.25 B", "354.0 M", "3872".
std::string Count(double n) {
  if (n >= 1e9) return absl::StrFormat("%.2f B", n / 1e9);
  if (n >= 1e6) return absl::StrFormat("%.1f M", n / 1e6);
  return absl::StrFormat("%.0f", n);
}

}  // namespace

std::string FormatStages(const std::vector<StageSummary> &stages,
                         int stages_per_rank) {
  std::string text;
  if (stages_per_rank <= 1) {
    for (size_t s = 0; s < stages.size(); ++s) {
      const StageSummary &stage = stages[s];
      absl::StrAppend(&text, s == 0 ? "" : "; ", "stage ", s, ": layers [",
                      stage.layers.first, ", ", stage.layers.last, "), ",
                      Count(stage.parameters), " parameters, ",
                      zero::FormatGiBOrMiB(stage.device_bytes), " GPU + ",
                      zero::FormatGiBOrMiB(stage.host_bytes), " host");
    }
    return text;
  }
  // The memory is per rank (one plan for all its stages): shown once.
  std::vector<const StageSummary *> first_of_rank;
  for (size_t s = 0; s < stages.size(); ++s) {
    const StageSummary &stage = stages[s];
    absl::StrAppend(&text, s == 0 ? "" : "; ", "stage ", s, ": layers [",
                    stage.layers.first, ", ", stage.layers.last, "), ",
                    Count(stage.parameters), " parameters on rank ",
                    stage.rank);
    if (stage.rank >= static_cast<int>(first_of_rank.size())) {
      first_of_rank.resize(stage.rank + 1, nullptr);
    }
    if (stage.rank >= 0 && first_of_rank[stage.rank] == nullptr) {
      first_of_rank[stage.rank] = &stage;
    }
  }
  for (size_t r = 0; r < first_of_rank.size(); ++r) {
    if (first_of_rank[r] == nullptr) continue;
    absl::StrAppend(
        &text, "; rank ", r, ": ",
        zero::FormatGiBOrMiB(first_of_rank[r]->device_bytes), " GPU + ",
        zero::FormatGiBOrMiB(first_of_rank[r]->host_bytes), " host");
  }
  return text;
}

}  // namespace pipeline
}  // namespace ze
