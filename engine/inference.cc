// Engine's inference entry points (DeepSpeed's ZeRO-Inference under stage
// 3): EvalForward and greedy Generate. See engine.h for the contracts.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops.h"
#include "core/status.h"
#include "engine/engine.h"

namespace ze {
namespace engine {

absl::StatusOr<float> Engine::EvalForward(const Tensor& tokens,
                                          const Tensor& targets) {
  StreamGuard guard(compute_stream_);
  ZE_RETURN_IF_ERROR(RequireNoPendingBackward("EvalForward"));
  if (tokens.dim() != 2 || targets.shape() != tokens.shape() ||
      tokens.dtype() != DType::kI32 || targets.dtype() != DType::kI32) {
    return absl::InvalidArgumentError(
        absl::StrCat("EvalForward on rank ", communicator_->rank(),
                     ": tokens and targets must both be (B, T) i32, got ",
                     tokens.DebugString(), " and ", targets.DebugString()));
  }
  ZE_ASSIGN_OR_RETURN(Tensor device_tokens, OnModelDevice(tokens));
  ZE_ASSIGN_OR_RETURN(Tensor device_targets, OnModelDevice(targets));
  ZE_RETURN_IF_ERROR(strategy_->BeginEval());
  absl::StatusOr<float> loss;
  {
    nn::NoSaveScope no_save;
    loss = model_->ForwardLoss(device_tokens, device_targets, compute_stream_);
  }
  // What the loss keeps for a backward (e.g. GPT's logits) must not be
  // mistaken for a training forward's.
  model_->ClearSavedState();
  const absl::Status end = strategy_->EndEval();
  ZE_RETURN_IF_ERROR(loss.status());
  ZE_RETURN_IF_ERROR(end);
  return *loss;
}

absl::StatusOr<std::vector<int32_t>> Engine::Generate(
    const std::vector<int32_t>& prompt_tokens, int max_new_tokens,
    const GenerateOptions& options) {
  StreamGuard guard(compute_stream_);
  const int rank = communicator_->rank();
  if (prompt_tokens.empty() || max_new_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Generate on rank ", rank, ": needs a non-empty prompt (got ",
        prompt_tokens.size(), " tokens) and max_new_tokens >= 0 (got ",
        max_new_tokens, ")"));
  }
  ZE_RETURN_IF_ERROR(RequireNoPendingBackward("Generate"));
  ZE_RETURN_IF_ERROR(strategy_->BeginEval());
  std::vector<int32_t> sequence = prompt_tokens;
  std::vector<int32_t> generated;
  auto decode = [&]() -> absl::Status {
    for (int i = 0; i < max_new_tokens; ++i) {
      const int64_t length = static_cast<int64_t>(sequence.size());
      const int64_t first =
          options.max_context > 0
              ? std::max<int64_t>(0, length - options.max_context)
              : 0;
      const int64_t t = length - first;
      ZE_ASSIGN_OR_RETURN(Tensor host,
                          Tensor::Empty({1, t}, DType::kI32, Device::Cpu()));
      std::copy(sequence.begin() + first, sequence.end(),
                host.data_as<int32_t>());
      ZE_ASSIGN_OR_RETURN(Tensor tokens, OnModelDevice(host));
      absl::StatusOr<Tensor> logits;
      {
        nn::NoSaveScope no_save;
        logits = model_->Forward(tokens, compute_stream_);  // (1, t, V)
      }
      ZE_RETURN_IF_ERROR(logits.status());
      if (logits->dim() != 3 || logits->size(0) != 1 || logits->size(1) != t) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Generate on rank ", rank,
            ": the model's Forward must return logits (1, ", t,
            ", V) for tokens (1, ", t, "), got ", logits->DebugString()));
      }
      const int64_t columns = logits->size(2);
      const int64_t vocab = options.vocab_size > 0
                                ? std::min(options.vocab_size, columns)
                                : columns;
      ZE_ASSIGN_OR_RETURN(
          std::vector<float> last,
          ToHostFloats(logits->Flat().Slice((t - 1) * columns, vocab),
                       compute_stream_));
      // The first maximum: every rank holds the same logits and picks the
      // same token, so the next step's collectives stay in step.
      const int32_t next = static_cast<int32_t>(
          std::max_element(last.begin(), last.end()) - last.begin());
      sequence.push_back(next);
      generated.push_back(next);
    }
    return absl::OkStatus();
  };
  const absl::Status status = decode();
  model_->ClearSavedState();
  const absl::Status end = strategy_->EndEval();
  ZE_RETURN_IF_ERROR(status);
  ZE_RETURN_IF_ERROR(end);
  return generated;
}

}  // namespace engine
}  // namespace ze
