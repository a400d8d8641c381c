#include "nn/gpt.h"

#include <cmath>

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
    {"124M", 12, 12, 768},  {"350M", 24, 16, 1024}, {"760M", 24, 16, 1536},
    {"1.3B", 24, 32, 2048}, {"2.7B", 32, 32, 2560}, {"6.7B", 32, 32, 4096},
    {"13B", 40, 40, 5120},
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
    : LossModel("GptModel"), config_(config), options_(options) {
  const LayerOptions layer_options{options.device, options.dtype};
  embed_ = RegisterChild("embed", std::make_unique<Embedding>(
                                      config.table_rows(), config.max_seq_len,
                                      config.channels, layer_options));
  blocks_ = RegisterChild("blocks", std::make_unique<Sequential>());
  for (int layer = 0; layer < config.num_layers; ++layer) {
    Block *block = blocks_->Append(std::make_unique<Block>(
        config.channels, config.num_heads, config.num_layers, layer_options));
    block->set_activation_checkpointing(config.activation_checkpointing);
  }
  ln_f_ = RegisterChild(
      "ln_f", std::make_unique<LayerNorm>(config.channels, layer_options));
  lm_head_ = RegisterChild("lm_head", std::make_unique<TiedOutputHead>(
                                          embed_->shared_token_table()));
}

absl::StatusOr<std::unique_ptr<GptModel>> GptModel::Create(
    const GptConfig &config, const GptOptions &options, const Stream &stream) {
  ZE_RETURN_IF_ERROR(config.Validate());
  if (options.dtype == DType::kI32) {
    return absl::InvalidArgumentError("GptOptions: dtype must be a float type");
  }
  std::unique_ptr<GptModel> model(new GptModel(config, options));
  if (options.materialize) {
    ZE_RETURN_IF_ERROR(model->MaterializeParameters(options.seed, stream));
  }
  return model;
}

absl::StatusOr<Tensor> GptModel::ForwardImpl(const Tensor &tokens,
                                             const Stream &stream) {
  ZE_ASSIGN_OR_RETURN(Tensor x, embed_->Forward(tokens, stream));  // (B,T,C)
  ZE_ASSIGN_OR_RETURN(x, blocks_->Forward(x, stream));
  ZE_ASSIGN_OR_RETURN(x, ln_f_->Forward(x, stream));
  return lm_head_->Forward(x, stream);  // (B, T, Vp)
}

absl::StatusOr<Tensor> GptModel::BackwardImpl(const Tensor &grad_logits,
                                              const Stream &stream) {
  ZE_ASSIGN_OR_RETURN(Tensor grad, lm_head_->Backward(grad_logits, stream));
  ZE_ASSIGN_OR_RETURN(grad, ln_f_->Backward(grad, stream));
  ZE_ASSIGN_OR_RETURN(grad, blocks_->Backward(grad, stream));
  return embed_->Backward(grad, stream);
}

void GptModel::ClearSavedStateImpl() {
  logits_ = Tensor();
  targets_ = Tensor();
}

absl::StatusOr<float> GptModel::ForwardLoss(const Tensor &tokens,
                                            const Tensor &targets,
                                            const Stream &stream) {
  if (!targets.defined() || !tokens.defined() ||
      targets.shape() != tokens.shape() || targets.dtype() != DType::kI32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ForwardLoss: targets must be i32 with the shape of tokens ",
        tokens.defined() ? ShapeToString(tokens.shape()) : "(undefined)",
        ", got ", targets.defined() ? targets.DebugString() : "undefined"));
  }
  ZE_ASSIGN_OR_RETURN(Tensor logits, Forward(tokens, stream));  // (B, T, Vp)
  ZE_ASSIGN_OR_RETURN(
      Tensor losses,  // (B * T)
      Tensor::Empty({targets.numel()}, DType::kF32, logits.device()));
  ZE_RETURN_IF_ERROR(CrossEntropyForward(logits, targets, losses, stream));
  // One read back per step: the per-row losses and which rows count.
  Tensor host_losses = losses;
  Tensor host_targets = targets;
  if (logits.device().is_cuda()) {
    ZE_ASSIGN_OR_RETURN(
        host_losses, Tensor::Empty(losses.shape(), DType::kF32, Device::Cpu()));
    ZE_ASSIGN_OR_RETURN(
        host_targets,
        Tensor::Empty(targets.shape(), DType::kI32, Device::Cpu()));
    ZE_RETURN_IF_ERROR(Copy(losses, host_losses, stream));
    ZE_RETURN_IF_ERROR(Copy(targets, host_targets, stream));
    ZE_RETURN_IF_ERROR(stream.Synchronize());
  }
  const float *loss_values = host_losses.data_as<const float>();
  const int32_t *target_ids = host_targets.data_as<const int32_t>();
  double sum = 0.0;
  int64_t counted = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) {
    if (target_ids[i] < 0) continue;
    sum += loss_values[i];
    ++counted;
  }
  logits_ = logits;
  targets_ = targets;
  counted_targets_ = counted;
  return counted > 0 ? static_cast<float>(sum / counted) : 0.0f;
}

absl::Status GptModel::BackwardLoss(float loss_scale, const Stream &stream) {
  if (!logits_.defined()) {
    return absl::FailedPreconditionError(
        "GptModel::BackwardLoss without a preceding ForwardLoss");
  }
  Tensor logits = std::move(logits_);
  Tensor targets = std::move(targets_);
  logits_ = Tensor();
  targets_ = Tensor();
  const float grad_scale =
      counted_targets_ > 0 ? loss_scale / static_cast<float>(counted_targets_)
                           : 0.0f;
  // In place: the logits are not needed once their gradient is formed.
  ZE_RETURN_IF_ERROR(
      CrossEntropyBackward(logits, targets, grad_scale, logits, stream));
  return Backward(logits, stream).status();
}

}  // namespace nn
}  // namespace ze
