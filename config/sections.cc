// The fixed sections' tables: which keys each section has, their types,
// defaults (read from the structs in config.h), meanings, aliases and the
// DeepSpeed keys zero-engine rejects; the top-level table; and the structs'
// operator==, derived from these tables.
#include "config/sections.h"

namespace ze {
namespace config {
namespace internal {
namespace {

Codec<OffloadDevice> OffloadDeviceCodec() {
  return Enum<OffloadDevice>({{"none", OffloadDevice::kNone},
                              {"cpu", OffloadDevice::kCpu},
                              {"nvme", OffloadDevice::kNvme}},
                             /*case_insensitive=*/false);
}

// The reason for a warning about an unknown key in `section`, one of the
// sections DeepSpeed reads from a plain dict (ignoring keys it does not
// know) rather than through a pydantic model that refuses them.
std::string UnknownInDictSection(const std::string& section) {
  return absl::StrCat(
      "not a key zero-engine or DeepSpeed reads (DeepSpeed "
      "ignores unknown keys in ",
      section, ")");
}

// Reasons shared by several ignored ZeRO keys.
constexpr char kImplementation[] =
    "a detail of DeepSpeed's implementation with no counterpart here";
constexpr char kFetchUnits[] =
    "stage 3 gathers parameters in buckets of each module's parameters, "
    "sized by stage3_prefetch_bucket_size";

const Schema<Fp16Config>& Fp16Schema() {
  static const auto* schema = [] {
    using F = Fp16Config;
    auto* s = new Schema<F>();
    s->Add(Value("enabled", &F::enabled, AutoOr(Boolean()),
                 "Train in fp16 with fp32 master weights."))
        .Add(Value("auto_cast", &F::auto_cast, Boolean(),
                   "DeepSpeed: cast inputs to fp16. Parsed; zero-engine runs "
                   "the whole model in fp16."))
        .Add(Value("loss_scale", &F::loss_scale, Number(NonNegative()),
                   "0 = dynamic loss scaling; a positive value is a static "
                   "scale."))
        .Add(Value("initial_scale_power", &F::initial_scale_power,
                   Integer(Between(0, 63)),
                   "Dynamic scaling starts at 2^initial_scale_power."))
        .Add(Value("loss_scale_window", &F::loss_scale_window,
                   Integer(AtLeast(1)),
                   "Clean steps after which the dynamic scale doubles."))
        .Add(Value("hysteresis", &F::hysteresis, Integer(AtLeast(1)),
                   "Overflows tolerated before the scale is halved."))
        .Add(Value("consecutive_hysteresis", &F::consecutive_hysteresis,
                   Boolean(), "A clean step refills the hysteresis budget."))
        .Add(Value("min_loss_scale", &F::min_loss_scale, Integer(AtLeast(1)),
                   "The dynamic scale never drops below this (an integer, as "
                   "in DeepSpeed)."))
        .WithoutEffect("auto_cast", "the whole model runs in fp16 anyway")
        .Ignored("fp16_master_weights_and_grads", Boolean(),
                 std::optional<bool>(false),
                 "master weights and their gradients are always fp32 here");
    return s;
  }();
  return *schema;
}

const Schema<Bf16Config>& Bf16Schema() {
  static const auto* schema = [] {
    auto* s = new Schema<Bf16Config>();
    s->Add(Value("enabled", &Bf16Config::enabled, AutoOr(Boolean()),
                 "Train in bf16 with fp32 master weights."))
        .Add(Value(
            "master_weights_16_plus_16", &Bf16Config::master_weights_16_plus_16,
            Boolean(),
            "zero-engine extension: keep each fp32 master weight as the "
            "bf16 weight plus a 16-bit remainder (2 bytes instead of 4), "
            "exact: the same master values bit for bit. The bf16 weights "
            "then round ties away from zero instead of to even (an exact "
            "16-bit remainder cannot recover round-to-nearest-even; they "
            "differ only when the dropped half is exactly 0x8000). bf16 "
            "training only (refused for an fp16 or fp32 model). With "
            "offload_optimizer \"cpu\" the offloaded master stays fp32 on "
            "the host (the same 4 bytes); not yet with \"nvme\" or "
            "offload_param."))
        .Add(Value(
            "bf16_optimizer_states", &Bf16Config::bf16_optimizer_states,
            Boolean(),
            "Adam's moments (exp_avg, exp_avg_sq) stored in bf16: 4 bytes an "
            "element instead of 8, on the GPU and in CPU offload. Each step "
            "decodes them, updates in fp32 and rounds the new moments to "
            "bf16 (to nearest even; see "
            "optimizer_states_stochastic_rounding: to nearest, a moment "
            "whose change in a step is under half a bf16 unit stays put, "
            "e.g. v at betas[1] = 0.999, whose sqrt then runs about 20% "
            "high; at 0.95 nearest is unbiased, "
            "bench/convergence/README.md). Any training dtype; not "
            "with offload_optimizer nvme (refused) nor SGD. Checkpoints "
            "store the moments in bf16 (the manifest's moments_dtype) and "
            "load into any moment format, the conversion named in the "
            "log."))
        .Add(Value("optimizer_states_stochastic_rounding",
                   &Bf16Config::optimizer_states_stochastic_rounding, Boolean(),
                   "zero-engine extension: with bf16_optimizer_states, round "
                   "the moments stochastically (unbiased: a value rounds up "
                   "with probability its distance from the lower bf16) "
                   "instead of to nearest even. The noise is a counter-based "
                   "hash of the config's seed, the step and the element's "
                   "index in its optimizer, so ranks and reruns agree bit for "
                   "bit."));
    const std::string fp32_master =
        "master weights, their gradients and the optimizer state are always "
        "fp32 here";
    s->Ignored("immediate_grad_update", Boolean(), std::optional<bool>(false),
               "gradients are applied at the optimizer step, as DeepSpeed's "
               "default does")
        .Ignored("check_grad_overflow", Boolean(), std::optional<bool>(true),
                 "zero-engine handles a step with non-finite gradients by "
                 "its own rule, whatever this says")
        .Ignored("bf16_master_weights_and_grads", Boolean(),
                 std::optional<bool>(false),
                 "DeepSpeed's bf16 master weights (lossy) are not built: "
                 "the master stays fp32 (exact); "
                 "bf16.master_weights_16_plus_16 keeps it in 2 bytes, "
                 "exactly");
    return s;
  }();
  return *schema;
}

const Schema<OffloadOptimizerConfig>& OffloadOptimizerSchema() {
  static const auto* schema = [] {
    using O = OffloadOptimizerConfig;
    auto* s = new Schema<O>();
    s->Add(Value("device", &O::device, OffloadDeviceCodec(),
                 "Where optimizer state lives: none (GPU), cpu (stage 1-3), "
                 "nvme (stage 3)."))
        .Add(Value("nvme_path", &O::nvme_path, Nullable(String(false)),
                   "Directory for NVMe swap files; required for nvme."))
        .Add(Value("pin_memory", &O::pin_memory, Boolean(),
                   "Use page-locked CPU buffers."))
        .Add(Value("buffer_count", &O::buffer_count, Integer(AtLeast(1)),
                   "Swap buffers for optimizer state (NVMe)."))
        .Add(Value("pipeline_read", &O::pipeline_read, Boolean(),
                   "Overlap reading the next sub-group with the step (NVMe)."))
        .Add(Value("pipeline_write", &O::pipeline_write, Boolean(),
                   "Overlap writing the last sub-group with the step (NVMe)."))
        .Add(Value("fast_init", &O::fast_init, Boolean(),
                   "Faster initialisation when offloading to NVMe."))
        .Add(Value("ratio", &O::ratio,
                   AutoOr(Number(DoubleRule{0.0, 1.0, true, false})),
                   "Fraction of the optimizer step done on the CPU: whole "
                   "buckets, the last layers' first (their gradients are "
                   "final first in backward, and the next forward reads "
                   "them last), until at least this share of the "
                   "trainable elements is offloaded; the rest keep their "
                   "master weights and state on the GPU and are updated "
                   "there, also with offload_param (their new weights then "
                   "go to the parameters' tier). \"auto\" (device cpu; "
                   "not a DeepSpeed value): the smallest share whose state "
                   "fits on the GPU beside the model's other state, one "
                   "micro-batch's activations and a reserve, so only what "
                   "does not fit is offloaded; the startup log names the "
                   "share and the sizes."))
        .Add(Value("delayed_update", &O::delayed_update, Boolean(),
                   "One-step delayed parameter update (ZeRO-Offload's DPU; "
                   "stages 1-2, device cpu, ratio 1): step t's CPU update "
                   "runs during step t+1's forward and backward, which use "
                   "the weights from before it, so every gradient is one "
                   "step stale. Not a DeepSpeed key."))
        .Add(Value("speculation_buffer_size", &O::speculation_buffer_size,
                   Nullable(Integer(AtLeast(0))),
                   "Elements of this rank's offloaded optimizer state (f32 "
                   "master weights and moments, host memory) that an update "
                   "begun during backward may back up: with gradient "
                   "clipping or fp16 the CPU update starts before the "
                   "gradient norm is known, as if nothing clips, and is "
                   "kept when nothing does (bit for bit the exact update) "
                   "or restored and redone with the clip factor; null: "
                   "every offloaded element, bounded by the host (at most "
                   "half of this rank's share of MemAvailable left after "
                   "the rest of its planned host memory); 0: off (the "
                   "update waits for the norm). Device cpu, the weights on "
                   "the device or in host memory (offload_param cpu, not "
                   "nvme). Not a DeepSpeed key."))
        .Add(Value("split_update", &O::split_update, Boolean(),
                   "true: let the engine update part of the offloaded state "
                   "on the GPU (streamed up and back through it while the "
                   "CPU updates the rest) where its model of the two "
                   "measured costs predicts a gain: device cpu, stages 2-3, "
                   "f32 master and moments, weights on the GPU; the startup "
                   "log states the split. Experimental: on an H100 host it "
                   "was 5-19% slower than the CPU alone at 124M and 1.3B, "
                   "stages 2 and 3 (bench/RESULTS.md run 64). false: the CPU "
                   "updates all of it. Not a DeepSpeed key."))
        .WithoutEffect("fast_init",
                       "the NVMe swap files are preallocated at start anyway")
        .Ignored("super_offload", Boolean(), std::optional<bool>(false),
                 "SuperOffload (DeepSpeed's superchip offload) is not "
                 "implemented")
        .Ignored("cpuadam_cores_perc", Number(UnitClosed()),
                 std::optional<double>(0.8),
                 "the CPU optimizer's thread count is zero-engine's own "
                 "choice");
    return s;
  }();
  return *schema;
}

const Schema<OffloadParamConfig>& OffloadParamSchema() {
  static const auto* schema = [] {
    using O = OffloadParamConfig;
    auto* s = new Schema<O>();
    s->Add(Value("device", &O::device, OffloadDeviceCodec(),
                 "Where partitioned parameters live: none (GPU), cpu, nvme "
                 "(a swap file per rank under nvme_path, named by its world "
                 "rank, read ahead of each all-gather in the fetch order). "
                 "Stage 3 only. The "
                 "optimizer may be anywhere: where offload_optimizer puts a "
                 "bucket's state on the CPU, the CPU update writes its "
                 "weights where they live; where it stays on the GPU (no "
                 "offload_optimizer, or beyond its ratio), the GPU updates "
                 "it and its new weights are copied to this tier each step "
                 "(into host memory, or into a swap buffer written to the "
                 "file). Not with bf16.master_weights_16_plus_16."))
        .Add(Value("nvme_path", &O::nvme_path, Nullable(String(false)),
                   "Directory for NVMe swap files; required for nvme."))
        .Add(Value("pin_memory", &O::pin_memory, Boolean(),
                   "Use page-locked CPU buffers."))
        .Add(Value("buffer_count", &O::buffer_count, Integer(AtLeast(1)),
                   "Host swap buffers parameters are read into from NVMe "
                   "(nvme only; pinned with pin_memory); buffer_count - 1 "
                   "buckets are read ahead."))
        .Add(Value("buffer_size", &O::buffer_size, Integer(AtLeast(1)),
                   "Elements a parameter swap buffer holds at most (nvme "
                   "only); every swapped ZeRO-3 bucket's per-rank slice must "
                   "fit one (checked at start). Allocated at the largest "
                   "slice when that is smaller."))
        .Add(Value("max_in_cpu", &O::max_in_cpu, Integer(AtLeast(0)),
                   "Parameter elements kept in CPU memory rather than "
                   "swapped (nvme only): the first buckets the forward reads, "
                   "while their per-rank slices fit."));
    // Used by device "nvme" only: ConfigWarnings (config.cc) drops these
    // warnings when the device is "nvme".
    const std::string only_nvme =
        "with offload_param.device \"cpu\" or none; it sizes device "
        "\"nvme\"'s swapping (host buffers, what stays in CPU memory), "
        "where it acts";
    s->WithoutEffect("buffer_count", only_nvme)
        .WithoutEffect("buffer_size", only_nvme)
        .WithoutEffect("max_in_cpu", only_nvme);
    return s;
  }();
  return *schema;
}

const Schema<ZeroConfig>& ZeroSchema() {
  static const auto* schema = [] {
    using Z = ZeroConfig;
    auto* s = new Schema<Z>();
    s->Add(Value("stage", &Z::stage, Integer(Between(0, 3)),
                 "0: data parallel; 1: partition optimizer state; 2: also "
                 "gradients; 3: also parameters."))
        .Add(Value("contiguous_gradients", &Z::contiguous_gradients, Boolean(),
                   "Copy gradients into one contiguous buffer as they are "
                   "produced."))
        .Add(Value("overlap_comm", &Z::overlap_comm, Boolean(),
                   "Overlap gradient reduction with backward.",
                   "true for stage 3, else false"))
        .Add(Value("reduce_scatter", &Z::reduce_scatter, Boolean(),
                   "Reduce gradients with reduce-scatter rather than "
                   "all-reduce (stage 2)."))
        .Add(Value("reduce_bucket_size", &Z::reduce_bucket_size,
                   AutoOr(Integer(AtLeast(1))),
                   "Elements reduced at a time. \"auto\": hidden_size^2. With "
                   "offload_optimizer at stages 1-2, a model of 2^24 or more "
                   "elements is reduced in buckets of at most 1/16 of it "
                   "(the offloaded update begins per bucket)."))
        .Add(Value("allgather_partitions", &Z::allgather_partitions, Boolean(),
                   "All-gather updated parameters rather than broadcast them "
                   "(stage 1, 2)."))
        .Add(Value("allgather_bucket_size", &Z::allgather_bucket_size,
                   Integer(AtLeast(1)), "Elements all-gathered at a time."))
        .Add(Value("round_robin_gradients", &Z::round_robin_gradients,
                   Boolean(),
                   "Stage 1/2 with CPU offload: spread gradient "
                   "copies over ranks."))
        .Add(Value("load_from_fp32_weights", &Z::load_from_fp32_weights,
                   Boolean(),
                   "Restore fp32 master weights from the checkpoint rather "
                   "than from the 16-bit weights."))
        .Add(Value("elastic_checkpoint", &Z::elastic_checkpoint, Boolean(),
                   "Allow loading a checkpoint at another world size (stage "
                   "1, 2); zero-engine reshards regardless."))
        .Add(Value("ignore_unused_parameters", &Z::ignore_unused_parameters,
                   Boolean(),
                   "Tolerate parameters that get no gradient (stage 1, 2)."))
        .Add(Section("offload_optimizer", &Z::offload_optimizer,
                     &OffloadOptimizerSchema(), "Optimizer state offload."))
        .Add(Section("offload_param", &Z::offload_param, &OffloadParamSchema(),
                     "Parameter offload (stage 3)."))
        .Add(Value("stage3_prefetch_bucket_size",
                   &Z::stage3_prefetch_bucket_size, AutoOr(Integer(AtLeast(0))),
                   "Elements of parameters prefetched ahead of use. \"auto\": "
                   "0.9 hidden_size^2."))
        .Add(Value("stage3_param_persistence_threshold",
                   &Z::stage3_param_persistence_threshold,
                   AutoOr(Integer(AtLeast(0))),
                   "Parameters smaller than this stay gathered. \"auto\": 10 "
                   "hidden_size."))
        .Add(Value("stage3_model_persistence_threshold",
                   &Z::stage3_model_persistence_threshold, Integer(AtLeast(0)),
                   "Upper bound on the elements kept gathered by the "
                   "persistence threshold."))
        .Add(Value("stage3_max_live_parameters", &Z::stage3_max_live_parameters,
                   Integer(AtLeast(0)),
                   "Most elements gathered at once before releasing."))
        .Add(Value("stage3_max_reuse_distance", &Z::stage3_max_reuse_distance,
                   Integer(AtLeast(0)),
                   "Counted in bucket requests (module parameter-group "
                   "fetches) in the recorded fetch order, not in parameters "
                   "as in DeepSpeed: a bucket whose last user releases it "
                   "stays gathered if the record requests it again within "
                   "this many requests (0 = gather on every request)."))
        .Add(Value("stage3_gather_16bit_weights_on_model_save",
                   &Z::stage3_gather_16bit_weights_on_model_save,
                   AutoOr(Boolean()),
                   "Consolidate 16-bit weights when saving the model. "
                   "\"auto\" (filled by accelerate): false."))
        .Add(Value("sub_group_size", &Z::sub_group_size, Integer(AtLeast(0)),
                   "Elements per optimizer-step sub-group (stage 3)."))
        .Add(Value("zero_hpz_partition_size", &Z::zero_hpz_partition_size,
                   Integer(AtLeast(1)),
                   "ZeRO++ secondary partition size (1 = off)."))
        .Add(Value("zero_quantized_weights", &Z::zero_quantized_weights,
                   Boolean(), "ZeRO++: quantize weights for all-gather."))
        .Add(Value("zero_quantized_gradients", &Z::zero_quantized_gradients,
                   Boolean(), "ZeRO++: quantize gradients for reduction."))
        .DeprecatedFlag("cpu_offload", "offload_optimizer",
                        "zero_optimization.offload_optimizer.device \"cpu\"",
                        [](Z* zero) {
                          zero->offload_optimizer.device = OffloadDevice::kCpu;
                        })
        .DeprecatedFlag(
            "cpu_offload_param", "offload_param",
            "zero_optimization.offload_param.device \"cpu\"",
            [](Z* zero) { zero->offload_param.device = OffloadDevice::kCpu; })
        // DeepSpeed's pydantic field names, which it accepts beside the
        // stage3_ spellings (axolotl's configs use them).
        .Alias("prefetch_bucket_size", "stage3_prefetch_bucket_size")
        .Alias("param_persistence_threshold",
               "stage3_param_persistence_threshold")
        .Alias("model_persistence_threshold",
               "stage3_model_persistence_threshold")
        .Alias("max_live_parameters", "stage3_max_live_parameters")
        .Alias("max_reuse_distance", "stage3_max_reuse_distance")
        .Alias("gather_16bit_weights_on_model_save",
               "stage3_gather_16bit_weights_on_model_save")
        .Alias("module_granularity_threshold",
               "stage3_module_granularity_threshold")
        .Alias("use_all_reduce_for_fetch_params",
               "stage3_use_all_reduce_for_fetch_params")
        .Alias("allgather_sequential", "stage3_allgather_sequential")
        .Deprecated("stage3_gather_fp16_weights_on_model_save",
                    "stage3_gather_16bit_weights_on_model_save")
        .WithoutEffect("contiguous_gradients",
                       "gradients always live in flat per-bucket buffers")
        .WithoutEffect("reduce_scatter",
                       "stages 1-3 always reduce-scatter gradients (the sums "
                       "an all-reduce gives, with half the traffic)")
        .WithoutEffect("allgather_partitions",
                       "updated parameters are always all-gathered (the "
                       "values a broadcast gives)")
        .WithoutEffect("round_robin_gradients",
                       "with CPU offload each rank already copies only its "
                       "own gradient slice to the host")
        .WithoutEffect("elastic_checkpoint",
                       "checkpoints load at any world size and stage anyway")
        .WithoutEffect("ignore_unused_parameters",
                       "parameters that get no gradient are always "
                       "tolerated (their gradient is zero)")
        .WithoutEffect("zero_hpz_partition_size",
                       "ZeRO++ hierarchical partitioning is not implemented: "
                       "parameters are partitioned over all ranks")
        .WithoutEffect("zero_quantized_weights",
                       "ZeRO++ weight quantization is not implemented: "
                       "all-gathers carry the model's dtype")
        .WithoutEffect("zero_quantized_gradients",
                       "ZeRO++ gradient quantization is not implemented: "
                       "reductions carry communication_data_type")
        .Ignored("cpu_offload_use_pin_memory", Boolean(), std::optional<bool>(),
                 "deprecated by DeepSpeed, which ignores it too; set "
                 "offload_optimizer.pin_memory or offload_param.pin_memory")
        .Ignored("stage3_module_granularity_threshold", Integer(AtLeast(0)),
                 std::optional<int64_t>(0), kFetchUnits)
        .Ignored("stage3_use_all_reduce_for_fetch_params", Boolean(),
                 std::optional<bool>(false), kFetchUnits)
        .Ignored("stage3_allgather_sequential", Boolean(),
                 std::optional<bool>(false), kFetchUnits)
        .Ignored("use_multi_rank_bucket_allreduce", Boolean(),
                 std::optional<bool>(true), kImplementation)
        .Ignored("compute_grad_norm", Boolean(), std::optional<bool>(true),
                 "the gradient norm is always computed (clipping and the "
                 "non-finite check use it)")
        .Ignored("legacy_stage1", Boolean(), std::optional<bool>(false),
                 "there is one stage-1 implementation")
        .Ignored("parameter_alignment", Boolean(), std::optional<bool>(false),
                 kImplementation)
        .Ignored("zero_quantized_nontrainable_weights", Boolean(),
                 std::optional<bool>(false),
                 "ZeRO++ quantization is not implemented")
        .Ignored("memory_efficient_linear", Boolean(),
                 std::optional<bool>(true), kImplementation)
        .Ignored("pipeline_loading_checkpoint", Boolean(),
                 std::optional<bool>(false),
                 "a pipeline loads only its own per-stage checkpoints "
                 "(docs/pipeline.md)")
        .Ignored("override_module_apply", Boolean(), std::optional<bool>(true),
                 kImplementation)
        .Ignored("log_trace_cache_warnings", Boolean(),
                 std::optional<bool>(false), kImplementation)
        .Ignored("enable_sanity_checks", Boolean(), std::optional<bool>(false),
                 kImplementation)
        .Ignored("save_muon_momentum_buffer_in_memory", Boolean(),
                 std::optional<bool>(false), "there is no Muon optimizer")
        .Ignored("zenflow", Present(), std::optional<bool>(),
                 "ZenFlow is not implemented")
        .Ignored("leaf_module", Present(), std::optional<bool>(),
                 "stage 3 fetches parameters per module of zero-engine's own "
                 "models; there are no PyTorch module classes to name")
        .Unsupported("mics_shard_size",
                     "MiCS was removed from DeepSpeed (0.19.8 rejects it "
                     "too); parameters are partitioned over all ranks")
        .Unsupported("mics_hierarchical_params_gather",
                     "MiCS was removed from DeepSpeed (0.19.8 rejects it "
                     "too)")
        .Unsupported("zeropp_loco_param",
                     "LoCo-ZeRO++ was removed from DeepSpeed (0.19.8 rejects "
                     "it too)")
        .AfterParse(
            [](const Json& object, const std::string&, Problems&, Z* zero) {
              // DeepSpeed's rule: stage 3 overlaps communication by default.
              if (!object.contains("overlap_comm")) {
                zero->overlap_comm = zero->stage == 3;
              }
            });
    return s;
  }();
  return *schema;
}

const Schema<AioConfig>& AioSchema() {
  static const auto* schema = [] {
    using A = AioConfig;
    auto* s = new Schema<A>();
    s->Add(Value("block_size", &A::block_size, Integer(AtLeast(1)),
                 "Bytes per I/O request."))
        .Add(Value("queue_depth", &A::queue_depth, Integer(AtLeast(1)),
                   "I/O requests in flight."))
        .Add(Value("thread_count", &A::thread_count, Integer(AtLeast(1)),
                   "I/O threads."))
        .Add(Value("single_submit", &A::single_submit, Boolean(),
                   "Submit requests one at a time rather than in batches."))
        .Add(Value("overlap_events", &A::overlap_events, Boolean(),
                   "Overlap submitting requests with reaping completions."))
        // DeepSpeed 0.19.8's name for the I/O threads of one request.
        .Alias("intra_op_parallelism", "thread_count")
        .Ignored("use_gds", Boolean(), std::optional<bool>(false),
                 "GPUDirect Storage is not implemented; NVMe I/O goes through "
                 "host memory")
        .WarnOnUnknownKeys(UnknownInDictSection("aio"));
    return s;
  }();
  return *schema;
}

const Schema<ActivationCheckpointingConfig>& ActivationCheckpointingSchema() {
  static const auto* schema = [] {
    using A = ActivationCheckpointingConfig;
    auto* s = new Schema<A>();
    s->Add(Value("partition_activations", &A::partition_activations, Boolean(),
                 "Partition saved activations across the model-parallel "
                 "ranks (DeepSpeed's meaning: the ranks of a tensor-parallel "
                 "group hold identical copies of a layer's input, so each "
                 "keeps 1/N and all-gathers it before the recompute)."))
        .Add(Value("cpu_checkpointing", &A::cpu_checkpointing, Boolean(),
                   "Keep each checkpointed module's saved input in pinned "
                   "host memory instead of on the GPU: copied out on a copy "
                   "stream after the module's forward (the device buffer is "
                   "reused once the copy is done) and brought back one "
                   "module ahead in backward (the previous layer's input "
                   "travels while this one recomputes) through a ring of 2 "
                   "device buffers the startup plan reports "
                   "(nn/activation_offload.h). Acts on the modules the model "
                   "checkpoints (nn::GptConfig / nn::DecoderConfig "
                   "activation_checkpointing, train_gpt "
                   "--activation_checkpointing, "
                   "nn::Module::set_activation_checkpointing); Initialize "
                   "warns when there are none. Losses and weights are bit "
                   "for bit those without it."))
        .Add(Value("contiguous_memory_optimization",
                   &A::contiguous_memory_optimization, Boolean(),
                   "Copy saved activations into one contiguous buffer."))
        .Add(Value("number_checkpoints", &A::number_checkpoints,
                   Nullable(Integer(AtLeast(1))),
                   "Checkpoints per forward (for the contiguous buffer)."))
        .Add(Value("synchronize_checkpoint_boundary",
                   &A::synchronize_checkpoint_boundary, Boolean(),
                   "Synchronize the device at each checkpoint boundary."))
        .Add(Value("profile", &A::profile, Boolean(),
                   "Time the checkpointed forward and recompute."));
    // DeepSpeed's block configures its checkpointing API, which models call;
    // here a model turns checkpointing on itself.
    s->WithoutEffect(
        "partition_activations",
        "it splits saved inputs across tensor-parallel ranks, which hold "
        "identical copies of them; zero-engine has no tensor parallelism, "
        "and across data-parallel ranks each rank's saved inputs are its own "
        "micro-batch's (nothing is duplicated, so there is nothing to split: "
        "use cpu_checkpointing to take them off the GPU)");
    s->WithoutEffect(
        "contiguous_memory_optimization",
        "saved inputs come from the caching allocator, or with "
        "cpu_checkpointing from a pooled host buffer and a ring of device "
        "buffers, which do not fragment");
    s->WithoutEffect("number_checkpoints",
                     "it only sizes DeepSpeed's contiguous buffer");
    s->WithoutEffect("synchronize_checkpoint_boundary",
                     "the engine never synchronises the device per layer");
    s->WithoutEffect("profile",
                     "checkpointed forwards and recomputations are not timed "
                     "separately");
    s->WarnOnUnknownKeys(UnknownInDictSection("activation_checkpointing"));
    return s;
  }();
  return *schema;
}

const Schema<ParallelWriteConfig>& ParallelWriteSchema() {
  static const auto* schema = [] {
    auto* s = new Schema<ParallelWriteConfig>();
    s->Add(Value("pipeline_stage", &ParallelWriteConfig::pipeline_stage,
                 Boolean(), "Write checkpoint shards per pipeline stage."))
        .WithoutEffect("pipeline_stage",
                       "a pipeline's checkpoint is always written per stage "
                       "(pipeline_stage_<s>/, docs/pipeline.md)");
    return s;
  }();
  return *schema;
}

const Schema<CheckpointConfig>& CheckpointSchema() {
  static const auto* schema = [] {
    using C = CheckpointConfig;
    auto* s = new Schema<C>();
    s->Add(Value("tag_validation", &C::tag_validation,
                 Enum<TagValidation>({{"Ignore", TagValidation::kIgnore},
                                      {"Warn", TagValidation::kWarn},
                                      {"Fail", TagValidation::kFail}},
                                     /*case_insensitive=*/true),
                 "What to do when ranks save under different tags."))
        .Add(Value("load_universal", &C::load_universal, Boolean(),
                   "Load a DeepSpeed universal checkpoint."))
        .Add(Value("use_node_local_storage", &C::use_node_local_storage,
                   Boolean(), "Each node writes to its own local storage."))
        .Add(Section("parallel_write", &C::parallel_write,
                     &ParallelWriteSchema(), "Parallel checkpoint writing."))
        .WithoutEffect("use_node_local_storage",
                       "every rank writes its own file into the one save "
                       "directory, which several hosts must share")
        .WarnOnUnknownKeys(UnknownInDictSection("checkpoint"));
    return s;
  }();
  return *schema;
}

const Schema<CsvMonitorConfig>& CsvMonitorSchema() {
  static const auto* schema = [] {
    using M = CsvMonitorConfig;
    auto* s = new Schema<M>();
    s->Add(Value("enabled", &M::enabled, Boolean(),
                 "Write training metrics to CSV files."))
        .Add(Value("output_path", &M::output_path, String(true),
                   "Directory for the CSV files (\"\" = current directory)."))
        .Add(Value("job_name", &M::job_name, String(false),
                   "Subdirectory naming this run."));
    return s;
  }();
  return *schema;
}

const Schema<PipelineConfig>& PipelineSchema() {
  static const auto* schema = [] {
    using P = PipelineConfig;
    auto* s = new Schema<P>();
    s->Add(Value("stages", &P::stages, Integer(AtLeast(1)),
                 "Pipeline stages (ranks per pipeline); the world is stages "
                 "x data-parallel replicas (stage = rank / (world / "
                 "stages)). Each stage's replicas run the ZeRO stage "
                 "(0-3) and offload (cpu or nvme, delayed_update) of "
                 "zero_optimization over that stage's parameters."))
        .Add(Value("partition", &P::partition, String(false),
                   "How the model's layer sequence is cut into stages: "
                   "\"parameters\" (or \"best\"), \"uniform\", or "
                   "boundaries such as \"0,4,8,12\"."))
        .Add(Value("activation_checkpoint_interval",
                   &P::activation_checkpoint_interval, Integer(Between(0, 1)),
                   "1: checkpoint every transformer block of the stage "
                   "(recompute in backward; as in DeepSpeed, not the "
                   "embedding, the final norm or the head); 0: off."))
        .Add(Value(
            "schedule", &P::schedule,
            Enum<PipelineSchedule>(
                {{"gpipe", PipelineSchedule::kGPipe},
                 {"1f1b", PipelineSchedule::kOneFOneB},
                 {"interleaved_1f1b", PipelineSchedule::kInterleavedOneFOneB},
                 {"zb_h1", PipelineSchedule::kZeroBubbleH1}},
                /*case_insensitive=*/false),
            "zero-engine: the schedule, gpipe, 1f1b, interleaved_1f1b or "
            "zb_h1 (zero bubble, Qi et al. 2023: 1F1B with each backward "
            "split into its input and weight gradients, the weight "
            "gradients filling the cool-down's bubble)."))
        .Add(Value("stages_per_rank", &P::stages_per_rank, Integer(AtLeast(1)),
                   "zero-engine: model stages per pipeline rank (the model "
                   "is cut into stages x stages_per_rank; stage s on "
                   "pipeline rank s % stages); > 1 needs interleaved_1f1b, "
                   "which needs >= 2."))
        .Add(Value("seed_layers", &P::seed_layers, Boolean(),
                   "Seed each layer's initialisation by its index."))
        .Add(Value("pipe_partitioned", &P::pipe_partitioned, Boolean(),
                   "Partition activations sent between stages over the "
                   "tensor-parallel group."))
        .Add(Value("grad_partitioned", &P::grad_partitioned, Boolean(),
                   "Partition gradients sent between stages over the "
                   "tensor-parallel group."))
        .WithoutEffect("seed_layers",
                       "parameters are initialised from (seed, name) "
                       "whatever the stage")
        .WithoutEffect("pipe_partitioned", "there is no tensor parallelism")
        .WithoutEffect("grad_partitioned", "there is no tensor parallelism");
    return s;
  }();
  return *schema;
}

}  // namespace

const Schema<Config>& TopSchema() {
  static const auto* schema = [] {
    using C = Config;
    auto* s = new Schema<C>();
    const Codec<Autoable<int64_t>> batch =
        AutoOr(Integer(Between(1, kMaxBatch)));
    // Batch sizes not given stay out of ToJson(); once inferred they print.
    auto batch_field = [&](std::string key, Autoable<int64_t> C::*member,
                           std::string meaning) {
      Field<C> field =
          Value(std::move(key), member, batch, std::move(meaning), "inferred");
      field.emit = [member, batch](const C& c) -> std::optional<Json> {
        const Autoable<int64_t>& value = c.*member;
        if (!value.is_auto() && value.raw_value() == 0) return std::nullopt;
        return batch.write(value);
      };
      return field;
    };
    s->Add(batch_field("train_batch_size", &C::train_batch_size,
                       "Samples per optimizer step over all ranks = micro x "
                       "accumulation x world size."))
        .Add(batch_field("train_micro_batch_size_per_gpu",
                         &C::train_micro_batch_size_per_gpu,
                         "Samples per forward/backward on one rank."))
        .Add(batch_field("gradient_accumulation_steps",
                         &C::gradient_accumulation_steps,
                         "Micro-batches accumulated per optimizer step."))
        .Add(Value("steps_per_print", &C::steps_per_print, Integer(AtLeast(1)),
                   "Log progress every this many optimizer steps."))
        .Add(Value("gradient_clipping", &C::gradient_clipping,
                   AutoOr(Number(NonNegative())),
                   "Clip gradients to this global L2 norm (0 = off)."))
        .Add(Value("prescale_gradients", &C::prescale_gradients, Boolean(),
                   "Divide gradients before the all-reduce rather than "
                   "after."))
        .Add(Value("gradient_predivide_factor", &C::gradient_predivide_factor,
                   Number(Positive()),
                   "Divide gradients by this before the all-reduce and by "
                   "world size / factor after."))
        .Add(Value("communication_data_type", &C::communication_data_type,
                   Nullable(Enum<CommDataType>({{"fp32", CommDataType::kFp32},
                                                {"fp16", CommDataType::kFp16},
                                                {"bf16", CommDataType::kBf16},
                                                {"bfp16", CommDataType::kBf16}},
                                               /*case_insensitive=*/false)),
                   "Data type of gradient communication (null = the model's)."))
        .Add(Value("wall_clock_breakdown", &C::wall_clock_breakdown, Boolean(),
                   "Time forward, backward and step separately, and the "
                   "collectives (the communicator's own time per step; "
                   "csv_monitor: elapsed_time_ms_*); with offload_optimizer, "
                   "also the CPU update's time, what the engine waited for "
                   "it and the ratio that would hide it."))
        .Add(Value("memory_breakdown", &C::memory_breakdown, Boolean(),
                   "Log memory use at each phase."))
        .Add(Value("seed", &C::seed, Integer(AtLeast(0)),
                   "zero-engine extension: seed of parameter init and every "
                   "other random stream."))
        .Add(Value("max_consecutive_nonfinite_steps",
                   &C::max_consecutive_nonfinite_steps, Integer(AtLeast(1)),
                   "zero-engine extension: bf16/f32 training skips a step "
                   "whose loss or gradient norm is inf or NaN, with a "
                   "warning, and fails after this many in a row (fp16: the "
                   "loss scaler's skips instead)."));

    s->Add(OptimizerField());
    s->Add(SchedulerField());

    s->Add(Section("fp16", &C::fp16, &Fp16Schema(), "fp16 training."))
        .Add(Section("bf16", &C::bf16, &Bf16Schema(), "bf16 training."))
        .Add(Section("zero_optimization", &C::zero_optimization, &ZeroSchema(),
                     "ZeRO."))
        .Add(Section("aio", &C::aio, &AioSchema(), "NVMe I/O."))
        .Add(Section("activation_checkpointing", &C::activation_checkpointing,
                     &ActivationCheckpointingSchema(),
                     "Activation checkpointing."))
        .Add(Section("checkpoint", &C::checkpoint, &CheckpointSchema(),
                     "Checkpoints."))
        .Add(Section("csv_monitor", &C::csv_monitor, &CsvMonitorSchema(),
                     "CSV metrics."))
        .Add(Section("pipeline", &C::pipeline, &PipelineSchema(),
                     "Pipeline parallelism (docs/pipeline.md)."))
        .Alias("bfloat16", "bf16");
    // DeepSpeed reads these top-level keys; zero-engine checks and ignores
    // them, warning when they would have done something.
    const std::string monitor =
        "zero-engine logs metrics through csv_monitor only";
    s->Ignored("zero_allow_untested_optimizer", Boolean(),
               std::optional<bool>(false),
               "every optimizer zero-engine has (Adam, AdamW, SGD) is "
               "supported at every ZeRO stage")
        .Ignored("zero_force_ds_cpu_optimizer", Boolean(),
                 std::optional<bool>(true),
                 "DeepSpeed uses it to refuse a client optimizer under "
                 "ZeRO-Offload; zero-engine offloads only the optimizer it "
                 "builds from this config")
        .Ignored("flops_profiler", SectionEnabled(false),
                 std::optional<bool>(false),
                 "the FLOPs profiler is not implemented")
        .Ignored("tensorboard", SectionEnabled(false),
                 std::optional<bool>(false), monitor)
        .Ignored("wandb", SectionEnabled(false), std::optional<bool>(false),
                 monitor)
        .Ignored("comet", SectionEnabled(false), std::optional<bool>(false),
                 monitor)
        .Ignored("comms_logger", SectionEnabled(false),
                 std::optional<bool>(false),
                 "the communication logger is not implemented "
                 "(wall_clock_breakdown times the collectives)")
        .Ignored("autotuning", SectionEnabled(false),
                 std::optional<bool>(false), "autotuning is not implemented")
        .Ignored("data_efficiency", SectionEnabled(false),
                 std::optional<bool>(false),
                 "data sampling and routing are not implemented")
        .Ignored("torch_autocast", SectionEnabled(false),
                 std::optional<bool>(false),
                 "the model runs in one dtype, chosen by fp16/bf16")
        .Ignored("hybrid_engine", SectionEnabled(false),
                 std::optional<bool>(false),
                 "the hybrid (RLHF) engine is not implemented")
        .Ignored("tensor_parallel", Present(), std::optional<bool>(),
                 "tensor parallelism is not implemented")
        .Ignored("data_types", Present(), std::optional<bool>(),
                 "zero-engine chooses these dtypes itself: gradients "
                 "accumulate in the model's dtype, master weights and "
                 "optimizer state are fp32")
        .Ignored("dataloader_drop_last", Boolean(), std::optional<bool>(false),
                 "zero-engine has no data loader")
        .Ignored("vocabulary_size", Present(), std::optional<bool>(),
                 "DeepSpeed only checks its alignment; the model sets its own")
        .Ignored("dump_state", Boolean(), std::optional<bool>(false),
                 "not implemented");
    // Features DeepSpeed 0.19.8 removed and rejects itself.
    const std::string removed =
        "removed from DeepSpeed, whose 0.19.8 rejects it too";
    s->Unsupported("amp", absl::StrCat("Apex AMP was ", removed,
                                       "; use \"bf16\" or \"fp16\""))
        .Unsupported("nebula",
                     absl::StrCat("Nebula checkpointing was ", removed))
        .Unsupported("compression_training",
                     absl::StrCat("the compression library was ", removed))
        .Unsupported("quantize_training",
                     absl::StrCat("quantize_training (MoQ) was ", removed))
        .Unsupported("sparse_gradients",
                     absl::StrCat("sparse_gradients was ", removed))
        .Unsupported("eigenvalue", absl::StrCat("eigenvalue was ", removed))
        .Unsupported("sparse_attention",
                     absl::StrCat("sparse attention was ", removed))
        .Unsupported("elasticity",
                     absl::StrCat("elastic training was ", removed,
                                  "; set the batch sizes directly"))
        .Unsupported("graph_harvesting",
                     absl::StrCat("graph harvesting was ", removed))
        .Unsupported(
            "curriculum_learning",
            absl::StrCat("top-level curriculum_learning was ", removed))
        .Unsupported("progressive_layer_drop",
                     absl::StrCat("progressive layer dropping was ", removed))
        .WarnOnUnknownKeys(
            "not a key zero-engine or DeepSpeed reads (DeepSpeed ignores "
            "unknown top-level keys)");
    return s;
  }();
  return *schema;
}

}  // namespace internal

// ------------------------------------------------------------- equality
// Derived from the tables: a key added to a table is compared without
// further code.

bool Fp16Config::operator==(const Fp16Config& other) const {
  return internal::Fp16Schema().Equal(*this, other);
}

bool Bf16Config::operator==(const Bf16Config& other) const {
  return internal::Bf16Schema().Equal(*this, other);
}

bool OffloadOptimizerConfig::operator==(
    const OffloadOptimizerConfig& other) const {
  return internal::OffloadOptimizerSchema().Equal(*this, other);
}

bool OffloadParamConfig::operator==(const OffloadParamConfig& other) const {
  return internal::OffloadParamSchema().Equal(*this, other);
}

bool ZeroConfig::operator==(const ZeroConfig& other) const {
  return internal::ZeroSchema().Equal(*this, other);
}

bool AioConfig::operator==(const AioConfig& other) const {
  return internal::AioSchema().Equal(*this, other);
}

bool ActivationCheckpointingConfig::operator==(
    const ActivationCheckpointingConfig& other) const {
  return internal::ActivationCheckpointingSchema().Equal(*this, other);
}

bool ParallelWriteConfig::operator==(const ParallelWriteConfig& other) const {
  return internal::ParallelWriteSchema().Equal(*this, other);
}

bool CheckpointConfig::operator==(const CheckpointConfig& other) const {
  return internal::CheckpointSchema().Equal(*this, other);
}

bool PipelineConfig::operator==(const PipelineConfig& other) const {
  return internal::PipelineSchema().Equal(*this, other);
}

bool CsvMonitorConfig::operator==(const CsvMonitorConfig& other) const {
  return internal::CsvMonitorSchema().Equal(*this, other);
}

// world_size is not a JSON key, so the table does not cover it; source only
// names the file for messages and is left out on purpose.
bool Config::operator==(const Config& other) const {
  return internal::TopSchema().Equal(*this, other) &&
         world_size == other.world_size;
}

std::vector<std::string> Config::UnresolvedAutoPaths() const {
  std::vector<std::string> paths;
  internal::TopSchema().AutoPaths("", *this, &paths);
  return paths;
}

}  // namespace config
}  // namespace ze
