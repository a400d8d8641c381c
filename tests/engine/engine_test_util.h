// Shared pieces of the engine tests that run as gtest programs, alone (world
// size 1) or under mpirun (every rank runs the same cases on one
// communicator).
#ifndef ZE_TESTS_ENGINE_ENGINE_TEST_UTIL_H_
#define ZE_TESTS_ENGINE_ENGINE_TEST_UTIL_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "core/dtype.h"
#include "engine/engine.h"
#include "nn/gpt.h"

namespace ze {
namespace enginetest {

// The process's communicator (CPU; set up by RunAllTests before any test).
std::shared_ptr<comm::Communicator> Comm();
inline int Rank() { return Comm()->rank(); }
inline int World() { return Comm()->world_size(); }

// Parses gtest flags, bootstraps the communicator from mpirun's environment
// (world size 1 without a launcher), runs every test and returns the exit
// status for main. Any rank's failure makes that rank exit non-zero, which
// mpirun reports as the job's failure.
int RunAllTests(int argc, char** argv);

// Bootstraps the communicator as RunAllTests does, then returns body()'s
// exit status (1 when the communicator cannot be created). For programs that
// are not gtest suites.
int RunWithCommunicator(const std::function<int()>& body);

// A GPT small enough to train in milliseconds on a CPU.
//   vocab 37, sequence kSeqLen, channels / layers / heads as given.
constexpr int kSeqLen = 8;
constexpr int kVocab = 37;
nn::GptConfig SmallGpt(int64_t channels = 16, int layers = 2, int heads = 2);

// Builds `config` on the CPU in `dtype`. With `materialize` false the
// parameters have no storage until engine::Initialize creates it.
absl::StatusOr<std::shared_ptr<nn::GptModel>> MakeGpt(
    const nn::GptConfig& config, DType dtype, bool materialize = true);

// Global sample g of a deterministic corpus whose next token is mostly
// predictable (the loss falls within a few steps). tokens/targets hold
// kSeqLen entries each.
void FillSample(int64_t g, int32_t* tokens, int32_t* targets);

// One optimizer step of `engine`: gradient_accumulation_steps micro-batches
// of train_micro_batch_size_per_gpu samples each. Rank r's micro-batch m of
// step s holds global samples ((s*A + m)*W + r)*B + i, so any world size and
// micro/accumulation split of the same train_batch_size sees the same data.
absl::StatusOr<engine::StepReport> TrainStep(engine::Engine& engine,
                                             int64_t step);

// Every trainable parameter's f32 master weights, concatenated in the
// engine's layout order (a collective: every rank calls it).
absl::StatusOr<std::vector<float>> AllMasterWeights(engine::Engine& engine);

// A training's record for bit-for-bit comparisons: every step's loss, the
// f32 master weights (AllMasterWeights) and EvalOutputs' bytes for two
// fixed samples (the 16-bit weights the forward gathers).
struct BitwiseRun {
  std::vector<double> losses;
  std::vector<float> master;
  std::vector<uint8_t> logits;
};

// EvalOutputs' bytes for global samples `first_sample` and the next (a
// collective at stage 3: every rank calls it); empty after a failure, which
// is reported (EXPECT).
std::vector<uint8_t> EvalLogitBytes(engine::Engine& engine,
                                    int64_t first_sample);

// Trains steps [first, end) with TrainStep, appending their losses to
// run.losses, then records the master weights and EvalLogitBytes(engine,
// logits_sample) (ASSERTs on failures; collectives: every rank calls it).
void TrainRecording(engine::Engine& engine, int first, int end,
                    int64_t logits_sample, BitwiseRun& run);

// Losses, master weights and logits equal bit for bit (EXPECT), `what`
// naming the run in messages.
void ExpectBitIdentical(const BitwiseRun& run, const BitwiseRun& reference,
                        const std::string& what);

// Compares a run's per-step losses and final f32 master weights (by
// parameter name) with a reference run's: both largest relative differences,
// |a - b| / max(1, |b|), must be within `tolerance` (EXPECT), and are printed
// with this rank. Sizes and names must match (ASSERT).
void ExpectRunsClose(
    const std::vector<double>& losses,
    const std::map<std::string, std::vector<float>>& weights,
    const std::vector<double>& reference_losses,
    const std::map<std::string, std::vector<float>>& reference_weights,
    double tolerance);

// The allocator-cap scenario of the memory tests: on the host allocator,
// measures what engines of stage 0 and of `fitting_stage` need (uncapped,
// memory_breakdown().total_bytes()), then caps the allocator at what is in
// use plus cap_of(stage-0 need, fitting-stage need) and checks (gtest
// EXPECT/ASSERT, returning on the first fatal failure) that
//   - stage 0's Initialize fails with ResourceExhausted naming its need,
//     and what that attempt allocated is back;
//   - `fitting_stage` trains 4 steps with a falling loss and a peak within
//     the cap.
// The cap is cleared however it ends. `model` builds the (unmaterialised)
// model, `config(stage)` the JSON config. Prints the figures with the rank.
void ExpectOnlyFittingStageTrainsUnderCap(
    int fitting_stage, const nn::GptConfig& model,
    const std::function<std::string(int stage)>& config,
    const std::function<int64_t(int64_t need_stage0, int64_t need_fitting)>&
        cap_of);

// Redirects this process's stderr (file descriptor 2, which the logger
// writes) into a temporary file while alive; Finish restores it and returns
// what was written. Not thread-safe; one at a time.
class StderrCapture {
 public:
  StderrCapture();
  ~StderrCapture();
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;
  // Restores stderr and returns the captured text (echoed to the real stderr
  // too, so test logs keep it). Only the first call captures.
  std::string Finish();

 private:
  int saved_fd_ = -1;
  std::FILE* file_ = nullptr;
};

}  // namespace enginetest
}  // namespace ze

#endif  // ZE_TESTS_ENGINE_ENGINE_TEST_UTIL_H_
