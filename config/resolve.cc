// Resolve(): replaces "auto" values from the model and the run, following
// Hugging Face's DeepSpeed integration, then validates the result again.
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "config/config.h"
#include "config/sections.h"
#include "config/validate.h"

namespace ze {
namespace config {

using internal::Json;
using internal::Problems;

absl::StatusOr<Config> Resolve(const Config& config,
                               const ResolutionContext& context) {
  if (context.world_size != 0 && context.world_size != config.world_size) {
    return absl::FailedPreconditionError(
        absl::StrCat(config.source, ": the config was loaded for world size ",
                     config.world_size, " but Resolve was given world size ",
                     context.world_size));
  }
  Config resolved = config;
  Problems problems(config.source);

  // Replaces an "auto" value from `hint`, or records which hint is missing
  // (and, in `why`, what it stands for when the field name does not say).
  auto fill = [&problems](auto* value, const auto& hint, const char* path,
                          const char* hint_name, const char* why = "") {
    if (!value->is_auto()) return;
    if (hint) {
      *value = *hint;
    } else {
      problems.Add(absl::StrCat(path, " is \"auto\" but ResolutionContext::",
                                hint_name, " was not given", why));
    }
  };

  // An "auto" batch size without a hint is treated as absent and inferred.
  auto batch = [](Autoable<int64_t>* value, std::optional<int64_t> hint) {
    if (value->is_auto()) *value = hint.value_or(0);
  };
  batch(&resolved.train_micro_batch_size_per_gpu,
        context.micro_batch_size_per_gpu);
  batch(&resolved.gradient_accumulation_steps,
        context.gradient_accumulation_steps);
  batch(&resolved.train_batch_size, std::nullopt);
  fill(&resolved.gradient_clipping, context.gradient_clipping,
       "gradient_clipping", "gradient_clipping");

  if (resolved.optimizer) {
    OptimizerParams& p = resolved.optimizer->params;
    fill(&p.lr, context.learning_rate, "optimizer.params.lr", "learning_rate");
    fill(&p.betas, context.betas, "optimizer.params.betas", "betas");
    fill(&p.eps, context.eps, "optimizer.params.eps", "eps");
    fill(&p.weight_decay, context.weight_decay, "optimizer.params.weight_decay",
         "weight_decay");
  }
  if (resolved.scheduler) {
    SchedulerParams& p = resolved.scheduler->params;
    // Hugging Face's rules: the warmup starts from 0 and peaks at the
    // optimizer's learning rate.
    if (p.warmup_min_lr.is_auto()) p.warmup_min_lr = 0.0;
    std::optional<double> peak = context.learning_rate;
    if (!peak && resolved.optimizer &&
        !resolved.optimizer->params.lr.is_auto()) {
      peak = resolved.optimizer->params.lr.raw_value();
    }
    fill(&p.warmup_max_lr, peak, "scheduler.params.warmup_max_lr",
         "learning_rate");
    fill(&p.warmup_num_steps, context.warmup_num_steps,
         "scheduler.params.warmup_num_steps", "warmup_num_steps");
    fill(&p.total_num_steps, context.total_num_steps,
         "scheduler.params.total_num_steps", "total_num_steps");
  }

  std::optional<bool> fp16, bf16;
  if (context.precision) {
    fp16 = *context.precision == TrainingPrecision::kFp16;
    bf16 = *context.precision == TrainingPrecision::kBf16;
  }
  fill(&resolved.fp16.enabled, fp16, "fp16.enabled", "precision");
  fill(&resolved.bf16.enabled, bf16, "bf16.enabled", "precision");

  ZeroConfig& zero = resolved.zero_optimization;
  std::optional<int64_t> square, prefetch, persistence;
  if (context.hidden_size) {
    const int64_t h = *context.hidden_size;
    if (h < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(config.source,
                       ": ResolutionContext::hidden_size must be positive, "
                       "got ",
                       h));
    }
    // Hugging Face's trainer_config_finalize: hidden_size * hidden_size,
    // int(0.9 * hidden_size * hidden_size) (evaluated left to right in
    // floating point, truncated) and 10 * hidden_size.
    square = h * h;
    prefetch = static_cast<int64_t>(0.9 * static_cast<double>(h) *
                                    static_cast<double>(h));
    persistence = 10 * h;
  }
  // accelerate fills it from zero3_save_16bit_model, false unless asked;
  // DeepSpeed itself reads "auto" as its default, false.
  if (zero.stage3_gather_16bit_weights_on_model_save.is_auto()) {
    zero.stage3_gather_16bit_weights_on_model_save = false;
  }
  // Unlike Hugging Face, the stage-3 sizes resolve at every stage (they are
  // unused below stage 3) rather than staying "auto".
  const char* kNeedsHiddenSize =
      ": the model's hidden size is needed (nn::LossModel::hidden_size())";
  fill(&zero.reduce_bucket_size, square, "zero_optimization.reduce_bucket_size",
       "hidden_size", kNeedsHiddenSize);
  fill(&zero.stage3_prefetch_bucket_size, prefetch,
       "zero_optimization.stage3_prefetch_bucket_size", "hidden_size",
       kNeedsHiddenSize);
  fill(&zero.stage3_param_persistence_threshold, persistence,
       "zero_optimization.stage3_param_persistence_threshold", "hidden_size",
       kNeedsHiddenSize);

  fill(&zero.offload_optimizer.ratio, context.offload_optimizer_ratio,
       "zero_optimization.offload_optimizer.ratio", "offload_optimizer_ratio",
       ": engine::Initialize chooses it from ResolutionContext::"
       "activation_bytes (engine::ChooseAutoOffloadRatio)");

  ZE_RETURN_IF_ERROR(problems.ToStatus());

  // Hints are user input too: check them with the same rules as the file by
  // reloading the resolved config, then apply the cross-key rules.
  Json json = internal::TopSchema().Emit(resolved);
  ZE_ASSIGN_OR_RETURN(
      Config reloaded,
      internal::ParseAndValidate(json, resolved.world_size, config.source));
  // ToJson() leaves out what was ignored; its warnings stay the file's.
  reloaded.load_warnings = config.load_warnings;
  return reloaded;
}

}  // namespace config
}  // namespace ze
