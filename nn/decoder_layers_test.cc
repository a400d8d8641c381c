// The decoder's layers on the CPU in f32: finite-difference gradients of
// every layer (and of each family's block), RoPE positions through the
// attention, ZeRO-3 style gather/release hooks (parameters present only
// between a module's own hooks), activation checkpointing and names.
#include "nn/decoder_layers.h"

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/ops.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "nn/test_util.h"

namespace ze {
namespace nn {
namespace {

using testing::CheckGradients;
using testing::RandomIds;
using testing::RandomTensor;
using testing::Values;

const LayerOptions kCpuF32;

template <typename M>
std::unique_ptr<M> Materialized(std::unique_ptr<M> module, uint64_t seed = 3) {
  EXPECT_TRUE(module->MaterializeParameters(seed, Stream()).ok());
  return module;
}

// Moves parameters away from their init (ones for norms, zeros for biases)
// so every term of the gradient is exercised.
void Randomize(Module &module, uint64_t seed) {
  for (Parameter *parameter : module.Parameters()) {
    Tensor data = parameter->data().value();
    const Tensor noise = RandomTensor(data.shape(), seed++, 0.3f);
    float *values = data.data_as<float>();
    for (int64_t i = 0; i < data.numel(); ++i) {
      values[i] += noise.data_as<float>()[i];
    }
  }
}

#define EXPECT_GRADIENTS_MATCH(failures) \
  EXPECT_TRUE((failures).empty()) << absl::StrJoin((failures), "\n")

// A small config of `family` (H 8, Hq 4, Hkv 2, D 4 (Qwen3: 6), F 12).
DecoderConfig Small(DecoderFamily family) {
  DecoderConfig config = DecoderConfig::Preset("llama-tiny").value();
  config.family = family;
  config.hidden_size = 8;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_dim = family == DecoderFamily::kQwen3 ? 6 : 4;
  config.intermediate_size = 12;
  config.rope_theta = 100;  // angles that turn within a few positions
  config.qkv_bias = family == DecoderFamily::kQwen2;
  config.qk_norm = family == DecoderFamily::kQwen3;
  config.rms_norm_eps = 1e-5;
  EXPECT_TRUE(config.Validate().ok()) << config.Validate();
  return config;
}

TEST(DecoderLayersGradientTest, RmsNorm) {
  auto norm = Materialized(std::make_unique<RmsNorm>(8, 1e-6, kCpuF32));
  Randomize(*norm, 10);
  EXPECT_GRADIENTS_MATCH(
      CheckGradients(*norm, RandomTensor({3, 2, 8}, 1), true));
}

TEST(DecoderLayersGradientTest, TokenEmbedding) {
  auto embedding =
      Materialized(std::make_unique<TokenEmbedding>(11, 6, kCpuF32));
  testing::GradCheckOptions options;
  options.samples_per_tensor = 20;
  EXPECT_GRADIENTS_MATCH(
      CheckGradients(*embedding, RandomIds({2, 5}, 1, 11), false, options));
}

TEST(DecoderLayersGradientTest, SwiGluMlp) {
  auto mlp = Materialized(std::make_unique<SwiGluMlp>(6, 10, kCpuF32));
  EXPECT_GRADIENTS_MATCH(
      CheckGradients(*mlp, RandomTensor({2, 3, 6}, 1), true));
}

// Selective recompute (Module::set_recompute_activation): down_proj keeps
// no SiLU(gate) * up, the backward recomputes it with the forward's kernel
// from the saved gate and up: outputs and gradients bit for bit those
// without it, in f32 and bf16, over two accumulating passes; the saved
// activations shrink by exactly the (rows, F) product input.
Tensor As(const Tensor &f32, DType dtype) {
  Tensor out = Tensor::Empty(f32.shape(), dtype, Device::Cpu()).value();
  EXPECT_TRUE(CopyConverting(f32, out, Stream()).ok());
  return out;
}

TEST(DecoderLayersTest, SwiGluMlpRecomputeIsBitIdenticalAndSavesItsHidden) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    LayerOptions options;
    options.dtype = dtype;
    std::vector<std::vector<float>> results[2];
    int64_t saved_bytes[2] = {0, 0};
    for (int recompute = 0; recompute < 2; ++recompute) {
      auto mlp = Materialized(std::make_unique<SwiGluMlp>(6, 10, options));
      mlp->set_recompute_activation(recompute == 1);
      Allocator *host = GetAllocator(Device::Cpu());
      for (int pass = 0; pass < 2; ++pass) {
        const Tensor input = As(RandomTensor({2, 3, 6}, 10 + pass), dtype);
        const Tensor grad_output =
            As(RandomTensor({2, 3, 6}, 20 + pass), dtype);
        const int64_t before = host->stats().bytes_in_use;
        const Tensor output = mlp->Forward(input, Stream()).value();
        saved_bytes[recompute] = host->stats().bytes_in_use - before;
        EXPECT_EQ(mlp->down_proj()->PendingInputDropped(), recompute == 1);
        const Tensor grad_input = mlp->Backward(grad_output, Stream()).value();
        results[recompute].push_back(Values(output));
        results[recompute].push_back(Values(grad_input));
      }
      for (Parameter *parameter : mlp->Parameters()) {
        results[recompute].push_back(Values(parameter->grad()));
      }
      for (Module *module : mlp->Modules()) {
        EXPECT_EQ(module->PendingBackwardCalls(), 0) << module->DisplayName();
      }
    }
    ASSERT_EQ(results[0].size(), results[1].size());
    for (size_t i = 0; i < results[0].size(); ++i) {
      EXPECT_EQ(0, std::memcmp(results[0][i].data(), results[1][i].data(),
                               results[0][i].size() * sizeof(float)))
          << "result " << i;
    }
    // The host allocator rounds each block up to 256 bytes.
    const int64_t hidden_bytes =
        2 * 3 * 10 * static_cast<int64_t>(SizeOf(dtype));
    EXPECT_EQ(saved_bytes[0] - saved_bytes[1],
              (hidden_bytes + 255) / 256 * 256);
  }
}

// SwiGluMlp's backward writes each gradient into its own activation's
// buffer (hidden's into hidden, gate's into gate, up's into up): above what
// the forward left, it allocates nothing of (..., F) (only the (..., C)
// input gradients of up and gate), where new buffers held three at once.
// Second pass (parameter gradients exist); f32 and bf16; the results are
// those of the gradient check and recompute tests above.
TEST(DecoderLayersTest, SwiGluMlpBackwardAllocatesNoIntermediateBuffer) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    LayerOptions options;
    options.dtype = dtype;
    const int64_t rows = 64, hidden = 8, intermediate = 64;
    auto mlp = Materialized(
        std::make_unique<SwiGluMlp>(hidden, intermediate, options));
    Allocator *host = GetAllocator(Device::Cpu());
    const int64_t f_bytes = rows * intermediate * SizeOf(dtype);
    for (int pass = 0; pass < 2; ++pass) {
      const Tensor input = As(RandomTensor({rows, hidden}, 10 + pass), dtype);
      const Tensor grad_output =
          As(RandomTensor({rows, hidden}, 20 + pass), dtype);
      ASSERT_TRUE(mlp->Forward(input, Stream()).ok());
      const int64_t before = host->stats().bytes_in_use;
      host->ResetPeak();
      ASSERT_TRUE(mlp->Backward(grad_output, Stream()).ok());
      if (pass == 1) {
        EXPECT_LT(host->stats().peak_bytes_in_use - before, f_bytes);
      }
    }
  }
}

TEST(DecoderLayersGradientTest, GroupedQueryAttentionOfEachFamily) {
  for (DecoderFamily family :
       {DecoderFamily::kLlama, DecoderFamily::kQwen2, DecoderFamily::kQwen3}) {
    SCOPED_TRACE(DecoderFamilyName(family));
    auto attention = Materialized(
        std::make_unique<GroupedQueryAttention>(Small(family), kCpuF32));
    Randomize(*attention, 20);
    testing::GradCheckOptions options;
    options.samples_per_tensor = 10;
    EXPECT_GRADIENTS_MATCH(
        CheckGradients(*attention, RandomTensor({2, 5, 8}, 1), true, options));
  }
}

TEST(DecoderLayersGradientTest, DecoderBlockOfEachFamily) {
  for (DecoderFamily family : {DecoderFamily::kLlama, DecoderFamily::kMistral,
                               DecoderFamily::kQwen2, DecoderFamily::kQwen3}) {
    SCOPED_TRACE(DecoderFamilyName(family));
    auto block =
        Materialized(std::make_unique<DecoderBlock>(Small(family), kCpuF32));
    Randomize(*block, 30);
    EXPECT_GRADIENTS_MATCH(
        CheckGradients(*block, RandomTensor({2, 4, 8}, 1), true));
  }
}

// Without positions, causal attention at position 2 would not see the
// order of positions 0 and 1; RoPE makes it: swapping them changes it.
TEST(DecoderLayersTest, AttentionDependsOnOrder) {
  auto attention = Materialized(std::make_unique<GroupedQueryAttention>(
      Small(DecoderFamily::kLlama), kCpuF32));
  Randomize(*attention, 5);  // scores far from uniform
  const Tensor input = RandomTensor({1, 3, 8}, 1);
  Tensor swapped = RandomTensor({1, 3, 8}, 1);
  float *s = swapped.data_as<float>();
  const float *x = input.data_as<const float>();
  for (int c = 0; c < 8; ++c) {
    s[c] = x[8 + c];
    s[8 + c] = x[c];
  }
  NoSaveScope no_save;
  const std::vector<float> a =
      Values(attention->Forward(input, Stream()).value());
  const std::vector<float> b =
      Values(attention->Forward(swapped, Stream()).value());
  float difference = 0;
  for (int c = 16; c < 24; ++c) difference += std::abs(a[c] - b[c]);
  EXPECT_GT(difference, 1e-4f);
}

TEST(DecoderLayersTest, ParameterNamesMatchTheConfig) {
  for (DecoderFamily family :
       {DecoderFamily::kLlama, DecoderFamily::kQwen2, DecoderFamily::kQwen3}) {
    const DecoderConfig config = Small(family);
    Sequential layers;
    auto *block =
        layers.Append(std::make_unique<DecoderBlock>(config, kCpuF32));
    (void)block;
    std::vector<std::string> names;
    for (Parameter *parameter : layers.Parameters()) {
      names.push_back(absl::StrCat("layers.", parameter->name()));
    }
    std::vector<std::string> expected;
    for (const auto &[name, shape] : config.ParameterShapes()) {
      if (name.rfind("layers.0.", 0) == 0) expected.push_back(name);
    }
    EXPECT_EQ(names, expected) << DecoderFamilyName(family);
    // Shapes too.
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto &[name, shape] : config.ParameterShapes()) {
      shapes[name] = shape;
    }
    for (Parameter *parameter : layers.Parameters()) {
      const Shape &shape = parameter->shape();
      EXPECT_EQ(std::vector<int64_t>(shape.begin(), shape.end()),
                shapes[absl::StrCat("layers.", parameter->name())])
          << parameter->name();
    }
  }
}

// Checkpointed blocks give bit-identical gradients, and so does a run
// where parameters exist only between each module's own pre and post hooks
// (ZeRO-3's use of the hooks), checkpointed or not.
TEST(DecoderLayersTest,
     CheckpointingAndGatherReleaseHooksGiveIdenticalGradients) {
  const DecoderConfig config = Small(DecoderFamily::kQwen3);
  const Tensor input = RandomTensor({2, 4, 8}, 1);
  const Tensor grad_output = RandomTensor({2, 4, 8}, 2);
  std::vector<std::vector<float>> reference;
  std::vector<float> reference_input_grad;
  for (int variant = 0; variant < 4; ++variant) {
    SCOPED_TRACE(variant);
    const bool checkpointed = variant == 1 || variant == 3;
    const bool hooks = variant >= 2;
    auto layers = std::make_unique<Sequential>();
    for (int i = 0; i < 2; ++i) {
      auto *block =
          layers->Append(std::make_unique<DecoderBlock>(config, kCpuF32));
      block->set_activation_checkpointing(checkpointed);
    }
    layers = Materialized(std::move(layers));
    Randomize(*layers, 40);
    std::map<Parameter *, Tensor> store;
    if (hooks) {
      for (Parameter *parameter : layers->Parameters()) {
        store[parameter] = parameter->data().value();
        parameter->ReleaseData();
      }
      auto gather = [&](Module &module, const Stream &) -> absl::Status {
        for (Parameter *parameter : module.DirectParameters()) {
          ZE_RETURN_IF_ERROR(parameter->SetData(store[parameter]));
        }
        return absl::OkStatus();
      };
      auto release = [](Module &module, const Stream &) {
        for (Parameter *parameter : module.DirectParameters()) {
          parameter->ReleaseData();
        }
        return absl::OkStatus();
      };
      for (Module *module : layers->Modules()) {
        module->AddHook(HookKind::kPreForward, gather);
        module->AddHook(HookKind::kPostForward, release);
        module->AddHook(HookKind::kPreBackward, gather);
        module->AddHook(HookKind::kPostBackward, release);
      }
    }
    ASSERT_TRUE(layers->Forward(input, Stream()).ok());
    const absl::StatusOr<Tensor> grad_input =
        layers->Backward(grad_output, Stream());
    ASSERT_TRUE(grad_input.ok()) << grad_input.status();
    std::vector<std::vector<float>> grads;
    for (Parameter *parameter : layers->Parameters()) {
      grads.push_back(Values(parameter->grad()));
      if (hooks) EXPECT_EQ(parameter->state(), ParameterState::kAbsent);
    }
    if (variant == 0) {
      reference = grads;
      reference_input_grad = Values(*grad_input);
      continue;
    }
    ASSERT_EQ(grads.size(), reference.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      EXPECT_EQ(0, std::memcmp(grads[i].data(), reference[i].data(),
                               grads[i].size() * sizeof(float)))
          << "parameter " << i;
    }
    EXPECT_EQ(Values(*grad_input), reference_input_grad);
  }
}

TEST(DecoderLayersTest, WrongInputsAreInvalidArgument) {
  auto attention = Materialized(std::make_unique<GroupedQueryAttention>(
      Small(DecoderFamily::kLlama), kCpuF32));
  const absl::StatusOr<Tensor> flat =
      attention->Forward(RandomTensor({4, 8}, 1), Stream());
  ASSERT_FALSE(flat.ok());
  EXPECT_EQ(flat.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(flat.status().message().find("(B, T, H)"), std::string::npos)
      << flat.status();
  auto norm = Materialized(std::make_unique<RmsNorm>(8, 1e-6, kCpuF32));
  EXPECT_EQ(norm->Forward(RandomTensor({2, 5}, 1), Stream()).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto embedding =
      Materialized(std::make_unique<TokenEmbedding>(11, 6, kCpuF32));
  EXPECT_EQ(
      embedding->Forward(RandomTensor({2, 5}, 1), Stream()).status().code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace nn
}  // namespace ze
