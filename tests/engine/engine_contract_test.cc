// Contracts of engine/engine.h, through the public API at every ZeRO stage:
//   - the header's usage example compiles and trains as written;
//   - Forward while a Backward is still owed fails with FailedPrecondition
//     and loses nothing (the owed Backward and the step still work);
//   - ranks' losses are weighed equally, whatever number of targets each
//     rank counts (nn/loss_model.h): the step's loss is the mean of the
//     ranks' mean losses, as DeepSpeed and DDP average gradients.
//
// Run alone (world size 1) and under mpirun at 2 and 3 ranks (BUILD.bazel).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/ops.h"
#include "core/status.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"

namespace ze {
namespace enginetest {
namespace {

constexpr int kMicroBatch = 2;

std::string Config(int stage) {
  return absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,)",
      R"( "steps_per_print": 1000,)",
      R"( "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},)",
      R"( "zero_optimization": {"stage": )", stage,
      R"(, "stage3_param_persistence_threshold": 0}})");
}

// This rank's micro-batch `step`: (kMicroBatch, kSeqLen) i32 each.
std::pair<Tensor, Tensor> MicroBatch(int64_t step) {
  Tensor tokens =
      Tensor::Empty({kMicroBatch, kSeqLen}, DType::kI32, Device::Cpu()).value();
  Tensor targets =
      Tensor::Empty({kMicroBatch, kSeqLen}, DType::kI32, Device::Cpu()).value();
  for (int i = 0; i < kMicroBatch; ++i) {
    FillSample((step * World() + Rank()) * kMicroBatch + i,
               tokens.data_as<int32_t>() + i * kSeqLen,
               targets.data_as<int32_t>() + i * kSeqLen);
  }
  return {tokens, targets};
}

// engine.h's example, as written there (with the batches it elides).
absl::Status TrainLikeTheHeader(std::shared_ptr<nn::LossModel> model,
                                const std::string& config_path, int steps,
                                std::vector<float>* losses) {
  ZE_ASSIGN_OR_RETURN(auto engine,
                      ze::engine::Initialize(model, config_path, Comm()));
  for (int step = 0; step < steps; ++step) {  // one micro-batch per call
    auto [tokens, targets] = MicroBatch(step);
    ZE_ASSIGN_OR_RETURN(float loss, engine->Forward(tokens, targets));
    ZE_RETURN_IF_ERROR(engine->Backward());
    ZE_RETURN_IF_ERROR(engine->Step().status());  // updates at the
    losses->push_back(loss);                      // accumulation boundary
  }
  return absl::OkStatus();
}

// A DeepSpeed config's keys that zero-engine accepts without acting on them
// (kept without effect, or read and ignored, or unknown at the top level)
// are named at startup (rank 0), with the reason, so nobody believes they
// took effect.
TEST(EngineStartupTest, WarnsOfSettingsWithoutEffect) {
  absl::StatusOr<std::shared_ptr<nn::GptModel>> model =
      MakeGpt(SmallGpt(), DType::kF32);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string config = absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000,)",
      R"( "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},)",
      R"( "zero_optimization": {"stage": 3, "zero_quantized_weights": true},)",
      R"( "activation_checkpointing": {"cpu_checkpointing": true,)",
      R"(                              "partition_activations": true},)",
      R"( "zero_allow_untested_optimizer": true, "log": {"level": 1}})");
  ::testing::internal::CaptureStderr();
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine =
      engine::Initialize(*model, config, Comm());
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(engine.ok()) << engine.status();
  const bool quantized = absl::StrContains(
      log,
      "zero_optimization.zero_quantized_weights is set but has no effect in "
      "zero-engine: ZeRO++ weight quantization is not implemented");
  const bool partitioning = absl::StrContains(
      log,
      "activation_checkpointing.partition_activations is set but has no "
      "effect in zero-engine: it splits saved inputs across tensor-parallel "
      "ranks");
  // cpu_checkpointing acts, but on checkpointed modules only, and SmallGpt
  // checkpoints none.
  const bool nothing_to_offload = absl::StrContains(
      log,
      "activation_checkpointing.cpu_checkpointing is set but no module of "
      "the model is checkpointed");
  const bool ignored = absl::StrContains(
      log,
      "zero_allow_untested_optimizer is ignored: every optimizer "
      "zero-engine has (Adam, AdamW, SGD) is supported at every ZeRO stage");
  const bool unknown = absl::StrContains(
      log, "log is ignored: not a key zero-engine or DeepSpeed reads");
  EXPECT_EQ(quantized, Rank() == 0) << log;
  EXPECT_EQ(partitioning, Rank() == 0) << log;
  EXPECT_EQ(nothing_to_offload, Rank() == 0) << log;
  EXPECT_EQ(ignored, Rank() == 0) << log;
  EXPECT_EQ(unknown, Rank() == 0) << log;
}

class EngineContractTest : public ::testing::TestWithParam<int> {};

TEST_P(EngineContractTest, HeaderExampleTrains) {
  const int stage = GetParam();
  const std::string path =
      absl::StrCat(std::getenv("TEST_TMPDIR"), "/contract_stage", stage,
                   "_rank", Rank(), ".json");
  std::FILE* file = std::fopen(path.c_str(), "w");
  ASSERT_NE(file, nullptr) << path;
  const std::string text = Config(stage);
  std::fwrite(text.data(), 1, text.size(), file);
  std::fclose(file);
  absl::StatusOr<std::shared_ptr<nn::GptModel>> model =
      MakeGpt(SmallGpt(), DType::kF32);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<float> losses;
  const absl::Status status = TrainLikeTheHeader(*model, path, 8, &losses);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(losses.size(), 8u);
  EXPECT_LT(losses.back(), losses.front()) << "the loss did not fall";
}

TEST_P(EngineContractTest, ForwardWhileBackwardOwedFailsAndLosesNothing) {
  const int stage = GetParam();
  absl::StatusOr<std::shared_ptr<nn::GptModel>> model =
      MakeGpt(SmallGpt(), DType::kF32);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine =
      engine::Initialize(*model, Config(stage), Comm());
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto [tokens, targets] = MicroBatch(0);
  absl::StatusOr<float> first = (*engine)->Forward(tokens, targets);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<float> second = (*engine)->Forward(tokens, targets);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("Backward"), std::string::npos)
      << second.status();
  EXPECT_NE(second.status().message().find(absl::StrCat("rank ", Rank())),
            std::string::npos)
      << second.status();
  // The owed Backward and the step still work, and the next micro-step
  // trains as usual.
  ASSERT_TRUE((*engine)->Backward().ok());
  absl::StatusOr<engine::StepReport> report = (*engine)->Step();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->boundary);
  EXPECT_EQ((*engine)->counters().global_steps, 1);
  auto [tokens1, targets1] = MicroBatch(1);
  ASSERT_TRUE((*engine)->Forward(tokens1, targets1).ok());
  ASSERT_TRUE((*engine)->Backward().ok());
  ASSERT_TRUE((*engine)->Step().ok());
}

// The model run by hand after Initialize (a habit from eager PyTorch) fails
// at once, naming the module, and costs the engine nothing: the training
// step after it gives the loss a fresh engine's first step gives.
TEST_P(EngineContractTest, ModelRunOutsideTheEngineFailsAndLosesNothing) {
  const int stage = GetParam();
  auto [tokens, targets] = MicroBatch(0);
  absl::StatusOr<std::shared_ptr<nn::GptModel>> reference_model =
      MakeGpt(SmallGpt(), DType::kF32);
  ASSERT_TRUE(reference_model.ok()) << reference_model.status();
  absl::StatusOr<std::unique_ptr<engine::Engine>> reference =
      engine::Initialize(*reference_model, Config(stage), Comm());
  ASSERT_TRUE(reference.ok()) << reference.status();
  absl::StatusOr<float> expected = (*reference)->Forward(tokens, targets);
  ASSERT_TRUE(expected.ok()) << expected.status();

  absl::StatusOr<std::shared_ptr<nn::GptModel>> model =
      MakeGpt(SmallGpt(), DType::kF32);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine =
      engine::Initialize(*model, Config(stage), Comm());
  ASSERT_TRUE(engine.ok()) << engine.status();
  absl::StatusOr<float> by_hand =
      (*model)->ForwardLoss(tokens, targets, Stream());
  ASSERT_FALSE(by_hand.ok());
  EXPECT_EQ(by_hand.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(
      absl::StrContains(by_hand.status().message(), "outside the engine"))
      << by_hand.status();
  EXPECT_TRUE(absl::StrContains(by_hand.status().message(),
                                absl::StrCat("rank ", Rank())))
      << by_hand.status();
  absl::StatusOr<float> loss = (*engine)->Forward(tokens, targets);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_EQ(*loss, *expected);
  ASSERT_TRUE((*engine)->Backward().ok());
  ASSERT_TRUE((*engine)->Step().ok());
  ASSERT_TRUE((*reference)->Backward().ok());
  ASSERT_TRUE((*reference)->Step().ok());
}

// EvalOutputs is model(inputs) without a backward: the GPT's logits, whose
// cross-entropy is EvalForward's loss, and the training state is untouched
// (the next step's loss is a fresh engine's).
TEST_P(EngineContractTest, EvalOutputsAreTheLogitsOfEvalForwardsLoss) {
  const int stage = GetParam();
  absl::StatusOr<std::shared_ptr<nn::GptModel>> model =
      MakeGpt(SmallGpt(), DType::kF32);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine =
      engine::Initialize(*model, Config(stage), Comm());
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto [tokens, targets] = MicroBatch(0);
  absl::StatusOr<Tensor> logits = (*engine)->EvalOutputs(tokens);
  ASSERT_TRUE(logits.ok()) << logits.status();
  ASSERT_EQ(logits->dim(), 3);
  ASSERT_EQ(logits->size(0), kMicroBatch);
  ASSERT_EQ(logits->size(1), kSeqLen);
  const int64_t classes = logits->size(2);
  ASSERT_GE(classes, kVocab);
  absl::StatusOr<std::vector<float>> values =
      ToHostFloats(*logits, (*engine)->compute_stream());
  ASSERT_TRUE(values.ok()) << values.status();
  // Mean cross-entropy over every position, in double.
  double sum = 0;
  const int32_t* target = targets.data_as<int32_t>();
  for (int64_t row = 0; row < kMicroBatch * kSeqLen; ++row) {
    const float* z = values->data() + row * classes;
    double largest = z[0];
    for (int64_t c = 1; c < classes; ++c)
      largest = std::max<double>(largest, z[c]);
    double total = 0;
    for (int64_t c = 0; c < classes; ++c) total += std::exp(z[c] - largest);
    sum += std::log(total) + largest - z[target[row]];
  }
  const double from_logits = sum / (kMicroBatch * kSeqLen);
  absl::StatusOr<float> loss = (*engine)->EvalForward(tokens, targets);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(from_logits, *loss, 1e-5 * std::max(1.0, from_logits));
  // Nothing of training changed: the first training step's loss is the
  // evaluation's.
  absl::StatusOr<float> trained = (*engine)->Forward(tokens, targets);
  ASSERT_TRUE(trained.ok()) << trained.status();
  EXPECT_EQ(*trained, *loss);
  ASSERT_TRUE((*engine)->Backward().ok());
  ASSERT_TRUE((*engine)->Step().ok());
}

TEST_P(EngineContractTest, RanksLossesWeighEquallyWhateverTheyCount) {
  const int stage = GetParam();
  absl::StatusOr<std::shared_ptr<nn::GptModel>> model =
      MakeGpt(SmallGpt(), DType::kF32);
  ASSERT_TRUE(model.ok()) << model.status();
  auto engine = engine::Initialize(*model, Config(stage), Comm());
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (int step = 0; step < 3; ++step) {
    auto [tokens, targets] = MicroBatch(step);
    // Rank r keeps only the last r + 1 targets of each row (a target < 0 is
    // ignored), so ranks average over different numbers of targets.
    int32_t* target = targets.data_as<int32_t>();
    for (int i = 0; i < kMicroBatch; ++i) {
      for (int t = 0; t < kSeqLen - (Rank() + 1); ++t) {
        target[i * kSeqLen + t] = -1;
      }
    }
    absl::StatusOr<float> loss = (*engine)->Forward(tokens, targets);
    ASSERT_TRUE(loss.ok()) << loss.status();
    ASSERT_EQ((*model)->counted_targets(), kMicroBatch * (Rank() + 1));
    ASSERT_TRUE((*engine)->Backward().ok());
    absl::StatusOr<engine::StepReport> report = (*engine)->Step();
    ASSERT_TRUE(report.ok()) << report.status();
    // Every rank's (loss, counted targets), summed over ranks.
    Tensor sums =
        FromHostFloats({*loss, *loss * (*model)->counted_targets(),
                        static_cast<float>((*model)->counted_targets())},
                       {3}, DType::kF32, Device::Cpu(), Stream())
            .value();
    ASSERT_TRUE(Comm()
                    ->AllReduce(sums, sums, comm::ReduceOp::kSum, Stream())
                    .value()
                    .Wait()
                    .ok());
    const float* sum = sums.data_as<float>();
    const double equal_weights = sum[0] / World();
    const double by_targets = sum[1] / sum[2];
    EXPECT_NEAR(report->loss, equal_weights, 1e-6 * std::abs(equal_weights))
        << "step " << step;
    if (World() > 1) {
      // The two weightings differ here, so the check above can tell them
      // apart.
      EXPECT_GT(std::abs(equal_weights - by_targets), 1e-4) << "step " << step;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, EngineContractTest,
                         ::testing::Values(0, 1, 2, 3));

}  // namespace
}  // namespace enginetest
}  // namespace ze

int main(int argc, char** argv) {
  return ze::enginetest::RunAllTests(argc, argv);
}
