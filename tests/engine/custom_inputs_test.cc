// A model that is not a language model: f32 features in, f32 targets,
// mean squared error. Engine::Forward only fixes the batch dimension; this
// trains such a model at every stage (alone and under mpirun) and checks
// that every stage follows stage 0's losses and that the loss falls.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/ops.h"
#include "core/status.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "nn/layers.h"
#include "nn/loss_model.h"
#include "nn/module.h"
#include "tests/engine/engine_test_util.h"

namespace ze {
namespace enginetest {
namespace {

constexpr int64_t kFeatures = 4;
constexpr int64_t kHidden = 8;
constexpr int kMicroBatch = 3;

// features (B, 4) f32 -> prediction (B, 1) f32 through two linear layers;
// the loss is the mean squared error against targets (B, 1) f32, formed on
// the host (the model is small and the test runs on the CPU).
class Regressor : public nn::LossModel {
 public:
  Regressor() : nn::LossModel("Regressor") {
    const nn::LayerOptions options;  // CPU, f32
    hidden_ = RegisterChild("hidden", std::make_unique<nn::Linear>(
                                          kFeatures, kHidden, true, options));
    out_ = RegisterChild(
        "out", std::make_unique<nn::Linear>(kHidden, 1, true, options));
  }

  absl::StatusOr<float> ForwardLoss(const Tensor& inputs, const Tensor& targets,
                                    const Stream& stream) override {
    if (inputs.dim() != 2 || inputs.size(1) != kFeatures ||
        inputs.dtype() != DType::kF32 ||
        targets.shape() != Shape{inputs.size(0), 1} ||
        targets.dtype() != DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Regressor: inputs must be (B, 4) f32 and targets (B, 1) f32, got ",
          inputs.DebugString(), " and ", targets.DebugString()));
    }
    ZE_ASSIGN_OR_RETURN(Tensor prediction, Forward(inputs, stream));  // (B, 1)
    ZE_ASSIGN_OR_RETURN(std::vector<float> y, ToHostFloats(prediction, stream));
    ZE_ASSIGN_OR_RETURN(std::vector<float> t, ToHostFloats(targets, stream));
    const size_t batch = y.size();
    double sum = 0;
    error_.resize(batch);
    for (size_t b = 0; b < batch; ++b) {
      error_[b] = y[b] - t[b];
      sum += static_cast<double>(error_[b]) * error_[b];
    }
    counted_ = static_cast<int64_t>(batch);
    pending_ = nn::SavingEnabled();
    return static_cast<float>(sum / batch);
  }

  absl::Status BackwardLoss(float loss_scale, const Stream& stream) override {
    if (!pending_) {
      return absl::FailedPreconditionError(
          "Regressor::BackwardLoss without a preceding ForwardLoss");
    }
    pending_ = false;
    // d(mean of e^2)/dy = 2 e / B.
    std::vector<float> grad(error_.size());
    for (size_t b = 0; b < grad.size(); ++b) {
      grad[b] = loss_scale * 2.0f * error_[b] / grad.size();
    }
    ZE_ASSIGN_OR_RETURN(
        Tensor grad_prediction,
        FromHostFloats(grad, {static_cast<int64_t>(grad.size()), 1},
                       DType::kF32, Device::Cpu(), stream));
    return Backward(grad_prediction, stream).status();
  }

  int64_t counted_targets() const override { return counted_; }
  Device device() const override { return Device::Cpu(); }
  DType dtype() const override { return DType::kF32; }

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor& features,
                                     const Stream& stream) override {
    ZE_ASSIGN_OR_RETURN(Tensor h, hidden_->Forward(features, stream));
    return out_->Forward(h, stream);
  }
  absl::StatusOr<Tensor> BackwardImpl(const Tensor& grad,
                                      const Stream& stream) override {
    ZE_ASSIGN_OR_RETURN(Tensor grad_h, out_->Backward(grad, stream));
    return hidden_->Backward(grad_h, stream);
  }
  void ClearSavedStateImpl() override { pending_ = false; }

 private:
  nn::Linear* hidden_;
  nn::Linear* out_;
  std::vector<float> error_;  // prediction - target, per sample
  int64_t counted_ = 0;
  bool pending_ = false;
};

// Global sample g: features in [-1, 1) and target 0.5 x0 - x1 + 0.25 x2 x3
// + 0.1 (mostly linear, so a small MLP fits it quickly).
void Sample(int64_t g, float* features, float* target) {
  for (int64_t f = 0; f < kFeatures; ++f) {
    const uint64_t bits =
        static_cast<uint64_t>(g * kFeatures + f) * 0x9e3779b97f4a7c15ull +
        0x632be59bd9b4e019ull;
    features[f] = static_cast<float>((bits >> 40) % 2000) / 1000.0f - 1.0f;
  }
  *target = 0.5f * features[0] - features[1] +
            0.25f * features[2] * features[3] + 0.1f;
}

std::string Config(int stage) {
  return absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": )", kMicroBatch,
      R"(, "gradient_accumulation_steps": 2, "steps_per_print": 1000,)",
      R"( "optimizer": {"type": "AdamW", "params": {"lr": 0.02}},)",
      R"( "zero_optimization": {"stage": )", stage,
      R"(, "stage3_param_persistence_threshold": 0}})");
}

// Losses of 25 optimizer steps at `stage`; every rank's micro-batch holds
// the global samples ((s * A + m) * W + r) * B + i, so the global batch is
// the same at any world size.
std::vector<float> Train(int stage) {
  auto model = std::make_shared<Regressor>();
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine =
      engine::Initialize(model, Config(stage), Comm());
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  std::vector<float> losses;
  for (int64_t step = 0; step < 25; ++step) {
    for (int64_t m = 0; m < 2; ++m) {
      Tensor inputs =
          Tensor::Empty({kMicroBatch, kFeatures}, DType::kF32, Device::Cpu())
              .value();
      Tensor targets =
          Tensor::Empty({kMicroBatch, 1}, DType::kF32, Device::Cpu()).value();
      for (int i = 0; i < kMicroBatch; ++i) {
        Sample(((step * 2 + m) * World() + Rank()) * kMicroBatch + i,
               inputs.data_as<float>() + i * kFeatures,
               targets.data_as<float>() + i);
      }
      absl::StatusOr<float> loss = (*engine)->Forward(inputs, targets);
      EXPECT_TRUE(loss.ok()) << loss.status();
      EXPECT_TRUE((*engine)->Backward().ok());
      absl::StatusOr<engine::StepReport> report = (*engine)->Step();
      EXPECT_TRUE(report.ok()) << report.status();
      if (!loss.ok() || !report.ok()) return {};
      if (report->boundary) losses.push_back(report->loss);
    }
  }
  return losses;
}

TEST(CustomInputsTest, FloatFeaturesTrainAtEveryStageLikeStageZero) {
  const std::vector<float> reference = Train(0);
  ASSERT_EQ(reference.size(), 25u);
  EXPECT_LT(reference.back(), 0.2f * reference.front())
      << "the loss did not fall: " << reference.front() << " -> "
      << reference.back();
  for (int stage : {1, 2, 3}) {
    const std::vector<float> losses = Train(stage);
    ASSERT_EQ(losses.size(), reference.size()) << "stage " << stage;
    for (size_t i = 0; i < losses.size(); ++i) {
      EXPECT_NEAR(losses[i], reference[i],
                  1e-5 * std::max(1.0f, std::abs(reference[i])))
          << "stage " << stage << ", step " << i + 1;
    }
  }
}

TEST(CustomInputsTest, OnlyTheBatchDimensionIsTheEnginesToCheck) {
  auto model = std::make_shared<Regressor>();
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine =
      engine::Initialize(model, Config(3), Comm());
  ASSERT_TRUE(engine.ok()) << engine.status();
  // A batch of the wrong size: the engine's error, naming both shapes.
  Tensor inputs =
      Tensor::Zeros({kMicroBatch + 1, kFeatures}, DType::kF32, Device::Cpu())
          .value();
  Tensor targets =
      Tensor::Zeros({kMicroBatch + 1, 1}, DType::kF32, Device::Cpu()).value();
  absl::StatusOr<float> wrong_batch = (*engine)->Forward(inputs, targets);
  ASSERT_FALSE(wrong_batch.ok());
  EXPECT_EQ(wrong_batch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(wrong_batch.status().message(),
                                "train_micro_batch_size_per_gpu=3 rows"))
      << wrong_batch.status();
  // Right batch, wrong feature count: the model's own error.
  inputs =
      Tensor::Zeros({kMicroBatch, kFeatures + 1}, DType::kF32, Device::Cpu())
          .value();
  targets = Tensor::Zeros({kMicroBatch, 1}, DType::kF32, Device::Cpu()).value();
  absl::StatusOr<float> wrong_features = (*engine)->Forward(inputs, targets);
  ASSERT_FALSE(wrong_features.ok());
  EXPECT_TRUE(absl::StrContains(wrong_features.status().message(),
                                "Regressor: inputs must be (B, 4) f32"))
      << wrong_features.status();
  // Evaluation takes any batch size.
  inputs = Tensor::Zeros({7, kFeatures}, DType::kF32, Device::Cpu()).value();
  targets = Tensor::Zeros({7, 1}, DType::kF32, Device::Cpu()).value();
  absl::StatusOr<float> eval = (*engine)->EvalForward(inputs, targets);
  ASSERT_TRUE(eval.ok()) << eval.status();
  absl::StatusOr<Tensor> outputs = (*engine)->EvalOutputs(inputs);
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  EXPECT_EQ(outputs->shape(), (Shape{7, 1}));
}

}  // namespace
}  // namespace enginetest
}  // namespace ze

int main(int argc, char** argv) {
  return ze::enginetest::RunAllTests(argc, argv);
}
