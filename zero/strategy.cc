#include "zero/strategy.h"

#include "absl/strings/str_cat.h"

namespace ze {
namespace zero {

absl::Status ZeroStrategy::AnnotateAllocationError(
    const absl::Status& status) const {
  return absl::Status(
      status.code(), absl::StrCat("model state does not fit on rank ", rank(),
                                  " (", device().ToString(), "): ZeRO stage ",
                                  config().zero_optimization.stage, " needs ",
                                  memory_.total_bytes(), " bytes per rank (",
                                  memory_.ToString(), "): ", status.message()));
}

absl::Status ZeroStrategy::RequireIdle(const char* what) const {
  if (phase_ == Phase::kIdle) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, " on rank ", rank(), ": not between micro-steps (",
      phase_ == Phase::kBackward ? "inside backward" : "inside an evaluation",
      ")"));
}

}  // namespace zero
}  // namespace ze
