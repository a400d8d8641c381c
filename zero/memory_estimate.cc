#include "zero/memory_estimate.h"

#include <cstdio>

#include "absl/strings/str_cat.h"

namespace ze {
namespace zero {
namespace {

std::string GiB(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3f GiB",
                static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return text;
}

// Bytes per replicated / partitioned element, by stage: which of params,
// grads and optimizer states are partitioned.
ModelStateBytes Compute(int64_t replicated_elements, int64_t partition_elements,
                        int stage, TrainingPrecision precision,
                        int64_t optimizer_state_bytes_per_element) {
  const int64_t weight_bytes = precision == TrainingPrecision::kMixed ? 2 : 4;
  const int64_t optimizer_bytes =
      (precision == TrainingPrecision::kMixed ? 4 : 0) +
      optimizer_state_bytes_per_element;
  ModelStateBytes bytes;
  bytes.params =
      weight_bytes * (stage >= 3 ? partition_elements : replicated_elements);
  bytes.grads =
      weight_bytes * (stage >= 2 ? partition_elements : replicated_elements);
  bytes.optimizer_states =
      optimizer_bytes * (stage >= 1 ? partition_elements : replicated_elements);
  return bytes;
}

absl::Status Validate(int stage, int64_t optimizer_state_bytes_per_element) {
  if (stage < 0 || stage > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory estimate: stage must be 0-3, got ", stage));
  }
  if (optimizer_state_bytes_per_element < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory estimate: optimizer state bytes must be >= 0, "
                     "got ",
                     optimizer_state_bytes_per_element));
  }
  return absl::OkStatus();
}

}  // namespace

std::string ModelStateBytes::ToString() const {
  return absl::StrCat("params ", GiB(params), ", grads ", GiB(grads),
                      ", optimizer states ", GiB(optimizer_states), ", total ",
                      GiB(total()));
}

absl::StatusOr<ModelStateBytes> PaperModelStateBytes(
    int64_t psi, int world_size, int stage, TrainingPrecision precision,
    int64_t optimizer_state_bytes_per_element) {
  absl::Status status = Validate(stage, optimizer_state_bytes_per_element);
  if (!status.ok()) return status;
  if (psi < 0 || world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory estimate: psi ", psi, " and world size ",
                     world_size, " must be >= 0 and >= 1"));
  }
  const int64_t per_rank = (psi + world_size - 1) / world_size;
  return Compute(psi, per_rank, stage, precision,
                 optimizer_state_bytes_per_element);
}

absl::StatusOr<ModelStateBytes> EstimateModelStateBytes(
    const PartitionedLayout& layout, int stage, TrainingPrecision precision,
    int64_t optimizer_state_bytes_per_element) {
  absl::Status status = Validate(stage, optimizer_state_bytes_per_element);
  if (!status.ok()) return status;
  return Compute(layout.padded_total_elements(), layout.partition_elements(),
                 stage, precision, optimizer_state_bytes_per_element);
}

}  // namespace zero
}  // namespace ze
