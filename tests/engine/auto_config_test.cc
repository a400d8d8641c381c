// "auto" config values through engine::Initialize(model, path): the shipped
// examples/configs/zero2_auto.json and Hugging Face's ZeRO-3 ds_config
// template (tests/engine/testdata/hf_zero3_auto.json) train unchanged.
// Initialize fills what the model and the job tell (the hidden size's
// bucket sizes, fp16/bf16.enabled from the model's dtype, the world size);
// what only the run knows comes from the caller's hints, as HF's
// TrainingArguments supply it. An "auto" without a hint is a named error.
//
// Run alone (world size 1) and under mpirun at 2 ranks (BUILD.bazel).
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"

namespace ze {
namespace enginetest {
namespace {

std::string RunfilePath(const std::string& path) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/zero_engine/", path);
}

// What HF's Trainer would pass from its TrainingArguments.
config::ResolutionContext TrainingArguments() {
  config::ResolutionContext hints;
  hints.micro_batch_size_per_gpu = 2;
  hints.gradient_accumulation_steps = 2;
  hints.learning_rate = 3e-3;
  hints.betas = std::array<double, 2>{0.9, 0.95};
  hints.eps = 1e-8;
  hints.weight_decay = 0.01;
  hints.gradient_clipping = 1.0;
  hints.warmup_num_steps = 2;
  hints.total_num_steps = 20;
  return hints;
}

class AutoConfigTest : public ::testing::TestWithParam<const char*> {};

TEST_P(AutoConfigTest, TrainsUnchangedWithTheModelsValues) {
  const std::string path = RunfilePath(GetParam());
  const nn::GptConfig shape = SmallGpt(/*channels=*/32);
  absl::StatusOr<std::shared_ptr<nn::GptModel>> model =
      MakeGpt(shape, DType::kBF16);
  ASSERT_TRUE(model.ok()) << model.status();
  auto engine = engine::Initialize(*model, path, Comm(), TrainingArguments());
  ASSERT_TRUE(engine.ok()) << engine.status();
  const config::Config& resolved = (*engine)->config();
  const int64_t hidden = shape.channels;
  EXPECT_FALSE(resolved.HasUnresolvedAuto());
  EXPECT_EQ(resolved.zero_optimization.reduce_bucket_size.value(),
            hidden * hidden);
  EXPECT_EQ(config::GetTrainingPrecision(resolved),
            config::TrainingPrecision::kBf16);
  EXPECT_EQ(resolved.train_batch_size.value(), 2 * 2 * World());
  if (resolved.zero_optimization.stage == 3) {
    EXPECT_EQ(resolved.zero_optimization.stage3_prefetch_bucket_size.value(),
              static_cast<int64_t>(0.9 * hidden * hidden));
    EXPECT_EQ(
        resolved.zero_optimization.stage3_param_persistence_threshold.value(),
        10 * hidden);
  }
  double first = 0;
  double last = 0;
  for (int step = 0; step < 6; ++step) {
    absl::StatusOr<engine::StepReport> report = TrainStep(**engine, step);
    ASSERT_TRUE(report.ok()) << report.status();
    ASSERT_TRUE(report->boundary);
    if (step == 0) first = report->loss;
    last = report->loss;
  }
  EXPECT_LT(last, first) << "the loss did not fall";
}

TEST_P(AutoConfigTest, AnAutoValueWithoutAHintIsNamed) {
  const std::string path = RunfilePath(GetParam());
  absl::StatusOr<std::shared_ptr<nn::GptModel>> model =
      MakeGpt(SmallGpt(), DType::kBF16);
  ASSERT_TRUE(model.ok()) << model.status();
  config::ResolutionContext hints = TrainingArguments();
  hints.learning_rate.reset();
  auto engine = engine::Initialize(*model, path, Comm(), hints);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("optimizer.params.lr"),
            std::string::npos)
      << engine.status();
}

INSTANTIATE_TEST_SUITE_P(
    Configs, AutoConfigTest,
    ::testing::Values("examples/configs/zero2_auto.json",
                      "tests/engine/testdata/hf_zero3_auto.json"));

}  // namespace
}  // namespace enginetest
}  // namespace ze

int main(int argc, char** argv) {
  return ze::enginetest::RunAllTests(argc, argv);
}
