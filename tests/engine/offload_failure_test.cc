// A swap file that fails in the middle of training (offload_optimizer on
// NVMe, stage 3), through the public API, alone and at 2 ranks: rank 0's
// swap file is truncated between steps, so its next offloaded update reads
// short. The step after that fails on every rank (rank 0 with the DataLoss
// naming its file, the others with Aborted naming how many ranks failed)
// instead of leaving the other ranks waiting in a collective; no rank's
// weights take a later update.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"

namespace ze {
namespace enginetest {
namespace {

TEST(OffloadFailureTest, TruncatedSwapFileStopsEveryRankAtTheNextStep) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string directory =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/swap_rank", Rank());
  ::mkdir(directory.c_str(), 0755);
  const std::string config = absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true},
          "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
          "zero_optimization": {"stage": 3, "sub_group_size": 1000,
              "offload_optimizer": {"device": "nvme", "nvme_path": ")",
      directory, R"("}}})");
  absl::StatusOr<std::shared_ptr<nn::GptModel>> model =
      MakeGpt(SmallGpt(), DType::kBF16);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<std::unique_ptr<engine::Engine>> created =
      engine::Initialize(*model, config, Comm());
  ASSERT_TRUE(created.ok()) << created.status();
  engine::Engine& engine = **created;
  const std::string swap_file = absl::StrCat(directory, "/zero_engine_rank",
                                             Rank(), "_optimizer_state.swp");
  EXPECT_EQ(::access(swap_file.c_str(), F_OK), 0) << swap_file;

  ASSERT_TRUE(TrainStep(engine, 0).ok());
  ASSERT_TRUE(TrainStep(engine, 1).ok());
  // Every update so far finished (a collective: every rank calls it).
  ASSERT_TRUE(AllMasterWeights(engine).ok());
  if (Rank() == 0) {
    ASSERT_EQ(::truncate(swap_file.c_str(), 0), 0);
  }
  // This step's update runs on the offload worker and fails on rank 0; the
  // step returns before it does.
  ASSERT_TRUE(TrainStep(engine, 2).ok());
  absl::StatusOr<engine::StepReport> failed = TrainStep(engine, 3);
  ASSERT_FALSE(failed.ok());
  if (Rank() == 0) {
    EXPECT_EQ(failed.status().code(), absl::StatusCode::kDataLoss)
        << failed.status();
    EXPECT_NE(failed.status().message().find(swap_file), std::string::npos)
        << failed.status();
    EXPECT_NE(failed.status().message().find("read"), std::string::npos)
        << failed.status();
  } else {
    EXPECT_EQ(failed.status().code(), absl::StatusCode::kAborted)
        << failed.status();
    EXPECT_NE(failed.status().message().find("failed on 1 other rank"),
              std::string::npos)
        << failed.status();
  }
}

}  // namespace
}  // namespace enginetest
}  // namespace ze

int main(int argc, char** argv) {
  return ze::enginetest::RunAllTests(argc, argv);
}
