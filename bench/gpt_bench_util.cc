#include "bench/gpt_bench_util.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <tuple>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "config/config.h"
#include "core/ops.h"
#include "core/status.h"
#include "nn/decoder.h"

namespace ze {
namespace bench {

absl::StatusOr<Flags> Flags::Parse(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("argument '", arg, "' is not of the form --name=value"));
    }
    const size_t equals = arg.find('=');
    const std::string name = arg.substr(
        2, equals == std::string::npos ? std::string::npos : equals - 2);
    const std::string value =
        equals == std::string::npos ? "1" : arg.substr(equals + 1);
    if (!flags.values_.emplace(name, value).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --", name, " is given twice"));
    }
  }
  return flags;
}

std::string Flags::GetString(const std::string& name,
                             const std::string& fallback) {
  used_.insert(name);
  const auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

absl::StatusOr<int64_t> Flags::GetInt(const std::string& name, int64_t fallback,
                                      int64_t min_value, int64_t max_value) {
  used_.insert(name);
  const auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  int64_t value = 0;
  if (!absl::SimpleAtoi(it->second, &value) || value < min_value ||
      value > max_value) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, "=", it->second, " must be an integer in [",
                     min_value, ", ", max_value, "]"));
  }
  return value;
}

absl::StatusOr<bool> Flags::GetBool(const std::string& name, bool fallback) {
  used_.insert(name);
  const auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  if (it->second == "1" || it->second == "true") return true;
  if (it->second == "0" || it->second == "false") return false;
  return absl::InvalidArgumentError(absl::StrCat(
      "--", name, "=", it->second, " must be 0, 1, true or false"));
}

absl::Status Flags::CheckAllUsed() const {
  std::vector<std::string> unknown;
  for (const auto& [name, value] : values_) {
    if (used_.count(name) == 0) unknown.push_back("--" + name);
  }
  if (unknown.empty()) return absl::OkStatus();
  std::vector<std::string> known;
  for (const std::string& name : used_) known.push_back("--" + name);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown flag(s) ", absl::StrJoin(unknown, ", "),
                   "; known flags: ", absl::StrJoin(known, ", ")));
}

std::vector<std::string> SplitList(const std::string& text) {
  return absl::StrSplit(text, ',', absl::SkipEmpty());
}

absl::StatusOr<std::vector<int64_t>> IntList(const std::string& flag,
                                             const std::string& text,
                                             int64_t min_value,
                                             int64_t max_value) {
  std::vector<int64_t> values;
  for (const std::string& item : SplitList(text)) {
    int64_t value = 0;
    if (!absl::SimpleAtoi(item, &value) || value < min_value ||
        value > max_value) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", item, "' is not an integer in [",
                       min_value, ", ", max_value, "]"));
    }
    values.push_back(value);
  }
  if (values.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " is empty"));
  }
  return values;
}

absl::StatusOr<std::vector<int64_t>> BatchSizes(
    const std::vector<std::string>& models, const std::string& batch_flag) {
  std::vector<int64_t> batches;
  if (batch_flag.empty()) {
    for (const std::string& model : models) {
      batches.push_back(model == "124M" ? 32 : model == "tiny" ? 2 : 16);
    }
    return batches;
  }
  for (const std::string& item : SplitList(batch_flag)) {
    int64_t batch = 0;
    if (!absl::SimpleAtoi(item, &batch) || batch < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--batch: '", item, "' is not a positive integer"));
    }
    batches.push_back(batch);
  }
  if (batches.size() == 1) batches.resize(models.size(), batches[0]);
  if (batches.size() != models.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--batch=", batch_flag, " gives ", batches.size(), " sizes for ",
        models.size(), " models (give one, or one per model)"));
  }
  return batches;
}

absl::StatusOr<nn::GptConfig> ModelConfig(const std::string& name,
                                          int64_t seq) {
  nn::GptConfig config;
  if (name == "tiny") {
    config.num_layers = 2;
    config.num_heads = 4;
    config.channels = 64;
    config.vocab_size = 256;
    config.padded_vocab_size = 256;
    config.max_seq_len = 64;
  } else {
    ZE_ASSIGN_OR_RETURN(config,
                        nn::GptConfig::Preset(name, /*pad_vocab=*/true));
  }
  if (seq > config.max_seq_len) config.max_seq_len = seq;
  ZE_RETURN_IF_ERROR(config.Validate());
  return config;
}

absl::StatusOr<BenchModelConfig> BenchModelConfig::FromName(
    const std::string& name, int64_t seq) {
  BenchModelConfig config;
  config.name = name;
  const std::vector<std::string> decoders = nn::DecoderConfig::PresetNames();
  if (std::find(decoders.begin(), decoders.end(), name) != decoders.end()) {
    ZE_ASSIGN_OR_RETURN(config.decoder, nn::DecoderConfig::Preset(name));
    config.decoder->max_position_embeddings =
        std::max(config.decoder->max_position_embeddings, seq);
    return config;
  }
  const std::vector<std::string> gpts = nn::GptConfig::PresetNames();
  if (name != "tiny" &&
      std::find(gpts.begin(), gpts.end(), name) == gpts.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown model '", name, "'; known: ", absl::StrJoin(gpts, ", "),
        ", tiny (GPT) and ", absl::StrJoin(decoders, ", "), " (decoders)"));
  }
  ZE_ASSIGN_OR_RETURN(config.gpt, ModelConfig(name, seq));
  return config;
}

int64_t BenchModelConfig::NumParameters() const {
  return is_decoder() ? decoder->NumParameters() : gpt.NumParameters();
}

int64_t BenchModelConfig::vocab_size() const {
  return is_decoder() ? decoder->vocab_size : gpt.vocab_size;
}

int BenchModelConfig::num_layers() const {
  return is_decoder() ? decoder->num_layers : gpt.num_layers;
}

int64_t BenchModelConfig::kv_channels() const {
  return is_decoder() ? decoder->num_kv_heads * decoder->head_dim
                      : gpt.channels;
}

Json BenchModelConfig::ToJson() const {
  return is_decoder() ? Json::parse(decoder->ToHuggingFaceJson())
                      : GptConfigJson(gpt);
}

void BenchModelConfig::set_activation_checkpointing(bool on) {
  if (is_decoder()) {
    decoder->activation_checkpointing = on;
  } else {
    gpt.activation_checkpointing = on;
  }
}

void BenchModelConfig::set_recompute_activations(bool on) {
  if (is_decoder()) {
    decoder->recompute_activations = on;
  } else {
    gpt.recompute_activations = on;
  }
}

void BenchModelConfig::set_head_weight_gradient(
    nn::OutputHead::WeightGradient where) {
  const bool in_backward = where == nn::OutputHead::WeightGradient::kInBackward;
  if (is_decoder()) {
    decoder->head_weight_gradient_in_backward = in_backward;
  } else {
    gpt.head_weight_gradient_in_backward = in_backward;
  }
}

absl::StatusOr<std::shared_ptr<nn::LossModel>> BuildModel(
    const BenchModelConfig& config, const Device& device, DType dtype,
    uint64_t seed, bool materialize, const Stream& stream) {
  ZE_ASSIGN_OR_RETURN(
      std::unique_ptr<nn::LossModel> model,
      BuildUniqueModel(config, device, dtype, seed, materialize, stream));
  return std::shared_ptr<nn::LossModel>(std::move(model));
}

absl::StatusOr<std::unique_ptr<nn::LossModel>> BuildUniqueModel(
    const BenchModelConfig& config, const Device& device, DType dtype,
    uint64_t seed, bool materialize, const Stream& stream) {
  if (config.is_decoder()) {
    nn::DecoderOptions options;
    options.device = device;
    options.dtype = dtype;
    options.seed = seed;
    options.materialize = materialize;
    options.first_layer = config.first_layer;
    options.last_layer = config.last_layer;
    ZE_ASSIGN_OR_RETURN(
        std::unique_ptr<nn::DecoderModel> model,
        nn::DecoderModel::Create(*config.decoder, options, stream));
    // A pipeline stage before the last has no head.
    if (model->lm_head() != nullptr) {
      model->lm_head()->set_loss_chunk_rows(config.loss_chunk_rows);
    }
    return std::unique_ptr<nn::LossModel>(std::move(model));
  }
  nn::GptOptions options;
  options.device = device;
  options.dtype = dtype;
  options.seed = seed;
  options.materialize = materialize;
  options.first_layer = config.first_layer;
  options.last_layer = config.last_layer;
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptModel> model,
                      nn::GptModel::Create(config.gpt, options, stream));
  if (model->lm_head() != nullptr) {
    model->lm_head()->set_loss_chunk_rows(config.loss_chunk_rows);
  }
  return std::unique_ptr<nn::LossModel>(std::move(model));
}

Json MemoryBreakdownJson(const zero::MemoryBreakdown& memory) {
  Json json;
  json["parameter_elements"] = memory.parameter_elements;
  json["model_weight_bytes"] = memory.model_weight_bytes;
  json["gradient_bytes"] = memory.gradient_bytes;
  json["master_weight_bytes"] = memory.master_weight_bytes;
  json["optimizer_state_bytes"] = memory.optimizer_state_bytes;
  json["total_bytes"] = memory.total_bytes();
  json["paper_bytes"] = memory.paper_bytes;
  json["device_bytes"] = memory.device_bytes;
  json["host_bytes"] = memory.host_bytes;
  json["pinned_host_bytes"] = memory.pinned_host_bytes;
  json["staging_bytes"] = memory.staging_bytes;
  json["nvme_bytes"] = memory.nvme_bytes;
  json["speculation_bytes"] = memory.speculation_bytes;
  // Where each part lives (zero/reports.h: they add up to device_bytes,
  // host_bytes and nvme_bytes).
  json["device_weight_bytes"] = memory.device_weight_bytes;
  json["host_weight_bytes"] = memory.host_weight_bytes;
  json["nvme_weight_bytes"] = memory.nvme_weight_bytes;
  json["device_optimizer_bytes"] = memory.device_optimizer_bytes;
  json["host_optimizer_bytes"] = memory.host_optimizer_bytes;
  json["nvme_optimizer_bytes"] = memory.nvme_optimizer_bytes;
  json["swap_buffer_bytes"] = memory.swap_buffer_bytes;
  return json;
}

int64_t FlopsParameterCount(const nn::GptConfig& config) {
  return config.NumParameters() - config.max_seq_len * config.channels;
}

double FlopsPerToken(const nn::GptConfig& config, int64_t seq) {
  return 6.0 * static_cast<double>(FlopsParameterCount(config)) +
         12.0 * config.num_layers * static_cast<double>(config.channels) *
             static_cast<double>(seq);
}

Json FlopsJson(const nn::GptConfig& config, int64_t seq) {
  Json json;
  json["num_parameters"] = config.NumParameters();
  json["flops_n"] = FlopsParameterCount(config);
  json["flops_n_definition"] =
      "GptConfig::NumParameters() minus embed.wpe (max_seq_len*C); tied "
      "wte counted once";
  json["flops_per_token"] = FlopsPerToken(config, seq);
  json["flops_formula"] = "6*flops_n + 12*L*C*T";
  json["peak_flops"] = kPeakFlops;
  return json;
}

Json GptConfigJson(const nn::GptConfig& config) {
  Json json;
  json["layers"] = config.num_layers;
  json["heads"] = config.num_heads;
  json["channels"] = config.channels;
  json["vocab_size"] = config.vocab_size;
  json["padded_vocab_size"] = config.table_rows();
  json["max_seq_len"] = config.max_seq_len;
  json["activation_checkpointing"] = config.activation_checkpointing;
  return json;
}

namespace {

struct Reference {
  const char* model;
  double eager_tokens_per_second;  // full step, PyTorch 2.11 eager
  double eager_mfu_pct;
  double compile_tokens_per_second;  // 0: not measured
  double compile_mfu_pct;
  double fwd_bwd_target_mfu_pct;  // 0: no target given
};

constexpr Reference kReferences[] = {
    {"124M", 369e3, 32.0, 0, 0, 0},
    {"350M", 156e3, 38.0, 0, 0, 45.0},
    {"1.3B", 58.1e3, 49.8, 65.0e3, 55.8, 55.0},
};

}  // namespace

Json ReferenceJson(const std::string& model, bool full_step,
                   double tokens_per_second, double mfu) {
  Json json = Json::object();
  for (const Reference& ref : kReferences) {
    if (model != ref.model) continue;
    json["pytorch_eager_full_step_tokens_per_s"] = ref.eager_tokens_per_second;
    json["pytorch_eager_full_step_mfu_pct"] = ref.eager_mfu_pct;
    if (ref.compile_tokens_per_second > 0) {
      json["torch_compile_full_step_tokens_per_s"] =
          ref.compile_tokens_per_second;
      json["torch_compile_full_step_mfu_pct"] = ref.compile_mfu_pct;
    }
    json["ratio_vs_pytorch_eager"] =
        tokens_per_second / ref.eager_tokens_per_second;
    if (full_step) {
      // Issue 4: at least 1.1x eager at every size, and above torch.compile
      // at 1.3B.
      bool met = tokens_per_second >= 1.1 * ref.eager_tokens_per_second;
      std::string target = ">= 1.1x PyTorch eager";
      if (ref.compile_tokens_per_second > 0) {
        met = met && tokens_per_second > ref.compile_tokens_per_second;
        target += " and > torch.compile";
      }
      json["target"] = target;
      json["meets_target"] = met;
    } else if (ref.fwd_bwd_target_mfu_pct > 0) {
      // Issue 3: forward+backward alone.
      json["target"] = absl::StrCat(">= ", ref.fwd_bwd_target_mfu_pct,
                                    "% MFU forward+backward");
      json["meets_target"] = mfu * 100 >= ref.fwd_bwd_target_mfu_pct;
    }
  }
  return json;
}

std::string DeviceName(const Device& device) {
  if (!device.is_cuda()) return "cpu";
  cudaDeviceProp properties;
  if (cudaGetDeviceProperties(&properties, device.index) != cudaSuccess) {
    return "unknown CUDA device";
  }
  return properties.name;
}

Json MemoryJson(const AllocatorStats& stats) {
  constexpr double kGib = 1024.0 * 1024.0 * 1024.0;
  Json json;
  json["peak_bytes_in_use"] = stats.peak_bytes_in_use;
  json["peak_gib_in_use"] = stats.peak_bytes_in_use / kGib;
  json["bytes_reserved"] = stats.bytes_reserved;
  json["gib_reserved"] = stats.bytes_reserved / kGib;
  return json;
}

absl::StatusOr<TokenBatch> RandomBatch(int64_t batch, int64_t seq,
                                       int64_t vocab_size, uint64_t seed,
                                       const Device& device,
                                       const Stream& stream) {
  // One random stream of B*(T+1) ids per batch: row b's targets are its
  // tokens shifted by one, as in language-model training.
  std::mt19937_64 generator(seed);
  std::uniform_int_distribution<int32_t> id(
      0, static_cast<int32_t>(vocab_size - 1));
  ZE_ASSIGN_OR_RETURN(Tensor host_tokens,
                      Tensor::Empty({batch, seq}, DType::kI32, Device::Cpu()));
  ZE_ASSIGN_OR_RETURN(Tensor host_targets,
                      Tensor::Empty({batch, seq}, DType::kI32, Device::Cpu()));
  int32_t* tokens = host_tokens.data_as<int32_t>();
  int32_t* targets = host_targets.data_as<int32_t>();
  for (int64_t b = 0; b < batch; ++b) {
    int32_t previous = id(generator);
    for (int64_t t = 0; t < seq; ++t) {
      const int32_t next = id(generator);
      tokens[b * seq + t] = previous;
      targets[b * seq + t] = next;
      previous = next;
    }
  }
  if (device.is_cpu()) return TokenBatch{host_tokens, host_targets};
  TokenBatch result;
  ZE_ASSIGN_OR_RETURN(result.tokens,
                      Tensor::Empty({batch, seq}, DType::kI32, device));
  ZE_ASSIGN_OR_RETURN(result.targets,
                      Tensor::Empty({batch, seq}, DType::kI32, device));
  ZE_RETURN_IF_ERROR(Copy(host_tokens, result.tokens, stream));
  ZE_RETURN_IF_ERROR(Copy(host_targets, result.targets, stream));
  // The host tensors are pageable and die here: finish the copies first.
  ZE_RETURN_IF_ERROR(stream.Synchronize());
  return result;
}

void SetPrecisionSections(DType dtype, Json& ds_config) {
  const config::TrainingPrecision precision = config::PrecisionOfDType(dtype);
  ds_config["bf16"] = {
      {"enabled", precision == config::TrainingPrecision::kBf16}};
  if (precision == config::TrainingPrecision::kFp16) {
    ds_config["fp16"] = {{"enabled", true}, {"loss_scale", 0}};
  }
}

void PrintJson(const Json& line) {
  std::printf("%s\n", line.dump().c_str());
  std::fflush(stdout);
}

int ReportStartupError(const char* program, const char* bench,
                       const absl::Status& status, int exit_code) {
  std::fprintf(stderr, "%s: %s\n", program, status.ToString().c_str());
  Json line;
  line["bench"] = bench;
  line["error"] = std::string(status.message());
  PrintJson(line);
  return exit_code;
}

void ResetDeviceMemory(const Device& device) {
  if (!device.is_cuda()) return;
  Allocator* allocator = CudaMemory(device.index);
  allocator->ReleaseCache();
  allocator->ResetPeak();
}

ModuleProfiler::ModuleProfiler(nn::Module& root, const Device& device)
    : root_(root), device_(device) {}

absl::StatusOr<std::unique_ptr<ModuleProfiler>> ModuleProfiler::Attach(
    nn::Module& root, const Device& device, int64_t expected_steps,
    bool checkpointing) {
  std::unique_ptr<ModuleProfiler> profiler(new ModuleProfiler(root, device));
  const std::vector<nn::Module*> modules = root.Modules();
  // Per step: two marks per call, forward and backward of every module (a
  // recomputing backward runs the forwards again), plus the step's two.
  const int64_t per_step =
      static_cast<int64_t>(modules.size()) * (checkpointing ? 6 : 4) + 2;
  const int64_t marks = per_step * std::max<int64_t>(1, expected_steps);
  if (device.is_cuda()) {
    // Created here, not in the step: cudaEventCreate is slow enough to show.
    profiler->pool_.reserve(marks);
    for (int64_t i = 0; i < marks; ++i) {
      ZE_ASSIGN_OR_RETURN(Event event, Event::Create(device, /*timing=*/true));
      profiler->pool_.push_back(std::move(event));
    }
  } else {
    profiler->host_ms_.reserve(marks);
  }
  profiler->calls_.reserve(marks / 2);
  ModuleProfiler* self = profiler.get();
  for (nn::Module* module : modules) {
    auto add = [&](nn::HookKind kind, nn::Hook hook) {
      self->hooks_.emplace_back(module, module->AddHook(kind, std::move(hook)));
    };
    add(nn::HookKind::kPreForward, [self](nn::Module& m, const Stream& s) {
      return self->Pre(m, kForward, s);
    });
    add(nn::HookKind::kPostForward,
        [self](nn::Module& m, const Stream& s) { return self->Post(m, s); });
    add(nn::HookKind::kPreBackward, [self](nn::Module& m, const Stream& s) {
      return self->Pre(m, kBackward, s);
    });
    add(nn::HookKind::kPostBackward,
        [self](nn::Module& m, const Stream& s) { return self->Post(m, s); });
  }
  return profiler;
}

ModuleProfiler::~ModuleProfiler() {
  for (auto& [module, handle] : hooks_) module->RemoveHook(handle);
}

namespace {

double HostNowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

absl::StatusOr<int> ModuleProfiler::Mark(const Stream& stream) {
  const int index = next_mark_++;
  if (device_.is_cpu()) {
    // CPU work is finished when the call returns: the host clock is exact.
    host_ms_.push_back(HostNowMs());
    return index;
  }
  if (index == static_cast<int>(pool_.size())) {
    ++pool_grown_;
    ZE_ASSIGN_OR_RETURN(Event event, Event::Create(device_, /*timing=*/true));
    pool_.push_back(std::move(event));
  }
  ZE_RETURN_IF_ERROR(pool_[index].Record(stream));
  return index;
}

absl::Status ModuleProfiler::Pre(nn::Module& module, Phase phase,
                                 const Stream& stream) {
  if (phase == kForward && open_backward_ > 0) phase = kRecompute;
  Call call;
  call.module = &module;
  call.phase = phase;
  call.parent = open_.empty() ? -1 : open_.back();
  call.host_start_ms = HostNowMs();
  ZE_ASSIGN_OR_RETURN(call.start, Mark(stream));
  open_.push_back(static_cast<int>(calls_.size()));
  if (phase == kBackward) ++open_backward_;
  calls_.push_back(call);
  return absl::OkStatus();
}

absl::Status ModuleProfiler::Post(nn::Module& module, const Stream& stream) {
  if (open_.empty() || calls_[open_.back()].module != &module) {
    return absl::InternalError(
        absl::StrCat("ModuleProfiler: post hook of ", module.DisplayName(),
                     " does not close the innermost open call"));
  }
  Call& call = calls_[open_.back()];
  ZE_ASSIGN_OR_RETURN(call.end, Mark(stream));
  call.host_end_ms = HostNowMs();
  if (call.phase == kBackward) --open_backward_;
  open_.pop_back();
  return absl::OkStatus();
}

absl::Status ModuleProfiler::BeginStep(const Stream& stream) {
  if (!open_.empty()) {
    return absl::FailedPreconditionError(
        "ModuleProfiler: a step begins inside an unfinished module call");
  }
  Step step;
  ZE_ASSIGN_OR_RETURN(step.start, Mark(stream));
  steps_.push_back(step);
  return absl::OkStatus();
}

absl::Status ModuleProfiler::EndStep(const Stream& stream) {
  if (steps_.empty() || steps_.back().end >= 0 || !open_.empty()) {
    return absl::FailedPreconditionError(
        "ModuleProfiler: EndStep without a matching BeginStep, or with a "
        "module call still open");
  }
  ZE_ASSIGN_OR_RETURN(steps_.back().end, Mark(stream));
  return absl::OkStatus();
}

absl::StatusOr<double> ModuleProfiler::Ms(int start, int end) const {
  if (start < 0 || end < 0) {
    return absl::FailedPreconditionError("ModuleProfiler: unfinished call");
  }
  if (device_.is_cpu()) return host_ms_[end] - host_ms_[start];
  ZE_ASSIGN_OR_RETURN(float ms, Event::ElapsedMs(pool_[start], pool_[end]));
  return static_cast<double>(ms);
}

namespace {

// "blocks.3.attn.qkv" -> "blocks.*.attn.qkv": one entry for all layers.
std::string PathPattern(const nn::Module& module) {
  if (module.parent() == nullptr) return "(root)";
  std::vector<std::string> parts = absl::StrSplit(module.FullName(), '.');
  for (std::string& part : parts) {
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
          return c >= '0' && c <= '9';
        })) {
      part = "*";
    }
  }
  return absl::StrJoin(parts, ".");
}

// {"bench":"gpt_fwd_bwd_profile","scope":scope, base fields...}.
Json Header(const Json& base, const char* scope) {
  Json line;
  line["bench"] = "gpt_fwd_bwd_profile";
  line["scope"] = scope;
  for (const auto& [key, value] : base.items()) line[key] = value;
  return line;
}

struct Totals {
  std::string type;
  bool leaf = false;
  int64_t calls[3] = {0, 0, 0};
  double inclusive[3] = {0, 0, 0};
  double self[3] = {0, 0, 0};
  double host = 0;  // host time between the hooks, all phases
  double SelfTotal() const { return self[0] + self[1] + self[2]; }
};

}  // namespace

absl::StatusOr<std::vector<Json>> ModuleProfiler::Report(
    const Json& base) const {
  if (steps_.empty() || steps_.back().end < 0) {
    return absl::FailedPreconditionError("ModuleProfiler: no finished step");
  }
  const double steps = static_cast<double>(steps_.size());
  double step_ms = 0;
  for (const Step& step : steps_) {
    ZE_ASSIGN_OR_RETURN(double ms, Ms(step.start, step.end));
    step_ms += ms;
  }
  std::vector<double> inclusive(calls_.size(), 0.0);
  std::vector<double> children(calls_.size(), 0.0);
  for (size_t i = 0; i < calls_.size(); ++i) {
    ZE_ASSIGN_OR_RETURN(inclusive[i], Ms(calls_[i].start, calls_[i].end));
    if (calls_[i].parent >= 0) children[calls_[i].parent] += inclusive[i];
  }
  // Insertion order kept in `order` so ties print in tree order.
  std::map<std::string, Totals> by_type, by_path;
  std::vector<std::string> type_order, path_order;
  double top_level[3] = {0, 0, 0};
  double top_level_host[3] = {0, 0, 0};
  double leaf_ms = 0, container_self_ms = 0;
  for (size_t i = 0; i < calls_.size(); ++i) {
    const Call& call = calls_[i];
    const bool leaf = call.module->children().empty();
    const double self_ms = inclusive[i] - children[i];
    if (call.parent < 0) {
      top_level[call.phase] += inclusive[i];
      top_level_host[call.phase] += call.host_end_ms - call.host_start_ms;
    }
    (leaf ? leaf_ms : container_self_ms) += self_ms;
    for (auto [map, order, key] :
         {std::make_tuple(&by_type, &type_order, call.module->type_name()),
          std::make_tuple(&by_path, &path_order, PathPattern(*call.module))}) {
      auto [it, inserted] = map->try_emplace(key);
      if (inserted) order->push_back(key);
      Totals& totals = it->second;
      totals.type = call.module->type_name();
      totals.leaf = leaf;
      ++totals.calls[call.phase];
      totals.inclusive[call.phase] += inclusive[i];
      totals.self[call.phase] += self_ms;
      totals.host += call.host_end_ms - call.host_start_ms;
    }
  }
  const double step_mean = step_ms / steps;
  const char* phase_names[3] = {"forward", "backward", "recompute"};
  std::vector<Json> lines;
  auto emit = [&](const char* scope, const std::map<std::string, Totals>& map,
                  std::vector<std::string> order) {
    // Largest self time first: the top lines are where the time goes.
    std::stable_sort(order.begin(), order.end(),
                     [&](const std::string& a, const std::string& b) {
                       return map.at(a).SelfTotal() > map.at(b).SelfTotal();
                     });
    for (const std::string& key : order) {
      const Totals& totals = map.at(key);
      Json line = Header(base, scope);
      line["name"] = key;
      if (std::string(scope) != "type") line["type"] = totals.type;
      line["leaf"] = totals.leaf;
      Json calls = Json::object();
      double total = 0;
      for (int p = 0; p < 3; ++p) {
        if (totals.calls[p] == 0) continue;
        calls[phase_names[p]] = totals.calls[p] / steps;
        line[absl::StrCat(phase_names[p], "_ms")] = totals.inclusive[p] / steps;
        total += totals.inclusive[p];
      }
      line["calls_per_step"] = calls;
      line["total_ms"] = total / steps;
      for (int p = 0; p < 3; ++p) {
        if (totals.calls[p] == 0) continue;
        line[absl::StrCat("self_", phase_names[p], "_ms")] =
            totals.self[p] / steps;
      }
      line["self_ms"] = totals.SelfTotal() / steps;
      line["self_share_of_step"] = totals.SelfTotal() / step_ms;
      line["host_ms"] = totals.host / steps;
      lines.push_back(std::move(line));
    }
  };
  emit("type", by_type, type_order);
  emit("path", by_path, path_order);

  Json summary = Header(base, "summary");
  summary["profiled_steps"] = steps_.size();
  summary["step_ms"] = step_mean;
  summary["root_forward_ms"] = top_level[kForward] / steps;
  summary["root_backward_ms"] = top_level[kBackward] / steps;
  // Host time to queue the root's forward and backward (hooks included);
  // the GPU waits for launches only where this approaches the GPU time.
  summary["root_forward_host_ms"] = top_level_host[kForward] / steps;
  summary["root_backward_host_ms"] = top_level_host[kBackward] / steps;
  // The loss read-back and its host round trip, and any gap between
  // ForwardLoss and BackwardLoss: no module encloses them (the loss kernels
  // run inside lm_head, whose loss mode computes the cross-entropy).
  summary["outside_modules_ms"] =
      step_mean - (top_level[0] + top_level[1] + top_level[2]) / steps;
  summary["leaf_modules_ms"] = leaf_ms / steps;
  // Containers' own work: attention core kernels, residual adds, and idle
  // time between children.
  summary["container_self_ms"] = container_self_ms / steps;
  summary["step_minus_leaf_modules_ms"] = step_mean - leaf_ms / steps;
  summary["calls_per_step"] = calls_.size() / steps;
  summary["events_per_step"] = next_mark_ / steps;
  summary["event_pool_grown"] = pool_grown_;
  summary["timer"] = device_.is_cpu() ? "host clock" : "cuda events";
  lines.push_back(std::move(summary));
  return lines;
}

}  // namespace bench
}  // namespace ze
