#include "zero/memory_estimate.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "zero/reports.h"

namespace ze {
namespace zero {
namespace {

// Bytes per replicated / partitioned element, by what `policy` partitions
// of params, grads and optimizer states.
ModelStateBytes Compute(int64_t replicated_elements, int64_t partition_elements,
                        const StagePolicy& policy, TrainingPrecision precision,
                        int64_t optimizer_state_bytes_per_element) {
  const bool mixed = precision != TrainingPrecision::kFp32;
  const int64_t weight_bytes = mixed ? 2 : 4;
  const int64_t master_bytes = mixed ? 4 : 0;
  const int64_t optimizer_bytes =
      master_bytes + optimizer_state_bytes_per_element;
  ModelStateBytes bytes;
  bytes.params =
      weight_bytes *
      (policy.partition_parameters ? partition_elements : replicated_elements);
  bytes.grads =
      weight_bytes *
      (policy.partition_gradients ? partition_elements : replicated_elements);
  const int64_t optimizer_elements =
      policy.partition_optimizer ? partition_elements : replicated_elements;
  bytes.optimizer_states = optimizer_bytes * optimizer_elements;
  bytes.master_weights = master_bytes * optimizer_elements;
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
  return absl::StrCat("params ", FormatGiB(params), ", grads ",
                      FormatGiB(grads), ", optimizer states ",
                      FormatGiB(optimizer_states), ", total ",
                      FormatGiB(total()));
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
  return Compute(psi, per_rank, StagePolicy::ForStage(stage), precision,
                 optimizer_state_bytes_per_element);
}

absl::StatusOr<ModelStateBytes> EstimateModelStateBytes(
    const PartitionedLayout& layout, int stage, TrainingPrecision precision,
    int64_t optimizer_state_bytes_per_element) {
  absl::Status status = Validate(stage, optimizer_state_bytes_per_element);
  if (!status.ok()) return status;
  return Compute(layout.padded_total_elements(), layout.partition_elements(),
                 StagePolicy::ForStage(stage), precision,
                 optimizer_state_bytes_per_element);
}

}  // namespace zero
}  // namespace ze
