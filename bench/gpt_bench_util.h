// Helpers shared by the benchmarks (gpt_bench, train_bench, generate_bench,
// checkpoint_bench): flag parsing, the model chosen by name (a GPT or a
// Llama-family decoder), the model FLOPs formula, the PyTorch reference
// figures, synthetic token batches and JSON output (one object per line on
// stdout).
#ifndef ZE_BENCH_GPT_BENCH_UTIL_H_
#define ZE_BENCH_GPT_BENCH_UTIL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "nlohmann/json.hpp"
#include "nn/decoder_config.h"
#include "nn/gpt.h"
#include "nn/loss_model.h"
#include "nn/module.h"
#include "zero/reports.h"

namespace ze {
namespace bench {

using Json = nlohmann::ordered_json;

// H200 (SXM) dense bf16 tensor-core peak, the denominator of every MFU here.
constexpr double kPeakFlops = 989e12;

// "--name=value" and bare "--name" (value "1") arguments. Every flag must be
// read through one of the getters or rejected by CheckAllUsed, so a typo
// fails loudly instead of running the default configuration.
class Flags {
 public:
  // InvalidArgument for an argument that does not start with "--" or repeats
  // a flag.
  static absl::StatusOr<Flags> Parse(int argc, char** argv);

  std::string GetString(const std::string& name, const std::string& fallback);
  // InvalidArgument naming the flag when the value is not an integer in
  // [min_value, max_value].
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback,
                                 int64_t min_value, int64_t max_value);
  // Accepts 0/1/true/false.
  absl::StatusOr<bool> GetBool(const std::string& name, bool fallback);
  // InvalidArgument listing the flags nobody read (unknown ones), and the
  // known ones.
  absl::Status CheckAllUsed() const;

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> used_;
};

// Splits "a,b,c" (empty items dropped).
std::vector<std::string> SplitList(const std::string& text);

// "a,b,c" (a flag's value) as integers in [min_value, max_value];
// InvalidArgument naming --`flag` for an item that is not, or an empty list.
absl::StatusOr<std::vector<int64_t>> IntList(const std::string& flag,
                                             const std::string& text,
                                             int64_t min_value,
                                             int64_t max_value);

// The batch for each model: `batch_flag` empty gives the defaults
// (124M: 32, others: 16); one number applies to every model; a list must have
// one number per model. InvalidArgument otherwise.
absl::StatusOr<std::vector<int64_t>> BatchSizes(
    const std::vector<std::string>& models, const std::string& batch_flag);

// The model config for `name`: a preset with the vocabulary padded to 50304,
// or "tiny" (2 layers, 4 heads, 64 channels, vocabulary 256) for smoke runs.
// The position table grows to `seq` when seq exceeds the preset's 1024.
absl::StatusOr<nn::GptConfig> ModelConfig(const std::string& name, int64_t seq);

// A benchmark's model, named by a GPT preset or "tiny" (ModelConfig) or by a
// decoder preset (nn::DecoderConfig::PresetNames(): llama-tiny, ...,
// llama-8B): its shape only, until BuildModel.
struct BenchModelConfig {
  // InvalidArgument naming `name` and every known name when it is neither.
  // `seq`, the longest sequence the run feeds, grows a GPT's position table
  // or a decoder's max_position_embeddings when it exceeds them.
  static absl::StatusOr<BenchModelConfig> FromName(const std::string& name,
                                                   int64_t seq);

  bool is_decoder() const { return decoder.has_value(); }
  // Every parameter element (a tied table once).
  int64_t NumParameters() const;
  // Token ids below this are valid inputs (GPT: 50257, not the padded 50304).
  int64_t vocab_size() const;
  int num_layers() const;
  // Elements of one layer's keys (or values) per cached position: GPT's
  // channels, a decoder's num_kv_heads x head_dim (grouped-query attention).
  int64_t kv_channels() const;
  // The JSON lines' "model_config": GptConfigJson, or the decoder's Hugging
  // Face config.json (DecoderConfig::ToHuggingFaceJson).
  Json ToJson() const;
  void set_activation_checkpointing(bool on);
  // The MLPs' selective recompute (GptConfig / DecoderConfig).
  void set_recompute_activations(bool on);
  // Where the head forms its weight gradient (GptConfig / DecoderConfig
  // head_weight_gradient_in_backward, nn::OutputHead::WeightGradient): in
  // the loss forward (a (V, C) f32 sum held until the backward) or in the
  // backward, a vocabulary slice at a time.
  void set_head_weight_gradient(nn::OutputHead::WeightGradient where);

  std::string name;
  // A pipeline stage's layers [first_layer, last_layer) of the model's
  // pipeline layer sequence (nn::PipelineStage); last_layer -1: through
  // the end. The whole model by default.
  int first_layer = 0;
  int last_layer = -1;
  // Rows of logits the loss forms at a time (nn::OutputHead); 0: the head's
  // default (a 256 MiB chunk). A benchmark knob: the rows that are not in
  // the last chunk pay one more head product in the backward.
  int64_t loss_chunk_rows = 0;
  nn::GptConfig gpt;                         // when !is_decoder()
  std::optional<nn::DecoderConfig> decoder;  // decoder presets
};

// The model for `config`, in `dtype` on `device`, initialised from `seed`
// (the same weights on every rank that passes the same seed). With
// materialize false the parameters have shapes but no storage (ZeRO-3's
// partitioned construction; nothing is allocated). Initialisation is queued
// on `stream`: synchronise it before another stream reads the weights.
// InvalidArgument for a bad config or dtype; ResourceExhausted when the
// weights do not fit.
absl::StatusOr<std::shared_ptr<nn::LossModel>> BuildModel(
    const BenchModelConfig& config, const Device& device, DType dtype,
    uint64_t seed, bool materialize, const Stream& stream);
// The same, owned alone (a chunk for nn::InterleavedStages::Create).
absl::StatusOr<std::unique_ptr<nn::LossModel>> BuildUniqueModel(
    const BenchModelConfig& config, const Device& device, DType dtype,
    uint64_t seed, bool materialize, const Stream& stream);

// The engine's per-rank model-state plan (Engine::memory_breakdown,
// zero::PlanMemory) as JSON, in bytes.
Json MemoryBreakdownJson(const zero::MemoryBreakdown& memory);

// The N of the FLOPs formula: GptConfig::NumParameters() minus the position
// embedding (max_seq_len x C), as nanoGPT's MFU estimate counts it. The tied
// token table counts once (it does the head's matrix product).
int64_t FlopsParameterCount(const nn::GptConfig& config);
// Model FLOPs per trained token (forward + backward, no recomputation):
// 6 N + 12 L C T (PaLM appendix B; T the sequence length).
double FlopsPerToken(const nn::GptConfig& config, int64_t seq);
// The JSON fields describing the FLOPs count (N, its definition, the total).
Json FlopsJson(const nn::GptConfig& config, int64_t seq);

// The model's shape as JSON (layers, heads, channels, vocab, ...).
Json GptConfigJson(const nn::GptConfig& config);

// PyTorch 2.11 on the same H200 (full training step: forward, backward,
// fused AdamW; bf16; flash attention), and the targets. Empty for
// models the issue gives no figure for.
Json ReferenceJson(const std::string& model, bool full_step,
                   double tokens_per_second, double mfu);

// "NVIDIA H200" (cudaGetDeviceProperties) or "cpu".
std::string DeviceName(const Device& device);

// Allocator statistics as JSON, in bytes and GiB.
Json MemoryJson(const AllocatorStats& stats);

// A synthetic batch: tokens and next-token targets, (batch, seq) i32 on
// `device`, uniformly random ids below `vocab_size` from `seed`. Generated on
// the host and copied once, so no generation happens in a timed loop.
struct TokenBatch {
  Tensor tokens;   // (B, T) i32
  Tensor targets;  // (B, T) i32
};
absl::StatusOr<TokenBatch> RandomBatch(int64_t batch, int64_t seq,
                                       int64_t vocab_size, uint64_t seed,
                                       const Device& device,
                                       const Stream& stream);

// Writes `line` as one line of compact JSON on stdout and flushes.
void PrintJson(const Json& line);

// Sets the DeepSpeed precision sections that train a model built with
// `dtype` (config::PrecisionOfDType): "bf16" (enabled for bf16) and, for
// f16, "fp16" with dynamic loss scaling.
void SetPrecisionSections(DType dtype, Json& ds_config);

// A benchmark that cannot start (bad flags, no communicator): prints
// "<program>: <status>" on stderr and {"bench": <bench>, "error": <message>}
// on stdout, so a driver reading the JSON lines sees why; returns
// `exit_code` for main to return.
int ReportStartupError(const char* program, const char* bench,
                       const absl::Status& status, int exit_code);

// Frees the cached device blocks and resets the allocator's peak, so each
// configuration's peak is its own. No-op on the CPU.
void ResetDeviceMemory(const Device& device);

// Times every Forward and Backward call of every module of a tree, through
// the public Module hooks only (the model does not cooperate). Each call is
// bracketed by two timing events recorded on the stream the call's work is
// queued on, so a module's time is what the GPU spent between the first and
// the last of its kernels, including idle gaps while it waited for the host.
// Events come from a pool created up front, and nothing is read back until
// Report, so profiling never synchronises inside a step; its only cost is a
// cudaEventRecord (a few microseconds of host time) per hook.
//
// On the CPU, work is done when a call returns, so the host clock is used.
//
// Per call the profiler knows the enclosing call (calls nest: a container's
// pre hook fires before its children's, its post hook after), so it reports
// inclusive time and self time (inclusive minus the direct children's
// inclusive time: a container's own kernels, such as the attention core or
// the residual adds of a Block, plus the gaps between its children).
// Forward calls made during a backward (activation checkpointing recomputes)
// are reported as phase "recompute". Each line also gives the host time
// between the hooks (host_ms: what queueing the work cost the CPU); where it
// approaches the GPU time, the GPU waits for launches.
class ModuleProfiler {
 public:
  // Adds four hooks to every module of `root` (removed by the destructor).
  // The pool holds the events of `expected_steps` steps in which every
  // module runs forward and backward once (more when checkpointing); when a
  // step needs more, the pool grows inside it (reported as pool_grown).
  static absl::StatusOr<std::unique_ptr<ModuleProfiler>> Attach(
      nn::Module& root, const Device& device, int64_t expected_steps,
      bool checkpointing);
  ~ModuleProfiler();
  ModuleProfiler(const ModuleProfiler&) = delete;
  ModuleProfiler& operator=(const ModuleProfiler&) = delete;

  // Bracket one training step (forward, loss, backward) on `stream`.
  absl::Status BeginStep(const Stream& stream);
  absl::Status EndStep(const Stream& stream);

  // Call after the stream has been synchronised. Returns one JSON object per
  // module type, then one per module path with layer indices replaced by
  // "*" (e.g. "blocks.*.attn.qkv"), then a summary; all times are ms per
  // step, averaged over the profiled steps. `base` fields are copied into
  // every object.
  absl::StatusOr<std::vector<Json>> Report(const Json& base) const;

 private:
  enum Phase { kForward = 0, kBackward = 1, kRecompute = 2 };
  struct Call {
    nn::Module* module = nullptr;
    Phase phase = kForward;
    int parent = -1;  // index of the enclosing call, -1 at top level
    int start = -1;   // mark indices
    int end = -1;
    double host_start_ms = 0;  // host clock at the pre and post hooks
    double host_end_ms = 0;
  };
  struct Step {
    int start = -1;
    int end = -1;
  };

  ModuleProfiler(nn::Module& root, const Device& device);
  // Records the next pool event on `stream` (or reads the host clock) and
  // returns its index.
  absl::StatusOr<int> Mark(const Stream& stream);
  absl::Status Pre(nn::Module& module, Phase phase, const Stream& stream);
  absl::Status Post(nn::Module& module, const Stream& stream);
  absl::StatusOr<double> Ms(int start, int end) const;

  nn::Module& root_;
  Device device_;
  std::vector<std::pair<nn::Module*, nn::HookHandle>> hooks_;
  std::vector<Event> pool_;      // CUDA: timing events
  std::vector<double> host_ms_;  // CPU: host clock per mark
  int next_mark_ = 0;
  int64_t pool_grown_ = 0;
  std::vector<Call> calls_;
  std::vector<int> open_;  // calls whose post hook has not fired
  int open_backward_ = 0;  // backward calls among open_
  std::vector<Step> steps_;
};

}  // namespace bench
}  // namespace ze

#endif  // ZE_BENCH_GPT_BENCH_UTIL_H_
