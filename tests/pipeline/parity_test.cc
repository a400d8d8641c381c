// Pipeline parity under mpirun: a pipeline of GPT (and Llama) stages (pipeline
// x data-parallel layouts 2x1 at 2 ranks, 3x1 at 3, 2x2 and 4x1 at 4), GPipe,
// 1F1B and zero bubble (ZB-H1, split backward), ZeRO stages 0-3 (with
// clipping, offload, fp16), trains to the
// losses and f32 master weights of the single-rank run over the same samples
// (every rank runs that reference itself, over a world of one split from the
// job's).
//
// Data: replica d's micro-batch m of step s holds global samples
// ((s*A + m)*D + d)*B + i; the reference's accumulation of A*D micro-
// batches sees the same samples (tests/engine's TrainStep numbering).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/ops.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "nn/decoder.h"
#include "nn/gpt.h"
#include "pipeline/layout.h"
#include "pipeline/partition.h"
#include "pipeline/schedule.h"
#include "pipeline/step_time.h"
#include "tests/engine/engine_test_util.h"

namespace ze {
namespace enginetest {
namespace {

constexpr int kSteps = 3;
constexpr int kAccumulation = 4;
constexpr int kMicro = 2;

// Blocks of the models under test: 3 (6 pipeline layers), more where a
// case needs more stages (ExpectParity sets it from Case::layers).
int g_layers = 3;

// Whether the models checkpoint every block (the checkpointing test's).
bool g_checkpoint_blocks = false;

nn::GptConfig Model() {
  nn::GptConfig config = SmallGpt(/*channels=*/16, g_layers);
  config.activation_checkpointing = g_checkpoint_blocks;
  return config;
}

// The model family under test: GPT, or a tiny Llama (tied or untied head).
enum class Family { kGpt, kLlamaTied, kLlamaUntied };
Family g_family = Family::kGpt;

nn::DecoderConfig Llama(bool tied) {
  nn::DecoderConfig config = nn::DecoderConfig::Preset("llama-tiny").value();
  config.num_layers = g_layers;
  config.hidden_size = 16;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_dim = 4;
  config.intermediate_size = 24;
  config.vocab_size = kVocab;
  config.max_position_embeddings = 16;
  config.tie_word_embeddings = tied;
  config.activation_checkpointing = g_checkpoint_blocks;
  return config;
}

std::vector<int64_t> LayerWeights() {
  if (g_family == Family::kGpt) return Model().PipelineLayerWeights();
  return Llama(g_family == Family::kLlamaTied).PipelineLayerWeights();
}

// Extra top-level keys of every run's config (the clipping test's), and
// extra keys of its zero_optimization section (the offload test's).
std::string g_extra_keys;
std::string g_zero_keys;

// Appended inside the "pipeline" section.
std::string g_pipeline_keys;

// The NVMe tier's nvme_path, "$NVME" in g_zero_keys: one directory for
// every rank of a pipeline run, as a job's ranks share one (its stages'
// swap files must not collide there), and the rank's own for its
// single-rank reference, a job of its own (whose one rank would name its
// files as every other rank's reference does). g_nvme_engine tells apart
// the engines a test keeps alive at once, each a job of its own.
std::string g_nvme_engine;
std::string NvmeDirectory(bool reference) {
  const char *tmp = std::getenv("TEST_TMPDIR");
  const std::string directory = absl::StrCat(
      tmp != nullptr ? tmp : "/tmp", "/nvme_w", World(), g_nvme_engine,
      reference ? absl::StrCat("_reference_rank", Rank()) : "");
  std::filesystem::create_directories(directory);
  return directory;
}

std::string ConfigJson(int stages, int zero_stage, const std::string &schedule,
                       int accumulation, const std::string &optimizer,
                       int per_rank = 1) {
  std::string zero_keys = g_zero_keys;
  if (zero_keys.find("$NVME") != std::string::npos) {
    zero_keys = absl::StrReplaceAll(
        zero_keys, {{"$NVME", NvmeDirectory(/*reference=*/stages == 1)}});
  }
  return absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": )", kMicro, g_extra_keys,
      R"(, "gradient_accumulation_steps": )", accumulation,
      R"(, "optimizer": )", optimizer, R"(, "zero_optimization": {"stage": )",
      zero_stage, zero_keys, R"(}, "pipeline": {"stages": )", stages,
      R"(, "schedule": ")", schedule, R"(", "stages_per_rank": )", per_rank,
      g_pipeline_keys, "}}");
}

// The GPT runs' dtype (fp16 for the loss-scale test).
DType g_dtype = DType::kF32;
// The fp16 test's injection: in the step numbered g_inject_step, an inf in
// the gradient of the first block's first module (first stage only), once.
int g_inject_step = -1;
bool g_inject_now = false;

// Adds the injection hook to the module of `model` holding parameter
// "blocks.0...." (none on stages without the first block).
void AddInjection(nn::LossModel &model) {
  for (nn::Module *module : model.Modules()) {
    const std::vector<nn::Parameter *> direct = module->DirectParameters();
    if (direct.empty() || direct[0]->name().rfind("blocks.0.", 0) != 0) {
      continue;
    }
    module->AddHook(nn::HookKind::kPostBackward,
                    [](nn::Module &hooked, const Stream &stream) {
                      if (!g_inject_now) return absl::OkStatus();
                      g_inject_now = false;
                      const Tensor &grad = hooked.DirectParameters()[0]->grad();
                      return Fill(grad.Slice(0, 1), INFINITY, stream);
                    });
    return;
  }
}

absl::StatusOr<std::unique_ptr<nn::LossModel>> Build(int first, int last) {
  if (g_family != Family::kGpt) {
    nn::DecoderOptions options;
    options.seed = 1234;
    options.first_layer = first;
    options.last_layer = last;
    ZE_ASSIGN_OR_RETURN(std::unique_ptr<nn::DecoderModel> model,
                        nn::DecoderModel::Create(
                            Llama(g_family == Family::kLlamaTied), options));
    return std::unique_ptr<nn::LossModel>(std::move(model));
  }
  nn::GptOptions options;
  options.seed = 1234;
  options.first_layer = first;
  options.last_layer = last;
  options.dtype = g_dtype;
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptModel> model,
                      nn::GptModel::Create(Model(), options));
  if (g_inject_step >= 0) AddInjection(*model);
  return std::unique_ptr<nn::LossModel>(std::move(model));
}

struct Run {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> weights;
  // A pipeline run's last step on this rank.
  engine::PipelineCounters counters;
};

// The single-rank run's config: A*D micro-batches per step.
std::string ReferenceConfig(int data_parallel, int zero_stage,
                            const std::string &optimizer) {
  return ConfigJson(1, zero_stage, "1f1b", kAccumulation * data_parallel,
                    optimizer);
}

// What Build(0, -1) makes of the globals it reads: with ReferenceConfig,
// all a single-rank run depends on (ReferenceOnce's key).
std::string ModelKey() {
  return absl::StrCat("family ", static_cast<int>(g_family), ", blocks ",
                      g_layers, ", checkpointed ", g_checkpoint_blocks,
                      ", dtype ", DTypeName(g_dtype), ", inject at step ",
                      g_inject_step);
}

// The single-rank run: A*D micro-batches per step over a world of one.
absl::StatusOr<Run> Reference(int data_parallel, int zero_stage,
                              const std::string &optimizer,
                              std::shared_ptr<comm::Communicator> alone) {
  ZE_ASSIGN_OR_RETURN(std::shared_ptr<nn::LossModel> model, Build(0, -1));
  ZE_ASSIGN_OR_RETURN(
      std::unique_ptr<engine::Engine> engine,
      engine::Initialize(
          model, ReferenceConfig(data_parallel, zero_stage, optimizer), alone));
  Run run;
  for (int step = 0; step < kSteps; ++step) {
    g_inject_now = step == g_inject_step;
    ZE_ASSIGN_OR_RETURN(engine::StepReport report, TrainStep(*engine, step));
    run.losses.push_back(report.loss);
  }
  for (const std::string &name : engine->ParameterNames()) {
    ZE_ASSIGN_OR_RETURN(run.weights[name], engine->GatherMasterWeights(name));
  }
  return run;
}

// This rank's model (fresh weights from the seed) for a pipeline of
// `stages` ranks with per_rank stages each: the model cut into
// stages x per_rank, this rank (pipeline rank r) holding stage
// stage_of(r, c) as its chunk c; by default the looping placement
// r + c x stages. One chunk is the stage itself, several an
// nn::InterleavedStages.
absl::StatusOr<std::shared_ptr<nn::LossModel>> RankModel(
    int stages, int per_rank,
    const std::function<int(int, int)> &stage_of = nullptr) {
  ZE_ASSIGN_OR_RETURN(
      pipeline::PipelineLayout layout,
      pipeline::PipelineLayout::Create(World(), stages, "pipeline.stages"));
  ZE_ASSIGN_OR_RETURN(std::vector<pipeline::LayerRange> ranges,
                      pipeline::PartitionLayers(
                          LayerWeights(), stages * per_rank, "parameters"));
  const int rank = layout.StageOf(Rank());
  std::vector<std::unique_ptr<nn::LossModel>> chunks;
  for (int c = 0; c < per_rank; ++c) {
    const pipeline::LayerRange mine =
        ranges[stage_of ? stage_of(rank, c) : rank + c * stages];
    ZE_ASSIGN_OR_RETURN(std::unique_ptr<nn::LossModel> chunk,
                        Build(mine.first, mine.last));
    chunks.push_back(std::move(chunk));
  }
  if (per_rank == 1)
    return std::shared_ptr<nn::LossModel>(std::move(chunks[0]));
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<nn::InterleavedStages> model,
                      nn::InterleavedStages::Create(std::move(chunks)));
  return std::shared_ptr<nn::LossModel>(std::move(model));
}

// A pipeline engine over RankModel's looping placement.
absl::StatusOr<std::unique_ptr<engine::Engine>> PipelinedEngine(
    int stages, int zero_stage, const std::string &schedule,
    const std::string &optimizer, int per_rank = 1) {
  ZE_ASSIGN_OR_RETURN(std::shared_ptr<nn::LossModel> model,
                      RankModel(stages, per_rank));
  return engine::Initialize(model,
                            ConfigJson(stages, zero_stage, schedule,
                                       kAccumulation, optimizer, per_rank),
                            Comm());
}

// Steps [first, last) of the pipeline run through `engine`, their losses
// appended to run->losses.
absl::Status TrainPipelined(engine::Engine &engine, int first, int last,
                            Run *run) {
  const int replicas = engine.communicator().world_size();
  const int replica = engine.communicator().rank();
  for (int step = first; step < last; ++step) {
    std::vector<std::vector<int32_t>> tokens(kAccumulation),
        targets(kAccumulation);
    std::vector<std::pair<Tensor, Tensor>> batches;
    for (int m = 0; m < kAccumulation; ++m) {
      tokens[m].resize(kMicro * kSeqLen);
      targets[m].resize(kMicro * kSeqLen);
      for (int i = 0; i < kMicro; ++i) {
        const int64_t sample =
            ((int64_t{step} * kAccumulation + m) * replicas + replica) *
                kMicro +
            i;
        FillSample(sample, &tokens[m][i * kSeqLen], &targets[m][i * kSeqLen]);
      }
      batches.emplace_back(Tensor::Wrap(tokens[m].data(), {kMicro, kSeqLen},
                                        DType::kI32, Device::Cpu()),
                           Tensor::Wrap(targets[m].data(), {kMicro, kSeqLen},
                                        DType::kI32, Device::Cpu()));
    }
    g_inject_now = step == g_inject_step;
    ZE_ASSIGN_OR_RETURN(engine::StepReport report, engine.TrainBatch(batches));
    run->losses.push_back(report.loss);
  }
  return absl::OkStatus();
}

absl::Status ReadWeights(engine::Engine &engine, Run *run) {
  for (const std::string &name : engine.ParameterNames()) {
    ZE_ASSIGN_OR_RETURN(run->weights[name], engine.GatherMasterWeights(name));
  }
  return absl::OkStatus();
}

// This rank's stage of the pipeline run; weights of its stage only.
absl::StatusOr<Run> Pipelined(int stages, int zero_stage,
                              const std::string &schedule,
                              const std::string &optimizer, int per_rank) {
  ZE_ASSIGN_OR_RETURN(
      std::unique_ptr<engine::Engine> engine,
      PipelinedEngine(stages, zero_stage, schedule, optimizer, per_rank));
  Run run;
  ZE_RETURN_IF_ERROR(TrainPipelined(*engine, 0, kSteps, &run));
  run.counters = engine->pipeline_counters();
  ZE_RETURN_IF_ERROR(ReadWeights(*engine, &run));
  return run;
}

// What the schedule of `stages` pipeline ranks (`per_rank` stages each,
// kAccumulation micro-batches) keeps in flight on this rank: the
// simulation's peak of stashed micro-batches, and the design's bound.
struct InFlight {
  int pipeline_rank = 0;
  int simulated_peak = 0;
  int bound = 0;
  int compute_actions = 0;  // in the rank's list
  bool split = false;       // Bw actions in it
  double rank_bubble = 0;   // simulated with the default costs
};
absl::StatusOr<InFlight> ScheduledInFlight(int stages,
                                           const std::string &schedule_name,
                                           int per_rank) {
  ZE_ASSIGN_OR_RETURN(
      pipeline::PipelineLayout layout,
      pipeline::PipelineLayout::Create(World(), stages, "pipeline.stages"));
  ZE_ASSIGN_OR_RETURN(const pipeline::ScheduleKind kind,
                      pipeline::ParseScheduleKind(schedule_name));
  ZE_ASSIGN_OR_RETURN(
      const pipeline::Schedule schedule,
      pipeline::BuildSchedule(kind, stages, kAccumulation, per_rank));
  ZE_ASSIGN_OR_RETURN(const pipeline::ScheduleStats stats,
                      pipeline::SimulateSchedule(schedule));
  InFlight in_flight;
  in_flight.pipeline_rank = layout.StageOf(Rank());
  in_flight.simulated_peak = stats.peak_activations[in_flight.pipeline_rank];
  in_flight.bound =
      pipeline::ActivationBound(schedule, in_flight.pipeline_rank);
  for (const pipeline::Action &a : schedule.actions[in_flight.pipeline_rank]) {
    if (pipeline::IsCommunication(a.kind)) continue;
    ++in_flight.compute_actions;
    in_flight.split |= a.kind == pipeline::ActionKind::kBackwardWeight;
  }
  in_flight.rank_bubble = stats.rank_bubble[in_flight.pipeline_rank];
  return in_flight;
}

// Every forward's activations are kept until its backward
// (pipeline/executor.h): no forward ran twice in the step, and the rank
// held the saved state of exactly the micro-batches the schedule keeps in
// flight (measured from the modules' saved-state slots), within its bound.
// A forward run without saving and recomputed at its backward, or records
// dropped or kept past their backward, would change the counts.
void ExpectEveryForwardSavedOnce(const Run &run, int stages,
                                 const std::string &schedule, int per_rank) {
  absl::StatusOr<InFlight> in_flight =
      ScheduledInFlight(stages, schedule, per_rank);
  ASSERT_TRUE(in_flight.ok()) << in_flight.status();
  EXPECT_EQ(run.counters.recomputed_forwards, 0);
  EXPECT_EQ(run.counters.peak_saved_micro_batches, in_flight->simulated_peak)
      << "pipeline rank " << in_flight->pipeline_rank;
  EXPECT_EQ(run.counters.activation_bound, in_flight->bound);
  EXPECT_LE(run.counters.peak_saved_micro_batches, in_flight->bound);
  // The step's time (pipeline/executor.h "Time"): every compute action of
  // the rank's list timed once, busy the sum of its parts, the waits part
  // of the idle time (intervals of one clock, disjoint, inside the step),
  // weight-gradient time only where the list has Bw actions. No durations
  // compared: they are the machine's.
  const pipeline::StepTimes &t = run.counters.times;
  EXPECT_EQ(t.compute_actions, in_flight->compute_actions);
  EXPECT_NEAR(t.busy_ms,
              t.forward_ms + t.backward_ms + t.weight_gradient_ms + t.reduce_ms,
              1e-9 * (1 + t.busy_ms));
  EXPECT_GT(t.wall_ms, 0);
  EXPECT_NEAR(t.busy_ms + t.idle_ms, t.wall_ms, 1e-9 * t.wall_ms);
  EXPECT_GE(t.wait_ms, 0);
  EXPECT_LE(t.wait_ms, t.idle_ms + 1e-6);
  if (!in_flight->split) EXPECT_EQ(t.weight_gradient_ms, 0);
  EXPECT_DOUBLE_EQ(run.counters.schedule_rank_bubble, in_flight->rank_bubble);
}

struct Case {
  int stages;
  int zero_stage;
  std::string schedule;
  std::string optimizer;
  double tolerance;
  int per_rank = 1;  // pipeline.stages_per_rank (interleaved_1f1b: > 1)
  int layers = 3;    // blocks of the model
};

// Reference, run once per process for each config and model: it does not
// depend on the schedule or the stage count, only on the data-parallel
// size (in its accumulation), so a table's schedules and stage counts of
// one data-parallel size share it. It costs p x D times a pipeline rank's
// work, most of a case's time on 2 cores. Every rank asks for the same
// keys in the same order (its own reference nvme_path the only difference),
// so all ranks split a world of one off together or none does.
absl::StatusOr<Run> ReferenceOnce(int data_parallel, int zero_stage,
                                  const std::string &optimizer) {
  static auto *runs = new std::map<std::string, Run>();
  const std::string key = absl::StrCat(
      ReferenceConfig(data_parallel, zero_stage, optimizer), " | ", ModelKey());
  if (auto found = runs->find(key); found != runs->end()) return found->second;
  // Every rank splits off its own world of one for the reference.
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> alone,
                      Comm()->Split(Rank(), 0));
  ZE_ASSIGN_OR_RETURN(
      Run run,
      Reference(data_parallel, zero_stage, optimizer,
                std::shared_ptr<comm::Communicator>(std::move(alone))));
  return runs->emplace(key, std::move(run)).first->second;
}

void ExpectParity(const Case &c) {
  SCOPED_TRACE(testing::Message()
               << c.stages << " stages x " << World() / c.stages
               << " replicas, family " << static_cast<int>(g_family) << ", "
               << c.schedule << " (" << c.per_rank << " per rank), ZeRO "
               << c.zero_stage << ", " << c.optimizer << ", rank " << Rank());
  g_layers = c.layers;
  struct RestoreLayers {
    ~RestoreLayers() { g_layers = 3; }
  } restore;
  absl::StatusOr<Run> reference =
      ReferenceOnce(World() / c.stages, c.zero_stage, c.optimizer);
  ASSERT_TRUE(reference.ok()) << reference.status();
  absl::StatusOr<Run> piped =
      Pipelined(c.stages, c.zero_stage, c.schedule, c.optimizer, c.per_rank);
  ASSERT_TRUE(piped.ok()) << piped.status();
  std::map<std::string, std::vector<float>> reference_weights;
  for (const auto &[name, values] : piped->weights) {
    ASSERT_EQ(reference->weights.count(name), 1u) << name;
    reference_weights[name] = reference->weights[name];
  }
  ASSERT_FALSE(piped->weights.empty());
  ExpectRunsClose(piped->losses, piped->weights, reference->losses,
                  reference_weights, c.tolerance);
  ExpectEveryForwardSavedOnce(*piped, c.stages, c.schedule, c.per_rank);
}

std::vector<int> StageCounts() {
  std::vector<int> counts;
  for (int stages = 2; stages <= World(); ++stages) {
    if (World() % stages == 0) counts.push_back(stages);
  }
  return counts;
}

// The pipeline ranks tested with 2 stages per rank: those dividing the
// world and the micro-batches (2 at 2 ranks; 2 and 4 at 4 ranks; none at
// 3).
std::vector<int> InterleavedStageCounts() {
  std::vector<int> counts;
  for (int stages : StageCounts()) {
    if (kAccumulation % stages == 0) counts.push_back(stages);
  }
  return counts;
}

// Blocks for 2 stages on each of `stages` ranks: the model's pipeline
// sequence (blocks + 3: embedding, final norm, head) needs 2 x stages
// layers; 3 blocks at least, as the other cases.
int InterleavedLayers(int stages) { return std::max(3, 2 * stages - 3); }

// ExpectParity for the interleaved schedule (2 stages per rank) at every
// interleaved layout of this world, ZeRO stage `zero_stage`.
void ExpectInterleavedParity(int zero_stage, const std::string &optimizer,
                             double tolerance) {
  for (int stages : InterleavedStageCounts()) {
    ExpectParity({stages, zero_stage, "interleaved_1f1b", optimizer, tolerance,
                  2, InterleavedLayers(stages)});
  }
}

constexpr char kSgd[] = R"({"type": "SGD", "params": {"lr": 0.1}})";
constexpr char kAdamW[] =
    R"({"type": "AdamW", "params": {"lr": 0.002, "weight_decay": 0.01}})";

TEST(PipelineParity, EveryLayoutScheduleAndZeroStageWithSgd) {
  if (World() < 2) GTEST_SKIP() << "a pipeline needs 2 or more ranks";
  for (int stages : StageCounts()) {
    for (const char *schedule : {"gpipe", "1f1b", "zb_h1"}) {
      for (int zero_stage : {0, 1, 2, 3}) {
        ExpectParity({stages, zero_stage, schedule, kSgd, 1e-5});
      }
    }
  }
}

// The Llama family through the same engine path, tied and untied heads:
// 1F1B at ZeRO 1, and the zero-bubble schedule at ZeRO 0-3 (its split
// backward through the decoder's fused projections, whose gradient addends
// stay in the input-gradient part).
TEST(PipelineParity, LlamaTiedAndUntied) {
  if (World() < 2) GTEST_SKIP() << "a pipeline needs 2 or more ranks";
  struct ScheduleStages {
    const char *schedule;
    std::vector<int> zero_stages;
  };
  for (Family family : {Family::kLlamaTied, Family::kLlamaUntied}) {
    g_family = family;
    for (int stages : StageCounts()) {
      for (const ScheduleStages &table :
           {ScheduleStages{"1f1b", {1}},
            ScheduleStages{"zb_h1", {0, 1, 2, 3}}}) {
        for (int zero_stage : table.zero_stages) {
          ExpectParity({stages, zero_stage, table.schedule, kSgd, 1e-5});
        }
      }
    }
  }
  g_family = Family::kGpt;
}

TEST(PipelineParity, OneFOneBWithAdamW) {
  if (World() < 2) GTEST_SKIP() << "a pipeline needs 2 or more ranks";
  for (int stages : StageCounts()) {
    ExpectParity({stages, 1, "1f1b", kAdamW, 1e-4});
  }
}

// gradient_clipping below the norm clips every step (SGD: the update is
// proportional to the clip factor) by the whole
// model's norm: each stage holds a part of the gradients (and the last
// stage a copy of the tied table's), so a norm of one stage's gradients, or
// one counting the tied table twice, would give other weights than the
// single-rank run. GPT and the tied Llama, GPipe and 1F1B, ZeRO 0-3.
TEST(PipelineParity, ClippingByTheNormAcrossStages) {
  if (World() < 2) GTEST_SKIP() << "a pipeline needs 2 or more ranks";
  g_extra_keys = R"(, "gradient_clipping": 0.1)";
  for (Family family : {Family::kGpt, Family::kLlamaTied}) {
    g_family = family;
    // zb_h1 clips as 1f1b does (the split changes how the gradients are
    // formed, which the other tables check, not the step): with clipping
    // in the offload table.
    for (int stages : StageCounts()) {
      for (const char *schedule : {"gpipe", "1f1b"}) {
        for (int zero_stage : {0, 1, 2, 3}) {
          ExpectParity({stages, zero_stage, schedule, kSgd, 1e-5});
        }
      }
    }
  }
  g_family = Family::kGpt;
  g_extra_keys.clear();
}

// fp16 with dynamic loss scaling: an inf in the first block's gradient (on
// the first stage only) must make every stage skip that step, as the
// single-rank run does, because the overflow flag is summed over the
// pipeline; the other steps train as the single-rank fp16 run.
TEST(PipelineParity, Fp16OverflowSkipsTheStepOnEveryStage) {
  if (World() < 2) GTEST_SKIP() << "a pipeline needs 2 or more ranks";
  g_dtype = DType::kF16;
  g_extra_keys =
      R"(, "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 8})";
  g_inject_step = 1;
  for (int stages : StageCounts()) {
    // zb_h1: the inf lands in a LayerNorm's gradient, formed in Bi.
    for (const char *schedule : {"1f1b", "zb_h1"}) {
      for (int zero_stage : {0, 1}) {
        ExpectParity({stages, zero_stage, schedule, kSgd, 1e-4});
      }
    }
  }
  // Interleaved: the injection is in whichever stage holds the first block
  // (rank 0's or rank 1's first).
  for (int zero_stage : {0, 1}) {
    ExpectInterleavedParity(zero_stage, kSgd, 1e-4);
  }
  g_dtype = DType::kF32;
  g_extra_keys.clear();
  g_inject_step = -1;
}

// ZeRO-Offload inside each stage: the optimizer step of every stage's
// data-parallel share on the CPU, clipped by the norm across the stages
// (the update cannot begin during a boundary backward: a pipeline has
// none, so it runs at the step). ZeRO 1-3, AdamW; at 3 also with
// offload_param, with the whole optimizer on the CPU, half of it or all of
// it on the GPU.
TEST(PipelineParity, OffloadOptimizerWithClipping) {
  if (World() < 2) GTEST_SKIP() << "a pipeline needs 2 or more ranks";
  g_extra_keys = R"(, "gradient_clipping": 0.1)";
  g_zero_keys = R"(, "offload_optimizer": {"device": "cpu"})";
  for (int stages : StageCounts()) {
    for (const char *schedule : {"1f1b", "zb_h1"}) {
      for (int zero_stage : {1, 2, 3}) {
        ExpectParity({stages, zero_stage, schedule, kAdamW, 1e-4});
      }
    }
  }
  // Stage 3 with the parameters on the host too.
  g_zero_keys =
      R"(, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"})";
  for (int stages : StageCounts()) {
    for (const char *schedule : {"1f1b", "zb_h1"}) {
      ExpectParity({stages, 3, schedule, kAdamW, 1e-4});
    }
  }
  // And with half of each stage's optimizer kept on the GPU (issue 28):
  // its buckets' new weights are copied to the host after their update.
  g_zero_keys =
      R"(, "offload_optimizer": {"device": "cpu", "ratio": 0.5}, "offload_param": {"device": "cpu"})";
  for (int stages : StageCounts()) {
    ExpectParity({stages, 3, "1f1b", kAdamW, 1e-4});
  }
  // ... and all of it (no offload_optimizer).
  g_zero_keys = R"(, "offload_param": {"device": "cpu"})";
  for (int stages : StageCounts()) {
    ExpectParity({stages, 3, "1f1b", kAdamW, 1e-4});
  }
  g_extra_keys.clear();
  g_zero_keys.clear();
}

// Interleaved 1F1B (issue 29): 2 pipeline ranks (x 2 data-parallel at 4
// ranks) with 2 stages each, the model cut into 4 (stage s on rank s % 2,
// so rank 0 holds the embedding's stage and the third, rank 1 the second
// and the head's), and at 4 ranks also 4 x 1 with 2 stages each (8 stages
// of a 5-block model: the middle ranks hold neither end), one ZeRO
// strategy per rank over all its stages:
// the single-rank run's losses and weights at ZeRO 0-3, for GPT and the
// Llama family (tied and untied), with and without clipping across the
// stages. A wrong chunk order, a message matched to another stage's
// buffer, a gradient of a stage reduced before its last backward (ZeRO
// 2-3 count uses per bracket), a tied table summed twice or not at all,
// or a chunk's parameters left out of the strategy would each change them.
TEST(PipelineParity, InterleavedEveryZeroStageGptAndLlama) {
  if (World() < 2) GTEST_SKIP() << "a pipeline needs 2 or more ranks";
  if (InterleavedStageCounts().empty()) GTEST_SKIP() << "no interleaved layout";
  for (Family family :
       {Family::kGpt, Family::kLlamaTied, Family::kLlamaUntied}) {
    g_family = family;
    for (int zero_stage : {0, 1, 2, 3}) {
      ExpectInterleavedParity(zero_stage, kSgd, 1e-5);
    }
  }
  g_family = Family::kGpt;
  g_extra_keys = R"(, "gradient_clipping": 0.1)";
  for (Family family : {Family::kGpt, Family::kLlamaTied}) {
    g_family = family;
    for (int zero_stage : {0, 1, 2, 3}) {
      ExpectInterleavedParity(zero_stage, kSgd, 1e-5);
    }
  }
  g_family = Family::kGpt;
  g_extra_keys.clear();
}

// Interleaved with ZeRO-Offload inside each rank (AdamW's step on the CPU,
// clipped by the norm across the ranks), ZeRO 1-3, GPT and the Llama
// family (tied and untied); at 3 also with offload_param (GPT).
TEST(PipelineParity, InterleavedOffloadOptimizer) {
  if (World() < 2) GTEST_SKIP() << "a pipeline needs 2 or more ranks";
  if (InterleavedStageCounts().empty()) GTEST_SKIP() << "no interleaved layout";
  g_extra_keys = R"(, "gradient_clipping": 0.1)";
  g_zero_keys = R"(, "offload_optimizer": {"device": "cpu"})";
  for (Family family :
       {Family::kGpt, Family::kLlamaTied, Family::kLlamaUntied}) {
    g_family = family;
    for (int zero_stage : {1, 2, 3}) {
      ExpectInterleavedParity(zero_stage, kAdamW, 1e-4);
    }
  }
  g_family = Family::kGpt;
  g_zero_keys =
      R"(, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"})";
  ExpectInterleavedParity(3, kAdamW, 1e-4);
  g_extra_keys.clear();
  g_zero_keys.clear();
}

// The layouts and schedules of the NVMe and delayed-update tables: every
// layout for GPT (gpipe, 1f1b, zb_h1); the Llama family's (tied and untied)
// up to 3 stages (2x1, 3x1, 2x2) with 1f1b and zb_h1: its 4x1 would check
// nothing of the swap files' names, the fetch order or the lag that GPT's
// does not, for a third of the 4-rank run's time. Sets g_family for each.
void ForEachFamilyStagesAndSchedule(
    const std::function<void(int stages, const char *schedule)> &run) {
  struct Table {
    Family family;
    std::vector<const char *> schedules;
    int max_stages;
  };
  for (const Table &table :
       {Table{Family::kGpt, {"gpipe", "1f1b", "zb_h1"}, 4},
        Table{Family::kLlamaTied, {"1f1b", "zb_h1"}, 3},
        Table{Family::kLlamaUntied, {"1f1b", "zb_h1"}, 3}}) {
    g_family = table.family;
    for (int stages : StageCounts()) {
      if (stages > table.max_stages) continue;
      for (const char *schedule : table.schedules) run(stages, schedule);
    }
  }
}

// The NVMe tier inside each stage (ZeRO-Infinity, stage 3), clipped by the
// norm across the stages: AdamW's state in a swap file per rank (in chunks
// of a sub-group), and then the parameters too, each bucket gathered anew
// at every use (no persistence, no reuse) and read ahead from its file in
// the fetch schedule's recorded order, which a pipeline's micro-steps
// interleave (1F1B's F(m + w) then B(m), its cool-down's backwards, ZB-H1's
// split parts). Every rank of the pipeline run swaps into one nvme_path,
// as a job's ranks do; each stage's data-parallel ranks number from 0, so
// files named by that rank would collide across the stages (the second
// stage's Initialize failing on the first's lock): they are named by the
// world rank. 1F1B and ZB-H1, GPT and the Llama family (tied and untied);
// GPipe and interleaved 1F1B for GPT.
TEST(PipelineParity, NvmeOffloadOfOptimizerAndParameters) {
  if (World() < 2) GTEST_SKIP() << "a pipeline needs 2 or more ranks";
  g_extra_keys = R"(, "gradient_clipping": 0.1)";
  const std::string optimizer_on_nvme =
      R"(, "sub_group_size": 1000, "offload_optimizer": {"device": "nvme", )"
      R"("nvme_path": "$NVME", "buffer_count": 2})";
  const std::string parameters_on_nvme = absl::StrCat(
      optimizer_on_nvme,
      R"(, "stage3_param_persistence_threshold": 0, )"
      R"("stage3_max_reuse_distance": 0, "offload_param": {"device": "nvme", )"
      R"("nvme_path": "$NVME", "max_in_cpu": 0, "buffer_count": 3})");
  ForEachFamilyStagesAndSchedule([&](int stages, const char *schedule) {
    for (const std::string &keys : {optimizer_on_nvme, parameters_on_nvme}) {
      g_zero_keys = keys;
      ExpectParity({stages, 3, schedule, kAdamW, 1e-4});
    }
  });
  // Interleaved (GPT): one strategy, so one set of files, per rank for its
  // stages; each stage's micro-steps follow their own fetch record.
  g_family = Family::kGpt;
  for (const std::string &keys : {optimizer_on_nvme, parameters_on_nvme}) {
    g_zero_keys = keys;
    ExpectInterleavedParity(3, kAdamW, 1e-4);
  }
  g_extra_keys.clear();
  g_zero_keys.clear();
}

// ZeRO-Offload's delayed update inside each stage (stages 1-2, the CPU
// optimizer, ratio 1): each stage's optimizer step t runs during step
// t + 1's micro-batches, which use the weights from before it, and joins
// at step t + 1's boundary, as the single-rank run with the delayed update
// does (the reference here): the same one-step lag on every stage, the
// tied table's two copies updated alike, clipped by the norm across the
// stages. A stage joining at another point (a micro-batch's instead of the
// step's), or one stage's update landing a step early, would change the
// losses. 1F1B and ZB-H1, GPT and the Llama family; GPipe and
// interleaved 1F1B for GPT.
TEST(PipelineParity, DelayedUpdate) {
  if (World() < 2) GTEST_SKIP() << "a pipeline needs 2 or more ranks";
  g_extra_keys = R"(, "gradient_clipping": 0.1)";
  g_zero_keys =
      R"(, "offload_optimizer": {"device": "cpu", "delayed_update": true})";
  ForEachFamilyStagesAndSchedule([](int stages, const char *schedule) {
    for (int zero_stage : {1, 2}) {
      ExpectParity({stages, zero_stage, schedule, kAdamW, 1e-4});
    }
  });
  // Interleaved (GPT): a rank's stages share one optimizer, so one lag.
  g_family = Family::kGpt;
  for (int zero_stage : {1, 2}) {
    ExpectInterleavedParity(zero_stage, kAdamW, 1e-4);
  }
  g_extra_keys.clear();
  g_zero_keys.clear();
}

// Activation checkpointing of every block (GptConfig / DecoderConfig
// activation_checkpointing, or pipeline.activation_checkpoint_interval 1,
// which checkpoints the blocks and not the head, whose loss mode refuses
// it), on the device and with cpu_checkpointing (the blocks' kept inputs in
// host memory): with several micro-batches in flight each checkpointed block
// keeps one input per micro-batch, in the micro-batch's saved-state slot,
// and recomputes from its own one in that micro-batch's backward; the
// offload prefetches within the slot. 1F1B and interleaved, GPT and the
// tied Llama, ZeRO 2 and 3 (their reductions wait for the micro-batch's
// own uses): the single-rank run's losses and weights (the reference
// checkpoints too: bit-identical either way). A backward recomputing from
// another micro-batch's input, or an offloaded input restored for the
// wrong block, would change them.
TEST(PipelineParity, ActivationCheckpointingWithMicroBatchesInFlight) {
  if (World() < 2) GTEST_SKIP() << "a pipeline needs 2 or more ranks";
  // Blocks checkpointed by the model's config, on the device or with
  // cpu_checkpointing, or by the config's pipeline section.
  struct Variant {
    bool model_checkpoints_blocks;
    const char *extra_keys;
    const char *pipeline_keys;
  };
  for (const Variant &variant :
       {Variant{true, "", ""},
        Variant{true,
                R"(, "activation_checkpointing": {"cpu_checkpointing": true})",
                ""},
        Variant{false, "", R"(, "activation_checkpoint_interval": 1)"}}) {
    g_checkpoint_blocks = variant.model_checkpoints_blocks;
    g_extra_keys = variant.extra_keys;
    g_pipeline_keys = variant.pipeline_keys;
    for (Family family : {Family::kGpt, Family::kLlamaTied}) {
      g_family = family;
      for (int stages : StageCounts()) {
        for (const char *schedule : {"1f1b", "zb_h1"}) {
          for (int zero_stage : {2, 3}) {
            ExpectParity({stages, zero_stage, schedule, kSgd, 1e-5});
          }
        }
      }
      for (int zero_stage : {2, 3}) {
        ExpectInterleavedParity(zero_stage, kSgd, 1e-5);
      }
    }
  }
  g_family = Family::kGpt;
  g_extra_keys.clear();
  g_pipeline_keys.clear();
  g_checkpoint_blocks = false;
}

// The saved micro-batches each pipeline rank holds at most, per schedule
// (printed; and equal to the schedule's simulated peak): GPipe m, 1F1B
// min(m, p - rank), interleaved Megatron's warm-up plus one (in stages).
TEST(PipelineMemory, PeakSavedMicroBatchesPerRank) {
  if (World() < 2) GTEST_SKIP() << "a pipeline needs 2 or more ranks";
  const int stages = World();
  std::vector<std::pair<std::string, int>> schedules = {
      {"gpipe", 1}, {"1f1b", 1}, {"zb_h1", 1}};
  if (kAccumulation % stages == 0) {
    schedules.emplace_back("interleaved_1f1b", 2);
  }
  for (const auto &[schedule, per_rank] : schedules) {
    SCOPED_TRACE(absl::StrCat(schedule, ", rank ", Rank()));
    g_layers = per_rank == 1 ? 3 : InterleavedLayers(stages);
    absl::StatusOr<std::unique_ptr<engine::Engine>> engine =
        PipelinedEngine(stages, 1, schedule, kSgd, per_rank);
    g_layers = 3;
    ASSERT_TRUE(engine.ok()) << engine.status();
    enginetest::Run run;
    ASSERT_TRUE(TrainPipelined(**engine, 0, 1, &run).ok());
    run.counters = (*engine)->pipeline_counters();
    std::printf(
        "%s, %d ranks x %d stage(s), %d micro-batches: pipeline rank %d held "
        "at most %d saved micro-batches (bound %d), recomputed %d forwards\n",
        schedule.c_str(), stages, per_rank, kAccumulation, Rank(),
        run.counters.peak_saved_micro_batches, run.counters.activation_bound,
        run.counters.recomputed_forwards);
    ExpectEveryForwardSavedOnce(run, stages, schedule, per_rank);
  }
}

// A directory every rank of this job names alike (the ranks share the
// test's sandbox).
std::string SharedDirectory(const std::string &name) {
  const char *tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name, "_w", World());
}

// A pipeline's checkpoint: saved after step 1 by every stage, loaded by a
// fresh engine of the same layout, which then trains to the uninterrupted
// run's losses and weights bit for bit (at ZeRO 1-3, AdamW, so the
// moments travel too), with 1F1B and, at ZeRO 3, zb_h1 (its deferred
// weight gradients all run within the step, so nothing of them is saved),
// and at ZeRO 3 with the NVMe tier: the optimizer state's swap files (1F1B),
// and the parameters' too (zb_h1), read into the checkpoint and written
// back from it by every stage (each engine's files in its own nvme_path,
// the engines being alive at once).
// The same directory refuses a pipeline of another stage count, naming
// both layouts, and a directory without a pipeline checkpoint is NotFound,
// on every rank, before anything is loaded.
TEST(PipelineCheckpoint, ResumesBitForBitAndRefusesAnotherLayout) {
  if (World() < 2) GTEST_SKIP() << "a pipeline needs 2 or more ranks";
  const int stages = World() == 4 ? 2 : World();
  struct CheckpointCase {
    const char *schedule;
    int zero_stage;
    const char *zero_keys;
    const char *name;
  };
  const char *optimizer_on_nvme =
      R"(, "sub_group_size": 1000, "offload_optimizer": {"device": "nvme", )"
      R"("nvme_path": "$NVME", "buffer_count": 2})";
  const std::string parameters_on_nvme = absl::StrCat(
      optimizer_on_nvme,
      R"(, "stage3_param_persistence_threshold": 0, "offload_param": )"
      R"({"device": "nvme", "nvme_path": "$NVME", "max_in_cpu": 0, )"
      R"("buffer_count": 3})");
  const std::vector<CheckpointCase> cases = {
      {"1f1b", 1, "", ""},
      {"1f1b", 2, "", ""},
      {"1f1b", 3, "", ""},
      {"zb_h1", 3, "", ""},
      {"1f1b", 3, optimizer_on_nvme, "_nvme"},
      {"zb_h1", 3, parameters_on_nvme.c_str(), "_nvme_param"}};
  for (const CheckpointCase &c : cases) {
    const char *schedule = c.schedule;
    const int zero_stage = c.zero_stage;
    g_zero_keys = c.zero_keys;
    SCOPED_TRACE(absl::StrCat(schedule, ", ZeRO ", zero_stage, c.name,
                              ", rank ", Rank()));
    const std::string directory = SharedDirectory(
        absl::StrCat("pipeline_ckpt_", schedule, "_z", zero_stage, c.name));
    g_nvme_engine = "_whole";
    absl::StatusOr<std::unique_ptr<engine::Engine>> whole =
        PipelinedEngine(stages, zero_stage, schedule, kAdamW);
    ASSERT_TRUE(whole.ok()) << whole.status();
    enginetest::Run uninterrupted;
    ASSERT_TRUE(TrainPipelined(**whole, 0, 1, &uninterrupted).ok());
    ASSERT_TRUE((*whole)->SaveCheckpoint(directory).ok());
    ASSERT_TRUE(TrainPipelined(**whole, 1, kSteps, &uninterrupted).ok());
    ASSERT_TRUE(ReadWeights(**whole, &uninterrupted).ok());

    g_nvme_engine = "_resumed";
    absl::StatusOr<std::unique_ptr<engine::Engine>> resumed_engine =
        PipelinedEngine(stages, zero_stage, schedule, kAdamW);
    ASSERT_TRUE(resumed_engine.ok()) << resumed_engine.status();
    absl::StatusOr<engine::LoadedCheckpoint> loaded =
        (*resumed_engine)->LoadCheckpoint(directory);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->tag, "global_step1");
    enginetest::Run resumed;
    resumed.losses.push_back(uninterrupted.losses[0]);
    ASSERT_TRUE(TrainPipelined(**resumed_engine, 1, kSteps, &resumed).ok());
    ASSERT_TRUE(ReadWeights(**resumed_engine, &resumed).ok());
    EXPECT_EQ(resumed.losses, uninterrupted.losses);
    for (const auto &[name, values] : uninterrupted.weights) {
      EXPECT_EQ(resumed.weights[name], values) << name;
    }

    // Another stage count: every rank refuses, naming pipeline.json.
    if (World() % 2 == 0 && World() != stages) {
      g_nvme_engine = "_other";
      absl::StatusOr<std::unique_ptr<engine::Engine>> other =
          PipelinedEngine(World(), zero_stage, "1f1b", kAdamW);
      ASSERT_TRUE(other.ok()) << other.status();
      absl::StatusOr<engine::LoadedCheckpoint> refused =
          (*other)->LoadCheckpoint(directory);
      EXPECT_FALSE(refused.ok());
      if (Rank() == 0) {
        EXPECT_EQ(refused.status().code(),
                  absl::StatusCode::kFailedPrecondition);
        EXPECT_NE(refused.status().message().find("pipeline.json"),
                  std::string::npos)
            << refused.status();
      }
    }
    absl::StatusOr<engine::LoadedCheckpoint> missing =
        (*resumed_engine)->LoadCheckpoint(directory + "_none");
    EXPECT_FALSE(missing.ok());
    if (Rank() == 0) {
      EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound)
          << missing.status();
    }
  }
  g_zero_keys.clear();
  g_nvme_engine.clear();
}

// An interleaved pipeline's checkpoint (2 ranks x 2 stages each): saved
// after step 1, one checkpoint per pipeline rank holding both its stages
// (pipeline_rank_<r>/: one strategy's state), loaded by a fresh engine of
// the same layout, which then trains to the uninterrupted run's losses and
// weights bit for bit (ZeRO 1 and 3, AdamW: the moments travel too). The
// same directory is refused, naming pipeline.json, by a pipeline of one
// stage per rank over the same ranks (its stages hold other layers).
TEST(PipelineCheckpoint, InterleavedResumesBitForBitAndRefusesOneStagePerRank) {
  if (World() < 2) GTEST_SKIP() << "a pipeline needs 2 or more ranks";
  if (InterleavedStageCounts().empty()) GTEST_SKIP() << "no interleaved layout";
  const int stages = InterleavedStageCounts()[0];
  for (int zero_stage : {1, 3}) {
    SCOPED_TRACE(absl::StrCat("ZeRO ", zero_stage, ", rank ", Rank()));
    const std::string directory = SharedDirectory(
        absl::StrCat("pipeline_interleaved_ckpt_z", zero_stage));
    absl::StatusOr<std::unique_ptr<engine::Engine>> whole = PipelinedEngine(
        stages, zero_stage, "interleaved_1f1b", kAdamW, /*per_rank=*/2);
    ASSERT_TRUE(whole.ok()) << whole.status();
    enginetest::Run uninterrupted;
    ASSERT_TRUE(TrainPipelined(**whole, 0, 1, &uninterrupted).ok());
    ASSERT_TRUE((*whole)->SaveCheckpoint(directory).ok());
    ASSERT_TRUE(TrainPipelined(**whole, 1, kSteps, &uninterrupted).ok());
    ASSERT_TRUE(ReadWeights(**whole, &uninterrupted).ok());
    EXPECT_TRUE(std::filesystem::is_directory(
        absl::StrCat(directory, "/pipeline_rank_", stages - 1)));

    absl::StatusOr<std::unique_ptr<engine::Engine>> resumed_engine =
        PipelinedEngine(stages, zero_stage, "interleaved_1f1b", kAdamW, 2);
    ASSERT_TRUE(resumed_engine.ok()) << resumed_engine.status();
    absl::StatusOr<engine::LoadedCheckpoint> loaded =
        (*resumed_engine)->LoadCheckpoint(directory);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->tag, "global_step1");
    enginetest::Run resumed;
    resumed.losses.push_back(uninterrupted.losses[0]);
    ASSERT_TRUE(TrainPipelined(**resumed_engine, 1, kSteps, &resumed).ok());
    ASSERT_TRUE(ReadWeights(**resumed_engine, &resumed).ok());
    EXPECT_EQ(resumed.losses, uninterrupted.losses);
    ASSERT_EQ(resumed.weights.size(), uninterrupted.weights.size());
    for (const auto &[name, values] : uninterrupted.weights) {
      EXPECT_EQ(resumed.weights[name], values) << name;
    }

    absl::StatusOr<std::unique_ptr<engine::Engine>> other =
        PipelinedEngine(stages, zero_stage, "1f1b", kAdamW);
    ASSERT_TRUE(other.ok()) << other.status();
    absl::StatusOr<engine::LoadedCheckpoint> refused =
        (*other)->LoadCheckpoint(directory);
    EXPECT_FALSE(refused.ok());
    if (Rank() == 0) {
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_NE(refused.status().message().find("pipeline.json"),
                std::string::npos)
          << refused.status();
    }
  }
}

// Ranks that would run different schedules (the last stage configured with
// fewer micro-batches) fail at Initialize on every rank, naming the cause,
// instead of hanging in a send no one receives.
TEST(PipelineErrors, RanksWithDifferentSchedulesFailByName) {
  if (World() < 2) GTEST_SKIP() << "a pipeline needs 2 or more ranks";
  const int stages = World();
  absl::StatusOr<std::vector<pipeline::LayerRange>> ranges =
      pipeline::PartitionLayers(LayerWeights(), stages, "parameters");
  ASSERT_TRUE(ranges.ok()) << ranges.status();
  absl::StatusOr<std::unique_ptr<nn::LossModel>> model =
      Build((*ranges)[Rank()].first, (*ranges)[Rank()].last);
  ASSERT_TRUE(model.ok()) << model.status();
  const int accumulation = Rank() == World() - 1 ? 2 : kAccumulation;
  const absl::Status status =
      engine::Initialize(std::move(*model),
                         ConfigJson(stages, 0, "1f1b", accumulation, kSgd),
                         Comm())
          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find(absl::StrCat("pipeline ranks ", World() - 1,
                                               " built another schedule")),
            std::string::npos)
      << status;
}

// Interleaved: ranks of the last pipeline rank configured with fewer
// micro-batches (2, still a multiple of the ranks) build other lists; every
// rank fails at Initialize, naming the rank, instead of hanging.
TEST(PipelineErrors, InterleavedRanksWithDifferentSchedulesFailByName) {
  if (World() < 2) GTEST_SKIP() << "a pipeline needs 2 or more ranks";
  if (InterleavedStageCounts().empty()) GTEST_SKIP() << "no interleaved layout";
  const int stages = InterleavedStageCounts()[0];
  absl::StatusOr<pipeline::PipelineLayout> layout =
      pipeline::PipelineLayout::Create(World(), stages, "pipeline.stages");
  ASSERT_TRUE(layout.ok()) << layout.status();
  const int rank = layout->StageOf(Rank());
  absl::StatusOr<std::shared_ptr<nn::LossModel>> model = RankModel(stages, 2);
  ASSERT_TRUE(model.ok()) << model.status();
  const int accumulation = rank == stages - 1 ? 2 : kAccumulation;
  const absl::Status status =
      engine::Initialize(*model,
                         ConfigJson(stages, 0, "interleaved_1f1b", accumulation,
                                    kSgd, /*per_rank=*/2),
                         Comm())
          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find(absl::StrCat("pipeline ranks ", stages - 1,
                                               " built another schedule")),
            std::string::npos)
      << status;
}

// A rank whose model is not the stages the interleaved layout gives it
// fails at Initialize, naming the key or the stage: one stage where
// pipeline.stages_per_rank says 2, and the contiguous placement (rank r
// holding stages 2r and 2r + 1) instead of the looping one (r and r + 2).
TEST(PipelineErrors, InterleavedModelsNotMatchingTheLayoutAreNamed) {
  if (World() < 2) GTEST_SKIP() << "a pipeline needs 2 or more ranks";
  if (InterleavedStageCounts().empty()) GTEST_SKIP() << "no interleaved layout";
  const int stages = InterleavedStageCounts()[0];
  absl::StatusOr<pipeline::PipelineLayout> layout =
      pipeline::PipelineLayout::Create(World(), stages, "pipeline.stages");
  ASSERT_TRUE(layout.ok()) << layout.status();
  const int rank = layout->StageOf(Rank());
  absl::StatusOr<std::vector<pipeline::LayerRange>> ranges =
      pipeline::PartitionLayers(LayerWeights(), 2 * stages, "parameters");
  ASSERT_TRUE(ranges.ok()) << ranges.status();
  const std::string config =
      ConfigJson(stages, 1, "interleaved_1f1b", kAccumulation, kSgd, 2);

  absl::StatusOr<std::unique_ptr<nn::LossModel>> one =
      Build((*ranges)[rank].first, (*ranges)[rank].last);
  ASSERT_TRUE(one.ok()) << one.status();
  const absl::Status single =
      engine::Initialize(std::move(*one), config, Comm()).status();
  EXPECT_EQ(single.code(), absl::StatusCode::kInvalidArgument) << single;
  EXPECT_NE(single.message().find(
                absl::StrCat("pipeline.stages_per_rank 2 but world rank ",
                             Rank(), "'s model holds 1 stage(s)")),
            std::string::npos)
      << single;

  absl::StatusOr<std::shared_ptr<nn::LossModel>> contiguous =
      RankModel(stages, 2, [](int r, int c) { return 2 * r + c; });
  ASSERT_TRUE(contiguous.ok()) << contiguous.status();
  const absl::Status placed =
      engine::Initialize(*contiguous, config, Comm()).status();
  EXPECT_EQ(placed.code(), absl::StatusCode::kInvalidArgument) << placed;
  // Rank 0's second stage should be stage `stages`; any other rank's first
  // should be stage `rank`.
  const std::string named =
      rank == 0 ? absl::StrCat("gives stage ", stages, " (world rank ", Rank(),
                               ", its stage 1)")
                : absl::StrCat("gives stage ", rank, " (world rank ", Rank(),
                               ", its stage 0)");
  EXPECT_NE(placed.message().find(named), std::string::npos) << placed;
}

// The startup line names every stage: its layers, its parameters and its
// rank's model-state memory (each stage's plan, gathered over the pipeline).
TEST(PipelineStartup, TheLineShowsEveryStagesLayersAndMemory) {
  if (World() < 2) GTEST_SKIP() << "a pipeline needs 2 or more ranks";
  const int stages = World();
  absl::StatusOr<std::vector<pipeline::LayerRange>> ranges =
      pipeline::PartitionLayers(LayerWeights(), stages, "parameters");
  ASSERT_TRUE(ranges.ok()) << ranges.status();
  if (Rank() == 0) ::testing::internal::CaptureStderr();
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine =
      PipelinedEngine(stages, 2, "1f1b", kAdamW);
  const std::string log =
      Rank() == 0 ? ::testing::internal::GetCapturedStderr() : "";
  ASSERT_TRUE(engine.ok()) << engine.status();
  if (Rank() != 0) return;
  for (int s = 0; s < stages; ++s) {
    // Each stage's layers, then a parameter count and memory in GiB.
    const std::string stage =
        absl::StrCat("stage ", s, ": layers [", (*ranges)[s].first, ", ",
                     (*ranges)[s].last, "), ");
    const size_t at = log.find(stage);
    ASSERT_NE(at, std::string::npos) << stage << " not in:\n" << log;
    const std::string rest = log.substr(at + stage.size(), 60);
    EXPECT_NE(rest.find(" parameters, "), std::string::npos) << rest;
    EXPECT_NE(rest.find("iB GPU + "), std::string::npos) << rest;
  }
}

// Interleaved: the line says how many stages each rank holds, names every
// stage's layers, parameters and rank (stage s on rank s % ranks), and
// each rank's model-state memory once.
TEST(PipelineStartup, InterleavedLineShowsEveryStagesRank) {
  if (World() < 2) GTEST_SKIP() << "a pipeline needs 2 or more ranks";
  if (InterleavedStageCounts().empty()) GTEST_SKIP() << "no interleaved layout";
  const int stages = InterleavedStageCounts()[0];
  absl::StatusOr<std::vector<pipeline::LayerRange>> ranges =
      pipeline::PartitionLayers(LayerWeights(), 2 * stages, "parameters");
  ASSERT_TRUE(ranges.ok()) << ranges.status();
  if (Rank() == 0) ::testing::internal::CaptureStderr();
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine =
      PipelinedEngine(stages, 2, "interleaved_1f1b", kAdamW, 2);
  const std::string log =
      Rank() == 0 ? ::testing::internal::GetCapturedStderr() : "";
  ASSERT_TRUE(engine.ok()) << engine.status();
  if (Rank() != 0) return;
  EXPECT_NE(log.find("2 stages per rank, schedule interleaved_1f1b"),
            std::string::npos)
      << log;
  for (int s = 0; s < 2 * stages; ++s) {
    const std::string stage =
        absl::StrCat("stage ", s, ": layers [", (*ranges)[s].first, ", ",
                     (*ranges)[s].last, "), ");
    const size_t at = log.find(stage);
    ASSERT_NE(at, std::string::npos) << stage << " not in:\n" << log;
    const std::string rest = log.substr(at + stage.size(), 60);
    EXPECT_NE(rest.find(absl::StrCat(" parameters on rank ", s % stages)),
              std::string::npos)
        << rest;
  }
  for (int r = 0; r < stages; ++r) {
    EXPECT_NE(log.find(absl::StrCat("rank ", r, ": ")), std::string::npos)
        << log;
  }
}

}  // namespace
}  // namespace enginetest
}  // namespace ze

int main(int argc, char **argv) {
  return ze::enginetest::RunAllTests(argc, argv);
}
