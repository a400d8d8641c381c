// Built-in layers: Linear, Embedding (token + position), LayerNorm, GELU,
// causal multi-head self-attention, MLP, the pre-LN transformer Block, an
// output head (tied or not, with a chunked loss) and Repeat (one child run
// several times).
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
  // The next Backward returns grad_output @ weight + grad_addend (another
  // branch's gradient of this module's input, summed inside the product:
  // LinearBackwardAdd); grad_addend is shaped like the input. Not with a
  // fused GELU backward. Consumed by that call; ClearBackwardFusion and
  // ClearSavedState drop it.
  void AddToNextGradInput(Tensor grad_addend) {
    fusion_.grad_input_addend = std::move(grad_addend);
  }
  // Selective recompute (Module::set_recompute_activation). The next
  // Forward keeps no reference to its input (a saving call still saves the
  // rest); consumed by that call. The container that produced the input
  // recomputes it and, before the Backward that pops that call, hands it
  // over with ProvideInputForNextBackward (same shape and values as the
  // forward's input); that Backward fails with FailedPrecondition when it
  // was not given one. PendingInputDropped: whether the call the next
  // Backward pops saved without its input.
  void DropInputOfNextForward() { drop_next_input_ = true; }
  bool PendingInputDropped() const;
  void ProvideInputForNextBackward(Tensor input) {
    fusion_.recomputed_input = std::move(input);
  }
  // The next Backward writes its input's gradient into the saved input
  // itself (LinearBackward's in-place form: the weight gradient, which
  // reads the input, is formed first) instead of a new buffer. For a
  // container whose activation is private to it (Mlp's (..., 4C) hidden,
  // SwiGluMlp's (..., F) gated product): that buffer is the block
  // backward's largest, and its gradient is the next. The caller promises
  // that nothing reads the input after that Backward. Not applied when the
  // weight gradient is deferred (a split backward keeps the input for its
  // second part) or the gradient's dtype is not the input's. Consumed by
  // that call; ClearBackwardFusion and ClearSavedState drop it.
  void WriteGradInputIntoInputInNextBackward() {
    fusion_.grad_input_into_input = true;
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
    drop_next_input_ = false;
  }
  // Split backward (nn/module.h): the first part returns the input's
  // gradient; the weight and bias gradients (the product grad^T @ input,
  // the row sums) are the deferred second part, holding the gradient w.r.t.
  // the product and the input until then. Fusions stay in the first part
  // (the GELU backward, a summed gradient addend, the producer's bias rows
  // it hands on); a fused-in bias gradient is added in the second.
  bool SplitsBackward() const override { return true; }

 private:
  // The second part: accumulates grad_product^T @ input into the weight's
  // gradient and the bias gradient (summed_bias_rows when defined, else
  // grad_product's row sums).
  absl::Status WeightGradients(const Tensor &grad_product, const Tensor &input,
                               const Tensor &summed_bias_rows,
                               const Stream &stream);
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
    Tensor grad_input_addend;             // added to the input's gradient
    Tensor recomputed_input;              // for a call that dropped it
    bool grad_input_into_input = false;   // the input is the caller's own
  };
  int64_t out_features_;
  Activation activation_;
  Parameter *weight_;
  Parameter *bias_ = nullptr;
  SavedStack<Saved> saved_;  // per call
  BackwardFusion fusion_;
  Tensor pending_residual_;  // (..., out) or undefined
  bool drop_next_input_ = false;
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
  // For weight tying (e.g. a tied OutputHead).
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
  Mlp *mlp() const { return mlp_; }

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

// A language model's output head: logits (..., V) = input (..., C) @
// weight (V, C)^T, no bias. The weight is the head's own ("weight",
// `weight_init`; type "OutputHead") or, tied, another module's parameter
// (GPT's token embedding; type "TiedOutputHead"), which keeps its owner's
// name and whose gradient accumulates both uses.
//
// Loss mode. ComputeLossInNextForward(targets, classes) makes the next
// Forward return, instead of the logits, each row's softmax cross-entropy
// against `targets` (targets' shape, f32; 0 where a target is < 0; classes
// as CrossEntropyForward's), computed loss_chunk_rows rows at a time
// (LinearCrossEntropyForward): the (..., V) logits never exist, only one
// chunk of them, so the memory does not grow with V beyond the weight's
// own. A saving Forward (nn/module.h's SavingEnabled) also forms, while
// each chunk's logits exist, the gradients of the sum of the rows' losses:
// w.r.t. the input, (..., C) in the input's dtype, and w.r.t. the weight,
// a private (V, C) f32 sum over the chunks (none when the weight is
// frozen), both kept until the Backward. The Backward of that call takes
// grad_output (1) f32 on the host: the derivative of the objective w.r.t.
// each counted row's loss, one value for all of them (for a mean over the
// counted rows times a loss scale, loss_scale / counted), scales the kept
// input gradient by it and returns it, and adds grad_output times the
// private sum into the weight's gradient. Both run between this module's
// hooks, so ZeRO's gathers and gradient reduction see no difference. The
// setting is consumed by that Forward (saving or not); ClearSavedState
// drops a pending one. A loss-mode Forward fails (FailedPrecondition) when
// the head or a module above it is checkpointed: the recomputation in
// backward would run without targets.
//
// Why the gradients are formed in the forward: a backward that starts from
// the loss needs each chunk's logits again, and recomputing them costs a
// second (rows x C) x (C x V) product, 6% of a Llama-3.2-1B step at a 128k
// vocabulary (bench/RESULTS.md, run 55). The price is the private (V, C)
// f32 sum held from the forward to the backward (1 GiB at that shape, less
// the chunk of logits no longer kept), which also keeps the chunks' sum of
// the weight gradient in f32 rather than rounding it into a 16-bit gradient
// chunk by chunk. The scale arrives only with the backward (LossModel::
// BackwardLoss), so the forward forms the unscaled gradient: its softmax
// terms lie in [-1, 1], representable in every float dtype as well as
// scaled ones (fp16's loss scale guards the rest of the network's smaller
// gradients, which are formed after the scaling), and the scaling then
// costs one rounding of the input gradient.
class OutputHead : public Module {
 public:
  // The bytes one chunk of logits may take (in the activations' dtype), the
  // default for loss_chunk_rows: 2 GiB is 8192 rows of Llama 3's 128,256
  // f16/bf16 logits (an 8 x 1024-token micro-batch in one chunk) and 21,248
  // of GPT-2's 50,304, half the 4.2 GB whole logits of a 16 x 1024-token
  // Llama micro-batch. Each chunk adds its product into the (V, C) f32
  // weight-gradient sum, so a chunk costs a pass over that sum besides its
  // products: at 256 MiB (7 chunks at GPT-2's vocabulary) the 124M GPT
  // trained 2.7% slower than with one chunk (bench/RESULTS.md, run 63).
  // The workspace lives only inside the forward; what the loss holds
  // across the memory peak is the gradients (see the class comment).
  static constexpr int64_t kLossChunkBytes = int64_t{2} << 30;

  // Untied: registers "weight" (vocab, channels).
  OutputHead(int64_t channels, int64_t vocab, const LayerOptions &options,
             const Initializer &weight_init = Initializer::Normal(0.02f));
  // Tied to `table` (V, C), a parameter of another module.
  explicit OutputHead(std::shared_ptr<Parameter> table);
  Parameter *weight() const { return weight_; }

  // See the class comment. targets: as many i32 elements as the input of
  // the next Forward has rows, on its device.
  void ComputeLossInNextForward(Tensor targets, int64_t classes) {
    pending_targets_ = std::move(targets);
    pending_classes_ = classes;
  }
  // Drops a pending ComputeLossInNextForward (a caller's error path, when
  // the forward failed before reaching this module).
  void ClearPendingLoss() { pending_targets_ = Tensor(); }

  // Rows per chunk in loss mode: `rows` >= 1, or 0 (the default) for at
  // most the rows of `dtype` logits that fit kLossChunkBytes
  // (LossChunkRowsFor), evened out over the chunks a forward needs.
  void set_loss_chunk_rows(int64_t rows) { loss_chunk_rows_ = rows; }
  // The rows per chunk of a loss-mode forward over `rows` rows: the set
  // value, else the fewest chunks of at most LossChunkRowsFor rows, of
  // nearly equal size (rounded up to 128 rows where the budget allows), so
  // that no chunk is a small remainder.
  int64_t loss_chunk_rows(int64_t rows, DType dtype) const;
  // loss_chunk_rows of a head of `vocab` rows whose set value is
  // `set_rows` (0: the default): what a memory model asks without a head.
  static int64_t LossChunkRows(int64_t rows, int64_t vocab, DType dtype,
                               int64_t set_rows);
  // kLossChunkBytes / (V * element size), at least 1, and a multiple of 128
  // from 128 on (the GPU products' row tile).
  static int64_t LossChunkRowsFor(int64_t vocab, DType dtype);

  // Where a saving loss-mode Forward's weight gradient is formed. In the
  // forward (the default; see the class comment): summed over the row
  // chunks into a private (V, C) f32 buffer held until the Backward. In
  // the backward: the forward keeps the rows' logsumexp (f32) and its
  // input instead, and the Backward forms the gradient a vocabulary slice
  // at a time (LinearCrossEntropyWeightGradient: each slice's logits formed
  // again, in a workspace of the forward's chunk of logits), each element
  // rounded once into the weight's gradient. No (V, C) f32 buffer (2.1 GB
  // at Llama-3-8B's head, the largest activation-like buffer once the
  // layers' inputs go to the host) for one more logits product: a third
  // more head products, about 2% of an 8B step and 6% at Llama-3.2-1B's
  // shape. Gradients equal the default's up to the order of the f32 sums.
  // f16 activations keep the default (the scaled softmax terms would be
  // rounded into f16's range).
  enum class WeightGradient { kInForward, kInBackward };
  void set_weight_gradient(WeightGradient where) { weight_gradient_ = where; }
  WeightGradient weight_gradient() const { return weight_gradient_; }

  // The buffers of a loss-mode Forward over `rows` rows of `channels` in
  // `dtype` (a head of `vocab` rows, its chunk rows set to `set_rows`),
  // for memory models (bench/pipeline_model): what the forward allocates
  // and frees on return (one chunk of logits), what it returns (the rows'
  // f32 losses), and what a saving forward keeps until its Backward (the
  // input's gradient, and for a trainable weight the (vocab, channels) f32
  // weight-gradient sum), once per forward awaiting its backward: a
  // pipeline's last stage holds one per micro-batch in flight.
  struct LossBuffers {
    int64_t logits_chunk_bytes = 0;
    int64_t losses_bytes = 0;
    int64_t saved_bytes = 0;
  };
  // With kInBackward, saved_bytes holds the input and the logsumexp
  // instead of the (V, C) sum, and the Backward allocates a workspace of
  // logits_chunk_bytes.
  static LossBuffers LossBuffersFor(
      int64_t rows, int64_t channels, int64_t vocab, DType dtype,
      int64_t set_rows, bool trainable_weight,
      WeightGradient where = WeightGradient::kInForward);

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor &input,
                                     const Stream &stream) override;
  absl::StatusOr<Tensor> BackwardImpl(const Tensor &grad_output,
                                      const Stream &stream) override;
  void ClearSavedStateImpl() override {
    saved_.Clear();
    ClearPendingLoss();
  }

 private:
  struct Saved {
    Tensor input;  // (..., C); logits mode, and loss mode kInBackward
    bool loss = false;
    // Loss mode only: the gradients of the sum of the rows' losses.
    Tensor grad_input;   // (..., C), the input's dtype
    Tensor grad_weight;  // (V, C) f32; kInForward with a trainable weight
    // kInBackward with a trainable weight: what the weight gradient needs.
    Tensor logsumexp;  // (rows) f32
    Tensor targets;    // the forward's targets
    int64_t classes = 0;
  };
  Parameter *weight_;
  SavedStack<Saved> saved_;  // per call
  Tensor pending_targets_;   // loss mode for the next Forward when defined
  int64_t pending_classes_ = 0;
  int64_t loss_chunk_rows_ = 0;
  WeightGradient weight_gradient_ = WeightGradient::kInForward;
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
