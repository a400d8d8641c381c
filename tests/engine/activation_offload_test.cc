// activation_checkpointing through the engine (issue 28), alone and under
// mpirun at 2 ranks, on the CPU (where the offload runs the same code with
// memcpy copies):
//   - cpu_checkpointing gives bit for bit the losses, gradient norms and
//     final f32 master weights of checkpointing without it, and both those
//     of no checkpointing at all (recompute is the same computation), for
//     the GPT and a Llama decoder at stages 0 and 3;
//   - every checkpointed block's input went through the offload, and
//     nothing is left held after the steps;
//   - the engine installs the offload from the config and removes it for a
//     config without the key; the startup log says what it does, and warns
//     when no module is checkpointed; partition_activations warns that it
//     needs tensor parallelism.
#include "nn/activation_offload.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/communicator.h"
#include "gtest/gtest.h"
#include "nn/decoder.h"
#include "tests/engine/engine_test_util.h"

namespace ze {
namespace enginetest {
namespace {

constexpr int kSteps = 3;
constexpr int kLayers = 3;

std::string ConfigJson(int stage, bool cpu_checkpointing,
                       const std::string& extra = "",
                       DType dtype = DType::kBF16) {
  return absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,)",
      R"("bf16": {"enabled": )", dtype == DType::kBF16 ? "true" : "false", "},",
      R"("optimizer": {"type": "AdamW", "params": {"lr": 0.01, "eps": 1e-3, "weight_decay": 0.01}},)",
      R"("activation_checkpointing": {"cpu_checkpointing": )",
      cpu_checkpointing ? "true" : "false", extra, "},",
      R"("zero_optimization": {"stage": )", stage,
      R"(, "reduce_bucket_size": 700, "stage3_param_persistence_threshold": 0}})");
}

enum class Family { kGpt, kLlama };
const char* Name(Family family) {
  return family == Family::kGpt ? "gpt" : "llama";
}

// recompute: the MLPs' selective recompute (recompute_activations).
absl::StatusOr<std::shared_ptr<nn::LossModel>> MakeModel(
    Family family, bool checkpointing, bool recompute = false,
    DType dtype = DType::kBF16) {
  if (family == Family::kGpt) {
    nn::GptConfig config = SmallGpt(16, kLayers, 2);
    config.activation_checkpointing = checkpointing;
    config.recompute_activations = recompute;
    ZE_ASSIGN_OR_RETURN(std::shared_ptr<nn::GptModel> gpt,
                        MakeGpt(config, dtype));
    return std::shared_ptr<nn::LossModel>(std::move(gpt));
  }
  nn::DecoderConfig config;
  config.family = nn::DecoderFamily::kLlama;
  config.num_layers = kLayers;
  config.hidden_size = 16;
  config.num_heads = 2;
  config.num_kv_heads = 1;
  config.head_dim = 8;
  config.intermediate_size = 24;
  config.vocab_size = kVocab;
  config.max_position_embeddings = kSeqLen;
  config.activation_checkpointing = checkpointing;
  config.recompute_activations = recompute;
  nn::DecoderOptions options;
  options.dtype = dtype;
  options.seed = 1234;
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<nn::DecoderModel> decoder,
                      nn::DecoderModel::Create(config, options));
  return std::shared_ptr<nn::LossModel>(std::move(decoder));
}

struct Training {
  std::vector<double> losses, norms;
  std::vector<float> master;
  nn::ActivationOffloadStats offload;  // zero when no offload was installed
  int held = 0;
};

Training TrainRun(Family family, int stage, bool checkpointing,
                  bool cpu_checkpointing, bool recompute = false,
                  DType dtype = DType::kBF16) {
  Training run;
  absl::StatusOr<std::shared_ptr<nn::LossModel>> model =
      MakeModel(family, checkpointing, recompute, dtype);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return run;
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine = engine::Initialize(
      *model, ConfigJson(stage, cpu_checkpointing, "", dtype), Comm());
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return run;
  for (int step = 0; step < kSteps; ++step) {
    absl::StatusOr<engine::StepReport> report = TrainStep(**engine, step);
    EXPECT_TRUE(report.ok()) << report.status();
    if (!report.ok()) return run;
    run.losses.push_back(report->loss);
    run.norms.push_back(report->grad_norm);
  }
  absl::StatusOr<std::vector<float>> master = AllMasterWeights(**engine);
  EXPECT_TRUE(master.ok()) << master.status();
  if (master.ok()) run.master = *master;
  const std::shared_ptr<nn::ActivationOffload>& offload =
      (*model)->activation_offload();
  if (offload != nullptr) {
    run.offload = offload->stats();
    run.held = offload->held();
  }
  return run;
}

void ExpectIdentical(const Training& actual, const Training& expected,
                     const std::string& what) {
  ASSERT_EQ(actual.losses.size(), static_cast<size_t>(kSteps)) << what;
  ASSERT_EQ(expected.losses.size(), static_cast<size_t>(kSteps)) << what;
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_EQ(
        std::memcmp(&actual.losses[i], &expected.losses[i], sizeof(double)), 0)
        << what << " step " << i << ": loss " << actual.losses[i] << " against "
        << expected.losses[i];
    EXPECT_EQ(std::memcmp(&actual.norms[i], &expected.norms[i], sizeof(double)),
              0)
        << what << " step " << i << ": norm " << actual.norms[i] << " against "
        << expected.norms[i];
  }
  ASSERT_FALSE(expected.master.empty()) << what;
  ASSERT_EQ(actual.master.size(), expected.master.size()) << what;
  EXPECT_EQ(std::memcmp(actual.master.data(), expected.master.data(),
                        expected.master.size() * sizeof(float)),
            0)
      << what << ": master weights differ";
}

TEST(ActivationOffloadEngineTest, CpuCheckpointingTrainsBitForBit) {
  for (Family family : {Family::kGpt, Family::kLlama}) {
    for (int stage : {0, 3}) {
      const std::string what =
          absl::StrCat(Name(family), " stage ", stage, " world ", World());
      const Training plain = TrainRun(family, stage, false, false);
      const Training recomputed = TrainRun(family, stage, true, false);
      const Training offloaded = TrainRun(family, stage, true, true);
      ExpectIdentical(recomputed, plain, what + " recompute");
      ExpectIdentical(offloaded, recomputed, what + " cpu_checkpointing");
      // Every block's input of every micro-batch went out; in each
      // backward the last block's was still on the device and the others'
      // had been prefetched.
      const int64_t micro_batches = kSteps * 2;
      EXPECT_EQ(offloaded.offload.offloaded, micro_batches * kLayers) << what;
      EXPECT_EQ(offloaded.offload.restored, micro_batches * kLayers) << what;
      EXPECT_EQ(offloaded.offload.prefetched, micro_batches * (kLayers - 1))
          << what;
      EXPECT_EQ(offloaded.offload.kept_newest, micro_batches) << what;
      EXPECT_EQ(offloaded.offload.ring_misses, 0) << what;
      EXPECT_EQ(offloaded.held, 0) << what;
      EXPECT_EQ(recomputed.offload.saved, 0) << what;
    }
  }
}

// Issue 28's finer recompute: the MLPs recompute their activation function
// in backward instead of keeping its output (Module::
// set_recompute_activation). Bit for bit the losses, gradient norms and
// master weights of the plain run at every stage, alone, with block
// checkpointing and with cpu_checkpointing: the decoder's SwiGLU in bf16
// (the same kernel on the same saved gate and up), GPT's GELU in f32 (in
// bf16 its forward GELU reads the unrounded pre-activation inside fc's
// product, the recomputation the rounded one).
TEST(ActivationOffloadEngineTest, RecomputedActivationsTrainBitForBit) {
  for (Family family : {Family::kGpt, Family::kLlama}) {
    const DType dtype = family == Family::kGpt ? DType::kF32 : DType::kBF16;
    for (int stage : {0, 1, 2, 3}) {
      const std::string what =
          absl::StrCat(Name(family), " ", DTypeName(dtype), " stage ", stage,
                       " world ", World());
      const Training plain =
          TrainRun(family, stage, false, false, false, dtype);
      const Training selective =
          TrainRun(family, stage, false, false, true, dtype);
      ExpectIdentical(selective, plain, what + " recompute_activations");
      if (stage == 0 || stage == 3) {
        const Training both = TrainRun(family, stage, true, true, true, dtype);
        ExpectIdentical(both, plain,
                        what + " recompute_activations + cpu_checkpointing");
      }
    }
  }
}

TEST(ActivationOffloadEngineTest, InstalledFromTheConfigAndLogged) {
  absl::StatusOr<std::shared_ptr<nn::LossModel>> model =
      MakeModel(Family::kGpt, true);
  ASSERT_TRUE(model.ok()) << model.status();
  {
    StderrCapture capture;
    auto engine = engine::Initialize(*model, ConfigJson(1, true), Comm());
    const std::string log = capture.Finish();
    ASSERT_TRUE(engine.ok()) << engine.status();
    ASSERT_NE((*model)->activation_offload(), nullptr);
    for (nn::Module* module : (*model)->Modules()) {
      EXPECT_EQ(module->activation_offload(), (*model)->activation_offload())
          << module->DisplayName();
    }
    if (Rank() == 0) {
      EXPECT_TRUE(absl::StrContains(
          log, absl::StrCat("the inputs of ", kLayers, " checkpointed modules",
                            " go to host memory")))
          << log;
    }
  }
  // The engine gone, the model no longer holds its offload.
  for (nn::Module* module : (*model)->Modules()) {
    EXPECT_EQ(module->activation_offload(), nullptr) << module->DisplayName();
  }
  // The same model under a config without the key: back on the device.
  auto engine = engine::Initialize(*model, ConfigJson(1, false), Comm());
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (nn::Module* module : (*model)->Modules()) {
    EXPECT_EQ(module->activation_offload(), nullptr) << module->DisplayName();
  }
}

TEST(ActivationOffloadEngineTest, WarnsWhereItCannotAct) {
  absl::StatusOr<std::shared_ptr<nn::LossModel>> model =
      MakeModel(Family::kGpt, false);
  ASSERT_TRUE(model.ok()) << model.status();
  StderrCapture capture;
  auto engine = engine::Initialize(
      *model, ConfigJson(0, true, R"(, "partition_activations": true)"),
      Comm());
  const std::string log = capture.Finish();
  ASSERT_TRUE(engine.ok()) << engine.status();
  if (Rank() != 0) return;  // rank 0 logs
  EXPECT_TRUE(absl::StrContains(log, "no module of the model is checkpointed"))
      << log;
  EXPECT_TRUE(absl::StrContains(
      log,
      "activation_checkpointing.partition_activations is set but has no "
      "effect in zero-engine"))
      << log;
  EXPECT_TRUE(absl::StrContains(log, "tensor parallelism")) << log;
}

}  // namespace
}  // namespace enginetest
}  // namespace ze

int main(int argc, char** argv) {
  return ze::enginetest::RunAllTests(argc, argv);
}
