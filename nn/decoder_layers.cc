#include "nn/decoder_layers.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/ops.h"
#include "core/status.h"
#include "core/stream.h"
#include "nn/functional.h"

namespace ze {
namespace nn {
namespace {

absl::StatusOr<Tensor> GradOrUndefined(Parameter *parameter,
                                       const Stream &stream) {
  if (parameter == nullptr) return Tensor();
  return parameter->GradForAccumulation(stream);
}

// x (B, T, H) -> x viewed as (B, T, heads, head_dim).
Tensor Heads(const Tensor &x, int64_t heads, int64_t head_dim) {
  return x.View({x.size(0), x.size(1), heads, head_dim});
}

// x (B, T, heads, D) -> x viewed as (B, T, heads * D).
Tensor Flat3(const Tensor &x) {
  return x.View({x.size(0), x.size(1), x.size(2) * x.size(3)});
}

}  // namespace

// ---------------------------------------------------------------- RmsNorm

RmsNorm::RmsNorm(int64_t channels, double eps, const LayerOptions &options)
    : Module("RmsNorm"), eps_(static_cast<float>(eps)) {
  weight_ = RegisterParameter("weight", {channels}, options.dtype,
                              options.device, Initializer::Ones());
}

absl::StatusOr<Tensor> RmsNorm::ForwardImpl(const Tensor &input,
                                            const Stream &stream) {
  const int64_t channels = weight_->shape()[0];
  if (!input.defined() || input.dim() < 1 || input.shape().back() != channels) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RmsNorm expects input (..., ", channels, "), got ",
        input.defined() ? ShapeToString(input.shape()) : "undefined"));
  }
  ZE_ASSIGN_OR_RETURN(Tensor weight, weight_->data());
  ZE_ASSIGN_OR_RETURN(Tensor output, Tensor::Empty(input.shape(), input.dtype(),
                                                   input.device()));
  ZE_ASSIGN_OR_RETURN(Tensor rstd, Tensor::Empty({input.numel() / channels},
                                                 DType::kF32, input.device()));
  ZE_RETURN_IF_ERROR(RmsNormForward(input, weight, eps_, output, rstd, stream));
  saved_.Save(Saved{input, rstd});
  return output;
}

absl::StatusOr<Tensor> RmsNorm::BackwardImpl(const Tensor &grad_output,
                                             const Stream &stream) {
  const Tensor grad_addend = std::move(pending_grad_addend_);
  pending_grad_addend_ = Tensor();
  ZE_RETURN_IF_ERROR(RequireSaved(!saved_.empty()));
  const Saved saved = saved_.Pop();
  ZE_ASSIGN_OR_RETURN(Tensor weight, weight_->data());
  ZE_ASSIGN_OR_RETURN(Tensor grad_weight, weight_->GradForAccumulation(stream));
  ZE_ASSIGN_OR_RETURN(Tensor grad_input,
                      Tensor::Empty(saved.input.shape(), grad_output.dtype(),
                                    grad_output.device()));
  ZE_RETURN_IF_ERROR(
      grad_addend.defined()
          ? RmsNormBackwardAdd(grad_output, saved.input, weight, saved.rstd,
                               grad_addend, grad_input, grad_weight, stream)
          : RmsNormBackward(grad_output, saved.input, weight, saved.rstd,
                            grad_input, grad_weight, stream));
  return grad_input;
}

// ---------------------------------------------------------------- Embedding

TokenEmbedding::TokenEmbedding(int64_t vocab_size, int64_t hidden_size,
                               const LayerOptions &options, float init_std)
    : Module("TokenEmbedding") {
  weight_ =
      RegisterParameter("weight", {vocab_size, hidden_size}, options.dtype,
                        options.device, Initializer::Normal(init_std));
}

absl::StatusOr<Tensor> TokenEmbedding::ForwardImpl(const Tensor &tokens,
                                                   const Stream &stream) {
  if (!tokens.defined() || tokens.dim() != 2 || tokens.dtype() != DType::kI32) {
    return absl::InvalidArgumentError(
        absl::StrCat("TokenEmbedding expects tokens (B, T) i32, got ",
                     tokens.defined() ? tokens.DebugString() : "undefined"));
  }
  ZE_ASSIGN_OR_RETURN(Tensor table, weight_->data());
  ZE_ASSIGN_OR_RETURN(
      Tensor output,  // (B, T, H)
      Tensor::Empty({tokens.size(0), tokens.size(1), table.size(1)},
                    table.dtype(), table.device()));
  ZE_RETURN_IF_ERROR(EmbeddingForward(tokens, table, Tensor(), output, stream));
  saved_tokens_.Save(tokens);
  return output;
}

absl::StatusOr<Tensor> TokenEmbedding::BackwardImpl(const Tensor &grad_output,
                                                    const Stream &stream) {
  ZE_RETURN_IF_ERROR(RequireSaved(!saved_tokens_.empty()));
  const Tensor tokens = saved_tokens_.Pop();
  ZE_ASSIGN_OR_RETURN(Tensor grad_table, weight_->GradForAccumulation(stream));
  if (grad_table.defined()) {
    ZE_RETURN_IF_ERROR(
        EmbeddingBackward(grad_output, tokens, grad_table, Tensor(), stream));
  }
  return Tensor();
}

// ---------------------------------------------------------------- Attention

GroupedQueryAttention::GroupedQueryAttention(const DecoderConfig &config,
                                             const LayerOptions &options)
    : Module("GroupedQueryAttention"),
      num_heads_(config.num_heads),
      num_kv_heads_(config.num_kv_heads),
      head_dim_(config.head_dim),
      inv_freq_(RopeInverseFrequencies(config.head_dim, config.rope_theta,
                                       config.rope_scaling)) {
  ZE_CHECK(num_heads_ > 0 && num_kv_heads_ > 0 &&
           num_heads_ % num_kv_heads_ == 0 && head_dim_ % 2 == 0);
  const int64_t hidden = config.hidden_size;
  const int64_t q_width = num_heads_ * head_dim_;
  const int64_t kv_width = num_kv_heads_ * head_dim_;
  q_proj_ = RegisterChild(
      "q_proj",
      std::make_unique<Linear>(hidden, q_width, config.qkv_bias, options));
  k_proj_ = RegisterChild(
      "k_proj",
      std::make_unique<Linear>(hidden, kv_width, config.qkv_bias, options));
  v_proj_ = RegisterChild(
      "v_proj",
      std::make_unique<Linear>(hidden, kv_width, config.qkv_bias, options));
  o_proj_ = RegisterChild(
      "o_proj", std::make_unique<Linear>(q_width, hidden, false, options));
  if (config.qk_norm) {
    q_norm_ = RegisterChild(
        "q_norm",
        std::make_unique<RmsNorm>(head_dim_, config.rms_norm_eps, options));
    k_norm_ = RegisterChild(
        "k_norm",
        std::make_unique<RmsNorm>(head_dim_, config.rms_norm_eps, options));
  }
}

absl::StatusOr<Tensor> GroupedQueryAttention::DeviceInvFreq(
    const Device &device, const Stream &stream) {
  if (!device_inv_freq_.defined() || device_inv_freq_.device() != device) {
    StreamGuard guard(stream);
    ZE_ASSIGN_OR_RETURN(
        device_inv_freq_,
        FromHostFloats(inv_freq_, {static_cast<int64_t>(inv_freq_.size())},
                       DType::kF32, device, stream));
  }
  return device_inv_freq_;
}

absl::StatusOr<Tensor> GroupedQueryAttention::ForwardImpl(
    const Tensor &input, const Stream &stream) {
  if (!input.defined() || input.dim() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GroupedQueryAttention expects input (B, T, H), got ",
        input.defined() ? ShapeToString(input.shape()) : "undefined"));
  }
  const int64_t batch = input.size(0), seq = input.size(1);
  ZE_ASSIGN_OR_RETURN(const Tensor inv_freq,
                      DeviceInvFreq(input.device(), stream));
  ZE_ASSIGN_OR_RETURN(Tensor q, q_proj_->Forward(input, stream));
  ZE_ASSIGN_OR_RETURN(Tensor k, k_proj_->Forward(input, stream));
  ZE_ASSIGN_OR_RETURN(Tensor v, v_proj_->Forward(input, stream));
  q = Heads(q, num_heads_, head_dim_);     // (B, T, Hq, D)
  k = Heads(k, num_kv_heads_, head_dim_);  // (B, T, Hkv, D)
  v = Heads(v, num_kv_heads_, head_dim_);  // (B, T, Hkv, D)
  if (q_norm_ != nullptr) {
    // Qwen3: RMSNorm of each head's vector, before RoPE.
    ZE_ASSIGN_OR_RETURN(q, q_norm_->Forward(q, stream));
    ZE_ASSIGN_OR_RETURN(k, k_norm_->Forward(k, stream));
  }
  // In place: q and k are fresh outputs no module keeps (a Linear and an
  // RmsNorm save their inputs, not their outputs).
  const Tensor starts = has_cache_slot_ ? cache_slot_.starts : Tensor();
  ZE_RETURN_IF_ERROR(RotaryEmbeddingForward(q, inv_freq, starts, q, stream));
  ZE_RETURN_IF_ERROR(RotaryEmbeddingForward(k, inv_freq, starts, k, stream));
  ZE_ASSIGN_OR_RETURN(Tensor attended,  // (B, T, Hq, D)
                      Tensor::Empty(q.shape(), input.dtype(), input.device()));
  if (has_cache_slot_) {
    const CacheSlot &slot = cache_slot_;
    ZE_RETURN_IF_ERROR(GroupedKvCacheWrite(k, v, slot.rows, slot.starts,
                                           slot.keys, slot.values, stream));
    ZE_RETURN_IF_ERROR(GroupedCachedAttentionForward(
        q, slot.rows, slot.starts, slot.keys, slot.values, attended, stream));
    return o_proj_->Forward(Flat3(attended), stream);
  }
  ZE_ASSIGN_OR_RETURN(
      Tensor logsumexp,  // (B, Hq, T)
      Tensor::Empty({batch, num_heads_, seq}, DType::kF32, input.device()));
  ZE_RETURN_IF_ERROR(
      GroupedAttentionForward(q, k, v, attended, logsumexp, stream));
  saved_.Save(Saved{q, k, v, attended, logsumexp});
  return o_proj_->Forward(Flat3(attended), stream);
}

absl::StatusOr<Tensor> GroupedQueryAttention::BackwardImpl(
    const Tensor &grad_output, const Stream &stream) {
  ZE_RETURN_IF_ERROR(RequireSaved(!saved_.empty()));
  const Saved saved = saved_.Pop();
  ZE_ASSIGN_OR_RETURN(const Tensor inv_freq,
                      DeviceInvFreq(grad_output.device(), stream));
  // (B, T, Hq * D)
  ZE_ASSIGN_OR_RETURN(Tensor grad_attended,
                      o_proj_->Backward(grad_output, stream));
  const DType dtype = grad_output.dtype();
  const Device device = grad_output.device();
  ZE_ASSIGN_OR_RETURN(Tensor grad_q,
                      Tensor::Empty(saved.q.shape(), dtype, device));
  ZE_ASSIGN_OR_RETURN(Tensor grad_k,
                      Tensor::Empty(saved.k.shape(), dtype, device));
  ZE_ASSIGN_OR_RETURN(Tensor grad_v,
                      Tensor::Empty(saved.v.shape(), dtype, device));
  ZE_RETURN_IF_ERROR(GroupedAttentionBackward(
      grad_attended.View(saved.q.shape()), saved.q, saved.k, saved.v,
      saved.output, saved.logsumexp, grad_q, grad_k, grad_v, stream));
  grad_attended = Tensor();
  // RoPE's backward is the inverse rotation, in place.
  ZE_RETURN_IF_ERROR(
      RotaryEmbeddingBackward(grad_q, inv_freq, Tensor(), grad_q, stream));
  ZE_RETURN_IF_ERROR(
      RotaryEmbeddingBackward(grad_k, inv_freq, Tensor(), grad_k, stream));
  if (k_norm_ != nullptr) {
    ZE_ASSIGN_OR_RETURN(grad_k, k_norm_->Backward(grad_k, stream));
    ZE_ASSIGN_OR_RETURN(grad_q, q_norm_->Backward(grad_q, stream));
  }
  // The three projections read the same input: their gradients add up,
  // each product adding the sum so far (LinearBackwardAdd).
  ZE_ASSIGN_OR_RETURN(Tensor grad_from_v,
                      v_proj_->Backward(Flat3(grad_v), stream));
  k_proj_->AddToNextGradInput(std::move(grad_from_v));
  ZE_ASSIGN_OR_RETURN(Tensor grad_from_kv,
                      k_proj_->Backward(Flat3(grad_k), stream));
  q_proj_->AddToNextGradInput(std::move(grad_from_kv));
  return q_proj_->Backward(Flat3(grad_q), stream);
}

// ---------------------------------------------------------------- SwiGluMlp

SwiGluMlp::SwiGluMlp(int64_t hidden_size, int64_t intermediate_size,
                     const LayerOptions &options)
    : Module("SwiGluMlp") {
  gate_proj_ = RegisterChild(
      "gate_proj",
      std::make_unique<Linear>(hidden_size, intermediate_size, false, options));
  up_proj_ = RegisterChild(
      "up_proj",
      std::make_unique<Linear>(hidden_size, intermediate_size, false, options));
  down_proj_ = RegisterChild(
      "down_proj",
      std::make_unique<Linear>(intermediate_size, hidden_size, false, options));
}

absl::StatusOr<Tensor> SwiGluMlp::ForwardImpl(const Tensor &input,
                                              const Stream &stream) {
  ZE_ASSIGN_OR_RETURN(Tensor gate, gate_proj_->Forward(input, stream));
  ZE_ASSIGN_OR_RETURN(Tensor up, up_proj_->Forward(input, stream));
  ZE_ASSIGN_OR_RETURN(Tensor hidden,  // (..., F)
                      Tensor::Empty(gate.shape(), gate.dtype(), gate.device()));
  ZE_RETURN_IF_ERROR(SwiGluForward(gate, up, hidden, stream));
  saved_.Save(Saved{gate, up});
  // Selective recompute: down_proj keeps no (..., F) input; the backward
  // recomputes it from gate and up, saved above anyway.
  if (recompute_activation() && SavingEnabled() &&
      !down_proj_->activation_checkpointing()) {
    down_proj_->DropInputOfNextForward();
  }
  return down_proj_->Forward(hidden, stream);
}

absl::StatusOr<Tensor> SwiGluMlp::BackwardImpl(const Tensor &grad_output,
                                               const Stream &stream) {
  ZE_RETURN_IF_ERROR(RequireSaved(!saved_.empty()));
  const Saved saved = saved_.Pop();
  if (down_proj_->PendingInputDropped()) {
    // The same kernel on the same saved values: bit for bit the forward's.
    ZE_ASSIGN_OR_RETURN(Tensor hidden,
                        Tensor::Empty(saved.gate.shape(), saved.gate.dtype(),
                                      saved.gate.device()));
    ZE_RETURN_IF_ERROR(SwiGluForward(saved.gate, saved.up, hidden, stream));
    down_proj_->ProvideInputForNextBackward(std::move(hidden));
  }
  // hidden, gate and up are this module's own: each buffer takes its own
  // gradient, so the backward allocates no (..., F) tensor. (With new
  // buffers the SwiGLU backward held five at once: gate, up and the
  // gradients of hidden, gate and up; now three.)
  down_proj_->WriteGradInputIntoInputInNextBackward();
  ZE_ASSIGN_OR_RETURN(Tensor grad_hidden,
                      down_proj_->Backward(grad_output, stream));
  Tensor grad_gate = saved.gate, grad_up = saved.up;
  if (saved.gate.dtype() != grad_output.dtype()) {
    ZE_ASSIGN_OR_RETURN(grad_gate,
                        Tensor::Empty(saved.gate.shape(), grad_output.dtype(),
                                      grad_output.device()));
    ZE_ASSIGN_OR_RETURN(grad_up,
                        Tensor::Empty(saved.up.shape(), grad_output.dtype(),
                                      grad_output.device()));
  }
  ZE_RETURN_IF_ERROR(SwiGluBackward(grad_hidden, saved.gate, saved.up,
                                    grad_gate, grad_up, stream));
  grad_hidden = Tensor();
  // Both projections read the same input: gate's product adds up's
  // gradient (LinearBackwardAdd).
  ZE_ASSIGN_OR_RETURN(Tensor grad_from_up, up_proj_->Backward(grad_up, stream));
  grad_up = Tensor();
  gate_proj_->AddToNextGradInput(std::move(grad_from_up));
  return gate_proj_->Backward(grad_gate, stream);
}

// ---------------------------------------------------------------- Block

DecoderBlock::DecoderBlock(const DecoderConfig &config,
                           const LayerOptions &options)
    : Module("DecoderBlock") {
  input_norm_ = RegisterChild(
      "input_norm", std::make_unique<RmsNorm>(config.hidden_size,
                                              config.rms_norm_eps, options));
  attn_ = RegisterChild(
      "attn", std::make_unique<GroupedQueryAttention>(config, options));
  post_attn_norm_ = RegisterChild(
      "post_attn_norm", std::make_unique<RmsNorm>(
                            config.hidden_size, config.rms_norm_eps, options));
  mlp_ = RegisterChild(
      "mlp", std::make_unique<SwiGluMlp>(config.hidden_size,
                                         config.intermediate_size, options));
}

absl::StatusOr<Tensor> DecoderBlock::ForwardImpl(const Tensor &input,
                                                 const Stream &stream) {
  ZE_ASSIGN_OR_RETURN(Tensor normed, input_norm_->Forward(input, stream));
  // residual = input + attn(input_norm(input)), the sum formed by o_proj's
  // product. A failed call leaves its one-shot setting unconsumed: drop it.
  attn_->o_proj()->AddResidualToNextForward(input);
  absl::StatusOr<Tensor> residual = attn_->Forward(normed, stream);
  if (!residual.ok()) {
    attn_->o_proj()->AddResidualToNextForward(Tensor());
    return residual.status();
  }
  normed = Tensor();
  ZE_ASSIGN_OR_RETURN(Tensor normed2,
                      post_attn_norm_->Forward(*residual, stream));
  // output = residual + mlp(post_attn_norm(residual)), by down_proj.
  mlp_->down_proj()->AddResidualToNextForward(*residual);
  absl::StatusOr<Tensor> output = mlp_->Forward(normed2, stream);
  if (!output.ok()) mlp_->down_proj()->AddResidualToNextForward(Tensor());
  return output;
}

absl::StatusOr<Tensor> DecoderBlock::BackwardImpl(const Tensor &grad_output,
                                                  const Stream &stream) {
  // d(residual) = d(out) + norm2'(mlp'(d(out))); d(in) = d(residual) +
  // norm1'(attn'(d(residual))): the norms add the residual gradients.
  ZE_ASSIGN_OR_RETURN(Tensor grad_mlp_in, mlp_->Backward(grad_output, stream));
  post_attn_norm_->AddToNextGradInput(grad_output);
  absl::StatusOr<Tensor> grad_residual =
      post_attn_norm_->Backward(grad_mlp_in, stream);
  if (!grad_residual.ok()) {
    post_attn_norm_->AddToNextGradInput(Tensor());
    return grad_residual.status();
  }
  grad_mlp_in = Tensor();
  ZE_ASSIGN_OR_RETURN(Tensor grad_attn_in,
                      attn_->Backward(*grad_residual, stream));
  input_norm_->AddToNextGradInput(*grad_residual);
  absl::StatusOr<Tensor> grad_input =
      input_norm_->Backward(grad_attn_in, stream);
  if (!grad_input.ok()) input_norm_->AddToNextGradInput(Tensor());
  return grad_input;
}

}  // namespace nn
}  // namespace ze
