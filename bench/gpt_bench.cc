// gpt_bench: GPT forward + backward throughput through the public model API
// (nn::GptModel::Create, ForwardLoss, BackwardLoss), no optimizer. Prints one
// JSON object per model on stdout (logs go to stderr):
//
//   {"bench":"gpt_fwd_bwd","model":"1.3B","device":"NVIDIA H200",
//    "dtype":"bf16","batch":16,"seq":1024,"world_size":1,"iters":10,...,
//    "ms_per_iter":...,"tokens_per_s":...,"mfu":...,"memory":{...},
//    "reference":{...}}
//
// Timing: `warmup` untimed iterations, then `iters` iterations between two
// synchronisations of the model's stream, measured by the wall clock (the
// figure reported) and by CUDA events (gpu_ms_per_iter). ForwardLoss reads
// the loss back to the host, so every iteration has one host sync, as a
// PyTorch loop calling loss.item() has. Parameter gradients accumulate
// across iterations: their slots are allocated in the first backward and
// reused (accumulating costs what overwriting does).
//
// MFU = tokens/s x (6 N + 12 L C T) / 989e12, N = NumParameters() minus the
// position embedding (see bench/gpt_bench_util.h); activation checkpointing
// does not change the FLOPs counted (model FLOPs, not hardware FLOPs).
//
// Flags:
//   --models=124M,350M,1.3B  any GptConfig preset, or "tiny"
//   --batch=                 default 124M: 32, others 16; one value or a list
//   --seq=1024 --iters=10 --warmup=3 --dtype=bf16 --checkpointing=0
//   --device=cuda:0          or cpu
//   --seed=1234
//   --smoke                  tiny GPT on the CPU, f32, 2 iterations (checks
//                            the code path in seconds; any flag overrides)
//   --profile=1              after the timed iterations, run --profile_iters
//                            more (default: --iters) with a CUDA event pair
//                            around every module's Forward and Backward
//                            (Module hooks), and print, before the model's
//                            line, one JSON line per module type and per
//                            module path ("blocks.*.mlp.fc") with ms per
//                            step, inclusive and self (minus children), and
//                            a summary line: step time, time outside every
//                            module (loss, its read-back), leaf-module time
//                            and step minus leaf time. The timed figures
//                            above are measured without hooks.
// A model that fails (e.g. out of memory) prints {"...","error":"..."} and
// the run goes on; the exit status is 1 if any did, 2 for bad flags.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/gpt_bench_util.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "nn/gpt.h"

namespace ze {
namespace bench {
namespace {

struct Options {
  std::vector<std::string> models;
  std::vector<int64_t> batches;
  int64_t seq = 1024;
  int64_t iters = 10;
  int64_t warmup = 3;
  DType dtype = DType::kBF16;
  bool checkpointing = false;
  Device device = Device::Cuda(0);
  uint64_t seed = 1234;
  bool smoke = false;
  bool profile = false;
  int64_t profile_iters = 10;  // --profile_iters, default --iters
};

absl::StatusOr<Options> ParseOptions(int argc, char** argv) {
  ZE_ASSIGN_OR_RETURN(Flags flags, Flags::Parse(argc, argv));
  Options options;
  ZE_ASSIGN_OR_RETURN(options.smoke, flags.GetBool("smoke", false));
  options.models = SplitList(
      flags.GetString("models", options.smoke ? "tiny" : "124M,350M,1.3B"));
  if (options.models.empty()) {
    return absl::InvalidArgumentError("--models is empty");
  }
  ZE_ASSIGN_OR_RETURN(options.batches,
                      BatchSizes(options.models, flags.GetString("batch", "")));
  ZE_ASSIGN_OR_RETURN(
      options.seq, flags.GetInt("seq", options.smoke ? 64 : 1024, 1, 1 << 20));
  ZE_ASSIGN_OR_RETURN(
      options.iters, flags.GetInt("iters", options.smoke ? 2 : 10, 1, 1 << 20));
  ZE_ASSIGN_OR_RETURN(
      options.warmup,
      flags.GetInt("warmup", options.smoke ? 1 : 3, 0, 1 << 20));
  ZE_ASSIGN_OR_RETURN(
      options.dtype,
      ParseDType(flags.GetString("dtype", options.smoke ? "f32" : "bf16")));
  if (options.dtype == DType::kI32) {
    return absl::InvalidArgumentError("--dtype must be bf16, f16 or f32");
  }
  ZE_ASSIGN_OR_RETURN(options.checkpointing,
                      flags.GetBool("checkpointing", false));
  ZE_ASSIGN_OR_RETURN(
      options.device,
      ParseDevice(flags.GetString("device", options.smoke ? "cpu" : "cuda:0")));
  ZE_ASSIGN_OR_RETURN(int64_t seed,
                      flags.GetInt("seed", 1234, 0, int64_t{1} << 62));
  options.seed = static_cast<uint64_t>(seed);
  ZE_ASSIGN_OR_RETURN(options.profile, flags.GetBool("profile", false));
  ZE_ASSIGN_OR_RETURN(options.profile_iters,
                      flags.GetInt("profile_iters", options.iters, 1, 1 << 20));
  ZE_RETURN_IF_ERROR(flags.CheckAllUsed());
  if (options.device.is_cuda() && options.device.index >= CudaDeviceCount()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device=", options.device.ToString(), " but ", CudaDeviceCount(),
        " CUDA device(s) are visible (use --smoke or --device=cpu here)"));
  }
  return options;
}

// The fields every line of this model carries, results or error.
Json ConfigurationJson(const Options& options, const std::string& model,
                       int64_t batch) {
  Json json;
  json["bench"] = "gpt_fwd_bwd";
  json["model"] = model;
  json["device"] = DeviceName(options.device);
  json["device_id"] = options.device.ToString();
  json["dtype"] = DTypeName(options.dtype);
  json["batch"] = batch;
  json["seq"] = options.seq;
  json["world_size"] = 1;
  json["iters"] = options.iters;
  json["warmup"] = options.warmup;
  json["checkpointing"] = options.checkpointing;
  json["zero_grad_between_iters"] = false;
  if (options.profile) json["profile_iters"] = options.profile_iters;
  return json;
}

// Runs options.profile_iters more iterations with a ModuleProfiler attached
// and prints its lines (model, batch and dtype copied from `line`); adds the
// summary to `line` as "profile". Separate from the timed iterations so the
// headline figures carry no hook overhead; the summary's step_ms against
// `unprofiled_ms` shows what the hooks cost.
absl::Status ProfileModel(const Options& options, nn::GptModel& model,
                          const std::function<absl::Status()>& iteration,
                          const Stream& stream, double unprofiled_ms,
                          Json& line) {
  ZE_ASSIGN_OR_RETURN(
      std::unique_ptr<ModuleProfiler> profiler,
      ModuleProfiler::Attach(model, options.device, options.profile_iters,
                             options.checkpointing));
  // The profiler's events are created; start from an idle stream so the
  // first profiled step does not absorb earlier work.
  ZE_RETURN_IF_ERROR(stream.Synchronize());
  const auto wall_start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < options.profile_iters; ++i) {
    ZE_RETURN_IF_ERROR(profiler->BeginStep(stream));
    ZE_RETURN_IF_ERROR(
        Annotate(iteration(), absl::StrCat("profiled iteration ", i)));
    ZE_RETURN_IF_ERROR(profiler->EndStep(stream));
  }
  // The only synchronisation: every event is read after the last step.
  ZE_RETURN_IF_ERROR(stream.Synchronize());
  const double wall_ms = std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - wall_start)
                             .count() /
                         options.profile_iters;
  Json base;
  for (const char* key : {"model", "device", "dtype", "batch", "seq"}) {
    base[key] = line[key];
  }
  ZE_ASSIGN_OR_RETURN(std::vector<Json> lines, profiler->Report(base));
  Json summary = lines.back();
  summary["profiled_wall_ms_per_iter"] = wall_ms;
  summary["unprofiled_ms_per_iter"] = unprofiled_ms;
  lines.back() = summary;
  for (const Json& profile_line : lines) PrintJson(profile_line);
  for (const char* key :
       {"model", "device", "dtype", "batch", "seq", "bench", "scope"}) {
    summary.erase(key);
  }
  line["profile"] = summary;
  return absl::OkStatus();
}

// Builds `model`, runs warm-up and timed iterations, and fills `line`.
absl::Status RunModel(const Options& options, const std::string& model_name,
                      int64_t batch, Json& line) {
  ZE_ASSIGN_OR_RETURN(nn::GptConfig config,
                      ModelConfig(model_name, options.seq));
  config.activation_checkpointing = options.checkpointing;
  line["model_config"] = GptConfigJson(config);
  line["flops"] = FlopsJson(config, options.seq);

  ZE_RETURN_IF_ERROR(SetCurrentDevice(options.device));
  Stream stream;  // the CPU's immediate stream
  if (options.device.is_cuda()) {
    ZE_ASSIGN_OR_RETURN(stream, Stream::Create(options.device));
  }
  ZE_ASSIGN_OR_RETURN(TokenBatch data,
                      RandomBatch(batch, options.seq, config.vocab_size,
                                  options.seed, options.device, stream));
  nn::GptOptions model_options;
  model_options.device = options.device;
  model_options.dtype = options.dtype;
  model_options.seed = options.seed;
  std::fprintf(stderr, "gpt_bench: building %s (%lld parameters) on %s\n",
               model_name.c_str(),
               static_cast<long long>(config.NumParameters()),
               options.device.ToString().c_str());
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptModel> model,
                      nn::GptModel::Create(config, model_options, stream));
  ZE_RETURN_IF_ERROR(stream.Synchronize());

  float loss = 0;
  const std::function<absl::Status()> iteration = [&]() -> absl::Status {
    ZE_ASSIGN_OR_RETURN(loss,
                        model->ForwardLoss(data.tokens, data.targets, stream));
    return model->BackwardLoss(/*loss_scale=*/1.0f, stream);
  };
  for (int64_t i = 0; i < options.warmup; ++i) {
    ZE_RETURN_IF_ERROR(Annotate(iteration(), absl::StrCat("warm-up ", i)));
  }
  ZE_RETURN_IF_ERROR(stream.Synchronize());

  Event start, end;  // CPU events when on the CPU (no GPU timing there)
  if (options.device.is_cuda()) {
    ZE_ASSIGN_OR_RETURN(start, Event::Create(options.device, true));
    ZE_ASSIGN_OR_RETURN(end, Event::Create(options.device, true));
    ZE_RETURN_IF_ERROR(start.Record(stream));
  }
  const auto wall_start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < options.iters; ++i) {
    ZE_RETURN_IF_ERROR(Annotate(iteration(), absl::StrCat("iteration ", i)));
  }
  if (options.device.is_cuda()) ZE_RETURN_IF_ERROR(end.Record(stream));
  ZE_RETURN_IF_ERROR(stream.Synchronize());
  const double seconds = std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - wall_start)
                             .count();
  if (!std::isfinite(loss)) {
    return absl::InternalError(absl::StrCat("loss is ", loss));
  }

  const double tokens =
      static_cast<double>(batch) * options.seq * options.iters;
  const double tokens_per_second = tokens / seconds;
  const double mfu =
      tokens_per_second * FlopsPerToken(config, options.seq) / kPeakFlops;
  line["ms_per_iter"] = seconds * 1e3 / options.iters;
  if (options.device.is_cuda()) {
    ZE_ASSIGN_OR_RETURN(float gpu_ms, Event::ElapsedMs(start, end));
    line["gpu_ms_per_iter"] = gpu_ms / options.iters;
  }
  line["tokens_per_s"] = tokens_per_second;
  line["tflops"] =
      tokens_per_second * FlopsPerToken(config, options.seq) / 1e12;
  line["mfu"] = mfu;
  line["mfu_pct"] = mfu * 100;
  line["loss"] = loss;
  if (options.device.is_cuda()) {
    line["memory"] = MemoryJson(CudaMemory(options.device.index)->stats());
  }
  line["reference"] =
      ReferenceJson(model_name, /*full_step=*/false, tokens_per_second, mfu);
  if (options.profile) {
    ZE_RETURN_IF_ERROR(ProfileModel(options, *model, iteration, stream,
                                    line["ms_per_iter"].get<double>(), line));
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  absl::StatusOr<Options> options = ParseOptions(argc, argv);
  if (!options.ok()) {
    return ReportStartupError("gpt_bench", "gpt_fwd_bwd", options.status(), 2);
  }
  int failures = 0;
  for (size_t i = 0; i < options->models.size(); ++i) {
    const std::string& model = options->models[i];
    const int64_t batch = options->batches[i];
    ResetDeviceMemory(options->device);
    Json line = ConfigurationJson(*options, model, batch);
    // Everything the model allocated is released when RunModel returns, so
    // the next model starts from an empty cache.
    const absl::Status status = RunModel(*options, model, batch, line);
    if (!status.ok()) {
      ++failures;
      std::fprintf(stderr, "gpt_bench: %s: %s\n", model.c_str(),
                   status.ToString().c_str());
      line["error"] = status.ToString();
      if (options->device.is_cuda()) {
        line["memory"] = MemoryJson(CudaMemory(options->device.index)->stats());
      }
    }
    PrintJson(line);
  }
  ResetDeviceMemory(options->device);
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace bench
}  // namespace ze

int main(int argc, char** argv) { return ze::bench::Main(argc, argv); }
