// Consolidation: one safetensors file holding every parameter's full value
// from a sharded checkpoint, streamed one parameter at a time, so the
// memory it needs is bounded by the largest parameter, never the model.
// The output loads with PyTorch's `safetensors.torch.load_file` (our names
// and shapes); in the hf-gpt2 format, with transformers'
// GPT2LMHeadModel.from_pretrained; in the hf format (a Llama, Mistral or
// Qwen decoder), it is a model directory that
// AutoModelForCausalLM.from_pretrained loads.
#ifndef ZE_ENGINE_CHECKPOINT_CONSOLIDATE_H_
#define ZE_ENGINE_CHECKPOINT_CONSOLIDATE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "engine/checkpoint/checkpoint_format.h"

namespace ze {
namespace checkpoint {

enum class ConsolidateFormat {
  kNative,  // our parameter names and shapes
  kHfGpt2,  // Hugging Face GPT-2 names and Conv1D layout (GPT models only)
  // A Hugging Face model directory (config.json, model.safetensors or
  // shards with their index) of a decoder (nn/decoder.h) whose checkpoint
  // records its config.json (kClientStateHfConfigKey).
  kHf,
};

// The client_state key (Engine::SaveCheckpoint's) under which a GPT's
// writer records its real vocabulary, the token table's rows beyond it being
// padding; hf-gpt2 consolidation reads it (ConsolidateOptions::vocab_size).
inline constexpr char kClientStateVocabularyKey[] = "vocab_size";
// The client_state key under which a decoder's writer (train_gpt, or a
// user's own loop) records the model's config.json as a JSON object
// (nn::DecoderConfig::ToHuggingFaceJson); hf consolidation needs it.
inline constexpr char kClientStateHfConfigKey[] = "hf_config";

struct ConsolidateOptions {
  // A file; for kHf a directory (created if absent; its parent must exist).
  std::string output_path;
  // The kind of state to take values from; empty: "master" (f32, exact)
  // when the checkpoint has it, else "weights".
  std::string kind;
  DType dtype = DType::kF32;  // element type written (kF32, kBF16, kF16)
  ConsolidateFormat format = ConsolidateFormat::kNative;
  // When > 0: the most bytes of parameter values the consolidation may hold
  // at once. ResourceExhausted (naming the parameter and the bytes) before
  // anything is written when the largest parameter needs more.
  int64_t memory_limit_bytes = 0;
  // hf-gpt2 only: rows of the token table to write, dropping the padding
  // rows a model adds for speed (e.g. 50304 -> 50257) so the file matches
  // a GPT2Config of the real vocabulary. 0: the checkpoint's client_state
  // kClientStateVocabularyKey when it holds a positive integer (train_gpt
  // records it),
  // else every row. More rows than the table has is InvalidArgument.
  int64_t vocab_size = 0;
  // hf only: 0 writes one model.safetensors; otherwise shards of at most
  // this many bytes of values each, with model.safetensors.index.json
  // (save_pretrained's max_shard_size).
  uint64_t max_shard_bytes = 0;
  // Every rank file's CRC-32C is checked against the manifest before
  // anything is written, as a load checks them (CheckpointReader::
  // VerifyFiles: one extra read of the checkpoint). Off only where the
  // files were just written and checksummed on their way out (the engine's
  // own consolidation after a save).
  bool verify_checksums = true;
};

struct ConsolidateReport {
  int64_t parameters = 0;
  int64_t bytes_written = 0;  // tensor bytes in the output
  // The most bytes of parameter values held at once, computed from the
  // shapes before anything is written: the largest parameter's value in the
  // output dtype, plus its largest piece staged in the stored dtype when the
  // dtypes differ (hf-gpt2: plus the larger of that and the exported copy).
  // Host allocations during Consolidate stay within it, up to allocation
  // rounding (consolidate_test measures this with the host allocator).
  int64_t peak_value_bytes = 0;
};

// Writes the consolidated file at options.output_path (atomically: the
// path holds the old file, or none, until it is complete; on any error
// nothing is left there). Errors name the parameter or the file: DataLoss
// naming a corrupt rank file (its checksum, before anything is written),
// the reader's (NotFound for a missing kind, read errors), the writer's
// (ResourceExhausted for a full disk), InvalidArgument for an unsupported
// dtype, for hf-gpt2 a checkpoint that is not a GPT, for hf one without
// the config.json in its client_state or whose parameters are not that
// config's (naming the first). kHf writes its shards atomically and
// config.json last (nn::HuggingFaceDecoderWriter).
absl::StatusOr<ConsolidateReport> Consolidate(
    const CheckpointReader& reader, const ConsolidateOptions& options);

}  // namespace checkpoint
}  // namespace ze

#endif  // ZE_ENGINE_CHECKPOINT_CONSOLIDATE_H_
