#include "zero/plan.h"

#include <algorithm>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "offload/host_update.h"
#include "offload/nvme_store.h"
#include "offload/swapped_weights.h"
#include "zero/optimizer.h"
#include "zero/training_state.h"

namespace ze {
namespace zero {

StagePolicy PolicyOf(const config::Config& config) {
  return StagePolicy::ForStage(
      static_cast<int>(config.zero_optimization.stage));
}

namespace {

// StageLayout's comment (plan.h).
absl::StatusOr<StageLayout> BuildStageLayout(nn::LossModel& model,
                                             const config::Config& config,
                                             int world_size) {
  StageLayout result;
  LayoutOptions options;
  options.world_size = world_size;
  if (config.optimizer.has_value() &&
      config.optimizer->params.blockwise_8bit_moments) {
    // Every rank's slice (and so every optimizer range) starts on an 8-bit
    // block: a block is re-encoded whole.
    options.slice_alignment =
        std::max(options.slice_alignment, offload::kMomentBlock);
  }
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
        OffloadBucketElements(config, result.trainable_elements)
            .value_or(config.zero_optimization.reduce_bucket_size.value());
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

// The breakdown for `layout` under `state` (model state as allocated,
// padding included; stage 3's layout may hold frozen buckets, which count
// as weights, gradients and optimizer slices like the others), where it
// lives by `state`'s placements (`nvme`: offload_optimizer's device is
// "nvme", so the offloaded buckets' master weights and moments are in a
// swap file, streamed through state.nvme.buffer_count host buffers of one
// chunk each), and the paper's figure for `trainable_elements` parameters.
// InvalidArgument for negative state bytes.
absl::StatusOr<MemoryBreakdown> PlanModelStateMemory(
    const PartitionedLayout& layout, const StagePolicy& policy,
    const PartitionStateOptions& state, bool nvme, TrainingPrecision precision,
    int64_t trainable_elements) {
  const int64_t optimizer_state_bytes_per_element =
      StateBytesPerElement(state.optimizer);
  ZE_ASSIGN_OR_RETURN(
      const ModelStateBytes bytes,
      EstimateModelStateBytes(layout, state.stage, precision,
                              optimizer_state_bytes_per_element));
  MemoryBreakdown memory;
  memory.parameter_elements = trainable_elements;
  memory.model_weight_bytes = bytes.params;
  memory.gradient_bytes = bytes.grads;
  memory.master_weight_bytes = bytes.master_weights;
  memory.optimizer_state_bytes = bytes.optimizer_states - bytes.master_weights;

  // Offload: the host buckets' master weights and state, the staging
  // buffers their transfers use, and offloaded weights live on the host.
  const bool weights_on_host = state.weights_placement == Placement::kHost;
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
    const bool on_host =
        !state.optimizer_placement.empty() &&
        state.optimizer_placement[static_cast<size_t>(b)] != Placement::kDevice;
    if (on_host) host_elements += own;
    if (on_host != weights_on_host) aliased = false;
  }
  // The moments as allocated: one device optimizer per device bucket and
  // one CPU optimizer over the host buckets, each in its
  // own format (8-bit adds its per-block steps; a small optimizer keeps
  // f32: offload::OptimizerStateBytes).
  int64_t device_state_bytes = 0;
  for (int b = 0; b < layout.num_buckets(); ++b) {
    const bool on_host =
        !state.optimizer_placement.empty() &&
        state.optimizer_placement[static_cast<size_t>(b)] != Placement::kDevice;
    // Frozen buckets count as the others (the estimate's rule above).
    if (on_host) continue;
    // The bucket's size decides the format (FlatOptimizer::Create).
    const int64_t own = policy.partition_optimizer
                            ? layout.bucket(b).slice_elements
                            : layout.bucket(b).padded_elements;
    device_state_bytes += offload::OptimizerStateBytes(
        state.optimizer, own, layout.bucket(b).padded_elements);
  }
  const int64_t host_state_bytes =
      offload::OptimizerStateBytes(state.optimizer, host_elements);
  memory.optimizer_state_bytes = device_state_bytes + host_state_bytes;
  if (!mixed && !aliased) {
    // f32 training with the optimizer away from the weights keeps a copy.
    memory.master_weight_bytes = 4 * all_elements;
  }
  if (state.split_master) {
    // The 16+16 master: on the device the bf16 weights plus 2 bytes of
    // remainder; offloaded buckets keep f32 (the same bits, 4 bytes).
    memory.master_weight_bytes =
        2 * (all_elements - host_elements) + 4 * host_elements;
  }
  const int64_t master_element_bytes = (mixed || !aliased) ? 4 : 0;
  memory.staging_bytes = weight_element_bytes * host_elements;
  int64_t host_weights = weights_on_host ? memory.model_weight_bytes : 0;
  // offload_param nvme: the buckets max_in_cpu keeps stay in host memory,
  // the rest are in the weights' swap file, read through buffer_count
  // buffers of the largest swapped slice (at most buffer_size) each.
  int64_t nvme_weights = 0;
  int64_t weight_swap_buffers = 0;
  if (state.weights_placement == Placement::kNvme) {
    const std::vector<bool> resident =
        ChooseResidentWeights(layout, state.weights_max_in_cpu);
    int64_t largest = 0;
    for (int b = 0; b < layout.num_buckets(); ++b) {
      const int64_t bytes =
          weight_element_bytes * layout.bucket(b).slice_elements;
      if (resident[b]) {
        host_weights += bytes;
      } else {
        nvme_weights += bytes;
        largest = std::max(largest, layout.bucket(b).slice_elements);
      }
    }
    offload::SwappedWeightsOptions swap = state.weights_nvme;
    swap.element_bytes = weight_element_bytes;
    weight_swap_buffers =
        swap.buffer_count * offload::SwappedWeights::BufferBytes(swap, largest);
  }
  const int64_t swapped_bytes =
      master_element_bytes * host_elements + host_state_bytes;
  int64_t swap_buffers = 0;
  memory.nvme_bytes = nvme_weights;
  if (nvme) {
    memory.nvme_bytes += swapped_bytes;
    swap_buffers =
        state.nvme.buffer_count *
        (master_element_bytes + optimizer_state_bytes_per_element) *
        std::min(state.chunk_elements, std::max<int64_t>(host_elements, 1));
  }
  memory.speculation_bytes =
      state.speculation_elements *
      offload::HostUpdate::BackupBytesPerElement(state.optimizer);
  memory.host_bytes = (nvme ? swap_buffers : swapped_bytes) +
                      memory.staging_bytes + host_weights +
                      weight_swap_buffers + memory.speculation_bytes;
  memory.pinned_host_bytes =
      state.pin_memory
          ? memory.staging_bytes + host_weights + weight_swap_buffers
          : 0;
  memory.device_bytes =
      memory.total_bytes() + memory.staging_bytes -
      (swapped_bytes + memory.staging_bytes + host_weights + nvme_weights);
  // The same bytes part by part (MemoryBreakdown's identities). With
  // offload_param and part of the optimizer on the device (ratio < 1) the
  // device keeps its buckets' master and moments while their weights are
  // off it: the update writes them into one bucket's device buffer at a
  // time and copies them to their tier (transient, as gathered buckets
  // are, so not model state).
  memory.host_optimizer_bytes = nvme ? 0 : swapped_bytes;
  memory.nvme_optimizer_bytes = nvme ? swapped_bytes : 0;
  memory.device_optimizer_bytes =
      memory.master_weight_bytes + memory.optimizer_state_bytes - swapped_bytes;
  memory.host_weight_bytes = host_weights;
  memory.nvme_weight_bytes = nvme_weights;
  memory.device_weight_bytes =
      memory.model_weight_bytes - host_weights - nvme_weights;
  memory.swap_buffer_bytes = swap_buffers + weight_swap_buffers;
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

}  // namespace

absl::StatusOr<Plan> BuildPlan(nn::LossModel& model,
                               const config::Config& config, int world_size,
                               const HostFacts& host) {
  Plan plan;
  plan.policy = PolicyOf(config);
  ZE_ASSIGN_OR_RETURN(plan.layout, BuildStageLayout(model, config, world_size));
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<TrainingState> training,
                      TrainingState::Create(config, world_size));
  const config::ZeroConfig& zero = config.zero_optimization;
  PartitionStateOptions& state = plan.state;
  state.stage = static_cast<int>(zero.stage);
  state.model_dtype = model.dtype();
  state.split_master = config.bf16.master_weights_16_plus_16;
  if (state.split_master && model.dtype() != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bf16.master_weights_16_plus_16 needs bf16 training; this model "
        "trains in ",
        DTypeName(model.dtype()), " (set bf16.enabled, or remove the key)"));
  }
  state.optimizer = training->optimizer_options();
  state.trainable = plan.layout.trainable;
  state.bucket_zero_read_first = plan.layout.bucket_zero_read_first;
  const bool nvme =
      zero.offload_optimizer.device == config::OffloadDevice::kNvme;
  // Speculation's backup at its unset default (bounded by the host below).
  bool speculation_unbounded = false;
  if (zero.offload_optimizer.device != config::OffloadDevice::kNone) {
    plan.cpu_optimizer = true;
    state.optimizer_placement =
        ChooseOptimizerPlacement(plan.layout.layout, plan.layout.trainable,
                                 zero.offload_optimizer.ratio.value(),
                                 plan.layout.bucket_zero_read_first,
                                 nvme ? Placement::kNvme : Placement::kHost);
    if (nvme) {
      state.nvme.nvme = offload::NvmeOptionsFromConfig(
          config.aio, zero.offload_optimizer.nvme_path.value_or(""));
      state.nvme.buffer_count = static_cast<int>(
          std::max<int64_t>(2, zero.offload_optimizer.buffer_count));
    }
    state.pin_memory = zero.offload_optimizer.pin_memory;
    // One chunk size for the pipeline and the memory it is planned by.
    state.chunk_elements =
        std::min(zero.sub_group_size, PartitionStateOptions::kMaxChunkElements);
    state.delayed_update = zero.offload_optimizer.delayed_update;
    // Speculation's backup (issue 27): where an update begins during
    // backward (offload::HostUpdate::CanBeginEarly: host buckets, no
    // delayed update, the weights not swapped), up to every host element.
    if (!nvme && !state.delayed_update &&
        zero.offload_param.device != config::OffloadDevice::kNvme) {
      int64_t host_elements = 0;
      for (int b = 0; b < plan.layout.layout.num_buckets(); ++b) {
        if (state.optimizer_placement[static_cast<size_t>(b)] !=
            Placement::kDevice) {
          host_elements += plan.layout.layout.bucket(b).slice_elements;
        }
      }
      state.speculation_elements =
          std::min(host_elements,
                   zero.offload_optimizer.speculation_buffer_size.value_or(
                       host_elements));
      speculation_unbounded =
          !zero.offload_optimizer.speculation_buffer_size.has_value();
      // The CPU/GPU split where a device-updated bucket can be: gradients
      // partitioned, an f32 master and f32 moments, the weights on the
      // device (PartitionStateOptions::split_update).
      state.split_update =
          zero.offload_optimizer.split_update &&
          plan.policy.partition_gradients && !state.split_master &&
          state.optimizer.moments == offload::MomentFormat::kF32 &&
          zero.offload_param.device == config::OffloadDevice::kNone;
    }
    // OMP_NUM_THREADS sets the CPU optimizer's threads (0: the strategy
    // gives it this rank's share of the host's CPUs).
    state.host_threads = host.omp_num_threads;
  }
  if (zero.offload_param.device == config::OffloadDevice::kCpu) {
    state.weights_placement = Placement::kHost;
    state.pin_memory = state.pin_memory || zero.offload_param.pin_memory;
  }
  if (zero.offload_param.device == config::OffloadDevice::kNvme) {
    // ZeRO-Infinity's parameter tier: DeepSpeed's keys with its meaning.
    state.weights_placement = Placement::kNvme;
    state.pin_memory = state.pin_memory || zero.offload_param.pin_memory;
    state.weights_nvme.nvme = offload::NvmeOptionsFromConfig(
        config.aio, zero.offload_param.nvme_path.value_or(""));
    state.weights_nvme.buffer_count = static_cast<int>(
        std::min<int64_t>(zero.offload_param.buffer_count, 1 << 20));
    state.weights_nvme.buffer_elements = zero.offload_param.buffer_size;
    state.weights_max_in_cpu = zero.offload_param.max_in_cpu;
    // A swapped bucket's slice is one record, read into one buffer: refused
    // here, by key, rather than at the first gather.
    const PartitionedLayout& layout = plan.layout.layout;
    const std::vector<bool> resident =
        ChooseResidentWeights(layout, state.weights_max_in_cpu);
    for (int b = 0; b < layout.num_buckets(); ++b) {
      const int64_t slice = layout.bucket(b).slice_elements;
      if (resident[b] || slice <= zero.offload_param.buffer_size) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          config.source, ": zero_optimization.offload_param.buffer_size ",
          zero.offload_param.buffer_size,
          " is smaller than the ZeRO-3 bucket of parameter '",
          layout.param(layout.bucket(b).first_param).name, "' (", slice,
          " elements per rank at world size ", world_size,
          "); every swapped bucket's slice must fit one swap buffer: set "
          "buffer_size to at least ",
          slice));
    }
  }
  if (speculation_unbounded && host.memory_available_bytes.has_value()) {
    // Unset, the backup is bounded by the host: at most half of this rank's
    // share of MemAvailable left after the rest of its planned host memory
    // (the rest of the process, data loading and the page cache need room
    // too), so the default never turns a run that fits into one the kernel
    // kills. A smaller backup only stops speculating earlier in a step.
    PartitionStateOptions without = state;
    without.speculation_elements = 0;
    ZE_ASSIGN_OR_RETURN(
        const MemoryBreakdown rest,
        PlanModelStateMemory(plan.layout.layout, plan.policy, without, nvme,
                             config::GetTrainingPrecision(config),
                             plan.layout.trainable_elements));
    const int64_t share =
        *host.memory_available_bytes / std::max(1, host.local_ranks);
    const int64_t room = std::max<int64_t>(0, share - rest.host_bytes) / 2;
    state.speculation_elements = std::min(
        state.speculation_elements,
        room / offload::HostUpdate::BackupBytesPerElement(state.optimizer));
  }
  ZE_ASSIGN_OR_RETURN(
      plan.memory,
      PlanModelStateMemory(plan.layout.layout, plan.policy, state, nvme,
                           config::GetTrainingPrecision(config),
                           plan.layout.trainable_elements));

  plan.reducer.kind = !plan.policy.partition_optimizer
                          ? ReductionKind::kAllReduce
                      : !plan.policy.partition_gradients
                          ? ReductionKind::kReduceScatterInPlace
                          : ReductionKind::kReduceScatterToPartition;
  plan.reducer.prescale = config.prescale_gradients;
  plan.reducer.predivide_factor = config.gradient_predivide_factor;
  plan.overlap_comm = zero.overlap_comm;
  plan.allgather_bucket_elements =
      std::max<int64_t>(1, zero.allgather_bucket_size);
  plan.seed = static_cast<uint64_t>(config.seed);
  plan.activation_ring_slots = config.activation_checkpointing.cpu_checkpointing
                                   ? kActivationRingSlots
                                   : 0;
  if (plan.policy.partition_parameters) {
    // Small buckets stay gathered, in layout order, while their total stays
    // within stage3_model_persistence_threshold (DeepSpeed's cap on what
    // the per-parameter threshold may keep).
    const PartitionedLayout& layout = plan.layout.layout;
    const int64_t threshold = zero.stage3_param_persistence_threshold.value();
    const int64_t model_threshold = zero.stage3_model_persistence_threshold;
    int64_t persistent_elements = 0;
    for (int b = 0; b < layout.num_buckets(); ++b) {
      int64_t elements = 0;
      for (int i = layout.bucket(b).first_param; i < layout.bucket(b).end_param;
           ++i) {
        elements += layout.param(i).numel;
      }
      const bool persistent = elements < threshold &&
                              elements <= model_threshold - persistent_elements;
      if (persistent) persistent_elements += elements;
      plan.persistent.push_back(persistent);
    }
    plan.fetch.prefetch_bucket_elements =
        zero.stage3_prefetch_bucket_size.value();
    plan.fetch.max_live_elements = zero.stage3_max_live_parameters;
    plan.fetch.max_reuse_distance = zero.stage3_max_reuse_distance;
  }
  return plan;
}

absl::StatusOr<MemoryBreakdown> PlanMemory(nn::LossModel& model,
                                           const config::Config& config,
                                           int world_size) {
  ZE_ASSIGN_OR_RETURN(Plan plan, BuildPlan(model, config, world_size));
  return plan.memory;
}

int64_t GatheredWeightBytes(const Plan& plan, int world_size) {
  if (!plan.policy.partition_parameters) return 0;
  if (world_size == 1 && plan.state.weights_placement == Placement::kDevice) {
    return 0;  // every gather in place (the partition is the whole model)
  }
  const int64_t live = std::min(
      plan.layout.layout.total_param_elements(),
      plan.fetch.max_live_elements + plan.fetch.prefetch_bucket_elements);
  return live * static_cast<int64_t>(SizeOf(plan.state.model_dtype));
}

absl::StatusOr<AutoRatioPlan> SmallestFittingOffloadRatio(
    nn::LossModel& model, const config::Config& config, int world_size,
    const HostFacts& host, int64_t device_bytes_allowed) {
  config::Config candidate = config;
  const auto plan_at = [&](double ratio) -> absl::StatusOr<Plan> {
    candidate.zero_optimization.offload_optimizer.ratio = ratio;
    return BuildPlan(model, candidate, world_size, host);
  };
  // Model state and gathered weights at a ratio.
  const auto device_bytes_of = [&](const Plan& plan) {
    return plan.memory.device_bytes + GatheredWeightBytes(plan, world_size);
  };
  // Nothing on the host is planned only to say so (the key's smallest
  // value is one step), and for the gradient buckets' transient bytes,
  // the same at every ratio.
  AutoRatioPlan choice;
  ZE_ASSIGN_OR_RETURN(const Plan nothing_offloaded, plan_at(0.0));
  choice.gradient_bucket_bytes =
      GradientBucketTransientBytes(nothing_offloaded, candidate, world_size);
  const auto fits = [&](int64_t device_bytes) {
    return device_bytes + choice.gradient_bucket_bytes <= device_bytes_allowed;
  };
  choice.everything_fits = fits(device_bytes_of(nothing_offloaded));
  // The device bytes fall as the ratio grows (whole buckets move to the
  // host), so the first that fits is the smallest.
  for (int step = 1; step <= kAutoRatioSteps; ++step) {
    choice.ratio = static_cast<double>(step) / kAutoRatioSteps;
    ZE_ASSIGN_OR_RETURN(const Plan plan, plan_at(choice.ratio));
    choice.device_bytes = device_bytes_of(plan);
    if (fits(choice.device_bytes)) {
      choice.fits = true;
      return choice;
    }
  }
  return choice;  // ratio 1, not fitting
}

int64_t GradientBucketTransientBytes(const Plan& plan,
                                     const config::Config& config,
                                     int world_size) {
  if (plan.reducer.kind != ReductionKind::kReduceScatterToPartition) return 0;
  const DType model_dtype = plan.state.model_dtype;
  const DType wire_dtype =
      config.communication_data_type.has_value()
          ? config::CommDataTypeDType(*config.communication_data_type)
          : model_dtype;
  const bool casts = wire_dtype != model_dtype;
  const bool accumulates = config.gradient_accumulation_steps.is_auto() ||
                           config.gradient_accumulation_steps.value() > 1;
  int64_t padded = 0;
  int64_t slice = 0;
  const PartitionedLayout& layout = plan.layout.layout;
  for (int b = 0; b < layout.num_buckets(); ++b) {
    padded = std::max(padded, layout.bucket(b).padded_elements);
    slice = std::max(slice, layout.bucket(b).slice_elements);
  }
  // Stage 3 keeps its bucket gradients apart from the partition.
  const bool in_partition =
      !plan.policy.partition_parameters &&
      LayersWriteThePartition(plan.reducer, world_size, casts, accumulates);
  const bool slices = !in_partition && (casts || accumulates);
  const int64_t in_flight = static_cast<int64_t>(kMaxReductionsInFlight);
  return (in_partition ? 0
                       : (in_flight + 2) * padded *
                             static_cast<int64_t>(SizeOf(model_dtype))) +
         (slices ? (in_flight + 1) * slice *
                       static_cast<int64_t>(SizeOf(wire_dtype))
                 : 0);
}

std::optional<int64_t> OffloadBucketElements(const config::Config& config,
                                             int64_t trainable_elements) {
  const config::ZeroConfig& zero = config.zero_optimization;
  if (zero.offload_optimizer.device == config::OffloadDevice::kNone ||
      PolicyOf(config).partition_parameters ||
      trainable_elements < kFineOffloadBucketsMinElements) {
    return std::nullopt;
  }
  const int64_t fine =
      (trainable_elements + kOffloadBuckets - 1) / kOffloadBuckets;
  if (fine >= zero.reduce_bucket_size.value()) return std::nullopt;
  return fine;
}

std::optional<std::string> OffloadBucketsNote(const Plan& plan,
                                              const config::Config& config) {
  const std::optional<int64_t> fine =
      OffloadBucketElements(config, plan.layout.trainable_elements);
  if (!fine.has_value()) return std::nullopt;
  return absl::StrCat(
      "offload_optimizer: gradients are reduced in ",
      plan.layout.layout.num_buckets(), " buckets of at most ", *fine,
      " elements instead of zero_optimization.reduce_bucket_size's ",
      config.zero_optimization.reduce_bucket_size.value(),
      ", so that the CPU update begins early in backward");
}

}  // namespace zero
}  // namespace ze
