// PipelineStage: a model built as one stage of a pipeline (docs/pipeline.md):
// a contiguous range [first_layer, last_layer) of the model's top-level
// layer sequence, in which layer i's output is layer i + 1's input, with
// only that range's parameters (GPT: the embedding, each block, the final
// LayerNorm and the head; GptOptions::first_layer/last_layer).
//
// The pipeline executor (pipeline/executor.h) runs a stage as the engine
// runs a LossModel: ForwardStage and BackwardStage go through the public
// Module::Forward/Backward, so the ZeRO strategy's hooks fire. Each
// ForwardStage saves its state and BackwardStage consumes the most recent
// one of the current saved-state slot (LIFO within a slot, as Module
// does); the executor runs each micro-batch in a slot of its own
// (nn::SavedStateSlot), so a schedule's order need not be LIFO across
// micro-batches.
//
// Not thread-safe (one thread drives a stage).
#ifndef ZE_NN_PIPELINE_STAGE_H_
#define ZE_NN_PIPELINE_STAGE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "nn/loss_model.h"
#include "nn/module.h"
#include "nn/parameter.h"

namespace ze {
namespace nn {

class PipelineStage {
 public:
  virtual ~PipelineStage() = default;

  // This stage's layers, [first_layer, last_layer) of the whole model's
  // num_pipeline_layers().
  virtual int first_layer() const = 0;
  virtual int last_layer() const = 0;
  virtual int num_pipeline_layers() const = 0;
  // Each of the whole model's pipeline layers' weight for partitioning by
  // parameters (pipeline/partition.h), so every rank computes the same cut.
  virtual std::vector<int64_t> PipelineLayerWeights() const = 0;
  bool is_first_stage() const { return first_layer() == 0; }
  bool is_last_stage() const { return last_layer() == num_pipeline_layers(); }

  // The activation passed between stages for a micro-batch whose model
  // inputs (what the first stage reads) are `inputs`: its shape (GPT:
  // (B, T, C) for (B, T) tokens) and dtype. Every rank of a pipeline is
  // given the micro-batches' inputs, so a middle stage sizes its receive
  // buffers from them.
  virtual Shape BoundaryShape(const Tensor &inputs) const = 0;
  virtual DType boundary_dtype() const = 0;

  // The modules of this stage's layers, in order (the executor turns on
  // per-layer activation checkpointing through them).
  virtual std::vector<Module *> StageLayers() = 0;
  // Of those, the transformer blocks: what pipeline.
  // activation_checkpoint_interval checkpoints. As in DeepSpeed, not the
  // embedding, the final norm or the head (whose loss mode forms its
  // gradients during the forward and refuses to be checkpointed).
  virtual std::vector<Module *> BlockLayers() = 0;

  // Runs this stage's layers. input: the model's inputs on the first stage,
  // else the previous stage's output. targets: read by the last stage
  // only, which returns the per-row losses (B, T) f32 that MeanCrossEntropy
  // (nn/loss_model.h) averages; other stages return their output
  // activation. Errors from any layer, annotated with its name.
  virtual absl::StatusOr<Tensor> ForwardStage(const Tensor &input,
                                              const Tensor &targets,
                                              const Stream &stream) = 0;
  // Backpropagates the most recent saved ForwardStage of the current
  // saved-state slot (nn/module.h): grad_output is the
  // next stage's input gradient, or on the last stage MeanCrossEntropy's
  // Backward. Returns the gradient of this stage's input (undefined on the
  // first stage, whose inputs are token ids). Accumulates into the
  // parameters' grad slots. FailedPrecondition without a saved forward.
  virtual absl::StatusOr<Tensor> BackwardStage(const Tensor &grad_output,
                                               const Stream &stream) = 0;
  // Under nn::SplitBackwardScope, BackwardStage runs the first part of a
  // split backward (nn/module.h); this runs the second, the deferred weight
  // gradients of the current saved-state slot's BackwardStage, over every
  // layer of the stage in the order of the first part.
  absl::Status BackwardStageWeights(const Stream &stream) {
    return Module::BackwardWeightsOf(StageLayers(), stream);
  }
  // Weight-gradient parts waiting in the current slot, over the stage.
  int PendingStageWeightGradients() {
    int pending = 0;
    for (Module *layer : StageLayers()) {
      pending += layer->PendingWeightGradients();
    }
    return pending;
  }

  // Parameters this stage holds that another stage holds too, whose
  // gradients the pipeline sums across the two before the update (GPT's
  // token table, used by the embedding on the first stage and the tied head
  // on the last). Empty when the stage holds every user of its parameters.
  virtual std::vector<Parameter *> TiedParameters() = 0;
};

// A pipeline rank's several stages as one model, for the interleaved
// schedule (pipeline/schedule.h: stage s on pipeline rank s % ranks, so
// chunk c of rank r is stage r + c * ranks): what the engine is given on
// that rank, so that ONE ZeRO strategy holds, partitions, reduces and
// updates every parameter of the rank, whichever chunk uses it. The chunks
// are unnamed children (Module::RegisterUnnamedChild): each parameter keeps
// its whole-model name ("blocks.3.attn.qkv.weight"), and with it its
// initial values (from (seed, name)), its checkpoint entry and the
// single-rank run's name. Modules() and Parameters() list chunk 0's, then
// chunk 1's, ... (model order).
//
// The whole never runs as one model: Forward, ForwardLoss and BackwardLoss
// are FailedPrecondition; the pipeline executor runs each chunk through
// its PipelineStage interface, inside the strategy's brackets.
class InterleavedStages : public LossModel {
 public:
  // chunks: this rank's stages in model order, each a LossModel that is a
  // PipelineStage (GptModel/DecoderModel built with first_layer/last_layer).
  // InvalidArgument naming the chunk: fewer than 2 chunks, a null one, one
  // that is not a PipelineStage, chunks of models of another layer count,
  // layer ranges not ascending and disjoint, another device or dtype than
  // chunk 0's, or two chunks with a parameter of one name.
  static absl::StatusOr<std::unique_ptr<InterleavedStages>> Create(
      std::vector<std::unique_ptr<LossModel>> chunks);

  int num_chunks() const { return static_cast<int>(stages_.size()); }
  // Chunk c as a pipeline stage / as a model; 0 <= c < num_chunks().
  PipelineStage *chunk(int c) const { return stages_[c]; }
  LossModel *chunk_model(int c) const { return models_[c]; }

  absl::StatusOr<float> ForwardLoss(const Tensor &inputs, const Tensor &targets,
                                    const Stream &stream) override;
  absl::Status BackwardLoss(float loss_scale, const Stream &stream) override;
  int64_t counted_targets() const override { return 0; }
  Device device() const override { return models_[0]->device(); }
  DType dtype() const override { return models_[0]->dtype(); }
  int64_t hidden_size() const override { return models_[0]->hidden_size(); }

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor &input,
                                     const Stream &stream) override;
  absl::StatusOr<Tensor> BackwardImpl(const Tensor &grad_output,
                                      const Stream &stream) override;

 private:
  InterleavedStages() : LossModel("InterleavedStages") {}
  // FailedPrecondition: the chunks run one by one, through the pipeline.
  absl::Status NotRunAsOne(const char *op) const;

  std::vector<LossModel *> models_;
  std::vector<PipelineStage *> stages_;
};

// The pipeline stages `model` holds, in model order: an InterleavedStages'
// chunks, a PipelineStage itself, else none.
std::vector<PipelineStage *> PipelineStagesOf(Module &model);

// A last stage's copy of a table tied to the head (GPT's "embed.wte",
// Llama's "embed_tokens.weight"), registered under the embedding's name so
// the copy keeps the table's name (and, initialised from (seed, name), the
// first stage's values; `initializer` must be the embedding's). Only the
// head reads it; the module itself never runs (FailedPrecondition).
class TiedTableCopy : public Module {
 public:
  TiedTableCopy(const std::string &parameter_name, int64_t rows,
                int64_t columns, DType dtype, const Device &device,
                const Initializer &initializer);
  Parameter *table() const { return table_; }
  std::shared_ptr<Parameter> shared_table() const {
    return SharedParameter(table_);
  }

 protected:
  absl::StatusOr<Tensor> ForwardImpl(const Tensor &input,
                                     const Stream &stream) override;
  absl::StatusOr<Tensor> BackwardImpl(const Tensor &grad_output,
                                      const Stream &stream) override;

 private:
  Parameter *table_;
};

// A model's constructor checks: InvalidArgument, naming `options`
// ("GptOptions") and the layer sequence `layers` describes, unless
// [first_layer, last_layer) is a non-empty range within `count` layers
// (last_layer -1: through the end).
absl::Status CheckPipelineLayers(const char *options, int first_layer,
                                 int last_layer, int count,
                                 const std::string &layers);

// The error of whole-model calls (ForwardLoss, ForwardCached, ...) on a
// stage: FailedPrecondition naming `op` and the stage's layers.
absl::Status NotWholeModelError(const char *op, const PipelineStage &stage);

}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_PIPELINE_STAGE_H_
