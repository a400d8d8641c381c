// pipeline_model: issue 29's model of a pipeline step, fed by measured
// module times. From a GPT's per-module forward and backward times at
// several micro-batch sizes (gpt_bench --profile=1, one GPU), it builds each
// stage's costs for a partition over p pipeline ranks, runs the schedule's
// action lists with those durations (pipeline::SimulateSchedule: receives
// wait for their sends plus the link's time), and prints one JSON line per
// (schedule, ranks, batch, micro-batches) with the predicted step, tokens/s,
// bubble, each stage's memory, per rank ("per_rank") its predicted busy and
// idle time, idle share (what train_bench's pipeline lines measure as
// "bubble") and memory, and the same batch under ZeRO-3 over the same GPUs
// for comparison. Nothing runs on a GPU here.
//
// What it assumes (each printed in the lines' "assumptions"):
//   - A stage's time for micro-batch b is the sum of its pipeline layers'
//     measured times at b (embedding, blocks, ln_f, head with its loss),
//     linearly interpolated between measured sizes; outside them, the
//     nearest two measured sizes extrapolate ("extrapolated": true).
//   - Each (stage, micro-batch) forward runs once: the executor keeps every
//     in-flight micro-batch's activations until its backward
//     (pipeline/executor.h), as the memory below counts; no forward is
//     recomputed (before pipe-save-29 the executor recomputed every forward
//     of 1F1B's ranks but the last, which this model did not charge).
//   - zb_h1 splits each block's measured backward into its input-gradient
//     part and its Linears' weight gradients, --weight_gradient_share of it
//     (0.5 by default: a Linear's two backward products cost alike; the
//     attention core, norms and GELU belong to the input part, so the
//     share is a little below one half); the embedding's, final norm's and
//     head's backward stay in the input part, as the engine runs them
//     (nn/module.h). Its memory counts InFlightBound micro-batches per rank
//     (a deferred weight gradient's inputs priced as a whole micro-batch's
//     activations: an upper bound). interleaved_1f1b: a rank's in-flight
//     stage-forwards (ActivationBound) spread evenly over its v stages
//     (an approximation: the warm-up runs the rank's earlier stages first).
//   - Activations and their gradients cross the link at --link_gb_s after
//     --link_latency_us; the optimizer runs once per stage at the end
//     (--optimizer_params_per_s, the engine's fused AdamW on the GPU).
//   - Memory: 16 bytes a parameter of model state (bf16 weights and
//     gradients, f32 master and moments: ZeRO stage 0 inside a pipeline of
//     one data-parallel replica), plus the stashed micro-batches'
//     activations (the schedule's own count, per rank) at the measured
//     activation bytes per sequence and block (the slope of gpt_bench's
//     peak memory over micro-batch size, less the output head's share of
//     it, spread over the blocks), plus, on the stage holding the head, its
//     loss buffers (nn::OutputHead::LossBuffersFor at --loss_chunk_rows):
//     one chunk of bf16 logits and the f32 losses while a forward runs, and
//     for every micro-batch whose head forward awaits its backward
//     (ActivationBound: GPipe m, 1F1B and zb_h1 one on the last rank) the
//     input's gradient and the (V, C) f32 weight-gradient sum. gpt_bench's
//     peak is the head's forward (the chunk lives only there), so the head's
//     bytes per sequence are in its slope and are taken out of the blocks'.
//   - ZeRO-3 over the same p GPUs: each GPU runs batch / p sequences as
//     accumulation of micro-batches of at most the largest measured size;
//     its parameters are gathered for every micro-batch's forward and
//     backward and its gradients reduce-scattered once a step over
//     --collective_gb_s (bus bandwidth). The step is reported both with the
//     communication hidden under compute and added to it.
//
// Flags:
//   --profile=PATH           gpt_bench --profile=1 JSON lines (required)
//   --model=1.3B             the GPT preset those lines measured
//   --seq=1024
//   --ranks=2,4,8  --batches=32,64,128,256  --micro_batches=1,2,4,8,16
//   --schedules=gpipe,1f1b   (or zb_h1, interleaved_1f1b)
//   --stages_per_rank=2      interleaved_1f1b's stages per rank (v): the
//                            model is cut into ranks x v stages, rank r
//                            holding r, r + ranks, ...; micro-batch counts
//                            that are not a multiple of the ranks are
//                            skipped for it
//   --partition=parameters   (or uniform, or "0,4,..": over all the stages)
//   --weight_gradient_share=0.5
//   --loss_chunk_rows=0      the head's chunk rows as the runs set them (0:
//                            the engine's 2 GiB default, as gpt_bench's and
//                            train_bench's unless given)
//   --link_gb_s=100 --link_latency_us=10 --collective_gb_s=100
//   --dtype=bf16             or f32: the training dtype, the bytes of an
//                            activation message and of the tied gradient
//   --tied_gb_s              the tied embedding's gradient sum between the
//                            first and last rank (V C elements; default
//                            --collective_gb_s), added after the schedule:
//                            step_ms = schedule_ms + tied_reduce_ms, every
//                            rank idle through it (train_bench's
//                            tied_sum_ms), so "bubble" includes it and
//                            "schedule_bubble" is the schedule's alone
//   --optimizer_params_per_s=1.46e11 --gpu_gib=139
// Exit status 0, or 2 with a JSON error line for bad flags or a profile
// without the lines needed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/gpt_bench_util.h"
#include "core/status.h"
#include "nn/gpt.h"
#include "nn/layers.h"
#include "pipeline/partition.h"
#include "pipeline/schedule.h"

namespace ze {
namespace bench {
namespace {

constexpr double kGib = 1024.0 * 1024.0 * 1024.0;

// Forward and backward milliseconds of one pipeline layer's modules.
struct LayerTimes {
  double forward_ms = 0;
  double backward_ms = 0;
};

// What one micro-batch size measured: per pipeline layer (embedding, each
// block, ln_f, head), and the step's peak device bytes.
struct Measured {
  std::vector<LayerTimes> layers;
  double peak_bytes = 0;
};

// Reads gpt_bench's lines for `model`: per batch, the "path" lines of the
// embedding, the blocks (all of them: "blocks.*"), ln_f and lm_head, and
// the model line's peak memory.
absl::StatusOr<std::map<int64_t, Measured>> ReadProfile(
    const std::string& path, const std::string& model, int layers) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("--profile=", path, ": cannot be read"));
  }
  std::map<int64_t, std::map<std::string, LayerTimes>> paths;
  std::map<int64_t, double> peaks;
  std::string text;
  int line_number = 0;
  while (std::getline(in, text)) {
    ++line_number;
    if (text.empty() || text[0] != '{') continue;
    Json line = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (line.is_discarded()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--profile=", path, " line ", line_number, ": not JSON"));
    }
    if (line.value("model", "") != model || !line.contains("batch")) continue;
    const int64_t batch = line["batch"].get<int64_t>();
    if (line.value("bench", "") == "gpt_fwd_bwd" && line.contains("memory")) {
      peaks[batch] = line["memory"].value("peak_bytes_in_use", 0.0);
    }
    if (line.value("scope", "") != "path") continue;
    LayerTimes& times = paths[batch][line.value("name", "")];
    times.forward_ms = line.value("forward_ms", 0.0);
    times.backward_ms = line.value("backward_ms", 0.0);
  }
  std::map<int64_t, Measured> measured;
  for (const auto& [batch, by_name] : paths) {
    for (const char* name : {"embed", "blocks.*", "ln_f", "lm_head"}) {
      if (!by_name.count(name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--profile=", path, ": batch ", batch, " of ", model, " has no \"",
            name, "\" path line (run gpt_bench --profile=1)"));
      }
    }
    Measured m;
    m.layers.push_back(by_name.at("embed"));
    const LayerTimes all_blocks = by_name.at("blocks.*");
    for (int i = 0; i < layers; ++i) {
      m.layers.push_back(
          {all_blocks.forward_ms / layers, all_blocks.backward_ms / layers});
    }
    m.layers.push_back(by_name.at("ln_f"));
    m.layers.push_back(by_name.at("lm_head"));
    m.peak_bytes = peaks.count(batch) ? peaks[batch] : 0;
    measured[batch] = std::move(m);
  }
  if (measured.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--profile=", path, ": ", model, " needs profiles at two or more ",
        "micro-batch sizes, found ", measured.size()));
  }
  return measured;
}

// Times of every pipeline layer at micro-batch `b`, interpolated (or
// extrapolated from the nearest two sizes; *extrapolated set).
std::vector<LayerTimes> TimesAt(const std::map<int64_t, Measured>& measured,
                                double b, bool* extrapolated) {
  auto upper = measured.lower_bound(static_cast<int64_t>(std::ceil(b)));
  if (upper != measured.end() && upper->first == b) {
    return upper->second.layers;
  }
  auto hi = upper, lo = upper;
  if (upper == measured.end()) {
    hi = std::prev(measured.end());
    lo = std::prev(hi);
    *extrapolated = true;
  } else if (upper == measured.begin()) {
    lo = upper;
    hi = std::next(upper);
    *extrapolated = true;
  } else {
    lo = std::prev(upper);
  }
  const double t = (b - lo->first) / static_cast<double>(hi->first - lo->first);
  std::vector<LayerTimes> times(lo->second.layers.size());
  for (size_t i = 0; i < times.size(); ++i) {
    const LayerTimes& a = lo->second.layers[i];
    const LayerTimes& c = hi->second.layers[i];
    times[i].forward_ms =
        std::max(0.0, a.forward_ms + t * (c.forward_ms - a.forward_ms));
    times[i].backward_ms =
        std::max(0.0, a.backward_ms + t * (c.backward_ms - a.backward_ms));
  }
  return times;
}

// The output head's loss buffers for a micro-batch of `sequences` (bf16
// activations, as gpt_bench and train_bench run).
nn::OutputHead::LossBuffers HeadBuffers(const nn::GptConfig& config,
                                        int64_t seq, int64_t loss_chunk_rows,
                                        double sequences) {
  return nn::OutputHead::LossBuffersFor(
      static_cast<int64_t>(std::llround(sequences * seq)), config.channels,
      config.table_rows(), DType::kBF16, loss_chunk_rows,
      /*trainable_weight=*/true);
}

// All of them at once: the head's forward, where gpt_bench's peak is.
double HeadPeakBytes(const nn::OutputHead::LossBuffers& buffers) {
  return static_cast<double>(buffers.logits_chunk_bytes + buffers.losses_bytes +
                             buffers.saved_bytes);
}

// Activation bytes one sequence keeps per block: the slope of the peak over
// micro-batch size between the smallest and largest measured sizes, less
// the head's loss buffers' slope between the same sizes (priced on the
// head's stage instead), spread over the blocks (0 when the profile has no
// memory, e.g. a CPU run).
double ActivationBytesPerSequenceAndBlock(
    const std::map<int64_t, Measured>& measured, const nn::GptConfig& config,
    int64_t seq, int64_t loss_chunk_rows) {
  const auto& first = *measured.begin();
  const auto& last = *measured.rbegin();
  if (first.second.peak_bytes <= 0 || last.second.peak_bytes <= 0) return 0;
  const double head =
      HeadPeakBytes(HeadBuffers(config, seq, loss_chunk_rows, last.first)) -
      HeadPeakBytes(HeadBuffers(config, seq, loss_chunk_rows, first.first));
  return std::max(0.0,
                  (last.second.peak_bytes - first.second.peak_bytes - head) /
                      static_cast<double>(last.first - first.first) /
                      config.num_layers);
}

struct Options {
  std::string profile;
  std::string model = "1.3B";
  int64_t seq = 1024;
  std::vector<int64_t> ranks, batches, micro_batches;
  std::vector<pipeline::ScheduleKind> schedules;
  std::string partition = "parameters";
  double link_gb_s = 100, link_latency_us = 10, collective_gb_s = 100;
  double tied_gb_s = 100;    // --tied_gb_s, by default collective_gb_s
  double element_bytes = 2;  // --dtype: bf16 (2) or f32 (4)
  double optimizer_params_per_s = 1.46e11, gpu_gib = 139;
  double weight_gradient_share = 0.5;
  int64_t loss_chunk_rows = 0;
  int64_t stages_per_rank = 2;  // interleaved_1f1b's v
};

absl::StatusOr<double> PositiveDouble(Flags& flags, const std::string& name,
                                      double fallback) {
  const std::string text = flags.GetString(name, "");
  if (text.empty()) return fallback;
  double value = 0;
  if (!absl::SimpleAtod(text, &value) || !(value > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": \"", text, "\" is not a positive number"));
  }
  return value;
}

absl::StatusOr<Options> ParseOptions(int argc, char** argv) {
  ZE_ASSIGN_OR_RETURN(Flags flags, Flags::Parse(argc, argv));
  Options o;
  o.profile = flags.GetString("profile", "");
  if (o.profile.empty()) {
    return absl::InvalidArgumentError("--profile=PATH is required");
  }
  o.model = flags.GetString("model", o.model);
  ZE_ASSIGN_OR_RETURN(o.seq, flags.GetInt("seq", 1024, 1, 1 << 20));
  ZE_ASSIGN_OR_RETURN(
      o.ranks, IntList("ranks", flags.GetString("ranks", "2,4,8"), 1, 1 << 16));
  ZE_ASSIGN_OR_RETURN(
      o.batches, IntList("batches", flags.GetString("batches", "32,64,128,256"),
                         1, int64_t{1} << 40));
  ZE_ASSIGN_OR_RETURN(
      o.micro_batches,
      IntList("micro_batches", flags.GetString("micro_batches", "1,2,4,8,16"),
              1, int64_t{1} << 40));
  for (const std::string& name :
       SplitList(flags.GetString("schedules", "gpipe,1f1b"))) {
    ZE_ASSIGN_OR_RETURN(pipeline::ScheduleKind kind,
                        pipeline::ParseScheduleKind(name));
    o.schedules.push_back(kind);
  }
  o.partition = flags.GetString("partition", o.partition);
  ZE_ASSIGN_OR_RETURN(o.stages_per_rank,
                      flags.GetInt("stages_per_rank", 2, 2, 1 << 10));
  ZE_ASSIGN_OR_RETURN(o.link_gb_s, PositiveDouble(flags, "link_gb_s", 100));
  ZE_ASSIGN_OR_RETURN(o.link_latency_us,
                      PositiveDouble(flags, "link_latency_us", 10));
  ZE_ASSIGN_OR_RETURN(o.collective_gb_s,
                      PositiveDouble(flags, "collective_gb_s", 100));
  ZE_ASSIGN_OR_RETURN(o.tied_gb_s,
                      PositiveDouble(flags, "tied_gb_s", o.collective_gb_s));
  const std::string dtype = flags.GetString("dtype", "bf16");
  if (dtype != "bf16" && dtype != "f32") {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype: \"", dtype,
                     "\" is not bf16 or f32 (the training dtype: "
                     "the bytes of a message and of the tied gradient)"));
  }
  o.element_bytes = dtype == "f32" ? 4 : 2;
  ZE_ASSIGN_OR_RETURN(o.optimizer_params_per_s,
                      PositiveDouble(flags, "optimizer_params_per_s", 1.46e11));
  ZE_ASSIGN_OR_RETURN(o.gpu_gib, PositiveDouble(flags, "gpu_gib", 139));
  ZE_ASSIGN_OR_RETURN(
      o.weight_gradient_share,
      PositiveDouble(flags, "weight_gradient_share", o.weight_gradient_share));
  ZE_ASSIGN_OR_RETURN(o.loss_chunk_rows,
                      flags.GetInt("loss_chunk_rows", 0, 0, int64_t{1} << 40));
  if (o.weight_gradient_share >= 1) {
    return absl::InvalidArgumentError(
        "--weight_gradient_share must be below 1 (a share of the backward)");
  }
  ZE_RETURN_IF_ERROR(flags.CheckAllUsed());
  return o;
}

Json Assumptions(const Options& o, double activation_bytes) {
  Json a;
  a["link_gb_s"] = o.link_gb_s;
  a["link_latency_us"] = o.link_latency_us;
  a["collective_gb_s"] = o.collective_gb_s;
  a["tied_gb_s"] = o.tied_gb_s;
  a["element_bytes"] = o.element_bytes;
  a["tied_reduce"] =
      "the tied (V, C) embedding gradient (element_bytes each) summed between "
      "the first and last rank after both finished the schedule, every rank "
      "waiting";
  a["optimizer_params_per_s"] = o.optimizer_params_per_s;
  a["state_bytes_per_parameter"] = 16;
  a["activation_bytes_per_sequence_and_block"] = activation_bytes;
  a["loss_chunk_rows"] = o.loss_chunk_rows;
  a["head_loss_buffers"] =
      "the head's stage: one bf16 logits chunk and the f32 losses, and per "
      "micro-batch awaiting its head backward the input gradient and the "
      "(V, C) f32 weight-gradient sum";
  a["gpu_gib"] = o.gpu_gib;
  a["stage_times"] = "sum of measured module times at the micro-batch size";
  a["forwards"] = "once per stage and micro-batch, none recomputed";
  a["weight_gradient_share"] = o.weight_gradient_share;
  a["interleaved_activations"] =
      "a rank's in-flight stage-forwards (pipeline::InFlightBound) shared "
      "equally by its stages";
  return a;
}

// The ZeRO-3 comparison for `batch` sequences over `gpus` GPUs.
Json ZeroThree(const Options& o, const std::map<int64_t, Measured>& measured,
               const nn::GptConfig& config, int64_t batch, int64_t gpus,
               double activation_bytes) {
  Json z;
  const int64_t per_gpu = batch / gpus;
  z["sequences_per_gpu"] = per_gpu;
  if (per_gpu < 1 || batch % gpus != 0) {
    z["error"] = "batch does not divide over the GPUs";
    return z;
  }
  const int64_t largest = measured.rbegin()->first;
  int64_t micro = std::min(per_gpu, largest);
  while (per_gpu % micro != 0) --micro;
  const int64_t accumulation = per_gpu / micro;
  bool extrapolated = false;
  double compute_ms = 0;
  for (const LayerTimes& t : TimesAt(measured, micro, &extrapolated)) {
    compute_ms += t.forward_ms + t.backward_ms;
  }
  compute_ms *= accumulation;
  const double parameters = static_cast<double>(config.NumParameters());
  compute_ms += parameters / gpus / o.optimizer_params_per_s * 1e3;
  // bf16 parameters gathered for each micro-batch's forward and backward,
  // gradients reduce-scattered once: (n - 1) / n of the model each time.
  const double share = (gpus - 1.0) / gpus;
  const double bytes = (2.0 * accumulation + 1.0) * 2.0 * parameters * share;
  const double comm_ms = bytes / (o.collective_gb_s * 1e9) * 1e3;
  const double state_gib = 16.0 * parameters / gpus / kGib;
  // Every GPU holds the head: its loss buffers for the one micro-batch.
  const double activation_gib =
      (activation_bytes * micro * config.num_layers +
       HeadPeakBytes(HeadBuffers(config, o.seq, o.loss_chunk_rows,
                                 static_cast<double>(micro)))) /
      kGib;
  z["micro_batch"] = micro;
  z["accumulation"] = accumulation;
  z["compute_ms"] = compute_ms;
  z["communication_ms"] = comm_ms;
  const double tokens = static_cast<double>(batch) * o.seq;
  z["tokens_per_s_overlapped"] = tokens / (std::max(compute_ms, comm_ms) / 1e3);
  z["tokens_per_s_serial"] = tokens / ((compute_ms + comm_ms) / 1e3);
  z["memory_gib"] = state_gib + activation_gib;
  z["fits"] = state_gib + activation_gib <= o.gpu_gib;
  z["extrapolated"] = extrapolated;
  return z;
}

absl::Status Run(const Options& o) {
  ZE_ASSIGN_OR_RETURN(nn::GptConfig config, ModelConfig(o.model, o.seq));
  ZE_ASSIGN_OR_RETURN(auto measured,
                      ReadProfile(o.profile, o.model, config.num_layers));
  const double activation_bytes = ActivationBytesPerSequenceAndBlock(
      measured, config, o.seq, o.loss_chunk_rows);
  const int head_layer = config.pipeline_layers() - 1;
  const std::vector<int64_t> weights = config.PipelineLayerWeights();
  const double message_bytes_per_sequence =
      o.element_bytes * static_cast<double>(o.seq) * config.channels;  // (T, C)
  double single_gpu_reference_ms = 0;
  for (const int64_t p : o.ranks) {
    for (const pipeline::ScheduleKind kind : o.schedules) {
      const bool interleaved =
          kind == pipeline::ScheduleKind::kInterleavedOneFOneB;
      const int v = interleaved ? static_cast<int>(o.stages_per_rank) : 1;
      ZE_ASSIGN_OR_RETURN(
          std::vector<pipeline::LayerRange> ranges,
          pipeline::PartitionLayers(weights, static_cast<int>(p) * v,
                                    o.partition, "--ranks", "--partition"));
      for (const int64_t batch : o.batches) {
        for (const int64_t m : o.micro_batches) {
          if (batch % m != 0) continue;
          // Interleaved 1F1B runs micro-batches in rounds of p.
          if (interleaved && m % p != 0) continue;
          const double b = static_cast<double>(batch / m);
          bool extrapolated = false;
          const std::vector<LayerTimes> times =
              TimesAt(measured, b, &extrapolated);
          ZE_ASSIGN_OR_RETURN(pipeline::Schedule schedule,
                              pipeline::BuildSchedule(kind, static_cast<int>(p),
                                                      static_cast<int>(m), v));
          pipeline::ActionCosts costs;
          Json stages = Json::array();
          std::vector<double> rank_memory_gib(p, 0);
          double one_gpu_ms = 0;
          const bool split = kind == pipeline::ScheduleKind::kZeroBubbleH1;
          for (size_t s = 0; s < ranges.size(); ++s) {
            const int rank = schedule.RankOfStage(static_cast<int>(s));
            double forward = 0, backward = 0, weight_gradients = 0;
            double parameters = 0;
            int blocks = 0;
            for (int layer = ranges[s].first; layer < ranges[s].last; ++layer) {
              forward += times[layer].forward_ms;
              backward += times[layer].backward_ms;
              parameters += static_cast<double>(weights[layer]);
              if (layer >= 1 && layer <= config.num_layers) {
                ++blocks;
                if (split) {
                  weight_gradients +=
                      o.weight_gradient_share * times[layer].backward_ms;
                }
              }
            }
            costs.stage_forward.push_back(forward / 1e3);
            costs.stage_backward_input.push_back((backward - weight_gradients) /
                                                 1e3);
            costs.stage_backward_weight.push_back(weight_gradients / 1e3);
            const double optimizer_s = parameters / o.optimizer_params_per_s;
            costs.stage_reduce.push_back(optimizer_s);
            one_gpu_ms += m * (forward + backward) + optimizer_s * 1e3;
            // A deferred weight gradient's inputs (zb_h1) priced as a
            // stashed micro-batch's activations; interleaved, the rank's
            // stage-forwards in flight shared by its v stages.
            const double stashed =
                static_cast<double>(pipeline::InFlightBound(schedule, rank)) /
                v;
            // The head's loss buffers: its backward runs whole in Bi, so
            // its saved sums follow the forwards in flight, not a deferred
            // weight gradient's.
            double loss_buffers = 0;
            if (ranges[s].first <= head_layer && head_layer < ranges[s].last) {
              const nn::OutputHead::LossBuffers head =
                  HeadBuffers(config, o.seq, o.loss_chunk_rows, b);
              loss_buffers =
                  static_cast<double>(head.logits_chunk_bytes +
                                      head.losses_bytes) +
                  static_cast<double>(head.saved_bytes) *
                      std::ceil(static_cast<double>(
                                    pipeline::ActivationBound(schedule, rank)) /
                                v);
            }
            const double activations = activation_bytes * b * blocks * stashed;
            const double memory_gib =
                (16.0 * parameters + activations + loss_buffers) / kGib;
            rank_memory_gib[rank] += memory_gib;
            Json stage;
            stage["layers"] = {ranges[s].first, ranges[s].last};
            stage["rank"] = rank;
            stage["blocks"] = blocks;
            stage["forward_ms"] = forward;
            stage["backward_ms"] = backward;
            if (split) stage["weight_gradient_ms"] = weight_gradients;
            stage["stashed_micro_batches"] = stashed;
            stage["activations_gib"] = activations / kGib;
            stage["loss_buffers_bytes"] = loss_buffers;
            stage["memory_gib"] = memory_gib;
            stage["fits"] = memory_gib <= o.gpu_gib;
            stages.push_back(stage);
          }
          costs.message = o.link_latency_us * 1e-6 +
                          message_bytes_per_sequence * b / (o.link_gb_s * 1e9);
          ZE_ASSIGN_OR_RETURN(pipeline::ScheduleStats stats,
                              pipeline::SimulateSchedule(schedule, costs));
          // The tied embedding's gradient (the first stage's table, the
          // last's head) summed between the two end ranks once both
          // finished (pipeline/executor.h); the boundary's all-reduce holds
          // every other rank until then. One rank holds both at p = 1.
          const double tied_s =
              p > 1
                  ? o.element_bytes * static_cast<double>(config.table_rows()) *
                        config.channels / (o.tied_gb_s * 1e9)
                  : 0.0;
          const double step_s = stats.makespan + tied_s;
          // Per rank: what train_bench's pipeline lines measure beside it
          // (busy_ms, bubble = idle over the step, the tied sum counted
          // idle as train_bench's tied_sum_ms is) and the memory of its
          // stages.
          Json ranks = Json::array();
          double idle_s = 0;
          for (int r = 0; r < p; ++r) {
            const double idle = step_s - stats.rank_busy[r];
            idle_s += idle;
            ranks.push_back({{"rank", r},
                             {"busy_ms", stats.rank_busy[r] * 1e3},
                             {"idle_ms", idle * 1e3},
                             {"bubble", idle / step_s},
                             {"schedule_bubble", stats.rank_bubble[r]},
                             {"memory_gib", rank_memory_gib[r]},
                             {"fits", rank_memory_gib[r] <= o.gpu_gib}});
          }
          const double tokens = static_cast<double>(batch) * o.seq;
          if (single_gpu_reference_ms == 0)
            single_gpu_reference_ms = one_gpu_ms;
          Json line;
          line["bench"] = "pipeline_model";
          line["model"] = o.model;
          line["schedule"] = pipeline::ScheduleName(kind);
          line["ranks"] = p;
          line["stages_per_rank"] = v;
          line["batch"] = batch;
          line["micro_batches"] = m;
          line["micro_batch"] = b;
          line["seq"] = o.seq;
          line["partition"] = o.partition;
          line["step_ms"] = step_s * 1e3;
          line["schedule_ms"] = stats.makespan * 1e3;
          line["tied_reduce_ms"] = tied_s * 1e3;
          line["tokens_per_s"] = tokens / step_s;
          line["tokens_per_s_per_gpu"] = tokens / step_s / p;
          line["bubble"] = idle_s / (step_s * static_cast<double>(p));
          line["schedule_bubble"] = stats.bubble_fraction;
          line["bubble_equal_stages"] =
              pipeline::ExpectedBubbleFraction(schedule);
          line["message_ms"] = costs.message * 1e3;
          // The same micro-batches one after another on one GPU (if it
          // held the model): what the pipeline's p GPUs are compared with.
          line["one_gpu_step_ms"] = one_gpu_ms;
          line["speedup_over_one_gpu"] = one_gpu_ms / (step_s * 1e3);
          line["stages"] = stages;
          line["per_rank"] = ranks;
          line["extrapolated"] = extrapolated;
          line["zero3_same_gpus"] =
              ZeroThree(o, measured, config, batch, p, activation_bytes);
          line["assumptions"] = Assumptions(o, activation_bytes);
          PrintJson(line);
        }
      }
    }
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  absl::StatusOr<Options> options = ParseOptions(argc, argv);
  absl::Status status = options.ok() ? Run(*options) : options.status();
  if (!status.ok()) {
    Json line;
    line["bench"] = "pipeline_model";
    line["error"] = status.ToString();
    PrintJson(line);
    std::fprintf(stderr, "pipeline_model: %s\n", status.ToString().c_str());
    return 2;
  }
  return 0;
}

}  // namespace
}  // namespace bench
}  // namespace ze

int main(int argc, char** argv) { return ze::bench::Main(argc, argv); }
