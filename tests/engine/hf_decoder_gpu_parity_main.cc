// The decoders on the GPU in bf16 against transformers (issue 25): every
// fixture of nn/pretrained/testdata loaded onto CUDA from its directory
// (HuggingFaceDecoderSource) at ZeRO stage 0 and at stage 3 with CPU
// optimizer offload, bf16 weights with f32 master weights, at this
// program's world size (ranks may share the GPU over the MPI backend):
//   - the eval loss within bf16 tolerance of transformers' f32 loss (and
//     printed beside transformers' own bf16 loss, reference.json's
//     "bf16_cpu"),
//   - the first 8 greedy tokens of each prompt (KV cache) equal to
//     transformers' (f32 and bf16 agree on them: the fixture script chose
//     seeds whose top-two logit gaps there are at least 0.05), up to a
//     near tie: bf16 rounding alone moves these models' logits by up to
//     reference.json's bf16_cpu.max_logit_deviation_first_8 (about 0.1), so
//     at a position whose top-two gap is within twice that, our token may be
//     transformers' runner-up; the rest of that prompt continues from a
//     different token and is not compared. Any other difference fails.
//   - 20 AdamW steps' losses within bf16 tolerance of transformers' f32
//     losses (|ours - theirs| <= 0.02 + 0.05 |theirs|).
// Prints one line per (fixture, setting); exits 1 on any failure.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/factory.h"
#include "core/status.h"
#include "engine/engine.h"
#include "nn/decoder.h"
#include "nn/pretrained/hf_decoder_source.h"
#include "tests/engine/hf_fixtures.h"

namespace ze {
namespace enginetest {
namespace {

constexpr double kEvalTolerance = 1e-2;  // relative, bf16 weights and math

bool Close(double ours, double theirs) {
  return std::abs(ours - theirs) <= 0.02 + 0.05 * std::abs(theirs);
}

// Runs one (fixture, stage); returns the number of failed checks.
absl::StatusOr<int> Check(std::shared_ptr<comm::Communicator> comm,
                          const std::string& fixture, int stage) {
  const nlohmann::json reference = ReadHfReference(fixture);
  const nlohmann::json& train = reference["train"];
  const int64_t batch = static_cast<int64_t>(train["tokens"].size());
  const int world = comm->world_size();
  if (batch % world != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        fixture, ": ", batch, " rows do not split over ", world, " ranks"));
  }
  const int64_t rows = batch / world;
  ZE_ASSIGN_OR_RETURN(
      std::unique_ptr<nn::HuggingFaceDecoderSource> source,
      nn::HuggingFaceDecoderSource::Open(HfFixtureDir(fixture)));
  nn::DecoderOptions options;
  options.device = comm->device();
  options.dtype = DType::kBF16;
  options.materialize = false;
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<nn::DecoderModel> built,
                      nn::DecoderModel::Create(source->config(), options));
  std::shared_ptr<nn::DecoderModel> model(std::move(built));
  ZE_ASSIGN_OR_RETURN(
      std::unique_ptr<engine::Engine> engine,
      engine::Initialize(model,
                         HfTrainingConfig(train, batch, world, stage,
                                          /*offload_optimizer=*/stage == 3,
                                          /*offload_param=*/false,
                                          /*bf16=*/true),
                         comm));
  ZE_RETURN_IF_ERROR(engine->LoadWeights(*source).status());
  int failures = 0;

  const nlohmann::json& eval = reference["eval"];
  const int64_t eval_rows = static_cast<int64_t>(eval["tokens"].size());
  ZE_ASSIGN_OR_RETURN(
      float eval_loss,
      engine->EvalForward(TokenRows(eval["tokens"], 0, eval_rows),
                          TokenRows(eval["targets"], 0, eval_rows)));
  const double want_eval = eval["loss"].get<double>();
  const double eval_difference =
      std::abs(eval_loss - want_eval) / std::abs(want_eval);
  failures += eval_difference > kEvalTolerance;

  std::vector<std::vector<int32_t>> prompts;
  for (const nlohmann::json& prompt : reference["generate"]["prompts"]) {
    prompts.push_back(prompt["prompt"].get<std::vector<int32_t>>());
  }
  ZE_ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> generated,
                      engine->Generate(prompts, 8));
  const double near_tie =
      2.0 * reference["bf16_cpu"]["max_logit_deviation_first_8"].get<double>();
  int tokens_equal = 0;
  std::string flips;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const nlohmann::json& expected = reference["generate"]["prompts"][i];
    const std::vector<int32_t> want =
        expected["tokens"].get<std::vector<int32_t>>();
    const std::vector<int32_t> runner_up =
        expected["runner_up_first_8"].get<std::vector<int32_t>>();
    const std::vector<double> gaps =
        expected["logit_gaps_first_8"].get<std::vector<double>>();
    bool equal = true;
    for (size_t position = 0; position < 8; ++position) {
      const int32_t got = generated[i].at(position);
      if (got == want[position]) continue;
      equal = false;
      const bool flip_at_near_tie =
          got == runner_up[position] && gaps[position] <= near_tie;
      absl::StrAppend(
          &flips, flips.empty() ? "" : "; ", "prompt ", i, " position ",
          position, ": ", got, " for ", want[position], " (gap ",
          gaps[position],
          flip_at_near_tie ? ", near tie: accepted)" : ", not a near tie)");
      failures += !flip_at_near_tie;
      break;  // what follows continues from another token
    }
    tokens_equal += equal;
  }
  const std::vector<double> want = train["losses"].get<std::vector<double>>();
  double worst = 0;
  int losses_off = 0;
  for (size_t step = 0; step < want.size(); ++step) {
    ZE_ASSIGN_OR_RETURN(
        engine::StepReport report,
        engine->TrainBatch(
            {{TokenRows(train["tokens"], comm->rank() * rows, rows),
              TokenRows(train["targets"], comm->rank() * rows, rows)}}));
    worst = std::max(worst, std::abs(report.loss - want[step]));
    losses_off += !Close(report.loss, want[step]);
  }
  failures += losses_off;
  if (comm->rank() == 0) {
    std::printf(
        "%s, stage %d%s, %d ranks, bf16 on %s: eval loss %.5f (transformers "
        "f32 %.5f, bf16 %.5f; rel %.1e), first 8 tokens equal for %d/%zu "
        "prompts%s%s%s, 20 losses: largest |difference| %.4f, %d outside "
        "0.02 + 5%%%s\n",
        fixture.c_str(), stage, stage == 3 ? " + offload_optimizer" : "", world,
        comm->device().ToString().c_str(), eval_loss, want_eval,
        reference["bf16_cpu"]["eval_loss"].get<double>(), eval_difference,
        tokens_equal, prompts.size(), flips.empty() ? "" : " (", flips.c_str(),
        flips.empty() ? "" : ")", worst, losses_off,
        failures ? "  FAILED" : "");
    std::fflush(stdout);
  }
  return failures;
}

int Main() {
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
  for (const std::string& fixture : HfFixtureNames()) {
    for (int stage : {0, 3}) {
      absl::StatusOr<int> failed = Check(comm, fixture, stage);
      if (!failed.ok()) {
        std::fprintf(stderr, "rank %d: %s stage %d: %s\n", comm->rank(),
                     fixture.c_str(), stage,
                     failed.status().ToString().c_str());
        return 1;
      }
      failures += *failed;
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace enginetest
}  // namespace ze

int main() { return ze::enginetest::Main(); }
