// fp16 dynamic loss scaling through the public engine API: an inf injected
// into one rank's gradient at chosen steps must make EVERY rank skip the
// step (the overflow flag is reduced across ranks), leave the weights and the
// learning-rate schedule untouched, count the skip, log it on rank 0 with the
// old and new scale, and move the scale exactly as DeepSpeed's
// DynamicLossScaler does.
//
// Run alone (world size 1) and under mpirun at 2 ranks (see BUILD.bazel).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"

namespace ze {
namespace enginetest {
namespace {

constexpr int kSteps = 13;
// 0-based steps whose gradient gets an inf on the injecting rank.
bool Injected(int step) {
  return step == 1 || step == 2 || (step >= 6 && step <= 9);
}

// Hand-computed from DeepSpeed's DynamicLossScaler.update_scale with
// initial_scale_power 4 (16), hysteresis 2, loss_scale_window 3,
// min_loss_scale 4 (iter = 0-based step, last = last overflow iter, -1 at
// the start; a clean step doubles when (iter - last) % 3 == 0):
//   iter 0 clean (1 % 3)              16, hysteresis 2
//   iter 1 overflow, hysteresis 2->1  16
//   iter 2 overflow, halve            8
//   iter 3, 4 clean (1, 2)            8
//   iter 5 clean (3): double, hyst 2  16
//   iter 6 overflow, hysteresis 2->1  16
//   iter 7 overflow, halve            8
//   iter 8 overflow, halve            4
//   iter 9 overflow, floor            4 (max(2, min_loss_scale))
//   iter 10, 11 clean (1, 2)          4
//   iter 12 clean (3): double         8
// The scale in effect for step s's backward is the one after step s-1.
const double kScaleAfter[kSteps] = {16, 16, 8, 8, 8, 16, 16, 8, 4, 4, 4, 4, 8};
// The rank-0 log line DeepSpeed's wording gives for each skipped step.
std::string ExpectedSkipLine(int step) {
  const char* tail = "";
  switch (step) {
    case 1:
    case 6:
      tail = "16, but hysteresis is 2. Reducing hysteresis to 1";
      break;
    case 2:
    case 7:
      tail = "16, reducing to 8";
      break;
    case 8:
      tail = "8, reducing to 4";
      break;
    case 9:
      tail = "4, reducing to 4";
      break;
  }
  return absl::StrCat(
      "step ", step + 1,
      ": OVERFLOW! Skipping step. Attempted loss scale: ", tail);
}

// WarmupLR, linear, min 0.01, max 0.1 over 20 steps, as DeepSpeed defines
// it: the update after `applied` non-skipped steps uses iteration
// applied - 1 (min_lr before the first).
double ExpectedLearningRate(int applied) {
  const int i = applied - 1;
  if (i < 0) return 0.01;
  return 0.01 + (0.1 - 0.01) * i / 20.0;
}

std::string Config(int stage, int accumulation) {
  return absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": )",
      accumulation, R"(, "steps_per_print": 1,)",
      R"("optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}},)",
      R"("scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.01,)",
      R"( "warmup_max_lr": 0.1, "warmup_num_steps": 20, "warmup_type": "linear"}},)",
      R"("fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 4,)",
      R"( "loss_scale_window": 3, "hysteresis": 2, "min_loss_scale": 4},)",
      R"("zero_optimization": {"stage": )", stage,
      R"(, "reduce_bucket_size": 300}})");
}

absl::StatusOr<std::vector<float>> ModelWeights(nn::GptModel& model) {
  std::vector<float> all;
  for (nn::Parameter* parameter : model.Parameters()) {
    ZE_ASSIGN_OR_RETURN(Tensor data, parameter->data());
    ZE_ASSIGN_OR_RETURN(std::vector<float> values,
                        ToHostFloats(data, Stream()));
    all.insert(all.end(), values.begin(), values.end());
  }
  return all;
}

class LossScaleTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(LossScaleTest, InjectedInfIsSkippedCountedLoggedAndScaled) {
  const auto [stage, accumulation] = GetParam();
  absl::StatusOr<std::shared_ptr<nn::GptModel>> made =
      MakeGpt(SmallGpt(), DType::kF16);
  ASSERT_TRUE(made.ok()) << made.status();
  std::shared_ptr<nn::GptModel> model = *made;

  // Only the last rank injects: every other rank sees clean gradients of its
  // own and must still skip. The hook is added before Initialize so it runs
  // before the engine's own post-backward hook, which may send the bucket
  // holding ln_f's gradients off to be reduced.
  const int injecting_rank = World() - 1;
  bool inject = false;
  model->ln_f()->AddHook(
      nn::HookKind::kPostBackward,
      [&inject, injecting_rank](nn::Module& module,
                                const Stream& stream) -> absl::Status {
        if (!inject || Rank() != injecting_rank) return absl::OkStatus();
        inject = false;  // once per step, in its first micro-batch
        const Tensor& grad = module.DirectParameters()[0]->grad();
        return Fill(grad.Slice(3, 1), std::numeric_limits<float>::infinity(),
                    stream);
      });

  absl::StatusOr<std::unique_ptr<engine::Engine>> created =
      engine::Initialize(model, Config(stage, accumulation), Comm());
  ASSERT_TRUE(created.ok()) << created.status();
  engine::Engine& engine = **created;
  ASSERT_EQ(engine.current_loss_scale(), 16.0);

  int skipped = 0;
  int applied = 0;
  for (int step = 0; step < kSteps; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    absl::StatusOr<std::vector<float>> master_before = AllMasterWeights(engine);
    absl::StatusOr<std::vector<float>> model_before = ModelWeights(*model);
    ASSERT_TRUE(master_before.ok() && model_before.ok());
    const double scale_before = engine.current_loss_scale();

    inject = Injected(step);
    StderrCapture capture;
    absl::StatusOr<engine::StepReport> report = TrainStep(engine, step);
    const std::string log = capture.Finish();
    ASSERT_TRUE(report.ok()) << report.status();

    EXPECT_TRUE(report->boundary);
    EXPECT_EQ(report->skipped, Injected(step));
    EXPECT_EQ(report->loss_scale, scale_before);
    EXPECT_EQ(report->loss_scale, step == 0 ? 16.0 : kScaleAfter[step - 1]);
    EXPECT_EQ(engine.current_loss_scale(), kScaleAfter[step]);
    // The schedule advances only on applied steps.
    EXPECT_DOUBLE_EQ(report->learning_rate, ExpectedLearningRate(applied));
    EXPECT_DOUBLE_EQ(engine.current_learning_rate(),
                     ExpectedLearningRate(applied + (Injected(step) ? 0 : 1)));

    absl::StatusOr<std::vector<float>> master_after = AllMasterWeights(engine);
    absl::StatusOr<std::vector<float>> model_after = ModelWeights(*model);
    ASSERT_TRUE(master_after.ok() && model_after.ok());
    if (Injected(step)) {
      ++skipped;
      EXPECT_EQ(*master_after, *master_before)
          << "a skipped step moved weights";
      EXPECT_EQ(*model_after, *model_before);
    } else {
      ++applied;
      EXPECT_NE(*master_after, *master_before) << "a clean step did nothing";
      EXPECT_TRUE(std::isfinite(report->loss));
    }
    // DeepSpeed counts a skipped step in global_steps (and in
    // global_samples) and separately in skipped_steps.
    EXPECT_EQ(engine.counters().global_steps, step + 1);
    EXPECT_EQ(engine.counters().skipped_steps, skipped);
    EXPECT_EQ(engine.counters().micro_steps, (step + 1) * accumulation);
    EXPECT_EQ(engine.counters().global_samples,
              (step + 1) * engine.config().train_batch_size.value());

    const bool logged = log.find("OVERFLOW") != std::string::npos;
    if (Rank() == 0) {
      EXPECT_EQ(logged, Injected(step)) << log;
      if (Injected(step)) {
        EXPECT_NE(log.find(ExpectedSkipLine(step)), std::string::npos)
            << "expected \"" << ExpectedSkipLine(step) << "\" in:\n"
            << log;
      }
      // The steps_per_print line reports the scale and the skip count.
      EXPECT_NE(log.find(absl::StrCat("loss_scale ", report->loss_scale,
                                      " skipped ", skipped)),
                std::string::npos)
          << log;
    } else {
      EXPECT_FALSE(logged) << "only rank 0 logs skips:\n" << log;
    }
  }
  EXPECT_EQ(engine.counters().skipped_steps, 6);
}

INSTANTIATE_TEST_SUITE_P(
    StagesAndAccumulation, LossScaleTest,
    ::testing::Combine(::testing::Values(0, 1, 2), ::testing::Values(1, 2)),
    [](const ::testing::TestParamInfo<std::tuple<int, int>>& info) {
      return absl::StrCat("stage", std::get<0>(info.param), "_accumulation",
                          std::get<1>(info.param));
    });

}  // namespace
}  // namespace enginetest
}  // namespace ze

int main(int argc, char** argv) {
  return ze::enginetest::RunAllTests(argc, argv);
}
