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
    : CausalLm("DecoderModel", config.vocab_size, options.first_layer,
               options.last_layer, config.pipeline_layers()),
      config_(config),
      options_(options) {
  const LayerOptions layer_options{options.device, options.dtype};
  const int n = config.num_layers;
  auto holds = [&](int layer) {
    return first_layer() <= layer && layer < last_layer();
  };
  Stack stack;
  TokenEmbedding *embed_tokens = nullptr;
  if (holds(0)) {
    embed_tokens = RegisterChild(
        "embed_tokens",
        std::make_unique<TokenEmbedding>(config.vocab_size, config.hidden_size,
                                         layer_options));
    stack.embedding = embed_tokens;
    if (config.tie_word_embeddings) {
      stack.tied_embedding_table = embed_tokens->weight();
    }
  } else if (holds(n + 2) && config.tie_word_embeddings) {
    // TokenEmbedding's initialiser for its table.
    stack.tied_table = RegisterChild(
        "embed_tokens",
        std::make_unique<TiedTableCopy>(
            "weight", config.vocab_size, config.hidden_size, options.dtype,
            options.device, Initializer::Normal(0.02f)));
  }
  for (int layer = 0; layer < n; ++layer) {
    if (!holds(layer + 1)) continue;
    if (stack.blocks == nullptr) {
      stack.blocks = RegisterChild("layers", std::make_unique<Sequential>());
    }
    // Named by its index in the whole model, whatever the stage.
    DecoderBlock *block = stack.blocks->Append(
        std::to_string(layer),
        std::make_unique<DecoderBlock>(config, layer_options));
    block->set_activation_checkpointing(config.activation_checkpointing);
    block->mlp()->set_recompute_activation(config.recompute_activations);
  }
  if (holds(n + 1)) {
    stack.final_norm = RegisterChild(
        "norm", std::make_unique<RmsNorm>(config.hidden_size,
                                          config.rms_norm_eps, layer_options));
  }
  if (holds(n + 2) && config.tie_word_embeddings) {
    stack.head = RegisterChild(
        "lm_head",
        std::make_unique<OutputHead>(embed_tokens != nullptr
                                         ? embed_tokens->shared_weight()
                                         : stack.tied_table->shared_table()));
  } else if (holds(n + 2)) {
    stack.head = RegisterChild(
        "lm_head", std::make_unique<OutputHead>(
                       config.hidden_size, config.vocab_size, layer_options));
  }
  if (stack.head != nullptr) {
    stack.head->set_weight_gradient(
        config.head_weight_gradient_in_backward
            ? OutputHead::WeightGradient::kInBackward
            : OutputHead::WeightGradient::kInForward);
  }
  SetStack(stack);
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
  const bool takes_tokens = embed_tokens() != nullptr;
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
  if (!forwarding_last_positions() && seq > max_positions()) {
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
  return CausalLm::ForwardImpl(tokens, stream);
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
  absl::StatusOr<Tensor> logits =
      ForwardLastPositions(tokens, stream);  // (N, 1, V); hooks fire
  for (int index = 0; index < config_.num_layers; ++index) {
    layer(index)->attn()->clear_cache_slot();
  }
  ZE_RETURN_IF_ERROR(logits.status());
  ZE_RETURN_IF_ERROR(cache.Advance(rows, tokens.size(1)));
  return logits;
}

}  // namespace nn
}  // namespace ze
