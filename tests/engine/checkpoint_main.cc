// Checkpoints through the public API, as a user runs them: separate mpirun
// jobs that train, save, and resume at any world size, stage and offload.
//
//   checkpoint_main train --out=FILE --stage=S [--offload=none|cpu|nvme]
//       [--dtype=f32|bf16] [--from=A] [--to=B] [--load=DIR [--tag=T]]
//       [--save=DIR] [--weights_only] [--load_weights=FILE] [--channels=C]
//                                                    (under mpirun -np W)
//   checkpoint_main compare --a=FILE --b=FILE [--exact] [--tolerance=X]
//   checkpoint_main kill_during_save --save=DIR --stage=S --victim=R
//       [--kill_after_bytes=N]                         (under mpirun -np W)
//
// `train` builds a tiny GPT, optionally loads a checkpoint (then --from
// must equal the step the checkpoint's client_state says comes next) or a
// safetensors file of full weights (Engine::LoadWeights), runs
// optimizer steps [from, to), writes the losses of those steps and every
// final f32 master weight to FILE (rank 0), and optionally saves.
//
// Every step trains on the same 12 global samples whatever the world size
// (W ranks x 12 / W each, accumulation 1), so runs at different world sizes
// and stages see the same data and differ only by the order of
// floating-point sums: that is what makes resharded resumes comparable
// with a straight single-rank run.
//
// `kill_during_save` trains 2 steps, saves tag "first", trains one more
// step and saves tag "second"; rank `victim` dies by SIGKILL when its rank
// file of the second save reaches N bytes. The job dies; the test then
// checks that `latest` still names "first" and that it loads.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/factory.h"
#include "core/status.h"
#include "engine/engine.h"
#include "nn/gpt.h"
#include "tests/engine/engine_test_util.h"

namespace ze {
namespace {

constexpr int kGlobalBatch = 12;  // divides by 1, 2, 3, 4
// The deterministic corpus the other engine tests train on.
using enginetest::FillSample;
using enginetest::kSeqLen;
using enginetest::kVocab;

std::map<std::string, std::string> ParseFlags(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) continue;
    const size_t equals = arg.find('=');
    if (equals == std::string::npos) {
      flags[arg.substr(2)] = "1";
    } else {
      flags[arg.substr(2, equals - 2)] = arg.substr(equals + 1);
    }
  }
  return flags;
}

std::string Get(const std::map<std::string, std::string>& flags,
                const std::string& key, const std::string& fallback) {
  auto found = flags.find(key);
  return found == flags.end() ? fallback : found->second;
}

struct Setup {
  int stage = 0;
  std::string offload = "none";
  std::string dtype = "f32";
  std::string nvme_directory;
  int channels = 16;
};

std::string ConfigJson(const Setup& setup, int world) {
  std::string offload;
  if (setup.offload == "cpu") {
    offload =
        R"(, "sub_group_size": 100, "offload_optimizer": {"device": "cpu"})";
    if (setup.stage == 3) {
      offload += R"(, "offload_param": {"device": "cpu"})";
    }
  } else if (setup.offload == "nvme") {
    offload = absl::StrCat(
        R"(, "sub_group_size": 100, "offload_optimizer": {"device": "nvme", "nvme_path": ")",
        setup.nvme_directory, R"(", "buffer_count": 2})");
  }
  return absl::StrCat(
      "{", R"("train_micro_batch_size_per_gpu": )", kGlobalBatch / world,
      R"(, "gradient_accumulation_steps": 1, "steps_per_print": 100,)",
      R"("gradient_clipping": 1.0,)",
      R"("optimizer": {"type": "AdamW", "params": {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-3, "weight_decay": 0.01}},)",
      setup.dtype == "bf16" ? R"("bf16": {"enabled": true},)" : "",
      R"("scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 4, "warmup_type": "linear"}},)",
      R"("zero_optimization": {"stage": )", setup.stage,
      R"(, "reduce_bucket_size": 700, "allgather_bucket_size": 900)",
      setup.stage == 3 ? R"(, "stage3_param_persistence_threshold": 0)" : "",
      offload, "}}");
}

absl::StatusOr<std::unique_ptr<engine::Engine>> MakeEngine(
    const Setup& setup, std::shared_ptr<comm::Communicator> communicator) {
  nn::GptConfig gpt;
  gpt.num_layers = 2;
  gpt.num_heads = 2;
  gpt.channels = setup.channels;
  gpt.vocab_size = kVocab;
  gpt.max_seq_len = kSeqLen;
  nn::GptOptions options;
  options.device = communicator->device();
  options.dtype = setup.dtype == "bf16" ? DType::kBF16 : DType::kF32;
  options.seed = 1234;
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptModel> created,
                      nn::GptModel::Create(gpt, options));
  std::shared_ptr<nn::GptModel> model(std::move(created));
  return engine::Initialize(
      model, ConfigJson(setup, communicator->world_size()), communicator);
}

// One optimizer step on global samples [step * 12, step * 12 + 12).
absl::StatusOr<double> TrainStep(engine::Engine& engine, int64_t step) {
  const int world = engine.communicator().world_size();
  const int rank = engine.communicator().rank();
  const int micro = kGlobalBatch / world;
  std::vector<int32_t> tokens(micro * kSeqLen), targets(tokens.size());
  for (int i = 0; i < micro; ++i) {
    FillSample(step * kGlobalBatch + rank * micro + i, &tokens[i * kSeqLen],
               &targets[i * kSeqLen]);
  }
  Tensor token_tensor =
      Tensor::Wrap(tokens.data(), {micro, kSeqLen}, DType::kI32, Device::Cpu());
  Tensor target_tensor = Tensor::Wrap(targets.data(), {micro, kSeqLen},
                                      DType::kI32, Device::Cpu());
  ZE_RETURN_IF_ERROR(engine.Forward(token_tensor, target_tensor).status());
  ZE_RETURN_IF_ERROR(engine.Backward());
  ZE_ASSIGN_OR_RETURN(engine::StepReport report, engine.Step());
  return report.loss;
}

absl::Status Train(const std::map<std::string, std::string>& flags,
                   std::shared_ptr<comm::Communicator> communicator) {
  Setup setup;
  setup.stage = std::stoi(Get(flags, "stage", "0"));
  setup.offload = Get(flags, "offload", "none");
  setup.dtype = Get(flags, "dtype", "f32");
  setup.channels = std::stoi(Get(flags, "channels", "16"));
  const std::string out = Get(flags, "out", "");
  setup.nvme_directory = out + ".nvme";
  mkdir(setup.nvme_directory.c_str(), 0755);
  const int64_t from = std::stoll(Get(flags, "from", "0"));
  const int64_t to = std::stoll(Get(flags, "to", "6"));
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine,
                      MakeEngine(setup, communicator));
  const std::string load = Get(flags, "load", "");
  if (!load.empty()) {
    ZE_ASSIGN_OR_RETURN(engine::Engine::LoadedCheckpoint loaded,
                        engine->LoadCheckpoint(load, Get(flags, "tag", ""),
                                               !flags.count("weights_only")));
    const int64_t next = loaded.client_state.value("next_step", int64_t{-1});
    if (next != from) {
      return absl::InternalError(
          absl::StrCat("the checkpoint's client_state says step ", next,
                       " comes next, but --from=", from));
    }
    if (engine->counters().global_steps != from) {
      return absl::InternalError(absl::StrCat("restored global_steps ",
                                              engine->counters().global_steps,
                                              ", expected ", from));
    }
  }
  const std::string load_weights = Get(flags, "load_weights", "");
  if (!load_weights.empty()) {
    ZE_RETURN_IF_ERROR(engine->LoadWeights(load_weights).status());
  }
  std::vector<double> losses;
  for (int64_t step = from; step < to; ++step) {
    ZE_ASSIGN_OR_RETURN(double loss, TrainStep(*engine, step));
    losses.push_back(loss);
  }
  const std::string save = Get(flags, "save", "");
  if (!save.empty()) {
    ZE_RETURN_IF_ERROR(engine->SaveCheckpoint(
        save, Get(flags, "save_tag", ""), nlohmann::json{{"next_step", to}}));
  }
  std::ostringstream text;
  text << std::setprecision(17);
  text << "from " << from << "\nlosses";
  for (double loss : losses) text << " " << loss;
  text << "\n";
  for (const std::string& name : engine->ParameterNames()) {
    ZE_ASSIGN_OR_RETURN(std::vector<float> weights,
                        engine->GatherMasterWeights(name));
    text << "param " << name << std::setprecision(9);
    for (float weight : weights) text << " " << weight;
    text << std::setprecision(17) << "\n";
  }
  if (communicator->rank() == 0 && !out.empty()) {
    std::ofstream file(out);
    file << text.str();
    if (!file) return absl::InternalError(absl::StrCat("cannot write ", out));
  }
  return absl::OkStatus();
}

struct Result {
  int64_t from = 0;
  std::vector<double> losses;
  std::map<std::string, std::vector<double>> params;
};

absl::StatusOr<Result> ReadResult(const std::string& path) {
  std::ifstream file(path);
  if (!file) return absl::NotFoundError(absl::StrCat("missing result ", path));
  Result result;
  std::string line;
  while (std::getline(file, line)) {
    std::istringstream words(line);
    std::string kind;
    words >> kind;
    double value;
    if (kind == "from") {
      words >> result.from;
    } else if (kind == "losses") {
      while (words >> value) result.losses.push_back(value);
    } else if (kind == "param") {
      std::string name;
      words >> name;
      while (words >> value) result.params[name].push_back(value);
    }
  }
  return result;
}

// Compares run `a` with reference `b` over a's steps (b must cover them)
// and over the final weights. --exact: bit for bit; otherwise relative to
// max(1, |b|) within --tolerance.
absl::Status Compare(const std::map<std::string, std::string>& flags) {
  ZE_ASSIGN_OR_RETURN(Result a, ReadResult(Get(flags, "a", "")));
  ZE_ASSIGN_OR_RETURN(Result b, ReadResult(Get(flags, "b", "")));
  const bool exact = flags.count("exact") > 0;
  const double tolerance = std::stod(Get(flags, "tolerance", "1e-5"));
  const int64_t offset = a.from - b.from;
  // A run of no steps (--from == --to) compares its weights only.
  if (offset < 0 || offset + a.losses.size() > b.losses.size() ||
      a.params.size() != b.params.size() || a.params.empty()) {
    return absl::DataLossError("the results do not cover the same steps");
  }
  double loss_error = 0, weight_error = 0;
  std::string worst;
  for (size_t i = 0; i < a.losses.size(); ++i) {
    const double reference = b.losses[offset + i];
    loss_error = std::max(loss_error, std::abs(a.losses[i] - reference) /
                                          std::max(1.0, std::abs(reference)));
  }
  for (const auto& [name, values] : b.params) {
    const std::vector<double>& other = a.params[name];
    if (other.size() != values.size()) {
      return absl::DataLossError(absl::StrCat(name, " differs in size"));
    }
    for (size_t i = 0; i < values.size(); ++i) {
      const double error =
          std::abs(other[i] - values[i]) / std::max(1.0, std::abs(values[i]));
      if (error > weight_error) {
        weight_error = error;
        worst = name;
      }
    }
  }
  const bool ok = exact ? loss_error == 0 && weight_error == 0
                        : loss_error <= tolerance && weight_error <= tolerance;
  std::printf(
      "%s %s vs %s: loss %.2e weights %.2e (%s) %s\n", ok ? "ok  " : "FAIL",
      Get(flags, "a", "").c_str(), Get(flags, "b", "").c_str(), loss_error,
      weight_error, worst.c_str(),
      exact ? "(exact)" : absl::StrCat("(tol ", tolerance, ")").c_str());
  if (!ok) {
    for (size_t i = 0; i < a.losses.size(); ++i) {
      std::printf("  step %lld  %.17g  %.17g\n",
                  static_cast<long long>(a.from + i), a.losses[i],
                  b.losses[offset + i]);
    }
    return absl::InternalError("mismatch");
  }
  return absl::OkStatus();
}

absl::Status KillDuringSave(const std::map<std::string, std::string>& flags,
                            std::shared_ptr<comm::Communicator> communicator) {
  Setup setup;
  setup.stage = std::stoi(Get(flags, "stage", "3"));
  setup.channels = std::stoi(Get(flags, "channels", "256"));
  const std::string save = Get(flags, "save", "");
  const int victim = std::stoi(Get(flags, "victim", "1"));
  // Rank files here are about 10 MB (channels 256, stage 3, 2 ranks).
  const std::string kill_after_bytes =
      Get(flags, "kill_after_bytes", "1000000");
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine,
                      MakeEngine(setup, communicator));
  for (int64_t step = 0; step < 2; ++step) {
    ZE_RETURN_IF_ERROR(TrainStep(*engine, step).status());
  }
  ZE_RETURN_IF_ERROR(
      engine->SaveCheckpoint(save, "first", nlohmann::json{{"next_step", 2}}));
  ZE_RETURN_IF_ERROR(TrainStep(*engine, 2).status());
  if (communicator->rank() == victim) {
    // The kernel stops a write that crosses the file size limit with
    // SIGXFSZ, in the middle of the rank file; the handler turns that into
    // SIGKILL, so the victim dies exactly there, with no cleanup of any kind
    // (deterministic, unlike racing a watcher against the writer).
    std::signal(SIGXFSZ, [](int) { raise(SIGKILL); });
    rlimit limit{};
    getrlimit(RLIMIT_FSIZE, &limit);
    limit.rlim_cur = static_cast<rlim_t>(std::stoll(kill_after_bytes));
    setrlimit(RLIMIT_FSIZE, &limit);
    std::fprintf(stderr, "rank %d: killing itself mid-save (at byte %s)\n",
                 victim, kill_after_bytes.c_str());
  }
  ZE_RETURN_IF_ERROR(
      engine->SaveCheckpoint(save, "second", nlohmann::json{{"next_step", 3}}));
  // Reaching here means the kill came too late: the test must not pass.
  return absl::InternalError("the save finished before the kill");
}

int Main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: checkpoint_main train|compare|kill_during_save ...\n");
    return 2;
  }
  const std::string command = argv[1];
  const std::map<std::string, std::string> flags = ParseFlags(argc, argv);
  absl::Status status;
  if (command == "compare") {
    status = Compare(flags);
  } else {
    comm::CommOptions options;
    options.device = Get(flags, "device", "cpu");
    absl::StatusOr<std::unique_ptr<comm::Communicator>> created =
        comm::CreateCommunicator(options);
    if (!created.ok()) {
      std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
      return 1;
    }
    std::shared_ptr<comm::Communicator> communicator(
        std::move(created).value());
    if (command == "train") {
      status = Train(flags, communicator);
    } else if (command == "kill_during_save") {
      status = KillDuringSave(flags, communicator);
    } else {
      std::fprintf(stderr, "unknown command %s\n", command.c_str());
      return 2;
    }
  }
  if (!status.ok()) {
    std::fprintf(stderr, "checkpoint_main %s: %s\n", command.c_str(),
                 status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace ze

int main(int argc, char** argv) { return ze::Main(argc, argv); }
