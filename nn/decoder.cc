#include "nn/decoder.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace ze {
namespace nn {

DecoderModel::DecoderModel(const DecoderConfig &config,
                           const DecoderOptions &options)
    : LossModel("DecoderModel"), config_(config), options_(options) {
  const LayerOptions layer_options{options.device, options.dtype};
  embed_tokens_ =
      RegisterChild("embed_tokens",
                    std::make_unique<TokenEmbedding>(
                        config.vocab_size, config.hidden_size, layer_options));
  layers_ = RegisterChild("layers", std::make_unique<Sequential>());
  for (int layer = 0; layer < config.num_layers; ++layer) {
    DecoderBlock *block =
        layers_->Append(std::make_unique<DecoderBlock>(config, layer_options));
    block->set_activation_checkpointing(config.activation_checkpointing);
  }
  norm_ = RegisterChild(
      "norm", std::make_unique<RmsNorm>(config.hidden_size, config.rms_norm_eps,
                                        layer_options));
  if (config.tie_word_embeddings) {
    lm_head_ = RegisterChild("lm_head", std::make_unique<OutputHead>(
                                            embed_tokens_->shared_weight()));
  } else {
    lm_head_ = RegisterChild(
        "lm_head", std::make_unique<OutputHead>(
                       config.hidden_size, config.vocab_size, layer_options));
  }
}

absl::StatusOr<std::unique_ptr<DecoderModel>> DecoderModel::Create(
    const DecoderConfig &config, const DecoderOptions &options,
    const Stream &stream) {
  ZE_RETURN_IF_ERROR(config.Validate());
  if (options.dtype == DType::kI32) {
    return absl::InvalidArgumentError(
        "DecoderOptions: dtype must be a float type");
  }
  std::unique_ptr<DecoderModel> model(new DecoderModel(config, options));
  if (options.materialize) {
    ZE_RETURN_IF_ERROR(model->MaterializeParameters(options.seed, stream));
  }
  return model;
}

int64_t DecoderModel::max_positions() const {
  if (config_.sliding_window > 0) {
    return std::min(config_.max_position_embeddings, config_.sliding_window);
  }
  return config_.max_position_embeddings;
}

absl::StatusOr<Tensor> DecoderModel::ForwardImpl(const Tensor &tokens,
                                                 const Stream &stream) {
  if (!tokens.defined() || tokens.dim() != 2 || tokens.dtype() != DType::kI32) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecoderModel expects tokens (B, T) i32, got ",
                     tokens.defined() ? tokens.DebugString() : "undefined"));
  }
  // A cached forward checked start + T against max_positions() already.
  const int64_t seq = tokens.size(1);
  if (!last_position_only_ && seq > max_positions()) {
    const bool window = max_positions() < config_.max_position_embeddings;
    return absl::InvalidArgumentError(absl::StrCat(
        "DecoderModel: a sequence of ", seq, " tokens exceeds ",
        window ? absl::StrCat("sliding_window = ", config_.sliding_window,
                              " (sliding-window attention is not "
                              "implemented; within the window it is plain "
                              "causal attention)")
               : absl::StrCat("max_position_embeddings = ",
                              config_.max_position_embeddings)));
  }
  ZE_ASSIGN_OR_RETURN(Tensor x, embed_tokens_->Forward(tokens, stream));
  ZE_ASSIGN_OR_RETURN(x, layers_->Forward(x, stream));  // (B, T, H)
  if (last_position_only_ && x.size(1) > 1) {
    ZE_ASSIGN_OR_RETURN(x, LastPositions(x, stream));  // (B, 1, H)
  }
  ZE_ASSIGN_OR_RETURN(x, norm_->Forward(x, stream));
  return lm_head_->Forward(x, stream);  // (B, T, V)
}

absl::StatusOr<Tensor> DecoderModel::BackwardImpl(const Tensor &grad_output,
                                                  const Stream &stream) {
  ZE_ASSIGN_OR_RETURN(Tensor grad, lm_head_->Backward(grad_output, stream));
  ZE_ASSIGN_OR_RETURN(grad, norm_->Backward(grad, stream));
  ZE_ASSIGN_OR_RETURN(grad, layers_->Backward(grad, stream));
  return embed_tokens_->Backward(grad, stream);
}

absl::StatusOr<float> DecoderModel::ForwardLoss(const Tensor &tokens,
                                                const Tensor &targets,
                                                const Stream &stream) {
  ZE_RETURN_IF_ERROR(MeanCrossEntropy::CheckTokensAndTargets(
      "DecoderModel::ForwardLoss", tokens, targets));
  loss_.Clear();
  lm_head_->ComputeLossInNextForward(targets, config_.vocab_size);
  absl::StatusOr<Tensor> losses = Forward(tokens, stream);  // (B, T) f32
  lm_head_->ClearPendingLoss();  // the forward may have failed before it
  ZE_RETURN_IF_ERROR(losses.status());
  return loss_.Forward(*losses, targets, stream);
}

absl::Status DecoderModel::BackwardLoss(float loss_scale,
                                        const Stream &stream) {
  ZE_ASSIGN_OR_RETURN(Tensor grad_losses,
                      loss_.Backward("DecoderModel::BackwardLoss", loss_scale));
  return Backward(grad_losses, stream).status();
}

absl::StatusOr<std::unique_ptr<KvCache>> DecoderModel::NewKvCache(
    int64_t batch, int64_t capacity, const Stream &stream) const {
  if (capacity > max_positions()) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecoderModel::NewKvCache: capacity = ", capacity,
                     " exceeds the model's ",
                     max_positions() < config_.max_position_embeddings
                         ? "sliding_window = "
                         : "max_position_embeddings = ",
                     max_positions()));
  }
  return KvCache::Create(config_.num_layers, batch, config_.num_kv_heads,
                         capacity, config_.head_dim, options_.dtype,
                         options_.device, stream);
}

absl::StatusOr<Tensor> DecoderModel::ForwardCached(
    const Tensor &tokens, const std::vector<int64_t> &rows, KvCache &cache,
    const Stream &stream) {
  const char *op = "DecoderModel::ForwardCached";
  if (cache.num_layers() != config_.num_layers ||
      cache.num_heads() != config_.num_kv_heads ||
      cache.head_dim() != config_.head_dim || cache.dtype() != options_.dtype ||
      cache.device() != options_.device) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": the cache (", cache.num_layers(), " layers, ", cache.num_heads(),
        " heads of ", cache.head_dim(), ", ", DTypeName(cache.dtype()), " on ",
        cache.device().ToString(), ") is not this model's (",
        config_.num_layers, " layers, ", config_.num_kv_heads,
        " key/value heads of ", config_.head_dim, ", ",
        DTypeName(options_.dtype), " on ", options_.device.ToString(),
        "); make it with NewKvCache"));
  }
  ZE_ASSIGN_OR_RETURN(
      const CacheSlots slots,
      PrepareCacheSlots(op, tokens, rows, cache, max_positions(),
                        options_.device, stream));
  // The settings live for this call only, whatever its outcome.
  for (int index = 0; index < config_.num_layers; ++index) {
    GroupedQueryAttention::CacheSlot slot;
    slot.keys = cache.keys(index);
    slot.values = cache.values(index);
    slot.rows = slots.rows;
    slot.starts = slots.starts;
    layer(index)->attn()->set_cache_slot(std::move(slot));
  }
  last_position_only_ = true;
  absl::StatusOr<Tensor> logits;
  {
    NoSaveScope no_save;
    logits = Forward(tokens, stream);  // (N, 1, V); hooks fire
  }
  last_position_only_ = false;
  for (int index = 0; index < config_.num_layers; ++index) {
    layer(index)->attn()->clear_cache_slot();
  }
  ZE_RETURN_IF_ERROR(logits.status());
  ZE_RETURN_IF_ERROR(cache.Advance(rows, tokens.size(1)));
  return logits;
}

}  // namespace nn
}  // namespace ze
