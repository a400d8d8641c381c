// PartitionState with offloaded optimizer state, on the CPU, without an
// engine: the NVMe failures a run can meet, each a named error that leaves
// the master weights as they were before the failed step where the swap
// file allows it.
#include "zero/partition_state.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops.h"
#include "core/status.h"
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
      ChooseOptimizerPlacement(Layout(), {}, 1.0, stage == 3, placement);
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

// A pipeline's stages each number their data-parallel ranks from 0 and
// hold different parameters: two states of rank 0 in one nvme_path are
// told apart by their job ranks (the world ranks), which name the files.
// Named by `rank` alone, the second would meet the first's lock.
TEST(PartitionStateNvmeTest, SwapFilesOfOneJobAreNamedByTheJobRank) {
  PartitionStateOptions first = NvmeOptions(::testing::TempDir());
  EXPECT_EQ(SwapFileName(first, "optimizer_state"),
            "zero_engine_rank0_optimizer_state.swp");
  first.job_rank = 2;
  PartitionStateOptions second = first;
  second.job_rank = 3;
  EXPECT_EQ(SwapFileName(second, "parameters"),
            "zero_engine_rank3_parameters.swp");
  absl::StatusOr<std::unique_ptr<PartitionState>> a = Make(first);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<std::unique_ptr<PartitionState>> b = Make(second);
  ASSERT_TRUE(b.ok()) << b.status();
  for (int job_rank : {2, 3}) {
    EXPECT_TRUE(std::filesystem::exists(
        absl::StrCat(::testing::TempDir(), "/zero_engine_rank", job_rank,
                     "_optimizer_state.swp")));
  }
  PartitionStateOptions same = first;
  const absl::Status taken = Make(same).status();
  EXPECT_EQ(taken.code(), absl::StatusCode::kFailedPrecondition) << taken;
  EXPECT_NE(taken.message().find("zero_engine_rank2_optimizer_state.swp"),
            std::string::npos)
      << taken;
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

// offload_param nvme: a state whose weights live in a swap file
// (`max_in_cpu` elements kept in host memory) and its twin with them in
// host memory (offload_param cpu), both with weights 0.5 and gradients 1.
PartitionStateOptions WeightsOptions(Placement weights, int64_t max_in_cpu) {
  PartitionStateOptions options = OffloadOptions(3, Placement::kHost);
  options.weights_placement = weights;
  options.weights_nvme.nvme.directory = ::testing::TempDir();
  options.weights_nvme.nvme.block_size = 1 << 20;  // a request per record
  // One swap buffer for two buckets: every bucket goes to the file and is
  // read back from it.
  options.weights_nvme.buffer_count = 1;
  options.weights_max_in_cpu = max_in_cpu;
  return options;
}

absl::StatusOr<std::unique_ptr<PartitionState>> MakeWithWeights(
    const PartitionStateOptions& options) {
  const PartitionedLayout layout = Layout();
  Stream stream;
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<PartitionState> state,
                      PartitionState::Create(layout, options, stream));
  for (int b = 0; b < state->num_buckets(); ++b) {
    ZE_ASSIGN_OR_RETURN(Tensor half,
                        Tensor::Empty({state->CheckpointWeightsRange(b).size()},
                                      DType::kF32, Device::Cpu()));
    ZE_RETURN_IF_ERROR(Fill(half, 0.5f, stream));
    ZE_RETURN_IF_ERROR(state->WriteWeights(b, 0, half, stream));
  }
  ZE_RETURN_IF_ERROR(state->AllocateTrainingState(stream));
  for (int b = 0; b < state->num_buckets(); ++b) {
    ZE_RETURN_IF_ERROR(Fill(state->OwnGradients(b), 1.0f, stream));
  }
  return state;
}

std::vector<float> WeightsOf(const PartitionState& state, int bucket) {
  Stream stream;
  absl::StatusOr<Tensor> out =
      Tensor::Empty({state.CheckpointWeightsRange(bucket).size()}, DType::kF32,
                    Device::Cpu());
  EXPECT_TRUE(out.ok());
  absl::Status read = state.ReadWeights(bucket, 0, *out, stream);
  EXPECT_TRUE(read.ok()) << read;
  const float* values = out->data_as<float>();
  return std::vector<float>(values, values + out->numel());
}

std::vector<float> Gathered(PartitionState& state, int bucket) {
  Stream stream;
  absl::StatusOr<Tensor> source = state.WeightsForGather(bucket, stream);
  EXPECT_TRUE(source.ok()) << source.status();
  if (!source.ok()) return {};
  absl::StatusOr<Tensor> out =
      Tensor::Empty({source->numel()}, DType::kF32, Device::Cpu());
  EXPECT_TRUE(CopyConverting(*source, *out, stream).ok());
  const float* values = out->data_as<float>();
  return std::vector<float>(values, values + out->numel());
}

// Two steps of `reference` and `state` with the same arguments: bucket 1
// gathered from `state` between its update and the join already holds the
// new weights, and after each join every bucket's weights, held and
// gathered, equal `reference`'s bit for bit (and moved from their 0.5 start).
void ExpectSameUpdates(PartitionState& reference, PartitionState& state) {
  Stream stream;
  StepArgs args;
  args.lr = 0.01;
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(reference.UpdateWeights(args, stream).ok());
    ASSERT_TRUE(state.UpdateWeights(args, stream).ok());
    const std::vector<float> gathered = Gathered(state, 1);
    ASSERT_TRUE(reference.FinishUpdate(stream).ok());
    ASSERT_TRUE(state.FinishUpdate(stream).ok());
    EXPECT_EQ(gathered, WeightsOf(reference, 1));
    for (int b = 0; b < state.num_buckets(); ++b) {
      const std::vector<float> expected = WeightsOf(reference, b);
      EXPECT_NE(expected[0], 0.5f) << "bucket " << b;  // updated
      EXPECT_EQ(WeightsOf(state, b), expected) << "bucket " << b;
      EXPECT_EQ(Gathered(state, b), expected) << "bucket " << b;
    }
  }
}

// The swapped weights are what the host weights are, bit for bit, through
// two updates: gathered before the join (from the update's staging), and
// read after it (from the file), for buckets swapped and kept (max_in_cpu).
TEST(PartitionStateNvmeWeightsTest, SwappedWeightsFollowTheUpdateExactly) {
  const PartitionedLayout layout = Layout();
  for (int64_t max_in_cpu : {int64_t{0}, layout.bucket(0).slice_elements}) {
    SCOPED_TRACE(max_in_cpu);
    auto host = MakeWithWeights(WeightsOptions(Placement::kHost, 0));
    ASSERT_TRUE(host.ok()) << host.status();
    auto swapped =
        MakeWithWeights(WeightsOptions(Placement::kNvme, max_in_cpu));
    ASSERT_TRUE(swapped.ok()) << swapped.status();
    EXPECT_EQ((*swapped)->weights_swapped(0), max_in_cpu == 0);
    ASSERT_EQ((*swapped)->num_buckets(), 2);
    EXPECT_TRUE((*swapped)->weights_swapped(1));
    EXPECT_FALSE((*swapped)->OwnWeights(1).defined());
    // Bucket 1 gathered before the join: the staged weights, written back
    // on the way; the others written back by the join.
    ExpectSameUpdates(**host, **swapped);
    // The swapped buckets went to the file and, two of them through one
    // buffer, came back from it (one alone stays in its buffer).
    EXPECT_GT((*swapped)->weights_nvme_counters().bytes_written, 0);
    if (max_in_cpu == 0) {
      EXPECT_GT((*swapped)->weights_nvme_counters().bytes_read, 0);
    }
  }
}

// A write-back that fails: the join's error names the parameters' swap
// file and the operation, the bucket's weights in the file are those from
// before the update (unchanged), the others are updated, and a later step
// works again.
TEST(PartitionStateNvmeWeightsTest, WriteBackErrorIsNamedAndLeavesTheFile) {
  PartitionStateOptions options = WeightsOptions(Placement::kNvme, 0);
  // Initialisation writes each of the 2 buckets once; fail the second
  // write-back (bucket 1's).
  options.weights_nvme.nvme.fail_write_request = 3;
  auto state = MakeWithWeights(options);
  ASSERT_TRUE(state.ok()) << state.status();
  Stream stream;
  StepArgs args;
  args.lr = 0.01;
  ASSERT_TRUE((*state)->UpdateWeights(args, stream).ok());
  const absl::Status status = (*state)->FinishUpdate(stream).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_NE(status.message().find("zero_engine_rank0_parameters.swp"),
            std::string::npos)
      << status;
  EXPECT_NE(status.message().find("write"), std::string::npos) << status;
  EXPECT_EQ(WeightsOf(**state, 1)[0], 0.5f);
  EXPECT_NE(WeightsOf(**state, 0)[0], 0.5f);
  ASSERT_TRUE((*state)->UpdateWeights(args, stream).ok());
  EXPECT_TRUE((*state)->FinishUpdate(stream).ok());
}

// offload_param with part of the optimizer on the device (issue 28):
// bucket 0's optimizer on the host, bucket 1's on the device (ratio < 1).
// The device-updated bucket's new weights reach the weights' tier (host
// memory, a swap buffer and then the file, or host memory kept by
// max_in_cpu), bit for bit what the same placement writes with the weights
// on the device, gathered before the join and read after it, through two
// updates; without offload_optimizer (both buckets on the device) too.
TEST(PartitionStateNvmeWeightsTest, DeviceUpdatedBucketsReachTheWeightsTier) {
  const PartitionedLayout layout = Layout();
  ASSERT_EQ(layout.num_buckets(), 2);
  const std::vector<std::vector<Placement>> placements = {
      {Placement::kHost, Placement::kDevice},
      {Placement::kDevice, Placement::kDevice}};
  for (const std::vector<Placement>& optimizer : placements) {
    struct Tier {
      Placement weights;
      int64_t max_in_cpu;
    };
    for (const Tier tier :
         {Tier{Placement::kHost, 0}, Tier{Placement::kNvme, 0},
          Tier{Placement::kNvme, int64_t{1} << 40}}) {
      SCOPED_TRACE(::testing::Message()
                   << "bucket 0's optimizer " << PlacementName(optimizer[0])
                   << ", weights " << PlacementName(tier.weights)
                   << ", max_in_cpu " << tier.max_in_cpu);
      PartitionStateOptions on_device = WeightsOptions(Placement::kDevice, 0);
      on_device.optimizer_placement = optimizer;
      PartitionStateOptions offloaded =
          WeightsOptions(tier.weights, tier.max_in_cpu);
      offloaded.optimizer_placement = optimizer;
      auto reference = MakeWithWeights(on_device);
      ASSERT_TRUE(reference.ok()) << reference.status();
      auto state = MakeWithWeights(offloaded);
      ASSERT_TRUE(state.ok()) << state.status();
      EXPECT_EQ((*state)->weights_swapped(1),
                tier.weights == Placement::kNvme && tier.max_in_cpu == 0);
      // The device bucket gathered before the join: from its swap buffer
      // (or host memory), not the update's staging.
      ExpectSameUpdates(**reference, **state);
      if ((*state)->weights_swapped(1)) {
        // One swap buffer for two buckets: the device bucket's weights
        // went to the file and came back from it.
        EXPECT_GT((*state)->weights_nvme_counters().bytes_written, 0);
        EXPECT_GT((*state)->weights_nvme_counters().bytes_read, 0);
      }
    }
  }
}

// A device-updated bucket's write to the swap file fails (bucket 0's; the
// next bucket then cannot take the one swap buffer either): UpdateWeights
// does not fail on this rank alone; the join does, naming the parameters'
// swap file, and the file keeps both buckets' weights from before the
// update; a later step works again.
TEST(PartitionStateNvmeWeightsTest, DeviceUpdatedWriteErrorIsTheJoins) {
  PartitionStateOptions options = WeightsOptions(Placement::kNvme, 0);
  options.optimizer_placement = {Placement::kDevice, Placement::kDevice};
  // Initialisation writes each of the 2 buckets once (requests 0 and 1);
  // the update's first write is request 2.
  options.weights_nvme.nvme.fail_write_request = 2;
  auto state = MakeWithWeights(options);
  ASSERT_TRUE(state.ok()) << state.status();
  Stream stream;
  StepArgs args;
  args.lr = 0.01;
  ASSERT_TRUE((*state)->UpdateWeights(args, stream).ok());
  const absl::Status status = (*state)->FinishUpdate(stream).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_NE(status.message().find("zero_engine_rank0_parameters.swp"),
            std::string::npos)
      << status;
  EXPECT_NE(status.message().find("offload_param"), std::string::npos)
      << status;
  EXPECT_EQ(WeightsOf(**state, 0)[0], 0.5f);
  EXPECT_EQ(WeightsOf(**state, 1)[0], 0.5f);
  ASSERT_TRUE((*state)->UpdateWeights(args, stream).ok());
  EXPECT_TRUE((*state)->FinishUpdate(stream).ok());
  EXPECT_NE(WeightsOf(**state, 0)[0], 0.5f);
  EXPECT_NE(WeightsOf(**state, 1)[0], 0.5f);
}

// Missing directory and too little space: named at Create (before any
// weight is written), as for the optimizer's file.
TEST(PartitionStateNvmeWeightsTest, CreateErrorsNameThePath) {
  PartitionStateOptions missing = WeightsOptions(Placement::kNvme, 0);
  missing.weights_nvme.nvme.directory = ::testing::TempDir() + "/missing";
  absl::Status status = MakeWithWeights(missing).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find(::testing::TempDir() + "/missing"),
            std::string::npos)
      << status;
  EXPECT_NE(status.message().find("offload_param"), std::string::npos)
      << status;
  PartitionStateOptions full = WeightsOptions(Placement::kNvme, 0);
  full.weights_nvme.nvme.pretend_free_bytes = 4096;
  status = MakeWithWeights(full).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(status.message().find("4096 free"), std::string::npos) << status;
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

// Speculation through PartitionState: begun with the arguments of a step
// that clips nothing, then the boundary's arguments decide. Equal: committed,
// the update handed over at the step. Different (clipped): rolled back and
// redone, the update with the clipped arguments alone. A skipped step
// (DropSpeculation): the master as before. Outcomes are reported.
TEST(PartitionStateHostTest, SpeculationCommitsOrIsRedoneExactly) {
  struct Run {
    std::vector<float> master;
    SpeculationOutcome outcome = SpeculationOutcome::kNone;
  };
  // `speculative`: begun during backward with grad_scale 1; `grad_scale`:
  // the boundary's; `skip`: the step is skipped instead.
  // `split`: bucket 1 (the forward's first) updated on the device
  // (offload::HostUpdate's CPU/GPU split; the CPU's kernel stands in).
  auto run = [](bool speculative, float grad_scale, bool skip,
                bool split) -> Run {
    const PartitionedLayout layout = Layout();
    PartitionStateOptions options;
    options.stage = 2;
    options.model_dtype = DType::kBF16;
    // SGD with momentum: a clipped step moves the weights less (Adam's
    // first step would not see the scale) and there is a state array.
    options.optimizer.type = OptimizerType::kSgd;
    options.optimizer.momentum = 0.9;
    options.host_threads = 2;
    options.chunk_elements = 512;
    options.speculation_elements = 1 << 20;
    options.optimizer_placement =
        ChooseOptimizerPlacement(layout, {}, 1.0, false, Placement::kHost);
    if (split) options.update_on_device = {false, true};
    Stream stream;
    Run result;
    absl::StatusOr<std::unique_ptr<PartitionState>> state =
        PartitionState::Create(layout, options, stream);
    EXPECT_TRUE(state.ok()) << state.status();
    if (!state.ok()) return result;
    PartitionState& partition = **state;
    EXPECT_TRUE(Fill(partition.weights(), 0.5f, stream).ok());
    EXPECT_TRUE(partition.AllocateTrainingState(stream).ok());
    for (int b = 0; b < partition.num_buckets(); ++b) {
      EXPECT_TRUE(Fill(partition.OwnGradients(b), 0.25f, stream).ok());
    }
    StepArgs begun;
    begun.lr = 0.01;
    if (speculative) {
      EXPECT_TRUE(
          partition.BeginUpdate(begun, stream, offload::Speculation()).ok());
      EXPECT_TRUE(partition.update_begun_early());
      // Both buckets final during backward: the worker may speculate both.
      EXPECT_TRUE(partition.GradientsFinal(0, stream).ok());
      EXPECT_TRUE(partition.GradientsFinal(1, stream).ok());
      // Give the worker the buckets before the boundary decides (how much
      // it took changes nothing but the outcome's name).
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (skip) {
      EXPECT_TRUE(partition.DropSpeculation(stream).ok());
      EXPECT_FALSE(partition.update_begun_early());
    } else {
      StepArgs args = begun;
      args.grad_scale = grad_scale;
      EXPECT_TRUE(partition.UpdateWeights(args, stream).ok());
    }
    result.outcome = partition.speculation_outcome();
    absl::StatusOr<offload::UpdateJoined> joined =
        partition.FinishUpdate(stream);
    EXPECT_TRUE(joined.ok()) << joined.status();
    if (!joined.ok()) return result;
    for (int b = 0; b < partition.num_buckets(); ++b) {
      const int64_t own = partition.OwnRange(b).size();
      absl::StatusOr<Tensor> out =
          Tensor::Empty({own}, DType::kF32, Device::Cpu());
      EXPECT_TRUE(out.ok());
      EXPECT_TRUE(
          partition.ReadOwnState(*joined, b, /*array=*/0, 0, *out, stream)
              .ok());
      const float* values = out->data_as<float>();
      result.master.insert(result.master.end(), values, values + own);
    }
    return result;
  };
  for (bool split : {false, true}) {
    SCOPED_TRACE(split ? "bucket 1 updated on the device" : "CPU only");
    const Run exact = run(false, 1.0f, false, split);
    const Run committed = run(true, 1.0f, false, split);
    EXPECT_EQ(committed.master, exact.master);
    EXPECT_NE(committed.outcome, SpeculationOutcome::kRedone);
    EXPECT_NE(committed.outcome, SpeculationOutcome::kNone);

    const Run clipped = run(false, 0.5f, false, split);
    const Run redone = run(true, 0.5f, false, split);
    EXPECT_EQ(redone.master, clipped.master);
    EXPECT_NE(redone.master, exact.master);
    EXPECT_NE(redone.outcome, SpeculationOutcome::kCommitted);

    const Run skipped = run(true, 1.0f, true, split);
    EXPECT_EQ(skipped.master,
              std::vector<float>(exact.master.size(), 0.5f));  // untouched
    EXPECT_NE(skipped.outcome, SpeculationOutcome::kCommitted);
    if (split) {
      // The same values as the CPU alone.
      EXPECT_EQ(exact.master, run(false, 1.0f, false, false).master);
      EXPECT_EQ(clipped.master, run(false, 0.5f, false, false).master);
    }
  }
}

offload::UpdateRates Rates(double cpu, double cpu_shared, double link,
                           double link_shared) {
  offload::UpdateRates rates;
  rates.cpu_seconds_per_element = cpu;
  rates.cpu_seconds_per_element_shared = cpu_shared;
  rates.link_bytes_per_second = link;
  rates.link_bytes_per_second_shared = link_shared;
  return rates;
}

// The split's model: buckets go to the device in the forward's reading
// order, as many as make the later side earliest; the two sides end near
// equal.
TEST(ChooseUpdateSplitTest, BalancesTheCpuAgainstTheLink) {
  // Four host buckets of 100 elements and one device bucket (0); the
  // forward reads bucket 4 first (stages 0-2).
  const std::vector<int64_t> host = {100, 100, 0, 100, 100};
  const std::vector<int> forward = {4, 3, 2, 1, 0};
  // CPU 1 s an element; link 12 bytes an element at 12 B/s: 1 s an element
  // too, neither slowed by the other: half each, the forward's first two
  // buckets (4 and 3) on the device.
  UpdateSplit even =
      ChooseUpdateSplit(host, forward, 12, Rates(1.0, 1.0, 12.0, 12.0));
  EXPECT_EQ(even.on_device,
            (std::vector<bool>{false, false, false, true, true}));
  EXPECT_EQ(even.host_elements, 400);
  EXPECT_EQ(even.device_elements, 200);
  EXPECT_DOUBLE_EQ(even.cpu_seconds(), 200.0);
  EXPECT_DOUBLE_EQ(even.device_seconds(), 200.0);
  // A link three times slower: one bucket (CPU 300 s, link 300 s).
  UpdateSplit slow =
      ChooseUpdateSplit(host, forward, 12, Rates(1.0, 1.0, 4.0, 4.0));
  EXPECT_EQ(slow.device_elements, 100);
  EXPECT_TRUE(slow.on_device[4]);
  // A link so slow that one bucket would outlast the CPU alone: none.
  EXPECT_EQ(ChooseUpdateSplit(host, forward, 12, Rates(1.0, 1.0, 0.01, 0.01))
                .device_elements,
            0);
  // Nothing measured (the CPU, or no device): none.
  EXPECT_EQ(ChooseUpdateSplit(host, forward, 12, {}).device_elements, 0);
  EXPECT_NE(even.ToString().find("device updates 200 of 400 host elements"),
            std::string::npos)
      << even.ToString();
}

// Both sides move host memory, so a split is costed at the rates each
// side keeps while the other runs. Where the CPU alone fills the host's
// memory, the split the rates alone promise is a loss: nothing is split.
// Where the first bucket moved loses (it slows the CPU's whole part) but
// two win, a walk that stopped at the first loss would split nothing.
TEST(ChooseUpdateSplitTest, CostsASplitAtTheSharedRates) {
  const std::vector<int64_t> host = {100, 100, 100, 100};
  const std::vector<int> forward = {0, 1, 2, 3};
  // Alone: 1 s an element each way (half each would take 200 s). Shared:
  // the CPU 1.5 s an element, the link 2 s: one bucket 450 s, two 400 s,
  // three 600 s, none 400 s.
  UpdateSplit bound =
      ChooseUpdateSplit(host, forward, 12, Rates(1.0, 1.5, 12.0, 6.0));
  EXPECT_EQ(bound.on_device, std::vector<bool>(4, false));
  EXPECT_DOUBLE_EQ(bound.cpu_seconds(), 400.0);
  // CPU 1.4 s shared, the link 1 s an element: one bucket 420 s (worse
  // than 400 s), two 280 s, three 300 s.
  UpdateSplit past_a_loss =
      ChooseUpdateSplit(host, forward, 12, Rates(1.0, 1.4, 12.0, 12.0));
  EXPECT_EQ(past_a_loss.on_device,
            (std::vector<bool>{true, true, false, false}));
  EXPECT_DOUBLE_EQ(past_a_loss.cpu_seconds(), 280.0);
  EXPECT_DOUBLE_EQ(past_a_loss.device_seconds(), 200.0);
}

// A split given per bucket must name only host buckets, one per bucket.
TEST(PartitionStateHostTest, AnUpdateSplitOfTheWrongShapeIsRefused) {
  PartitionStateOptions options = OffloadOptions(2, Placement::kHost);
  options.update_on_device = {true};  // two buckets
  absl::StatusOr<std::unique_ptr<PartitionState>> state = Make(options);
  ASSERT_FALSE(state.ok());
  EXPECT_NE(state.status().message().find("update_on_device"),
            std::string::npos)
      << state.status();
}

}  // namespace
}  // namespace zero
}  // namespace ze
