#include "nn/layers.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/ops.h"
#include "core/status.h"
#include "nn/functional.h"

namespace ze {
namespace nn {
namespace {

// shape with its last dimension replaced by `last`.
Shape WithLastDim(Shape shape, int64_t last) {
  shape.back() = last;
  return shape;
}

absl::Status RequireLastDim(const Tensor &input, int64_t expected,
                            const char *what) {
  if (!input.defined() || input.dim() < 1 || input.shape().back() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " expects input (..., ", expected, "), got ",
        input.defined() ? ShapeToString(input.shape()) : "undefined"));
  }
  return absl::OkStatus();
}

// Parameter data, or undefined for a null parameter (optional bias).
absl::StatusOr<Tensor> DataOrUndefined(const Parameter *parameter) {
  if (parameter == nullptr) return Tensor();
  return parameter->data();
}

absl::StatusOr<Tensor> GradOrUndefined(Parameter *parameter,
                                       const Stream &stream) {
  if (parameter == nullptr) return Tensor();
  return parameter->GradForAccumulation(stream);
}

}  // namespace

// ---------------------------------------------------------------- Linear

Linear::Linear(int64_t in_features, int64_t out_features, bool with_bias,
               const LayerOptions &options, const Initializer &weight_init,
               Activation activation)
    : Module("Linear"), out_features_(out_features), activation_(activation) {
  weight_ = RegisterParameter("weight", {out_features, in_features},
                              options.dtype, options.device, weight_init);
  if (with_bias) {
    bias_ = RegisterParameter("bias", {out_features}, options.dtype,
                              options.device, Initializer::Zeros());
  }
}

Tensor Linear::PendingPreActivation() const {
  if (activation_ != Activation::kGelu || saved_.empty()) return Tensor();
  // Every pending call that saved pushed one record. When some pending call
  // saved none (checkpointed), the top record may belong to an earlier
  // call than the one the next Backward consumes: do not fuse.
  if (saved_.size() != PendingBackwardCalls()) return Tensor();
  return saved_.Top().pre_activation;
}

bool Linear::PendingInputDropped() const {
  // As PendingPreActivation: only when the top record is the next call's.
  if (saved_.empty() || saved_.size() != PendingBackwardCalls()) return false;
  return !saved_.Top().input.defined();
}

void Linear::FuseGeluBackwardIntoNextBackward(const Tensor &pre_activation,
                                              const Tensor &bias_grad) {
  fusion_.gelu_pre_activation = pre_activation;
  fusion_.gelu_bias_grad = bias_grad;
}

void Linear::NextGradIsPreActivation(const Tensor &bias_grad) {
  fusion_.grad_is_pre_activation = true;
  fusion_.pre_activation_bias_grad = bias_grad;
}

absl::StatusOr<Tensor> Linear::ForwardImpl(const Tensor &input,
                                           const Stream &stream) {
  ZE_RETURN_IF_ERROR(RequireLastDim(input, weight_->shape()[1], "Linear"));
  ZE_ASSIGN_OR_RETURN(Tensor weight, weight_->data());
  ZE_ASSIGN_OR_RETURN(Tensor bias, DataOrUndefined(bias_));
  const Shape output_shape = WithLastDim(input.shape(), out_features_);
  ZE_ASSIGN_OR_RETURN(Tensor output, Tensor::Empty(output_shape, input.dtype(),
                                                   input.device()));
  const Tensor residual = std::move(pending_residual_);
  pending_residual_ = Tensor();
  // Selective recompute: the container recomputes the input for Backward.
  const Tensor kept_input = drop_next_input_ ? Tensor() : input;
  drop_next_input_ = false;
  if (activation_ == Activation::kGelu) {
    if (residual.defined()) {
      return absl::InvalidArgumentError(
          "Linear: AddResidualToNextForward needs Activation::kNone");
    }
    ZE_ASSIGN_OR_RETURN(
        Tensor pre_activation,
        Tensor::Empty(output_shape, input.dtype(), input.device()));
    ZE_RETURN_IF_ERROR(
        LinearGeluForward(input, weight, bias, output, pre_activation, stream));
    saved_.Save(Saved{kept_input, pre_activation});
    return output;
  }
  ZE_RETURN_IF_ERROR(
      residual.defined()
          ? LinearForwardAdd(input, weight, bias, residual, output, stream)
          : LinearForward(input, weight, bias, output, stream));
  saved_.Save(Saved{kept_input, Tensor()});
  return output;
}

absl::StatusOr<Tensor> Linear::BackwardImpl(const Tensor &grad_output,
                                            const Stream &stream) {
  const BackwardFusion fusion = std::move(fusion_);
  fusion_ = BackwardFusion();
  ZE_RETURN_IF_ERROR(RequireSaved(!saved_.empty()));
  Saved saved = saved_.Pop();
  if (!saved.input.defined()) {
    // The forward dropped its input (DropInputOfNextForward).
    if (!fusion.recomputed_input.defined()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Linear ", DisplayName(),
          ": the forward kept no input (DropInputOfNextForward) and none "
          "was given for this Backward (ProvideInputForNextBackward)"));
    }
    saved.input = fusion.recomputed_input;
  }
  ZE_ASSIGN_OR_RETURN(Tensor weight, weight_->data());
  // Split (nn/module.h): this part computes the input's gradient only and
  // touches no parameter gradient; the weight and bias gradients are
  // WeightGradients' later, from the same tensors.
  const bool deferring = CurrentBackwardPart() == BackwardPart::kInput;
  // The consumer applied GELU's backward and summed the rows already.
  const Tensor summed_bias_rows = fusion.grad_is_pre_activation
                                      ? fusion.pre_activation_bias_grad
                                      : Tensor();
  Tensor grad_weight, grad_bias;
  if (!deferring) {
    ZE_ASSIGN_OR_RETURN(grad_weight, GradOrUndefined(weight_, stream));
    ZE_ASSIGN_OR_RETURN(grad_bias, GradOrUndefined(bias_, stream));
  }
  // The gradient w.r.t. input @ weight^T + bias, and the bias gradient still
  // to be reduced from it.
  Tensor grad_product = grad_output;
  Tensor grad_bias_to_reduce = grad_bias;
  if (fusion.grad_is_pre_activation) {
    if (grad_bias.defined() && summed_bias_rows.defined()) {
      ZE_RETURN_IF_ERROR(Add(summed_bias_rows, grad_bias, grad_bias, stream));
      grad_bias_to_reduce = Tensor();
    }
  } else if (activation_ == Activation::kGelu) {
    ZE_ASSIGN_OR_RETURN(
        grad_product, Tensor::Empty(saved.pre_activation.shape(),
                                    grad_output.dtype(), grad_output.device()));
    ZE_RETURN_IF_ERROR(
        GeluBackward(grad_output, saved.pre_activation, grad_product, stream));
  }
  // Not needed any more: let it go before grad_input is allocated.
  saved.pre_activation = Tensor();
  if (deferring) {
    DeferWeightGradient([this, grad_product, input = saved.input,
                         summed_bias_rows](const Stream &later) {
      return WeightGradients(grad_product, input, summed_bias_rows, later);
    });
  }
  Tensor grad_input;
  if (fusion.grad_input_into_input && !deferring &&
      saved.input.dtype() == grad_output.dtype()) {
    grad_input = saved.input;
  } else {
    ZE_ASSIGN_OR_RETURN(grad_input,
                        Tensor::Empty(saved.input.shape(), grad_output.dtype(),
                                      grad_output.device()));
  }
  if (fusion.gelu_pre_activation.defined()) {
    if (fusion.grad_input_addend.defined()) {
      return absl::InvalidArgumentError(
          "Linear: AddToNextGradInput cannot join a fused GELU backward");
    }
    // This module's input was gelu(pre_activation): return the gradient
    // w.r.t. pre_activation.
    ZE_RETURN_IF_ERROR(
        GeluLinearBackward(grad_product, saved.input, weight,
                           fusion.gelu_pre_activation, grad_input, grad_weight,
                           grad_bias_to_reduce, fusion.gelu_bias_grad, stream));
    return grad_input;
  }
  ZE_RETURN_IF_ERROR(
      fusion.grad_input_addend.defined()
          ? LinearBackwardAdd(grad_product, saved.input, weight,
                              fusion.grad_input_addend, grad_input, grad_weight,
                              grad_bias_to_reduce, stream)
          : LinearBackward(grad_product, saved.input, weight, grad_input,
                           grad_weight, grad_bias_to_reduce, stream));
  return grad_input;
}

absl::Status Linear::WeightGradients(const Tensor &grad_product,
                                     const Tensor &input,
                                     const Tensor &summed_bias_rows,
                                     const Stream &stream) {
  // The same products and sums as a whole backward's, in the same order.
  ZE_ASSIGN_OR_RETURN(Tensor weight, weight_->data());
  ZE_ASSIGN_OR_RETURN(Tensor grad_weight, GradOrUndefined(weight_, stream));
  ZE_ASSIGN_OR_RETURN(Tensor grad_bias, GradOrUndefined(bias_, stream));
  Tensor grad_bias_to_reduce = grad_bias;
  if (grad_bias.defined() && summed_bias_rows.defined()) {
    ZE_RETURN_IF_ERROR(Add(summed_bias_rows, grad_bias, grad_bias, stream));
    grad_bias_to_reduce = Tensor();
  }
  if (!grad_weight.defined() && !grad_bias_to_reduce.defined()) {
    return absl::OkStatus();
  }
  return LinearBackward(grad_product, input, weight, Tensor(), grad_weight,
                        grad_bias_to_reduce, stream);
}

// ---------------------------------------------------------------- Embedding

Embedding::Embedding(int64_t vocab_size, int64_t max_seq_len, int64_t channels,
                     const LayerOptions &options, float init_std)
    : Module("Embedding"), max_seq_len_(max_seq_len) {
  token_table_ =
      RegisterParameter("wte", {vocab_size, channels}, options.dtype,
                        options.device, Initializer::Normal(init_std));
  position_table_ =
      RegisterParameter("wpe", {max_seq_len, channels}, options.dtype,
                        options.device, Initializer::Normal(init_std));
}

absl::StatusOr<Tensor> Embedding::ForwardImpl(const Tensor &tokens,
                                              const Stream &stream) {
  if (!tokens.defined() || tokens.dim() != 2 || tokens.dtype() != DType::kI32 ||
      tokens.size(1) > max_seq_len_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Embedding expects tokens (B, T <= ", max_seq_len_, ") i32, got ",
        tokens.defined() ? tokens.DebugString() : "undefined"));
  }
  ZE_ASSIGN_OR_RETURN(Tensor wte, token_table_->data());
  ZE_ASSIGN_OR_RETURN(Tensor wpe, position_table_->data());
  // (B, T, C)
  ZE_ASSIGN_OR_RETURN(
      Tensor output,
      Tensor::Empty({tokens.size(0), tokens.size(1), wte.size(1)}, wte.dtype(),
                    wte.device()));
  if (position_starts_.defined()) {
    ZE_RETURN_IF_ERROR(
        EmbeddingForwardAt(tokens, position_starts_, wte, wpe, output, stream));
  } else {
    ZE_RETURN_IF_ERROR(EmbeddingForward(tokens, wte, wpe, output, stream));
  }
  saved_tokens_.Save(tokens);
  return output;
}

absl::StatusOr<Tensor> Embedding::BackwardImpl(const Tensor &grad_output,
                                               const Stream &stream) {
  ZE_RETURN_IF_ERROR(RequireSaved(!saved_tokens_.empty()));
  const Tensor tokens = saved_tokens_.Pop();
  ZE_ASSIGN_OR_RETURN(Tensor grad_wte,
                      token_table_->GradForAccumulation(stream));
  ZE_ASSIGN_OR_RETURN(Tensor grad_wpe,
                      position_table_->GradForAccumulation(stream));
  if (grad_wte.defined() || grad_wpe.defined()) {
    ZE_RETURN_IF_ERROR(
        EmbeddingBackward(grad_output, tokens, grad_wte, grad_wpe, stream));
  }
  return Tensor();
}

// ---------------------------------------------------------------- LayerNorm

LayerNorm::LayerNorm(int64_t channels, const LayerOptions &options)
    : Module("LayerNorm") {
  weight_ = RegisterParameter("weight", {channels}, options.dtype,
                              options.device, Initializer::Ones());
  bias_ = RegisterParameter("bias", {channels}, options.dtype, options.device,
                            Initializer::Zeros());
}

absl::StatusOr<Tensor> LayerNorm::ForwardImpl(const Tensor &input,
                                              const Stream &stream) {
  ZE_RETURN_IF_ERROR(RequireLastDim(input, weight_->shape()[0], "LayerNorm"));
  ZE_ASSIGN_OR_RETURN(Tensor weight, weight_->data());
  ZE_ASSIGN_OR_RETURN(Tensor bias, bias_->data());
  const int64_t rows = input.numel() / input.shape().back();
  ZE_ASSIGN_OR_RETURN(Tensor output, Tensor::Empty(input.shape(), input.dtype(),
                                                   input.device()));
  ZE_ASSIGN_OR_RETURN(Tensor mean,
                      Tensor::Empty({rows}, DType::kF32, input.device()));
  ZE_ASSIGN_OR_RETURN(Tensor rstd,
                      Tensor::Empty({rows}, DType::kF32, input.device()));
  ZE_RETURN_IF_ERROR(
      LayerNormForward(input, weight, bias, output, mean, rstd, stream));
  saved_.Save(Saved{input, mean, rstd});
  return output;
}

absl::StatusOr<Tensor> LayerNorm::BackwardImpl(const Tensor &grad_output,
                                               const Stream &stream) {
  ZE_RETURN_IF_ERROR(RequireSaved(!saved_.empty()));
  const Saved saved = saved_.Pop();
  ZE_ASSIGN_OR_RETURN(Tensor weight, weight_->data());
  ZE_ASSIGN_OR_RETURN(Tensor grad_weight, weight_->GradForAccumulation(stream));
  ZE_ASSIGN_OR_RETURN(Tensor grad_bias, bias_->GradForAccumulation(stream));
  ZE_ASSIGN_OR_RETURN(Tensor grad_input,
                      Tensor::Empty(saved.input.shape(), grad_output.dtype(),
                                    grad_output.device()));
  const Tensor grad_addend = std::move(pending_grad_addend_);
  pending_grad_addend_ = Tensor();
  if (grad_addend.defined()) {
    ZE_RETURN_IF_ERROR(LayerNormBackwardAdd(
        grad_output, saved.input, weight, saved.mean, saved.rstd, grad_addend,
        grad_input, grad_weight, grad_bias, stream));
  } else {
    ZE_RETURN_IF_ERROR(LayerNormBackward(grad_output, saved.input, weight,
                                         saved.mean, saved.rstd, grad_input,
                                         grad_weight, grad_bias, stream));
  }
  return grad_input;
}

// ---------------------------------------------------------------- Gelu

absl::StatusOr<Tensor> Gelu::ForwardImpl(const Tensor &input,
                                         const Stream &stream) {
  ZE_ASSIGN_OR_RETURN(Tensor output, Tensor::Empty(input.shape(), input.dtype(),
                                                   input.device()));
  ZE_RETURN_IF_ERROR(GeluForward(input, output, stream));
  saved_inputs_.Save(input);
  return output;
}

absl::StatusOr<Tensor> Gelu::BackwardImpl(const Tensor &grad_output,
                                          const Stream &stream) {
  ZE_RETURN_IF_ERROR(RequireSaved(!saved_inputs_.empty()));
  const Tensor input = saved_inputs_.Pop();
  ZE_ASSIGN_OR_RETURN(
      Tensor grad_input,
      Tensor::Empty(input.shape(), grad_output.dtype(), grad_output.device()));
  ZE_RETURN_IF_ERROR(GeluBackward(grad_output, input, grad_input, stream));
  return grad_input;
}

// ---------------------------------------------------------------- Attention

CausalSelfAttention::CausalSelfAttention(int64_t channels, int num_heads,
                                         int num_layers,
                                         const LayerOptions &options)
    : Module("CausalSelfAttention"), num_heads_(num_heads) {
  ZE_CHECK(num_heads > 0 && channels % num_heads == 0);
  qkv_ = RegisterChild(
      "qkv", std::make_unique<Linear>(channels, 3 * channels, true, options));
  proj_ = RegisterChild(
      "proj",
      std::make_unique<Linear>(channels, channels, true, options,
                               Initializer::ScaledResidual(0.02f, num_layers)));
}

absl::StatusOr<Tensor> CausalSelfAttention::ForwardImpl(const Tensor &input,
                                                        const Stream &stream) {
  if (!input.defined() || input.dim() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CausalSelfAttention expects input (B, T, C), got ",
        input.defined() ? ShapeToString(input.shape()) : "undefined"));
  }
  const int64_t batch = input.size(0), seq = input.size(1),
                channels = input.size(2);
  ZE_ASSIGN_OR_RETURN(Tensor qkv, qkv_->Forward(input, stream));  // (B,T,3C)
  ZE_ASSIGN_OR_RETURN(
      Tensor attended,  // (B, T, C)
      Tensor::Empty({batch, seq, channels}, input.dtype(), input.device()));
  if (has_cache_slot_) {
    // Incremental decoding: the new positions' keys and values join the
    // cache; a prefill attends over the input alone (the same thing, with
    // the fast causal kernel), a decode step over the cached prefix.
    const CacheSlot &slot = cache_slot_;
    if (slot.empty_prefix) {
      ZE_ASSIGN_OR_RETURN(
          Tensor logsumexp,  // (B, H, T), not kept
          Tensor::Empty({batch, num_heads_, seq}, DType::kF32, input.device()));
      ZE_RETURN_IF_ERROR(
          AttentionForward(qkv, num_heads_, attended, logsumexp, stream));
      ZE_RETURN_IF_ERROR(KvCacheWrite(qkv, slot.rows, slot.starts, num_heads_,
                                      slot.keys, slot.values, stream));
    } else {
      ZE_RETURN_IF_ERROR(KvCacheWrite(qkv, slot.rows, slot.starts, num_heads_,
                                      slot.keys, slot.values, stream));
      ZE_RETURN_IF_ERROR(CachedAttentionForward(qkv, slot.rows, slot.starts,
                                                num_heads_, slot.keys,
                                                slot.values, attended, stream));
    }
    return proj_->Forward(attended, stream);
  }
  ZE_ASSIGN_OR_RETURN(
      Tensor logsumexp,  // (B, H, T)
      Tensor::Empty({batch, num_heads_, seq}, DType::kF32, input.device()));
  ZE_RETURN_IF_ERROR(
      AttentionForward(qkv, num_heads_, attended, logsumexp, stream));
  saved_.Save(Saved{qkv, attended, logsumexp});
  return proj_->Forward(attended, stream);
}

absl::StatusOr<Tensor> CausalSelfAttention::BackwardImpl(
    const Tensor &grad_output, const Stream &stream) {
  ZE_RETURN_IF_ERROR(RequireSaved(!saved_.empty()));
  const Saved saved = saved_.Pop();
  // (B, T, C)
  ZE_ASSIGN_OR_RETURN(Tensor grad_attended,
                      proj_->Backward(grad_output, stream));
  // (B, T, 3C)
  ZE_ASSIGN_OR_RETURN(Tensor grad_qkv,
                      Tensor::Empty(saved.qkv.shape(), grad_output.dtype(),
                                    grad_output.device()));
  ZE_RETURN_IF_ERROR(AttentionBackward(grad_attended, saved.qkv, saved.output,
                                       saved.logsumexp, num_heads_, grad_qkv,
                                       stream));
  return qkv_->Backward(grad_qkv, stream);
}

// ---------------------------------------------------------------- Mlp

Mlp::Mlp(int64_t channels, int num_layers, const LayerOptions &options)
    : Module("Mlp") {
  fc_ = RegisterChild(
      "fc", std::make_unique<Linear>(channels, 4 * channels, true, options,
                                     Initializer::Normal(0.02f),
                                     Linear::Activation::kGelu));
  proj_ = RegisterChild(
      "proj",
      std::make_unique<Linear>(4 * channels, channels, true, options,
                               Initializer::ScaledResidual(0.02f, num_layers)));
}

absl::StatusOr<Tensor> Mlp::ForwardImpl(const Tensor &input,
                                        const Stream &stream) {
  ZE_ASSIGN_OR_RETURN(Tensor hidden, fc_->Forward(input, stream));  // gelu'd
  // Selective recompute: proj keeps no (..., 4C) input; the backward
  // recomputes it from fc's pre-activation, which fc saves anyway (not when
  // either is checkpointed: fc then saves no pre-activation, proj's
  // recomputation saves its own input).
  if (recompute_activation() && SavingEnabled() &&
      !fc_->activation_checkpointing() && !proj_->activation_checkpointing()) {
    proj_->DropInputOfNextForward();
  }
  return proj_->Forward(hidden, stream);
}

absl::StatusOr<Tensor> Mlp::BackwardImpl(const Tensor &grad_output,
                                         const Stream &stream) {
  // Handed to proj (this reference is dropped then): fc's Backward, which
  // no longer needs it, then runs without the (..., 4C) tensor alive.
  Tensor pre_activation = fc_->PendingPreActivation();
  if (!pre_activation.defined()) {
    // fc recomputes its forward in its own Backward: no fusion.
    ZE_ASSIGN_OR_RETURN(Tensor grad_hidden,
                        proj_->Backward(grad_output, stream));
    return fc_->Backward(grad_hidden, stream);
  }
  // fc's bias gradient, reduced by proj's fused product and added by fc.
  Tensor fc_bias_grad;
  const Parameter *fc_bias = fc_->bias();
  if (fc_bias != nullptr && fc_bias->requires_grad()) {
    ZE_ASSIGN_OR_RETURN(
        fc_bias_grad,
        Tensor::Empty(fc_bias->shape(), DType::kF32, grad_output.device()));
    ZE_RETURN_IF_ERROR(Fill(fc_bias_grad, 0.0f, stream));
  }
  if (proj_->PendingInputDropped()) {
    // proj's input, gelu(pre_activation), recomputed. Bit for bit the
    // forward's in f32; in bf16/f16 the forward's GELU read the unrounded
    // pre-activation (fused into fc's product), this one the rounded one.
    ZE_ASSIGN_OR_RETURN(Tensor hidden, Tensor::Empty(pre_activation.shape(),
                                                     pre_activation.dtype(),
                                                     pre_activation.device()));
    ZE_RETURN_IF_ERROR(GeluForward(pre_activation, hidden, stream));
    proj_->ProvideInputForNextBackward(std::move(hidden));
  }
  proj_->FuseGeluBackwardIntoNextBackward(pre_activation, fc_bias_grad);
  // proj's input, gelu(pre_activation), is this module's own: its buffer
  // takes the pre-activation's gradient.
  proj_->WriteGradInputIntoInputInNextBackward();
  pre_activation = Tensor();
  absl::StatusOr<Tensor> grad_pre_activation =
      proj_->Backward(grad_output, stream);
  if (!grad_pre_activation.ok()) {
    proj_->ClearBackwardFusion();
    return grad_pre_activation.status();
  }
  fc_->NextGradIsPreActivation(fc_bias_grad);
  absl::StatusOr<Tensor> grad_input =
      fc_->Backward(*grad_pre_activation, stream);
  if (!grad_input.ok()) fc_->ClearBackwardFusion();
  return grad_input;
}

// ---------------------------------------------------------------- Block

Block::Block(int64_t channels, int num_heads, int num_layers,
             const LayerOptions &options)
    : Module("Block") {
  ln1_ = RegisterChild("ln1", std::make_unique<LayerNorm>(channels, options));
  attn_ = RegisterChild("attn", std::make_unique<CausalSelfAttention>(
                                    channels, num_heads, num_layers, options));
  ln2_ = RegisterChild("ln2", std::make_unique<LayerNorm>(channels, options));
  mlp_ = RegisterChild("mlp",
                       std::make_unique<Mlp>(channels, num_layers, options));
}

absl::StatusOr<Tensor> Block::ForwardImpl(const Tensor &input,
                                          const Stream &stream) {
  ZE_ASSIGN_OR_RETURN(Tensor normed, ln1_->Forward(input, stream));
  // Both residual sums are formed by the branches' output projections: the
  // product adds the residual as its C matrix (LinearForwardAdd), so no
  // separate pass over the activations.
  // residual = input + attn(ln1(input)).
  // A failed call leaves its one-shot setting unconsumed: drop it, so it
  // neither holds the activation nor reaches a later, unrelated call.
  attn_->proj()->AddResidualToNextForward(input);
  absl::StatusOr<Tensor> residual = attn_->Forward(normed, stream);
  if (!residual.ok()) {
    attn_->proj()->AddResidualToNextForward(Tensor());
    return residual.status();
  }
  ZE_ASSIGN_OR_RETURN(Tensor normed2, ln2_->Forward(*residual, stream));
  // output = residual + mlp(ln2(residual)).
  mlp_->proj()->AddResidualToNextForward(*residual);
  absl::StatusOr<Tensor> output = mlp_->Forward(normed2, stream);
  if (!output.ok()) mlp_->proj()->AddResidualToNextForward(Tensor());
  return output;
}

absl::StatusOr<Tensor> Block::BackwardImpl(const Tensor &grad_output,
                                           const Stream &stream) {
  // d(residual) = d(out) + ln2'(mlp'(d(out))) and d(in) = d(residual) +
  // ln1'(attn'(d(residual))): both sums are formed by the LayerNorm
  // backward kernels as they write their input gradients.
  ZE_ASSIGN_OR_RETURN(Tensor grad_mlp_in, mlp_->Backward(grad_output, stream));
  ln2_->AddToNextGradInput(grad_output);
  absl::StatusOr<Tensor> grad_residual = ln2_->Backward(grad_mlp_in, stream);
  if (!grad_residual.ok()) {
    ln2_->AddToNextGradInput(Tensor());
    return grad_residual.status();
  }
  ZE_ASSIGN_OR_RETURN(Tensor grad_attn_in,
                      attn_->Backward(*grad_residual, stream));
  ln1_->AddToNextGradInput(*grad_residual);
  absl::StatusOr<Tensor> grad_input = ln1_->Backward(grad_attn_in, stream);
  if (!grad_input.ok()) ln1_->AddToNextGradInput(Tensor());
  return grad_input;
}

// ---------------------------------------------------------------- Output head

OutputHead::OutputHead(int64_t channels, int64_t vocab,
                       const LayerOptions &options,
                       const Initializer &weight_init)
    : Module("OutputHead") {
  weight_ = RegisterParameter("weight", {vocab, channels}, options.dtype,
                              options.device, weight_init);
}

OutputHead::OutputHead(std::shared_ptr<Parameter> table)
    : Module("TiedOutputHead"), weight_(table.get()) {
  ZE_CHECK(weight_ != nullptr && weight_->shape().size() == 2);
  UseSharedParameter(std::move(table));
}

int64_t OutputHead::LossChunkRowsFor(int64_t vocab, DType dtype) {
  const int64_t row_bytes =
      std::max<int64_t>(1, vocab * static_cast<int64_t>(SizeOf(dtype)));
  const int64_t rows = kLossChunkBytes / row_bytes;
  if (rows < 128) return std::max<int64_t>(1, rows);
  return rows / 128 * 128;
}

int64_t OutputHead::loss_chunk_rows(int64_t rows, DType dtype) const {
  return LossChunkRows(rows, weight_->shape()[0], dtype, loss_chunk_rows_);
}

int64_t OutputHead::LossChunkRows(int64_t rows, int64_t vocab, DType dtype,
                                  int64_t set_rows) {
  if (set_rows > 0) return set_rows;
  const int64_t limit = LossChunkRowsFor(vocab, dtype);
  if (rows <= limit) return std::max<int64_t>(rows, 1);
  const int64_t chunks = (rows + limit - 1) / limit;
  const int64_t even = (rows + chunks - 1) / chunks;
  if (limit < 128) return even;
  // limit is a multiple of 128 here, so the rounding stays within it.
  return std::min(limit, (even + 127) / 128 * 128);
}

OutputHead::LossBuffers OutputHead::LossBuffersFor(
    int64_t rows, int64_t channels, int64_t vocab, DType dtype,
    int64_t set_rows, bool trainable_weight, WeightGradient where) {
  // As ForwardImpl allocates them.
  const int64_t element = static_cast<int64_t>(SizeOf(dtype));
  const int64_t chunk = std::max<int64_t>(
      std::min(rows, LossChunkRows(rows, vocab, dtype, set_rows)), 1);
  LossBuffers buffers;
  buffers.logits_chunk_bytes = chunk * vocab * element;
  buffers.losses_bytes = rows * static_cast<int64_t>(sizeof(float));
  buffers.saved_bytes = rows * channels * element;
  if (trainable_weight) {
    buffers.saved_bytes +=
        where == WeightGradient::kInBackward && dtype != DType::kF16
            ? rows * channels * element +
                  rows * static_cast<int64_t>(sizeof(float))
            : vocab * channels * static_cast<int64_t>(sizeof(float));
  }
  return buffers;
}

absl::StatusOr<Tensor> OutputHead::ForwardImpl(const Tensor &input,
                                               const Stream &stream) {
  const Tensor targets = std::move(pending_targets_);
  pending_targets_ = Tensor();
  ZE_RETURN_IF_ERROR(
      RequireLastDim(input, weight_->shape()[1], type_name().c_str()));
  ZE_ASSIGN_OR_RETURN(Tensor weight, weight_->data());
  const int64_t vocab = weight.size(0);
  if (!targets.defined()) {
    // (..., V)
    ZE_ASSIGN_OR_RETURN(Tensor logits,
                        Tensor::Empty(WithLastDim(input.shape(), vocab),
                                      input.dtype(), input.device()));
    ZE_RETURN_IF_ERROR(LinearForward(input, weight, Tensor(), logits, stream));
    saved_.Save(Saved{input});
    return logits;
  }
  for (const Module *module = this; module != nullptr;
       module = module->parent()) {
    if (module->activation_checkpointing()) {
      // Its recomputation in backward would run this head without targets.
      return absl::FailedPreconditionError(
          absl::StrCat("the loss mode of ", DisplayName(),
                       " does not support activation checkpointing of ",
                       module->DisplayName()));
    }
  }
  const int64_t rows = input.numel() / input.shape().back();
  const int64_t chunk = std::min(rows, loss_chunk_rows(rows, input.dtype()));
  // (R, V): one chunk of logits, reused by every chunk; freed on return.
  ZE_ASSIGN_OR_RETURN(const Tensor logits,
                      Tensor::Empty({std::max<int64_t>(chunk, 1), vocab},
                                    input.dtype(), input.device()));
  ZE_ASSIGN_OR_RETURN(Tensor losses, Tensor::Empty(targets.shape(), DType::kF32,
                                                   input.device()));
  Saved saved;
  saved.loss = true;
  if (SavingEnabled()) {
    ZE_ASSIGN_OR_RETURN(
        saved.grad_input,
        Tensor::Empty(input.shape(), input.dtype(), input.device()));
    if (weight_->requires_grad() &&
        weight_gradient_ == WeightGradient::kInBackward &&
        input.dtype() != DType::kF16) {
      ZE_ASSIGN_OR_RETURN(saved.logsumexp,
                          Tensor::Empty({rows}, DType::kF32, input.device()));
      saved.input = input;
      saved.targets = targets;
      saved.classes = pending_classes_;
    } else if (weight_->requires_grad()) {
      ZE_ASSIGN_OR_RETURN(
          saved.grad_weight,
          Tensor::Empty(weight.shape(), DType::kF32, input.device()));
      ZE_RETURN_IF_ERROR(Fill(saved.grad_weight, 0.0f, stream));
    }
  }
  ZE_RETURN_IF_ERROR(LinearCrossEntropyForward(
      input, weight, targets, logits, losses, stream, pending_classes_,
      saved.grad_input, saved.grad_weight, saved.logsumexp));
  saved_.Save(std::move(saved));
  return losses;
}

absl::StatusOr<Tensor> OutputHead::BackwardImpl(const Tensor &grad_output,
                                                const Stream &stream) {
  ZE_RETURN_IF_ERROR(RequireSaved(!saved_.empty()));
  Saved saved = saved_.Pop();
  ZE_ASSIGN_OR_RETURN(Tensor grad_weight, weight_->GradForAccumulation(stream));
  if (!saved.loss) {
    ZE_ASSIGN_OR_RETURN(Tensor weight, weight_->data());
    ZE_ASSIGN_OR_RETURN(Tensor grad_input,
                        Tensor::Empty(saved.input.shape(), grad_output.dtype(),
                                      grad_output.device()));
    ZE_RETURN_IF_ERROR(LinearBackward(grad_output, saved.input, weight,
                                      grad_input, grad_weight, Tensor(),
                                      stream));
    return grad_input;
  }
  if (!grad_output.defined() || grad_output.numel() != 1 ||
      grad_output.dtype() != DType::kF32 || !grad_output.device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(
        type_name(),
        ": the backward of a loss-mode forward takes the gradient of each "
        "counted row's loss as one f32 value on the host, got ",
        grad_output.defined() ? grad_output.DebugString() : "undefined"));
  }
  const float grad_scale = *grad_output.data_as<const float>();
  if (grad_weight.defined() && saved.grad_weight.defined()) {
    ZE_RETURN_IF_ERROR(Axpby(grad_scale, saved.grad_weight, 1.0f, grad_weight,
                             grad_weight, stream));
  }
  if (grad_weight.defined() && saved.logsumexp.defined()) {
    // A vocabulary slice of as many logits as one forward chunk held.
    ZE_ASSIGN_OR_RETURN(Tensor weight, weight_->data());
    const int64_t vocab = weight.size(0);
    const int64_t rows = saved.logsumexp.numel();
    const int64_t chunk =
        std::min(rows, loss_chunk_rows(rows, saved.input.dtype()));
    int64_t width = std::clamp<int64_t>(
        chunk * vocab / std::max<int64_t>(rows, 1), 1, vocab);
    if (width >= 128 && width < vocab) width = width / 128 * 128;
    ZE_ASSIGN_OR_RETURN(Tensor workspace,
                        Tensor::Empty({rows, width}, saved.input.dtype(),
                                      saved.input.device()));
    ZE_RETURN_IF_ERROR(LinearCrossEntropyWeightGradient(
        saved.input, weight, saved.targets, saved.logsumexp, grad_scale,
        workspace, grad_weight, stream, saved.classes));
  }
  ZE_RETURN_IF_ERROR(Scale(saved.grad_input, grad_scale, stream));
  return saved.grad_input;
}

// ---------------------------------------------------------------- Repeat

Repeat::Repeat(std::unique_ptr<Module> layer, int times)
    : Module("Repeat"), times_(times) {
  ZE_CHECK(times >= 1);
  layer_ = RegisterChild("layer", std::move(layer));
}

absl::StatusOr<Tensor> Repeat::ForwardImpl(const Tensor &input,
                                           const Stream &stream) {
  Tensor activation = input;
  for (int i = 0; i < times_; ++i) {
    ZE_ASSIGN_OR_RETURN(activation, layer_->Forward(activation, stream));
  }
  return activation;
}

absl::StatusOr<Tensor> Repeat::BackwardImpl(const Tensor &grad_output,
                                            const Stream &stream) {
  Tensor grad = grad_output;
  for (int i = 0; i < times_; ++i) {
    ZE_ASSIGN_OR_RETURN(grad, layer_->Backward(grad, stream));
  }
  return grad;
}

}  // namespace nn
}  // namespace ze
