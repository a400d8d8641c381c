// PartitionState with offloaded optimizer state, on the CPU, without an
// engine: the NVMe failures a run can meet, each a named error that leaves
// the master weights as they were before the failed step where the swap
// file allows it.
#include "zero/partition_state.h"

#include <string>
#include <vector>

#include "core/ops.h"
#include "gtest/gtest.h"

namespace ze {
namespace zero {
namespace {

PartitionedLayout Layout() {
  LayoutOptions options;
  options.world_size = 1;
  options.bucket_max_elements = 3000;
  absl::StatusOr<PartitionedLayout> layout =
      PartitionedLayout::Build({{"a", 2500}, {"b", 1000}, {"c", 777}}, options);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *layout;
}

// bf16 AdamW at `stage` with every bucket's optimizer at `placement`: a CPU
// optimizer of 2 threads and chunks of 512 elements (the layout's buckets
// take several).
PartitionStateOptions OffloadOptions(int stage, Placement placement) {
  PartitionStateOptions options;
  options.stage = stage;
  options.optimizer_placement =
      ChooseOptimizerPlacement(Layout(), {}, 1.0, placement);
  options.model_dtype = DType::kBF16;
  options.optimizer.type = OptimizerType::kAdamW;
  options.host_threads = 2;
  options.chunk_elements = 512;
  return options;
}

PartitionStateOptions NvmeOptions(const std::string& directory) {
  PartitionStateOptions options = OffloadOptions(3, Placement::kNvme);
  options.nvme.nvme.directory = directory;
  options.nvme.nvme.block_size = 1 << 20;  // one request per chunk record
  options.nvme.buffer_count = 2;
  return options;
}

// Weights 0.5 and gradients `gradient` in every bucket.
absl::StatusOr<std::unique_ptr<PartitionState>> Make(
    const PartitionStateOptions& options, float gradient = 1.0f) {
  const PartitionedLayout layout = Layout();
  Stream stream;
  absl::StatusOr<std::unique_ptr<PartitionState>> state =
      PartitionState::Create(layout, options, stream);
  if (!state.ok()) return state;
  for (int b = 0; b < (*state)->num_buckets(); ++b) {
    absl::Status filled = Fill((*state)->OwnWeights(b), 0.5f, stream);
    if (!filled.ok()) return filled;
  }
  absl::Status allocated = (*state)->AllocateTrainingState(stream);
  if (!allocated.ok()) return allocated;
  for (int b = 0; b < (*state)->num_buckets(); ++b) {
    absl::Status filled = Fill((*state)->OwnGradients(b), gradient, stream);
    if (!filled.ok()) return filled;
  }
  return state;
}

TEST(PartitionStateNvmeTest, UnwritableAndMissingDirectoriesAreNamed) {
  for (const std::string& directory :
       {std::string("/proc"), ::testing::TempDir() + "/missing"}) {
    absl::Status status = Make(NvmeOptions(directory)).status();
    EXPECT_FALSE(status.ok());
    EXPECT_NE(status.message().find(directory), std::string::npos) << status;
  }
}

TEST(PartitionStateNvmeTest, TooLittleSpaceStatesBytesNeededAndFree) {
  PartitionStateOptions options = NvmeOptions(::testing::TempDir());
  options.nvme.nvme.pretend_free_bytes = 4096;
  absl::Status status = Make(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(status.message().find("4096 free"), std::string::npos) << status;
  EXPECT_NE(status.message().find(::testing::TempDir()), std::string::npos)
      << status;
}

// A write that fails in the middle of a step: the step's error names the
// file and the operation (through FinishUpdate, as the next boundary step
// sees it), and a step after it works again.
TEST(PartitionStateNvmeTest, IoErrorMidStepIsReported) {
  PartitionStateOptions options = NvmeOptions(::testing::TempDir());
  // Initialisation writes one request per chunk first; fail the step's
  // third write-back.
  const PartitionedLayout layout = Layout();
  int64_t chunks = 0;
  for (int b = 0; b < layout.num_buckets(); ++b) {
    chunks += (layout.bucket(b).slice_elements + 511) / 512;
  }
  options.nvme.nvme.fail_write_request = chunks + 2;
  absl::StatusOr<std::unique_ptr<PartitionState>> state = Make(options);
  ASSERT_TRUE(state.ok()) << state.status();
  Stream stream;
  StepArgs args;
  args.lr = 0.01;
  absl::Status updated = (*state)->UpdateWeights(args, stream);
  ASSERT_TRUE(updated.ok()) << updated;
  absl::Status status = (*state)->FinishUpdate(stream).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_NE(status.message().find("zero_engine_rank0_optimizer_state.swp"),
            std::string::npos)
      << status;
  EXPECT_NE(status.message().find("write"), std::string::npos) << status;
  ASSERT_TRUE((*state)->UpdateWeights(args, stream).ok());
  EXPECT_TRUE((*state)->FinishUpdate(stream).ok());
}

// The worker updates the host buckets in the order the next forward reads
// them, so that forward can follow the update: stages 0-2 lay buckets out in
// backward order (bucket 0 read last), stage 3 in model order.
TEST(PartitionStateHostTest, BucketsAreUpdatedInTheForwardsReadingOrder) {
  for (bool bucket_zero_read_first : {false, true}) {
    PartitionStateOptions options =
        OffloadOptions(bucket_zero_read_first ? 3 : 2, Placement::kHost);
    options.bucket_zero_read_first = bucket_zero_read_first;
    absl::StatusOr<std::unique_ptr<PartitionState>> state = Make(options);
    ASSERT_TRUE(state.ok()) << state.status();
    Stream stream;
    StepArgs args;
    args.lr = 0.01;
    for (int step = 0; step < 2; ++step) {
      ASSERT_TRUE((*state)->UpdateWeights(args, stream).ok());
      ASSERT_TRUE((*state)->FinishUpdate(stream).ok());
      const std::vector<int> expected = bucket_zero_read_first
                                            ? std::vector<int>{0, 1}
                                            : std::vector<int>{1, 0};
      EXPECT_EQ((*state)->last_update_order(), expected)
          << "bucket_zero_read_first " << bucket_zero_read_first;
    }
  }
}

// Finishing before reading is a type: the state readers take FinishUpdate's
// proof, which an update begun during backward cannot give until the step
// hands over the rest (the boundary step's FinishPreviousUpdate leaves it
// running); once joined, the early update's master equals one handed over
// at the step.
TEST(PartitionStateHostTest, EarlyUpdateIsJoinedOnlyAfterTheStep) {
  std::vector<std::vector<float>> masters;
  for (bool early : {false, true}) {
    absl::StatusOr<std::unique_ptr<PartitionState>> state =
        Make(OffloadOptions(2, Placement::kHost), /*gradient=*/0.25f);
    ASSERT_TRUE(state.ok()) << state.status();
    Stream stream;
    ASSERT_TRUE((*state)->CanBeginEarly());
    StepArgs args;
    args.lr = 0.01;
    if (early) {
      ASSERT_TRUE((*state)->BeginUpdate(args, stream).ok());
      EXPECT_TRUE((*state)->update_begun_early());
      ASSERT_TRUE((*state)->GradientsFinal(0, stream).ok());
      EXPECT_EQ((*state)->FinishUpdate(stream).status().code(),
                absl::StatusCode::kFailedPrecondition);
      EXPECT_TRUE((*state)->FinishPreviousUpdate(stream).ok());
      EXPECT_TRUE((*state)->update_begun_early());
    }
    ASSERT_TRUE((*state)->UpdateWeights(args, stream).ok());
    EXPECT_FALSE((*state)->update_begun_early());
    absl::StatusOr<offload::UpdateJoined> joined =
        (*state)->FinishUpdate(stream);
    ASSERT_TRUE(joined.ok()) << joined.status();
    std::vector<float> master;
    for (int b = 0; b < (*state)->num_buckets(); ++b) {
      const int64_t own = (*state)->OwnRange(b).size();
      absl::StatusOr<Tensor> out =
          Tensor::Empty({own}, DType::kF32, Device::Cpu());
      ASSERT_TRUE(out.ok());
      ASSERT_TRUE((*state)
                      ->ReadOwnState(*joined, b, /*array=*/0, 0, *out, stream)
                      .ok());
      const float* values = out->data_as<float>();
      master.insert(master.end(), values, values + own);
    }
    EXPECT_NE(master.front(), 0.5f);  // updated
    masters.push_back(master);
  }
  EXPECT_EQ(masters[0], masters[1]);
}

}  // namespace
}  // namespace zero
}  // namespace ze
