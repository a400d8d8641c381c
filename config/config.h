// Typed DeepSpeed-compatible training configuration and its strict loader.
//
// A user's existing `ds_config.json` is read with DeepSpeed's keys, meanings
// and defaults, but more strictly than DeepSpeed reads it:
//   - unknown keys are rejected at every level, with the JSON path and the
//     nearest valid key ("did you mean ...?");
//   - duplicate keys are rejected (DeepSpeed's json.load keeps the last one
//     silently);
//   - types and ranges are checked; an integer may be written as an integral
//     JSON float (5e8), never as a string ("5e8");
//   - the batch triple train_batch_size = train_micro_batch_size_per_gpu x
//     gradient_accumulation_steps x world size is inferred and checked like
//     DeepSpeed's _configure_train_batch_size.
// Every error message starts with the config's source (file path, or the
// source name given for a string) and names the JSON path of the offending
// key.
//
// Defaults live in exactly one place: the default member initializers below.
// The parser, ToJson() and ReferenceMarkdown() all read them from there.
//
// Typical use (engine):
//   ZE_ASSIGN_OR_RETURN(config::Config raw,
//                       config::LoadConfigFile(path, world_size));
//   config::ResolutionContext context;
//   // nn::LossModel::hidden_size(): 0 means the model does not know it.
//   if (model.hidden_size() > 0) context.hidden_size = model.hidden_size();
//   ZE_ASSIGN_OR_RETURN(config::Config cfg, config::Resolve(raw, context));
//   if (rank == 0) ZE_LOG_RANK0(INFO) << config::ToJson(cfg);
#ifndef ZE_CONFIG_CONFIG_H_
#define ZE_CONFIG_CONFIG_H_

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "core/status.h"
#include "nlohmann/json_fwd.hpp"

namespace ze {
namespace config {

// A value the JSON may give as the string "auto", as Hugging Face's DeepSpeed
// integration allows. An "auto" value has no number yet: Resolve() replaces
// it from the model and the run (ResolutionContext). Reading value() while it
// is still "auto" is a bug in the caller (it skipped Resolve) and aborts.
template <typename T>
class Autoable {
 public:
  Autoable() = default;
  // Implicit on purpose: lets defaults read `Autoable<double> lr = 1e-3;`.
  Autoable(T value) : value_(std::move(value)) {}  // NOLINT
  static Autoable Auto() {
    Autoable result;
    result.is_auto_ = true;
    return result;
  }

  bool is_auto() const { return is_auto_; }
  // The concrete value. Aborts if the value is still "auto".
  const T& value() const {
    ZE_CHECK(!is_auto_);
    return value_;
  }
  // The held value whether or not it is "auto" (then it is the default);
  // for the loader and printers, not for training code.
  const T& raw_value() const { return value_; }

  bool operator==(const Autoable& other) const {
    return is_auto_ == other.is_auto_ && (is_auto_ || value_ == other.value_);
  }
  bool operator!=(const Autoable& other) const { return !(*this == other); }

 private:
  T value_{};
  bool is_auto_ = false;
};

// ---------------------------------------------------------------- optimizer

// DeepSpeed matches optimizer names case-insensitively ("adamw" == "AdamW").
enum class OptimizerType { kAdam, kAdamW, kSgd };

// "optimizer.params". Which keys are valid depends on the optimizer type:
// Adam/AdamW take lr, betas, eps, weight_decay, torch_adam, adam_w_mode;
// SGD takes lr, momentum, weight_decay. Defaults are PyTorch's (DeepSpeed
// hands these to the torch/fused optimizer) and FusedAdam's.
struct OptimizerParams {
  Autoable<double> lr = 1e-3;
  Autoable<std::array<double, 2>> betas = std::array<double, 2>{0.9, 0.999};
  Autoable<double> eps = 1e-8;
  Autoable<double> weight_decay = 0.0;
  // SGD momentum factor.
  double momentum = 0.0;
  // DeepSpeed: use torch.optim.Adam instead of the fused kernel. Accepted for
  // compatibility; zero-engine has one Adam implementation either way.
  bool torch_adam = false;
  // DeepSpeed's default: type "Adam" applies *decoupled* weight decay (AdamW)
  // unless adam_w_mode is false, in which case decay is added to the
  // gradient (L2). Type "AdamW" is always decoupled.
  bool adam_w_mode = true;
  // zero-engine extension (Adam, AdamW): m and v in 8-bit codes with an f32
  // step per block of 256 (offload/moment_codec.h).
  bool blockwise_8bit_moments = false;

  bool operator==(const OptimizerParams& other) const;
};

struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdam;  // "type" is required in JSON.
  OptimizerParams params;

  // True when weight decay is decoupled from the gradient (AdamW semantics),
  // following DeepSpeed: AdamW always, Adam unless adam_w_mode is false, SGD
  // never (SGD's weight decay is L2 added to the gradient, as in PyTorch).
  bool DecoupledWeightDecay() const;
  bool operator==(const OptimizerConfig& other) const;
};

// ---------------------------------------------------------------- scheduler

// DeepSpeed matches scheduler names exactly (case-sensitive).
enum class SchedulerType {
  kWarmupLR,
  kWarmupDecayLR,
  kWarmupCosineLR,
  kOneCycle
};
enum class WarmupType { kLog, kLinear };

// "scheduler.params". Keys are accepted only for the scheduler types that use
// them (see ReferenceMarkdown()).
struct SchedulerParams {
  // WarmupLR, WarmupDecayLR.
  Autoable<double> warmup_min_lr = 0.0;
  Autoable<double> warmup_max_lr = 0.001;
  // WarmupLR, WarmupDecayLR, WarmupCosineLR.
  Autoable<int64_t> warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::kLog;
  // WarmupDecayLR, WarmupCosineLR; required there. 0 only while absent (the
  // loader rejects a config that needs it and lacks it).
  Autoable<int64_t> total_num_steps = 0;
  // WarmupCosineLR: the warmup starts at warmup_min_ratio x lr and the cosine
  // ends at cos_min_ratio x lr.
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 0.0001;
  // OneCycle. cycle_min_lr and cycle_max_lr are required there.
  std::optional<double> cycle_min_lr;
  std::optional<double> cycle_max_lr;
  double decay_lr_rate = 0.0;
  int64_t cycle_first_step_size = 2000;
  // Absent in JSON means "same as cycle_first_step_size"; the loader fills it.
  int64_t cycle_second_step_size = 2000;
  int64_t cycle_first_stair_count = 0;
  // Absent in JSON means "same as cycle_first_stair_count"; filled likewise.
  int64_t cycle_second_stair_count = 0;
  int64_t decay_step_size = 0;
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
  // All types: the last step already taken (-1: start from the beginning).
  int64_t last_batch_iteration = -1;

  bool operator==(const SchedulerParams& other) const;
};

struct SchedulerConfig {
  SchedulerType type = SchedulerType::kWarmupLR;  // "type" is required.
  SchedulerParams params;
  bool operator==(const SchedulerConfig& other) const;
};

// ---------------------------------------------------------- mixed precision

struct Fp16Config {
  Autoable<bool> enabled = false;
  // DeepSpeed: let torch.autocast pick per-op precision. Parsed; zero-engine
  // runs the whole model in fp16 when enabled.
  bool auto_cast = false;
  // 0 selects dynamic loss scaling; any positive value is a static scale.
  double loss_scale = 0.0;
  // Dynamic scaling starts at 2^initial_scale_power.
  int64_t initial_scale_power = 16;
  // Clean steps after which the dynamic scale doubles.
  int64_t loss_scale_window = 1000;
  // Overflows tolerated before the scale is halved.
  int64_t hysteresis = 2;
  // Whether a clean step refills the hysteresis budget.
  bool consecutive_hysteresis = false;
  // The dynamic scale never drops below this. An integer, as in DeepSpeed
  // (its pydantic model refuses 1e-10).
  int64_t min_loss_scale = 1;

  bool operator==(const Fp16Config& other) const;
};

// "bf16" (legacy alias "bfloat16").
struct Bf16Config {
  Autoable<bool> enabled = false;
  // zero-engine extension (not a DeepSpeed key): the exact 16+16 master
  // (core/dtype.h's Bf16Split): each f32 master weight is the bf16 weight
  // plus a 16-bit remainder, 2 bytes instead of 4, the same values bit for
  // bit; the weights then round ties away from zero. bf16 training only.
  bool master_weights_16_plus_16 = false;
  // DeepSpeed's key: Adam's moments m and v stored in bf16 (4 bytes an
  // element instead of 8), rounded to nearest even, or stochastically with
  // optimizer_states_stochastic_rounding (a zero-engine key; noise keyed
  // by the config's seed, the step and the element).
  bool bf16_optimizer_states = false;
  bool optimizer_states_stochastic_rounding = false;
  bool operator==(const Bf16Config& other) const;
};

// ------------------------------------------------------------------ ZeRO

enum class OffloadDevice { kNone, kCpu, kNvme };

// "zero_optimization.offload_optimizer": where optimizer state (and the
// optimizer step) lives. cpu: stage 1, 2, 3; nvme: stage 3 only.
struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::optional<std::string> nvme_path;  // required when device is nvme
  bool pin_memory = false;
  int64_t buffer_count = 4;
  bool pipeline_read = false;
  bool pipeline_write = false;
  bool fast_init = false;
  // Fraction of the optimizer step offloaded to the CPU (1 = all of it).
  // "auto" (this project's meaning; device cpu only): the smallest share
  // whose plan fits the device beside one micro-batch's activations
  // (engine::ChooseAutoOffloadRatio), resolved by Initialize through
  // ResolutionContext::offload_optimizer_ratio.
  Autoable<double> ratio = 1.0;
  // ZeRO-Offload's one-step delayed parameter update (this project's key;
  // DeepSpeed has none): stages 1-2, device cpu, ratio 1.
  bool delayed_update = false;
  // Issue 27's speculative update (this project's key): how many of the
  // rank's offloaded elements an update begun during backward may back up
  // (master weights and optimizer state, in host memory) to start before
  // the gradient norm is known; unset: all of them that fit the host
  // (zero::BuildPlan bounds it by MemAvailable); 0: off.
  std::optional<int64_t> speculation_buffer_size;
  // Issue 27's CPU/GPU split (this project's key): whether the engine may
  // update part of the offloaded state on the GPU, streaming it through,
  // where its model of the two costs predicts a gain (zero::
  // ChooseUpdateSplit); false (the default): the CPU updates all of it.
  // Off by default because, measured against the CPU alone in the same
  // run, the split lost at every size and stage tried (bench/RESULTS.md,
  // run 64: 5-19%): its model predicts the device part from raw copies,
  // and the device part ran far slower than predicted.
  bool split_update = false;
  bool operator==(const OffloadOptimizerConfig& other) const;
};

// "zero_optimization.offload_param": where partitioned parameters live
// between uses. Stage 3 only.
struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::optional<std::string> nvme_path;  // required when device is nvme
  bool pin_memory = false;
  int64_t buffer_count = 5;
  // Elements per NVMe swap buffer (each holds one bucket's slice, so the
  // largest swapped slice must fit).
  int64_t buffer_size = 100'000'000;
  // Elements of parameters kept in CPU memory when swapping to NVMe (the
  // first buckets the forward reads, zero::ChooseResidentWeights).
  int64_t max_in_cpu = 1'000'000'000;
  bool operator==(const OffloadParamConfig& other) const;
};

// "zero_optimization". Sizes are in elements, as in DeepSpeed.
struct ZeroConfig {
  int64_t stage = 0;
  bool contiguous_gradients = true;
  // Absent in JSON: true for stage 3, false otherwise (DeepSpeed's rule);
  // the loader fills it in.
  bool overlap_comm = false;
  bool reduce_scatter = true;
  Autoable<int64_t> reduce_bucket_size = 500'000'000;
  bool allgather_partitions = true;
  int64_t allgather_bucket_size = 500'000'000;
  bool round_robin_gradients = false;
  bool load_from_fp32_weights = true;
  bool elastic_checkpoint = false;
  bool ignore_unused_parameters = true;
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;
  // Stage 3.
  Autoable<int64_t> stage3_prefetch_bucket_size = 50'000'000;
  Autoable<int64_t> stage3_param_persistence_threshold = 100'000;
  int64_t stage3_model_persistence_threshold =
      std::numeric_limits<int64_t>::max();
  int64_t stage3_max_live_parameters = 1'000'000'000;
  int64_t stage3_max_reuse_distance = 1'000'000'000;
  // Alias: gather_16bit_weights_on_model_save; deprecated spelling:
  // stage3_gather_fp16_weights_on_model_save. "auto" (accelerate fills it
  // from its zero3_save_16bit_model, default false) resolves to false.
  Autoable<bool> stage3_gather_16bit_weights_on_model_save = false;
  int64_t sub_group_size = 1'000'000'000;
  // ZeRO++: secondary (hierarchical) partition size, 1 = off.
  int64_t zero_hpz_partition_size = 1;
  bool zero_quantized_weights = false;
  bool zero_quantized_gradients = false;

  bool operator==(const ZeroConfig& other) const;
};

// "aio": the NVMe (libaio) swapper.
struct AioConfig {
  int64_t block_size = 1'048'576;
  int64_t queue_depth = 8;
  int64_t thread_count = 1;
  bool single_submit = false;
  bool overlap_events = true;
  bool operator==(const AioConfig& other) const;
};

// ------------------------------------------------------- other sections

// Checkpointing itself is chosen on the model (nn::Module::
// set_activation_checkpointing). cpu_checkpointing acts: the engine keeps
// checkpointed inputs in host memory (nn/activation_offload.h); the other
// keys are accepted without effect, sections.cc says why.
struct ActivationCheckpointingConfig {
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;
  std::optional<int64_t> number_checkpoints;
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;
  bool operator==(const ActivationCheckpointingConfig& other) const;
};

// "pipeline.schedule" (zero-engine's key): the order of a pipeline
// stage's forwards and backwards (docs/pipeline.md).
enum class PipelineSchedule {
  kGPipe,
  kOneFOneB,
  kInterleavedOneFOneB,
  kZeroBubbleH1,
};

// "pipeline": DeepSpeed's pipeline-parallel keys, plus the schedule and
// the stages per rank. The world is `stages` pipeline ranks times
// world_size / stages data-parallel replicas (pipeline/layout.h); the batch
// triple counts the replicas: train = micro x accumulation x (world_size /
// stages), and the accumulation steps are the pipeline's micro-batches, as
// in DeepSpeed. With stages_per_rank v > 1 (interleaved_1f1b only) the
// model is cut into stages x v pipeline stages, stage s on pipeline rank
// s % stages (Megatron's virtual pipeline stages).
struct PipelineConfig {
  int64_t stages = 1;
  // "parameters" (or DeepSpeed's "best"), "uniform", or explicit layer
  // boundaries "0,4,8,12" (pipeline/partition.h).
  std::string partition = "parameters";
  // 0: no activation checkpointing; 1: every pipeline layer checkpointed.
  int64_t activation_checkpoint_interval = 0;
  PipelineSchedule schedule = PipelineSchedule::kOneFOneB;
  // zero-engine's key: model stages per pipeline rank; > 1 exactly with
  // schedule kInterleavedOneFOneB (config validation).
  int64_t stages_per_rank = 1;
  bool seed_layers = false;
  bool pipe_partitioned = true;
  bool grad_partitioned = true;
  bool operator==(const PipelineConfig& other) const;
};

// DeepSpeed matches tag_validation case-insensitively.
enum class TagValidation { kIgnore, kWarn, kFail };

// "checkpoint.parallel_write".
struct ParallelWriteConfig {
  bool pipeline_stage = false;
  bool operator==(const ParallelWriteConfig& other) const;
};

struct CheckpointConfig {
  // Whether ranks must agree on a checkpoint's tag when saving.
  TagValidation tag_validation = TagValidation::kWarn;
  bool load_universal = false;
  bool use_node_local_storage = false;
  ParallelWriteConfig parallel_write;
  bool operator==(const CheckpointConfig& other) const;
};

struct CsvMonitorConfig {
  bool enabled = false;
  std::string output_path = "";
  std::string job_name = "DeepSpeedJobName";
  bool operator==(const CsvMonitorConfig& other) const;
};

// "communication_data_type"; DeepSpeed also spells bf16 "bfp16".
enum class CommDataType { kFp32, kFp16, kBf16 };

// ------------------------------------------------------------- the config

// A key the loader accepted but wants the user to know about. Printed as
// "<source>: <key> <message>", e.g. key "zero_allow_untested_optimizer",
// message "is ignored: every optimizer zero-engine has ...".
struct ConfigWarning {
  std::string key;  // JSON path, e.g. zero_optimization.zero_quantized_weights
  std::string message;
  bool operator==(const ConfigWarning& other) const {
    return key == other.key && message == other.message;
  }
};

struct Config {
  // The batch triple. 0 means "not given" and lasts only until the triple is
  // inferred; after a successful load (with no "auto" among the three) or
  // Resolve(), all three are positive and satisfy
  // train = micro x accumulation x world_size.
  Autoable<int64_t> train_batch_size = 0;
  Autoable<int64_t> train_micro_batch_size_per_gpu = 0;
  Autoable<int64_t> gradient_accumulation_steps = 0;
  int64_t steps_per_print = 10;
  // Clip gradients to this global L2 norm; 0 disables clipping.
  Autoable<double> gradient_clipping = 0.0;
  // Divide gradients by the world size before the all-reduce, not after.
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  // Data type of gradient communication; unset means the model's dtype.
  std::optional<CommDataType> communication_data_type;
  bool wall_clock_breakdown = false;
  bool memory_breakdown = false;
  // zero-engine extension (not a DeepSpeed key): the seed of every
  // counter-based generator (parameter init, dropout, data order).
  int64_t seed = 42;
  // zero-engine extension (not a DeepSpeed key): bf16/f32 training fails
  // after this many consecutive steps whose loss or gradient norm is inf or
  // NaN (each is skipped with a warning); fp16 keeps its loss scaler's
  // skips instead.
  int64_t max_consecutive_nonfinite_steps = 5;

  std::optional<OptimizerConfig> optimizer;  // absent: the client supplies one
  std::optional<SchedulerConfig> scheduler;  // absent: constant lr
  Fp16Config fp16;
  Bf16Config bf16;
  ZeroConfig zero_optimization;
  AioConfig aio;
  ActivationCheckpointingConfig activation_checkpointing;
  CheckpointConfig checkpoint;
  CsvMonitorConfig csv_monitor;
  PipelineConfig pipeline;

  // The ranks that hold one copy of a pipeline stage: world_size /
  // pipeline.stages (world_size without a pipeline). What the batch triple
  // counts.
  int64_t data_parallel_size() const {
    return pipeline.stages > 0 && world_size % pipeline.stages == 0
               ? world_size / pipeline.stages
               : world_size;
  }

  // Not JSON keys. world_size is the one the batch triple was checked
  // against; source names the file (or "<json string>") for error messages;
  // load_warnings are what the loader accepted with a warning (keys
  // DeepSpeed reads that zero-engine ignores, top-level keys DeepSpeed itself
  // ignores, deprecated spellings), in file order. None takes part in ==.
  int world_size = 1;
  std::string source = "<json string>";
  std::vector<ConfigWarning> load_warnings;

  // JSON paths still holding "auto", in the order of ReferenceMarkdown();
  // empty once resolved. Derived from the key tables.
  std::vector<std::string> UnresolvedAutoPaths() const;
  bool HasUnresolvedAuto() const { return !UnresolvedAutoPaths().empty(); }

  // Compares every JSON key (derived from the key tables, as is every
  // section's operator==, so a new key is compared without further code)
  // and world_size; not `source`.
  bool operator==(const Config& other) const;
  bool operator!=(const Config& other) const { return !(*this == other); }
};

// The precision training runs in: bf16 or fp16 when enabled, else fp32.
// Requires fp16.enabled and bf16.enabled to be resolved (not "auto").
enum class TrainingPrecision { kFp32, kFp16, kBf16 };
TrainingPrecision GetTrainingPrecision(const Config& config);

// The one mapping between the config's precision and core's element types.
// The dtype a model's parameters must have to train in `precision`: kBF16,
// kF16 or kF32 (what examples build the model with, and what Initialize
// checks the model against).
DType PrecisionDType(TrainingPrecision precision);
// The precision a model built with `dtype` trains in: kBf16 for bf16, kFp16
// for f16, kFp32 otherwise (what "auto" in fp16/bf16.enabled resolves to).
TrainingPrecision PrecisionOfDType(DType dtype);
// The dtype gradients travel in under communication_data_type.
DType CommDataTypeDType(CommDataType type);

// Canonical JSON spellings ("AdamW", "WarmupCosineLR", "nvme", ...), for logs.
const char* OptimizerTypeName(OptimizerType type);
const char* SchedulerTypeName(SchedulerType type);
const char* OffloadDeviceName(OffloadDevice device);

// ------------------------------------------------------------------ loading

// Reads, parses and validates the JSON file at `path` for a run of
// `world_size` ranks. Errors: NotFound when the file cannot be opened;
// InvalidArgument (every problem found, one per line, each starting with
// `path` and naming the JSON path) for malformed JSON, duplicate keys,
// unknown keys, wrong types, out-of-range values and an inconsistent batch
// triple. "auto" values are kept; see Resolve().
absl::StatusOr<Config> LoadConfigFile(const std::string& path, int world_size);

// As LoadConfigFile, for JSON text; `source_name` stands for the file name in
// messages.
absl::StatusOr<Config> LoadConfigString(
    absl::string_view json_text, int world_size,
    absl::string_view source_name = "<json string>");

// As LoadConfigString, for an already parsed object. Duplicate keys cannot be
// detected here: the JSON parser has already dropped them.
absl::StatusOr<Config> LoadConfigJson(
    const nlohmann::json& json, int world_size,
    absl::string_view source_name = "<json object>");

// What Resolve() needs to replace "auto" values, following Hugging Face's
// integration. Each hint is optional; Resolve() fails (naming the JSON path and
// the hint) only when an "auto" value needs a hint that is absent.
struct ResolutionContext {
  // 0: keep the config's world size; otherwise it must equal it.
  int world_size = 0;
  // The model's hidden size h (Hugging Face's hidden_size; the engine takes
  // nn::LossModel::hidden_size()). Hugging Face's rules:
  // zero_optimization.reduce_bucket_size = h * h,
  // stage3_prefetch_bucket_size = int(0.9 * h * h) (truncated),
  // stage3_param_persistence_threshold = 10 * h. Must be positive when set;
  // leave it unset when the model does not know it (hidden_size() == 0):
  // then only a config with "auto" in one of those keys fails, naming it.
  std::optional<int64_t> hidden_size;
  // For "auto" batch sizes. An "auto" batch size without a hint is inferred
  // from the other two, as if it were absent.
  std::optional<int64_t> micro_batch_size_per_gpu;
  std::optional<int64_t> gradient_accumulation_steps;
  // For "auto" optimizer params; learning_rate also feeds
  // scheduler.params.warmup_max_lr (else the optimizer's lr does).
  std::optional<double> learning_rate;
  std::optional<std::array<double, 2>> betas;
  std::optional<double> eps;
  std::optional<double> weight_decay;
  std::optional<double> gradient_clipping;
  // For "auto" scheduler steps. "auto" warmup_min_lr resolves to 0.
  std::optional<int64_t> total_num_steps;
  std::optional<int64_t> warmup_num_steps;
  // For "auto" fp16.enabled / bf16.enabled.
  std::optional<TrainingPrecision> precision;
  // For "auto" zero_optimization.offload_optimizer.ratio: the share of the
  // optimizer step on the CPU, in [0, 1]. engine::Initialize fills it
  // (engine::ChooseAutoOffloadRatio) from activation_bytes below and the
  // device's free memory.
  std::optional<double> offload_optimizer_ratio;
  // The device memory one micro-batch's activations take on each rank
  // (zero::EstimateActivations' peak: train_gpt and train_bench pass it),
  // which the device must keep free beside the model state an "auto"
  // ratio places there.
  std::optional<int64_t> activation_bytes;
  // The device memory each rank may use for an "auto" ratio (a GPU shared
  // with another job, say); unset: what the device has free (plus what the
  // process already holds), shared among the ranks on it.
  std::optional<int64_t> device_memory_bytes;
};

// The rules across keys that say what the engine can run, for
// engine::Initialize, which calls it on every config (one changed or built
// in code after loading included): Unimplemented for
// checkpoint.load_universal, and for offload_param.device "cpu" or "nvme"
// without the whole optimizer step on the CPU (offload_optimizer.device
// "cpu" or "nvme" with ratio 1); InvalidArgument for
// offload_optimizer.delayed_update outside device "cpu", ratio 1, stage 1 or 2.
// Each message starts with config.source and names the keys. Loading keeps
// accepting these, so a DeepSpeed config that asks for them is still read
// (check_config, ConfigWarnings) and every key can still change alone.
absl::Status CheckSupported(const Config& config);

// Returns `config` with every "auto" replaced and the result validated again
// (batch triple included). A config with no "auto" comes back unchanged.
// Errors: InvalidArgument naming the source, each unresolvable JSON path and
// the ResolutionContext field it needs; FailedPrecondition when
// context.world_size is set and differs from config.world_size.
absl::StatusOr<Config> Resolve(const Config& config,
                               const ResolutionContext& context);

// The config as JSON with every key and default filled in, in a stable order
// (the order of ReferenceMarkdown()); unresolved values print as "auto".
// LoadConfigString(ToJson(c), c.world_size) == c.
std::string ToJson(const Config& config);

// Every warning about `config`, for Engine::Initialize to log on rank 0 and
// check_config to print: first load_warnings (file order), then every key
// set away from its default that zero-engine accepts (so DeepSpeed configs
// load unchanged) but that changes nothing here (ZeRO++ options,
// activation_checkpointing, implementation hints), in the order of
// ReferenceMarkdown().
std::vector<ConfigWarning> ConfigWarnings(const Config& config);

// The README's config reference (Markdown tables: key, type, default,
// meaning), generated from the same defaults and validation rules the loader
// uses.
std::string ReferenceMarkdown();

}  // namespace config
}  // namespace ze

#endif  // ZE_CONFIG_CONFIG_H_
