// DecoderModel on the CPU in f32: names and shapes against the config
// (tied and untied heads), whole-model gradients, checkpointing, training
// steps that lower the loss, the cached forward against the full forward
// for each family, and the errors (sequence too long, Mistral's window,
// another model's cache).
#include "nn/decoder.h"

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/ops.h"
#include "gtest/gtest.h"
#include "nn/test_util.h"

namespace ze {
namespace nn {
namespace {

using testing::RandomIds;
using testing::Values;

// A tiny model of `family`: 2 layers, H 16, Hq 4, Hkv 2, D 4 (Qwen3: 6),
// F 24, V 37, 16 positions (Mistral: window 12).
DecoderConfig Tiny(DecoderFamily family, bool tied) {
  DecoderConfig config = DecoderConfig::Preset("llama-tiny").value();
  config.family = family;
  config.num_layers = 2;
  config.hidden_size = 16;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_dim = family == DecoderFamily::kQwen3 ? 6 : 4;
  config.intermediate_size = 24;
  config.vocab_size = 37;
  config.max_position_embeddings = 16;
  config.rope_theta = 1000;
  config.tie_word_embeddings = tied;
  config.qkv_bias = family == DecoderFamily::kQwen2;
  config.qk_norm = family == DecoderFamily::kQwen3;
  config.sliding_window = family == DecoderFamily::kMistral ? 12 : 0;
  EXPECT_TRUE(config.Validate().ok()) << config.Validate();
  return config;
}

std::unique_ptr<DecoderModel> MakeModel(const DecoderConfig &config,
                                        uint64_t seed = 42) {
  DecoderOptions options;
  options.seed = seed;
  return DecoderModel::Create(config, options).value();
}

// Moves every parameter off its init (norm gains of 1, zero biases) so the
// checks see every term.
void Randomize(DecoderModel &model, uint64_t seed) {
  for (Parameter *parameter : model.Parameters()) {
    Tensor data = parameter->data().value();
    const Tensor noise = testing::RandomTensor(data.shape(), seed++, 0.1f);
    for (int64_t i = 0; i < data.numel(); ++i) {
      data.data_as<float>()[i] += noise.data_as<const float>()[i];
    }
  }
}

struct Batch {
  Tensor tokens;   // (B, T) i32
  Tensor targets;  // (B, T) i32
};
// Targets are the next token of a random sequence.
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

TEST(DecoderTest, ParametersFollowTheConfigTiedAndUntied) {
  for (const char *preset :
       {"llama-tiny", "mistral-tiny", "qwen2-tiny", "qwen3-tiny"}) {
    for (bool tied : {true, false}) {
      SCOPED_TRACE(absl::StrCat(preset, tied ? " tied" : " untied"));
      DecoderConfig config = DecoderConfig::Preset(preset).value();
      config.tie_word_embeddings = tied;
      DecoderOptions options;
      options.materialize = false;  // shapes only
      auto model = DecoderModel::Create(config, options).value();
      EXPECT_EQ(model->type_name(), "DecoderModel");
      std::vector<std::pair<std::string, std::vector<int64_t>>> actual;
      for (Parameter *parameter : model->Parameters()) {
        const Shape &shape = parameter->shape();
        actual.push_back({parameter->name(),
                          std::vector<int64_t>(shape.begin(), shape.end())});
      }
      EXPECT_EQ(actual, config.ParameterShapes());
      EXPECT_EQ(model->NumParameterElements(), config.NumParameters());
      EXPECT_EQ(model->hidden_size(), config.hidden_size);
      const std::vector<Parameter *> &head =
          model->lm_head()->DirectParameters();
      ASSERT_EQ(head.size(), 1u);
      if (tied) {
        EXPECT_EQ(head[0], model->embed_tokens()->weight());
        EXPECT_EQ(model->lm_head()->type_name(), "TiedOutputHead");
      } else {
        EXPECT_EQ(head[0]->name(), "lm_head.weight");
        EXPECT_NE(head[0], model->embed_tokens()->weight());
      }
    }
  }
}

TEST(DecoderTest, InitialisationIsDeterministicByName) {
  auto a = MakeModel(Tiny(DecoderFamily::kQwen2, false), 7);
  auto b = MakeModel(Tiny(DecoderFamily::kQwen2, false), 7);
  for (Parameter *parameter : a->Parameters()) {
    const std::vector<float> values = Values(parameter->data().value());
    EXPECT_EQ(
        values,
        Values(b->FindParameter(parameter->name()).value()->data().value()))
        << parameter->name();
    const std::string &name = parameter->name();
    const bool norm = name.find("norm.weight") != std::string::npos;
    const bool bias = name.find(".bias") != std::string::npos;
    if (norm || bias) {
      for (float v : values) EXPECT_EQ(v, norm ? 1.0f : 0.0f) << name;
    } else {
      double squares = 0;
      for (float v : values) squares += v * v;
      EXPECT_NEAR(std::sqrt(squares / values.size()), 0.02, 0.006) << name;
    }
  }
}

// Whole-model central differences on the mean loss, every family, a few
// elements of every parameter (the tied table's gradient must hold both its
// uses to match).
TEST(DecoderTest, WholeModelGradientsMatchFiniteDifferences) {
  for (DecoderFamily family : {DecoderFamily::kLlama, DecoderFamily::kMistral,
                               DecoderFamily::kQwen2, DecoderFamily::kQwen3}) {
    const bool tied = family != DecoderFamily::kQwen2;
    SCOPED_TRACE(DecoderFamilyName(family));
    auto model = MakeModel(Tiny(family, tied));
    Randomize(*model, 3);
    Batch batch = MakeBatch(2, 6, 37, 1);
    batch.targets.data_as<int32_t>()[3] = -1;  // ignored
    const Stream stream;
    testing::GradCheckOptions options;
    options.absolute_tol = 1e-4f;
    options.relative_tol = 3e-2f;
    options.samples_per_tensor = 4;
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
    EXPECT_EQ(model->counted_targets(), 11);
    for (Module *module : model->Modules()) {
      EXPECT_EQ(module->PendingBackwardCalls(), 0) << module->DisplayName();
    }
  }
}

std::vector<std::vector<float>> Gradients(DecoderModel &model,
                                          const Batch &batch, float *loss) {
  const Stream stream;
  *loss = model.ForwardLoss(batch.tokens, batch.targets, stream).value();
  EXPECT_TRUE(model.BackwardLoss(1.0f, stream).ok());
  std::vector<std::vector<float>> grads;
  for (Parameter *parameter : model.Parameters()) {
    grads.push_back(Values(parameter->grad()));
  }
  return grads;
}

TEST(DecoderTest, CheckpointingGivesIdenticalLossAndGradients) {
  DecoderConfig config = Tiny(DecoderFamily::kQwen3, true);
  const Batch batch = MakeBatch(2, 8, 37, 2);
  float loss_plain = 0, loss_checkpointed = 0;
  auto plain = MakeModel(config);
  const auto grads_plain = Gradients(*plain, batch, &loss_plain);
  config.activation_checkpointing = true;
  auto checkpointed = MakeModel(config);
  EXPECT_TRUE(checkpointed->layer(0)->activation_checkpointing());
  const auto grads_checkpointed =
      Gradients(*checkpointed, batch, &loss_checkpointed);
  EXPECT_EQ(loss_plain, loss_checkpointed);
  ASSERT_EQ(grads_plain.size(), grads_checkpointed.size());
  for (size_t i = 0; i < grads_plain.size(); ++i) {
    EXPECT_EQ(0,
              std::memcmp(grads_plain[i].data(), grads_checkpointed[i].data(),
                          grads_plain[i].size() * sizeof(float)))
        << "parameter " << i;
  }
}

// A few SGD steps (learning rate 0.2) on one batch: the loss starts near
// log(V) (small init) and goes down at every step.
TEST(DecoderTest, SgdStepsLowerTheLoss) {
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    auto model = MakeModel(Tiny(DecoderFamily::kLlama, tied));
    const Batch batch = MakeBatch(2, 8, 37, 3);
    const absl::StatusOr<std::vector<float>> trained = testing::SgdLosses(
        *model, batch.tokens, batch.targets, 10, 0.2f, Stream());
    ASSERT_TRUE(trained.ok()) << trained.status();
    const std::vector<float> &losses = *trained;
    EXPECT_NEAR(losses.front(), std::log(37.0), 0.05);
    EXPECT_LT(losses.back(), losses.front() - 0.5f)
        << absl::StrJoin(losses, ", ");
    for (size_t i = 1; i < losses.size(); ++i) {
      EXPECT_LT(losses[i], losses[i - 1]) << i;
    }
  }
}

// DecoderConfig::head_weight_gradient_in_backward reaches the head (tied
// and untied), and the model trains as with the default: the same losses
// over SGD steps up to the order of the head's f32 weight-gradient sums.
TEST(DecoderTest, HeadWeightGradientInBackwardTrainsAsInForward) {
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    std::vector<float> losses[2];
    for (bool in_backward : {false, true}) {
      DecoderConfig config = Tiny(DecoderFamily::kLlama, tied);
      config.head_weight_gradient_in_backward = in_backward;
      auto model = MakeModel(config);
      EXPECT_EQ(model->lm_head()->weight_gradient(),
                in_backward ? OutputHead::WeightGradient::kInBackward
                            : OutputHead::WeightGradient::kInForward);
      const Batch batch = MakeBatch(2, 8, 37, 3);
      absl::StatusOr<std::vector<float>> trained = testing::SgdLosses(
          *model, batch.tokens, batch.targets, 8, 0.2f, Stream());
      ASSERT_TRUE(trained.ok()) << trained.status();
      losses[in_backward] = *std::move(trained);
    }
    EXPECT_LT(losses[0].back(), losses[0].front() - 0.5f);
    for (size_t i = 0; i < losses[0].size(); ++i) {
      EXPECT_NEAR(losses[1][i], losses[0][i], 1e-5f * losses[0][i]) << i;
    }
  }
}

// The cached forward's logits equal the full forward's at every position:
// two rows of different prompt lengths prefilled separately, then decoded
// one token at a time together.
TEST(DecoderTest, ForwardCachedEqualsFullForwardForEachFamily) {
  for (DecoderFamily family : {DecoderFamily::kLlama, DecoderFamily::kMistral,
                               DecoderFamily::kQwen2, DecoderFamily::kQwen3}) {
    SCOPED_TRACE(DecoderFamilyName(family));
    auto model = MakeModel(Tiny(family, family == DecoderFamily::kLlama));
    Randomize(*model, 9);
    const int64_t seq = 10, vocab = 37;
    const Tensor tokens = RandomIds({2, seq}, 5, vocab);
    const Stream stream;
    std::vector<float> full;
    {
      NoSaveScope no_save;
      full = Values(model->Forward(tokens, stream).value());  // (2, 10, V)
    }
    auto expected = [&](int64_t row, int64_t position) {
      return std::vector<float>(
          full.begin() + (row * seq + position) * vocab,
          full.begin() + (row * seq + position + 1) * vocab);
    };
    auto row_tokens = [&](int64_t row, int64_t from, int64_t count) {
      Tensor out = RandomIds({1, count}, 0, vocab);
      for (int64_t t = 0; t < count; ++t) {
        out.data_as<int32_t>()[t] =
            tokens.data_as<const int32_t>()[row * seq + from + t];
      }
      return out;
    };
    auto expect_near = [](const std::vector<float> &a,
                          const std::vector<float> &b) {
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 2e-5) << i;
    };
    auto cache = model->NewKvCache(3, 12, stream).value();
    EXPECT_EQ(cache->num_heads(), 2);
    EXPECT_EQ(cache->head_dim(), family == DecoderFamily::kQwen3 ? 6 : 4);
    const int64_t prompt[2] = {3, 5};
    // Cache rows 2 and 0 hold sequences 0 and 1.
    const int64_t cache_row[2] = {2, 0};
    for (int64_t s = 0; s < 2; ++s) {
      const Tensor logits = model
                                ->ForwardCached(row_tokens(s, 0, prompt[s]),
                                                {cache_row[s]}, *cache, stream)
                                .value();
      EXPECT_EQ(logits.shape(), (Shape{1, 1, vocab}));
      expect_near(Values(logits), expected(s, prompt[s] - 1));
    }
    // Decode: sequence 0 has 3..9, sequence 1 has 5..9; both step while
    // they have tokens left.
    for (int64_t position = 3; position < seq; ++position) {
      std::vector<int64_t> rows;
      std::vector<int64_t> sequences;
      for (int64_t s = 0; s < 2; ++s) {
        if (position >= prompt[s]) {
          rows.push_back(cache_row[s]);
          sequences.push_back(s);
        }
      }
      Tensor step = RandomIds({static_cast<int64_t>(rows.size()), 1}, 0, vocab);
      for (size_t i = 0; i < rows.size(); ++i) {
        step.data_as<int32_t>()[i] =
            tokens.data_as<const int32_t>()[sequences[i] * seq + position];
      }
      const std::vector<float> logits =
          Values(model->ForwardCached(step, rows, *cache, stream).value());
      for (size_t i = 0; i < rows.size(); ++i) {
        expect_near(std::vector<float>(logits.begin() + i * vocab,
                                       logits.begin() + (i + 1) * vocab),
                    expected(sequences[i], position));
      }
    }
    EXPECT_EQ(cache->length(2), seq);
    EXPECT_EQ(cache->length(0), seq);
    EXPECT_EQ(cache->length(1), 0);
    for (Module *module : model->Modules()) {
      EXPECT_EQ(module->PendingBackwardCalls(), 0) << module->DisplayName();
    }
  }
}

// bf16 storage on the CPU (the ops widen to f32 and round once): the loss
// is the f32 model's within bf16's precision, backward runs, and the
// cached path agrees with the bf16 full forward.
TEST(DecoderTest, Bf16OnTheCpu) {
  const DecoderConfig config = Tiny(DecoderFamily::kQwen3, true);
  DecoderOptions options;
  options.seed = 5;
  auto f32 = DecoderModel::Create(config, options).value();
  options.dtype = DType::kBF16;
  auto bf16 = DecoderModel::Create(config, options).value();
  const Batch batch = MakeBatch(2, 8, 37, 4);
  const Stream stream;
  const float loss32 =
      f32->ForwardLoss(batch.tokens, batch.targets, stream).value();
  const float loss16 =
      bf16->ForwardLoss(batch.tokens, batch.targets, stream).value();
  EXPECT_NEAR(loss16, loss32, 1e-2 * loss32);
  ASSERT_TRUE(bf16->BackwardLoss(1.0f, stream).ok());
  EXPECT_EQ(bf16->embed_tokens()->weight()->grad().dtype(), DType::kBF16);
  std::vector<float> full;
  {
    NoSaveScope no_save;
    full = Values(bf16->Forward(batch.tokens, stream).value());
  }
  auto cache = bf16->NewKvCache(2, 8, stream).value();
  EXPECT_EQ(cache->dtype(), DType::kBF16);
  const std::vector<float> last =
      Values(bf16->ForwardCached(batch.tokens, {0, 1}, *cache, stream).value());
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t v = 0; v < 37; ++v) {
      EXPECT_NEAR(last[b * 37 + v], full[(b * 8 + 7) * 37 + v], 2e-2);
    }
  }
}

void ExpectInvalid(const absl::Status &status, const std::string &needle) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find(needle), std::string::npos) << status;
}

TEST(DecoderTest, Errors) {
  const Stream stream;
  auto llama = MakeModel(Tiny(DecoderFamily::kLlama, true));
  const Batch long_batch = MakeBatch(1, 17, 37, 1);
  ExpectInvalid(
      llama->ForwardLoss(long_batch.tokens, long_batch.targets, stream)
          .status(),
      "max_position_embeddings = 16");
  auto mistral = MakeModel(Tiny(DecoderFamily::kMistral, false));
  EXPECT_EQ(mistral->max_positions(), 12);
  const Batch window_batch = MakeBatch(1, 13, 37, 1);
  ExpectInvalid(
      mistral->ForwardLoss(window_batch.tokens, window_batch.targets, stream)
          .status(),
      "sliding_window = 12");
  ExpectInvalid(mistral->NewKvCache(1, 13, stream).status(),
                "sliding_window = 12");
  // Decoding past the window.
  auto cache = mistral->NewKvCache(1, 12, stream).value();
  ASSERT_TRUE(
      mistral->ForwardCached(RandomIds({1, 12}, 1, 37), {0}, *cache, stream)
          .ok());
  ExpectInvalid(
      mistral->ForwardCached(RandomIds({1, 1}, 1, 37), {0}, *cache, stream)
          .status(),
      "holds 12 positions");
  // Another model's cache; a target outside the vocabulary.
  auto qwen3 = MakeModel(Tiny(DecoderFamily::kQwen3, true));
  auto qwen3_cache = qwen3->NewKvCache(1, 8, stream).value();
  ExpectInvalid(
      llama->ForwardCached(RandomIds({1, 2}, 1, 37), {0}, *qwen3_cache, stream)
          .status(),
      "not this model's");
  Batch bad = MakeBatch(1, 4, 37, 1);
  bad.targets.data_as<int32_t>()[2] = 37;
  EXPECT_FALSE(llama->ForwardLoss(bad.tokens, bad.targets, stream).ok());
  EXPECT_EQ(llama->BackwardLoss(1.0f, stream).code(),
            absl::StatusCode::kFailedPrecondition);
  ExpectInvalid(
      llama->ForwardLoss(bad.tokens, RandomIds({1, 3}, 1, 37), stream).status(),
      "targets must be i32 with the shape of tokens");
  DecoderConfig broken = Tiny(DecoderFamily::kLlama, true);
  broken.num_kv_heads = 3;
  ExpectInvalid(DecoderModel::Create(broken, DecoderOptions()).status(),
                "num_kv_heads");
}

}  // namespace
}  // namespace nn
}  // namespace ze

namespace ze {
namespace nn {
namespace {

// Stages built apart (embed_tokens + block 0 | block 1 + norm | head)
// compute the whole model's loss and gradients, tied and untied: bit for
// bit except a tied table's, whose halves are summed in another order.
TEST(DecoderPipelineStageTest, StagesChainedEqualTheWholeModel) {
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const DecoderConfig config = Tiny(DecoderFamily::kQwen2, tied);
    ASSERT_EQ(config.pipeline_layers(), 5);
    const std::vector<int64_t> weights = config.PipelineLayerWeights();
    int64_t total = 0;
    for (int64_t w : weights) total += w;
    EXPECT_EQ(total, config.NumParameters() + (tied ? 37 * 16 : 0));
    const Batch batch = MakeBatch(2, 8, 37, 11);
    auto whole = MakeModel(config);
    float whole_loss = 0;
    const auto whole_grads = Gradients(*whole, batch, &whole_loss);

    const int bounds[] = {0, 2, 4, 5};
    std::vector<std::unique_ptr<DecoderModel>> stages;
    for (int s = 0; s < 3; ++s) {
      DecoderOptions options;
      options.seed = 42;
      options.first_layer = bounds[s];
      options.last_layer = bounds[s + 1];
      absl::StatusOr<std::unique_ptr<DecoderModel>> stage =
          DecoderModel::Create(config, options);
      ASSERT_TRUE(stage.ok()) << stage.status();
      stages.push_back(std::move(*stage));
    }
    EXPECT_EQ(stages[0]->TiedParameters().size(), tied ? 1u : 0u);
    EXPECT_EQ(stages[2]->TiedParameters().size(), tied ? 1u : 0u);
    EXPECT_EQ(stages[1]->layers()->at(0)->FullName(), "layers.1");

    const Stream stream;
    Tensor x = batch.tokens;
    for (auto &stage : stages) {
      absl::StatusOr<Tensor> out =
          stage->ForwardStage(x, batch.targets, stream);
      ASSERT_TRUE(out.ok()) << out.status();
      x = *out;
    }
    MeanCrossEntropy loss;
    EXPECT_EQ(loss.Forward(x, batch.targets, stream).value(), whole_loss);
    Tensor grad = loss.Backward("test", 1.0f).value();
    for (int s = 2; s >= 0; --s) {
      absl::StatusOr<Tensor> back = stages[s]->BackwardStage(grad, stream);
      ASSERT_TRUE(back.ok()) << back.status();
      grad = *back;
    }
    const std::vector<Parameter *> whole_params = whole->Parameters();
    for (size_t i = 0; i < whole_params.size(); ++i) {
      const std::string &name = whole_params[i]->name();
      std::vector<float> summed;
      for (auto &stage : stages) {
        absl::StatusOr<Parameter *> p = stage->FindParameter(name);
        if (!p.ok()) continue;
        const std::vector<float> g = Values((*p)->grad());
        if (summed.empty()) summed.assign(g.size(), 0.0f);
        for (size_t k = 0; k < g.size(); ++k) summed[k] += g[k];
      }
      ASSERT_EQ(summed.size(), whole_grads[i].size()) << name;
      for (size_t k = 0; k < summed.size(); ++k) {
        if (tied && name == "embed_tokens.weight") {
          ASSERT_NEAR(summed[k], whole_grads[i][k],
                      1e-6f * (1 + std::fabs(whole_grads[i][k])))
              << name << "[" << k << "]";
        } else {
          ASSERT_EQ(summed[k], whole_grads[i][k]) << name << "[" << k << "]";
        }
      }
    }
    EXPECT_EQ(stages[1]
                  ->ForwardLoss(batch.tokens, batch.targets, stream)
                  .status()
                  .code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

}  // namespace
}  // namespace nn
}  // namespace ze
