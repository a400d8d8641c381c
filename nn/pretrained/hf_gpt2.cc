#include "nn/pretrained/hf_gpt2.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "core/dtype.h"
#include "core/safetensors/reader.h"
#include "core/safetensors/writer.h"
#include "core/status.h"
#include "nn/pretrained/hf_names.h"

namespace ze {
namespace nn {
namespace {

using safetensors::ElementType;
using safetensors::Reader;
using safetensors::TensorInfo;

// The shape of a parameter in OUR layout, as a function of the dims.
enum class ShapeKind {
  kVocabByC,      // (V, C)
  kPositionsByC,  // (P, C)
  kC,             // (C)
  kThreeC,        // (3C)
  kThreeCByC,     // (3C, C)
  kCByC,          // (C, C)
  kFourC,         // (4C)
  kFourCByC,      // (4C, C)
  kCByFourC,      // (C, 4C)
};

struct ParamEntry {
  const char *hf_suffix;
  const char *our_suffix;
  bool transpose;  // HF Conv1D (in, out) vs our Linear (out, in)
  ShapeKind shape;
};

// THE name table. Our names are defined by nn's GPT; if they change, this is
// the one place to follow them. Order is our canonical parameter order.
constexpr ParamEntry kEmbeddingParams[] = {
    {"wte.weight", "embed.wte", false, ShapeKind::kVocabByC},
    {"wpe.weight", "embed.wpe", false, ShapeKind::kPositionsByC},
};
constexpr ParamEntry kBlockParams[] = {
    {"ln_1.weight", "ln1.weight", false, ShapeKind::kC},
    {"ln_1.bias", "ln1.bias", false, ShapeKind::kC},
    {"attn.c_attn.weight", "attn.qkv.weight", true, ShapeKind::kThreeCByC},
    {"attn.c_attn.bias", "attn.qkv.bias", false, ShapeKind::kThreeC},
    {"attn.c_proj.weight", "attn.proj.weight", true, ShapeKind::kCByC},
    {"attn.c_proj.bias", "attn.proj.bias", false, ShapeKind::kC},
    {"ln_2.weight", "ln2.weight", false, ShapeKind::kC},
    {"ln_2.bias", "ln2.bias", false, ShapeKind::kC},
    {"mlp.c_fc.weight", "mlp.fc.weight", true, ShapeKind::kFourCByC},
    {"mlp.c_fc.bias", "mlp.fc.bias", false, ShapeKind::kFourC},
    {"mlp.c_proj.weight", "mlp.proj.weight", true, ShapeKind::kCByFourC},
    {"mlp.c_proj.bias", "mlp.proj.bias", false, ShapeKind::kC},
};
constexpr ParamEntry kFinalParams[] = {
    {"ln_f.weight", "ln_f.weight", false, ShapeKind::kC},
    {"ln_f.bias", "ln_f.bias", false, ShapeKind::kC},
};
// Our token table: its row count may exceed the file's (vocabulary padding).
constexpr char kOurTokenTable[] = "embed.wte";
constexpr char kHfBlockPrefix[] = "h.";
constexpr char kOurBlockPrefix[] = "blocks.";
constexpr char kHfModelPrefix[] = "transformer.";
constexpr char kHfLmHead[] = "lm_head.weight";
// Per-block buffers HF saves with some checkpoints (causal mask, -1e4).
constexpr const char *kHfIgnoredBlockSuffixes[] = {"attn.bias",
                                                   "attn.masked_bias"};

Shape OurShape(ShapeKind kind, const Gpt2Dims &dims) {
  const int64_t c = dims.channels;
  switch (kind) {
    case ShapeKind::kVocabByC:
      return {dims.vocab_size, c};
    case ShapeKind::kPositionsByC:
      return {dims.max_positions, c};
    case ShapeKind::kC:
      return {c};
    case ShapeKind::kThreeC:
      return {3 * c};
    case ShapeKind::kThreeCByC:
      return {3 * c, c};
    case ShapeKind::kCByC:
      return {c, c};
    case ShapeKind::kFourC:
      return {4 * c};
    case ShapeKind::kFourCByC:
      return {4 * c, c};
    case ShapeKind::kCByFourC:
      return {c, 4 * c};
  }
  return {};
}

Shape Transposed(const Shape &shape) {
  ZE_CHECK(shape.size() == 2);
  return {shape[1], shape[0]};
}

// Looks `name` up on one side of the table (hf or ours) and returns the
// other side, with or without the block index.
std::optional<Gpt2NameMapping> MapName(absl::string_view name, bool from_hf) {
  auto side = [from_hf](const ParamEntry &entry) {
    return from_hf ? entry.hf_suffix : entry.our_suffix;
  };
  auto other = [from_hf](const ParamEntry &entry) {
    return from_hf ? entry.our_suffix : entry.hf_suffix;
  };
  int index = 0;
  absl::string_view rest;
  if (SplitIndexedName(name, from_hf ? kHfBlockPrefix : kOurBlockPrefix, &index,
                       &rest)) {
    for (const ParamEntry &entry : kBlockParams) {
      if (rest == side(entry)) {
        return Gpt2NameMapping{
            absl::StrCat(from_hf ? kOurBlockPrefix : kHfBlockPrefix, index, ".",
                         other(entry)),
            entry.transpose};
      }
    }
    return std::nullopt;
  }
  for (const auto *table : {&kEmbeddingParams, &kFinalParams}) {
    for (const ParamEntry &entry : *table) {
      if (name == side(entry)) {
        return Gpt2NameMapping{other(entry), entry.transpose};
      }
    }
  }
  return std::nullopt;
}

absl::string_view StripModelPrefix(absl::string_view hf_name) {
  absl::ConsumePrefix(&hf_name, kHfModelPrefix);
  return hf_name;
}

// Finds `hf_name` in the file with or without the "transformer." prefix.
const TensorInfo *FindEither(const Reader &reader, absl::string_view hf_name) {
  const TensorInfo *info = reader.Find(absl::StrCat(kHfModelPrefix, hf_name));
  return info != nullptr ? info : reader.Find(hf_name);
}

bool IsLoadableElementType(ElementType type) {
  return type == ElementType::kF32 || type == ElementType::kBF16 ||
         type == ElementType::kF16 || type == ElementType::kF64;
}

float LoadElement(const void *data, ElementType type, size_t index) {
  if (type == ElementType::kF64) {
    return static_cast<float>(static_cast<const double *>(data)[index]);
  }
  return LoadAsFloat(data, safetensors::DTypeOf(type).value(), index);
}

// Converts `rows` x `cols` elements at `source` (of `source_type`) into
// `destination` (of `destination_dtype`), transposing when asked:
// destination is then (cols, rows). Tiled so both sides stay in cache.
void ConvertMatrix(const void *source, ElementType source_type, int64_t rows,
                   int64_t cols, bool transpose, void *destination,
                   DType destination_dtype) {
  if (!transpose) {
    for (int64_t i = 0; i < rows * cols; ++i) {
      StoreFromFloat(destination, destination_dtype, i,
                     LoadElement(source, source_type, i));
    }
    return;
  }
  constexpr int64_t kTile = 64;
  for (int64_t row_tile = 0; row_tile < rows; row_tile += kTile) {
    for (int64_t col_tile = 0; col_tile < cols; col_tile += kTile) {
      const int64_t row_end = std::min(rows, row_tile + kTile);
      const int64_t col_end = std::min(cols, col_tile + kTile);
      for (int64_t r = row_tile; r < row_end; ++r) {
        for (int64_t c = col_tile; c < col_end; ++c) {
          StoreFromFloat(destination, destination_dtype, c * rows + r,
                         LoadElement(source, source_type, r * cols + c));
        }
      }
    }
  }
}

// (rows, cols) of a shape seen as a matrix: a vector is one row.
std::pair<int64_t, int64_t> AsMatrix(const Shape &shape) {
  if (shape.size() == 2) return {shape[0], shape[1]};
  return {1, NumElements(shape)};
}

// Joins at most `limit` items, then "... and N more", so a wrong file does
// not produce a 300-line message.
std::string JoinSome(const std::vector<std::string> &items, size_t limit = 12) {
  if (items.size() <= limit) return absl::StrJoin(items, ", ");
  std::vector<std::string> head(items.begin(), items.begin() + limit);
  return absl::StrCat(absl::StrJoin(head, ", "), ", ... and ",
                      items.size() - limit, " more");
}

absl::StatusOr<Gpt2Dims> InferDims(const Reader &reader) {
  const TensorInfo *wte = FindEither(reader, "wte.weight");
  const TensorInfo *wpe = FindEither(reader, "wpe.weight");
  if (wte == nullptr || wpe == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        reader.path(), ": not a Hugging Face GPT-2 checkpoint: no ",
        wte == nullptr ? "wte.weight" : "wpe.weight",
        " (with or without the \"transformer.\" prefix)"));
  }
  if (wte->shape.size() != 2 || wpe->shape.size() != 2 ||
      wte->shape[1] != wpe->shape[1]) {
    return absl::InvalidArgumentError(
        absl::StrCat(reader.path(), ": wte.weight ", ShapeToString(wte->shape),
                     " and wpe.weight ", ShapeToString(wpe->shape),
                     " are not (V, C) and (P, C) with one C"));
  }
  Gpt2Dims dims;
  dims.vocab_size = wte->shape[0];
  dims.channels = wte->shape[1];
  dims.max_positions = wpe->shape[0];
  for (const TensorInfo &info : reader.tensors()) {
    int index = 0;
    absl::string_view rest;
    if (SplitIndexedName(StripModelPrefix(info.name), kHfBlockPrefix, &index,
                         &rest)) {
      dims.num_layers = std::max(dims.num_layers, index + 1);
    }
  }
  return dims;
}

// Where each of our parameters comes from in the file.
struct Source {
  std::string our_name;
  Shape our_shape;
  bool transpose = false;
  const TensorInfo *info = nullptr;
};

}  // namespace

std::optional<Gpt2NameMapping> MapHuggingFaceGpt2Name(
    absl::string_view hf_name) {
  return MapName(StripModelPrefix(hf_name), /*from_hf=*/true);
}

bool IsIgnoredHuggingFaceGpt2Name(absl::string_view hf_name) {
  if (hf_name == kHfLmHead) return true;
  int index = 0;
  absl::string_view rest;
  if (!SplitIndexedName(StripModelPrefix(hf_name), kHfBlockPrefix, &index,
                        &rest)) {
    return false;
  }
  for (const char *suffix : kHfIgnoredBlockSuffixes) {
    if (rest == suffix) return true;
  }
  return false;
}

std::optional<Gpt2NameMapping> MapToHuggingFaceGpt2Name(
    absl::string_view our_name) {
  return MapName(our_name, /*from_hf=*/false);
}

std::vector<std::pair<std::string, Shape>> Gpt2ParameterShapes(
    const Gpt2Dims &dims) {
  std::vector<std::pair<std::string, Shape>> shapes;
  for (const ParamEntry &entry : kEmbeddingParams) {
    shapes.emplace_back(entry.our_suffix, OurShape(entry.shape, dims));
  }
  for (int layer = 0; layer < dims.num_layers; ++layer) {
    for (const ParamEntry &entry : kBlockParams) {
      shapes.emplace_back(
          absl::StrCat(kOurBlockPrefix, layer, ".", entry.our_suffix),
          OurShape(entry.shape, dims));
    }
  }
  for (const ParamEntry &entry : kFinalParams) {
    shapes.emplace_back(entry.our_suffix, OurShape(entry.shape, dims));
  }
  return shapes;
}

absl::StatusOr<Gpt2Dims> InferHuggingFaceGpt2Dims(const std::string &path) {
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<Reader> reader, Reader::Open(path));
  return InferDims(*reader);
}

absl::Status LoadHuggingFaceGpt2(const std::string &path,
                                 const Gpt2TensorVisitor &visitor,
                                 const Gpt2LoadOptions &options) {
  if (!IsFloatingPoint(options.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("loading ", path, ": requested dtype ",
                     DTypeName(options.dtype), " is not f32, bf16 or f16"));
  }
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<Reader> reader, Reader::Open(path));
  ZE_ASSIGN_OR_RETURN(const Gpt2Dims file_dims, InferDims(*reader));
  Gpt2Dims dims = options.expected.value_or(file_dims);

  std::vector<std::string> problems;
  if (dims.num_layers != file_dims.num_layers ||
      dims.channels != file_dims.channels ||
      dims.max_positions != file_dims.max_positions ||
      dims.vocab_size < file_dims.vocab_size) {
    problems.push_back(absl::StrCat(
        "the file has ", file_dims.num_layers,
        " layers, C=", file_dims.channels, ", ", file_dims.max_positions,
        " positions, vocabulary ", file_dims.vocab_size, "; the model has ",
        dims.num_layers, ", C=", dims.channels, ", ", dims.max_positions, ", ",
        dims.vocab_size, " (the model's vocabulary may only be larger)"));
  }

  // Every file tensor must map to one of our parameters or be ignorable.
  std::map<std::string, const TensorInfo *> by_our_name;
  std::vector<std::string> unexpected;
  const TensorInfo *lm_head = nullptr;
  for (const TensorInfo &info : reader->tensors()) {
    if (info.name == kHfLmHead) lm_head = &info;
    if (IsIgnoredHuggingFaceGpt2Name(info.name)) continue;
    std::optional<Gpt2NameMapping> mapping = MapHuggingFaceGpt2Name(info.name);
    if (!mapping.has_value()) {
      unexpected.push_back(absl::StrCat("\"", info.name, "\""));
      continue;
    }
    if (!by_our_name.emplace(mapping->name, &info).second) {
      unexpected.push_back(absl::StrCat(
          "\"", info.name, "\" (a second source for ", mapping->name, ")"));
    }
  }

  std::vector<Source> sources;
  std::vector<std::string> missing;
  std::vector<std::string> mismatched;
  for (auto &[our_name, our_shape] : Gpt2ParameterShapes(dims)) {
    auto found = by_our_name.find(our_name);
    if (found == by_our_name.end()) {
      missing.push_back(absl::StrCat(
          our_name, " (", MapToHuggingFaceGpt2Name(our_name)->name, ")"));
      continue;
    }
    const TensorInfo *info = found->second;
    by_our_name.erase(found);
    const bool transpose = MapToHuggingFaceGpt2Name(our_name)->transpose;
    Shape expected_file_shape = transpose ? Transposed(our_shape) : our_shape;
    if (our_name == kOurTokenTable)
      expected_file_shape[0] = file_dims.vocab_size;
    if (info->shape != expected_file_shape) {
      mismatched.push_back(
          absl::StrCat("\"", info->name, "\" is ", ShapeToString(info->shape),
                       ", expected ", ShapeToString(expected_file_shape),
                       transpose ? " (HF Conv1D layout: (in, out))" : ""));
    }
    if (!IsLoadableElementType(info->dtype)) {
      mismatched.push_back(
          absl::StrCat("\"", info->name, "\" has dtype ",
                       safetensors::ElementTypeName(info->dtype),
                       " (expected F32, BF16, F16 or F64)"));
    }
    sources.push_back({our_name, our_shape, transpose, info});
  }
  // Left over: block tensors beyond the model's layers.
  for (const auto &[our_name, info] : by_our_name) {
    unexpected.push_back(absl::StrCat("\"", info->name, "\" (", our_name,
                                      " is not a parameter of the model)"));
  }
  if (lm_head != nullptr) {
    const Shape wte_shape = {file_dims.vocab_size, file_dims.channels};
    if (lm_head->shape != wte_shape) {
      mismatched.push_back(
          absl::StrCat("\"", kHfLmHead, "\" is ", ShapeToString(lm_head->shape),
                       " but must equal wte.weight's ",
                       ShapeToString(wte_shape), " (the head is tied to it)"));
    }
  }
  if (!unexpected.empty()) {
    problems.push_back(absl::StrCat(
        unexpected.size(), " unexpected tensors: ", JoinSome(unexpected)));
  }
  if (!missing.empty()) {
    problems.push_back(absl::StrCat(
        missing.size(), " missing parameters: ", JoinSome(missing)));
  }
  if (!mismatched.empty()) {
    problems.push_back(absl::StrCat(
        mismatched.size(), " shape/dtype mismatches: ", JoinSome(mismatched)));
  }
  if (!problems.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot load as Hugging Face GPT-2: ",
                     absl::StrJoin(problems, "; ")));
  }

  // Everything checks out: now read, one parameter at a time.
  std::vector<char> raw;
  for (const Source &source : sources) {
    const TensorInfo &info = *source.info;
    raw.resize(info.num_bytes());
    ZE_RETURN_IF_ERROR(
        reader->ReadBytes(info.name, 0, info.num_bytes(), raw.data()));
    ZE_ASSIGN_OR_RETURN(
        Tensor value,
        Tensor::Zeros(source.our_shape, options.dtype, Device::Cpu()));
    // wte may have fewer rows than ours (padded vocabulary): the file's rows
    // fill the start and the padding stays zero.
    const auto [rows, cols] = AsMatrix(info.shape);
    ConvertMatrix(raw.data(), info.dtype, rows, cols, source.transpose,
                  value.data(), options.dtype);
    ZE_RETURN_IF_ERROR(
        Annotate(visitor(source.our_name, value),
                 absl::StrCat(path, ": loading ", source.our_name, " from ",
                              info.name)));
  }
  return absl::OkStatus();
}

absl::Status ExportHuggingFaceGpt2(const std::string &path,
                                   const Gpt2Dims &dims,
                                   const Gpt2TensorSource &source,
                                   const Gpt2ExportOptions &options) {
  const int64_t vocab_rows =
      options.vocab_size == 0 ? dims.vocab_size : options.vocab_size;
  if (dims.num_layers <= 0 || dims.channels <= 0 || dims.vocab_size <= 0 ||
      dims.max_positions <= 0 || vocab_rows <= 0 ||
      vocab_rows > dims.vocab_size || !IsFloatingPoint(options.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "exporting ", path, ": invalid dims (", dims.num_layers, " layers, C=",
        dims.channels, ", V=", dims.vocab_size, ", P=", dims.max_positions,
        "), vocab_size ", vocab_rows, " or dtype ", DTypeName(options.dtype)));
  }
  const std::vector<std::pair<std::string, Shape>> parameters =
      Gpt2ParameterShapes(dims);
  std::vector<safetensors::TensorSpec> specs;
  std::vector<bool> transposes;
  for (const auto &[our_name, our_shape] : parameters) {
    const Gpt2NameMapping hf = *MapToHuggingFaceGpt2Name(our_name);
    Shape file_shape = hf.transpose ? Transposed(our_shape) : our_shape;
    if (our_name == kOurTokenTable) file_shape[0] = vocab_rows;
    specs.push_back({absl::StrCat(options.prefix, hf.name),
                     safetensors::ElementTypeOf(options.dtype), file_shape});
    transposes.push_back(hf.transpose);
  }
  safetensors::Metadata metadata = options.metadata;
  metadata["format"] = "pt";
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<safetensors::Writer> writer,
                      safetensors::Writer::Create(path, specs, metadata));

  for (size_t i = 0; i < parameters.size(); ++i) {
    const auto &[our_name, our_shape] = parameters[i];
    const std::string context =
        absl::StrCat("exporting ", path, ": parameter ", our_name);
    absl::StatusOr<Tensor> value = source(our_name);
    if (!value.ok()) return Annotate(value.status(), context);
    if (!value->defined() || !value->device().is_cpu() ||
        !IsFloatingPoint(value->dtype()) || value->shape() != our_shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          context, ": the source gave ",
          value->defined() ? value->DebugString() : "an undefined tensor",
          ", expected a CPU f32/bf16/f16 tensor of shape ",
          ShapeToString(our_shape)));
    }
    // wte's padding rows (beyond vocab_rows) are the tail of the row-major
    // data, so converting just the leading rows drops them.
    const Shape &file_shape = specs[i].shape;
    ZE_ASSIGN_OR_RETURN(
        Tensor converted,
        Tensor::Empty(file_shape, options.dtype, Device::Cpu()));
    const auto [rows, cols] =
        transposes[i] ? AsMatrix(our_shape) : AsMatrix(file_shape);
    ConvertMatrix(value->data(), safetensors::ElementTypeOf(value->dtype()),
                  rows, cols, transposes[i], converted.data(), options.dtype);
    ZE_RETURN_IF_ERROR(
        Annotate(writer->Append(specs[i].name, converted), context));
  }
  return writer->Finish();
}

absl::StatusOr<Gpt2Dims> ConvertHuggingFaceGpt2File(const std::string &hf_path,
                                                    const std::string &out_path,
                                                    DType dtype,
                                                    int64_t vocab_size) {
  ZE_ASSIGN_OR_RETURN(Gpt2Dims dims, InferHuggingFaceGpt2Dims(hf_path));
  const int64_t vocabulary = dims.vocab_size;
  if (vocab_size > 0) {
    if (vocab_size < dims.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("--vocab_size=", vocab_size, " is below ", hf_path,
                       "'s vocabulary of ", dims.vocab_size));
    }
    dims.vocab_size = vocab_size;
  }
  // The header is fixed from the dims, then each parameter is appended as
  // the loader hands it over.
  std::vector<safetensors::TensorSpec> specs;
  for (const auto &[name, shape] : Gpt2ParameterShapes(dims)) {
    specs.push_back({name, safetensors::ElementTypeOf(dtype), shape});
  }
  ZE_ASSIGN_OR_RETURN(
      std::unique_ptr<safetensors::Writer> writer,
      safetensors::Writer::Create(
          out_path, std::move(specs),
          {{"format", "pt"},
           {"source", hf_path},
           {kVocabularyMetadataKey, absl::StrCat(vocabulary)}}));
  Gpt2LoadOptions options;
  options.dtype = dtype;
  options.expected = dims;
  ZE_RETURN_IF_ERROR(LoadHuggingFaceGpt2(
      hf_path,
      [&](const std::string &name, const Tensor &value) {
        return writer->Append(name, value);
      },
      options));
  ZE_RETURN_IF_ERROR(writer->Finish());
  return dims;
}

}  // namespace nn
}  // namespace ze
