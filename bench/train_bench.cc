// train_bench: full training steps (forward, backward, optimizer step)
// through the engine (ze::engine::Initialize + Forward/Backward/Step) for GPT
// presets and ZeRO stages, with a DeepSpeed-style config built here. Runs
// alone (world size 1) or under mpirun (data parallel, one GPU per rank).
// Rank 0 prints one JSON object per (model, stage) on stdout; logs go to
// stderr:
//
//   {"bench":"train_step","model":"1.3B","stage":2,"device":"NVIDIA H200",
//    "dtype":"bf16","batch":16,"seq":1024,"world_size":1,"iters":10,...,
//    "step_ms":...,"tokens_per_s":...,"mfu":...,"memory":{...},
//    "memory_breakdown":{...},"ds_config":{...},"reference":{...}}
//
// Beside the plan (memory_breakdown, zero/reports.h's parts included) the
// line measures where the model state went: "host_memory" (this rank's
// resident bytes and peak, page-locked as PinnedHostMemory's blocks plus
// registered ranges, the pageable rest) and, with an NVMe tier,
// "nvme_files" (its swap files' allocated bytes); "losses" holds every
// step's loss, warm-up steps first.
//
// Timing: `warmup` untimed steps, then `iters` steps between two
// synchronisations of the engine's compute stream (and a barrier across
// ranks), by the wall clock. tokens_per_s counts every rank's tokens
// (world_size x batch x seq x accumulation per step); tokens_per_s_per_gpu
// and mfu are per
// GPU. MFU uses the same FLOPs as gpt_bench (6 N + 12 L C T per token; the
// optimizer's FLOPs are not counted, as PyTorch's MFU figures do not count
// them either).
//
// Data: one random batch per rank (seed + rank), generated once and copied
// to the device before timing; every step trains on it.
//
// Flags:
//   --models=124M,350M,1.3B  any GptConfig preset, or "tiny", or a decoder
//                            preset (llama-tiny, llama-1B, llama-3B,
//                            llama-8B, ...: nn::DecoderConfig::Preset; its
//                            FLOPs 6 N + 12 L (heads x head_dim) T, N every
//                            parameter, a tied table once, as
//                            torch_llama_anchor.py counts them)
//   --stages=0,2             ZeRO stages 0-3. Stage 3 builds the model
//                            without storage (partitioned construction)
//                            and adds "stage3": per-step all-gather and
//                            reduce-scatter counts and elements, wait_ms
//                            (time the compute stream stalled on parameter
//                            all-gathers, CUDA timing events; mean per
//                            timed step), buckets kept for reuse, early
//                            releases and the peak gathered elements
//   --stage3_prefetch_bucket_size=5e7 --stage3_max_live_parameters=1e9
//   --stage3_max_reuse_distance=1e9 --stage3_param_persistence_threshold=1e5
//                            (DeepSpeed's defaults)
//   --batch=                 default 124M: 32, others 16; one value or a list
//   --seq=1024 --iters=10 --warmup=3 --dtype=bf16 (bf16, f16 or f32; the
//   config enables the matching mixed precision)
//   --overlap_comm=1 --backend=auto (mpi, nccl) --checkpointing=0
//   --recompute_activations=0  the MLPs recompute their activation
//                            function in backward (GptConfig /
//                            DecoderConfig recompute_activations)
//   --cpu_checkpointing=0    activation_checkpointing.cpu_checkpointing
//                            (needs --checkpointing=1): saved block inputs
//                            in pinned host memory; adds
//                            "activation_offload" (per timed step: bytes
//                            offloaded, prefetch hits, ring misses; pinned
//                            host and device ring bytes). With either,
//                            "peak_bytes_above_initialize" is the CUDA
//                            allocator's peak over the steps minus what
//                            Initialize left in use: the activations' (and
//                            step temporaries') peak, to compare runs with
//                            and without
//   --loss_chunk_rows=0      rows of logits the loss forms at a time (0: the
//                            output head's 2 GiB default; batch x seq: the
//                            whole logits in one chunk)
//   --head_weight_gradient=forward  where the output head forms its weight
//                            gradient (nn::OutputHead::WeightGradient):
//                            "forward" (a (V, C) f32 sum kept from the
//                            loss forward to its backward) or "backward"
//                            (a vocabulary slice at a time: no such sum,
//                            one more logits product)
//   --lr=6e-4 (AdamW, betas 0.9/0.95, weight decay 0.1)
//   --seed=1234
//   --accumulation=1         gradient_accumulation_steps; a timed step is
//                            that many forward/backward micro-steps and one
//                            optimizer step (tokens count all of them)
//   --offload=none           none, optimizer (offload_optimizer: cpu; stages
//                            1-3) or both (and offload_param; stage 3)
//   --offload_ratio=1        offload_optimizer.ratio; auto: the engine's
//                            choice (engine/auto_offload_ratio.h) from the
//                            GPU's free memory and the activation estimate
//                            (zero::EstimateActivations), reported as
//                            "offload_ratio_chosen"
//   --offload_device=cpu     cpu or nvme: offload_optimizer.device
//   --offload_param_device=cpu  cpu or nvme: offload_param.device (with
//                            --offload=both)
//   --max_in_cpu=            offload_param.max_in_cpu (elements kept in
//                            host memory by the nvme parameter tier; unset:
//                            the engine's default, 1e9)
//   --aio_block_size=1048576 --aio_queue_depth=8   the config's aio block
//                            (DeepSpeed's defaults), used by nvme
//   --nvme_path=/tmp         both tiers' nvme_path. With either on nvme
//                            (by these flags or --ds_config_patch),
//                            "nvme" gives the swap files' traffic over the
//                            timed steps (per step: bytes read and written,
//                            the time any / both directions had I/O in
//                            flight, the union over both files, so overlaps
//                            count once; GB/s over that busy time and over
//                            the wall time) and "nvme_steps", the same per
//                            timed step (bytes counted when a transfer
//                            finishes, so I/O a step leaves in flight falls
//                            in the next; wall_ms between the returns of
//                            successive steps, which a GPU may trail)
//   --disk_baseline=0        1: before any configuration, rank 0 measures
//                            the disk at --nvme_path with bench/
//                            disk_baseline.h's dd-like loop (each direction
//                            alone, then both at once) and prints it as
//                            {"bench":"disk_baseline",...}; each line's
//                            "nvme" then has "disk_duplex_GBps" and
//                            "fraction_of_disk_duplex" (the busy-time
//                            combined GB/s over the disk's both-at-once
//                            combined GB/s: issue 28's measure)
//   --disk_baseline_bytes=4GiB  per file (2 files: needs twice that free)
//   --delayed_update=0       offload_optimizer.delayed_update (stages 1-2)
//   --speculation_buffer_size=-1  offload_optimizer.speculation_buffer_size
//                            (-1: unset, the engine's default; 0: never
//                            speculate, so a clipped run's update waits
//                            for the norm)
//   --split_update=0         offload_optimizer.split_update (1: the
//                            experimental CPU/GPU split of the offloaded
//                            update; 0, the engine's default: the CPU
//                            updates all of it)
//   --sub_group_size=1000000000  zero_optimization.sub_group_size (the
//                            offloaded update's chunk, capped by the engine)
//   --pin_memory=1           the offload sections' pin_memory
//   --gradient_clipping=1.0  (0: none; DeepSpeed's anchor script clips none)
//   --reduce_bucket_size=5e8
//   --pipeline_stages=1      pipeline parallelism: the world is this many
//                            stages x world / stages replicas (the config's
//                            "pipeline" section); each rank builds only its
//                            stage's layers and a step is one
//                            Engine::TrainBatch of --accumulation
//                            micro-batches; adds "pipeline" (stages,
//                            schedule, layers per stage, and per rank
//                            "ranks": memory peak, activations held, and
//                            the step's time per timed step: busy_ms (its
//                            compute actions, on a GPU until their kernels
//                            finished), idle_ms (the rest of the rank's
//                            step: waits for messages and the slowest
//                            rank), wait_ms (blocked on messages and in
//                            the tied embedding's gradient sum between
//                            the end ranks, tied_sum_ms; part of
//                            idle_ms), bubble = idle_ms / wall_ms beside
//                            predicted_bubble, the schedule's for that
//                            rank in its own units (forward 1, backward 2:
//                            pipeline::SimulateSchedule), and boundary_ms
//                            (the optimizer step after it);
//                            "measured_bubble" and "predicted_bubble" over
//                            the ranks) and counts tokens per replica.
//                            Over nccl (one GPU per rank) the messages
//                            go device to device; interleaved_1f1b is
//                            refused there (it relies on eager sends):
//                            --backend=mpi for it
//   --pipeline_schedule=1f1b (or gpipe, zb_h1, interleaved_1f1b)
//   --pipeline_stages_per_rank=1  pipeline.stages_per_rank: 2 or more with
//                            interleaved_1f1b (each rank builds its stages
//                            as one nn::InterleavedStages), else 1
//   --pipeline_partition=parameters (or uniform, or boundaries "0,4,8,...",
//                            over stages x stages_per_rank stages)
//   --ds_config_patch=FILE   a JSON merge patch (RFC 7386) over every run's
//                            generated config, applied last: keys no flag
//                            sets (blockwise_8bit_moments, offload_param
//                            nvme and its buffers, ...); the line's
//                            ds_config shows the result
//   --peak_attribution=0     1: "peak_attribution" in the line: the bytes
//                            live at the steps' memory peak (the device's
//                            allocator; host memory on the CPU) by the
//                            module scope that allocated them ("Linear
//                            backward", "Block recompute", ...; model
//                            state is "(before attribution)"); each
//                            allocation then also updates a table
//   --smoke                  tiny GPT on the CPU, stages 0,2,3, 2 steps
// A configuration that fails prints {"...","error":"..."}. At world size 1
// the run goes on with the next one; with several ranks a failure other than
// "not implemented" ends the run (the ranks could no longer agree on the
// collectives to issue). Exit status 1 if any configuration failed other
// than with Unimplemented, 2 for bad flags.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/disk_baseline.h"
#include "bench/gpt_bench_util.h"
#include "comm/communicator.h"
#include "comm/factory.h"
#include "config/config.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/ops.h"
#include "core/status.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "engine/engine.h"
#include "engine/offload_report.h"
#include "nn/activation_offload.h"
#include "nn/decoder_config.h"
#include "nn/loss_model.h"
#include "nn/pipeline_stage.h"
#include "offload/nvme_store.h"
#include "pipeline/layout.h"
#include "pipeline/partition.h"
#include "pipeline/schedule.h"
#include "pipeline/step_time.h"
#include "zero/activation_estimate.h"
#include "zero/plan.h"

namespace ze {
namespace bench {
namespace {

struct Options {
  std::vector<std::string> models;
  std::vector<int64_t> batches;
  std::vector<int> stages;
  int64_t seq = 1024;
  int64_t iters = 10;
  int64_t warmup = 3;
  DType dtype = DType::kBF16;
  bool overlap_comm = true;
  bool checkpointing = false;
  bool cpu_checkpointing = false;
  bool recompute_activations = false;
  int64_t loss_chunk_rows = 0;  // 0: the output head's default
  nn::OutputHead::WeightGradient head_weight_gradient =
      nn::OutputHead::WeightGradient::kInForward;
  double lr = 6e-4;
  std::string backend = "auto";
  std::string device = "cuda";
  uint64_t seed = 1234;
  bool smoke = false;
  int64_t accumulation = 1;
  std::string offload = "none";  // none, optimizer, both
  double offload_ratio = 1.0;
  bool offload_ratio_auto = false;  // --offload_ratio=auto
  int64_t sub_group_size = config::ZeroConfig().sub_group_size;
  std::string offload_device = "cpu";
  std::string offload_param_device = "cpu";
  int64_t max_in_cpu = -1;  // -1: unset
  std::string nvme_path = "/tmp";
  bool disk_baseline = false;
  int64_t disk_baseline_bytes = int64_t{4} << 30;
  int64_t aio_block_size = config::AioConfig().block_size;
  int64_t aio_queue_depth = config::AioConfig().queue_depth;
  bool pin_memory = true;
  bool delayed_update = false;
  int64_t speculation_buffer_size = -1;  // -1: unset
  bool split_update = false;
  double gradient_clipping = 1.0;
  double reduce_bucket_size = 5e8;
  // Stage 3 fetcher settings (DeepSpeed's defaults).
  double stage3_prefetch_bucket_size = 5e7;
  double stage3_max_live_parameters = 1e9;
  double stage3_max_reuse_distance = 1e9;
  double stage3_param_persistence_threshold = 1e5;
  // Pipeline parallelism (issue 29): the world as pipeline_stages x
  // world / pipeline_stages replicas; each rank builds only its stage and a
  // step is one Engine::TrainBatch of `accumulation` micro-batches.
  int64_t pipeline_stages = 1;
  std::string pipeline_schedule = "1f1b";
  std::string pipeline_partition = "parameters";
  int64_t pipeline_stages_per_rank = 1;
  // --ds_config_patch: a JSON merge patch (RFC 7386) applied last to every
  // run's generated config, for keys no flag sets (state formats,
  // offload_param's NVMe buffers, ...). Null when not given.
  Json config_patch;
  // --peak_attribution: the steps' memory peak by allocation scope.
  bool peak_attribution = false;
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
  const std::string stages =
      flags.GetString("stages", options.smoke ? "0,2,3" : "0,2");
  for (const std::string& item : SplitList(stages)) {
    int stage = -1;
    if (!absl::SimpleAtoi(item, &stage) || stage < 0 || stage > 3) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stages: '", item, "' is not a ZeRO stage (0-3)"));
    }
    options.stages.push_back(stage);
  }
  if (options.stages.empty()) {
    return absl::InvalidArgumentError("--stages is empty");
  }
  ZE_ASSIGN_OR_RETURN(
      options.seq, flags.GetInt("seq", options.smoke ? 64 : 1024, 1, 1 << 20));
  ZE_ASSIGN_OR_RETURN(
      options.iters, flags.GetInt("iters", options.smoke ? 2 : 10, 1, 1 << 20));
  ZE_ASSIGN_OR_RETURN(
      options.warmup,
      flags.GetInt("warmup", options.smoke ? 1 : 3, 0, 1 << 20));
  ZE_ASSIGN_OR_RETURN(options.dtype,
                      ParseDType(flags.GetString("dtype", "bf16")));
  if (options.dtype == DType::kI32) {
    return absl::InvalidArgumentError("--dtype must be bf16, f16 or f32");
  }
  ZE_ASSIGN_OR_RETURN(options.overlap_comm,
                      flags.GetBool("overlap_comm", true));
  ZE_ASSIGN_OR_RETURN(options.checkpointing,
                      flags.GetBool("checkpointing", false));
  ZE_ASSIGN_OR_RETURN(options.cpu_checkpointing,
                      flags.GetBool("cpu_checkpointing", false));
  ZE_ASSIGN_OR_RETURN(options.recompute_activations,
                      flags.GetBool("recompute_activations", false));
  if (options.cpu_checkpointing && !options.checkpointing) {
    return absl::InvalidArgumentError(
        "--cpu_checkpointing=1 offloads the inputs of checkpointed blocks: "
        "add --checkpointing=1");
  }
  ZE_ASSIGN_OR_RETURN(options.loss_chunk_rows,
                      flags.GetInt("loss_chunk_rows", 0, 0, 1 << 30));
  const std::string head_weight_gradient =
      flags.GetString("head_weight_gradient", "forward");
  if (head_weight_gradient == "backward") {
    options.head_weight_gradient = nn::OutputHead::WeightGradient::kInBackward;
  } else if (head_weight_gradient != "forward") {
    return absl::InvalidArgumentError(
        absl::StrCat("--head_weight_gradient=", head_weight_gradient,
                     ": expected forward or backward"));
  }
  const std::string lr = flags.GetString("lr", "6e-4");
  if (!absl::SimpleAtod(lr, &options.lr) || !(options.lr > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lr=", lr, " is not a positive number"));
  }
  for (auto [flag, value] : std::vector<std::pair<const char*, double*>>{
           {"stage3_prefetch_bucket_size",
            &options.stage3_prefetch_bucket_size},
           {"stage3_max_live_parameters", &options.stage3_max_live_parameters},
           {"stage3_max_reuse_distance", &options.stage3_max_reuse_distance},
           {"stage3_param_persistence_threshold",
            &options.stage3_param_persistence_threshold},
           {"gradient_clipping", &options.gradient_clipping},
           {"reduce_bucket_size", &options.reduce_bucket_size}}) {
    const std::string text = flags.GetString(flag, "");
    if (text.empty()) continue;
    if (!absl::SimpleAtod(text, value) || !(*value >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, "=", text, " is not a non-negative number"));
    }
  }
  ZE_ASSIGN_OR_RETURN(options.accumulation,
                      flags.GetInt("accumulation", 1, 1, 1 << 20));
  ZE_ASSIGN_OR_RETURN(options.pipeline_stages,
                      flags.GetInt("pipeline_stages", 1, 1, 1 << 16));
  options.pipeline_schedule = flags.GetString("pipeline_schedule", "1f1b");
  options.pipeline_partition =
      flags.GetString("pipeline_partition", "parameters");
  ZE_ASSIGN_OR_RETURN(options.pipeline_stages_per_rank,
                      flags.GetInt("pipeline_stages_per_rank", 1, 1, 1 << 10));
  options.offload = flags.GetString("offload", "none");
  options.offload_device = flags.GetString("offload_device", "cpu");
  options.offload_param_device = flags.GetString("offload_param_device", "cpu");
  for (const std::string* device :
       {&options.offload_device, &options.offload_param_device}) {
    if (*device != "cpu" && *device != "nvme") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--offload_device and --offload_param_device must be cpu or nvme, "
          "not '",
          *device, "'"));
    }
  }
  ZE_ASSIGN_OR_RETURN(options.max_in_cpu,
                      flags.GetInt("max_in_cpu", -1, -1, int64_t{1} << 50));
  options.nvme_path = flags.GetString("nvme_path", "/tmp");
  ZE_ASSIGN_OR_RETURN(options.disk_baseline,
                      flags.GetBool("disk_baseline", false));
  ZE_ASSIGN_OR_RETURN(
      options.disk_baseline_bytes,
      ParseByteSize(flags.GetString("disk_baseline_bytes", "4GiB")));
  if (options.disk_baseline_bytes <= 0 ||
      options.disk_baseline_bytes % (1 << 20) != 0) {
    return absl::InvalidArgumentError(
        "--disk_baseline_bytes must be a positive multiple of 1 MiB");
  }
  ZE_ASSIGN_OR_RETURN(
      options.aio_block_size,
      flags.GetInt("aio_block_size", options.aio_block_size, 4096, 1 << 30));
  ZE_ASSIGN_OR_RETURN(
      options.aio_queue_depth,
      flags.GetInt("aio_queue_depth", options.aio_queue_depth, 1, 1024));
  if (options.offload != "none" && options.offload != "optimizer" &&
      options.offload != "both") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--offload=", options.offload, " must be none, optimizer or both"));
  }
  const std::string ratio = flags.GetString("offload_ratio", "1");
  options.offload_ratio_auto = ratio == "auto";
  if (!options.offload_ratio_auto &&
      (!absl::SimpleAtod(ratio, &options.offload_ratio) ||
       !(options.offload_ratio >= 0 && options.offload_ratio <= 1))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--offload_ratio=", ratio, " is not in [0, 1] or auto"));
  }
  ZE_ASSIGN_OR_RETURN(options.sub_group_size,
                      flags.GetInt("sub_group_size", options.sub_group_size, 1,
                                   int64_t{1} << 40));
  ZE_ASSIGN_OR_RETURN(options.pin_memory, flags.GetBool("pin_memory", true));
  ZE_ASSIGN_OR_RETURN(options.delayed_update,
                      flags.GetBool("delayed_update", false));
  ZE_ASSIGN_OR_RETURN(
      options.speculation_buffer_size,
      flags.GetInt("speculation_buffer_size", -1, -1, int64_t{1} << 50));
  ZE_ASSIGN_OR_RETURN(options.split_update,
                      flags.GetBool("split_update", false));
  options.backend = flags.GetString("backend", "auto");
  options.device = flags.GetString("device", options.smoke ? "cpu" : "cuda");
  ZE_ASSIGN_OR_RETURN(int64_t seed,
                      flags.GetInt("seed", 1234, 0, int64_t{1} << 62));
  options.seed = static_cast<uint64_t>(seed);
  ZE_ASSIGN_OR_RETURN(options.peak_attribution,
                      flags.GetBool("peak_attribution", false));
  if (const std::string patch = flags.GetString("ds_config_patch", "");
      !patch.empty()) {
    std::ifstream file(patch);
    if (!file) {
      return absl::InvalidArgumentError(
          absl::StrCat("--ds_config_patch=", patch, ": cannot open it"));
    }
    options.config_patch =
        Json::parse(file, nullptr, /*allow_exceptions=*/false);
    if (!options.config_patch.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--ds_config_patch=", patch, ": not a JSON object (a merge patch)"));
    }
  }
  ZE_RETURN_IF_ERROR(flags.CheckAllUsed());
  if (options.device != "cpu" && CudaDeviceCount() == 0) {
    return absl::FailedPreconditionError(
        "no CUDA device is visible (use --smoke or --device=cpu here)");
  }
  return options;
}

// Whether a run's config puts either offload tier on NVMe, by the flags
// or a --ds_config_patch: it then gets the aio block (unless the patch set
// one) and its line the swap files' traffic.
bool ConfigUsesNvme(const Json& config) {
  for (const char* tier : {"offload_optimizer", "offload_param"}) {
    const Json::json_pointer device(
        absl::StrCat("/zero_optimization/", tier, "/device"));
    if (config.contains(device) && config.at(device) == "nvme") return true;
  }
  return false;
}

// This process's host memory now, to hold against memory_breakdown's
// host_bytes and pinned_host_bytes: resident (VmRSS) and its peak (VmHWM)
// from /proc/self/status; page-locked, as PinnedHostMemory's blocks in use
// (staging, pinned weights) plus the ranges registered in place
// (HostRegistration: swap buffers, CPU optimizer state); pageable, the
// resident bytes less both (the model's host state and everything else the
// process holds: libraries, the CUDA runtime's own buffers, data).
Json HostMemoryJson() {
  Json json;
  int64_t rss = 0, peak = 0;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    int64_t kib = 0;
    const auto field = [&](const char* name, int64_t* out) {
      if (line.rfind(name, 0) != 0) return;
      std::string value = line.substr(std::string(name).size());
      value = value.substr(0, value.find(" kB"));
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(value), &kib)) {
        *out = kib * 1024;
      }
    };
    field("VmRSS:", &rss);
    field("VmHWM:", &peak);
  }
  const int64_t pinned = PinnedHostMemory()->stats().bytes_in_use;
  const int64_t registered = HostRegistration::ProcessLockedBytes();
  json["rss_bytes"] = rss;
  json["peak_rss_bytes"] = peak;
  json["pinned_allocator_bytes"] = pinned;
  json["registered_bytes"] = registered;
  json["pinned_bytes"] = pinned + registered;
  json["pageable_bytes"] = std::max<int64_t>(0, rss - pinned - registered);
  return json;
}

// The swap files this rank's engine holds now (zero_engine_rank<R>_*.swp
// under each NVMe tier's nvme_path): bytes allocated on disk (fallocate'd
// at creation, so the plan's nvme_bytes plus each record's rounding to 4
// KiB), by file.
Json SwapFilesJson(const Json& config, int rank) {
  Json json;
  json["files"] = Json::object();
  int64_t total = 0;
  std::vector<std::string> directories;
  for (const char* tier : {"offload_optimizer", "offload_param"}) {
    const Json::json_pointer path(
        absl::StrCat("/zero_optimization/", tier, "/nvme_path"));
    const Json::json_pointer device(
        absl::StrCat("/zero_optimization/", tier, "/device"));
    if (!config.contains(device) || config.at(device) != "nvme" ||
        !config.contains(path)) {
      continue;
    }
    const std::string directory = config.at(path).get<std::string>();
    if (std::find(directories.begin(), directories.end(), directory) ==
        directories.end()) {
      directories.push_back(directory);
    }
  }
  const std::string prefix = absl::StrCat("zero_engine_rank", rank, "_");
  for (const std::string& directory : directories) {
    std::error_code error;
    for (const auto& entry :
         std::filesystem::directory_iterator(directory, error)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind(prefix, 0) != 0) continue;
      struct stat info;
      if (::stat(entry.path().c_str(), &info) != 0) continue;
      const int64_t bytes = static_cast<int64_t>(info.st_blocks) * 512;
      json["files"][entry.path().string()] = bytes;
      total += bytes;
    }
  }
  json["bytes"] = total;
  return json;
}

// The DeepSpeed config of one run, as the engine reads it.
Json DeepSpeedConfig(const Options& options, int64_t batch, int stage,
                     int world_size) {
  Json config;
  // A pipeline's stages share each replica's batch: DeepSpeed counts the
  // data-parallel world, world / stages.
  config["train_batch_size"] =
      batch * (world_size / options.pipeline_stages) * options.accumulation;
  if (options.pipeline_stages > 1) {
    config["pipeline"] = {{"stages", options.pipeline_stages},
                          {"partition", options.pipeline_partition},
                          {"schedule", options.pipeline_schedule}};
    if (options.pipeline_stages_per_rank > 1) {
      config["pipeline"]["stages_per_rank"] = options.pipeline_stages_per_rank;
    }
  }
  config["train_micro_batch_size_per_gpu"] = batch;
  config["gradient_accumulation_steps"] = options.accumulation;
  // Large: the engine's own progress line would add a host sync per print.
  config["steps_per_print"] = 1000000;
  config["gradient_clipping"] = options.gradient_clipping;
  config["optimizer"] = {{"type", "AdamW"},
                         {"params",
                          {{"lr", options.lr},
                           {"betas", {0.9, 0.95}},
                           {"eps", 1e-8},
                           {"weight_decay", 0.1}}}};
  SetPrecisionSections(options.dtype, config);
  if (options.cpu_checkpointing) {
    config["activation_checkpointing"] = {{"cpu_checkpointing", true}};
  }
  config["zero_optimization"] = {
      {"stage", stage},
      {"contiguous_gradients", true},
      {"overlap_comm", options.overlap_comm},
      {"reduce_scatter", true},
      {"reduce_bucket_size", static_cast<int64_t>(options.reduce_bucket_size)},
      {"sub_group_size", options.sub_group_size},
      {"allgather_partitions", true},
      {"allgather_bucket_size", 5e8}};
  if (options.offload != "none") {
    Json& zero = config["zero_optimization"];
    zero["offload_optimizer"] = {
        {"device", options.offload_device},
        {"nvme_path", options.nvme_path},
        {"pin_memory", options.pin_memory},
        {"ratio", options.offload_ratio_auto ? Json("auto")
                                             : Json(options.offload_ratio)},
        {"delayed_update", options.delayed_update},
        {"split_update", options.split_update}};
    if (options.speculation_buffer_size >= 0) {
      zero["offload_optimizer"]["speculation_buffer_size"] =
          options.speculation_buffer_size;
    }
    if (options.offload == "both") {
      zero["offload_param"] = {{"device", options.offload_param_device},
                               {"pin_memory", options.pin_memory}};
      if (options.offload_param_device == "nvme") {
        zero["offload_param"]["nvme_path"] = options.nvme_path;
      }
      if (options.max_in_cpu >= 0) {
        zero["offload_param"]["max_in_cpu"] = options.max_in_cpu;
      }
    }
  }
  if (stage == 3) {
    Json& zero = config["zero_optimization"];
    zero["stage3_prefetch_bucket_size"] =
        static_cast<int64_t>(options.stage3_prefetch_bucket_size);
    zero["stage3_max_live_parameters"] =
        static_cast<int64_t>(options.stage3_max_live_parameters);
    zero["stage3_max_reuse_distance"] =
        static_cast<int64_t>(options.stage3_max_reuse_distance);
    zero["stage3_param_persistence_threshold"] =
        static_cast<int64_t>(options.stage3_param_persistence_threshold);
  }
  if (!options.config_patch.is_null()) config.merge_patch(options.config_patch);
  if (ConfigUsesNvme(config) && !config.contains("aio")) {
    config["aio"] = {{"block_size", options.aio_block_size},
                     {"queue_depth", options.aio_queue_depth}};
  }
  return config;
}

// The swap files' traffic between two readings of Engine::nvme_counters
// over `seconds` of wall time: bytes each way, the time any / each / both
// directions had I/O in flight (the union over both files), the GB/s
// (together and each way) over that busy time and over the wall time, and
// the busy and both-at-once shares. Divided by `steps` (the bytes and
// times per step; the rates and shares are not).
Json NvmeTrafficJson(const offload::NvmeStore::Counters& before,
                     const offload::NvmeStore::Counters& after, double seconds,
                     double steps) {
  const double read = static_cast<double>(after.bytes_read - before.bytes_read);
  const double written =
      static_cast<double>(after.bytes_written - before.bytes_written);
  const double busy = after.busy.busy_seconds - before.busy.busy_seconds;
  const double read_busy =
      after.busy.read_busy_seconds - before.busy.read_busy_seconds;
  const double write_busy =
      after.busy.write_busy_seconds - before.busy.write_busy_seconds;
  const double duplex = after.busy.duplex_seconds - before.busy.duplex_seconds;
  Json json;
  json["bytes_read"] = read / steps;
  json["bytes_written"] = written / steps;
  json["busy_ms"] = busy * 1e3 / steps;
  json["read_busy_ms"] = read_busy * 1e3 / steps;
  json["write_busy_ms"] = write_busy * 1e3 / steps;
  json["duplex_ms"] = duplex * 1e3 / steps;
  json["wall_ms"] = seconds * 1e3 / steps;
  // The disk's rate while it had work, both directions together: what
  // issue 28 compares with dd reading and writing at once.
  json["combined_GBps_busy"] = busy > 0 ? (read + written) / busy / 1e9 : 0.0;
  json["combined_GBps_wall"] =
      seconds > 0 ? (read + written) / seconds / 1e9 : 0.0;
  // Each direction over the wall time, and over the time that direction
  // had I/O in flight.
  json["write_GBps_wall"] = seconds > 0 ? written / seconds / 1e9 : 0.0;
  json["read_GBps_wall"] = seconds > 0 ? read / seconds / 1e9 : 0.0;
  json["write_GBps_busy"] = write_busy > 0 ? written / write_busy / 1e9 : 0.0;
  json["read_GBps_busy"] = read_busy > 0 ? read / read_busy / 1e9 : 0.0;
  // Share of the time the disk had work, and of that, both directions.
  json["busy_fraction"] = seconds > 0 ? busy / seconds : 0.0;
  json["duplex_fraction"] = busy > 0 ? duplex / busy : 0.0;
  return json;
}

// The timed steps' pipeline time on this rank (Engine::pipeline_counters
// after each TrainBatch), summed; printed per step.
struct PipelineStepTimes {
  pipeline::StepTimes times;  // times.steps counts the timed steps
  double boundary_ms = 0;
  void Add(const engine::PipelineCounters& c) {
    times += c.times;
    boundary_ms += c.boundary_ms;
  }
};

// Pipeline mode: every rank's own figures, gathered to rank 0's line (a
// collective: every rank calls it) so issue 29's step model can be checked
// stage by stage: the device memory peak (this process's allocator; ranks
// sharing one GPU each have their own) and in use when the steps ended, in
// MiB, the micro-batches whose activations the rank held at once against
// its schedule's bound, and the timed steps' time split into compute and
// idle (per step) beside the schedule's predicted bubble for the rank.
// Travels as f32 (MiB are exact to 1/1024 up to 16 GiB, to 1 KiB up to 16
// TiB; milliseconds to 24 bits). Also prints one line per rank to stderr
// on rank 0. `pipeline` gets "ranks", "measured_bubble" (the ranks' idle
// time over their wall time) and "predicted_bubble" (the schedule's).
absl::Status AddPipelineRanks(comm::Communicator& comm, engine::Engine& engine,
                              const Device& device, int64_t peak_before_steps,
                              const PipelineStepTimes& times, Json& pipeline) {
  constexpr double kMiB = 1024.0 * 1024.0;
  double peak_mib = 0, in_use_mib = 0;
  if (device.is_cuda()) {
    const AllocatorStats stats = CudaMemory(device.index)->stats();
    peak_mib = static_cast<double>(
                   std::max(stats.peak_bytes_in_use, peak_before_steps)) /
               kMiB;
    in_use_mib = static_cast<double>(stats.bytes_in_use) / kMiB;
  }
  const engine::PipelineCounters counters = engine.pipeline_counters();
  const pipeline::StepTimes& sum = times.times;
  const double steps = std::max(1, sum.steps);
  const std::vector<float> mine = {
      static_cast<float>(peak_mib),
      static_cast<float>(in_use_mib),
      static_cast<float>(counters.peak_saved_micro_batches),
      static_cast<float>(counters.activation_bound),
      static_cast<float>(sum.wall_ms / steps),
      static_cast<float>(sum.busy_ms / steps),
      static_cast<float>(sum.idle_ms / steps),
      static_cast<float>(sum.wait_ms / steps),
      static_cast<float>(sum.forward_ms / steps),
      static_cast<float>(sum.backward_ms / steps),
      static_cast<float>(sum.weight_gradient_ms / steps),
      static_cast<float>(times.boundary_ms / steps),
      static_cast<float>(counters.schedule_rank_bubble),
      static_cast<float>(sum.reduce_ms / steps),
      static_cast<float>(sum.tied_sum_ms / steps)};
  const int64_t fields = static_cast<int64_t>(mine.size());
  const Stream& stream = engine.compute_stream();
  ZE_ASSIGN_OR_RETURN(Tensor input, FromHostFloats(mine, {fields}, DType::kF32,
                                                   comm.device(), stream));
  ZE_ASSIGN_OR_RETURN(Tensor all, Tensor::Empty({fields * comm.world_size()},
                                                DType::kF32, comm.device()));
  ZE_ASSIGN_OR_RETURN(comm::Work work, comm.AllGather(input, all, stream));
  ZE_RETURN_IF_ERROR(work.Wait());
  ZE_ASSIGN_OR_RETURN(const std::vector<float> values,
                      ToHostFloats(all, stream));
  Json ranks = Json::array();
  double wall = 0, idle = 0;
  for (int r = 0; r < comm.world_size(); ++r) {
    const float* v = &values[static_cast<size_t>(r * fields)];
    const double bubble = v[4] > 0 ? v[6] / v[4] : 0;
    wall += v[4];
    idle += v[6];
    ranks.push_back({{"rank", r},
                     {"peak_mib", v[0]},
                     {"in_use_mib", v[1]},
                     {"peak_saved_micro_batches", static_cast<int>(v[2])},
                     {"activation_bound", static_cast<int>(v[3])},
                     {"wall_ms", v[4]},
                     {"busy_ms", v[5]},
                     {"idle_ms", v[6]},
                     {"wait_ms", v[7]},
                     {"forward_ms", v[8]},
                     {"backward_ms", v[9]},
                     {"weight_gradient_ms", v[10]},
                     {"reduce_ms", v[13]},
                     {"tied_sum_ms", v[14]},
                     {"boundary_ms", v[11]},
                     {"bubble", bubble},
                     {"predicted_bubble", v[12]}});
    if (comm.rank() == 0) {
      std::fprintf(stderr,
                   "train_bench: pipeline rank %d: busy_ms %.2f idle_ms %.2f "
                   "(waiting %.2f) of %.2f per step: bubble %.3f, the "
                   "schedule's %.3f; boundary_ms %.2f\n",
                   r, v[5], v[6], v[7], v[4], bubble, v[12], v[11]);
    }
  }
  pipeline["ranks"] = ranks;
  pipeline["measured_bubble"] = wall > 0 ? idle / wall : 0;
  pipeline["predicted_bubble"] = counters.schedule_bubble;
  pipeline["timed_steps"] = times.times.steps;
  return absl::OkStatus();
}

// Builds the model and the engine for (model, stage), times the steps and
// fills `line`. Collective with the other ranks. `disk`: the disk's
// baseline when --disk_baseline=1 measured it (else null).
absl::Status RunConfiguration(const Options& options, const std::string& name,
                              int64_t batch, int stage,
                              std::shared_ptr<comm::Communicator> comm,
                              const DiskBaseline* disk, Json& line) {
  const Device device = comm->device();
  ZE_ASSIGN_OR_RETURN(BenchModelConfig config,
                      BenchModelConfig::FromName(name, options.seq));
  config.set_activation_checkpointing(options.checkpointing);
  config.set_recompute_activations(options.recompute_activations);
  config.loss_chunk_rows = options.loss_chunk_rows;
  config.set_head_weight_gradient(options.head_weight_gradient);
  const int64_t num_parameters = config.NumParameters();
  // A pipeline: this rank builds only its stage's layers. Ranks of one
  // replica (the same data-parallel index) train on the same data.
  int data_index = comm->rank();
  // With several stages per rank (interleaved_1f1b), this rank's stages in
  // model order: pipeline rank r holds stages r, r + stages, ...
  std::vector<pipeline::LayerRange> my_stages;
  if (options.pipeline_stages > 1) {
    ZE_ASSIGN_OR_RETURN(
        const pipeline::PipelineLayout layout,
        pipeline::PipelineLayout::Create(
            comm->world_size(), static_cast<int>(options.pipeline_stages),
            "--pipeline_stages"));
    const std::vector<int64_t> weights =
        config.is_decoder() ? config.decoder->PipelineLayerWeights()
                            : config.gpt.PipelineLayerWeights();
    const int per_rank = static_cast<int>(options.pipeline_stages_per_rank);
    ZE_ASSIGN_OR_RETURN(
        const std::vector<pipeline::LayerRange> ranges,
        pipeline::PartitionLayers(
            weights, static_cast<int>(options.pipeline_stages) * per_rank,
            options.pipeline_partition, "--pipeline_stages",
            "--pipeline_partition"));
    for (int c = 0; c < per_rank; ++c) {
      my_stages.push_back(
          ranges[layout.StageOf(comm->rank()) +
                 c * static_cast<int>(options.pipeline_stages)]);
    }
    config.first_layer = my_stages[0].first;
    config.last_layer = my_stages[0].last;
    data_index = layout.DataParallelIndexOf(comm->rank());
    Json stages = Json::array();
    for (const pipeline::LayerRange& range : ranges) {
      stages.push_back({range.first, range.last});
    }
    line["pipeline"] = {{"stages", options.pipeline_stages},
                        {"data_parallel", layout.data_parallel},
                        {"schedule", options.pipeline_schedule},
                        {"partition", options.pipeline_partition},
                        {"stages_per_rank", per_rank},
                        {"stage_layers", stages}};
  }
  double flops_per_token = 0;
  line["model_config"] = config.ToJson();
  if (config.is_decoder()) {
    const nn::DecoderConfig& decoder = *config.decoder;
    flops_per_token =
        6.0 * static_cast<double>(num_parameters) +
        12.0 * decoder.num_layers *
            static_cast<double>(decoder.num_heads * decoder.head_dim) *
            static_cast<double>(options.seq);
    Json flops;
    flops["num_parameters"] = num_parameters;
    flops["flops_per_token"] = flops_per_token;
    flops["flops_formula"] =
        "6*num_parameters + 12*L*(heads*head_dim)*T (torch_llama_anchor.py's)";
    flops["peak_flops"] = kPeakFlops;
    line["flops"] = flops;
  } else {
    flops_per_token = FlopsPerToken(config.gpt, options.seq);
    line["flops"] = FlopsJson(config.gpt, options.seq);
  }
  const Json ds_config =
      DeepSpeedConfig(options, batch, stage, comm->world_size());
  line["ds_config"] = ds_config;
  const bool uses_nvme = ConfigUsesNvme(ds_config);

  ZE_RETURN_IF_ERROR(SetCurrentDevice(device));
  Stream stream;  // the CPU's immediate stream
  if (device.is_cuda()) {
    ZE_ASSIGN_OR_RETURN(stream, Stream::Create(device));
  }
  if (comm->rank() == 0) {
    std::fprintf(stderr,
                 "train_bench: %s (%lld parameters), ZeRO stage %d, world "
                 "size %d\n",
                 name.c_str(), static_cast<long long>(num_parameters), stage,
                 comm->world_size());
  }
  // Stage 3: no storage until the engine creates this rank's partition.
  // The same seed on every rank: the same weights.
  std::shared_ptr<nn::LossModel> model;
  if (my_stages.size() > 1) {
    // Interleaved: the rank's stages as one model, each chunk built for its
    // layer range under the whole model's names (nn/pipeline_stage.h).
    std::vector<std::unique_ptr<nn::LossModel>> chunks;
    for (const pipeline::LayerRange& range : my_stages) {
      BenchModelConfig chunk = config;
      chunk.first_layer = range.first;
      chunk.last_layer = range.last;
      ZE_ASSIGN_OR_RETURN(
          std::unique_ptr<nn::LossModel> built,
          BuildUniqueModel(chunk, device, options.dtype, options.seed,
                           /*materialize=*/stage != 3, stream));
      chunks.push_back(std::move(built));
    }
    ZE_ASSIGN_OR_RETURN(std::unique_ptr<nn::InterleavedStages> stages,
                        nn::InterleavedStages::Create(std::move(chunks)));
    model = std::move(stages);
  } else {
    ZE_ASSIGN_OR_RETURN(model,
                        BuildModel(config, device, options.dtype, options.seed,
                                   /*materialize=*/stage != 3, stream));
  }
  ZE_RETURN_IF_ERROR(stream.Synchronize());
  // --offload_ratio=auto: the engine keeps on the GPU what fits beside one
  // micro-batch's activations, as estimated for this model and shape.
  config::ResolutionContext hints;
  if (options.offload_ratio_auto) {
    zero::ActivationModel shape =
        config.is_decoder()
            ? zero::ActivationModel::Of(*config.decoder, options.dtype, batch,
                                        options.seq)
            : zero::ActivationModel::Of(config.gpt, options.dtype, batch,
                                        options.seq);
    shape.loss_chunk_rows = options.loss_chunk_rows;
    shape.ring_slots = options.checkpointing && options.cpu_checkpointing
                           ? zero::kActivationRingSlots
                           : 0;
    shape.cuda = device.is_cuda();
    hints.activation_bytes = zero::EstimateActivations(shape).device;
  }
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine,
                      engine::Initialize(model, ds_config.dump(), comm, hints));
  if (options.offload != "none") {
    line["offload_ratio_chosen"] =
        engine->config().zero_optimization.offload_optimizer.ratio.value();
  }
  int64_t peak_before_steps = 0;
  line["memory_breakdown"] = MemoryBreakdownJson(engine->memory_breakdown());
  if (device.is_cuda()) {
    // Model state plus the model's own buffers, before any activation: to
    // compare with memory_breakdown.
    line["bytes_in_use_after_initialize"] =
        CudaMemory(device.index)->stats().bytes_in_use;
    // The steps' own peak (peak_bytes_above_initialize) starts here; the
    // run's (memory.peak_bytes_in_use) is the larger of the two.
    peak_before_steps = CudaMemory(device.index)->stats().peak_bytes_in_use;
    CudaMemory(device.index)->ResetPeak();
  }
  // The device's allocator (host memory on the CPU) whose steps' peak
  // --peak_attribution breaks down by the module scope of each block.
  Allocator* const memory =
      device.is_cuda() ? CudaMemory(device.index) : HostMemory();
  if (options.peak_attribution) {
    memory->EnablePeakAttribution();
    memory->ResetPeak();
  }

  const Stream& compute = engine->compute_stream();
  ZE_ASSIGN_OR_RETURN(
      TokenBatch data,
      RandomBatch(batch, options.seq, config.vocab_size(),
                  options.seed + 1 + static_cast<uint64_t>(data_index), device,
                  compute));
  const std::vector<std::pair<Tensor, Tensor>> micro_batches(
      options.accumulation, {data.tokens, data.targets});

  double loss = 0;
  double grad_norm = 0;
  Json losses = Json::array();  // every step's, warm-up included
  double wait_ms = 0;           // summed over the steps since the last reset
  PipelineStepTimes pipeline_times;  // likewise
  auto step = [&]() -> absl::Status {
    engine::StepReport report;
    if (options.pipeline_stages > 1) {
      ZE_ASSIGN_OR_RETURN(report, engine->TrainBatch(micro_batches));
      pipeline_times.Add(engine->pipeline_counters());
    } else {
      for (int64_t micro = 0; micro < options.accumulation; ++micro) {
        ZE_RETURN_IF_ERROR(engine->Forward(data.tokens, data.targets).status());
        ZE_RETURN_IF_ERROR(engine->Backward());
        ZE_ASSIGN_OR_RETURN(report, engine->Step());
      }
    }
    loss = report.loss;
    losses.push_back(loss);
    grad_norm = report.grad_norm;
    wait_ms += engine->communication_counters().wait_ms;
    return absl::OkStatus();
  };
  for (int64_t i = 0; i < options.warmup; ++i) {
    ZE_RETURN_IF_ERROR(Annotate(step(), absl::StrCat("warm-up step ", i)));
  }
  ZE_RETURN_IF_ERROR(compute.Synchronize());
  ZE_RETURN_IF_ERROR(comm->Barrier());
  wait_ms = 0;
  pipeline_times = PipelineStepTimes();

  const offload::NvmeStore::Counters io_before = engine->nvme_counters();
  const zero::PartitionState::OffloadTimes times_before =
      engine->offload_times();
  const engine::Counters counters_before = engine->counters();
  const auto wall_start = std::chrono::steady_clock::now();
  // Per timed step: the swap files' counters when it returned (a host
  // reading, no synchronisation, so the timing is unchanged).
  Json nvme_steps = Json::array();
  offload::NvmeStore::Counters io_last = io_before;
  auto last_return = wall_start;
  for (int64_t i = 0; i < options.iters; ++i) {
    ZE_RETURN_IF_ERROR(Annotate(step(), absl::StrCat("step ", i)));
    if (uses_nvme) {
      const offload::NvmeStore::Counters io = engine->nvme_counters();
      const auto now = std::chrono::steady_clock::now();
      nvme_steps.push_back(NvmeTrafficJson(
          io_last, io, std::chrono::duration<double>(now - last_return).count(),
          1.0));
      io_last = io;
      last_return = now;
    }
  }
  ZE_RETURN_IF_ERROR(compute.Synchronize());
  ZE_RETURN_IF_ERROR(comm->Barrier());
  const double seconds = std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - wall_start)
                             .count();
  if (!std::isfinite(loss)) {
    return absl::InternalError(absl::StrCat("loss is ", loss));
  }

  // A replica's tokens, spread over its pipeline stages' GPUs.
  const double tokens_per_gpu_per_step =
      static_cast<double>(batch) * options.seq * options.accumulation /
      static_cast<double>(options.pipeline_stages);
  const double per_gpu = tokens_per_gpu_per_step * options.iters / seconds;
  const double mfu = per_gpu * flops_per_token / kPeakFlops;
  line["step_ms"] = seconds * 1e3 / options.iters;
  if (uses_nvme) {
    const offload::NvmeStore::Counters io = engine->nvme_counters();
    const double iters = static_cast<double>(options.iters);
    // Per step over the timed steps. A transfer still in flight now (a
    // read-ahead for the next step) has its busy time so far counted and
    // its bytes not: the rate errs low, never high.
    Json nvme = NvmeTrafficJson(io_before, io, seconds, iters);
    if (disk != nullptr && disk->duplex.combined_GBps > 0) {
      nvme["disk_duplex_GBps"] = disk->duplex.combined_GBps;
      nvme["fraction_of_disk_duplex"] =
          nvme["combined_GBps_busy"].get<double>() / disk->duplex.combined_GBps;
    }
    line["nvme"] = nvme;
    line["nvme_steps"] = nvme_steps;
  }
  if (options.offload != "none") {
    // Per update, in milliseconds: the worker's span (first gradient chunk
    // awaited to last weights chunk queued), the CPU optimizer's share of
    // it, and the time spent waiting for gradients to reach the host.
    const zero::PartitionState::OffloadTimes times = engine->offload_times();
    const double updates =
        std::max<int64_t>(1, times.updates - times_before.updates);
    Json worker;
    worker["updates"] = times.updates - times_before.updates;
    worker["worker_ms"] =
        (times.worker_seconds - times_before.worker_seconds) * 1e3 / updates;
    worker["optimizer_ms"] =
        (times.optimizer_seconds - times_before.optimizer_seconds) * 1e3 /
        updates;
    worker["gradient_wait_ms"] =
        (times.gradient_wait_seconds - times_before.gradient_wait_seconds) *
        1e3 / updates;
    worker["engine_wait_ms"] =
        (times.engine_wait_seconds - times_before.engine_wait_seconds) * 1e3 /
        updates;
    worker["device_ms"] =
        (times.device_seconds - times_before.device_seconds) * 1e3 / updates;
    // Issue 27's CPU/GPU split: the host elements each side updates.
    worker["cpu_elements"] = times.cpu_elements;
    worker["device_elements"] = times.device_elements;
    line["offload_worker"] = worker;
    // Issue 27: the timed steps whose CPU update ran during backward and
    // was kept, was undone and redone (or restored), or waited for the norm.
    const engine::Counters counters = engine->counters();
    Json speculation;
    speculation["committed"] =
        counters.speculation_committed - counters_before.speculation_committed;
    speculation["redone"] =
        counters.speculation_redone - counters_before.speculation_redone;
    speculation["not_speculated"] = counters.speculation_not_speculated -
                                    counters_before.speculation_not_speculated;
    line["speculation"] = speculation;
  }
  line["tokens_per_s"] = per_gpu * comm->world_size();
  line["tokens_per_s_per_gpu"] = per_gpu;
  line["tflops_per_gpu"] = per_gpu * flops_per_token / 1e12;
  line["mfu"] = mfu;
  line["mfu_pct"] = mfu * 100;
  line["loss"] = loss;
  line["losses"] = losses;
  line["grad_norm"] = grad_norm;
  // Where the model state went, measured, beside memory_breakdown's plan:
  // host memory (this rank's process) and the swap files on disk.
  line["host_memory"] = HostMemoryJson();
  if (uses_nvme) line["nvme_files"] = SwapFilesJson(ds_config, comm->rank());
  line["global_steps"] = engine->counters().global_steps;
  line["skipped_steps"] = engine->counters().skipped_steps;
  line["loss_scale"] = engine->current_loss_scale();
  if (device.is_cuda()) {
    AllocatorStats stats = CudaMemory(device.index)->stats();
    line["peak_bytes_above_initialize"] =
        stats.peak_bytes_in_use -
        line["bytes_in_use_after_initialize"].get<int64_t>();
    stats.peak_bytes_in_use =
        std::max(stats.peak_bytes_in_use, peak_before_steps);
    line["memory"] = MemoryJson(stats);
  }
  if (options.peak_attribution) {
    // Largest first; everything live at Initialize's end (model state,
    // buffers) is "(before attribution)".
    const std::vector<std::pair<std::string, int64_t>> labels =
        memory->PeakAttribution();
    Json by_label = Json::array();
    int64_t total = 0;
    for (const auto& [label, bytes] : labels) {
      total += bytes;
      by_label.push_back({label, bytes});
    }
    line["peak_attribution"] = {{"peak_bytes", total},
                                {"bytes_by_scope", by_label}};
  }
  if (options.pipeline_stages > 1) {
    ZE_RETURN_IF_ERROR(AddPipelineRanks(*comm, *engine, device,
                                        peak_before_steps, pipeline_times,
                                        line["pipeline"]));
  }
  if (const std::shared_ptr<nn::ActivationOffload>& offload =
          model->activation_offload();
      offload != nullptr) {
    const nn::ActivationOffloadStats& a = offload->stats();
    const double steps = static_cast<double>(options.warmup + options.iters);
    Json activation_offload;
    activation_offload["offloaded_bytes_per_step"] = a.offloaded_bytes / steps;
    activation_offload["restores_per_step"] = a.restored / steps;
    activation_offload["prefetched_per_step"] = a.prefetched / steps;
    activation_offload["ring_misses"] = a.ring_misses;
    activation_offload["pinned_host_bytes"] = a.host_bytes;
    activation_offload["device_ring_bytes"] = a.ring_bytes;
    line["activation_offload"] = activation_offload;
  }
  if (stage == 3) {
    const engine::CommunicationCounters k = engine->communication_counters();
    Json stage3;
    stage3["all_gathers_per_step"] = k.all_gathers;
    stage3["all_gathers_in_place_per_step"] = k.all_gathers_in_place;
    stage3["all_gathered_elements_per_step"] = k.all_gathered_elements;
    stage3["reduce_scatters_per_step"] = k.reduce_scatters;
    stage3["reduce_scattered_elements_per_step"] = k.reduce_scattered_elements;
    stage3["kept_for_reuse_per_step"] = k.kept_for_reuse;
    stage3["early_releases_per_step"] = k.early_releases;
    stage3["peak_gathered_elements"] = k.peak_gathered_elements;
    // Mean per timed step; compare with step_ms.
    stage3["wait_ms"] = wait_ms / options.iters;
    stage3["wait_fraction"] = wait_ms / (seconds * 1e3);
    line["stage3"] = stage3;
  }
  // The PyTorch figures are single-GPU; compare per GPU.
  line["reference"] = ReferenceJson(name, /*full_step=*/true, per_gpu, mfu);
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  absl::StatusOr<Options> options = ParseOptions(argc, argv);
  if (!options.ok()) {
    return ReportStartupError("train_bench", "train_step", options.status(), 2);
  }
  // One communicator for every configuration: bootstrapping NCCL once, and
  // knowing the rank and world size before building each config.
  comm::CommOptions comm_options;
  comm_options.backend = options->backend;
  comm_options.device = options->device;
  absl::StatusOr<std::unique_ptr<comm::Communicator>> created =
      comm::CreateCommunicator(comm_options);
  if (!created.ok()) {
    return ReportStartupError("train_bench", "train_step", created.status(), 1);
  }
  std::shared_ptr<comm::Communicator> comm = std::move(*created);
  const Device device = comm->device();
  const bool printer = comm->rank() == 0;
  // Pipeline flags are bad input (exit 2) before any configuration runs:
  // a stage count that does not divide the world, an unknown schedule.
  if (options->pipeline_stages > 1) {
    absl::Status bad =
        pipeline::PipelineLayout::Create(
            comm->world_size(), static_cast<int>(options->pipeline_stages),
            "--pipeline_stages")
            .status();
    if (bad.ok()) {
      absl::StatusOr<pipeline::ScheduleKind> kind =
          pipeline::ParseScheduleKind(options->pipeline_schedule);
      bad = kind.status();
      // Named here, before any model is built (the config's validation
      // would name pipeline.stages_per_rank only after).
      const bool interleaved =
          kind.ok() && *kind == pipeline::ScheduleKind::kInterleavedOneFOneB;
      if (interleaved && options->pipeline_stages_per_rank < 2) {
        bad = absl::InvalidArgumentError(
            "--pipeline_schedule=interleaved_1f1b needs "
            "--pipeline_stages_per_rank=2 or more");
      } else if (kind.ok() && !interleaved &&
                 options->pipeline_stages_per_rank > 1) {
        bad = absl::InvalidArgumentError(absl::StrCat(
            "--pipeline_stages_per_rank=", options->pipeline_stages_per_rank,
            ": only --pipeline_schedule=interleaved_1f1b holds several "
            "stages per rank"));
      }
    }
    if (!bad.ok()) {
      return ReportStartupError("train_bench", "train_step", bad, 2);
    }
  }

  // The disk's own figures, before any swap file exists: rank 0 alone (the
  // ranks of a machine share its disk), the others waiting at the barrier
  // so no other I/O of this program runs meanwhile.
  std::optional<DiskBaseline> disk;
  if (options->disk_baseline) {
    absl::Status measured = absl::OkStatus();
    if (printer) {
      absl::StatusOr<DiskBaseline> result = MeasureDiskBaseline(
          options->nvme_path, options->disk_baseline_bytes, /*duplex=*/true);
      measured = result.status();
      if (result.ok()) {
        disk = *result;
        Json line;
        line["bench"] = "disk_baseline";
        line.update(DiskBaselineJson(*disk));
        PrintJson(line);
      }
    }
    if (!measured.ok()) {
      // The other ranks wait at the barrier: end the job (MPI's launcher
      // ends them once this rank exits).
      return ReportStartupError("train_bench", "disk_baseline", measured, 1);
    }
    const absl::Status barrier = comm->Barrier();
    if (!barrier.ok()) {
      return ReportStartupError("train_bench", "disk_baseline", barrier, 1);
    }
  }

  int failures = 0;
  for (size_t m = 0; m < options->models.size(); ++m) {
    for (int stage : options->stages) {
      const std::string& model = options->models[m];
      const int64_t batch = options->batches[m];
      ResetDeviceMemory(device);
      Json line;
      line["bench"] = "train_step";
      line["model"] = model;
      line["stage"] = stage;
      line["device"] = DeviceName(device);
      line["device_id"] = device.ToString();
      line["dtype"] = DTypeName(options->dtype);
      line["batch"] = batch;
      line["seq"] = options->seq;
      line["world_size"] = comm->world_size();
      line["backend"] = comm->backend_name();
      line["iters"] = options->iters;
      line["warmup"] = options->warmup;
      line["optimizer"] = "AdamW (engine's fused kernel)";
      line["checkpointing"] = options->checkpointing;
      line["cpu_checkpointing"] = options->cpu_checkpointing;
      line["recompute_activations"] = options->recompute_activations;
      line["loss_chunk_rows"] = options->loss_chunk_rows;
      line["head_weight_gradient"] =
          options->head_weight_gradient ==
                  nn::OutputHead::WeightGradient::kInBackward
              ? "backward"
              : "forward";
      line["accumulation"] = options->accumulation;
      line["offload"] = options->offload;
      // The engine, model and data are released when this returns.
      const absl::Status status =
          RunConfiguration(*options, model, batch, stage, comm,
                           disk.has_value() ? &*disk : nullptr, line);
      if (!status.ok()) {
        const bool unimplemented =
            status.code() == absl::StatusCode::kUnimplemented;
        if (!unimplemented) ++failures;
        std::fprintf(stderr, "train_bench: %s stage %d: %s\n", model.c_str(),
                     stage, status.ToString().c_str());
        line["error"] = std::string(status.message());
        line["error_code"] = absl::StatusCodeToString(status.code());
        if (device.is_cuda()) {
          line["memory"] = MemoryJson(CudaMemory(device.index)->stats());
        }
        if (printer) PrintJson(line);
        if (!unimplemented && comm->world_size() > 1) {
          std::fprintf(stderr,
                       "train_bench: stopping: with %d ranks a failed "
                       "configuration leaves the ranks out of step\n",
                       comm->world_size());
          return 1;
        }
        continue;
      }
      if (printer) PrintJson(line);
    }
  }
  ResetDeviceMemory(device);
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace bench
}  // namespace ze

int main(int argc, char** argv) { return ze::bench::Main(argc, argv); }
