// Initialize refuses a model on another device than the communicator's
// (the classic bug: every rank builds its model on cuda:0), naming both
// devices, instead of failing at the first collective or hanging the ranks
// whose model is right. Needs a GPU; one process.
#include <memory>

#include "absl/strings/match.h"
#include "comm/factory.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "nn/gpt.h"

namespace ze {
namespace {

TEST(DevicePlacementTest, ModelOnAnotherDeviceThanTheCommunicatorIsRefused) {
  comm::CommOptions options;
  options.device = "cpu";  // a communicator for host tensors
  absl::StatusOr<std::unique_ptr<comm::Communicator>> created =
      comm::CreateCommunicator(options);
  ASSERT_TRUE(created.ok()) << created.status();
  std::shared_ptr<comm::Communicator> communicator = std::move(*created);

  nn::GptConfig config;
  config.vocab_size = 37;
  config.max_seq_len = 8;
  config.channels = 16;
  config.num_layers = 1;
  config.num_heads = 2;
  nn::GptOptions model_options;
  model_options.device = Device::Cuda(0);
  absl::StatusOr<std::unique_ptr<nn::GptModel>> model =
      nn::GptModel::Create(config, model_options);
  ASSERT_TRUE(model.ok()) << model.status();

  absl::StatusOr<std::unique_ptr<engine::Engine>> engine =
      engine::Initialize(std::shared_ptr<nn::GptModel>(std::move(*model)),
                         R"({"train_micro_batch_size_per_gpu": 2,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})",
                         communicator);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(engine.status().message(),
                                "the model is on cuda:0 but this rank's "
                                "communicator uses cpu"))
      << engine.status();
}

}  // namespace
}  // namespace ze
