// The GPT model on the CPU in f32: whole-model gradient check (tied
// embedding included), checkpointing on/off, ignored targets, shapes-only
// construction, presets and parameter counts, and overfitting one batch.
#include "nn/gpt.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "core/ops.h"
#include "gtest/gtest.h"
#include "nn/test_util.h"

namespace ze {
namespace nn {
namespace {

using testing::RandomIds;

GptConfig TinyConfig() {
  GptConfig config;
  config.num_layers = 2;
  config.num_heads = 2;
  config.channels = 16;
  config.vocab_size = 37;
  config.max_seq_len = 8;
  return config;
}

std::unique_ptr<GptModel> MakeModel(const GptConfig &config,
                                    uint64_t seed = 42) {
  GptOptions options;
  options.seed = seed;
  return GptModel::Create(config, options).value();
}

// Targets are the next token of a random sequence.
struct Batch {
  Tensor tokens;   // (B, T) i32
  Tensor targets;  // (B, T) i32
};
Batch MakeBatch(int64_t batch, int64_t seq, int32_t vocab, uint64_t seed) {
  const Tensor stream = RandomIds({batch, seq + 1}, seed, vocab);
  Batch result{RandomIds({batch, seq}, 0, vocab),
               RandomIds({batch, seq}, 0, vocab)};
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      result.tokens.data_as<int32_t>()[b * seq + t] =
          stream.data_as<int32_t>()[b * (seq + 1) + t];
      result.targets.data_as<int32_t>()[b * seq + t] =
          stream.data_as<int32_t>()[b * (seq + 1) + t + 1];
    }
  }
  return result;
}

TEST(GptTest, ParameterNamesAndTiedHead) {
  auto model = MakeModel(TinyConfig());
  std::vector<std::string> names;
  for (Parameter *parameter : model->Parameters()) {
    names.push_back(parameter->name());
  }
  ASSERT_EQ(names.size(), 2u + 2 * 12 + 2);
  EXPECT_EQ(names[0], "embed.wte");
  EXPECT_EQ(names[1], "embed.wpe");
  EXPECT_EQ(names[2], "blocks.0.ln1.weight");
  EXPECT_EQ(names[4], "blocks.0.attn.qkv.weight");
  EXPECT_EQ(names[14], "blocks.1.ln1.weight");
  EXPECT_EQ(names.back(), "ln_f.bias");
  // The head reads the token table; it is listed once overall.
  ASSERT_EQ(model->lm_head()->DirectParameters().size(), 1u);
  EXPECT_EQ(model->lm_head()->DirectParameters()[0],
            model->embed()->token_table());
  EXPECT_EQ(model->NumParameterElements(), TinyConfig().NumParameters());
}

// Whole-model central differences on the mean loss, 8 sampled elements of
// every parameter. Step 1e-2; pass when |analytic - numeric| <= 1e-4 +
// 3e-2 * max(|analytic|, |numeric|). The tied table embed.wte is checked
// like any other: its gradient must hold both the embedding's and the
// head's contribution to match.
TEST(GptTest, WholeModelGradientsMatchFiniteDifferences) {
  GptConfig config = TinyConfig();
  auto model = MakeModel(config);
  const Batch batch = MakeBatch(2, 8, 37, 1);
  const Stream stream;
  testing::GradCheckOptions options;
  options.absolute_tol = 1e-4f;
  options.relative_tol = 3e-2f;
  options.samples_per_tensor = 8;
  const std::vector<std::string> failures = testing::CheckGradientsOfLoss(
      model->Parameters(),
      [&]() {
        NoSaveScope no_save;
        return static_cast<double>(
            model->ForwardLoss(batch.tokens, batch.targets, stream).value());
      },
      [&]() {
        ASSERT_TRUE(
            model->ForwardLoss(batch.tokens, batch.targets, stream).ok());
        ASSERT_TRUE(model->BackwardLoss(1.0f, stream).ok());
      },
      options);
  EXPECT_TRUE(failures.empty()) << absl::StrJoin(failures, "\n");
  for (Module *module : model->Modules()) {
    EXPECT_EQ(module->PendingBackwardCalls(), 0) << module->DisplayName();
  }
}

// Runs one forward/backward and returns every parameter's gradient.
std::vector<std::vector<float>> Gradients(GptModel &model, const Batch &batch,
                                          float *loss) {
  const Stream stream;
  *loss = model.ForwardLoss(batch.tokens, batch.targets, stream).value();
  EXPECT_TRUE(model.BackwardLoss(1.0f, stream).ok());
  std::vector<std::vector<float>> grads;
  for (Parameter *parameter : model.Parameters()) {
    grads.push_back(testing::Values(parameter->grad()));
  }
  return grads;
}

TEST(GptTest, ActivationCheckpointingGivesBitIdenticalGradients) {
  const Batch batch = MakeBatch(2, 8, 37, 3);
  GptConfig config = TinyConfig();
  auto plain = MakeModel(config);
  config.activation_checkpointing = true;
  auto checkpointed = MakeModel(config);
  float plain_loss = 0, checkpointed_loss = 0;
  const auto plain_grads = Gradients(*plain, batch, &plain_loss);
  const auto checkpointed_grads =
      Gradients(*checkpointed, batch, &checkpointed_loss);
  EXPECT_EQ(plain_loss, checkpointed_loss);
  ASSERT_EQ(plain_grads.size(), checkpointed_grads.size());
  for (size_t i = 0; i < plain_grads.size(); ++i) {
    ASSERT_EQ(plain_grads[i].size(), checkpointed_grads[i].size());
    EXPECT_EQ(0,
              std::memcmp(plain_grads[i].data(), checkpointed_grads[i].data(),
                          plain_grads[i].size() * sizeof(float)))
        << plain->Parameters()[i]->name();
  }
}

// Rows with target -1 neither count in the mean nor produce gradient: a
// batch of two sequences whose second is fully ignored gives the loss and
// gradients of the first sequence alone.
TEST(GptTest, IgnoredTargetsDoNotCount) {
  const Batch both = MakeBatch(2, 8, 37, 5);
  Batch masked = both;
  masked.targets = RandomIds({2, 8}, 0, 37);
  std::memcpy(masked.targets.data(), both.targets.data(), 8 * sizeof(int32_t));
  for (int t = 8; t < 16; ++t) masked.targets.data_as<int32_t>()[t] = -1;
  Batch first{both.tokens.Slice(0, 8).View({1, 8}),
              both.targets.Slice(0, 8).View({1, 8})};
  auto model_masked = MakeModel(TinyConfig());
  auto model_first = MakeModel(TinyConfig());
  float masked_loss = 0, first_loss = 0;
  const auto masked_grads = Gradients(*model_masked, masked, &masked_loss);
  const auto first_grads = Gradients(*model_first, first, &first_loss);
  EXPECT_EQ(model_masked->counted_targets(), 8);
  EXPECT_NEAR(masked_loss, first_loss, 1e-6f);
  for (size_t i = 0; i < masked_grads.size(); ++i) {
    for (size_t j = 0; j < masked_grads[i].size(); ++j) {
      EXPECT_NEAR(masked_grads[i][j], first_grads[i][j], 1e-6f)
          << model_first->Parameters()[i]->name() << "[" << j << "]";
    }
  }
}

TEST(GptTest, HiddenSizeIsTheEmbeddingWidth) {
  GptConfig config = TinyConfig();
  config.channels = 24;
  std::unique_ptr<GptModel> model = MakeModel(config);
  EXPECT_EQ(model->hidden_size(), 24);
  // Through the interface the engine sees.
  const LossModel &as_loss_model = *model;
  EXPECT_EQ(as_loss_model.hidden_size(), 24);
}

TEST(GptTest, ShapesOnlyModelHasNoStorageAndFailsCleanly) {
  GptOptions options;
  options.materialize = false;
  auto model = GptModel::Create(TinyConfig(), options).value();
  for (Parameter *parameter : model->Parameters()) {
    EXPECT_EQ(parameter->state(), ParameterState::kAbsent);
  }
  const Batch batch = MakeBatch(1, 4, 37, 1);
  const absl::StatusOr<float> loss =
      model->ForwardLoss(batch.tokens, batch.targets, Stream());
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(loss.status().message().find("embed.wte"), std::string::npos)
      << loss.status();
  // Materialising later gives exactly the eagerly built model.
  ASSERT_TRUE(model->MaterializeParameters(42, Stream()).ok());
  auto eager = MakeModel(TinyConfig(), 42);
  for (Parameter *parameter : model->Parameters()) {
    EXPECT_EQ(
        testing::Values(parameter->data().value()),
        testing::Values(
            eager->FindParameter(parameter->name()).value()->data().value()))
        << parameter->name();
  }
}

TEST(GptTest, PresetsAndParameterCounts) {
  const GptConfig gpt2_small = GptConfig::Preset("124M").value();
  EXPECT_EQ(gpt2_small.NumParameters(), 124439808);  // GPT-2 small, tied head
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"124M", {12, 12, 768}},  {"350M", {24, 16, 1024}},
      {"760M", {24, 16, 1536}}, {"1.3B", {24, 32, 2048}},
      {"2.7B", {32, 32, 2560}}, {"6.7B", {32, 32, 4096}},
      {"13B", {40, 40, 5120}},  {"25B", {56, 48, 6144}}};
  for (const auto &[name, shape] : expected) {
    const GptConfig config =
        GptConfig::Preset(name, /*pad_vocab=*/true).value();
    EXPECT_EQ(config.num_layers, shape[0]) << name;
    EXPECT_EQ(config.num_heads, shape[1]) << name;
    EXPECT_EQ(config.channels, shape[2]) << name;
    EXPECT_EQ(config.table_rows(), 50304);
    EXPECT_EQ(config.max_seq_len, 1024);
    // The count matches the tree that would be built (shapes only).
    GptOptions options;
    options.materialize = false;
    auto model = GptModel::Create(config, options).value();
    EXPECT_EQ(model->NumParameterElements(), config.NumParameters()) << name;
  }
  EXPECT_EQ(GptConfig::Preset("125M").status().code(),
            absl::StatusCode::kInvalidArgument);
  GptConfig bad = TinyConfig();
  bad.num_heads = 3;
  EXPECT_EQ(GptModel::Create(bad, GptOptions()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Plain SGD (lr 0.3, no momentum) on one fixed batch of 2 x 8 tokens drives
// the mean loss from about ln(37) = 3.6 to below 0.1 within 400 steps (it takes
// 59 with this seed).
TEST(GptTest, SgdOverfitsOneBatch) {
  auto model = MakeModel(TinyConfig(), 7);
  const Batch batch = MakeBatch(2, 8, 37, 11);
  const Stream stream;
  const float learning_rate = 0.3f;
  float first_loss = 0.0f, loss = 0.0f;
  int step = 0;
  for (; step < 400; ++step) {
    ASSERT_TRUE(model->ZeroGrad(stream).ok());
    loss = model->ForwardLoss(batch.tokens, batch.targets, stream).value();
    if (step == 0) first_loss = loss;
    if (loss < 0.1f) break;
    ASSERT_TRUE(model->BackwardLoss(1.0f, stream).ok());
    ASSERT_TRUE(testing::SgdStep(*model, learning_rate, stream).ok());
  }
  EXPECT_NEAR(first_loss, std::log(37.0f), 0.3f);
  EXPECT_LT(loss, 0.1f) << "after " << step << " steps";
}

// GptConfig::head_weight_gradient_in_backward reaches the head, and the
// model trains as with the default: the same losses over SGD steps up to
// the order of the f32 sums of the head's weight gradient.
TEST(GptTest, HeadWeightGradientInBackwardTrainsAsInForward) {
  std::vector<float> losses[2];
  for (bool in_backward : {false, true}) {
    GptConfig config = TinyConfig();
    config.head_weight_gradient_in_backward = in_backward;
    auto model = MakeModel(config, 7);
    EXPECT_EQ(model->lm_head()->weight_gradient(),
              in_backward ? OutputHead::WeightGradient::kInBackward
                          : OutputHead::WeightGradient::kInForward);
    const Batch batch = MakeBatch(2, 8, 37, 11);
    absl::StatusOr<std::vector<float>> trained = testing::SgdLosses(
        *model, batch.tokens, batch.targets, 8, 0.3f, Stream());
    ASSERT_TRUE(trained.ok()) << trained.status();
    losses[in_backward] = *std::move(trained);
  }
  // The loss falls (the steps do something), and each step's loss agrees.
  EXPECT_LT(losses[0].back(), losses[0].front() - 0.5f);
  for (size_t i = 0; i < losses[0].size(); ++i) {
    EXPECT_NEAR(losses[1][i], losses[0][i], 1e-5f * losses[0][i]) << i;
  }
}

TEST(GptTest, BackwardLossWithoutForwardLossIsFailedPrecondition) {
  auto model = MakeModel(TinyConfig());
  EXPECT_EQ(model->BackwardLoss(1.0f, Stream()).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace nn
}  // namespace ze

namespace ze {
namespace nn {
namespace {

// A pipeline of stages built apart (embedding + block 0 | block 1 + ln_f |
// head) computes the whole model's loss and gradients: bit for bit except
// the tied table's, whose two halves (embedding, head) are summed in
// another order.
TEST(GptPipelineStageTest, StagesChainedEqualTheWholeModel) {
  const GptConfig config = TinyConfig();
  ASSERT_EQ(config.pipeline_layers(), 5);
  const Batch batch = MakeBatch(2, 8, 37, 11);
  auto whole = MakeModel(config);
  float whole_loss = 0;
  const auto whole_grads = Gradients(*whole, batch, &whole_loss);

  const int bounds[] = {0, 2, 4, 5};
  std::vector<std::unique_ptr<GptModel>> stages;
  for (int s = 0; s < 3; ++s) {
    GptOptions options;
    options.seed = 42;
    options.first_layer = bounds[s];
    options.last_layer = bounds[s + 1];
    absl::StatusOr<std::unique_ptr<GptModel>> stage =
        GptModel::Create(config, options);
    ASSERT_TRUE(stage.ok()) << stage.status();
    stages.push_back(std::move(*stage));
  }
  EXPECT_TRUE(stages[0]->is_first_stage());
  EXPECT_TRUE(stages[2]->is_last_stage());
  EXPECT_FALSE(stages[1]->is_first_stage() || stages[1]->is_last_stage());
  EXPECT_EQ(stages[1]->StageLayers().size(), 2u);
  EXPECT_EQ(stages[1]->blocks()->at(0)->FullName(), "blocks.1");
  ASSERT_EQ(stages[0]->TiedParameters().size(), 1u);
  ASSERT_EQ(stages[2]->TiedParameters().size(), 1u);
  EXPECT_EQ(stages[2]->TiedParameters()[0]->name(), "embed.wte");
  EXPECT_TRUE(stages[1]->TiedParameters().empty());
  EXPECT_TRUE(whole->TiedParameters().empty());

  const Stream stream;
  Tensor x = batch.tokens;
  for (auto &stage : stages) {
    absl::StatusOr<Tensor> out = stage->ForwardStage(x, batch.targets, stream);
    ASSERT_TRUE(out.ok()) << out.status();
    x = *out;
  }
  MeanCrossEntropy loss;
  const float staged_loss = loss.Forward(x, batch.targets, stream).value();
  EXPECT_EQ(staged_loss, whole_loss);
  Tensor grad = loss.Backward("test", 1.0f).value();
  for (int s = 2; s >= 0; --s) {
    absl::StatusOr<Tensor> back = stages[s]->BackwardStage(grad, stream);
    ASSERT_TRUE(back.ok()) << back.status();
    grad = *back;
  }

  const std::vector<Parameter *> whole_params = whole->Parameters();
  int compared = 0;
  for (size_t i = 0; i < whole_params.size(); ++i) {
    const std::string &name = whole_params[i]->name();
    std::vector<float> summed;
    for (auto &stage : stages) {
      absl::StatusOr<Parameter *> p = stage->FindParameter(name);
      if (!p.ok()) continue;
      const std::vector<float> g = testing::Values((*p)->grad());
      if (summed.empty()) summed.assign(g.size(), 0.0f);
      for (size_t k = 0; k < g.size(); ++k) summed[k] += g[k];
    }
    ASSERT_EQ(summed.size(), whole_grads[i].size()) << name;
    for (size_t k = 0; k < summed.size(); ++k) {
      if (name == "embed.wte") {
        ASSERT_NEAR(summed[k], whole_grads[i][k],
                    1e-6f * (1 + std::fabs(whole_grads[i][k])))
            << name << "[" << k << "]";
      } else {
        ASSERT_EQ(summed[k], whole_grads[i][k]) << name << "[" << k << "]";
      }
    }
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(whole_params.size()));
}

TEST(GptPipelineStageTest, BadRangesAndWholeModelCallsAreRefused) {
  GptOptions options;
  options.first_layer = 3;
  options.last_layer = 3;
  absl::StatusOr<std::unique_ptr<GptModel>> empty =
      GptModel::Create(TinyConfig(), options);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("non-empty range within the "
                                          "model's 5"),
            std::string::npos)
      << empty.status();
  options.first_layer = 1;
  options.last_layer = 3;
  auto middle = GptModel::Create(TinyConfig(), options).value();
  const Batch batch = MakeBatch(1, 4, 37, 1);
  const absl::Status status =
      middle->ForwardLoss(batch.tokens, batch.targets, Stream()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("GptModel::ForwardLoss: this model is a "
                                  "pipeline stage (layers [1, 3) of 5)"),
            std::string::npos)
      << status;
  EXPECT_EQ(middle->BoundaryShape(batch.tokens), (Shape{1, 4, 16}));
  const std::vector<int64_t> weights = TinyConfig().PipelineLayerWeights();
  ASSERT_EQ(weights.size(), 5u);
  int64_t total = 0;
  for (int64_t w : weights) total += w;
  // The head's weight is the tied table counted again.
  EXPECT_EQ(total, TinyConfig().NumParameters() + 37 * 16);
}

// A rank's two non-contiguous stages (layers [0, 2) and [3, 4) of 5) as
// one model: the parameters keep their whole-model names and values (as
// the stages built alone have them), in chunk order; the chunks still run
// one by one and the whole refuses to; bad chunk lists are refused by name.
TEST(GptPipelineStageTest, InterleavedStagesKeepNamesAndRefuseBadChunks) {
  const GptConfig config = TinyConfig();
  auto stage = [&](int first, int last) {
    GptOptions options;
    options.seed = 42;
    options.first_layer = first;
    options.last_layer = last;
    return std::unique_ptr<LossModel>(
        GptModel::Create(config, options).value());
  };
  std::vector<std::unique_ptr<LossModel>> chunks;
  chunks.push_back(stage(0, 2));
  chunks.push_back(stage(3, 4));
  std::vector<std::string> expected_names;
  std::vector<std::vector<float>> expected_values;
  for (auto &chunk : chunks) {
    for (Parameter *p : chunk->Parameters()) {
      expected_names.push_back(p->name());
      expected_values.push_back(testing::Values(p->data().value()));
    }
  }
  absl::StatusOr<std::unique_ptr<InterleavedStages>> both =
      InterleavedStages::Create(std::move(chunks));
  ASSERT_TRUE(both.ok()) << both.status();
  InterleavedStages &model = **both;
  ASSERT_EQ(model.num_chunks(), 2);
  EXPECT_EQ(model.chunk(1)->first_layer(), 3);
  std::vector<std::string> names;
  const std::vector<Parameter *> parameters = model.Parameters();
  for (size_t i = 0; i < parameters.size(); ++i) {
    names.push_back(parameters[i]->name());
    EXPECT_EQ(testing::Values(parameters[i]->data().value()),
              expected_values[i])
        << names.back();
  }
  EXPECT_EQ(names, expected_names);
  EXPECT_TRUE(model.FindParameter(expected_names.back()).ok());
  EXPECT_EQ(expected_names.back().rfind("ln_f.", 0), 0u)
      << expected_names.back();
  EXPECT_TRUE(model.FindParameter("embed.wte").ok());
  EXPECT_FALSE(model.FindParameter("blocks.1.ln1.weight").ok());
  const std::vector<PipelineStage *> stages = PipelineStagesOf(model);
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(stages[0], model.chunk(0));
  EXPECT_TRUE(stages[0]->is_first_stage());
  EXPECT_FALSE(stages[1]->is_last_stage());
  const Batch batch = MakeBatch(1, 4, 37, 1);
  absl::StatusOr<Tensor> out =
      model.chunk(0)->ForwardStage(batch.tokens, batch.targets, Stream());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->shape(), (Shape{1, 4, 16}));
  const absl::Status whole =
      model.ForwardLoss(batch.tokens, batch.targets, Stream()).status();
  EXPECT_EQ(whole.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(whole.message().find("layers [0, 2), [3, 4) of 5"),
            std::string::npos)
      << whole;

  std::vector<std::unique_ptr<LossModel>> one;
  one.push_back(stage(0, 2));
  EXPECT_EQ(InterleavedStages::Create(std::move(one)).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<std::unique_ptr<LossModel>> backwards;
  backwards.push_back(stage(3, 4));
  backwards.push_back(stage(0, 2));
  const absl::Status order =
      InterleavedStages::Create(std::move(backwards)).status();
  EXPECT_NE(order.message().find("chunk 1 holds layers [0, 2), which do not "
                                 "follow chunk 0's [3, 4)"),
            std::string::npos)
      << order;
}

}  // namespace
}  // namespace nn
}  // namespace ze
