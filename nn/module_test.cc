// Module API: names, traversal order, hooks (order, removal, errors),
// checkpointing's hook sequence, parameter data states and their errors.
#include "nn/module.h"

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "nn/layers.h"
#include "nn/test_util.h"

namespace ze {
namespace nn {
namespace {

using testing::RandomTensor;

// A two-level tree: root Sequential { "0": Linear, "1": Sequential("inner")
// { "0": Gelu, "1": Linear } }.
class TreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::make_unique<Sequential>();
    first_ = root_->Append(std::make_unique<Linear>(4, 6, true, options_));
    inner_ = root_->Append("inner", std::make_unique<Sequential>());
    gelu_ = inner_->Append(std::make_unique<Gelu>());
    last_ = inner_->Append(std::make_unique<Linear>(6, 3, false, options_));
    ASSERT_TRUE(root_->MaterializeParameters(5, Stream()).ok());
  }

  // Adds a hook of every kind to every module, recording "<kind> <name>".
  void RecordAllHooks() {
    for (Module *module : root_->Modules()) {
      for (HookKind kind : {HookKind::kPreForward, HookKind::kPostForward,
                            HookKind::kPreBackward, HookKind::kPostBackward}) {
        handles_.push_back(
            {module,
             module->AddHook(kind, [this, kind](Module &m, const Stream &) {
               events_.push_back(std::string(HookKindName(kind)) + " " +
                                 Name(m));
               return absl::OkStatus();
             })});
      }
    }
  }

  static std::string Name(const Module &module) {
    return module.FullName().empty() ? "root" : module.FullName();
  }

  LayerOptions options_;
  std::unique_ptr<Sequential> root_;
  Linear *first_;
  Sequential *inner_;
  Gelu *gelu_;
  Linear *last_;
  std::vector<std::string> events_;
  std::vector<std::pair<Module *, HookHandle>> handles_;
};

TEST_F(TreeTest, FullNamesAreDottedPathsInStableOrder) {
  std::vector<std::string> names;
  for (Parameter *parameter : root_->Parameters()) {
    names.push_back(parameter->name());
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"0.weight", "0.bias", "inner.1.weight"}));
  std::vector<std::string> modules;
  for (Module *module : root_->Modules()) modules.push_back(Name(*module));
  EXPECT_EQ(modules, (std::vector<std::string>{"root", "0", "inner", "inner.0",
                                               "inner.1"}));
  EXPECT_EQ(root_->FindParameter("inner.1.weight").value(), last_->weight());
  EXPECT_EQ(root_->FindParameter("inner.1.bias").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(root_->NumParameterElements(), 6 * 4 + 6 + 3 * 6);
}

TEST_F(TreeTest, HooksFireInDocumentedOrder) {
  RecordAllHooks();
  const Stream stream;
  const Tensor input = RandomTensor({2, 4}, 1);
  const Tensor output = root_->Forward(input, stream).value();
  ASSERT_TRUE(root_->Backward(RandomTensor(output.shape(), 2), stream).ok());
  const std::vector<std::string> expected = {
      "pre-forward root",      "pre-forward 0",         "post-forward 0",
      "pre-forward inner",     "pre-forward inner.0",   "post-forward inner.0",
      "pre-forward inner.1",   "post-forward inner.1",  "post-forward inner",
      "post-forward root",     "pre-backward root",     "pre-backward inner",
      "pre-backward inner.1",  "post-backward inner.1", "pre-backward inner.0",
      "post-backward inner.0", "post-backward inner",   "pre-backward 0",
      "post-backward 0",       "post-backward root"};
  EXPECT_EQ(events_, expected);
}

TEST_F(TreeTest, CheckpointedContainerRefiresChildForwardHooksInBackward) {
  inner_->set_activation_checkpointing(true);
  RecordAllHooks();
  const Stream stream;
  const Tensor output = root_->Forward(RandomTensor({2, 4}, 1), stream).value();
  // The checkpointed container keeps only its input; its children nothing.
  EXPECT_EQ(inner_->PendingBackwardCalls(), 1);
  EXPECT_EQ(last_->PendingBackwardCalls(), 0);
  events_.clear();
  ASSERT_TRUE(root_->Backward(RandomTensor(output.shape(), 2), stream).ok());
  const std::vector<std::string> expected = {
      // The checkpointed container's own forward hooks do not fire again;
      // its children's do, inside its pre/post-backward.
      "pre-backward root",     "pre-backward inner",    "pre-forward inner.0",
      "post-forward inner.0",  "pre-forward inner.1",   "post-forward inner.1",
      "pre-backward inner.1",  "post-backward inner.1", "pre-backward inner.0",
      "post-backward inner.0", "post-backward inner",   "pre-backward 0",
      "post-backward 0",       "post-backward root"};
  EXPECT_EQ(events_, expected);
  for (Module *module : root_->Modules()) {
    EXPECT_EQ(module->PendingBackwardCalls(), 0) << Name(*module);
  }
}

TEST_F(TreeTest, RemovedHooksNoLongerFire) {
  RecordAllHooks();
  for (const auto &[module, handle] : handles_) {
    EXPECT_TRUE(module->RemoveHook(handle));
    EXPECT_FALSE(module->RemoveHook(handle));
  }
  const Tensor output =
      root_->Forward(RandomTensor({2, 4}, 1), Stream()).value();
  ASSERT_TRUE(root_->Backward(RandomTensor(output.shape(), 2), Stream()).ok());
  EXPECT_TRUE(events_.empty());
  EXPECT_EQ(root_->NumHooks(HookKind::kPreForward), 0);
}

TEST_F(TreeTest, HookErrorAbortsAndNamesTheModule) {
  last_->AddHook(HookKind::kPreForward, [](Module &, const Stream &) {
    return absl::UnavailableError("gather failed");
  });
  const absl::StatusOr<Tensor> output =
      root_->Forward(RandomTensor({2, 4}, 1), Stream());
  ASSERT_FALSE(output.ok());
  EXPECT_EQ(output.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(output.status().message().find("inner.1"), std::string::npos)
      << output.status();
  EXPECT_NE(output.status().message().find("gather failed"), std::string::npos);
  root_->ClearSavedState();
  EXPECT_EQ(first_->PendingBackwardCalls(), 0);
}

// A ZeRO-3 style use of the hooks: parameters are absent except between a
// module's pre and post hooks, and the model still computes the same result.
TEST_F(TreeTest, ParametersCanBeGatheredAndReleasedByHooksAlone) {
  const Stream stream;
  const Tensor input = RandomTensor({2, 4}, 1);
  const std::vector<float> reference =
      testing::Values(root_->Forward(input, stream).value());
  root_->ClearSavedState();
  std::map<Parameter *, Tensor> store;
  for (Parameter *parameter : root_->Parameters()) {
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
  for (Module *module : root_->Modules()) {
    module->AddHook(HookKind::kPreForward, gather);
    module->AddHook(HookKind::kPostForward, release);
    module->AddHook(HookKind::kPreBackward, gather);
    module->AddHook(HookKind::kPostBackward, release);
  }
  const Tensor output = root_->Forward(input, stream).value();
  EXPECT_EQ(testing::Values(output), reference);
  for (Parameter *parameter : root_->Parameters()) {
    EXPECT_EQ(parameter->state(), ParameterState::kAbsent);
  }
  ASSERT_TRUE(root_->Backward(RandomTensor(output.shape(), 2), stream).ok());
  EXPECT_TRUE(first_->weight()->grad().defined());
}

// The same gather/release hooks with a checkpointed leaf (which owns
// parameters) and a checkpointed container: gradients equal those of a plain
// run without hooks, bit for bit.
TEST_F(TreeTest, GatherReleaseHooksWorkWithCheckpointing) {
  const Stream stream;
  const Tensor input = RandomTensor({2, 4}, 1);
  const Tensor grad_output = RandomTensor({2, 3}, 2);
  ASSERT_TRUE(root_->Forward(input, stream).ok());
  ASSERT_TRUE(root_->Backward(grad_output, stream).ok());
  std::vector<std::vector<float>> reference;
  for (Parameter *parameter : root_->Parameters()) {
    reference.push_back(testing::Values(parameter->grad()));
    parameter->ReleaseGrad();
  }
  first_->set_activation_checkpointing(true);
  inner_->set_activation_checkpointing(true);
  std::map<Parameter *, Tensor> store;
  for (Parameter *parameter : root_->Parameters()) {
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
  for (Module *module : root_->Modules()) {
    module->AddHook(HookKind::kPreForward, gather);
    module->AddHook(HookKind::kPostForward, release);
    module->AddHook(HookKind::kPreBackward, gather);
    module->AddHook(HookKind::kPostBackward, release);
  }
  ASSERT_TRUE(root_->Forward(input, stream).ok());
  const absl::StatusOr<Tensor> grad_input =
      root_->Backward(grad_output, stream);
  ASSERT_TRUE(grad_input.ok()) << grad_input.status();
  const std::vector<Parameter *> parameters = root_->Parameters();
  for (size_t i = 0; i < parameters.size(); ++i) {
    EXPECT_EQ(testing::Values(parameters[i]->grad()), reference[i])
        << parameters[i]->name();
    EXPECT_EQ(parameters[i]->state(), ParameterState::kAbsent);
  }
}

TEST_F(TreeTest, AbsentParameterDataIsAStatusError) {
  last_->weight()->ReleaseData();
  EXPECT_EQ(last_->weight()->state(), ParameterState::kAbsent);
  const absl::StatusOr<Tensor> data = last_->weight()->data();
  EXPECT_EQ(data.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(data.status().message().find("inner.1.weight"), std::string::npos);
  const absl::StatusOr<Tensor> output =
      root_->Forward(RandomTensor({2, 4}, 1), Stream());
  EXPECT_EQ(output.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(output.status().message().find("inner.1.weight"),
            std::string::npos);
}

TEST_F(TreeTest, ShardStateAndErrors) {
  Parameter *weight = last_->weight();  // (3, 6): 18 elements
  weight->ReleaseData();
  Tensor shard = Tensor::Zeros({5}, DType::kF32, Device::Cpu()).value();
  ASSERT_TRUE(weight->SetShard(shard, 10).ok());
  EXPECT_EQ(weight->state(), ParameterState::kShard);
  EXPECT_EQ(weight->shard_offset(), 10);
  const absl::Status status = weight->data().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("[10, 15) of 18"), std::string::npos)
      << status;
  EXPECT_EQ(weight->SetShard(shard, 14).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(weight->SetData(shard).code(), absl::StatusCode::kInvalidArgument);
  weight->ReleaseShard();
  EXPECT_EQ(weight->shard().status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(TreeTest, BackwardWithoutForwardIsFailedPrecondition) {
  const absl::StatusOr<Tensor> grad =
      root_->Backward(RandomTensor({2, 3}, 2), Stream());
  EXPECT_EQ(grad.status().code(), absl::StatusCode::kFailedPrecondition);
  {
    NoSaveScope no_save;
    ASSERT_TRUE(root_->Forward(RandomTensor({2, 4}, 1), Stream()).ok());
  }
  EXPECT_EQ(root_->PendingBackwardCalls(), 0);
  EXPECT_EQ(root_->Backward(RandomTensor({2, 3}, 2), Stream()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Saved-state slots: two forwards in flight, each in a slot of its own,
// backpropagated oldest first (1F1B's order, F(m + 1) before B(m)): each
// backward pops its own forward's records, so the input gradients are
// those of each forward backpropagated alone, bit for bit, with and
// without checkpointing (whose kept input is per slot too). One stack for
// both would give the first backward the second forward's records.
TEST_F(TreeTest, SlotsBackpropagateTheirOwnForwardInAnyOrder) {
  const Stream stream;
  const Tensor a = RandomTensor({2, 4}, 1), b = RandomTensor({2, 4}, 7);
  const Tensor grad_output = RandomTensor({2, 3}, 2);
  for (bool checkpointed : {false, true}) {
    SCOPED_TRACE(checkpointed ? "checkpointed" : "saved");
    inner_->set_activation_checkpointing(checkpointed);
    std::vector<std::vector<float>> alone;
    for (const Tensor &input : {a, b}) {
      ASSERT_TRUE(root_->Forward(input, stream).ok());
      alone.push_back(
          testing::Values(root_->Backward(grad_output, stream).value()));
    }
    for (int64_t slot : {1, 2}) {
      const SavedStateSlot in(slot);
      ASSERT_TRUE(root_->Forward(slot == 1 ? a : b, stream).ok());
      EXPECT_EQ(root_->PendingBackwardCalls(), 1);
    }
    EXPECT_EQ(root_->SavedSlots(), 2);
    EXPECT_EQ(inner_->SavedSlots(), 2);
    EXPECT_EQ(last_->SavedSlots(), checkpointed ? 0 : 2);  // inner_ keeps
    EXPECT_EQ(root_->PendingBackwardCalls(), 0);           // slot 0's
    for (int64_t slot : {1, 2}) {
      const SavedStateSlot in(slot);
      const absl::StatusOr<Tensor> grad = root_->Backward(grad_output, stream);
      ASSERT_TRUE(grad.ok()) << grad.status();
      EXPECT_EQ(testing::Values(*grad), alone[slot - 1]);
    }
    EXPECT_EQ(root_->SavedSlots(), 0);
    const SavedStateSlot in(1);
    const absl::Status again = root_->Backward(grad_output, stream).status();
    EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(again.message().find("saved-state slot 1"), std::string::npos)
        << again;
  }
  EXPECT_EQ(CurrentSavedStateSlot(), 0);
}

TEST_F(TreeTest, FrozenParameterGetsNoGradient) {
  first_->weight()->set_requires_grad(false);
  const Tensor output =
      root_->Forward(RandomTensor({2, 4}, 1), Stream()).value();
  ASSERT_TRUE(root_->Backward(RandomTensor(output.shape(), 2), Stream()).ok());
  EXPECT_FALSE(first_->weight()->grad().defined());
  EXPECT_TRUE(first_->bias()->grad().defined());
}

TEST_F(TreeTest, GradientsAccumulateAcrossCallsAndZeroGradResets) {
  const Stream stream;
  const Tensor input = RandomTensor({2, 4}, 1);
  const Tensor grad_output = RandomTensor({2, 3}, 2);
  ASSERT_TRUE(root_->Forward(input, stream).ok());
  ASSERT_TRUE(root_->Backward(grad_output, stream).ok());
  const std::vector<float> once = testing::Values(first_->weight()->grad());
  ASSERT_TRUE(root_->Forward(input, stream).ok());
  ASSERT_TRUE(root_->Backward(grad_output, stream).ok());
  const std::vector<float> twice = testing::Values(first_->weight()->grad());
  for (size_t i = 0; i < once.size(); ++i) {
    EXPECT_NEAR(twice[i], 2 * once[i], 1e-6f * (1 + std::fabs(once[i])));
  }
  ASSERT_TRUE(root_->ZeroGrad(stream).ok());
  for (float v : testing::Values(first_->weight()->grad())) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace nn
}  // namespace ze
