#include "nn/causal_lm.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace ze {
namespace nn {

CausalLm::CausalLm(const char *type_name, int64_t loss_vocab, int first_layer,
                   int last_layer, int pipeline_layers)
    : LossModel(type_name),
      type_name_(type_name),
      loss_vocab_(loss_vocab),
      first_layer_(first_layer),
      last_layer_(last_layer < 0 ? pipeline_layers : last_layer) {}

absl::Status CausalLm::RequireWhole(const char *op) const {
  if (whole()) return absl::OkStatus();
  return NotWholeModelError(op, *this);
}

std::vector<Module *> CausalLm::StageLayers() {
  std::vector<Module *> layers;
  if (stack_.embedding != nullptr) layers.push_back(stack_.embedding);
  for (Module *block : BlockLayers()) layers.push_back(block);
  if (stack_.final_norm != nullptr) layers.push_back(stack_.final_norm);
  if (stack_.head != nullptr) layers.push_back(stack_.head);
  return layers;
}

std::vector<Module *> CausalLm::BlockLayers() {
  std::vector<Module *> layers;
  if (stack_.blocks != nullptr) {
    for (int i = 0; i < stack_.blocks->size(); ++i) {
      layers.push_back(stack_.blocks->at(i));
    }
  }
  return layers;
}

std::vector<Parameter *> CausalLm::TiedParameters() {
  if (whole()) return {};
  if (stack_.embedding != nullptr && stack_.head == nullptr &&
      stack_.tied_embedding_table != nullptr) {
    return {stack_.tied_embedding_table};
  }
  if (stack_.tied_table != nullptr) return {stack_.tied_table->table()};
  return {};
}

absl::StatusOr<Tensor> CausalLm::ForwardStage(const Tensor &input,
                                              const Tensor &targets,
                                              const Stream &stream) {
  if (stack_.head != nullptr) {
    if (!targets.defined() || targets.dtype() != DType::kI32 ||
        targets.dim() != 2 || input.dim() < 2 ||
        targets.size(0) != input.size(0) || targets.size(1) != input.size(1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          type_name_,
          "::ForwardStage: the last stage needs targets (B, T) i32 matching "
          "its input ",
          input.DebugString(), ", got ",
          targets.defined() ? targets.DebugString() : "undefined"));
    }
    stack_.head->ComputeLossInNextForward(targets, loss_vocab_);
  }
  absl::StatusOr<Tensor> output = Forward(input, stream);
  if (stack_.head != nullptr) stack_.head->ClearPendingLoss();
  return output;
}

absl::StatusOr<Tensor> CausalLm::ForwardImpl(const Tensor &tokens,
                                             const Stream &stream) {
  Tensor x = tokens;
  if (stack_.embedding != nullptr) {
    ZE_ASSIGN_OR_RETURN(x, stack_.embedding->Forward(tokens, stream));
  }
  if (stack_.blocks != nullptr) {
    ZE_ASSIGN_OR_RETURN(x, stack_.blocks->Forward(x, stream));  // (B, T, H)
  }
  if (last_position_only_ && x.size(1) > 1) {
    ZE_ASSIGN_OR_RETURN(x, LastPositions(x, stream));  // (B, 1, H)
  }
  if (stack_.final_norm != nullptr) {
    ZE_ASSIGN_OR_RETURN(x, stack_.final_norm->Forward(x, stream));
  }
  if (stack_.head != nullptr) {
    ZE_ASSIGN_OR_RETURN(x, stack_.head->Forward(x, stream));  // (B, T, V)
  }
  return x;
}

absl::StatusOr<Tensor> CausalLm::BackwardImpl(const Tensor &grad_output,
                                              const Stream &stream) {
  Tensor grad = grad_output;
  if (stack_.head != nullptr) {
    ZE_ASSIGN_OR_RETURN(grad, stack_.head->Backward(grad, stream));
  }
  if (stack_.final_norm != nullptr) {
    ZE_ASSIGN_OR_RETURN(grad, stack_.final_norm->Backward(grad, stream));
  }
  if (stack_.blocks != nullptr) {
    ZE_ASSIGN_OR_RETURN(grad, stack_.blocks->Backward(grad, stream));
  }
  if (stack_.embedding != nullptr) {
    return stack_.embedding->Backward(grad, stream);
  }
  return grad;  // (B, T, H): the previous stage's output gradient
}

absl::StatusOr<Tensor> CausalLm::ForwardLastPositions(const Tensor &tokens,
                                                      const Stream &stream) {
  last_position_only_ = true;
  absl::StatusOr<Tensor> logits;
  {
    NoSaveScope no_save;
    logits = Forward(tokens, stream);  // (N, 1, V); hooks fire
  }
  last_position_only_ = false;
  return logits;
}

absl::StatusOr<float> CausalLm::ForwardLoss(const Tensor &tokens,
                                            const Tensor &targets,
                                            const Stream &stream) {
  const std::string op = absl::StrCat(type_name_, "::ForwardLoss");
  ZE_RETURN_IF_ERROR(RequireWhole(op.c_str()));
  ZE_RETURN_IF_ERROR(
      MeanCrossEntropy::CheckTokensAndTargets(op.c_str(), tokens, targets));
  loss_.Clear();
  stack_.head->ComputeLossInNextForward(targets, loss_vocab_);
  absl::StatusOr<Tensor> losses = Forward(tokens, stream);  // (B, T) f32
  stack_.head->ClearPendingLoss();  // the forward may have failed before it
  ZE_RETURN_IF_ERROR(losses.status());
  return loss_.Forward(*losses, targets, stream);
}

absl::Status CausalLm::BackwardLoss(float loss_scale, const Stream &stream) {
  const std::string op = absl::StrCat(type_name_, "::BackwardLoss");
  ZE_RETURN_IF_ERROR(RequireWhole(op.c_str()));
  ZE_ASSIGN_OR_RETURN(Tensor grad_losses,
                      loss_.Backward(op.c_str(), loss_scale));
  return Backward(grad_losses, stream).status();
}

}  // namespace nn
}  // namespace ze
