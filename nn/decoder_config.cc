#include "nn/decoder_config.h"

#include <cmath>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "nlohmann/json.hpp"

namespace ze {
namespace nn {
namespace {

using Json = nlohmann::json;

struct FamilyInfo {
  DecoderFamily family;
  const char *model_type;
  const char *architecture;  // the *ForCausalLM class
  const char *base_model;    // the headless class
};

constexpr FamilyInfo kFamilies[] = {
    {DecoderFamily::kLlama, "llama", "LlamaForCausalLM", "LlamaModel"},
    {DecoderFamily::kMistral, "mistral", "MistralForCausalLM", "MistralModel"},
    {DecoderFamily::kQwen2, "qwen2", "Qwen2ForCausalLM", "Qwen2Model"},
    {DecoderFamily::kQwen3, "qwen3", "Qwen3ForCausalLM", "Qwen3Model"},
};

const FamilyInfo &InfoOf(DecoderFamily family) {
  for (const FamilyInfo &info : kFamilies) {
    if (info.family == family) return info;
  }
  return kFamilies[0];
}

// Keys that only mixture-of-experts variants carry (Mixtral, Qwen2-MoE,
// Qwen3-MoE, DeepSeek, ...). Any of them with a value other than null / 0 /
// empty means a model this decoder cannot be.
constexpr const char *kMoeKeys[] = {
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "n_routed_experts",
    "n_shared_experts",
    "shared_expert_intermediate_size",
    "decoder_sparse_step",
};

// Typed access to config.json's keys; every error names the file and key.
class JsonReader {
 public:
  JsonReader(const Json &root, const std::string &origin)
      : root_(root), origin_(origin) {}

  absl::Status Error(const std::string &key, const std::string &what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(origin_, ": config key \"", key, "\" ", what));
  }

  // The value of `key` in `object` (the root by default), or nullptr when
  // absent or null.
  const Json *Find(const std::string &key, const Json *object = nullptr) const {
    const Json &in = object != nullptr ? *object : root_;
    auto it = in.find(key);
    if (it == in.end() || it->is_null()) return nullptr;
    return &*it;
  }

  // `path` is the key as named in errors ("rope_scaling.factor").
  absl::StatusOr<int64_t> Int(const std::string &key,
                              std::optional<int64_t> fallback,
                              const Json *object = nullptr,
                              const std::string &path = "") const {
    const std::string name = path.empty() ? key : path;
    const Json *value = Find(key, object);
    if (value == nullptr) {
      if (fallback.has_value()) return *fallback;
      return Error(name, "is missing");
    }
    if (value->is_number_integer()) return value->get<int64_t>();
    if (value->is_number_float()) {
      const double d = value->get<double>();
      if (d == std::floor(d) && std::fabs(d) < 9e15) {
        return static_cast<int64_t>(d);
      }
    }
    return Error(name, absl::StrCat("must be an integer, not ", value->dump()));
  }

  absl::StatusOr<double> Number(const std::string &key,
                                std::optional<double> fallback,
                                const Json *object = nullptr,
                                const std::string &path = "") const {
    const std::string name = path.empty() ? key : path;
    const Json *value = Find(key, object);
    if (value == nullptr) {
      if (fallback.has_value()) return *fallback;
      return Error(name, "is missing");
    }
    if (value->is_number()) return value->get<double>();
    return Error(name, absl::StrCat("must be a number, not ", value->dump()));
  }

  absl::StatusOr<bool> Bool(const std::string &key, bool fallback) const {
    const Json *value = Find(key);
    if (value == nullptr) return fallback;
    if (value->is_boolean()) return value->get<bool>();
    return Error(key,
                 absl::StrCat("must be true or false, not ", value->dump()));
  }

  absl::StatusOr<std::string> String(const std::string &key,
                                     const std::string &fallback,
                                     const Json *object = nullptr,
                                     const std::string &path = "") const {
    const std::string name = path.empty() ? key : path;
    const Json *value = Find(key, object);
    if (value == nullptr) return fallback;
    if (value->is_string()) return value->get<std::string>();
    return Error(name, absl::StrCat("must be a string, not ", value->dump()));
  }

 private:
  const Json &root_;
  const std::string &origin_;
};

absl::StatusOr<DecoderFamily> ReadFamily(const JsonReader &reader) {
  if (const Json *architectures = reader.Find("architectures")) {
    if (!architectures->is_array()) {
      return reader.Error("architectures", "must be a list of class names");
    }
    std::vector<std::string> names;
    for (const Json &name : *architectures) {
      if (!name.is_string()) continue;
      names.push_back(name.get<std::string>());
      for (const FamilyInfo &info : kFamilies) {
        if (names.back() == info.architecture ||
            names.back() == info.base_model) {
          return info.family;
        }
      }
    }
    return reader.Error(
        "architectures",
        absl::StrCat("= [", absl::StrJoin(names, ", "),
                     "] names no supported decoder (LlamaForCausalLM, "
                     "MistralForCausalLM, Qwen2ForCausalLM, "
                     "Qwen3ForCausalLM)"));
  }
  std::string model_type;
  ZE_ASSIGN_OR_RETURN(model_type, reader.String("model_type", ""));
  if (model_type.empty()) {
    return reader.Error("architectures",
                        "is missing, and so is model_type: the model family "
                        "is unknown");
  }
  for (const FamilyInfo &info : kFamilies) {
    if (model_type == info.model_type) return info.family;
  }
  return reader.Error("model_type",
                      absl::StrCat("= \"", model_type,
                                   "\" is not a supported decoder (llama, "
                                   "mistral, qwen2, qwen3)"));
}

// Reads RoPE's settings from either spelling into `config`.
absl::Status ReadRope(const JsonReader &reader, DecoderConfig &config) {
  // transformers 5 writes rope_parameters (with rope_theta inside); older
  // files have rope_theta at the top and rope_scaling null or an object.
  const Json *parameters = reader.Find("rope_parameters");
  std::string key = "rope_parameters";
  if (parameters == nullptr) {
    parameters = reader.Find("rope_scaling");
    key = "rope_scaling";
  }
  double theta = 10000;
  ZE_ASSIGN_OR_RETURN(theta, reader.Number("rope_theta", 10000.0));
  config.rope_theta = theta;
  config.rope_scaling = RopeScaling();
  if (parameters == nullptr) return absl::OkStatus();
  if (!parameters->is_object()) {
    return reader.Error(
        key, absl::StrCat("must be an object, not ", parameters->dump()));
  }
  ZE_ASSIGN_OR_RETURN(
      config.rope_theta,
      reader.Number("rope_theta", theta, parameters, key + ".rope_theta"));
  std::string type_key = "rope_type";
  if (reader.Find("rope_type", parameters) == nullptr &&
      reader.Find("type", parameters) != nullptr) {
    type_key = "type";  // the oldest spelling
  }
  std::string type;
  ZE_ASSIGN_OR_RETURN(type, reader.String(type_key, "default", parameters,
                                          absl::StrCat(key, ".", type_key)));
  if (type != "default" && type != "llama3") {
    return reader.Error(absl::StrCat(key, ".", type_key),
                        absl::StrCat("= \"", type,
                                     "\" is not supported (default and "
                                     "llama3 are)"));
  }
  RopeScaling &scaling = config.rope_scaling;
  scaling.type = type;
  if (type == "default") return absl::OkStatus();
  ZE_ASSIGN_OR_RETURN(
      scaling.factor,
      reader.Number("factor", std::nullopt, parameters, key + ".factor"));
  ZE_ASSIGN_OR_RETURN(scaling.low_freq_factor,
                      reader.Number("low_freq_factor", std::nullopt, parameters,
                                    key + ".low_freq_factor"));
  ZE_ASSIGN_OR_RETURN(scaling.high_freq_factor,
                      reader.Number("high_freq_factor", std::nullopt,
                                    parameters, key + ".high_freq_factor"));
  ZE_ASSIGN_OR_RETURN(
      scaling.original_max_position_embeddings,
      reader.Int("original_max_position_embeddings", std::nullopt, parameters,
                 key + ".original_max_position_embeddings"));
  return absl::OkStatus();
}

std::string FormatDouble(double value) {
  // Shortest text that reads back to the same double, as JSON wants it.
  return Json(value).dump();
}

}  // namespace

const char *DecoderFamilyName(DecoderFamily family) {
  return InfoOf(family).model_type;
}

std::vector<float> RopeInverseFrequencies(int64_t head_dim, double theta,
                                          const RopeScaling &scaling) {
  const int64_t half = head_dim / 2;
  std::vector<float> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    // transformers: 1 / theta ** (arange(0, D, 2).float() / D), all f32.
    const float exponent =
        static_cast<float>(2 * i) / static_cast<float>(head_dim);
    const float power = static_cast<float>(
        std::pow(static_cast<double>(static_cast<float>(theta)), exponent));
    inv_freq[i] = 1.0f / power;
  }
  if (scaling.type != "llama3") return inv_freq;
  // Llama 3.1's rule, in f32 like transformers' tensors: a wavelength
  // (2 pi / inv_freq) above original / low_freq_factor is a low frequency,
  // divided by factor; below original / high_freq_factor a high frequency,
  // kept; between, a mix weighted by where original / wavelength lies
  // between the two factors.
  // (torch evaluates `scalar / tensor` as reciprocal(tensor) * scalar, and
  // promotes Python scalars to f32; the order below is its order.)
  const float factor = static_cast<float>(scaling.factor);
  const float low = static_cast<float>(scaling.low_freq_factor);
  const double original =
      static_cast<double>(scaling.original_max_position_embeddings);
  const float low_freq_wavelength =
      static_cast<float>(original / scaling.low_freq_factor);
  const float high_freq_wavelength =
      static_cast<float>(original / scaling.high_freq_factor);
  const float spread =
      static_cast<float>(scaling.high_freq_factor - scaling.low_freq_factor);
  const float two_pi = static_cast<float>(2 * 3.141592653589793);
  for (int64_t i = 0; i < half; ++i) {
    const float wavelength = (1.0f / inv_freq[i]) * two_pi;
    if (wavelength > low_freq_wavelength) {
      inv_freq[i] = inv_freq[i] / factor;
    } else if (wavelength >= high_freq_wavelength) {
      const float smooth =
          ((1.0f / wavelength) * static_cast<float>(original) - low) / spread;
      inv_freq[i] =
          (1.0f - smooth) * inv_freq[i] / factor + smooth * inv_freq[i];
    }
  }
  return inv_freq;
}

absl::Status DecoderConfig::Validate() const {
  auto fail = [](const std::string &message) {
    return absl::InvalidArgumentError(absl::StrCat("DecoderConfig: ", message));
  };
  if (num_layers < 1) return fail(absl::StrCat("num_layers = ", num_layers));
  if (hidden_size < 1) return fail(absl::StrCat("hidden_size = ", hidden_size));
  if (num_heads < 1) return fail(absl::StrCat("num_heads = ", num_heads));
  if (num_kv_heads < 1 || num_heads % num_kv_heads != 0) {
    return fail(
        absl::StrCat("num_kv_heads = ", num_kv_heads,
                     " must be positive and divide num_heads = ", num_heads));
  }
  if (head_dim < 2 || head_dim % 2 != 0) {
    return fail(absl::StrCat("head_dim = ", head_dim,
                             " must be positive and even (rotary embedding "
                             "rotates pairs)"));
  }
  if (intermediate_size < 1) {
    return fail(absl::StrCat("intermediate_size = ", intermediate_size));
  }
  if (vocab_size < 1) return fail(absl::StrCat("vocab_size = ", vocab_size));
  if (max_position_embeddings < 1) {
    return fail(
        absl::StrCat("max_position_embeddings = ", max_position_embeddings));
  }
  if (!(rms_norm_eps > 0)) {
    return fail(
        absl::StrCat("rms_norm_eps = ", rms_norm_eps, " must be positive"));
  }
  if (!(rope_theta > 0)) {
    return fail(absl::StrCat("rope_theta = ", rope_theta, " must be positive"));
  }
  if (rope_scaling.type == "llama3") {
    if (!(rope_scaling.factor > 0)) {
      return fail(absl::StrCat("rope_scaling.factor = ", rope_scaling.factor,
                               " must be positive"));
    }
    if (!(rope_scaling.low_freq_factor > 0) ||
        !(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor)) {
      return fail(absl::StrCat(
          "rope_scaling.low_freq_factor = ", rope_scaling.low_freq_factor,
          " and high_freq_factor = ", rope_scaling.high_freq_factor,
          " must satisfy 0 < low < high"));
    }
    if (rope_scaling.original_max_position_embeddings < 1) {
      return fail(
          absl::StrCat("rope_scaling.original_max_position_embeddings = ",
                       rope_scaling.original_max_position_embeddings));
    }
  } else if (rope_scaling.type != "default") {
    return fail(absl::StrCat("rope_scaling.type = \"", rope_scaling.type,
                             "\" (default and llama3 are supported)"));
  }
  if (qkv_bias != (family == DecoderFamily::kQwen2)) {
    return fail(absl::StrCat("qkv_bias = ", qkv_bias ? "true" : "false",
                             " for family ", DecoderFamilyName(family),
                             " (q/k/v biases are Qwen2's, and Qwen2 always "
                             "has them)"));
  }
  if (qk_norm != (family == DecoderFamily::kQwen3)) {
    return fail(absl::StrCat("qk_norm = ", qk_norm ? "true" : "false",
                             " for family ", DecoderFamilyName(family),
                             " (q/k norms are Qwen3's, and Qwen3 always has "
                             "them)"));
  }
  if (sliding_window < 0 ||
      (sliding_window > 0 && family != DecoderFamily::kMistral)) {
    return fail(absl::StrCat("sliding_window = ", sliding_window,
                             " (only Mistral's is supported; 0 means none)"));
  }
  return absl::OkStatus();
}

std::vector<std::pair<std::string, std::vector<int64_t>>>
DecoderConfig::ParameterShapes() const {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  const int64_t h = hidden_size;
  const int64_t q = static_cast<int64_t>(num_heads) * head_dim;
  const int64_t kv = static_cast<int64_t>(num_kv_heads) * head_dim;
  const int64_t f = intermediate_size;
  shapes.push_back({"embed_tokens.weight", {vocab_size, h}});
  for (int layer = 0; layer < num_layers; ++layer) {
    const std::string prefix = absl::StrCat("layers.", layer, ".");
    shapes.push_back({prefix + "input_norm.weight", {h}});
    shapes.push_back({prefix + "attn.q_proj.weight", {q, h}});
    if (qkv_bias) shapes.push_back({prefix + "attn.q_proj.bias", {q}});
    shapes.push_back({prefix + "attn.k_proj.weight", {kv, h}});
    if (qkv_bias) shapes.push_back({prefix + "attn.k_proj.bias", {kv}});
    shapes.push_back({prefix + "attn.v_proj.weight", {kv, h}});
    if (qkv_bias) shapes.push_back({prefix + "attn.v_proj.bias", {kv}});
    shapes.push_back({prefix + "attn.o_proj.weight", {h, q}});
    if (qk_norm) {
      shapes.push_back({prefix + "attn.q_norm.weight", {head_dim}});
      shapes.push_back({prefix + "attn.k_norm.weight", {head_dim}});
    }
    shapes.push_back({prefix + "post_attn_norm.weight", {h}});
    shapes.push_back({prefix + "mlp.gate_proj.weight", {f, h}});
    shapes.push_back({prefix + "mlp.up_proj.weight", {f, h}});
    shapes.push_back({prefix + "mlp.down_proj.weight", {h, f}});
  }
  shapes.push_back({"norm.weight", {h}});
  if (!tie_word_embeddings)
    shapes.push_back({"lm_head.weight", {vocab_size, h}});
  return shapes;
}

std::vector<int64_t> DecoderConfig::PipelineLayerWeights() const {
  std::vector<int64_t> weights(pipeline_layers(), 0);
  for (const auto &[name, shape] : ParameterShapes()) {
    int64_t count = 1;
    for (int64_t extent : shape) count *= extent;
    int layer = 0;  // embed_tokens
    if (name.rfind("layers.", 0) == 0) {
      layer = 1 + std::stoi(name.substr(7, name.find('.', 7) - 7));
    } else if (name.rfind("norm.", 0) == 0) {
      layer = num_layers + 1;
    } else if (name.rfind("lm_head.", 0) == 0) {
      layer = num_layers + 2;
    }
    weights[layer] += count;
  }
  if (tie_word_embeddings) weights[num_layers + 2] = vocab_size * hidden_size;
  return weights;
}

int64_t DecoderConfig::NumParameters() const {
  // Closed form (what ParameterShapes lists, summed; the test checks both).
  const int64_t h = hidden_size;
  const int64_t q = static_cast<int64_t>(num_heads) * head_dim;
  const int64_t kv = static_cast<int64_t>(num_kv_heads) * head_dim;
  const int64_t f = intermediate_size;
  const int64_t per_layer = 2 * h                       // the two norms
                            + (q + 2 * kv) * h + q * h  // q/k/v, o
                            + (qkv_bias ? q + 2 * kv : 0) +
                            (qk_norm ? 2 * head_dim : 0) + 3 * f * h;
  return vocab_size * h * (tie_word_embeddings ? 1 : 2) +
         num_layers * per_layer + h;
}

absl::StatusOr<DecoderConfig> DecoderConfig::FromHuggingFaceJson(
    const std::string &json_text, const std::string &origin) {
  Json root = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": not valid JSON"));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": not a JSON object"));
  }
  const JsonReader reader(root, origin);
  DecoderConfig config;
  ZE_ASSIGN_OR_RETURN(config.family, ReadFamily(reader));
  const DecoderFamily family = config.family;
  const char *family_name = DecoderFamilyName(family);

  for (const char *key : kMoeKeys) {
    const Json *value = reader.Find(key);
    if (value == nullptr) continue;
    const bool empty = (value->is_number() && value->get<double>() == 0) ||
                       (value->is_array() && value->empty());
    if (!empty) {
      return reader.Error(key, absl::StrCat("= ", value->dump(),
                                            ": mixture-of-experts models are "
                                            "not supported"));
    }
  }

  int64_t value = 0;
  ZE_ASSIGN_OR_RETURN(value, reader.Int("num_hidden_layers", std::nullopt));
  config.num_layers = static_cast<int>(value);
  ZE_ASSIGN_OR_RETURN(config.hidden_size,
                      reader.Int("hidden_size", std::nullopt));
  ZE_ASSIGN_OR_RETURN(value, reader.Int("num_attention_heads", std::nullopt));
  config.num_heads = static_cast<int>(value);
  ZE_ASSIGN_OR_RETURN(value,
                      reader.Int("num_key_value_heads", config.num_heads));
  config.num_kv_heads = static_cast<int>(value);
  if (config.num_heads < 1) {
    return reader.Error(
        "num_attention_heads",
        absl::StrCat("= ", config.num_heads, " must be positive"));
  }
  if (config.num_kv_heads < 1 || config.num_heads % config.num_kv_heads != 0) {
    return reader.Error("num_key_value_heads",
                        absl::StrCat("= ", config.num_kv_heads,
                                     " must be positive and divide "
                                     "num_attention_heads = ",
                                     config.num_heads));
  }
  const bool head_dim_given = reader.Find("head_dim") != nullptr;
  if (!head_dim_given && config.hidden_size % config.num_heads != 0) {
    return reader.Error(
        "head_dim",
        absl::StrCat("is missing and hidden_size = ", config.hidden_size,
                     " is not a multiple of "
                     "num_attention_heads = ",
                     config.num_heads));
  }
  ZE_ASSIGN_OR_RETURN(
      config.head_dim,
      reader.Int("head_dim", config.hidden_size / config.num_heads));
  ZE_ASSIGN_OR_RETURN(config.intermediate_size,
                      reader.Int("intermediate_size", std::nullopt));
  ZE_ASSIGN_OR_RETURN(config.vocab_size,
                      reader.Int("vocab_size", std::nullopt));
  ZE_ASSIGN_OR_RETURN(config.max_position_embeddings,
                      reader.Int("max_position_embeddings", std::nullopt));
  ZE_ASSIGN_OR_RETURN(config.rms_norm_eps, reader.Number("rms_norm_eps", 1e-6));
  ZE_ASSIGN_OR_RETURN(config.tie_word_embeddings,
                      reader.Bool("tie_word_embeddings", false));
  ZE_RETURN_IF_ERROR(ReadRope(reader, config));

  double rotary_fraction = 1;
  ZE_ASSIGN_OR_RETURN(rotary_fraction,
                      reader.Number("partial_rotary_factor", 1.0));
  if (rotary_fraction != 1) {
    return reader.Error("partial_rotary_factor",
                        absl::StrCat("= ", rotary_fraction,
                                     " is not supported (RoPE rotates every "
                                     "dimension)"));
  }
  std::string activation;
  ZE_ASSIGN_OR_RETURN(activation, reader.String("hidden_act", "silu"));
  if (activation != "silu") {
    return reader.Error("hidden_act",
                        absl::StrCat("= \"", activation,
                                     "\" is not supported (the MLP is "
                                     "SwiGLU: silu)"));
  }
  bool flag = false;
  ZE_ASSIGN_OR_RETURN(flag, reader.Bool("mlp_bias", false));
  if (flag) {
    return reader.Error("mlp_bias", "= true is not supported (no MLP biases)");
  }
  ZE_ASSIGN_OR_RETURN(flag, reader.Bool("attention_bias", false));
  // Qwen2's q/k/v biases are built in (its config has no such key); for the
  // others attention_bias would put biases on all four projections, o_proj
  // included.
  if (flag && family != DecoderFamily::kQwen2) {
    return reader.Error(
        "attention_bias",
        absl::StrCat("= true is not supported for ", family_name,
                     " (it would give o_proj a bias)"));
  }
  double dropout = 0;
  ZE_ASSIGN_OR_RETURN(dropout, reader.Number("attention_dropout", 0.0));
  if (dropout != 0) {
    return reader.Error(
        "attention_dropout",
        absl::StrCat("= ", dropout, " is not supported (no dropout)"));
  }

  config.qkv_bias = family == DecoderFamily::kQwen2;
  config.qk_norm = family == DecoderFamily::kQwen3;
  int64_t window = 0;
  ZE_ASSIGN_OR_RETURN(window, reader.Int("sliding_window", 0));
  if (family == DecoderFamily::kMistral) {
    if (window < 0) {
      return reader.Error("sliding_window",
                          absl::StrCat("= ", window, " must not be negative"));
    }
    config.sliding_window = window;
  } else if (family == DecoderFamily::kQwen2 ||
             family == DecoderFamily::kQwen3) {
    // Qwen's sliding window applies only with use_sliding_window (to the
    // layers from max_window_layers on); a window at least as long as every
    // sequence is plain causal attention.
    bool use_window = false;
    ZE_ASSIGN_OR_RETURN(use_window, reader.Bool("use_sliding_window", false));
    if (use_window && window > 0 && window < config.max_position_embeddings) {
      return reader.Error(
          "use_sliding_window",
          absl::StrCat("= true with sliding_window = ", window,
                       " below max_position_embeddings = ",
                       config.max_position_embeddings,
                       " is not supported (no sliding-window attention)"));
    }
  }
  if (const Json *types = reader.Find("layer_types")) {
    if (!types->is_array()) {
      return reader.Error("layer_types", "must be a list");
    }
    for (const Json &type : *types) {
      if (type == "full_attention") continue;
      // Mistral's window is enforced at run time; elsewhere a window no
      // sequence can exceed is plain causal attention.
      if (type == "sliding_attention" &&
          (family == DecoderFamily::kMistral || window == 0 ||
           window >= config.max_position_embeddings)) {
        continue;
      }
      return reader.Error("layer_types",
                          absl::StrCat("contains ", type.dump(),
                                       ": only full_attention layers are "
                                       "supported (no sliding-window "
                                       "attention)"));
    }
  }

  if (absl::Status status = config.Validate(); !status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": ", status.message()));
  }
  return config;
}

std::string DecoderConfig::ToHuggingFaceJson() const {
  const FamilyInfo &info = InfoOf(family);
  // Written by hand, not through Json's object (which sorts keys), so the
  // file reads in the usual order.
  std::vector<std::string> lines;
  auto add = [&lines](const std::string &key, const std::string &value) {
    lines.push_back(absl::StrCat("  \"", key, "\": ", value));
  };
  auto quote = [](const std::string &text) { return Json(text).dump(); };
  add("architectures", absl::StrCat("[", quote(info.architecture), "]"));
  add("model_type", quote(info.model_type));
  add("hidden_size", absl::StrCat(hidden_size));
  add("intermediate_size", absl::StrCat(intermediate_size));
  add("num_hidden_layers", absl::StrCat(num_layers));
  add("num_attention_heads", absl::StrCat(num_heads));
  add("num_key_value_heads", absl::StrCat(num_kv_heads));
  add("head_dim", absl::StrCat(head_dim));
  add("vocab_size", absl::StrCat(vocab_size));
  add("max_position_embeddings", absl::StrCat(max_position_embeddings));
  add("rms_norm_eps", FormatDouble(rms_norm_eps));
  add("rope_theta", FormatDouble(rope_theta));
  if (rope_scaling.type == "default") {
    add("rope_scaling", "null");
  } else {
    add("rope_scaling",
        absl::StrCat("{\"rope_type\": ", quote(rope_scaling.type),
                     ", \"factor\": ", FormatDouble(rope_scaling.factor),
                     ", \"low_freq_factor\": ",
                     FormatDouble(rope_scaling.low_freq_factor),
                     ", \"high_freq_factor\": ",
                     FormatDouble(rope_scaling.high_freq_factor),
                     ", \"original_max_position_embeddings\": ",
                     rope_scaling.original_max_position_embeddings, "}"));
  }
  add("tie_word_embeddings", tie_word_embeddings ? "true" : "false");
  add("hidden_act", quote("silu"));
  add("attention_dropout", "0.0");
  switch (family) {
    case DecoderFamily::kLlama:
      add("attention_bias", "false");
      add("mlp_bias", "false");
      break;
    case DecoderFamily::kMistral:
      add("sliding_window",
          sliding_window > 0 ? absl::StrCat(sliding_window) : "null");
      break;
    case DecoderFamily::kQwen2:
      add("use_sliding_window", "false");
      add("sliding_window", "null");
      break;
    case DecoderFamily::kQwen3:
      add("attention_bias", "false");
      add("use_sliding_window", "false");
      add("sliding_window", "null");
      break;
  }
  add("torch_dtype", quote("float32"));
  return absl::StrCat("{\n", absl::StrJoin(lines, ",\n"), "\n}\n");
}

namespace {

DecoderConfig Tiny(DecoderFamily family) {
  DecoderConfig config;  // the defaults are the tiny shape
  config.family = family;
  config.qkv_bias = family == DecoderFamily::kQwen2;
  config.qk_norm = family == DecoderFamily::kQwen3;
  if (family == DecoderFamily::kMistral) config.sliding_window = 64;
  if (family == DecoderFamily::kQwen3) config.head_dim = 32;  // != 64 / 4
  config.tie_word_embeddings =
      family == DecoderFamily::kLlama || family == DecoderFamily::kQwen3;
  return config;
}

DecoderConfig Llama3(int layers, int64_t hidden, int heads, int64_t ffn,
                     bool tied, double rope_factor) {
  DecoderConfig config;
  config.family = DecoderFamily::kLlama;
  config.num_layers = layers;
  config.hidden_size = hidden;
  config.num_heads = heads;
  config.num_kv_heads = 8;
  config.head_dim = hidden / heads;
  config.intermediate_size = ffn;
  config.vocab_size = 128256;
  config.max_position_embeddings = 131072;
  config.rms_norm_eps = 1e-5;
  config.rope_theta = 500000;
  config.rope_scaling.type = "llama3";
  config.rope_scaling.factor = rope_factor;
  config.rope_scaling.low_freq_factor = 1;
  config.rope_scaling.high_freq_factor = 4;
  config.rope_scaling.original_max_position_embeddings = 8192;
  config.tie_word_embeddings = tied;
  return config;
}

struct NamedPreset {
  const char *name;
  DecoderConfig (*make)();
};

constexpr NamedPreset kPresets[] = {
    {"llama-tiny", [] { return Tiny(DecoderFamily::kLlama); }},
    {"mistral-tiny", [] { return Tiny(DecoderFamily::kMistral); }},
    {"qwen2-tiny", [] { return Tiny(DecoderFamily::kQwen2); }},
    {"qwen3-tiny", [] { return Tiny(DecoderFamily::kQwen3); }},
    // Llama 3.2 1B and 3B, Llama 3.1 8B (their config.json's shapes).
    {"llama-1B", [] { return Llama3(16, 2048, 32, 8192, true, 32); }},
    {"llama-3B", [] { return Llama3(28, 3072, 24, 8192, true, 32); }},
    {"llama-8B", [] { return Llama3(32, 4096, 32, 14336, false, 8); }},
};

}  // namespace

absl::StatusOr<DecoderConfig> DecoderConfig::Preset(const std::string &name) {
  for (const NamedPreset &preset : kPresets) {
    if (name == preset.name) return preset.make();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown decoder preset '", name,
                   "'; known: ", absl::StrJoin(PresetNames(), ", ")));
}

std::vector<std::string> DecoderConfig::PresetNames() {
  std::vector<std::string> names;
  for (const NamedPreset &preset : kPresets) names.push_back(preset.name);
  return names;
}

bool DecoderConfig::operator==(const DecoderConfig &other) const {
  const RopeScaling &a = rope_scaling;
  const RopeScaling &b = other.rope_scaling;
  return family == other.family && num_layers == other.num_layers &&
         hidden_size == other.hidden_size && num_heads == other.num_heads &&
         num_kv_heads == other.num_kv_heads && head_dim == other.head_dim &&
         intermediate_size == other.intermediate_size &&
         vocab_size == other.vocab_size &&
         max_position_embeddings == other.max_position_embeddings &&
         rms_norm_eps == other.rms_norm_eps && rope_theta == other.rope_theta &&
         a.type == b.type && a.factor == b.factor &&
         a.low_freq_factor == b.low_freq_factor &&
         a.high_freq_factor == b.high_freq_factor &&
         a.original_max_position_embeddings ==
             b.original_max_position_embeddings &&
         tie_word_embeddings == other.tie_word_embeddings &&
         qkv_bias == other.qkv_bias && qk_norm == other.qk_norm &&
         sliding_window == other.sliding_window &&
         activation_checkpointing == other.activation_checkpointing &&
         recompute_activations == other.recompute_activations &&
         head_weight_gradient_in_backward ==
             other.head_weight_gradient_in_backward;
}

}  // namespace nn
}  // namespace ze
