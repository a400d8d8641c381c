// Engine's inference entry points (DeepSpeed's ZeRO-Inference under stage
// 3): EvalForward and Generate (batched, KV-cached, greedy or sampled). See
// engine.h for the contracts.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops.h"
#include "core/status.h"
#include "engine/engine_impl.h"
#include "engine/sampling.h"
#include "nn/kv_cache.h"
#include "zero/plan.h"

namespace ze {
namespace engine {

absl::StatusOr<float> EngineImpl::EvalForward(const Tensor& inputs,
                                              const Tensor& targets) {
  StreamGuard guard(compute_stream_);
  ZE_RETURN_IF_ERROR(RequireNoPendingBackward("EvalForward"));
  if (!inputs.defined() || !targets.defined() || inputs.dim() < 1 ||
      targets.dim() < 1 || inputs.size(0) != targets.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "EvalForward on rank ", communicator_->rank(),
        ": inputs and targets must have the same number of rows (their "
        "first dimension), got ",
        inputs.defined() ? inputs.DebugString() : "undefined", " and ",
        targets.defined() ? targets.DebugString() : "undefined"));
  }
  ZE_ASSIGN_OR_RETURN(Tensor device_inputs, OnModelDevice(inputs));
  ZE_ASSIGN_OR_RETURN(Tensor device_targets, OnModelDevice(targets));
  float loss = 0;
  ZE_RETURN_IF_ERROR(RunEvaluation([&]() -> absl::Status {
    nn::NoSaveScope no_save;
    ZE_ASSIGN_OR_RETURN(loss, model_->ForwardLoss(device_inputs, device_targets,
                                                  compute_stream_));
    return absl::OkStatus();
  }));
  return loss;
}

absl::StatusOr<Tensor> EngineImpl::EvalOutputs(const Tensor& inputs) {
  StreamGuard guard(compute_stream_);
  ZE_RETURN_IF_ERROR(RequireNoPendingBackward("EvalOutputs"));
  ZE_ASSIGN_OR_RETURN(Tensor device_inputs, OnModelDevice(inputs));
  Tensor outputs;
  ZE_RETURN_IF_ERROR(RunEvaluation([&]() -> absl::Status {
    nn::NoSaveScope no_save;
    ZE_ASSIGN_OR_RETURN(outputs,
                        model_->Forward(device_inputs, compute_stream_));
    return absl::OkStatus();
  }));
  return outputs;
}

absl::Status EngineImpl::RunEvaluation(
    const std::function<absl::Status()>& forward) {
  ZE_RETURN_IF_ERROR(strategy_->BeginEval());
  const absl::Status status = forward();
  model_->ClearSavedState();
  const absl::Status end = strategy_->EndEval();
  ZE_RETURN_IF_ERROR(status);
  return end;
}

namespace {

// InvalidArgument naming the first bad argument of Generate.
absl::Status CheckGenerateArguments(
    const std::vector<std::vector<int32_t>>& prompts, int max_new_tokens,
    const GenerateOptions& options, int rank) {
  auto invalid = [rank](const std::string& message) {
    return absl::InvalidArgumentError(
        absl::StrCat("Generate on rank ", rank, ": ", message));
  };
  if (prompts.empty()) return invalid("prompts is empty (no prompt to extend)");
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) {
      return invalid(absl::StrCat("prompts[", i, "] is empty"));
    }
    for (size_t j = 0; j < prompts[i].size(); ++j) {
      const int32_t id = prompts[i][j];
      if (id < 0 || (options.vocab_size > 0 && id >= options.vocab_size)) {
        return invalid(absl::StrCat(
            "prompts[", i, "][", j, "] = ", id, " is not a token id",
            options.vocab_size > 0
                ? absl::StrCat(
                      " in [0, options.vocab_size = ", options.vocab_size, ")")
                : std::string(" (negative)")));
      }
    }
  }
  if (max_new_tokens < 0) {
    return invalid(
        absl::StrCat("max_new_tokens = ", max_new_tokens, " must be >= 0"));
  }
  if (!(options.temperature >= 0.0f) || std::isinf(options.temperature)) {
    return invalid(absl::StrCat("options.temperature = ", options.temperature,
                                " must be finite and >= 0 (0: greedy)"));
  }
  if (options.top_k < 0) {
    return invalid(absl::StrCat("options.top_k = ", options.top_k,
                                " must be >= 0 (0: off)"));
  }
  if (options.max_context < 0) {
    return invalid(absl::StrCat("options.max_context = ", options.max_context,
                                " must be >= 0 (0: the whole sequence)"));
  }
  if (options.vocab_size < 0) {
    return invalid(absl::StrCat("options.vocab_size = ", options.vocab_size,
                                " must be >= 0 (0: every column)"));
  }
  return absl::OkStatus();
}

// One Generate call: the rows' sequences, the tokens they produced, and the
// forwards that extend them (see Engine::Generate's contract).
class BatchGeneration {
 public:
  BatchGeneration(nn::LossModel& model, nn::IncrementalDecoder* decoder,
                  comm::Communicator& comm, const Stream& stream,
                  bool agree_on_stop,
                  const std::vector<std::vector<int32_t>>& prompts,
                  int max_new_tokens, const GenerateOptions& options)
      : model_(model),
        decoder_(decoder),
        comm_(comm),
        stream_(stream),
        agree_on_stop_(agree_on_stop),
        options_(options),
        max_new_tokens_(max_new_tokens),
        sequences_(prompts),
        generated_(prompts.size()),
        finished_(prompts.size(), false) {
    sampling_.temperature = options.temperature;
    sampling_.top_k = options.top_k;
    sampling_.seed = options.seed;
  }

  absl::Status Run() {
    const int64_t batch = static_cast<int64_t>(sequences_.size());
    int64_t longest = 0;
    for (const std::vector<int32_t>& prompt : sequences_) {
      longest = std::max<int64_t>(longest, prompt.size());
    }
    int64_t step = 0;
    if (decoder_ != nullptr && options_.use_cache && max_new_tokens_ > 0) {
      // The cache reproduces the recompute exactly while no window slides:
      // step s feeds every row whole while its length + s <= window, for
      // the longest row too.
      int64_t window = decoder_->max_positions();
      if (options_.max_context > 0) {
        window = std::min(window, options_.max_context);
      }
      const int64_t cached_steps =
          std::min<int64_t>(max_new_tokens_, window - longest + 1);
      if (cached_steps >= 1) {
        // Step s >= 1 writes position length + s - 1 of each row.
        ZE_ASSIGN_OR_RETURN(
            std::unique_ptr<nn::KvCache> cache,
            decoder_->NewKvCache(batch, longest + cached_steps - 1, stream_));
        ZE_RETURN_IF_ERROR(Prefill(*cache));
        for (step = 1; step < cached_steps; ++step) {
          ZE_ASSIGN_OR_RETURN(const bool done, AllFinished());
          if (done) return absl::OkStatus();
          ZE_RETURN_IF_ERROR(Decode(*cache, step));
        }
      }
    }
    for (; step < max_new_tokens_; ++step) {
      if (step > 0) {
        ZE_ASSIGN_OR_RETURN(const bool done, AllFinished());
        if (done) return absl::OkStatus();
      }
      ZE_RETURN_IF_ERROR(Recompute(step));
    }
    return absl::OkStatus();
  }

  std::vector<std::vector<int32_t>> TakeGenerated() {
    return std::move(generated_);
  }

 private:
  // (rows, t) i32 tokens on the model's device.
  absl::StatusOr<Tensor> DeviceTokens(const std::vector<int32_t>& values,
                                      int64_t rows, int64_t t) {
    ZE_ASSIGN_OR_RETURN(Tensor host,
                        Tensor::Empty({rows, t}, DType::kI32, Device::Cpu()));
    std::copy(values.begin(), values.end(), host.data_as<int32_t>());
    if (model_.device().is_cpu()) return host;
    ZE_ASSIGN_OR_RETURN(Tensor device,
                        Tensor::Empty({rows, t}, DType::kI32, model_.device()));
    ZE_RETURN_IF_ERROR(Copy(host, device, stream_));
    return device;
  }

  // Row `row`'s next token from its logits (`columns` of them) at `step`.
  void Append(int64_t row, const float* logits, int64_t columns, int64_t step) {
    if (finished_[row]) {
      // Keeps the row's shape in step with the batch; not returned.
      sequences_[row].push_back(*options_.stop_token);
      return;
    }
    const int64_t vocab = options_.vocab_size > 0
                              ? std::min(options_.vocab_size, columns)
                              : columns;
    const int32_t token = ChooseToken(logits, vocab, sampling_, row, step);
    sequences_[row].push_back(token);
    generated_[row].push_back(token);
    if (options_.stop_token.has_value() && token == *options_.stop_token) {
      finished_[row] = true;
    }
  }

  // logits (N, 1, V) of rows[i]: one read back for the group.
  absl::Status AppendAll(const Tensor& logits, const std::vector<int64_t>& rows,
                         int64_t step) {
    if (logits.dim() != 3 ||
        logits.size(0) != static_cast<int64_t>(rows.size()) ||
        logits.size(1) != 1) {
      return absl::InternalError(
          absl::StrCat("Generate on rank ", comm_.rank(),
                       ": the cached forward returned logits ",
                       logits.DebugString(), " for ", rows.size(), " rows"));
    }
    const int64_t columns = logits.size(2);
    ZE_ASSIGN_OR_RETURN(std::vector<float> host, ToHostFloats(logits, stream_));
    for (size_t i = 0; i < rows.size(); ++i) {
      Append(rows[i], host.data() + i * columns, columns, step);
    }
    return absl::OkStatus();
  }

  // Rows grouped by a length, shortest first (one forward per group).
  template <typename LengthOf>
  std::map<int64_t, std::vector<int64_t>> GroupRows(LengthOf length_of) const {
    std::map<int64_t, std::vector<int64_t>> groups;
    for (int64_t row = 0; row < static_cast<int64_t>(sequences_.size());
         ++row) {
      groups[length_of(row)].push_back(row);
    }
    return groups;
  }

  // Step 0 through the cache: each group of equal prompt length in one
  // forward that fills its rows' positions [0, length).
  absl::Status Prefill(nn::KvCache& cache) {
    const auto groups =
        GroupRows([this](int64_t row) { return sequences_[row].size(); });
    for (const auto& [length, rows] : groups) {
      std::vector<int32_t> values;
      for (int64_t row : rows) {
        values.insert(values.end(), sequences_[row].begin(),
                      sequences_[row].end());
      }
      ZE_ASSIGN_OR_RETURN(Tensor tokens,
                          DeviceTokens(values, rows.size(), length));
      ZE_ASSIGN_OR_RETURN(
          Tensor logits,  // (N, 1, V)
          decoder_->ForwardCached(tokens, rows, cache, stream_));
      ZE_RETURN_IF_ERROR(AppendAll(logits, rows, 0));
    }
    return absl::OkStatus();
  }

  // Step `step` through the cache: every row's last token, (B, 1), each at
  // its own position.
  absl::Status Decode(nn::KvCache& cache, int64_t step) {
    std::vector<int32_t> values;
    std::vector<int64_t> rows;
    for (int64_t row = 0; row < static_cast<int64_t>(sequences_.size());
         ++row) {
      values.push_back(sequences_[row].back());
      rows.push_back(row);
    }
    ZE_ASSIGN_OR_RETURN(Tensor tokens, DeviceTokens(values, rows.size(), 1));
    ZE_ASSIGN_OR_RETURN(Tensor logits,
                        decoder_->ForwardCached(tokens, rows, cache, stream_));
    return AppendAll(logits, rows, step);
  }

  // Step `step` without a cache: each row's window (its last max_context
  // tokens) through the model's Forward, rows of equal window together.
  absl::Status Recompute(int64_t step) {
    auto window_of = [this](int64_t row) -> int64_t {
      const int64_t length = sequences_[row].size();
      return options_.max_context > 0 ? std::min(length, options_.max_context)
                                      : length;
    };
    for (const auto& [t, rows] : GroupRows(window_of)) {
      std::vector<int32_t> values;
      for (int64_t row : rows) {
        values.insert(values.end(), sequences_[row].end() - t,
                      sequences_[row].end());
      }
      const int64_t n = static_cast<int64_t>(rows.size());
      ZE_ASSIGN_OR_RETURN(Tensor tokens, DeviceTokens(values, n, t));
      absl::StatusOr<Tensor> logits;
      {
        nn::NoSaveScope no_save;
        logits = model_.Forward(tokens, stream_);  // (n, t, V)
      }
      ZE_RETURN_IF_ERROR(logits.status());
      if (logits->dim() != 3 || logits->size(0) != n || logits->size(1) != t) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Generate on rank ", comm_.rank(),
            ": the model's Forward must return logits (", n, ", ", t,
            ", V) for tokens (", n, ", ", t, "), got ", logits->DebugString()));
      }
      const int64_t columns = logits->size(2);
      for (int64_t i = 0; i < n; ++i) {
        ZE_ASSIGN_OR_RETURN(
            std::vector<float> last,
            ToHostFloats(
                logits->Flat().Slice(((i + 1) * t - 1) * columns, columns),
                stream_));
        Append(rows[i], last.data(), columns, step);
      }
    }
    return absl::OkStatus();
  }

  // Whether every row has met the stop token; under stage 3 (several
  // ranks), whether every rank's have, so that all ranks stop at the same
  // step and their forwards (collectives) stay in step.
  absl::StatusOr<bool> AllFinished() {
    if (!options_.stop_token.has_value()) return false;
    const bool local = std::all_of(finished_.begin(), finished_.end(),
                                   [](bool f) { return f; });
    if (!agree_on_stop_ || comm_.world_size() == 1) return local;
    ZE_ASSIGN_OR_RETURN(
        Tensor flag, Tensor::Zeros({1}, DType::kF32, comm_.device(), stream_));
    ZE_RETURN_IF_ERROR(Fill(flag, local ? 0.0f : 1.0f, stream_));
    ZE_ASSIGN_OR_RETURN(
        comm::Work work,
        comm_.AllReduce(flag, flag, comm::ReduceOp::kMax, stream_));
    ZE_RETURN_IF_ERROR(work.Wait());
    ZE_ASSIGN_OR_RETURN(std::vector<float> unfinished,
                        ToHostFloats(flag, stream_));
    return unfinished[0] == 0.0f;
  }

  nn::LossModel& model_;
  nn::IncrementalDecoder* decoder_;  // null: recompute only
  comm::Communicator& comm_;
  const Stream& stream_;
  const bool agree_on_stop_;
  const GenerateOptions& options_;
  const int max_new_tokens_;
  SamplingParams sampling_;
  std::vector<std::vector<int32_t>> sequences_;  // prompt + new tokens
  std::vector<std::vector<int32_t>> generated_;  // new tokens, to return
  std::vector<bool> finished_;                   // met the stop token
};

}  // namespace

absl::StatusOr<std::vector<std::vector<int32_t>>> EngineImpl::Generate(
    const std::vector<std::vector<int32_t>>& prompts, int max_new_tokens,
    const GenerateOptions& options) {
  StreamGuard guard(compute_stream_);
  ZE_RETURN_IF_ERROR(CheckGenerateArguments(prompts, max_new_tokens, options,
                                            communicator_->rank()));
  ZE_RETURN_IF_ERROR(RequireNoPendingBackward("Generate"));
  BatchGeneration generation(
      *model_, dynamic_cast<nn::IncrementalDecoder*>(model_.get()),
      *communicator_, compute_stream_,
      // Partitioned parameters are gathered collectively in every forward,
      // so ranks must stop together.
      /*agree_on_stop=*/
      zero::PolicyOf(config_).partition_parameters, prompts, max_new_tokens,
      options);
  ZE_RETURN_IF_ERROR(RunEvaluation([&] { return generation.Run(); }));
  return generation.TakeGenerated();
}

absl::StatusOr<std::vector<int32_t>> Engine::Generate(
    const std::vector<int32_t>& prompt_tokens, int max_new_tokens,
    const GenerateOptions& options) {
  ZE_ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> generated,
                      Generate(std::vector<std::vector<int32_t>>{prompt_tokens},
                               max_new_tokens, options));
  return std::move(generated.front());
}

}  // namespace engine
}  // namespace ze
