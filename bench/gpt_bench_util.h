// Helpers shared by gpt_bench and train_bench: flag parsing, the model FLOPs
// formula, the PyTorch reference figures, synthetic token batches and JSON
// output (one object per line on stdout).
#ifndef ZE_BENCH_GPT_BENCH_UTIL_H_
#define ZE_BENCH_GPT_BENCH_UTIL_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "nlohmann/json.hpp"
#include "nn/gpt.h"

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

// The batch for each model: `batch_flag` empty gives the defaults
// (124M: 32, others: 16); one number applies to every model; a list must have
// one number per model. InvalidArgument otherwise.
absl::StatusOr<std::vector<int64_t>> BatchSizes(
    const std::vector<std::string>& models, const std::string& batch_flag);

// The model config for `name`: a preset with the vocabulary padded to 50304,
// or "tiny" (2 layers, 4 heads, 64 channels, vocabulary 256) for smoke runs.
// The position table grows to `seq` when seq exceeds the preset's 1024.
absl::StatusOr<nn::GptConfig> ModelConfig(const std::string& name, int64_t seq);

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

// Frees the cached device blocks and resets the allocator's peak, so each
// configuration's peak is its own. No-op on the CPU.
void ResetDeviceMemory(const Device& device);

}  // namespace bench
}  // namespace ze

#endif  // ZE_BENCH_GPT_BENCH_UTIL_H_
