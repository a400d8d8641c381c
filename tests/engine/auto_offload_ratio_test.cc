// offload_optimizer.ratio "auto" through engine::Initialize, alone and under
// mpirun at 2 and 3 ranks:
//   - with a device budget (ResolutionContext::device_memory_bytes) that
//     holds about half of the optimizer state beside the activations and
//     the reserve, the engine takes the smallest ratio whose plan fits
//     (the one planned here ratio by ratio), says so in the log, and
//     trains bit for bit like the same config with that number;
//   - a budget that holds everything takes the key's smallest share; one
//     that holds nothing takes ratio 1; without a budget the device's
//     (here the host's) free memory decides, the same on every rank;
//   - without ResolutionContext::activation_bytes Initialize refuses,
//     naming the key and the hint.
#include "engine/auto_offload_ratio.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"
#include "zero/plan.h"

namespace ze {
namespace enginetest {
namespace {

constexpr int kSteps = 3;
constexpr int64_t kLogitsSample = 1000;
constexpr int64_t kActivationBytes = 20000;

std::string ConfigJson(int stage, const std::string& ratio) {
  return absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,)",
      R"( "gradient_clipping": 1.0, "bf16": {"enabled": true},)",
      R"( "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},)",
      R"( "zero_optimization": {"stage": )", stage,
      R"(, "reduce_bucket_size": 600, "sub_group_size": 100,)",
      R"( "offload_optimizer": {"device": "cpu", "ratio": )", ratio, "}}}");
}

absl::StatusOr<std::unique_ptr<engine::Engine>> MakeEngine(
    int stage, const std::string& ratio,
    const config::ResolutionContext& hints) {
  ZE_ASSIGN_OR_RETURN(std::shared_ptr<nn::GptModel> model,
                      MakeGpt(SmallGpt(32, 3, 2), DType::kBF16));
  return engine::Initialize(model, ConfigJson(stage, ratio), Comm(), hints);
}

// The device bytes (model state, stage 3's gathers, the gradient buckets)
// of each grid ratio
// 0, 1/20, ..., 1, planned one by one.
std::vector<int64_t> DeviceBytesByRatio(int stage) {
  std::vector<int64_t> bytes;
  absl::StatusOr<std::shared_ptr<nn::GptModel>> model =
      MakeGpt(SmallGpt(32, 3, 2), DType::kBF16, /*materialize=*/false);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return bytes;
  absl::StatusOr<config::Config> config =
      config::LoadConfigString(ConfigJson(stage, "1"), World());
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return bytes;
  for (int step = 0; step <= zero::kAutoRatioSteps; ++step) {
    // Set in the struct: the key itself excludes 0.
    config->zero_optimization.offload_optimizer.ratio =
        static_cast<double>(step) / zero::kAutoRatioSteps;
    absl::StatusOr<zero::Plan> plan =
        zero::BuildPlan(**model, *config, World());
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return {};
    bytes.push_back(
        plan->memory.device_bytes + zero::GatheredWeightBytes(*plan, World()) +
        zero::GradientBucketTransientBytes(*plan, *config, World()));
  }
  return bytes;
}

// The budget whose room for model state, after the reserve and the
// activations, is exactly `model_state_bytes`.
int64_t BudgetFor(int64_t model_state_bytes) {
  int64_t budget = static_cast<int64_t>(
      static_cast<double>(model_state_bytes + kActivationBytes) /
      (1.0 - engine::kAutoRatioReserveFraction));
  // The reserve is truncated: step up to the first budget that leaves it.
  while (budget -
             static_cast<int64_t>(engine::kAutoRatioReserveFraction *
                                  static_cast<double>(budget)) -
             kActivationBytes <
         model_state_bytes) {
    ++budget;
  }
  return budget;
}

double RatioOf(const engine::Engine& engine) {
  return engine.config().zero_optimization.offload_optimizer.ratio.value();
}

TEST(AutoOffloadRatioTest, ChoosesTheSmallestFittingRatioAndTrainsLikeIt) {
  for (const int stage : {2, 3}) {
    const std::string what = absl::StrCat("stage ", stage, " world ", World());
    const std::vector<int64_t> bytes = DeviceBytesByRatio(stage);
    ASSERT_EQ(bytes.size(), zero::kAutoRatioSteps + 1) << what;
    // Room for the plan at ratio 0.5: the smallest ratio planning as few
    // bytes is the one to choose.
    const int half = zero::kAutoRatioSteps / 2;
    int expected_step = half;
    while (expected_step > 1 && bytes[expected_step - 1] <= bytes[half]) {
      --expected_step;
    }
    const double expected =
        static_cast<double>(expected_step) / zero::kAutoRatioSteps;
    ASSERT_LT(bytes[half], bytes[0]) << what;  // something moves at 0.5
    ASSERT_GT(bytes[half], bytes.back()) << what;

    config::ResolutionContext hints;
    hints.activation_bytes = kActivationBytes;
    hints.device_memory_bytes = BudgetFor(bytes[half]);
    StderrCapture log;
    absl::StatusOr<std::unique_ptr<engine::Engine>> chosen =
        MakeEngine(stage, R"("auto")", hints);
    const std::string logged = log.Finish();
    ASSERT_TRUE(chosen.ok()) << what << ": " << chosen.status();
    EXPECT_EQ(RatioOf(**chosen), expected) << what;
    if (Rank() == 0) {
      EXPECT_NE(logged.find(absl::StrFormat(
                    "offload_optimizer.ratio \"auto\": %.2f (model state on "
                    "the device",
                    expected)),
                std::string::npos)
          << what << ":\n"
          << logged;
    }
    BitwiseRun run;
    TrainRecording(**chosen, 0, kSteps, kLogitsSample, run);

    absl::StatusOr<std::unique_ptr<engine::Engine>> given =
        MakeEngine(stage, absl::StrCat(expected), config::ResolutionContext());
    ASSERT_TRUE(given.ok()) << what << ": " << given.status();
    BitwiseRun reference;
    TrainRecording(**given, 0, kSteps, kLogitsSample, reference);
    ExpectBitIdentical(run, reference, what);
  }
}

TEST(AutoOffloadRatioTest, RoomForAllTakesTheSmallestShareAndNoRoomTakesAll) {
  const std::vector<int64_t> bytes = DeviceBytesByRatio(2);
  ASSERT_EQ(bytes.size(), zero::kAutoRatioSteps + 1);
  config::ResolutionContext hints;
  hints.activation_bytes = kActivationBytes;
  hints.device_memory_bytes = BudgetFor(bytes[0]);
  StderrCapture log;
  absl::StatusOr<std::unique_ptr<engine::Engine>> roomy =
      MakeEngine(2, R"("auto")", hints);
  const std::string logged = log.Finish();
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  EXPECT_EQ(RatioOf(**roomy), 1.0 / zero::kAutoRatioSteps);
  if (Rank() == 0) {
    EXPECT_NE(logged.find("all of it would fit on the device: without "
                          "offload_optimizer nothing would go to the host"),
              std::string::npos)
        << logged;
  }

  hints.device_memory_bytes = 1;
  absl::StatusOr<std::unique_ptr<engine::Engine>> cramped =
      MakeEngine(2, R"("auto")", hints);
  ASSERT_TRUE(cramped.ok()) << cramped.status();  // no cap: it still runs
  EXPECT_EQ(RatioOf(**cramped), 1.0);

  // The host's free memory (a CPU model's device) holds this model many
  // times over.
  hints.device_memory_bytes.reset();
  absl::StatusOr<std::unique_ptr<engine::Engine>> measured =
      MakeEngine(2, R"("auto")", hints);
  ASSERT_TRUE(measured.ok()) << measured.status();
  EXPECT_EQ(RatioOf(**measured), 1.0 / zero::kAutoRatioSteps);
}

TEST(AutoOffloadRatioTest, WithoutTheActivationHintInitializeRefuses) {
  absl::StatusOr<std::unique_ptr<engine::Engine>> refused =
      MakeEngine(2, R"("auto")", config::ResolutionContext());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find(
                "zero_optimization.offload_optimizer.ratio is \"auto\" but "
                "ResolutionContext::activation_bytes was not given"),
            absl::string_view::npos)
      << refused.status();
  // The ratio's own hint needs nothing else.
  config::ResolutionContext hints;
  hints.offload_optimizer_ratio = 0.25;
  absl::StatusOr<std::unique_ptr<engine::Engine>> hinted =
      MakeEngine(2, R"("auto")", hints);
  ASSERT_TRUE(hinted.ok()) << hinted.status();
  EXPECT_EQ(RatioOf(**hinted), 0.25);
}

}  // namespace
}  // namespace enginetest
}  // namespace ze

int main(int argc, char** argv) {
  return ze::enginetest::RunAllTests(argc, argv);
}
