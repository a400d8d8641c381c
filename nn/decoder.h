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
class DecoderModel : public LossModel,
                     public IncrementalDecoder,
                     public PipelineStage {
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
  // i-th block.
  TokenEmbedding *embed_tokens() const { return embed_tokens_; }
  Sequential *layers() const { return layers_; }
  DecoderBlock *layer(int index) const {
    return static_cast<DecoderBlock *>(layers_->at(index));
  }
  RmsNorm *norm() const { return norm_; }
  // Untied (type "OutputHead", weight lm_head.weight) or tied (type
  // "TiedOutputHead", weight embed_tokens.weight).
  OutputHead *lm_head() const { return lm_head_; }

  // Whether this model holds every layer (not a pipeline stage).
  bool whole() const { return is_first_stage() && is_last_stage(); }

  // PipelineStage (nn/pipeline_stage.h).
  int first_layer() const override { return first_layer_; }
  int last_layer() const override { return last_layer_; }
  int num_pipeline_layers() const override { return config_.pipeline_layers(); }
  std::vector<int64_t> PipelineLayerWeights() const override {
    return config_.PipelineLayerWeights();
  }
  Shape BoundaryShape(const Tensor &inputs) const override {
    return {inputs.size(0), inputs.size(1), config_.hidden_size};
  }
  DType boundary_dtype() const override { return options_.dtype; }
  std::vector<Module *> StageLayers() override;
  std::vector<Module *> BlockLayers() override;
  absl::StatusOr<Tensor> ForwardStage(const Tensor &input,
                                      const Tensor &targets,
                                      const Stream &stream) override;
  absl::StatusOr<Tensor> BackwardStage(const Tensor &grad_output,
                                       const Stream &stream) override {
    return Backward(grad_output, stream);
  }
  std::vector<Parameter *> TiedParameters() override;

  // Forward through the public Module::Forward (hooks fire) plus the mean
  // cross-entropy over targets >= 0 (MeanCrossEntropy). A pipeline stage
  // that is not the whole model refuses (FailedPrecondition), as do
  // BackwardLoss, NewKvCache and ForwardCached.
  //   tokens, targets (B, T) i32 on the model's device, T at most
  //   max_positions(). One stream synchronisation per call. Only one chunk
  //   of logits is alive at a time (OutputHead's loss mode); the last stays
  //   until BackwardLoss.
  // InvalidArgument for bad inputs or a sequence longer than
  // max_position_embeddings (or Mistral's sliding_window), naming the key.
  absl::StatusOr<float> ForwardLoss(const Tensor &tokens, const Tensor &targets,
                                    const Stream &stream) override;
  // Backpropagates loss_scale * (mean loss of the last ForwardLoss) through
  // the public Module::Backward, accumulating into the parameters' grads.
  // FailedPrecondition without a preceding ForwardLoss.
  absl::Status BackwardLoss(float loss_scale, const Stream &stream) override;
  int64_t counted_targets() const override { return loss_.counted(); }

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
  // tokens (B, T) i32 -> logits (B, T, V) ((B, 1, V) in a cached forward).
  absl::StatusOr<Tensor> ForwardImpl(const Tensor &tokens,
                                     const Stream &stream) override;
  // grad_output: the logits' gradient, or for a ForwardLoss's forward the
  // per-row losses' (OutputHead's loss mode).
  absl::StatusOr<Tensor> BackwardImpl(const Tensor &grad_output,
                                      const Stream &stream) override;
  void ClearSavedStateImpl() override { loss_.Clear(); }

 private:
  DecoderModel(const DecoderConfig &config, const DecoderOptions &options);

  absl::Status RequireWhole(const char *op) const {
    return whole() ? absl::OkStatus() : NotWholeModelError(op, *this);
  }

  DecoderConfig config_;
  DecoderOptions options_;
  int first_layer_ = 0;
  int last_layer_ = 0;
  TokenEmbedding *embed_tokens_ = nullptr;
  Sequential *layers_ = nullptr;
  RmsNorm *norm_ = nullptr;
  OutputHead *lm_head_ = nullptr;
  // A tied last stage without embed_tokens: its copy of the table.
  TiedTableCopy *tied_table_ = nullptr;
  // Between ForwardLoss and BackwardLoss: the count of targets.
  MeanCrossEntropy loss_;
  // During ForwardCached: ForwardImpl applies the norm and the head to each
  // sequence's last position only.
  bool last_position_only_ = false;
};

}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_DECODER_H_
