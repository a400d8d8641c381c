// ZeRO-3 inference on CUDA (tag gpu): alone, or under mpirun with ranks
// sharing the GPU (MPI backend staging through pinned memory). A small GPT
// is trained a few steps at stage 0 and at stage 3 (f32 and bf16), then
// EvalForward and Generate must agree: identical tokens, losses within
// 1e-4 (f32) or 2e-2 (bf16) relative. Also reports the stage-3 all-gather
// wait time the CUDA timing events measured. Exit status 0 on success.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/factory.h"
#include "core/status.h"
#include "engine/engine.h"
#include "nn/gpt.h"
#include "tests/engine/engine_test_util.h"

namespace ze {
namespace enginetest {
namespace {

struct Result {
  float eval_loss = 0;
  std::vector<int32_t> tokens;
  double wait_ms = 0;
};

absl::StatusOr<Result> TrainThenInfer(
    const std::shared_ptr<comm::Communicator>& comm, int stage,
    const std::string& dtype) {
  nn::GptOptions options;
  options.device = comm->device();
  options.dtype = dtype == "bf16" ? DType::kBF16 : DType::kF32;
  options.seed = 1234;
  options.materialize = false;
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptModel> created,
                      nn::GptModel::Create(SmallGpt(32, 2, 2), options));
  std::shared_ptr<nn::GptModel> model = std::move(created);
  const std::string config = absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": )", 12 / comm->world_size(),
      R"(, "gradient_accumulation_steps": 1, "steps_per_print": 1000,)",
      dtype == "bf16" ? R"("bf16": {"enabled": true},)" : "",
      R"("optimizer": {"type": "AdamW", "params": {"lr": 0.01}},)",
      R"("zero_optimization": {"stage": )", stage,
      R"(, "stage3_param_persistence_threshold": 0}})");
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine,
                      engine::Initialize(model, config, comm));
  Result result;
  for (int step = 0; step < 10; ++step) {
    ZE_RETURN_IF_ERROR(TrainStep(*engine, step).status());
    result.wait_ms += engine->communication_counters().wait_ms;
  }
  std::vector<int32_t> tokens(3 * kSeqLen), targets(3 * kSeqLen);
  for (int i = 0; i < 3; ++i) {
    FillSample(5000 + i, &tokens[i * kSeqLen], &targets[i * kSeqLen]);
  }
  ZE_ASSIGN_OR_RETURN(
      result.eval_loss,
      engine->EvalForward(
          Tensor::Wrap(tokens.data(), {3, kSeqLen}, DType::kI32, Device::Cpu()),
          Tensor::Wrap(targets.data(), {3, kSeqLen}, DType::kI32,
                       Device::Cpu())));
  engine::GenerateOptions generate;
  generate.max_context = kSeqLen;
  generate.vocab_size = kVocab;
  ZE_ASSIGN_OR_RETURN(result.tokens,
                      engine->Generate({3, 18, 19}, 12, generate));
  return result;
}

int Main(int argc, char** argv) {
  (void)argc;
  (void)argv;
  comm::CommOptions options;
  options.device = "cuda";
  options.backend = "mpi";
  absl::StatusOr<std::unique_ptr<comm::Communicator>> created =
      comm::CreateCommunicator(options);
  if (!created.ok()) {
    std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
    return 1;
  }
  std::shared_ptr<comm::Communicator> comm = std::move(*created);
  int failures = 0;
  for (const char* dtype : {"f32", "bf16"}) {
    absl::StatusOr<Result> reference = TrainThenInfer(comm, 0, dtype);
    absl::StatusOr<Result> stage3 = TrainThenInfer(comm, 3, dtype);
    if (!reference.ok() || !stage3.ok()) {
      std::fprintf(stderr, "rank %d %s: %s %s\n", comm->rank(), dtype,
                   reference.status().ToString().c_str(),
                   stage3.status().ToString().c_str());
      return 1;
    }
    const double tolerance = std::string(dtype) == "f32" ? 1e-4 : 2e-2;
    const double difference =
        std::abs(stage3->eval_loss - reference->eval_loss) /
        std::max(1.0f, reference->eval_loss);
    const bool same_tokens = stage3->tokens == reference->tokens;
    std::printf(
        "rank %d world %d %s: eval loss stage 0 %.6f stage 3 %.6f (rel %.1e), "
        "tokens %s, stage 3 all-gather wait %.3f ms over 10 steps\n",
        comm->rank(), comm->world_size(), dtype, reference->eval_loss,
        stage3->eval_loss, difference, same_tokens ? "identical" : "DIFFER",
        stage3->wait_ms);
    // bf16 argmax may flip on a near tie; f32 must not.
    if (difference > tolerance ||
        (!same_tokens && std::string(dtype) == "f32")) {
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace enginetest
}  // namespace ze

int main(int argc, char** argv) { return ze::enginetest::Main(argc, argv); }
