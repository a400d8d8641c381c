#include "zero/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace ze {
namespace zero {
namespace {

constexpr double kScaleFactor = 2.0;  // DeepSpeed's scale_factor

// DeepSpeed prints scales as int(); scales below 1 print as fractions.
std::string ScaleText(double scale) {
  if (scale >= 1.0 && scale == std::floor(scale) && scale < 9.0e15) {
    return absl::StrCat(static_cast<int64_t>(scale));
  }
  return absl::StrCat(scale);
}

}  // namespace

std::string ScaleUpdate::Message() const {
  if (!overflow) {
    if (new_scale != old_scale) {
      return absl::StrCat("loss scale ", ScaleText(old_scale), " -> ",
                          ScaleText(new_scale));
    }
    return absl::StrCat("loss scale ", ScaleText(new_scale));
  }
  if (new_scale != old_scale || old_hysteresis == new_hysteresis) {
    return absl::StrCat(
        "OVERFLOW! Skipping step. Attempted loss scale: ", ScaleText(old_scale),
        ", reducing to ", ScaleText(new_scale));
  }
  return absl::StrCat(
      "OVERFLOW! Skipping step. Attempted loss scale: ", ScaleText(old_scale),
      ", but hysteresis is ", old_hysteresis, ". Reducing hysteresis to ",
      new_hysteresis);
}

LossScaler::LossScaler(const LossScalerOptions& options) : options_(options) {
  state_.cur_scale = options.loss_scale > 0.0
                         ? options.loss_scale
                         : std::ldexp(1.0, options.initial_scale_power);
  state_.cur_hysteresis = options.hysteresis;
}

absl::StatusOr<LossScaler> LossScaler::Create(
    const LossScalerOptions& options) {
  if (!(options.loss_scale >= 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp16.loss_scale must be >= 0 (0: dynamic), got ", options.loss_scale));
  }
  if (options.initial_scale_power < 0 || options.initial_scale_power > 126) {
    return absl::InvalidArgumentError(
        absl::StrCat("fp16.initial_scale_power must be in [0, 126], got ",
                     options.initial_scale_power));
  }
  if (options.loss_scale_window < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("fp16.loss_scale_window must be >= 1, got ",
                     options.loss_scale_window));
  }
  if (options.hysteresis < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("fp16.hysteresis must be >= 1, got ", options.hysteresis));
  }
  if (!(options.min_loss_scale > 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp16.min_loss_scale must be > 0, got ", options.min_loss_scale));
  }
  return LossScaler(options);
}

absl::StatusOr<ScaleUpdate> LossScaler::Update(bool overflow) {
  ScaleUpdate update;
  update.overflow = overflow;
  update.step_skipped = overflow;
  update.old_scale = state_.cur_scale;
  update.old_hysteresis = state_.cur_hysteresis;
  if (!dynamic()) {
    ++state_.cur_iter;
    update.new_scale = state_.cur_scale;
    update.new_hysteresis = state_.cur_hysteresis;
    return update;
  }

  LossScalerState next = state_;
  if (overflow) {
    if (options_.hysteresis == 1 || next.cur_hysteresis == 1) {
      if (next.cur_scale == options_.min_loss_scale &&
          options_.raise_error_at_min_scale) {
        return absl::FailedPreconditionError(absl::StrCat(
            "fp16 gradient overflow at iteration ", next.cur_iter,
            " with the loss scale already at min_loss_scale ",
            ScaleText(next.cur_scale),
            ": cannot decrease it further; the run cannot continue"));
      }
      next.cur_scale =
          std::max(next.cur_scale / kScaleFactor, options_.min_loss_scale);
    } else {
      --next.cur_hysteresis;
    }
    next.last_overflow_iter = next.cur_iter;
  } else {
    if (options_.consecutive_hysteresis) {
      next.cur_hysteresis = options_.hysteresis;
    }
    if ((next.cur_iter - next.last_overflow_iter) %
            options_.loss_scale_window ==
        0) {
      if (!options_.consecutive_hysteresis) {
        next.cur_hysteresis = options_.hysteresis;
      }
      next.cur_scale *= kScaleFactor;
    }
  }
  ++next.cur_iter;
  state_ = next;
  update.new_scale = state_.cur_scale;
  update.new_hysteresis = state_.cur_hysteresis;
  return update;
}

absl::Status LossScaler::Restore(const LossScalerState& state) {
  if (!(state.cur_scale > 0.0) || !std::isfinite(state.cur_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss scaler state: cur_scale must be positive, got ",
                     state.cur_scale));
  }
  if (dynamic() && (state.cur_hysteresis < 1 ||
                    state.cur_hysteresis > options_.hysteresis)) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss scaler state: cur_hysteresis ", state.cur_hysteresis,
                     " is outside [1, ", options_.hysteresis, "]"));
  }
  if (state.cur_iter < 0 || state.last_overflow_iter >= state.cur_iter) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss scaler state: last_overflow_iter ", state.last_overflow_iter,
        " must be below cur_iter ", state.cur_iter));
  }
  state_ = state;
  return absl::OkStatus();
}

}  // namespace zero
}  // namespace ze
