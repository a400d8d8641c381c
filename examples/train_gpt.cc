// train_gpt: trains a GPT data-parallel across the ranks of an mpirun job,
// the way a DeepSpeed config says, through ze::engine::Initialize.
//
//   mpirun --oversubscribe --bind-to none -np 2 train_gpt
//       --config=examples/configs/demo_zero3_offload_cpu.json --steps=300
//
// Flags (train_gpt --help lists them with their defaults):
//   --config      a DeepSpeed-style JSON config (ZeRO stage, precision,
//                 optimizer, schedule, batch sizes, offload, csv_monitor).
//                 Default examples/configs/train_gpt_cpu.json: from the
//                 working directory, else the copy in the binary's Bazel
//                 runfiles (so bazel-bin/examples/train_gpt runs anywhere).
//   --model       "tiny" (4 layers, 4 heads, 128 channels; for CPUs) or a
//                 GPT-2/3 preset (124M, 350M, 1.3B, ...), or a decoder
//                 preset (llama-tiny, mistral-tiny, qwen2-tiny, qwen3-tiny,
//                 llama-1B, llama-3B, llama-8B). Default: tiny, or with
//                 --init_from the file's or directory's shape.
//   --layers, --heads, --channels
//                 reshape tiny (the demo: --layers=2 --heads=8); refused
//                 with any other model.
//   --data        what to train on:
//                   addition           the built-in task (default): sums of
//                                      --digits-digit numbers, judged by
//                                      exact-match accuracy on held-out
//                                      problems (examples/train_data.h)
//                   text:PATH, *.txt   any file, read as bytes (vocab 256)
//                   tokens:PATH, *.bin nanoGPT's uint16 token file (vocab:
//                                      the preset's 50257, or the file's
//                                      largest token + 1 for tiny)
//                   tokens32:PATH      uint32 token file, for vocabularies
//                                      above 65,535 (tools/write_tokens.py)
//   --steps, --seq, --seed, --device=auto|cpu|cuda (auto: this rank's GPU
//                 when there is one).
//   --eval_every  evaluate every N steps (0: only at the end). Addition:
//                 accuracy of greedy answers (Engine::Generate, batched,
//                 KV cache) on --eval_problems held-out problems, with a few
//                 samples; files: validation loss and a sampled continuation.
//   --eval_windows files: validation windows of --seq tokens, spread evenly
//                 over the validation part (its last tenth), whose mean loss
//                 is the validation loss (default 8; more for a loss that
//                 can judge differences of 0.01). Evaluated 8 at a time.
//   --init_from   a Hugging Face GPT-2 safetensors file (converted to our
//                 names on rank 0 first) or a native one (our names, e.g.
//                 ze_checkpoint consolidate's): full weights loaded through
//                 Engine::LoadWeights, each rank taking its part, at any
//                 stage and world size. Or a Hugging Face Llama, Mistral,
//                 Qwen2 or Qwen3 model directory (config.json gives the
//                 shape; model.safetensors or shards), read by every rank
//                 straight from its files (docs/models.md).
//   --export_hf   decoders: at the end, the trained weights as a Hugging
//                 Face model directory (--export_dtype=bf16|f16|f32).
//   --save_dir/--save_every/--resume/--resume_if_present/--resume_tag
//                 checkpoints (below).
//   --head_weight_gradient=forward|backward  where the output head forms
//                 its weight gradient (nn::OutputHead::WeightGradient):
//                 forward keeps a (vocab, hidden) f32 sum from the loss
//                 forward to its backward; backward forms it a vocabulary
//                 slice at a time (less memory, one more logits product).
//   --dry_run     prints the per-rank memory plan and exits (below).
//   --device_memory_gib  with offload_optimizer.ratio "auto": the device
//                 memory each rank may use (0, the default: what the device
//                 has free), e.g. to plan for an 80 GB card on another
//                 machine with --dry_run, or to leave room on a shared GPU.
//   --progress    auto|line|log (below).
//   --prompt      text to continue at each evaluation (and at the end), in
//                 the data's vocabulary: bytes for text files, the task's
//                 characters for addition ("123+456=" is answered greedily),
//                 space-separated token ids for token files. Default: the
//                 validation text's first tokens (files); none (addition).
//   --min_accuracy  addition only: exit 1 unless the final accuracy reaches
//                 it (tools/demo.sh's verdict).
//   --min_loss_drop  exit 1 unless the loss fell by at least this fraction
//                 (the mean of the last fifth of the steps against the first
//                 fifth's; 0, the default: no check).
//
// --dry_run checks the config, builds the model's shapes without storage
// and prints the per-rank memory plan (GPU, pinned host, NVMe; the same
// figures Initialize would report and allocate by) and an activation
// estimate, with an "auto" offload_optimizer.ratio the share the engine
// chose beside that estimate (engine::ResolveConfig; training hands the
// same choice to Initialize), then exits without allocating. With
// pipeline.stages > 1: the layout, the schedule's bubble and each stage's
// layers and plan (no activation estimate yet); train_gpt does not train a
// pipeline config (refused by name: docs/pipeline.md).
//
// Checkpoints: with --save_dir the engine saves there every --save_every
// steps (0: only at the end) and at the end (tag global_stepN, `latest`
// updated atomically). Before any step every rank checks that --save_dir
// is a directory it can create and write in, with room for one checkpoint
// (the memory plan's master weights, optimizer state and 16-bit weights of
// every rank); otherwise every rank stops with the reason. --resume loads
// `latest` from --save_dir, at whatever world size, stage or offload it
// was saved with, and continues from the step after it up to --steps (it
// wins over --init_from); without a checkpoint there it is an error naming
// the directory. --resume_if_present resumes when there is one and starts
// afresh otherwise (for a job script that restarts itself);
// --resume_tag=TAG resumes from that tag instead of `latest` (which is
// left as it is until the next save).
//
// Data parallelism: rank r reads samples ((step * A + m) * W + r) * B + i
// of the global sample sequence (A accumulation steps, W ranks, B the
// micro-batch), and every sample depends only on its number, so a run is
// the same at any world size with the same train_batch_size.
//
// Progress: with --progress=line rank 0 redraws one line in place (step,
// loss, tokens/s, MFU on a GPU, ETA, memory) and keeps the engine's
// per-step log lines quiet while it does; with --progress=log the engine's
// line every steps_per_print steps is the progress report. auto is line
// when stdout is a terminal and the process was not started by mpirun:
// Open MPI hands every rank a pseudo-terminal even when mpirun's own output
// goes to a file, so a rank cannot tell; tools/demo.sh passes
// --progress=line when its own output is a terminal.
//
// At the end rank 0 prints one summary line, "train_gpt: ...". Exit status
// (every rank): 0 when the run finished; 1 only when an acceptance the
// command line asked for failed (--min_accuracy, --min_loss_drop); 2 for
// bad input (an unknown flag or bad value, a config or data problem, an
// unusable --save_dir, a micro-batch too large to allocate) and any other
// error. --help lists the flags and exits 0.
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "comm/bootstrap.h"
#include "comm/factory.h"
#include "config/config.h"
#include "core/allocator.h"
#include "core/logging.h"
#include "core/safetensors/reader.h"
#include "core/status.h"
#include "core/stream.h"
#include "engine/agreement.h"
#include "engine/checkpoint/checkpoint_format.h"
#include "engine/checkpoint/consolidate.h"
#include "engine/engine.h"
#include "examples/progress.h"
#include "examples/train_data.h"
#include "nn/decoder.h"
#include "nn/decoder_config.h"
#include "nn/gpt.h"
#include "nn/pipeline_stage.h"
#include "nn/pretrained/hf_decoder_source.h"
#include "nn/pretrained/hf_gpt2.h"
#include "pipeline/layout.h"
#include "pipeline/partition.h"
#include "pipeline/schedule.h"
#include "zero/activation_estimate.h"
#include "zero/memory_estimate.h"
#include "zero/plan.h"

ABSL_FLAG(std::string, config, "examples/configs/train_gpt_cpu.json",
          "DeepSpeed-style JSON config (path); the default is looked up in "
          "the working directory, then in the binary's runfiles");
ABSL_FLAG(
    std::string, model, "",
    "tiny, or a GPT preset (124M, 350M, 760M, 1.3B, 2.7B, 6.7B, 13B, 25B), "
    "or a decoder preset (llama-tiny, mistral-tiny, qwen2-tiny, "
    "qwen3-tiny, llama-1B, llama-3B, llama-8B); empty: tiny, or the "
    "--init_from file's or directory's shape");
ABSL_FLAG(int32_t, layers, 0,
          "--model=tiny only: transformer blocks (0: tiny's 4)");
ABSL_FLAG(int32_t, heads, 0,
          "--model=tiny only: attention heads (0: tiny's 4)");
ABSL_FLAG(int64_t, channels, 0,
          "--model=tiny only: embedding width, a multiple of --heads (0: "
          "tiny's 128)");
ABSL_FLAG(bool, activation_checkpointing, false,
          "recompute each transformer block's activations in backward "
          "(Hugging Face's gradient_checkpointing): less memory, one more "
          "forward");
ABSL_FLAG(bool, recompute_activations, false,
          "each MLP recomputes its activation function (GELU, SiLU(gate) * "
          "up) in backward instead of keeping its output: less activation "
          "memory, the same losses");
ABSL_FLAG(std::string, head_weight_gradient, "forward",
          "where the output head forms its weight gradient: forward (a "
          "(vocab, hidden) f32 sum held from the loss forward to its "
          "backward) or backward (a vocabulary slice at a time: no such sum, "
          "one more logits product)");
ABSL_FLAG(std::string, data, "addition",
          "addition (built-in task), text:PATH or PATH.txt (bytes), "
          "tokens:PATH or PATH.bin (nanoGPT uint16 tokens), tokens32:PATH "
          "(uint32 tokens)");
ABSL_FLAG(int32_t, digits, 3, "addition: digits of each operand (1-9)");
ABSL_FLAG(int32_t, eval_problems, 128,
          "addition: held-out problems (never trained on) for accuracy");
ABSL_FLAG(int64_t, eval_windows, 8,
          "files: validation windows (--seq tokens each, spread over the "
          "validation part) averaged into the validation loss");
ABSL_FLAG(int64_t, steps, 60, "optimizer steps to train (>= 5)");
ABSL_FLAG(int64_t, seq, 0,
          "sequence length in tokens (>= 2); 0: one addition problem per row "
          "(3 digits + 3 tokens), or 64 for files");
ABSL_FLAG(std::string, device, "auto", "auto (a GPU when present), cpu, cuda");
ABSL_FLAG(int64_t, seed, -1,
          "seed of the model's initialisation and the data; -1: the "
          "config's seed");
ABSL_FLAG(int64_t, eval_every, 0, "evaluate every N steps; 0: only at the end");
ABSL_FLAG(std::string, init_from, "",
          "initial weights: a Hugging Face GPT-2 or native safetensors file, "
          "or a Hugging Face Llama/Mistral/Qwen2/Qwen3 model directory");
ABSL_FLAG(std::string, save_dir, "", "checkpoint directory");
ABSL_FLAG(std::string, export_hf, "",
          "decoders: at the end, write the trained weights as a Hugging Face "
          "model directory here (config.json + model.safetensors or shards)");
ABSL_FLAG(std::string, export_dtype, "bf16",
          "--export_hf's element type: bf16, f16 or f32");
ABSL_FLAG(int64_t, save_every, 0,
          "save every N steps (with --save_dir); 0: only at the end");
ABSL_FLAG(bool, resume, false,
          "continue from --save_dir/latest; an error when there is none");
ABSL_FLAG(bool, resume_if_present, false,
          "continue from --save_dir/latest when there is one, else start "
          "afresh");
ABSL_FLAG(std::string, resume_tag, "",
          "continue from this tag of --save_dir (not `latest`); an error when "
          "it is missing");
ABSL_FLAG(bool, dry_run, false,
          "print the per-rank memory plan and exit without allocating");
ABSL_FLAG(double, device_memory_gib, 0,
          "the device memory (GiB) each rank may use when the config's "
          "offload_optimizer.ratio is \"auto\" (0: what the device has "
          "free); plans for another card, or leaves room on a shared one");
ABSL_FLAG(std::string, progress, "auto",
          "line (redrawn in place), log (the engine's line every "
          "steps_per_print), or auto");
ABSL_FLAG(double, min_accuracy, 0,
          "addition: exit 1 when the final held-out accuracy is below this "
          "fraction");
ABSL_FLAG(double, min_loss_drop, 0,
          "exit 1 unless the mean loss of the last fifth of the steps is at "
          "least this fraction below the first fifth's; 0: no check");
ABSL_FLAG(std::string, prompt, "",
          "text to continue at each evaluation, in the data's vocabulary "
          "(bytes; addition characters; token ids separated by spaces)");
ABSL_FLAG(double, peak_tflops, 989,
          "one GPU's peak TFLOP/s for MFU (989: H100/H200 SXM dense bf16)");

namespace ze {
namespace {

// What the flags ask for, checked.
struct Options {
  std::string config;
  std::string model;
  std::string export_hf;  // a directory, or empty
  DType export_dtype = DType::kBF16;
  int layers = 0;  // 0: the named shape's own
  int heads = 0;
  int64_t channels = 0;
  bool activation_checkpointing = false;
  bool recompute_activations = false;
  bool head_weight_gradient_in_backward = false;  // --head_weight_gradient
  std::string data;
  int digits = 3;
  int eval_problems = 128;
  int64_t eval_windows = 8;
  int64_t steps = 60;
  int64_t seq = 64;
  std::string device;
  int64_t seed = -1;
  int64_t eval_every = 0;
  std::string init_from;
  std::string save_dir;
  int64_t save_every = 0;
  bool resume = false;             // --resume or --resume_tag
  bool resume_if_present = false;  // --resume_if_present
  std::string resume_tag;          // empty: `latest`
  bool dry_run = false;
  double device_memory_gib = 0;  // 0: the device's free memory
  std::string progress;
  double min_accuracy = 0;
  double min_loss_drop = 0;
  std::string prompt;
  double peak_tflops = 989;
};

absl::StatusOr<Options> ReadFlags() {
  Options o;
  o.config = absl::GetFlag(FLAGS_config);
  o.model = absl::GetFlag(FLAGS_model);
  o.export_hf = absl::GetFlag(FLAGS_export_hf);
  const std::string export_dtype = absl::GetFlag(FLAGS_export_dtype);
  if (export_dtype == "bf16" || export_dtype == "f16" ||
      export_dtype == "f32") {
    o.export_dtype = export_dtype == "bf16"  ? DType::kBF16
                     : export_dtype == "f16" ? DType::kF16
                                             : DType::kF32;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--export_dtype=", export_dtype, ": use bf16, f16 or f32"));
  }
  o.layers = absl::GetFlag(FLAGS_layers);
  o.heads = absl::GetFlag(FLAGS_heads);
  o.channels = absl::GetFlag(FLAGS_channels);
  o.activation_checkpointing = absl::GetFlag(FLAGS_activation_checkpointing);
  o.recompute_activations = absl::GetFlag(FLAGS_recompute_activations);
  const std::string head_weight_gradient =
      absl::GetFlag(FLAGS_head_weight_gradient);
  if (head_weight_gradient != "forward" && head_weight_gradient != "backward") {
    return absl::InvalidArgumentError(
        absl::StrCat("--head_weight_gradient=", head_weight_gradient,
                     ": use forward or backward"));
  }
  o.head_weight_gradient_in_backward = head_weight_gradient == "backward";
  o.data = absl::GetFlag(FLAGS_data);
  o.digits = absl::GetFlag(FLAGS_digits);
  o.eval_problems = absl::GetFlag(FLAGS_eval_problems);
  o.eval_windows = absl::GetFlag(FLAGS_eval_windows);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.seq = absl::GetFlag(FLAGS_seq);
  o.device = absl::GetFlag(FLAGS_device);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.eval_every = absl::GetFlag(FLAGS_eval_every);
  o.init_from = absl::GetFlag(FLAGS_init_from);
  o.save_dir = absl::GetFlag(FLAGS_save_dir);
  o.save_every = absl::GetFlag(FLAGS_save_every);
  o.resume_if_present = absl::GetFlag(FLAGS_resume_if_present);
  o.resume_tag = absl::GetFlag(FLAGS_resume_tag);
  o.resume = absl::GetFlag(FLAGS_resume) || !o.resume_tag.empty();
  o.min_loss_drop = absl::GetFlag(FLAGS_min_loss_drop);
  o.prompt = absl::GetFlag(FLAGS_prompt);
  o.dry_run = absl::GetFlag(FLAGS_dry_run);
  o.device_memory_gib = absl::GetFlag(FLAGS_device_memory_gib);
  o.progress = absl::GetFlag(FLAGS_progress);
  o.min_accuracy = absl::GetFlag(FLAGS_min_accuracy);
  o.peak_tflops = absl::GetFlag(FLAGS_peak_tflops);
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(what);
  };
  if (o.steps < 5) return bad(absl::StrCat("--steps=", o.steps, ": need >= 5"));
  if (o.seq != 0 && o.seq < 2) {
    return bad(
        absl::StrCat("--seq=", o.seq, ": need >= 2, or 0 for the data's own"));
  }
  if (!(o.device_memory_gib >= 0) || !std::isfinite(o.device_memory_gib)) {
    return bad(absl::StrCat("--device_memory_gib=", o.device_memory_gib,
                            ": need a finite number >= 0 (0: the device's "
                            "free memory)"));
  }
  if (o.eval_windows < 1) {
    return bad(absl::StrCat("--eval_windows=", o.eval_windows, ": need >= 1"));
  }
  if (o.eval_every < 0 || o.save_every < 0) {
    return bad("--eval_every and --save_every must be >= 0");
  }
  if (o.progress != "auto" && o.progress != "line" && o.progress != "log") {
    return bad(
        absl::StrCat("--progress=", o.progress, ": use auto, line or log"));
  }
  if ((o.resume || o.resume_if_present) && o.save_dir.empty()) {
    return bad(absl::StrCat(
        o.resume_tag.empty() ? "--resume" : "--resume_tag",
        o.resume_if_present ? " (or --resume_if_present)" : "",
        " needs --save_dir, the directory the checkpoints are in"));
  }
  if (o.resume_if_present && o.resume) {
    return bad(
        "--resume_if_present resumes only when a checkpoint exists; "
        "--resume and --resume_tag require one: give one of them");
  }
  if (o.save_every > 0 && o.save_dir.empty()) {
    return bad("--save_every needs --save_dir");
  }
  if (!(o.min_accuracy >= 0 && o.min_accuracy <= 1)) {
    return bad(absl::StrCat("--min_accuracy=", o.min_accuracy,
                            ": a fraction in [0, 1]"));
  }
  if (!(o.min_loss_drop >= 0 && o.min_loss_drop < 1)) {
    return bad(absl::StrCat("--min_loss_drop=", o.min_loss_drop,
                            ": a fraction in [0, 1)"));
  }
  return o;
}

constexpr char kDefaultConfig[] = "examples/configs/train_gpt_cpu.json";

// The --config path to open: the flag's, except that the default, when the
// working directory has no such file, is taken from the binary's Bazel
// runfiles (where //examples:train_gpt's data puts it). NotFound saying how
// to pass one otherwise.
absl::StatusOr<std::string> ResolveConfigPath(const std::string& flag) {
  std::error_code error;
  if (flag != kDefaultConfig || std::filesystem::exists(flag, error)) {
    return flag;
  }
  std::vector<std::string> candidates;
  if (const char* runfiles = std::getenv("RUNFILES_DIR")) {
    candidates.push_back(absl::StrCat(runfiles, "/zero_engine/", flag));
  }
  const std::filesystem::path self =
      std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) {
    candidates.push_back(
        absl::StrCat(self.string(), ".runfiles/zero_engine/", flag));
  }
  for (const std::string& candidate : candidates) {
    if (std::filesystem::is_regular_file(candidate, error)) return candidate;
  }
  return absl::NotFoundError(absl::StrCat(
      "--config: the default ", flag, " is not in the working directory (",
      std::filesystem::current_path(error).string(),
      ") nor in this binary's runfiles; run from the repository root or pass "
      "--config=PATH to a DeepSpeed JSON config (the repository's "
      "examples/configs/ holds several)"));
}

// absl's parser exits 1 on an unknown flag or a bad value (and on --help),
// but this trainer's exit status 1 means a failed acceptance check: the
// command line is checked here first, against absl's own flag registry,
// so main can exit 2 (bad input) or 0 (--help). Returns the problem, or an
// empty string; sets *help when a usage flag (--help, ...) was given.
std::string CheckCommandLine(int argc, char** argv, bool* help) {
  static const char* const kUsageFlags[] = {
      "help",   "helpfull",  "helpshort", "helppackage",
      "helpon", "helpmatch", "version",   "only_check_args"};
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    // Positional arguments are main's to refuse.
    if (!absl::ConsumePrefix(&arg, "-")) continue;
    absl::ConsumePrefix(&arg, "-");
    const size_t eq = arg.find('=');
    const std::string name(arg.substr(0, eq));
    std::optional<std::string> value;
    if (eq != absl::string_view::npos) value = std::string(arg.substr(eq + 1));
    if (std::find(std::begin(kUsageFlags), std::end(kUsageFlags), name) !=
        std::end(kUsageFlags)) {
      *help = true;
      continue;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no") && !value) {
      // --nofoo for a boolean --foo.
      absl::CommandLineFlag* negated =
          absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) continue;
    }
    if (flag == nullptr) {
      return absl::StrCat("unknown flag --", name,
                          " (train_gpt --help lists the flags)");
    }
    if (!value) {
      if (flag->IsOfType<bool>()) continue;
      // absl takes "--name value" too.
      if (i + 1 >= argc) return absl::StrCat("--", name, " needs a value");
      value = argv[++i];
    }
    std::string error;
    if (!flag->ParseFrom(*value, &error)) {
      return absl::StrCat("--", name, "=", *value, ": ", error);
    }
  }
  return "";
}

// --help: the usage message and this program's flags with their defaults.
void PrintHelp() {
  std::printf("%s\n\nFlags:\n",
              std::string(absl::ProgramUsageMessage()).c_str());
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::EndsWith(flag->Filename(), "train_gpt.cc")) {
      flags.push_back(flag);
    }
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  for (const absl::CommandLineFlag* flag : flags) {
    std::printf("  --%s: %s (default: \"%s\")\n",
                std::string(flag->Name()).c_str(), flag->Help().c_str(),
                flag->DefaultValue().c_str());
  }
}

// --data, parsed.
struct DataSpec {
  enum class Kind { kAddition, kText, kTokens } kind = Kind::kAddition;
  std::string path;
  examples::TokenCorpus::TokenWidth width =
      examples::TokenCorpus::TokenWidth::kUint16;  // kTokens
};

absl::StatusOr<DataSpec> ParseDataFlag(const std::string& value) {
  if (value == "addition") return DataSpec{};
  if (absl::StartsWith(value, "text:")) {
    return DataSpec{DataSpec::Kind::kText, value.substr(5)};
  }
  if (absl::StartsWith(value, "tokens32:")) {
    return DataSpec{DataSpec::Kind::kTokens, value.substr(9),
                    examples::TokenCorpus::TokenWidth::kUint32};
  }
  if (absl::StartsWith(value, "tokens:")) {
    return DataSpec{DataSpec::Kind::kTokens, value.substr(7)};
  }
  if (absl::EndsWith(value, ".txt"))
    return DataSpec{DataSpec::Kind::kText, value};
  if (absl::EndsWith(value, ".bin")) {
    return DataSpec{DataSpec::Kind::kTokens, value};
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--data=", value,
      ": use addition, text:PATH (or a path ending .txt) for a file read as "
      "bytes, tokens:PATH (or a path ending .bin) for a nanoGPT uint16 "
      "token file, or tokens32:PATH for a uint32 token file"));
}

// What --init_from holds.
struct InitFile {
  bool hugging_face = false;
  nn::Gpt2Dims dims;  // the file's (vocab_size: its wte rows)
  // The real vocabulary (the table's rows beyond it are padding): a
  // Hugging Face file's rows, a converted file's recorded vocabulary
  // (nn::kVocabularyMetadataKey); 0 when a native file records none.
  int64_t vocabulary = 0;
};

absl::StatusOr<InitFile> InspectInitFile(const std::string& path) {
  absl::StatusOr<std::unique_ptr<safetensors::Reader>> opened =
      safetensors::Reader::Open(path);
  if (!opened.ok()) {
    return absl::Status(
        opened.status().code(),
        absl::StrCat("--init_from: ", opened.status().message()));
  }
  const std::unique_ptr<safetensors::Reader>& reader = *opened;
  const safetensors::TensorInfo* wte = reader->Find("embed.wte");
  const safetensors::TensorInfo* wpe = reader->Find("embed.wpe");
  if (wte == nullptr) {
    // Not our names: it must be a Hugging Face GPT-2 file.
    InitFile file;
    file.hugging_face = true;
    absl::StatusOr<nn::Gpt2Dims> dims = nn::InferHuggingFaceGpt2Dims(path);
    if (!dims.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--init_from=", path,
          ": neither our GPT (no embed.wte) nor a Hugging Face GPT-2 file: ",
          dims.status().message()));
    }
    file.dims = *dims;
    file.vocabulary = dims->vocab_size;
    return file;
  }
  if (wpe == nullptr || wte->shape.size() != 2 || wpe->shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("--init_from=", path,
                     ": embed.wte and embed.wpe must both be (rows, C)"));
  }
  InitFile file;
  file.dims.vocab_size = wte->shape[0];
  const auto recorded = reader->metadata().find(nn::kVocabularyMetadataKey);
  if (recorded != reader->metadata().end() &&
      (!absl::SimpleAtoi(recorded->second, &file.vocabulary) ||
       file.vocabulary <= 0 || file.vocabulary > file.dims.vocab_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--init_from=", path, ": metadata ", nn::kVocabularyMetadataKey, "=\"",
        recorded->second, "\" is not a vocabulary of at most the ",
        file.dims.vocab_size, " rows of embed.wte"));
  }
  file.dims.channels = wte->shape[1];
  file.dims.max_positions = wpe->shape[0];
  for (int layer = 0;; ++layer) {
    if (reader->Find(absl::StrCat("blocks.", layer, ".ln1.weight")) ==
        nullptr) {
      file.dims.num_layers = layer;
      break;
    }
  }
  return file;
}

// The model's shape: --model's, or the --init_from file's; the vocabulary
// covers the data's tokens.
absl::StatusOr<nn::GptConfig> ModelConfig(const Options& options,
                                          int64_t data_vocab,
                                          const std::optional<InitFile>& init) {
  nn::GptConfig config;
  const std::string name =
      options.model.empty() && !init.has_value() ? "tiny" : options.model;
  const bool reshaped =
      options.layers != 0 || options.heads != 0 || options.channels != 0;
  if (reshaped && name != "tiny") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--layers, --heads and --channels reshape --model=tiny only; --model=",
        name.empty() ? "(the --init_from file's shape)" : name,
        " has its own shape"));
  }
  if (name == "tiny") {
    config.num_layers = options.layers != 0 ? options.layers : 4;
    config.num_heads = options.heads != 0 ? options.heads : 4;
    config.channels = options.channels != 0 ? options.channels : 128;
    config.vocab_size = data_vocab;
    config.padded_vocab_size = 0;
  } else if (!name.empty()) {
    ZE_ASSIGN_OR_RETURN(config,
                        nn::GptConfig::Preset(name, /*pad_vocab=*/true));
    // A preset keeps its (padded) table, so its shapes and speed are the
    // real ones; byte data uses its first 256 rows.
    if (data_vocab > config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--data: tokens up to ", data_vocab - 1, " do not fit --model=", name,
          "'s vocabulary of ", config.vocab_size));
    }
    if (data_vocab <= 256) config.vocab_size = data_vocab;
  }
  config.max_seq_len = options.seq;
  if (init.has_value()) {
    const nn::Gpt2Dims& file = init->dims;
    if (name.empty()) {
      // GPT-2 files do not record the head count; every GPT-2 size uses
      // heads of 64 channels.
      config.num_layers = file.num_layers;
      config.channels = file.channels;
      config.num_heads = static_cast<int>(file.channels / 64);
      if (config.num_heads * 64 != file.channels) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--init_from=", options.init_from, ": ", file.channels,
            " channels are not heads of 64; name the shape with --model"));
      }
    } else if (config.num_layers != file.num_layers ||
               config.channels != file.channels) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--model=", name, " has ", config.num_layers, " layers of ",
          config.channels, " channels; --init_from=", options.init_from,
          " has ", file.num_layers, " of ", file.channels));
    }
    if (options.seq > file.max_positions) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--seq=", options.seq, " exceeds --init_from=", options.init_from,
          "'s ", file.max_positions, " positions"));
    }
    config.max_seq_len = file.max_positions;
    // A Hugging Face table is padded to a multiple of 128 on conversion
    // (50257 -> 50304); a native file's table is taken as it is. The
    // logits that compete are the file's vocabulary where it is known (a
    // native file without one: the data's).
    const int64_t rows = init->hugging_face
                             ? (file.vocab_size + 127) / 128 * 128
                             : file.vocab_size;
    const int64_t vocab = init->vocabulary > 0 ? init->vocabulary : data_vocab;
    if (data_vocab > vocab || vocab > rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--data: tokens up to ", data_vocab - 1, " do not fit --init_from=",
          options.init_from, "'s vocabulary of ", file.vocab_size));
    }
    config.vocab_size = vocab;
    config.padded_vocab_size = rows > vocab ? rows : 0;
  }
  ZE_RETURN_IF_ERROR(config.Validate());
  return config;
}

// Whether `directory` holds a completed checkpoint (its `latest` file).
bool CheckpointExists(const std::string& directory) {
  return std::ifstream(directory + "/latest").good();
}

// "1 rank", "2 ranks".
std::string Ranks(int n) {
  return n == 1 ? "1 rank" : absl::StrCat(n, " ranks");
}

// --dry_run with pipeline.stages > 1: the layout, the schedule's bubble and,
// per stage, its layers and the model-state plan of one of its ranks
// (BuildPlan over the stage's own layers at the data-parallel size), from
// shape-only stage models. With pipeline.stages_per_rank v > 1
// (interleaved) the model is cut into stages x v and the plan is per
// pipeline rank, over its v stages (one ZeRO strategy holds them): one
// line per rank naming its stages' layers. Rank 0 prints. Errors from the
// layout, the partition, the schedule or the plan (the config's key named).
absl::Status PrintPipelineDryRun(
    const std::string& config_path, const config::Config& config, int world,
    int64_t num_parameters, const std::optional<nn::GptConfig>& gpt,
    const std::optional<nn::DecoderConfig>& decoder, DType dtype, int rank) {
  const config::PipelineConfig& pipe = config.pipeline;
  const int per_rank = static_cast<int>(pipe.stages_per_rank);
  ZE_ASSIGN_OR_RETURN(
      const pipeline::PipelineLayout layout,
      pipeline::PipelineLayout::Create(world, static_cast<int>(pipe.stages),
                                       "pipeline.stages"));
  ZE_ASSIGN_OR_RETURN(
      const std::vector<pipeline::LayerRange> ranges,
      pipeline::PartitionLayers(
          gpt ? gpt->PipelineLayerWeights() : decoder->PipelineLayerWeights(),
          layout.stages * per_rank, pipe.partition,
          per_rank > 1 ? "pipeline.stages x pipeline.stages_per_rank"
                       : "pipeline.stages"));
  const pipeline::ScheduleKind kind = pipeline::ScheduleKindOf(pipe.schedule);
  ZE_ASSIGN_OR_RETURN(
      const pipeline::Schedule schedule,
      pipeline::BuildSchedule(
          kind, layout.stages,
          static_cast<int>(config.gradient_accumulation_steps.value()),
          per_rank));
  // Either family's stage (layers `range`), shapes only.
  const auto build_stage = [&](const pipeline::LayerRange& range)
      -> absl::StatusOr<std::unique_ptr<nn::LossModel>> {
    const auto stage_options = [&](auto options) {
      options.dtype = dtype;
      options.materialize = false;
      options.first_layer = range.first;
      options.last_layer = range.last;
      return options;
    };
    if (gpt) {
      ZE_ASSIGN_OR_RETURN(
          std::unique_ptr<nn::GptModel> stage,
          nn::GptModel::Create(*gpt, stage_options(nn::GptOptions())));
      return std::unique_ptr<nn::LossModel>(std::move(stage));
    }
    ZE_ASSIGN_OR_RETURN(std::unique_ptr<nn::DecoderModel> stage,
                        nn::DecoderModel::Create(
                            *decoder, stage_options(nn::DecoderOptions())));
    return std::unique_ptr<nn::LossModel>(std::move(stage));
  };
  std::vector<std::string> lines;
  for (int r = 0; r < layout.stages; ++r) {
    // Pipeline rank r holds stages r + c * stages (pipeline/schedule.h).
    std::vector<std::unique_ptr<nn::LossModel>> chunks;
    std::string held;
    for (int c = 0; c < per_rank; ++c) {
      const int s = r + c * layout.stages;
      ZE_ASSIGN_OR_RETURN(std::unique_ptr<nn::LossModel> chunk,
                          build_stage(ranges[s]));
      chunks.push_back(std::move(chunk));
      absl::StrAppend(&held, c == 0 ? "" : ", ", "stage ", s, ": layers [",
                      ranges[s].first, ", ", ranges[s].last, ")");
    }
    std::unique_ptr<nn::LossModel> model;
    if (per_rank == 1) {
      model = std::move(chunks[0]);
    } else {
      ZE_ASSIGN_OR_RETURN(model,
                          nn::InterleavedStages::Create(std::move(chunks)));
    }
    ZE_ASSIGN_OR_RETURN(const zero::Plan plan,
                        zero::BuildPlan(*model, config, layout.data_parallel));
    lines.push_back(absl::StrCat(
        "  ", per_rank > 1 ? absl::StrCat("rank ", r, " (", held, ")") : held,
        ", model state per rank: ", plan.memory.ToString()));
  }
  if (rank != 0) return absl::OkStatus();
  std::printf(
      "train_gpt --dry_run: %s (%lld parameters), %s, ZeRO stage %d, "
      "pipeline %s%s, schedule %s over %lld micro-batches (bubble %.3f; at "
      "most %d micro-batches' inputs stashed on rank 0)\n",
      config_path.c_str(), static_cast<long long>(num_parameters),
      Ranks(world).c_str(), static_cast<int>(config.zero_optimization.stage),
      layout.ToString().c_str(),
      per_rank > 1 ? absl::StrCat(", ", per_rank, " stages per rank").c_str()
                   : "",
      pipeline::ScheduleName(kind),
      static_cast<long long>(config.gradient_accumulation_steps.value()),
      pipeline::ExpectedBubbleFraction(schedule),
      pipeline::ActivationBound(schedule, 0));
  for (const std::string& line : lines) std::printf("%s\n", line.c_str());
  std::printf(
      "  activations per stage: not estimated yet; train_gpt itself does not "
      "train a pipeline yet (Engine::TrainBatch does: docs/pipeline.md)\n");
  return absl::OkStatus();
}

// The bytes one checkpoint of `model` under `config` takes on disk, every
// rank's file together, by the memory plan (zero::PlanMemory at world size
// 1, where a rank holds the whole state): the f32 master weights (an f32
// model's weights are its master weights), the optimizer's moments, the
// 16-bit weights of a mixed-precision model, and the consolidated 16-bit
// copy stage3_gather_16bit_weights_on_model_save adds. The files' headers
// and the manifest are small beside them.
absl::StatusOr<int64_t> CheckpointBytes(nn::LossModel& model,
                                        const config::Config& config) {
  ZE_ASSIGN_OR_RETURN(const zero::MemoryBreakdown plan,
                      zero::PlanMemory(model, config, /*world_size=*/1));
  const bool mixed =
      config::GetTrainingPrecision(config) != config::TrainingPrecision::kFp32;
  int64_t bytes = plan.model_weight_bytes + plan.optimizer_state_bytes;
  if (mixed) bytes += plan.master_weight_bytes;
  // "auto" resolves to false (config/resolve.cc); the config is not
  // resolved yet here.
  const config::Autoable<bool>& gather_16bit =
      config.zero_optimization.stage3_gather_16bit_weights_on_model_save;
  if (!gather_16bit.is_auto() && gather_16bit.value()) {
    bytes += plan.model_weight_bytes;
  }
  return bytes;
}

// --save_dir as this rank sees it, before any step: the directory exists
// or can be created, a file can be created and written in it (a read-only
// file system, a path through a regular file and missing permission all
// fail here, also for root), and its file system has room for one
// checkpoint of `checkpoint_bytes`. All ranks' files count, since ranks
// usually share the directory; older checkpoints there are kept by a save,
// so this is the least that must be free. FailedPrecondition naming the
// directory and the cause.
absl::Status CheckSaveDir(const std::string& directory,
                          int64_t checkpoint_bytes, int rank) {
  const std::string what = absl::StrCat("--save_dir=", directory);
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error || !std::filesystem::is_directory(directory)) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": cannot create the checkpoint directory on rank ", rank, ": ",
        error ? error.message() : "a file of that name exists"));
  }
  // A real write: access(W_OK) says yes to root on a read-only mount.
  const std::string probe =
      absl::StrCat(directory, "/.train_gpt_probe.rank", rank, ".", getpid());
  const int fd = ::open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": cannot write a file there on rank ", rank, ": ",
                     std::strerror(errno)));
  }
  const bool wrote = ::write(fd, "x", 1) == 1;
  const int write_errno = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!wrote) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": cannot write a file there on rank ", rank, ": ",
                     std::strerror(write_errno)));
  }
  struct statvfs disk;
  if (::statvfs(directory.c_str(), &disk) == 0) {
    const double free_bytes =
        static_cast<double>(disk.f_bavail) * static_cast<double>(disk.f_frsize);
    if (free_bytes < static_cast<double>(checkpoint_bytes)) {
      constexpr double kMib = 1024.0 * 1024.0;
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s: its file system has %.1f MiB free on rank %d, but one "
          "checkpoint of this model and config takes about %.1f MiB (%d "
          "bytes: master weights, optimizer state and 16-bit weights, by the "
          "memory plan); free space there or choose another --save_dir",
          what, free_bytes / kMib, rank, checkpoint_bytes / kMib,
          checkpoint_bytes));
    }
  }
  return absl::OkStatus();
}

// --prompt in the data's vocabulary: bytes (text files and the addition
// task, whose tokens are characters) or token ids separated by spaces
// (token files). Empty: none. InvalidArgument naming the flag for an id
// that is not a number or outside [0, vocab_size).
absl::StatusOr<std::vector<int32_t>> PromptTokens(const std::string& prompt,
                                                  DataSpec::Kind kind,
                                                  int64_t vocab_size) {
  std::vector<int32_t> tokens;
  if (kind != DataSpec::Kind::kTokens) {
    for (unsigned char c : prompt) tokens.push_back(c);
  } else {
    for (absl::string_view word :
         absl::StrSplit(prompt, ' ', absl::SkipWhitespace())) {
      int32_t id = 0;
      if (!absl::SimpleAtoi(word, &id) || id < 0 || id >= vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--prompt: '", word, "' is not a token id in [0, ", vocab_size,
            ") (token files take ids separated by spaces)"));
      }
      tokens.push_back(id);
    }
  }
  for (int32_t token : tokens) {
    if (token >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prompt: byte ", token,
                       " is outside the model's vocabulary of ", vocab_size));
    }
  }
  return tokens;
}

// Loads --init_from into the engine (every rank). A Hugging Face file is
// first converted to our names by rank 0, next to the checkpoints (or in
// $TMPDIR), which every rank must be able to read: on several hosts, give
// --save_dir on a shared file system.
absl::Status LoadInitialWeights(const Options& options, const InitFile& init,
                                const nn::GptConfig& gpt,
                                engine::Engine& engine) {
  comm::Communicator& communicator = engine.communicator();
  std::string path = options.init_from;
  std::string converted;
  if (init.hugging_face) {
    const char* tmp = std::getenv("TMPDIR");
    const std::string directory =
        !options.save_dir.empty() ? options.save_dir : (tmp ? tmp : "/tmp");
    // One name for every rank of this job (Open MPI's job id, the same on
    // every host), another for every other job.
    const char* job = std::getenv("OMPI_MCA_ess_base_jobid");
    converted =
        absl::StrCat(directory, "/init_from.",
                     job != nullptr ? std::string(job) : absl::StrCat(getpid()),
                     ".ze.safetensors");
    absl::Status status;
    if (communicator.rank() == 0) {
      // --save_dir need not exist yet: the first save would create it.
      std::error_code error;
      std::filesystem::create_directories(directory, error);
      if (error) {
        status = absl::FailedPreconditionError(absl::StrCat(
            "--init_from=", options.init_from, ": cannot create ", directory,
            " for the converted file: ", error.message()));
      } else {
        status = nn::ConvertHuggingFaceGpt2File(options.init_from, converted,
                                                DType::kF32, gpt.table_rows())
                     .status();
      }
    }
    ZE_RETURN_IF_ERROR(communicator.Barrier());
    ZE_RETURN_IF_ERROR(status);
    // The file appears only complete (written to a temporary name, then
    // renamed), so every rank can tell whether rank 0 succeeded, and no rank
    // enters LoadWeights' collectives alone.
    if (!std::ifstream(converted).good()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--init_from=", options.init_from, ": rank 0 did not convert it to ",
          converted, " (see rank 0's error), or this rank cannot read ",
          directory,
          " (on several hosts give --save_dir on a shared file "
          "system)"));
    }
    path = converted;
  }
  absl::StatusOr<engine::LoadReport> report = engine.LoadWeights(path);
  if (!converted.empty()) {
    ZE_RETURN_IF_ERROR(communicator.Barrier());
    if (communicator.rank() == 0) std::remove(converted.c_str());
  }
  if (!report.ok()) {
    return absl::Status(report.status().code(),
                        absl::StrCat("--init_from=", options.init_from, ": ",
                                     report.status().message()));
  }
  ZE_LOG_RANK0(INFO) << "train_gpt: initialised " << report->tensors
                     << " parameters from " << options.init_from
                     << (init.hugging_face ? " (Hugging Face GPT-2)" : "");
  return absl::OkStatus();
}

// What the trainer needs to know of the model it trains, whichever family
// (GPT, or a Llama / Mistral / Qwen decoder).
struct ModelFacts {
  std::string name;  // --model, "tiny", or where --init_from came from
  int num_layers = 0;
  int num_heads = 0;
  int64_t hidden = 0;           // the residual stream's width
  int64_t attention_width = 0;  // query heads x head size
  int64_t mlp_width = 0;        // the MLP's hidden width (4C, or the FFN's)
  int64_t vocab_size = 0;       // the logits that compete
  int64_t max_positions = 0;
  int64_t num_parameters = 0;
};

ModelFacts FactsOf(const std::string& name, const nn::GptConfig& gpt) {
  ModelFacts facts;
  facts.name = name;
  facts.num_layers = gpt.num_layers;
  facts.num_heads = gpt.num_heads;
  facts.hidden = gpt.channels;
  facts.attention_width = gpt.channels;
  facts.mlp_width = 4 * gpt.channels;
  facts.vocab_size = gpt.vocab_size;
  facts.max_positions = gpt.max_seq_len;
  facts.num_parameters = gpt.NumParameters();
  return facts;
}

ModelFacts FactsOf(const std::string& name, const nn::DecoderConfig& decoder) {
  ModelFacts facts;
  facts.name = name;
  facts.num_layers = decoder.num_layers;
  facts.num_heads = decoder.num_heads;
  facts.hidden = decoder.hidden_size;
  facts.attention_width = decoder.num_heads * decoder.head_dim;
  facts.mlp_width = decoder.intermediate_size;
  facts.vocab_size = decoder.vocab_size;
  facts.max_positions = decoder.max_position_embeddings;
  facts.num_parameters = decoder.NumParameters();
  return facts;
}

// Whether the options ask for a decoder (Llama, Mistral, Qwen): a decoder
// preset in --model, or a Hugging Face model directory in --init_from.
bool WantsDecoder(const Options& options) {
  const std::vector<std::string> presets = nn::DecoderConfig::PresetNames();
  return std::find(presets.begin(), presets.end(), options.model) !=
             presets.end() ||
         (!options.init_from.empty() &&
          std::filesystem::is_directory(options.init_from));
}

// The decoder's shape: the --init_from directory's config.json, or the
// --model preset's (a tiny preset's vocabulary is the data's, as GPT's
// tiny). `source` is set to the opened directory (every check done, nothing
// read yet). Errors name the flag.
absl::StatusOr<nn::DecoderConfig> DecoderModelConfig(
    const Options& options, int64_t data_vocab,
    std::unique_ptr<nn::HuggingFaceDecoderSource>* source) {
  if (options.layers != 0 || options.heads != 0 || options.channels != 0) {
    return absl::InvalidArgumentError(
        "--layers, --heads and --channels reshape --model=tiny only; a "
        "decoder takes its shape from its preset or config.json");
  }
  nn::DecoderConfig config;
  if (!options.init_from.empty()) {
    if (!options.model.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--model=", options.model, " with --init_from=", options.init_from,
          ": the directory's config.json gives the shape; leave out --model"));
    }
    absl::StatusOr<std::unique_ptr<nn::HuggingFaceDecoderSource>> opened =
        nn::HuggingFaceDecoderSource::Open(options.init_from);
    if (!opened.ok()) {
      return absl::Status(
          opened.status().code(),
          absl::StrCat("--init_from: ", opened.status().message()));
    }
    *source = std::move(*opened);
    config = (*source)->config();
    if (data_vocab > config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--data: tokens up to ", data_vocab - 1, " do not fit --init_from=",
          options.init_from, "'s vocabulary of ", config.vocab_size));
    }
  } else {
    ZE_ASSIGN_OR_RETURN(config, nn::DecoderConfig::Preset(options.model));
    if (absl::EndsWith(options.model, "-tiny")) {
      config.vocab_size = data_vocab;
    } else if (data_vocab > config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--data: tokens up to ", data_vocab - 1, " do not fit --model=",
          options.model, "'s vocabulary of ", config.vocab_size));
    }
    // A preset's positions are what the run needs (RoPE has no table).
    config.max_position_embeddings =
        std::max<int64_t>(config.max_position_embeddings, options.seq);
  }
  const std::string origin =
      options.init_from.empty()
          ? absl::StrCat("--model=", options.model)
          : absl::StrCat("--init_from=", options.init_from);
  if (options.seq > config.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("--seq=", options.seq, " exceeds ", origin, "'s ",
                     config.max_position_embeddings,
                     " positions (max_position_embeddings)"));
  }
  if (config.sliding_window > 0 && options.seq > config.sliding_window) {
    return absl::InvalidArgumentError(
        absl::StrCat("--seq=", options.seq, " exceeds ", origin,
                     "'s sliding_window of ", config.sliding_window,
                     " (only plain causal attention is implemented)"));
  }
  ZE_RETURN_IF_ERROR(config.Validate());
  return config;
}

// An evaluation's outcome; accuracy only for the addition task.
struct Evaluation {
  std::optional<double> accuracy;
  std::optional<double> validation_loss;
};

// How rank 0 prints a prompt and what the model made of it: text where
// the vocabulary is bytes, else the first token ids.
std::string ShowTokens(const std::vector<int32_t>& tokens, bool text) {
  if (text) {
    return absl::StrCat(
        "\"", absl::CEscape(std::string(tokens.begin(), tokens.end())), "\"");
  }
  std::string ids;
  for (size_t i = 0; i < tokens.size() && i < 16; ++i) {
    absl::StrAppend(&ids, i ? " " : "", tokens[i]);
  }
  return absl::StrCat("[", ids, tokens.size() > 16 ? " ...]" : "]");
}

// Greedy answers to every held-out problem in one batched Generate call
// (KV cache). Every rank generates the whole set, the same collective
// under stage 3 and the same verdict everywhere, at the price of repeating
// a small computation. A --prompt (every rank's the same) is answered
// greedily too, up to a newline.
absl::StatusOr<Evaluation> EvaluateAddition(
    const examples::AdditionTask& task, const ModelFacts& facts,
    engine::Engine& engine, int64_t step, int rank,
    const std::vector<int32_t>& prompt) {
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& problem : task.held_out()) {
    prompts.push_back(task.PromptTokens(problem));
  }
  engine::GenerateOptions generate;
  generate.max_context = facts.max_positions;
  generate.vocab_size = facts.vocab_size;
  generate.stop_token = '\n';
  ZE_ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> outputs,
                      engine.Generate(prompts, task.digits() + 2, generate));
  int correct = 0;
  std::vector<std::string> samples;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& problem = task.held_out()[i];
    const std::string text(outputs[i].begin(), outputs[i].end());
    const std::optional<int64_t> answer = task.ParseAnswer(text);
    const bool ok = answer.has_value() && *answer == problem.a + problem.b;
    correct += ok;
    if (samples.size() < 4) {
      samples.push_back(absl::StrCat(
          "  ", examples::AdditionTask::Describe(problem), "= -> ",
          answer.has_value() ? absl::StrCat(*answer)
                             : absl::StrCat("\"", absl::CEscape(text), "\""),
          ok ? " (ok)"
             : absl::StrCat(" (wrong, ", problem.a + problem.b, ")")));
    }
  }
  Evaluation evaluation;
  evaluation.accuracy = static_cast<double>(correct) / outputs.size();
  if (rank == 0) {
    std::printf("eval at step %lld: held-out accuracy %d/%zu = %.1f%%\n",
                static_cast<long long>(step), correct, outputs.size(),
                *evaluation.accuracy * 100);
    for (const std::string& sample : samples)
      std::printf("%s\n", sample.c_str());
    std::fflush(stdout);
  }
  if (!prompt.empty()) {
    ZE_ASSIGN_OR_RETURN(std::vector<int32_t> answer,
                        engine.Generate(prompt, task.digits() + 2, generate));
    if (rank == 0) {
      std::printf("  --prompt %s -> %s\n", ShowTokens(prompt, true).c_str(),
                  ShowTokens(answer, true).c_str());
      std::fflush(stdout);
    }
  }
  return evaluation;
}

// The mean loss over validation windows, and a sampled continuation of
// --prompt, or without one of the validation part's first tokens.
absl::StatusOr<Evaluation> EvaluateCorpus(
    const examples::TokenCorpus& corpus, const ModelFacts& facts,
    engine::Engine& engine, int64_t seq, int64_t windows, int64_t step,
    int rank, const std::vector<int32_t>& user_prompt) {
  // Eight windows a forward bounds the evaluation's activations whatever
  // --eval_windows is; every window has seq targets, so the validation loss
  // is the mean of the batches' means weighted by their windows.
  constexpr int64_t kWindowsPerForward = 8;
  double loss_sum = 0;
  for (int64_t first = 0; first < windows; first += kWindowsPerForward) {
    const int64_t batch = std::min(kWindowsPerForward, windows - first);
    std::vector<int32_t> tokens(batch * seq), targets(batch * seq);
    for (int64_t i = 0; i < batch; ++i) {
      corpus.FillValidation(first + i, windows, seq, &tokens[i * seq],
                            &targets[i * seq]);
    }
    ZE_ASSIGN_OR_RETURN(
        float batch_loss,
        engine.EvalForward(Tensor::Wrap(tokens.data(), {batch, seq},
                                        DType::kI32, Device::Cpu()),
                           Tensor::Wrap(targets.data(), {batch, seq},
                                        DType::kI32, Device::Cpu())));
    loss_sum += static_cast<double>(batch_loss) * static_cast<double>(batch);
  }
  const float loss =
      static_cast<float>(loss_sum / static_cast<double>(windows));
  const int64_t prompt_length = std::min<int64_t>(32, seq / 2);
  const std::vector<int32_t> prompt =
      user_prompt.empty() ? corpus.ValidationTokens(0, prompt_length)
                          : user_prompt;
  engine::GenerateOptions generate;
  generate.max_context = facts.max_positions;
  generate.vocab_size = facts.vocab_size;
  generate.temperature = 0.8f;
  generate.top_k = 40;
  generate.seed = static_cast<uint64_t>(step);
  ZE_ASSIGN_OR_RETURN(std::vector<int32_t> continuation,
                      engine.Generate(prompt, 64, generate));
  if (rank == 0) {
    std::printf("eval at step %lld: validation loss %.4f\n",
                static_cast<long long>(step), loss);
    if (corpus.is_text()) {
      const std::string before(prompt.begin(), prompt.end());
      const std::string after(continuation.begin(), continuation.end());
      std::printf("  \"%s\" -> \"%s\"\n", absl::CEscape(before).c_str(),
                  absl::CEscape(after).c_str());
    } else if (!user_prompt.empty()) {
      std::printf("  --prompt %s -> %s\n", ShowTokens(prompt, false).c_str(),
                  ShowTokens(continuation, false).c_str());
    } else {
      std::string ids;
      for (size_t i = 0; i < continuation.size() && i < 16; ++i) {
        absl::StrAppend(&ids, i ? " " : "", continuation[i]);
      }
      std::printf("  sampled token ids: %s ...\n", ids.c_str());
    }
    std::fflush(stdout);
  }
  Evaluation evaluation;
  evaluation.validation_loss = loss;
  return evaluation;
}

// --export_hf: the trained f32 master weights, gathered one parameter at a
// time (a collective: every rank gathers each parameter; rank 0 writes), as
// a Hugging Face model directory in --export_dtype. Memory: one parameter's
// full value at a time. Every rank returns rank 0's outcome.
absl::Status ExportHuggingFace(const Options& options,
                               const nn::DecoderConfig& decoder,
                               engine::Engine& engine) {
  comm::Communicator& communicator = engine.communicator();
  const bool writes = communicator.rank() == 0;
  std::unique_ptr<nn::HuggingFaceDecoderWriter> writer;
  absl::Status status;
  if (writes) {
    nn::DecoderExportOptions export_options;
    export_options.dtype = options.export_dtype;
    // save_pretrained's default shard size.
    export_options.max_shard_bytes = uint64_t{5} << 30;
    export_options.metadata = {{"source", "zero-engine train_gpt"}};
    absl::StatusOr<std::unique_ptr<nn::HuggingFaceDecoderWriter>> created =
        nn::HuggingFaceDecoderWriter::Create(options.export_hf, decoder,
                                             export_options);
    if (created.ok()) {
      writer = std::move(*created);
    } else {
      status = created.status();
    }
  }
  for (const auto& [name, shape] : decoder.ParameterShapes()) {
    // Every rank gathers every parameter, whatever rank 0's state, so the
    // collectives stay matched.
    absl::StatusOr<std::vector<float>> values =
        engine.GatherMasterWeights(name);
    if (!values.ok()) {
      status.Update(values.status());
      break;
    }
    if (writes && status.ok()) {
      status.Update(writer->Append(
          name,
          Tensor::Wrap(values->data(), {static_cast<int64_t>(values->size())},
                       DType::kF32, Device::Cpu())));
    }
  }
  if (writes && status.ok()) status.Update(writer->Finish());
  ZE_RETURN_IF_ERROR(engine::AgreeAcrossRanks(
      communicator, status, engine.compute_stream(), "--export_hf"));
  ZE_LOG_RANK0(INFO) << "train_gpt: wrote " << options.export_hf
                     << " (Hugging Face "
                     << nn::DecoderFamilyName(decoder.family) << ", "
                     << DTypeName(options.export_dtype) << ")";
  return absl::OkStatus();
}

// Takes the options by value: --seq=0 is resolved here, from the data.
absl::Status Train(Options options, int* exit_code) {
  ZE_ASSIGN_OR_RETURN(options.config, ResolveConfigPath(options.config));
  comm::CommOptions comm_options;
  comm_options.device = options.device;
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> created,
                      comm::CreateCommunicator(comm_options));
  std::shared_ptr<comm::Communicator> communicator = std::move(created);
  const int world = communicator->world_size();
  const int rank = communicator->rank();

  // The config decides the model's dtype, so read it before building the
  // model; Initialize reads (and checks) the same file again.
  ZE_ASSIGN_OR_RETURN(config::Config config,
                      config::LoadConfigFile(options.config, world));
  const uint64_t seed =
      static_cast<uint64_t>(options.seed >= 0 ? options.seed : config.seed);

  // The data first: its vocabulary sizes the model.
  ZE_ASSIGN_OR_RETURN(DataSpec data, ParseDataFlag(options.data));
  std::optional<examples::AdditionTask> task;
  std::unique_ptr<examples::TokenCorpus> corpus;
  int64_t data_vocab = 256;
  std::string data_description;
  if (data.kind == DataSpec::Kind::kAddition) {
    ZE_ASSIGN_OR_RETURN(task, examples::AdditionTask::Create(
                                  options.digits, options.eval_problems, seed));
    // One problem per row: every problem at the same positions, as the
    // evaluation's prompts are, which the model learns several times faster
    // than problems packed at shifting offsets.
    if (options.seq == 0) options.seq = task->problem_length() - 1;
  } else if (options.seq == 0) {
    options.seq = 64;
  }
  if (task.has_value()) {
    const examples::AdditionTask::Problem& example = task->held_out()[0];
    const std::vector<int32_t> prompt = task->PromptTokens(example);
    data_description = absl::StrFormat(
        "%d-digit addition, answers reversed (%s = \"%s%s\"), %d problems "
        "held out",
        options.digits, examples::AdditionTask::Describe(example),
        std::string(prompt.begin(), prompt.end()),
        absl::CEscape(task->AnswerText(example)), options.eval_problems);
  } else if (data.kind == DataSpec::Kind::kText) {
    ZE_ASSIGN_OR_RETURN(
        corpus, examples::TokenCorpus::FromTextFile(data.path, options.seq));
    data_description = absl::StrCat(data.path, " (", corpus->size(), " bytes)");
  } else {
    ZE_ASSIGN_OR_RETURN(corpus, examples::TokenCorpus::FromTokenFile(
                                    data.path, options.seq, data.width));
    data_vocab = corpus->vocab_size();
    data_description = absl::StrCat(data.path, " (", corpus->size(), " uint",
                                    8 * corpus->bytes_per_token(),
                                    " tokens, largest ", data_vocab - 1, ")");
  }
  // The config's precision builds the model, so it cannot come from the
  // model as Initialize's "auto" would take it.
  for (const auto& [key, enabled] :
       {std::pair{"fp16.enabled", &config.fp16.enabled},
        std::pair{"bf16.enabled", &config.bf16.enabled}}) {
    if (enabled->is_auto()) {
      return absl::InvalidArgumentError(absl::StrCat(
          options.config, ": ", key,
          " is \"auto\", but train_gpt builds the model in the config's "
          "precision: set fp16.enabled or bf16.enabled to true or false"));
    }
  }
  const config::TrainingPrecision precision =
      config::GetTrainingPrecision(config);
  const DType model_dtype = config::PrecisionDType(precision);
  // The model, either family. Shapes only: the engine creates the storage
  // in its flat buffers.
  std::shared_ptr<nn::LossModel> model;
  ModelFacts facts;
  std::optional<InitFile> init;  // GPT's --init_from file
  std::optional<nn::GptConfig> gpt_config;
  // A decoder's --init_from directory, opened and checked on every rank;
  // each rank reads its own ranges from it after Initialize.
  std::unique_ptr<nn::HuggingFaceDecoderSource> decoder_source;
  std::optional<nn::DecoderConfig> decoder_config;
  if (WantsDecoder(options)) {
    ZE_ASSIGN_OR_RETURN(decoder_config, DecoderModelConfig(options, data_vocab,
                                                           &decoder_source));
    decoder_config->activation_checkpointing = options.activation_checkpointing;
    decoder_config->recompute_activations = options.recompute_activations;
    decoder_config->head_weight_gradient_in_backward =
        options.head_weight_gradient_in_backward;
    nn::DecoderOptions model_options;
    model_options.device = communicator->device();
    model_options.dtype = model_dtype;
    model_options.seed = seed;
    model_options.materialize = false;
    ZE_ASSIGN_OR_RETURN(
        std::unique_ptr<nn::DecoderModel> built,
        nn::DecoderModel::Create(*decoder_config, model_options));
    model = std::move(built);
    facts = FactsOf(
        options.model.empty()
            ? absl::StrCat(nn::DecoderFamilyName(decoder_config->family),
                           " from --init_from")
            : options.model,
        *decoder_config);
  } else {
    if (!options.init_from.empty()) {
      ZE_ASSIGN_OR_RETURN(init, InspectInitFile(options.init_from));
    }
    ZE_ASSIGN_OR_RETURN(gpt_config, ModelConfig(options, data_vocab, init));
    gpt_config->activation_checkpointing = options.activation_checkpointing;
    gpt_config->recompute_activations = options.recompute_activations;
    gpt_config->head_weight_gradient_in_backward =
        options.head_weight_gradient_in_backward;
    nn::GptOptions model_options;
    model_options.device = communicator->device();
    model_options.dtype = model_dtype;
    model_options.seed = seed;
    model_options.materialize = false;
    ZE_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptModel> built,
                        nn::GptModel::Create(*gpt_config, model_options));
    model = std::move(built);
    facts = FactsOf(options.model.empty() ? (init ? "from --init_from" : "tiny")
                                          : options.model,
                    *gpt_config);
  }
  const int64_t seq = options.seq;
  if (!options.export_hf.empty()) {
    if (!decoder_config.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--export_hf=", options.export_hf,
          ": writes Llama/Mistral/Qwen decoders; for a GPT, save a "
          "checkpoint and run ze_checkpoint consolidate --format=hf-gpt2"));
    }
    // Before any step: a directory rank 0 cannot create or write in must
    // not cost the run.
    absl::Status usable;
    if (rank == 0) {
      std::error_code error;
      std::filesystem::create_directories(options.export_hf, error);
      if (error) {
        usable = absl::FailedPreconditionError(
            absl::StrCat("--export_hf=", options.export_hf,
                         ": cannot create the directory: ", error.message()));
      } else if (access(options.export_hf.c_str(), W_OK) != 0) {
        usable = absl::FailedPreconditionError(
            absl::StrCat("--export_hf=", options.export_hf,
                         ": cannot write there: ", std::strerror(errno)));
      }
    }
    ZE_RETURN_IF_ERROR(engine::AgreeAcrossRanks(
        *communicator, usable, Stream::Default(communicator->device()),
        "checking --export_hf"));
  }
  if (options.dry_run && config.pipeline.stages > 1) {
    ZE_RETURN_IF_ERROR(PrintPipelineDryRun(options.config, config, world,
                                           facts.num_parameters, gpt_config,
                                           decoder_config, model_dtype, rank));
    *exit_code = 0;
    return absl::OkStatus();
  }
  if (config.pipeline.stages > 1) {
    return absl::UnimplementedError(absl::StrCat(
        options.config, ": pipeline.stages ", config.pipeline.stages,
        ": train_gpt does not train a pipeline yet (each rank would build "
        "only its stage and train through Engine::TrainBatch: "
        "docs/pipeline.md); --dry_run shows the plan per stage"));
  }
  // The config as Initialize trains by, resolved here the same way
  // (engine::ResolveConfig) so that the plans below are Initialize's: an
  // "auto" offload_optimizer.ratio is chosen beside this run's activation
  // estimate and handed to Initialize, which keeps it. "auto" values only
  // a trainer's arguments fill (learning rates...) fail here, naming them.
  // The ratio's placeholder is used only when it is "auto" (then replaced
  // below); the micro-batch it resolves sizes the activation estimate.
  const bool auto_ratio =
      config.zero_optimization.offload_optimizer.ratio.is_auto();
  config::ResolutionContext hints;
  config::ResolutionContext any_ratio;
  any_ratio.offload_optimizer_ratio = 1.0;
  ZE_ASSIGN_OR_RETURN(
      config::Config resolved,
      engine::ResolveConfig(config, *model, *communicator, any_ratio));
  // Activations of one micro-batch (zero/activation_estimate.h): the
  // step's allocations walked in the modules' order, loss head and
  // checkpointing included. With cpu_checkpointing the checkpointed
  // inputs move to pinned host memory and the plan's ring stays on the
  // device.
  const int64_t micro_batch = resolved.train_micro_batch_size_per_gpu.value();
  zero::ActivationModel shape =
      decoder_config.has_value()
          ? zero::ActivationModel::Of(*decoder_config, model_dtype, micro_batch,
                                      seq)
          : zero::ActivationModel::Of(*gpt_config, model_dtype, micro_batch,
                                      seq);
  shape.ring_slots = options.activation_checkpointing &&
                             resolved.activation_checkpointing.cpu_checkpointing
                         ? zero::kActivationRingSlots
                         : 0;
  shape.cuda = communicator->device().is_cuda();
  const zero::ActivationEstimate activations = zero::EstimateActivations(shape);
  engine::AutoOffloadRatio chosen_ratio;
  if (auto_ratio) {
    hints.activation_bytes = activations.device;
    if (options.device_memory_gib > 0) {
      hints.device_memory_bytes = static_cast<int64_t>(
          options.device_memory_gib * 1024.0 * 1024.0 * 1024.0);
    }
    ZE_ASSIGN_OR_RETURN(
        resolved, engine::ResolveConfig(config, *model, *communicator, hints,
                                        &chosen_ratio));
    hints.offload_optimizer_ratio = chosen_ratio.ratio;
  }
  config = std::move(resolved);
  if (options.dry_run) {
    ZE_ASSIGN_OR_RETURN(zero::Plan plan,
                        zero::BuildPlan(*model, config, world));
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    if (rank == 0) {
      std::printf(
          "train_gpt --dry_run: %s (%lld parameters), %s, ZeRO stage "
          "%d\n  model state per rank: %s\n  activations per rank "
          "(estimate, micro-batch %lld x %lld%s%s%s): %s\n",
          options.config.c_str(), static_cast<long long>(facts.num_parameters),
          Ranks(world).c_str(),
          static_cast<int>(config.zero_optimization.stage),
          plan.memory.ToString().c_str(), static_cast<long long>(micro_batch),
          static_cast<long long>(seq),
          options.activation_checkpointing ? ", activation checkpointing" : "",
          options.recompute_activations ? ", recomputed activations" : "",
          options.head_weight_gradient_in_backward
              ? ", head weight gradient in backward"
              : "",
          activations.ToString().c_str());
      if (plan.activation_ring_slots > 0 && options.activation_checkpointing) {
        std::printf(
            "  cpu_checkpointing: saved inputs in pinned host memory %.3f "
            "GiB, %d device ring buffers of one input (included above)\n",
            activations.pinned_host / kGiB, plan.activation_ring_slots);
      } else if (plan.activation_ring_slots > 0) {
        std::printf(
            "  cpu_checkpointing: set, but no block is checkpointed "
            "(--activation_checkpointing): nothing to offload\n");
      }
      if (auto_ratio) {
        std::printf("  offload_optimizer.ratio \"auto\": %s\n",
                    chosen_ratio.ToString().c_str());
      }
    }
    *exit_code = 0;
    return absl::OkStatus();
  }
  // Checkpoint arguments, checked on every rank together before the engine
  // exists: a mistake there must not cost a training run.
  const Stream& setup_stream = Stream::Default(communicator->device());
  bool resuming = false;
  if (options.resume || options.resume_if_present) {
    const bool present =
        options.resume_tag.empty()
            ? CheckpointExists(options.save_dir)
            : std::filesystem::is_directory(checkpoint::TagDirectory(
                  options.save_dir, options.resume_tag));
    absl::Status seen;
    if (!present) {
      seen = absl::NotFoundError(
          options.resume_tag.empty()
              ? absl::StrCat("--resume: no checkpoint in --save_dir=",
                             options.save_dir, " (no ", options.save_dir,
                             "/latest); leave out --resume to start a new "
                             "run there, or give --resume_if_present to "
                             "resume only when a checkpoint exists")
              : absl::StrCat("--resume_tag=", options.resume_tag,
                             ": no checkpoint ",
                             checkpoint::TagDirectory(options.save_dir,
                                                      options.resume_tag)));
    }
    // Every rank resumes or none: LoadCheckpoint is a collective.
    const absl::Status everywhere = engine::AgreeAcrossRanks(
        *communicator, seen, setup_stream, "checking --resume");
    if (options.resume) ZE_RETURN_IF_ERROR(everywhere);
    resuming = everywhere.ok();
  }
  if (!options.save_dir.empty()) {
    ZE_ASSIGN_OR_RETURN(const int64_t checkpoint_bytes,
                        CheckpointBytes(*model, config));
    ZE_RETURN_IF_ERROR(engine::AgreeAcrossRanks(
        *communicator, CheckSaveDir(options.save_dir, checkpoint_bytes, rank),
        setup_stream, "checking --save_dir"));
  }
  ZE_ASSIGN_OR_RETURN(
      std::vector<int32_t> prompt,
      PromptTokens(options.prompt, data.kind, facts.vocab_size));

  ZE_ASSIGN_OR_RETURN(
      std::unique_ptr<engine::Engine> engine,
      engine::Initialize(model, options.config, communicator, hints));

  const int64_t micro = engine->config().train_micro_batch_size_per_gpu.value();
  const int64_t accumulation =
      engine->config().gradient_accumulation_steps.value();
  const int64_t batch_tokens = engine->config().train_batch_size.value() * seq;
  ZE_LOG_RANK0(INFO) << absl::StrFormat(
      "train_gpt: model %s (%d layers, %d heads, %d channels; %d "
      "parameters, %s), %s on %s, %d steps of "
      "%d x %d x %d (micro x accumulation x ranks) sequences of %d tokens; "
      "data: %s",
      facts.name, facts.num_layers, facts.num_heads,
      static_cast<int>(facts.hidden), facts.num_parameters,
      DTypeName(model_dtype), Ranks(world), communicator->device().ToString(),
      options.steps, micro, accumulation, world, seq, data_description);

  // A checkpoint to resume from replaces every weight --init_from would
  // load, so the file is read only when there is none.
  if (init.has_value() && !resuming) {
    ZE_RETURN_IF_ERROR(
        LoadInitialWeights(options, *init, *gpt_config, *engine));
  }
  if (decoder_source != nullptr && !resuming) {
    absl::StatusOr<engine::LoadReport> report =
        engine->LoadWeights(*decoder_source);
    if (!report.ok()) {
      return absl::Status(report.status().code(),
                          absl::StrCat("--init_from=", options.init_from, ": ",
                                       report.status().message()));
    }
    ZE_LOG_RANK0(INFO) << "train_gpt: initialised " << report->tensors
                       << " parameters from " << decoder_source->description();
  }
  // Only the load reads the directory; its files close here.
  decoder_source.reset();
  // Resuming: the step to continue from and the first steps' mean loss (to
  // judge the whole run's progress) come back in client_state.
  int64_t first_step = 0;
  double resumed_first_loss = 0;
  if (resuming) {
    ZE_ASSIGN_OR_RETURN(
        engine::Engine::LoadedCheckpoint loaded,
        engine->LoadCheckpoint(options.save_dir, options.resume_tag));
    first_step = loaded.client_state.value("next_step", int64_t{0});
    resumed_first_loss = loaded.client_state.value("first_loss", 0.0);
    ZE_LOG_RANK0(INFO) << "train_gpt: resumed from " << options.save_dir << "/"
                       << loaded.tag << " (saved by "
                       << Ranks(loaded.saved_world_size) << " at ZeRO stage "
                       << loaded.saved_stage << "), continuing at step "
                       << first_step;
  }

  auto evaluate = [&](int64_t step) -> absl::StatusOr<Evaluation> {
    if (task.has_value()) {
      return EvaluateAddition(*task, facts, *engine, step, rank, prompt);
    }
    return EvaluateCorpus(*corpus, facts, *engine, seq, options.eval_windows,
                          step, rank, prompt);
  };

  // Progress: a line redrawn in place, or the engine's log lines.
  // Under any launcher comm/ recognises (Open MPI or Hydra), stdout is the
  // launcher's pipe even when the launcher's own stdout is a terminal.
  const absl::StatusOr<comm::LaunchInfo> launch =
      comm::LaunchInfoFromEnvironment();
  const bool under_mpirun = !launch.ok() || launch->launched;
  const bool in_place =
      options.progress == "line" ||
      (options.progress == "auto" && isatty(STDOUT_FILENO) && !under_mpirun);
  examples::ProgressPrinter progress(stdout, in_place && rank == 0);
  const LogLevel log_level = MinLogLevel();
  // The engine's steps_per_print lines would break the redrawn line.
  auto quiet_engine = [&](bool quiet) {
    if (progress.in_place()) {
      SetMinLogLevel(quiet ? std::max(log_level, LogLevel::kWarning)
                           : log_level);
    }
  };
  const double flops_per_token = examples::TrainingFlopsPerToken(
      static_cast<double>(facts.num_parameters), facts.num_layers,
      facts.attention_width, seq);
  Allocator* allocator = GetAllocator(communicator->device());

  // The micro-batch's buffers through the host allocator, so a micro-batch
  // too large for memory is a ResourceExhausted naming its bytes.
  const std::string batch_what =
      absl::StrCat("the micro-batch's tokens (train_micro_batch_size_per_gpu ",
                   micro, " x --seq ", seq, " int32)");
  absl::StatusOr<Tensor> token_buffer =
      Tensor::Empty({micro, seq}, DType::kI32, Device::Cpu());
  ZE_RETURN_IF_ERROR(Annotate(token_buffer.status(), batch_what));
  absl::StatusOr<Tensor> target_buffer =
      Tensor::Empty({micro, seq}, DType::kI32, Device::Cpu());
  ZE_RETURN_IF_ERROR(Annotate(target_buffer.status(), batch_what));
  int32_t* tokens = token_buffer->data_as<int32_t>();
  int32_t* targets = target_buffer->data_as<int32_t>();
  std::vector<double> losses;
  double first_loss = resumed_first_loss;  // mean of the run's first steps
  auto save = [&](int64_t next_step) -> absl::Status {
    // The real vocabulary, so that `ze_checkpoint consolidate
    // --format=hf-gpt2` drops a padded table's extra rows (50304 ->
    // 50257) and transformers loads the file as GPT-2; a decoder's
    // config.json, so that `consolidate --format=hf` writes the directory
    // transformers loads.
    nlohmann::json client_state{
        {"next_step", next_step},
        {"first_loss", first_loss},
        {checkpoint::kClientStateVocabularyKey, facts.vocab_size}};
    if (decoder_config.has_value()) {
      client_state[checkpoint::kClientStateHfConfigKey] =
          nlohmann::json::parse(decoder_config->ToHuggingFaceJson());
    }
    return engine->SaveCheckpoint(options.save_dir, "", client_state);
  };
  Evaluation last_evaluation;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  Clock::time_point window_start = start;
  int64_t window_steps = 0;
  double eval_seconds = 0;  // excluded from throughput and ETA
  quiet_engine(true);
  for (int64_t step = first_step; step < options.steps; ++step) {
    engine::StepReport report;
    for (int64_t m = 0; m < accumulation; ++m) {
      for (int64_t i = 0; i < micro; ++i) {
        const int64_t sample =
            ((step * accumulation + m) * world + rank) * micro + i;
        if (task.has_value()) {
          task->FillSample(sample, seq, &tokens[i * seq], &targets[i * seq]);
        } else {
          corpus->FillSample(
              static_cast<int64_t>(examples::Mix(seed) >> 1) ^ sample, seq,
              &tokens[i * seq], &targets[i * seq]);
        }
      }
      ZE_RETURN_IF_ERROR(
          engine->Forward(*token_buffer, *target_buffer).status());
      ZE_RETURN_IF_ERROR(engine->Backward());
      ZE_ASSIGN_OR_RETURN(report, engine->Step());
    }
    if (!report.skipped) losses.push_back(report.loss);
    if (first_loss == 0 && losses.size() == 5) {
      first_loss =
          (losses[0] + losses[1] + losses[2] + losses[3] + losses[4]) / 5;
    }
    ++window_steps;
    const Clock::time_point now = Clock::now();
    const double window_seconds =
        std::chrono::duration<double>(now - window_start).count();
    // Redraw at most about five times a second, and at the last step.
    if (progress.in_place() &&
        (window_seconds >= 0.2 || step + 1 == options.steps)) {
      examples::ProgressSnapshot snapshot;
      snapshot.step = step + 1;
      snapshot.total_steps = options.steps;
      snapshot.loss = report.loss;
      snapshot.tokens_per_second =
          window_steps * static_cast<double>(batch_tokens) / window_seconds;
      if (communicator->device().is_cuda()) {
        snapshot.mfu = examples::ModelFlopsUtilization(
            flops_per_token, snapshot.tokens_per_second, world,
            options.peak_tflops * 1e12);
      }
      snapshot.remaining_seconds = examples::EstimateRemainingSeconds(
          step + 1 - first_step, options.steps - first_step,
          std::chrono::duration<double>(now - start).count() - eval_seconds);
      const AllocatorStats memory = allocator->stats();
      snapshot.memory_allocated_bytes = memory.bytes_in_use;
      snapshot.memory_peak_bytes = memory.peak_bytes_in_use;
      progress.Update(snapshot);
      window_start = now;
      window_steps = 0;
    }
    if (!options.save_dir.empty() && options.save_every > 0 &&
        (step + 1) % options.save_every == 0 && step + 1 < options.steps) {
      ZE_RETURN_IF_ERROR(save(step + 1));
    }
    if (options.eval_every > 0 && (step + 1) % options.eval_every == 0 &&
        step + 1 < options.steps) {
      const Clock::time_point eval_start = Clock::now();
      progress.Finish();
      quiet_engine(false);
      ZE_ASSIGN_OR_RETURN(last_evaluation, evaluate(step + 1));
      quiet_engine(true);
      eval_seconds +=
          std::chrono::duration<double>(Clock::now() - eval_start).count();
      window_start = Clock::now();
      window_steps = 0;
    }
  }
  progress.Finish();
  quiet_engine(false);
  if (!options.save_dir.empty() && first_step < options.steps) {
    ZE_RETURN_IF_ERROR(save(options.steps));
  }
  if (!options.export_hf.empty()) {
    ZE_RETURN_IF_ERROR(ExportHuggingFace(options, *decoder_config, *engine));
  }
  const double seconds =
      std::chrono::duration<double>(Clock::now() - start).count() -
      eval_seconds;

  if (first_step >= options.steps) {
    ZE_LOG_RANK0(INFO) << "train_gpt: the checkpoint is already at step "
                       << first_step << " of " << options.steps
                       << "; nothing to train";
    *exit_code = 0;
    return absl::OkStatus();
  }
  ZE_ASSIGN_OR_RETURN(last_evaluation, evaluate(options.steps));
  // The loss is the mean over all ranks, so every rank reaches the same
  // verdict.
  const size_t window = std::max<size_t>(1, losses.size() / 5);
  double first = 0, last = 0;
  const bool judged = losses.size() >= 2 * window;
  if (judged) {
    for (size_t i = 0; i < window; ++i) {
      first += losses[i] / window;
      last += losses[losses.size() - window + i] / window;
    }
    // A resumed run is judged against the loss the run started from.
    if (resumed_first_loss > 0) first = resumed_first_loss;
  }
  const double drop = judged && first > 0 ? 1 - last / first : 0;
  // Only the checks the command line asked for decide the exit status.
  const bool dropped_enough =
      options.min_loss_drop <= 0 || (judged && drop >= options.min_loss_drop);
  const bool accurate = !last_evaluation.accuracy.has_value() ||
                        *last_evaluation.accuracy >= options.min_accuracy;
  const double tokens_per_second =
      static_cast<double>(options.steps - first_step) * batch_tokens / seconds;
  if (rank == 0) {
    std::string verdict;
    if (!judged) {
      verdict = "too few unskipped steps to judge the loss";
    } else if (drop > 0) {
      verdict = absl::StrFormat("the loss fell %.1f%%", drop * 100);
    } else {
      verdict = absl::StrFormat("the loss did not fall (%+.1f%%)", -drop * 100);
    }
    if (options.min_loss_drop > 0) {
      verdict = dropped_enough
                    ? absl::StrFormat("OK, %s (>= %.0f%%)", verdict,
                                      options.min_loss_drop * 100)
                    : absl::StrFormat("FAILED, %s (--min_loss_drop %.0f%%)",
                                      verdict, options.min_loss_drop * 100);
    }
    if (last_evaluation.accuracy.has_value()) {
      absl::StrAppendFormat(&verdict, "; held-out accuracy %.1f%%",
                            *last_evaluation.accuracy * 100);
      if (options.min_accuracy > 0) {
        absl::StrAppendFormat(
            &verdict,
            accurate ? " (>= %.0f%%: learned)" : " (FAILED: below %.0f%%)",
            options.min_accuracy * 100);
      }
    }
    std::printf(
        "train_gpt: %s, %s, ZeRO stage %d, %d steps in %.1f s "
        "(%.0f tokens/s), loss %.4f -> %.4f (mean of first/last %zu), "
        "skipped %d: %s\n",
        options.model.empty()
            ? (options.init_from.empty() ? "tiny" : "the --init_from model")
            : options.model.c_str(),
        Ranks(world).c_str(),
        static_cast<int>(engine->config().zero_optimization.stage),
        static_cast<int>(options.steps - first_step), seconds,
        tokens_per_second, first, last, window,
        static_cast<int>(engine->counters().skipped_steps), verdict.c_str());
    std::fflush(stdout);
  }
  *exit_code = dropped_enough && accurate ? 0 : 1;
  return absl::OkStatus();
}

}  // namespace
}  // namespace ze

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "trains a GPT through ze::engine::Initialize; launch with mpirun -np N "
      "(see examples/train_gpt.cc's header for every flag)");
  bool help = false;
  const std::string bad_flag = ze::CheckCommandLine(argc, argv, &help);
  if (help) {
    ze::PrintHelp();
    return 0;
  }
  if (!bad_flag.empty()) {
    std::fprintf(stderr, "train_gpt: %s\n", bad_flag.c_str());
    return 2;
  }
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    std::fprintf(stderr,
                 "train_gpt: unexpected argument '%s' (flags are "
                 "--name=value; --help lists them)\n",
                 positional[1]);
    return 2;
  }
  absl::StatusOr<ze::Options> options = ze::ReadFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "train_gpt: %s\n",
                 std::string(options.status().message()).c_str());
    return 2;
  }
  int exit_code = 2;
  absl::Status status = ze::Train(*options, &exit_code);
  if (!status.ok()) {
    std::fprintf(stderr, "train_gpt: %s\n", status.ToString().c_str());
    return 2;
  }
  return exit_code;
}
