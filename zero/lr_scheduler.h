// Learning-rate schedules with DeepSpeed's formulas, as pure functions of
// the iteration, so resuming from a checkpoint is exact.
//
// Iteration convention (DeepSpeed's `last_batch_iteration`): it starts at
// -1 and the engine advances it after every *applied* optimizer step
// (DeepSpeed does not step the scheduler when fp16 overflow skips a step).
// The learning rate for the next update is therefore
//     LearningRate(applied_steps - 1)
// and a checkpoint stores last_batch_iteration = applied_steps - 1.
//
// Formulas (DeepSpeed deepspeed/runtime/lr_schedules.py), i = iteration,
// W = max(2, warmup_num_steps):
//   warmup gamma(i) = log(i + 1) / log(W)   (log)   or  i / W   (linear)
//   WarmupLR:       i < 0: min_lr; i < W: min + (max - min) gamma(i); else max
//   WarmupDecayLR:  as WarmupLR during warmup, then
//                   min + (max - min) * max(0, (T - i) / max(1, T - W))
//   WarmupCosineLR: lr = base_lr * ratio(i); i < 0: 0;
//                   i < W: warmup_min_ratio + (1 - warmup_min_ratio) gamma(i);
//                   else p = min(1, (i - W + 1) / max(1, T - W)),
//                   max(0, cos_min_ratio + (1 - cos_min_ratio)(1 + cos(pi p)) /
//                   2)
//   OneCycle:       triangle from cycle_min_lr up to cycle_max_lr over
//                   cycle_first_step_size and back over cycle_second_step_size
//                   (optionally in stairs), then min_lr / (1 + decay_lr_rate *
//                   (i - total + 1) / decay_step_size); momentum (Adam beta1)
//                   mirrors it between cycle_max_mom and cycle_min_mom, then
//                   max_mom * (1 + decay_mom_rate * interval); beta2 is 0.99.
#ifndef ZE_ZERO_LR_SCHEDULER_H_
#define ZE_ZERO_LR_SCHEDULER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace ze {
namespace zero {

enum class WarmupType { kLog = 0, kLinear = 1 };

// Parses DeepSpeed's "log" / "linear"; InvalidArgument otherwise.
absl::StatusOr<WarmupType> ParseWarmupType(const std::string& text);

struct WarmupLRParams {
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 0.001;
  int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::kLog;
};

struct WarmupDecayLRParams {
  WarmupLRParams warmup;
  int64_t total_num_steps = 0;  // required
};

struct WarmupCosineLRParams {
  double base_lr = 0.001;       // the optimizer's lr (DeepSpeed: group['lr'])
  int64_t total_num_steps = 0;  // required
  double warmup_min_ratio = 0.0;
  int64_t warmup_num_steps = 1000;
  double cos_min_ratio = 0.0001;
  WarmupType warmup_type = WarmupType::kLog;
};

struct OneCycleParams {
  double cycle_min_lr = 0.0;  // required
  double cycle_max_lr = 0.0;  // required
  double decay_lr_rate = 0.0;
  int64_t cycle_first_step_size = 2000;
  std::optional<int64_t> cycle_second_step_size;  // default: first
  int64_t cycle_first_stair_count = 0;
  std::optional<int64_t> cycle_second_stair_count;  // default: first
  int64_t decay_step_size = 0;
  // Momentum cycling applies to optimizers with betas (Adam, AdamW);
  // DeepSpeed turns it off for SGD, and so should the engine.
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
};

// Adam's (beta1, beta2) for one iteration.
struct Betas {
  double beta1 = 0.9;
  double beta2 = 0.999;
};

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  // The learning rate after `last_batch_iteration` scheduler steps (-1:
  // before the first). Pure: the same iteration always gives the same value.
  virtual double LearningRate(int64_t last_batch_iteration) const = 0;
  // The betas to use, when the schedule cycles momentum (OneCycle); nullopt
  // otherwise.
  virtual std::optional<Betas> Momentum(int64_t last_batch_iteration) const {
    return std::nullopt;
  }
  // "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle".
  virtual const char* name() const = 0;
};

// Each fails with InvalidArgument (naming the parameter) when
// warmup_num_steps < 1, a required total is < 1, a step size < 1, a stair
// count < 0, a negative learning rate or ratio, or decay_step_size < 0.
absl::StatusOr<std::unique_ptr<LrSchedule>> MakeWarmupLR(
    const WarmupLRParams& params);
absl::StatusOr<std::unique_ptr<LrSchedule>> MakeWarmupDecayLR(
    const WarmupDecayLRParams& params);
absl::StatusOr<std::unique_ptr<LrSchedule>> MakeWarmupCosineLR(
    const WarmupCosineLRParams& params);
absl::StatusOr<std::unique_ptr<LrSchedule>> MakeOneCycle(
    const OneCycleParams& params);

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_LR_SCHEDULER_H_
