#include "zero/activation_estimate.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nn/layers.h"

namespace ze {
namespace zero {
namespace {

// What the device holds, by kind (ActivationEstimate::at_peak).
constexpr char kInputs[] = "block inputs";
constexpr char kSaved[] = "saved activations";
constexpr char kRecomputed[] = "recomputed block";
constexpr char kBackward[] = "block backward";
constexpr char kTransient[] = "forward temporaries";
constexpr char kHead[] = "loss head";
constexpr char kRing[] = "cpu_checkpointing ring";
constexpr char kScratch[] = "CUDA scratch";
constexpr char kAttention[] = "attention workspace";

// Allocations and frees in the order the code makes them; the peak of the
// bytes live, with what was live then.
class Ledger {
 public:
  using Id = int;
  explicit Ledger(bool cuda) : cuda_(cuda) {}

  Id Alloc(const char *kind, int64_t bytes) {
    const int64_t rounded = Round(bytes);
    entries_.push_back(Entry{kind, rounded, true});
    live_ += rounded;
    if (live_ > peak_) {
      peak_ = live_;
      peak_at_ = phase_;
      std::map<std::string, int64_t> by_kind;
      for (const Entry &entry : entries_) {
        if (entry.live) by_kind[entry.kind] += entry.bytes;
      }
      at_peak_.assign(by_kind.begin(), by_kind.end());
    }
    return static_cast<Id>(entries_.size()) - 1;
  }
  void Free(Id id) {
    if (id < 0 || !entries_[id].live) return;
    entries_[id].live = false;
    live_ -= entries_[id].bytes;
  }
  void set_phase(std::string phase) { phase_ = std::move(phase); }

  int64_t peak() const { return peak_; }
  const std::string &peak_at() const { return peak_at_; }
  const std::vector<std::pair<std::string, int64_t>> &at_peak() const {
    return at_peak_;
  }

 private:
  struct Entry {
    const char *kind;
    int64_t bytes;
    bool live;
  };
  // As the allocators count a block (core/allocator.cc RoundSize).
  int64_t Round(int64_t bytes) const {
    if (bytes <= 0) bytes = 1;
    if (!cuda_) return (bytes + 255) / 256 * 256;
    if (bytes <= (int64_t{1} << 20)) return (bytes + 511) / 512 * 512;
    constexpr int64_t kLarge = int64_t{2} << 20;
    return (bytes + kLarge - 1) / kLarge * kLarge;
  }

  bool cuda_;
  std::vector<Entry> entries_;
  int64_t live_ = 0;
  int64_t peak_ = 0;
  std::string phase_;
  std::string peak_at_;
  std::vector<std::pair<std::string, int64_t>> at_peak_;
};

constexpr Ledger::Id kNone = -1;

// The walk of one ForwardLoss + BackwardLoss (see the header). Sizes in
// bytes; N rows (micro-batch x seq).
class StepWalk {
 public:
  explicit StepWalk(const ActivationModel &m)
      : m_(m),
        ledger_(m.cuda),
        e_(static_cast<int64_t>(SizeOf(m.dtype))),
        n_(m.micro_batch * m.seq),
        gpt_(m.family == ActivationModel::Family::kGpt) {}

  ActivationEstimate Run();

 private:
  // What a block's saving forward keeps for its backward (kNone: not
  // allocated).
  struct BlockSaved {
    Ledger::Id normed = kNone, stats1 = kNone;
    Ledger::Id q = kNone, k = kNone, v = kNone;  // GPT: q is qkv
    Ledger::Id q_pre = kNone, k_pre = kNone;     // Qwen3: before the norms
    Ledger::Id q_stats = kNone, k_stats = kNone;
    Ledger::Id attended = kNone, logsumexp = kNone;
    Ledger::Id residual = kNone;
    Ledger::Id normed2 = kNone, stats2 = kNone;
    Ledger::Id pre = kNone;     // GPT: fc's pre-activation; decoder: gate
    Ledger::Id up = kNone;      // decoder
    Ledger::Id hidden = kNone;  // the activation's output, proj's input
  };

  int64_t Rows(int64_t width) const { return n_ * width * e_; }
  // A norm's f32 statistics: LayerNorm mean and rstd, RmsNorm rstd.
  int64_t Stats(int64_t rows) const { return rows * (gpt_ ? 8 : 4); }
  int64_t QWidth() const { return m_.heads * m_.head_dim; }
  int64_t KvWidth() const { return m_.kv_heads * m_.head_dim; }

  // The block's ForwardImpl with saving on (kind: where the kept tensors
  // are booked) or off (a checkpointed forward: everything freed by the
  // return but the output). Returns the output.
  Ledger::Id BlockForward(bool saving, const char *kind, BlockSaved *saved);
  // BackwardImpl after a saving forward; `saved` is consumed. Returns the
  // input's gradient. `input`: the block input, freed with the norm that
  // saved it when nothing else keeps it (kNone when something does).
  Ledger::Id BlockBackward(BlockSaved saved, Ledger::Id input);
  // The bytes one attention call's CUDA workspace takes (0 on the CPU and
  // where a call needs none), as nn/cuda/functional_cuda.cc asks for them:
  // GPT's backward an f32 dq and the rows' deltas; the grouped kernels'
  // direct route (head_dim 64) the deltas; the packed route (head_dim 128)
  // q/k/v packed as GPT's qkv in the forward, and those plus their
  // gradients, the f32 dq and the deltas in the backward.
  int64_t AttentionWorkspace(bool backward) const;
  // Books that workspace for the call's duration.
  void AttentionCall(bool backward) {
    const int64_t bytes = AttentionWorkspace(backward);
    if (bytes > 0) ledger_.Free(ledger_.Alloc(kAttention, bytes));
  }

  const ActivationModel &m_;
  Ledger ledger_;
  const int64_t e_;
  const int64_t n_;
  const bool gpt_;
};

Ledger::Id StepWalk::BlockForward(bool saving, const char *kind,
                                  BlockSaved *saved) {
  Ledger &l = ledger_;
  const int64_t c = m_.hidden;
  BlockSaved s;
  // norm 1: output and statistics (the statistics go with the call when
  // nothing is saved).
  s.normed = l.Alloc(kind, Rows(c));
  s.stats1 = l.Alloc(kind, Stats(n_));
  if (!saving) l.Free(s.stats1);
  if (gpt_) {
    s.q = l.Alloc(kind, Rows(3 * c));  // qkv
    s.attended = l.Alloc(kind, Rows(c));
    s.logsumexp = l.Alloc(kind, 4 * m_.micro_batch * m_.heads * m_.seq);
  } else {
    s.q = l.Alloc(kind, Rows(QWidth()));
    s.k = l.Alloc(kind, Rows(KvWidth()));
    s.v = l.Alloc(kind, Rows(KvWidth()));
    if (m_.qk_norm) {
      // The norms keep their inputs (q, k before them) and statistics.
      s.q_pre = s.q;
      s.q = l.Alloc(kind, Rows(QWidth()));
      s.q_stats = l.Alloc(kind, 4 * n_ * m_.heads);
      if (!saving) l.Free(s.q_stats), l.Free(s.q_pre);
      s.k_pre = s.k;
      s.k = l.Alloc(kind, Rows(KvWidth()));
      s.k_stats = l.Alloc(kind, 4 * n_ * m_.kv_heads);
      if (!saving) l.Free(s.k_stats), l.Free(s.k_pre);
    }
    s.attended = l.Alloc(kind, Rows(QWidth()));
    s.logsumexp = l.Alloc(kind, 4 * m_.micro_batch * m_.heads * m_.seq);
    // The packed route's q/k/v packing, for the call.
    AttentionCall(/*backward=*/false);
  }
  // The output projection adds the residual into its product.
  s.residual = l.Alloc(kind, Rows(c));
  if (!saving) {
    // The attention's locals go with its return.
    for (Ledger::Id id : {s.q, s.k, s.v, s.attended, s.logsumexp}) l.Free(id);
    // The decoder's block drops its norm output then; GPT's keeps it.
    if (!gpt_) l.Free(s.normed);
  }
  s.normed2 = l.Alloc(kind, Rows(c));
  s.stats2 = l.Alloc(kind, Stats(n_));
  if (!saving) l.Free(s.stats2);
  const int64_t f = m_.ffn;
  // A forward's output is the next block's input; a recomputation's is
  // dropped at once.
  const char *output_kind = kind == kRecomputed ? kRecomputed : kInputs;
  Ledger::Id output = kNone;
  if (gpt_) {
    // fc (GELU fused): output, then pre-activation.
    s.hidden = l.Alloc(kind, Rows(f));
    s.pre = l.Alloc(kind, Rows(f));
    if (!saving) l.Free(s.pre);
    output = l.Alloc(output_kind, Rows(c));
  } else {
    s.pre = l.Alloc(kind, Rows(f));  // gate
    s.up = l.Alloc(kind, Rows(f));
    s.hidden = l.Alloc(kind, Rows(f));
    output = l.Alloc(output_kind, Rows(c));
    if (!saving) l.Free(s.pre), l.Free(s.up);
  }
  // The MLP's hidden goes with its return unless down/proj keeps it.
  if (!saving || m_.recompute_activations) {
    l.Free(s.hidden);
    s.hidden = kNone;
  }
  if (!saving) {
    for (Ledger::Id id : {s.normed, s.residual, s.normed2}) l.Free(id);
  }
  if (saved != nullptr) *saved = s;
  return output;
}

Ledger::Id StepWalk::BlockBackward(BlockSaved s, Ledger::Id input) {
  Ledger &l = ledger_;
  const int64_t c = m_.hidden;
  const int64_t f = m_.ffn;
  Ledger::Id grad_mlp_in;
  if (gpt_) {
    // Mlp: fc's bias gradient (f32), hidden recomputed when dropped, proj's
    // product writing the pre-activation's gradient into hidden.
    const Ledger::Id fc_bias = l.Alloc(kBackward, 4 * f);
    if (s.hidden == kNone) s.hidden = l.Alloc(kBackward, Rows(f));
    // fc: the pre-activation goes before its input's gradient is made.
    l.Free(s.pre);
    grad_mlp_in = l.Alloc(kBackward, Rows(c));
    l.Free(s.normed2);  // fc's saved input
    l.Free(s.hidden);   // the pre-activation's gradient
    l.Free(fc_bias);
  } else {
    if (s.hidden == kNone) s.hidden = l.Alloc(kBackward, Rows(f));
    // down_proj writes into hidden, SwiGLU's backward into gate and up.
    l.Free(s.hidden);
    const Ledger::Id from_up = l.Alloc(kBackward, Rows(c));
    grad_mlp_in = l.Alloc(kBackward, Rows(c));
    l.Free(from_up);
    l.Free(s.normed2);
    l.Free(s.pre);  // gate
    l.Free(s.up);
  }
  // norm 2 (adds the output's gradient): its input's gradient, then its
  // saved input (the residual) and statistics go.
  const Ledger::Id grad_residual = l.Alloc(kBackward, Rows(c));
  l.Free(s.residual);
  l.Free(s.stats2);
  if (!gpt_) l.Free(grad_mlp_in);  // DecoderBlock drops it here
  Ledger::Id grad_attn_in;
  if (gpt_) {
    const Ledger::Id grad_attended = l.Alloc(kBackward, Rows(c));
    const Ledger::Id grad_qkv = l.Alloc(kBackward, Rows(3 * c));
    AttentionCall(/*backward=*/true);
    grad_attn_in = l.Alloc(kBackward, Rows(c));
    l.Free(s.normed);  // qkv's saved input
    for (Ledger::Id id :
         {s.q, s.attended, s.logsumexp, grad_attended, grad_qkv}) {
      l.Free(id);
    }
  } else {
    const Ledger::Id grad_attended = l.Alloc(kBackward, Rows(QWidth()));
    Ledger::Id grad_q = l.Alloc(kBackward, Rows(QWidth()));
    Ledger::Id grad_k = l.Alloc(kBackward, Rows(KvWidth()));
    const Ledger::Id grad_v = l.Alloc(kBackward, Rows(KvWidth()));
    AttentionCall(/*backward=*/true);
    l.Free(grad_attended);
    if (m_.qk_norm) {
      const Ledger::Id k2 = l.Alloc(kBackward, Rows(KvWidth()));
      l.Free(s.k_pre), l.Free(s.k_stats), l.Free(grad_k);
      grad_k = k2;
      const Ledger::Id q2 = l.Alloc(kBackward, Rows(QWidth()));
      l.Free(s.q_pre), l.Free(s.q_stats), l.Free(grad_q);
      grad_q = q2;
    }
    const Ledger::Id from_v = l.Alloc(kBackward, Rows(c));
    const Ledger::Id from_kv = l.Alloc(kBackward, Rows(c));
    l.Free(from_v);
    grad_attn_in = l.Alloc(kBackward, Rows(c));
    l.Free(from_kv);
    l.Free(s.normed);  // the projections' saved input
    for (Ledger::Id id :
         {s.q, s.k, s.v, s.attended, s.logsumexp, grad_q, grad_k, grad_v}) {
      l.Free(id);
    }
  }
  // norm 1 (adds the residual's gradient).
  const Ledger::Id grad_input = l.Alloc(kBackward, Rows(c));
  l.Free(input);
  l.Free(s.stats1);
  for (Ledger::Id id : {grad_mlp_in, grad_residual, grad_attn_in}) l.Free(id);
  return grad_input;
}

int64_t StepWalk::AttentionWorkspace(bool backward) const {
  if (!m_.cuda) return 0;
  const int64_t rows_f32 = 4 * m_.micro_batch * m_.heads * m_.seq;
  const bool half = m_.dtype == DType::kBF16 || m_.dtype == DType::kF16;
  if (gpt_) return backward ? 4 * n_ * m_.hidden + rows_f32 : 0;
  if (half && m_.head_dim == 128) {
    const int64_t packed = (3 * Rows(QWidth()) + 255) / 256 * 256;
    return backward ? 2 * packed + 4 * n_ * QWidth() + rows_f32 : packed;
  }
  return backward ? rows_f32 : 0;
}

ActivationEstimate StepWalk::Run() {
  Ledger &l = ledger_;
  const int64_t c = m_.hidden;
  const int64_t layers = m_.layers;
  const bool offload = m_.checkpointing && m_.ring_slots > 0;
  ActivationEstimate estimate;

  // Kept from the previous step: the CUDA kernels' scratch and the ring.
  if (m_.cuda) {
    // The attention kernels' workspaces live only for their calls
    // (AttentionWorkspace); the stream's scratch buffer keeps the small
    // partial sums of bias and norm gradients (a few MiB, not counted).
    l.set_phase("scratch");
    l.Alloc(kScratch, int64_t{32} << 20);  // cuBLASLt's workspace
  }
  if (offload) {
    l.set_phase("ring");
    for (int i = 0; i < m_.ring_slots; ++i) l.Alloc(kRing, Rows(c));
    estimate.pinned_host = layers * Rows(c);
  }

  // ---- ForwardLoss.
  l.set_phase("embedding forward");
  const Ledger::Id x0 = l.Alloc(kInputs, Rows(c));
  std::vector<Ledger::Id> inputs(layers, kNone);  // each block's input
  std::vector<BlockSaved> saved(layers);
  Ledger::Id x = x0;
  Ledger::Id newest = kNone;  // the offload's newest input, on the device
  for (int64_t i = 0; i < layers; ++i) {
    l.set_phase(absl::StrCat("block ", i, " forward"));
    inputs[i] = x;
    const Ledger::Id out = m_.checkpointing
                               ? BlockForward(false, kTransient, nullptr)
                               : BlockForward(true, kSaved, &saved[i]);
    if (offload) {
      // Only the newest saved input stays on the device; the embedding's
      // output is the model's local until the blocks return.
      if (newest != kNone && newest != x0) l.Free(newest);
      newest = x;
    }
    x = out;
  }
  if (offload && x0 != newest) l.Free(x0);
  // The final norm keeps its input (the last block's output).
  l.set_phase("final norm forward");
  const Ledger::Id final_input = x;
  const Ledger::Id head_input = l.Alloc(kHead, Rows(c));
  const Ledger::Id final_stats = l.Alloc(kHead, Stats(n_));
  // The head in loss mode (OutputHead::LossBuffersFor).
  l.set_phase("loss head forward");
  const bool in_backward =
      m_.head_weight_gradient_in_backward && m_.dtype != DType::kF16;
  const nn::OutputHead::LossBuffers head = nn::OutputHead::LossBuffersFor(
      n_, c, m_.vocab, m_.dtype, m_.loss_chunk_rows, true,
      in_backward ? nn::OutputHead::WeightGradient::kInBackward
                  : nn::OutputHead::WeightGradient::kInForward);
  const Ledger::Id logits = l.Alloc(kHead, head.logits_chunk_bytes);
  const Ledger::Id losses = l.Alloc(kHead, head.losses_bytes);
  const Ledger::Id head_grad_input = l.Alloc(kHead, Rows(c));
  Ledger::Id head_sum = kNone, head_logsumexp = kNone;
  if (in_backward) {
    head_logsumexp = l.Alloc(kHead, 4 * n_);
  } else {
    head_sum = l.Alloc(kHead, m_.vocab * c * 4);
  }
  l.Free(logits);
  if (!in_backward) l.Free(head_input);  // nobody keeps the head's input
  l.Free(losses);                        // read back by the loss

  // ---- BackwardLoss.
  l.set_phase("loss head backward");
  // The loss's gradient, one f32 on the host (MeanCrossEntropy::Backward):
  // the device's allocator only when the device is the host.
  const Ledger::Id grad_loss = m_.cuda ? kNone : l.Alloc(kHead, 4);
  if (in_backward) {
    // A vocabulary slice of as many logits as one forward chunk held.
    const int64_t chunk =
        std::min(n_, nn::OutputHead::LossChunkRows(n_, m_.vocab, m_.dtype,
                                                   m_.loss_chunk_rows));
    int64_t width = std::clamp<int64_t>(
        chunk * m_.vocab / std::max<int64_t>(n_, 1), 1, m_.vocab);
    if (width >= 128 && width < m_.vocab) width = width / 128 * 128;
    const Ledger::Id workspace = l.Alloc(kHead, n_ * width * e_);
    l.Free(workspace);
    l.Free(head_input);
    l.Free(head_logsumexp);
  } else {
    l.Free(head_sum);
  }
  l.set_phase("final norm backward");
  Ledger::Id grad = l.Alloc(kBackward, Rows(c));
  l.Free(final_input);
  l.Free(final_stats);
  l.Free(head_grad_input);
  for (int64_t i = layers - 1; i >= 0; --i) {
    l.set_phase(absl::StrCat("block ", i, " backward"));
    Ledger::Id input = inputs[i];
    if (m_.checkpointing) {
      if (offload) {
        // The newest input is the top block's own; the others come back
        // into the ring, already allocated.
        input = i == layers - 1 ? newest : kNone;
      }
      l.set_phase(absl::StrCat("block ", i, " backward: recompute"));
      const Ledger::Id output = BlockForward(true, kRecomputed, &saved[i]);
      l.Free(output);  // the recomputed output is not needed
      l.set_phase(absl::StrCat("block ", i, " backward"));
      // The checkpoint keeps the input until the block's Backward returns.
      const Ledger::Id next = BlockBackward(saved[i], kNone);
      l.Free(input);
      l.Free(grad);
      grad = next;
    } else {
      const Ledger::Id next = BlockBackward(saved[i], input);
      l.Free(grad);
      grad = next;
    }
  }
  l.Free(grad);
  l.Free(grad_loss);

  estimate.device = l.peak();
  estimate.peak_at = l.peak_at();
  estimate.at_peak = l.at_peak();
  std::sort(estimate.at_peak.begin(), estimate.at_peak.end(),
            [](const auto &a, const auto &b) { return a.second > b.second; });
  return estimate;
}

}  // namespace

ActivationModel ActivationModel::Of(const nn::GptConfig &config, DType dtype,
                                    int64_t micro_batch, int64_t seq) {
  ActivationModel m;
  m.family = Family::kGpt;
  m.layers = config.num_layers;
  m.hidden = config.channels;
  m.heads = config.num_heads;
  m.kv_heads = config.num_heads;
  m.head_dim = config.num_heads > 0 ? config.channels / config.num_heads : 0;
  m.ffn = 4 * config.channels;
  m.vocab = config.table_rows();
  m.dtype = dtype;
  m.micro_batch = micro_batch;
  m.seq = seq;
  m.checkpointing = config.activation_checkpointing;
  m.recompute_activations = config.recompute_activations;
  m.head_weight_gradient_in_backward = config.head_weight_gradient_in_backward;
  return m;
}

ActivationModel ActivationModel::Of(const nn::DecoderConfig &config,
                                    DType dtype, int64_t micro_batch,
                                    int64_t seq) {
  ActivationModel m;
  m.family = Family::kDecoder;
  m.layers = config.num_layers;
  m.hidden = config.hidden_size;
  m.heads = config.num_heads;
  m.kv_heads = config.num_kv_heads;
  m.head_dim = config.head_dim;
  m.ffn = config.intermediate_size;
  m.qk_norm = config.qk_norm;
  m.vocab = config.vocab_size;
  m.dtype = dtype;
  m.micro_batch = micro_batch;
  m.seq = seq;
  m.checkpointing = config.activation_checkpointing;
  m.recompute_activations = config.recompute_activations;
  m.head_weight_gradient_in_backward = config.head_weight_gradient_in_backward;
  return m;
}

std::string ActivationEstimate::ToString() const {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  std::string parts;
  for (const auto &[kind, bytes] : at_peak) {
    absl::StrAppend(&parts, parts.empty() ? "" : ", ", kind, " ",
                    absl::StrFormat("%.3f", bytes / kGiB));
  }
  return absl::StrFormat("%.3f GiB at %s (%s)", device / kGiB, peak_at, parts);
}

ActivationEstimate EstimateActivations(const ActivationModel &model) {
  if (model.layers < 1 || model.hidden < 1 || model.heads < 1 ||
      model.kv_heads < 1 || model.head_dim < 1 || model.ffn < 1 ||
      model.vocab < 1 || model.micro_batch < 1 || model.seq < 1) {
    return ActivationEstimate();
  }
  return StepWalk(model).Run();
}

}  // namespace zero
}  // namespace ze
