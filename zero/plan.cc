#include "zero/plan.h"

#include <algorithm>
#include <unordered_set>
#include <utility>

#include "core/status.h"
#include "zero/optimizer.h"
#include "zero/training_state.h"

namespace ze {
namespace zero {

StagePolicy PolicyOf(const config::Config& config) {
  return StagePolicy::ForStage(
      static_cast<int>(config.zero_optimization.stage));
}

absl::StatusOr<StageLayout> BuildStageLayout(nn::LossModel& model,
                                             const config::Config& config,
                                             int world_size) {
  StageLayout result;
  LayoutOptions options;
  options.world_size = world_size;
  if (!PolicyOf(config).partition_parameters) {
    for (nn::Parameter* parameter : model.Parameters()) {
      if (parameter->requires_grad()) result.params.push_back(parameter);
    }
    std::reverse(result.params.begin(), result.params.end());
    std::vector<ParamSpec> specs;
    for (nn::Parameter* parameter : result.params) {
      specs.push_back({parameter->name(), parameter->numel()});
      result.trainable_elements += parameter->numel();
    }
    options.bucket_max_elements =
        config.zero_optimization.reduce_bucket_size.value();
    ZE_ASSIGN_OR_RETURN(result.layout,
                        PartitionedLayout::Build(specs, options));
    return result;
  }
  std::unordered_set<const nn::Parameter*> placed;
  std::vector<std::vector<ParamSpec>> groups;
  for (nn::Module* module : model.Modules()) {
    std::vector<ParamSpec> trainable, frozen;
    std::vector<nn::Parameter*> trainable_params, frozen_params;
    for (nn::Parameter* parameter : module->DirectParameters()) {
      if (!placed.insert(parameter).second) continue;
      if (parameter->requires_grad()) {
        trainable.push_back({parameter->name(), parameter->numel()});
        trainable_params.push_back(parameter);
        result.trainable_elements += parameter->numel();
      } else {
        frozen.push_back({parameter->name(), parameter->numel()});
        frozen_params.push_back(parameter);
      }
    }
    if (!trainable.empty()) {
      groups.push_back(std::move(trainable));
      result.trainable.push_back(true);
      result.params.insert(result.params.end(), trainable_params.begin(),
                           trainable_params.end());
    }
    if (!frozen.empty()) {
      groups.push_back(std::move(frozen));
      result.trainable.push_back(false);
      result.params.insert(result.params.end(), frozen_params.begin(),
                           frozen_params.end());
    }
  }
  ZE_ASSIGN_OR_RETURN(result.layout,
                      PartitionedLayout::BuildFromGroups(groups, options));
  result.bucket_zero_read_first = true;
  return result;
}

OffloadPlan PlanOffload(const config::Config& config,
                        const StageLayout& layout) {
  const config::ZeroConfig& zero = config.zero_optimization;
  OffloadPlan plan;
  if (zero.offload_optimizer.device != config::OffloadDevice::kNone) {
    const bool nvme =
        zero.offload_optimizer.device == config::OffloadDevice::kNvme;
    plan.optimizer_placement = ChooseOptimizerPlacement(
        layout.layout, layout.trainable, zero.offload_optimizer.ratio,
        nvme ? Placement::kNvme : Placement::kHost);
    for (Placement where : plan.optimizer_placement) {
      plan.state.optimizer_on_host.push_back(where != Placement::kDevice);
    }
    if (nvme) {
      plan.state.optimizer_on_nvme = true;
      plan.state.nvme_buffer_count = static_cast<int>(
          std::max<int64_t>(2, zero.offload_optimizer.buffer_count));
    }
    plan.state.pin_memory = zero.offload_optimizer.pin_memory;
    plan.state.chunk_elements =
        std::min(zero.sub_group_size, PartitionStateOptions::kMaxChunkElements);
  }
  if (zero.offload_param.device == config::OffloadDevice::kCpu) {
    plan.state.weights_on_host = true;
    plan.state.pin_memory =
        plan.state.pin_memory || zero.offload_param.pin_memory;
  }
  return plan;
}

absl::StatusOr<MemoryBreakdown> PlanMemory(nn::LossModel& model,
                                           const config::Config& config,
                                           int world_size) {
  ZE_ASSIGN_OR_RETURN(StageLayout layout,
                      BuildStageLayout(model, config, world_size));
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<TrainingState> training,
                      TrainingState::Create(config, world_size));
  const OffloadPlan offload = PlanOffload(config, layout);
  return PlanModelStateMemory(
      layout.layout, PolicyOf(config), config::GetTrainingPrecision(config),
      StateBytesPerElement(training->optimizer_options()),
      layout.trainable_elements, offload.state);
}

}  // namespace zero
}  // namespace ze
