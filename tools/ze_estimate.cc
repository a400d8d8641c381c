// ze_estimate: how much memory each rank needs for model state, by ZeRO
// stage and offload choice, before anything is allocated (DeepSpeed's
// estimate_zero{2,3}_model_states_mem_needs, per rank and per placement).
//
//   ze_estimate --params=13e9 --world_size=8 [--dtype=bf16|fp16|f32]
//       [--optimizer=adamw|sgd] [--json]
//   ze_estimate --model=1.3B|124M|...|tiny --world_size=8 [--config=FILE]
//       [--json]
//
// With --params: the ZeRO paper's formulas (16 Psi, 4 Psi + 12 Psi / N,
// 2 Psi + 14 Psi / N, 16 Psi / N for mixed-precision Adam), split by where
// offload puts each part. With --model: the engine's own plan
// (zero/plan.h PlanMemory: the real layout with its padding), exactly what
// Initialize reports and allocates for that model and config at that world
// size; the config's stage and offload are replaced row by row. Prints a
// table (GiB per rank: GPU, host with its pinned part, NVMe), or one JSON
// object per row with --json (bytes). Exit 0, 1 on error, 2 bad usage.
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "config/config.h"
#include "core/status.h"
#include "nlohmann/json.hpp"
#include "nn/gpt.h"
#include "zero/memory_estimate.h"
#include "zero/plan.h"

namespace ze {
namespace {

constexpr char kUsage[] =
    "usage: ze_estimate --params=N --world_size=W [--dtype=bf16|fp16|f32] "
    "[--optimizer=adamw|sgd] [--json]\n"
    "       ze_estimate --model=NAME --world_size=W [--config=FILE] [--json]\n";

struct Row {
  int stage = 0;
  std::string offload;  // none, cpu, cpu+param, nvme
  int64_t device = 0, host = 0, pinned = 0, nvme = 0;
  double paper = 0;  // the paper's model-state figure (placement aside)
};

// The offload choices shown for `stage` (offload_optimizer needs stage >= 1;
// offload_param and this build's NVMe, stage 3).
std::vector<std::string> OffloadChoices(int stage) {
  if (stage == 0) return {"none"};
  if (stage < 3) return {"none", "cpu"};
  return {"none", "cpu", "cpu+param", "nvme"};
}

// The paper's per-rank bytes, placed: offloaded optimizer state (f32 master
// and moments) goes to the host with a 16-bit staging copy of the rank's
// gradients (pinned), or to NVMe; offloaded parameters go to the host.
absl::StatusOr<Row> PaperRow(double psi, int world, int stage,
                             const std::string& offload,
                             config::TrainingPrecision precision,
                             int64_t state_bytes) {
  ZE_ASSIGN_OR_RETURN(
      zero::ModelStateBytes bytes,
      zero::PaperModelStateBytes(static_cast<int64_t>(psi), world, stage,
                                 precision, state_bytes));
  Row row;
  row.stage = stage;
  row.offload = offload;
  row.paper = static_cast<double>(bytes.total());
  const int64_t own = stage == 0 ? static_cast<int64_t>(psi)
                                 : static_cast<int64_t>(std::ceil(psi / world));
  const int64_t element_bytes =
      precision == config::TrainingPrecision::kFp32 ? 4 : 2;
  row.device = bytes.total();
  if (offload == "none") return row;
  const int64_t staging = element_bytes * own;
  row.device -= bytes.optimizer_states;
  if (offload == "nvme") {
    row.nvme = bytes.optimizer_states;
    row.host = staging;
  } else {
    row.host = bytes.optimizer_states + staging;
  }
  row.pinned = staging;
  if (offload == "cpu+param") {
    row.device -= bytes.params;
    row.host += bytes.params;
    row.pinned += bytes.params;
  }
  return row;
}

std::string GiB(double bytes) {
  return absl::StrFormat("%.2f", bytes / (1024.0 * 1024.0 * 1024.0));
}

void Print(const std::vector<Row>& rows, bool json, const std::string& what) {
  if (json) {
    for (const Row& row : rows) {
      nlohmann::ordered_json line;
      line["estimate"] = what;
      line["stage"] = row.stage;
      line["offload"] = row.offload;
      line["device_bytes"] = row.device;
      line["host_bytes"] = row.host;
      line["pinned_host_bytes"] = row.pinned;
      line["nvme_bytes"] = row.nvme;
      line["paper_bytes"] = row.paper;
      std::printf("%s\n", line.dump().c_str());
    }
    return;
  }
  std::printf("%s\nper rank, GiB:\n", what.c_str());
  std::printf("%-6s %-10s %10s %10s %10s %10s %14s\n", "stage", "offload",
              "GPU", "host", "(pinned)", "NVMe", "paper (total)");
  for (const Row& row : rows) {
    std::printf("%-6d %-10s %10s %10s %10s %10s %14s\n", row.stage,
                row.offload.c_str(), GiB(row.device).c_str(),
                GiB(row.host).c_str(), GiB(row.pinned).c_str(),
                GiB(row.nvme).c_str(), GiB(row.paper).c_str());
  }
}

absl::Status FromNumbers(const std::map<std::string, std::string>& flags,
                         int world, bool json) {
  double psi = 0;
  if (!absl::SimpleAtod(flags.at("params"), &psi) || psi < 1) {
    return absl::InvalidArgumentError("--params must be a positive number");
  }
  const std::string dtype =
      flags.count("dtype") ? flags.at("dtype") : std::string("bf16");
  const std::string optimizer =
      flags.count("optimizer") ? flags.at("optimizer") : std::string("adamw");
  config::TrainingPrecision precision;
  if (dtype == "bf16") {
    precision = config::TrainingPrecision::kBf16;
  } else if (dtype == "fp16") {
    precision = config::TrainingPrecision::kFp16;
  } else if (dtype == "f32") {
    precision = config::TrainingPrecision::kFp32;
  } else {
    return absl::InvalidArgumentError("--dtype must be bf16, fp16 or f32");
  }
  if (optimizer != "adamw" && optimizer != "sgd") {
    return absl::InvalidArgumentError("--optimizer must be adamw or sgd");
  }
  const int64_t state_bytes = optimizer == "adamw" ? 8 : 4;  // SGD: momentum
  std::vector<Row> rows;
  for (int stage = 0; stage <= 3; ++stage) {
    for (const std::string& offload : OffloadChoices(stage)) {
      ZE_ASSIGN_OR_RETURN(Row row, PaperRow(psi, world, stage, offload,
                                            precision, state_bytes));
      rows.push_back(row);
    }
  }
  Print(
      rows, json,
      absl::StrFormat("ZeRO paper formulas: %.4g parameters, %d ranks, %s, %s",
                      psi, world, dtype, optimizer));
  return absl::OkStatus();
}

constexpr char kDefaultConfig[] = R"({
  "train_micro_batch_size_per_gpu": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 0}
})";

absl::Status FromModel(const std::map<std::string, std::string>& flags,
                       int world, bool json) {
  const std::string name = flags.at("model");
  ZE_ASSIGN_OR_RETURN(config::Config config,
                      flags.count("config")
                          ? config::LoadConfigFile(flags.at("config"), world)
                          : config::LoadConfigString(kDefaultConfig, world));
  nn::GptConfig gpt;
  if (name == "tiny") {
    gpt.num_layers = 4;
    gpt.num_heads = 4;
    gpt.channels = 128;
    gpt.vocab_size = 256;
    gpt.max_seq_len = 64;
  } else {
    ZE_ASSIGN_OR_RETURN(gpt, nn::GptConfig::Preset(name, /*pad_vocab=*/true));
  }
  nn::GptOptions options;
  options.materialize = false;  // shapes only
  const config::TrainingPrecision precision =
      config::GetTrainingPrecision(config);
  options.dtype = precision == config::TrainingPrecision::kBf16   ? DType::kBF16
                  : precision == config::TrainingPrecision::kFp16 ? DType::kF16
                                                                  : DType::kF32;
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptModel> model,
                      nn::GptModel::Create(gpt, options));
  std::vector<Row> rows;
  for (int stage = 0; stage <= 3; ++stage) {
    for (const std::string& offload : OffloadChoices(stage)) {
      config::Config variant = config;
      variant.zero_optimization.stage = stage;
      auto& optimizer = variant.zero_optimization.offload_optimizer;
      auto& param = variant.zero_optimization.offload_param;
      optimizer.device = offload == "none"   ? config::OffloadDevice::kNone
                         : offload == "nvme" ? config::OffloadDevice::kNvme
                                             : config::OffloadDevice::kCpu;
      optimizer.pin_memory = true;
      param.device = offload == "cpu+param" ? config::OffloadDevice::kCpu
                                            : config::OffloadDevice::kNone;
      ZE_ASSIGN_OR_RETURN(zero::MemoryBreakdown plan,
                          zero::PlanMemory(*model, variant, world));
      Row row;
      row.stage = stage;
      row.offload = offload;
      row.device = plan.device_bytes;
      row.host = plan.host_bytes;
      row.pinned = plan.pinned_host_bytes;
      row.nvme = plan.nvme_bytes;
      row.paper = plan.paper_bytes;
      rows.push_back(row);
    }
  }
  Print(rows, json,
        absl::StrFormat("engine plan (zero/plan.h): GPT %s, %d parameters, "
                        "%d ranks, %s",
                        name, gpt.NumParameters(), world,
                        DTypeName(options.dtype)));
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t equals = arg.find('=');
    if (arg.rfind("--", 0) != 0) {
      std::fprintf(stderr, "ze_estimate: unexpected argument %s\n%s",
                   arg.c_str(), kUsage);
      return 2;
    }
    flags[arg.substr(
        2, equals == std::string::npos ? std::string::npos : equals - 2)] =
        equals == std::string::npos ? "1" : arg.substr(equals + 1);
  }
  for (const auto& [name, value] : flags) {
    if (name != "params" && name != "model" && name != "world_size" &&
        name != "dtype" && name != "optimizer" && name != "config" &&
        name != "json") {
      std::fprintf(stderr, "ze_estimate: unknown flag --%s\n%s", name.c_str(),
                   kUsage);
      return 2;
    }
  }
  int world = 0;
  if (!flags.count("world_size") ||
      !absl::SimpleAtoi(flags["world_size"], &world) || world < 1 ||
      flags.count("params") + flags.count("model") != 1) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  const bool json = flags.count("json") > 0;
  const absl::Status status = flags.count("params")
                                  ? FromNumbers(flags, world, json)
                                  : FromModel(flags, world, json);
  if (!status.ok()) {
    std::fprintf(stderr, "ze_estimate: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace ze

int main(int argc, char** argv) { return ze::Main(argc, argv); }
