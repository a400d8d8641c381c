// offload_optimizer.ratio "auto": the engine chooses how much of the exact
// f32 optimizer state stays on the GPU, from the device's memory instead of
// a number the user guesses. The CPU's share of the update costs host
// memory traffic (28 bytes a parameter for AdamW) that a step cannot hide
// once it outlasts backward, while the GPU's share costs almost nothing
// (bench/RESULTS.md runs 73-74, 1.3B on an H100: ratio 1 gives 61-89% of
// no offload, 0.4-0.5 gives 85-97%). So the fastest placement that fits is
// the one that offloads only what does not fit: the smallest ratio whose
// plan (zero::SmallestFittingOffloadRatio) fits the device beside one
// micro-batch's activations and a reserve.
//
// engine::Initialize (the config-file overload) calls it when the config's
// ratio is "auto" and ResolutionContext::offload_optimizer_ratio is unset,
// with ResolutionContext::activation_bytes (required) and
// device_memory_bytes (optional), and logs the choice; train_gpt calls it
// itself for --dry_run and passes the choice on.
#ifndef ZE_ENGINE_AUTO_OFFLOAD_RATIO_H_
#define ZE_ENGINE_AUTO_OFFLOAD_RATIO_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "nn/loss_model.h"

namespace ze {
namespace engine {

// The share of the device kept free beyond the model state and the
// activations: the caching allocator's blocks that no request fits, NCCL's
// and cuBLAS's buffers, the small tensors no estimate lists. Runs 73-74
// (1.3B on an H100): the allocator held 6-12% more than its peak in use.
inline constexpr double kAutoRatioReserveFraction = 0.10;

struct AutoOffloadRatio {
  double ratio = 1.0;
  // False when even ratio 1 leaves too much on the device: the strategy
  // then fails to allocate, naming the bytes.
  bool fits = false;
  // No offload at all would fit too (the key's smallest value, 1 /
  // zero::kAutoRatioSteps, is chosen; without offload_optimizer nothing
  // would go to the host).
  bool everything_fits = false;
  // This rank's device memory: ResolutionContext::device_memory_bytes, or
  // what the device has free plus what this process's allocator already
  // holds (the model's weights among it), divided among the ranks sharing
  // the device, the smallest over all ranks.
  int64_t device_budget_bytes = 0;
  bool budget_given = false;  // from device_memory_bytes
  int ranks_per_device = 1;
  int64_t reserve_bytes = 0;     // kAutoRatioReserveFraction of the budget
  int64_t activation_bytes = 0;  // ResolutionContext::activation_bytes
  // The model state (and stage 3's gathered weights) the plan keeps on the
  // device at `ratio`.
  int64_t model_state_device_bytes = 0;
  // The stage 2-3 gradient buckets' bytes during a backward
  // (zero::GradientBucketTransientBytes).
  int64_t gradient_bucket_bytes = 0;
  // The log's form, "R (model state on the device A + gradient buckets G +
  // activations B + reserve C <= D: free on the device, N ranks on it)", or
  // "...: the budget given)" for device_memory_bytes; "> D" and a note when it
  // does not fit, and a note when no offload would fit too.
  std::string ToString() const;
};

// A collective (every rank calls it with the same config and hints).
// `config`: resolved but for the ratio (whose value is ignored), with
// offload_optimizer.device cpu and pipeline.stages 1. Errors:
// InvalidArgument for a negative activation_bytes or device_memory_bytes,
// Unimplemented with pipeline stages (each stage's model differs), the
// device query's or zero::BuildPlan's error.
absl::StatusOr<AutoOffloadRatio> ChooseAutoOffloadRatio(
    nn::LossModel& model, const config::Config& config,
    comm::Communicator& communicator, int64_t activation_bytes,
    std::optional<int64_t> device_memory_bytes = std::nullopt);

}  // namespace engine
}  // namespace ze

#endif  // ZE_ENGINE_AUTO_OFFLOAD_RATIO_H_
