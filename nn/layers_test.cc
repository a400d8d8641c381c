// Finite-difference gradient checks of every layer on the CPU in f32.
//
// Each check compares the analytic gradient (Backward) with central
// differences, step 1e-2, on 6 sampled elements of every parameter and of the
// input, passing when |analytic - numeric| <= 2e-3 + 2e-2 * max(|analytic|,
// |numeric|) (see GradCheckOptions). The loss is sum(output * R) for a fixed
// random R, computed in double.
#include "nn/layers.h"

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/ops.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "nn/functional.h"
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

TEST(LayersGradientTest, LinearWithGelu) {
  auto linear = Materialized(
      std::make_unique<Linear>(5, 8, true, kCpuF32, Initializer::Normal(0.5f),
                               Linear::Activation::kGelu));
  Randomize(*linear, 70);
  testing::GradCheckOptions options;
  options.samples_per_tensor = 12;
  EXPECT_GRADIENTS_MATCH(
      CheckGradients(*linear, RandomTensor({2, 3, 5}, 1), true, options));
}

// The Mlp's fc saves nothing when it is itself checkpointed; the Mlp then
// leaves GELU's backward to fc (the unfused path).
TEST(LayersGradientTest, MlpWithCheckpointedFc) {
  auto mlp = Materialized(std::make_unique<Mlp>(6, 2, kCpuF32));
  mlp->fc()->set_activation_checkpointing(true);
  Randomize(*mlp, 40);
  EXPECT_GRADIENTS_MATCH(
      CheckGradients(*mlp, RandomTensor({2, 3, 6}, 1), true));
}

TEST(LayersGradientTest, MlpRunTwiceInOneForward) {
  auto twice = Materialized(
      std::make_unique<Repeat>(std::make_unique<Mlp>(6, 2, kCpuF32), 2));
  Randomize(*twice, 45);
  EXPECT_GRADIENTS_MATCH(
      CheckGradients(*twice, RandomTensor({2, 3, 6}, 1), true));
}

// The Mlp (GELU fused into fc's forward and proj's backward, fc's bias
// gradient reduced by proj) against the unfused composition Linear, Gelu,
// Linear with the same parameters: on the CPU in f32 the arithmetic is the
// same, so everything agrees bit for bit, whether the Mlp, or its fc, is
// checkpointed or not, over two accumulating backwards. The exception is
// fc's bias gradient from the second backward on: the fused path adds the
// pass's row sum to it, the unfused one adds the rows one by one.
TEST(LayersTest, MlpEqualsUnfusedLinearGeluLinear) {
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant);
    auto mlp = Materialized(std::make_unique<Mlp>(6, 2, kCpuF32));
    Randomize(*mlp, 40);
    if (variant == 1) mlp->set_activation_checkpointing(true);
    if (variant == 2) mlp->fc()->set_activation_checkpointing(true);
    Sequential reference;
    reference.Append(std::make_unique<Linear>(6, 24, true, kCpuF32));
    reference.Append(std::make_unique<Gelu>());
    reference.Append(std::make_unique<Linear>(24, 6, true, kCpuF32));
    ASSERT_TRUE(reference.MaterializeParameters(1, Stream()).ok());
    const std::vector<Parameter *> ours = mlp->Parameters();
    const std::vector<Parameter *> theirs = reference.Parameters();
    ASSERT_EQ(ours.size(), theirs.size());
    for (size_t i = 0; i < ours.size(); ++i) {
      ASSERT_TRUE(
          Copy(ours[i]->data().value(), theirs[i]->data().value(), Stream())
              .ok());
    }
    for (int pass = 0; pass < 2; ++pass) {
      const Tensor input = RandomTensor({2, 3, 6}, 10 + pass);
      const Tensor grad_output = RandomTensor({2, 3, 6}, 20 + pass);
      const Tensor output = mlp->Forward(input, Stream()).value();
      const Tensor expected = reference.Forward(input, Stream()).value();
      EXPECT_EQ(testing::Values(output), testing::Values(expected));
      const Tensor grad_input = mlp->Backward(grad_output, Stream()).value();
      const Tensor expected_grad =
          reference.Backward(grad_output, Stream()).value();
      EXPECT_EQ(testing::Values(grad_input), testing::Values(expected_grad));
    }
    for (size_t i = 0; i < ours.size(); ++i) {
      const std::vector<float> got = testing::Values(ours[i]->grad());
      const std::vector<float> want = testing::Values(theirs[i]->grad());
      if (ours[i] != mlp->fc()->bias() || variant == 2) {
        EXPECT_EQ(got, want) << ours[i]->name();
        continue;
      }
      ASSERT_EQ(got.size(), want.size());
      for (size_t j = 0; j < got.size(); ++j) {
        EXPECT_NEAR(got[j], want[j], 1e-6f) << ours[i]->name() << " " << j;
      }
    }
    for (Module *module : mlp->Modules()) {
      EXPECT_EQ(module->PendingBackwardCalls(), 0) << module->DisplayName();
    }
  }
}

// The Mlp's backward writes the pre-activation's gradient into its own
// (..., 4C) hidden buffer (Linear::WriteGradInputIntoInputInNextBackward):
// above what the forward left and what it must recompute, it allocates
// nothing as large as that buffer (only fc's (..., C) input gradient, once
// the pre-activation is freed, and f32 bias-row sums), where a new
// gradient buffer would have added the whole (..., 4C) at the peak. Measured on
// the second pass, once the parameter gradients exist; with and without
// selective recompute (its recomputed hidden is the Mlp's own too), and with
// the Mlp checkpointed (its recomputed forward's).
TEST(LayersTest, MlpBackwardAllocatesNoSecondHiddenBuffer) {
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant);
    auto mlp = Materialized(std::make_unique<Mlp>(16, 2, kCpuF32));
    if (variant == 1) mlp->set_recompute_activation(true);
    if (variant == 2) mlp->set_activation_checkpointing(true);
    Allocator *host = GetAllocator(Device::Cpu());
    const int64_t rows = 64;
    const int64_t hidden_bytes = rows * 4 * 16 * sizeof(float);
    for (int pass = 0; pass < 2; ++pass) {
      const Tensor input = RandomTensor({rows, 16}, 10 + pass);
      const Tensor grad_output = RandomTensor({rows, 16}, 20 + pass);
      ASSERT_TRUE(mlp->Forward(input, Stream()).ok());
      const int64_t before = host->stats().bytes_in_use;
      host->ResetPeak();
      ASSERT_TRUE(mlp->Backward(grad_output, Stream()).ok());
      const int64_t above = host->stats().peak_bytes_in_use - before;
      if (pass == 1) {
        // What the backward must recompute: selective recompute the hidden,
        // the checkpointed Mlp pre-activation and hidden; and no more
        // (..., 4C) buffer than that.
        const int64_t recomputed = variant * hidden_bytes;
        EXPECT_GE(above, recomputed);
        EXPECT_LT(above, recomputed + hidden_bytes);
      }
    }
  }
}

// Selective recompute (Module::set_recompute_activation): proj keeps no
// GELU output; the backward recomputes it from fc's pre-activation. On the
// CPU in f32 that is the forward's arithmetic, so outputs and gradients
// are bit for bit those without it over two accumulating passes (the Mlp
// checkpointed or not); the saved activations shrink by exactly the
// (rows, 4C) product input. With fc checkpointed nothing is dropped.
TEST(LayersTest, MlpRecomputeIsBitIdenticalAndSavesTheGeluOutput) {
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant);
    std::vector<std::vector<float>> results[2];
    int64_t saved_bytes[2] = {0, 0};
    for (int recompute = 0; recompute < 2; ++recompute) {
      auto mlp = Materialized(std::make_unique<Mlp>(6, 2, kCpuF32));
      Randomize(*mlp, 40);
      mlp->set_recompute_activation(recompute == 1);
      if (variant == 1) mlp->set_activation_checkpointing(true);
      if (variant == 2) mlp->fc()->set_activation_checkpointing(true);
      Allocator *host = GetAllocator(Device::Cpu());
      for (int pass = 0; pass < 2; ++pass) {
        const Tensor input = RandomTensor({2, 3, 6}, 10 + pass);
        const int64_t before = host->stats().bytes_in_use;
        const Tensor output = mlp->Forward(input, Stream()).value();
        saved_bytes[recompute] = host->stats().bytes_in_use - before;
        EXPECT_EQ(mlp->proj()->PendingInputDropped(),
                  recompute == 1 && variant == 0);
        const Tensor grad_input =
            mlp->Backward(RandomTensor({2, 3, 6}, 20 + pass), Stream()).value();
        results[recompute].push_back(testing::Values(output));
        results[recompute].push_back(testing::Values(grad_input));
      }
      for (Parameter *parameter : mlp->Parameters()) {
        results[recompute].push_back(testing::Values(parameter->grad()));
      }
      for (Module *module : mlp->Modules()) {
        EXPECT_EQ(module->PendingBackwardCalls(), 0) << module->DisplayName();
      }
    }
    ASSERT_EQ(results[0].size(), results[1].size());
    for (size_t i = 0; i < results[0].size(); ++i) {
      EXPECT_EQ(results[0][i], results[1][i]) << "result " << i;
    }
    // The host allocator rounds each block up to 256 bytes.
    EXPECT_EQ(saved_bytes[0] - saved_bytes[1],
              variant == 0 ? (2 * 3 * 24 * 4 + 255) / 256 * 256 : 0);
  }
}

// A Linear that dropped its input refuses a Backward given none, naming
// what the caller missed, and works once given it.
TEST(LayersTest, LinearWithDroppedInputNeedsItBack) {
  auto linear = Materialized(std::make_unique<Linear>(5, 7, true, kCpuF32));
  const Tensor input = RandomTensor({2, 5}, 1);
  linear->DropInputOfNextForward();
  const Tensor output = linear->Forward(input, Stream()).value();
  EXPECT_TRUE(linear->PendingInputDropped());
  const absl::StatusOr<Tensor> refused =
      linear->Backward(RandomTensor(output.shape(), 2), Stream());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("ProvideInputForNextBackward"),
            std::string::npos)
      << refused.status();
  // The drop was one call only.
  linear->ClearSavedState();
  ASSERT_TRUE(linear->Forward(input, Stream()).ok());
  EXPECT_FALSE(linear->PendingInputDropped());
  linear->ClearSavedState();
  linear->DropInputOfNextForward();
  ASSERT_TRUE(linear->Forward(input, Stream()).ok());
  linear->ProvideInputForNextBackward(input);
  EXPECT_TRUE(linear->Backward(RandomTensor(output.shape(), 2), Stream()).ok());
}

// What ZeRO-3 relies on: fc's and proj's hooks fire as for any two Linears,
// and every parameter gradient is accumulated inside its own module's
// Backward. Here gradient slots exist only from a module's pre-backward
// hook on (as ZeRO-3 installs them) and proj's post-backward hook checks
// that fc's gradients were not touched yet.
TEST(LayersTest, MlpAccumulatesEachGradientInsideItsOwnModule) {
  auto mlp = Materialized(std::make_unique<Mlp>(6, 2, kCpuF32));
  Randomize(*mlp, 40);
  std::vector<std::string> events;
  for (Module *module : mlp->Modules()) {
    const std::string name =
        module->FullName().empty() ? "mlp" : module->FullName();
    for (HookKind kind : {HookKind::kPreForward, HookKind::kPostForward,
                          HookKind::kPreBackward, HookKind::kPostBackward}) {
      module->AddHook(kind, [&events, name, kind](Module &m, const Stream &s) {
        events.push_back(std::string(HookKindName(kind)) + " " + name);
        if (kind == HookKind::kPreBackward) {
          for (Parameter *parameter : m.DirectParameters()) {
            ZE_RETURN_IF_ERROR(parameter->SetGrad(
                Tensor::Zeros(parameter->shape(), DType::kF32, Device::Cpu())
                    .value()));
          }
        }
        return absl::OkStatus();
      });
    }
  }
  mlp->proj()->AddHook(HookKind::kPostBackward,
                       [&mlp](Module &, const Stream &) {
                         EXPECT_FALSE(mlp->fc()->weight()->grad().defined());
                         EXPECT_FALSE(mlp->fc()->bias()->grad().defined());
                         return absl::OkStatus();
                       });
  const Tensor input = RandomTensor({2, 3, 6}, 10);
  const Tensor grad_output = RandomTensor({2, 3, 6}, 20);
  ASSERT_TRUE(mlp->Forward(input, Stream()).ok());
  ASSERT_TRUE(mlp->Backward(grad_output, Stream()).ok());
  EXPECT_EQ(events,
            (std::vector<std::string>{
                "pre-forward mlp", "pre-forward fc", "post-forward fc",
                "pre-forward proj", "post-forward proj", "post-forward mlp",
                "pre-backward mlp", "pre-backward proj", "post-backward proj",
                "pre-backward fc", "post-backward fc", "post-backward mlp"}));
  // The same gradients as with slots allocated up front.
  auto plain = Materialized(std::make_unique<Mlp>(6, 2, kCpuF32));
  Randomize(*plain, 40);
  ASSERT_TRUE(plain->Forward(input, Stream()).ok());
  ASSERT_TRUE(plain->Backward(grad_output, Stream()).ok());
  const std::vector<Parameter *> ours = mlp->Parameters();
  const std::vector<Parameter *> theirs = plain->Parameters();
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_EQ(testing::Values(ours[i]->grad()),
              testing::Values(theirs[i]->grad()))
        << ours[i]->name();
  }
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

// Split backward (nn/module.h): two micro-batches in their own saved-state
// slots, both forwards, both input-gradient parts, then both weight-gradient
// parts, give the gradients of whole backwards in the same order bit for
// bit, for a block run twice in one forward (its weights accumulate two
// calls), plain, checkpointed, and with the MLP's GELU recomputed. The
// input-gradient part writes no Linear gradient (the LayerNorms' it does),
// leaves one deferred call per Linear call, and the hooks see each Linear's
// parts: pre/post at kInput, then pre/post at kWeight; other modules' at
// kWhole only.
TEST(SplitBackwardTest, SplitEqualsWholeBitForBitAcrossSlots) {
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(::testing::Message() << "variant " << variant);
    std::vector<std::vector<float>> grads[2];
    std::vector<float> input_grads[2];
    for (int split = 0; split < 2; ++split) {
      auto model = Materialized(std::make_unique<Repeat>(
          std::make_unique<Block>(8, 2, 2, kCpuF32), 2));
      Randomize(*model, 70);
      if (variant == 1) model->set_activation_checkpointing(true);
      for (Module *module : model->Modules()) {
        if (variant == 2 && module->type_name() == "Mlp") {
          module->set_recompute_activation(true);
        }
      }
      std::map<std::string, std::string> parts;  // module -> parts seen
      for (Module *module : model->Modules()) {
        for (HookKind kind :
             {HookKind::kPreBackward, HookKind::kPostBackward}) {
          module->AddHook(kind, [&parts, kind](Module &m, const Stream &) {
            absl::StrAppend(&parts[m.FullName()],
                            kind == HookKind::kPreBackward ? "<" : ">",
                            BackwardPartName(CurrentBackwardPart()), " ");
            return absl::OkStatus();
          });
        }
      }
      Tensor grad_input[2];
      for (int mb = 0; mb < 2; ++mb) {
        SavedStateSlot slot(mb + 1);
        ASSERT_TRUE(
            model->Forward(RandomTensor({2, 4, 8}, 10 + mb), Stream()).ok());
      }
      for (int mb = 0; mb < 2; ++mb) {
        SavedStateSlot slot(mb + 1);
        const Tensor grad_output = RandomTensor({2, 4, 8}, 20 + mb);
        if (split == 0) {
          grad_input[mb] = model->Backward(grad_output, Stream()).value();
          continue;
        }
        SplitBackwardScope splitting;
        grad_input[mb] = model->Backward(grad_output, Stream()).value();
        // 4 Linears per block call, 2 calls.
        EXPECT_EQ(model->PendingWeightGradients(), 8);
      }
      if (split == 1) {
        for (Parameter *parameter : model->Parameters()) {
          const bool linear = parameter->owner()->type_name() == "Linear";
          EXPECT_EQ(parameter->grad().defined(), !linear) << parameter->name();
        }
        for (int mb = 0; mb < 2; ++mb) {
          SavedStateSlot slot(mb + 1);
          ASSERT_TRUE(model->BackwardWeights(Stream()).ok());
          EXPECT_EQ(model->PendingWeightGradients(), 0);
        }
        // Nothing left in any slot: a second run has nothing to do.
        SavedStateSlot slot(1);
        EXPECT_TRUE(model->BackwardWeights(Stream()).ok());
        const std::string linear_parts =
            "<input >input <input >input <input >input <input >input "
            "<weight >weight <weight >weight <weight >weight "
            "<weight >weight ";
        EXPECT_EQ(parts["layer.attn.qkv"], linear_parts);
        EXPECT_EQ(parts["layer.mlp.fc"], linear_parts);
        EXPECT_EQ(parts["layer.ln1"],
                  "<whole >whole <whole >whole <whole >whole <whole >whole ");
      }
      for (int mb = 0; mb < 2; ++mb) {
        const std::vector<float> values = testing::Values(grad_input[mb]);
        input_grads[split].insert(input_grads[split].end(), values.begin(),
                                  values.end());
      }
      for (Parameter *parameter : model->Parameters()) {
        grads[split].push_back(testing::Values(parameter->grad()));
      }
    }
    ASSERT_EQ(grads[0].size(), grads[1].size());
    for (size_t i = 0; i < grads[0].size(); ++i) {
      ASSERT_EQ(grads[0][i].size(), grads[1][i].size());
      EXPECT_EQ(0, std::memcmp(grads[0][i].data(), grads[1][i].data(),
                               grads[0][i].size() * sizeof(float)))
          << "parameter " << i;
    }
    EXPECT_EQ(input_grads[0], input_grads[1]);
  }
}

// A Block whose attention fails mid-forward (here: a failing hook on the
// qkv projection, after the Block handed attn.proj its residual) must not
// leave that residual pending: attn.proj, run on its own afterwards, is a
// plain Linear again.
TEST(LayersTest, FailedBlockForwardLeavesNoPendingResidual) {
  auto block = Materialized(std::make_unique<Block>(8, 2, 2, kCpuF32));
  Module *attn = nullptr;
  for (const auto &[name, child] : block->children()) {
    if (name == "attn") attn = child;
  }
  ASSERT_NE(attn, nullptr);
  Module *qkv = nullptr;
  Module *proj = nullptr;
  for (const auto &[name, child] : attn->children()) {
    if (name == "qkv") qkv = child;
    if (name == "proj") proj = child;
  }
  ASSERT_NE(qkv, nullptr);
  ASSERT_NE(proj, nullptr);
  const HookHandle failing =
      qkv->AddHook(HookKind::kPreForward, [](Module &, const Stream &) {
        return absl::InternalError("injected hook failure");
      });
  const Tensor input = RandomTensor({2, 4, 8}, 1);
  EXPECT_FALSE(block->Forward(input, Stream()).ok());
  ASSERT_TRUE(qkv->RemoveHook(failing));

  // attn.proj on its own: equal to a fresh Linear with the same weights.
  const Tensor hidden = RandomTensor({2, 4, 8}, 2);
  const Tensor got = proj->Forward(hidden, Stream()).value();
  auto *linear = static_cast<Linear *>(proj);
  Tensor want = Tensor::Empty({2, 4, 8}, DType::kF32, Device::Cpu()).value();
  ASSERT_TRUE(LinearForward(hidden, linear->weight()->data().value(),
                            linear->bias()->data().value(), want, Stream())
                  .ok());
  EXPECT_EQ(testing::Values(got), testing::Values(want));
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
