// The 42 ds_config files of config/testdata/realworld/ (copied unchanged from
// public repositories; SOURCES.md says from where) load exactly when
// DeepSpeed 0.19.8's own parser (DeepSpeedConfig, after Hugging Face fills
// "auto") accepts them, and are rejected naming the key DeepSpeed names
// when it does not. The table records each file's verdict, established from
// DeepSpeed 0.19.8's source (runtime/config.py, runtime/zero/config.py,
// runtime/precision_config.py, config_utils.py: pydantic models with
// extra="forbid", aliases, deprecated fields) and the warnings zero-engine
// gives for what it accepts and ignores.
#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "config/config.h"
#include "gtest/gtest.h"

namespace ze {
namespace config {
namespace {

constexpr char kDir[] = "config/testdata/realworld";

struct Verdict {
  // Empty: the file loads. Otherwise the JSON path the error must name
  // (DeepSpeed's verdict names the same key).
  std::string rejected_at;
  // Keys of the expected warnings (ConfigWarnings), in order.
  std::vector<std::string> warnings;
};

// At world size 2 (the batch triple of one file depends on it).
const std::map<std::string, Verdict>& Table() {
  static const auto* table = new std::map<std::string, Verdict>{
      // DeepSpeedFP16Config forbids extra keys and wants an integer
      // min_loss_scale (0.5); offload_param at stage 2 is our own error.
      {"CarperAI__trlx__examples_summarize_rlhf_configs_ds_config_trlx_gptj_"
       "summarize.json",
       {"fp16.opt_level", {}}},
      {"CarperAI__trlx__examples_summarize_rlhf_sft_ds_config_gptj.json",
       {"fp16.opt_level", {}}},
      {"InternLM__InternLM-XComposer__finetune_ds_config_zero2.json", {}},
      {"LianjiaTech__BELLE__train_configs_deepspeed_config_stage3.json", {}},
      {"OpenBMB__MiniCPM-V__finetune_ds_config_zero3.json", {}},
      {"OpenGVLab__InternVL__internvl_chat_zero_stage1_config.json",
       {"", {"fp16.auto_cast"}}},
      {"OpenGVLab__InternVL__segmentation_zero_configs_adam_zero2_bf16.json",
       {"", {"log"}}},
      {"OptimalScale__LMFlow__configs_deepspeed_zero3.json", {}},
      {"QwenLM__Qwen__finetune_ds_config_zero2.json", {}},
      {"QwenLM__Qwen__finetune_ds_config_zero3.json", {}},
      {"THUDM__ChatGLM-6B__ptuning_deepspeed.json",
       {"", {"zero_allow_untested_optimizer"}}},
      {"THUDM__GLM__config_tasks_config_blocklm_10B.json",
       {"",
        {"zero_optimization.cpu_offload", "zero_allow_untested_optimizer",
         "zero_optimization.contiguous_gradients"}}},
      {"allenai__open-instruct__configs_ds_configs_stage3_no_offloading.json",
       {}},
      {"axolotl-ai-cloud__axolotl__deepspeed_configs_zero1.json", {}},
      {"axolotl-ai-cloud__axolotl__deepspeed_configs_zero3_bf16.json", {}},
      {"axolotl-ai-cloud__axolotl__deepspeed_configs_zero3_bf16_cpuoffload_"
       "all.json",
       {"", {"zero_force_ds_cpu_optimizer", "zero_allow_untested_optimizer"}}},
      {"baichuan-inc__Baichuan2__fine-tune_ds_config.json", {}},
      {"haotian-liu__LLaVA__scripts_zero2.json", {}},
      {"haotian-liu__LLaVA__scripts_zero3.json", {}},
      {"haotian-liu__LLaVA__scripts_zero3_offload.json", {}},
      {"hiyouga__LLaMA-Factory__examples_deepspeed_ds_z0_config.json",
       {"",
        {"zero_allow_untested_optimizer",
         "zero_optimization.round_robin_gradients"}}},
      {"hiyouga__LLaMA-Factory__examples_deepspeed_ds_z3_config.json",
       {"", {"zero_allow_untested_optimizer"}}},
      {"hiyouga__LLaMA-Factory__examples_deepspeed_ds_z3_fp8_config.json",
       {"",
        {"zero_allow_untested_optimizer", "comms_config", "monitor_config"}}},
      {"hiyouga__LLaMA-Factory__examples_deepspeed_ds_z3_offload_config.json",
       {"", {"zero_allow_untested_optimizer"}}},
      {"huggingface__accelerate__examples_deepspeed_config_templates_zero_"
       "stage2_offload_config.json",
       {}},
      {"huggingface__accelerate__examples_deepspeed_config_templates_zero_"
       "stage3_offload_config.json",
       {}},
      {"huggingface__transformers__tests_deepspeed_ds_config_zero2.json", {}},
      {"huggingface__transformers__tests_deepspeed_ds_config_zero3.json",
       {"", {"zero_optimization.stage3_gather_fp16_weights_on_model_save"}}},
      {"lm-sys__FastChat__playground_deepspeed_config_s2.json", {}},
      {"lm-sys__FastChat__playground_deepspeed_config_s3.json", {}},
      {"microsoft__DeepSpeedExamples__training_autotuning_hf_dsconfigs_ds_"
       "config_fp16_z3.json",
       {}},
      {"microsoft__DeepSpeedExamples__training_imagenet_config_ds_fp16_z1_"
       "config.json",
       {"",
        {"zero_allow_untested_optimizer", "cuda_visible_devices",
         "fp16.auto_cast"}}},
      {"microsoft__DeepSpeed__tests_model_Megatron_GPT2_ds_config_func_bs8_"
       "zero2_offload.json",
       {"",
        {"zero_optimization.cpu_offload",
         "activation_checkpointing.partition_activations",
         "activation_checkpointing.contiguous_memory_optimization"}}},
      // DeepSpeedBF16Config forbids the fp16 loss-scaling keys.
      {"microsoft__DeepSpeed__tests_torch_compile_ds_config_z3.json",
       {"bf16.loss_scale", {}}},
      {"microsoft__Megatron-DeepSpeed__examples_deepspeed_curriculum_"
       "learning_ds_zero_stage_1_config_baseline.json",
       {"", {"optimizer.params.max_grad_norm"}}},
      {"microsoft__Megatron-DeepSpeed__examples_deepspeed_finetune_hf_llama_"
       "ds_config.json",
       {}},
      // train_batch_size 16 = micro 16 x accumulation x world: world size 1
      // only (DeepSpeed: "Gradient accumulation steps: 0").
      {"microsoft__Megatron-DeepSpeed__examples_deepspeed_universal_"
       "checkpointing_ds_config.json",
       {"train_batch_size", {}}},
      {"modelscope__ms-swift__swift_config_zero3.json", {}},
      {"nlpxucan__WizardLM__training_src_configs_deepspeed_config.json", {}},
      {"tatsu-lab__stanford_alpaca__configs_default_offload_opt_param.json",
       {}},
      // DeepSpeedFP16Config: min_loss_scale is an int; 1e-10 is refused.
      {"ymcui__Chinese-LLaMA-Alpaca__scripts_training_ds_zero2_no_offload.json",
       {"fp16.min_loss_scale", {}}},
      {"yuanzhoulvpi2017__zero_nlp__train_qwen_ds_zero2_no_offload.json",
       {"fp16.min_loss_scale", {}}},
  };
  return *table;
}

std::vector<std::string> CorpusFiles() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(kDir)) {
    if (entry.path().extension() == ".json") {
      names.push_back(entry.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Resolves every "auto" as the engine would for some model and run.
ResolutionContext Context(int world_size) {
  ResolutionContext context;
  context.world_size = world_size;
  context.hidden_size = 64;
  context.micro_batch_size_per_gpu = 2;
  context.gradient_accumulation_steps = 2;
  context.learning_rate = 1e-4;
  context.betas = std::array<double, 2>{0.9, 0.999};
  context.eps = 1e-8;
  context.weight_decay = 0.0;
  context.gradient_clipping = 1.0;
  context.total_num_steps = 100;
  context.warmup_num_steps = 10;
  context.precision = TrainingPrecision::kBf16;
  return context;
}

TEST(RealWorldConfigsTest, EveryFileHasTheVerdictInTheTable) {
  const std::vector<std::string> files = CorpusFiles();
  ASSERT_EQ(files.size(), 42u);
  ASSERT_EQ(files.size(), Table().size());
  int loaded = 0;
  for (const std::string& name : files) {
    SCOPED_TRACE(name);
    auto row = Table().find(name);
    ASSERT_NE(row, Table().end()) << "not in the table";
    const Verdict& verdict = row->second;
    const std::string path = absl::StrCat(kDir, "/", name);
    absl::StatusOr<Config> config = LoadConfigFile(path, 2);
    if (!verdict.rejected_at.empty()) {
      ASSERT_FALSE(config.ok()) << "loaded, but DeepSpeed 0.19.8 rejects it";
      const std::string message(config.status().message());
      EXPECT_TRUE(absl::StartsWith(message, path + ": ")) << message;
      EXPECT_TRUE(absl::StrContains(message, verdict.rejected_at)) << message;
      continue;
    }
    ASSERT_TRUE(config.ok()) << config.status();
    ++loaded;
    std::vector<std::string> warning_keys;
    for (const ConfigWarning& warning : ConfigWarnings(*config)) {
      warning_keys.push_back(warning.key);
      EXPECT_FALSE(warning.message.empty()) << warning.key;
    }
    EXPECT_EQ(warning_keys, verdict.warnings);
    // Usable: every "auto" resolves as Hugging Face would fill it.
    absl::StatusOr<Config> resolved = Resolve(*config, Context(2));
    ASSERT_TRUE(resolved.ok()) << resolved.status();
    EXPECT_FALSE(resolved->HasUnresolvedAuto());
  }
  // DeepSpeed 0.19.8 accepts 36 of the 42 at world size 2.
  EXPECT_EQ(loaded, 36);
}

TEST(RealWorldConfigsTest, FilesDeepSpeedAcceptsLoadAtWorldSizes1And8) {
  for (const std::string& name : CorpusFiles()) {
    const Verdict& verdict = Table().at(name);
    const std::string path = absl::StrCat(kDir, "/", name);
    // The one batch-triple rejection holds only above world size 1.
    const bool batch_only = verdict.rejected_at == "train_batch_size";
    for (int world_size : {1, 8}) {
      SCOPED_TRACE(absl::StrCat(name, " at world size ", world_size));
      absl::StatusOr<Config> config = LoadConfigFile(path, world_size);
      const bool expect_ok =
          verdict.rejected_at.empty() || (batch_only && world_size == 1);
      ASSERT_EQ(config.ok(), expect_ok) << config.status();
      if (!expect_ok) {
        EXPECT_TRUE(
            absl::StrContains(config.status().message(), verdict.rejected_at));
        continue;
      }
      absl::StatusOr<Config> resolved = Resolve(*config, Context(world_size));
      ASSERT_TRUE(resolved.ok()) << resolved.status();
      EXPECT_EQ(resolved->train_batch_size.value(),
                resolved->train_micro_batch_size_per_gpu.value() *
                    resolved->gradient_accumulation_steps.value() * world_size);
    }
  }
}

TEST(RealWorldConfigsTest, SourcesListsEveryFile) {
  std::ifstream sources(absl::StrCat(kDir, "/SOURCES.md"));
  ASSERT_TRUE(sources) << "SOURCES.md must travel with the files";
  const std::string text((std::istreambuf_iterator<char>(sources)),
                         std::istreambuf_iterator<char>());
  for (const std::string& name : CorpusFiles()) {
    EXPECT_TRUE(absl::StrContains(text, name)) << name;
  }
}

}  // namespace
}  // namespace config
}  // namespace ze
