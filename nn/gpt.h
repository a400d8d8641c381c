// GPT: token + position embedding, N pre-LN transformer blocks, a final
// LayerNorm, and an output head tied to the token embedding
// (logits = x @ wte^T), with a cross-entropy loss.
//
// Parameter names (stable, used by checkpoints and the engine):
//   embed.wte (Vp, C), embed.wpe (max_T, C),
//   blocks.N.ln1.{weight,bias}, blocks.N.attn.qkv.{weight,bias},
//   blocks.N.attn.proj.{weight,bias}, blocks.N.ln2.{weight,bias},
//   blocks.N.mlp.fc.{weight,bias}, blocks.N.mlp.proj.{weight,bias},
//   ln_f.{weight,bias}.
// The head ("lm_head", a tied OutputHead) lists embed.wte among its
// DirectParameters, so a ZeRO-3 hook on lm_head gathers the tied table as it
// must. ForwardLoss runs the head in loss mode: the (B, T, Vp) logits are
// formed a chunk of rows at a time and never kept whole (OutputHead).
#ifndef ZE_NN_GPT_H_
#define ZE_NN_GPT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "nn/causal_lm.h"
#include "nn/kv_cache.h"
#include "nn/layers.h"
#include "nn/loss_model.h"
#include "nn/module.h"
#include "nn/pipeline_stage.h"

namespace ze {
namespace nn {

struct GptConfig {
  int num_layers = 12;
  int num_heads = 12;
  int64_t channels = 768;
  int64_t vocab_size = 50257;
  // Rows of the token table and columns of the logits; 0 means vocab_size.
  // Padding (e.g. to 50304, a multiple of 128) makes the matrix products
  // faster. The padded columns are left out of the loss's softmax (and get
  // no gradient), so the loss is the unpadded model's: a pretrained GPT-2
  // (50257) padded to 50304 keeps its loss, where zero padding rows would
  // otherwise give logits of 0 that outweigh its real, mostly negative ones.
  int64_t padded_vocab_size = 0;
  int64_t max_seq_len = 1024;
  // Checkpoint every block (see Module::set_activation_checkpointing).
  bool activation_checkpointing = false;
  // Recompute every MLP's GELU in backward instead of keeping its output
  // (Module::set_recompute_activation): 4 C fewer saved elements per token
  // and layer.
  bool recompute_activations = false;
  // Where the tied head forms its weight gradient in a loss-mode forward
  // (OutputHead::WeightGradient, set on the head at construction): false,
  // in the forward, a (table_rows, C) f32 sum held until the backward;
  // true, in the backward, a vocabulary slice at a time (no such sum, one
  // more logits product). The same gradients up to the order of f32 sums.
  bool head_weight_gradient_in_backward = false;

  int64_t table_rows() const {
    return padded_vocab_size > 0 ? padded_vocab_size : vocab_size;
  }
  // InvalidArgument naming the field when a value is out of range.
  absl::Status Validate() const;
  // Number of parameter elements of the model this config builds (the tied
  // head counts once).
  int64_t NumParameters() const;

  // The pipeline layer sequence (nn/pipeline_stage.h): 0 the embedding,
  // 1 .. num_layers the blocks, num_layers + 1 the final LayerNorm,
  // num_layers + 2 the head.
  int pipeline_layers() const { return num_layers + 3; }
  // Each pipeline layer's weight for partitioning by parameters: its
  // parameter count, the head counting the tied table it multiplies by
  // (its work is the embedding table's size, not zero).
  std::vector<int64_t> PipelineLayerWeights() const;

  // GPT-2 / GPT-3 sizes: "124M" (12 layers, 12 heads, 768), "350M" (24, 16,
  // 1024), "760M" (24, 16, 1536), "1.3B" (24, 32, 2048), "2.7B" (32, 32,
  // 2560), "6.7B" (32, 32, 4096), "13B" (40, 40, 5120), "25B" (56, 48, 6144:
  // GPT-NeoX-20B's width, deeper); vocabulary 50257, sequence 1024. With
  // `pad_vocab`, padded_vocab_size is 50304. InvalidArgument listing the known
  // names otherwise.
  static absl::StatusOr<GptConfig> Preset(const std::string &name,
                                          bool pad_vocab = false);
  static std::vector<std::string> PresetNames();
};

// Construction options.
struct GptOptions {
  Device device = Device::Cpu();
  DType dtype = DType::kF32;
  uint64_t seed = 0;
  // False: shapes only, no parameter storage (partitioned construction);
  // call MaterializeParameters (or set data/shards) later.
  bool materialize = true;
  // A pipeline stage (nn/pipeline_stage.h): only pipeline layers
  // [first_layer, last_layer) are built, under their whole-model names
  // (blocks keep their index: "blocks.5.attn..."), so initialisation and
  // checkpoints match the whole model's. last_layer -1: through the end.
  // A stage holding the head but not the embedding holds its own copy of
  // the tied table, "embed.wte" (TiedParameters()).
  int first_layer = 0;
  int last_layer = -1;
};

// Incremental decoding (nn/kv_cache.h): the cache holds, per block, the
// attention's keys and values, (B, num_heads, T_max, channels / num_heads)
// in the model's dtype. ForwardCached runs the public Module::Forward with
// the embedding placing each row's tokens at its cached length and every
// attention layer appending to and reading its cache; the final LayerNorm
// and the head then run on each sequence's last position only.
class GptModel : public CausalLm {
 public:
  // Builds the tree and, with options.materialize, initialises every
  // parameter from (seed, name). InvalidArgument for a bad config;
  // ResourceExhausted when parameters do not fit.
  static absl::StatusOr<std::unique_ptr<GptModel>> Create(
      const GptConfig &config, const GptOptions &options,
      const Stream &stream = Stream());

  const GptConfig &config() const { return config_; }
  const GptOptions &options() const { return options_; }
  Device device() const override { return options_.device; }
  DType dtype() const override { return options_.dtype; }
  // The embedding width (config().channels, GPT-2's n_embd).
  int64_t hidden_size() const override { return config_.channels; }
  // Null on a pipeline stage without that layer (blocks: without blocks).
  Embedding *embed() const {
    return static_cast<Embedding *>(stack().embedding);
  }
  Sequential *blocks() const { return stack().blocks; }
  LayerNorm *ln_f() const {
    return static_cast<LayerNorm *>(stack().final_norm);
  }

  // PipelineStage (nn/pipeline_stage.h; the rest is CausalLm's).
  int num_pipeline_layers() const override { return config_.pipeline_layers(); }
  std::vector<int64_t> PipelineLayerWeights() const override {
    return config_.PipelineLayerWeights();
  }

  // ForwardLoss and BackwardLoss: CausalLm's (a target < 0 is ignored).

  // IncrementalDecoder (nn/kv_cache.h). max_positions() is
  // config().max_seq_len.
  int64_t max_positions() const override { return config_.max_seq_len; }
  absl::StatusOr<std::unique_ptr<KvCache>> NewKvCache(
      int64_t batch, int64_t capacity, const Stream &stream) const override;
  absl::StatusOr<Tensor> ForwardCached(const Tensor &tokens,
                                       const std::vector<int64_t> &rows,
                                       KvCache &cache,
                                       const Stream &stream) override;

 private:
  GptModel(const GptConfig &config, const GptOptions &options);

  GptConfig config_;
  GptOptions options_;
};

}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_GPT_H_
