// DecoderConfig: the shape of a Llama-family decoder (Llama, Mistral, Qwen2,
// Qwen3), read from and written to Hugging Face's config.json.
//
// One class of model covers the four families: pre-norm blocks of RMSNorm,
// grouped-query attention with rotary position embedding, and a SwiGLU MLP.
// They differ only in what the config records here:
//   Llama    no biases; rope_scaling "llama3" possible (Llama 3.1+).
//   Mistral  like Llama, with an optional sliding window: recorded and
//            enforced at run time (a sequence longer than it is refused,
//            since within the window the attention is plain causal).
//   Qwen2    biases on q/k/v (never on o_proj).
//   Qwen3    per-head RMSNorm of q and k (weight (D)) before RoPE; head_dim
//            independent of hidden_size / num_heads.
//
// Parameter names (stable; checkpoints, ZeRO and the HF name table use them),
// with Hq = num_heads, Hkv = num_kv_heads, D = head_dim, H = hidden_size,
// F = intermediate_size, V = vocab_size:
//   embed_tokens.weight (V, H)
//   layers.N.input_norm.weight (H)
//   layers.N.attn.q_proj.weight (Hq*D, H)   .bias (Hq*D)   [Qwen2]
//   layers.N.attn.k_proj.weight (Hkv*D, H)  .bias (Hkv*D)  [Qwen2]
//   layers.N.attn.v_proj.weight (Hkv*D, H)  .bias (Hkv*D)  [Qwen2]
//   layers.N.attn.o_proj.weight (H, Hq*D)
//   layers.N.attn.q_norm.weight (D)  layers.N.attn.k_norm.weight (D)  [Qwen3]
//   layers.N.post_attn_norm.weight (H)
//   layers.N.mlp.gate_proj.weight (F, H)  .up_proj.weight (F, H)
//   layers.N.mlp.down_proj.weight (H, F)
//   norm.weight (H)
//   lm_head.weight (V, H)  [untied only; tied, the head reads embed_tokens]
// Linear weights are (out, in) like Hugging Face's, so import and export
// copy bytes.
#ifndef ZE_NN_DECODER_CONFIG_H_
#define ZE_NN_DECODER_CONFIG_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ze {
namespace nn {

enum class DecoderFamily { kLlama, kMistral, kQwen2, kQwen3 };

// "llama", "mistral", "qwen2", "qwen3" (Hugging Face's model_type).
const char *DecoderFamilyName(DecoderFamily family);

// How RoPE's inverse frequencies are derived from rope_theta.
//   "default": inv_freq[i] = theta^(-2i/D).
//   "llama3":  Llama 3.1's rule: wavelengths longer than
//              original_max_position_embeddings / low_freq_factor are divided
//              by `factor`, those shorter than
//              original_max_position_embeddings / high_freq_factor are kept,
//              and those between are interpolated smoothly.
// Other Hugging Face rope types (linear, dynamic, yarn, longrope) are refused
// when a config is read.
struct RopeScaling {
  std::string type = "default";
  double factor = 1;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  int64_t original_max_position_embeddings = 8192;
};

// RoPE's inverse frequencies, inv_freq (head_dim / 2), as transformers
// computes them in f32: theta^(-2i / head_dim), then, for "llama3", its
// rescaling (long wavelengths divided by factor, short ones kept, a smooth
// interpolation between). head_dim even and positive, theta positive.
std::vector<float> RopeInverseFrequencies(int64_t head_dim, double theta,
                                          const RopeScaling &scaling);

struct DecoderConfig {
  DecoderFamily family = DecoderFamily::kLlama;
  int num_layers = 2;
  int64_t hidden_size = 64;         // H
  int num_heads = 4;                // Hq
  int num_kv_heads = 2;             // Hkv, divides Hq
  int64_t head_dim = 16;            // D, even (rotate-half RoPE)
  int64_t intermediate_size = 128;  // F
  int64_t vocab_size = 256;         // V
  int64_t max_position_embeddings = 128;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  // Biases on q/k/v: true exactly for Qwen2.
  bool qkv_bias = false;
  // Per-head RMSNorm of q and k before RoPE: true exactly for Qwen3.
  bool qk_norm = false;
  // Mistral only: attention sees at most this many previous positions. 0
  // means none. Sequences longer than it are refused at run time (within it
  // the attention is plain causal, which is all the kernels implement).
  int64_t sliding_window = 0;
  // Checkpoint every block (see Module::set_activation_checkpointing). Not a
  // Hugging Face key: neither read nor written by the JSON functions.
  bool activation_checkpointing = false;
  // Recompute every MLP's SiLU(gate) * up in backward instead of keeping it
  // (Module::set_recompute_activation): intermediate_size fewer saved
  // elements per token and layer, bit for bit the same training. Not a
  // Hugging Face key either.
  bool recompute_activations = false;
  // Where the head forms its weight gradient in a loss-mode forward
  // (OutputHead::WeightGradient, set on the head at construction): false,
  // in the forward, a (vocab_size, hidden_size) f32 sum held until the
  // backward; true, in the backward, a vocabulary slice at a time (no such
  // sum, one more logits product). Not a Hugging Face key either.
  bool head_weight_gradient_in_backward = false;

  // InvalidArgument naming the field when a value is out of range or
  // inconsistent with the family (qkv_bias iff Qwen2, qk_norm iff Qwen3,
  // sliding_window only for Mistral).
  absl::Status Validate() const;
  // Number of parameter elements (a tied head counts once): the sum of the
  // element counts of ParameterShapes().
  int64_t NumParameters() const;
  // Every parameter with its shape, in the model's order (the order of
  // Module::Parameters()): embed_tokens, layers.0.* ... layers.{L-1}.*,
  // norm, then lm_head when untied. Names as in the file comment.
  std::vector<std::pair<std::string, std::vector<int64_t>>> ParameterShapes()
      const;
  // The pipeline layer sequence (nn/pipeline_stage.h): 0 embed_tokens,
  // 1 .. num_layers the blocks, num_layers + 1 the final norm,
  // num_layers + 2 the head.
  int pipeline_layers() const { return num_layers + 3; }
  // Each pipeline layer's parameter count (ParameterShapes() grouped by
  // layer); a tied head counts the table it multiplies by.
  std::vector<int64_t> PipelineLayerWeights() const;

  // Reads a Hugging Face config.json. The family comes from `architectures`
  // (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
  // Qwen3ForCausalLM, or their *Model bases), else from `model_type`.
  // Accepts both rope spellings: transformers 5's `rope_parameters`
  // {rope_type, rope_theta, factor, ...} and the older top-level
  // `rope_theta` with `rope_scaling` {rope_type or type, factor, ...}.
  // head_dim defaults to hidden_size / num_attention_heads,
  // num_key_value_heads to num_attention_heads, rms_norm_eps to 1e-6,
  // rope_theta to 10000, tie_word_embeddings to false.
  // InvalidArgument starting with `origin` (the file's path) and naming the
  // key for: malformed JSON; a missing or mistyped key; an unknown family;
  // a mixture-of-experts key (num_experts, num_local_experts, ...); a
  // rope_type other than default or llama3; attention_bias true for Llama,
  // Mistral or Qwen3 (o_proj would have a bias); mlp_bias true; hidden_act
  // other than silu; attention_dropout other than 0; a sliding window on
  // Qwen2/Qwen3 (use_sliding_window true with sliding_window below
  // max_position_embeddings, or a "sliding_attention" layer type); and
  // anything Validate() refuses.
  static absl::StatusOr<DecoderConfig> FromHuggingFaceJson(
      const std::string &json_text, const std::string &origin);
  // A config.json that transformers' AutoConfig / AutoModelForCausalLM load
  // into the same model (legacy rope spelling, which transformers 4 and 5
  // both read). FromHuggingFaceJson(ToHuggingFaceJson()) returns an equal
  // config (activation_checkpointing, recompute_activations and
  // head_weight_gradient_in_backward aside).
  std::string ToHuggingFaceJson() const;

  // Named shapes: "llama-tiny" (tests: 2 layers, 64 wide, 4/2 heads, tied),
  // "mistral-tiny", "qwen2-tiny", "qwen3-tiny" (the same with each family's
  // feature), "llama-1B" (Llama 3.2 1B), "llama-3B" (Llama 3.2 3B),
  // "llama-8B" (Llama 3.1 8B). InvalidArgument listing the known names
  // otherwise.
  static absl::StatusOr<DecoderConfig> Preset(const std::string &name);
  static std::vector<std::string> PresetNames();

  bool operator==(const DecoderConfig &other) const;
  bool operator!=(const DecoderConfig &other) const {
    return !(*this == other);
  }
};

}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_DECODER_CONFIG_H_
