// Gradient clipping by global norm, through the public engine API.
//
//   clipping_main run --out=DIR      (alone, or under mpirun -np 2 / 3)
//   clipping_main compare --dir=DIR --worlds=1,2,3
//
// `run` trains a small f32 GPT for kSteps steps with plain SGD (no momentum,
// no weight decay) and gradient_clipping 0.5 at ZeRO stages 0, 1 and 2, on a
// global batch of 6 samples split evenly over the ranks (the same samples
// at any world size). It checks, in-process, that clipping limits the
// update: the first update's norm is lr x 0.5 with clipping, lr x grad_norm
// (larger) without. Rank 0 writes each stage's StepReport::grad_norm
// sequence to DIR/norms_w<W>_s<stage>.txt.
//
// `compare` checks that every stage and world size reported the same norms
// as world size 1, stage 0: relative 1e-5. The only differences are the
// order of f32 sums (per rank, then across ranks) and, from step 2 on, the
// weights those rounding differences produced; measured 8e-8 on CPU.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "comm/factory.h"
#include "core/logging.h"
#include "core/status.h"
#include "tests/engine/engine_test_util.h"

namespace ze {
namespace enginetest {
namespace {

constexpr int kSteps = 4;
constexpr int kGlobalBatch = 6;
constexpr double kLr = 0.1;
constexpr double kMaxNorm = 0.5;
constexpr double kTolerance = 1e-5;

std::string Config(int stage, int micro, double clipping) {
  return absl::StrCat(R"({"train_batch_size": )", kGlobalBatch,
                      R"(, "train_micro_batch_size_per_gpu": )", micro,
                      R"(, "steps_per_print": 1000, "gradient_clipping": )",
                      clipping,
                      R"(, "optimizer": {"type": "SGD", "params": {"lr": )",
                      kLr, R"(}}, "zero_optimization": {"stage": )", stage,
                      R"(, "reduce_bucket_size": 500}})");
}

double Distance(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    sum += d * d;
  }
  return std::sqrt(sum);
}

// Trains kSteps steps (or 1 with clipping off); returns the grad norms and
// the first update's norm.
absl::Status Train(int stage, double clipping, std::vector<double>* norms,
                   double* first_update) {
  ZE_ASSIGN_OR_RETURN(std::shared_ptr<nn::GptModel> model,
                      MakeGpt(SmallGpt(), DType::kF32));
  ZE_ASSIGN_OR_RETURN(
      std::unique_ptr<engine::Engine> engine,
      engine::Initialize(model, Config(stage, kGlobalBatch / World(), clipping),
                         Comm()));
  const int steps = clipping > 0 ? kSteps : 1;
  for (int step = 0; step < steps; ++step) {
    ZE_ASSIGN_OR_RETURN(std::vector<float> before, AllMasterWeights(*engine));
    ZE_ASSIGN_OR_RETURN(engine::StepReport report, TrainStep(*engine, step));
    ZE_ASSIGN_OR_RETURN(std::vector<float> after, AllMasterWeights(*engine));
    norms->push_back(report.grad_norm);
    if (step == 0) *first_update = Distance(before, after);
  }
  return absl::OkStatus();
}

int Run(const std::string& out) {
  bool ok = true;
  for (int stage : {0, 1, 2}) {
    std::vector<double> norms, unclipped_norms;
    double clipped_update = 0, unclipped_update = 0;
    absl::Status status = Train(stage, kMaxNorm, &norms, &clipped_update);
    if (status.ok()) {
      status = Train(stage, 0.0, &unclipped_norms, &unclipped_update);
    }
    if (!status.ok()) {
      std::cerr << "rank " << Rank() << " stage " << stage << ": " << status
                << "\n";
      return 1;
    }
    // The test means something only if the first gradient is clipped.
    const bool clipped = norms[0] > 2 * kMaxNorm;
    const bool limited = std::abs(clipped_update / (kLr * kMaxNorm) - 1) < 1e-4;
    const bool free =
        std::abs(unclipped_update / (kLr * unclipped_norms[0]) - 1) < 1e-4;
    const bool same_norm =
        std::abs(unclipped_norms[0] / norms[0] - 1) < kTolerance;
    std::printf(
        "rank %d world %d stage %d: grad norm %.7g (max %.2g), first update "
        "%.7g clipped vs %.7g unclipped (lr x max = %.7g): %s\n",
        Rank(), World(), stage, norms[0], kMaxNorm, clipped_update,
        unclipped_update, kLr * kMaxNorm,
        clipped && limited && free && same_norm ? "ok" : "FAIL");
    ok = ok && clipped && limited && free && same_norm;
    if (Rank() == 0) {
      std::ofstream file(
          absl::StrCat(out, "/norms_w", World(), "_s", stage, ".txt"));
      file.precision(10);
      for (double norm : norms) file << norm << "\n";
      if (!file) {
        std::cerr << "cannot write " << out << "\n";
        return 1;
      }
    }
  }
  return ok ? 0 : 1;
}

absl::StatusOr<std::vector<double>> ReadNorms(const std::string& path) {
  std::ifstream file(path);
  if (!file) return absl::NotFoundError(absl::StrCat("missing ", path));
  std::vector<double> norms;
  double value;
  while (file >> value) norms.push_back(value);
  if (norms.size() != kSteps) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", norms.size(), " norms, expected ", kSteps));
  }
  return norms;
}

int Compare(const std::string& dir, const std::string& worlds) {
  absl::StatusOr<std::vector<double>> reference =
      ReadNorms(absl::StrCat(dir, "/norms_w1_s0.txt"));
  if (!reference.ok()) {
    std::cerr << reference.status() << "\n";
    return 1;
  }
  bool ok = true;
  double worst = 0;
  for (absl::string_view world : absl::StrSplit(worlds, ',')) {
    for (int stage : {0, 1, 2}) {
      absl::StatusOr<std::vector<double>> norms =
          ReadNorms(absl::StrCat(dir, "/norms_w", world, "_s", stage, ".txt"));
      if (!norms.ok()) {
        std::cerr << norms.status() << "\n";
        return 1;
      }
      for (int i = 0; i < kSteps; ++i) {
        const double error = std::abs((*norms)[i] / (*reference)[i] - 1);
        worst = std::max(worst, error);
        if (error > kTolerance) {
          ok = false;
          std::printf("FAIL world %s stage %d step %d: %.9g vs %.9g\n",
                      std::string(world).c_str(), stage, i, (*norms)[i],
                      (*reference)[i]);
        }
      }
    }
  }
  std::printf(
      "grad norms across worlds %s x stages 0-2: largest relative difference "
      "%.2e (tolerance %.0e): %s\n",
      worlds.c_str(), worst, kTolerance, ok ? "PASSED" : "FAILED");
  return ok ? 0 : 1;
}

std::string Flag(int argc, char** argv, const std::string& name,
                 const std::string& fallback) {
  const std::string prefix = "--" + name + "=";
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind(prefix, 0) == 0) return arg.substr(prefix.size());
  }
  return fallback;
}

}  // namespace
}  // namespace enginetest
}  // namespace ze

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "compare") {
    return ze::enginetest::Compare(
        ze::enginetest::Flag(argc, argv, "dir", "."),
        ze::enginetest::Flag(argc, argv, "worlds", "1,2,3"));
  }
  if (mode != "run") {
    std::cerr << "usage: clipping_main run --out=DIR | compare --dir=DIR "
                 "--worlds=1,2,3\n";
    return 2;
  }
  return ze::enginetest::RunWithCommunicator([&]() {
    return ze::enginetest::Run(ze::enginetest::Flag(argc, argv, "out", "."));
  });
}
