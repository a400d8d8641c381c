#include "zero/create_strategy.h"

#include "zero/plan.h"
#include "zero/stage3.h"
#include "zero/stage_policy.h"
#include "zero/stages_0_to_2.h"

namespace ze {
namespace zero {

absl::StatusOr<std::unique_ptr<ZeroStrategy>> CreateZeroStrategy(
    const StrategyContext& context) {
  if (context.plan->policy.partition_parameters) {
    return Stage3::Create(context);
  }
  return Stages0To2::Create(context);
}

}  // namespace zero
}  // namespace ze
