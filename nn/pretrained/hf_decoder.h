// Hugging Face decoder checkpoints (Llama, Mistral, Qwen2, Qwen3) in and out:
// one name table for the four families, a streaming reader of a model
// directory, and a writer of one (sharded by size) that transformers'
// AutoModelForCausalLM.from_pretrained loads.
//
// A model directory is what save_pretrained writes:
//   config.json                     the shape (nn/decoder_config.h reads it)
//   model.safetensors               every tensor, or, when sharded,
//   model.safetensors.index.json    {"weight_map": {key: shard file}, ...}
//   model-00001-of-0000N.safetensors ...
// Hugging Face's Linear weights are (out, in) like ours, so parameters are
// copied element for element: only the names change (and the element type,
// when asked). Which parameters a model has (biases for Qwen2, q/k norms for
// Qwen3, lm_head when untied) is DecoderConfig::ParameterShapes()'s to say;
// the table here only translates names.
//
// Nothing here holds more than one parameter at a time (plus, for a ranged
// read, the range): the reader keeps each shard open by its descriptor and
// reads a parameter's bytes when asked; the writer fixes each shard's header
// from the shapes and streams the values in.
#ifndef ZE_NN_PRETRAINED_HF_DECODER_H_
#define ZE_NN_PRETRAINED_HF_DECODER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
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
#include "nn/decoder_config.h"

namespace ze {
namespace safetensors {
class Reader;
class Writer;
}  // namespace safetensors

namespace nn {

// The files of a model directory.
inline constexpr char kHfConfigFile[] = "config.json";
inline constexpr char kHfWeightsFile[] = "model.safetensors";
inline constexpr char kHfIndexFile[] = "model.safetensors.index.json";

// ---------------------------------------------------------------------------
// The name table.

// Hugging Face name -> ours ("model.layers.3.self_attn.q_proj.weight" ->
// "layers.3.attn.q_proj.weight", "model.embed_tokens.weight" ->
// "embed_tokens.weight", "lm_head.weight" -> "lm_head.weight"). nullopt for
// a name with no entry (whether a model has that parameter is the config's
// business, not the table's).
std::optional<std::string> MapHuggingFaceDecoderName(absl::string_view hf_name);

// Ours -> Hugging Face's; nullopt for a name with no entry.
std::optional<std::string> MapToHuggingFaceDecoderName(
    absl::string_view our_name);

// True for tensors some hub files carry that are deliberately not loaded:
// the rotary embedding's "model.layers.N.self_attn.rotary_emb.inv_freq"
// buffers (older transformers saved them; they are recomputed from the
// config).
bool IsIgnoredHuggingFaceDecoderName(absl::string_view hf_name);

// ---------------------------------------------------------------------------
// Reading.

// Reads and parses `directory`/config.json (DecoderConfig's errors, which
// name the file and the key; NotFound naming the file when it is absent).
absl::StatusOr<DecoderConfig> ReadHuggingFaceDecoderConfig(
    const std::string &directory);

// Receives one parameter: our name and its values, a CPU tensor of the
// requested dtype and of ParameterShapes()'s shape that the visitor may keep
// (it owns a share). A non-OK status stops the load and is returned,
// annotated with the file, the key and our name.
using DecoderTensorVisitor =
    std::function<absl::Status(const std::string &our_name, const Tensor &)>;

struct DecoderLoadOptions {
  // dtype of the tensors given to the visitor or read: kF32, kBF16 or kF16
  // (conversion rounds to nearest even; f32 -> f32 and 16-bit -> f32 are
  // exact).
  DType dtype = DType::kF32;
  // The model's config. When set, the directory's config.json must give the
  // same family and parameter shapes (InvalidArgument naming both
  // otherwise); runtime-only settings (eps, rope, window) are the model's
  // business. When unset, config.json alone decides.
  std::optional<DecoderConfig> expected;
};

// An opened, completely checked model directory. Open reads config.json,
// the index (when sharded) and every shard's header, and checks all of it
// before anything is read, reporting every problem at once: missing
// parameters, unexpected tensors (beyond the model's layers, a bias the
// family has no use for, a name with no entry in the table), shapes,
// element types other than F32/BF16/F16, keys the index places in a shard
// that lacks them (or in two shards), shards that do not exist, and, for a
// tied model whose file holds lm_head.weight as well, a head whose shape or
// values differ from the embedding (equal copies are accepted and skipped;
// this check reads both tables, a chunk at a time).
//
// Reads are const and may run concurrently (safetensors::Reader's pread).
// The reader keeps one file descriptor per shard until it is destroyed.
class HuggingFaceDecoderReader {
 public:
  // Where one of our parameters lies.
  struct Source {
    std::string our_name;
    Shape shape;       // ours, = the file's
    std::string file;  // the shard's path
    std::string key;   // the Hugging Face name in it
    safetensors::ElementType dtype = safetensors::ElementType::kF32;
    uint64_t num_bytes = 0;
  };

  // Opens `directory` (checks above). InvalidArgument starting with the
  // directory and listing every problem, each naming the file and the key
  // (a shard the index lists that does not exist, or that is not a valid
  // safetensors file, is one of them); NotFound naming the directory when
  // it has neither model.safetensors nor model.safetensors.index.json, and
  // naming config.json when that is absent; DecoderConfig's errors for the
  // config; InvalidArgument naming the index for a malformed index. When
  // both model.safetensors and an index exist, model.safetensors is read
  // (as from_pretrained does).
  static absl::StatusOr<std::unique_ptr<HuggingFaceDecoderReader>> Open(
      const std::string &directory, const DecoderLoadOptions &options = {});

  ~HuggingFaceDecoderReader();
  HuggingFaceDecoderReader(const HuggingFaceDecoderReader &) = delete;
  HuggingFaceDecoderReader &operator=(const HuggingFaceDecoderReader &) =
      delete;

  const std::string &directory() const { return directory_; }
  // The directory's config (config.json).
  const DecoderConfig &config() const { return config_; }
  // Every parameter, in DecoderConfig::ParameterShapes() order.
  const std::vector<Source> &parameters() const { return sources_; }
  // The source of `our_name`, or null when the model has no such parameter.
  const Source *Find(absl::string_view our_name) const;
  // Bytes of parameter data in the files (an ignored copy of a tied head
  // not counted).
  uint64_t parameter_bytes() const;

  // Parameter `our_name` whole, in a new CPU tensor of `dtype` (kF32, kBF16
  // or kF16). NotFound naming the directory for an unknown name; read
  // errors naming the file and the key.
  absl::StatusOr<Tensor> Read(absl::string_view our_name, DType dtype) const;

  // Elements [element_begin, element_begin + destination.numel()) of
  // parameter `our_name`, flattened row-major, converted into `destination`
  // (a CPU tensor of kF32, kBF16 or kF16, any shape): how a rank loads only
  // its slice. Reads just those bytes (in chunks of at most 4 MiB when
  // converting). OutOfRange when the range leaves the parameter;
  // InvalidArgument for a destination that is not a CPU float tensor.
  absl::Status ReadRange(absl::string_view our_name, int64_t element_begin,
                         const Tensor &destination) const;

  // Calls `visitor` once per parameter, in parameters() order, with its
  // values as a new CPU tensor of `dtype` (one parameter alive at a time,
  // unless the visitor keeps them).
  absl::Status ForEach(const DecoderTensorVisitor &visitor, DType dtype) const;

 private:
  HuggingFaceDecoderReader() = default;

  std::string directory_;
  DecoderConfig config_;
  std::vector<Source> sources_;
  std::map<std::string, size_t, std::less<>> index_;  // our name -> sources_
  // Shard path -> its reader.
  std::map<std::string, std::unique_ptr<safetensors::Reader>> files_;
};

// Opens `directory` (HuggingFaceDecoderReader::Open, every check before any
// read) and calls `visitor` once per parameter in ParameterShapes() order.
// Returns the directory's config. Errors as Open's, the reads' and the
// visitor's.
absl::StatusOr<DecoderConfig> LoadHuggingFaceDecoder(
    const std::string &directory, const DecoderTensorVisitor &visitor,
    const DecoderLoadOptions &options = {});

// ---------------------------------------------------------------------------
// Writing.

struct DecoderExportOptions {
  // Element type written: kF32, kBF16 or kF16.
  DType dtype = DType::kF32;
  // 0: one model.safetensors. Otherwise the parameters, in order, are cut
  // into shards of at most this many bytes of data each (a parameter larger
  // than that gets a shard of its own, as save_pretrained does), named
  // model-00001-of-0000N.safetensors, with model.safetensors.index.json.
  uint64_t max_shard_bytes = 0;
  // Added to every shard's metadata; "format": "pt" is always set, since
  // transformers refuses safetensors files without it.
  safetensors::Metadata metadata;
};

// Writes a model directory from parameters handed over one at a time, in
// parameters() order (DecoderConfig::ParameterShapes()), each in one or
// more chunks:
//
//   ZE_ASSIGN_OR_RETURN(auto writer,
//                       HuggingFaceDecoderWriter::Create(dir, config, opts));
//   for (const auto& [name, shape] : writer->parameters())
//     ZE_RETURN_IF_ERROR(writer->Append(name, values_of(name)));
//   ZE_RETURN_IF_ERROR(writer->Finish());
//
// Only the shard being written is open; each shard file is written
// atomically (safetensors::Writer: a temporary name, renamed by its
// Finish). Finish writes the index (when sharded) and config.json
// (DecoderConfig::ToHuggingFaceJson) atomically, last, and then removes the
// weight files of an earlier export that the new one does not name (a
// model.safetensors beside a new index, or an index and shards beside a new
// model.safetensors, or shards of another count), since from_pretrained
// would read those instead. A failure leaves the shards finished so far
// and no config.json or index of this export.
// Not thread-safe.
class HuggingFaceDecoderWriter {
 public:
  // Creates `directory` if absent (its parent must exist) and the first
  // shard. InvalidArgument for a config Validate() refuses or a dtype that
  // is not kF32/kBF16/kF16; the file system's errors naming the path.
  static absl::StatusOr<std::unique_ptr<HuggingFaceDecoderWriter>> Create(
      const std::string &directory, const DecoderConfig &config,
      const DecoderExportOptions &options = {});

  ~HuggingFaceDecoderWriter();
  HuggingFaceDecoderWriter(const HuggingFaceDecoderWriter &) = delete;
  HuggingFaceDecoderWriter &operator=(const HuggingFaceDecoderWriter &) =
      delete;

  // Our parameters with their shapes, in the order they must come.
  const std::vector<std::pair<std::string, Shape>> &parameters() const {
    return parameters_;
  }
  // The weight files this export writes (names inside the directory).
  std::vector<std::string> files() const;

  // Appends the elements of `values` (a CPU tensor of kF32, kBF16 or kF16;
  // only its row-major elements count, not its shape), converted to the
  // export's dtype, to parameter `our_name`, which must be the first one
  // not yet complete. FailedPrecondition naming both for another name or
  // after a failure or Finish; InvalidArgument for a tensor that is not a
  // CPU float tensor or has more elements than the parameter still lacks;
  // the file system's errors naming the shard.
  absl::Status Append(absl::string_view our_name, const Tensor &values);

  // FailedPrecondition naming the first incomplete parameter unless every
  // one is complete; then finishes the last shard and writes the index and
  // config.json (see the class comment).
  absl::Status Finish();

 private:
  struct Shard {
    std::string file;                // name inside the directory
    std::vector<size_t> parameters;  // indices into parameters_
    uint64_t bytes = 0;
  };
  HuggingFaceDecoderWriter() = default;
  absl::Status OpenShard(size_t shard);
  absl::Status Fail(absl::Status status);

  std::string directory_;
  DecoderConfig config_;
  DecoderExportOptions options_;
  std::vector<std::pair<std::string, Shape>> parameters_;
  std::vector<std::string> hf_names_;  // per parameter
  std::vector<Shard> shards_;
  std::vector<size_t> shard_of_;                 // per parameter
  size_t current_ = 0;                           // first incomplete parameter
  int64_t written_in_current_ = 0;               // its elements written so far
  std::unique_ptr<safetensors::Writer> writer_;  // the open shard
  size_t open_shard_ = 0;
  absl::Status failure_;
  bool finished_ = false;
};

// Gives the values of one of our parameters, by our name: a CPU tensor of
// kF32, kBF16 or kF16 with ParameterShapes()'s shape.
using DecoderTensorSource =
    std::function<absl::StatusOr<Tensor>(const std::string &our_name)>;

// Writes `directory` (HuggingFaceDecoderWriter) asking `source` for one
// parameter at a time. InvalidArgument naming the parameter when the source
// returns a wrong shape or a tensor that is not a CPU float tensor; the
// source's and the writer's errors otherwise.
absl::Status ExportHuggingFaceDecoder(const std::string &directory,
                                      const DecoderConfig &config,
                                      const DecoderTensorSource &source,
                                      const DecoderExportOptions &options = {});

}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_PRETRAINED_HF_DECODER_H_
