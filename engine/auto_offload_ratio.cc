#include "engine/auto_offload_ratio.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/host_facts.h"
#include "core/status.h"
#include "core/stream.h"
#include "engine/agreement.h"
#include "zero/plan.h"
#include "zero/reports.h"

namespace ze {
namespace engine {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// What this process may use of its device now: the free memory (a GPU's,
// or the host's MemAvailable for a CPU model) plus what its own allocator
// already holds (the model's weights among it, which the plan counts),
// within the allocator's cap when one is set.
absl::StatusOr<int64_t> LocalDeviceMemory(const Device& device) {
  int64_t available = 0;
  if (device.is_cuda()) {
    ZE_ASSIGN_OR_RETURN(available, CudaFreeMemoryBytes(device));
  } else {
    available = ReadMemAvailableBytes().value_or(0);
  }
  const AllocatorStats stats = GetAllocator(device)->stats();
  int64_t budget = available + stats.bytes_reserved;
  if (stats.byte_cap > 0) budget = std::min(budget, stats.byte_cap);
  return budget;
}

}  // namespace

std::string AutoOffloadRatio::ToString() const {
  std::string text = absl::StrFormat(
      "%.2f (model state on the device %s + gradient buckets %s + "
      "activations %s + reserve %s %s %s",
      ratio, zero::FormatGiBOrMiB(model_state_device_bytes),
      zero::FormatGiBOrMiB(gradient_bucket_bytes),
      zero::FormatGiBOrMiB(activation_bytes),
      zero::FormatGiBOrMiB(reserve_bytes), fits ? "<=" : ">",
      zero::FormatGiBOrMiB(device_budget_bytes));
  if (budget_given) {
    absl::StrAppend(&text, ": the budget given)");
  } else {
    absl::StrAppend(&text, ": free on the device, ", ranks_per_device,
                    ranks_per_device == 1 ? " rank" : " ranks", " on it)");
  }
  if (!fits) {
    absl::StrAppend(&text, "; even all of the state on the host does not fit");
  } else if (everything_fits) {
    absl::StrAppend(&text,
                    "; all of it would fit on the device: without "
                    "offload_optimizer nothing would go to the host");
  }
  return text;
}

absl::StatusOr<AutoOffloadRatio> ChooseAutoOffloadRatio(
    nn::LossModel& model, const config::Config& config,
    comm::Communicator& communicator, int64_t activation_bytes,
    std::optional<int64_t> device_memory_bytes) {
  const std::string key = absl::StrCat(
      config.source, ": zero_optimization.offload_optimizer.ratio \"auto\"");
  if (activation_bytes < 0 ||
      (device_memory_bytes.has_value() && *device_memory_bytes < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": activation_bytes (", activation_bytes,
                     ") and device_memory_bytes must not be negative"));
  }
  if (config.pipeline.stages > 1) {
    return absl::UnimplementedError(absl::StrCat(
        key, " with pipeline.stages ", config.pipeline.stages,
        ": each stage's model differs, so one ratio for every rank cannot "
        "be chosen yet; give a number"));
  }
  AutoOffloadRatio choice;
  choice.activation_bytes = activation_bytes;
  if (device_memory_bytes.has_value()) {
    choice.device_budget_bytes = *device_memory_bytes;
    choice.budget_given = true;
  } else {
    // Ranks take GPUs round robin by local rank (comm's rule), so a host
    // with more ranks than GPUs puts this many on each.
    const Device device = communicator.device();
    const int local = std::max(1, communicator.local_size());
    const int devices =
        device.is_cuda() ? std::max(1, std::min(CudaDeviceCount(), local)) : 1;
    choice.ranks_per_device = (local + devices - 1) / devices;
    const absl::StatusOr<int64_t> local_bytes = LocalDeviceMemory(device);
    ZE_RETURN_IF_ERROR(AgreeAcrossRanks(
        communicator, local_bytes.status(), Stream::Default(device),
        absl::StrCat(key, ": reading the device's free memory")));
    // Every rank must choose the same ratio: the smallest share, in whole
    // MiB (a float holds them exactly up to 16 TiB).
    const float share_mib = static_cast<float>(std::floor(
        static_cast<double>(*local_bytes / choice.ranks_per_device) / kMiB));
    ZE_ASSIGN_OR_RETURN(
        std::vector<float> shares,
        AllGatherFloats(communicator, {share_mib}, Stream::Default(device)));
    choice.device_budget_bytes = static_cast<int64_t>(
        static_cast<double>(*std::min_element(shares.begin(), shares.end())) *
        kMiB);
  }
  choice.reserve_bytes =
      static_cast<int64_t>(kAutoRatioReserveFraction *
                           static_cast<double>(choice.device_budget_bytes));
  const int64_t allowed =
      choice.device_budget_bytes - choice.reserve_bytes - activation_bytes;
  ZE_ASSIGN_OR_RETURN(const zero::AutoRatioPlan plan,
                      zero::SmallestFittingOffloadRatio(
                          model, config, communicator.world_size(),
                          ReadProcessHostFacts(communicator.local_size()),
                          std::max<int64_t>(allowed, 0)));
  choice.ratio = plan.ratio;
  choice.fits = plan.fits && allowed >= 0;
  choice.everything_fits = plan.everything_fits && allowed >= 0;
  choice.model_state_device_bytes = plan.device_bytes;
  choice.gradient_bucket_bytes = plan.gradient_bucket_bytes;
  return choice;
}

}  // namespace engine
}  // namespace ze
