#include "nn/pretrained/hf_decoder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "core/atomic_file.h"
#include "core/dtype.h"
#include "core/safetensors/reader.h"
#include "core/safetensors/writer.h"
#include "core/status.h"
#include "nlohmann/json.hpp"
#include "nn/pretrained/hf_names.h"

namespace ze {
namespace nn {
namespace {

using safetensors::ElementType;
using safetensors::Reader;
using safetensors::TensorInfo;

struct NameEntry {
  const char *hf;
  const char *ours;
};

// THE name table, for all four families. Our names are nn's decoder's
// (nn/decoder_config.h); whether a model has a given parameter (biases:
// Qwen2; q/k norms: Qwen3; lm_head: untied) is DecoderConfig's to say.
constexpr NameEntry kModelNames[] = {
    {"model.embed_tokens.weight", "embed_tokens.weight"},
    {"model.norm.weight", "norm.weight"},
    {"lm_head.weight", "lm_head.weight"},
};
// Inside "model.layers.N." / "layers.N.".
constexpr NameEntry kLayerNames[] = {
    {"input_layernorm.weight", "input_norm.weight"},
    {"self_attn.q_proj.weight", "attn.q_proj.weight"},
    {"self_attn.q_proj.bias", "attn.q_proj.bias"},
    {"self_attn.k_proj.weight", "attn.k_proj.weight"},
    {"self_attn.k_proj.bias", "attn.k_proj.bias"},
    {"self_attn.v_proj.weight", "attn.v_proj.weight"},
    {"self_attn.v_proj.bias", "attn.v_proj.bias"},
    {"self_attn.q_norm.weight", "attn.q_norm.weight"},
    {"self_attn.k_norm.weight", "attn.k_norm.weight"},
    {"self_attn.o_proj.weight", "attn.o_proj.weight"},
    {"post_attention_layernorm.weight", "post_attn_norm.weight"},
    {"mlp.gate_proj.weight", "mlp.gate_proj.weight"},
    {"mlp.up_proj.weight", "mlp.up_proj.weight"},
    {"mlp.down_proj.weight", "mlp.down_proj.weight"},
};
constexpr char kHfLayerPrefix[] = "model.layers.";
constexpr char kOurLayerPrefix[] = "layers.";
// Per-layer buffers of older files, recomputed from the config.
constexpr char kHfIgnoredLayerSuffix[] = "self_attn.rotary_emb.inv_freq";
constexpr char kHfEmbedding[] = "model.embed_tokens.weight";
constexpr char kHfHead[] = "lm_head.weight";

// At most this many source bytes are converted at a time (ranged reads into
// another dtype, the tied-head comparison).
constexpr uint64_t kChunkBytes = 4 << 20;

std::optional<std::string> MapName(absl::string_view name, bool from_hf) {
  auto side = [from_hf](const NameEntry &entry) {
    return from_hf ? entry.hf : entry.ours;
  };
  auto other = [from_hf](const NameEntry &entry) {
    return from_hf ? entry.ours : entry.hf;
  };
  int index = 0;
  absl::string_view rest;
  if (SplitIndexedName(name, from_hf ? kHfLayerPrefix : kOurLayerPrefix, &index,
                       &rest)) {
    for (const NameEntry &entry : kLayerNames) {
      if (rest == side(entry)) {
        return absl::StrCat(from_hf ? kOurLayerPrefix : kHfLayerPrefix, index,
                            ".", other(entry));
      }
    }
    return std::nullopt;
  }
  for (const NameEntry &entry : kModelNames) {
    if (name == side(entry)) return std::string(other(entry));
  }
  return std::nullopt;
}

bool IsLoadableElementType(ElementType type) {
  return type == ElementType::kF32 || type == ElementType::kBF16 ||
         type == ElementType::kF16;
}

std::string Quoted(absl::string_view text) {
  return absl::StrCat("\"", text, "\"");
}

absl::StatusOr<std::string> ReadTextFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    return ErrnoToStatus(error == 0 ? ENOENT : error, "open", path);
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return ErrnoToStatus(errno, "read", path);
  return text.str();
}

std::string JoinPath(const std::string &directory, absl::string_view file) {
  return (std::filesystem::path(directory) / std::string(file)).string();
}

// "model-00002-of-00005.safetensors", as save_pretrained names shards.
std::string ShardName(size_t index, size_t count) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", index + 1, count);
}

bool IsShardName(absl::string_view name) {
  // model-NNNNN-of-NNNNN.safetensors
  if (!absl::ConsumePrefix(&name, "model-") ||
      !absl::ConsumeSuffix(&name, ".safetensors") || name.size() != 14 ||
      name.substr(5, 4) != "-of-") {
    return false;
  }
  for (size_t i : {0, 1, 2, 3, 4, 9, 10, 11, 12, 13}) {
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return false;
  }
  return true;
}

// The shard files and key -> shard of an index file.
struct Index {
  std::vector<std::string> files;                 // sorted, unique
  std::map<std::string, std::string> weight_map;  // key -> file
};

absl::StatusOr<Index> ReadIndex(const std::string &path) {
  ZE_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path));
  nlohmann::json json = nlohmann::json::parse(text, nullptr,
                                              /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a JSON object"));
  }
  auto map = json.find("weight_map");
  if (map == json.end() || !map->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": no \"weight_map\" object"));
  }
  Index index;
  std::set<std::string> files;
  for (auto it = map->begin(); it != map->end(); ++it) {
    if (!it.value().is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": weight_map[", Quoted(it.key()), "] is not a file name"));
    }
    const std::string file = it.value().get<std::string>();
    if (file.empty() || absl::StrContains(file, "/") || file == "." ||
        file == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": weight_map[", Quoted(it.key()), "] is ",
                       Quoted(file), ", not a file of the directory"));
    }
    index.weight_map[it.key()] = file;
    files.insert(file);
  }
  index.files.assign(files.begin(), files.end());
  return index;
}

// Joins problems, at most `limit` of them, then how many more.
std::string JoinProblems(const std::vector<std::string> &problems,
                         size_t limit = 40) {
  std::vector<std::string> head(
      problems.begin(), problems.begin() + std::min(limit, problems.size()));
  std::string joined = absl::StrJoin(head, "; ");
  if (problems.size() > limit) {
    absl::StrAppend(&joined, "; ... and ", problems.size() - limit, " more");
  }
  return joined;
}

std::string DescribeConfig(const DecoderConfig &config) {
  return absl::StrCat(DecoderFamilyName(config.family), ", ", config.num_layers,
                      " layers, hidden ", config.hidden_size, ", ",
                      config.num_heads, "/", config.num_kv_heads, " heads of ",
                      config.head_dim, ", FFN ", config.intermediate_size,
                      ", vocabulary ", config.vocab_size,
                      config.tie_word_embeddings ? ", tied" : ", untied");
}

}  // namespace

// ---------------------------------------------------------------------------
// The name table.

std::optional<std::string> MapHuggingFaceDecoderName(
    absl::string_view hf_name) {
  return MapName(hf_name, /*from_hf=*/true);
}

std::optional<std::string> MapToHuggingFaceDecoderName(
    absl::string_view our_name) {
  return MapName(our_name, /*from_hf=*/false);
}

bool IsIgnoredHuggingFaceDecoderName(absl::string_view hf_name) {
  int index = 0;
  absl::string_view rest;
  return SplitIndexedName(hf_name, kHfLayerPrefix, &index, &rest) &&
         rest == kHfIgnoredLayerSuffix;
}

// ---------------------------------------------------------------------------
// Reading.

absl::StatusOr<DecoderConfig> ReadHuggingFaceDecoderConfig(
    const std::string &directory) {
  const std::string path = JoinPath(directory, kHfConfigFile);
  ZE_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path));
  return DecoderConfig::FromHuggingFaceJson(text, path);
}

HuggingFaceDecoderReader::~HuggingFaceDecoderReader() = default;

absl::StatusOr<std::unique_ptr<HuggingFaceDecoderReader>>
HuggingFaceDecoderReader::Open(const std::string &directory,
                               const DecoderLoadOptions &options) {
  if (!IsFloatingPoint(options.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("loading ", directory, ": requested dtype ",
                     DTypeName(options.dtype), " is not f32, bf16 or f16"));
  }
  std::unique_ptr<HuggingFaceDecoderReader> reader(
      new HuggingFaceDecoderReader());
  reader->directory_ = directory;
  ZE_ASSIGN_OR_RETURN(reader->config_, ReadHuggingFaceDecoderConfig(directory));
  const DecoderConfig &config = reader->config_;
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes =
      config.ParameterShapes();

  std::vector<std::string> problems;
  if (options.expected.has_value() &&
      (options.expected->family != config.family ||
       options.expected->ParameterShapes() != shapes)) {
    problems.push_back(absl::StrCat(JoinPath(directory, kHfConfigFile),
                                    " describes ", DescribeConfig(config),
                                    "; the model is ",
                                    DescribeConfig(*options.expected)));
  }

  // The files: one model.safetensors (preferred, as from_pretrained does),
  // else the index's shards.
  const std::string single = JoinPath(directory, kHfWeightsFile);
  const std::string index_path = JoinPath(directory, kHfIndexFile);
  std::optional<Index> index;
  std::vector<std::string> files;
  std::error_code error;
  if (std::filesystem::exists(single, error)) {
    files.push_back(kHfWeightsFile);
  } else if (std::filesystem::exists(index_path, error)) {
    ZE_ASSIGN_OR_RETURN(index, ReadIndex(index_path));
    files = index->files;
  } else {
    return absl::NotFoundError(absl::StrCat(
        directory, ": no ", kHfWeightsFile, " and no ", kHfIndexFile,
        ": not a Hugging Face model directory with safetensors weights"));
  }

  // Every tensor of every file, by key.
  std::map<std::string, std::pair<std::string, const TensorInfo *>> tensors;
  for (const std::string &file : files) {
    const std::string path = JoinPath(directory, file);
    absl::StatusOr<std::unique_ptr<Reader>> opened = Reader::Open(path);
    if (!opened.ok()) {
      if (index.has_value() &&
          opened.status().code() == absl::StatusCode::kNotFound) {
        std::vector<std::string> keys;
        for (const auto &[key, shard] : index->weight_map) {
          if (shard == file) keys.push_back(key);
        }
        problems.push_back(absl::StrCat(index_path, " places ", keys.size(),
                                        " tensors (", Quoted(keys.front()),
                                        keys.size() > 1 ? ", ..." : "", ") in ",
                                        path, ", which does not exist"));
      } else {
        problems.push_back(std::string(opened.status().message()));
      }
      continue;
    }
    const Reader &shard = **opened;
    for (const TensorInfo &info : shard.tensors()) {
      if (index.has_value()) {
        auto listed = index->weight_map.find(info.name);
        if (listed == index->weight_map.end()) {
          problems.push_back(absl::StrCat(path, ": ", Quoted(info.name),
                                          " is not listed in ", index_path));
          continue;
        }
        if (listed->second != file) {
          problems.push_back(absl::StrCat(path, ": ", Quoted(info.name),
                                          " is also here, but ", index_path,
                                          " places it in ", listed->second));
          continue;
        }
      }
      auto [it, inserted] =
          tensors.emplace(info.name, std::make_pair(path, &info));
      if (!inserted) {
        problems.push_back(absl::StrCat(path, ": ", Quoted(info.name),
                                        " is in ", it->second.first, " too"));
      }
    }
    reader->files_.emplace(path, std::move(opened).value());
  }
  if (index.has_value()) {
    for (const auto &[key, file] : index->weight_map) {
      const std::string path = JoinPath(directory, file);
      if (reader->files_.count(path) != 0 && tensors.count(key) == 0) {
        problems.push_back(absl::StrCat(index_path, " places ", Quoted(key),
                                        " in ", path, ", which lacks it"));
      }
    }
  }

  // Map the keys to our names.
  std::map<std::string, std::string> key_of;  // our name -> key
  std::set<std::string> ours;
  for (const auto &[name, shape] : shapes) ours.insert(name);
  const bool tied_head_in_file =
      config.tie_word_embeddings && tensors.count(kHfHead) != 0;
  for (const auto &[key, where] : tensors) {
    if (IsIgnoredHuggingFaceDecoderName(key)) continue;
    if (key == kHfHead && tied_head_in_file) continue;  // checked below
    const std::optional<std::string> our_name = MapHuggingFaceDecoderName(key);
    if (!our_name.has_value()) {
      problems.push_back(absl::StrCat(
          where.first, ": unexpected tensor ", Quoted(key),
          " (no Llama/Mistral/Qwen2/Qwen3 decoder parameter has this name)"));
    } else if (ours.count(*our_name) == 0) {
      problems.push_back(absl::StrCat(
          where.first, ": unexpected tensor ", Quoted(key), " (", *our_name,
          " is not a parameter of the model config.json describes: ",
          DescribeConfig(config), ")"));
    } else {
      key_of[*our_name] = key;
    }
  }
  for (const auto &[our_name, shape] : shapes) {
    auto found = key_of.find(our_name);
    const std::string hf_name = *MapToHuggingFaceDecoderName(our_name);
    if (found == key_of.end()) {
      problems.push_back(absl::StrCat("missing ", Quoted(hf_name), " (",
                                      our_name, ", ", ShapeToString(shape), ")",
                                      index.has_value()
                                          ? absl::StrCat(" in ", index_path)
                                          : absl::StrCat(" in ", single)));
      continue;
    }
    const auto &[path, info] = tensors.at(found->second);
    bool ok = true;
    if (info->shape != shape) {
      problems.push_back(absl::StrCat(
          path, ": ", Quoted(info->name), " is ", ShapeToString(info->shape),
          ", expected ", ShapeToString(shape), " (", our_name, ")"));
      ok = false;
    }
    if (!IsLoadableElementType(info->dtype)) {
      problems.push_back(absl::StrCat(path, ": ", Quoted(info->name),
                                      " has dtype ",
                                      safetensors::ElementTypeName(info->dtype),
                                      " (F32, BF16 or F16 are read)"));
      ok = false;
    }
    if (ok) {
      reader->index_.emplace(our_name, reader->sources_.size());
      reader->sources_.push_back(Source{our_name, shape, path, info->name,
                                        info->dtype, info->num_bytes()});
    }
  }

  // A tied model's file may carry the head too (some exporters write both);
  // accepted when it is the embedding's copy, since it is then ignored.
  if (tied_head_in_file) {
    const auto &[head_path, head] = tensors.at(kHfHead);
    auto embedding = tensors.find(kHfEmbedding);
    if (embedding != tensors.end()) {
      const auto &[embedding_path, table] = embedding->second;
      if (head->shape != table->shape) {
        problems.push_back(absl::StrCat(
            head_path, ": ", Quoted(kHfHead), " is ",
            ShapeToString(head->shape), " but config.json ties it to ",
            Quoted(kHfEmbedding), ", which is ", ShapeToString(table->shape)));
      } else if (IsLoadableElementType(head->dtype) &&
                 IsLoadableElementType(table->dtype)) {
        // Compared as f32, a chunk at a time.
        const DType head_dtype = safetensors::DTypeOf(head->dtype).value();
        const DType table_dtype = safetensors::DTypeOf(table->dtype).value();
        const int64_t count = head->num_elements();
        const int64_t chunk = kChunkBytes / sizeof(float);
        std::vector<char> a(chunk * SizeOf(head_dtype));
        std::vector<char> b(chunk * SizeOf(table_dtype));
        const Reader &head_file = *reader->files_.at(head_path);
        const Reader &table_file = *reader->files_.at(embedding_path);
        int64_t differs = -1;
        for (int64_t begin = 0; begin < count && differs < 0; begin += chunk) {
          const int64_t n = std::min(chunk, count - begin);
          ZE_RETURN_IF_ERROR(
              head_file.ReadBytes(kHfHead, begin * SizeOf(head_dtype),
                                  n * SizeOf(head_dtype), a.data()));
          ZE_RETURN_IF_ERROR(
              table_file.ReadBytes(kHfEmbedding, begin * SizeOf(table_dtype),
                                   n * SizeOf(table_dtype), b.data()));
          for (int64_t i = 0; i < n; ++i) {
            if (FloatBits(LoadAsFloat(a.data(), head_dtype, i)) !=
                FloatBits(LoadAsFloat(b.data(), table_dtype, i))) {
              differs = begin + i;
              break;
            }
          }
        }
        if (differs >= 0) {
          problems.push_back(absl::StrCat(
              head_path, ": ", Quoted(kHfHead), " differs from ",
              Quoted(kHfEmbedding), " (first at element ", differs,
              ") but config.json ties them (tie_word_embeddings: true), so "
              "the file's head would be ignored"));
        }
      }
    }
  }

  if (!problems.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(directory, ": cannot load as a Hugging Face ",
                     DecoderFamilyName(config.family), " model (",
                     problems.size(), " problems): ", JoinProblems(problems)));
  }
  return reader;
}

const HuggingFaceDecoderReader::Source *HuggingFaceDecoderReader::Find(
    absl::string_view our_name) const {
  auto found = index_.find(our_name);
  return found == index_.end() ? nullptr : &sources_[found->second];
}

uint64_t HuggingFaceDecoderReader::parameter_bytes() const {
  uint64_t bytes = 0;
  for (const Source &source : sources_) bytes += source.num_bytes;
  return bytes;
}

absl::StatusOr<Tensor> HuggingFaceDecoderReader::Read(
    absl::string_view our_name, DType dtype) const {
  const Source *source = Find(our_name);
  if (source == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        directory_, ": the model has no parameter ", Quoted(our_name)));
  }
  ZE_ASSIGN_OR_RETURN(Tensor value,
                      Tensor::Empty(source->shape, dtype, Device::Cpu()));
  ZE_RETURN_IF_ERROR(ReadRange(our_name, 0, value));
  return value;
}

absl::Status HuggingFaceDecoderReader::ReadRange(
    absl::string_view our_name, int64_t element_begin,
    const Tensor &destination) const {
  const Source *source = Find(our_name);
  if (source == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        directory_, ": the model has no parameter ", Quoted(our_name)));
  }
  if (!destination.defined() || !destination.device().is_cpu() ||
      !IsFloatingPoint(destination.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reading ", our_name, " from ", source->file, ": the destination ",
        destination.defined() ? destination.DebugString() : "is undefined",
        " is not a CPU f32/bf16/f16 tensor"));
  }
  const int64_t count = destination.numel();
  const int64_t total = NumElements(source->shape);
  if (element_begin < 0 || element_begin > total ||
      count > total - element_begin) {
    return absl::OutOfRangeError(
        absl::StrCat("reading ", our_name, " from ", source->file,
                     ": elements [", element_begin, ", ", element_begin + count,
                     ") are not inside ", Quoted(source->key), "'s ", total));
  }
  const Reader &file = *files_.at(source->file);
  const DType file_dtype = safetensors::DTypeOf(source->dtype).value();
  const size_t size = SizeOf(file_dtype);
  if (file_dtype == destination.dtype()) {
    return file.ReadBytes(source->key, element_begin * size, count * size,
                          destination.data());
  }
  const int64_t chunk = kChunkBytes / size;
  std::vector<char> buffer(std::min(count, chunk) * size);
  char *out = static_cast<char *>(destination.data());
  const size_t out_size = SizeOf(destination.dtype());
  for (int64_t done = 0; done < count; done += chunk) {
    const int64_t n = std::min(chunk, count - done);
    ZE_RETURN_IF_ERROR(file.ReadBytes(
        source->key, (element_begin + done) * size, n * size, buffer.data()));
    ConvertElements(buffer.data(), file_dtype, out + done * out_size,
                    destination.dtype(), n);
  }
  return absl::OkStatus();
}

absl::Status HuggingFaceDecoderReader::ForEach(
    const DecoderTensorVisitor &visitor, DType dtype) const {
  for (const Source &source : sources_) {
    const std::string context =
        absl::StrCat(directory_, ": loading ", source.our_name, " from ",
                     source.file, ": ", Quoted(source.key));
    absl::StatusOr<Tensor> value = Read(source.our_name, dtype);
    if (!value.ok()) return Annotate(value.status(), context);
    ZE_RETURN_IF_ERROR(Annotate(visitor(source.our_name, *value), context));
  }
  return absl::OkStatus();
}

absl::StatusOr<DecoderConfig> LoadHuggingFaceDecoder(
    const std::string &directory, const DecoderTensorVisitor &visitor,
    const DecoderLoadOptions &options) {
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<HuggingFaceDecoderReader> reader,
                      HuggingFaceDecoderReader::Open(directory, options));
  ZE_RETURN_IF_ERROR(reader->ForEach(visitor, options.dtype));
  return reader->config();
}

// ---------------------------------------------------------------------------
// Writing.

HuggingFaceDecoderWriter::~HuggingFaceDecoderWriter() = default;

absl::StatusOr<std::unique_ptr<HuggingFaceDecoderWriter>>
HuggingFaceDecoderWriter::Create(const std::string &directory,
                                 const DecoderConfig &config,
                                 const DecoderExportOptions &options) {
  if (!IsFloatingPoint(options.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("exporting ", directory, ": dtype ",
                     DTypeName(options.dtype), " is not f32, bf16 or f16"));
  }
  ZE_RETURN_IF_ERROR(
      Annotate(config.Validate(), absl::StrCat("exporting ", directory)));
  if (::mkdir(directory.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, "create the directory", directory);
  }
  std::error_code error;
  if (!std::filesystem::is_directory(directory, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("exporting ", directory, ": not a directory"));
  }

  std::unique_ptr<HuggingFaceDecoderWriter> writer(
      new HuggingFaceDecoderWriter());
  writer->directory_ = directory;
  writer->config_ = config;
  writer->options_ = options;
  for (const auto &[name, shape] : config.ParameterShapes()) {
    const std::optional<std::string> hf_name =
        MapToHuggingFaceDecoderName(name);
    if (!hf_name.has_value()) {
      return absl::InternalError(absl::StrCat(
          "exporting ", directory, ": parameter ", name,
          " has no Hugging Face name (nn/pretrained/hf_decoder.cc's table "
          "lags nn/decoder_config.h)"));
    }
    writer->parameters_.emplace_back(name, shape);
    writer->hf_names_.push_back(*hf_name);
  }

  // Shards: parameters in order, a new shard whenever the next parameter
  // would take the current one past the limit.
  const size_t element_size = SizeOf(options.dtype);
  for (size_t i = 0; i < writer->parameters_.size(); ++i) {
    const uint64_t bytes =
        NumElements(writer->parameters_[i].second) * element_size;
    if (writer->shards_.empty() ||
        (options.max_shard_bytes > 0 &&
         !writer->shards_.back().parameters.empty() &&
         writer->shards_.back().bytes + bytes > options.max_shard_bytes)) {
      writer->shards_.emplace_back();
    }
    writer->shards_.back().parameters.push_back(i);
    writer->shards_.back().bytes += bytes;
    writer->shard_of_.push_back(writer->shards_.size() - 1);
  }
  // One shard is written as model.safetensors with no index, as
  // save_pretrained does.
  for (size_t s = 0; s < writer->shards_.size(); ++s) {
    writer->shards_[s].file = writer->shards_.size() == 1
                                  ? std::string(kHfWeightsFile)
                                  : ShardName(s, writer->shards_.size());
  }
  ZE_RETURN_IF_ERROR(writer->OpenShard(0));
  return writer;
}

std::vector<std::string> HuggingFaceDecoderWriter::files() const {
  std::vector<std::string> names;
  for (const Shard &shard : shards_) names.push_back(shard.file);
  return names;
}

absl::Status HuggingFaceDecoderWriter::OpenShard(size_t shard) {
  std::vector<safetensors::TensorSpec> specs;
  for (size_t i : shards_[shard].parameters) {
    specs.push_back({hf_names_[i], safetensors::ElementTypeOf(options_.dtype),
                     parameters_[i].second});
  }
  safetensors::Metadata metadata = options_.metadata;
  metadata["format"] = "pt";
  ZE_ASSIGN_OR_RETURN(
      writer_, safetensors::Writer::Create(
                   JoinPath(directory_, shards_[shard].file), specs, metadata));
  open_shard_ = shard;
  return absl::OkStatus();
}

absl::Status HuggingFaceDecoderWriter::Fail(absl::Status status) {
  failure_ = status;
  writer_.reset();  // removes the unfinished shard's temporary file
  return status;
}

absl::Status HuggingFaceDecoderWriter::Append(absl::string_view our_name,
                                              const Tensor &values) {
  if (!failure_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("exporting ", directory_, ": appending ", our_name,
                     " after a failure: ", failure_.message()));
  }
  if (finished_ || current_ >= parameters_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "exporting ", directory_, ": appending ", our_name,
        finished_ ? " after Finish" : " after the last parameter"));
  }
  const auto &[name, shape] = parameters_[current_];
  if (our_name != name) {
    return absl::FailedPreconditionError(
        absl::StrCat("exporting ", directory_, ": got ", our_name,
                     " but the next parameter is ", name,
                     " (parameters come in DecoderConfig::ParameterShapes() "
                     "order)"));
  }
  const int64_t remaining = NumElements(shape) - written_in_current_;
  if (!values.defined() || !values.device().is_cpu() ||
      !IsFloatingPoint(values.dtype()) || values.numel() > remaining) {
    return absl::InvalidArgumentError(absl::StrCat(
        "exporting ", directory_, ": parameter ", name, ": got ",
        values.defined() ? values.DebugString() : "an undefined tensor",
        ", expected a CPU f32/bf16/f16 tensor of at most ", remaining,
        " elements (", ShapeToString(shape), ")"));
  }
  if (writer_ == nullptr) {
    absl::Status opened = OpenShard(shard_of_[current_]);
    if (!opened.ok()) return Fail(opened);
  }
  Tensor converted = values;
  if (values.dtype() != options_.dtype) {
    ZE_ASSIGN_OR_RETURN(
        converted,
        Tensor::Empty({values.numel()}, options_.dtype, Device::Cpu()));
    ConvertElements(values.data(), values.dtype(), converted.data(),
                    options_.dtype, values.numel());
  }
  absl::Status appended = writer_->Append(hf_names_[current_], converted);
  if (!appended.ok()) {
    return Fail(Annotate(appended, absl::StrCat("exporting ", directory_,
                                                ": parameter ", name)));
  }
  written_in_current_ += values.numel();
  // Past every complete parameter (zero-size ones included); a shard whose
  // parameters are all complete is finished at once, so only one is open.
  while (current_ < parameters_.size() &&
         written_in_current_ == NumElements(parameters_[current_].second)) {
    const size_t shard = shard_of_[current_];
    ++current_;
    written_in_current_ = 0;
    if (current_ == parameters_.size() || shard_of_[current_] != shard) {
      absl::Status finished = writer_->Finish();
      writer_.reset();
      if (!finished.ok()) return Fail(finished);
      if (current_ < parameters_.size()) {
        absl::Status opened = OpenShard(shard_of_[current_]);
        if (!opened.ok()) return Fail(opened);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status HuggingFaceDecoderWriter::Finish() {
  if (!failure_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("exporting ", directory_,
                     ": Finish after a failure: ", failure_.message()));
  }
  if (finished_) {
    return absl::FailedPreconditionError(
        absl::StrCat("exporting ", directory_, ": Finish called twice"));
  }
  if (current_ < parameters_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "exporting ", directory_, ": parameter ", parameters_[current_].first,
        " is incomplete (", written_in_current_, " of ",
        NumElements(parameters_[current_].second), " elements)"));
  }
  const bool sharded = shards_.size() > 1;
  if (sharded) {
    nlohmann::json index;
    uint64_t total_bytes = 0;
    int64_t total_parameters = 0;
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t i = 0; i < parameters_.size(); ++i) {
      weight_map[hf_names_[i]] = shards_[shard_of_[i]].file;
      total_parameters += NumElements(parameters_[i].second);
    }
    for (const Shard &shard : shards_) total_bytes += shard.bytes;
    index["metadata"] = {{"total_size", total_bytes},
                         {"total_parameters", total_parameters}};
    index["weight_map"] = weight_map;
    absl::Status written = WriteFileAtomically(
        JoinPath(directory_, kHfIndexFile), index.dump(2) + "\n");
    if (!written.ok()) return Fail(written);
  }
  absl::Status written = WriteFileAtomically(
      JoinPath(directory_, kHfConfigFile), config_.ToHuggingFaceJson());
  if (!written.ok()) return Fail(written);

  // Weight files of an earlier export that from_pretrained would read instead
  // of (or besides) these.
  const std::vector<std::string> ours = files();
  std::error_code error;
  for (const auto &entry :
       std::filesystem::directory_iterator(directory_, error)) {
    const std::string name = entry.path().filename().string();
    const bool ours_now =
        std::find(ours.begin(), ours.end(), name) != ours.end();
    const bool stale =
        !ours_now && (name == kHfWeightsFile ||
                      (name == kHfIndexFile && !sharded) || IsShardName(name));
    if (stale && ::unlink(entry.path().c_str()) != 0 && errno != ENOENT) {
      return Fail(ErrnoToStatus(errno, "remove the stale weight file",
                                entry.path().string()));
    }
  }
  if (error) {
    return Fail(absl::InternalError(
        absl::StrCat("exporting ", directory_,
                     ": listing the directory: ", error.message())));
  }
  finished_ = true;
  return absl::OkStatus();
}

absl::Status ExportHuggingFaceDecoder(const std::string &directory,
                                      const DecoderConfig &config,
                                      const DecoderTensorSource &source,
                                      const DecoderExportOptions &options) {
  ZE_ASSIGN_OR_RETURN(
      std::unique_ptr<HuggingFaceDecoderWriter> writer,
      HuggingFaceDecoderWriter::Create(directory, config, options));
  for (const auto &[name, shape] : writer->parameters()) {
    const std::string context =
        absl::StrCat("exporting ", directory, ": parameter ", name);
    absl::StatusOr<Tensor> value = source(name);
    if (!value.ok()) return Annotate(value.status(), context);
    if (!value->defined() || !value->device().is_cpu() ||
        !IsFloatingPoint(value->dtype()) || value->shape() != shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          context, ": the source gave ",
          value->defined() ? value->DebugString() : "an undefined tensor",
          ", expected a CPU f32/bf16/f16 tensor of shape ",
          ShapeToString(shape)));
    }
    ZE_RETURN_IF_ERROR(writer->Append(name, *value));
  }
  return writer->Finish();
}

}  // namespace nn
}  // namespace ze
