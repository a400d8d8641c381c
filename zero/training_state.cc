#include "zero/training_state.h"

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status.h"

namespace ze {
namespace zero {
namespace {

WarmupType ToZero(config::WarmupType type) {
  return type == config::WarmupType::kLinear ? WarmupType::kLinear
                                             : WarmupType::kLog;
}

absl::Status Named(const config::Config& config, const absl::Status& status,
                   const std::string& path) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(config.source, ": ", path,
                                                  ": ", status.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TrainingState>> TrainingState::Create(
    const config::Config& config, int world_size) {
  std::unique_ptr<TrainingState> state(new TrainingState());
  if (!config.optimizer.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.source,
        ": optimizer: the config names no optimizer; zero-engine needs "
        "optimizer.type (Adam, AdamW or SGD)"));
  }
  const config::OptimizerConfig& optimizer = *config.optimizer;
  OptimizerOptions& options = state->optimizer_options_;
  switch (optimizer.type) {
    case config::OptimizerType::kSgd:
      options.type = OptimizerType::kSgd;
      options.momentum = optimizer.params.momentum;
      break;
    case config::OptimizerType::kAdam:
    case config::OptimizerType::kAdamW:
      options.type = optimizer.DecoupledWeightDecay() ? OptimizerType::kAdamW
                                                      : OptimizerType::kAdam;
      options.beta1 = optimizer.params.betas.value()[0];
      options.beta2 = optimizer.params.betas.value()[1];
      options.eps = optimizer.params.eps.value();
      if (optimizer.params.blockwise_8bit_moments) {
        options.moments = offload::MomentFormat::kBlockwise8;
        // The codes' stochastic rounding (offload/moment_codec.h).
        options.rounding_seed = static_cast<uint64_t>(config.seed);
      } else if (config.bf16.bf16_optimizer_states) {
        options.moments = offload::MomentFormat::kBf16;
        options.stochastic_rounding =
            config.bf16.optimizer_states_stochastic_rounding;
        options.rounding_seed = static_cast<uint64_t>(config.seed);
      }
      break;
  }
  options.weight_decay = optimizer.params.weight_decay.value();
  state->base_learning_rate_ = optimizer.params.lr.value();

  if (config.scheduler.has_value()) {
    const config::SchedulerParams& p = config.scheduler->params;
    absl::StatusOr<std::unique_ptr<LrSchedule>> schedule;
    WarmupLRParams warmup;
    warmup.warmup_min_lr = p.warmup_min_lr.value();
    warmup.warmup_max_lr = p.warmup_max_lr.value();
    warmup.warmup_num_steps = p.warmup_num_steps.value();
    warmup.warmup_type = ToZero(p.warmup_type);
    switch (config.scheduler->type) {
      case config::SchedulerType::kWarmupLR:
        schedule = MakeWarmupLR(warmup);
        break;
      case config::SchedulerType::kWarmupDecayLR: {
        WarmupDecayLRParams decay;
        decay.warmup = warmup;
        decay.total_num_steps = p.total_num_steps.value();
        schedule = MakeWarmupDecayLR(decay);
        break;
      }
      case config::SchedulerType::kWarmupCosineLR: {
        WarmupCosineLRParams cosine;
        cosine.base_lr = state->base_learning_rate_;
        cosine.total_num_steps = p.total_num_steps.value();
        cosine.warmup_min_ratio = p.warmup_min_ratio;
        cosine.warmup_num_steps = p.warmup_num_steps.value();
        cosine.cos_min_ratio = p.cos_min_ratio;
        cosine.warmup_type = ToZero(p.warmup_type);
        schedule = MakeWarmupCosineLR(cosine);
        break;
      }
      case config::SchedulerType::kOneCycle: {
        OneCycleParams cycle;
        cycle.cycle_min_lr = p.cycle_min_lr.value_or(0.0);
        cycle.cycle_max_lr = p.cycle_max_lr.value_or(0.0);
        cycle.decay_lr_rate = p.decay_lr_rate;
        cycle.cycle_first_step_size = p.cycle_first_step_size;
        cycle.cycle_second_step_size = p.cycle_second_step_size;
        cycle.cycle_first_stair_count = p.cycle_first_stair_count;
        cycle.cycle_second_stair_count = p.cycle_second_stair_count;
        cycle.decay_step_size = p.decay_step_size;
        // DeepSpeed cycles momentum only for optimizers with betas.
        cycle.cycle_momentum =
            p.cycle_momentum && options.type != OptimizerType::kSgd;
        cycle.cycle_min_mom = p.cycle_min_mom;
        cycle.cycle_max_mom = p.cycle_max_mom;
        cycle.decay_mom_rate = p.decay_mom_rate;
        schedule = MakeOneCycle(cycle);
        break;
      }
    }
    ZE_RETURN_IF_ERROR(Named(config, schedule.status(), "scheduler.params"));
    state->schedule_ = std::move(schedule).value();
    state->schedule_step_ = p.last_batch_iteration + 1;
  }

  if (config::GetTrainingPrecision(config) ==
      config::TrainingPrecision::kFp16) {
    LossScalerOptions scaler;
    scaler.loss_scale = config.fp16.loss_scale;
    scaler.initial_scale_power =
        static_cast<int>(config.fp16.initial_scale_power);
    scaler.loss_scale_window = config.fp16.loss_scale_window;
    scaler.hysteresis = static_cast<int>(config.fp16.hysteresis);
    scaler.consecutive_hysteresis = config.fp16.consecutive_hysteresis;
    scaler.min_loss_scale = config.fp16.min_loss_scale;
    // Keep skipping at the floor rather than stopping the run; each skip is
    // logged and counted, so a diverged run is visible.
    scaler.raise_error_at_min_scale = false;
    absl::StatusOr<LossScaler> created = LossScaler::Create(scaler);
    ZE_RETURN_IF_ERROR(Named(config, created.status(), "fp16"));
    state->scaler_.emplace(std::move(created).value());
  }
  (void)world_size;
  return state;
}

double TrainingState::learning_rate() const {
  if (schedule_ == nullptr) return base_learning_rate_;
  return schedule_->LearningRate(schedule_step_ - 1);
}

void TrainingState::FillMomentum(StepArgs* args) const {
  if (schedule_ == nullptr) return;
  std::optional<Betas> betas = schedule_->Momentum(schedule_step_ - 1);
  if (!betas.has_value()) return;
  args->beta1 = betas->beta1;
  args->beta2 = betas->beta2;
}

double TrainingState::loss_scale() const {
  return scaler_.has_value() ? scaler_->scale() : 1.0;
}

absl::Status TrainingState::UpdateLossScale(bool overflow, int64_t step) {
  if (!scaler_.has_value()) return absl::OkStatus();
  ZE_ASSIGN_OR_RETURN(ScaleUpdate update, scaler_->Update(overflow));
  if (update.step_skipped) {
    ZE_LOG_RANK0(WARNING) << "step " << step << ": " << update.Message();
  } else if (update.new_scale != update.old_scale) {
    ZE_LOG_RANK0(INFO) << "step " << step << ": " << update.Message();
  }
  return absl::OkStatus();
}

}  // namespace zero
}  // namespace ze
