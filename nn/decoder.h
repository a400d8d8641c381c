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
};

// Incremental decoding (nn/kv_cache.h): the cache holds, per block, the
// keys (after RoPE) and values, (B, Hkv, T_max, D) in the model's dtype.
// ForwardCached runs the public Module::Forward with each attention layer
// placing its row's tokens at the cached length (RoPE), appending to and
// reading its cache; the final norm and the head then run on each
// sequence's last position only.
class DecoderModel : public LossModel, public IncrementalDecoder {
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
  TokenEmbedding *embed_tokens() const { return embed_tokens_; }
  Sequential *layers() const { return layers_; }
  DecoderBlock *layer(int index) const {
    return static_cast<DecoderBlock *>(layers_->at(index));
  }
  RmsNorm *norm() const { return norm_; }
  // Untied (type "OutputHead", weight lm_head.weight) or tied (type
  // "TiedOutputHead", weight embed_tokens.weight).
  OutputHead *lm_head() const { return lm_head_; }

  // Forward through the public Module::Forward (hooks fire) plus the mean
  // cross-entropy over targets >= 0 (MeanCrossEntropy).
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

  DecoderConfig config_;
  DecoderOptions options_;
  TokenEmbedding *embed_tokens_;
  Sequential *layers_;
  RmsNorm *norm_;
  OutputHead *lm_head_;
  // Between ForwardLoss and BackwardLoss: the count of targets.
  MeanCrossEntropy loss_;
  // During ForwardCached: ForwardImpl applies the norm and the head to each
  // sequence's last position only.
  bool last_position_only_ = false;
};

}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_DECODER_H_
