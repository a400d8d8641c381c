#include "engine/checkpoint/checkpoint_format.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <unordered_map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/atomic_file.h"
#include "core/crc32c.h"
#include "core/logging.h"
#include "core/ops.h"
#include "core/safetensors/format.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace ze {
namespace checkpoint {
namespace {

namespace fs = std::filesystem;
using OrderedJson = nlohmann::ordered_json;

// A std::filesystem error from `action` on `path` as the most specific
// Status.
absl::Status FsStatus(const std::error_code& error, const std::string& action,
                      const std::string& path) {
  return ErrnoToStatus(error.value(), action, path);
}

absl::StatusOr<DType> ParseDTypeKey(const std::string& text) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    if (text == DTypeName(dtype)) return dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model_dtype \"", text, "\" (f32, bf16, f16)"));
}

bool IsKnownKind(const std::string& kind) {
  return kind == kMaster || kind == kExpAvg || kind == kExpAvgSq ||
         kind == kMomentumBuffer || kind == kWeights;
}

// The element type a kind is stored in.
safetensors::ElementType KindElementType(const Manifest& manifest,
                                         const std::string& kind) {
  if (kind == kExpAvg || kind == kExpAvgSq) {
    return safetensors::ElementTypeOf(manifest.moments_dtype);
  }
  return safetensors::ElementTypeOf(kind == kWeights ? manifest.model_dtype
                                                     : DType::kF32);
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

}  // namespace

std::string RankFileName(int rank) {
  return absl::StrFormat("rank_%05d.safetensors", rank);
}

std::string PieceTensorName(const std::string& kind,
                            const std::string& parameter) {
  return absl::StrCat(kind, "/", parameter);
}

int64_t ParameterRecord::numel() const {
  int64_t count = 1;
  for (int64_t dimension : shape) count *= dimension;
  return count;
}

const ParameterRecord* Manifest::Find(const std::string& name) const {
  for (const ParameterRecord& record : parameters) {
    if (record.name == name) return &record;
  }
  return nullptr;
}

bool Manifest::HasKind(const std::string& kind) const {
  return std::find(kinds.begin(), kinds.end(), kind) != kinds.end();
}

absl::Status CheckMatchesModel(
    const Manifest& manifest,
    const std::vector<std::pair<std::string, Shape>>& parameters) {
  std::vector<std::string> problems;
  std::set<std::string> model_names;
  for (const auto& [name, shape] : parameters) {
    model_names.insert(name);
    const ParameterRecord* record = manifest.Find(name);
    if (record == nullptr) {
      problems.push_back(absl::StrCat(name, " is not in the checkpoint"));
    } else if (record->shape != shape) {
      problems.push_back(
          absl::StrCat(name, " has shape [", absl::StrJoin(record->shape, ", "),
                       "] in the checkpoint but [", absl::StrJoin(shape, ", "),
                       "] in the model"));
    }
  }
  for (const ParameterRecord& record : manifest.parameters) {
    if (model_names.count(record.name) == 0) {
      problems.push_back(
          absl::StrCat(record.name, " is in the checkpoint but not the model"));
    }
  }
  if (problems.empty()) return absl::OkStatus();
  const size_t shown = std::min<size_t>(problems.size(), 10);
  return absl::InvalidArgumentError(absl::StrCat(
      "checkpoint ", manifest.tag, " was saved from another model: ",
      absl::StrJoin(problems.begin(), problems.begin() + shown, "; "),
      problems.size() > shown
          ? absl::StrCat(" (and ", problems.size() - shown, " more)")
          : ""));
}

std::string SerializeManifest(const Manifest& manifest) {
  OrderedJson json;
  json["format"] = kFormatName;
  json["format_version"] = manifest.format_version;
  json["tag"] = manifest.tag;
  json["saved_at"] = manifest.saved_at.empty() ? UtcNow() : manifest.saved_at;
  json["world_size"] = manifest.world_size;
  json["zero_stage"] = manifest.zero_stage;
  json["model_dtype"] = DTypeName(manifest.model_dtype);
  if (manifest.moments_dtype != DType::kF32) {
    json["moments_dtype"] = DTypeName(manifest.moments_dtype);
  }
  json["kinds"] = manifest.kinds;
  json["training_state"] = manifest.training_state;
  json["client_state"] = manifest.client_state;
  OrderedJson files = OrderedJson::array();
  for (const FileRecord& file : manifest.files) {
    files.push_back({{"name", file.name},
                     {"rank", file.rank},
                     {"bytes", file.bytes},
                     {"crc32c", Crc32cToString(file.crc32c)}});
  }
  json["files"] = files;
  OrderedJson parameters = OrderedJson::array();
  for (const ParameterRecord& record : manifest.parameters) {
    OrderedJson pieces = OrderedJson::array();
    for (const Piece& piece : record.pieces) {
      pieces.push_back({piece.rank, piece.begin, piece.count});
    }
    parameters.push_back(
        {{"name", record.name}, {"shape", record.shape}, {"pieces", pieces}});
  }
  json["parameters"] = parameters;
  json["config"] = manifest.config;
  return json.dump(1) + "\n";
}

absl::StatusOr<Manifest> ParseManifest(const std::string& text,
                                       const std::string& source) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& error) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not valid JSON: ", error.what()));
  }
  Manifest manifest;
  std::string key;  // the key being read, for messages
  auto invalid = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
  };
  try {
    if (!json.is_object()) return invalid("not a JSON object");
    key = "format";
    if (json.at(key).get<std::string>() != kFormatName) {
      return invalid(absl::StrCat("\"format\" is \"",
                                  json.at(key).get<std::string>(), "\", not \"",
                                  kFormatName, "\""));
    }
    key = "format_version";
    manifest.format_version = json.at(key).get<int>();
    if (manifest.format_version > kFormatVersion) {
      return absl::FailedPreconditionError(absl::StrCat(
          source, ": format_version ", manifest.format_version,
          " was written by a newer version of zero-engine (this one reads up "
          "to ",
          kFormatVersion, ")"));
    }
    if (manifest.format_version < 1) {
      return invalid(absl::StrCat("format_version ", manifest.format_version,
                                  " is not a version"));
    }
    key = "tag";
    manifest.tag = json.at(key).get<std::string>();
    key = "saved_at";
    manifest.saved_at = json.value(key, "");
    key = "world_size";
    manifest.world_size = json.at(key).get<int>();
    if (manifest.world_size < 1) return invalid("world_size must be >= 1");
    key = "zero_stage";
    manifest.zero_stage = json.at(key).get<int>();
    if (manifest.zero_stage < 0 || manifest.zero_stage > 3) {
      return invalid(
          absl::StrCat("zero_stage ", manifest.zero_stage, " is not 0-3"));
    }
    key = "model_dtype";
    absl::StatusOr<DType> dtype =
        ParseDTypeKey(json.at(key).get<std::string>());
    if (!dtype.ok()) return invalid(std::string(dtype.status().message()));
    manifest.model_dtype = *dtype;
    if (json.contains("moments_dtype")) {
      key = "moments_dtype";
      absl::StatusOr<DType> moments =
          ParseDTypeKey(json.at(key).get<std::string>());
      if (!moments.ok() || *moments == DType::kF16) {
        return invalid("moments_dtype must be \"f32\" or \"bf16\"");
      }
      manifest.moments_dtype = *moments;
    }
    key = "kinds";
    manifest.kinds = json.at(key).get<std::vector<std::string>>();
    std::set<std::string> seen_kinds;
    for (const std::string& kind : manifest.kinds) {
      if (!IsKnownKind(kind) || !seen_kinds.insert(kind).second) {
        return invalid(
            absl::StrCat("kinds: unknown or repeated kind \"", kind, "\""));
      }
    }
    for (const char* object_key :
         {"training_state", "client_state", "config"}) {
      key = object_key;
      const nlohmann::json& value = json.at(key);
      if (!value.is_object()) return invalid(key + " is not an object");
    }
    manifest.training_state = json.at("training_state");
    manifest.client_state = json.at("client_state");
    manifest.config = json.at("config");
    key = "files";
    for (const nlohmann::json& file : json.at(key)) {
      FileRecord record;
      record.name = file.at("name").get<std::string>();
      record.rank = file.at("rank").get<int>();
      record.bytes = file.at("bytes").get<uint64_t>();
      const std::string crc = file.at("crc32c").get<std::string>();
      if (crc.size() != 15 || crc.rfind("crc32c:", 0) != 0) {
        return invalid(absl::StrCat("files: ", record.name, ": crc32c \"", crc,
                                    "\" is malformed"));
      }
      record.crc32c =
          static_cast<uint32_t>(std::stoul(crc.substr(7), nullptr, 16));
      manifest.files.push_back(std::move(record));
    }
    if (static_cast<int>(manifest.files.size()) != manifest.world_size) {
      return invalid(absl::StrCat("files lists ", manifest.files.size(),
                                  " files for world_size ",
                                  manifest.world_size));
    }
    for (int rank = 0; rank < manifest.world_size; ++rank) {
      if (manifest.files[rank].rank != rank ||
          manifest.files[rank].name != RankFileName(rank)) {
        return invalid(absl::StrCat(
            "files[", rank, "] is \"", manifest.files[rank].name, "\" of rank ",
            manifest.files[rank].rank, ", expected ", RankFileName(rank)));
      }
    }
    key = "parameters";
    std::set<std::string> names;
    for (const nlohmann::json& parameter : json.at(key)) {
      ParameterRecord record;
      record.name = parameter.at("name").get<std::string>();
      key = absl::StrCat("parameters: ", record.name);
      if (!names.insert(record.name).second) {
        return invalid(
            absl::StrCat("parameter ", record.name, " is listed twice"));
      }
      record.shape = parameter.at("shape").get<std::vector<int64_t>>();
      for (int64_t dimension : record.shape) {
        if (dimension < 0) {
          return invalid(absl::StrCat("parameter ", record.name,
                                      " has a negative dimension"));
        }
      }
      int64_t next = 0;
      std::set<int> ranks;
      for (const nlohmann::json& piece : parameter.at("pieces")) {
        const Piece value{piece.at(0).get<int>(), piece.at(1).get<int64_t>(),
                          piece.at(2).get<int64_t>()};
        if (value.rank < 0 || value.rank >= manifest.world_size ||
            !ranks.insert(value.rank).second || value.count <= 0 ||
            value.begin != next) {
          return invalid(absl::StrCat(
              "parameter ", record.name, ": piece [rank ", value.rank,
              ", begin ", value.begin, ", count ", value.count,
              "] does not continue the pieces before it (expected begin ", next,
              ", a new rank below ", manifest.world_size,
              ", a positive count)"));
        }
        next += value.count;
        record.pieces.push_back(value);
      }
      if (next != record.numel()) {
        return invalid(absl::StrCat("parameter ", record.name,
                                    ": pieces cover ", next, " of its ",
                                    record.numel(), " elements"));
      }
      manifest.parameters.push_back(std::move(record));
    }
  } catch (const nlohmann::json::exception& error) {
    return invalid(absl::StrCat("key \"", key, "\": ", error.what()));
  } catch (const std::exception& error) {
    return invalid(absl::StrCat("key \"", key, "\": ", error.what()));
  }
  return manifest;
}

// ----------------------------------------------------------------- writing

struct RankFileWriter::Impl {
  std::unique_ptr<safetensors::Writer> writer;
  int rank = 0;
};

absl::StatusOr<std::unique_ptr<RankFileWriter>> RankFileWriter::Create(
    const std::string& tag_directory, int rank,
    const std::vector<std::string>& kinds,
    const std::vector<DType>& kind_dtypes,
    const std::vector<PieceSpec>& pieces) {
  if (kinds.size() != kind_dtypes.size()) {
    return absl::InvalidArgumentError(
        "RankFileWriter: one dtype per kind is needed");
  }
  std::vector<safetensors::TensorSpec> specs;
  specs.reserve(pieces.size() * kinds.size());
  for (const PieceSpec& piece : pieces) {
    for (size_t k = 0; k < kinds.size(); ++k) {
      specs.push_back({PieceTensorName(kinds[k], piece.parameter),
                       safetensors::ElementTypeOf(kind_dtypes[k]),
                       {piece.count}});
    }
  }
  safetensors::Metadata metadata = {{"format", kFormatName},
                                    {"rank", std::to_string(rank)}};
  // Direct I/O: see safetensors::WriterOptions (the disk writes while the
  // state is still being copied out, instead of at the final fsync). On the
  // H200 host it saved at 2.05 GB/s where buffered writes managed 0.79
  // (bench/RESULTS.md, runs 31 and 35).
  safetensors::WriterOptions options;
  options.direct_io = true;
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<safetensors::Writer> writer,
                      safetensors::Writer::Create(
                          absl::StrCat(tag_directory, "/", RankFileName(rank)),
                          std::move(specs), metadata, options));
  std::unique_ptr<RankFileWriter> result(new RankFileWriter());
  result->impl_ = std::make_unique<Impl>();
  result->impl_->writer = std::move(writer);
  result->impl_->rank = rank;
  return result;
}

RankFileWriter::~RankFileWriter() = default;

absl::Status RankFileWriter::Append(const std::string& kind,
                                    const std::string& parameter,
                                    const Tensor& values) {
  return impl_->writer->Append(PieceTensorName(kind, parameter), values);
}

absl::StatusOr<FileRecord> RankFileWriter::Finish() {
  ZE_RETURN_IF_ERROR(impl_->writer->Finish());
  FileRecord record;
  record.name = RankFileName(impl_->rank);
  record.rank = impl_->rank;
  record.bytes = impl_->writer->bytes_written();
  record.crc32c = impl_->writer->crc32c();
  return record;
}

const safetensors::Writer::Stats& RankFileWriter::stats() const {
  return impl_->writer->stats();
}

std::string PartialDirectory(const std::string& directory,
                             const std::string& tag) {
  return absl::StrCat(directory, "/.", tag, ".partial");
}

std::string TagDirectory(const std::string& directory, const std::string& tag) {
  return absl::StrCat(directory, "/", tag);
}

namespace {
std::string OldDirectory(const std::string& directory, const std::string& tag) {
  return absl::StrCat(directory, "/.", tag, ".old");
}
}  // namespace

absl::Status ValidateTag(const std::string& tag) {
  if (tag.empty() || tag.size() > 255 || tag[0] == '.') {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint tag \"", tag,
                     "\" must be 1-255 characters and not start with '.'"));
  }
  for (char c : tag) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
        c != '_' && c != '-') {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint tag \"", tag, "\" has the character '", std::string(1, c),
          "'; use letters, digits, '.', '_' and '-'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PartialSave>> ListPartialSaves(
    const std::string& directory) {
  std::error_code error;
  if (!fs::is_directory(directory, error)) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint directory ", directory, " does not exist"));
  }
  std::vector<PartialSave> saves;
  constexpr absl::string_view kSuffix = ".partial";
  for (fs::directory_iterator entry(directory, error), end;
       !error && entry != end; entry.increment(error)) {
    const std::string name = entry->path().filename().string();
    if (name.size() <= 1 + kSuffix.size() || name[0] != '.' ||
        !absl::EndsWith(name, kSuffix) || !entry->is_directory(error)) {
      continue;
    }
    PartialSave save;
    save.path = entry->path().string();
    save.tag = name.substr(1, name.size() - 1 - kSuffix.size());
    for (fs::recursive_directory_iterator file(save.path, error), last;
         !error && file != last; file.increment(error)) {
      std::error_code size_error;
      if (file->is_regular_file(size_error)) {
        const uintmax_t size = file->file_size(size_error);
        if (!size_error) save.bytes += size;
      }
    }
    if (error) return FsStatus(error, "list", save.path);
    saves.push_back(std::move(save));
  }
  if (error) return FsStatus(error, "list", directory);
  std::sort(saves.begin(), saves.end(),
            [](const PartialSave& a, const PartialSave& b) {
              return a.path < b.path;
            });
  return saves;
}

absl::StatusOr<std::vector<PartialSave>> RemovePartialSaves(
    const std::string& directory) {
  std::error_code error;
  if (!fs::exists(directory, error)) return std::vector<PartialSave>();
  ZE_ASSIGN_OR_RETURN(std::vector<PartialSave> saves,
                      ListPartialSaves(directory));
  for (const PartialSave& save : saves) {
    fs::remove_all(save.path, error);
    if (error) return FsStatus(error, "remove the partial save", save.path);
  }
  return saves;
}

absl::Status BeginSave(const std::string& directory, const std::string& tag) {
  ZE_RETURN_IF_ERROR(ValidateTag(tag));
  std::error_code error;
  fs::create_directories(directory, error);
  if (error)
    return FsStatus(error, "create the checkpoint directory", directory);
  // Failed saves' leftovers, of this tag or any other.
  ZE_ASSIGN_OR_RETURN(const std::vector<PartialSave> removed,
                      RemovePartialSaves(directory));
  for (const PartialSave& save : removed) {
    ZE_LOG(WARNING) << "removed " << save.path << "/ (" << save.bytes
                    << " bytes), an incomplete save of tag " << save.tag
                    << " left by a save that failed or was killed";
  }
  const std::string partial = PartialDirectory(directory, tag);
  if (mkdir(partial.c_str(), 0755) != 0) {
    return ErrnoToStatus(errno, "create", partial);
  }
  return SyncDirectory(directory);
}

absl::Status CommitSave(const std::string& directory,
                        const Manifest& manifest) {
  const std::string partial = PartialDirectory(directory, manifest.tag);
  ZE_RETURN_IF_ERROR(
      WriteFileAtomically(absl::StrCat(partial, "/", kManifestFileName),
                          SerializeManifest(manifest)));
  ZE_RETURN_IF_ERROR(SyncDirectory(partial));
  const std::string target = TagDirectory(directory, manifest.tag);
  const std::string old = OldDirectory(directory, manifest.tag);
  std::error_code error;
  const bool replacing = fs::exists(target, error);
  if (replacing) {
    fs::remove_all(old, error);
    if (rename(target.c_str(), old.c_str()) != 0) {
      return ErrnoToStatus(errno, "move the previous save aside:", target);
    }
  }
  if (rename(partial.c_str(), target.c_str()) != 0) {
    const int rename_error = errno;
    if (replacing) rename(old.c_str(), target.c_str());
    return ErrnoToStatus(rename_error,
                         "rename the completed save into place:", target);
  }
  ZE_RETURN_IF_ERROR(SyncDirectory(directory));
  ZE_RETURN_IF_ERROR(WriteFileAtomically(
      absl::StrCat(directory, "/", kLatestFileName), manifest.tag + "\n"));
  // The previous save of this tag: moved aside just above, or left by a
  // CommitSave that died between its two renames (then `replacing` is
  // false, and the .old directory is stale now that <tag> is complete).
  fs::remove_all(old, error);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadLatestTag(const std::string& directory) {
  const std::string path = absl::StrCat(directory, "/", kLatestFileName);
  std::ifstream file(path);
  if (!file) {
    return absl::NotFoundError(absl::StrCat(
        path, " does not exist: no checkpoint was completed in ", directory));
  }
  std::stringstream text;
  text << file.rdbuf();
  const std::string tag(absl::StripAsciiWhitespace(text.str()));
  absl::Status valid = ValidateTag(tag);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", valid.message()));
  }
  return tag;
}

// ----------------------------------------------------------------- reading

absl::StatusOr<std::string> ResolveTagDirectory(
    const std::string& directory, const std::string& tag_argument) {
  std::error_code error;
  if (!fs::is_directory(directory, error)) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint directory ", directory, " does not exist"));
  }
  std::string tag = tag_argument;
  if (tag.empty()) {
    ZE_ASSIGN_OR_RETURN(tag, ReadLatestTag(directory));
  }
  ZE_RETURN_IF_ERROR(ValidateTag(tag));
  const std::string tag_directory = TagDirectory(directory, tag);
  if (fs::is_directory(tag_directory, error)) return tag_directory;
  const std::string old = OldDirectory(directory, tag);
  if (fs::is_directory(old, error)) return old;  // see ReadLatestTag
  return absl::NotFoundError(
      absl::StrCat("checkpoint tag ", tag, " does not exist in ", directory));
}

absl::StatusOr<Manifest> ReadManifest(const std::string& tag_directory) {
  const std::string manifest_path =
      absl::StrCat(tag_directory, "/", kManifestFileName);
  std::ifstream manifest_file(manifest_path);
  if (!manifest_file) {
    return absl::NotFoundError(
        absl::StrCat(manifest_path, " is missing: the save of ", tag_directory,
                     " did not complete"));
  }
  std::stringstream text;
  text << manifest_file.rdbuf();
  if (manifest_file.bad()) {
    return absl::DataLossError(absl::StrCat("read ", manifest_path, " failed"));
  }
  return ParseManifest(text.str(), manifest_path);
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    const std::string& directory, const std::string& tag_argument) {
  ZE_ASSIGN_OR_RETURN(const std::string tag_directory,
                      ResolveTagDirectory(directory, tag_argument));
  std::unique_ptr<CheckpointReader> reader(new CheckpointReader());
  reader->tag_directory_ = tag_directory;
  ZE_ASSIGN_OR_RETURN(reader->manifest_, ReadManifest(tag_directory));
  const std::string& tag = reader->manifest_.tag;
  const Manifest& manifest = reader->manifest_;

  // What every rank file must declare, from the manifest.
  std::vector<std::unordered_map<std::string, int64_t>> expected(
      manifest.world_size);
  for (const ParameterRecord& record : manifest.parameters) {
    for (const Piece& piece : record.pieces) {
      for (const std::string& kind : manifest.kinds) {
        expected[piece.rank][PieceTensorName(kind, record.name)] = piece.count;
      }
    }
  }
  reader->files_.resize(manifest.world_size);
  reader->reads_.resize(manifest.world_size);
  for (const FileRecord& file : manifest.files) {
    const std::string path = absl::StrCat(tag_directory, "/", file.name);
    struct stat info;
    if (stat(path.c_str(), &info) != 0) {
      return absl::NotFoundError(absl::StrCat(file.name, " of checkpoint tag ",
                                              tag, " is missing (", path, ")"));
    }
    if (static_cast<uint64_t>(info.st_size) != file.bytes) {
      return absl::DataLossError(absl::StrCat(
          path, " has ", info.st_size, " bytes but the manifest records ",
          file.bytes, " (truncated or overwritten)"));
    }
    absl::StatusOr<std::unique_ptr<safetensors::Reader>> opened =
        safetensors::Reader::Open(path);
    if (!opened.ok()) {
      return absl::DataLossError(absl::StrCat("checkpoint tag ", tag, ": ",
                                              opened.status().message()));
    }
    const auto& wanted = expected[file.rank];
    if ((*opened)->tensors().size() != wanted.size()) {
      return absl::DataLossError(
          absl::StrCat(path, " holds ", (*opened)->tensors().size(),
                       " tensors but the manifest implies ", wanted.size()));
    }
    for (const safetensors::TensorInfo& info_entry : (*opened)->tensors()) {
      auto found = wanted.find(info_entry.name);
      const std::string kind =
          info_entry.name.substr(0, info_entry.name.find('/'));
      if (found == wanted.end() || info_entry.num_elements() != found->second ||
          info_entry.dtype != KindElementType(manifest, kind)) {
        return absl::DataLossError(absl::StrCat(
            path, ": tensor \"", info_entry.name,
            "\" disagrees with the manifest (not listed, or another size or "
            "dtype)"));
      }
    }
    reader->files_[file.rank] = std::move(opened).value();
  }
  return reader;
}

CheckpointReader::~CheckpointReader() = default;

absl::StatusOr<const safetensors::Reader*> CheckpointReader::RankFile(
    int rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (rank < 0 || rank >= static_cast<int>(files_.size()) ||
      files_[rank] == nullptr) {
    return absl::InternalError(absl::StrCat("no open file for rank ", rank));
  }
  return files_[rank].get();
}

namespace {

// CRC-32C of bytes [begin, begin + length) of `fd`.
absl::StatusOr<uint32_t> ChecksumRange(int fd, uint64_t begin, uint64_t length,
                                       const std::string& path) {
  constexpr size_t kBufferBytes = size_t{8} << 20;
  std::vector<char> buffer(std::min<uint64_t>(kBufferBytes, length));
  uint32_t crc = 0;
  uint64_t done = 0;
  while (done < length) {
    const size_t want =
        static_cast<size_t>(std::min<uint64_t>(buffer.size(), length - done));
    const ssize_t got =
        pread(fd, buffer.data(), want, static_cast<off_t>(begin + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "read", path);
    }
    if (got == 0) {
      return absl::DataLossError(absl::StrCat(
          path, " ended at byte ", begin + done, " while being verified"));
    }
    crc = Crc32cExtend(crc, buffer.data(), static_cast<size_t>(got));
    done += static_cast<uint64_t>(got);
  }
  return crc;
}

}  // namespace

absl::Status CheckpointReader::VerifyFiles(int stride, int offset) const {
  for (const FileRecord& file : manifest_.files) {
    if (stride > 0 && file.rank % stride != offset) continue;
    ZE_RETURN_IF_ERROR(VerifyFile(file));
  }
  return absl::OkStatus();
}

namespace {

absl::Status CorruptFileError(const std::string& path, uint64_t size,
                              uint32_t crc, const FileRecord& file) {
  return absl::DataLossError(
      absl::StrCat(path, " is corrupt: ", size, " bytes with ",
                   Crc32cToString(crc), ", the manifest records ", file.bytes,
                   " bytes with ", Crc32cToString(file.crc32c)));
}

}  // namespace

absl::Status CheckpointReader::VerifyFile(const FileRecord& file) const {
  // A file is read as up to kThreads segments in parallel (a disk answers
  // several requests faster than one stream), their checksums combined.
  constexpr int kThreads = 4;
  constexpr uint64_t kMinSegmentBytes = uint64_t{64} << 20;
  const std::string path = absl::StrCat(tag_directory_, "/", file.name);
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return ErrnoToStatus(errno, "open", path);
  struct stat info;
  fstat(fd, &info);
  const uint64_t size = static_cast<uint64_t>(info.st_size);
  posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  const int segments = static_cast<int>(std::max<uint64_t>(
      1, std::min<uint64_t>(kThreads, size / kMinSegmentBytes)));
  const uint64_t segment = (size + segments - 1) / segments;
  auto segment_begin = [&](int64_t i) { return std::min(size, i * segment); };
  auto segment_length = [&](int64_t i) {
    return std::min(size, segment_begin(i) + segment) - segment_begin(i);
  };
  std::vector<uint32_t> crcs(segments, 0);
  ThreadPool pool(segments);
  const absl::Status read =
      pool.TryParallelFor(segments, [&](int, int64_t i) -> absl::Status {
        ZE_ASSIGN_OR_RETURN(crcs[i], ChecksumRange(fd, segment_begin(i),
                                                   segment_length(i), path));
        return absl::OkStatus();
      });
  close(fd);
  ZE_RETURN_IF_ERROR(read);
  uint32_t crc = 0;
  for (int i = 0; i < segments; ++i) {
    crc = i == 0 ? crcs[i] : Crc32cCombine(crc, crcs[i], segment_length(i));
  }
  if (size != file.bytes || crc != file.crc32c) {
    return CorruptFileError(path, size, crc, file);
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::VerifyFilesFromReads(int stride, int offset,
                                                    int* reread_files) const {
  if (reread_files != nullptr) *reread_files = 0;
  for (const FileRecord& file : manifest_.files) {
    if (stride > 0 && file.rank % stride != offset) continue;
    std::vector<ReadRecord> reads;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      reads = reads_[file.rank];
    }
    std::sort(reads.begin(), reads.end(),
              [](const ReadRecord& a, const ReadRecord& b) {
                return a.offset != b.offset ? a.offset < b.offset
                                            : a.bytes < b.bytes;
              });
    ZE_ASSIGN_OR_RETURN(const safetensors::Reader* opened, RankFile(file.rank));
    const std::string path = absl::StrCat(tag_directory_, "/", file.name);
    // Do the reads tile the data section [data_start, bytes) exactly? Then
    // the header's CRC followed by theirs, in order, is the file's.
    uint64_t position = opened->data_start();
    uint32_t data_crc = 0;
    bool covered = true;
    const ReadRecord* previous = nullptr;
    for (const ReadRecord& read : reads) {
      if (previous != nullptr && read.offset == previous->offset &&
          read.bytes == previous->bytes) {
        // The same bytes read twice (e.g. master weights taken from the
        // 16-bit weights): must have read the same.
        if (read.crc32c != previous->crc32c) covered = false;
        continue;
      }
      if (read.offset != position) {
        covered = false;
        break;
      }
      data_crc = Crc32cCombine(data_crc, read.crc32c, read.bytes);
      position += read.bytes;
      previous = &read;
    }
    if (!covered || position != file.bytes) {
      if (reread_files != nullptr) ++*reread_files;
      ZE_RETURN_IF_ERROR(VerifyFile(file));
      continue;
    }
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoToStatus(errno, "open", path);
    absl::StatusOr<uint32_t> header_crc =
        ChecksumRange(fd, 0, opened->data_start(), path);
    close(fd);
    ZE_RETURN_IF_ERROR(header_crc.status());
    const uint32_t crc =
        Crc32cCombine(*header_crc, data_crc, file.bytes - opened->data_start());
    if (crc != file.crc32c) {
      return CorruptFileError(path, file.bytes, crc, file);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::ReadRanges(
    const std::vector<RangeRequest>& requests, int threads) {
  // One read: bytes [offset, offset + bytes) of rank file `rank` into
  // `target` (`direct`: straight into its memory; otherwise through a
  // buffer of the stored dtype, converted).
  struct Task {
    int rank = 0;
    uint64_t offset = 0;
    uint64_t bytes = 0;
    bool direct = true;
    DType stored = DType::kF32;
    Tensor target;
  };
  std::vector<Task> tasks;
  for (const RangeRequest& request : requests) {
    const ParameterRecord* record = manifest_.Find(request.parameter);
    if (record == nullptr) {
      return absl::NotFoundError(absl::StrCat(tag_directory_, ": no parameter ",
                                              request.parameter,
                                              " in the checkpoint"));
    }
    if (!manifest_.HasKind(request.kind)) {
      return absl::NotFoundError(absl::StrCat(tag_directory_, ": no \"",
                                              request.kind,
                                              "\" state in the checkpoint"));
    }
    const Tensor& destination = request.destination;
    const int64_t begin = request.begin;
    const int64_t count = destination.numel();
    if (begin < 0 || begin + count > record->numel()) {
      return absl::OutOfRangeError(absl::StrCat(
          tag_directory_, ": elements [", begin, ", ", begin + count, ") of ",
          request.parameter, " (", record->numel(), " elements)"));
    }
    if (!destination.device().is_cpu()) {
      return absl::InvalidArgumentError(
          "ReadRanges: destinations must be on CPU");
    }
    const std::string name = PieceTensorName(request.kind, request.parameter);
    ZE_ASSIGN_OR_RETURN(DType stored, safetensors::DTypeOf(KindElementType(
                                          manifest_, request.kind)));
    const uint64_t element = SizeOf(stored);
    const int64_t chunk_elements =
        static_cast<int64_t>(kReadChunkBytes / element);
    Tensor flat = destination.Flat();
    for (const Piece& piece : record->pieces) {
      const int64_t low = std::max(begin, piece.begin);
      const int64_t high = std::min(begin + count, piece.begin + piece.count);
      if (high <= low) continue;
      ZE_ASSIGN_OR_RETURN(const safetensors::Reader* file,
                          RankFile(piece.rank));
      ZE_ASSIGN_OR_RETURN(const safetensors::TensorInfo* info, file->Get(name));
      const uint64_t start =
          file->data_start() + info->begin + (low - piece.begin) * element;
      for (int64_t done = low; done < high; done += chunk_elements) {
        const int64_t n = std::min(chunk_elements, high - done);
        Task task;
        task.rank = piece.rank;
        task.offset = start + (done - low) * element;
        task.bytes = n * element;
        task.direct = stored == destination.dtype();
        task.stored = stored;
        task.target = flat.Slice(done - begin, n);
        tasks.push_back(std::move(task));
      }
    }
  }
  // File order: each file is read front to back, `threads` reads at a time.
  std::sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.offset < b.offset;
  });
  std::vector<int> fds(manifest_.world_size, -1);
  auto close_all = [&] {
    for (int& fd : fds) {
      if (fd >= 0) close(fd);
      fd = -1;
    }
  };
  for (const Task& task : tasks) {
    if (fds[task.rank] >= 0) continue;
    const std::string path =
        absl::StrCat(tag_directory_, "/", manifest_.files[task.rank].name);
    fds[task.rank] = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fds[task.rank] < 0) {
      const int error = errno;
      close_all();
      return ErrnoToStatus(error, "open", path);
    }
    posix_fadvise(fds[task.rank], 0, 0, POSIX_FADV_SEQUENTIAL);
  }
  threads = std::max(1, std::min<int>(threads, static_cast<int>(tasks.size())));
  // Per thread: its reads' records and its buffer for converted reads.
  std::vector<std::vector<std::pair<int, ReadRecord>>> records(threads);
  std::vector<std::vector<char>> buffers(threads);
  ThreadPool pool(threads);
  const absl::Status read = pool.TryParallelFor(
      static_cast<int64_t>(tasks.size()),
      [&](int thread, int64_t i) -> absl::Status {
        const Task& task = tasks[i];
        const std::string& name = manifest_.files[task.rank].name;
        char* memory = static_cast<char*>(task.target.data());
        if (!task.direct) {
          buffers[thread].resize(task.bytes);
          memory = buffers[thread].data();
        }
        uint64_t done = 0;
        while (done < task.bytes) {
          const ssize_t got =
              pread(fds[task.rank], memory + done, task.bytes - done,
                    static_cast<off_t>(task.offset + done));
          if (got < 0 && errno == EINTR) continue;
          const std::string path = absl::StrCat(tag_directory_, "/", name);
          if (got < 0) return ErrnoToStatus(errno, "read", path);
          if (got == 0) {
            return absl::DataLossError(
                absl::StrCat(path, " ended at byte ", task.offset + done,
                             " (truncated while being read)"));
          }
          done += static_cast<uint64_t>(got);
        }
        if (!task.direct) {
          const Tensor staged = Tensor::Wrap(memory, {task.target.numel()},
                                             task.stored, Device::Cpu());
          ZE_RETURN_IF_ERROR(
              Copy(staged, task.target, Stream::Default(Device::Cpu())));
        }
        records[thread].push_back(
            {task.rank,
             ReadRecord{task.offset, task.bytes, Crc32c(memory, task.bytes)}});
        return absl::OkStatus();
      });
  close_all();
  ZE_RETURN_IF_ERROR(read);
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& list : records) {
    for (const auto& [rank, read] : list) {
      reads_[rank].push_back(read);
      bytes_read_ += static_cast<int64_t>(read.bytes);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::ReadRange(const std::string& kind,
                                         const std::string& parameter,
                                         int64_t begin,
                                         const Tensor& destination) const {
  const ParameterRecord* record = manifest_.Find(parameter);
  if (record == nullptr) {
    return absl::NotFoundError(absl::StrCat(tag_directory_, ": no parameter ",
                                            parameter, " in the checkpoint"));
  }
  if (!manifest_.HasKind(kind)) {
    return absl::NotFoundError(absl::StrCat(tag_directory_, ": no \"", kind,
                                            "\" state in the checkpoint"));
  }
  const int64_t count = destination.numel();
  if (begin < 0 || begin + count > record->numel()) {
    return absl::OutOfRangeError(
        absl::StrCat(tag_directory_, ": elements [", begin, ", ", begin + count,
                     ") of ", parameter, " (", record->numel(), " elements)"));
  }
  if (!destination.device().is_cpu()) {
    return absl::InvalidArgumentError("ReadRange: destination must be on CPU");
  }
  const std::string name = PieceTensorName(kind, parameter);
  ZE_ASSIGN_OR_RETURN(DType stored,
                      safetensors::DTypeOf(KindElementType(manifest_, kind)));
  Tensor flat = destination.Flat();
  for (const Piece& piece : record->pieces) {
    const int64_t low = std::max(begin, piece.begin);
    const int64_t high = std::min(begin + count, piece.begin + piece.count);
    if (high <= low) continue;
    ZE_ASSIGN_OR_RETURN(const safetensors::Reader* file, RankFile(piece.rank));
    Tensor target = flat.Slice(low - begin, high - low);
    if (stored == destination.dtype()) {
      ZE_RETURN_IF_ERROR(
          file->ReadRange(name, low - piece.begin, high - low, target));
    } else {
      ZE_ASSIGN_OR_RETURN(Tensor staged,
                          Tensor::Empty({high - low}, stored, Device::Cpu()));
      ZE_RETURN_IF_ERROR(
          file->ReadRange(name, low - piece.begin, high - low, staged));
      ZE_RETURN_IF_ERROR(Copy(staged, target, Stream::Default(Device::Cpu())));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    bytes_read_ += (high - low) * static_cast<int64_t>(SizeOf(stored));
  }
  return absl::OkStatus();
}

int64_t CheckpointReader::bytes_read() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_read_;
}

}  // namespace checkpoint
}  // namespace ze
