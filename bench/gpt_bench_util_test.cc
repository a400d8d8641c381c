// BenchModelConfig: one name picks a GPT or a decoder, with the shape
// figures generate_bench's KV-cache size and the JSON lines rely on; and
// BuildModel builds the matching model.
#include "bench/gpt_bench_util.h"

#include <memory>

#include "core/device.h"
#include "core/stream.h"
#include "gtest/gtest.h"
#include "nn/decoder_config.h"

namespace ze {
namespace bench {
namespace {

TEST(BenchModelConfigTest, DecoderPresetKeepsGroupedKeyValueWidth) {
  absl::StatusOr<BenchModelConfig> config =
      BenchModelConfig::FromName("llama-8B", 256);
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->is_decoder());
  EXPECT_EQ(config->num_layers(), 32);
  // 8 key/value heads of 128, not the 4096 query width.
  EXPECT_EQ(config->kv_channels(), 8 * 128);
  EXPECT_EQ(config->vocab_size(), 128256);
  EXPECT_EQ(config->NumParameters(), 8030261248);
  // The preset's 131072 positions already cover 256.
  EXPECT_EQ(config->decoder->max_position_embeddings, 131072);
  const Json json = config->ToJson();
  EXPECT_EQ(json.at("num_key_value_heads"), 8);
  EXPECT_EQ(json.at("tie_word_embeddings"), false);
}

TEST(BenchModelConfigTest, SequenceGrowsPositionsOfBothKinds) {
  absl::StatusOr<BenchModelConfig> decoder =
      BenchModelConfig::FromName("llama-tiny", 300);
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  EXPECT_EQ(decoder->decoder->max_position_embeddings, 300);
  EXPECT_EQ(decoder->ToJson().at("max_position_embeddings"), 300);
  absl::StatusOr<BenchModelConfig> gpt =
      BenchModelConfig::FromName("tiny", 300);
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  EXPECT_FALSE(gpt->is_decoder());
  EXPECT_EQ(gpt->gpt.max_seq_len, 300);
  EXPECT_EQ(gpt->kv_channels(), 64);
}

TEST(BenchModelConfigTest, GptPresetCountsRealVocabulary) {
  absl::StatusOr<BenchModelConfig> config =
      BenchModelConfig::FromName("1.3B", 1024);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->is_decoder());
  EXPECT_EQ(config->vocab_size(), 50257);  // the table has 50304 rows
  EXPECT_EQ(config->kv_channels(), 2048);
  EXPECT_EQ(config->num_layers(), 24);
  EXPECT_EQ(config->ToJson().at("padded_vocab_size"), 50304);
}

TEST(BenchModelConfigTest, UnknownNameListsBothKinds) {
  absl::StatusOr<BenchModelConfig> config =
      BenchModelConfig::FromName("llama-70B", 128);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(config.status().message());
  EXPECT_NE(message.find("'llama-70B'"), std::string::npos) << message;
  EXPECT_NE(message.find("1.3B"), std::string::npos) << message;
  EXPECT_NE(message.find("llama-8B"), std::string::npos) << message;
}

TEST(BenchModelConfigTest, CheckpointingReachesTheChosenConfig) {
  absl::StatusOr<BenchModelConfig> decoder =
      BenchModelConfig::FromName("qwen3-tiny", 64);
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  decoder->set_activation_checkpointing(true);
  EXPECT_TRUE(decoder->decoder->activation_checkpointing);
  absl::StatusOr<BenchModelConfig> gpt = BenchModelConfig::FromName("tiny", 64);
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  gpt->set_activation_checkpointing(true);
  EXPECT_TRUE(gpt->gpt.activation_checkpointing);
}

TEST(BuildModelTest, BuildsTheNamedKindWithoutStorageWhenAsked) {
  for (const char* name : {"tiny", "llama-tiny", "llama-8B"}) {
    SCOPED_TRACE(name);
    absl::StatusOr<BenchModelConfig> config =
        BenchModelConfig::FromName(name, 16);
    ASSERT_TRUE(config.ok()) << config.status();
    // Shapes only: even 8B allocates nothing.
    absl::StatusOr<std::shared_ptr<nn::LossModel>> model =
        BuildModel(*config, Device::Cpu(), DType::kBF16, 1,
                   /*materialize=*/false, Stream());
    ASSERT_TRUE(model.ok()) << model.status();
    int64_t elements = 0;
    for (nn::Parameter* parameter : (*model)->Parameters()) {
      elements += parameter->numel();
      EXPECT_EQ(parameter->state(), nn::ParameterState::kAbsent);
    }
    EXPECT_EQ(elements, config->NumParameters());
    EXPECT_EQ((*model)->dtype(), DType::kBF16);
  }
}

TEST(BuildModelTest, MaterializedTinyDecoderHasWeights) {
  absl::StatusOr<BenchModelConfig> config =
      BenchModelConfig::FromName("llama-tiny", 16);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::shared_ptr<nn::LossModel>> model = BuildModel(
      *config, Device::Cpu(), DType::kF32, 1, /*materialize=*/true, Stream());
  ASSERT_TRUE(model.ok()) << model.status();
  for (nn::Parameter* parameter : (*model)->Parameters()) {
    EXPECT_NE(parameter->state(), nn::ParameterState::kAbsent)
        << parameter->name();
  }
}

}  // namespace
}  // namespace bench
}  // namespace ze
