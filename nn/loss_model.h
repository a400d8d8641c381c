// LossModel: a Module that computes its own training loss. What the engine
// trains (ze::engine::Initialize takes one).
//
// Contract, shared by every implementation:
//   ForwardLoss runs the model's public Module::Forward (so hooks fire) and
//   returns the mean loss of the batch, read back to the host.
//   BackwardLoss backpropagates loss_scale * that mean loss through the
//   public Module::Backward, ACCUMULATING into the parameters' grad slots.
//   counted_targets() is the number of targets the last ForwardLoss averaged
//   over. The engine weighs every rank's mean loss equally, whatever its
//   count (as DeepSpeed and DDP average gradients over ranks), so the loss
//   it reports is the mean of the ranks' means and matches the gradients.
//   hidden_size() is optional (0 = unknown); see below.
#ifndef ZE_NN_LOSS_MODEL_H_
#define ZE_NN_LOSS_MODEL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "nn/module.h"

namespace ze {
namespace nn {

class LossModel : public Module {
 public:
  explicit LossModel(std::string type_name) : Module(std::move(type_name)) {}

  // inputs, targets: on the model's device, first dimension B (the
  // micro-batch); their other dimensions and dtypes are the model's to
  // define and check (GptModel: (B, T) i32 both, a target < 0 ignored).
  // InvalidArgument for inputs the model does not take; errors from any
  // module, annotated with its name.
  virtual absl::StatusOr<float> ForwardLoss(const Tensor& inputs,
                                            const Tensor& targets,
                                            const Stream& stream) = 0;
  // FailedPrecondition without a preceding ForwardLoss.
  virtual absl::Status BackwardLoss(float loss_scale, const Stream& stream) = 0;
  virtual int64_t counted_targets() const = 0;
  // The device and dtype the model's parameters and activations use.
  virtual Device device() const = 0;
  virtual DType dtype() const = 0;
  // The model's width, what Hugging Face calls hidden_size (GPT-2's n_embd):
  // the engine passes it to config::Resolve() (ResolutionContext::
  // hidden_size) to size the "auto" ZeRO buckets from it. 0 means unknown,
  // the default for models that have no single width; a config that needs
  // it then fails to resolve, naming the key.
  virtual int64_t hidden_size() const { return 0; }
};

// The language-model loss GptModel and DecoderModel share: the mean
// softmax cross-entropy over the targets >= 0 of a batch, from the per-row
// losses their OutputHead computes in loss mode (chunked: the (B, T, V)
// logits never exist; see OutputHead in nn/layers.h). Forward reads the
// per-row losses back (one synchronisation) and averages them on the host;
// Backward gives the gradient the head's loss-mode Backward takes. Not
// thread-safe.
class MeanCrossEntropy {
 public:
  // InvalidArgument starting with `op` unless tokens is (B, T) i32 and
  // targets i32 of its shape (a model's ForwardLoss checks its inputs so).
  static absl::Status CheckTokensAndTargets(const char* op,
                                            const Tensor& tokens,
                                            const Tensor& targets);

  // losses: the per-row losses (B, T) f32 (0 where ignored), targets (B, T)
  // i32, both on one device. Returns the mean loss over the counted targets
  // (0 when none count) and remembers their count until Backward or Clear.
  absl::StatusOr<float> Forward(const Tensor& losses, const Tensor& targets,
                                const Stream& stream);
  // d(loss_scale * mean loss)/d(each counted row's loss), loss_scale /
  // counted (0 when none count), as the (1) f32 host tensor
  // OutputHead::Backward takes in loss mode. Ends the pending state.
  // FailedPrecondition starting with `op` without a preceding Forward.
  absl::StatusOr<Tensor> Backward(const char* op, float loss_scale);
  // Targets counted by the last Forward.
  int64_t counted() const { return counted_; }
  // Forgets a pending Forward.
  void Clear() { pending_ = false; }

 private:
  bool pending_ = false;
  int64_t counted_ = 0;
};

}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_LOSS_MODEL_H_
