// Memory figures through the public engine API, for ZeRO stages 0-2 of a
// small bf16 GPT trained with AdamW:
//   - memory_breakdown() matches the ZeRO paper's per-rank formula (16 Psi,
//     4 Psi + 12 Psi / N, 2 Psi + 14 Psi / N bytes) within 5%, with Psi
//     counted from the model, not taken from the engine;
//   - the host allocator's bytes in use grow across Initialize by what the
//     breakdown says (the model is built without storage, so every byte of
//     model state is allocated inside Initialize), and the peak during
//     Initialize stays within the same 5%;
//   - rank 0, and only rank 0, prints the memory line at Initialize;
//   - at stage 2 on one rank, gradient accumulation adds no bucket
//     buffers: the layers accumulate into the partition every micro-batch
//     (GradientReducer::ReducesInPartition);
//   - with a byte cap between stage 2's and stage 0's needs (4 ranks),
//     stage 0 fails with ResourceExhausted stating the bytes it needs and
//     stage 2 initialises and trains.
//
// Run alone and under mpirun at 2 and 4 ranks (see BUILD.bazel).
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"

namespace ze {
namespace enginetest {
namespace {

// Large enough that layout padding (a few elements per bucket and rank) is
// far below 5%, small enough to initialise in milliseconds. Psi = 101,952.
nn::GptConfig MemoryGpt() { return SmallGpt(/*channels=*/64, /*layers=*/2); }

std::string Config(int stage, int accumulation) {
  return absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": )",
      accumulation, ",",
      R"( "steps_per_print": 1000, "bf16": {"enabled": true},)",
      R"("optimizer": {"type": "AdamW", "params": {"lr": 0.001}},)",
      R"("zero_optimization": {"stage": )", stage,
      R"(, "reduce_bucket_size": 20000}})");
}

double PaperBytes(int stage, double psi, double n) {
  if (stage == 0) return 16 * psi;
  if (stage == 1) return 4 * psi + 12 * psi / n;
  return 2 * psi + 14 * psi / n;
}

class MemoryTest : public ::testing::TestWithParam<int> {};

TEST_P(MemoryTest, BreakdownMatchesPaperAndAllocator) {
  const int stage = GetParam();
  absl::StatusOr<std::shared_ptr<nn::GptModel>> made =
      MakeGpt(MemoryGpt(), DType::kBF16, /*materialize=*/false);
  ASSERT_TRUE(made.ok()) << made.status();
  std::shared_ptr<nn::GptModel> model = *made;
  const double psi = static_cast<double>(model->NumParameterElements());
  const double paper = PaperBytes(stage, psi, World());

  Allocator* host = HostMemory();
  host->ResetPeak();
  const AllocatorStats before = host->stats();
  StderrCapture capture;
  absl::StatusOr<std::unique_ptr<engine::Engine>> created =
      engine::Initialize(model, Config(stage, 1), Comm());
  const std::string log = capture.Finish();
  ASSERT_TRUE(created.ok()) << created.status();
  const AllocatorStats after = host->stats();
  const engine::MemoryBreakdown& memory = (*created)->memory_breakdown();

  // The breakdown against the paper.
  EXPECT_EQ(memory.parameter_elements, static_cast<int64_t>(psi));
  EXPECT_DOUBLE_EQ(memory.paper_bytes, paper);
  const double total = static_cast<double>(memory.total_bytes());
  EXPECT_NEAR(total / paper, 1.0, 0.05)
      << memory.ToString() << " vs paper " << paper;
  // Its parts (bf16 weights and gradients, f32 master, two f32 moments).
  const double n = World();
  EXPECT_NEAR(memory.model_weight_bytes / (2 * psi), 1.0, 0.05);
  EXPECT_NEAR(memory.gradient_bytes / (stage == 2 ? 2 * psi / n : 2 * psi), 1.0,
              0.05);
  EXPECT_NEAR(memory.master_weight_bytes / (stage == 0 ? 4 * psi : 4 * psi / n),
              1.0, 0.05);
  EXPECT_NEAR(
      memory.optimizer_state_bytes / (stage == 0 ? 8 * psi : 8 * psi / n), 1.0,
      0.05);

  // The allocator against the breakdown: what Initialize left allocated,
  // and the most it held at once.
  const double held =
      static_cast<double>(after.bytes_in_use - before.bytes_in_use);
  const double peak =
      static_cast<double>(after.peak_bytes_in_use - before.bytes_in_use);
  std::printf(
      "rank %d stage %d world %d: Psi %.0f, breakdown %.0f B (%.3f of paper), "
      "allocator held %.0f B (%.3f), peak %.0f B (%.3f)\n",
      Rank(), stage, World(), psi, total, total / paper, held, held / total,
      peak, peak / total);
  EXPECT_NEAR(held / total, 1.0, 0.05);
  EXPECT_NEAR(peak / total, 1.0, 0.05);

  const std::string line =
      absl::StrCat("ZeRO stage ", stage, ", world size ", World(),
                   ", Psi=", static_cast<int64_t>(psi), " parameters");
  if (Rank() == 0) {
    EXPECT_NE(log.find(line), std::string::npos) << log;
  } else {
    EXPECT_EQ(log.find("ZeRO stage"), std::string::npos) << log;
  }

  // Training does not leave more model state behind than the breakdown
  // (stage 2's in-flight bucket gradients are freed after each backward).
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(TrainStep(**created, step).ok());
  }
  const double after_training =
      static_cast<double>(host->stats().bytes_in_use - before.bytes_in_use);
  EXPECT_NEAR(after_training / total, 1.0, 0.05);
}

INSTANTIATE_TEST_SUITE_P(Stages, MemoryTest, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("stage", info.param);
                         });

// Stage 2, one rank: a window of 3 micro-batches peaks no higher than a
// window of 1. Before the layers accumulated into the partition in every
// micro-batch, the second and third held full-size bucket buffers and
// reduce-scatter output slices (4 buckets and 3 slices of 20,000 bf16
// elements here: 280 kB, 17% of the model state; run 76's 8B: 6.8 GiB).
TEST(AccumulationMemoryTest, Stage2OnOneRankAddsNoBucketBuffers) {
  if (World() != 1) GTEST_SKIP() << "one rank reduces in place";
  int64_t peaks[2] = {0, 0};
  int64_t total = 0;
  for (const int accumulation : {1, 3}) {
    absl::StatusOr<std::shared_ptr<nn::GptModel>> model =
        MakeGpt(MemoryGpt(), DType::kBF16, /*materialize=*/false);
    ASSERT_TRUE(model.ok()) << model.status();
    absl::StatusOr<std::unique_ptr<engine::Engine>> created =
        engine::Initialize(*model, Config(2, accumulation), Comm());
    ASSERT_TRUE(created.ok()) << created.status();
    total = (*created)->memory_breakdown().total_bytes();
    Allocator* host = HostMemory();
    // One window each, after a first step that allocates what stays.
    ASSERT_TRUE(TrainStep(**created, 0).ok());
    const int64_t before = host->stats().bytes_in_use;
    host->ResetPeak();
    ASSERT_TRUE(TrainStep(**created, 1).ok());
    peaks[accumulation == 1 ? 0 : 1] = host->stats().peak_bytes_in_use - before;
  }
  std::printf(
      "stage 2, one rank: step peak above its start %lld B at "
      "accumulation 1, %lld B at 3 (model state %lld B)\n",
      static_cast<long long>(peaks[0]), static_cast<long long>(peaks[1]),
      static_cast<long long>(total));
  EXPECT_LE(peaks[1], peaks[0] + total / 50);
}

// offload_optimizer (stages 1-2) and offload_param with it (stage 3): the
// plan puts the f32 master weights, the moments and the transfer staging in
// host memory, and the rest on the device. On the CPU the host allocator
// holds everything but the CPU optimizer's moments (offload/ allocates
// those itself), so its growth across Initialize is total + staging - 8 Psi
// / N.
class OffloadMemoryTest : public ::testing::TestWithParam<int> {};

TEST_P(OffloadMemoryTest, PlanPlacesStateOnHost) {
  const int stage = GetParam();
  absl::StatusOr<std::shared_ptr<nn::GptModel>> made =
      MakeGpt(MemoryGpt(), DType::kBF16, /*materialize=*/false);
  ASSERT_TRUE(made.ok()) << made.status();
  std::shared_ptr<nn::GptModel> model = *made;
  const double psi = static_cast<double>(model->NumParameterElements());
  const double n = World();
  std::string config = Config(stage, 1);
  const std::string offload = absl::StrCat(
      R"(, "offload_optimizer": {"device": "cpu"})",
      stage == 3 ? R"(, "offload_param": {"device": "cpu"})" : "", "}}");
  config.replace(config.size() - 2, 2, offload);

  Allocator* host = HostMemory();
  const AllocatorStats before = host->stats();
  absl::StatusOr<std::unique_ptr<engine::Engine>> created =
      engine::Initialize(model, config, Comm());
  ASSERT_TRUE(created.ok()) << created.status() << "\n" << config;
  const engine::MemoryBreakdown& memory = (*created)->memory_breakdown();
  // Host: f32 master (4) + two moments (8) + bf16 staging (2) per element of
  // this rank's partition, plus the bf16 weights partition at stage 3.
  // Also the speculative update's backup of master and moments (12 per
  // element, issue 27), at stage 3 too: host weights (offload_param cpu)
  // are written in place as early as device weights are uploaded.
  const double host_expected =
      14 * psi / n + (stage == 3 ? 2 * psi / n : 0) + 12 * psi / n;
  EXPECT_NEAR(memory.host_bytes / host_expected, 1.0, 0.05)
      << memory.ToString();
  const double device_expected = stage == 3   ? 2 * psi / n
                                 : stage == 2 ? 2 * psi + 2 * psi / n
                                              : 4 * psi;
  EXPECT_NEAR(memory.device_bytes / device_expected, 1.0, 0.05)
      << memory.ToString();
  EXPECT_NEAR(memory.staging_bytes / (2 * psi / n), 1.0, 0.05);
  EXPECT_EQ(
      memory.device_bytes + memory.host_bytes,
      memory.total_bytes() + memory.staging_bytes + memory.speculation_bytes);
  EXPECT_GT(memory.speculation_bytes, 0);
  EXPECT_EQ(memory.pinned_host_bytes, 0);  // pin_memory defaults to false

  const double held =
      static_cast<double>(host->stats().bytes_in_use - before.bytes_in_use);
  const double expected_held = memory.total_bytes() + memory.staging_bytes +
                               memory.speculation_bytes - 8 * psi / n;
  EXPECT_NEAR(held / expected_held, 1.0, 0.05)
      << "host allocator grew by " << held << " B; " << memory.ToString();
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(TrainStep(**created, step).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, OffloadMemoryTest, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("stage", info.param);
                         });

TEST(AllocatorCapTest, Stage0DoesNotFitStage2Does) {
  if (World() != 4) GTEST_SKIP() << "needs 4 ranks";
  ExpectOnlyFittingStageTrainsUnderCap(
      2, MemoryGpt(), [](int stage) { return Config(stage, 1); },
      [](int64_t need_stage0, int64_t need_stage2) {
        // 16 Psi vs 5.5 Psi: the cap leaves stage 2 room for activations and
        // its in-flight bucket gradients, and stage 0 none.
        EXPECT_GT(need_stage0, 2 * need_stage2);
        return (need_stage0 + need_stage2) * 7 / 10;
      });
}

}  // namespace
}  // namespace enginetest
}  // namespace ze

int main(int argc, char** argv) {
  return ze::enginetest::RunAllTests(argc, argv);
}
