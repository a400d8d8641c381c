// Engine: trains a model data-parallel across the ranks of an mpirun job,
// the way a DeepSpeed config says. This is the public interface: what a
// program includes (Initialize, the Engine's methods, and through
// engine/reports.h the reports they return). The implementation is private
// to engine/: the Engine forwards to an EngineImpl (engine/engine_impl.h),
// which orchestrates a micro-step through zero/'s one seam
// (zero/strategy.h), times and logs it through a StepMonitor
// (engine/step_monitor.h) and checkpoints through engine/checkpoint/.
//
//   ZE_ASSIGN_OR_RETURN(auto engine,
//                       ze::engine::Initialize(model, "ds_config.json"));
//   for (...) {                        // one micro-batch per call
//     ZE_ASSIGN_OR_RETURN(float loss, engine->Forward(tokens, targets));
//     ZE_RETURN_IF_ERROR(engine->Backward());
//     ZE_RETURN_IF_ERROR(engine->Step().status());  // updates at the
//   }                                    // accumulation boundary only
//
// What the engine owns: the communicator (bootstrapped from mpirun's
// environment), the flat partitioned buffers that replace the model's
// parameter and gradient storage, the f32 master weights and optimizer state
// (this rank's partition from stage 1 on), the loss scaler and the learning
// rate schedule. The model is shared with the caller, who may keep using it
// for evaluation; its parameters become views into the engine's buffers.
//
// Data parallelism: every rank feeds its own micro-batch; gradients are
// averaged over ranks and over the gradient_accumulation_steps micro-batches
// of a step, so world size W with micro-batch B and accumulation A trains
// exactly like one rank with micro-batch W*B*A (up to rounding).
//
// Stage by stage (Psi parameters, N ranks, mixed-precision Adam):
//   0: 16-bit weights and gradients replicated; gradients all-reduced in
//      buckets of reduce_bucket_size elements as soon as a bucket's
//      gradients are final during backward; replicated f32 master weights and
//      moments. 16 Psi bytes per rank.
//   1: gradients reduce-scattered (each rank keeps the reduced slice it
//      owns); master weights and moments partitioned; updated 16-bit weights
//      all-gathered in groups of allgather_bucket_size. 4 Psi + 12 Psi / N.
//   2: as 1, but the 16-bit gradients live only in flight: each bucket is
//      reduce-scattered during backward, every micro-step, into this rank's
//      gradient partition and freed. 2 Psi + 14 Psi / N.
//   3: everything partitioned; each module's parameters are all-gathered
//      before it runs and released after (zero/stage3.h). 16 Psi / N plus
//      the gathered buckets.
//
// Monitoring, as DeepSpeed's keys say: every steps_per_print steps rank 0
// logs step, loss, learning rate, loss scale, skipped steps, samples/s and
// tokens/s; with wall_clock_breakdown also the mean forward and backward
// time per micro-step and step time per step since the last print (each
// phase then synchronises the device at its end, so leave it off for
// speed); with memory_breakdown the allocator's bytes in use after each
// phase and its peak since the last print (whose peak it then resets).
// csv_monitor writes Train/Samples/train_loss, lr, loss_scale (fp16),
// tokens_per_second (over all ranks, since the previous step),
// memory_allocated_bytes and memory_peak_bytes (the model device's
// allocator) and, with wall_clock_breakdown,
// elapsed_time_ms_{forward,backward,step} at each step (engine/monitor.h); a
// failed write is logged and ends csv monitoring, never the step. All of
// this is engine/step_monitor.h's.
//
// Threading: one thread drives an engine. Errors are Statuses naming the
// config key, parameter or rank; a failed collective (timeout, mismatch)
// leaves the engine unusable (later calls fail with FailedPrecondition).
#ifndef ZE_ENGINE_ENGINE_H_
#define ZE_ENGINE_ENGINE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "core/safetensors/tensor_source.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "engine/auto_offload_ratio.h"
#include "engine/reports.h"
#include "nlohmann/json.hpp"
#include "nn/loss_model.h"

namespace ze {
namespace engine {

// Engine::Generate's options (Hugging Face generate's, where they exist).
struct GenerateOptions {
  // Only the last this many tokens are fed to the model (its maximum
  // sequence length); 0 feeds the whole sequence. While every row's
  // sequence fits, the KV cache computes exactly that; once a window
  // slides, the remaining tokens are computed by recomputing each window.
  int64_t max_context = 0;
  // Only logits [0, vocab_size) compete (a padded vocabulary's extra
  // columns never win); 0 uses every column.
  int64_t vocab_size = 0;
  // 0: greedy (the first maximum). Otherwise tokens are drawn from
  // softmax(logits / temperature); must be >= 0.
  float temperature = 0.0f;
  // With temperature > 0: draw among the top_k largest logits only (ties to
  // the lower id, so top_k = 1 is greedy); 0 is off; must be >= 0.
  int top_k = 0;
  // Sampling is a pure function of (seed, prompt index in the batch, step)
  // (Philox, engine/sampling.h): the same seed and prompts give the same
  // tokens, on any machine. Data-parallel ranks that want different samples
  // for equal prompts pass different seeds.
  uint64_t seed = 0;
  // A row that produces this token ends there (the token is returned as
  // its last); generation ends when every row has ended (under stage 3:
  // every row of every rank, agreed by a one-element all-reduce per step).
  std::optional<int32_t> stop_token;
  // Incremental decoding over a KV cache when the model offers it
  // (nn::IncrementalDecoder, as GptModel does); false recomputes the whole
  // prefix for every token (the reference the cache is tested against).
  bool use_cache = true;
};

class Engine;
class EngineImpl;  // engine/engine_impl.h, private to engine/

// Engine::GatherParameters's scope (DeepSpeed's zero.GatheredParameters).
// While alive, the named parameters' full data is readable (and writable)
// on every rank through Parameter::data(). Release (or the destructor,
// which logs a failure) ends it: a collective every rank must reach in the
// same order. Must not outlive its engine.
class GatheredParameters {
 public:
  ~GatheredParameters();
  GatheredParameters(const GatheredParameters&) = delete;
  GatheredParameters& operator=(const GatheredParameters&) = delete;
  // With modifier_rank >= 0, that rank's values of the named parameters
  // replace every rank's copy: stage 3 weight shards, stages 0-2 weights,
  // and the f32 master weights (optimizer moments are kept). Then the
  // gathered data is released (stage 3). Later calls do nothing and return
  // the first call's status.
  absl::Status Release();

 private:
  friend class EngineImpl;
  GatheredParameters(EngineImpl* engine, std::vector<std::string> names,
                     int modifier_rank)
      : engine_(engine),
        names_(std::move(names)),
        modifier_rank_(modifier_rank) {}
  EngineImpl* engine_;
  std::vector<std::string> names_;
  int modifier_rank_;
  bool released_ = false;
  absl::Status status_;
};

class Engine {
 public:
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Runs the model's forward and loss on this rank's micro-batch.
  //   inputs, targets: on the host or the model's device, each with first
  //   dimension B = train_micro_batch_size_per_gpu; the other dimensions
  //   and the dtypes are the model's to define (nn::LossModel::ForwardLoss):
  //   a GPT takes (B, T) i32 token ids and targets, a regression model
  //   might take (B, F) f32 features and (B, 1) f32 targets.
  // Returns this rank's mean loss. InvalidArgument for a batch dimension
  // other than B (naming both shapes); FailedPrecondition when a Backward
  // is still owed for the previous Forward. Throughput (tokens/s in logs
  // and csv_monitor) counts the elements of i32 inputs as tokens, and the
  // samples of other inputs.
  absl::StatusOr<float> Forward(const Tensor& inputs, const Tensor& targets);
  // Backpropagates the last Forward's loss (scaled by the loss scale and
  // 1 / gradient_accumulation_steps). At the accumulation boundary, and
  // every micro-step under stage 2, gradients are reduced as buckets fill.
  absl::Status Backward();
  // At the accumulation boundary: unscale, check for overflow (fp16), clip,
  // update, gather the 16-bit weights (stages 1-2), step the schedule, zero
  // the gradients. Otherwise only counts the micro-step.
  //
  // bf16/f32: a step whose loss or global gradient norm is inf or NaN is
  // skipped (StepReport::nonfinite and skipped; the weights, optimizer
  // state and schedule stay as they were; see StepReport for the one
  // exception) and rank 0 logs a warning at once naming the step and both
  // values. The max_consecutive_nonfinite_steps-th such step in a row fails
  // with FailedPrecondition on every rank (the step is still skipped, and
  // the engine stays usable: a later finite step resets the count). fp16
  // keeps its loss scaler's overflow skips, which never fail.
  absl::StatusOr<StepReport> Step();
  // gradient_accumulation_steps micro-batches: Forward, Backward and Step
  // each. micro_batches[i] = {tokens, targets}.
  absl::StatusOr<StepReport> TrainBatch(
      const std::vector<std::pair<Tensor, Tensor>>& micro_batches);

  bool IsGradientAccumulationBoundary() const;
  const Counters& counters() const;
  double current_learning_rate() const;
  double current_loss_scale() const;
  const config::Config& config() const;
  comm::Communicator& communicator() const;
  nn::LossModel& model() const;
  const MemoryBreakdown& memory_breakdown() const;
  const Stream& compute_stream() const;
  // Over the last completed optimizer step (see CommunicationCounters).
  CommunicationCounters communication_counters() const;
  // Bytes and seconds of swap-file I/O so far (offload_optimizer nvme and
  // offload_param nvme, summed; zeros otherwise), and `busy`: the union of
  // both files' in-flight intervals, per direction and both at once
  // (offload::IoActivity), counted once where they overlap. Include
  // engine/offload_report.h to call it.
  NvmeCounters nvme_counters() const;
  // Where the offloaded update's worker spent its time, summed over every
  // update so far (zeros without offload_optimizer). Include
  // engine/offload_report.h to call it.
  OffloadTimes offload_times() const;
  // This pipeline rank's last TrainBatch (see PipelineCounters); zeros
  // without a pipeline.
  PipelineCounters pipeline_counters() const;

  // The f32 master copy of parameter `name`, gathered from every rank (a
  // collective: every rank must call it). For tests and checkpoints.
  absl::StatusOr<std::vector<float>> GatherMasterWeights(
      const std::string& name);
  // Every trainable parameter's name, in the engine's layout order.
  std::vector<std::string> ParameterNames() const;

  // Inference (DeepSpeed's ZeRO-Inference under stage 3). Both are
  // collectives under stage 3 (every rank calls them with the same shapes;
  // parameters are gathered on demand and released), must not run between a
  // Forward and its Backward (FailedPrecondition), and leave the training
  // state as it was: uses, the recorded module order, the schedule hash,
  // gradients and counters.
  //
  // The model's mean loss on (inputs, targets), on the host or the device,
  // without saving activations. As for Forward, except that B (the first
  // dimension, shared by both) may be any size.
  absl::StatusOr<float> EvalForward(const Tensor& inputs,
                                    const Tensor& targets);
  // The model's own Forward output for `inputs` (on the host or the device,
  // any shape and dtype the model's Forward takes), without saving
  // activations: what `model(inputs)` under torch.no_grad() gives a
  // DeepSpeed or FSDP user, e.g. a GPT's logits (B, T, V) or a
  // classifier's (B, C). The output is on the model's device in its dtype,
  // written by work queued on compute_stream() (synchronise it, or copy on
  // it, before reading on the host). Stage 3: a collective like EvalForward.
  // FailedPrecondition between a Forward and its Backward; the model's
  // errors otherwise.
  absl::StatusOr<Tensor> EvalOutputs(const Tensor& inputs);
  // Generation for a batch of prompts (token ids, any lengths >= 1): up to
  // max_new_tokens new tokens per prompt, chosen on the host from the last
  // position's logits (greedy, or sampled: GenerateOptions). Returns the new
  // tokens only, one vector per prompt, in the prompts' order; a row that
  // met options.stop_token is shorter (ending with it).
  //
  // With a model that implements nn::IncrementalDecoder (GptModel) and
  // options.use_cache, one KV cache is allocated for the batch and the
  // longest sequence (activations: this rank's own, freed on return). The
  // prompts are prefilled one forward per distinct length (rows of equal
  // length together, so no padding and no attention mask: each row sits at
  // its own positions), then every step decodes all rows in one forward of
  // (B, 1) tokens, each row at its own position. Rows that have ended keep
  // decoding the stop token (their output is dropped), so every step's
  // shapes stay those of the batch. From the step at which any row's
  // sequence outgrows max_context (or the model's positions), every row is
  // recomputed over its window instead, exactly as without a cache. Otherwise,
  // or with use_cache false, every step runs the model's Forward over each
  // row's whole window (rows of equal length together), recomputing the prefix,
  // as Generate did before; the model's Forward must then return logits (B, T,
  // V).
  //
  // Stage 3: a collective like EvalForward: every rank passes the same
  // number of prompts with the same lengths (token values may differ: each
  // rank generates for its own prompts), the same max_new_tokens and the
  // same options except seed, so all ranks run the same forwards; the
  // cache's forwards go through Module::Forward, so the parameters are
  // gathered and released as for any forward.
  //
  // InvalidArgument naming the argument (and the prompt's index) for an
  // empty batch, an empty prompt, a negative token id (or one >=
  // options.vocab_size when set), max_new_tokens < 0, a negative
  // temperature, top_k, max_context or vocab_size. FailedPrecondition
  // between a Forward and its Backward. The model's errors otherwise.
  absl::StatusOr<std::vector<std::vector<int32_t>>> Generate(
      const std::vector<std::vector<int32_t>>& prompts, int max_new_tokens,
      const GenerateOptions& options = GenerateOptions());
  // One prompt: Generate({prompt_tokens}, ...)[0]; errors name prompts[0].
  // (A braced batch of one, Generate({{1, 2}}, ...), matches both forms:
  // spell its type, std::vector<std::vector<int32_t>>{{1, 2}}.)
  absl::StatusOr<std::vector<int32_t>> Generate(
      const std::vector<int32_t>& prompt_tokens, int max_new_tokens,
      const GenerateOptions& options = GenerateOptions());

  // Gathers the named parameters for reading or modifying their full data
  // (a collective). NotFound naming an unknown parameter; InvalidArgument
  // when modifier_rank >= world size; FailedPrecondition between a Forward
  // and its Backward.
  absl::StatusOr<std::unique_ptr<GatheredParameters>> GatherParameters(
      const std::vector<std::string>& names, int modifier_rank = -1);

  // Loads every parameter (our names, any float dtype in the file) from a
  // safetensors file into the weights and the f32 master weights; optimizer
  // state is kept. Stage 3 reads only this rank's ranges
  // (safetensors::TensorSource::ReadRange); stages 0-2 read whole tensors.
  // Nothing is written unless every parameter is there with its shape.
  // Errors name the file and the parameter. A collective at stage 3.
  absl::StatusOr<LoadReport> LoadWeights(const std::string& path);
  // The same from any source of tensors under our parameter names (a Hugging
  // Face model directory: nn/pretrained/hf_decoder.h); the errors name
  // source.description(). `source` is only read during the call.
  absl::StatusOr<LoadReport> LoadWeights(
      const safetensors::TensorSource& source);

  // Checkpoints (DeepSpeed's save_checkpoint / load_checkpoint); the format
  // and its crash safety are in engine/checkpoint/checkpoint_format.h.
  //
  // Saves the whole training state under `directory`/`tag` (tag empty:
  // "global_step<N>"): every rank writes its slices of the f32 master
  // weights, the optimizer's moments and the 16-bit weights (reading
  // offloaded state back from host memory or NVMe) into its own file; rank
  // 0 writes the manifest (layout of every parameter, counters, scheduler,
  // loss scaler, optimizer step, the resolved config, `client_state`, and
  // each file's size and CRC-32C), then makes the tag visible and points
  // `latest` at it. With zero_optimization.stage3_gather_16bit_weights_on_
  // model_save, rank 0 also writes `tag`/model_16bit.safetensors (the
  // model's dtype, our parameter names), streamed one parameter at a time
  // from the rank files, never the whole model in memory.
  //
  // A collective: every rank calls it with the same directory and tag (the
  // ranks check: InvalidArgument naming the ranks' values otherwise), at an
  // accumulation boundary and not between Forward and Backward
  // (FailedPrecondition). Any rank's failure (a full disk, no permission)
  // fails the call on every rank, and leaves `latest` and every complete
  // checkpoint as they were. `client_state` must be a JSON object.
  //
  // A checkpoint that could not be resumed from is never committed: when
  // a master weight is inf or NaN (the 16-bit weights are rounded from
  // them; a non-finite optimizer state makes them so at its first update),
  // or the last step's loss was not finite and its update was applied
  // (StepReport::nonfinite without skipped), the call fails with
  // FailedPrecondition on every rank, naming what is not finite, and
  // `latest` keeps naming the last good checkpoint.
  //
  // A pipeline engine (pipeline.stages > 1) writes `directory`/pipeline.json
  // (stages and layer ranges), one checkpoint as above per stage under
  // `directory`/pipeline_stage_<s>/ (that stage's data-parallel ranks), and
  // moves `directory`/latest once every stage has committed; it loads only
  // a checkpoint of the same pipeline layout (FailedPrecondition naming
  // both), and no stage loads unless every stage validated its files
  // (engine/checkpoint/orchestration.h).
  absl::Status SaveCheckpoint(
      const std::string& directory, const std::string& tag = "",
      const nlohmann::json& client_state = nlohmann::json::object());

  // Where this rank's last SaveCheckpoint spent its time (engine/reports.h;
  // also spelled Engine::CheckpointSaveReport).
  using CheckpointSaveReport = engine::CheckpointSaveReport;
  const CheckpointSaveReport& last_save_report() const;

  using LoadedCheckpoint = engine::LoadedCheckpoint;
  // Loads `directory`/`tag` (empty: the one `latest` names) saved at any
  // world size and ZeRO stage into this engine's layout: each rank reads
  // only the byte ranges of the parameters it holds. Restores the weights,
  // the f32 master weights, and, with `load_optimizer_states`, the
  // optimizer's moments and step count (otherwise those keep their
  // values); always the counters, the learning-rate schedule's position
  // and the loss scaler. A collective, under the same conditions as
  // SaveCheckpoint.
  //
  // Before anything is written the ranks check, together, the manifest,
  // every file's size and CRC-32C (each rank verifies a share of the
  // files), and that the checkpoint's parameters are exactly the model's,
  // with the same shapes. When this rank's state fits in host memory (the
  // one-pass path: at most 3/4 of MemAvailable divided among the ranks on
  // the host, or ZE_CHECKPOINT_STAGING_LIMIT bytes when that environment
  // variable was set when Initialize ran; 0 disables it) everything it needs is
  // read once into host staging, the checksums computed as it is read, and
  // applied after the check; a file it verifies but did not read whole
  // (resharding) is read again for its checksum. Otherwise (the two-pass path)
  // its files are verified first and the state then read and written bucket by
  // bucket. A failure there is an error naming the file or
  // parameter (NotFound for a missing tag or file, DataLoss for a corrupt
  // or truncated file, InvalidArgument for another model, FailedPrecondition
  // for a newer format version or missing optimizer state) on every rank,
  // with the engine unchanged. A read error after that point (the disk
  // failing mid-load) leaves the state partly loaded: DataLoss saying so.
  absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(
      const std::string& directory, const std::string& tag = "",
      bool load_optimizer_states = true);

 private:
  friend absl::StatusOr<std::unique_ptr<Engine>> Initialize(
      std::shared_ptr<nn::LossModel> model, const config::Config& config,
      std::shared_ptr<comm::Communicator> communicator);
  explicit Engine(std::unique_ptr<EngineImpl> impl);
  std::unique_ptr<EngineImpl> impl_;  // never null
};

// Wraps `model` for training with `config` (already loaded; its world size
// must match the communicator's). `communicator` may be null: one is
// bootstrapped from mpirun (world size 1 without a launcher) with default
// comm::CommOptions, so ranks sharing a GPU ask through the environment
// (ZE_ALLOW_GPU_SHARING=1). Fails with InvalidArgument naming the config key
// when the config and the model disagree (dtype, an unsupported option),
// ResourceExhausted (with the bytes needed) when the model state does not
// fit the device's allocator cap, or the communicator's error
// (FailedPrecondition for more ranks on a host than GPUs, unless asked).
// FailedPrecondition, on every rank, when a CUDA model is not on the
// communicator's device (build it on communicator->device()).
// Process-wide, once: installs core/file_cleanup.h's SIGINT, SIGTERM and
// SIGHUP handlers (only where the program left the default disposition),
// which remove the job's NVMe swap files and then end the process by the
// same signal.
absl::StatusOr<std::unique_ptr<Engine>> Initialize(
    std::shared_ptr<nn::LossModel> model, const config::Config& config,
    std::shared_ptr<comm::Communicator> communicator = nullptr);

// As above, with the config given as a file path, or as JSON text when it
// starts with '{'. The batch triple is checked against the world size.
// "auto" values are resolved as Hugging Face's integration does
// (config::Resolve): the world size, the model's hidden size
// (LossModel::hidden_size: reduce_bucket_size, stage3_prefetch_bucket_size,
// stage3_param_persistence_threshold) and fp16/bf16.enabled from the model's
// dtype are filled in by Initialize unless `hints` sets them; what only the
// training run knows (learning rate, batch sizes, steps...) comes from
// `hints`, the counterpart of HF's TrainingArguments. An "auto" value left
// without a hint fails with InvalidArgument naming its JSON path.
absl::StatusOr<std::unique_ptr<Engine>> Initialize(
    std::shared_ptr<nn::LossModel> model,
    const std::string& config_path_or_json,
    std::shared_ptr<comm::Communicator> communicator = nullptr,
    const config::ResolutionContext& hints = config::ResolutionContext());

// What the config-file Initialize trains by: `loaded` (LoadConfigFile's)
// with every "auto" replaced as it does (above), offload_optimizer.ratio
// "auto" chosen by engine::ChooseAutoOffloadRatio from `hints`'
// activation_bytes (and device_memory_bytes) and logged, unless `hints`
// gives the ratio. For programs that plan before Initialize
// (train_gpt --dry_run); passing the result's ratio on as
// ResolutionContext::offload_optimizer_ratio makes Initialize keep it. A
// collective when the ratio is chosen (every rank calls it). Errors:
// config::Resolve's, and InvalidArgument naming the key for an "auto" ratio
// without activation_bytes. `auto_ratio`, when not null, receives the
// choice (untouched when nothing was chosen).
absl::StatusOr<config::Config> ResolveConfig(
    const config::Config& loaded, nn::LossModel& model,
    comm::Communicator& communicator,
    const config::ResolutionContext& hints = config::ResolutionContext(),
    AutoOffloadRatio* auto_ratio = nullptr);

}  // namespace engine
}  // namespace ze

#endif  // ZE_ENGINE_ENGINE_H_
