// Hugging Face GPT-2 checkpoints in and out: name map, layout conversion,
// and streaming load/export through safetensors.
//
// HF GPT-2 (GPT2LMHeadModel / GPT2Model) stores its projections as Conv1D
// weights of shape (in, out); our Linear weights are (out, in) like
// torch.nn.Linear, so those four weights per block are transposed on the way
// in and out. The fused qkv projection keeps HF's column order: [q | k | v],
// each (H, D) with C = H * D, matching nn/functional.h AttentionForward.
//
// The loader hands tensors to a visitor one at a time, so it needs none of
// nn's classes and never holds more than one parameter (plus its source).
#ifndef ZE_NN_PRETRAINED_HF_GPT2_H_
#define ZE_NN_PRETRAINED_HF_GPT2_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "core/safetensors/format.h"
#include "core/tensor.h"

namespace ze {
namespace nn {

// The sizes that fix every GPT-2 parameter's shape.
struct Gpt2Dims {
  int num_layers = 0;         // L
  int64_t channels = 0;       // C
  int64_t vocab_size = 0;     // V (ours may be padded beyond the file's)
  int64_t max_positions = 0;  // maximum sequence length (wpe rows)
};

// A name on the other side of the map, and whether the weight's two axes
// are swapped between the layouts (HF Conv1D (in, out) vs our (out, in)).
struct Gpt2NameMapping {
  std::string name;
  bool transpose = false;
};

// HF name -> our name ("transformer.h.3.attn.c_attn.weight" ->
// {"blocks.3.attn.qkv.weight", transpose = true}). Accepts names with and
// without the "transformer." prefix (GPT2LMHeadModel vs GPT2Model files).
// nullopt for names with no parameter of ours: the attention mask buffers
// (see IsIgnoredHuggingFaceGpt2Name), the tied lm_head, and unknown names.
std::optional<Gpt2NameMapping> MapHuggingFaceGpt2Name(
    absl::string_view hf_name);

// True for HF tensors that are deliberately not loaded: the causal-mask
// buffers ".attn.bias" / ".attn.masked_bias" and "lm_head.weight" (tied to
// wte; its shape is still checked by the loader).
bool IsIgnoredHuggingFaceGpt2Name(absl::string_view hf_name);

// Our name -> HF name without any prefix ("blocks.3.mlp.fc.weight" ->
// {"h.3.mlp.c_fc.weight", transpose = true}); nullopt for unknown names.
std::optional<Gpt2NameMapping> MapToHuggingFaceGpt2Name(
    absl::string_view our_name);

// Every parameter of our GPT with its shape in our layout, in canonical
// order: wte, wpe, blocks.0.* ... blocks.{L-1}.*, ln_f.
std::vector<std::pair<std::string, Shape>> Gpt2ParameterShapes(
    const Gpt2Dims &dims);

// Dims of the checkpoint at `path`, from wte/wpe shapes and the highest
// block index. NotFound / InvalidArgument naming the file when it is not a
// GPT-2 checkpoint; the reader's errors otherwise.
absl::StatusOr<Gpt2Dims> InferHuggingFaceGpt2Dims(const std::string &path);

// Receives one parameter: our name and its values in our layout, a CPU
// tensor of the requested dtype that the visitor may keep (it owns a share).
// A non-OK status stops the load and is returned, annotated with the name.
using Gpt2TensorVisitor =
    std::function<absl::Status(const std::string &our_name, const Tensor &)>;

struct Gpt2LoadOptions {
  // dtype of the tensors given to the visitor: kF32, kBF16 or kF16
  // (conversion rounds to nearest even).
  DType dtype = DType::kF32;
  // The model's dims. When set, the file must match them except that our
  // vocabulary may be larger (padded, e.g. 50257 -> 50304): the extra wte
  // rows are zero. When unset, the file's own dims are used.
  std::optional<Gpt2Dims> expected;
};

// Loads the HF GPT-2 safetensors file at `path`: checks it completely
// first, then calls `visitor` once per parameter in Gpt2ParameterShapes
// order with the transposed/converted tensor. Reads one tensor at a time.
// Errors name the file and the tensors: InvalidArgument listing every
// unexpected tensor, every missing parameter and every shape mismatch (all
// found before any visitor call); InvalidArgument for a dims mismatch or an
// unsupported file dtype (supported: F32, BF16, F16, F64); the reader's and
// the visitor's errors otherwise.
absl::Status LoadHuggingFaceGpt2(const std::string &path,
                                 const Gpt2TensorVisitor &visitor,
                                 const Gpt2LoadOptions &options = {});

// The metadata key of a converted file (ConvertHuggingFaceGpt2File) that
// holds the Hugging Face file's vocabulary, in decimal: the token table's
// rows beyond it are padding, so a model loading the file knows which
// logits are real.
inline constexpr char kVocabularyMetadataKey[] = "vocab_size";

// Converts the HF GPT-2 safetensors file at `hf_path` into a safetensors
// file of our names and layout at `out_path` (what Engine::LoadWeights and
// GptModel read), elements converted to `dtype` (kF32, kBF16 or kF16).
// With vocab_size > 0 the token table gets that many rows, the rows beyond
// the file's vocabulary zero (padding, e.g. 50257 -> 50304); below the
// file's vocabulary is InvalidArgument naming --vocab_size. The file's own
// vocabulary is recorded under kVocabularyMetadataKey. Streams one
// tensor at a time (LoadHuggingFaceGpt2 checks the whole file first); the
// output is written atomically (safetensors::Writer). Returns the dims
// written. Errors as LoadHuggingFaceGpt2's, and the writer's naming
// `out_path`.
absl::StatusOr<Gpt2Dims> ConvertHuggingFaceGpt2File(const std::string &hf_path,
                                                    const std::string &out_path,
                                                    DType dtype,
                                                    int64_t vocab_size = 0);

// Gives the values of one of our parameters, by our name, in our layout
// (a CPU tensor of kF32, kBF16 or kF16 with the Gpt2ParameterShapes shape).
using Gpt2TensorSource =
    std::function<absl::StatusOr<Tensor>(const std::string &our_name)>;

struct Gpt2ExportOptions {
  // Element type written to the file.
  DType dtype = DType::kF32;
  // Prefix for every name: "transformer." matches GPT2LMHeadModel's
  // state_dict; "" matches GPT2Model (and the hub's gpt2 file). Both load
  // with transformers' from_pretrained.
  std::string prefix = "transformer.";
  // Rows of wte to write: 0 means dims.vocab_size; a smaller value drops our
  // padding rows (e.g. 50304 -> 50257).
  int64_t vocab_size = 0;
  // Added to the file's metadata; "format": "pt" is always set, since
  // transformers refuses safetensors files without it.
  safetensors::Metadata metadata;
};

// Writes our parameters as an HF GPT-2 safetensors file at `path`, asking
// `source` for one parameter at a time (streaming: only one is held) and
// transposing the Conv1D weights back. lm_head is not written (tied).
// Atomic like safetensors::Writer. InvalidArgument naming the parameter when
// `source` returns a wrong shape or dtype; the source's and the writer's
// errors otherwise.
absl::Status ExportHuggingFaceGpt2(const std::string &path,
                                   const Gpt2Dims &dims,
                                   const Gpt2TensorSource &source,
                                   const Gpt2ExportOptions &options = {});

}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_PRETRAINED_HF_GPT2_H_
