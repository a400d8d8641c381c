// Validation after each key passed its own checks: the rules spanning
// several keys, and the batch triple; and CheckSupported, the rules across
// keys that say what the engine can run (config.h).
#include "config/validate.h"

#include <initializer_list>
#include <utility>

#include "absl/strings/str_cat.h"
#include "config/sections.h"

namespace ze {
namespace config {
namespace internal {
namespace {

// The batch triple, following DeepSpeed's _configure_train_batch_size: two
// given values determine the third, one given value sets accumulation to 1,
// and the three must satisfy train = micro x accumulation x world size.
void InferBatchTriple(Config* config, Problems& problems) {
  // With a pipeline, the replicas of a stage (DeepSpeed's data-parallel
  // world) take the batch.
  const int64_t world = config->data_parallel_size();
  int64_t train = config->train_batch_size.raw_value();
  int64_t micro = config->train_micro_batch_size_per_gpu.raw_value();
  int64_t accum = config->gradient_accumulation_steps.raw_value();
  auto shown = [](int64_t v) {
    return v > 0 ? absl::StrCat(v) : std::string("not given");
  };
  const std::string given = absl::StrCat(
      " (train_batch_size ", shown(train), ", train_micro_batch_size_per_gpu ",
      shown(micro), ", gradient_accumulation_steps ", shown(accum),
      config->pipeline.stages > 1
          ? absl::StrCat(", data-parallel size ", world, " = world size ",
                         config->world_size, " / pipeline.stages ",
                         config->pipeline.stages)
          : absl::StrCat(", world size ", world),
      ")");

  auto divide = [&](int64_t dividend, int64_t divisor, const std::string& what,
                    const std::string& divisor_text, int64_t* quotient) {
    if (dividend % divisor != 0) {
      problems.Add(absl::StrCat("train_batch_size (", dividend,
                                ") is not divisible by ", divisor_text, " = ",
                                divisor, ", so ", what, " cannot be inferred",
                                given));
      return false;
    }
    *quotient = dividend / divisor;
    return true;
  };

  if (train > 0 && micro > 0 && accum > 0) {
    // All given: checked below.
  } else if (train > 0 && micro > 0) {
    if (!divide(train, micro * world, "gradient_accumulation_steps",
                "train_micro_batch_size_per_gpu x world size", &accum)) {
      return;
    }
  } else if (train > 0 && accum > 0) {
    if (!divide(train, accum * world, "train_micro_batch_size_per_gpu",
                "gradient_accumulation_steps x world size", &micro)) {
      return;
    }
  } else if (micro > 0 && accum > 0) {
    train = micro * accum * world;
  } else if (train > 0) {
    accum = 1;
    if (!divide(train, world, "train_micro_batch_size_per_gpu", "world size",
                &micro)) {
      return;
    }
  } else if (micro > 0) {
    accum = 1;
    train = micro * world;
  } else {
    problems.Add(absl::StrCat(
        "train_batch_size or train_micro_batch_size_per_gpu must be given; "
        "gradient_accumulation_steps alone does not determine the batch",
        given));
    return;
  }
  if (train != micro * accum * world) {
    problems.Add(absl::StrCat(
        "inconsistent batch sizes at train_batch_size: train_batch_size (",
        train, ") must equal train_micro_batch_size_per_gpu (", micro,
        ") x gradient_accumulation_steps (", accum, ") x world size (", world,
        ") = ", micro * accum * world));
    return;
  }
  config->train_batch_size = train;
  config->train_micro_batch_size_per_gpu = micro;
  config->gradient_accumulation_steps = accum;
}

bool IsTrue(const Autoable<bool>& value) {
  return !value.is_auto() && value.raw_value();
}

// Rules spanning several keys, in the same pass as the keys' own checks so
// that a file's problems are all reported at once. A rule whose keys were
// rejected on their own is skipped: it would judge the default kept in their
// place, not what the user wrote. Fills in the batch triple when none of it
// is "auto".
void ValidateAcrossKeys(Config* config, Problems& problems) {
  auto any_bad = [&problems](std::initializer_list<const char*> paths) {
    for (const char* path : paths) {
      if (problems.IsBad(path)) return true;
    }
    return false;
  };
  if (!any_bad({"fp16.enabled", "bf16.enabled", "bfloat16.enabled"}) &&
      IsTrue(config->fp16.enabled) && IsTrue(config->bf16.enabled)) {
    problems.Add(
        "fp16.enabled and bf16.enabled are both true; enable at most one");
  }
  if (!any_bad({"communication_data_type", "fp16.enabled"}) &&
      config->communication_data_type == CommDataType::kFp16 &&
      !config->fp16.enabled.is_auto() && !config->fp16.enabled.raw_value()) {
    // Stricter than DeepSpeed: without fp16's loss scaling and overflow
    // check, gradients outside fp16's range would silently become inf or 0
    // in the reduction (and an inf norm would zero the update).
    problems.Add(
        "communication_data_type \"fp16\" needs fp16.enabled (its loss "
        "scaling keeps the gradients in fp16's range and its overflow check "
        "skips a step that leaves it); use \"bf16\" or \"fp32\"");
  }

  const ZeroConfig& zero = config->zero_optimization;
  const std::string stage = absl::StrCat(zero.stage);
  auto check_nvme_path = [&](OffloadDevice device,
                             const std::optional<std::string>& nvme_path,
                             const std::string& section) {
    if (problems.IsBad(section + ".device") ||
        problems.IsBad(section + ".nvme_path")) {
      return;
    }
    if (device == OffloadDevice::kNvme && !nvme_path) {
      problems.Add(absl::StrCat(section, ".device is \"nvme\" but ", section,
                                ".nvme_path is not set"));
    }
  };
  const std::string offload_optimizer = "zero_optimization.offload_optimizer";
  const std::string offload_param = "zero_optimization.offload_param";
  check_nvme_path(zero.offload_optimizer.device,
                  zero.offload_optimizer.nvme_path, offload_optimizer);
  check_nvme_path(zero.offload_param.device, zero.offload_param.nvme_path,
                  offload_param);
  // Stricter than DeepSpeed, which silently ignores offload at a stage that
  // cannot use it (offload_param below stage 3, any offload at stage 0): the
  // user believes memory is saved that is not.
  const bool stage_bad = problems.IsBad("zero_optimization.stage");
  const bool optimizer_device_bad =
      stage_bad || problems.IsBad(offload_optimizer + ".device");
  const bool param_device_bad =
      stage_bad || problems.IsBad(offload_param + ".device");
  if (!optimizer_device_bad &&
      zero.offload_optimizer.device != OffloadDevice::kNone &&
      zero.stage == 0) {
    problems.Add(absl::StrCat(offload_optimizer,
                              ".device needs zero_optimization.stage 1, 2 or "
                              "3; stage is 0"));
  }
  if (!optimizer_device_bad &&
      zero.offload_optimizer.device == OffloadDevice::kNvme &&
      zero.stage != 3) {
    problems.Add(absl::StrCat(offload_optimizer,
                              ".device \"nvme\" needs zero_optimization.stage "
                              "3 (ZeRO-Infinity); stage is ",
                              stage));
  }
  // "auto" chooses how much of the state the GPU keeps; without a CPU
  // optimizer there is nothing to choose (nvme: the ratio's share goes to
  // the swap file, whose I/O, not the GPU's memory, sets its cost).
  if (!optimizer_device_bad && zero.offload_optimizer.ratio.is_auto() &&
      zero.offload_optimizer.device != OffloadDevice::kCpu) {
    problems.Add(absl::StrCat(offload_optimizer, ".ratio \"auto\" needs ",
                              offload_optimizer, ".device \"cpu\""));
  }
  if (!param_device_bad && zero.offload_param.device != OffloadDevice::kNone &&
      zero.stage != 3) {
    problems.Add(absl::StrCat(offload_param,
                              ".device needs zero_optimization.stage 3; "
                              "stage is ",
                              stage));
  }

  if (!any_bad({"optimizer.params.adam_w_mode"}) && config->optimizer &&
      config->optimizer->type == OptimizerType::kAdamW &&
      !config->optimizer->params.adam_w_mode) {
    problems.Add(
        "optimizer.params.adam_w_mode is false but optimizer.type is AdamW, "
        "which always decouples weight decay; use type Adam for L2 decay");
  }

  if (config->scheduler) {
    const SchedulerParams& p = config->scheduler->params;
    const SchedulerType type = config->scheduler->type;
    const char* type_name = SchedulerTypeName(type);
    if ((type == SchedulerType::kWarmupDecayLR ||
         type == SchedulerType::kWarmupCosineLR) &&
        !any_bad({"scheduler.params.total_num_steps"}) &&
        !p.total_num_steps.is_auto() && p.total_num_steps.raw_value() == 0) {
      problems.Add(
          absl::StrCat("missing required key "
                       "scheduler.params.total_num_steps (",
                       type_name, " decays until that step)"));
    }
    if (type == SchedulerType::kOneCycle) {
      for (const auto& [value, key] :
           {std::make_pair(&p.cycle_min_lr, "cycle_min_lr"),
            std::make_pair(&p.cycle_max_lr, "cycle_max_lr")}) {
        if (!*value &&
            !problems.IsBad(absl::StrCat("scheduler.params.", key))) {
          problems.Add(absl::StrCat("missing required key scheduler.params.",
                                    key,
                                    " (OneCycle needs both ends of the "
                                    "cycle)"));
        }
      }
      if (p.cycle_min_lr && p.cycle_max_lr &&
          *p.cycle_min_lr > *p.cycle_max_lr) {
        problems.Add(absl::StrCat("scheduler.params.cycle_min_lr (",
                                  FormatDouble(*p.cycle_min_lr),
                                  ") exceeds scheduler.params.cycle_max_lr (",
                                  FormatDouble(*p.cycle_max_lr), ")"));
      }
      if (p.cycle_min_mom > p.cycle_max_mom) {
        problems.Add(absl::StrCat("scheduler.params.cycle_min_mom (",
                                  FormatDouble(p.cycle_min_mom),
                                  ") exceeds scheduler.params.cycle_max_mom (",
                                  FormatDouble(p.cycle_max_mom), ")"));
      }
    }
    if ((type == SchedulerType::kWarmupLR ||
         type == SchedulerType::kWarmupDecayLR) &&
        !any_bad({"scheduler.params.warmup_min_lr",
                  "scheduler.params.warmup_max_lr"}) &&
        !p.warmup_min_lr.is_auto() && !p.warmup_max_lr.is_auto() &&
        p.warmup_min_lr.raw_value() > p.warmup_max_lr.raw_value()) {
      problems.Add(absl::StrCat("scheduler.params.warmup_min_lr (",
                                FormatDouble(p.warmup_min_lr.raw_value()),
                                ") exceeds scheduler.params.warmup_max_lr (",
                                FormatDouble(p.warmup_max_lr.raw_value()),
                                ")"));
    }
  }

  const int64_t stages = config->pipeline.stages;
  if (config->world_size % stages != 0) {
    problems.Add(absl::StrCat(
        "pipeline.stages = ", stages, " does not divide the world size ",
        config->world_size,
        ": every stage needs the same number of data-parallel ranks"));
    return;
  }

  // Several stages per rank is what the interleaved schedule is; the
  // others hold one (pipeline/schedule.h BuildSchedule would refuse later,
  // without the keys' names).
  if (!any_bad({"pipeline.schedule", "pipeline.stages_per_rank",
                "pipeline.stages"})) {
    const PipelineConfig& pipe = config->pipeline;
    const bool interleaved =
        pipe.schedule == PipelineSchedule::kInterleavedOneFOneB;
    if (interleaved && pipe.stages_per_rank < 2) {
      problems.Add(absl::StrCat(
          "pipeline.schedule \"interleaved_1f1b\" needs "
          "pipeline.stages_per_rank >= 2 (got ",
          pipe.stages_per_rank, "); use \"1f1b\" for one stage per rank"));
    } else if (!interleaved && pipe.stages_per_rank != 1) {
      problems.Add(
          absl::StrCat("pipeline.stages_per_rank = ", pipe.stages_per_rank,
                       " needs pipeline.schedule \"interleaved_1f1b\""
                       " (the other schedules hold one stage per "
                       "rank)"));
    }
  }

  if (!any_bad({"train_batch_size", "train_micro_batch_size_per_gpu",
                "gradient_accumulation_steps"}) &&
      !config->train_batch_size.is_auto() &&
      !config->train_micro_batch_size_per_gpu.is_auto() &&
      !config->gradient_accumulation_steps.is_auto()) {
    InferBatchTriple(config, problems);
  }
  // Megatron's interleaved order runs the micro-batches in groups of one
  // per pipeline rank.
  const PipelineConfig& pipe = config->pipeline;
  if (!any_bad({"pipeline.schedule", "gradient_accumulation_steps"}) &&
      pipe.schedule == PipelineSchedule::kInterleavedOneFOneB &&
      pipe.stages > 1 && !config->gradient_accumulation_steps.is_auto() &&
      config->gradient_accumulation_steps.raw_value() > 0 &&
      config->gradient_accumulation_steps.raw_value() % pipe.stages != 0) {
    problems.Add(absl::StrCat(
        "pipeline.schedule \"interleaved_1f1b\" needs "
        "gradient_accumulation_steps (the micro-batches, ",
        config->gradient_accumulation_steps.raw_value(),
        ") to be a multiple of pipeline.stages (", pipe.stages, ")"));
  }
}

}  // namespace

absl::StatusOr<Config> ParseAndValidate(const Json& json, int world_size,
                                        absl::string_view source_name) {
  const std::string source(source_name);
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": world size must be at least 1, got ", world_size));
  }
  Config config;
  config.world_size = world_size;
  config.source = source;
  Problems problems(source);
  TopSchema().Parse(json, "", problems, &config);
  ValidateAcrossKeys(&config, problems);
  ZE_RETURN_IF_ERROR(problems.ToStatus());
  config.load_warnings = problems.warnings();
  return config;
}

}  // namespace internal

absl::Status CheckSupported(const Config& config) {
  const ZeroConfig& zero = config.zero_optimization;
  const OffloadOptimizerConfig& offload_optimizer = zero.offload_optimizer;
  const OffloadParamConfig& offload_param = zero.offload_param;
  if (config.checkpoint.load_universal) {
    // DeepSpeed's universal checkpoints are its own offline conversion; our
    // checkpoints load at any world size and stage without one.
    return absl::UnimplementedError(absl::StrCat(
        config.source,
        ": checkpoint.load_universal is not available: zero-engine does not "
        "read DeepSpeed's universal checkpoints (its own checkpoints load at "
        "any world size and stage directly); remove the key"));
  }
  if (config.bf16.master_weights_16_plus_16 &&
      (offload_optimizer.device == OffloadDevice::kNvme ||
       offload_param.device != OffloadDevice::kNone)) {
    return absl::UnimplementedError(absl::StrCat(
        config.source,
        ": bf16.master_weights_16_plus_16 with zero_optimization's "
        "offload_optimizer.device \"nvme\" or offload_param is not "
        "available yet (offload_optimizer.device \"cpu\" is); remove one of "
        "them"));
  }
  // Compressed moments (Adam's m and v in bf16 or 8 bits).
  const bool eight_bit = config.optimizer.has_value() &&
                         config.optimizer->params.blockwise_8bit_moments;
  const char* moments_key = eight_bit
                                ? "optimizer.params.blockwise_8bit_moments"
                                : "bf16.bf16_optimizer_states";
  if (eight_bit && config.bf16.bf16_optimizer_states) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.source,
        ": bf16.bf16_optimizer_states and "
        "optimizer.params.blockwise_8bit_moments each choose how Adam's "
        "moments are stored; keep one"));
  }
  if (config.bf16.optimizer_states_stochastic_rounding &&
      !config.bf16.bf16_optimizer_states) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.source,
        ": bf16.optimizer_states_stochastic_rounding rounds bf16 moments; "
        "it needs bf16.bf16_optimizer_states"));
  }
  if (eight_bit || config.bf16.bf16_optimizer_states) {
    if (config.optimizer.has_value() &&
        config.optimizer->type == OptimizerType::kSgd) {
      return absl::InvalidArgumentError(absl::StrCat(
          config.source, ": ", moments_key,
          " compresses Adam's moments; SGD's momentum buffer stays fp32 "
          "(remove the key or use Adam/AdamW)"));
    }
    if (offload_optimizer.device == OffloadDevice::kNvme) {
      return absl::UnimplementedError(absl::StrCat(
          config.source, ": ", moments_key,
          " with zero_optimization.offload_optimizer.device \"nvme\" is not "
          "available yet (the swap file holds fp32 state; \"cpu\" works)"));
    }
  }
  // ZeRO-Offload's stage 1-2 CPU mode only.
  if (offload_optimizer.delayed_update &&
      (offload_optimizer.device != OffloadDevice::kCpu ||
       offload_optimizer.ratio != Autoable<double>(1.0) ||
       (zero.stage != 1 && zero.stage != 2))) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.source,
        ": zero_optimization.offload_optimizer.delayed_update needs "
        "offload_optimizer.device \"cpu\" with ratio 1 at "
        "zero_optimization.stage 1 or 2 (stage is ",
        zero.stage, ")"));
  }
  return absl::OkStatus();
}

}  // namespace config
}  // namespace ze
