// TrainingState: what the config says about the optimizer, the learning
// rate schedule and the loss scale, turned into the zero/ building blocks
// the engine drives step by step. One per engine; every rank holds the same
// state (it only changes from values all ranks agree on).
#ifndef ZE_ZERO_TRAINING_STATE_H_
#define ZE_ZERO_TRAINING_STATE_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config/config.h"
#include "zero/loss_scaler.h"
#include "zero/lr_scheduler.h"
#include "zero/optimizer.h"

namespace ze {
namespace zero {

class TrainingState {
 public:
  // Maps the config's optimizer (DeepSpeed semantics: "Adam" is AdamW unless
  // adam_w_mode is false), scheduler and fp16 sections. InvalidArgument
  // naming the config key when a value cannot be used (e.g. no optimizer).
  static absl::StatusOr<std::unique_ptr<TrainingState>> Create(
      const config::Config& config, int world_size);

  const OptimizerOptions& optimizer_options() const {
    return optimizer_options_;
  }
  // The learning rate for the next update.
  double learning_rate() const;
  // Momentum overrides for the next update (OneCycle's momentum cycling).
  void FillMomentum(StepArgs* args) const;
  // Called after every update that was not skipped (DeepSpeed steps the
  // schedule only then).
  void AdvanceSchedule() { ++schedule_step_; }
  int64_t schedule_step() const { return schedule_step_; }
  void set_schedule_step(int64_t step) { schedule_step_ = step; }

  // fp16 only: the scale the loss is multiplied by (1 otherwise).
  double loss_scale() const;
  bool checks_overflow() const { return scaler_.has_value(); }
  // Applies DeepSpeed's dynamic loss scaling for one step; logs skips on
  // rank 0 with the old and new scale. `step` is for the log line.
  absl::Status UpdateLossScale(bool overflow, int64_t step);
  LossScaler* scaler() { return scaler_ ? &*scaler_ : nullptr; }

  // Whether the last boundary step's optimizer arguments depended on its
  // statistics: it clipped, or it was skipped for an overflow or a
  // non-finite gradient (RunBoundaryStep records it; false before the
  // first step). Every rank records the same value (the statistics are
  // all-reduced). A hint for when to speculate (WorthBeginningEarly), not
  // training state: checkpoints do not keep it, so a resumed run's first
  // step counts as following an unclipped one.
  bool last_step_needed_statistics() const {
    return last_step_needed_statistics_;
  }
  void set_last_step_needed_statistics(bool needed) {
    last_step_needed_statistics_ = needed;
  }

 private:
  TrainingState() = default;

  OptimizerOptions optimizer_options_;
  double base_learning_rate_ = 0;
  std::unique_ptr<LrSchedule> schedule_;
  std::optional<LossScaler> scaler_;
  int64_t schedule_step_ = 0;
  bool last_step_needed_statistics_ = false;
};

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_TRAINING_STATE_H_
