// Engine::Generate for batches, through the public engine API, alone and
// under mpirun (every rank generates for its own prompts: the second prompt
// starts with 5 + rank):
//   - the KV-cached batch gives the tokens of the recompute path, of each
//     prompt generated alone, and of a sliding window (max_context);
//   - sampling: the same seed gives the same tokens, other seeds others;
//     top_k = 1 and a temperature near 0 are greedy;
//   - a stop token ends each row where it appears (under stage 3 rows end
//     at different steps on different ranks, and the ranks agree);
//   - stage 3 (parameters gathered by the hooks) gives stage 0's tokens, and
//     the tokens a stage-0 run at world size 1 produced (kGolden);
//   - bad arguments are InvalidArgument naming the argument and the prompt.
// The weights are loaded from a file (the same values on every rank and
// stage, no training), so stage 0 at any world size computes exactly what
// it computes at world size 1.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/safetensors/writer.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "nn/init.h"
#include "tests/engine/engine_test_util.h"

namespace ze {
namespace enginetest {
namespace {

using Batch = std::vector<std::vector<int32_t>>;

nn::GptConfig Model() {
  nn::GptConfig config = SmallGpt(/*channels=*/32, /*layers=*/2, /*heads=*/2);
  config.max_seq_len = 24;
  return config;
}

// This rank's copy of the test's weights: the model's shapes and names with
// normal(0.3) values (LayerNorm gains 1), from nn/init.h's generator. An
// untrained GPT at GPT-2's 0.02 mostly repeats the last token; these
// weights make greedy sequences that depend on the whole prefix.
std::string WeightsPath() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/generate_weights_rank",
                      Rank(), ".safetensors");
}

absl::Status WriteWeights() {
  static bool written = false;
  if (written) return absl::OkStatus();
  ZE_ASSIGN_OR_RETURN(std::shared_ptr<nn::GptModel> model,
                      MakeGpt(Model(), DType::kF32, /*materialize=*/false));
  std::vector<safetensors::TensorSpec> specs;
  for (nn::Parameter* parameter : model->Parameters()) {
    specs.push_back({parameter->name(), safetensors::ElementType::kF32,
                     parameter->shape()});
  }
  ZE_ASSIGN_OR_RETURN(auto writer,
                      safetensors::Writer::Create(WeightsPath(), specs));
  for (nn::Parameter* parameter : model->Parameters()) {
    const std::string& name = parameter->name();
    const bool gain = name.size() > 6 &&
                      name.compare(name.size() - 6, 6, "weight") == 0 &&
                      name.find("ln") != std::string::npos;
    std::vector<float> values(parameter->numel());
    nn::GenerateInitialValues(
        gain ? nn::Initializer::Ones() : nn::Initializer::Normal(0.3f),
        /*seed=*/77, name, 0, parameter->numel(), values.data());
    ZE_RETURN_IF_ERROR(
        writer->Append(name, Tensor::Wrap(values.data(), {parameter->numel()},
                                          DType::kF32, Device::Cpu())));
  }
  ZE_RETURN_IF_ERROR(writer->Finish());
  written = true;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<engine::Engine>> MakeEngine(int stage) {
  ZE_RETURN_IF_ERROR(WriteWeights());
  ZE_ASSIGN_OR_RETURN(std::shared_ptr<nn::GptModel> model,
                      MakeGpt(Model(), DType::kF32, /*materialize=*/false));
  ZE_ASSIGN_OR_RETURN(
      std::unique_ptr<engine::Engine> engine,
      engine::Initialize(
          model,
          absl::StrCat(
              R"({"train_micro_batch_size_per_gpu": 1, "steps_per_print": 1000,)",
              R"("optimizer": {"type": "AdamW", "params": {"lr": 0.01}},)",
              R"("zero_optimization": {"stage": )", stage,
              stage == 3 ? R"(, "stage3_param_persistence_threshold": 0)" : "",
              "}}"),
          Comm()));
  // Stage 3 reads only this rank's ranges: a collective.
  ZE_RETURN_IF_ERROR(engine->LoadWeights(WeightsPath()).status());
  return engine;
}

// Lengths 3, 5, 1, 3: three prefill groups, one of two rows.
Batch Prompts(int rank) {
  return {{3, 18, 19}, {5 + rank, 1, 2, 30, 11}, {7}, {20, 21, 22}};
}

constexpr int kNewTokens = 14;

engine::GenerateOptions Greedy(bool cache = true) {
  engine::GenerateOptions options;
  options.vocab_size = kVocab;
  options.use_cache = cache;
  return options;
}

engine::GenerateOptions Sampled(uint64_t seed, float temperature = 1.0f,
                                int top_k = 0) {
  engine::GenerateOptions options = Greedy();
  options.temperature = temperature;
  options.top_k = top_k;
  options.seed = seed;
  return options;
}

std::string Print(const Batch& batch) {
  std::vector<std::string> rows;
  for (const std::vector<int32_t>& row : batch) {
    rows.push_back(absl::StrCat("{", absl::StrJoin(row, ", "), "}"));
  }
  return absl::StrCat("{", absl::StrJoin(rows, ", "), "}");
}

Batch Gen(engine::Engine& engine, const Batch& prompts,
          const engine::GenerateOptions& options, int new_tokens = kNewTokens) {
  absl::StatusOr<Batch> generated =
      engine.Generate(prompts, new_tokens, options);
  EXPECT_TRUE(generated.ok()) << generated.status();
  return generated.ok() ? *generated : Batch();
}

// What stage 0 generates at world size 1, greedily, for Prompts(0) and
// Prompts(1) (rank 1's prompts).
const Batch kGolden[2] = {
    {{24, 24, 24, 6, 3, 24, 24, 24, 10, 3, 6, 6, 36, 30},
     {36, 3, 24, 24, 3, 6, 6, 24, 24, 24, 24, 24, 24, 3},
     {24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 18, 13, 24, 24},
     {24, 24, 24, 24, 24, 24, 24, 24, 10, 10, 10, 10, 24, 24}},
    {{24, 24, 24, 6, 3, 24, 24, 24, 10, 3, 6, 6, 36, 30},
     {24, 36, 24, 24, 3, 24, 24, 24, 24, 24, 36, 24, 24, 3},
     {24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 18, 13, 24, 24},
     {24, 24, 24, 24, 24, 24, 24, 24, 10, 10, 10, 10, 24, 24}}};

TEST(GenerateTest, CachedBatchEqualsRecomputeAndSinglePrompts) {
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine = MakeEngine(0);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const Batch prompts = Prompts(Rank());
  const Batch cached = Gen(**engine, prompts, Greedy(true));
  const Batch recomputed = Gen(**engine, prompts, Greedy(false));
  std::printf("rank %d greedy: %s\n", Rank(), Print(cached).c_str());
  ASSERT_EQ(cached.size(), prompts.size());
  for (const std::vector<int32_t>& row : cached) {
    EXPECT_EQ(row.size(), static_cast<size_t>(kNewTokens));
  }
  EXPECT_EQ(cached, recomputed);
  // Each prompt alone, the old single-sequence path (no cache).
  for (size_t i = 0; i < prompts.size(); ++i) {
    absl::StatusOr<std::vector<int32_t>> alone =
        (*engine)->Generate(prompts[i], kNewTokens, Greedy(false));
    ASSERT_TRUE(alone.ok()) << alone.status();
    EXPECT_EQ(*alone, cached[i]) << "prompt " << i;
  }
  // A window of 10: every row slides during generation; the cache serves
  // the first steps, the recompute the rest.
  engine::GenerateOptions windowed = Greedy(true);
  windowed.max_context = 10;
  const Batch slid = Gen(**engine, prompts, windowed);
  windowed.use_cache = false;
  EXPECT_EQ(slid, Gen(**engine, prompts, windowed));
  // The world-size-1 stage-0 tokens.
  if (!kGolden[0].empty()) EXPECT_EQ(cached, kGolden[Rank() % 2]);
  if (World() == 1) {
    // Rank 1's prompts too, for kGolden[1].
    const Batch other = Gen(**engine, Prompts(1), Greedy());
    std::printf("world 1, rank 1's prompts: %s\n", Print(other).c_str());
    if (!kGolden[1].empty()) EXPECT_EQ(other, kGolden[1]);
  }
  // No new tokens: empty rows.
  EXPECT_EQ(Gen(**engine, prompts, Greedy(), 0), Batch(prompts.size()));
}

TEST(GenerateTest, SamplingIsReproducibleAndBoundedByGreedy) {
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine = MakeEngine(0);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const Batch prompts = Prompts(Rank());
  const Batch greedy = Gen(**engine, prompts, Greedy());
  const Batch first = Gen(**engine, prompts, Sampled(5));
  std::printf("rank %d seed 5: %s\n", Rank(), Print(first).c_str());
  EXPECT_EQ(first, Gen(**engine, prompts, Sampled(5)));
  EXPECT_NE(first, Gen(**engine, prompts, Sampled(6)));
  EXPECT_NE(first, greedy);
  // The draws do not depend on the cache (logits equal up to rounding).
  engine::GenerateOptions uncached = Sampled(5);
  uncached.use_cache = false;
  EXPECT_EQ(first, Gen(**engine, prompts, uncached));
  EXPECT_EQ(greedy, Gen(**engine, prompts, Sampled(9, 1.0f, /*top_k=*/1)));
  EXPECT_EQ(greedy, Gen(**engine, prompts, Sampled(9, 1e-6f)));
  // top_k = 2 is reproducible too.
  EXPECT_EQ(Gen(**engine, prompts, Sampled(3, 0.8f, 2)),
            Gen(**engine, prompts, Sampled(3, 0.8f, 2)));
}

// Rows end at their first stop token (included); the others run on.
void ExpectStopped(const Batch& stopped, const Batch& full, int32_t stop) {
  ASSERT_EQ(stopped.size(), full.size());
  for (size_t i = 0; i < full.size(); ++i) {
    const auto at = std::find(full[i].begin(), full[i].end(), stop);
    const std::vector<int32_t> expected(full[i].begin(),
                                        at == full[i].end() ? at : at + 1);
    EXPECT_EQ(stopped[i], expected) << "row " << i << " stop " << stop;
  }
}

TEST(GenerateTest, StopTokenEndsEachRow) {
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine = MakeEngine(0);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const Batch prompts = Prompts(Rank());
  const Batch full = Gen(**engine, prompts, Sampled(21));
  // The token row 0 draws at step 3: row 0 ends there, others wherever.
  const int32_t stop = full[0][3];
  for (bool cache : {true, false}) {
    engine::GenerateOptions options = Sampled(21);
    options.use_cache = cache;
    options.stop_token = stop;
    ExpectStopped(Gen(**engine, prompts, options), full, stop);
  }
}

TEST(GenerateTest, Stage3MatchesStage0) {
  const Batch prompts = Prompts(Rank());
  Batch greedy0, sampled0, stopped0;
  int32_t stop = 0;
  {
    absl::StatusOr<std::unique_ptr<engine::Engine>> engine = MakeEngine(0);
    ASSERT_TRUE(engine.ok()) << engine.status();
    greedy0 = Gen(**engine, prompts, Greedy());
    sampled0 = Gen(**engine, prompts, Sampled(13, 0.9f, 10));
    // Rank-dependent: rows end at different steps on different ranks.
    stop = sampled0[Rank() % 4][2 + Rank()];
    engine::GenerateOptions options = Sampled(13, 0.9f, 10);
    options.stop_token = stop;
    stopped0 = Gen(**engine, prompts, options);
  }
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine = MakeEngine(3);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ(Gen(**engine, prompts, Greedy()), greedy0);
  EXPECT_EQ(Gen(**engine, prompts, Greedy(false)), greedy0);
  if (!kGolden[0].empty()) EXPECT_EQ(greedy0, kGolden[Rank() % 2]);
  EXPECT_EQ(Gen(**engine, prompts, Sampled(13, 0.9f, 10)), sampled0);
  engine::GenerateOptions options = Sampled(13, 0.9f, 10);
  options.stop_token = stop;
  const Batch stopped = Gen(**engine, prompts, options);
  EXPECT_EQ(stopped, stopped0);
  ExpectStopped(stopped, sampled0, stop);
  // Training state untouched: nothing is left gathered or pending.
  EXPECT_EQ((*engine)->model().PendingBackwardCalls(), 0);
}

void ExpectInvalid(const absl::StatusOr<Batch>& result,
                   const std::string& fragment) {
  ASSERT_FALSE(result.ok()) << fragment;
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument)
      << result.status();
  EXPECT_NE(result.status().message().find(fragment), std::string::npos)
      << "'" << fragment << "' not in: " << result.status().message();
}

TEST(GenerateTest, BadArgumentsAreNamed) {
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine = MakeEngine(3);
  ASSERT_TRUE(engine.ok()) << engine.status();
  engine::Engine& e = **engine;
  const Batch prompts = Prompts(Rank());
  ExpectInvalid(e.Generate(prompts, 4, Sampled(1, -0.5f)),
                "options.temperature = -0.5");
  ExpectInvalid(e.Generate(prompts, 4, Sampled(1, 1.0f, -1)),
                "options.top_k = -1");
  ExpectInvalid(e.Generate({{1, 2}, {3}, {}}, 4, Greedy()),
                "prompts[2] is empty");
  ExpectInvalid(e.Generate(Batch(), 4, Greedy()), "prompts is empty");
  ExpectInvalid(e.Generate({{1}, {-4, 2}}, 4, Greedy()), "prompts[1][0] = -4");
  ExpectInvalid(e.Generate(Batch{{1, kVocab}}, 4, Greedy()),
                "prompts[0][1] = 37 is not a token id in [0, "
                "options.vocab_size = 37)");
  ExpectInvalid(e.Generate(prompts, -1, Greedy()), "max_new_tokens = -1");
  engine::GenerateOptions negative = Greedy();
  negative.max_context = -2;
  ExpectInvalid(e.Generate(prompts, 4, negative), "options.max_context = -2");
  absl::StatusOr<std::vector<int32_t>> single =
      e.Generate(std::vector<int32_t>(), 4, Greedy());
  ASSERT_FALSE(single.ok());
  EXPECT_NE(single.status().message().find("prompts[0] is empty"),
            std::string::npos);
  // The engine is unaffected: a good call still works (a collective).
  EXPECT_EQ(Gen(e, prompts, Greedy(), 2).size(), prompts.size());
}

}  // namespace
}  // namespace enginetest
}  // namespace ze

int main(int argc, char** argv) {
  return ze::enginetest::RunAllTests(argc, argv);
}
