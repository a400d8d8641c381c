// generate_bench: tokens per second of Engine::Generate for GPT presets and
// Llama-family decoder presets (llama-8B, ...), with the KV cache (prefill
// per prompt length, then one (B, 1) forward per token) or by recomputing
// the whole prefix for every token, under ZeRO stage 0 or 3 (parameters
// gathered by the module hooks for every forward). Runs alone or under
// mpirun (data parallel: every rank generates for its own prompts, same
// shapes). Rank 0 prints one JSON object per (model, batch, stage, cache)
// on stdout; logs go to stderr:
//
//   {"bench":"generate","impl":"zero-engine","model":"llama-8B","batch":16,
//    "prompt":128,"new_tokens":128,"stage":0,"cache":true,"dtype":"bf16",
//    "device":"NVIDIA H200","world_size":1,"iters":3,"model_config":{...},
//    "memory_breakdown":{...},"bytes_in_use_after_initialize":...,
//    "total_ms":...,"tokens_per_s":...,"ms_per_token":...,"prefill_ms":...,
//    "decode_tokens_per_s":...,"kv_cache_bytes":...,"memory":{...}}
//
// bench/hf_generate_reference.py prints the same fields for Hugging Face
// transformers' generate (GPT-2 or LlamaForCausalLM at the same shapes).
//
// What is timed: `iters` calls of Generate(prompts, new_tokens) after
// `warmup` untimed ones, between two synchronisations of the engine's
// compute stream (and a barrier), by the wall clock; greedy, no stop token,
// so every call produces exactly batch x new_tokens tokens per rank. The
// prompts are random ids (seed + rank), all of length --prompt.
//   total_ms            one Generate call (prefill + every decode step)
//   tokens_per_s        batch x new_tokens x world_size / total (HF's
//                       definition: new tokens over the whole call)
//   ms_per_token        total_ms / new_tokens (one step of the batch)
//   prefill_ms          one Generate call with new_tokens = 1: the prompt's
//                       forward(s), the first token and the call's overhead
//   decode_tokens_per_s batch x (new_tokens - 1) x world_size /
//                       (total - prefill): the steady decode rate
//   kv_cache_bytes      2 x layers x batch x (prompt + new_tokens - 1)
//                       positions x kv channels x dtype bytes (cache only;
//                       kv channels: GPT's channels, a decoder's
//                       num_kv_heads x head_dim)
//   model_config        GPT: layers, heads, channels, ...; a decoder: its
//                       Hugging Face config.json
//   memory_breakdown    the engine's per-rank model-state plan (bytes)
// Each step reads the last position's logits back to the host and chooses
// the token there (as HF's generate does on the device, then syncs for its
// stopping criteria).
//
// Memory: the engine is a training engine, and Initialize allocates the
// whole training state whether or not a step follows. The config here uses
// the smallest optimizer (SGD without momentum), so at stages 0-2 a rank
// holds 16-bit weights, 16-bit gradients and f32 master weights: 8 bytes
// per parameter (llama-8B: 64.2 GB, 59.8 GiB), all on the device (stage 0
// has no optimizer offload); stage 3 divides it by the world size. Hugging
// Face's generate holds the 2 bytes of the weights.
// --dry_run prints the plan without allocating.
//
// Flags:
//   --model=1.3B           a GptConfig preset (vocabulary padded to 50304;
//                          tokens are chosen among the first 50257), "tiny",
//                          or a decoder preset (llama-tiny, mistral-tiny,
//                          qwen2-tiny, qwen3-tiny, llama-1B, llama-3B,
//                          llama-8B); a list runs each
//   --batch=1,16           prompts per rank; a list runs each
//   --prompt=128 --new_tokens=128
//   --stage=0              ZeRO stage 0-3; a list runs each ("0,3")
//   --cache=1              1: KV cache; 0: recompute; "1,0" runs both
//   --device=cuda          cuda or cpu
//   --dtype=bf16           bf16, f16 or f32 (the config's mixed precision)
//   --iters=3 --warmup=1 --seed=1234 --backend=auto (mpi, nccl)
//   --smoke                tiny GPT and llama-tiny on the CPU, batch 1,3,
//                          prompt 8, new_tokens 8, stages 0,3, cache 1,0,
//                          1 iter
//   --dry_run              no device, nothing allocated: per (model, stage,
//                          batch) one line with the engine's plan
//                          (zero::PlanMemory on a model without storage),
//                          kv_cache_bytes and planned_device_bytes (their
//                          sum on the device; activations and logits
//                          excluded), at --world_size ranks (default 1)
// A configuration that fails prints {"...","error":"..."}; with several
// ranks the run then stops (the ranks could no longer agree on their
// collectives). Exit status 1 if any configuration failed, 2 for bad flags.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/gpt_bench_util.h"
#include "comm/communicator.h"
#include "comm/factory.h"
#include "config/config.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/stream.h"
#include "engine/engine.h"
#include "nn/loss_model.h"
#include "zero/plan.h"

namespace ze {
namespace bench {
namespace {

struct Options {
  std::vector<std::string> models;
  std::vector<int64_t> batches;
  std::vector<int> stages;
  std::vector<bool> caches;
  int64_t prompt = 128;
  int64_t new_tokens = 128;
  int64_t iters = 3;
  int64_t warmup = 1;
  DType dtype = DType::kBF16;
  std::string device = "cuda";
  std::string backend = "auto";
  uint64_t seed = 1234;
  bool dry_run = false;
  int world_size = 1;  // --dry_run's
};

absl::StatusOr<Options> ParseOptions(int argc, char** argv) {
  ZE_ASSIGN_OR_RETURN(Flags flags, Flags::Parse(argc, argv));
  Options options;
  ZE_ASSIGN_OR_RETURN(const bool smoke, flags.GetBool("smoke", false));
  options.models =
      SplitList(flags.GetString("model", smoke ? "tiny,llama-tiny" : "1.3B"));
  if (options.models.empty()) {
    return absl::InvalidArgumentError("--model is empty");
  }
  ZE_ASSIGN_OR_RETURN(
      options.batches,
      IntList("batch", flags.GetString("batch", smoke ? "1,3" : "1,16"), 1,
              1 << 16));
  ZE_ASSIGN_OR_RETURN(
      std::vector<int64_t> stages,
      IntList("stage", flags.GetString("stage", smoke ? "0,3" : "0"), 0, 3));
  options.stages.assign(stages.begin(), stages.end());
  ZE_ASSIGN_OR_RETURN(
      std::vector<int64_t> caches,
      IntList("cache", flags.GetString("cache", smoke ? "1,0" : "1"), 0, 1));
  for (int64_t cache : caches) options.caches.push_back(cache == 1);
  ZE_ASSIGN_OR_RETURN(options.prompt,
                      flags.GetInt("prompt", smoke ? 8 : 128, 1, 1 << 20));
  ZE_ASSIGN_OR_RETURN(options.new_tokens,
                      flags.GetInt("new_tokens", smoke ? 8 : 128, 1, 1 << 20));
  ZE_ASSIGN_OR_RETURN(options.iters,
                      flags.GetInt("iters", smoke ? 1 : 3, 1, 1 << 20));
  ZE_ASSIGN_OR_RETURN(options.warmup,
                      flags.GetInt("warmup", smoke ? 0 : 1, 0, 1 << 20));
  ZE_ASSIGN_OR_RETURN(options.dtype, ParseDType(flags.GetString(
                                         "dtype", smoke ? "f32" : "bf16")));
  if (options.dtype == DType::kI32) {
    return absl::InvalidArgumentError("--dtype must be bf16, f16 or f32");
  }
  options.device = flags.GetString("device", smoke ? "cpu" : "cuda");
  if (options.device != "cuda" && options.device != "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", options.device, " must be cuda or cpu"));
  }
  options.backend = flags.GetString("backend", "auto");
  ZE_ASSIGN_OR_RETURN(int64_t seed,
                      flags.GetInt("seed", 1234, 0, int64_t{1} << 62));
  options.seed = static_cast<uint64_t>(seed);
  ZE_ASSIGN_OR_RETURN(options.dry_run, flags.GetBool("dry_run", false));
  ZE_ASSIGN_OR_RETURN(const int64_t world_size,
                      flags.GetInt("world_size", 1, 1, 1 << 20));
  if (world_size != 1 && !options.dry_run) {
    return absl::InvalidArgumentError(
        "--world_size is --dry_run's; a run takes the launcher's world size");
  }
  options.world_size = static_cast<int>(world_size);
  ZE_RETURN_IF_ERROR(flags.CheckAllUsed());
  if (!options.dry_run && options.device == "cuda" && CudaDeviceCount() == 0) {
    return absl::FailedPreconditionError(
        "no CUDA device is visible (use --smoke, --dry_run or --device=cpu "
        "here)");
  }
  return options;
}

// The engine's config: inference only, so the smallest optimizer state
// (SGD without momentum) and no gradient clipping.
Json DeepSpeedConfig(const Options& options, int stage, int world_size) {
  Json config;
  config["train_batch_size"] = world_size;
  config["train_micro_batch_size_per_gpu"] = 1;
  config["gradient_accumulation_steps"] = 1;
  config["steps_per_print"] = 1000000;
  config["optimizer"] = {{"type", "SGD"}, {"params", {{"lr", 1e-4}}}};
  SetPrecisionSections(options.dtype, config);
  config["zero_optimization"] = {{"stage", stage}};
  return config;
}

// Random prompts, (batch) x prompt ids below `vocab`, from `seed`.
std::vector<std::vector<int32_t>> RandomPrompts(int64_t batch, int64_t length,
                                                int64_t vocab, uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab - 1));
  std::vector<std::vector<int32_t>> prompts(batch);
  for (std::vector<int32_t>& prompt : prompts) {
    for (int64_t t = 0; t < length; ++t) prompt.push_back(id(generator));
  }
  return prompts;
}

// The fields every line of (model, stage) starts with.
Json BaseLine(const Options& options, const std::string& name, int stage) {
  Json base;
  base["bench"] = "generate";
  base["impl"] = "zero-engine";
  base["model"] = name;
  base["prompt"] = options.prompt;
  base["new_tokens"] = options.new_tokens;
  base["stage"] = stage;
  base["dtype"] = DTypeName(options.dtype);
  return base;
}

// The KV cache Generate allocates for `batch` rows of prompt + new_tokens
// tokens: keys and values of every layer, for prompt + new_tokens - 1
// positions (the last token is never fed back).
double KvCacheBytes(const Options& options, const BenchModelConfig& config,
                    int64_t batch) {
  return 2.0 * config.num_layers() * static_cast<double>(batch) *
         static_cast<double>(options.prompt + options.new_tokens - 1) *
         static_cast<double>(config.kv_channels()) * SizeOf(options.dtype);
}

// The per-rank model state Initialize would allocate for `shape` at
// `stage` (zero::PlanMemory on a model without storage: allocates nothing).
absl::StatusOr<zero::MemoryBreakdown> PlanModelState(
    const Options& options, const BenchModelConfig& shape, int stage) {
  ZE_ASSIGN_OR_RETURN(
      std::shared_ptr<nn::LossModel> model,
      BuildModel(shape, Device::Cpu(), options.dtype, options.seed,
                 /*materialize=*/false, Stream()));
  ZE_ASSIGN_OR_RETURN(
      const config::Config ds_config,
      config::LoadConfigString(
          DeepSpeedConfig(options, stage, options.world_size).dump(),
          options.world_size));
  return zero::PlanMemory(*model, ds_config, options.world_size);
}

// --dry_run: one line per (model, stage, batch) with the plan and the KV
// cache. Returns the number of failed (model, stage) pairs.
int DryRun(const Options& options) {
  int failures = 0;
  for (const std::string& name : options.models) {
    for (int stage : options.stages) {
      Json base = BaseLine(options, name, stage);
      base["dry_run"] = true;
      base["world_size"] = options.world_size;
      absl::StatusOr<BenchModelConfig> config =
          BenchModelConfig::FromName(name, options.prompt + options.new_tokens);
      absl::StatusOr<zero::MemoryBreakdown> memory =
          config.ok() ? PlanModelState(options, *config, stage)
                      : config.status();
      if (!memory.ok()) {
        std::fprintf(stderr, "generate_bench: %s stage %d: %s\n", name.c_str(),
                     stage, memory.status().ToString().c_str());
        base["error"] = std::string(memory.status().message());
        base["error_code"] = absl::StatusCodeToString(memory.status().code());
        PrintJson(base);
        ++failures;
        continue;
      }
      base["model_config"] = config->ToJson();
      base["num_parameters"] = config->NumParameters();
      base["memory_breakdown"] = MemoryBreakdownJson(*memory);
      for (int64_t batch : options.batches) {
        Json line = base;
        line["batch"] = batch;
        const double cache = KvCacheBytes(options, *config, batch);
        line["kv_cache_bytes"] = cache;
        line["planned_device_bytes"] =
            static_cast<double>(memory->device_bytes) + cache;
        PrintJson(line);
      }
    }
  }
  return failures;
}

// Builds the model and the engine for (model, stage), then times every
// (batch, cache) configuration on it, printing a line each (rank 0).
// Collective with the other ranks. Returns the number of failed lines.
int RunModelStage(const Options& options, const std::string& name, int stage,
                  std::shared_ptr<comm::Communicator> comm) {
  const Device device = comm->device();
  const bool printer = comm->rank() == 0;
  Json base = BaseLine(options, name, stage);
  base["device"] = DeviceName(device);
  base["world_size"] = comm->world_size();
  base["backend"] = comm->backend_name();
  base["iters"] = options.iters;
  base["warmup"] = options.warmup;
  base["greedy"] = true;
  auto fail = [&](Json line, const absl::Status& status) {
    std::fprintf(stderr, "generate_bench: %s stage %d: %s\n", name.c_str(),
                 stage, status.ToString().c_str());
    line["error"] = std::string(status.message());
    line["error_code"] = absl::StatusCodeToString(status.code());
    if (device.is_cuda()) {
      line["memory"] = MemoryJson(CudaMemory(device.index)->stats());
    }
    if (printer) PrintJson(line);
    return 1;
  };

  absl::StatusOr<BenchModelConfig> config =
      BenchModelConfig::FromName(name, options.prompt + options.new_tokens);
  if (!config.ok()) return fail(base, config.status());
  base["model_config"] = config->ToJson();
  absl::Status status = SetCurrentDevice(device);
  if (!status.ok()) return fail(base, status);
  Stream stream;
  if (device.is_cuda()) {
    absl::StatusOr<Stream> created = Stream::Create(device);
    if (!created.ok()) return fail(base, created.status());
    stream = *created;
  }
  // The same seed on every rank: the same weights. Stage 3: no storage
  // until the engine creates this rank's partition.
  absl::StatusOr<std::shared_ptr<nn::LossModel>> model =
      BuildModel(*config, device, options.dtype, options.seed,
                 /*materialize=*/stage != 3, stream);
  if (!model.ok()) return fail(base, model.status());
  status = stream.Synchronize();
  if (!status.ok()) return fail(base, status);
  if (printer) {
    std::fprintf(stderr,
                 "generate_bench: %s (%lld parameters), ZeRO stage %d, world "
                 "size %d\n",
                 name.c_str(), static_cast<long long>(config->NumParameters()),
                 stage, comm->world_size());
  }
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine = engine::Initialize(
      std::move(*model),
      DeepSpeedConfig(options, stage, comm->world_size()).dump(), comm);
  if (!engine.ok()) return fail(base, engine.status());
  base["memory_breakdown"] = MemoryBreakdownJson((*engine)->memory_breakdown());
  if (device.is_cuda()) {
    // Model state and the model's own buffers, before any activation or
    // cache: to compare with memory_breakdown.
    base["bytes_in_use_after_initialize"] =
        CudaMemory(device.index)->stats().bytes_in_use;
  }
  const Stream& compute = (*engine)->compute_stream();

  int failures = 0;
  for (int64_t batch : options.batches) {
    for (bool cache : options.caches) {
      Json line = base;
      line["batch"] = batch;
      line["cache"] = cache;
      const std::vector<std::vector<int32_t>> prompts =
          RandomPrompts(batch, options.prompt, config->vocab_size(),
                        options.seed + 1 + static_cast<uint64_t>(comm->rank()));
      engine::GenerateOptions generate;
      generate.vocab_size = config->vocab_size();
      generate.use_cache = cache;
      // Seconds per Generate call of `new_tokens`, over `iters` calls.
      auto time_calls = [&](int64_t new_tokens, int64_t iters,
                            int64_t warmup) -> absl::StatusOr<double> {
        for (int64_t i = 0; i < warmup; ++i) {
          ZE_RETURN_IF_ERROR(
              (*engine)->Generate(prompts, new_tokens, generate).status());
        }
        ZE_RETURN_IF_ERROR(compute.Synchronize());
        ZE_RETURN_IF_ERROR(comm->Barrier());
        const auto start = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < iters; ++i) {
          ZE_ASSIGN_OR_RETURN(
              std::vector<std::vector<int32_t>> tokens,
              (*engine)->Generate(prompts, new_tokens, generate));
          if (static_cast<int64_t>(tokens.front().size()) != new_tokens) {
            return absl::InternalError(
                absl::StrCat("generated ", tokens.front().size(), " of ",
                             new_tokens, " tokens"));
          }
        }
        ZE_RETURN_IF_ERROR(compute.Synchronize());
        ZE_RETURN_IF_ERROR(comm->Barrier());
        return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                             start)
                   .count() /
               iters;
      };
      ResetDeviceMemory(device);
      absl::StatusOr<double> total =
          time_calls(options.new_tokens, options.iters, options.warmup);
      absl::StatusOr<double> prefill =
          total.ok() ? time_calls(1, options.iters,
                                  std::min<int64_t>(options.warmup, 1))
                     : total;
      if (!prefill.ok()) {
        failures += fail(line, prefill.status());
        if (comm->world_size() > 1) return failures;
        continue;
      }
      const double world = comm->world_size();
      const double tokens = static_cast<double>(batch) * options.new_tokens;
      line["total_ms"] = *total * 1e3;
      line["tokens_per_s"] = tokens * world / *total;
      line["tokens_per_s_per_gpu"] = tokens / *total;
      line["ms_per_token"] = *total * 1e3 / options.new_tokens;
      line["prefill_ms"] = *prefill * 1e3;
      if (options.new_tokens > 1 && *total > *prefill) {
        line["decode_tokens_per_s"] = static_cast<double>(batch) *
                                      (options.new_tokens - 1) * world /
                                      (*total - *prefill);
      }
      line["kv_cache_bytes"] =
          cache ? KvCacheBytes(options, *config, batch) : 0.0;
      if (device.is_cuda()) {
        line["memory"] = MemoryJson(CudaMemory(device.index)->stats());
      }
      if (printer) PrintJson(line);
    }
  }
  return failures;
}

int Main(int argc, char** argv) {
  absl::StatusOr<Options> options = ParseOptions(argc, argv);
  if (!options.ok()) {
    return ReportStartupError("generate_bench", "generate", options.status(),
                              2);
  }
  if (options->dry_run) return DryRun(*options) == 0 ? 0 : 1;
  comm::CommOptions comm_options;
  comm_options.backend = options->backend;
  comm_options.device = options->device;
  absl::StatusOr<std::unique_ptr<comm::Communicator>> created =
      comm::CreateCommunicator(comm_options);
  if (!created.ok()) {
    return ReportStartupError("generate_bench", "generate", created.status(),
                              1);
  }
  std::shared_ptr<comm::Communicator> comm = std::move(*created);
  int failures = 0;
  for (const std::string& model : options->models) {
    for (int stage : options->stages) {
      // The engine and model are released when this returns.
      failures += RunModelStage(*options, model, stage, comm);
      if (failures > 0 && comm->world_size() > 1) {
        std::fprintf(stderr,
                     "generate_bench: stopping: with %d ranks a failed "
                     "configuration leaves the ranks out of step\n",
                     comm->world_size());
        return 1;
      }
    }
  }
  ResetDeviceMemory(comm->device());
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace bench
}  // namespace ze

int main(int argc, char** argv) { return ze::bench::Main(argc, argv); }
