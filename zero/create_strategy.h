// The factory of the ZeRO strategies (zero/strategy.h), apart from the
// interface so the implementations can depend on the interface alone.
#ifndef ZE_ZERO_CREATE_STRATEGY_H_
#define ZE_ZERO_CREATE_STRATEGY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "zero/strategy.h"

namespace ze {
namespace zero {

// The strategy context.plan's policy asks for: Stages0To2 or Stage3.
// Allocates the model state by the plan (context.plan, non-null),
// initialises it and installs the hooks. ResourceExhausted naming the
// plan's bytes per rank when it does not fit.
absl::StatusOr<std::unique_ptr<ZeroStrategy>> CreateZeroStrategy(
    const StrategyContext& context);

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_CREATE_STRATEGY_H_
