#include "zero/memory_estimate.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

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

absl::Status ValidateStateBytes(int64_t optimizer_state_bytes_per_element) {
  if (optimizer_state_bytes_per_element < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory estimate: optimizer state bytes must be >= 0, "
                     "got ",
                     optimizer_state_bytes_per_element));
  }
  return absl::OkStatus();
}

absl::Status Validate(int stage, int64_t optimizer_state_bytes_per_element) {
  if (stage < 0 || stage > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory estimate: stage must be 0-3, got ", stage));
  }
  return ValidateStateBytes(optimizer_state_bytes_per_element);
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

absl::StatusOr<MemoryBreakdown> PlanModelStateMemory(
    const PartitionedLayout& layout, const StagePolicy& policy,
    TrainingPrecision precision, int64_t optimizer_state_bytes_per_element,
    int64_t trainable_elements, const StatePlacement& placement) {
  absl::Status status = ValidateStateBytes(optimizer_state_bytes_per_element);
  if (!status.ok()) return status;
  const ModelStateBytes bytes =
      Compute(layout.padded_total_elements(), layout.partition_elements(),
              policy, precision, optimizer_state_bytes_per_element);
  MemoryBreakdown memory;
  memory.parameter_elements = trainable_elements;
  memory.model_weight_bytes = bytes.params;
  memory.gradient_bytes = bytes.grads;
  memory.master_weight_bytes = bytes.master_weights;
  memory.optimizer_state_bytes = bytes.optimizer_states - bytes.master_weights;

  // Offload: the host buckets' master weights and state, the staging
  // buffers their transfers use, and offloaded weights live on the host.
  const bool mixed = precision != TrainingPrecision::kFp32;
  const int64_t weight_element_bytes = mixed ? 2 : 4;
  int64_t host_elements = 0;
  int64_t all_elements = 0;
  bool aliased = !mixed;
  for (int b = 0; b < layout.num_buckets(); ++b) {
    const int64_t own = policy.partition_optimizer
                            ? layout.bucket(b).slice_elements
                            : layout.bucket(b).padded_elements;
    all_elements += own;
    const bool on_host = !placement.optimizer_on_host.empty() &&
                         placement.optimizer_on_host[static_cast<size_t>(b)];
    if (on_host) host_elements += own;
    if (on_host != placement.weights_on_host) aliased = false;
  }
  if (!mixed && !aliased) {
    // f32 training with the optimizer away from the weights keeps a copy.
    memory.master_weight_bytes = 4 * all_elements;
  }
  const int64_t master_element_bytes = (mixed || !aliased) ? 4 : 0;
  memory.staging_bytes = weight_element_bytes * host_elements;
  const int64_t host_weights =
      placement.weights_on_host ? memory.model_weight_bytes : 0;
  const int64_t swapped_bytes =
      (master_element_bytes + optimizer_state_bytes_per_element) *
      host_elements;
  int64_t swap_buffers = 0;
  if (placement.optimizer_on_nvme) {
    memory.nvme_bytes = swapped_bytes;
    swap_buffers =
        placement.nvme_buffer_count *
        (master_element_bytes + optimizer_state_bytes_per_element) *
        std::min(placement.chunk_elements, std::max<int64_t>(host_elements, 1));
  }
  memory.host_bytes =
      (placement.optimizer_on_nvme ? swap_buffers : swapped_bytes) +
      memory.staging_bytes + host_weights;
  memory.pinned_host_bytes =
      placement.pin_memory ? memory.staging_bytes + host_weights : 0;
  memory.device_bytes = memory.total_bytes() + memory.staging_bytes -
                        (swapped_bytes + memory.staging_bytes + host_weights);
  // The paper's formula in exact arithmetic: each of params, grads and
  // optimizer states is either replicated (Psi) or divided by N.
  const double psi = static_cast<double>(trainable_elements);
  const double n = layout.world_size();
  const double weight = mixed ? 2 : 4;
  const double optimizer =
      (mixed ? 4 : 0) + static_cast<double>(optimizer_state_bytes_per_element);
  const double replicated = (policy.partition_parameters ? 0 : weight) +
                            (policy.partition_gradients ? 0 : weight) +
                            (policy.partition_optimizer ? 0 : optimizer);
  const double partitioned = weight + weight + optimizer - replicated;
  memory.paper_bytes = replicated * psi + partitioned * psi / n;
  return memory;
}

}  // namespace zero
}  // namespace ze
