#include "nn/gpt.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/ops.h"
#include "core/status.h"
#include "nn/functional.h"

namespace ze {
namespace nn {
namespace {

struct PresetShape {
  const char *name;
  int num_layers;
  int num_heads;
  int64_t channels;
};

constexpr PresetShape kPresets[] = {
    {"124M", 12, 12, 768},
    {"350M", 24, 16, 1024},
    {"760M", 24, 16, 1536},
    {"1.3B", 24, 32, 2048},
    {"2.7B", 32, 32, 2560},
    {"6.7B", 32, 32, 4096},
    {"13B", 40, 40, 5120},
    // Not a GPT-3 size: GPT-NeoX-20B's width (6144, 48 heads of 128) at 56
    // layers, 25.7 G parameters: issue 28's "at least 25B on one GPU".
    {"25B", 56, 48, 6144},
};

}  // namespace

absl::Status GptConfig::Validate() const {
  auto fail = [](const std::string &message) {
    return absl::InvalidArgumentError(absl::StrCat("GptConfig: ", message));
  };
  if (num_layers < 1) return fail(absl::StrCat("num_layers = ", num_layers));
  if (num_heads < 1) return fail(absl::StrCat("num_heads = ", num_heads));
  if (channels < 1 || channels % num_heads != 0) {
    return fail(absl::StrCat(
        "channels = ", channels,
        " must be positive and divisible by num_heads = ", num_heads));
  }
  if (vocab_size < 1) return fail(absl::StrCat("vocab_size = ", vocab_size));
  if (padded_vocab_size != 0 && padded_vocab_size < vocab_size) {
    return fail(absl::StrCat("padded_vocab_size = ", padded_vocab_size,
                             " is smaller than vocab_size = ", vocab_size));
  }
  if (max_seq_len < 1) return fail(absl::StrCat("max_seq_len = ", max_seq_len));
  return absl::OkStatus();
}

int64_t GptConfig::NumParameters() const {
  const int64_t c = channels;
  const int64_t per_block = 2 * c                // ln1
                            + 3 * c * c + 3 * c  // attn.qkv
                            + c * c + c          // attn.proj
                            + 2 * c              // ln2
                            + 4 * c * c + 4 * c  // mlp.fc
                            + 4 * c * c + c;     // mlp.proj
  return table_rows() * c + max_seq_len * c + num_layers * per_block + 2 * c;
}

std::vector<int64_t> GptConfig::PipelineLayerWeights() const {
  const int64_t c = channels;
  const int64_t per_block = 12 * c * c + 13 * c;  // as in NumParameters
  std::vector<int64_t> weights;
  weights.push_back(table_rows() * c + max_seq_len * c);  // embedding
  for (int layer = 0; layer < num_layers; ++layer) {
    weights.push_back(per_block);
  }
  weights.push_back(2 * c);             // ln_f
  weights.push_back(table_rows() * c);  // the head's product
  return weights;
}

absl::StatusOr<GptConfig> GptConfig::Preset(const std::string &name,
                                            bool pad_vocab) {
  for (const PresetShape &preset : kPresets) {
    if (name == preset.name) {
      GptConfig config;
      config.num_layers = preset.num_layers;
      config.num_heads = preset.num_heads;
      config.channels = preset.channels;
      config.vocab_size = 50257;
      config.padded_vocab_size = pad_vocab ? 50304 : 0;
      config.max_seq_len = 1024;
      return config;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown GPT preset '", name,
                   "'; known: ", absl::StrJoin(PresetNames(), ", ")));
}

std::vector<std::string> GptConfig::PresetNames() {
  std::vector<std::string> names;
  for (const PresetShape &preset : kPresets) names.push_back(preset.name);
  return names;
}

GptModel::GptModel(const GptConfig &config, const GptOptions &options)
    : CausalLm("GptModel", config.vocab_size, options.first_layer,
               options.last_layer, config.pipeline_layers()),
      config_(config),
      options_(options) {
  const LayerOptions layer_options{options.device, options.dtype};
  const int n = config.num_layers;
  auto holds = [&](int layer) {
    return first_layer() <= layer && layer < last_layer();
  };
  Stack stack;
  Embedding *embed = nullptr;
  if (holds(0)) {
    embed = RegisterChild("embed", std::make_unique<Embedding>(
                                       config.table_rows(), config.max_seq_len,
                                       config.channels, layer_options));
    stack.embedding = embed;
    stack.tied_embedding_table = embed->token_table();
  } else if (holds(n + 2)) {
    // Embedding's initialiser for its token table.
    stack.tied_table = RegisterChild(
        "embed", std::make_unique<TiedTableCopy>(
                     "wte", config.table_rows(), config.channels, options.dtype,
                     options.device, Initializer::Normal(0.02f)));
  }
  for (int layer = 0; layer < n; ++layer) {
    if (!holds(layer + 1)) continue;
    if (stack.blocks == nullptr) {
      stack.blocks = RegisterChild("blocks", std::make_unique<Sequential>());
    }
    // Named by its index in the whole model, whatever the stage.
    Block *block = stack.blocks->Append(
        std::to_string(layer),
        std::make_unique<Block>(config.channels, config.num_heads,
                                config.num_layers, layer_options));
    block->set_activation_checkpointing(config.activation_checkpointing);
    block->mlp()->set_recompute_activation(config.recompute_activations);
  }
  if (holds(n + 1)) {
    stack.final_norm = RegisterChild(
        "ln_f", std::make_unique<LayerNorm>(config.channels, layer_options));
  }
  if (holds(n + 2)) {
    stack.head = RegisterChild(
        "lm_head", std::make_unique<OutputHead>(
                       embed != nullptr ? embed->shared_token_table()
                                        : stack.tied_table->shared_table()));
    stack.head->set_weight_gradient(
        config.head_weight_gradient_in_backward
            ? OutputHead::WeightGradient::kInBackward
            : OutputHead::WeightGradient::kInForward);
  }
  SetStack(stack);
}

absl::StatusOr<std::unique_ptr<GptModel>> GptModel::Create(
    const GptConfig &config, const GptOptions &options, const Stream &stream) {
  ZE_RETURN_IF_ERROR(config.Validate());
  if (options.dtype == DType::kI32) {
    return absl::InvalidArgumentError("GptOptions: dtype must be a float type");
  }
  ZE_RETURN_IF_ERROR(
      CheckPipelineLayers("GptOptions", options.first_layer, options.last_layer,
                          config.pipeline_layers(),
                          absl::StrCat("the embedding, ", config.num_layers,
                                       " blocks, ln_f, the head")));
  std::unique_ptr<GptModel> model(new GptModel(config, options));
  if (options.materialize) {
    ZE_RETURN_IF_ERROR(model->MaterializeParameters(options.seed, stream));
  }
  return model;
}

absl::StatusOr<std::unique_ptr<KvCache>> GptModel::NewKvCache(
    int64_t batch, int64_t capacity, const Stream &stream) const {
  ZE_RETURN_IF_ERROR(RequireWhole("GptModel::NewKvCache"));
  if (capacity > config_.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptModel::NewKvCache: capacity = ", capacity,
        " exceeds the model's max_seq_len = ", config_.max_seq_len));
  }
  return KvCache::Create(config_.num_layers, batch, config_.num_heads, capacity,
                         config_.channels / config_.num_heads, options_.dtype,
                         options_.device, stream);
}

absl::StatusOr<Tensor> GptModel::ForwardCached(const Tensor &tokens,
                                               const std::vector<int64_t> &rows,
                                               KvCache &cache,
                                               const Stream &stream) {
  const char *op = "GptModel::ForwardCached";
  ZE_RETURN_IF_ERROR(RequireWhole(op));
  if (cache.num_layers() != config_.num_layers ||
      cache.num_heads() != config_.num_heads ||
      cache.head_dim() != config_.channels / config_.num_heads ||
      cache.dtype() != options_.dtype || cache.device() != options_.device) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": the cache (", cache.num_layers(), " layers, ", cache.num_heads(),
        " heads of ", cache.head_dim(), ", ", DTypeName(cache.dtype()), " on ",
        cache.device().ToString(), ") is not this model's (",
        config_.num_layers, " layers, ", config_.num_heads, " heads of ",
        config_.channels / config_.num_heads, ", ", DTypeName(options_.dtype),
        " on ", options_.device.ToString(), "); make it with NewKvCache"));
  }
  ZE_ASSIGN_OR_RETURN(
      const CacheSlots slots,
      PrepareCacheSlots(op, tokens, rows, cache, config_.max_seq_len,
                        options_.device, stream));
  const int64_t seq = tokens.size(1);
  const Tensor &row_ids = slots.rows;
  const Tensor &starts = slots.starts;
  const bool empty_prefix = slots.empty_prefix;

  // The settings live for this call only, whatever its outcome.
  embed()->set_position_starts(starts);
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    CausalSelfAttention::CacheSlot slot;
    slot.keys = cache.keys(layer);
    slot.values = cache.values(layer);
    slot.rows = row_ids;
    slot.starts = starts;
    slot.empty_prefix = empty_prefix;
    static_cast<Block *>(blocks()->at(layer))
        ->attn()
        ->set_cache_slot(std::move(slot));
  }
  absl::StatusOr<Tensor> logits =
      ForwardLastPositions(tokens, stream);  // (N, 1, Vp); hooks fire
  embed()->set_position_starts(Tensor());
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    static_cast<Block *>(blocks()->at(layer))->attn()->clear_cache_slot();
  }
  ZE_RETURN_IF_ERROR(logits.status());
  ZE_RETURN_IF_ERROR(cache.Advance(rows, seq));
  return logits;
}

}  // namespace nn
}  // namespace ze
