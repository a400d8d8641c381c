// Built-in layers: Linear, Embedding (token + position), LayerNorm, GELU,
// causal multi-head self-attention, MLP, the pre-LN transformer Block, a
// tied output head and Repeat (one child run several times).
//
// Every layer is built for one device and dtype (LayerOptions) with no
// parameter storage; the root materialises parameters once the tree, and so
// every full parameter name, is complete (Module::MaterializeParameters).
// Activations take the dtype and device of the layer's input (token ids:
// of the embedding table). Shapes below: B batch, T sequence, C channels.
#ifndef ZE_NN_LAYERS_H_
#define ZE_NN_LAYERS_H_

#include <memory>
#include <string>

#include "core/tensor.h"
#include "nn/module.h"

namespace ze {
namespace nn {

// Where and in what format a layer's parameters live.
struct LayerOptions {
  Device device = Device::Cpu();
  DType dtype = DType::kF32;
};

// output (..., out) = act(input (..., in) @ weight (out, in)^T + bias (out)),
// where act is the identity or, with Activation::kGelu, GELU (tanh
// approximation; one fused product on CUDA, see LinearGeluForward).
// Parameters: "weight" (initializer given, GPT-2 default normal(0.02)) and,
// with bias, "bias" (zeros).
//
// GELU fusion across two Linears. A container that feeds a kGelu Linear
// (the producer) into another Linear (the consumer), as Mlp does, can move
// GELU's backward into the consumer's input-gradient product. Just before
// the consumer's Backward it takes the producer's PendingPreActivation()
// and calls consumer.FuseGeluBackwardIntoNextBackward(pre_activation,
// bias_grad); the consumer's Backward then returns the gradient w.r.t. the
// pre-activation (not w.r.t. its input) and adds that gradient's row sums
// into bias_grad (f32, zero-filled by the container). The container then
// calls producer.NextGradIsPreActivation(bias_grad) and runs the producer's
// Backward on that gradient: it skips GELU's backward and adds bias_grad
// into its bias gradient (inside its own Backward, so hooks that gather or
// reduce the producer's parameters see its gradients there). Each setting
// applies to the next Backward of that module only and is consumed by it
// (or dropped by ClearSavedState / ClearBackwardFusion). Every hook fires
// as without fusion; gradients are equal up to rounding.
class Linear : public Module {
 public:
  enum class Activation { kNone, kGelu };

  Linear(int64_t in_features, int64_t out_features, bool with_bias,
         const LayerOptions &options,
         const Initializer &weight_init = Initializer::Normal(0.02f),
         Activation activation = Activation::kNone);
  Parameter *weight() const { return weight_; }
  Parameter *bias() const { return bias_; }  // null without bias
  Activation activation() const { return activation_; }

  // kGelu only: the pre-activation (..., out) saved by the forward call the
  // next Backward consumes; undefined when that call saved none (this
  // module checkpointed, or its forward run without saving), in which case
  // the container must not fuse.
  Tensor PendingPreActivation() const;
  // Consumer side: the next Backward fuses the backward of the GELU whose
  // output was this module's input (`pre_activation` is its input, shaped
  // like this module's input) and returns the gradient w.r.t.
  // pre_activation; it adds the gradient's row sums into `bias_grad`
  // ((in_features), any float dtype) when that is defined.
  void FuseGeluBackwardIntoNextBackward(const Tensor &pre_activation,
                                        const Tensor &bias_grad);
  // Producer side (kGelu): the next Backward's grad_output is already the
  // gradient w.r.t. the pre-activation; `bias_grad` ((out_features), or
  // undefined when no bias gradient is wanted) holds its row sums, added
  // into the bias gradient instead of reducing grad_output again.
  void NextGradIsPreActivation(const Tensor &bias_grad);
  // Drops both settings (a container's error path).
  void ClearBackwardFusion() { fusion_ = BackwardFusion(); }

  // The next Forward returns input @ weight^T + bias + residual (a residual
  // stream joined inside the product, LinearForwardAdd; Activation::kNone
  // only); residual is shaped like the output and must be a different
  // tensor. Consumed by that call; ClearSavedState drops it. Backward is
  // unchanged (the residual's gradient is the caller's grad_output).
  void AddResidualToNextForward(Tensor residual) {
    pending_residual_ = std::move(residual);
  }

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor &input,
                                     const Stream &stream) override;
  absl::StatusOr<Tensor> BackwardImpl(const Tensor &grad_output,
                                      const Stream &stream) override;
  void ClearSavedStateImpl() override {
    saved_.Clear();
    ClearBackwardFusion();
    pending_residual_ = Tensor();
  }

 private:
  struct Saved {
    Tensor input;           // (..., in)
    Tensor pre_activation;  // (..., out), kGelu only
  };
  // One-shot settings for the next Backward (see the class comment).
  struct BackwardFusion {
    Tensor gelu_pre_activation;           // consumer: fuse GELU's backward
    Tensor gelu_bias_grad;                // consumer: row sums go here
    bool grad_is_pre_activation = false;  // producer
    Tensor pre_activation_bias_grad;      // producer: add into bias grad
  };
  int64_t out_features_;
  Activation activation_;
  Parameter *weight_;
  Parameter *bias_ = nullptr;
  SavedStack<Saved> saved_;  // per call
  BackwardFusion fusion_;
  Tensor pending_residual_;  // (..., out) or undefined
};

// output (B, T, C) = wte[tokens] + wpe[0..T). Input: tokens (B, T) i32.
// Parameters "wte" (V, C) and "wpe" (max_T, C), both normal(init_std).
// Backward returns an undefined tensor (token ids have no gradient).
class Embedding : public Module {
 public:
  Embedding(int64_t vocab_size, int64_t max_seq_len, int64_t channels,
            const LayerOptions &options, float init_std = 0.02f);
  Parameter *token_table() const { return token_table_; }
  Parameter *position_table() const { return position_table_; }
  // For weight tying (e.g. TiedOutputHead).
  std::shared_ptr<Parameter> shared_token_table() const {
    return SharedParameter(token_table_);
  }
  // Incremental decoding: while set, Forward places sequence b's tokens at
  // positions [starts[b], starts[b] + T) instead of [0, T); starts (B) i32
  // on the tables' device. Set, and cleared with an undefined tensor, by the
  // model around a cached forward (GptModel::ForwardCached).
  void set_position_starts(Tensor starts) {
    position_starts_ = std::move(starts);
  }

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor &tokens,
                                     const Stream &stream) override;
  absl::StatusOr<Tensor> BackwardImpl(const Tensor &grad_output,
                                      const Stream &stream) override;
  void ClearSavedStateImpl() override { saved_tokens_.Clear(); }

 private:
  int64_t max_seq_len_;
  Parameter *token_table_;
  Parameter *position_table_;
  SavedStack<Tensor> saved_tokens_;  // (B, T) i32 per call
  Tensor position_starts_;           // (B) i32 or undefined
};

// LayerNorm over the last dimension, eps 1e-5. Parameters "weight" (ones),
// "bias" (zeros), both (C).
//
// A pre-LN block can fuse a residual gradient into the LayerNorm backward
// that joins it (one pass instead of two, on CUDA): AddToNextGradInput(g)
// makes the next Backward return LayerNorm'(dy) + g. Consumed by that call
// (hooks run as usual); ClearSavedState drops a pending one.
class LayerNorm : public Module {
 public:
  LayerNorm(int64_t channels, const LayerOptions &options);
  Parameter *weight() const { return weight_; }
  Parameter *bias() const { return bias_; }

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
    Tensor mean;   // (M) f32
    Tensor rstd;   // (M) f32
  };
  Parameter *weight_;
  Parameter *bias_;
  SavedStack<Saved> saved_;
  Tensor pending_grad_addend_;  // (..., C) or undefined
};

// GELU (tanh approximation), any shape. No parameters.
class Gelu : public Module {
 public:
  Gelu() : Module("Gelu") {}

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor &input,
                                     const Stream &stream) override;
  absl::StatusOr<Tensor> BackwardImpl(const Tensor &grad_output,
                                      const Stream &stream) override;
  void ClearSavedStateImpl() override { saved_inputs_.Clear(); }

 private:
  SavedStack<Tensor> saved_inputs_;
};

// Causal multi-head self-attention: children "qkv" (Linear C -> 3C) and
// "proj" (Linear C -> C, scaled residual init for `num_layers`).
// (B, T, C) -> (B, T, C).
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t channels, int num_heads, int num_layers,
                      const LayerOptions &options);
  Linear *qkv() const { return qkv_; }
  Linear *proj() const { return proj_; }
  int num_heads() const { return num_heads_; }

  // Incremental decoding (nn/kv_cache.h). While a slot is set, Forward
  // takes the input as the new positions of N sequences: it writes their
  // keys and values into the slot's cache (KvCacheWrite) and attends over
  // each sequence's cached prefix as well (CachedAttentionForward), saving
  // nothing for backward. Set and cleared by the model around a cached
  // forward (GptModel::ForwardCached); the tensors stay referenced until
  // cleared.
  struct CacheSlot {
    Tensor keys, values;  // this layer's cache, (B, H, T_max, D)
    Tensor rows, starts;  // (N) i32 on the cache's device
    // Every start is 0 (a prefill): attention over the input alone is the
    // same, so the plain causal kernel runs, then the write.
    bool empty_prefix = false;
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
    Tensor qkv;        // (B, T, 3C)
    Tensor output;     // (B, T, C), attention output before proj
    Tensor logsumexp;  // (B, H, T) f32
  };
  int num_heads_;
  Linear *qkv_;
  Linear *proj_;
  SavedStack<Saved> saved_;
  CacheSlot cache_slot_;
  bool has_cache_slot_ = false;
};

// The transformer MLP: proj(gelu(fc(x))), children "fc" (Linear C -> 4C
// with Activation::kGelu) and "proj" (Linear 4C -> C, scaled residual
// init). (..., C) -> (..., C). Backward fuses GELU's backward into proj's
// input-gradient product and hands fc the row sums of the pre-activation
// gradient for its bias (see Linear), unless fc saved nothing for this call
// (fc itself checkpointed): then fc applies GELU's backward itself.
class Mlp : public Module {
 public:
  Mlp(int64_t channels, int num_layers, const LayerOptions &options);
  Linear *fc() const { return fc_; }
  Linear *proj() const { return proj_; }

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor &input,
                                     const Stream &stream) override;
  absl::StatusOr<Tensor> BackwardImpl(const Tensor &grad_output,
                                      const Stream &stream) override;

 private:
  Linear *fc_;
  Linear *proj_;
};

// Pre-LN transformer block:
//   x = x + attn(ln1(x));  x = x + mlp(ln2(x)).
// Children "ln1", "attn", "ln2", "mlp". (B, T, C) -> (B, T, C).
class Block : public Module {
 public:
  Block(int64_t channels, int num_heads, int num_layers,
        const LayerOptions &options);
  CausalSelfAttention *attn() const { return attn_; }

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor &input,
                                     const Stream &stream) override;
  absl::StatusOr<Tensor> BackwardImpl(const Tensor &grad_output,
                                      const Stream &stream) override;

 private:
  LayerNorm *ln1_;
  CausalSelfAttention *attn_;
  LayerNorm *ln2_;
  Mlp *mlp_;
};

// logits (..., V) = input (..., C) @ table (V, C)^T, where `table` is a
// parameter owned by another module (GPT's token embedding). The table keeps
// its owner's name and its gradient accumulates both uses.
class TiedOutputHead : public Module {
 public:
  explicit TiedOutputHead(std::shared_ptr<Parameter> table);
  Parameter *table() const { return table_; }

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor &input,
                                     const Stream &stream) override;
  absl::StatusOr<Tensor> BackwardImpl(const Tensor &grad_output,
                                      const Stream &stream) override;
  void ClearSavedStateImpl() override { saved_inputs_.Clear(); }

 private:
  Parameter *table_;
  SavedStack<Tensor> saved_inputs_;  // (..., C) per call
};

// Runs its one child "layer" `times` times (weights shared across the
// repeats); Backward runs the child's Backward `times` times.
class Repeat : public Module {
 public:
  Repeat(std::unique_ptr<Module> layer, int times);

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor &input,
                                     const Stream &stream) override;
  absl::StatusOr<Tensor> BackwardImpl(const Tensor &grad_output,
                                      const Stream &stream) override;

 private:
  Module *layer_;
  int times_;
};

}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_LAYERS_H_
