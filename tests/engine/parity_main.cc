// Parity of ZeRO stages 0-3 across world sizes, through the public API.
//
//   parity_main run --out=DIR [--configs=reference|all] [--only=NAME]
//                                                  (under mpirun -np W)
//   parity_main compare --dir=DIR --world=W [--only=NAME]
//
// --only runs (or compares) just the configuration called NAME, e.g.
// w2_f32_sgd_s0_a1_m2 (its reference: --configs=reference
// --only=w1_f32_sgd_s0_a2_m2), so one run can be repeated on its own.
//
// `run` trains a tiny GPT for 10 optimizer steps under every combination of
// dtype {f32, bf16, fp16 with dynamic loss scaling} x optimizer {SGD with
// momentum, AdamW} x stage {0, 1, 2, 3} x gradient accumulation {1, 2} and
// writes, on rank 0, one file per run with the 10 losses and every final f32
// master weight; and with ZeRO-Offload (offload_optimizer at stages 1-3, half
// the buckets offloaded by `ratio` at stage 2, and offload_param with it at
// stage 3), each compared with the reference and, tighter, with the same run
// without offload. With --configs=reference (world size 1) it instead runs
// stage 0 with the accumulation counts the other world sizes are compared
// against, plus micro-batch 4 x accumulation 1 (compared with micro-batch 2
// x accumulation 2).
//
// Why the comparison is exact in principle: rank r's micro-batch m of step s
// holds global samples ((s*A + m)*W + r)*B + i, so world size W with
// accumulation A sees the same samples per step as one rank with
// accumulation A*W, and the engine averages gradients over both. Only the
// order of floating-point sums differs.
//
// `compare` checks every world-size-W run against the world-size-1 stage-0
// reference with the same dtype and optimizer, prints the largest
// differences, and exits non-zero beyond the tolerances below.
#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/factory.h"
#include "core/logging.h"
#include "core/ops.h"
#include "core/status.h"
#include "engine/engine.h"
#include "nn/gpt.h"
#include "tests/engine/engine_test_util.h"

namespace ze {
namespace {

constexpr int kSteps = 10;
// The deterministic corpus the other engine tests train on.
using enginetest::FillSample;
using enginetest::kSeqLen;
using enginetest::kVocab;

struct RunSpec {
  std::string dtype;      // f32, bf16, fp16
  std::string optimizer;  // sgd, adamw
  int stage = 0;
  int accumulation = 1;
  int micro = 2;
  // ZeRO-Offload: "" (none), "cpu" (offload_optimizer, with the
  // experimental CPU/GPU split asked for: split_update), "cpuhalf"
  // (offload_optimizer with ratio 0.5: half the buckets' optimizer on the
  // device), "cpuparam" (offload_optimizer and offload_param, stage 3),
  // "cpudelay" (offload_optimizer with delayed_update: different maths,
  // compared across world sizes with itself), "nvme" (offload_optimizer on
  // NVMe, stage 3; swap files under --out), "nvmeparam" (as "cpuparam" with
  // the parameters in a swap file under --out, nothing kept in CPU memory,
  // two swap buffers: compared with "cpuparam", exactly on the CPU; on a
  // GPU within the dtype's tolerance, as "serial"), "cpuhalfparam" and
  // "nvmehalfparam" (as "cpuparam" and "nvmeparam" with ratio 0.5: the
  // device-updated buckets' weights copied to the host or the swap file;
  // issue 28), the second compared with the first as "nvmeparam" is with
  // "cpuparam", "noclip" (no offload, no
  // gradient clipping) and "cpuearly" (offload_optimizer without clipping:
  // stage 2 starts the CPU update during backward), compared with each
  // other; "serial" (no offload, overlap_comm false at accumulation 2, so
  // every collective runs on the compute stream), compared with the same
  // run with overlap_comm: the communication stream must change when things
  // run, never what they compute. On the CPU exactly; on a GPU within the
  // dtype's tolerance, because the CUDA kernels sum some gradients with
  // atomicAdd (embedding, LayerNorm weights, attention's dq), whose order
  // changes from run to run (measured 2026-12-04: f32 runs differ by 1-2
  // f32 ulps, 1.5e-8 to 1.1e-7, serial or not). A race on the stream would
  // show up as far more than that. "master16" (bf16, no offload, the exact
  // 16+16 master: bf16.master_weights_16_plus_16) is compared with the same
  // run's f32 master within the dtype's tolerance: they are identical until
  // a master weight sits exactly on a bf16 tie above an even value (about
  // one update in 2^17; tests/engine:master16 checks exactness up to it),
  // then its forward weight is one bf16 step apart and bf16 training drifts
  // from there as a reordered sum would (measured 2026-12-06 at 1 rank: 4
  // of 8 runs met a tie within 10 steps, final loss 1.1e-4 apart).
  std::string offload;
  std::string Name(int world) const {
    return absl::StrCat("w", world, "_", dtype, "_", optimizer, "_s", stage,
                        "_a", accumulation, "_m", micro,
                        offload.empty() ? "" : "_o", offload);
  }
};

// Tolerances, relative to max(1, |reference|). f32 differs only by the order
// of sums; bf16/fp16 round gradients to 8/11 bits at every accumulation and
// reduction, so their runs drift further apart over 10 steps.
struct Tolerance {
  double loss;
  double weight;
};
Tolerance ToleranceFor(const std::string& dtype) {
  // Measured on CPU at world sizes 1-4 (2026-12-02): largest loss / weight
  // differences f32 9e-8 / 1.2e-7, fp16 2.2e-5 / 1.1e-4, bf16 3.4e-4 /
  // 1.2e-3. The tolerances leave about 10x room.
  if (dtype == "f32") return {1e-5, 1e-5};
  if (dtype == "fp16") return {5e-4, 2e-3};
  return {3e-3, 1e-2};  // bf16
}

// AdamW's eps is 1e-3 here, not 1e-8: attention's key bias has an exactly
// zero gradient (softmax ignores a shift shared by all keys), so its
// "gradient" is rounding noise, and with a tiny eps Adam turns that noise into
// full +-lr steps whose signs depend on the order of floating-point sums.
// A larger eps bounds that amplification without hiding real differences.
// Where "nvme" runs keep their swap files (a directory under --out).
std::string& NvmeDirectory() {
  static std::string directory;
  return directory;
}

std::string OffloadJson(const std::string& offload) {
  if (offload.empty() || offload == "noclip" || offload == "serial" ||
      offload == "master16") {
    return "";
  }
  if (offload == "nvme") {
    // Small aio blocks and two buffers: the pipeline wraps around often.
    return absl::StrCat(
        R"(, "sub_group_size": 100, "offload_optimizer": {"device": "nvme", "nvme_path": ")",
        NvmeDirectory(), R"(", "buffer_count": 2})");
  }
  // A small sub_group_size: the offloaded step runs in many chunks.
  const std::string optimizer = absl::StrCat(
      R"(, "sub_group_size": 100, "offload_optimizer": {"device": "cpu", "pin_memory": true)",
      offload == "cpuhalf" || offload == "cpuhalfparam" ||
              offload == "nvmehalfparam"
          ? R"(, "ratio": 0.5)"
          : "",
      // The CPU/GPU split (on a GPU; off by default) where it can run.
      offload == "cpu" ? R"(, "split_update": true)" : "",
      offload == "cpudelay" ? R"(, "delayed_update": true)" : "", "}");
  std::string param =
      offload == "cpuparam" || offload == "cpuhalfparam"
          ? R"(, "offload_param": {"device": "cpu", "pin_memory": true})"
          : "";
  if (offload == "nvmeparam" || offload == "nvmehalfparam") {
    param = absl::StrCat(
        R"(, "offload_param": {"device": "nvme", "pin_memory": true, "nvme_path": ")",
        NvmeDirectory(), R"(", "max_in_cpu": 0, "buffer_count": 2})");
  }
  return optimizer + param;
}

std::string ConfigJson(const RunSpec& spec, int world) {
  const std::string optimizer =
      spec.optimizer == "sgd"
          ? R"("optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}})"
          : R"("optimizer": {"type": "AdamW", "params": {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-3, "weight_decay": 0.01}})";
  std::string precision;
  if (spec.dtype == "bf16") {
    precision =
        spec.offload == "master16"
            ? R"("bf16": {"enabled": true, "master_weights_16_plus_16": true},)"
            : R"("bf16": {"enabled": true},)";
  }
  if (spec.dtype == "fp16") {
    precision =
        R"("fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 10, "loss_scale_window": 4, "hysteresis": 2},)";
  }
  // Small buckets so every run has several (and parameters straddle rank
  // slices); a scheduler so the learning rate changes every step.
  return absl::StrCat(
      "{", R"("train_micro_batch_size_per_gpu": )", spec.micro, ",",
      R"("gradient_accumulation_steps": )", spec.accumulation, ",",
      R"("steps_per_print": 5, "gradient_clipping": )",
      spec.offload == "noclip" || spec.offload == "cpuearly" ? "0.0" : "1.0",
      ",", optimizer, ",", precision,
      R"("scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": )",
      spec.optimizer == "sgd" ? "0.1" : "0.01",
      R"(, "warmup_num_steps": 4, "warmup_type": "linear"}},)",
      R"("zero_optimization": {"stage": )", spec.stage,
      R"(, "reduce_bucket_size": 700, "allgather_bucket_size": 900)",
      // Half the runs reduce on a separate stream (on a GPU), half on the
      // compute stream, so both orderings are checked.
      R"(, "overlap_comm": )",
      spec.accumulation == 2 && spec.offload != "serial" ? "true" : "false",
      // Stage 3: nothing persistent (every module fetched on demand), and a
      // prefetch window of a few modules.
      spec.stage == 3
          ? R"(, "stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 3000)"
          : "",
      OffloadJson(spec.offload), "}}");
  (void)world;
}

// Every rank must start from the same (seeded) weights. Checked before
// training, so a rank that did not fails here naming the parameter instead of
// as a loss trajectory drifting from the reference: a race in the engine's
// setup once left one weight matrix all zero on one rank.
absl::Status CheckSameInitialWeights(engine::Engine& engine,
                                     comm::Communicator& communicator,
                                     const std::string& run) {
  const std::vector<std::string> names = engine.ParameterNames();
  // Per parameter, a 24-bit hash of its f32 bits: exact as a float, so the
  // maximum and minimum over ranks agree exactly when every rank's does.
  std::vector<float> high(names.size()), low(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    ZE_ASSIGN_OR_RETURN(std::vector<float> weights,
                        engine.GatherMasterWeights(names[i]));
    uint32_t hash = 2166136261u;
    for (float weight : weights) {
      uint32_t bits;
      std::memcpy(&bits, &weight, sizeof(bits));
      hash = (hash ^ bits) * 16777619u;
    }
    high[i] = low[i] = static_cast<float>(hash & 0xffffffu);
  }
  const int64_t count = static_cast<int64_t>(names.size());
  // The NCCL backend only takes tensors on its device, so there the values
  // are reduced as a device copy; the MPI and local backends take them from
  // the host.
  const Device device = communicator.device();
  for (auto [values, op] : {std::make_pair(&high, comm::ReduceOp::kMax),
                            std::make_pair(&low, comm::ReduceOp::kMin)}) {
    Tensor host =
        Tensor::Wrap(values->data(), {count}, DType::kF32, Device::Cpu());
    if (device.is_cpu() ||
        std::strcmp(communicator.backend_name(), "nccl") != 0) {
      ZE_ASSIGN_OR_RETURN(comm::Work work,
                          communicator.AllReduce(host, host, op, Stream()));
      ZE_RETURN_IF_ERROR(work.Wait());
      continue;
    }
    ZE_ASSIGN_OR_RETURN(Stream stream, Stream::Create(device));
    ZE_ASSIGN_OR_RETURN(Tensor on_device,
                        Tensor::Empty({count}, DType::kF32, device));
    ZE_RETURN_IF_ERROR(Copy(host, on_device, stream));
    ZE_ASSIGN_OR_RETURN(comm::Work work, communicator.AllReduce(
                                             on_device, on_device, op, stream));
    ZE_RETURN_IF_ERROR(work.StreamWait(stream));
    ZE_RETURN_IF_ERROR(Copy(on_device, host, stream));
    ZE_RETURN_IF_ERROR(stream.Synchronize());
  }
  std::string differing;
  for (size_t i = 0; i < names.size(); ++i) {
    if (high[i] != low[i]) absl::StrAppend(&differing, " ", names[i]);
  }
  if (differing.empty()) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(run, ": the ranks start from different weights (rank ",
                   communicator.rank(), "'s check) in:", differing));
}

absl::Status RunOne(const RunSpec& spec,
                    std::shared_ptr<comm::Communicator> communicator,
                    const std::string& out_dir) {
  const int world = communicator->world_size();
  const int rank = communicator->rank();
  nn::GptConfig gpt;
  gpt.num_layers = 2;
  gpt.num_heads = 2;
  gpt.channels = 16;
  gpt.vocab_size = kVocab;
  gpt.max_seq_len = kSeqLen;
  // Every f32 SGD run (reference and compared run alike) checkpoints its
  // blocks: gradients are bit-identical with and without checkpointing, so
  // the references stay valid, and the engine's gradient-readiness counting
  // must hold while blocks recompute their forward inside backward.
  gpt.activation_checkpointing = spec.dtype == "f32" && spec.optimizer == "sgd";
  nn::GptOptions options;
  options.device = communicator->device();
  options.dtype = spec.dtype == "f32"    ? DType::kF32
                  : spec.dtype == "bf16" ? DType::kBF16
                                         : DType::kF16;
  options.seed = 1234;
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptModel> created,
                      nn::GptModel::Create(gpt, options));
  std::shared_ptr<nn::GptModel> model(std::move(created));
  ZE_ASSIGN_OR_RETURN(
      std::unique_ptr<engine::Engine> engine,
      engine::Initialize(model, ConfigJson(spec, world), communicator));
  ZE_RETURN_IF_ERROR(
      CheckSameInitialWeights(*engine, *communicator, spec.Name(world)));
  std::vector<double> losses;
  std::vector<int32_t> tokens(spec.micro * kSeqLen), targets(tokens.size());
  for (int step = 0; step < kSteps; ++step) {
    for (int micro = 0; micro < spec.accumulation; ++micro) {
      for (int i = 0; i < spec.micro; ++i) {
        const int64_t sample =
            ((static_cast<int64_t>(step) * spec.accumulation + micro) * world +
             rank) *
                spec.micro +
            i;
        FillSample(sample, &tokens[i * kSeqLen], &targets[i * kSeqLen]);
      }
      Tensor token_tensor = Tensor::Wrap(tokens.data(), {spec.micro, kSeqLen},
                                         DType::kI32, Device::Cpu());
      Tensor target_tensor = Tensor::Wrap(targets.data(), {spec.micro, kSeqLen},
                                          DType::kI32, Device::Cpu());
      ZE_RETURN_IF_ERROR(engine->Forward(token_tensor, target_tensor).status());
      ZE_RETURN_IF_ERROR(engine->Backward());
      ZE_ASSIGN_OR_RETURN(engine::StepReport report, engine->Step());
      if (report.boundary) losses.push_back(report.loss);
    }
  }
  std::ostringstream text;
  text.precision(9);
  text << "losses";
  for (double loss : losses) text << " " << loss;
  text << "\nskipped " << engine->counters().skipped_steps << "\n";
  for (const std::string& name : engine->ParameterNames()) {
    ZE_ASSIGN_OR_RETURN(std::vector<float> weights,
                        engine->GatherMasterWeights(name));
    text << "param " << name;
    for (float weight : weights) text << " " << weight;
    text << "\n";
  }
  if (rank == 0) {
    std::ofstream file(absl::StrCat(out_dir, "/", spec.Name(world), ".txt"));
    file << text.str();
    if (!file) {
      return absl::InternalError(absl::StrCat("cannot write ", out_dir));
    }
  }
  return absl::OkStatus();
}

struct RunResult {
  std::vector<double> losses;
  std::map<std::string, std::vector<double>> params;
};

absl::StatusOr<RunResult> ReadResult(const std::string& path) {
  std::ifstream file(path);
  if (!file) return absl::NotFoundError(absl::StrCat("missing result ", path));
  RunResult result;
  std::string line;
  while (std::getline(file, line)) {
    std::istringstream words(line);
    std::string kind;
    words >> kind;
    if (kind == "losses") {
      double value;
      while (words >> value) result.losses.push_back(value);
    } else if (kind == "param") {
      std::string name;
      words >> name;
      double value;
      std::vector<double>& values = result.params[name];
      while (words >> value) values.push_back(value);
    }
  }
  return result;
}

// Largest |a - b| / max(1, |b|) over the losses and over the weights.
absl::Status Compare(const std::string& dir, const std::string& name,
                     const std::string& reference_name,
                     const Tolerance& tolerance, bool* all_ok) {
  ZE_ASSIGN_OR_RETURN(RunResult run,
                      ReadResult(absl::StrCat(dir, "/", name, ".txt")));
  ZE_ASSIGN_OR_RETURN(
      RunResult reference,
      ReadResult(absl::StrCat(dir, "/", reference_name, ".txt")));
  if (run.losses.size() != kSteps || reference.losses.size() != kSteps ||
      run.params.size() != reference.params.size()) {
    return absl::DataLossError(absl::StrCat("incomplete results for ", name));
  }
  double loss_error = 0, weight_error = 0;
  for (int i = 0; i < kSteps; ++i) {
    loss_error =
        std::max(loss_error, std::abs(run.losses[i] - reference.losses[i]) /
                                 std::max(1.0, std::abs(reference.losses[i])));
  }
  std::string worst;
  for (const auto& [param, values] : reference.params) {
    const std::vector<double>& other = run.params[param];
    if (other.size() != values.size()) {
      return absl::DataLossError(
          absl::StrCat(name, ": ", param, " size differs"));
    }
    for (size_t i = 0; i < values.size(); ++i) {
      const double error =
          std::abs(other[i] - values[i]) / std::max(1.0, std::abs(values[i]));
      if (error > weight_error) {
        weight_error = error;
        worst = param;
      }
    }
  }
  const bool ok =
      loss_error <= tolerance.loss && weight_error <= tolerance.weight;
  std::printf(
      "%s %-28s vs %-28s loss %.2e (tol %.0e) weights %.2e (tol %.0e, %s) "
      "first/last loss %.5f/%.5f\n",
      ok ? "ok  " : "FAIL", name.c_str(), reference_name.c_str(), loss_error,
      tolerance.loss, weight_error, tolerance.weight, worst.c_str(),
      run.losses.front(), run.losses.back());
  if (!ok) {
    *all_ok = false;
    // Both trajectories, so a failure that does not reproduce (a race)
    // still shows at which step the run left the reference.
    std::printf("     step  %-14s %-14s\n", "run loss", "reference");
    for (size_t i = 0; i < run.losses.size() && i < reference.losses.size();
         ++i) {
      std::printf("     %4zu  %-14.8f %-14.8f%s\n", i, run.losses[i],
                  reference.losses[i],
                  std::abs(run.losses[i] - reference.losses[i]) /
                              std::max(1.0, std::abs(reference.losses[i])) >
                          tolerance.loss
                      ? "  <-"
                      : "");
    }
  }
  return absl::OkStatus();
}

// The delayed update trains on one-step-stale gradients, so it is compared
// with itself: at world size W with the world-size-1 run of accumulation
// A * W (the same samples per step), and at world size 1 it must differ
// from the same run without the delay (the delay is in effect) while its
// loss still falls.
absl::Status CompareDelayed(const std::string& dir, const RunSpec& spec,
                            int world, bool* all_ok) {
  if (world > 1) {
    RunSpec reference = spec;
    reference.accumulation = spec.accumulation * world;
    return Compare(dir, spec.Name(world), reference.Name(1),
                   ToleranceFor(spec.dtype), all_ok);
  }
  RunSpec undelayed = spec;
  undelayed.offload = "cpu";
  ZE_ASSIGN_OR_RETURN(RunResult delayed,
                      ReadResult(absl::StrCat(dir, "/", spec.Name(1), ".txt")));
  ZE_ASSIGN_OR_RETURN(
      RunResult plain,
      ReadResult(absl::StrCat(dir, "/", undelayed.Name(1), ".txt")));
  double difference = 0;
  for (size_t i = 0; i < delayed.losses.size() && i < plain.losses.size();
       ++i) {
    difference =
        std::max(difference, std::abs(delayed.losses[i] - plain.losses[i]));
  }
  const bool falls = delayed.losses.size() == kSteps &&
                     delayed.losses.back() < delayed.losses.front();
  // The first step's loss is the same (nothing was updated yet).
  const bool same_start = !delayed.losses.empty() && !plain.losses.empty() &&
                          delayed.losses[0] == plain.losses[0];
  const bool ok = difference > 0 && falls && same_start;
  if (!ok) *all_ok = false;
  std::printf(
      "%s %-30s delayed vs undelayed: largest loss difference %.2e, "
      "loss %g -> %g\n",
      ok ? "ok  " : "FAIL", spec.Name(1).c_str(), difference,
      delayed.losses.empty() ? 0.0 : delayed.losses.front(),
      delayed.losses.empty() ? 0.0 : delayed.losses.back());
  return absl::OkStatus();
}

std::vector<RunSpec> Matrix() {
  std::vector<RunSpec> specs;
  for (const char* dtype : {"f32", "bf16", "fp16"}) {
    for (const char* optimizer : {"sgd", "adamw"}) {
      for (int stage : {0, 1, 2, 3}) {
        for (int accumulation : {1, 2}) {
          specs.push_back({dtype, optimizer, stage, accumulation, 2});
        }
      }
      // Offload at every stage that allows it.
      for (int accumulation : {1, 2}) {
        for (int stage : {1, 2, 3}) {
          specs.push_back({dtype, optimizer, stage, accumulation, 2, "cpu"});
        }
        specs.push_back({dtype, optimizer, 2, accumulation, 2, "cpuhalf"});
        specs.push_back({dtype, optimizer, 3, accumulation, 2, "cpuparam"});
        specs.push_back({dtype, optimizer, 3, accumulation, 2, "nvmeparam"});
        specs.push_back({dtype, optimizer, 3, accumulation, 2, "cpuhalfparam"});
        specs.push_back(
            {dtype, optimizer, 3, accumulation, 2, "nvmehalfparam"});
        specs.push_back({dtype, optimizer, 3, accumulation, 2, "nvme"});
      }
    }
  }
  // The update begun during backward (no clipping), stage 2.
  for (const char* dtype : {"f32", "bf16"}) {
    for (const char* optimizer : {"sgd", "adamw"}) {
      for (int accumulation : {1, 2}) {
        specs.push_back({dtype, optimizer, 2, accumulation, 2, "noclip"});
        specs.push_back({dtype, optimizer, 2, accumulation, 2, "cpuearly"});
      }
    }
  }
  // The delayed update, stages 1-2.
  for (const char* dtype : {"f32", "bf16"}) {
    for (int stage : {1, 2}) {
      specs.push_back({dtype, "adamw", stage, 1, 2, "cpudelay"});
    }
  }
  // The exact 16+16 master against the f32 master, every stage.
  for (const char* optimizer : {"sgd", "adamw"}) {
    for (int stage = 0; stage <= 3; ++stage) {
      specs.push_back({"bf16", optimizer, stage, 2, 2, "master16"});
    }
  }
  // Collectives on the compute stream against the communication stream.
  for (const char* dtype : {"f32", "bf16"}) {
    for (int stage : {2, 3}) {
      specs.push_back({dtype, "adamw", stage, 2, 2, "serial"});
    }
  }
  return specs;
}

// Offloading moves where the optimizer runs, not what it computes: the same
// f32 expression on the host (offload/'s kernel) as on the device. On the
// CPU both are that kernel, bit for bit; on a GPU the CUDA kernel may round
// sqrt and division differently in the last bit.
Tolerance OffloadTolerance(const std::string& dtype) {
  if (dtype == "f32") return {1e-6, 1e-6};
  return {1e-4, 1e-4};
}

std::vector<RunSpec> ReferenceMatrix() {
  std::vector<RunSpec> specs;
  for (const char* dtype : {"f32", "bf16", "fp16"}) {
    for (const char* optimizer : {"sgd", "adamw"}) {
      for (int accumulation : {1, 2, 3, 4, 6, 8}) {
        specs.push_back({dtype, optimizer, 0, accumulation, 2});
      }
      specs.push_back({dtype, optimizer, 0, 1, 4});
    }
  }
  // What the delayed-update runs at world size W compare with.
  for (const char* dtype : {"f32", "bf16"}) {
    for (int stage : {1, 2}) {
      for (int accumulation : {1, 2, 3, 4}) {
        specs.push_back({dtype, "adamw", stage, accumulation, 2, "cpudelay"});
      }
    }
  }
  return specs;
}

std::string Flag(int argc, char** argv, const std::string& name,
                 const std::string& fallback) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]).rfind(prefix, 0) == 0) {
      return std::string(argv[i]).substr(prefix.size());
    }
  }
  return fallback;
}

int Main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "run") {
    const std::string out = Flag(argc, argv, "out", ".");
    NvmeDirectory() = out + "/nvme";
    mkdir(NvmeDirectory().c_str(), 0755);  // every rank; EEXIST is fine
    comm::CommOptions options;
    options.device = Flag(argc, argv, "device", "cpu");
    absl::StatusOr<std::unique_ptr<comm::Communicator>> created =
        comm::CreateCommunicator(options);
    if (!created.ok()) {
      std::cerr << created.status() << "\n";
      return 1;
    }
    std::shared_ptr<comm::Communicator> communicator =
        std::move(created).value();
    SetMinLogLevel(LogLevel::kWarning);
    const bool reference = Flag(argc, argv, "configs", "all") == "reference";
    const std::string only = Flag(argc, argv, "only", "");
    for (const RunSpec& spec : reference ? ReferenceMatrix() : Matrix()) {
      if (!only.empty() && spec.Name(communicator->world_size()) != only) {
        continue;
      }
      absl::Status status = RunOne(spec, communicator, out);
      if (!status.ok()) {
        std::cerr << "rank " << communicator->rank() << ": "
                  << spec.Name(communicator->world_size()) << ": " << status
                  << "\n";
        return 1;
      }
    }
    return 0;
  }
  if (mode == "compare") {
    const std::string dir = Flag(argc, argv, "dir", ".");
    const int world = std::atoi(Flag(argc, argv, "world", "2").c_str());
    const std::string only = Flag(argc, argv, "only", "");
    // Where the runs ran (the `run` mode's --device): decides whether runs
    // that must agree exactly on the CPU can, see RunSpec::offload.
    const bool on_cuda =
        absl::StartsWith(Flag(argc, argv, "device", "cpu"), "cuda");
    bool all_ok = true;
    for (const RunSpec& spec : Matrix()) {
      if (!only.empty() && spec.Name(world) != only) continue;
      RunSpec reference = spec;
      reference.stage = 0;
      reference.accumulation = spec.accumulation * world;
      reference.offload.clear();
      if (spec.offload == "noclip") continue;  // cpuearly's reference
      if (spec.offload == "cpuearly") {
        RunSpec unclipped = spec;
        unclipped.offload = "noclip";
        absl::Status status =
            Compare(dir, spec.Name(world), unclipped.Name(world),
                    OffloadTolerance(spec.dtype), &all_ok);
        if (!status.ok()) {
          std::cerr << status << "\n";
          return 1;
        }
        continue;
      }
      if (spec.offload == "cpudelay") {
        absl::Status status = CompareDelayed(dir, spec, world, &all_ok);
        if (!status.ok()) {
          std::cerr << status << "\n";
          return 1;
        }
        continue;
      }
      absl::Status status = Compare(dir, spec.Name(world), reference.Name(1),
                                    ToleranceFor(spec.dtype), &all_ok);
      if (status.ok() && !spec.offload.empty()) {
        // And against the same run without offload (or with overlap_comm,
        // or with the f32 master), at this world size.
        RunSpec on_device = spec;
        on_device.offload.clear();
        Tolerance tolerance = OffloadTolerance(spec.dtype);
        if (spec.offload == "master16") tolerance = ToleranceFor(spec.dtype);
        if (spec.offload == "serial") {
          tolerance = on_cuda ? ToleranceFor(spec.dtype) : Tolerance{0, 0};
        }
        if (spec.offload == "nvmeparam" || spec.offload == "nvmehalfparam") {
          // Only where the weights live differs from "cpuparam" (or
          // "cpuhalfparam").
          on_device.offload =
              spec.offload == "nvmeparam" ? "cpuparam" : "cpuhalfparam";
          tolerance = on_cuda ? ToleranceFor(spec.dtype) : Tolerance{0, 0};
        }
        status = Compare(dir, spec.Name(world), on_device.Name(world),
                         tolerance, &all_ok);
      }
      if (!status.ok()) {
        std::cerr << status << "\n";
        return 1;
      }
    }
    if (world == 1 && only.empty()) {
      // Micro-batch 2 x accumulation 2 against micro-batch 4 x accumulation 1.
      for (const char* dtype : {"f32", "bf16", "fp16"}) {
        for (const char* optimizer : {"sgd", "adamw"}) {
          RunSpec split{dtype, optimizer, 0, 2, 2};
          RunSpec whole{dtype, optimizer, 0, 1, 4};
          absl::Status status = Compare(dir, split.Name(1), whole.Name(1),
                                        ToleranceFor(dtype), &all_ok);
          if (!status.ok()) {
            std::cerr << status << "\n";
            return 1;
          }
        }
      }
    }
    std::printf("parity at world size %d: %s\n", world,
                all_ok ? "PASSED" : "FAILED");
    return all_ok ? 0 : 1;
  }
  std::cerr << "usage: parity_main run --out=DIR [--configs=reference] | "
               "compare --dir=DIR --world=W\n";
  return 2;
}

}  // namespace
}  // namespace ze

int main(int argc, char** argv) { return ze::Main(argc, argv); }
