// Finite-difference gradient checks of every layer on the CPU in f32.
//
// Each check compares the analytic gradient (Backward) with central
// differences, step 1e-2, on 6 sampled elements of every parameter and of the
// input, passing when |analytic - numeric| <= 2e-3 + 2e-2 * max(|analytic|,
// |numeric|) (see GradCheckOptions). The loss is sum(output * R) for a fixed
// random R, computed in double.
#include "nn/layers.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "nn/test_util.h"

namespace ze {
namespace nn {
namespace {

using testing::CheckGradients;
using testing::RandomIds;
using testing::RandomTensor;

const LayerOptions kCpuF32;

template <typename M>
std::unique_ptr<M> Materialized(std::unique_ptr<M> module, uint64_t seed = 3) {
  EXPECT_TRUE(module->MaterializeParameters(seed, Stream()).ok());
  return module;
}

// Perturbs parameters away from their init (zeros for biases, ones for
// LayerNorm gains) so every term of the gradient is exercised.
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

TEST(LayersGradientTest, LinearWithBias) {
  auto linear = Materialized(std::make_unique<Linear>(5, 7, true, kCpuF32));
  Randomize(*linear, 10);
  EXPECT_GRADIENTS_MATCH(
      CheckGradients(*linear, RandomTensor({2, 3, 5}, 1), true));
}

TEST(LayersGradientTest, LinearWithoutBias) {
  auto linear = Materialized(std::make_unique<Linear>(5, 7, false, kCpuF32));
  EXPECT_EQ(linear->bias(), nullptr);
  EXPECT_EQ(linear->Parameters().size(), 1u);
  EXPECT_GRADIENTS_MATCH(
      CheckGradients(*linear, RandomTensor({4, 5}, 1), true));
}

TEST(LayersGradientTest, Embedding) {
  auto embedding = Materialized(std::make_unique<Embedding>(11, 6, 4, kCpuF32));
  // Repeated ids make the scatter-add accumulate.
  Tensor tokens = RandomIds({3, 5}, 1, 11);
  tokens.data_as<int32_t>()[0] = tokens.data_as<int32_t>()[7];
  testing::GradCheckOptions options;
  options.samples_per_tensor = 20;
  EXPECT_GRADIENTS_MATCH(CheckGradients(*embedding, tokens, false, options));
}

TEST(LayersGradientTest, LayerNorm) {
  auto norm = Materialized(std::make_unique<LayerNorm>(8, kCpuF32));
  Randomize(*norm, 20);
  EXPECT_GRADIENTS_MATCH(
      CheckGradients(*norm, RandomTensor({3, 2, 8}, 1), true));
}

TEST(LayersGradientTest, Gelu) {
  Gelu gelu;
  testing::GradCheckOptions options;
  options.samples_per_tensor = 24;
  EXPECT_GRADIENTS_MATCH(
      CheckGradients(gelu, RandomTensor({4, 6}, 1, 3.0f), true, options));
}

TEST(LayersGradientTest, CausalSelfAttention) {
  auto attention =
      Materialized(std::make_unique<CausalSelfAttention>(8, 2, 2, kCpuF32));
  Randomize(*attention, 30);
  testing::GradCheckOptions options;
  options.samples_per_tensor = 12;
  EXPECT_GRADIENTS_MATCH(
      CheckGradients(*attention, RandomTensor({2, 5, 8}, 1), true, options));
}

TEST(LayersGradientTest, Mlp) {
  auto mlp = Materialized(std::make_unique<Mlp>(6, 2, kCpuF32));
  Randomize(*mlp, 40);
  EXPECT_GRADIENTS_MATCH(
      CheckGradients(*mlp, RandomTensor({2, 3, 6}, 1), true));
}

TEST(LayersGradientTest, Block) {
  auto block = Materialized(std::make_unique<Block>(8, 2, 2, kCpuF32));
  Randomize(*block, 50);
  EXPECT_GRADIENTS_MATCH(
      CheckGradients(*block, RandomTensor({2, 4, 8}, 1), true));
}

// One Block run twice in one forward: its per-call records are consumed in
// reverse and both calls' contributions accumulate into the shared weights.
TEST(LayersGradientTest, ModuleRunTwiceInOneForward) {
  auto twice = Materialized(
      std::make_unique<Repeat>(std::make_unique<Block>(8, 2, 2, kCpuF32), 2));
  Randomize(*twice, 60);
  EXPECT_GRADIENTS_MATCH(
      CheckGradients(*twice, RandomTensor({2, 4, 8}, 1), true));
}

// Gradients of a checkpointed block are bit-identical to those of a plain
// one, and so is the input gradient.
TEST(LayersCheckpointTest, CheckpointedBlockGivesIdenticalGradients) {
  std::vector<std::vector<float>> grads[2];
  std::vector<float> input_grads[2];
  for (int checkpointed = 0; checkpointed < 2; ++checkpointed) {
    auto block = Materialized(
        std::make_unique<Repeat>(std::make_unique<Block>(8, 2, 2, kCpuF32), 2));
    block->set_activation_checkpointing(checkpointed == 1);
    const Tensor input = RandomTensor({2, 4, 8}, 1);
    const Tensor output = block->Forward(input, Stream()).value();
    const Tensor grad_input =
        block->Backward(RandomTensor(output.shape(), 2), Stream()).value();
    input_grads[checkpointed] = testing::Values(grad_input);
    for (Parameter *parameter : block->Parameters()) {
      grads[checkpointed].push_back(testing::Values(parameter->grad()));
    }
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) {
    EXPECT_EQ(0, std::memcmp(grads[0][i].data(), grads[1][i].data(),
                             grads[0][i].size() * sizeof(float)))
        << "parameter " << i;
  }
  EXPECT_EQ(input_grads[0], input_grads[1]);
}

TEST(LayersTest, BlockParameterNames) {
  auto block = std::make_unique<Block>(8, 2, 2, kCpuF32);
  std::vector<std::string> names;
  for (Parameter *parameter : block->Parameters()) {
    names.push_back(parameter->name());
    EXPECT_EQ(parameter->state(), ParameterState::kAbsent);
  }
  EXPECT_EQ(names, (std::vector<std::string>{
                       "ln1.weight", "ln1.bias", "attn.qkv.weight",
                       "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
                       "ln2.weight", "ln2.bias", "mlp.fc.weight", "mlp.fc.bias",
                       "mlp.proj.weight", "mlp.proj.bias"}));
}

TEST(LayersTest, WrongInputShapeIsInvalidArgument) {
  auto linear = Materialized(std::make_unique<Linear>(5, 7, true, kCpuF32));
  const absl::StatusOr<Tensor> output =
      linear->Forward(RandomTensor({2, 4}, 1), Stream());
  EXPECT_EQ(output.status().code(), absl::StatusCode::kInvalidArgument);
  auto embedding = Materialized(std::make_unique<Embedding>(11, 6, 4, kCpuF32));
  Tensor tokens = RandomIds({1, 3}, 1, 11);
  tokens.data_as<int32_t>()[2] = 11;
  const absl::StatusOr<Tensor> embedded = embedding->Forward(tokens, Stream());
  EXPECT_EQ(embedded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(embedded.status().message().find("tokens[0, 2] = 11"),
            std::string::npos)
      << embedded.status();
  EXPECT_EQ(
      embedding->Forward(RandomIds({1, 7}, 1, 11), Stream()).status().code(),
      absl::StatusCode::kInvalidArgument);  // T > max_seq_len
}

}  // namespace
}  // namespace nn
}  // namespace ze
