// ze_estimate: how much memory each rank needs for model state, by ZeRO
// stage and offload choice, before anything is allocated (DeepSpeed's
// estimate_zero{2,3}_model_states_mem_needs, per rank and per placement).
//
//   ze_estimate --params=13e9|7B|350M --world_size=8 [--dtype=bf16|fp16|f32]
//       [--optimizer=adamw|sgd] [--json]
//   ze_estimate --model=1.3B|124M|...|tiny --world_size=8 [--json]
//   either, with --config=ds_config.json: that config's row only
//
// With --params: the ZeRO paper's formulas (16 Psi, 4 Psi + 12 Psi / N,
// 2 Psi + 14 Psi / N, 16 Psi / N for mixed-precision Adam), split by where
// offload puts each part. With --model: the engine's own plan
// (zero/plan.h PlanMemory: the real layout with its padding), exactly what
// Initialize reports and allocates for that model and config at that world
// size. Without --config every stage and offload choice is a row; with it,
// only the config's own (its stage, offload_optimizer and offload_param,
// precision and optimizer; the world size from --world_size or else from
// its batch triple). Prints a table (GiB per rank: GPU, host with its
// pinned part, NVMe), or one JSON object per row with --json (bytes). The
// "nvmeparam" rows put the 16-bit weights on NVMe too (offload_param nvme;
// without --config, max_in_cpu 0: none kept in CPU memory, and buffer_size
// at least the largest bucket; the engine plan then counts the swap buffers
// as pinned host bytes). With --model and --config the one row is followed
// by where each part lives (GPU: weights, gradients, master and optimizer
// state; host: the offloaded master and state, weights, staging, swap
// buffers, speculation backup; NVMe: state and weights), and --json adds
// them as "placement" (zero/reports.h MemoryBreakdown's parts).
// Exit status: 0 printed, 2 bad input (the message names the flag or the
// config file and key); --help prints the usage.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "config/config.h"
#include "core/status.h"
#include "nlohmann/json.hpp"
#include "nn/gpt.h"
#include "zero/memory_estimate.h"
#include "zero/optimizer.h"
#include "zero/plan.h"
#include "zero/stage_policy.h"

namespace ze {
namespace {

// " with the 16+16 master (2 bytes)", " with bf16 moments (4 bytes)", ...:
// the state formats a config chooses, for the engine plan's title.
std::string MasterAndMomentsNote(const std::optional<config::Config>& config) {
  if (!config.has_value()) return "";
  std::string note;
  if (config->bf16.master_weights_16_plus_16) {
    note += " with the 16+16 master (2 bytes)";
  }
  const char* moments = config->optimizer.has_value() &&
                                config->optimizer->params.blockwise_8bit_moments
                            ? "8-bit block-wise moments (2 bytes + 8 per 256)"
                        : config->bf16.bf16_optimizer_states
                            ? "bf16 moments (4 bytes)"
                            : nullptr;
  if (moments != nullptr) {
    note += note.empty() ? " with " : " and ";
    note += moments;
  }
  return note;
}

constexpr char kUsage[] =
    "usage: ze_estimate --params=N --world_size=W [--dtype=bf16|fp16|f32] "
    "[--optimizer=adamw|sgd] [--json]\n"
    "       ze_estimate --model=NAME --world_size=W [--json]\n"
    "       either with --config=DS_CONFIG.json [--world_size=W]\n";

constexpr char kHelp[] =
    "Per-rank memory for model state (weights, gradients, optimizer state)\n"
    "by ZeRO stage and offload, before anything is allocated.\n"
    "\n"
    "  --params=N       parameter count: 13e9, 7B, 1.3B, 350M, 125K, 2T\n"
    "                   (the ZeRO paper's formulas)\n"
    "  --model=NAME     a GPT preset (124M, 350M, 760M, 1.3B, 2.7B, 6.7B, "
    "13B, 25B)\n"
    "                   or tiny: the engine's own plan, padding included\n"
    "  --world_size=W   ranks (1 to 1000000); with --config, defaults to\n"
    "                   train_batch_size / (micro batch x accumulation)\n"
    "  --config=FILE    a DeepSpeed config: only its own stage, offload,\n"
    "                   precision and optimizer are shown (\"auto\" values\n"
    "                   that do not change memory are not needed)\n"
    "  --dtype=D        bf16 (default), fp16 or f32; with --config only where\n"
    "                   its precision is \"auto\"\n"
    "  --optimizer=O    adamw (default) or sgd; with --config only where it\n"
    "                   names no optimizer\n"
    "  --json           one JSON object per row, in bytes\n"
    "  --help           this text\n"
    "\n"
    "Exit status: 0 printed, 2 bad input (the message names the flag, or the\n"
    "config file and key).\n";

struct Row {
  int stage = 0;
  // none, cpu, cpu+param, param, nvme, nvme+param, nvme+nvmeparam, ...
  // (cpu0.6+nvmeparam: offload_optimizer's ratio where it is below 1)
  std::string offload;
  int64_t device = 0, host = 0, pinned = 0, nvme = 0;
  double paper = 0;  // the paper's model-state figure (placement aside)
  // The engine plan's breakdown (--model only): where each part lives.
  std::optional<zero::MemoryBreakdown> plan;
};

// Bad input: exit 2 with the message, which names the flag or file.
absl::Status BadFlag(const std::string& flag, const std::string& value,
                     const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, "=", value, ": ", why));
}

// One stage and offload combination (a row).
struct Choice {
  int stage = 0;
  config::OffloadDevice optimizer = config::OffloadDevice::kNone;
  config::OffloadDevice param = config::OffloadDevice::kNone;
  // offload_optimizer.ratio (--config only): the share of the optimizer
  // state offloaded, the rest staying on the device.
  double ratio = 1.0;
};

std::string OffloadName(const Choice& choice) {
  using config::OffloadDevice;
  std::string name = choice.optimizer == OffloadDevice::kNvme  ? "nvme"
                     : choice.optimizer == OffloadDevice::kCpu ? "cpu"
                                                               : "";
  if (!name.empty() && choice.ratio < 1.0) {
    absl::StrAppend(&name, absl::StrFormat("%g", choice.ratio));
  }
  if (choice.param != OffloadDevice::kNone) {
    const char* param =
        choice.param == OffloadDevice::kNvme ? "nvmeparam" : "param";
    name = name.empty() ? param : name + "+" + param;
  }
  return name.empty() ? "none" : name;
}

// Every combination shown without --config (offload_optimizer needs stage
// >= 1; offload_param and this build's NVMe, stage 3). The NVMe parameter
// row keeps nothing in CPU memory (max_in_cpu 0; DeepSpeed's default 1e9
// would keep a small model's parameters on the host).
std::vector<Choice> AllChoices() {
  using config::OffloadDevice;
  std::vector<Choice> choices = {
      {0}, {1}, {1, OffloadDevice::kCpu}, {2}, {2, OffloadDevice::kCpu}};
  choices.push_back({3});
  choices.push_back({3, OffloadDevice::kCpu});
  choices.push_back({3, OffloadDevice::kCpu, OffloadDevice::kCpu});
  choices.push_back({3, OffloadDevice::kNvme});
  choices.push_back({3, OffloadDevice::kNvme, OffloadDevice::kNvme});
  return choices;
}

// What every row shares.
struct Setup {
  int world = 0;
  config::TrainingPrecision precision = config::TrainingPrecision::kBf16;
  std::string optimizer = "adamw";  // for the title
  int64_t state_bytes = 8;          // optimizer state per element
  std::vector<Choice> choices = AllChoices();
  std::optional<config::Config> config;  // --config, loaded
  std::string from_config;               // the title's note on --config
};

const char* PrecisionName(config::TrainingPrecision precision) {
  switch (precision) {
    case config::TrainingPrecision::kBf16:
      return "bf16";
    case config::TrainingPrecision::kFp16:
      return "fp16";
    default:
      return "f32";
  }
}

// The paper's per-rank bytes, placed: offloaded optimizer state (f32 master
// and moments) goes to the host with a 16-bit staging copy of the rank's
// gradients (pinned), or to NVMe; offloaded parameters (stage 3) go to the
// host, pinned, or to NVMe.
absl::StatusOr<Row> PaperRow(double psi, const Setup& setup,
                             const Choice& choice) {
  ZE_ASSIGN_OR_RETURN(zero::ModelStateBytes bytes,
                      zero::PaperModelStateBytes(
                          static_cast<int64_t>(psi), setup.world, choice.stage,
                          setup.precision, setup.state_bytes));
  Row row;
  row.stage = choice.stage;
  row.offload = OffloadName(choice);
  row.paper = static_cast<double>(bytes.total());
  const int64_t own =
      zero::StagePolicy::ForStage(choice.stage).partition_optimizer
          ? static_cast<int64_t>(std::ceil(psi / setup.world))
          : static_cast<int64_t>(psi);
  const int64_t element_bytes =
      setup.precision == config::TrainingPrecision::kFp32 ? 4 : 2;
  row.device = bytes.total();
  if (choice.optimizer != config::OffloadDevice::kNone) {
    // `ratio` of the state (and of the staging its gradients travel
    // through) offloaded, the rest on the device: the formula's share, not
    // whole buckets as the engine plan takes them.
    const int64_t offloaded = static_cast<int64_t>(std::llround(
        choice.ratio * static_cast<double>(bytes.optimizer_states)));
    const int64_t staging = static_cast<int64_t>(
        std::llround(choice.ratio * static_cast<double>(element_bytes * own)));
    row.device -= offloaded;
    if (choice.optimizer == config::OffloadDevice::kNvme) {
      row.nvme = offloaded;
      row.host = staging;
    } else {
      row.host = offloaded + staging;
    }
    row.pinned = staging;
  }
  if (choice.param == config::OffloadDevice::kCpu) {
    row.device -= bytes.params;
    row.host += bytes.params;
    row.pinned += bytes.params;
  } else if (choice.param == config::OffloadDevice::kNvme) {
    row.device -= bytes.params;
    row.nvme += bytes.params;
  }
  return row;
}

std::string GiB(double bytes) {
  return absl::StrFormat("%.2f", bytes / (1024.0 * 1024.0 * 1024.0));
}

void Print(const std::vector<Row>& rows, bool json, const std::string& what,
           int world) {
  if (json) {
    for (const Row& row : rows) {
      nlohmann::ordered_json line;
      line["estimate"] = what;
      line["world_size"] = world;
      line["stage"] = row.stage;
      line["offload"] = row.offload;
      line["device_bytes"] = row.device;
      line["host_bytes"] = row.host;
      line["pinned_host_bytes"] = row.pinned;
      line["nvme_bytes"] = row.nvme;
      line["paper_bytes"] = row.paper;
      if (row.plan.has_value()) {
        // MemoryBreakdown's parts (zero/reports.h: they add up to the
        // totals above).
        const zero::MemoryBreakdown& plan = *row.plan;
        line["placement"] = {
            {"device_weight_bytes", plan.device_weight_bytes},
            {"host_weight_bytes", plan.host_weight_bytes},
            {"nvme_weight_bytes", plan.nvme_weight_bytes},
            {"gradient_bytes", plan.gradient_bytes},
            {"device_optimizer_bytes", plan.device_optimizer_bytes},
            {"host_optimizer_bytes", plan.host_optimizer_bytes},
            {"nvme_optimizer_bytes", plan.nvme_optimizer_bytes},
            {"staging_bytes", plan.staging_bytes},
            {"swap_buffer_bytes", plan.swap_buffer_bytes},
            {"speculation_bytes", plan.speculation_bytes}};
      }
      std::printf("%s\n", line.dump().c_str());
    }
    return;
  }
  std::printf("%s\nper rank, GiB:\n", what.c_str());
  std::printf("%-6s %-14s %10s %10s %10s %10s %14s\n", "stage", "offload",
              "GPU", "host", "(pinned)", "NVMe", "paper (total)");
  for (const Row& row : rows) {
    std::printf("%-6d %-14s %10s %10s %10s %10s %14s\n", row.stage,
                row.offload.c_str(), GiB(row.device).c_str(),
                GiB(row.host).c_str(), GiB(row.pinned).c_str(),
                GiB(row.nvme).c_str(), GiB(row.paper).c_str());
  }
  if (rows.size() == 1 && rows[0].plan.has_value()) {
    // One config's row: where each part of it lives.
    const zero::MemoryBreakdown& plan = *rows[0].plan;
    std::printf(
        "GPU = weights %s + gradients %s + master and optimizer state %s\n"
        "host = master and optimizer state %s + weights %s + transfer "
        "staging %s + swap buffers %s + speculation backup %s\n"
        "NVMe = master and optimizer state %s + weights %s\n",
        GiB(plan.device_weight_bytes).c_str(), GiB(plan.gradient_bytes).c_str(),
        GiB(plan.device_optimizer_bytes).c_str(),
        GiB(plan.host_optimizer_bytes).c_str(),
        GiB(plan.host_weight_bytes).c_str(), GiB(plan.staging_bytes).c_str(),
        GiB(plan.swap_buffer_bytes).c_str(),
        GiB(plan.speculation_bytes).c_str(),
        GiB(plan.nvme_optimizer_bytes).c_str(),
        GiB(plan.nvme_weight_bytes).c_str());
  }
}

// "13e9", "7B", "1.3B", "350M", "125K", "2T" (suffixes in either case; G
// for B too): a positive, finite count of at most 1e15, rounded to whole
// parameters.
absl::StatusOr<double> ParseParameterCount(const std::string& text) {
  constexpr double kMost = 1e15;  // 16 bytes each still fits in int64
  std::string number = text;
  double scale = 1;
  if (!number.empty()) {
    switch (absl::ascii_toupper(static_cast<unsigned char>(number.back()))) {
      case 'K':
        scale = 1e3;
        break;
      case 'M':
        scale = 1e6;
        break;
      case 'B':
      case 'G':
        scale = 1e9;
        break;
      case 'T':
        scale = 1e12;
        break;
    }
    if (scale != 1) number.pop_back();
  }
  double value = 0;
  if (!absl::SimpleAtod(number, &value) || !std::isfinite(value) ||
      absl::StrContains(number, ' ')) {
    return BadFlag("params", text,
                   "not a parameter count; write e.g. 7B, 1.3B, 350M or 13e9");
  }
  value = std::round(value * scale);
  if (value < 1) return BadFlag("params", text, "must be at least 1");
  if (value > kMost) {
    return BadFlag("params", text,
                   "more than 1e15 (1000T) parameters; the byte counts would "
                   "overflow");
  }
  return value;
}

absl::StatusOr<int> ParseWorldSize(const std::string& text) {
  constexpr int kMost = 1'000'000;
  int world = 0;
  if (!absl::SimpleAtoi(text, &world) || world < 1 || world > kMost) {
    return BadFlag(
        "world_size", text,
        absl::StrCat("must be a whole number of ranks from 1 to ", kMost));
  }
  return world;
}

// The world size a config's batch triple fixes (train_batch_size / (micro
// batch x accumulation)), when it gives all three as numbers.
std::optional<int> WorldSizeFromBatch(const std::string& path) {
  std::ifstream file(path);
  nlohmann::json json = nlohmann::json::parse(file, nullptr, false);
  if (!json.is_object()) return std::nullopt;
  auto number = [&json](const char* key) -> int64_t {
    auto found = json.find(key);
    return found != json.end() && found->is_number_integer()
               ? found->get<int64_t>()
               : 0;
  };
  const int64_t total = number("train_batch_size");
  const int64_t per_rank = number("train_micro_batch_size_per_gpu") *
                           number("gradient_accumulation_steps");
  if (total <= 0 || per_rank <= 0 || total % per_rank != 0 ||
      total / per_rank > 1'000'000) {
    return std::nullopt;
  }
  return static_cast<int>(total / per_rank);
}

using Flags = std::map<std::string, std::string>;

// Fills `setup` from the flags and, with --config, from the config: its
// stage and offload become the only row; its precision and optimizer
// replace --dtype and --optimizer, which may only fill what it leaves open
// ("auto" precision, no optimizer).
absl::Status MakeSetup(const Flags& flags, Setup& setup) {
  const bool has_config = flags.count("config") > 0;
  if (flags.count("world_size")) {
    ZE_ASSIGN_OR_RETURN(setup.world, ParseWorldSize(flags.at("world_size")));
  } else if (has_config) {
    const std::optional<int> implied = WorldSizeFromBatch(flags.at("config"));
    setup.world = implied.value_or(0);
    if (implied) {
      setup.from_config =
          absl::StrCat("world size ", *implied, " from its batch sizes");
    }
  }
  if (setup.world == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--world_size is needed",
        has_config ? absl::StrCat(" (", flags.at("config"),
                                  " does not give train_batch_size, "
                                  "train_micro_batch_size_per_gpu and "
                                  "gradient_accumulation_steps as numbers)")
                   : ""));
  }
  std::optional<config::TrainingPrecision> dtype;
  if (flags.count("dtype")) {
    const std::string& text = flags.at("dtype");
    if (text == "bf16") {
      dtype = config::TrainingPrecision::kBf16;
    } else if (text == "fp16") {
      dtype = config::TrainingPrecision::kFp16;
    } else if (text == "f32") {
      dtype = config::TrainingPrecision::kFp32;
    } else {
      return BadFlag("dtype", text, "use bf16, fp16 or f32");
    }
  }
  if (flags.count("optimizer")) {
    const std::string& text = flags.at("optimizer");
    if (text != "adamw" && text != "sgd") {
      return BadFlag("optimizer", text, "use adamw or sgd");
    }
    setup.optimizer = text;
    setup.state_bytes = text == "adamw" ? 8 : 4;  // SGD: momentum
  }
  if (!has_config) {
    setup.precision = dtype.value_or(config::TrainingPrecision::kBf16);
    return absl::OkStatus();
  }

  const std::string& path = flags.at("config");
  ZE_ASSIGN_OR_RETURN(config::Config loaded,
                      config::LoadConfigFile(path, setup.world));
  // What Initialize would refuse (compressed moments on NVMe, the 16+16
  // master with offload_param, ...) gets no row: its plan would describe a
  // run that cannot start.
  ZE_RETURN_IF_ERROR(config::CheckSupported(loaded));
  if (loaded.fp16.enabled.is_auto() || loaded.bf16.enabled.is_auto()) {
    setup.precision = dtype.value_or(config::TrainingPrecision::kBf16);
  } else if (dtype) {
    return BadFlag("dtype", flags.at("dtype"),
                   absl::StrCat(path,
                                " sets the precision (bf16.enabled, "
                                "fp16.enabled); --dtype only fills \"auto\""));
  } else {
    setup.precision = config::GetTrainingPrecision(loaded);
  }
  if (loaded.optimizer) {
    if (flags.count("optimizer")) {
      return BadFlag("optimizer", flags.at("optimizer"),
                     absl::StrCat(path,
                                  " names its optimizer (optimizer.type); "
                                  "--optimizer only fills its absence"));
    }
    zero::OptimizerOptions options;
    options.type = loaded.optimizer->type == config::OptimizerType::kSgd
                       ? zero::OptimizerType::kSgd
                       : zero::OptimizerType::kAdamW;
    options.momentum = loaded.optimizer->params.momentum;
    // Compressed moments (bf16.bf16_optimizer_states,
    // optimizer.params.blockwise_8bit_moments): their bytes an element
    // (8-bit: the codes; the per-block steps are in the engine plan).
    if (options.type != zero::OptimizerType::kSgd) {
      if (loaded.optimizer->params.blockwise_8bit_moments) {
        options.moments = offload::MomentFormat::kBlockwise8;
      } else if (loaded.bf16.bf16_optimizer_states) {
        options.moments = offload::MomentFormat::kBf16;
      }
    }
    setup.state_bytes = zero::StateBytesPerElement(options);
    setup.optimizer =
        options.type == zero::OptimizerType::kSgd ? "sgd" : "adam";
  } else {
    // Hugging Face's Trainer supplies one (AdamW) when the config has none.
    loaded.optimizer = config::OptimizerConfig();
    loaded.optimizer->type = setup.optimizer == "sgd"
                                 ? config::OptimizerType::kSgd
                                 : config::OptimizerType::kAdamW;
    loaded.optimizer->params.momentum = setup.optimizer == "sgd" ? 0.9 : 0;
    absl::StrAppend(&setup.from_config, setup.from_config.empty() ? "" : ", ",
                    "no optimizer in the config: ", setup.optimizer,
                    " assumed");
  }
  const config::ZeroConfig& zero = loaded.zero_optimization;
  if (zero.offload_optimizer.ratio.is_auto()) {
    // Chosen at Initialize from the GPU's free memory and the run's
    // activations, which a plan made elsewhere cannot know.
    return absl::InvalidArgumentError(absl::StrCat(
        loaded.source,
        ": zero_optimization.offload_optimizer.ratio is \"auto\": the "
        "engine chooses it at start from the GPU's free memory (train_gpt "
        "--dry_run on the GPU machine shows the choice); give a number "
        "here to see that share's plan"));
  }
  Choice choice;
  choice.stage = static_cast<int>(zero.stage);
  choice.optimizer = zero.offload_optimizer.device;
  choice.ratio = zero.offload_optimizer.ratio.value();
  // DeepSpeed uses offload_param at stage 3 only.
  choice.param = zero::PolicyOf(loaded).partition_parameters
                     ? zero.offload_param.device
                     : config::OffloadDevice::kNone;
  setup.choices = {choice};
  setup.config = std::move(loaded);
  return absl::OkStatus();
}

std::string ConfigNote(const Flags& flags, const Setup& setup) {
  if (!setup.config) return "";
  return absl::StrCat("; ", flags.at("config"),
                      setup.from_config.empty() ? "" : ": ", setup.from_config);
}

absl::Status FromNumbers(const Flags& flags, const Setup& setup, bool json) {
  ZE_ASSIGN_OR_RETURN(const double psi,
                      ParseParameterCount(flags.at("params")));
  std::vector<Row> rows;
  for (const Choice& choice : setup.choices) {
    ZE_ASSIGN_OR_RETURN(Row row, PaperRow(psi, setup, choice));
    rows.push_back(row);
  }
  Print(rows, json,
        absl::StrFormat("ZeRO paper formulas: %.4g parameters, %d %s, %s, "
                        "%s%s",
                        psi, setup.world, setup.world == 1 ? "rank" : "ranks",
                        PrecisionName(setup.precision), setup.optimizer,
                        ConfigNote(flags, setup)),
        setup.world);
  return absl::OkStatus();
}

constexpr char kDefaultConfig[] = R"({
  "train_micro_batch_size_per_gpu": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
  "zero_optimization": {"stage": 0}
})";

absl::Status FromModel(const Flags& flags, const Setup& setup, bool json) {
  const std::string name = flags.at("model");
  nn::GptConfig gpt;
  if (name == "tiny") {
    gpt.num_layers = 4;
    gpt.num_heads = 4;
    gpt.channels = 128;
    gpt.vocab_size = 256;
    gpt.max_seq_len = 64;
  } else {
    absl::StatusOr<nn::GptConfig> preset =
        nn::GptConfig::Preset(name, /*pad_vocab=*/true);
    if (!preset.ok()) {
      return BadFlag("model", name, std::string(preset.status().message()));
    }
    gpt = *preset;
  }
  config::Config config;
  if (setup.config) {
    // "auto" values: the model's hidden size and the precision as the
    // engine would fill them; the rest (learning rates, schedule lengths)
    // changes no byte of the plan, so any value does.
    config::ResolutionContext context;
    context.hidden_size = gpt.channels;
    context.precision = setup.precision;
    context.learning_rate = 1e-4;
    context.betas = std::array<double, 2>{0.9, 0.999};
    context.eps = 1e-8;
    context.weight_decay = 0;
    context.gradient_clipping = 0;
    context.total_num_steps = 1000;
    context.warmup_num_steps = 10;
    if (setup.config->train_micro_batch_size_per_gpu.is_auto() &&
        setup.config->train_batch_size.is_auto()) {
      context.micro_batch_size_per_gpu = 1;  // nothing else fixes the batch
    }
    ZE_ASSIGN_OR_RETURN(config, config::Resolve(*setup.config, context));
  } else {
    ZE_ASSIGN_OR_RETURN(config,
                        config::LoadConfigString(kDefaultConfig, setup.world));
    config.bf16.enabled = setup.precision == config::TrainingPrecision::kBf16;
    config.fp16.enabled = setup.precision == config::TrainingPrecision::kFp16;
    if (setup.optimizer == "sgd") {
      config.optimizer->type = config::OptimizerType::kSgd;
      config.optimizer->params.momentum = 0.9;
    }
  }
  nn::GptOptions options;
  options.materialize = false;  // shapes only
  options.dtype =
      setup.precision == config::TrainingPrecision::kBf16   ? DType::kBF16
      : setup.precision == config::TrainingPrecision::kFp16 ? DType::kF16
                                                            : DType::kF32;
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptModel> model,
                      nn::GptModel::Create(gpt, options));
  std::vector<Row> rows;
  for (const Choice& choice : setup.choices) {
    config::Config variant = config;
    if (!setup.config) {
      variant.zero_optimization.stage = choice.stage;
      auto& optimizer = variant.zero_optimization.offload_optimizer;
      optimizer.device = choice.optimizer;
      optimizer.pin_memory = true;
      variant.zero_optimization.offload_param.device = choice.param;
      if (choice.param == config::OffloadDevice::kNvme) {
        variant.zero_optimization.offload_param.max_in_cpu = 0;
        // A swapped bucket must fit one buffer (BuildPlan refuses it, as
        // DeepSpeed's swapper does): the row raises buffer_size to the
        // largest bucket where the default 1e8 is too small.
        config::Config unswapped = variant;
        unswapped.zero_optimization.offload_param.device =
            config::OffloadDevice::kNone;
        ZE_ASSIGN_OR_RETURN(const zero::Plan layout_plan,
                            zero::BuildPlan(*model, unswapped, setup.world));
        const zero::PartitionedLayout& layout = layout_plan.layout.layout;
        int64_t& buffer = variant.zero_optimization.offload_param.buffer_size;
        for (int b = 0; b < layout.num_buckets(); ++b) {
          buffer = std::max(buffer, layout.bucket(b).slice_elements);
        }
      }
    }
    ZE_ASSIGN_OR_RETURN(zero::MemoryBreakdown plan,
                        zero::PlanMemory(*model, variant, setup.world));
    Row row;
    row.stage = choice.stage;
    row.offload = OffloadName(choice);
    row.device = plan.device_bytes;
    row.host = plan.host_bytes;
    row.pinned = plan.pinned_host_bytes;
    row.nvme = plan.nvme_bytes;
    row.paper = plan.paper_bytes;
    row.plan = plan;
    rows.push_back(row);
  }
  Print(rows, json,
        absl::StrFormat("engine plan (zero/plan.h): GPT %s, %d parameters, "
                        "%d %s, %s%s, %s%s",
                        name, gpt.NumParameters(), setup.world,
                        setup.world == 1 ? "rank" : "ranks",
                        DTypeName(options.dtype),
                        MasterAndMomentsNote(setup.config), setup.optimizer,
                        ConfigNote(flags, setup)),
        setup.world);
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h" || arg == "-help") {
      std::printf("%s\n%s", kUsage, kHelp);
      return 0;
    }
    const size_t equals = arg.find('=');
    if (arg.rfind("--", 0) != 0) {
      std::fprintf(stderr, "ze_estimate: unexpected argument %s\n%s",
                   arg.c_str(), kUsage);
      return 2;
    }
    const std::string name = arg.substr(
        2, equals == std::string::npos ? std::string::npos : equals - 2);
    if (name != "params" && name != "model" && name != "world_size" &&
        name != "dtype" && name != "optimizer" && name != "config" &&
        name != "json") {
      std::fprintf(stderr, "ze_estimate: unknown flag --%s\n%s", name.c_str(),
                   kUsage);
      return 2;
    }
    if (equals == std::string::npos && name != "json") {
      std::fprintf(stderr, "ze_estimate: --%s needs a value (--%s=...)\n%s",
                   name.c_str(), name.c_str(), kUsage);
      return 2;
    }
    flags[name] = equals == std::string::npos ? "1" : arg.substr(equals + 1);
  }
  if (flags.count("params") + flags.count("model") != 1) {
    std::fprintf(stderr, "ze_estimate: give one of --params and --model\n%s",
                 kUsage);
    return 2;
  }
  const bool json = flags.count("json") > 0;
  Setup setup;
  absl::Status status = MakeSetup(flags, setup);
  if (status.ok()) {
    status = flags.count("params") ? FromNumbers(flags, setup, json)
                                   : FromModel(flags, setup, json);
  }
  if (!status.ok()) {
    // Every failure here comes from the input: the flags or the config.
    std::fprintf(stderr, "ze_estimate: %s\n",
                 std::string(status.message()).c_str());
    return 2;
  }
  return 0;
}

}  // namespace
}  // namespace ze

int main(int argc, char** argv) { return ze::Main(argc, argv); }
