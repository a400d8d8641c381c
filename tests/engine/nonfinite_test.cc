// Non-finite steps in bf16 and f32 training, through the public engine API
// (issue 24): a NaN injected into one rank's gradient at chosen steps must
// make EVERY rank skip that step (the gradient norm is all-reduced), keep
// the weights, warn on rank 0 at once, and fail the
// max_consecutive_nonfinite_steps-th such step in a row on every rank; and
// SaveCheckpoint must refuse state holding inf or NaN, leaving `latest` at
// the last good checkpoint.
//
// Run alone (world size 1) and under mpirun at 2 ranks (see BUILD.bazel).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"

namespace ze {
namespace enginetest {
namespace {

namespace fs = std::filesystem;

constexpr int kLimit = 3;

std::string Config(int stage, DType dtype) {
  return absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,)",
      R"( "steps_per_print": 100, "gradient_clipping": 1.0,)",
      R"( "max_consecutive_nonfinite_steps": )", kLimit, ",",
      R"( "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},)",
      R"( "bf16": {"enabled": )", dtype == DType::kBF16 ? "true" : "false",
      R"(}, "zero_optimization": {"stage": )", stage,
      R"(, "reduce_bucket_size": 300}})");
}

std::string SharedDirectory(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string directory = absl::StrCat(base != nullptr ? base : "/tmp",
                                       "/nonfinite_w", World(), "_", name);
  if (Rank() == 0) {
    fs::remove_all(directory);
    fs::create_directories(directory);
  }
  EXPECT_TRUE(Comm()->Barrier().ok());
  return directory;
}

std::string Latest(const std::string& directory) {
  std::ifstream file(directory + "/latest");
  std::string tag;
  std::getline(file, tag);
  return tag;
}

class NonFiniteTest : public ::testing::TestWithParam<std::tuple<int, DType>> {
};

TEST_P(NonFiniteTest, SkippedWarnedAndFailAfterTheLimit) {
  const auto [stage, dtype] = GetParam();
  absl::StatusOr<std::shared_ptr<nn::GptModel>> made =
      MakeGpt(SmallGpt(), dtype);
  ASSERT_TRUE(made.ok()) << made.status();
  std::shared_ptr<nn::GptModel> model = *made;
  // Only the last rank injects (before the engine's own hook, as
  // loss_scale_test does): the others must skip as well.
  const int injecting_rank = World() - 1;
  bool inject = false;
  model->ln_f()->AddHook(
      nn::HookKind::kPostBackward,
      [&inject, injecting_rank](nn::Module& module,
                                const Stream& stream) -> absl::Status {
        if (!inject || Rank() != injecting_rank) return absl::OkStatus();
        const Tensor& grad = module.DirectParameters()[0]->grad();
        return Fill(grad.Slice(3, 1), std::numeric_limits<float>::quiet_NaN(),
                    stream);
      });
  absl::StatusOr<std::unique_ptr<engine::Engine>> created =
      engine::Initialize(model, Config(stage, dtype), Comm());
  ASSERT_TRUE(created.ok()) << created.status();
  engine::Engine& engine = **created;

  // Two runs of non-finite steps below the limit, then one that reaches it.
  const std::set<int> injected = {1, 3, 4, 6, 7, 8};
  int skipped = 0;
  for (int step = 0; step <= 8; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    absl::StatusOr<std::vector<float>> before = AllMasterWeights(engine);
    ASSERT_TRUE(before.ok()) << before.status();
    inject = injected.count(step) > 0;
    StderrCapture capture;
    absl::StatusOr<engine::StepReport> report = TrainStep(engine, step);
    const std::string log = capture.Finish();
    if (step == 8) {
      // The third in a row: an error on every rank, naming the key.
      ASSERT_FALSE(report.ok());
      EXPECT_TRUE(absl::IsFailedPrecondition(report.status()))
          << report.status();
      EXPECT_NE(
          report.status().message().find("3 in a row; training stops at 3, "
                                         "max_consecutive_nonfinite_steps"),
          std::string::npos)
          << report.status();
      break;
    }
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->nonfinite, inject);
    EXPECT_EQ(report->skipped, inject);
    absl::StatusOr<std::vector<float>> after = AllMasterWeights(engine);
    ASSERT_TRUE(after.ok()) << after.status();
    if (inject) {
      ++skipped;
      EXPECT_EQ(*after, *before) << "a non-finite step moved the weights";
    } else {
      EXPECT_NE(*after, *before) << "a clean step did nothing";
      for (float value : *after) ASSERT_TRUE(std::isfinite(value));
    }
    EXPECT_EQ(engine.counters().skipped_steps, skipped);
    const bool warned = log.find("is not finite") != std::string::npos;
    if (Rank() == 0) {
      EXPECT_EQ(warned, inject) << log;
      if (inject) {
        EXPECT_NE(log.find(absl::StrCat("step ", step + 1, ": the loss")),
                  std::string::npos)
            << log;
      }
    } else {
      EXPECT_FALSE(warned) << "only rank 0 warns:\n" << log;
    }
  }
}

TEST_P(NonFiniteTest, SaveRefusesNonFiniteWeightsAndKeepsLatest) {
  const auto [stage, dtype] = GetParam();
  absl::StatusOr<std::shared_ptr<nn::GptModel>> made =
      MakeGpt(SmallGpt(), dtype);
  ASSERT_TRUE(made.ok()) << made.status();
  absl::StatusOr<std::unique_ptr<engine::Engine>> created =
      engine::Initialize(*made, Config(stage, dtype), Comm());
  ASSERT_TRUE(created.ok()) << created.status();
  engine::Engine& engine = **created;
  const std::string directory =
      SharedDirectory(absl::StrCat("stage", stage, "_", DTypeName(dtype)));

  ASSERT_TRUE(TrainStep(engine, 0).ok());
  ASSERT_TRUE(engine.SaveCheckpoint(directory).ok());
  ASSERT_EQ(Latest(directory), "global_step1");
  ASSERT_TRUE(TrainStep(engine, 1).ok());

  // Rank 0 puts a NaN into one weight; every rank's copy and the master
  // weights take it (GatherParameters with a modifier rank).
  const std::string name = engine.ParameterNames().front();
  {
    absl::StatusOr<std::unique_ptr<engine::GatheredParameters>> gathered =
        engine.GatherParameters({name}, /*modifier_rank=*/0);
    ASSERT_TRUE(gathered.ok()) << gathered.status();
    if (Rank() == 0) {
      absl::StatusOr<nn::Parameter*> parameter =
          engine.model().FindParameter(name);
      ASSERT_TRUE(parameter.ok()) << parameter.status();
      absl::StatusOr<Tensor> data = (*parameter)->data();
      ASSERT_TRUE(data.ok()) << data.status();
      ASSERT_TRUE(Fill(data->Slice(0, 1),
                       std::numeric_limits<float>::quiet_NaN(),
                       engine.compute_stream())
                      .ok());
      ASSERT_TRUE(engine.compute_stream().Synchronize().ok());
    }
    ASSERT_TRUE((*gathered)->Release().ok());
  }
  const absl::Status saved = engine.SaveCheckpoint(directory);
  ASSERT_FALSE(saved.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(saved)) << saved;
  EXPECT_EQ(Latest(directory), "global_step1");
  EXPECT_FALSE(fs::exists(absl::StrCat(directory, "/global_step2")));
  if (Rank() == 0) {
    // Rank 0 saves the slice holding the NaN (the first parameter's first
    // element); the others learn of it through the agreement.
    EXPECT_NE(saved.message().find("values hold inf or NaN"), std::string::npos)
        << saved;
  }
}

// The one case a non-finite update is applied: stage 2 with the optimizer
// offloaded and neither clipping nor fp16 starts the CPU update during
// backward, before the norm is known. The step says so, and no checkpoint
// of that state is committed.
TEST(NonFiniteEarlyUpdateTest, AppliedUpdateIsReportedAndNotSaved) {
  absl::StatusOr<std::shared_ptr<nn::GptModel>> made =
      MakeGpt(SmallGpt(), DType::kBF16);
  ASSERT_TRUE(made.ok()) << made.status();
  std::shared_ptr<nn::GptModel> model = *made;
  bool inject = false;
  model->ln_f()->AddHook(
      nn::HookKind::kPostBackward,
      [&inject](nn::Module& module, const Stream& stream) -> absl::Status {
        if (!inject) return absl::OkStatus();
        const Tensor& grad = module.DirectParameters()[0]->grad();
        return Fill(grad.Slice(3, 1), std::numeric_limits<float>::quiet_NaN(),
                    stream);
      });
  const std::string config = absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 100,)",
      R"( "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},)",
      R"( "bf16": {"enabled": true}, "zero_optimization": {"stage": 2,)",
      R"( "reduce_bucket_size": 300, "offload_optimizer": {"device": "cpu"}}})");
  absl::StatusOr<std::unique_ptr<engine::Engine>> created =
      engine::Initialize(model, config, Comm());
  ASSERT_TRUE(created.ok()) << created.status();
  engine::Engine& engine = **created;
  const std::string directory = SharedDirectory("early_update");
  ASSERT_TRUE(TrainStep(engine, 0).ok());
  ASSERT_TRUE(engine.SaveCheckpoint(directory).ok());
  inject = true;
  StderrCapture capture;
  absl::StatusOr<engine::StepReport> report = TrainStep(engine, 1);
  const std::string log = capture.Finish();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->nonfinite);
  EXPECT_FALSE(report->skipped);
  if (Rank() == 0) {
    EXPECT_NE(log.find("the offloaded update had already begun and was "
                       "applied"),
              std::string::npos)
        << log;
  }
  const absl::Status saved = engine.SaveCheckpoint(directory);
  EXPECT_TRUE(absl::IsFailedPrecondition(saved)) << saved;
  EXPECT_NE(saved.message().find("its update was applied"), std::string::npos)
      << saved;
  EXPECT_EQ(Latest(directory), "global_step1");
}

INSTANTIATE_TEST_SUITE_P(
    StagesAndDtypes, NonFiniteTest,
    ::testing::Combine(::testing::Values(0, 2, 3),
                       ::testing::Values(DType::kBF16, DType::kF32)),
    [](const ::testing::TestParamInfo<NonFiniteTest::ParamType>& info) {
      return absl::StrCat("stage", std::get<0>(info.param), "_",
                          DTypeName(std::get<1>(info.param)));
    });

}  // namespace
}  // namespace enginetest
}  // namespace ze

int main(int argc, char** argv) {
  return ze::enginetest::RunAllTests(argc, argv);
}
