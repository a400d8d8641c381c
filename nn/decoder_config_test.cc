#include "nn/decoder_config.h"

#include <string>

#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ze {
namespace nn {
namespace {

using ::testing::HasSubstr;

// Llama 3.2 1B's config.json as transformers 4 writes it (legacy rope
// spelling: top-level rope_theta, rope_scaling with rope_type).
constexpr char kLlama32Legacy[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// The same model as transformers 5 writes it (rope_parameters).
constexpr char kLlama32V5[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "hidden_size": 2048,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_parameters": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rope_type": "llama3"
  },
  "tie_word_embeddings": true,
  "vocab_size": 128256
})";

// Qwen3-0.6B's shape: head_dim 128 with hidden 1024 / 16 heads = 64.
constexpr char kQwen3[] = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

constexpr char kQwen2[] = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "hidden_size": 896,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 21,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

constexpr char kMistral[] = R"({
  "architectures": ["MistralForCausalLM"],
  "hidden_size": 4096,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": false,
  "vocab_size": 32000
})";

absl::StatusOr<DecoderConfig> Parse(const std::string &json) {
  return DecoderConfig::FromHuggingFaceJson(json, "/models/x/config.json");
}

// `json` with `from` replaced by `to` (which must occur).
std::string Edit(const std::string &json, const std::string &from,
                 const std::string &to) {
  EXPECT_NE(json.find(from), std::string::npos) << from;
  return absl::StrReplaceAll(json, {{from, to}});
}

void ExpectRefused(const std::string &json, const std::string &key) {
  absl::StatusOr<DecoderConfig> config = Parse(json);
  ASSERT_FALSE(config.ok()) << "accepted; expected a refusal naming " << key;
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("/models/x/config.json"));
  EXPECT_THAT(config.status().message(), HasSubstr(key));
}

TEST(DecoderConfigTest, ReadsLlama32InBothRopeSpellings) {
  for (const char *json : {kLlama32Legacy, kLlama32V5}) {
    absl::StatusOr<DecoderConfig> config = Parse(json);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->family, DecoderFamily::kLlama);
    EXPECT_EQ(config->num_layers, 16);
    EXPECT_EQ(config->hidden_size, 2048);
    EXPECT_EQ(config->num_heads, 32);
    EXPECT_EQ(config->num_kv_heads, 8);
    EXPECT_EQ(config->head_dim, 64);
    EXPECT_EQ(config->intermediate_size, 8192);
    EXPECT_EQ(config->vocab_size, 128256);
    EXPECT_EQ(config->max_position_embeddings, 131072);
    EXPECT_DOUBLE_EQ(config->rms_norm_eps, 1e-5);
    EXPECT_DOUBLE_EQ(config->rope_theta, 500000);
    EXPECT_EQ(config->rope_scaling.type, "llama3");
    EXPECT_DOUBLE_EQ(config->rope_scaling.factor, 32);
    EXPECT_DOUBLE_EQ(config->rope_scaling.low_freq_factor, 1);
    EXPECT_DOUBLE_EQ(config->rope_scaling.high_freq_factor, 4);
    EXPECT_EQ(config->rope_scaling.original_max_position_embeddings, 8192);
    EXPECT_TRUE(config->tie_word_embeddings);
    EXPECT_FALSE(config->qkv_bias);
    EXPECT_FALSE(config->qk_norm);
    EXPECT_EQ(config->sliding_window, 0);
    // It is exactly the llama-1B preset.
    EXPECT_EQ(*config, *DecoderConfig::Preset("llama-1B"));
  }
}

TEST(DecoderConfigTest, OldestRopeSpellingAndDefaults) {
  // rope_scaling {"type": ...}; no head_dim, num_key_value_heads,
  // rms_norm_eps, rope_theta or tie_word_embeddings.
  const std::string json = R"({"model_type": "llama", "hidden_size": 64,
    "intermediate_size": 96, "num_attention_heads": 4,
    "num_hidden_layers": 1, "vocab_size": 10, "max_position_embeddings": 32,
    "rope_scaling": {"type": "llama3", "factor": 8, "low_freq_factor": 1,
                     "high_freq_factor": 4,
                     "original_max_position_embeddings": 16}})";
  absl::StatusOr<DecoderConfig> config = Parse(json);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->family, DecoderFamily::kLlama);  // from model_type
  EXPECT_EQ(config->head_dim, 16);
  EXPECT_EQ(config->num_kv_heads, 4);
  EXPECT_DOUBLE_EQ(config->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(config->rope_theta, 10000);
  EXPECT_FALSE(config->tie_word_embeddings);
  EXPECT_EQ(config->rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(config->rope_scaling.factor, 8);
  EXPECT_EQ(config->rope_scaling.original_max_position_embeddings, 16);
}

TEST(DecoderConfigTest, ReadsQwen3HeadDimAndNorms) {
  absl::StatusOr<DecoderConfig> config = Parse(kQwen3);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->family, DecoderFamily::kQwen3);
  EXPECT_EQ(config->head_dim, 128);  // not 1024 / 16
  EXPECT_TRUE(config->qk_norm);
  EXPECT_FALSE(config->qkv_bias);
  EXPECT_EQ(config->rope_scaling.type, "default");
  EXPECT_DOUBLE_EQ(config->rope_theta, 1e6);
  // q_proj is (Hq * D, H) = (2048, 1024); o_proj (1024, 2048).
  for (const auto &[name, shape] : config->ParameterShapes()) {
    if (name == "layers.0.attn.q_proj.weight") {
      EXPECT_EQ(shape, (std::vector<int64_t>{2048, 1024}));
    }
    if (name == "layers.0.attn.o_proj.weight") {
      EXPECT_EQ(shape, (std::vector<int64_t>{1024, 2048}));
    }
    if (name == "layers.0.attn.q_norm.weight") {
      EXPECT_EQ(shape, (std::vector<int64_t>{128}));
    }
  }
}

TEST(DecoderConfigTest, ReadsQwen2BiasesAndMistralWindow) {
  absl::StatusOr<DecoderConfig> qwen2 = Parse(kQwen2);
  ASSERT_TRUE(qwen2.ok()) << qwen2.status();
  EXPECT_EQ(qwen2->family, DecoderFamily::kQwen2);
  EXPECT_TRUE(qwen2->qkv_bias);
  EXPECT_EQ(qwen2->sliding_window, 0);  // use_sliding_window false
  EXPECT_EQ(qwen2->head_dim, 64);

  absl::StatusOr<DecoderConfig> mistral = Parse(kMistral);
  ASSERT_TRUE(mistral.ok()) << mistral.status();
  EXPECT_EQ(mistral->family, DecoderFamily::kMistral);
  EXPECT_EQ(mistral->sliding_window, 4096);
  EXPECT_FALSE(mistral->qkv_bias);
  absl::StatusOr<DecoderConfig> no_window = Parse(
      Edit(kMistral, "\"sliding_window\": 4096", "\"sliding_window\": null"));
  ASSERT_TRUE(no_window.ok()) << no_window.status();
  EXPECT_EQ(no_window->sliding_window, 0);
}

TEST(DecoderConfigTest, RefusalsNameTheKey) {
  ExpectRefused(Edit(kLlama32Legacy, "\"rope_type\": \"llama3\"",
                     "\"rope_type\": \"yarn\""),
                "rope_scaling.rope_type");
  ExpectRefused(Edit(kLlama32V5, "\"rope_type\": \"llama3\"",
                     "\"rope_type\": \"dynamic\""),
                "rope_parameters.rope_type");
  ExpectRefused(Edit(kLlama32Legacy, "\"factor\": 32.0,", ""),
                "rope_scaling.factor");
  ExpectRefused(Edit(kLlama32Legacy, "\"attention_bias\": false",
                     "\"attention_bias\": true"),
                "attention_bias");
  ExpectRefused(
      Edit(kQwen3, "\"attention_bias\": false", "\"attention_bias\": true"),
      "attention_bias");
  ExpectRefused(
      Edit(kLlama32Legacy, "\"mlp_bias\": false", "\"mlp_bias\": true"),
      "mlp_bias");
  ExpectRefused(Edit(kLlama32Legacy, "\"hidden_act\": \"silu\"",
                     "\"hidden_act\": \"gelu\""),
                "hidden_act");
  ExpectRefused(Edit(kLlama32Legacy, "\"attention_dropout\": 0.0",
                     "\"attention_dropout\": 0.1"),
                "attention_dropout");
  ExpectRefused(Edit(kMistral, "\"sliding_window\": 4096",
                     "\"sliding_window\": 4096, \"num_local_experts\": 8"),
                "num_local_experts");
  ExpectRefused(Edit(kQwen2, "\"max_window_layers\": 21",
                     "\"max_window_layers\": 21, \"num_experts\": 60"),
                "num_experts");
  ExpectRefused(Edit(Edit(kQwen2, "\"use_sliding_window\": false",
                          "\"use_sliding_window\": true"),
                     "\"sliding_window\": 32768", "\"sliding_window\": 4096"),
                "use_sliding_window");
  ExpectRefused(Edit(Edit(kQwen3, "\"use_sliding_window\": false",
                          "\"use_sliding_window\": false, \"layer_types\": "
                          "[\"sliding_attention\"]"),
                     "\"sliding_window\": null", "\"sliding_window\": 4096"),
                "layer_types");
  ExpectRefused(
      Edit(kLlama32Legacy, "\"LlamaForCausalLM\"", "\"GPT2LMHeadModel\""),
      "architectures");
  ExpectRefused(Edit(kLlama32Legacy, "\"num_key_value_heads\": 8",
                     "\"num_key_value_heads\": 5"),
                "num_key_value_heads");
  ExpectRefused(Edit(kLlama32Legacy, "\"hidden_size\": 2048,", ""),
                "hidden_size");
  ExpectRefused(
      Edit(kLlama32Legacy, "\"vocab_size\": 128256", "\"vocab_size\": \"big\""),
      "vocab_size");
  ExpectRefused(Edit(kLlama32Legacy, "\"tie_word_embeddings\": true",
                     "\"tie_word_embeddings\": 1"),
                "tie_word_embeddings");
  absl::StatusOr<DecoderConfig> bad = Parse("{not json");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("/models/x/config.json"));
}

TEST(DecoderConfigTest, AcceptsHarmlessValues) {
  // A Qwen2 window as long as the positions is plain causal attention; an
  // MoE key of 0 is a dense model.
  EXPECT_TRUE(Parse(Edit(kQwen2, "\"use_sliding_window\": false",
                         "\"use_sliding_window\": true"))
                  .ok());
  EXPECT_TRUE(Parse(Edit(kQwen2, "\"max_window_layers\": 21",
                         "\"max_window_layers\": 21, \"num_experts\": 0"))
                  .ok());
}

TEST(DecoderConfigTest, ToHuggingFaceJsonRoundTrips) {
  for (const std::string &name : DecoderConfig::PresetNames()) {
    absl::StatusOr<DecoderConfig> config = DecoderConfig::Preset(name);
    ASSERT_TRUE(config.ok()) << config.status();
    ASSERT_TRUE(config->Validate().ok()) << name << ": " << config->Validate();
    const std::string json = config->ToHuggingFaceJson();
    absl::StatusOr<DecoderConfig> back = Parse(json);
    ASSERT_TRUE(back.ok()) << name << ": " << back.status() << "\n" << json;
    EXPECT_EQ(*back, *config) << name << "\n" << json;
  }
  // Values that need every digit survive.
  DecoderConfig config = *DecoderConfig::Preset("llama-tiny");
  config.rms_norm_eps = 1.0 / 3;
  config.rope_theta = 12345.678901234567;
  EXPECT_EQ(*Parse(config.ToHuggingFaceJson()), config);
}

TEST(DecoderConfigTest, Presets) {
  DecoderConfig one = *DecoderConfig::Preset("llama-1B");
  EXPECT_EQ(one.num_layers, 16);
  EXPECT_EQ(one.hidden_size, 2048);
  EXPECT_EQ(one.num_heads, 32);
  EXPECT_EQ(one.num_kv_heads, 8);
  EXPECT_EQ(one.head_dim, 64);
  EXPECT_EQ(one.intermediate_size, 8192);
  EXPECT_EQ(one.vocab_size, 128256);
  EXPECT_TRUE(one.tie_word_embeddings);
  EXPECT_EQ(one.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(one.rope_scaling.factor, 32);
  EXPECT_DOUBLE_EQ(one.rope_theta, 500000);
  // Llama 3.2 1B has 1,235,814,400 parameters.
  EXPECT_EQ(one.NumParameters(), 1235814400);

  DecoderConfig eight = *DecoderConfig::Preset("llama-8B");
  EXPECT_EQ(eight.num_layers, 32);
  EXPECT_EQ(eight.hidden_size, 4096);
  EXPECT_EQ(eight.num_heads, 32);
  EXPECT_EQ(eight.num_kv_heads, 8);
  EXPECT_EQ(eight.head_dim, 128);
  EXPECT_EQ(eight.intermediate_size, 14336);
  EXPECT_EQ(eight.vocab_size, 128256);
  EXPECT_FALSE(eight.tie_word_embeddings);
  EXPECT_EQ(eight.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(eight.rope_scaling.factor, 8);
  EXPECT_DOUBLE_EQ(eight.rope_theta, 500000);
  // Llama 3.1 8B has 8,030,261,248 parameters.
  EXPECT_EQ(eight.NumParameters(), 8030261248);

  absl::StatusOr<DecoderConfig> unknown = DecoderConfig::Preset("llama-70B");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.status().message(), HasSubstr("llama-tiny"));
}

TEST(DecoderConfigTest, NumParametersIsTheSumOfTheShapes) {
  for (const std::string &name : DecoderConfig::PresetNames()) {
    for (bool tied : {false, true}) {
      DecoderConfig config = *DecoderConfig::Preset(name);
      config.tie_word_embeddings = tied;
      int64_t sum = 0;
      bool has_head = false;
      for (const auto &[param, shape] : config.ParameterShapes()) {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        sum += n;
        has_head |= param == "lm_head.weight";
      }
      EXPECT_EQ(config.NumParameters(), sum) << name << " tied=" << tied;
      EXPECT_EQ(has_head, !tied) << name;
    }
  }
}

TEST(DecoderConfigTest, ValidateNamesTheField) {
  DecoderConfig config = *DecoderConfig::Preset("llama-tiny");
  config.num_kv_heads = 3;
  EXPECT_THAT(config.Validate().message(), HasSubstr("num_kv_heads"));
  config = *DecoderConfig::Preset("llama-tiny");
  config.head_dim = 15;
  EXPECT_THAT(config.Validate().message(), HasSubstr("head_dim"));
  config = *DecoderConfig::Preset("llama-tiny");
  config.qkv_bias = true;
  EXPECT_THAT(config.Validate().message(), HasSubstr("qkv_bias"));
  config = *DecoderConfig::Preset("qwen3-tiny");
  config.qk_norm = false;
  EXPECT_THAT(config.Validate().message(), HasSubstr("qk_norm"));
  config = *DecoderConfig::Preset("llama-tiny");
  config.sliding_window = 16;
  EXPECT_THAT(config.Validate().message(), HasSubstr("sliding_window"));
  config = *DecoderConfig::Preset("llama-tiny");
  config.rope_scaling.type = "linear";
  EXPECT_THAT(config.Validate().message(), HasSubstr("rope_scaling"));
}

}  // namespace
}  // namespace nn
}  // namespace ze
