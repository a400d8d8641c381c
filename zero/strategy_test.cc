// Both ZeRO strategies (Stages0To2 at stages 0-2, Stage3) at 1-4 ranks, as
// threads of one process (comm/in_process.h), driven through the micro-step
// protocol of zero/strategy.h exactly as the Engine drives it, on a tiny
// GPT: two optimizer steps at world size W match one rank at stage 0 that
// accumulates W micro-batches per step (the same samples, averaged alike),
// in the loss and in every f32 master weight. Only the order of
// floating-point sums differs, hence the f32 tolerance.
#include "zero/strategy.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/in_process.h"
#include "comm/in_process_worlds.h"
#include "config/config.h"
#include "core/status.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "nn/gpt.h"
#include "zero/create_strategy.h"
#include "zero/plan.h"
#include "zero/training_state.h"

namespace ze {
namespace zero {
namespace {

constexpr int kSteps = 2;
constexpr int kMicro = 2;
constexpr int kSeqLen = 8;
constexpr int kVocab = 37;
// Relative to max(1, |reference|), as tests/engine/parity_main.cc's f32.
constexpr double kTolerance = 1e-5;

struct TrainedRun {
  std::vector<double> losses;                        // per step
  std::map<std::string, std::vector<float>> master;  // after the last step
};

// Sample g's tokens and targets: a noisy deterministic sequence.
void FillSample(int64_t g, int32_t* tokens, int32_t* targets) {
  uint64_t x = static_cast<uint64_t>(g) * 0x9E3779B97F4A7C15ull + 1;
  int32_t current = static_cast<int32_t>((x >> 33) % kVocab);
  for (int t = 0; t < kSeqLen; ++t) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const int32_t next = (x >> 60) % 4 == 0
                             ? static_cast<int32_t>((x >> 33) % kVocab)
                             : (current * 5 + 3) % kVocab;
    tokens[t] = current;
    targets[t] = next;
    current = next;
  }
}

std::string ConfigJson(int stage, int accumulation) {
  // Small buckets, so parameters straddle buckets and rank slices.
  return absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": )", kMicro,
      R"(, "gradient_accumulation_steps": )", accumulation,
      R"(, "gradient_clipping": 1.0,
          "optimizer": {"type": "SGD",
                        "params": {"lr": 0.1, "momentum": 0.9,
                                   "weight_decay": 0.01}},
          "zero_optimization": {"stage": )",
      stage,
      R"(, "reduce_bucket_size": 700, "allgather_bucket_size": 900,
          "stage3_param_persistence_threshold": 0}})");
}

// One rank's training, as Engine::Forward / Backward / Step drive the
// strategy; rank r's micro-batch m of step s holds global samples
// ((s * A + m) * W + r) * B + i.
absl::StatusOr<TrainedRun> Train(comm::Communicator& comm, int stage,
                                 int accumulation) {
  const int world = comm.world_size();
  const int rank = comm.rank();
  const Stream stream;  // the CPU's
  ZE_ASSIGN_OR_RETURN(
      const config::Config config,
      config::LoadConfigString(ConfigJson(stage, accumulation), world));
  nn::GptConfig gpt;
  gpt.num_layers = 2;
  gpt.num_heads = 2;
  gpt.channels = 16;
  gpt.vocab_size = kVocab;
  gpt.max_seq_len = kSeqLen;
  nn::GptOptions options;
  options.seed = 1234;
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptModel> model,
                      nn::GptModel::Create(gpt, options));
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<TrainingState> training,
                      TrainingState::Create(config, world));
  ZE_ASSIGN_OR_RETURN(const Plan plan, BuildPlan(*model, config, world));
  int64_t global_steps = 0;
  StrategyContext context;
  context.config = &config;
  context.comm = &comm;
  context.compute_stream = &stream;
  context.model = model.get();
  context.training = training.get();
  context.global_steps = &global_steps;
  context.communication_dtype = DType::kF32;
  context.plan = &plan;
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<ZeroStrategy> strategy,
                      CreateZeroStrategy(context));
  TrainedRun run;
  std::vector<int32_t> tokens(kMicro * kSeqLen), targets(kMicro * kSeqLen);
  for (int step = 0; step < kSteps; ++step) {
    double loss_sum = 0;
    for (int m = 0; m < accumulation; ++m) {
      for (int i = 0; i < kMicro; ++i) {
        const int64_t sample =
            ((int64_t{step} * accumulation + m) * world + rank) * kMicro + i;
        FillSample(sample, &tokens[i * kSeqLen], &targets[i * kSeqLen]);
      }
      const Tensor token_tensor = Tensor::Wrap(tokens.data(), {kMicro, kSeqLen},
                                               DType::kI32, Device::Cpu());
      const Tensor target_tensor = Tensor::Wrap(
          targets.data(), {kMicro, kSeqLen}, DType::kI32, Device::Cpu());
      ZE_RETURN_IF_ERROR(strategy->BeginForward());
      absl::StatusOr<float> loss =
          model->ForwardLoss(token_tensor, target_tensor, stream);
      strategy->EndForward();
      ZE_RETURN_IF_ERROR(loss.status());
      loss_sum += *loss;
      ZE_RETURN_IF_ERROR(strategy->BeginBackward(m == accumulation - 1));
      const absl::Status backward = model->BackwardLoss(
          static_cast<float>(training->loss_scale() / accumulation), stream);
      const absl::Status ended = strategy->EndBackward();
      ZE_RETURN_IF_ERROR(backward);
      ZE_RETURN_IF_ERROR(ended);
    }
    ZE_ASSIGN_OR_RETURN(StepReport report, strategy->BoundaryStep(loss_sum));
    ++global_steps;
    if (report.skipped) return absl::InternalError("a step was skipped");
    run.losses.push_back(report.loss);
  }
  for (const std::string& name : strategy->ParameterNames()) {
    ZE_ASSIGN_OR_RETURN(run.master[name], strategy->GatherMasterWeights(name));
  }
  return run;
}

// Every rank's run at `world` ranks (EXPECT-failing for a failed rank).
std::vector<TrainedRun> TrainWorld(int world, int stage, int accumulation) {
  std::vector<absl::StatusOr<TrainedRun>> ranks =
      comm::RunInProcessFor<TrainedRun>(world, [&](comm::Communicator& comm) {
        return Train(comm, stage, accumulation);
      });
  std::vector<TrainedRun> runs(world);
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(ranks[r].ok()) << "stage " << stage << ", rank " << r << " of "
                               << world << ": " << ranks[r].status();
    if (ranks[r].ok()) runs[r] = *std::move(ranks[r]);
  }
  return runs;
}

double RelativeError(double got, double want) {
  return std::fabs(got - want) / std::max(1.0, std::fabs(want));
}

class StrategyTest : public testing::TestWithParam<int> {};

ZE_IN_PROCESS_WORLDS(StrategyTest);

TEST_P(StrategyTest, EveryStageMatchesOneRankAccumulatingTheSameSamples) {
  const int world = GetParam();
  const std::vector<TrainedRun> reference = TrainWorld(1, /*stage=*/0, world);
  ASSERT_EQ(reference[0].losses.size(), static_cast<size_t>(kSteps));
  ASSERT_FALSE(reference[0].master.empty());
  for (int stage = 0; stage <= 3; ++stage) {
    const std::vector<TrainedRun> runs = TrainWorld(world, stage, 1);
    for (int r = 0; r < world; ++r) {
      const std::string where =
          absl::StrCat("stage ", stage, ", rank ", r, " of ", world);
      const TrainedRun& run = runs[r];
      ASSERT_EQ(run.losses.size(), reference[0].losses.size()) << where;
      for (int s = 0; s < kSteps; ++s) {
        EXPECT_LE(RelativeError(run.losses[s], reference[0].losses[s]),
                  kTolerance)
            << where << ", step " << s << ": loss " << run.losses[s] << " vs "
            << reference[0].losses[s];
      }
      ASSERT_EQ(run.master.size(), reference[0].master.size()) << where;
      for (const auto& [name, want] : reference[0].master) {
        const auto found = run.master.find(name);
        ASSERT_NE(found, run.master.end()) << where << ": no " << name;
        ASSERT_EQ(found->second.size(), want.size()) << where << ", " << name;
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_LE(RelativeError(found->second[i], want[i]), kTolerance)
              << where << ", " << name << "[" << i << "]: " << found->second[i]
              << " vs " << want[i];
        }
      }
    }
  }
}

}  // namespace
}  // namespace zero
}  // namespace ze
