// Parity with transformers (issue 25): every tiny model transformers wrote
// into nn/pretrained/testdata (Llama with llama3 RoPE scaling, Mistral,
// Qwen2 with q/k/v biases, a sharded Qwen2, Qwen3 with q/k norms; GQA in
// all), loaded through the public API (Engine::LoadWeights from the model
// directory itself, HuggingFaceDecoderSource: no converted copy, stage 3
// reading only this rank's ranges) at ZeRO stages 0-3, with the optimizer
// offloaded to the CPU at stages 1-3 and the parameters too at stage 3, at
// this program's world size (alone, and under mpirun at 2 and 3 ranks):
//   - the eval loss equals transformers' (f32) within kTolerance, relative;
//   - greedy generation of 24 tokens from 3 prompts of different lengths
//     (batched, through the KV cache) equals transformers' generate, token
//     for token;
//   - 20 AdamW steps on the fixture's batch (rank r trains its share of the
//     rows, the engine averages over ranks) give transformers' 20 losses
//     within kTolerance, relative.
// reference.json holds transformers' figures (write_hf_decoder_fixtures.py).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "nn/decoder.h"
#include "nn/pretrained/hf_decoder_source.h"
#include "tests/engine/engine_test_util.h"

namespace ze {
namespace {

using enginetest::Comm;
using enginetest::Rank;
using enginetest::World;

// transformers and this engine both compute in f32 on the CPU, with sums in
// different orders (and, at several ranks, gradients summed over ranks).
constexpr double kTolerance = 1e-5;

std::string FixtureDir(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"),
                      "/zero_engine/nn/pretrained/testdata/", name);
}

nlohmann::json ReadReference(const std::string& name) {
  std::ifstream in(FixtureDir(name) + "/reference.json");
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

// rows [begin, begin + count) of a (B, T) list of lists, as a (count, T) i32
// tensor that owns its storage.
Tensor Rows(const nlohmann::json& table, int64_t begin, int64_t count) {
  const int64_t length = static_cast<int64_t>(table[0].size());
  Tensor tensor =
      Tensor::Empty({count, length}, DType::kI32, Device::Cpu()).value();
  int32_t* data = tensor.data_as<int32_t>();
  for (int64_t r = 0; r < count; ++r) {
    for (int64_t t = 0; t < length; ++t) {
      data[r * length + t] = table[begin + r][t].get<int32_t>();
    }
  }
  return tensor;
}

struct Setting {
  int stage;
  bool offload_optimizer;
  bool offload_param;
  std::string Name() const {
    return absl::StrCat("stage ", stage,
                        offload_optimizer ? " + offload_optimizer cpu" : "",
                        offload_param ? " + offload_param cpu" : "");
  }
};

std::string ConfigJson(const Setting& setting, const nlohmann::json& train,
                       int64_t batch) {
  nlohmann::json zero = {{"stage", setting.stage}};
  if (setting.offload_optimizer) {
    zero["offload_optimizer"] = {{"device", "cpu"}};
  }
  if (setting.offload_param) zero["offload_param"] = {{"device", "cpu"}};
  // Small buckets, so stage 3 gathers and reduces in several pieces.
  zero["reduce_bucket_size"] = 4096;
  zero["stage3_prefetch_bucket_size"] = 4096;
  zero["stage3_param_persistence_threshold"] = 0;
  const nlohmann::json config = {
      {"train_batch_size", batch},
      {"train_micro_batch_size_per_gpu", batch / World()},
      {"gradient_accumulation_steps", 1},
      {"gradient_clipping", 0.0},
      {"optimizer",
       {{"type", "AdamW"},
        {"params",
         {{"lr", train["lr"]},
          {"betas", train["betas"]},
          {"eps", train["eps"]},
          {"weight_decay", train["weight_decay"]}}}}},
      {"zero_optimization", zero},
  };
  return config.dump();
}

class HfDecoderParityTest : public testing::TestWithParam<const char*> {};

TEST_P(HfDecoderParityTest, EveryStageAndOffloadMatchesTransformers) {
  const std::string fixture = GetParam();
  const nlohmann::json reference = ReadReference(fixture);
  const nlohmann::json& train = reference["train"];
  const int64_t batch = static_cast<int64_t>(train["tokens"].size());
  ASSERT_EQ(batch % World(), 0)
      << fixture << "'s training batch of " << batch
      << " rows does not split over " << World() << " ranks";
  const int64_t rows = batch / World();

  const std::vector<Setting> settings = {{0, false, false}, {1, false, false},
                                         {2, false, false}, {3, false, false},
                                         {1, true, false},  {2, true, false},
                                         {3, true, false},  {3, true, true}};
  for (const Setting& setting : settings) {
    SCOPED_TRACE(
        absl::StrCat(fixture, ", ", setting.Name(), ", ", World(), " ranks"));
    absl::StatusOr<std::unique_ptr<nn::HuggingFaceDecoderSource>> source =
        nn::HuggingFaceDecoderSource::Open(FixtureDir(fixture));
    ASSERT_TRUE(source.ok()) << source.status();
    nn::DecoderOptions options;
    options.device = Device::Cpu();
    options.dtype = DType::kF32;
    options.materialize = false;  // the engine creates the storage
    absl::StatusOr<std::unique_ptr<nn::DecoderModel>> built =
        nn::DecoderModel::Create((*source)->config(), options);
    ASSERT_TRUE(built.ok()) << built.status();
    std::shared_ptr<nn::DecoderModel> model(std::move(*built));
    absl::StatusOr<std::unique_ptr<engine::Engine>> engine =
        engine::Initialize(model, ConfigJson(setting, train, batch), Comm());
    ASSERT_TRUE(engine.ok()) << engine.status();
    absl::StatusOr<engine::LoadReport> loaded =
        (*engine)->LoadWeights(**source);
    ASSERT_TRUE(loaded.ok()) << loaded.status();

    // The eval loss (every rank the same rows).
    const nlohmann::json& eval = reference["eval"];
    const int64_t eval_rows = static_cast<int64_t>(eval["tokens"].size());
    absl::StatusOr<float> eval_loss =
        (*engine)->EvalForward(Rows(eval["tokens"], 0, eval_rows),
                               Rows(eval["targets"], 0, eval_rows));
    ASSERT_TRUE(eval_loss.ok()) << eval_loss.status();
    const double want_eval = eval["loss"].get<double>();
    EXPECT_LE(std::abs(*eval_loss - want_eval) / std::abs(want_eval),
              kTolerance)
        << "eval loss " << *eval_loss << ", transformers " << want_eval;

    // Greedy generation, all prompts in one batch through the KV cache.
    std::vector<std::vector<int32_t>> prompts;
    for (const nlohmann::json& prompt : reference["generate"]["prompts"]) {
      prompts.push_back(prompt["prompt"].get<std::vector<int32_t>>());
    }
    const int new_tokens = reference["generate"]["max_new_tokens"].get<int>();
    absl::StatusOr<std::vector<std::vector<int32_t>>> generated =
        (*engine)->Generate(prompts, new_tokens);
    ASSERT_TRUE(generated.ok()) << generated.status();
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ((*generated)[i], reference["generate"]["prompts"][i]["tokens"]
                                     .get<std::vector<int32_t>>())
          << "prompt " << i << " (" << prompts[i].size() << " tokens)";
    }

    // 20 AdamW steps; rank r trains rows [r * rows, (r + 1) * rows).
    const std::vector<double> want = train["losses"].get<std::vector<double>>();
    double worst = 0;
    for (size_t step = 0; step < want.size(); ++step) {
      absl::StatusOr<engine::StepReport> report = (*engine)->TrainBatch(
          {{Rows(train["tokens"], Rank() * rows, rows),
            Rows(train["targets"], Rank() * rows, rows)}});
      ASSERT_TRUE(report.ok()) << report.status();
      const double difference =
          std::abs(report->loss - want[step]) / std::abs(want[step]);
      worst = std::max(worst, difference);
      EXPECT_LE(difference, kTolerance)
          << "step " << step << ": loss " << report->loss << ", transformers "
          << want[step];
    }
    if (Rank() == 0) {
      std::printf(
          "%s, %s, %d ranks: eval loss %.7f (transformers %.7f), "
          "20 steps' losses within %.2e of transformers'\n",
          fixture.c_str(), setting.Name().c_str(), World(), *eval_loss,
          want_eval, worst);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfDecoderParityTest,
                         testing::Values("llama", "mistral", "qwen2",
                                         "qwen2_sharded", "qwen3"));

}  // namespace
}  // namespace ze

int main(int argc, char** argv) {
  return ze::enginetest::RunAllTests(argc, argv);
}
