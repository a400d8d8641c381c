#include "engine/checkpoint/consolidate.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/safetensors/writer.h"
#include "core/status.h"
#include "nn/decoder_config.h"
#include "nn/pretrained/hf_decoder.h"
#include "nn/pretrained/hf_gpt2.h"

namespace ze {
namespace checkpoint {
namespace {

// Reads parameter `record`'s full value of `kind` as `dtype`, tracking the
// bytes held in `report`.
absl::StatusOr<Tensor> ReadParameter(const CheckpointReader& reader,
                                     const ParameterRecord& record,
                                     const std::string& kind, DType dtype,
                                     ConsolidateReport* report) {
  ZE_ASSIGN_OR_RETURN(Tensor value,
                      Tensor::Empty(record.shape, dtype, Device::Cpu()));
  ZE_RETURN_IF_ERROR(reader.ReadRange(kind, record.name, 0, value));
  ++report->parameters;
  return value;
}

// The most bytes of values held at once for `record`: its full value in
// `dtype`, plus (when the stored dtype differs) the largest piece staged by
// ReadRange before conversion. The hf-gpt2 export then makes a converted
// (possibly transposed) copy of the value, of the same size, after the
// staging buffer is freed. Allocation rounding (at most 256 bytes a buffer)
// is not counted.
int64_t ValueBytes(const Manifest& manifest, const ParameterRecord& record,
                   const std::string& kind, DType dtype,
                   ConsolidateFormat format) {
  const DType stored = kind == kWeights ? manifest.model_dtype : DType::kF32;
  const int64_t value_bytes =
      record.numel() * static_cast<int64_t>(SizeOf(dtype));
  int64_t staged_bytes = 0;
  if (stored != dtype) {
    int64_t largest_piece = 0;
    for (const Piece& piece : record.pieces) {
      largest_piece = std::max(largest_piece, piece.count);
    }
    staged_bytes = largest_piece * static_cast<int64_t>(SizeOf(stored));
  }
  if (format == ConsolidateFormat::kHfGpt2) {
    staged_bytes = std::max(staged_bytes, value_bytes);
  }
  return value_bytes + staged_bytes;
}

// The step the checkpoint was saved at, for the output's metadata.
std::string GlobalSteps(const Manifest& manifest) {
  const auto found = manifest.training_state.find("global_steps");
  return found == manifest.training_state.end() ? "unknown" : found->dump();
}

absl::StatusOr<nn::Gpt2Dims> GptDims(const Manifest& manifest) {
  const ParameterRecord* wte = manifest.Find("embed.wte");
  const ParameterRecord* wpe = manifest.Find("embed.wpe");
  if (wte == nullptr || wpe == nullptr || wte->shape.size() != 2 ||
      wpe->shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", manifest.tag,
                     " is not a GPT (no embed.wte / embed.wpe matrices): "
                     "hf-gpt2 needs one"));
  }
  nn::Gpt2Dims dims;
  dims.vocab_size = wte->shape[0];
  dims.channels = wte->shape[1];
  dims.max_positions = wpe->shape[0];
  for (const ParameterRecord& record : manifest.parameters) {
    if (record.name.rfind("blocks.", 0) != 0) continue;
    const size_t dot = record.name.find('.', 7);
    int index = 0;
    if (absl::SimpleAtoi(record.name.substr(7, dot - 7), &index)) {
      dims.num_layers = std::max(dims.num_layers, index + 1);
    }
  }
  return dims;
}

// The token table's rows to export (see ConsolidateOptions::vocab_size).
absl::StatusOr<int64_t> ExportedVocabulary(const CheckpointReader& reader,
                                           const nn::Gpt2Dims& dims,
                                           int64_t requested) {
  int64_t rows = requested;
  const char* source = "vocab_size";
  if (rows == 0) {
    const nlohmann::json& client_state = reader.manifest().client_state;
    const auto recorded = client_state.find(kClientStateVocabularyKey);
    if (recorded == client_state.end() || !recorded->is_number_integer() ||
        recorded->get<int64_t>() <= 0) {
      return dims.vocab_size;
    }
    rows = recorded->get<int64_t>();
    source = "the checkpoint's client_state vocab_size";
  }
  if (rows < 0 || rows > dims.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(reader.tag_directory(), ": ", source, " ", rows,
                     " is not between 1 and the token table's ",
                     dims.vocab_size, " rows (embed.wte)"));
  }
  return rows;
}

// The decoder's config.json the checkpoint's client_state records.
absl::StatusOr<nn::DecoderConfig> RecordedDecoderConfig(
    const CheckpointReader& reader) {
  const nlohmann::json& client_state = reader.manifest().client_state;
  const auto recorded = client_state.find(kClientStateHfConfigKey);
  if (recorded == client_state.end() || !recorded->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "consolidate --format=hf: checkpoint ", reader.tag_directory(),
        " records no Hugging Face config.json (client_state \"",
        kClientStateHfConfigKey,
        "\"): only a Llama, Mistral or Qwen decoder saved with its config "
        "can be written as a model directory (a GPT: --format=hf-gpt2)"));
  }
  return nn::DecoderConfig::FromHuggingFaceJson(
      recorded->dump(), absl::StrCat(reader.tag_directory(), " client_state ",
                                     kClientStateHfConfigKey));
}

}  // namespace

absl::StatusOr<ConsolidateReport> Consolidate(
    const CheckpointReader& reader, const ConsolidateOptions& options) {
  const Manifest& manifest = reader.manifest();
  if (options.dtype != DType::kF32 && options.dtype != DType::kBF16 &&
      options.dtype != DType::kF16) {
    return absl::InvalidArgumentError(
        "consolidate: the output dtype must be f32, bf16 or f16");
  }
  const std::string kind =
      !options.kind.empty() ? options.kind
                            : (manifest.HasKind(kMaster) ? kMaster : kWeights);
  if (!manifest.HasKind(kind)) {
    return absl::NotFoundError(absl::StrCat(reader.tag_directory(), ": no \"",
                                            kind, "\" state to consolidate"));
  }
  ConsolidateReport report;
  // The bound, checked before anything is written.
  const ParameterRecord* largest = nullptr;
  for (const ParameterRecord& record : manifest.parameters) {
    const int64_t bytes =
        ValueBytes(manifest, record, kind, options.dtype, options.format);
    if (bytes > report.peak_value_bytes) {
      report.peak_value_bytes = bytes;
      largest = &record;
    }
  }
  if (options.memory_limit_bytes > 0 &&
      report.peak_value_bytes > options.memory_limit_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "consolidate: parameter ", largest->name, " needs ",
        report.peak_value_bytes, " bytes at once, over the limit of ",
        options.memory_limit_bytes));
  }
  if (options.verify_checksums) {
    absl::Status verified = reader.VerifyFiles();
    if (!verified.ok()) {
      return absl::Status(verified.code(),
                          absl::StrCat("consolidate: ", verified.message(),
                                       "; nothing was written"));
    }
  }

  // The parameter `name`'s full value for an exporter.
  auto exported = [&](const std::string& name) -> absl::StatusOr<Tensor> {
    const ParameterRecord* record = manifest.Find(name);
    if (record == nullptr) {
      return absl::NotFoundError(
          absl::StrCat(reader.tag_directory(), ": no parameter ", name));
    }
    report.bytes_written +=
        record->numel() * static_cast<int64_t>(SizeOf(options.dtype));
    return ReadParameter(reader, *record, kind, options.dtype, &report);
  };
  const safetensors::Metadata provenance = {
      {"source", "zero-engine checkpoint"},
      {"source_tag", manifest.tag},
      {"global_steps", GlobalSteps(manifest)}};
  if (options.format == ConsolidateFormat::kHf) {
    ZE_ASSIGN_OR_RETURN(const nn::DecoderConfig config,
                        RecordedDecoderConfig(reader));
    // Every parameter of the config, with its shape, before anything is
    // written; and nothing else.
    const auto shapes = config.ParameterShapes();
    for (const auto& [name, shape] : shapes) {
      const ParameterRecord* record = manifest.Find(name);
      if (record == nullptr || record->shape != shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            "consolidate --format=hf: ", reader.tag_directory(),
            record == nullptr ? " has no parameter "
                              : " has another shape for parameter ",
            name, " of its recorded config.json"));
      }
    }
    if (shapes.size() != manifest.parameters.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("consolidate --format=hf: ", reader.tag_directory(),
                       " has ", manifest.parameters.size(),
                       " parameters, its config.json ", shapes.size()));
    }
    nn::DecoderExportOptions export_options;
    export_options.dtype = options.dtype;
    export_options.max_shard_bytes = options.max_shard_bytes;
    export_options.metadata = provenance;
    ZE_RETURN_IF_ERROR(nn::ExportHuggingFaceDecoder(options.output_path, config,
                                                    exported, export_options));
    return report;
  }
  if (options.format == ConsolidateFormat::kHfGpt2) {
    ZE_ASSIGN_OR_RETURN(nn::Gpt2Dims dims, GptDims(manifest));
    nn::Gpt2ExportOptions export_options;
    export_options.dtype = options.dtype;
    ZE_ASSIGN_OR_RETURN(export_options.vocab_size,
                        ExportedVocabulary(reader, dims, options.vocab_size));
    export_options.metadata = provenance;
    ZE_RETURN_IF_ERROR(nn::ExportHuggingFaceGpt2(options.output_path, dims,
                                                 exported, export_options));
    return report;
  }

  std::vector<safetensors::TensorSpec> specs;
  for (const ParameterRecord& record : manifest.parameters) {
    specs.push_back(
        {record.name, safetensors::ElementTypeOf(options.dtype), record.shape});
  }
  safetensors::Metadata metadata = {{"format", "pt"},
                                    {"source", "zero-engine checkpoint"},
                                    {"source_tag", manifest.tag},
                                    {"global_steps", GlobalSteps(manifest)}};
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<safetensors::Writer> writer,
                      safetensors::Writer::Create(options.output_path,
                                                  std::move(specs), metadata));
  for (const ParameterRecord& record : manifest.parameters) {
    ZE_ASSIGN_OR_RETURN(Tensor value, ReadParameter(reader, record, kind,
                                                    options.dtype, &report));
    ZE_RETURN_IF_ERROR(writer->Append(record.name, value));
    report.bytes_written += static_cast<int64_t>(value.nbytes());
  }
  ZE_RETURN_IF_ERROR(writer->Finish());
  return report;
}

}  // namespace checkpoint
}  // namespace ze
