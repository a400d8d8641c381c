// DecoderModel trained through the engine against transformers, alone and
// under mpirun (2 and 3 ranks): each fixture of nn/pretrained/testdata
// (Llama, Mistral, Qwen2, sharded Qwen2, Qwen3; written by transformers with
// reference.json) is built without storage, loaded with LoadWeights from
// the Hugging Face directory (stage 3: each rank reads its ranges), and
// trained 20 AdamW steps (the fixture's settings: lr 1e-3, betas 0.9/0.95,
// eps 1e-8, weight decay 0.1 on every parameter, no clipping) at stages 0-3
// and with the optimizer offloaded to the CPU. Every rank trains on the
// fixture's whole batch, so the mean over ranks is transformers' gradient at
// any world size. Each step's loss must equal transformers' within 1e-5
// relative (plus f32's 1e-7 floor, as nn/pretrained:decoder_parity_test),
// and the eval loss (EvalForward) before training too; then greedy Generate
// through the KV cache must give generate()'s tokens (stage 3: a
// collective).
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "nn/decoder.h"
#include "nn/pretrained/hf_decoder_source.h"
#include "tests/engine/engine_test_util.h"

namespace ze {
namespace enginetest {
namespace {

using Json = nlohmann::json;

std::string FixtureDir(const std::string &name) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"),
                      "/zero_engine/nn/pretrained/testdata/", name);
}

Json ReadReference(const std::string &directory) {
  std::ifstream file(directory + "/reference.json");
  std::stringstream text;
  text << file.rdbuf();
  return Json::parse(text.str());
}

// A (B, T) i32 host tensor from a list of lists; `storage` keeps the ids.
Tensor Ids(const Json &rows, std::vector<int32_t> &storage) {
  const int64_t batch = rows.size(), seq = rows[0].size();
  storage.clear();
  for (const Json &row : rows) {
    for (const Json &id : row) storage.push_back(id.get<int32_t>());
  }
  return Tensor::Wrap(storage.data(), {batch, seq}, DType::kI32, Device::Cpu());
}

std::string Config(int stage, bool offload, const Json &train) {
  return absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,)",
      R"( "steps_per_print": 1000, "optimizer": {"type": "AdamW", "params": {"lr": )",
      train["lr"].dump(), R"(, "betas": )", train["betas"].dump(),
      R"(, "eps": )", train["eps"].dump(), R"(, "weight_decay": )",
      train["weight_decay"].dump(), R"(}}, "zero_optimization": {"stage": )",
      stage, offload ? R"(, "offload_optimizer": {"device": "cpu"})" : "",
      "}}");
}

void ExpectRelative(double actual, double expected, const std::string &what) {
  EXPECT_LE(std::abs(actual - expected), 1e-5 * std::abs(expected) + 1e-7)
      << what << ": " << actual << " vs transformers' " << expected << " (rank "
      << Rank() << ")";
}

struct Case {
  int stage;
  bool offload;
};

class DecoderEngineParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DecoderEngineParityTest, TrainsAndGeneratesAsTransformers) {
  const std::string directory = FixtureDir(GetParam());
  const Json reference = ReadReference(directory);
  const Json &train = reference["train"];
  for (const Case &c : {Case{0, false}, Case{1, false}, Case{2, false},
                        Case{3, false}, Case{2, true}, Case{3, true}}) {
    SCOPED_TRACE(absl::StrCat("stage ", c.stage, c.offload ? " offload" : "",
                              ", rank ", Rank(), " of ", World()));
    absl::StatusOr<std::unique_ptr<nn::HuggingFaceDecoderSource>> source =
        nn::HuggingFaceDecoderSource::Open(directory);
    ASSERT_TRUE(source.ok()) << source.status();
    nn::DecoderOptions options;
    options.materialize = false;  // the engine makes the (partitioned) storage
    absl::StatusOr<std::unique_ptr<nn::DecoderModel>> model =
        nn::DecoderModel::Create((*source)->config(), options);
    ASSERT_TRUE(model.ok()) << model.status();
    absl::StatusOr<std::unique_ptr<engine::Engine>> engine =
        engine::Initialize(std::shared_ptr<nn::LossModel>(std::move(*model)),
                           Config(c.stage, c.offload, train), Comm());
    ASSERT_TRUE(engine.ok()) << engine.status();
    ASSERT_TRUE((*engine)->LoadWeights(**source).ok());

    std::vector<int32_t> eval_tokens, eval_targets;
    const absl::StatusOr<float> eval_loss =
        (*engine)->EvalForward(Ids(reference["eval"]["tokens"], eval_tokens),
                               Ids(reference["eval"]["targets"], eval_targets));
    ASSERT_TRUE(eval_loss.ok()) << eval_loss.status();
    ExpectRelative(*eval_loss, reference["eval"]["loss"].get<double>(),
                   "eval loss");

    std::vector<int32_t> tokens_storage, targets_storage;
    const Tensor tokens = Ids(train["tokens"], tokens_storage);
    const Tensor targets = Ids(train["targets"], targets_storage);
    for (size_t step = 0; step < train["losses"].size(); ++step) {
      const absl::StatusOr<engine::StepReport> report =
          (*engine)->TrainBatch({{tokens, targets}});
      ASSERT_TRUE(report.ok()) << report.status();
      ExpectRelative(report->loss, train["losses"][step].get<double>(),
                     absl::StrCat("loss of step ", step + 1));
    }
    const absl::StatusOr<float> after = (*engine)->EvalForward(tokens, targets);
    ASSERT_TRUE(after.ok()) << after.status();
    ExpectRelative(*after, train["loss_after"].get<double>(),
                   "loss after the last step");

    // Generation on the weights as loaded (a fresh load: training moved
    // them).
    ASSERT_TRUE((*engine)->LoadWeights(**source).ok());
    const Json &generate = reference["generate"];
    for (const Json &prompt : generate["prompts"]) {
      const absl::StatusOr<std::vector<int32_t>> produced =
          (*engine)->Generate(prompt["prompt"].get<std::vector<int32_t>>(),
                              generate["max_new_tokens"].get<int>());
      ASSERT_TRUE(produced.ok()) << produced.status();
      EXPECT_EQ(*produced, prompt["tokens"].get<std::vector<int32_t>>())
          << "prompt " << prompt["prompt"].dump();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, DecoderEngineParityTest,
                         ::testing::Values("llama", "mistral", "qwen2",
                                           "qwen2_sharded", "qwen3"));

}  // namespace
}  // namespace enginetest
}  // namespace ze

int main(int argc, char **argv) {
  return ze::enginetest::RunAllTests(argc, argv);
}
