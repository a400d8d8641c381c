// What a ZeRO strategy will build for a model and a config, computed
// without allocating anything: the flat layout (which the strategies
// themselves use, so there is one definition of it), where offloaded state
// goes, and the per-rank memory plan; StagePolicy (zero/stage_policy.h)
// says what each stage partitions. The engine's startup plan,
// train_gpt --dry_run and tools/ze_estimate all come from here.
#ifndef ZE_ZERO_PLAN_H_
#define ZE_ZERO_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "nn/loss_model.h"
#include "nn/parameter.h"
#include "zero/flat_layout.h"
#include "zero/memory_estimate.h"
#include "zero/partition_state.h"
#include "zero/stage_policy.h"

namespace ze {
namespace zero {

// What zero_optimization.stage partitions: the one place the stage number
// is read (strategies, the engine and the memory plan ask this).
StagePolicy PolicyOf(const config::Config& config);

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

// The layout of zero_optimization.stage for `model` at `world_size`.
//   Stages 0-2: the trainable parameters in reverse model order (the last
//   layers' gradients are final first in backward), cut into buckets of
//   reduce_bucket_size elements.
//   Stage 3: one bucket of trainable and one of frozen parameters per
//   module, in Modules() order; a parameter goes to the first module that
//   lists it.
// Needs only shapes (parameters may have no storage). InvalidArgument from
// PartitionedLayout::Build.
absl::StatusOr<StageLayout> BuildStageLayout(nn::LossModel& model,
                                             const config::Config& config,
                                             int world_size);

// Where offload_optimizer / offload_param put each bucket's state, for the
// PartitionState (`optimizer_placement`, empty without offload) and for the
// memory plan (`state`).
struct OffloadPlan {
  std::vector<Placement> optimizer_placement;
  StatePlacement state;
};
OffloadPlan PlanOffload(const config::Config& config,
                        const StageLayout& layout);

// The per-rank model-state plan the engine reports at startup and
// allocates by, for `model` under `config` at `world_size` (any: no ranks
// are needed). InvalidArgument for a config whose optimizer cannot be
// built, or from the layout.
absl::StatusOr<MemoryBreakdown> PlanMemory(nn::LossModel& model,
                                           const config::Config& config,
                                           int world_size);

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_PLAN_H_
