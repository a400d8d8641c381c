// DecoderModel: the Llama-family decoder (Llama, Mistral, Qwen2, Qwen3; see
// nn/decoder_config.h) with its cross-entropy loss and incremental decoding:
//   embed_tokens -> layers.0 .. layers.{L-1} (DecoderBlock) -> norm ->
//   lm_head (an OutputHead: untied, its own weight (V, H); tied, logits =
//   x @ embed_tokens^T).
// Parameter names are DecoderConfig::ParameterShapes()'s, in the same order
// as Parameters(). The tied head lists embed_tokens.weight among its
// DirectParameters, so a ZeRO-3 hook on lm_head gathers the table as it
// must. ForwardLoss runs the head in loss mode: the (B, T, V) logits are
// formed a chunk of rows at a time and never kept whole (OutputHead).
#ifndef ZE_NN_DECODER_H_
#define ZE_NN_DECODER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "nn/causal_lm.h"
#include "nn/decoder_config.h"
#include "nn/decoder_layers.h"
#include "nn/kv_cache.h"
#include "nn/layers.h"
#include "nn/loss_model.h"
#include "nn/module.h"
#include "nn/pipeline_stage.h"

namespace ze {
namespace nn {

// Construction options (as GptOptions).
struct DecoderOptions {
  Device device = Device::Cpu();
  DType dtype = DType::kF32;
  uint64_t seed = 0;
  // False: shapes only, no parameter storage (partitioned construction);
  // call MaterializeParameters (or set data/shards) later.
  bool materialize = true;
  // A pipeline stage (nn/pipeline_stage.h): only pipeline layers
  // [first_layer, last_layer) are built, under their whole-model names
  // ("layers.5.attn..."); last_layer -1: through the end. A tied stage
  // holding the head but not embed_tokens holds its own copy,
  // "embed_tokens.weight" (TiedParameters()).
  int first_layer = 0;
  int last_layer = -1;
};

// Incremental decoding (nn/kv_cache.h): the cache holds, per block, the
// keys (after RoPE) and values, (B, Hkv, T_max, D) in the model's dtype.
// ForwardCached runs the public Module::Forward with each attention layer
// placing its row's tokens at the cached length (RoPE), appending to and
// reading its cache; the final norm and the head then run on each
// sequence's last position only.
class DecoderModel : public CausalLm {
 public:
  // Builds the tree and, with options.materialize, initialises every
  // parameter from (seed, full name): normal(0.02) for embeddings and
  // projections, ones for norms, zeros for biases. InvalidArgument for a
  // bad config (DecoderConfig::Validate) or an i32 dtype; ResourceExhausted
  // when parameters do not fit.
  static absl::StatusOr<std::unique_ptr<DecoderModel>> Create(
      const DecoderConfig &config, const DecoderOptions &options,
      const Stream &stream = Stream());

  const DecoderConfig &config() const { return config_; }
  const DecoderOptions &options() const { return options_; }
  Device device() const override { return options_.device; }
  DType dtype() const override { return options_.dtype; }
  int64_t hidden_size() const override { return config_.hidden_size; }
  // Null on a pipeline stage without that layer; layer(i) is the stage's
  // i-th block. lm_head() (CausalLm's) is untied (type "OutputHead",
  // weight lm_head.weight) or tied (type "TiedOutputHead", weight
  // embed_tokens.weight).
  TokenEmbedding *embed_tokens() const {
    return static_cast<TokenEmbedding *>(stack().embedding);
  }
  Sequential *layers() const { return stack().blocks; }
  DecoderBlock *layer(int index) const {
    return static_cast<DecoderBlock *>(layers()->at(index));
  }
  RmsNorm *norm() const { return static_cast<RmsNorm *>(stack().final_norm); }

  // PipelineStage (nn/pipeline_stage.h; the rest is CausalLm's).
  int num_pipeline_layers() const override { return config_.pipeline_layers(); }
  std::vector<int64_t> PipelineLayerWeights() const override {
    return config_.PipelineLayerWeights();
  }

  // ForwardLoss and BackwardLoss: CausalLm's. They, like the forward,
  // refuse a sequence longer than max_position_embeddings (or Mistral's
  // sliding_window), naming the key (InvalidArgument).

  // IncrementalDecoder. max_positions() is max_position_embeddings, or
  // Mistral's sliding_window when smaller (longer sequences are refused:
  // within the window, sliding-window attention is plain causal attention).
  int64_t max_positions() const override;
  absl::StatusOr<std::unique_ptr<KvCache>> NewKvCache(
      int64_t batch, int64_t capacity, const Stream &stream) const override;
  absl::StatusOr<Tensor> ForwardCached(const Tensor &tokens,
                                       const std::vector<int64_t> &rows,
                                       KvCache &cache,
                                       const Stream &stream) override;

 protected:
  // Checks the input (tokens (B, T) i32, or on a stage without
  // embed_tokens the activation (B, T, H); T at most max_positions()),
  // then CausalLm's forward.
  absl::StatusOr<Tensor> ForwardImpl(const Tensor &tokens,
                                     const Stream &stream) override;

 private:
  DecoderModel(const DecoderConfig &config, const DecoderOptions &options);

  DecoderConfig config_;
  DecoderOptions options_;
};

}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_DECODER_H_
