// The plan: everything a ZeRO strategy decides before it allocates, for a
// model's shapes, a config, a world size and the host's facts, computed
// once by BuildPlan without allocating anything. What each stage
// partitions (StagePolicy, zero/stage_policy.h), the flat layout, where
// every bucket's state lives, the PartitionState options every rank shares
// and the per-rank memory breakdown. The engine builds it at setup and its
// strategy allocates by it (StrategyContext::plan); train_gpt --dry_run
// and tools/ze_estimate report it (PlanMemory), so what is reported is
// what is allocated.
#ifndef ZE_ZERO_PLAN_H_
#define ZE_ZERO_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "core/host_facts.h"
#include "nn/loss_model.h"
#include "nn/parameter.h"
#include "zero/fetch_schedule.h"
#include "zero/flat_layout.h"
#include "zero/gradient_reducer.h"
#include "zero/memory_estimate.h"
#include "zero/partition_state.h"
#include "zero/reports.h"
#include "zero/stage_policy.h"

namespace ze {
namespace zero {

// What zero_optimization.stage partitions: the one place the stage number
// is read (strategies, the engine and the memory plan ask this).
StagePolicy PolicyOf(const config::Config& config);

// The flat layout of the model's parameters.
//   Stages 0-2: the trainable parameters in reverse model order (the last
//   layers' gradients are final first in backward), cut into buckets of
//   reduce_bucket_size elements.
//   Stage 3: one bucket of trainable and one of frozen parameters per
//   module, in Modules() order; a parameter goes to the first module that
//   lists it.
struct StageLayout {
  PartitionedLayout layout;
  // The model's parameters in layout order (layout.param(i) is params[i]).
  std::vector<nn::Parameter*> params;
  // Per bucket: false for stage 3's frozen buckets. Empty at stages 0-2
  // (which lay out trainable parameters only).
  std::vector<bool> trainable;
  // Trainable parameter elements (Psi).
  int64_t trainable_elements = 0;
  // True when the forward reads bucket 0 first (stage 3: model order);
  // false when it reads it last (stages 0-2: backward order).
  bool bucket_zero_read_first = false;
};

struct Plan {
  StagePolicy policy;
  StageLayout layout;
  // offload_optimizer is on: a CPU optimizer updates the offloaded buckets
  // on this host's cores.
  bool cpu_optimizer = false;
  // The PartitionState options every rank shares: stage, optimizer, model
  // dtype, trainable buckets and their order, per-bucket optimizer
  // placement (offload_optimizer's device and ratio), the weights'
  // placement (offload_param), pin_memory, the chunk size
  // (sub_group_size, capped), delayed_update, the NVMe swap settings (the
  // optimizer's, and offload_param nvme's buffers and max_in_cpu; a
  // swapped bucket slice larger than buffer_size is refused by BuildPlan
  // naming the key), and
  // host_threads from OMP_NUM_THREADS (0: the strategy divides the host's
  // CPUs among its ranks). A strategy adds its rank, device, CPU share and
  // allocation-error annotation.
  PartitionStateOptions state;
  // This rank's model-state memory (every rank's is the same).
  MemoryBreakdown memory;

  // How the strategy runs, from the config's keys, so that no strategy
  // reads them itself. The gradient reduction: its kind by the policy
  // (all-reduce, reduce-scatter in place, or into the partition),
  // prescale_gradients and gradient_predivide_factor; the strategy adds
  // the communication dtype (StrategyContext).
  GradientReducerOptions reducer;
  // overlap_comm: collectives on a stream of their own (on a GPU).
  bool overlap_comm = false;
  // Stages 0-2: at most this many elements per all-gather call that
  // rebuilds the weights after a step (allgather_bucket_size, >= 1).
  int64_t allgather_bucket_elements = 1;
  // Parameters without data are generated from (seed, name).
  uint64_t seed = 0;
  // Stage 3 (empty otherwise): per bucket, kept gathered between uses
  // (under stage3_param_persistence_threshold elements, in layout order
  // while the total stays within stage3_model_persistence_threshold).
  std::vector<bool> persistent;
  // Stage 3: the fetch schedule's prefetch and eviction limits.
  FetchScheduleOptions fetch;
  // activation_checkpointing.cpu_checkpointing: checkpointed modules keep
  // their inputs in pinned host memory and bring them back through this
  // many device buffers, each one input (B, T, C) in size
  // (nn::ActivationOffloadOptions::ring_slots): the one the running layer
  // reads and the one the previous layer's input is prefetched into. 0 when
  // off. EstimateActivations (zero/activation_estimate.h, ring_slots)
  // turns it into bytes for a micro-batch shape.
  int activation_ring_slots = 0;
};

// cpu_checkpointing's device ring: one input in use, the next on its way
// (nn/activation_offload.h).
inline constexpr int kActivationRingSlots = 2;

// The plan for `model` under `config` (validated) at `world_size` (any:
// no ranks are needed), with `host`'s facts. Needs only shapes (parameters
// may have no storage); borrows `model`'s parameters (StageLayout::params),
// so the plan must not outlive it. InvalidArgument for a config whose
// optimizer cannot be built, or from PartitionedLayout::Build.
absl::StatusOr<Plan> BuildPlan(nn::LossModel& model,
                               const config::Config& config, int world_size,
                               const HostFacts& host = HostFacts());

// offload_optimizer on, stages 1-2: the offloaded update begins during
// backward one reduce bucket at a time, as each bucket's gradients are
// reduced, so few buckets give the CPU its first gradients late, and one
// bucket gives it none before the boundary while still paying for the
// early start (speculation's backup; the update runs in backward's order,
// not the next forward's). Run 63, one H100: 1.3B GPT stage 2 at
// train_bench's 5e8-element reduce buckets (3) 35,739 tokens/s, at 5e7
// 39,935; run 64: 124M stage 2 (one bucket) 6% behind the update run whole
// after backward. For a model of at least kFineOffloadBucketsMinElements
// trainable elements (a smaller one's update takes a few milliseconds
// however late it starts) the layout's buckets are then at most
// 1/kOffloadBuckets of the model: the elements per bucket, or nullopt
// where reduce_bucket_size is already that fine (or no offload, stage 3's
// per-module buckets, a small model). Buckets that large still keep each
// collective far above the size where its bandwidth saturates. Pure.
inline constexpr int kOffloadBuckets = 16;
inline constexpr int64_t kFineOffloadBucketsMinElements = int64_t{1} << 24;
std::optional<int64_t> OffloadBucketElements(const config::Config& config,
                                             int64_t trainable_elements);
// The startup log's line when OffloadBucketElements made the buckets finer
// than reduce_bucket_size (how many, how large, why); nullopt otherwise.
std::optional<std::string> OffloadBucketsNote(const Plan& plan,
                                              const config::Config& config);

// offload_optimizer.ratio "auto" (engine::ChooseAutoOffloadRatio): the
// smallest of the ratios 1/kAutoRatioSteps, ..., 1 (the key excludes 0)
// whose plan keeps at most `device_bytes_allowed` on the device: model
// state (MemoryBreakdown::device_bytes), stage 3's gathered weights
// (GatheredWeightBytes) and the gradient buckets' transient bytes
// (GradientBucketTransientBytes); or ratio 1 with fits false when none does
// (the strategy then fails to allocate, naming the bytes). A smaller ratio
// keeps more of the exact f32 state on the GPU, where its update costs no host
// memory traffic (bench/RESULTS.md runs 73-74: ratio 0.4-0.5 is 85-97% of
// no offload where 1 is 61-89%), so the smallest that fits is the fastest.
// `config`: resolved (its own ratio is ignored), offload_optimizer.device
// cpu. Errors: BuildPlan's. Pure apart from BuildPlan's reading of `host`.
inline constexpr int kAutoRatioSteps = 20;
struct AutoRatioPlan {
  double ratio = 1.0;
  int64_t device_bytes = 0;  // model state and gathered weights at `ratio`
  int64_t gradient_bucket_bytes = 0;  // GradientBucketTransientBytes
  bool fits = false;
  // Nothing offloaded would fit too (without offload_optimizer).
  bool everything_fits = false;
};
absl::StatusOr<AutoRatioPlan> SmallestFittingOffloadRatio(
    nn::LossModel& model, const config::Config& config, int world_size,
    const HostFacts& host, int64_t device_bytes_allowed);

// Stage 3: the device bytes of gathered weights beyond the plan's own
// partition, where a gather cannot be served in place (several ranks, or
// the partition on the host with offload_param): at most
// stage3_max_live_parameters plus one prefetch bucket of the model's
// elements at the model's element size (the fetch schedule's bound). 0 at
// stages 0-2 and where every gather is in place. Pure.
int64_t GatheredWeightBytes(const Plan& plan, int world_size);

// Stages 2-3 (kReduceScatterToPartition): the device bytes the gradient
// buckets hold at once during a backward beyond the model state, at the
// largest bucket's size: each bucket's full gradients from its first
// module's backward until its reduction finishes (kMaxReductionsInFlight
// in flight, the one just issued and the next being written: + 2), and,
// where a reduction cannot land in the partition itself (accumulating onto
// it, or a communication_data_type cast), its output slice (+ 1 each).
// Stage 2 on one rank without a cast needs neither: the layers accumulate
// into the partition (except later micro-batches under
// prescale_gradients). Live with the activations (run 76's 8B before
// that, accumulation 4: 5e8-element bf16 buckets, about 7 GB); an
// unresolved accumulation counts as several. 0 at stages 0-1. Pure.
int64_t GradientBucketTransientBytes(const Plan& plan,
                                     const config::Config& config,
                                     int world_size);

// BuildPlan(model, config, world_size).memory: the per-rank model-state
// plan the engine reports at startup and allocates by.
absl::StatusOr<MemoryBreakdown> PlanMemory(nn::LossModel& model,
                                           const config::Config& config,
                                           int world_size);

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_PLAN_H_
