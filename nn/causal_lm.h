// CausalLm: what GptModel and DecoderModel share, the causal language
// model's layer stack and everything that only walks it:
//   embedding -> blocks (a Sequential) -> final norm -> lm_head (an
//   OutputHead)
// on any contiguous part of it (a pipeline stage: a null layer is one this
// stage does not hold), the mean cross-entropy loss (ForwardLoss /
// BackwardLoss), the pipeline's stage interface, and the forward that keeps
// each sequence's last position only (ForwardLastPositions, for
// incremental decoding). A family's class builds its layers in its
// constructor, registers them as children and hands them to SetStack; it
// keeps what differs: its config, input checks, KV cache and the cached
// forward's settings of its layers.
#ifndef ZE_NN_CAUSAL_LM_H_
#define ZE_NN_CAUSAL_LM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "nn/kv_cache.h"
#include "nn/layers.h"
#include "nn/loss_model.h"
#include "nn/module.h"
#include "nn/pipeline_stage.h"

namespace ze {
namespace nn {

class CausalLm : public LossModel,
                 public IncrementalDecoder,
                 public PipelineStage {
 public:
  // Whether this model holds every layer (not a pipeline stage).
  bool whole() const { return is_first_stage() && is_last_stage(); }
  // Null on a pipeline stage without the head.
  OutputHead *lm_head() const { return stack_.head; }

  // PipelineStage (nn/pipeline_stage.h): the stage holds pipeline layers
  // [first_layer, last_layer); its activation is (B, T, hidden_size()) in
  // the model's dtype.
  int first_layer() const override { return first_layer_; }
  int last_layer() const override { return last_layer_; }
  Shape BoundaryShape(const Tensor &inputs) const override {
    return {inputs.size(0), inputs.size(1), hidden_size()};
  }
  DType boundary_dtype() const override { return dtype(); }
  std::vector<Module *> StageLayers() override;
  std::vector<Module *> BlockLayers() override;
  absl::StatusOr<Tensor> ForwardStage(const Tensor &input,
                                      const Tensor &targets,
                                      const Stream &stream) override;
  absl::StatusOr<Tensor> BackwardStage(const Tensor &grad_output,
                                       const Stream &stream) override {
    return Backward(grad_output, stream);
  }
  std::vector<Parameter *> TiedParameters() override;

  // Forward through the public Module::Forward (hooks fire) plus the mean
  // cross-entropy over targets >= 0 (MeanCrossEntropy; only the real
  // vocabulary's logits compete, a padded table's extra rows are left out).
  // A pipeline stage that is not the whole model refuses
  // (FailedPrecondition; the pipeline runs it through ForwardStage).
  //   tokens, targets (B, T) i32 on the model's device. Returns the mean
  //   loss over counted targets; reads the per-row losses back to the host:
  //   one stream synchronisation per call. Only one chunk of logits is
  //   alive at a time (OutputHead's loss mode); the last stays until
  //   BackwardLoss.
  absl::StatusOr<float> ForwardLoss(const Tensor &tokens, const Tensor &targets,
                                    const Stream &stream) override;
  // Backpropagates loss_scale * (mean loss of the last ForwardLoss) through
  // the public Module::Backward, accumulating into the parameters' grads.
  // The head recomputes each chunk's logits but the last and turns them
  // into their gradient in place. FailedPrecondition without a preceding
  // ForwardLoss, or on a stage that is not the whole model.
  absl::Status BackwardLoss(float loss_scale, const Stream &stream) override;
  // Targets counted by the last ForwardLoss.
  int64_t counted_targets() const override { return loss_.counted(); }

 protected:
  // The layers SetStack is given; null where the stage lacks one.
  struct Stack {
    Module *embedding = nullptr;
    Sequential *blocks = nullptr;
    Module *final_norm = nullptr;
    OutputHead *head = nullptr;
    // A last stage without the embedding whose head is tied: its copy of
    // the table.
    TiedTableCopy *tied_table = nullptr;
    // The embedding's table when the head multiplies by it (tied), else
    // null.
    Parameter *tied_embedding_table = nullptr;
  };

  // `type_name` names the model in messages ("GptModel"); `loss_vocab`
  // columns of the head's logits compete in the loss; the stage holds
  // pipeline layers [first_layer, last_layer) of `pipeline_layers`
  // (last_layer -1: through the end, as GptOptions and DecoderOptions say).
  CausalLm(const char *type_name, int64_t loss_vocab, int first_layer,
           int last_layer, int pipeline_layers);

  // Called once by the family's constructor, after registering the layers.
  void SetStack(const Stack &stack) { stack_ = stack; }
  const Stack &stack() const { return stack_; }

  // FailedPrecondition naming `op` unless whole().
  absl::Status RequireWhole(const char *op) const;

  // Forward(tokens) with every sequence but its last position dropped
  // before the final norm and the head, and nothing saved for a backward:
  // (N, T) -> (N, 1, V). The family's ForwardCached sets its layers' cache
  // slots around it.
  absl::StatusOr<Tensor> ForwardLastPositions(const Tensor &tokens,
                                              const Stream &stream);
  // Whether the forward running now is ForwardLastPositions'.
  bool forwarding_last_positions() const { return last_position_only_; }

  // The stack in order: tokens (B, T) i32 (or on a stage without the
  // embedding the activation (B, T, H)) -> logits (B, T, V), or the per-row
  // losses in ForwardLoss's forward (OutputHead's loss mode).
  absl::StatusOr<Tensor> ForwardImpl(const Tensor &tokens,
                                     const Stream &stream) override;
  // grad_output: the logits' gradient, or for a ForwardLoss's forward the
  // per-row losses'. Returns the embedding's (empty) input gradient, or on
  // a stage without it the previous stage's output gradient (B, T, H).
  absl::StatusOr<Tensor> BackwardImpl(const Tensor &grad_output,
                                      const Stream &stream) override;
  void ClearSavedStateImpl() override { loss_.Clear(); }

 private:
  std::string type_name_;
  int64_t loss_vocab_;
  int first_layer_;
  int last_layer_;
  Stack stack_;
  // Between ForwardLoss and BackwardLoss: the count of targets (the head
  // keeps what its backward needs).
  MeanCrossEntropy loss_;
  // During ForwardLastPositions.
  bool last_position_only_ = false;
};

}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_CAUSAL_LM_H_
