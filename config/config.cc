// The public API of config.h: loading, printing and the generated
// reference. The pieces live by concept: codec.h (typed values), schema.h
// (fields and tables), schema.cc, sections.cc and typed_sections.cc (the tables
// and the equality derived from them), validate.cc (cross-key rules, batch
// triple), resolve.cc ("auto").
#include "config/config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "config/schema.h"
#include "config/sections.h"
#include "config/strict_json.h"
#include "config/validate.h"

namespace ze {
namespace config {

using internal::Json;
using internal::MarkdownTable;
using internal::OptimizerParamsSchema;
using internal::ReferenceRow;
using internal::SchedulerParamsSchema;

const char* OptimizerTypeName(OptimizerType type) {
  switch (type) {
    case OptimizerType::kAdam:
      return "Adam";
    case OptimizerType::kAdamW:
      return "AdamW";
    case OptimizerType::kSgd:
      return "SGD";
  }
  return "?";
}

const char* SchedulerTypeName(SchedulerType type) {
  switch (type) {
    case SchedulerType::kWarmupLR:
      return "WarmupLR";
    case SchedulerType::kWarmupDecayLR:
      return "WarmupDecayLR";
    case SchedulerType::kWarmupCosineLR:
      return "WarmupCosineLR";
    case SchedulerType::kOneCycle:
      return "OneCycle";
  }
  return "?";
}

const char* OffloadDeviceName(OffloadDevice device) {
  switch (device) {
    case OffloadDevice::kNone:
      return "none";
    case OffloadDevice::kCpu:
      return "cpu";
    case OffloadDevice::kNvme:
      return "nvme";
  }
  return "?";
}

bool OptimizerConfig::DecoupledWeightDecay() const {
  switch (type) {
    case OptimizerType::kAdamW:
      return true;
    case OptimizerType::kAdam:
      return params.adam_w_mode;
    case OptimizerType::kSgd:
      return false;
  }
  return false;
}

TrainingPrecision GetTrainingPrecision(const Config& config) {
  if (config.bf16.enabled.value()) return TrainingPrecision::kBf16;
  if (config.fp16.enabled.value()) return TrainingPrecision::kFp16;
  return TrainingPrecision::kFp32;
}

DType PrecisionDType(TrainingPrecision precision) {
  switch (precision) {
    case TrainingPrecision::kBf16:
      return DType::kBF16;
    case TrainingPrecision::kFp16:
      return DType::kF16;
    case TrainingPrecision::kFp32:
      break;
  }
  return DType::kF32;
}

TrainingPrecision PrecisionOfDType(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return TrainingPrecision::kBf16;
    case DType::kF16:
      return TrainingPrecision::kFp16;
    default:
      return TrainingPrecision::kFp32;
  }
}

DType CommDataTypeDType(CommDataType type) {
  switch (type) {
    case CommDataType::kFp16:
      return DType::kF16;
    case CommDataType::kBf16:
      return DType::kBF16;
    case CommDataType::kFp32:
      break;
  }
  return DType::kF32;
}

absl::StatusOr<Config> LoadConfigString(absl::string_view json_text,
                                        int world_size,
                                        absl::string_view source_name) {
  ZE_ASSIGN_OR_RETURN(Json json,
                      ParseJsonRejectingDuplicates(json_text, source_name));
  return internal::ParseAndValidate(json, world_size, source_name);
}

absl::StatusOr<Config> LoadConfigFile(const std::string& path, int world_size) {
  // An ifstream opens a directory without complaint and then reads nothing,
  // which would surface as "invalid JSON" at line 1.
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path,
        ": is a directory, not a config file; pass the path of the "
        "ds_config JSON file itself"));
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot open the config file"));
  }
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) {
    return absl::DataLossError(
        absl::StrCat(path, ": reading the config file failed"));
  }
  return LoadConfigString(text.str(), world_size, path);
}

absl::StatusOr<Config> LoadConfigJson(const nlohmann::json& json,
                                      int world_size,
                                      absl::string_view source_name) {
  // Re-reading the dump gives the ordered representation the loader walks;
  // configs are small.
  return internal::ParseAndValidate(Json::parse(json.dump()), world_size,
                                    source_name);
}

std::string ToJson(const Config& config) {
  return internal::TopSchema().Emit(config).dump(2);
}

std::vector<ConfigWarning> ConfigWarnings(const Config& config) {
  std::vector<ConfigWarning> warnings = config.load_warnings;
  internal::TopSchema().Ineffective("", config, Config{}, &warnings);
  if (config.zero_optimization.offload_param.device == OffloadDevice::kNvme) {
    // offload_param's swap settings act with device "nvme" (the schema marks
    // them for every other device).
    const std::string prefix = "zero_optimization.offload_param.";
    warnings.erase(
        std::remove_if(warnings.begin(), warnings.end(),
                       [&prefix](const ConfigWarning& warning) {
                         return warning.key == prefix + "buffer_count" ||
                                warning.key == prefix + "buffer_size" ||
                                warning.key == prefix + "max_in_cpu";
                       }),
        warnings.end());
  }
  return warnings;
}

std::string ReferenceMarkdown() {
  std::string out =
      "Keys follow DeepSpeed's `ds_config.json`: same names, meanings and "
      "defaults. This reference is generated from the code "
      "(`config/print_reference`).\n"
      "\n## What loads: errors and warnings\n\n"
      "A config that DeepSpeed 0.19.8's own parser accepts loads here too "
      "(after Hugging Face fills `\"auto\"`): of the 42 public ds_config "
      "files in `config/testdata/realworld/` (`SOURCES.md` says from where), "
      "DeepSpeed accepts 36 at world size 2 and so does zero-engine; the "
      "other 6 both reject, naming the same key "
      "(`config:realworld_configs_test` holds each file's verdict). Every "
      "problem of a file is reported at once, one line each, naming the file "
      "and the JSON path; the rules between keys run in the same pass.\n"
      "\n"
      "Errors (DeepSpeed rejects these too): unknown keys in the sections "
      "DeepSpeed validates (`fp16`, `bf16`, `zero_optimization` and its "
      "offload blocks, `csv_monitor`; with \"did you mean\" for a near "
      "miss), wrong types and out-of-range values (`fp16.min_loss_scale` is "
      "an integer), a ZeRO key given in two spellings (an alias and its "
      "canonical name, or a deprecated key and its replacement), features "
      "DeepSpeed 0.19.8 removed, and an inconsistent batch triple.\n"
      "\n"
      "Errors where DeepSpeed is silent: duplicate keys (its JSON parser "
      "keeps the last); a near miss of a known key where DeepSpeed ignores "
      "unknown keys (`zero_optimisation` at the top level: \"did you "
      "mean\"); both `bf16` and `bfloat16` (DeepSpeed reads `bf16`); "
      "`offload_param` below stage 3 and any offload at stage 0, which "
      "DeepSpeed ignores although the user believes memory is saved; "
      "fp16 and bf16 both enabled; `communication_data_type` fp16 without "
      "fp16 training; nvme offload without `nvme_path`; a JSON number that "
      "overflows a double.\n"
      "\n"
      "Warnings (Initialize logs them on rank 0, `check_config` prints them; "
      "the config loads): keys DeepSpeed reads that zero-engine checks and "
      "ignores, keys accepted without effect, deprecated spellings DeepSpeed "
      "still reads (`cpu_offload`: read as `offload_optimizer.device` "
      "\"cpu\"), and keys that neither reads where DeepSpeed ignores "
      "unknown keys (the top level, `aio`, `activation_checkpointing`, "
      "`checkpoint`) unless they are a near miss. Each warning "
      "names the key and why; a key at the value that changes nothing (a "
      "section with `\"enabled\": false`) is silent.\n"
      "\n"
      "Values marked `\"auto\"` are filled in from the model and run where "
      "Hugging Face's Trainer (or accelerate) fills them.\n"
      "\n## Top level and sections\n\n";
  std::vector<ReferenceRow> rows;
  internal::TopSchema().Rows("", Config{}, &rows);
  absl::StrAppend(&out, MarkdownTable(rows));
  std::vector<std::string> notes;
  internal::TopSchema().Notes("", &notes);
  absl::StrAppend(&out,
                  "\nAliases, DeepSpeed keys zero-engine rejects, keys it "
                  "accepts without effect, and keys it accepts and ignores "
                  "(Initialize logs a warning on rank 0 for each that a "
                  "config sets, and `check_config` prints them):\n\n",
                  absl::StrJoin(notes, "\n"), "\n");

  absl::StrAppend(&out,
                  "\n## optimizer\n\nWithout an `optimizer` section the "
                  "client supplies the optimizer. `optimizer.params` by "
                  "`optimizer.type`:\n");
  for (OptimizerType type : {OptimizerType::kAdam, OptimizerType::kSgd}) {
    rows.clear();
    OptimizerParamsSchema(type).Rows("optimizer.params", OptimizerParams{},
                                     &rows);
    absl::StrAppend(&out, "\n### ",
                    type == OptimizerType::kSgd ? "SGD" : "Adam, AdamW", "\n\n",
                    MarkdownTable(rows));
  }

  absl::StrAppend(&out,
                  "\n## scheduler\n\nWithout a `scheduler` section the "
                  "learning rate is constant. `scheduler.params` by "
                  "`scheduler.type`:\n");
  for (SchedulerType type :
       {SchedulerType::kWarmupLR, SchedulerType::kWarmupDecayLR,
        SchedulerType::kWarmupCosineLR, SchedulerType::kOneCycle}) {
    rows.clear();
    SchedulerParamsSchema(type).Rows("scheduler.params", SchedulerParams{},
                                     &rows);
    absl::StrAppend(&out, "\n### ", SchedulerTypeName(type), "\n\n",
                    MarkdownTable(rows));
  }
  return out;
}

}  // namespace config
}  // namespace ze
