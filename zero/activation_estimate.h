// The activation memory of one training micro-batch of this engine's GPT
// (nn::GptModel) or Llama-family decoder (nn::DecoderModel), as the code
// allocates it: for --dry_run and memory planning, in place of a generic
// per-layer formula (Korthikanti et al.'s 34 B T C + 5 B H T^2), which
// knows neither the loss head's buffers, nor grouped-query attention and
// the FFN width, nor what a checkpointed block's backward holds at once.
//
// How: the estimate walks one ForwardLoss + BackwardLoss in the order the
// modules run (nn/layers.cc, nn/decoder_layers.cc, nn/module.cc's
// checkpointing, nn/activation_offload.cc's ring) and books every tensor
// they allocate when they allocate it and frees it when its last reference
// goes, in the allocator's rounding; the peak of that ledger is the
// estimate. What the walk models, per block: the saved activations
// (norm outputs and statistics, q/k/v or qkv, the attention output and
// logsumexp, the MLP's pre-activation/gate/up and its activation output
// unless recompute_activations drops it), the block outputs that are the
// next block's input (with checkpointing: the only thing kept, on the
// device or, with cpu_checkpointing, in host memory plus the ring's device
// buffers and the newest input kept on the device), one block's
// recomputation and backward working set (the MLP's private buffers taking
// their own gradients, as Linear::WriteGradInputIntoInputInNextBackward
// does), and the loss head's buffers (nn::OutputHead::LossBuffersFor: one
// chunk of logits, the input's gradient, and the (V, C) f32 weight-
// gradient sum or, with the weight gradient in the backward, the kept
// input, the rows' logsumexp and the backward's slice workspace).
//
// Not modelled: parameters and their gradients (model state: Plan::memory),
// ZeRO's gathered parameters and buckets, the optimizer; the embedding's
// tokens and targets (the caller's). On CUDA (cuda_scratch) the kernels'
// grow-only per-stream scratch is added as a constant: the attention
// backward's workspace on a Hopper GPU (H100, H200: GPT, an f32 dq and
// the row deltas; a decoder, the row deltas at head size 64 (the direct
// kernels), at 128 the packed route's packed q/k/v and their gradients
// besides) and
// cuBLASLt's 32 MiB workspace; smaller scratch (the column sums'
// partials) is left out.
#ifndef ZE_ZERO_ACTIVATION_ESTIMATE_H_
#define ZE_ZERO_ACTIVATION_ESTIMATE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "nn/decoder_config.h"
#include "nn/gpt.h"

namespace ze {
namespace zero {

// One micro-batch step of a whole model (not a pipeline stage).
struct ActivationModel {
  enum class Family { kGpt, kDecoder };
  Family family = Family::kGpt;
  int64_t layers = 0;
  int64_t hidden = 0;          // C, the residual stream's width
  int64_t heads = 0;           // query heads
  int64_t kv_heads = 0;        // key/value heads (GPT: heads)
  int64_t head_dim = 0;        // (GPT: hidden / heads)
  int64_t ffn = 0;             // the MLP's hidden width (GPT: 4 C)
  bool qk_norm = false;        // Qwen3's per-head norms of q and k
  int64_t vocab = 0;           // the head's rows (GPT: the padded table)
  DType dtype = DType::kBF16;  // the activations' (the model's) dtype
  int64_t micro_batch = 0;
  int64_t seq = 0;
  // The head's rows per loss chunk as set (OutputHead::set_loss_chunk_rows);
  // 0: its default.
  int64_t loss_chunk_rows = 0;
  bool checkpointing = false;  // every block (activation_checkpointing)
  // cpu_checkpointing: the ring's device buffers (Plan::
  // activation_ring_slots); 0 when off. Only with checkpointing.
  int ring_slots = 0;
  bool recompute_activations = false;
  // OutputHead::WeightGradient::kInBackward (f16 keeps the forward's sum,
  // as the head does).
  bool head_weight_gradient_in_backward = false;
  // A CUDA device (Hopper): its allocator's rounding and the kernels'
  // scratch (file comment); false: the host allocator's (a CPU run).
  bool cuda = true;

  // The shape of `config`'s model (its checkpointing, recompute and head
  // settings included) for a micro-batch of `micro_batch` x `seq` tokens.
  static ActivationModel Of(const nn::GptConfig &config, DType dtype,
                            int64_t micro_batch, int64_t seq);
  static ActivationModel Of(const nn::DecoderConfig &config, DType dtype,
                            int64_t micro_batch, int64_t seq);
};

struct ActivationEstimate {
  // Peak bytes on the model's device above what the step starts with
  // (parameters and gradients; after Initialize, on a GPU): the ledger's
  // peak, with the ring and the CUDA scratch, which stay allocated from
  // the first step on.
  int64_t device = 0;
  // cpu_checkpointing: the host copies of the checkpointed inputs (pinned
  // on CUDA), allocated once and reused every step.
  int64_t pinned_host = 0;
  // Where the peak falls, e.g. "block 23 backward: recompute".
  std::string peak_at;
  // The device bytes live at the peak by kind, largest first; they add up
  // to `device`.
  std::vector<std::pair<std::string, int64_t>> at_peak;
  // "2.918 GiB at block 23 backward: recompute (saved activations ...)".
  std::string ToString() const;
};

// The estimate for `model`; shapes must be positive (else all zeros).
ActivationEstimate EstimateActivations(const ActivationModel &model);

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_ACTIVATION_ESTIMATE_H_
