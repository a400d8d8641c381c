// ze_checkpoint: look into, check, consolidate and clean zero-engine
// checkpoints (engine/checkpoint/checkpoint_format.h) without an engine or
// a GPU.
//
//   ze_checkpoint inspect DIR [--tag=T] [--json]
//   ze_checkpoint verify DIR [--tag=T]
//   ze_checkpoint consolidate DIR --out=FILE [--tag=T] [--dtype=f32|bf16|f16]
//       [--format=native|hf-gpt2|hf] [--kind=master|weights]
//       [--memory_limit=BYTES] [--vocab_size=V] [--max_shard_size=BYTES]
//   ze_checkpoint clean DIR
//   ze_checkpoint import-hf-gpt2 HF_FILE --out=FILE [--dtype=f32|bf16|f16]
//       [--vocab_size=V]
//   ze_checkpoint --help
//
// inspect prints what a checkpoint holds (tag, world size, stage, dtype,
// kinds, steps, parameters, files with sizes) from the manifest and the
// files' sizes, so it describes a damaged checkpoint too (and exits 1 when
// a file is missing or has the wrong size), and lists the incomplete saves
// (.<tag>.partial/, with their sizes) failed saves left in DIR; verify
// reads every file and compares its CRC-32C with the manifest; consolidate
// verifies the checksums as a load does (a corrupt rank file is refused by
// name before anything is written), then writes one safetensors file of
// full parameters, one parameter at a time, so it needs memory for the
// largest parameter only (--memory_limit makes that bound a hard limit;
// with --format=hf-gpt2, --vocab_size=V writes the token table's first V
// rows, dropping a padded table's extra ones, by default the vocabulary the
// checkpoint's client_state records, as train_gpt's does). With --format=hf
// (a Llama, Mistral or Qwen decoder whose checkpoint records its
// config.json, as train_gpt's do) --out is a directory that transformers'
// AutoModelForCausalLM.from_pretrained loads: config.json and
// model.safetensors, or with --max_shard_size=BYTES shards of at most that
// many bytes with model.safetensors.index.json. clean removes
// the incomplete saves in DIR, printing each with its size (the next save
// removes them too); do not run it while a job saves into DIR.
// import-hf-gpt2 turns a Hugging Face GPT-2 safetensors file into our names
// and layout (Conv1D weights transposed, the vocabulary padded with zero
// rows to V), one parameter at a time, so that Engine::LoadWeights can
// start a job at any world size and stage from it.
//
// Exit status: 0 done; 1 a check the command exists for failed (verify: a
// file is missing, truncated or corrupt; inspect: a file is missing or has
// the wrong size); 2 bad usage or bad input (no such directory or tag, an
// unreadable manifest, a corrupt or incomplete checkpoint to consolidate,
// a refused option), the message naming the flag, file or path.
#include <sys/stat.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/allocator.h"
#include "core/crc32c.h"
#include "core/safetensors/writer.h"
#include "core/status.h"
#include "engine/checkpoint/checkpoint_format.h"
#include "engine/checkpoint/consolidate.h"
#include "nn/pretrained/hf_gpt2.h"

namespace ze {
namespace checkpoint {
namespace {

constexpr char kUsage[] =
    "usage:\n"
    "  ze_checkpoint inspect DIR [--tag=T] [--json]\n"
    "  ze_checkpoint verify DIR [--tag=T]\n"
    "  ze_checkpoint consolidate DIR --out=FILE [--tag=T] "
    "[--dtype=f32|bf16|f16]\n"
    "      [--format=native|hf-gpt2|hf] [--kind=master|weights] "
    "[--memory_limit=BYTES] [--vocab_size=V]\n"
    "      [--max_shard_size=BYTES]\n"
    "  ze_checkpoint clean DIR\n"
    "  ze_checkpoint import-hf-gpt2 HF_FILE --out=FILE [--dtype=f32|bf16|f16] "
    "[--vocab_size=V]\n"
    "  ze_checkpoint --help\n";

constexpr char kHelp[] =
    "DIR is a checkpoint directory (--save_dir): it holds `latest`, one\n"
    "directory per tag, and .<tag>.partial/ directories failed saves left.\n"
    "\n"
    "  inspect      what the checkpoint holds (the tag `latest` names, or\n"
    "               --tag), from the manifest and the files' sizes; and the\n"
    "               incomplete saves in DIR with their sizes\n"
    "  verify       every rank file's CRC-32C against the manifest\n"
    "  consolidate  one safetensors file of full parameters (--out), after\n"
    "               verifying the checksums as a load does; --format=hf: a\n"
    "               Hugging Face model directory of a Llama/Mistral/Qwen\n"
    "               checkpoint (--out is the directory)\n"
    "  clean        remove the incomplete saves (.<tag>.partial/) in DIR,\n"
    "               each printed with its size; the next save also does\n"
    "  import-hf-gpt2  a Hugging Face GPT-2 safetensors file in our names\n"
    "\n"
    "Exit status: 0 done; 1 verify (or inspect's size check) found a bad\n"
    "file; 2 bad usage or input (the message names the flag, file or\n"
    "path).\n";

constexpr int kCheckFailed = 1;
constexpr int kBadInput = 2;

struct Arguments {
  std::string command;
  std::string directory;
  std::map<std::string, std::string> flags;
};

// Exits 2 with the usage on anything it does not understand.
absl::StatusOr<Arguments> Parse(int argc, char** argv,
                                const std::vector<std::string>& known) {
  Arguments arguments;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--", 0) == 0) {
      const size_t equals = arg.find('=');
      const std::string name = arg.substr(
          2, equals == std::string::npos ? std::string::npos : equals - 2);
      if (std::find(known.begin(), known.end(), name) == known.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown flag --", name));
      }
      arguments.flags[name] =
          equals == std::string::npos ? "1" : arg.substr(equals + 1);
    } else if (arguments.command.empty()) {
      arguments.command = arg;
    } else if (arguments.directory.empty()) {
      arguments.directory = arg;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument ", arg));
    }
  }
  if (arguments.command.empty() || arguments.directory.empty()) {
    return absl::InvalidArgumentError("a command and a directory are needed");
  }
  return arguments;
}

std::string Flag(const Arguments& arguments, const std::string& name,
                 const std::string& fallback = "") {
  auto found = arguments.flags.find(name);
  return found == arguments.flags.end() ? fallback : found->second;
}

int64_t Elements(const Manifest& manifest) {
  int64_t total = 0;
  for (const ParameterRecord& record : manifest.parameters) {
    total += record.numel();
  }
  return total;
}

// What inspect finds for one rank file: its size on disk against the
// manifest's record.
struct FileCheck {
  const FileRecord* record = nullptr;
  bool present = false;
  uint64_t actual_bytes = 0;
  bool size_matches() const { return present && actual_bytes == record->bytes; }
  std::string Describe() const {
    if (!present) return "MISSING";
    if (!size_matches()) {
      return absl::StrCat("SIZE MISMATCH (", actual_bytes, " bytes on disk)");
    }
    return "size ok";
  }
};

// Describes the checkpoint in `tag_directory` from its manifest and the
// rank files' sizes alone, so that a damaged checkpoint can be described
// too; with JSON, `partial` (the directory's incomplete saves) too.
// FailedPrecondition (after printing) when a file is missing or has another
// size than the manifest records.
absl::Status Inspect(const std::string& tag_directory, const Manifest& manifest,
                     const std::vector<PartialSave>& partial, bool as_json) {
  const nlohmann::json& state = manifest.training_state;
  std::vector<FileCheck> checks;
  int bad_files = 0;
  for (const FileRecord& file : manifest.files) {
    FileCheck check;
    check.record = &file;
    struct stat info;
    const std::string path = absl::StrCat(tag_directory, "/", file.name);
    if (stat(path.c_str(), &info) == 0) {
      check.present = true;
      check.actual_bytes = static_cast<uint64_t>(info.st_size);
    }
    if (!check.size_matches()) ++bad_files;
    checks.push_back(check);
  }
  constexpr const char* kStepKeys[] = {"global_steps", "skipped_steps",
                                       "micro_steps", "global_samples"};
  if (as_json) {
    nlohmann::ordered_json json;
    json["directory"] = tag_directory;
    json["tag"] = manifest.tag;
    json["format_version"] = manifest.format_version;
    json["saved_at"] = manifest.saved_at;
    json["world_size"] = manifest.world_size;
    json["zero_stage"] = manifest.zero_stage;
    json["model_dtype"] = DTypeName(manifest.model_dtype);
    json["kinds"] = manifest.kinds;
    for (const char* key : kStepKeys) {
      if (state.contains(key)) json[key] = state[key];
    }
    json["parameters"] = manifest.parameters.size();
    json["elements"] = Elements(manifest);
    json["training_state"] = state;
    nlohmann::ordered_json files = nlohmann::ordered_json::array();
    for (const FileCheck& check : checks) {
      files.push_back({{"name", check.record->name},
                       {"bytes", check.record->bytes},
                       {"crc32c", Crc32cToString(check.record->crc32c)},
                       {"present", check.present},
                       {"actual_bytes", check.actual_bytes},
                       {"size_matches", check.size_matches()}});
    }
    json["files"] = files;
    nlohmann::ordered_json partial_saves = nlohmann::ordered_json::array();
    for (const PartialSave& save : partial) {
      partial_saves.push_back(
          {{"path", save.path}, {"tag", save.tag}, {"bytes", save.bytes}});
    }
    json["partial_saves"] = partial_saves;
    std::printf("%s\n", json.dump().c_str());
  } else {
    std::printf("checkpoint %s (format version %d, saved %s)\n",
                tag_directory.c_str(), manifest.format_version,
                manifest.saved_at.c_str());
    std::printf("  tag %s, world size %d, ZeRO stage %d, model dtype %s\n",
                manifest.tag.c_str(), manifest.world_size, manifest.zero_stage,
                DTypeName(manifest.model_dtype));
    std::printf("  kinds: %s\n", absl::StrJoin(manifest.kinds, ", ").c_str());
    for (const char* key : kStepKeys) {
      if (state.contains(key)) {
        std::printf("  %s %s\n", key, state[key].dump().c_str());
      }
    }
    std::printf("  %zu parameters, %lld elements\n", manifest.parameters.size(),
                static_cast<long long>(Elements(manifest)));
    uint64_t bytes = 0;
    for (const FileCheck& check : checks) {
      std::printf("  %s  %llu bytes  %s  %s\n", check.record->name.c_str(),
                  static_cast<unsigned long long>(check.record->bytes),
                  Crc32cToString(check.record->crc32c).c_str(),
                  check.Describe().c_str());
      bytes += check.record->bytes;
    }
    std::printf(
        "  total %llu bytes (%.3f GB); run verify to check the checksums\n",
        static_cast<unsigned long long>(bytes), bytes / 1e9);
  }
  if (bad_files > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(bad_files, " of ", manifest.files.size(), " files of ",
                     tag_directory, " are missing or have the wrong size"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DType> ParseDType(const std::string& text) {
  if (text == "f32") return DType::kF32;
  if (text == "bf16") return DType::kBF16;
  if (text == "f16") return DType::kF16;
  return absl::InvalidArgumentError(
      absl::StrCat("--dtype=", text, ": use f32, bf16 or f16"));
}

// The conversion itself is nn/pretrained's (train_gpt --init_from uses
// it too); this reports what was written.
absl::Status ImportHuggingFaceGpt2(const std::string& hf_path,
                                   const std::string& out_path, DType dtype,
                                   int64_t vocab_size) {
  ZE_ASSIGN_OR_RETURN(
      nn::Gpt2Dims dims,
      nn::ConvertHuggingFaceGpt2File(hf_path, out_path, dtype, vocab_size));
  std::printf(
      "wrote %s: GPT-2 with %d layers, %lld channels, vocabulary %lld\n",
      out_path.c_str(), dims.num_layers, static_cast<long long>(dims.channels),
      static_cast<long long>(dims.vocab_size));
  return absl::OkStatus();
}

// The incomplete saves in `directory`, for inspect's text output.
void PrintPartialSaves(const std::vector<PartialSave>& partial,
                       const std::string& directory) {
  if (partial.empty()) return;
  std::printf(
      "incomplete saves in %s (left by saves that failed or were killed; "
      "removed by the next save or `ze_checkpoint clean %s`):\n",
      directory.c_str(), directory.c_str());
  for (const PartialSave& save : partial) {
    std::printf("  %s/  %llu bytes\n", save.path.c_str(),
                static_cast<unsigned long long>(save.bytes));
  }
}

absl::Status Clean(const std::string& directory) {
  ZE_ASSIGN_OR_RETURN(const std::vector<PartialSave> present,
                      ListPartialSaves(directory));  // NotFound: no DIR
  ZE_ASSIGN_OR_RETURN(const std::vector<PartialSave> removed,
                      RemovePartialSaves(directory));
  uint64_t bytes = 0;
  for (const PartialSave& save : removed) {
    std::printf("removed %s/  %llu bytes\n", save.path.c_str(),
                static_cast<unsigned long long>(save.bytes));
    bytes += save.bytes;
  }
  std::printf("%zu incomplete saves removed from %s, %llu bytes\n",
              removed.size(), directory.c_str(),
              static_cast<unsigned long long>(bytes));
  return absl::OkStatus();
}

// Prints `status` as the command's error; returns `code`.
int Fail(const std::string& command, const absl::Status& status, int code) {
  std::fprintf(stderr, "ze_checkpoint %s: %s\n", command.c_str(),
               std::string(status.message()).c_str());
  return code;
}

int Main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h" || arg == "help") {
      std::printf("%s\n%s", kUsage, kHelp);
      return 0;
    }
  }
  absl::StatusOr<Arguments> parsed =
      Parse(argc, argv,
            {"tag", "json", "out", "dtype", "format", "kind", "memory_limit",
             "vocab_size", "max_shard_size"});
  if (!parsed.ok()) {
    std::fprintf(stderr, "ze_checkpoint: %s\n%s",
                 std::string(parsed.status().message()).c_str(), kUsage);
    return kBadInput;
  }
  const Arguments& arguments = *parsed;
  const std::string& command = arguments.command;
  const std::string& directory = arguments.directory;
  if (command == "import-hf-gpt2") {
    absl::StatusOr<DType> dtype = ParseDType(Flag(arguments, "dtype", "f32"));
    int64_t vocab_size = 0;
    if (Flag(arguments, "out").empty() || !dtype.ok() ||
        !absl::SimpleAtoi(Flag(arguments, "vocab_size", "0"), &vocab_size)) {
      std::fprintf(stderr,
                   "ze_checkpoint import-hf-gpt2: needs --out, a "
                   "valid --dtype and --vocab_size\n%s",
                   kUsage);
      return kBadInput;
    }
    absl::Status status = ImportHuggingFaceGpt2(
        directory, Flag(arguments, "out"), *dtype, vocab_size);
    return status.ok() ? 0 : Fail(command, status, kBadInput);
  }
  if (command == "clean") {
    absl::Status status = Clean(directory);
    return status.ok() ? 0 : Fail(command, status, kBadInput);
  }
  if (command != "inspect" && command != "verify" && command != "consolidate") {
    std::fprintf(stderr, "ze_checkpoint: unknown command %s\n%s",
                 command.c_str(), kUsage);
    return kBadInput;
  }
  if (command == "inspect") {
    absl::StatusOr<std::vector<PartialSave>> partial =
        ListPartialSaves(directory);
    if (!partial.ok()) return Fail(command, partial.status(), kBadInput);
    const bool as_json = arguments.flags.count("json") > 0;
    absl::StatusOr<std::string> tag_directory =
        ResolveTagDirectory(directory, Flag(arguments, "tag"));
    absl::StatusOr<Manifest> manifest =
        tag_directory.ok() ? ReadManifest(*tag_directory)
                           : absl::StatusOr<Manifest>(tag_directory.status());
    if (!manifest.ok()) {
      // No checkpoint to describe; what a failed save left is still worth
      // knowing.
      if (!as_json) PrintPartialSaves(*partial, directory);
      return Fail(command, manifest.status(), kBadInput);
    }
    absl::Status status = Inspect(*tag_directory, *manifest, *partial, as_json);
    if (!as_json) PrintPartialSaves(*partial, directory);
    return status.ok() ? 0 : Fail(command, status, kCheckFailed);
  }

  ConsolidateOptions options;
  if (command == "consolidate") {
    options.output_path = Flag(arguments, "out");
    options.kind = Flag(arguments, "kind");
    const std::string dtype = Flag(arguments, "dtype", "f32");
    const std::string format = Flag(arguments, "format", "native");
    if (options.output_path.empty() ||
        (dtype != "f32" && dtype != "bf16" && dtype != "f16") ||
        (format != "native" && format != "hf-gpt2" && format != "hf") ||
        !absl::SimpleAtoi(Flag(arguments, "max_shard_size", "0"),
                          &options.max_shard_bytes) ||
        !absl::SimpleAtoi(Flag(arguments, "memory_limit", "0"),
                          &options.memory_limit_bytes) ||
        options.memory_limit_bytes < 0 ||
        !absl::SimpleAtoi(Flag(arguments, "vocab_size", "0"),
                          &options.vocab_size) ||
        options.vocab_size < 0) {
      std::fprintf(stderr,
                   "ze_checkpoint consolidate: needs --out, and --dtype, "
                   "--format, --memory_limit, --vocab_size, --max_shard_size "
                   "must be valid\n%s",
                   kUsage);
      return kBadInput;
    }
    options.dtype = dtype == "f32"    ? DType::kF32
                    : dtype == "bf16" ? DType::kBF16
                                      : DType::kF16;
    options.format = format == "native"    ? ConsolidateFormat::kNative
                     : format == "hf-gpt2" ? ConsolidateFormat::kHfGpt2
                                           : ConsolidateFormat::kHf;
  }
  // What a missing directory, tag or manifest is: input that is not a
  // checkpoint (2) for either command.
  absl::StatusOr<std::string> tag_directory =
      ResolveTagDirectory(directory, Flag(arguments, "tag"));
  const absl::Status found = tag_directory.ok()
                                 ? ReadManifest(*tag_directory).status()
                                 : tag_directory.status();
  if (!found.ok()) return Fail(command, found, kBadInput);
  // Open checks the manifest, every file's presence, size and header: for
  // verify, a missing or truncated file is the check failing.
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(directory, Flag(arguments, "tag"));
  if (!reader.ok()) {
    return Fail(command, reader.status(),
                command == "verify" ? kCheckFailed : kBadInput);
  }
  if (command == "verify") {
    bool all_ok = true;
    for (const FileRecord& file : (*reader)->manifest().files) {
      // One file at a time, so every bad file is listed.
      absl::Status file_status =
          (*reader)->VerifyFiles((*reader)->manifest().world_size, file.rank);
      if (file_status.ok()) {
        std::printf("OK  %s %s, %llu bytes\n", file.name.c_str(),
                    Crc32cToString(file.crc32c).c_str(),
                    static_cast<unsigned long long>(file.bytes));
      } else {
        std::printf("BAD %s\n", std::string(file_status.message()).c_str());
      }
      all_ok = all_ok && file_status.ok();
    }
    if (!all_ok) return kCheckFailed;
    std::printf("verified %zu files of %s\n",
                (*reader)->manifest().files.size(),
                (*reader)->tag_directory().c_str());
    return 0;
  }
  if (options.memory_limit_bytes > 0) {
    // The limit is the host allocator's cap too (every tensor the
    // consolidation holds comes from it), so exceeding it fails loudly
    // instead of merely being reported. The allocator rounds each buffer
    // up to 256 bytes and consolidation holds at most two at once, which
    // the limit (compared with exact sizes) does not count.
    constexpr int64_t kAllocatorRounding = 2 * 256;
    HostMemory()->SetByteCap(HostMemory()->stats().bytes_in_use +
                             options.memory_limit_bytes + kAllocatorRounding);
  }
  absl::StatusOr<ConsolidateReport> report = Consolidate(**reader, options);
  // A corrupt or incomplete checkpoint, a kind it lacks, a limit it
  // exceeds, an output that cannot be written: the input's fault.
  if (!report.ok()) return Fail(command, report.status(), kBadInput);
  std::printf(
      "wrote %s: %lld parameters, %lld tensor bytes, at most %lld bytes "
      "of values held at once\n",
      options.output_path.c_str(), static_cast<long long>(report->parameters),
      static_cast<long long>(report->bytes_written),
      static_cast<long long>(report->peak_value_bytes));
  return 0;
}

}  // namespace
}  // namespace checkpoint
}  // namespace ze

int main(int argc, char** argv) { return ze::checkpoint::Main(argc, argv); }
