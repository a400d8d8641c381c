// Hugging Face GPT-2 weights through a real GptModel: export one model's
// parameters as an HF file, load the file into a second model built with
// another seed, and check that every parameter and the loss come back
// identical. This pins the name table in hf_gpt2.cc to nn's real parameter
// names.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/status.h"
#include "nn/gpt.h"
#include "nn/pretrained/hf_gpt2.h"

namespace ze {
namespace nn {
namespace {

GptConfig TinyConfig() {
  GptConfig config;
  config.num_layers = 2;
  config.num_heads = 2;
  config.channels = 16;
  config.vocab_size = 37;
  config.padded_vocab_size = 48;  // our table is padded; the file is not
  config.max_seq_len = 8;
  return config;
}

std::unique_ptr<GptModel> Build(uint64_t seed) {
  GptOptions options;
  options.seed = seed;
  return GptModel::Create(TinyConfig(), options).value();
}

float Loss(GptModel& model) {
  std::vector<int32_t> tokens(2 * 8), targets(2 * 8);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>((i * 7 + 3) % 37);
    targets[i] = static_cast<int32_t>((i * 5 + 1) % 37);
  }
  Tensor token_tensor =
      Tensor::Wrap(tokens.data(), {2, 8}, DType::kI32, Device::Cpu());
  Tensor target_tensor =
      Tensor::Wrap(targets.data(), {2, 8}, DType::kI32, Device::Cpu());
  return model.ForwardLoss(token_tensor, target_tensor, Stream()).value();
}

TEST(GptRoundTripTest, ExportThenLoadIntoAnotherModelGivesTheSameWeights) {
  std::unique_ptr<GptModel> source = Build(1);
  std::unique_ptr<GptModel> target = Build(2);
  ASSERT_NE(Loss(*source), Loss(*target));

  const GptConfig config = TinyConfig();
  Gpt2Dims dims;
  dims.num_layers = config.num_layers;
  dims.channels = config.channels;
  dims.vocab_size = config.table_rows();
  dims.max_positions = config.max_seq_len;
  const std::string path =
      std::string(std::getenv("TEST_TMPDIR")) + "/gpt2_roundtrip.safetensors";
  Gpt2ExportOptions export_options;
  export_options.vocab_size = config.vocab_size;  // drop the padding rows
  ASSERT_TRUE(ExportHuggingFaceGpt2(
                  path, dims,
                  [&](const std::string& name) -> absl::StatusOr<Tensor> {
                    ZE_ASSIGN_OR_RETURN(Parameter * parameter,
                                        source->FindParameter(name));
                    return parameter->data();
                  },
                  export_options)
                  .ok());

  Gpt2LoadOptions load_options;
  load_options.expected = dims;  // our vocabulary is padded: extra rows zero
  int loaded = 0;
  absl::Status status = LoadHuggingFaceGpt2(
      path,
      [&](const std::string& name, const Tensor& values) -> absl::Status {
        ZE_ASSIGN_OR_RETURN(Parameter * parameter, target->FindParameter(name));
        ZE_ASSIGN_OR_RETURN(Tensor data, parameter->data());
        ++loaded;
        return Copy(values, data, Stream());
      },
      load_options);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(loaded, static_cast<int>(source->Parameters().size()));

  for (Parameter* parameter : source->Parameters()) {
    const std::vector<float> expected =
        ToHostFloats(parameter->data().value(), Stream()).value();
    const std::vector<float> actual =
        ToHostFloats(
            target->FindParameter(parameter->name()).value()->data().value(),
            Stream())
            .value();
    if (parameter->name() == "embed.wte") {
      // Rows past the file's vocabulary are zero after the load.
      const size_t real = config.vocab_size * config.channels;
      EXPECT_EQ(std::vector<float>(actual.begin(), actual.begin() + real),
                std::vector<float>(expected.begin(), expected.begin() + real));
      for (size_t i = real; i < actual.size(); ++i) ASSERT_EQ(actual[i], 0.0f);
    } else {
      EXPECT_EQ(actual, expected) << parameter->name();
    }
  }
}

}  // namespace
}  // namespace nn
}  // namespace ze
