// Incremental decoding on the CPU in f32: the cache ops against the plain
// attention and embedding, GptModel::ForwardCached's logits against the
// full recompute at every step (a batch of prompts of different lengths,
// prefilled per length, then decoded together, each row at its own
// position), hooks firing as in a plain forward, and the errors naming the
// argument and row.
#include "nn/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/ops.h"
#include "gtest/gtest.h"
#include "nn/functional.h"
#include "nn/gpt.h"
#include "nn/test_util.h"

namespace ze {
namespace nn {
namespace {

using testing::RandomIds;
using testing::RandomTensor;

Tensor Empty(const Shape& shape, DType dtype = DType::kF32) {
  return Tensor::Empty(shape, dtype, Device::Cpu()).value();
}

Tensor I32(const std::vector<int32_t>& values) {
  Tensor tensor = Empty({static_cast<int64_t>(values.size())}, DType::kI32);
  std::copy(values.begin(), values.end(), tensor.data_as<int32_t>());
  return tensor;
}

void ExpectInvalid(const absl::Status& status, const std::string& fragment) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find(fragment), std::string::npos)
      << "'" << fragment << "' not in: " << status.message();
}

float MaxAbsDiff(const float* a, const float* b, int64_t count) {
  float worst = 0;
  for (int64_t i = 0; i < count; ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]));
  }
  return worst;
}

// Two sequences of length 7 stored in cache rows 2 and 0 of a 3-row cache,
// written in chunks of 4 (a prefill) and then 1, 2 (decode and a chunked
// step): every chunk's cached attention equals the matching rows of
// AttentionForward on the whole sequences.
TEST(KvCacheOpsTest, CachedAttentionEqualsFullAttentionChunkByChunk) {
  const int64_t n = 2, seq = 7, heads = 2, head_dim = 4, capacity = 9;
  const int64_t channels = heads * head_dim;
  const Tensor qkv = RandomTensor({n, seq, 3 * channels}, 11, 1.5f);
  Tensor full = Empty({n, seq, channels});
  ASSERT_TRUE(
      AttentionForward(qkv, heads, full, Empty({n, heads, seq}), Stream())
          .ok());
  const Tensor keys = RandomTensor({3, heads, capacity, head_dim}, 12);
  const Tensor values = RandomTensor({3, heads, capacity, head_dim}, 13);
  const Tensor rows = I32({2, 0});
  int64_t position = 0;
  for (int64_t chunk : {4, 1, 2}) {
    // qkv rows [position, position + chunk) of both sequences.
    Tensor part = Empty({n, chunk, 3 * channels});
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(Copy(qkv.Flat().Slice((i * seq + position) * 3 * channels,
                                        chunk * 3 * channels),
                       part.Flat().Slice(i * chunk * 3 * channels,
                                         chunk * 3 * channels),
                       Stream())
                      .ok());
    }
    const Tensor starts =
        I32({static_cast<int32_t>(position), static_cast<int32_t>(position)});
    ASSERT_TRUE(
        KvCacheWrite(part, rows, starts, heads, keys, values, Stream()).ok());
    Tensor output = Empty({n, chunk, channels});
    ASSERT_TRUE(CachedAttentionForward(part, rows, starts, heads, keys, values,
                                       output, Stream())
                    .ok());
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_LE(
          MaxAbsDiff(output.data_as<float>() + i * chunk * channels,
                     full.data_as<float>() + (i * seq + position) * channels,
                     chunk * channels),
          1e-6f)
          << "chunk at " << position << ", sequence " << i;
    }
    position += chunk;
  }
  // The written keys are the sequences' keys, at their rows; row 1 is
  // untouched.
  const Tensor untouched = RandomTensor({3, heads, capacity, head_dim}, 12);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t t = 0; t < seq; ++t) {
      for (int64_t d = 0; d < head_dim; ++d) {
        const float k = qkv.data_as<float>()[(1 * seq + t) * 3 * channels +
                                             channels + h * head_dim + d];
        EXPECT_EQ(
            keys.data_as<float>()[((0 * heads + h) * capacity + t) * head_dim +
                                  d],
            k);
      }
    }
  }
  const int64_t row_size = heads * capacity * head_dim;
  EXPECT_EQ(MaxAbsDiff(keys.data_as<float>() + row_size,
                       untouched.data_as<float>() + row_size, row_size),
            0.0f);
}

TEST(KvCacheOpsTest, EmbeddingForwardAtShiftsEachRowsPositions) {
  const Tensor table = RandomTensor({11, 6}, 1);
  const Tensor positions = RandomTensor({9, 6}, 2);
  const Tensor tokens = RandomIds({2, 3}, 3, 11);
  Tensor output = Empty({2, 3, 6});
  ASSERT_TRUE(EmbeddingForwardAt(tokens, I32({4, 0}), table, positions, output,
                                 Stream())
                  .ok());
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < 3; ++t) {
      const int64_t position = (b == 0 ? 4 : 0) + t;
      const int32_t id = tokens.data_as<int32_t>()[b * 3 + t];
      for (int64_t c = 0; c < 6; ++c) {
        EXPECT_EQ(output.data_as<float>()[(b * 3 + t) * 6 + c],
                  table.data_as<float>()[id * 6 + c] +
                      positions.data_as<float>()[position * 6 + c]);
      }
    }
  }
  ExpectInvalid(EmbeddingForwardAt(tokens, I32({7, 0}), table, positions,
                                   output, Stream()),
                "starts[0] = 7");
  ExpectInvalid(
      EmbeddingForwardAt(tokens, I32({0}), table, positions, output, Stream()),
      "starts must have shape [2]");
}

TEST(KvCacheOpsTest, BadRowsAndStartsAreNamed) {
  const int64_t heads = 2, head_dim = 2, capacity = 4;
  const Tensor qkv = RandomTensor({2, 2, 12}, 1);
  const Tensor keys = Empty({2, heads, capacity, head_dim});
  const Tensor values = Empty({2, heads, capacity, head_dim});
  ExpectInvalid(KvCacheWrite(qkv, I32({0, 2}), I32({0, 0}), heads, keys, values,
                             Stream()),
                "rows[1] = 2");
  ExpectInvalid(KvCacheWrite(qkv, I32({0, 1}), I32({0, 3}), heads, keys, values,
                             Stream()),
                "starts[1] = 3");
  ExpectInvalid(
      CachedAttentionForward(qkv, I32({0, 1}), I32({-1, 0}), heads, keys,
                             values, Empty({2, 2, 4}), Stream()),
      "starts[0] = -1");
  ExpectInvalid(
      KvCacheWrite(qkv, I32({0, 1}), I32({0, 0}), 3, keys, values, Stream()),
      "num_heads = 3");
  ExpectInvalid(
      KvCacheWrite(qkv, I32({0, 1}), I32({0, 0}), heads, keys, keys, Stream()),
      "must not alias");
  ExpectInvalid(
      CachedAttentionForward(qkv, I32({0, 1}), I32({0, 0}), heads, keys, values,
                             Empty({2, 2, 5}), Stream()),
      "output must have shape [2, 2, 4]");
}

// ------------------------------------------------------------ GptModel

GptConfig Config() {
  GptConfig config;
  config.num_layers = 2;
  config.num_heads = 2;
  config.channels = 16;
  config.vocab_size = 37;
  config.max_seq_len = 16;
  return config;
}

std::unique_ptr<GptModel> MakeModel(DType dtype = DType::kF32) {
  GptOptions options;
  options.seed = 7;
  options.dtype = dtype;
  return GptModel::Create(Config(), options).value();
}

Tensor Tokens(const std::vector<std::vector<int32_t>>& rows) {
  const int64_t length = static_cast<int64_t>(rows[0].size());
  Tensor tokens =
      Empty({static_cast<int64_t>(rows.size()), length}, DType::kI32);
  for (size_t r = 0; r < rows.size(); ++r) {
    std::copy(rows[r].begin(), rows[r].end(),
              tokens.data_as<int32_t>() + r * length);
  }
  return tokens;
}

// The last position's logits of a plain forward over `sequence`.
std::vector<float> FullLastLogits(GptModel& model,
                                  const std::vector<int32_t>& sequence) {
  NoSaveScope no_save;
  const Tensor logits = model.Forward(Tokens({sequence}), Stream()).value();
  const int64_t vocab = logits.size(2);
  const std::vector<float> all = testing::Values(logits);
  return std::vector<float>(all.end() - vocab, all.end());
}

// Prompts of lengths 5, 2, 5 and 3: prefilled per length (rows 0 and 2
// together), then decoded as one batch for 8 steps, each row at its own
// position; logits at every step equal the full recompute's.
void ExpectCachedEqualsRecompute(DType dtype, float tolerance) {
  auto model = MakeModel(dtype);
  const std::vector<std::vector<int32_t>> prompts = {
      {3, 18, 19, 7, 1}, {30, 2}, {5, 5, 9, 36, 0}, {11, 12, 13}};
  const int64_t batch = 4, steps = 8;
  auto cache = model->NewKvCache(batch, /*capacity=*/14, Stream()).value();
  EXPECT_EQ(cache->keys(0).shape(), (Shape{batch, 2, 14, 8}));
  EXPECT_EQ(cache->dtype(), dtype);
  std::vector<std::vector<int32_t>> sequences = prompts;
  std::vector<std::vector<float>> last(batch);
  const int64_t vocab = Config().vocab_size;
  auto check = [&](const Tensor& logits, const std::vector<int64_t>& rows,
                   const std::string& what) {
    ASSERT_EQ(logits.shape(),
              (Shape{static_cast<int64_t>(rows.size()), 1, vocab}));
    const std::vector<float> values = testing::Values(logits);
    for (size_t i = 0; i < rows.size(); ++i) {
      const std::vector<float> expected =
          FullLastLogits(*model, sequences[rows[i]]);
      const float* got = values.data() + i * vocab;
      EXPECT_LE(MaxAbsDiff(got, expected.data(), vocab), tolerance)
          << what << ", row " << rows[i];
      last[rows[i]].assign(got, got + vocab);
    }
  };
  for (const std::vector<int64_t>& rows :
       std::vector<std::vector<int64_t>>{{0, 2}, {1}, {3}}) {
    std::vector<std::vector<int32_t>> group;
    for (int64_t row : rows) group.push_back(prompts[row]);
    absl::StatusOr<Tensor> logits =
        model->ForwardCached(Tokens(group), rows, *cache, Stream());
    ASSERT_TRUE(logits.ok()) << logits.status();
    check(*logits, rows, "prefill");
  }
  EXPECT_EQ(cache->lengths(), (std::vector<int64_t>{5, 2, 5, 3}));
  const std::vector<int64_t> all = {0, 1, 2, 3};
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<std::vector<int32_t>> next;
    for (int64_t b = 0; b < batch; ++b) {
      // Greedy, so the sequences are what generation would produce.
      const int32_t token = static_cast<int32_t>(
          std::max_element(last[b].begin(), last[b].end()) - last[b].begin());
      sequences[b].push_back(token);
      next.push_back({token});
    }
    absl::StatusOr<Tensor> logits =
        model->ForwardCached(Tokens(next), all, *cache, Stream());
    ASSERT_TRUE(logits.ok()) << logits.status();
    check(*logits, all, "decode step " + std::to_string(step));
  }
  EXPECT_EQ(cache->lengths(), (std::vector<int64_t>{13, 10, 13, 11}));
  // Nothing was saved for a backward.
  EXPECT_EQ(model->PendingBackwardCalls(), 0);
  EXPECT_EQ(model->embed()->PendingBackwardCalls(), 0);
}

TEST(GptKvCacheTest, CachedLogitsEqualFullRecomputeAtEveryStepF32) {
  ExpectCachedEqualsRecompute(DType::kF32, 2e-6f);
}

// bf16 storage: the cache and activations round like the full path's, in
// another order.
TEST(GptKvCacheTest, CachedLogitsFollowFullRecomputeBf16) {
  ExpectCachedEqualsRecompute(DType::kBF16, 3e-2f);
}

// The cached forward runs through Module::Forward: every module's forward
// hooks fire once per call, as in a plain forward (what ZeRO-3 relies on).
TEST(GptKvCacheTest, HooksFireAsInAPlainForward) {
  auto model = MakeModel();
  std::map<Module*, int> pre, post;
  for (Module* module : model->Modules()) {
    module->AddHook(HookKind::kPreForward, [&](Module& m, const Stream&) {
      ++pre[&m];
      return absl::OkStatus();
    });
    module->AddHook(HookKind::kPostForward, [&](Module& m, const Stream&) {
      ++post[&m];
      return absl::OkStatus();
    });
  }
  auto cache = model->NewKvCache(2, 8, Stream()).value();
  ASSERT_TRUE(model
                  ->ForwardCached(Tokens({{1, 2, 3}, {4, 5, 6}}), {0, 1},
                                  *cache, Stream())
                  .ok());
  ASSERT_TRUE(
      model->ForwardCached(Tokens({{7}, {8}}), {0, 1}, *cache, Stream()).ok());
  for (Module* module : model->Modules()) {
    EXPECT_EQ(pre[module], 2) << module->DisplayName();
    EXPECT_EQ(post[module], 2) << module->DisplayName();
  }
  // A failing hook fails the call, leaves the lengths and the modules'
  // one-shot settings clean: a plain forward afterwards is unaffected.
  const HookHandle failing =
      model->ln_f()->AddHook(HookKind::kPreForward, [](Module&, const Stream&) {
        return absl::UnavailableError("injected");
      });
  absl::StatusOr<Tensor> failed =
      model->ForwardCached(Tokens({{9}, {9}}), {0, 1}, *cache, Stream());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(cache->lengths(), (std::vector<int64_t>{4, 4}));
  ASSERT_TRUE(model->ln_f()->RemoveHook(failing));
  EXPECT_EQ(FullLastLogits(*model, {1, 2, 3}),
            FullLastLogits(*MakeModel(), {1, 2, 3}));
}

TEST(GptKvCacheTest, BadArgumentsAreNamed) {
  auto model = MakeModel();
  auto cache = model->NewKvCache(2, 6, Stream()).value();
  ExpectInvalid(model->NewKvCache(2, 17, Stream()).status(),
                "capacity = 17 exceeds the model's max_seq_len = 16");
  ExpectInvalid(model->NewKvCache(0, 4, Stream()).status(), "batch = 0");
  ExpectInvalid(
      model->ForwardCached(Tokens({{1, 2}}), {2}, *cache, Stream()).status(),
      "rows[0] = 2");
  ExpectInvalid(
      model->ForwardCached(Tokens({{1}, {2}}), {1, 1}, *cache, Stream())
          .status(),
      "rows[1] = 1 is listed twice");
  ExpectInvalid(
      model->ForwardCached(Tokens({{1}, {2}}), {1}, *cache, Stream()).status(),
      "rows has 1 entries");
  ASSERT_TRUE(
      model->ForwardCached(Tokens({{1, 2, 3, 4, 5}}), {1}, *cache, Stream())
          .ok());
  ExpectInvalid(
      model->ForwardCached(Tokens({{1, 2}}), {1}, *cache, Stream()).status(),
      "row 1 holds 5 positions; 2 more exceed the cache's capacity 6");
  EXPECT_EQ(cache->length(1), 5);
  GptConfig other = Config();
  other.num_layers = 3;
  GptOptions options;
  auto wider = GptModel::Create(other, options).value();
  auto foreign = wider->NewKvCache(2, 6, Stream()).value();
  ExpectInvalid(
      model->ForwardCached(Tokens({{1}}), {0}, *foreign, Stream()).status(),
      "is not this model's");
  ExpectInvalid(cache->Advance({0}, 7), "do not fit its capacity 6");
  cache->Reset();
  EXPECT_EQ(cache->lengths(), (std::vector<int64_t>{0, 0}));
}

}  // namespace
}  // namespace nn
}  // namespace ze
