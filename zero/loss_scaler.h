// fp16 loss scaling, static or dynamic, with DeepSpeed's exact rules.
//
// Dynamic (DeepSpeed's DynamicLossScaler.update_scale), called once per
// optimizer step with whether any rank saw an inf/NaN gradient:
//   overflow:
//     if hysteresis == 1 or the current hysteresis counter is 1:
//       scale = max(scale / 2, min_loss_scale)   (at min_loss_scale already
//       and raise_error_at_min_scale: an error, the run cannot continue)
//     else: counter -= 1, scale kept
//     last_overflow_iter = iter; the step is skipped either way.
//     The counter is NOT restored by halving: it stays 1 until a clean
//     window completes, so later overflows halve at once.
//   clean:
//     if consecutive_hysteresis: counter = hysteresis (every clean step)
//     if (iter - last_overflow_iter) % loss_scale_window == 0:
//       counter = hysteresis (when not consecutive_hysteresis); scale *= 2
//   iter += 1
// The window counts from the last overflow (or from iteration -1 at the
// start), so the first doubling comes after loss_scale_window clean steps.
//
// Static (loss_scale > 0): the scale never changes; an overflow still skips
// the step.
#ifndef ZE_ZERO_LOSS_SCALER_H_
#define ZE_ZERO_LOSS_SCALER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ze {
namespace zero {

// DeepSpeed's fp16 section, with its defaults.
struct LossScalerOptions {
  double loss_scale = 0.0;  // > 0: static scale; 0: dynamic
  int initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
  // DeepSpeed's DynamicLossScaler default: an overflow at min_loss_scale
  // stops the run (Update returns an error) instead of skipping forever.
  bool raise_error_at_min_scale = true;
};

// Everything that changes; a checkpoint saves and restores it.
struct LossScalerState {
  double cur_scale = 1.0;
  int64_t cur_iter = 0;
  int64_t last_overflow_iter = -1;
  int cur_hysteresis = 1;

  friend bool operator==(const LossScalerState& a, const LossScalerState& b) {
    return a.cur_scale == b.cur_scale && a.cur_iter == b.cur_iter &&
           a.last_overflow_iter == b.last_overflow_iter &&
           a.cur_hysteresis == b.cur_hysteresis;
  }
};

// What one Update did, for the engine's log and counters.
struct ScaleUpdate {
  bool overflow = false;
  bool step_skipped = false;  // == overflow
  double old_scale = 1.0;
  double new_scale = 1.0;
  int old_hysteresis = 1;
  int new_hysteresis = 1;

  // For a skipped step, DeepSpeed's wording: "OVERFLOW! Skipping step.
  // Attempted loss scale: 65536, reducing to 32768" (or "..., but hysteresis
  // is 2. Reducing hysteresis to 1"); for a clean step, "loss scale 65536"
  // (plus " -> 131072" when it grew).
  std::string Message() const;
};

class LossScaler {
 public:
  // Fails with InvalidArgument for loss_scale < 0, initial_scale_power
  // outside [0, 126], loss_scale_window < 1, hysteresis < 1 or
  // min_loss_scale <= 0 (the message names the key).
  static absl::StatusOr<LossScaler> Create(const LossScalerOptions& options);

  // The scale to multiply the loss by for the next backward.
  double scale() const { return state_.cur_scale; }
  bool dynamic() const { return options_.loss_scale <= 0.0; }
  const LossScalerOptions& options() const { return options_; }

  // Applies the rules above for one optimizer step. `overflow` must be the
  // same on every rank (the engine reduces the flag first). Fails with
  // FailedPrecondition when an overflow happens at min_loss_scale and
  // raise_error_at_min_scale is set (the state is unchanged then).
  absl::StatusOr<ScaleUpdate> Update(bool overflow);

  LossScalerState state() const { return state_; }
  // Restores a saved state. InvalidArgument when it is impossible
  // (non-positive scale, hysteresis counter outside [1, hysteresis] for a
  // dynamic scaler, last_overflow_iter >= cur_iter).
  absl::Status Restore(const LossScalerState& state);

 private:
  explicit LossScaler(const LossScalerOptions& options);

  LossScalerOptions options_;
  LossScalerState state_;
};

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_LOSS_SCALER_H_
