#include "zero/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace ze {
namespace zero {
namespace {

constexpr double kPi = 3.14159265358979323846;

// A key's lower bound: `value` must be >= `minimum`.
struct Bound {
  const char* key;
  double value;
  double minimum;
};

// InvalidArgument naming the schedule and the first key below its bound.
absl::Status RequireAtLeast(const char* schedule,
                            std::initializer_list<Bound> bounds) {
  for (const Bound& bound : bounds) {
    if (!(bound.value >= bound.minimum)) {
      return absl::InvalidArgumentError(
          absl::StrCat(schedule, ": ", bound.key, " must be >= ", bound.minimum,
                       ", got ", bound.value));
    }
  }
  return absl::OkStatus();
}

double Steps(int64_t steps) { return static_cast<double>(steps); }

// The warmup fraction gamma(i) for 0 <= i < warmup_steps (already max(2,.)).
double WarmupGamma(WarmupType type, int64_t iteration, int64_t warmup_steps) {
  if (type == WarmupType::kLog) {
    return std::log(static_cast<double>(iteration + 1)) /
           std::log(static_cast<double>(warmup_steps));
  }
  return static_cast<double>(iteration) / static_cast<double>(warmup_steps);
}

// DeepSpeed's math.isclose(x, 0) with default tolerances is x == 0.
bool IsZero(double value) { return value == 0.0; }

class WarmupDecaySchedule : public LrSchedule {
 public:
  // total_steps < 0: no decay (WarmupLR).
  WarmupDecaySchedule(const WarmupLRParams& params, int64_t total_steps)
      : params_(params),
        warmup_steps_(std::max<int64_t>(2, params.warmup_num_steps)),
        total_steps_(total_steps) {}

  double LearningRate(int64_t i) const override {
    const double min_lr = params_.warmup_min_lr;
    const double delta = params_.warmup_max_lr - params_.warmup_min_lr;
    if (i < 0) return min_lr;
    double gamma = 1.0;
    if (i < warmup_steps_) {
      gamma = WarmupGamma(params_.warmup_type, i, warmup_steps_);
    } else if (total_steps_ >= 0) {
      gamma = std::max(
          0.0,
          static_cast<double>(total_steps_ - i) /
              std::max(1.0, static_cast<double>(total_steps_ - warmup_steps_)));
    }
    return min_lr + delta * gamma;
  }
  const char* name() const override {
    return total_steps_ >= 0 ? "WarmupDecayLR" : "WarmupLR";
  }

 private:
  WarmupLRParams params_;
  int64_t warmup_steps_;
  int64_t total_steps_;
};

class WarmupCosineSchedule : public LrSchedule {
 public:
  explicit WarmupCosineSchedule(const WarmupCosineLRParams& params)
      : params_(params),
        warmup_steps_(std::max<int64_t>(2, params.warmup_num_steps)) {}

  double LearningRate(int64_t i) const override {
    if (i < 0) return 0.0;  // DeepSpeed: ratio 0 before the first step
    return params_.base_lr * Ratio(i);
  }
  const char* name() const override { return "WarmupCosineLR"; }

 private:
  double Ratio(int64_t i) const {
    if (i < warmup_steps_) {
      const double gamma = WarmupGamma(params_.warmup_type, i, warmup_steps_);
      return params_.warmup_min_ratio +
             gamma * (1.0 - params_.warmup_min_ratio);
    }
    const double real_last_step = static_cast<double>(i - warmup_steps_ + 1);
    const double real_total_steps = std::max<double>(
        1.0, static_cast<double>(params_.total_num_steps - warmup_steps_));
    const double progress = std::min(1.0, real_last_step / real_total_steps);
    const double cosine = (1.0 + std::cos(kPi * progress)) / 2.0;
    return std::max(
        0.0, params_.cos_min_ratio + (1.0 - params_.cos_min_ratio) * cosine);
  }

  WarmupCosineLRParams params_;
  int64_t warmup_steps_;
};

class OneCycleSchedule : public LrSchedule {
 public:
  explicit OneCycleSchedule(const OneCycleParams& params)
      : params_(params),
        first_size_(static_cast<double>(params.cycle_first_step_size)),
        second_size_(static_cast<double>(params.cycle_second_step_size.value_or(
            params.cycle_first_step_size))),
        total_size_(first_size_ + second_size_),
        step_ratio_(first_size_ / total_size_),
        first_stairs_(params.cycle_first_stair_count),
        second_stairs_(params.cycle_second_stair_count.value_or(
            params.cycle_first_stair_count)),
        skip_lr_decay_(IsZero(params.decay_step_size) ||
                       IsZero(params.decay_lr_rate)),
        skip_mom_decay_(IsZero(params.decay_step_size) ||
                        IsZero(params.decay_mom_rate)) {}

  double LearningRate(int64_t i) const override {
    if (static_cast<double>(i) < total_size_) {
      return params_.cycle_min_lr +
             (params_.cycle_max_lr - params_.cycle_min_lr) * ScaleFactor(i);
    }
    if (skip_lr_decay_) return params_.cycle_min_lr;
    return params_.cycle_min_lr /
           (1.0 + params_.decay_lr_rate * DecayInterval(i));
  }

  std::optional<Betas> Momentum(int64_t i) const override {
    if (!params_.cycle_momentum) return std::nullopt;
    Betas betas;
    betas.beta2 = 0.99;  // DeepSpeed's OneCycle fixes beta2
    if (i < 0) {
      // DeepSpeed's constructor installs cycle_min_mom before the first
      // step (the formula would give cycle_max_mom there).
      betas.beta1 = params_.cycle_min_mom;
    } else if (static_cast<double>(i) < total_size_) {
      betas.beta1 =
          params_.cycle_max_mom -
          (params_.cycle_max_mom - params_.cycle_min_mom) * ScaleFactor(i);
    } else if (skip_mom_decay_) {
      betas.beta1 = params_.cycle_max_mom;
    } else {
      betas.beta1 = params_.cycle_max_mom *
                    (1.0 + params_.decay_mom_rate * DecayInterval(i));
    }
    return betas;
  }
  const char* name() const override { return "OneCycle"; }

 private:
  double DecayInterval(int64_t i) const {
    const double decay_iteration = static_cast<double>(i) - total_size_ + 1.0;
    return decay_iteration / static_cast<double>(params_.decay_step_size);
  }

  // Position in the triangle: 0 at the cycle's ends, 1 at its peak.
  double ScaleFactor(int64_t i) const {
    const double batch_iteration = static_cast<double>(i + 1);
    const double cycle = std::floor(1.0 + batch_iteration / total_size_);
    const double x = 1.0 + batch_iteration / total_size_ - cycle;
    double scale;
    int64_t stairs;
    if (x <= step_ratio_) {
      scale = x / step_ratio_;
      stairs = first_stairs_;
    } else {
      scale = (x - 1.0) / (step_ratio_ - 1.0);
      stairs = second_stairs_;
    }
    if (stairs > 0) {
      // Quantise from the integer offset in the cycle, not from `scale`,
      // whose rounding could drop a whole stair at a boundary.
      const double in_cycle = std::fmod(batch_iteration, total_size_);
      const double position =
          in_cycle <= first_size_
              ? in_cycle * static_cast<double>(stairs) / first_size_
              : (total_size_ - in_cycle) * static_cast<double>(stairs) /
                    second_size_;
      scale = std::floor(position) / static_cast<double>(stairs);
    }
    return scale;
  }

  OneCycleParams params_;
  double first_size_;
  double second_size_;
  double total_size_;
  double step_ratio_;
  int64_t first_stairs_;
  int64_t second_stairs_;
  bool skip_lr_decay_;
  bool skip_mom_decay_;
};

}  // namespace

absl::StatusOr<WarmupType> ParseWarmupType(const std::string& text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "log") return WarmupType::kLog;
  if (lower == "linear") return WarmupType::kLinear;
  return absl::InvalidArgumentError(absl::StrCat(
      "warmup_type must be \"log\" or \"linear\", got \"", text, "\""));
}

absl::StatusOr<std::unique_ptr<LrSchedule>> MakeWarmupLR(
    const WarmupLRParams& params) {
  ZE_RETURN_IF_ERROR(RequireAtLeast(
      "WarmupLR", {{"warmup_num_steps", Steps(params.warmup_num_steps), 1},
                   {"warmup_min_lr", params.warmup_min_lr, 0},
                   {"warmup_max_lr", params.warmup_max_lr, 0}}));
  return std::unique_ptr<LrSchedule>(new WarmupDecaySchedule(params, -1));
}

absl::StatusOr<std::unique_ptr<LrSchedule>> MakeWarmupDecayLR(
    const WarmupDecayLRParams& params) {
  const WarmupLRParams& warmup = params.warmup;
  ZE_RETURN_IF_ERROR(RequireAtLeast(
      "WarmupDecayLR", {{"warmup_num_steps", Steps(warmup.warmup_num_steps), 1},
                        {"total_num_steps", Steps(params.total_num_steps), 1},
                        {"warmup_min_lr", warmup.warmup_min_lr, 0},
                        {"warmup_max_lr", warmup.warmup_max_lr, 0}}));
  return std::unique_ptr<LrSchedule>(
      new WarmupDecaySchedule(warmup, params.total_num_steps));
}

absl::StatusOr<std::unique_ptr<LrSchedule>> MakeWarmupCosineLR(
    const WarmupCosineLRParams& params) {
  ZE_RETURN_IF_ERROR(
      RequireAtLeast("WarmupCosineLR",
                     {{"warmup_num_steps", Steps(params.warmup_num_steps), 1},
                      {"total_num_steps", Steps(params.total_num_steps), 1},
                      {"lr", params.base_lr, 0},
                      {"warmup_min_ratio", params.warmup_min_ratio, 0},
                      {"cos_min_ratio", params.cos_min_ratio, 0}}));
  return std::unique_ptr<LrSchedule>(new WarmupCosineSchedule(params));
}

absl::StatusOr<std::unique_ptr<LrSchedule>> MakeOneCycle(
    const OneCycleParams& params) {
  // An absent second phase takes the first's size (and passes).
  ZE_RETURN_IF_ERROR(RequireAtLeast(
      "OneCycle",
      {{"cycle_min_lr", params.cycle_min_lr, 0},
       {"cycle_max_lr", params.cycle_max_lr, 0},
       {"cycle_first_step_size", Steps(params.cycle_first_step_size), 1},
       {"cycle_second_step_size",
        Steps(params.cycle_second_step_size.value_or(1)), 1},
       {"cycle_first_stair_count", Steps(params.cycle_first_stair_count), 0},
       {"cycle_second_stair_count",
        Steps(params.cycle_second_stair_count.value_or(0)), 0},
       {"decay_step_size", Steps(params.decay_step_size), 0},
       {"decay_lr_rate", params.decay_lr_rate, 0},
       {"decay_mom_rate", params.decay_mom_rate, 0}}));
  return std::unique_ptr<LrSchedule>(new OneCycleSchedule(params));
}

}  // namespace zero
}  // namespace ze
