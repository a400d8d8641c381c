// RunBoundaryStep at 1-4 ranks, as threads of one process
// (comm/in_process.h), on a PartitionState whose gradients hold what the
// reducer leaves (the sum over ranks): every stage's rank updates its part
// with the global norm's clip factor and the 1/world average, reports the
// mean loss over ranks, skips on every rank when one rank's gradients are
// not finite, and fails every rank when their schedule hashes differ.
#include "zero/boundary_step.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/in_process.h"
#include "comm/in_process_worlds.h"
#include "config/config.h"
#include "core/ops.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "zero/partition_state.h"
#include "zero/training_state.h"

namespace ze {
namespace zero {
namespace {

constexpr double kLearningRate = 0.5;

// The summed gradient at element i of bucket b's padded buffer, and the
// initial weight there: the same on every rank, as after a reduction.
float Gradient(int b, int64_t i) {
  return static_cast<float>((i * 7 + b * 3) % 11) - 5.0f;
}
float Weight(int b, int64_t i) {
  return 0.25f * static_cast<float>((i + b) % 8);
}

struct StepSetup {
  int stage = 1;
  double clipping = 0;
  int inf_rank = -1;         // this rank's gradients hold an inf
  bool rank_hashes = false;  // each rank passes its own schedule hash
};

struct Result {
  StepReport report;
  // This rank's f32 master after the step, per bucket, and which element
  // of the padded bucket it starts at.
  std::vector<std::vector<float>> master;
  std::vector<int64_t> master_begin;
  // WorthBeginningEarly before and after the step.
  bool worth_beginning_early_before = false;
  bool worth_beginning_early_after = false;
};

absl::StatusOr<PartitionedLayout> Layout(int world) {
  LayoutOptions options;
  options.world_size = world;
  options.bucket_max_elements = 100;
  return PartitionedLayout::Build({{"a", 53}, {"b", 40}, {"c", 21}}, options);
}

absl::StatusOr<Result> RunStep(const StepSetup& setup,
                               comm::Communicator& comm) {
  const int world = comm.world_size();
  const int rank = comm.rank();
  const Stream stream;  // the CPU's
  ZE_ASSIGN_OR_RETURN(const config::Config config,
                      config::LoadConfigString(
                          absl::StrCat(R"({"train_micro_batch_size_per_gpu": 1,
                          "gradient_accumulation_steps": 1,
                          "optimizer": {"type": "SGD", "params": {"lr": )",
                                       kLearningRate, R"(}},
                          "gradient_clipping": )",
                                       setup.clipping, R"(,
                          "zero_optimization": {"stage": )",
                                       setup.stage, "}}"),
                          world));
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<TrainingState> training,
                      TrainingState::Create(config, world));
  ZE_ASSIGN_OR_RETURN(const PartitionedLayout layout, Layout(world));
  PartitionStateOptions options;
  options.stage = setup.stage;
  options.rank = rank;
  options.model_dtype = DType::kBF16;  // so the f32 master is its own copy
  options.optimizer = training->optimizer_options();
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<PartitionState> state,
                      PartitionState::Create(layout, options, stream));
  Result result;
  for (int b = 0; b < layout.num_buckets(); ++b) {
    const BucketLayout& bucket = layout.bucket(b);
    // Where this rank's part starts in the padded bucket: the whole bucket
    // at stage 0, its slice from stage 1 on (stage 3 holds only the slice
    // of the weights too).
    result.master_begin.push_back(
        setup.stage == 0 ? 0 : rank * bucket.slice_elements);
    const Tensor own = state->OwnWeights(b);
    std::vector<float> weights(own.numel());
    for (size_t i = 0; i < weights.size(); ++i) {
      weights[i] = Weight(b, result.master_begin[b] + i);
    }
    ZE_ASSIGN_OR_RETURN(Tensor values,
                        FromHostFloats(weights, {own.numel()}, own.dtype(),
                                       Device::Cpu(), stream));
    ZE_RETURN_IF_ERROR(Copy(values, own, stream));
  }
  ZE_RETURN_IF_ERROR(state->AllocateTrainingState(stream));
  for (int b = 0; b < layout.num_buckets(); ++b) {
    const Tensor own = state->OwnGradients(b);
    std::vector<float> gradients(own.numel());
    for (size_t i = 0; i < gradients.size(); ++i) {
      gradients[i] = Gradient(b, result.master_begin[b] + i);
    }
    if (rank == setup.inf_rank && b == 1) gradients[3] = INFINITY;
    ZE_ASSIGN_OR_RETURN(Tensor values,
                        FromHostFloats(gradients, {own.numel()}, own.dtype(),
                                       Device::Cpu(), stream));
    ZE_RETURN_IF_ERROR(Copy(values, own, stream));
    state->set_gradients_current(b);
  }
  // config, comm, compute stream, training state, partition, step 1.
  const BoundaryStepContext context{&config,        &comm,       &stream,
                                    training.get(), state.get(), 1};
  BoundaryStepHooks hooks;
  int after_update_calls = 0;
  hooks.after_update = [&] {
    ++after_update_calls;
    return absl::OkStatus();
  };
  if (setup.rank_hashes) {
    hooks.schedule_hash = 1000 + rank;
    hooks.schedule_mismatch = [](uint64_t max, uint64_t min, uint64_t own) {
      return absl::AbortedError(
          absl::StrCat("hashes differ: max ", max, " min ", min, " own ", own));
    };
  }
  result.worth_beginning_early_before = WorthBeginningEarly(config, *training);
  ZE_ASSIGN_OR_RETURN(result.report,
                      RunBoundaryStep(context, /*loss_sum=*/rank + 1.0, hooks));
  result.worth_beginning_early_after = WorthBeginningEarly(config, *training);
  if (after_update_calls != (result.report.skipped ? 0 : 1)) {
    return absl::InternalError(
        absl::StrCat("after_update ran ", after_update_calls, " times"));
  }
  for (int b = 0; b < layout.num_buckets(); ++b) {
    ZE_ASSIGN_OR_RETURN(std::vector<float> master,
                        ToHostFloats(state->OwnMaster(b), stream));
    result.master.push_back(std::move(master));
  }
  return result;
}

// Runs `setup` at `world` ranks; every rank's result (failing the test for
// a rank that failed).
std::vector<Result> RunWorld(int world, const StepSetup& setup) {
  std::vector<absl::StatusOr<Result>> ranks = comm::RunInProcessFor<Result>(
      world, [&](comm::Communicator& comm) { return RunStep(setup, comm); });
  std::vector<Result> results(world);
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(ranks[r].ok()) << "rank " << r << ": " << ranks[r].status();
    if (ranks[r].ok()) results[r] = *std::move(ranks[r]);
  }
  return results;
}

class BoundaryStepTest : public testing::TestWithParam<int> {};

ZE_IN_PROCESS_WORLDS(BoundaryStepTest);

TEST_P(BoundaryStepTest, EveryStageUpdatesItsPartWithTheGlobalClipFactor) {
  const int world = GetParam();
  ASSERT_TRUE(Layout(world).ok());
  const PartitionedLayout layout = *Layout(world);
  // The global norm of the true (averaged) gradient: the stored sums / N.
  double sum_of_squares = 0;
  for (int b = 0; b < layout.num_buckets(); ++b) {
    for (int64_t i = 0; i < layout.bucket(b).padded_elements; ++i) {
      sum_of_squares += Gradient(b, i) * Gradient(b, i);
    }
  }
  const double norm = std::sqrt(sum_of_squares) / world;
  for (int stage = 0; stage <= 3; ++stage) {
    // Without clipping, and with a clip that binds (the norm is ~30).
    for (double clipping : {0.0, 2.0}) {
      StepSetup setup;
      setup.stage = stage;
      setup.clipping = clipping;
      const std::vector<Result> results = RunWorld(world, setup);
      const double coefficient =
          clipping > 0 ? std::min(1.0, clipping / (norm + 1e-6)) : 1.0;
      for (int r = 0; r < world; ++r) {
        const std::string where =
            absl::StrCat("stage ", stage, ", clipping ", clipping, ", rank ", r,
                         " of ", world);
        const StepReport& report = results[r].report;
        EXPECT_TRUE(report.boundary) << where;
        EXPECT_FALSE(report.skipped) << where;
        // Losses 1..N: their mean.
        EXPECT_DOUBLE_EQ(report.loss, (world + 1) / 2.0) << where;
        EXPECT_NEAR(report.grad_norm, norm, 1e-5 * norm) << where;
        EXPECT_DOUBLE_EQ(report.learning_rate, kLearningRate) << where;
        for (int b = 0; b < layout.num_buckets(); ++b) {
          const std::vector<float>& master = results[r].master[b];
          for (size_t i = 0; i < master.size(); ++i) {
            const int64_t at = results[r].master_begin[b] + i;
            const double want = Weight(b, at) - kLearningRate * coefficient *
                                                    Gradient(b, at) / world;
            ASSERT_NEAR(master[i], want, 1e-5)
                << where << ", bucket " << b << " element " << at;
          }
        }
      }
    }
  }
}

TEST_P(BoundaryStepTest, OneRanksInfSkipsTheStepOnEveryRank) {
  const int world = GetParam();
  StepSetup setup;
  setup.stage = 2;
  setup.inf_rank = world - 1;
  const std::vector<Result> results = RunWorld(world, setup);
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(results[r].report.skipped) << "rank " << r;
    EXPECT_TRUE(results[r].report.nonfinite) << "rank " << r;
    // The master weights are the initial ones.
    for (size_t b = 0; b < results[r].master.size(); ++b) {
      for (size_t i = 0; i < results[r].master[b].size(); ++i) {
        const int64_t at = results[r].master_begin[b] + i;
        ASSERT_EQ(results[r].master[b][i], Weight(b, at))
            << "rank " << r << ", bucket " << b << " element " << at;
      }
    }
  }
}

// An update that must speculate (clipping set) begins early unless the
// last step clipped or was skipped; one that needs no statistics always
// does. Every rank decides alike.
TEST_P(BoundaryStepTest, AClippedOrSkippedStepMakesTheNextWaitForTheNorm) {
  const int world = GetParam();
  struct Want {
    double clipping;
    int inf_rank;
    bool worth_after;
  };
  // The norm is ~30 / world: 2 clips, 1000 does not.
  for (const Want& want : {Want{0.0, -1, true}, Want{1000.0, -1, true},
                           Want{2.0, -1, false}, Want{1000.0, 0, false}}) {
    StepSetup setup;
    setup.stage = 2;
    setup.clipping = want.clipping;
    setup.inf_rank = want.inf_rank;
    const std::vector<Result> results = RunWorld(world, setup);
    for (int r = 0; r < world; ++r) {
      const std::string where =
          absl::StrCat("clipping ", want.clipping, ", inf on rank ",
                       want.inf_rank, ", rank ", r, " of ", world);
      EXPECT_TRUE(results[r].worth_beginning_early_before) << where;
      EXPECT_EQ(results[r].worth_beginning_early_after, want.worth_after)
          << where;
      EXPECT_EQ(results[r].report.skipped, want.inf_rank >= 0) << where;
    }
  }
}

TEST(BoundaryStepScheduleTest, DifferingHashesFailEveryRank) {
  for (int world : {2, 3}) {
    StepSetup setup;
    setup.stage = 3;
    setup.rank_hashes = true;
    const std::vector<absl::Status> statuses = comm::RunInProcess(
        world, [&](comm::Communicator& comm) -> absl::Status {
          return RunStep(setup, comm).status();
        });
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(statuses[r].code(), absl::StatusCode::kAborted) << statuses[r];
      EXPECT_TRUE(absl::StrContains(
          statuses[r].message(),
          absl::StrCat("max ", 1000 + world - 1, " min 1000 own ", 1000 + r)))
          << statuses[r];
    }
  }
  // One rank: nothing to differ from.
  StepSetup setup;
  setup.stage = 3;
  setup.rank_hashes = true;
  EXPECT_FALSE(RunWorld(1, setup)[0].report.skipped);
}

}  // namespace
}  // namespace zero
}  // namespace ze
