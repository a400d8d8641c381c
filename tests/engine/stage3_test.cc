// ZeRO stage 3 through the public engine API, alone and under mpirun (every
// rank runs every case on one communicator):
//   - parity with stage 0 at the same world size (which parity_main ties to
//     the world-size-1 run) for the fetcher's options: persistence threshold
//     0 and large, prefetch on and off, a max_live_parameters small enough to
//     stop prefetching, activation checkpointing, frozen parameters and a
//     53-element parameter (channels 53), in f32 and bf16, accumulation 2;
//   - communication counters: one step all-gathers every parameter twice and
//     reduce-scatters it once (3 Psi elements up to padding);
//   - prescale_gradients with a gradient_predivide_factor of 3 matches the
//     unscaled run at every stage;
//   - communication_data_type: an f32 model reducing in bf16 is rounded
//     (differs from f32, trains the same), a bf16 model reducing in fp32
//     trains as bf16 does, at every stage;
//   - a window whose boundary micro-step has no Backward is reduced before
//     its step at every stage;
//   - a module the backward skips in some micro-steps or whole windows
//     trains as under stage 0 with stages 2 and 3 (no stale gradients);
//   - a module order that changes between steps falls back to on-demand
//     fetching, says so in the log and still matches stage 0;
//   - one rank taking a different module path gets the named
//     schedule-mismatch error on every rank, within seconds;
//   - memory: model state per rank about 16 Psi / N, the host allocator's
//     held and peak bytes during Initialize about the same (never the whole
//     model), and under a byte cap stage 0 fails while stage 3 trains (4
//     ranks).
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/ops.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "nn/layers.h"
#include "tests/engine/engine_test_util.h"

namespace ze {
namespace enginetest {
namespace {

// A stack of f32 linear layers, in -> A -> B -> out, with loss
// 0.5 * mean(y^2). The input is the token ids scaled to [0, 1), (B, T).
// With `swapped`, B runs before A: a different module path with the same
// collective sizes (A and B have the same shapes).
class LinearStack : public nn::LossModel {
 public:
  static constexpr int64_t kWidth = 128;

  LinearStack() : nn::LossModel("LinearStack") {
    nn::LayerOptions options;
    const nn::Initializer init = nn::Initializer::Normal(0.1f);
    in_ = RegisterChild("in", std::make_unique<nn::Linear>(
                                  kSeqLen, kWidth, true, options, init));
    a_ = RegisterChild(
        "a", std::make_unique<nn::Linear>(kWidth, kWidth, true, options, init));
    b_ = RegisterChild(
        "b", std::make_unique<nn::Linear>(kWidth, kWidth, true, options, init));
    out_ = RegisterChild("out", std::make_unique<nn::Linear>(
                                    kWidth, kSeqLen, true, options, init));
  }
  void set_swapped(bool swapped) { swapped_ = swapped; }
  // Forward call i (counted from construction) runs B only when
  // b_used[i] (calls past the end run it).
  void set_b_schedule(std::vector<bool> b_used) {
    b_schedule_ = std::move(b_used);
  }

  absl::StatusOr<float> ForwardLoss(const Tensor& tokens, const Tensor& targets,
                                    const Stream& stream) override {
    ZE_ASSIGN_OR_RETURN(
        Tensor x, Tensor::Empty(tokens.shape(), DType::kF32, Device::Cpu()));
    for (int64_t i = 0; i < tokens.numel(); ++i) {
      x.data_as<float>()[i] = tokens.data_as<const int32_t>()[i] / 37.0f;
    }
    ZE_ASSIGN_OR_RETURN(output_, Forward(x, stream));
    double sum = 0;
    for (int64_t i = 0; i < output_.numel(); ++i) {
      const double y = output_.data_as<const float>()[i];
      sum += 0.5 * y * y;
    }
    counted_ = output_.numel();
    (void)targets;
    return static_cast<float>(sum / output_.numel());
  }
  absl::Status BackwardLoss(float loss_scale, const Stream& stream) override {
    ZE_ASSIGN_OR_RETURN(Tensor grad, Tensor::Empty(output_.shape(), DType::kF32,
                                                   Device::Cpu()));
    for (int64_t i = 0; i < grad.numel(); ++i) {
      grad.data_as<float>()[i] =
          loss_scale * output_.data_as<const float>()[i] / output_.numel();
    }
    output_ = Tensor();
    return Backward(grad, stream).status();
  }
  int64_t counted_targets() const override { return counted_; }
  Device device() const override { return Device::Cpu(); }
  DType dtype() const override { return DType::kF32; }

 protected:
  std::vector<nn::Module*> Order(bool b_used) const {
    if (!b_used) return {in_, a_, out_};
    return swapped_ ? std::vector<nn::Module*>{in_, b_, a_, out_}
                    : std::vector<nn::Module*>{in_, a_, b_, out_};
  }
  absl::StatusOr<Tensor> ForwardImpl(const Tensor& input,
                                     const Stream& stream) override {
    const size_t call = forward_calls_++;
    order_.push_back(Order(call >= b_schedule_.size() || b_schedule_[call]));
    Tensor x = input;
    for (nn::Module* module : order_.back()) {
      ZE_ASSIGN_OR_RETURN(x, module->Forward(x, stream));
    }
    return x;
  }
  absl::StatusOr<Tensor> BackwardImpl(const Tensor& grad_output,
                                      const Stream& stream) override {
    std::vector<nn::Module*> order = order_.back();
    order_.pop_back();
    Tensor grad = grad_output;
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      ZE_ASSIGN_OR_RETURN(grad, (*it)->Backward(grad, stream));
    }
    return grad;
  }

 private:
  nn::Linear *in_, *a_, *b_, *out_;
  bool swapped_ = false;
  std::vector<bool> b_schedule_;
  size_t forward_calls_ = 0;
  std::vector<std::vector<nn::Module*>> order_;
  Tensor output_;
  int64_t counted_ = 0;
};

struct TrainingRun {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> weights;
  double largest_update = 0;  // max |final - initial| master weight
};

// `top_level_keys`: more top-level entries, each followed by a comma.
std::string Config(int stage, const std::string& dtype, int accumulation,
                   const std::string& stage3_keys,
                   const std::string& optimizer = "AdamW",
                   const std::string& top_level_keys = "") {
  const std::string optimizer_json =
      optimizer == "SGD"
          ? R"("optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}},)"
          : R"("optimizer": {"type": "AdamW", "params": {"lr": 0.01, "eps": 1e-3, "weight_decay": 0.01}},)";
  return absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": )",
      accumulation, R"(, "steps_per_print": 1000, "gradient_clipping": 1.0,)",
      top_level_keys, dtype == "bf16" ? R"("bf16": {"enabled": true},)" : "",
      optimizer_json, R"("zero_optimization": {"stage": )", stage, stage3_keys,
      "}}");
}

absl::StatusOr<TrainingRun> Train(
    std::shared_ptr<nn::LossModel> model, const std::string& config, int steps,
    const std::function<void(int)>& before_step = {}) {
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine,
                      engine::Initialize(model, config, Comm()));
  TrainingRun run;
  std::map<std::string, std::vector<float>> initial;
  for (const std::string& name : engine->ParameterNames()) {
    ZE_ASSIGN_OR_RETURN(initial[name], engine->GatherMasterWeights(name));
  }
  for (int step = 0; step < steps; ++step) {
    if (before_step) before_step(step);
    ZE_ASSIGN_OR_RETURN(engine::StepReport report, TrainStep(*engine, step));
    run.losses.push_back(report.loss);
  }
  for (const std::string& name : engine->ParameterNames()) {
    ZE_ASSIGN_OR_RETURN(run.weights[name], engine->GatherMasterWeights(name));
    for (size_t i = 0; i < initial[name].size(); ++i) {
      run.largest_update =
          std::max(run.largest_update,
                   std::abs(static_cast<double>(run.weights[name][i]) -
                            initial[name][i]));
    }
  }
  return run;
}

// Largest relative differences of losses and weights, as parity_main
// measures them.
void ExpectClose(const TrainingRun& run, const TrainingRun& reference,
                 double tolerance) {
  enginetest::ExpectRunsClose(run.losses, run.weights, reference.losses,
                              reference.weights, tolerance);
  // Training happened (the comparison is not between two untouched models).
  EXPECT_GT(run.largest_update, 1e-3);
}

struct Variant {
  std::string name;
  std::string dtype;
  std::string stage3_keys;
  bool checkpointing = false;
  bool frozen = false;
  int64_t channels = 16;
  int heads = 2;
  std::string optimizer = "AdamW";
};

void PrintTo(const Variant& variant, std::ostream* os) {
  *os << variant.dtype << "_" << variant.name;
}

class Stage3ParityTest : public ::testing::TestWithParam<Variant> {};

TEST_P(Stage3ParityTest, MatchesStage0) {
  const Variant& v = GetParam();
  auto make = [&](bool checkpointing) -> std::shared_ptr<nn::LossModel> {
    nn::GptConfig gpt = SmallGpt(v.channels, 2, v.heads);
    gpt.activation_checkpointing = checkpointing;
    absl::StatusOr<std::shared_ptr<nn::GptModel>> model =
        MakeGpt(gpt, v.dtype == "bf16" ? DType::kBF16 : DType::kF32,
                /*materialize=*/false);
    EXPECT_TRUE(model.ok()) << model.status();
    if (v.frozen) {
      for (const char* name : {"blocks.0.ln1.weight", "blocks.1.mlp.fc.bias"}) {
        absl::StatusOr<nn::Parameter*> parameter =
            (*model)->FindParameter(name);
        EXPECT_TRUE(parameter.ok());
        (*parameter)->set_requires_grad(false);
      }
    }
    return *model;
  };
  constexpr int kSteps = 6;
  absl::StatusOr<TrainingRun> reference =
      Train(make(false), Config(0, v.dtype, 2, "", v.optimizer), kSteps);
  ASSERT_TRUE(reference.ok()) << reference.status();
  absl::StatusOr<TrainingRun> run =
      Train(make(v.checkpointing),
            Config(3, v.dtype, 2, v.stage3_keys, v.optimizer), kSteps);
  ASSERT_TRUE(run.ok()) << run.status();
  if (v.frozen) {
    EXPECT_EQ(run->weights.count("blocks.0.ln1.weight"), 0u);
  }
  ExpectClose(*run, *reference, v.dtype == "f32" ? 1e-5 : 1e-2);
}

std::vector<Variant> Variants() {
  const std::string none = R"(, "stage3_param_persistence_threshold": 0)";
  std::vector<Variant> variants;
  for (const char* dtype : {"f32", "bf16"}) {
    variants.push_back({"persist0_prefetch", dtype, none});
    variants.push_back(
        {"persist_all", dtype,
         R"(, "stage3_param_persistence_threshold": 100000000)"});
    variants.push_back(
        {"no_prefetch", dtype, none + R"(, "stage3_prefetch_bucket_size": 0)"});
    variants.push_back(
        {"max_live_small", dtype,
         none +
             R"(, "stage3_max_live_parameters": 3000, "stage3_prefetch_bucket_size": 100000)"});
    variants.push_back({"checkpointing", dtype, none, /*checkpointing=*/true});
    variants.push_back({"frozen_c53", dtype, none, false, /*frozen=*/true,
                        /*channels=*/53, /*heads=*/1});
    variants.push_back({"sgd", dtype, none, false, false, 16, 2, "SGD"});
  }
  return variants;
}

INSTANTIATE_TEST_SUITE_P(Variants, Stage3ParityTest,
                         ::testing::ValuesIn(Variants()),
                         [](const ::testing::TestParamInfo<Variant>& info) {
                           return absl::StrCat(info.param.dtype, "_",
                                               info.param.name);
                         });

// A module the backward does not reach in some micro-steps, or in a whole
// accumulation window: stages 2 and 3 write a bucket's gradient slice with
// its first reduce-scatter of a window instead of zero-filling it after each
// step, and a slice no reduce reached in the window is zero-filled at the
// step. Stale gradients from the window before would show here as weights
// of B (which AdamW still decays) that differ from stage 0's.
TEST(Stage3UnusedModuleTest, SometimesUnusedModuleMatchesStage0) {
  // Per forward call, two per step (accumulation 2): B used in both, in
  // neither (the whole window), only in the second, only in the first.
  const std::vector<bool> schedule = {true, true,  false, false, false, true,
                                      true, false, true,  true,  false, false};
  constexpr int kSteps = 6;
  auto make = [&]() {
    auto model = std::make_shared<LinearStack>();
    model->set_b_schedule(schedule);
    return model;
  };
  absl::StatusOr<TrainingRun> reference =
      Train(make(), Config(0, "f32", 2, ""), kSteps);
  ASSERT_TRUE(reference.ok()) << reference.status();
  const std::string none = R"(, "stage3_param_persistence_threshold": 0)";
  for (int stage : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("stage ", stage, ", rank ", Rank()));
    absl::StatusOr<TrainingRun> run =
        Train(make(), Config(stage, "f32", 2, stage == 3 ? none : ""), kSteps);
    ASSERT_TRUE(run.ok()) << run.status();
    ExpectClose(*run, *reference, 1e-5);
  }
}

// prescale_gradients (DeepSpeed's meaning): every rank divides its
// gradients by gradient_predivide_factor before they are reduced and the
// step multiplies it back, so training follows the plain run up to
// rounding, whatever the stage (stages 2 and 3 scale each micro-step's
// buckets, stages 0 and 1 the accumulated gradients once).
TEST(PrescaleGradientsTest, EveryStageMatchesTheUnscaledRun) {
  auto make = []() -> std::shared_ptr<nn::LossModel> {
    absl::StatusOr<std::shared_ptr<nn::GptModel>> model =
        MakeGpt(SmallGpt(), DType::kF32, /*materialize=*/false);
    EXPECT_TRUE(model.ok()) << model.status();
    return *model;
  };
  constexpr int kSteps = 4;
  absl::StatusOr<TrainingRun> reference =
      Train(make(), Config(0, "f32", 2, ""), kSteps);
  ASSERT_TRUE(reference.ok()) << reference.status();
  const std::string prescale =
      R"("prescale_gradients": true, "gradient_predivide_factor": 3.0,)";
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE(absl::StrCat("stage ", stage, ", rank ", Rank()));
    absl::StatusOr<TrainingRun> run =
        Train(make(), Config(stage, "f32", 2, "", "AdamW", prescale), kSteps);
    ASSERT_TRUE(run.ok()) << run.status();
    ExpectClose(*run, *reference, 1e-5);
  }
}

// Largest relative difference of the final weights, |a - b| / max(1, |b|).
double LargestWeightDifference(const TrainingRun& run,
                               const TrainingRun& reference) {
  double largest = 0;
  for (const auto& [name, values] : reference.weights) {
    const std::vector<float>& other = run.weights.at(name);
    for (size_t i = 0; i < values.size(); ++i) {
      largest =
          std::max(largest, std::abs(double(other[i]) - values[i]) /
                                std::max(1.0, std::abs(double(values[i]))));
    }
  }
  return largest;
}

// communication_data_type: gradients are reduced in that dtype and rounded
// back to the model's once. An f32 model communicating in bf16 has its
// gradients rounded to bf16 at every stage and world size (so it must
// differ from the f32 run, yet train the same model); a bf16 model
// communicating in fp32 trains as the bf16 run does.
TEST(CommunicationDataTypeTest, GradientsAreReducedInTheGivenDType) {
  auto make = [](DType dtype) -> std::shared_ptr<nn::LossModel> {
    absl::StatusOr<std::shared_ptr<nn::GptModel>> model =
        MakeGpt(SmallGpt(), dtype, /*materialize=*/false);
    EXPECT_TRUE(model.ok()) << model.status();
    return *model;
  };
  constexpr int kSteps = 4;
  const std::string none = R"(, "stage3_param_persistence_threshold": 0)";
  absl::StatusOr<TrainingRun> f32 =
      Train(make(DType::kF32), Config(0, "f32", 2, ""), kSteps);
  ASSERT_TRUE(f32.ok()) << f32.status();
  absl::StatusOr<TrainingRun> bf16 =
      Train(make(DType::kBF16), Config(0, "bf16", 2, ""), kSteps);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE(
        absl::StrCat("stage ", stage, ", rank ", Rank(), " of ", World()));
    const std::string keys = stage == 3 ? none : "";
    absl::StatusOr<TrainingRun> rounded =
        Train(make(DType::kF32),
              Config(stage, "f32", 2, keys, "AdamW",
                     R"("communication_data_type": "bf16",)"),
              kSteps);
    ASSERT_TRUE(rounded.ok()) << rounded.status();
    const double difference = LargestWeightDifference(*rounded, *f32);
    EXPECT_GT(difference, 1e-6) << "bf16 communication left no trace";
    EXPECT_LT(difference, 2e-2);
    absl::StatusOr<TrainingRun> wide =
        Train(make(DType::kBF16),
              Config(stage, "bf16", 2, keys, "AdamW",
                     R"("communication_data_type": "fp32",)"),
              kSteps);
    ASSERT_TRUE(wide.ok()) << wide.status();
    ExpectClose(*wide, *bf16, 1e-2);
  }
}

// A window whose boundary micro-step has no Backward (a batch skipped by
// the caller): stages 0 and 1 reduce gradients in the boundary Backward, so
// the step must reduce them itself, or each rank steps with its own. All
// stages must match stage 2, which reduces every micro-step.
TEST(BoundaryWithoutBackwardTest, EveryStageReducesBeforeTheStep) {
  auto train = [](int stage) -> absl::StatusOr<TrainingRun> {
    ZE_ASSIGN_OR_RETURN(
        std::shared_ptr<nn::GptModel> model,
        MakeGpt(SmallGpt(), DType::kF32, /*materialize=*/false));
    const std::string keys =
        stage == 3 ? R"(, "stage3_param_persistence_threshold": 0)" : "";
    ZE_ASSIGN_OR_RETURN(
        std::unique_ptr<engine::Engine> engine,
        engine::Initialize(model, Config(stage, "f32", 2, keys), Comm()));
    TrainingRun run;
    std::vector<int32_t> tokens(2 * kSeqLen), targets(2 * kSeqLen);
    for (int step = 0; step < 4; ++step) {
      // Micro-step 0 trains; micro-step 1 (the boundary) only steps.
      for (int i = 0; i < 2; ++i) {
        FillSample((step * World() + Rank()) * 2 + i, &tokens[i * kSeqLen],
                   &targets[i * kSeqLen]);
      }
      Tensor token_tensor =
          Tensor::Wrap(tokens.data(), {2, kSeqLen}, DType::kI32, Device::Cpu());
      Tensor target_tensor = Tensor::Wrap(targets.data(), {2, kSeqLen},
                                          DType::kI32, Device::Cpu());
      ZE_RETURN_IF_ERROR(engine->Forward(token_tensor, target_tensor).status());
      ZE_RETURN_IF_ERROR(engine->Backward());
      ZE_RETURN_IF_ERROR(engine->Step().status());
      ZE_ASSIGN_OR_RETURN(engine::StepReport report, engine->Step());
      if (!report.boundary) return absl::InternalError("expected a boundary");
      run.losses.push_back(report.loss);
    }
    for (const std::string& name : engine->ParameterNames()) {
      ZE_ASSIGN_OR_RETURN(run.weights[name], engine->GatherMasterWeights(name));
    }
    run.largest_update = 1;  // compared below, not against untouched weights
    return run;
  };
  absl::StatusOr<TrainingRun> reference = train(2);
  ASSERT_TRUE(reference.ok()) << reference.status();
  for (int stage : {0, 1, 3}) {
    SCOPED_TRACE(
        absl::StrCat("stage ", stage, ", rank ", Rank(), " of ", World()));
    absl::StatusOr<TrainingRun> run = train(stage);
    ASSERT_TRUE(run.ok()) << run.status();
    ExpectClose(*run, *reference, 1e-5);
  }
}

// stage3_model_persistence_threshold caps what the per-bucket threshold
// keeps gathered: all four modules persistent (refreshed once a step), two
// or so, or none (each gathered for forward and backward).
TEST(Stage3CountersTest, ModelPersistenceThresholdCapsTheKeptTotal) {
  auto gathers_per_step = [](const std::string& model_threshold) -> int64_t {
    auto model = std::make_shared<LinearStack>();
    absl::StatusOr<std::unique_ptr<engine::Engine>> engine = engine::Initialize(
        model,
        Config(3, "f32", 1,
               absl::StrCat(R"(, "stage3_param_persistence_threshold": )",
                            R"(100000000, "stage3_max_reuse_distance": 0)",
                            model_threshold)),
        Comm());
    EXPECT_TRUE(engine.ok()) << engine.status();
    if (!engine.ok()) return -1;
    for (int step = 0; step < 2; ++step) {
      EXPECT_TRUE(TrainStep(**engine, step).ok());
    }
    return (*engine)->communication_counters().all_gathers;
  };
  const double psi = static_cast<double>(
      std::make_shared<LinearStack>()->NumParameterElements());
  EXPECT_EQ(gathers_per_step(""), 4);
  EXPECT_EQ(gathers_per_step(R"(, "stage3_model_persistence_threshold": 0)"),
            8);
  const int64_t half = gathers_per_step(
      absl::StrCat(R"(, "stage3_model_persistence_threshold": )",
                   static_cast<int64_t>(psi / 2)));
  EXPECT_GT(half, 4);
  EXPECT_LT(half, 8);
}

TEST(Stage3CountersTest, OneStepMovesThreePsi) {
  auto model = std::make_shared<LinearStack>();
  const double psi = static_cast<double>(model->NumParameterElements());
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine = engine::Initialize(
      model,
      // Reuse 0: every request gathers (the default keeps buckets needed
      // again, see stage3_inference_test).
      Config(
          3, "f32", 1,
          R"(, "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0)"),
      Comm());
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(TrainStep(**engine, step).ok());
    const engine::CommunicationCounters counters =
        (*engine)->communication_counters();
    // Four modules: each gathered for forward and for backward, each
    // gradient bucket reduce-scattered once.
    EXPECT_EQ(counters.all_gathers, 8);
    // One rank serves every gather in place (no copy of its own slice).
    EXPECT_EQ(counters.all_gathers_in_place, World() == 1 ? 8 : 0);
    EXPECT_EQ(counters.reduce_scatters, 4);
    EXPECT_EQ(counters.all_gathered_elements,
              2 * counters.reduce_scattered_elements);
    const double total = static_cast<double>(
        counters.all_gathered_elements + counters.reduce_scattered_elements);
    // Padding: under 16 + 128 * N elements per module.
    EXPECT_GE(total, 3 * psi);
    EXPECT_LE(total, 3 * (psi + 4 * (16 + 128 * World())));
    if (Rank() == 0 && step == 2) {
      std::printf(
          "world %d: Psi %.0f, step all-gathered %lld, reduce-scattered "
          "%lld (%.4f x 3 Psi)\n",
          World(), psi, static_cast<long long>(counters.all_gathered_elements),
          static_cast<long long>(counters.reduce_scattered_elements),
          total / (3 * psi));
    }
  }
}

TEST(Stage3CountersTest, TiedTableIsGatheredByEmbeddingAndHead) {
  absl::StatusOr<std::shared_ptr<nn::GptModel>> model =
      MakeGpt(SmallGpt(), DType::kF32, false);
  ASSERT_TRUE(model.ok());
  const double psi = static_cast<double>((*model)->NumParameterElements());
  const double table = static_cast<double>(
      (*model)->config().table_rows() * (*model)->config().channels +
      (*model)->config().max_seq_len * (*model)->config().channels);
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine = engine::Initialize(
      *model,
      Config(
          3, "f32", 1,
          R"(, "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0)"),
      Comm());
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE(TrainStep(**engine, 0).ok());
  const engine::CommunicationCounters counters =
      (*engine)->communication_counters();
  // The embedding's bucket (wte, wpe) is gathered by the embedding and by
  // the head, forward and backward: twice more than the rest.
  const double extra = static_cast<double>(
      counters.all_gathered_elements - 2 * counters.reduce_scattered_elements);
  EXPECT_GE(extra, 2 * table);
  EXPECT_LE(extra, 2 * (table + 16 * 2 + 128 * World()));
  EXPECT_GE(static_cast<double>(counters.reduce_scattered_elements), psi);
}

TEST(Stage3OrderTest, ChangedOrderFallsBackAndMatchesStage0) {
  // Steps 0-2 in one order, then swapped: step 3 must notice, fetch on
  // demand, and record the new order for later steps.
  constexpr int kSteps = 6;
  auto reference_model = std::make_shared<LinearStack>();
  absl::StatusOr<TrainingRun> reference =
      Train(reference_model, Config(0, "f32", 1, ""), kSteps,
            [&](int step) { reference_model->set_swapped(step >= 3); });
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto model = std::make_shared<LinearStack>();
  StderrCapture capture;
  absl::StatusOr<TrainingRun> run =
      Train(model,
            Config(3, "f32", 1, R"(, "stage3_param_persistence_threshold": 0)"),
            kSteps, [&](int step) { model->set_swapped(step >= 3); });
  const std::string log = capture.Finish();
  ASSERT_TRUE(run.ok()) << run.status();
  ExpectClose(*run, *reference, 1e-5);
  if (Rank() == 0) {
    EXPECT_NE(log.find("ZeRO-3: module order changed at request"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("recorded a new module order"), std::string::npos);
  }
}

TEST(Stage3ScheduleTest, DifferentModulePathIsANamedErrorOnEveryRank) {
  if (World() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto model = std::make_shared<LinearStack>();
  model->set_swapped(Rank() == 1);
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine = engine::Initialize(
      model,
      Config(3, "f32", 1, R"(, "stage3_param_persistence_threshold": 0)"),
      Comm());
  ASSERT_TRUE(engine.ok()) << engine.status();
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<engine::StepReport> report = TrainStep(**engine, 0);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kAborted)
      << report.status();
  EXPECT_NE(report.status().message().find("ranks took different module paths"),
            std::string::npos)
      << report.status();
  // This rank's own order is named.
  EXPECT_NE(report.status().message().find(
                Rank() == 1 ? "in (Linear), b (Linear), a (Linear)"
                            : "in (Linear), a (Linear), b (Linear)"),
            std::string::npos)
      << report.status();
  EXPECT_LT(seconds, 5.0);
  std::printf("rank %d: schedule mismatch reported after %.3f s: %s\n", Rank(),
              seconds, std::string(report.status().message()).c_str());
}

// Large enough that padding (under 16 + 128 N elements per module bucket)
// stays well under 5%: Psi = 401,792 at channels 128.
nn::GptConfig MemoryGpt() { return SmallGpt(/*channels=*/128, /*layers=*/2); }

std::string MemoryConfig(int stage) {
  return absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,)",
      R"( "steps_per_print": 1000, "bf16": {"enabled": true},)",
      R"("optimizer": {"type": "AdamW", "params": {"lr": 0.001}},)",
      R"("zero_optimization": {"stage": )", stage,
      R"(, "stage3_param_persistence_threshold": 0}})");
}

TEST(Stage3MemoryTest, PartitionedConstructionHoldsSixteenPsiOverN) {
  absl::StatusOr<std::shared_ptr<nn::GptModel>> made =
      MakeGpt(MemoryGpt(), DType::kBF16, /*materialize=*/false);
  ASSERT_TRUE(made.ok()) << made.status();
  std::shared_ptr<nn::GptModel> model = *made;
  const double psi = static_cast<double>(model->NumParameterElements());
  const double paper = 16 * psi / World();
  Allocator* host = HostMemory();
  host->ResetPeak();
  const AllocatorStats before = host->stats();
  absl::StatusOr<std::unique_ptr<engine::Engine>> created =
      engine::Initialize(model, MemoryConfig(3), Comm());
  ASSERT_TRUE(created.ok()) << created.status();
  const AllocatorStats after = host->stats();
  const engine::MemoryBreakdown& memory = (*created)->memory_breakdown();
  const double total = static_cast<double>(memory.total_bytes());
  EXPECT_DOUBLE_EQ(memory.paper_bytes, paper);
  EXPECT_NEAR(total / paper, 1.0, 0.05) << memory.ToString();
  const double held =
      static_cast<double>(after.bytes_in_use - before.bytes_in_use);
  const double peak =
      static_cast<double>(after.peak_bytes_in_use - before.bytes_in_use);
  // Nothing but this rank's partition was ever allocated: no full
  // parameter, no full model (2 Psi bytes of bf16 would be half of 16 Psi/4).
  EXPECT_NEAR(held / total, 1.0, 0.01);
  EXPECT_NEAR(peak / total, 1.0, 0.01);
  for (nn::Parameter* parameter : model->Parameters()) {
    EXPECT_NE(parameter->state(), nn::ParameterState::kFull)
        << parameter->name();
  }
  std::printf(
      "rank %d world %d: Psi %.0f, stage 3 breakdown %.0f B (%.4f of 16 "
      "Psi/N), "
      "Initialize held %.0f B, peak %.0f B (%.4f of breakdown; the bf16 model "
      "alone is %.0f B)\n",
      Rank(), World(), psi, total, total / paper, held, peak, peak / total,
      2 * psi);
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(TrainStep(**created, step).ok());
  }
  // Between steps only the partition is held: every gathered bucket and
  // gradient buffer has been released.
  const double after_training =
      static_cast<double>(host->stats().bytes_in_use - before.bytes_in_use);
  EXPECT_NEAR(after_training / total, 1.0, 0.01);
}

TEST(Stage3MemoryTest, Stage0DoesNotFitStage3Does) {
  if (World() != 4) GTEST_SKIP() << "needs 4 ranks";
  ExpectOnlyFittingStageTrainsUnderCap(
      3, MemoryGpt(), MemoryConfig,
      [](int64_t need_stage0, int64_t need_stage3) {
        // 16 Psi vs 4 Psi: the cap leaves stage 3 room for gathered buckets,
        // gradient buffers and activations, and stage 0 none.
        EXPECT_GT(need_stage0, 3 * need_stage3);
        return need_stage3 + (need_stage0 - need_stage3) / 2;
      });
}

}  // namespace
}  // namespace enginetest
}  // namespace ze

int main(int argc, char** argv) {
  return ze::enginetest::RunAllTests(argc, argv);
}
