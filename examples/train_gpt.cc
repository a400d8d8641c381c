// train_gpt: trains a GPT data-parallel across the ranks of an mpirun job,
// the way a DeepSpeed config says, through ze::engine::Initialize.
//
//   mpirun --oversubscribe --bind-to none -np 4 train_gpt
//       [--config=examples/configs/train_gpt_cpu.json] [--model=tiny]
//       [--steps=60] [--seq=64] [--device=auto|cpu|cuda]
//       [--save_dir=DIR [--save_every=N] [--resume]] [--dry_run]
//
// --dry_run checks the config, builds the model's shapes without storage
// and prints the per-rank memory plan (GPU, pinned host, NVMe; the same
// figures Initialize would report and allocate by) and an activation
// estimate, then exits without allocating.
//
// Checkpoints: with --save_dir the engine saves there every --save_every
// steps (0: only at the end) and at the end (tag global_stepN, `latest`
// updated atomically). --resume loads `latest` from --save_dir when there
// is one, at whatever world size, stage or offload it was saved with, and
// continues from the step after it up to --steps.
//
// The data is built in: a deterministic corpus of sentences from a small
// grammar ("the old cat chases a red ball quietly."), read as bytes (the
// vocabulary is the 256 byte values). Its structure is learnable in a few
// dozen steps, so the loss falls visibly from ln(256) = 5.55. Every rank
// draws different windows of it (sample g of step s depends only on the
// global sample index, so the run is the same at any world size).
//
// The engine logs the loss curve every steps_per_print steps (rank 0). At
// the end rank 0 prints one summary line, "train_gpt: ...", and every rank
// exits 1 when the loss did not fall (the mean of the last fifth of the
// steps must be below 90% of the first fifth's), 2 on any error.
//
// --model: "tiny" (4 layers, 4 heads, 128 channels; for CPUs) or a GPT-2/3
// preset name (124M, 350M, 1.3B, ...; byte vocabulary padded to the preset's
// table). --device=auto takes the GPU of this rank where there is one.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/factory.h"
#include "config/config.h"
#include "core/logging.h"
#include "core/status.h"
#include "engine/engine.h"
#include "nn/gpt.h"
#include "zero/plan.h"

namespace ze {
namespace {

struct Flags {
  std::string config = "examples/configs/train_gpt_cpu.json";
  std::string model = "tiny";
  int64_t steps = 60;
  int64_t seq = 64;
  std::string device = "auto";
  std::string save_dir;
  int64_t save_every = 0;
  bool resume = false;
  bool dry_run = false;
};

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    bool ok = eq != std::string::npos;
    if (name == "--config") {
      flags.config = value;
    } else if (name == "--model") {
      flags.model = value;
    } else if (name == "--device") {
      flags.device = value;
    } else if (name == "--steps") {
      ok = ok && absl::SimpleAtoi(value, &flags.steps) && flags.steps >= 5;
    } else if (name == "--seq") {
      ok = ok && absl::SimpleAtoi(value, &flags.seq) && flags.seq >= 2;
    } else if (name == "--save_dir") {
      flags.save_dir = value;
      ok = ok && !value.empty();
    } else if (name == "--save_every") {
      ok = ok && absl::SimpleAtoi(value, &flags.save_every) &&
           flags.save_every >= 0;
    } else if (name == "--resume") {
      flags.resume = true;
      ok = eq == std::string::npos;
    } else if (name == "--dry_run") {
      flags.dry_run = true;
      ok = eq == std::string::npos;
    } else {
      ok = false;
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad flag '", arg,
          "'; usage: train_gpt [--config=PATH] [--model=tiny|124M|...] "
          "[--steps=N>=5] [--seq=T>=2] [--device=auto|cpu|cuda] "
          "[--save_dir=DIR [--save_every=N] [--resume]] [--dry_run]"));
    }
  }
  return flags;
}

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// About `bytes` bytes of sentences from a fixed grammar:
//   sentence := det [adj] noun verb det [adj] noun [adverb] "."
// Word choices come from a counter-based generator, so every rank builds the
// same corpus without communicating.
std::string BuildCorpus(size_t bytes) {
  static const char* const kDet[] = {"the", "a", "my", "every", "that"};
  static const char* const kAdj[] = {"old",   "red",   "small", "happy",
                                     "quiet", "green", "tired", "bright"};
  static const char* const kNoun[] = {"cat",  "dog",   "bird",  "man",
                                      "girl", "ball",  "house", "tree",
                                      "fish", "horse", "river", "stone"};
  static const char* const kVerb[] = {"sees",  "likes", "chases", "finds",
                                      "holds", "wants", "paints", "follows"};
  static const char* const kAdverb[] = {"quickly", "slowly", "today", "again",
                                        "quietly"};
  std::string corpus;
  uint64_t counter = 0;
  auto pick = [&counter](const char* const* words, size_t n) {
    return std::string(words[Mix(counter++) % n]);
  };
  auto noun_phrase = [&]() {
    std::string phrase = pick(kDet, 5);
    if (Mix(counter++) % 2 == 0) absl::StrAppend(&phrase, " ", pick(kAdj, 8));
    absl::StrAppend(&phrase, " ", pick(kNoun, 12));
    return phrase;
  };
  while (corpus.size() < bytes) {
    std::string sentence = noun_phrase();
    absl::StrAppend(&sentence, " ", pick(kVerb, 8), " ", noun_phrase());
    if (Mix(counter++) % 3 == 0) {
      absl::StrAppend(&sentence, " ", pick(kAdverb, 5));
    }
    absl::StrAppend(&corpus, sentence, ". ");
  }
  return corpus;
}

absl::StatusOr<nn::GptConfig> ModelConfig(const std::string& name,
                                          int64_t seq) {
  nn::GptConfig config;
  if (name == "tiny") {
    config.num_layers = 4;
    config.num_heads = 4;
    config.channels = 128;
  } else {
    ZE_ASSIGN_OR_RETURN(config,
                        nn::GptConfig::Preset(name, /*pad_vocab=*/true));
  }
  // Bytes are the tokens. A preset keeps its (padded) table so its shapes
  // and speed are the real ones; the unused rows are never a target.
  config.vocab_size = 256;
  if (name != "tiny") config.padded_vocab_size = 50304;
  config.max_seq_len = seq;
  ZE_RETURN_IF_ERROR(config.Validate());
  return config;
}

// Whether `directory` holds a completed checkpoint (its `latest` file).
bool CheckpointExists(const std::string& directory) {
  return std::ifstream(directory + "/latest").good();
}

absl::Status Train(const Flags& flags, int* exit_code) {
  comm::CommOptions options;
  options.device = flags.device;
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> created,
                      comm::CreateCommunicator(options));
  std::shared_ptr<comm::Communicator> communicator = std::move(created);
  const int world = communicator->world_size();
  const int rank = communicator->rank();

  // The config decides the model's dtype, so read it before building the
  // model; Initialize reads (and checks) the same file again.
  ZE_ASSIGN_OR_RETURN(config::Config config,
                      config::LoadConfigFile(flags.config, world));
  const config::TrainingPrecision precision =
      config::GetTrainingPrecision(config);
  ZE_ASSIGN_OR_RETURN(nn::GptConfig gpt, ModelConfig(flags.model, flags.seq));
  nn::GptOptions model_options;
  model_options.device = communicator->device();
  model_options.dtype =
      precision == config::TrainingPrecision::kBf16   ? DType::kBF16
      : precision == config::TrainingPrecision::kFp16 ? DType::kF16
                                                      : DType::kF32;
  model_options.seed = static_cast<uint64_t>(config.seed);
  // Shapes only: the engine creates the storage in its flat buffers.
  model_options.materialize = false;
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptModel> built,
                      nn::GptModel::Create(gpt, model_options));
  std::shared_ptr<nn::GptModel> model(std::move(built));
  if (flags.dry_run) {
    ZE_ASSIGN_OR_RETURN(zero::MemoryBreakdown plan,
                        zero::PlanMemory(*model, config, world));
    // Activations of one micro-batch without recomputation, 16-bit
    // (Korthikanti et al. 2022: 34 B T C + 5 B H T^2 bytes per layer): an
    // estimate, not the engine's allocator.
    const double micro =
        static_cast<double>(config.train_micro_batch_size_per_gpu.value());
    const double activations =
        gpt.num_layers * (34.0 * micro * flags.seq * gpt.channels +
                          5.0 * micro * gpt.num_heads * flags.seq * flags.seq);
    if (rank == 0) {
      std::printf(
          "train_gpt --dry_run: %s (%lld parameters), %d ranks, ZeRO stage "
          "%d\n  model state per rank: %s\n  activations per rank "
          "(estimate, micro-batch %.0f x %lld): %.3f GiB\n",
          flags.config.c_str(), static_cast<long long>(gpt.NumParameters()),
          world, static_cast<int>(config.zero_optimization.stage),
          plan.ToString().c_str(), micro, static_cast<long long>(flags.seq),
          activations / (1024.0 * 1024.0 * 1024.0));
    }
    *exit_code = 0;
    return absl::OkStatus();
  }
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine,
                      engine::Initialize(model, flags.config, communicator));

  const int64_t micro = engine->config().train_micro_batch_size_per_gpu.value();
  const int64_t accumulation =
      engine->config().gradient_accumulation_steps.value();
  const int64_t seq = flags.seq;
  const std::string corpus = BuildCorpus(1 << 16);
  ZE_LOG_RANK0(INFO) << absl::StrFormat(
      "train_gpt: model %s (%d parameters, %s), %d ranks on %s, %d steps of "
      "%d x %d x %d sequences of %d bytes",
      flags.model, gpt.NumParameters(), DTypeName(model_options.dtype), world,
      communicator->device().ToString(), flags.steps, world, accumulation,
      micro, seq);

  if (flags.resume && flags.save_dir.empty()) {
    return absl::InvalidArgumentError("train_gpt: --resume needs --save_dir");
  }
  // Resuming: the step to continue from and the first steps' mean loss (to
  // judge the whole run's progress) come back in client_state.
  int64_t first_step = 0;
  double resumed_first_loss = 0;
  if (flags.resume && CheckpointExists(flags.save_dir)) {
    ZE_ASSIGN_OR_RETURN(engine::Engine::LoadedCheckpoint loaded,
                        engine->LoadCheckpoint(flags.save_dir));
    first_step = loaded.client_state.value("next_step", int64_t{0});
    resumed_first_loss = loaded.client_state.value("first_loss", 0.0);
    ZE_LOG_RANK0(INFO) << "train_gpt: resumed from " << flags.save_dir << "/"
                       << loaded.tag << " (saved by " << loaded.saved_world_size
                       << " ranks at ZeRO stage " << loaded.saved_stage
                       << "), continuing at step " << first_step;
  }

  std::vector<int32_t> tokens(micro * seq), targets(micro * seq);
  std::vector<double> losses;
  double first_loss = resumed_first_loss;  // mean of the run's first steps
  auto save = [&](int64_t next_step) -> absl::Status {
    return engine->SaveCheckpoint(
        flags.save_dir, "",
        nlohmann::json{{"next_step", next_step}, {"first_loss", first_loss}});
  };
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = first_step; step < flags.steps; ++step) {
    engine::StepReport report;
    for (int64_t m = 0; m < accumulation; ++m) {
      for (int64_t i = 0; i < micro; ++i) {
        const int64_t sample =
            ((step * accumulation + m) * world + rank) * micro + i;
        const size_t offset =
            Mix(static_cast<uint64_t>(sample)) % (corpus.size() - seq - 1);
        for (int64_t t = 0; t < seq; ++t) {
          tokens[i * seq + t] = static_cast<unsigned char>(corpus[offset + t]);
          targets[i * seq + t] =
              static_cast<unsigned char>(corpus[offset + t + 1]);
        }
      }
      Tensor token_tensor =
          Tensor::Wrap(tokens.data(), {micro, seq}, DType::kI32, Device::Cpu());
      Tensor target_tensor = Tensor::Wrap(targets.data(), {micro, seq},
                                          DType::kI32, Device::Cpu());
      ZE_RETURN_IF_ERROR(engine->Forward(token_tensor, target_tensor).status());
      ZE_RETURN_IF_ERROR(engine->Backward());
      ZE_ASSIGN_OR_RETURN(report, engine->Step());
    }
    if (!report.skipped) losses.push_back(report.loss);
    if (first_loss == 0 && losses.size() == 5) {
      first_loss =
          (losses[0] + losses[1] + losses[2] + losses[3] + losses[4]) / 5;
    }
    if (!flags.save_dir.empty() && flags.save_every > 0 &&
        (step + 1) % flags.save_every == 0 && step + 1 < flags.steps) {
      ZE_RETURN_IF_ERROR(save(step + 1));
    }
  }
  if (!flags.save_dir.empty() && first_step < flags.steps) {
    ZE_RETURN_IF_ERROR(save(flags.steps));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();

  if (first_step >= flags.steps) {
    ZE_LOG_RANK0(INFO) << "train_gpt: the checkpoint is already at step "
                       << first_step << " of " << flags.steps
                       << "; nothing to train";
    *exit_code = 0;
    return absl::OkStatus();
  }
  // The loss is the mean over all ranks, so every rank reaches the same
  // verdict.
  const size_t window = std::max<size_t>(1, losses.size() / 5);
  if (losses.size() < 2 * window) {
    return absl::FailedPreconditionError(
        "train_gpt: too many skipped steps to judge the loss");
  }
  double first = 0, last = 0;
  for (size_t i = 0; i < window; ++i) {
    first += losses[i] / window;
    last += losses[losses.size() - window + i] / window;
  }
  // A resumed run is judged against the loss the run started from.
  if (resumed_first_loss > 0) first = resumed_first_loss;
  const bool fell = last < 0.9 * first;
  const double tokens_per_second =
      static_cast<double>(flags.steps - first_step) *
      engine->config().train_batch_size.value() * seq / seconds;
  if (rank == 0) {
    std::printf(
        "train_gpt: %s, %d ranks, ZeRO stage %d, %d steps in %.1f s "
        "(%.0f tokens/s), loss %.4f -> %.4f (mean of first/last %zu), "
        "skipped %d: %s\n",
        flags.model.c_str(), world,
        static_cast<int>(engine->config().zero_optimization.stage),
        static_cast<int>(flags.steps - first_step), seconds, tokens_per_second,
        first, last, window, static_cast<int>(engine->counters().skipped_steps),
        fell ? "OK, the loss fell" : "FAILED, the loss did not fall");
    std::fflush(stdout);
  }
  *exit_code = fell ? 0 : 1;
  return absl::OkStatus();
}

}  // namespace
}  // namespace ze

int main(int argc, char** argv) {
  absl::StatusOr<ze::Flags> flags = ze::ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "%s\n", flags.status().ToString().c_str());
    return 2;
  }
  int exit_code = 2;
  absl::Status status = ze::Train(*flags, &exit_code);
  if (!status.ok()) {
    std::fprintf(stderr, "train_gpt: %s\n", status.ToString().c_str());
    return 2;
  }
  return exit_code;
}
