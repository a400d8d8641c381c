#include "config/config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ze {
namespace config {
namespace {

// Bazel runs tests from the runfiles root, where //examples/configs's files
// sit at their workspace paths.
constexpr char kExamplesDir[] = "examples/configs";

std::vector<std::string> ExampleConfigPaths() {
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(kExamplesDir)) {
    if (entry.path().extension() == ".json") {
      paths.push_back(entry.path().string());
    }
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

// A context that resolves every "auto" the examples use.
ResolutionContext FullContext() {
  ResolutionContext context;
  context.hidden_size = 768;
  context.micro_batch_size_per_gpu = 4;
  context.gradient_accumulation_steps = 2;
  context.learning_rate = 3e-4;
  context.betas = std::array<double, 2>{0.9, 0.95};
  context.eps = 1e-8;
  context.weight_decay = 0.1;
  context.gradient_clipping = 1.0;
  context.total_num_steps = 1000;
  context.warmup_num_steps = 100;
  context.precision = TrainingPrecision::kBf16;
  return context;
}

Config LoadOrDie(const std::string& json, int world_size = 1) {
  absl::StatusOr<Config> config = LoadConfigString(json, world_size, "t.json");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : Config{};
}

// ------------------------------------------------------------ examples

TEST(ExampleConfigsTest, EveryExampleLoadsAtSeveralWorldSizes) {
  const std::vector<std::string> paths = ExampleConfigPaths();
  // The nine examples the project documents; more may be added.
  ASSERT_GE(paths.size(), 9u);
  for (const std::string& path : paths) {
    for (int world_size : {1, 2, 4}) {
      absl::StatusOr<Config> config = LoadConfigFile(path, world_size);
      ASSERT_TRUE(config.ok())
          << path << " at world size " << world_size << ": " << config.status();
      absl::StatusOr<Config> resolved = Resolve(*config, FullContext());
      ASSERT_TRUE(resolved.ok()) << path << ": " << resolved.status();
      EXPECT_FALSE(resolved->HasUnresolvedAuto()) << path;
      EXPECT_EQ(resolved->train_batch_size.value(),
                resolved->train_micro_batch_size_per_gpu.value() *
                    resolved->gradient_accumulation_steps.value() * world_size)
          << path;
    }
  }
}

TEST(PrecisionTest, MapsToAndFromCoreDTypes) {
  EXPECT_EQ(PrecisionDType(TrainingPrecision::kFp32), DType::kF32);
  EXPECT_EQ(PrecisionDType(TrainingPrecision::kFp16), DType::kF16);
  EXPECT_EQ(PrecisionDType(TrainingPrecision::kBf16), DType::kBF16);
  for (TrainingPrecision precision :
       {TrainingPrecision::kFp32, TrainingPrecision::kFp16,
        TrainingPrecision::kBf16}) {
    EXPECT_EQ(PrecisionOfDType(PrecisionDType(precision)), precision);
  }
  EXPECT_EQ(PrecisionOfDType(DType::kI32), TrainingPrecision::kFp32);
  EXPECT_EQ(CommDataTypeDType(CommDataType::kFp32), DType::kF32);
  EXPECT_EQ(CommDataTypeDType(CommDataType::kFp16), DType::kF16);
  EXPECT_EQ(CommDataTypeDType(CommDataType::kBf16), DType::kBF16);
}

TEST(ExampleConfigsTest, ExamplesMeanWhatTheirNamesSay) {
  auto load = [](const std::string& name) {
    absl::StatusOr<Config> config =
        LoadConfigFile(std::string(kExamplesDir) + "/" + name, 2);
    EXPECT_TRUE(config.ok()) << config.status();
    return config.ok() ? *config : Config{};
  };
  const Config stage0 = load("stage0_f32.json");
  EXPECT_EQ(stage0.zero_optimization.stage, 0);
  EXPECT_EQ(GetTrainingPrecision(stage0), TrainingPrecision::kFp32);

  const Config stage1 = load("stage1_bf16.json");
  EXPECT_EQ(stage1.zero_optimization.stage, 1);
  EXPECT_EQ(GetTrainingPrecision(stage1), TrainingPrecision::kBf16);

  const Config stage2 = load("stage2_fp16.json");
  EXPECT_EQ(stage2.zero_optimization.stage, 2);
  EXPECT_EQ(GetTrainingPrecision(stage2), TrainingPrecision::kFp16);
  EXPECT_EQ(stage2.fp16.loss_scale, 0.0);                       // dynamic
  EXPECT_EQ(stage2.train_micro_batch_size_per_gpu.value(), 8);  // 64 / 4 / 2

  const Config stage3 = load("stage3_bf16.json");
  EXPECT_EQ(stage3.zero_optimization.stage, 3);
  EXPECT_TRUE(stage3.zero_optimization.stage3_gather_16bit_weights_on_model_save
                  .value());
  EXPECT_EQ(stage3.checkpoint.tag_validation, TagValidation::kFail);

  const Config cpu = load("stage3_offload_cpu.json");
  EXPECT_EQ(cpu.zero_optimization.offload_optimizer.device,
            OffloadDevice::kCpu);
  EXPECT_EQ(cpu.zero_optimization.offload_param.device, OffloadDevice::kCpu);

  // Optimizer state on NVMe, parameters in CPU memory.
  const Config nvme = load("stage3_offload_nvme.json");
  EXPECT_EQ(nvme.zero_optimization.offload_optimizer.device,
            OffloadDevice::kNvme);
  EXPECT_EQ(nvme.zero_optimization.offload_optimizer.nvme_path,
            std::optional<std::string>("/local_nvme/zero-engine"));
  EXPECT_EQ(nvme.zero_optimization.offload_optimizer.buffer_count, 4);
  EXPECT_EQ(nvme.zero_optimization.offload_param.device, OffloadDevice::kCpu);

  const Config automatic = load("zero2_auto.json");
  EXPECT_TRUE(automatic.HasUnresolvedAuto());

  const Config cosine = load("warmup_cosine.json");
  ASSERT_TRUE(cosine.scheduler.has_value());
  EXPECT_EQ(cosine.scheduler->type, SchedulerType::kWarmupCosineLR);
  EXPECT_EQ(cosine.scheduler->params.warmup_type, WarmupType::kLinear);

  const Config sgd = load("onecycle_sgd.json");
  ASSERT_TRUE(sgd.optimizer.has_value());
  EXPECT_EQ(sgd.optimizer->type, OptimizerType::kSgd);  // written "sgd"
  EXPECT_EQ(sgd.optimizer->params.momentum, 0.9);
  ASSERT_TRUE(sgd.scheduler.has_value());
  EXPECT_EQ(sgd.scheduler->type, SchedulerType::kOneCycle);
}

// ------------------------------------------------------------ rejection

struct InvalidCase {
  const char* name;
  const char* json;
  int world_size;
  // Every fragment must appear in the error message; the first is the JSON
  // path (or the key) the error must name.
  std::vector<std::string> fragments;
};

class InvalidConfigTest : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(InvalidConfigTest, IsRejectedNamingSourceAndPath) {
  const InvalidCase& c = GetParam();
  absl::StatusOr<Config> config =
      LoadConfigString(c.json, c.world_size, "bad_config.json");
  ASSERT_FALSE(config.ok()) << c.name << " was accepted";
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(config.status().message());
  EXPECT_EQ(message.rfind("bad_config.json: ", 0), 0u) << message;
  for (const std::string& fragment : c.fragments) {
    EXPECT_NE(message.find(fragment), std::string::npos)
        << c.name << ": \"" << fragment << "\" not in:\n"
        << message;
  }
}

#define BATCH "\"train_micro_batch_size_per_gpu\": 1, "

INSTANTIATE_TEST_SUITE_P(
    Table, InvalidConfigTest,
    ::testing::Values(
        InvalidCase{"unknown_top_level_key",
                    R"({"train_micro_batch_size_per_gpu": 1,
                        "gradient_acumulation_steps": 2})",
                    1,
                    {"at gradient_acumulation_steps",
                     "did you mean \"gradient_accumulation_steps\"?"}},
        // At the top level such a key is a warning (DeepSpeed ignores it);
        // inside a section, as in DeepSpeed's pydantic models, an error.
        InvalidCase{"unknown_nested_key_far_from_any",
                    "{" BATCH R"("fp16": {"enabled": true,
                                          "learning_rate": 0.1}})",
                    1,
                    {"unknown key \"learning_rate\" at fp16.learning_rate",
                     "valid keys at fp16", "loss_scale_window"}},
        InvalidCase{"misspelled_nested_key",
                    "{" BATCH R"("zero_optimization": {"stage": 3,
                        "stage3_prefetch_bucket_sise": 1000}})",
                    1,
                    {"zero_optimization.stage3_prefetch_bucket_sise",
                     "did you mean \"stage3_prefetch_bucket_size\"?"}},
        InvalidCase{"misspelled_key_two_levels_down",
                    "{" BATCH R"("zero_optimization": {"stage": 2,
                        "offload_optimizer": {"device": "cpu",
                                              "pin_memroy": true}}})",
                    1,
                    {"zero_optimization.offload_optimizer.pin_memroy",
                     "did you mean \"pin_memory\"?"}},
        InvalidCase{"duplicate_top_level_key",
                    R"({"train_batch_size": 8, "train_batch_size": 16})",
                    1,
                    {"duplicate key \"train_batch_size\" at train_batch_size"}},
        InvalidCase{"duplicate_nested_key",
                    "{" BATCH R"("zero_optimization": {"stage": 1,
                                                        "stage": 2}})",
                    1,
                    {"duplicate key \"stage\" at zero_optimization.stage"}},
        InvalidCase{"string_where_number_belongs",
                    "{" BATCH R"("zero_optimization": {
                        "reduce_bucket_size": "5e8"}})",
                    1,
                    {"at zero_optimization.reduce_bucket_size",
                     "expected an integer", "got string \"5e8\""}},
        InvalidCase{"non_integral_number_for_integer",
                    "{" BATCH R"("zero_optimization": {"stage": 1.5}})",
                    1,
                    {"at zero_optimization.stage", "non-integral number 1.5"}},
        InvalidCase{"boolean_for_integer",
                    "{" BATCH R"("steps_per_print": true})",
                    1,
                    {"at steps_per_print", "got boolean true"}},
        InvalidCase{"stage_4",
                    "{" BATCH R"("zero_optimization": {"stage": 4}})",
                    1,
                    {"zero_optimization.stage must be in [0, 3], got 4"}},
        InvalidCase{"stage_negative",
                    "{" BATCH R"("zero_optimization": {"stage": -1}})",
                    1,
                    {"zero_optimization.stage must be in [0, 3], got -1"}},
        InvalidCase{"fp16_and_bf16",
                    "{" BATCH R"("fp16": {"enabled": true},
                                  "bf16": {"enabled": true}})",
                    1,
                    {"fp16.enabled and bf16.enabled are both true"}},
        InvalidCase{"fp16_communication_without_fp16_training",
                    "{" BATCH R"("bf16": {"enabled": true},
                                  "communication_data_type": "fp16"})",
                    1,
                    {"communication_data_type \"fp16\" needs fp16.enabled"}},
        InvalidCase{"bf16_and_legacy_alias_both_given",
                    "{" BATCH R"("bf16": {"enabled": true},
                                  "bfloat16": {"enabled": true}})",
                    1,
                    {"\"bf16\" and \"bfloat16\"", "alias"}},
        InvalidCase{
            "batch_33_17_2_at_world_size_2",
            R"({"train_batch_size": 33,
                        "train_micro_batch_size_per_gpu": 17,
                        "gradient_accumulation_steps": 2})",
            2,
            {"train_batch_size (33)", "train_micro_batch_size_per_gpu (17)",
             "gradient_accumulation_steps (2)", "world size (2)", "= 68"}},
        InvalidCase{"batch_not_divisible_for_inference",
                    R"({"train_batch_size": 33,
                        "train_micro_batch_size_per_gpu": 4})",
                    2,
                    {"train_batch_size (33) is not divisible",
                     "train_micro_batch_size_per_gpu 4", "world size 2",
                     "gradient_accumulation_steps cannot be inferred"}},
        InvalidCase{"no_batch_size_at_all",
                    R"({"gradient_accumulation_steps": 4})",
                    1,
                    {"train_batch_size or train_micro_batch_size_per_gpu must "
                     "be given"}},
        InvalidCase{"zero_batch_size",
                    R"({"train_micro_batch_size_per_gpu": 0})",
                    1,
                    {"train_micro_batch_size_per_gpu must be in [1,"}},
        InvalidCase{"missing_optimizer_type",
                    "{" BATCH R"("optimizer": {"params": {"lr": 0.1}}})",
                    1,
                    {"missing required key optimizer.type", "\"AdamW\""}},
        InvalidCase{"unsupported_optimizer_type",
                    "{" BATCH R"("optimizer": {"type": "Lamb"}})",
                    1,
                    {"optimizer.type is \"Lamb\"", "does not implement"}},
        InvalidCase{"unknown_optimizer_type",
                    "{" BATCH R"("optimizer": {"type": "Adamm"}})",
                    1,
                    {"at optimizer.type", "did you mean \"Adam\"?"}},
        InvalidCase{"negative_learning_rate",
                    "{" BATCH R"("optimizer": {"type": "AdamW",
                                               "params": {"lr": -0.1}}})",
                    1,
                    {"optimizer.params.lr must be >= 0.0, got -0.1"}},
        InvalidCase{"beta_not_below_one",
                    "{" BATCH R"("optimizer": {"type": "Adam",
                        "params": {"betas": [0.9, 1.0]}}})",
                    1,
                    {"optimizer.params.betas[1] must be in [0.0, 1.0)"}},
        InvalidCase{"betas_not_a_pair",
                    "{" BATCH R"("optimizer": {"type": "Adam",
                        "params": {"betas": 0.9}}})",
                    1,
                    {"at optimizer.params.betas", "an array of two numbers"}},
        InvalidCase{"momentum_is_not_an_adam_param",
                    "{" BATCH R"("optimizer": {"type": "AdamW",
                        "params": {"momentum": 0.9}}})",
                    1,
                    {"unknown key \"momentum\" at optimizer.params.momentum"}},
        InvalidCase{"adamw_without_adam_w_mode",
                    "{" BATCH R"("optimizer": {"type": "AdamW",
                        "params": {"adam_w_mode": false}}})",
                    1,
                    {"optimizer.params.adam_w_mode"}},
        InvalidCase{"auto_where_not_accepted",
                    "{" BATCH R"("optimizer": {"type": "SGD",
                        "params": {"momentum": "auto"}}})",
                    1,
                    {"\"auto\" is not accepted at optimizer.params.momentum"}},
        InvalidCase{"negative_bucket_size",
                    "{" BATCH R"("zero_optimization": {
                        "allgather_bucket_size": -1}})",
                    1,
                    {"zero_optimization.allgather_bucket_size must be >= 1, "
                     "got -1"}},
        InvalidCase{"bad_scheduler_type",
                    "{" BATCH R"("scheduler": {"type": "WarmupCosine"}})",
                    1,
                    {"at scheduler.type", "did you mean \"WarmupCosineLR\"?"}},
        InvalidCase{"scheduler_type_is_case_sensitive",
                    "{" BATCH R"("scheduler": {"type": "warmuplr"}})",
                    1,
                    {"at scheduler.type", "did you mean \"WarmupLR\"?"}},
        InvalidCase{
            "unsupported_scheduler_type",
            "{" BATCH R"("scheduler": {"type": "LRRangeTest"}})",
            1,
            {"scheduler.type is \"LRRangeTest\"", "does not implement"}},
        InvalidCase{"scheduler_param_of_another_type",
                    "{" BATCH R"("scheduler": {"type": "WarmupLR",
                        "params": {"cos_min_ratio": 0.1}}})",
                    1,
                    {"at scheduler.params.cos_min_ratio"}},
        InvalidCase{"warmup_decay_without_total_steps",
                    "{" BATCH R"("scheduler": {"type": "WarmupDecayLR",
                        "params": {"warmup_num_steps": 10}}})",
                    1,
                    {"scheduler.params.total_num_steps"}},
        InvalidCase{"one_cycle_without_max_lr",
                    "{" BATCH R"("scheduler": {"type": "OneCycle",
                        "params": {"cycle_min_lr": 0.01}}})",
                    1,
                    {"scheduler.params.cycle_max_lr"}},
        InvalidCase{"unknown_key_in_scheduler_section",
                    "{" BATCH R"("scheduler": {"type": "WarmupLR",
                                                "parmas": {}}})",
                    1,
                    {"at scheduler.parmas", "did you mean \"params\"?"}},
        InvalidCase{"bad_offload_device",
                    "{" BATCH R"("zero_optimization": {"stage": 3,
                        "offload_param": {"device": "gpu"}}})",
                    1,
                    {"at zero_optimization.offload_param.device",
                     "\"none\", \"cpu\", \"nvme\""}},
        InvalidCase{"nvme_offload_without_path",
                    "{" BATCH R"("zero_optimization": {"stage": 3,
                        "offload_optimizer": {"device": "nvme"}}})",
                    1,
                    {"zero_optimization.offload_optimizer.nvme_path"}},
        InvalidCase{"param_offload_below_stage_3",
                    "{" BATCH R"("zero_optimization": {"stage": 2,
                        "offload_param": {"device": "cpu"}}})",
                    1,
                    {"zero_optimization.offload_param.device", "stage 3"}},
        InvalidCase{"offload_ratio_out_of_range",
                    "{" BATCH R"("zero_optimization": {"stage": 2,
                        "offload_optimizer": {"device": "cpu",
                                              "ratio": 1.5}}})",
                    1,
                    {"zero_optimization.offload_optimizer.ratio must be in"}},
        InvalidCase{"section_deepspeed_removed",
                    "{" BATCH R"("amp": {"enabled": true}})",
                    1,
                    {"\"amp\" at amp is not supported", "0.19.8 rejects"}},
        InvalidCase{
            "mics_deepspeed_removed",
            "{" BATCH R"("zero_optimization": {"stage": 3,
                                                        "mics_shard_size": 4}})",
            1,
            {"zero_optimization.mics_shard_size is not supported", "MiCS"}},
        InvalidCase{"deprecated_key_with_its_replacement",
                    "{" BATCH R"("zero_optimization": {"stage": 2,
                        "cpu_offload": false,
                        "offload_optimizer": {"device": "cpu"}}})",
                    1,
                    {"zero_optimization.cpu_offload (deprecated) and "
                     "zero_optimization.offload_optimizer are given"}},
        InvalidCase{"alias_and_canonical_spelling_together",
                    "{" BATCH R"("zero_optimization": {"stage": 3,
                        "max_live_parameters": 5,
                        "stage3_max_live_parameters": 7}})",
                    1,
                    {"both \"max_live_parameters\" and "
                     "\"stage3_max_live_parameters\" are given at "
                     "zero_optimization"}},
        InvalidCase{"min_loss_scale_not_an_integer",
                    "{" BATCH R"("fp16": {"enabled": true,
                                          "min_loss_scale": 1e-10}})",
                    1,
                    {"at fp16.min_loss_scale", "non-integral"}},
        InvalidCase{"bf16_has_no_loss_scaling_keys",
                    "{" BATCH R"("bf16": {"enabled": true, "loss_scale": 0}})",
                    1,
                    {"unknown key \"loss_scale\" at bf16.loss_scale"}},
        InvalidCase{"typo_of_an_ignored_top_level_key",
                    "{" BATCH R"("zero_allow_untested_optimiser": true})",
                    1,
                    {"zero_allow_untested_optimiser",
                     "did you mean "
                     "\"zero_allow_untested_optimizer\"?"}},
        InvalidCase{"typo_of_a_top_level_key",
                    "{" BATCH R"("zero_optimisation": {"stage": 1}})",
                    1,
                    {"unknown key \"zero_optimisation\"",
                     "did you mean \"zero_optimization\"?"}},
        InvalidCase{"ignored_key_of_the_wrong_type",
                    "{" BATCH R"("zero_allow_untested_optimizer": "yes"})",
                    1,
                    {"zero_allow_untested_optimizer", "expected a boolean"}},
        InvalidCase{
            "number_overflows_a_double",
            "{" BATCH R"("zero_optimization": {"stage": 2,
                        "reduce_bucket_size": 1e999}})",
            1,
            {"zero_optimization.reduce_bucket_size", "out of range", "1e999"}},
        InvalidCase{"key_and_cross_key_problems_in_one_pass",
                    "{" BATCH R"("steps_per_print": 0,
                        "zero_optimization": {"stage": 2,
                            "offload_param": {"device": "cpu"}}})",
                    1,
                    {"steps_per_print must be >= 1",
                     "zero_optimization.offload_param.device needs "
                     "zero_optimization.stage 3"}},
        InvalidCase{"section_not_an_object",
                    "{" BATCH R"("fp16": true})",
                    1,
                    {"expected an object at fp16, got boolean true"}},
        InvalidCase{"top_level_not_an_object",
                    "[1, 2]",
                    1,
                    {"expected an object at the top level, got an array"}},
        InvalidCase{"malformed_json",
                    "{\"train_batch_size\": 8,}",
                    1,
                    {"invalid JSON", "line 1"}},
        InvalidCase{"tag_validation_unknown",
                    "{" BATCH
                    R"("checkpoint": {"tag_validation": "Sometimes"}})",
                    1,
                    {"at checkpoint.tag_validation"}},
        InvalidCase{"every_problem_reported_at_once",
                    "{" BATCH R"("steps_per_print": 0,
                                  "zero_optimization": {"stage": 9}})",
                    1,
                    {"steps_per_print must be >= 1",
                     "zero_optimization.stage must be in [0, 3]"}}),
    [](const ::testing::TestParamInfo<InvalidCase>& info) {
      return std::string(info.param.name);
    });

TEST(LoadConfigTest, MissingFileIsNotFoundAndNamesThePath) {
  absl::StatusOr<Config> config =
      LoadConfigFile("/nonexistent/ds_config.json", 1);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(config.status().message().find("/nonexistent/ds_config.json"),
            absl::string_view::npos);
}

TEST(LoadConfigTest, DirectoryIsAnErrorThatSaysSo) {
  const std::string dir = ::testing::TempDir();
  absl::StatusOr<Config> config = LoadConfigFile(dir, 1);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(config.status().message(),
                                absl::StrCat(dir, ": is a directory")))
      << config.status();
}

TEST(LoadConfigTest, NumberOverflowingADoubleNamesFileAndKey) {
  // nlohmann's parser throws out_of_range for 1e999, which escaped the
  // loader and aborted the process.
  const std::string path = absl::StrCat(::testing::TempDir(), "/overflow.json");
  {
    std::ofstream file(path);
    file << R"({"train_batch_size": 8, "gradient_clipping": [1, -1e999]})";
  }
  absl::StatusOr<Config> config = LoadConfigFile(path, 1);
  ASSERT_FALSE(config.ok());
  EXPECT_TRUE(absl::StrContains(
      config.status().message(),
      absl::StrCat(path, ": number out of range at gradient_clipping[1]")))
      << config.status();
}

// ------------------------------------------------- DeepSpeed compatibility

std::vector<std::string> WarningKeys(const Config& config) {
  std::vector<std::string> keys;
  for (const ConfigWarning& warning : ConfigWarnings(config)) {
    keys.push_back(warning.key);
  }
  return keys;
}

TEST(CompatibilityTest, KeysDeepSpeedReadsButZeroEngineLacksAreWarnings) {
  const Config c = LoadOrDie(R"({"train_batch_size": 8,
      "zero_allow_untested_optimizer": true,
      "zero_force_ds_cpu_optimizer": true,
      "flops_profiler": {"enabled": false, "profile_step": 1},
      "tensorboard": {"enabled": true, "output_path": "tb/"},
      "data_types": {"grad_accum_dtype": "fp32"},
      "optimizer": {"type": "Adam", "params": {"lr": 1e-3,
                                                "max_grad_norm": 1.0}},
      "bf16": {"enabled": true, "immediate_grad_update": true},
      "zero_optimization": {"stage": 3, "compute_grad_norm": true,
                            "leaf_module": {"classes": []}},
      "log": {"steps_per_print": 50}})");
  // Keys at the value that does nothing (zero_force_ds_cpu_optimizer's
  // default true, a disabled flops_profiler, compute_grad_norm true) are
  // silent; the rest name the key and why, in file order.
  EXPECT_EQ(WarningKeys(c),
            (std::vector<std::string>{
                "zero_allow_untested_optimizer", "tensorboard", "data_types",
                "optimizer.params.max_grad_norm", "bf16.immediate_grad_update",
                "zero_optimization.leaf_module", "log"}));
  const std::vector<ConfigWarning> warnings = ConfigWarnings(c);
  for (const ConfigWarning& warning : warnings) {
    EXPECT_TRUE(absl::StartsWith(warning.message, "is ignored: "))
        << warning.key << " " << warning.message;
  }
  EXPECT_TRUE(absl::StrContains(warnings[1].message, "csv_monitor"));
  EXPECT_TRUE(absl::StrContains(warnings[3].message, "gradient_clipping"));
  EXPECT_TRUE(absl::StrContains(warnings.back().message,
                                "DeepSpeed ignores unknown top-level keys"));
  // The warnings survive Resolve (ToJson leaves ignored keys out).
  ResolutionContext context = FullContext();
  context.world_size = 1;
  absl::StatusOr<Config> resolved = Resolve(c, context);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->load_warnings, c.load_warnings);
}

TEST(CompatibilityTest, SectionsDeepSpeedReadsFromADictWarnOnUnknownKeys) {
  // DeepSpeed reads aio, activation_checkpointing and checkpoint with
  // dict.get and ignores other keys; a near miss is still an error.
  const Config c = LoadOrDie(R"({"train_batch_size": 8,
      "aio": {"intra_op_parallelism": 4, "use_gds": false, "extra": 1},
      "checkpoint": {"writer": {"type": "fast"}}})");
  EXPECT_EQ(c.aio.thread_count, 4);  // DeepSpeed 0.19.8's name for it
  EXPECT_EQ(WarningKeys(c),
            (std::vector<std::string>{"aio.extra", "checkpoint.writer"}));
  EXPECT_TRUE(absl::StrContains(ConfigWarnings(c)[0].message,
                                "DeepSpeed ignores unknown keys in aio"));
  absl::StatusOr<Config> typo = LoadConfigString(
      R"({"train_batch_size": 8, "checkpoint": {"tag_validaton": "Warn"}})", 1,
      "t.json");
  ASSERT_FALSE(typo.ok());
  EXPECT_TRUE(absl::StrContains(typo.status().message(),
                                "did you mean \"tag_validation\"?"))
      << typo.status();
}

TEST(CompatibilityTest, DeepSpeedFieldNamesAreAliasesOfTheStage3Spellings) {
  const Config c = LoadOrDie(R"({"train_batch_size": 8,
      "zero_optimization": {"stage": 3, "prefetch_bucket_size": 1,
          "param_persistence_threshold": 2, "model_persistence_threshold": 3,
          "max_live_parameters": 4, "max_reuse_distance": 5,
          "gather_16bit_weights_on_model_save": true}})");
  const ZeroConfig& z = c.zero_optimization;
  EXPECT_EQ(z.stage3_prefetch_bucket_size.value(), 1);
  EXPECT_EQ(z.stage3_param_persistence_threshold.value(), 2);
  EXPECT_EQ(z.stage3_model_persistence_threshold, 3);
  EXPECT_EQ(z.stage3_max_live_parameters, 4);
  EXPECT_EQ(z.stage3_max_reuse_distance, 5);
  EXPECT_TRUE(z.stage3_gather_16bit_weights_on_model_save.value());
  EXPECT_TRUE(ConfigWarnings(c).empty());  // aliases are not deprecated
}

TEST(CompatibilityTest, DeprecatedKeysAreReadAsDeepSpeedReadsThemAndWarn) {
  const Config c = LoadOrDie(R"({"train_batch_size": 8,
      "zero_optimization": {"stage": 2, "cpu_offload": true,
          "stage3_gather_fp16_weights_on_model_save": true}})");
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_TRUE(
      c.zero_optimization.stage3_gather_16bit_weights_on_model_save.value());
  const std::vector<ConfigWarning> warnings = ConfigWarnings(c);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_EQ(warnings[0].key, "zero_optimization.cpu_offload");
  EXPECT_TRUE(absl::StrContains(
      warnings[0].message,
      "is deprecated by DeepSpeed (which still reads it); true is read as "
      "zero_optimization.offload_optimizer.device \"cpu\""))
      << warnings[0].message;
  EXPECT_EQ(warnings[1].key,
            "zero_optimization.stage3_gather_fp16_weights_on_model_save");
  // ToJson prints the replacement, which reloads to the same config.
  const Config reloaded = LoadOrDie(ToJson(c));
  EXPECT_EQ(reloaded, c);
  EXPECT_TRUE(ConfigWarnings(reloaded).empty());
  // cpu_offload false changes nothing, as in DeepSpeed.
  EXPECT_EQ(LoadOrDie(R"({"train_batch_size": 8, "zero_optimization":
                {"stage": 2, "cpu_offload": false}})")
                .zero_optimization.offload_optimizer.device,
            OffloadDevice::kNone);
}

TEST(CompatibilityTest, AutoGather16BitWeightsResolvesToFalse) {
  // accelerate's ZeRO-3 template; accelerate fills it from
  // zero3_save_16bit_model, false by default.
  const Config c = LoadOrDie(R"({"train_batch_size": 8,
      "zero_optimization": {"stage": 3,
          "stage3_gather_16bit_weights_on_model_save": "auto"}})");
  EXPECT_EQ(
      c.UnresolvedAutoPaths(),
      (std::vector<std::string>{
          "zero_optimization.stage3_gather_16bit_weights_on_model_save"}));
  absl::StatusOr<Config> resolved = Resolve(c, ResolutionContext{});
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_FALSE(resolved->zero_optimization
                   .stage3_gather_16bit_weights_on_model_save.value());
}

TEST(LoadConfigTest, RejectsNonPositiveWorldSize) {
  EXPECT_FALSE(LoadConfigString(R"({"train_batch_size": 8})", 0).ok());
}

TEST(LoadConfigTest, LoadConfigJsonAcceptsAParsedObjectAndNamesItsSource) {
  nlohmann::json json = {{"train_micro_batch_size_per_gpu", 2},
                         {"zero_optimization", {{"stage", 2}}}};
  absl::StatusOr<Config> config = LoadConfigJson(json, 4, "from_code");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->train_batch_size.value(), 8);
  EXPECT_EQ(config->zero_optimization.stage, 2);

  json["zero_optimization"]["stag"] = 1;
  config = LoadConfigJson(json, 4, "from_code");
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("from_code: unknown key \"stag\" at "
                                           "zero_optimization.stag"),
            absl::string_view::npos)
      << config.status();
}

// ------------------------------------------------------------ defaults

TEST(DefaultsTest, MatchDeepSpeedDocumentedDefaults) {
  const Config c = LoadOrDie(R"({"train_micro_batch_size_per_gpu": 1})");
  // Top level.
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_EQ(c.gradient_clipping.value(), 0.0);
  EXPECT_FALSE(c.prescale_gradients);
  EXPECT_EQ(c.gradient_predivide_factor, 1.0);
  EXPECT_FALSE(c.communication_data_type.has_value());
  EXPECT_FALSE(c.wall_clock_breakdown);
  EXPECT_FALSE(c.memory_breakdown);
  EXPECT_EQ(c.seed, 42);  // zero-engine extension
  EXPECT_FALSE(c.optimizer.has_value());
  EXPECT_FALSE(c.scheduler.has_value());
  // fp16 / bf16.
  EXPECT_FALSE(c.fp16.enabled.value());
  EXPECT_FALSE(c.bf16.enabled.value());
  EXPECT_EQ(c.fp16.loss_scale, 0.0);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_FALSE(c.fp16.consecutive_hysteresis);
  EXPECT_EQ(c.fp16.min_loss_scale, 1);
  // ZeRO.
  const ZeroConfig& z = c.zero_optimization;
  EXPECT_EQ(z.stage, 0);
  EXPECT_TRUE(z.contiguous_gradients);
  EXPECT_FALSE(z.overlap_comm);
  EXPECT_TRUE(z.reduce_scatter);
  EXPECT_EQ(z.reduce_bucket_size.value(), 500'000'000);
  EXPECT_TRUE(z.allgather_partitions);
  EXPECT_EQ(z.allgather_bucket_size, 500'000'000);
  EXPECT_TRUE(z.load_from_fp32_weights);
  EXPECT_EQ(z.stage3_prefetch_bucket_size.value(), 50'000'000);
  EXPECT_EQ(z.stage3_param_persistence_threshold.value(), 100'000);
  EXPECT_EQ(z.stage3_max_live_parameters, 1'000'000'000);
  EXPECT_EQ(z.stage3_max_reuse_distance, 1'000'000'000);
  EXPECT_FALSE(z.stage3_gather_16bit_weights_on_model_save.value());
  EXPECT_EQ(z.sub_group_size, 1'000'000'000);
  EXPECT_EQ(z.zero_hpz_partition_size, 1);
  EXPECT_EQ(z.offload_optimizer.device, OffloadDevice::kNone);
  EXPECT_EQ(z.offload_optimizer.buffer_count, 4);
  EXPECT_EQ(z.offload_optimizer.ratio, 1.0);
  EXPECT_EQ(z.offload_param.buffer_count, 5);
  EXPECT_EQ(z.offload_param.buffer_size, 100'000'000);
  EXPECT_EQ(z.offload_param.max_in_cpu, 1'000'000'000);
  // aio, checkpoint, monitor.
  EXPECT_EQ(c.aio.block_size, 1'048'576);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_EQ(c.aio.thread_count, 1);
  EXPECT_FALSE(c.aio.single_submit);
  EXPECT_TRUE(c.aio.overlap_events);
  EXPECT_EQ(c.checkpoint.tag_validation, TagValidation::kWarn);
  EXPECT_FALSE(c.activation_checkpointing.partition_activations);
  EXPECT_FALSE(c.activation_checkpointing.number_checkpoints.has_value());
  EXPECT_FALSE(c.csv_monitor.enabled);
  EXPECT_EQ(c.csv_monitor.job_name, "DeepSpeedJobName");
}

TEST(DefaultsTest, OptimizerAndSchedulerDefaults) {
  const Config c = LoadOrDie(R"({"train_micro_batch_size_per_gpu": 1,
      "optimizer": {"type": "adam"},
      "scheduler": {"type": "WarmupCosineLR",
                    "params": {"total_num_steps": 100}}})");
  ASSERT_TRUE(c.optimizer && c.scheduler);
  const OptimizerParams& o = c.optimizer->params;
  EXPECT_EQ(c.optimizer->type, OptimizerType::kAdam);
  EXPECT_EQ(o.lr.value(), 1e-3);
  EXPECT_EQ(o.betas.value()[0], 0.9);
  EXPECT_EQ(o.betas.value()[1], 0.999);
  EXPECT_EQ(o.eps.value(), 1e-8);
  EXPECT_EQ(o.weight_decay.value(), 0.0);
  // DeepSpeed's Adam decouples weight decay unless adam_w_mode is false.
  EXPECT_TRUE(c.optimizer->DecoupledWeightDecay());
  const SchedulerParams& s = c.scheduler->params;
  EXPECT_EQ(s.warmup_num_steps.value(), 1000);
  EXPECT_EQ(s.warmup_type, WarmupType::kLog);
  EXPECT_EQ(s.warmup_min_ratio, 0.0);
  EXPECT_EQ(s.cos_min_ratio, 0.0001);
  EXPECT_EQ(s.last_batch_iteration, -1);

  const Config cycle = LoadOrDie(R"({"train_micro_batch_size_per_gpu": 1,
      "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.01,
          "cycle_max_lr": 0.1, "cycle_first_step_size": 300,
          "cycle_first_stair_count": 3}}})");
  const SchedulerParams& p = cycle.scheduler->params;
  EXPECT_EQ(p.cycle_second_step_size, 300);  // mirrors the first half
  EXPECT_EQ(p.cycle_second_stair_count, 3);
  EXPECT_TRUE(p.cycle_momentum);
  EXPECT_EQ(p.cycle_min_mom, 0.8);
  EXPECT_EQ(p.cycle_max_mom, 0.9);
  EXPECT_EQ(p.decay_step_size, 0);
}

TEST(DefaultsTest, OverlapCommDefaultsToTrueOnlyForStage3) {
  for (int stage = 0; stage <= 3; ++stage) {
    const Config c = LoadOrDie(absl::StrCat(
        R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": )",
        R"({"stage": )", stage, "}}"));
    EXPECT_EQ(c.zero_optimization.overlap_comm, stage == 3) << stage;
  }
  const Config explicit_off = LoadOrDie(R"({"train_micro_batch_size_per_gpu": 1,
      "zero_optimization": {"stage": 3, "overlap_comm": false}})");
  EXPECT_FALSE(explicit_off.zero_optimization.overlap_comm);
}

TEST(ParsingTest, IntegralFloatsAreIntegersAndNamesAreCaseInsensitive) {
  const Config c = LoadOrDie(R"({"train_micro_batch_size_per_gpu": 2e0,
      "optimizer": {"type": "ADAMW"},
      "checkpoint": {"tag_validation": "fail"},
      "zero_optimization": {"reduce_bucket_size": 5e8,
                            "stage3_gather_fp16_weights_on_model_save": true},
      "bfloat16": {"enabled": true},
      "communication_data_type": "bfp16"})");
  EXPECT_EQ(c.train_micro_batch_size_per_gpu.value(), 2);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size.value(), 500'000'000);
  EXPECT_EQ(c.optimizer->type, OptimizerType::kAdamW);
  EXPECT_EQ(c.checkpoint.tag_validation, TagValidation::kFail);
  // Aliases land on the canonical fields and print under canonical names.
  EXPECT_TRUE(
      c.zero_optimization.stage3_gather_16bit_weights_on_model_save.value());
  EXPECT_TRUE(c.bf16.enabled.value());
  EXPECT_EQ(c.communication_data_type, CommDataType::kBf16);
  const nlohmann::json printed = nlohmann::json::parse(ToJson(c));
  EXPECT_TRUE(printed.contains("bf16"));
  EXPECT_FALSE(printed.contains("bfloat16"));
  EXPECT_EQ(printed["communication_data_type"], "bf16");
  EXPECT_EQ(printed["optimizer"]["type"], "AdamW");
  EXPECT_TRUE(printed["zero_optimization"]
                     ["stage3_gather_16bit_weights_on_model_save"]);
}

TEST(ParsingTest, AdamWeightDecayModeFollowsDeepSpeed) {
  auto decoupled = [](const char* optimizer) {
    return LoadOrDie(absl::StrCat(R"({"train_micro_batch_size_per_gpu": 1,
                                      "optimizer": )",
                                  optimizer, "}"))
        .optimizer->DecoupledWeightDecay();
  };
  EXPECT_TRUE(decoupled(R"({"type": "Adam"})"));
  EXPECT_FALSE(
      decoupled(R"({"type": "Adam", "params": {"adam_w_mode": false}})"));
  EXPECT_TRUE(decoupled(R"({"type": "AdamW"})"));
  EXPECT_FALSE(
      decoupled(R"({"type": "SGD", "params": {"weight_decay": 0.1}})"));
}

// ------------------------------------------------------------ batch triple

struct BatchCase {
  const char* json;
  int world_size;
  int64_t train, micro, accumulation;
};

TEST(BatchTripleTest, InferredFromAnyTwoOrFromOne) {
  const BatchCase cases[] = {
      // All three, consistent.
      {R"("train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
          "gradient_accumulation_steps": 4)",
       2, 32, 4, 4},
      // Train and micro: accumulation = 32 / (4 x 2).
      {R"("train_batch_size": 32, "train_micro_batch_size_per_gpu": 4)", 2, 32,
       4, 4},
      // Train and accumulation: micro = 48 / (2 x 3).
      {R"("train_batch_size": 48, "gradient_accumulation_steps": 2)", 3, 48, 8,
       2},
      // Micro and accumulation: train = 4 x 2 x 3.
      {R"("train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2)",
       3, 24, 4, 2},
      // Train alone: accumulation 1, micro = 16 / 4.
      {R"("train_batch_size": 16)", 4, 16, 4, 1},
      // Micro alone: accumulation 1, train = 5 x 3.
      {R"("train_micro_batch_size_per_gpu": 5)", 3, 15, 5, 1},
  };
  for (const BatchCase& c : cases) {
    const Config config =
        LoadOrDie(absl::StrCat("{", c.json, "}"), c.world_size);
    EXPECT_EQ(config.train_batch_size.value(), c.train) << c.json;
    EXPECT_EQ(config.train_micro_batch_size_per_gpu.value(), c.micro) << c.json;
    EXPECT_EQ(config.gradient_accumulation_steps.value(), c.accumulation)
        << c.json;
  }
}

TEST(BatchTripleTest, SameFileFailsAtAWorldSizeThatDoesNotDivide) {
  const char* json =
      R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})";
  EXPECT_TRUE(LoadConfigString(json, 4).ok());
  absl::StatusOr<Config> at_three = LoadConfigString(json, 3);
  ASSERT_FALSE(at_three.ok());
  EXPECT_NE(at_three.status().message().find("world size 3"),
            absl::string_view::npos)
      << at_three.status();
}

// A pipeline's replicas take the batch: train = micro x accumulation x
// (world / pipeline.stages), as DeepSpeed's data-parallel world does.
TEST(PipelineConfigTest, BatchTripleCountsDataParallelReplicas) {
  const Config config = LoadOrDie(
      R"({"train_batch_size": 16, "gradient_accumulation_steps": 4,
          "pipeline": {"stages": 2, "partition": "uniform",
                       "schedule": "gpipe",
                       "activation_checkpoint_interval": 1}})",
      4);
  EXPECT_EQ(config.data_parallel_size(), 2);
  EXPECT_EQ(config.train_micro_batch_size_per_gpu.value(), 2);
  EXPECT_EQ(config.pipeline.stages, 2);
  EXPECT_EQ(config.pipeline.partition, "uniform");
  EXPECT_EQ(config.pipeline.schedule, PipelineSchedule::kGPipe);
  EXPECT_EQ(config.pipeline.activation_checkpoint_interval, 1);
  EXPECT_EQ(LoadOrDie(R"({"train_batch_size": 8})", 4).pipeline.schedule,
            PipelineSchedule::kOneFOneB);
}

TEST(PipelineConfigTest, BadLayoutsAndValuesNameTheKey) {
  absl::StatusOr<Config> uneven = LoadConfigString(
      R"({"train_batch_size": 8, "pipeline": {"stages": 3}})", 4);
  ASSERT_FALSE(uneven.ok());
  EXPECT_NE(uneven.status().message().find(
                "pipeline.stages = 3 does not divide the world size 4"),
            absl::string_view::npos)
      << uneven.status();
  absl::StatusOr<Config> schedule = LoadConfigString(
      R"({"train_batch_size": 8, "pipeline": {"schedule": "1F1B"}})", 1);
  ASSERT_FALSE(schedule.ok());
  EXPECT_NE(schedule.status().message().find("pipeline.schedule"),
            absl::string_view::npos)
      << schedule.status();
  absl::StatusOr<Config> interval = LoadConfigString(
      R"({"train_batch_size": 8,
          "pipeline": {"activation_checkpoint_interval": 2}})",
      1);
  ASSERT_FALSE(interval.ok());
  EXPECT_NE(interval.status().message().find(
                "pipeline.activation_checkpoint_interval"),
            absl::string_view::npos)
      << interval.status();
  absl::StatusOr<Config> batch = LoadConfigString(
      R"({"train_batch_size": 6, "gradient_accumulation_steps": 2,
          "pipeline": {"stages": 2}})",
      4);
  ASSERT_FALSE(batch.ok());
  EXPECT_NE(batch.status().message().find(
                "data-parallel size 2 = world size 4 / pipeline.stages 2"),
            absl::string_view::npos)
      << batch.status();
}

// Several stages per rank is the interleaved schedule, and the
// interleaved schedule is several stages per rank over micro-batches in
// groups of one per pipeline rank: each mismatch names its keys at load.
TEST(PipelineConfigTest, StagesPerRankGoesWithTheInterleavedSchedule) {
  const Config interleaved = LoadOrDie(
      R"({"train_batch_size": 16, "gradient_accumulation_steps": 4,
          "pipeline": {"stages": 2, "schedule": "interleaved_1f1b",
                       "stages_per_rank": 2}})",
      4);
  EXPECT_EQ(interleaved.pipeline.schedule,
            PipelineSchedule::kInterleavedOneFOneB);
  EXPECT_EQ(interleaved.pipeline.stages_per_rank, 2);
  EXPECT_EQ(LoadOrDie(R"({"train_batch_size": 8})", 4).pipeline.stages_per_rank,
            1);
  // The zero-bubble schedule holds one stage per rank.
  EXPECT_EQ(LoadOrDie(R"({"train_batch_size": 16,
                          "pipeline": {"stages": 2, "schedule": "zb_h1"}})",
                      4)
                .pipeline.schedule,
            PipelineSchedule::kZeroBubbleH1);
  const struct {
    const char* json;
    const char* message;
  } cases[] = {
      {R"({"train_batch_size": 16, "gradient_accumulation_steps": 4,
           "pipeline": {"stages": 2, "schedule": "interleaved_1f1b"}})",
       "pipeline.schedule \"interleaved_1f1b\" needs "
       "pipeline.stages_per_rank >= 2 (got 1)"},
      {R"({"train_batch_size": 16, "gradient_accumulation_steps": 4,
           "pipeline": {"stages": 2, "stages_per_rank": 2}})",
       "pipeline.stages_per_rank = 2 needs pipeline.schedule "
       "\"interleaved_1f1b\""},
      {R"({"train_batch_size": 12, "gradient_accumulation_steps": 3,
           "pipeline": {"stages": 2, "schedule": "interleaved_1f1b",
                        "stages_per_rank": 2}})",
       "gradient_accumulation_steps (the micro-batches, 3) to be a multiple "
       "of pipeline.stages (2)"},
      {R"({"train_batch_size": 16,
           "pipeline": {"stages": 2, "stages_per_rank": 0}})",
       "pipeline.stages_per_rank"},
      {R"({"train_batch_size": 16,
           "pipeline": {"stages": 2, "schedule": "zb_h1",
                        "stages_per_rank": 2}})",
       "pipeline.stages_per_rank = 2 needs pipeline.schedule "
       "\"interleaved_1f1b\""},
  };
  for (const auto& c : cases) {
    absl::StatusOr<Config> config = LoadConfigString(c.json, 4);
    ASSERT_FALSE(config.ok()) << c.json;
    EXPECT_NE(config.status().message().find(c.message),
              absl::string_view::npos)
        << config.status();
  }
}

// ------------------------------------------------------------ auto

TEST(ResolveTest, HiddenSizeRulesFollowHuggingFace) {
  const Config raw = LoadOrDie(R"({"train_micro_batch_size_per_gpu": 1,
      "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
          "stage3_prefetch_bucket_size": "auto",
          "stage3_param_persistence_threshold": "auto"}})");
  EXPECT_EQ(raw.UnresolvedAutoPaths(),
            (std::vector<std::string>{
                "zero_optimization.reduce_bucket_size",
                "zero_optimization.stage3_prefetch_bucket_size",
                "zero_optimization.stage3_param_persistence_threshold"}));

  ResolutionContext context;
  context.hidden_size = 1000;
  absl::StatusOr<Config> resolved = Resolve(raw, context);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  const ZeroConfig& z = resolved->zero_optimization;
  EXPECT_EQ(z.reduce_bucket_size.value(), 1'000'000);
  EXPECT_EQ(z.stage3_prefetch_bucket_size.value(), 900'000);
  EXPECT_EQ(z.stage3_param_persistence_threshold.value(), 10'000);
  EXPECT_FALSE(resolved->HasUnresolvedAuto());

  // Without the hint, the error names each path and the missing hint.
  absl::StatusOr<Config> unresolved = Resolve(raw, ResolutionContext{});
  ASSERT_FALSE(unresolved.ok());
  const std::string message(unresolved.status().message());
  EXPECT_NE(message.find("t.json: zero_optimization.reduce_bucket_size is "
                         "\"auto\" but ResolutionContext::hidden_size"),
            std::string::npos)
      << message;
  EXPECT_NE(
      message.find("zero_optimization.stage3_param_persistence_threshold"),
      std::string::npos)
      << message;
}

TEST(ResolveTest, HuggingFaceStyleConfigResolvesFromTheRun) {
  absl::StatusOr<Config> raw =
      LoadConfigFile(std::string(kExamplesDir) + "/zero2_auto.json", 2);
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ(raw->UnresolvedAutoPaths().size(), 15u);

  absl::StatusOr<Config> c = Resolve(*raw, FullContext());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->train_micro_batch_size_per_gpu.value(), 4);
  EXPECT_EQ(c->gradient_accumulation_steps.value(), 2);
  EXPECT_EQ(c->train_batch_size.value(), 16);  // 4 x 2 x world size 2
  EXPECT_EQ(c->gradient_clipping.value(), 1.0);
  EXPECT_EQ(c->optimizer->params.lr.value(), 3e-4);
  EXPECT_EQ(c->optimizer->params.betas.value()[1], 0.95);
  EXPECT_EQ(c->optimizer->params.weight_decay.value(), 0.1);
  EXPECT_EQ(c->scheduler->params.warmup_min_lr.value(), 0.0);
  EXPECT_EQ(c->scheduler->params.warmup_max_lr.value(), 3e-4);
  EXPECT_EQ(c->scheduler->params.warmup_num_steps.value(), 100);
  EXPECT_EQ(c->scheduler->params.total_num_steps.value(), 1000);
  EXPECT_EQ(GetTrainingPrecision(*c), TrainingPrecision::kBf16);
  EXPECT_FALSE(c->fp16.enabled.value());
  EXPECT_EQ(c->zero_optimization.reduce_bucket_size.value(), 768 * 768);

  // Resolving a resolved config changes nothing.
  absl::StatusOr<Config> again = Resolve(*c, ResolutionContext{});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *c);
}

TEST(ResolveTest, AutoBatchSizesWithoutHintsAreInferred) {
  const Config raw = LoadOrDie(R"({"train_batch_size": 64,
      "train_micro_batch_size_per_gpu": "auto",
      "gradient_accumulation_steps": 4})",
                               2);
  EXPECT_TRUE(raw.train_micro_batch_size_per_gpu.is_auto());
  absl::StatusOr<Config> c = Resolve(raw, ResolutionContext{});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->train_micro_batch_size_per_gpu.value(), 8);
}

TEST(ResolveTest, HintsAreValidatedAndWorldSizeMustMatch) {
  absl::StatusOr<Config> raw =
      LoadConfigFile(std::string(kExamplesDir) + "/zero2_auto.json", 2);
  ASSERT_TRUE(raw.ok()) << raw.status();
  ResolutionContext context = FullContext();
  context.learning_rate = -1.0;
  absl::StatusOr<Config> bad_lr = Resolve(*raw, context);
  ASSERT_FALSE(bad_lr.ok());
  EXPECT_NE(bad_lr.status().message().find("optimizer.params.lr must be >= 0"),
            absl::string_view::npos)
      << bad_lr.status();

  context = FullContext();
  context.micro_batch_size_per_gpu = 3;
  context.world_size = 4;
  absl::StatusOr<Config> wrong_world = Resolve(*raw, context);
  ASSERT_FALSE(wrong_world.ok());
  EXPECT_EQ(wrong_world.status().code(), absl::StatusCode::kFailedPrecondition);
}

// offload_optimizer.ratio "auto" is kept by the loader, printed back as
// "auto", needs device cpu, and resolves only from its hint (which
// engine::Initialize computes), checked like the file's value.
TEST(ResolveTest, AutoOffloadRatioResolvesFromItsHint) {
  const std::string json =
      R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": )"
      R"({"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": "auto"}}})";
  absl::StatusOr<Config> raw = LoadConfigString(json, 1, "auto_ratio.json");
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_TRUE(raw->zero_optimization.offload_optimizer.ratio.is_auto());
  EXPECT_EQ(
      raw->UnresolvedAutoPaths(),
      std::vector<std::string>{"zero_optimization.offload_optimizer.ratio"});
  absl::StatusOr<Config> again = LoadConfigString(ToJson(*raw), 1);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->zero_optimization.offload_optimizer.ratio.is_auto());

  absl::StatusOr<Config> unhinted = Resolve(*raw, ResolutionContext());
  ASSERT_FALSE(unhinted.ok());
  EXPECT_NE(unhinted.status().message().find(
                "auto_ratio.json: zero_optimization.offload_optimizer.ratio "
                "is \"auto\" but ResolutionContext::offload_optimizer_ratio "
                "was not given"),
            absl::string_view::npos)
      << unhinted.status();

  ResolutionContext context;
  context.offload_optimizer_ratio = 0.35;
  absl::StatusOr<Config> resolved = Resolve(*raw, context);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->zero_optimization.offload_optimizer.ratio.value(), 0.35);
  EXPECT_FALSE(resolved->HasUnresolvedAuto());

  context.offload_optimizer_ratio = 1.5;
  absl::StatusOr<Config> out_of_range = Resolve(*raw, context);
  ASSERT_FALSE(out_of_range.ok());
  EXPECT_NE(out_of_range.status().message().find(
                "zero_optimization.offload_optimizer.ratio must be in"),
            absl::string_view::npos)
      << out_of_range.status();

  absl::StatusOr<Config> nvme = LoadConfigString(
      R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": )"
      R"({"stage": 3, "offload_optimizer": {"device": "nvme", )"
      R"("nvme_path": "/tmp", "ratio": "auto"}}})",
      1, "nvme_auto.json");
  ASSERT_FALSE(nvme.ok());
  EXPECT_NE(nvme.status().message().find(
                "zero_optimization.offload_optimizer.ratio \"auto\" needs "
                "zero_optimization.offload_optimizer.device \"cpu\""),
            absl::string_view::npos)
      << nvme.status();
}

// ------------------------------------------------------------ ToJson

// Every key, each set to a value other than its default, so a key ToJson()
// forgot to write, or the parser forgot to read, changes the round trip.
constexpr char kEveryKeyNonDefault[] = R"({
  "train_batch_size": 48,
  "train_micro_batch_size_per_gpu": 3,
  "gradient_accumulation_steps": 8,
  "steps_per_print": 7,
  "gradient_clipping": 0.5,
  "prescale_gradients": true,
  "gradient_predivide_factor": 2.0,
  "communication_data_type": "fp32",
  "wall_clock_breakdown": true,
  "memory_breakdown": true,
  "seed": 1234,
  "max_consecutive_nonfinite_steps": 2,
  "optimizer": {"type": "Adam", "params": {"lr": 0.002, "betas": [0.8, 0.99],
      "eps": 1e-6, "weight_decay": 0.05, "torch_adam": true,
      "blockwise_8bit_moments": true,
      "adam_w_mode": false}},
  "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.001,
      "cycle_max_lr": 0.01, "decay_lr_rate": 0.1, "cycle_first_step_size": 10,
      "cycle_second_step_size": 20, "cycle_first_stair_count": 2,
      "cycle_second_stair_count": 4, "decay_step_size": 5,
      "cycle_momentum": false, "cycle_min_mom": 0.7, "cycle_max_mom": 0.95,
      "decay_mom_rate": 0.01, "last_batch_iteration": 3}},
  "fp16": {"enabled": true, "auto_cast": true, "loss_scale": 128.0,
      "initial_scale_power": 12, "loss_scale_window": 500, "hysteresis": 3,
      "consecutive_hysteresis": true, "min_loss_scale": 2},
  "bf16": {"enabled": false, "master_weights_16_plus_16": true,
      "bf16_optimizer_states": true,
      "optimizer_states_stochastic_rounding": true},
  "zero_optimization": {"stage": 3, "contiguous_gradients": false,
      "overlap_comm": false, "reduce_scatter": false,
      "reduce_bucket_size": 1000, "allgather_partitions": false,
      "allgather_bucket_size": 2000, "round_robin_gradients": true,
      "load_from_fp32_weights": false, "elastic_checkpoint": true,
      "ignore_unused_parameters": false,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme/a",
          "pin_memory": true, "buffer_count": 6, "pipeline_read": true,
          "pipeline_write": true, "fast_init": true, "ratio": 0.5,
          "delayed_update": false, "speculation_buffer_size": 4096,
          "split_update": true},
      "offload_param": {"device": "nvme", "nvme_path": "/nvme/b",
          "pin_memory": true, "buffer_count": 7, "buffer_size": 3000,
          "max_in_cpu": 4000},
      "stage3_prefetch_bucket_size": 5000,
      "stage3_param_persistence_threshold": 6000,
      "stage3_model_persistence_threshold": 7000,
      "stage3_max_live_parameters": 8000, "stage3_max_reuse_distance": 9000,
      "stage3_gather_16bit_weights_on_model_save": true,
      "sub_group_size": 10000, "zero_hpz_partition_size": 2,
      "zero_quantized_weights": true, "zero_quantized_gradients": true},
  "aio": {"block_size": 4096, "queue_depth": 16, "thread_count": 2,
      "single_submit": true, "overlap_events": false},
  "activation_checkpointing": {"partition_activations": true,
      "cpu_checkpointing": true, "contiguous_memory_optimization": true,
      "number_checkpoints": 12, "synchronize_checkpoint_boundary": true,
      "profile": true},
  "checkpoint": {"tag_validation": "Ignore", "load_universal": true,
      "use_node_local_storage": true, "parallel_write": {"pipeline_stage": true}},
  "csv_monitor": {"enabled": true, "output_path": "out/", "job_name": "job"},
  "pipeline": {"stages": 2, "partition": "uniform",
               "activation_checkpoint_interval": 1,
               "schedule": "interleaved_1f1b", "stages_per_rank": 2,
               "seed_layers": true, "pipe_partitioned": false,
               "grad_partitioned": false}
})";

TEST(ToJsonTest, EveryKeySurvivesTheRoundTrip) {
  const Config c = LoadOrDie(kEveryKeyNonDefault, 4);
  // ToJson writes back exactly what was read: no key lost, none invented.
  EXPECT_EQ(nlohmann::json::parse(ToJson(c)),
            nlohmann::json::parse(kEveryKeyNonDefault));
  const Config reloaded = LoadOrDie(ToJson(c), 4);
  EXPECT_EQ(reloaded, c);
}

TEST(ToJsonTest, EveryExampleRoundTripsRawAndResolved) {
  for (const std::string& path : ExampleConfigPaths()) {
    absl::StatusOr<Config> raw = LoadConfigFile(path, 2);
    ASSERT_TRUE(raw.ok()) << raw.status();
    absl::StatusOr<Config> resolved = Resolve(*raw, FullContext());
    ASSERT_TRUE(resolved.ok()) << resolved.status();
    for (const Config* c : {&*raw, &*resolved}) {
      absl::StatusOr<Config> reloaded = LoadConfigString(ToJson(*c), 2);
      ASSERT_TRUE(reloaded.ok()) << path << ": " << reloaded.status() << "\n"
                                 << ToJson(*c);
      EXPECT_EQ(*reloaded, *c) << path;
      EXPECT_EQ(ToJson(*reloaded), ToJson(*c)) << path;  // stable output
    }
  }
}

TEST(ToJsonTest, FillsEveryDefaultInAStableOrder) {
  const Config c = LoadOrDie(R"({"train_micro_batch_size_per_gpu": 1})");
  const nlohmann::ordered_json printed =
      nlohmann::ordered_json::parse(ToJson(c));
  std::vector<std::string> keys;
  for (const auto& item : printed.items()) keys.push_back(item.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"train_batch_size",
                                            "train_micro_batch_size_per_gpu",
                                            "gradient_accumulation_steps",
                                            "steps_per_print",
                                            "gradient_clipping",
                                            "prescale_gradients",
                                            "gradient_predivide_factor",
                                            "communication_data_type",
                                            "wall_clock_breakdown",
                                            "memory_breakdown",
                                            "seed",
                                            "max_consecutive_nonfinite_steps",
                                            "fp16",
                                            "bf16",
                                            "zero_optimization",
                                            "aio",
                                            "activation_checkpointing",
                                            "checkpoint",
                                            "csv_monitor",
                                            "pipeline"}));
  EXPECT_EQ(printed["gradient_accumulation_steps"], 1);
  EXPECT_EQ(printed["zero_optimization"]["stage3_max_live_parameters"],
            1'000'000'000);
  EXPECT_EQ(printed["checkpoint"]["tag_validation"], "Warn");
}

TEST(EqualityTest, DetectsAChangeInAnyNestedField) {
  const Config c = LoadOrDie(kEveryKeyNonDefault, 4);
  Config changed = c;
  changed.zero_optimization.offload_param.max_in_cpu += 1;
  EXPECT_NE(changed, c);
  changed = c;
  changed.scheduler->params.decay_mom_rate = 0.5;
  EXPECT_NE(changed, c);
  changed = c;
  changed.checkpoint.parallel_write.pipeline_stage = false;
  EXPECT_NE(changed, c);
  changed = c;
  changed.source = "elsewhere.json";  // not part of the value
  EXPECT_EQ(changed, c);
}

// ------------------------------------------------------------ reference

// Collects "a.b.c" for every leaf of a JSON object.
void LeafPaths(const nlohmann::json& json, const std::string& prefix,
               std::vector<std::string>* out) {
  for (const auto& item : json.items()) {
    const std::string path =
        prefix.empty() ? item.key() : prefix + "." + item.key();
    if (item.value().is_object()) {
      LeafPaths(item.value(), path, out);
    } else {
      out->push_back(path);
    }
  }
}

TEST(ConfigWarningsTest, NamesOnlyKeysSetAwayFromTheirDefaults) {
  // The defaults, and accepted keys given at their default values, are
  // silent; so are keys that do take effect.
  EXPECT_TRUE(ConfigWarnings(LoadOrDie(R"({"train_batch_size": 8})")).empty());
  EXPECT_TRUE(ConfigWarnings(LoadOrDie(R"({"train_batch_size": 8,
      "zero_optimization": {"stage": 3, "overlap_comm": false,
                            "zero_hpz_partition_size": 1,
                            "zero_quantized_weights": false,
                            "contiguous_gradients": true}})"))
                  .empty());
  const std::vector<ConfigWarning> settings =
      ConfigWarnings(LoadOrDie(R"({"train_batch_size": 8,
      "fp16": {"enabled": true, "auto_cast": true},
      "zero_optimization": {"stage": 3, "zero_quantized_weights": true,
                            "zero_quantized_gradients": true,
                            "offload_param": {"device": "cpu",
                                              "max_in_cpu": 5}},
      "activation_checkpointing": {"cpu_checkpointing": true,
                                   "partition_activations": true},
      "checkpoint": {"parallel_write": {"pipeline_stage": true}}})"));
  std::vector<std::string> keys;
  for (const ConfigWarning& setting : settings) {
    keys.push_back(setting.key);
    EXPECT_TRUE(absl::StartsWith(setting.message,
                                 "is set but has no effect in zero-engine: "))
        << setting.key << " " << setting.message;
  }
  EXPECT_EQ(keys,
            (std::vector<std::string>{
                "fp16.auto_cast", "zero_optimization.offload_param.max_in_cpu",
                "zero_optimization.zero_quantized_weights",
                "zero_optimization.zero_quantized_gradients",
                "activation_checkpointing.partition_activations",
                "checkpoint.parallel_write.pipeline_stage"}));
  // cpu_checkpointing acts (nn/activation_offload.h); partition_activations
  // says why it cannot without tensor parallelism.
  EXPECT_TRUE(absl::StrContains(settings[4].message, "tensor parallelism"))
      << settings[4].message;
  EXPECT_TRUE(absl::StrContains(settings[2].message, "not implemented"))
      << settings[2].message;
}

TEST(ReferenceMarkdownTest, DocumentsEveryKeyWithItsDefault) {
  const std::string reference = ReferenceMarkdown();
  std::vector<std::string> paths;
  LeafPaths(nlohmann::json::parse(kEveryKeyNonDefault), "", &paths);
  for (const char* other_scheduler :
       {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
        "total_num_steps", "warmup_min_ratio", "cos_min_ratio"}) {
    paths.push_back(std::string("scheduler.params.") + other_scheduler);
  }
  paths.push_back("optimizer.params.momentum");
  for (const std::string& path : paths) {
    EXPECT_NE(reference.find("| `" + path + "` |"), std::string::npos) << path;
  }
  // Defaults come from the code, not from prose.
  EXPECT_NE(reference.find("| `zero_optimization.reduce_bucket_size` | "
                           "integer >= 1, or \"auto\" | `500000000` |"),
            std::string::npos);
  EXPECT_NE(reference.find("| `seed` | integer >= 0 | `42` |"),
            std::string::npos);
}

TEST(UnresolvedAutoPathsTest, ListsEveryAutoThatToJsonPrints) {
  const Config c = LoadOrDie(R"({
      "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
      "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
      "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto",
          "eps": "auto", "weight_decay": "auto"}},
      "scheduler": {"type": "WarmupDecayLR", "params": {
          "warmup_min_lr": "auto", "warmup_max_lr": "auto",
          "warmup_num_steps": "auto", "total_num_steps": "auto"}},
      "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
      "zero_optimization": {"reduce_bucket_size": "auto",
          "stage3_prefetch_bucket_size": "auto",
          "stage3_param_persistence_threshold": "auto"}})");
  const std::string printed = ToJson(c);
  size_t autos = 0;
  for (size_t at = printed.find("\"auto\""); at != std::string::npos;
       at = printed.find("\"auto\"", at + 1)) {
    ++autos;
  }
  EXPECT_EQ(autos, 17u);
  EXPECT_EQ(c.UnresolvedAutoPaths().size(), autos);
}

// ------------------------------------------------- equality from the tables

// Values to try in place of `original`, in order, for a key whose valid
// range the test does not know: the first one the loader accepts is used.
std::vector<nlohmann::json> Alternatives(const nlohmann::json& original) {
  std::vector<nlohmann::json> out;
  if (original.is_boolean()) return {!original.get<bool>()};
  if (original.is_number_integer()) {
    const int64_t v = original.get<int64_t>();
    if (v > std::numeric_limits<int64_t>::min()) out.push_back(v - 1);
    if (v < std::numeric_limits<int64_t>::max()) out.push_back(v + 1);
    for (int64_t c : {v / 2, int64_t{0}, int64_t{1}, int64_t{2}}) {
      out.push_back(c);
    }
    return out;
  }
  if (original.is_number()) {
    const double v = original.get<double>();
    for (double c : {v - 1, v / 2, v * 2, 1e-4, 0.0, 1.0, 0.5}) {
      out.push_back(c);
    }
    return out;
  }
  // Strings (enum spellings, paths, "auto") and null (unset optionals).
  for (const char* c :
       {"AdamW", "Ignore", "linear", "cpu", "fp32", "/tmp/swap", "gpipe"}) {
    out.push_back(c);
  }
  if (original.is_string()) out.push_back(original.get<std::string>() + "x");
  for (double c : {12.0, 6.0, 1.0, 1e-4}) out.push_back(c);
  return out;
}

// "zero_optimization.offload_param.device" for the pointer
// "/zero_optimization/offload_param/device" ("/betas/0" -> "betas").
std::string DottedKey(const std::string& pointer) {
  std::string dotted;
  size_t start = 1;
  while (start <= pointer.size()) {
    size_t end = pointer.find('/', start);
    if (end == std::string::npos) end = pointer.size();
    const std::string part = pointer.substr(start, end - start);
    if (!part.empty() && !std::all_of(part.begin(), part.end(), [](char ch) {
          return ch >= '0' && ch <= '9';
        })) {
      if (!dotted.empty()) dotted += ".";
      dotted += part;
    }
    start = end + 1;
  }
  return dotted;
}

// Every key the reference documents, as "a.b.c".
std::vector<std::string> ReferenceKeys() {
  std::vector<std::string> keys;
  const std::string reference = ReferenceMarkdown();
  for (size_t at = reference.find("\n| `"); at != std::string::npos;
       at = reference.find("\n| `", at + 1)) {
    const size_t begin = at + 4;
    keys.push_back(reference.substr(begin, reference.find('`', begin) - begin));
  }
  return keys;
}

// operator== is derived from the key tables. For every key ToJson() prints
// (every key of every table, over these bases), a config that differs in
// that key alone must compare unequal; and every key the reference lists
// must have been covered, so a key cannot escape by being left out here.
TEST(EqualityTest, ChangingAnyKeyAloneMakesConfigsUnequal) {
  // The batch triple is checked only without "auto", so with
  // train_batch_size "auto" each of the three can change alone.
  const std::string batch =
      R"("train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2,
         "gradient_accumulation_steps": 3, "zero_optimization": {"stage": 3})";
  const std::vector<std::string> bases = {
      R"("optimizer": {"type": "Adam"}, "scheduler": {"type": "WarmupLR"})",
      R"("optimizer": {"type": "SGD"}, "scheduler": {"type": "WarmupDecayLR",
          "params": {"total_num_steps": 100}})",
      R"("optimizer": {"type": "AdamW"}, "scheduler": {
          "type": "WarmupCosineLR", "params": {"total_num_steps": 100}})",
      R"("scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.001,
          "cycle_max_lr": 0.01}})",
      // stages_per_rank changes alone only under the interleaved schedule.
      R"("pipeline": {"schedule": "interleaved_1f1b", "stages_per_rank": 2})",
  };
  std::set<std::string> covered;
  for (const std::string& base_keys : bases) {
    const Config base =
        LoadOrDie(absl::StrCat("{", batch, ",", base_keys, "}"), 2);
    const nlohmann::json base_json = nlohmann::json::parse(ToJson(base));
    const nlohmann::json leaves = base_json.flatten();
    for (const auto& [pointer, original] : leaves.items()) {
      // A section's type selects which params are valid, so it cannot change
      // alone; TypesTakePartInEquality covers it.
      if (absl::EndsWith(pointer, "/type")) continue;
      bool changed = false;
      for (const nlohmann::json& value : Alternatives(original)) {
        if (value == original) continue;
        nlohmann::json json = base_json;
        json[nlohmann::json::json_pointer(pointer)] = value;
        // World size 2, so pipeline.stages can change alone (to 2).
        absl::StatusOr<Config> other = LoadConfigJson(json, 2);
        if (!other.ok()) continue;
        EXPECT_FALSE(*other == base) << pointer << " = " << value.dump();
        EXPECT_TRUE(*other != base) << pointer << " = " << value.dump();
        changed = true;
        break;
      }
      // Some values are valid in one base only (adam_w_mode false is
      // rejected for AdamW): a key must change in at least one base.
      if (changed) covered.insert(DottedKey(pointer));
    }
  }
  const std::vector<std::string> reference_keys = ReferenceKeys();
  ASSERT_GT(reference_keys.size(), 80u);
  for (const std::string& key : reference_keys) {
    if (absl::EndsWith(key, ".type")) continue;
    EXPECT_TRUE(covered.count(key))
        << key << " never changed alone: no base printed it, or no value in "
        << "Alternatives() was valid for it";
  }
}

TEST(EqualityTest, TypesAndWorldSizeTakePartInEquality) {
  const Config adam = LoadOrDie(R"({"train_batch_size": 4,
      "optimizer": {"type": "Adam"}, "scheduler": {"type": "WarmupLR"}})");
  Config adamw = adam;
  adamw.optimizer->type = OptimizerType::kAdamW;
  EXPECT_NE(adamw, adam);
  Config cosine = adam;
  cosine.scheduler->type = SchedulerType::kWarmupCosineLR;
  EXPECT_NE(cosine, adam);
  Config no_scheduler = adam;
  no_scheduler.scheduler.reset();
  EXPECT_NE(no_scheduler, adam);
  Config other_world = adam;
  other_world.world_size = 2;
  EXPECT_NE(other_world, adam);
  // Only the source is left out: it names the file for messages.
  Config other_source = adam;
  other_source.source = "elsewhere.json";
  EXPECT_EQ(other_source, adam);
}

// ------------------------------------------------- auto from the model

// A config with "auto" in exactly one hidden-size key.
Config WithOneHiddenSizeAuto(const std::string& key) {
  return LoadOrDie(absl::StrCat(R"({"train_micro_batch_size_per_gpu": 1,
      "zero_optimization": {"stage": 3, ")",
                                key, R"(": "auto"}})"));
}

TEST(ResolveTest, ReduceBucketSizeIsHiddenSquared) {
  const Config raw = WithOneHiddenSizeAuto("reduce_bucket_size");
  ResolutionContext context;
  context.hidden_size = 768;
  absl::StatusOr<Config> c = Resolve(raw, context);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->zero_optimization.reduce_bucket_size.value(), 768 * 768);
  // The others keep their defaults.
  EXPECT_EQ(c->zero_optimization.stage3_prefetch_bucket_size.value(),
            50'000'000);
  EXPECT_EQ(c->zero_optimization.stage3_param_persistence_threshold.value(),
            100'000);
}

TEST(ResolveTest, PrefetchBucketSizeIsNineTenthsOfHiddenSquaredTruncated) {
  const Config raw = WithOneHiddenSizeAuto("stage3_prefetch_bucket_size");
  ResolutionContext context;
  // 0.9 x 1023 x 1023 = 941876.1: Hugging Face's int() truncates.
  context.hidden_size = 1023;
  absl::StatusOr<Config> c = Resolve(raw, context);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->zero_optimization.stage3_prefetch_bucket_size.value(), 941876);
  EXPECT_EQ(c->zero_optimization.reduce_bucket_size.value(), 500'000'000);
}

TEST(ResolveTest, ParamPersistenceThresholdIsTenHidden) {
  const Config raw =
      WithOneHiddenSizeAuto("stage3_param_persistence_threshold");
  ResolutionContext context;
  context.hidden_size = 4096;
  absl::StatusOr<Config> c = Resolve(raw, context);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->zero_optimization.stage3_param_persistence_threshold.value(),
            40'960);
}

TEST(ResolveTest, MissingHiddenSizeNamesThePathAndTheModelsHiddenSize) {
  for (const char* key : {"reduce_bucket_size", "stage3_prefetch_bucket_size",
                          "stage3_param_persistence_threshold"}) {
    absl::StatusOr<Config> c =
        Resolve(WithOneHiddenSizeAuto(key), ResolutionContext{});
    ASSERT_FALSE(c.ok()) << key;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(c.status().message());
    EXPECT_NE(message.find(absl::StrCat("t.json: zero_optimization.", key,
                                        " is \"auto\"")),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("ResolutionContext::hidden_size was not given"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("the model's hidden size is needed"),
              std::string::npos)
        << message;
  }
  // A hidden size is needed only where a key asks for it.
  const Config no_auto = LoadOrDie(R"({"train_micro_batch_size_per_gpu": 1})");
  EXPECT_TRUE(Resolve(no_auto, ResolutionContext{}).ok());
}

TEST(ResolveTest, ExampleZero2AutoResolvesGivenAHiddenSize) {
  absl::StatusOr<Config> raw =
      LoadConfigFile(std::string(kExamplesDir) + "/zero2_auto.json", 1);
  ASSERT_TRUE(raw.ok()) << raw.status();
  ResolutionContext context = FullContext();
  context.hidden_size = 1600;  // GPT-2 XL's n_embd
  absl::StatusOr<Config> c = Resolve(*raw, context);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->zero_optimization.reduce_bucket_size.value(), 2'560'000);
  EXPECT_FALSE(c->HasUnresolvedAuto());

  context.hidden_size.reset();
  absl::StatusOr<Config> without = Resolve(*raw, context);
  ASSERT_FALSE(without.ok());
  EXPECT_NE(without.status().message().find(
                "zero_optimization.reduce_bucket_size is \"auto\""),
            absl::string_view::npos)
      << without.status();
}

// Hugging Face's documented ZeRO-3 ds_config, "auto" wherever it allows.
constexpr char kHuggingFaceZero3[] = R"({
  "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
           "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
  "bf16": {"enabled": "auto"},
  "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto",
                                            "eps": "auto",
                                            "weight_decay": "auto"}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto",
                                               "warmup_max_lr": "auto",
                                               "warmup_num_steps": "auto"}},
  "zero_optimization": {
    "stage": 3,
    "offload_optimizer": {"device": "cpu", "pin_memory": true},
    "offload_param": {"device": "cpu", "pin_memory": true},
    "overlap_comm": true,
    "contiguous_gradients": true,
    "sub_group_size": 1e9,
    "reduce_bucket_size": "auto",
    "stage3_prefetch_bucket_size": "auto",
    "stage3_param_persistence_threshold": "auto",
    "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e9,
    "stage3_gather_16bit_weights_on_model_save": true
  },
  "gradient_accumulation_steps": "auto",
  "gradient_clipping": "auto",
  "steps_per_print": 2000,
  "train_batch_size": "auto",
  "train_micro_batch_size_per_gpu": "auto",
  "wall_clock_breakdown": false
})";

TEST(ResolveTest, HuggingFaceZero3ConfigResolvesGivenAHiddenSize) {
  const Config raw = LoadOrDie(kHuggingFaceZero3, 2);
  ResolutionContext context = FullContext();
  context.hidden_size = 768;
  absl::StatusOr<Config> c = Resolve(raw, context);
  ASSERT_TRUE(c.ok()) << c.status();
  const ZeroConfig& z = c->zero_optimization;
  EXPECT_EQ(z.reduce_bucket_size.value(), 589'824);
  EXPECT_EQ(z.stage3_prefetch_bucket_size.value(), 530'841);  // 530841.6
  EXPECT_EQ(z.stage3_param_persistence_threshold.value(), 7'680);
  EXPECT_EQ(c->train_batch_size.value(), 16);  // 4 x 2 x world size 2
  EXPECT_FALSE(c->HasUnresolvedAuto());
}

// A pipeline composes with every ZeRO stage and offload the engine runs
// (tests/pipeline:parity_np*, against the single-rank run): CheckSupported
// refuses nothing for it that it would not refuse without one.
TEST(CheckSupportedTest, PipelineComposesWithZeroAndEveryOffload) {
  const char* base = R"({"train_batch_size": 8, "pipeline": {"stages": 2},
      "zero_optimization": {"stage": 1}})";
  EXPECT_TRUE(CheckSupported(LoadOrDie(base, 2)).ok());
  // Clipping composes: the norm spans the stages.
  Config clipped = LoadOrDie(base, 2);
  clipped.gradient_clipping = 1.0;
  EXPECT_TRUE(CheckSupported(clipped).ok());
  // And fp16: the overflow flag spans the stages too.
  clipped.fp16.enabled = true;
  EXPECT_TRUE(CheckSupported(clipped).ok());
  // Stage 2 and offload too.
  Config offloaded = clipped;
  offloaded.zero_optimization.stage = 2;
  offloaded.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
  EXPECT_TRUE(CheckSupported(offloaded).ok());
  // The delayed update (each stage's optimizer one step behind).
  Config delayed = offloaded;
  delayed.zero_optimization.offload_optimizer.delayed_update = true;
  EXPECT_TRUE(CheckSupported(delayed).ok()) << CheckSupported(delayed);
  // Stage 3 with the parameters on the host.
  Config sharded = offloaded;
  sharded.zero_optimization.stage = 3;
  sharded.zero_optimization.offload_param.device = OffloadDevice::kCpu;
  EXPECT_TRUE(CheckSupported(sharded).ok());
  // The NVMe tier (stage 3): the optimizer state, then the parameters too
  // (each rank's swap files named by its world rank, so the stages' files
  // stay apart in one nvme_path).
  sharded.zero_optimization.offload_optimizer.device = OffloadDevice::kNvme;
  sharded.zero_optimization.offload_optimizer.nvme_path = "/tmp";
  EXPECT_TRUE(CheckSupported(sharded).ok()) << CheckSupported(sharded);
  sharded.zero_optimization.offload_param.device = OffloadDevice::kNvme;
  sharded.zero_optimization.offload_param.nvme_path = "/tmp";
  EXPECT_TRUE(CheckSupported(sharded).ok()) << CheckSupported(sharded);
}

TEST(CheckSupportedTest, RefusesWhatThisBuildCannotRun) {
  EXPECT_TRUE(CheckSupported(LoadOrDie(R"({"train_batch_size": 8,
      "zero_optimization": {"stage": 3,
          "offload_optimizer": {"device": "cpu"},
          "offload_param": {"device": "cpu"}}})"))
                  .ok());
  // offload_param with the optimizer (partly) on the device: the device
  // buckets' weights are written to the weights' tier after their update
  // (issue 28), whether no offload_optimizer, ratio < 1 or ratio 1.
  const Config no_optimizer_offload = LoadOrDie(R"({"train_batch_size": 8,
      "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})");
  EXPECT_TRUE(CheckSupported(no_optimizer_offload).ok());
  Config half = no_optimizer_offload;
  half.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
  half.zero_optimization.offload_optimizer.ratio = 0.5;
  EXPECT_TRUE(CheckSupported(half).ok());
  half.zero_optimization.offload_optimizer.ratio = 1.0;
  EXPECT_TRUE(CheckSupported(half).ok());

  // offload_param nvme (ZeRO-Infinity's parameter tier) runs, with the
  // optimizer anywhere as for cpu.
  const Config nvme_params = LoadOrDie(R"({"train_batch_size": 8,
      "zero_optimization": {"stage": 3,
          "offload_optimizer": {"device": "nvme", "nvme_path": "/x"},
          "offload_param": {"device": "nvme", "nvme_path": "/x",
                            "max_in_cpu": 0, "buffer_count": 3}}})");
  EXPECT_TRUE(CheckSupported(nvme_params).ok());
  // Its swap settings act: no "without effect" warning for them.
  for (const ConfigWarning& warning : ConfigWarnings(nvme_params)) {
    EXPECT_FALSE(
        absl::StartsWith(warning.key, "zero_optimization.offload_param."))
        << warning.key << " " << warning.message;
  }
  Config nvme_alone = nvme_params;
  nvme_alone.zero_optimization.offload_optimizer.device = OffloadDevice::kNone;
  EXPECT_TRUE(CheckSupported(nvme_alone).ok());
  Config nvme_part = nvme_params;
  nvme_part.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
  nvme_part.zero_optimization.offload_optimizer.ratio = 0.6;
  EXPECT_TRUE(CheckSupported(nvme_part).ok());
  // What still does not run with it is refused by key: the 16+16 master.
  Config master16 = half;
  master16.bf16.master_weights_16_plus_16 = true;
  absl::Status status = CheckSupported(master16);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
  EXPECT_NE(status.message().find("bf16.master_weights_16_plus_16"),
            absl::string_view::npos)
      << status;
  EXPECT_NE(status.message().find("offload_param"), absl::string_view::npos)
      << status;

  Config universal = LoadOrDie(R"({"train_batch_size": 8,
      "checkpoint": {"load_universal": true}})");
  status = CheckSupported(universal);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(status.message().find("checkpoint.load_universal"),
            absl::string_view::npos)
      << status;

  Config split = LoadOrDie(R"({"train_batch_size": 8,
      "bf16": {"enabled": true, "master_weights_16_plus_16": true},
      "zero_optimization": {"stage": 2}})");
  EXPECT_TRUE(split.bf16.master_weights_16_plus_16);
  EXPECT_TRUE(CheckSupported(split).ok());
  split.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
  EXPECT_TRUE(CheckSupported(split).ok());
  split.zero_optimization.offload_optimizer.device = OffloadDevice::kNvme;
  status = CheckSupported(split);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(status.message().find("bf16.master_weights_16_plus_16 with "
                                  "zero_optimization's "
                                  "offload_optimizer.device \"nvme\""),
            absl::string_view::npos)
      << status;

  Config delayed = LoadOrDie(R"({"train_batch_size": 8,
      "zero_optimization": {"stage": 2,
          "offload_optimizer": {"device": "cpu", "delayed_update": true}}})");
  EXPECT_TRUE(CheckSupported(delayed).ok());
  delayed.zero_optimization.stage = 3;
  status = CheckSupported(delayed);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find(
                "zero_optimization.offload_optimizer.delayed_update needs"),
            absl::string_view::npos)
      << status;
}

}  // namespace
}  // namespace config
}  // namespace ze
