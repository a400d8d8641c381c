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
    : LossModel("DecoderModel"),
      config_(config),
      options_(options),
      first_layer_(options.first_layer),
      last_layer_(options.last_layer < 0 ? config.pipeline_layers()
                                         : options.last_layer) {
  const LayerOptions layer_options{options.device, options.dtype};
  const int n = config.num_layers;
  auto holds = [&](int layer) {
    return first_layer_ <= layer && layer < last_layer_;
  };
  if (holds(0)) {
    embed_tokens_ = RegisterChild(
        "embed_tokens",
        std::make_unique<TokenEmbedding>(config.vocab_size, config.hidden_size,
                                         layer_options));
  } else if (holds(n + 2) && config.tie_word_embeddings) {
    // TokenEmbedding's initialiser for its table.
    tied_table_ = RegisterChild(
        "embed_tokens",
        std::make_unique<TiedTableCopy>(
            "weight", config.vocab_size, config.hidden_size, options.dtype,
            options.device, Initializer::Normal(0.02f)));
  }
  for (int layer = 0; layer < n; ++layer) {
    if (!holds(layer + 1)) continue;
    if (layers_ == nullptr) {
      layers_ = RegisterChild("layers", std::make_unique<Sequential>());
    }
    // Named by its index in the whole model, whatever the stage.
    DecoderBlock *block =
        layers_->Append(std::to_string(layer),
                        std::make_unique<DecoderBlock>(config, layer_options));
    block->set_activation_checkpointing(config.activation_checkpointing);
    block->mlp()->set_recompute_activation(config.recompute_activations);
  }
  if (holds(n + 1)) {
    norm_ = RegisterChild(
        "norm", std::make_unique<RmsNorm>(config.hidden_size,
                                          config.rms_norm_eps, layer_options));
  }
  if (!holds(n + 2)) return;
  if (config.tie_word_embeddings) {
    lm_head_ = RegisterChild(
        "lm_head", std::make_unique<OutputHead>(
                       embed_tokens_ != nullptr ? embed_tokens_->shared_weight()
                                                : tied_table_->shared_table()));
  } else {
    lm_head_ = RegisterChild(
        "lm_head", std::make_unique<OutputHead>(
                       config.hidden_size, config.vocab_size, layer_options));
  }
  lm_head_->set_weight_gradient(config.head_weight_gradient_in_backward
                                    ? OutputHead::WeightGradient::kInBackward
                                    : OutputHead::WeightGradient::kInForward);
}

absl::StatusOr<std::unique_ptr<DecoderModel>> DecoderModel::Create(
    const DecoderConfig &config, const DecoderOptions &options,
    const Stream &stream) {
  ZE_RETURN_IF_ERROR(config.Validate());
  if (options.dtype == DType::kI32) {
    return absl::InvalidArgumentError(
        "DecoderOptions: dtype must be a float type");
  }
  ZE_RETURN_IF_ERROR(
      CheckPipelineLayers("DecoderOptions", options.first_layer,
                          options.last_layer, config.pipeline_layers(),
                          absl::StrCat("embed_tokens, ", config.num_layers,
                                       " blocks, norm, the head")));
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
  // A pipeline stage without embed_tokens takes the activation (B, T, H).
  const bool takes_tokens = embed_tokens_ != nullptr;
  if (!tokens.defined() ||
      (takes_tokens && (tokens.dim() != 2 || tokens.dtype() != DType::kI32)) ||
      (!takes_tokens && tokens.dim() != 3)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DecoderModel expects ",
        takes_tokens ? "tokens (B, T) i32" : "the activation (B, T, H)",
        ", got ", tokens.defined() ? tokens.DebugString() : "undefined"));
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
  Tensor x = tokens;
  if (embed_tokens_ != nullptr) {
    ZE_ASSIGN_OR_RETURN(x, embed_tokens_->Forward(tokens, stream));
  }
  if (layers_ != nullptr) {
    ZE_ASSIGN_OR_RETURN(x, layers_->Forward(x, stream));  // (B, T, H)
  }
  if (last_position_only_ && x.size(1) > 1) {
    ZE_ASSIGN_OR_RETURN(x, LastPositions(x, stream));  // (B, 1, H)
  }
  if (norm_ != nullptr) {
    ZE_ASSIGN_OR_RETURN(x, norm_->Forward(x, stream));
  }
  if (lm_head_ != nullptr) {
    ZE_ASSIGN_OR_RETURN(x, lm_head_->Forward(x, stream));  // (B, T, V)
  }
  return x;
}

std::vector<Module *> DecoderModel::StageLayers() {
  std::vector<Module *> layers;
  if (embed_tokens_ != nullptr) layers.push_back(embed_tokens_);
  if (layers_ != nullptr) {
    for (int i = 0; i < layers_->size(); ++i) layers.push_back(layers_->at(i));
  }
  if (norm_ != nullptr) layers.push_back(norm_);
  if (lm_head_ != nullptr) layers.push_back(lm_head_);
  return layers;
}

std::vector<Module *> DecoderModel::BlockLayers() {
  std::vector<Module *> layers;
  if (layers_ != nullptr) {
    for (int i = 0; i < layers_->size(); ++i) layers.push_back(layers_->at(i));
  }
  return layers;
}

absl::StatusOr<Tensor> DecoderModel::ForwardStage(const Tensor &input,
                                                  const Tensor &targets,
                                                  const Stream &stream) {
  if (lm_head_ != nullptr) {
    if (!targets.defined() || targets.dtype() != DType::kI32 ||
        targets.dim() != 2 || input.dim() < 2 ||
        targets.size(0) != input.size(0) || targets.size(1) != input.size(1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DecoderModel::ForwardStage: the last stage needs targets (B, T) "
          "i32 matching its input ",
          input.DebugString(), ", got ",
          targets.defined() ? targets.DebugString() : "undefined"));
    }
    lm_head_->ComputeLossInNextForward(targets, config_.vocab_size);
  }
  absl::StatusOr<Tensor> output = Forward(input, stream);
  if (lm_head_ != nullptr) lm_head_->ClearPendingLoss();
  return output;
}

std::vector<Parameter *> DecoderModel::TiedParameters() {
  if (whole() || !config_.tie_word_embeddings) return {};
  if (embed_tokens_ != nullptr && lm_head_ == nullptr) {
    return {embed_tokens_->weight()};
  }
  if (tied_table_ != nullptr) return {tied_table_->table()};
  return {};
}

absl::StatusOr<Tensor> DecoderModel::BackwardImpl(const Tensor &grad_output,
                                                  const Stream &stream) {
  Tensor grad = grad_output;
  if (lm_head_ != nullptr) {
    ZE_ASSIGN_OR_RETURN(grad, lm_head_->Backward(grad, stream));
  }
  if (norm_ != nullptr) {
    ZE_ASSIGN_OR_RETURN(grad, norm_->Backward(grad, stream));
  }
  if (layers_ != nullptr) {
    ZE_ASSIGN_OR_RETURN(grad, layers_->Backward(grad, stream));
  }
  if (embed_tokens_ != nullptr) return embed_tokens_->Backward(grad, stream);
  return grad;  // (B, T, H): the previous stage's output gradient
}

absl::StatusOr<float> DecoderModel::ForwardLoss(const Tensor &tokens,
                                                const Tensor &targets,
                                                const Stream &stream) {
  ZE_RETURN_IF_ERROR(RequireWhole("DecoderModel::ForwardLoss"));
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
  ZE_RETURN_IF_ERROR(RequireWhole("DecoderModel::BackwardLoss"));
  ZE_ASSIGN_OR_RETURN(Tensor grad_losses,
                      loss_.Backward("DecoderModel::BackwardLoss", loss_scale));
  return Backward(grad_losses, stream).status();
}

absl::StatusOr<std::unique_ptr<KvCache>> DecoderModel::NewKvCache(
    int64_t batch, int64_t capacity, const Stream &stream) const {
  ZE_RETURN_IF_ERROR(RequireWhole("DecoderModel::NewKvCache"));
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
  ZE_RETURN_IF_ERROR(RequireWhole(op));
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
