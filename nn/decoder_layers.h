// The layers of the Llama-family decoder (nn/decoder_config.h): RMSNorm, a
// token embedding without positions, grouped-query attention with rotary
// position embedding (optional q/k/v biases, optional per-head q/k norms),
// the SwiGLU MLP and the pre-norm block.
//
// As in nn/layers.h: each layer is built for one device and dtype with no
// parameter storage (the root materialises), activations take the input's
// dtype and device, and containers call their children's public
// Forward/Backward so every module's hooks fire (ZeRO-3 gathers per module).
// Shapes: B batch, T sequence, H hidden, Hq / Hkv query / key-value heads,
// D head_dim, F intermediate, V vocabulary.
#ifndef ZE_NN_DECODER_LAYERS_H_
#define ZE_NN_DECODER_LAYERS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "nn/decoder_config.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace ze {
namespace nn {

// RMSNorm over the last dimension (RmsNormForward): (..., C) -> (..., C).
// Parameter "weight" (C), ones.
//
// AddToNextGradInput(g) makes the next Backward return RMSNorm'(dy) + g (a
// pre-norm block's residual gradient joining at the norm's input; one
// kernel on the GPU later, an add on the CPU now). Consumed by that call;
// ClearSavedState drops a pending one.
class RmsNorm : public Module {
 public:
  RmsNorm(int64_t channels, double eps, const LayerOptions &options);
  Parameter *weight() const { return weight_; }
  float eps() const { return eps_; }

  void AddToNextGradInput(Tensor grad_addend) {
    pending_grad_addend_ = std::move(grad_addend);
  }

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor &input,
                                     const Stream &stream) override;
  absl::StatusOr<Tensor> BackwardImpl(const Tensor &grad_output,
                                      const Stream &stream) override;
  void ClearSavedStateImpl() override {
    saved_.Clear();
    pending_grad_addend_ = Tensor();
  }

 private:
  struct Saved {
    Tensor input;  // (..., C)
    Tensor rstd;   // (M) f32
  };
  float eps_;
  Parameter *weight_;
  SavedStack<Saved> saved_;
  Tensor pending_grad_addend_;  // (..., C) or undefined
};

// output (B, T, H) = weight[tokens]. Input: tokens (B, T) i32. Parameter
// "weight" (V, H), normal(init_std). No positions: the decoder's attention
// applies RoPE. Backward returns an undefined tensor.
class TokenEmbedding : public Module {
 public:
  TokenEmbedding(int64_t vocab_size, int64_t hidden_size,
                 const LayerOptions &options, float init_std = 0.02f);
  Parameter *weight() const { return weight_; }
  // For weight tying (a tied OutputHead).
  std::shared_ptr<Parameter> shared_weight() const {
    return SharedParameter(weight_);
  }

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor &tokens,
                                     const Stream &stream) override;
  absl::StatusOr<Tensor> BackwardImpl(const Tensor &grad_output,
                                      const Stream &stream) override;
  void ClearSavedStateImpl() override { saved_tokens_.Clear(); }

 private:
  Parameter *weight_;
  SavedStack<Tensor> saved_tokens_;  // (B, T) i32 per call
};

// Grouped-query causal self-attention with RoPE, (B, T, H) -> (B, T, H):
//   q = q_proj(x) (B, T, Hq, D), k = k_proj(x), v = v_proj(x) (B, T, Hkv, D)
//   [Qwen3: q = q_norm(q), k = k_norm(k), per head over D]
//   q, k = RoPE(q), RoPE(k) at positions 0..T-1 (or the cache's)
//   out = o_proj(GroupedAttention(q, k, v))
// Children, in this order: "q_proj", "k_proj", "v_proj" (Linear H -> Hq*D /
// Hkv*D, biases iff config.qkv_bias), "o_proj" (Linear Hq*D -> H, no bias),
// then with config.qk_norm "q_norm", "k_norm" (RmsNorm(D)). All weights
// normal(0.02).
class GroupedQueryAttention : public Module {
 public:
  GroupedQueryAttention(const DecoderConfig &config,
                        const LayerOptions &options);
  Linear *q_proj() const { return q_proj_; }
  Linear *k_proj() const { return k_proj_; }
  Linear *v_proj() const { return v_proj_; }
  Linear *o_proj() const { return o_proj_; }
  RmsNorm *q_norm() const { return q_norm_; }  // null without qk_norm
  RmsNorm *k_norm() const { return k_norm_; }  // null without qk_norm
  // RoPE's inverse frequencies (D / 2), RopeInverseFrequencies of the config.
  const std::vector<float> &inv_freq() const { return inv_freq_; }

  // Incremental decoding (nn/kv_cache.h). While a slot is set, Forward takes
  // its input as the new positions of N sequences: RoPE places them at
  // starts[i] + t, their keys and values are written to the slot's cache
  // (GroupedKvCacheWrite) and each query attends over its row's cached
  // prefix too (GroupedCachedAttentionForward); nothing is saved. Set and
  // cleared by the model around a cached forward (DecoderModel).
  struct CacheSlot {
    Tensor keys, values;  // this layer's cache, (B, Hkv, T_max, D)
    Tensor rows, starts;  // (N) i32 on the cache's device
  };
  void set_cache_slot(CacheSlot slot) {
    cache_slot_ = std::move(slot);
    has_cache_slot_ = true;
  }
  void clear_cache_slot() {
    cache_slot_ = CacheSlot();
    has_cache_slot_ = false;
  }

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor &input,
                                     const Stream &stream) override;
  absl::StatusOr<Tensor> BackwardImpl(const Tensor &grad_output,
                                      const Stream &stream) override;
  void ClearSavedStateImpl() override { saved_.Clear(); }

 private:
  struct Saved {
    Tensor q, k, v;    // after norm and RoPE: (B, T, Hq|Hkv, D)
    Tensor output;     // (B, T, Hq, D), attention output before o_proj
    Tensor logsumexp;  // (B, Hq, T) f32
  };
  int num_heads_, num_kv_heads_;
  int64_t head_dim_;
  Linear *q_proj_;
  Linear *k_proj_;
  Linear *v_proj_;
  Linear *o_proj_;
  RmsNorm *q_norm_ = nullptr;
  RmsNorm *k_norm_ = nullptr;
  // The device copy of inv_freq_, made by the first Forward (not a
  // parameter: derived from the config, and the same on every rank).
  absl::StatusOr<Tensor> DeviceInvFreq(const Device &device,
                                       const Stream &stream);
  std::vector<float> inv_freq_;  // (D / 2)
  Tensor device_inv_freq_;       // (D / 2) f32 on the activations' device
  SavedStack<Saved> saved_;
  CacheSlot cache_slot_;
  bool has_cache_slot_ = false;
};

// SwiGLU MLP: down_proj(silu(gate_proj(x)) * up_proj(x)), (..., H) ->
// (..., H). Children "gate_proj", "up_proj" (Linear H -> F), "down_proj"
// (Linear F -> H), no biases, normal(0.02).
class SwiGluMlp : public Module {
 public:
  SwiGluMlp(int64_t hidden_size, int64_t intermediate_size,
            const LayerOptions &options);
  Linear *gate_proj() const { return gate_proj_; }
  Linear *up_proj() const { return up_proj_; }
  Linear *down_proj() const { return down_proj_; }

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor &input,
                                     const Stream &stream) override;
  absl::StatusOr<Tensor> BackwardImpl(const Tensor &grad_output,
                                      const Stream &stream) override;
  void ClearSavedStateImpl() override { saved_.Clear(); }

 private:
  struct Saved {
    Tensor gate, up;  // (..., F)
  };
  Linear *gate_proj_;
  Linear *up_proj_;
  Linear *down_proj_;
  SavedStack<Saved> saved_;
};

// Pre-norm decoder block, (B, T, H) -> (B, T, H):
//   x = x + attn(input_norm(x));  x = x + mlp(post_attn_norm(x)).
// Children "input_norm", "attn", "post_attn_norm", "mlp". The residual sums
// are formed inside o_proj's and down_proj's products (LinearForwardAdd),
// the residual gradients inside the norms' backwards, as GPT's Block does.
class DecoderBlock : public Module {
 public:
  DecoderBlock(const DecoderConfig &config, const LayerOptions &options);
  RmsNorm *input_norm() const { return input_norm_; }
  GroupedQueryAttention *attn() const { return attn_; }
  RmsNorm *post_attn_norm() const { return post_attn_norm_; }
  SwiGluMlp *mlp() const { return mlp_; }

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor &input,
                                     const Stream &stream) override;
  absl::StatusOr<Tensor> BackwardImpl(const Tensor &grad_output,
                                      const Stream &stream) override;

 private:
  RmsNorm *input_norm_;
  GroupedQueryAttention *attn_;
  RmsNorm *post_attn_norm_;
  SwiGluMlp *mlp_;
};

}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_DECODER_LAYERS_H_
