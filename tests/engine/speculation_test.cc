// The speculative offloaded update (issue 27) through the public engine API:
// with offload_optimizer at stages 1-3 (cpu, and nvme at stage 3; at stage 3
// cpu also with offload_param cpu, the CPU writing the weights where they
// live), f32, bf16
// and fp16, gradient accumulation 1 and 3, training with speculation (the
// default) must give bit for bit the losses, norms, skips and final f32
// master weights of the synchronous exact update
// (offload_optimizer.speculation_buffer_size 0), under
//   - a gradient_clipping that some steps exceed and others do not (the
//     committed and the redone paths both taken where speculation runs),
//     and, in fp16, a first loss scale that overflows (the skipped step
//     rolls the speculation back);
//   - a tiny gradient_clipping that every step exceeds: each rank's own
//     gradients exceed it, so speculation stops early and no step commits.
// Where no update can begin during backward (NVMe) every step reports "not
// speculated".
//
// Run alone (world size 1) and under mpirun at 2 and 3 ranks (BUILD.bazel).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/communicator.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"
#include "zero/grad_clip.h"

namespace ze {
namespace enginetest {
namespace {

constexpr int kSteps = 6;
// How often a speculating run is repeated until the worker has been seen
// to speculate (it races backward and the boundary for the chunks: on a
// loaded machine at one rank it may lose every time; every attempt must
// match the exact update all the same). Whether speculation ran at all is
// checked over the whole suite (SpeculationSeen).
constexpr int kAttempts = 5;

// Over every case that ran: steps speculated (committed or redone) and
// steps where a rank's own norm stopped speculation. At the end (a global
// test environment's TearDown) both must be positive when a speculating
// case ran: else the parity checks never met a speculated step.
struct Seen {
  bool speculating_case_ran = false;
  int64_t speculated_steps = 0;
  bool tiny_case_ran = false;
  int64_t stopped_steps = 0;
};
Seen& SeenSoFar() {
  static Seen seen;
  return seen;
}
class SpeculationSeen : public ::testing::Environment {
 public:
  void TearDown() override {
    const Seen& seen = SeenSoFar();
    if (seen.speculating_case_ran) {
      EXPECT_GT(seen.speculated_steps, 0)
          << "rank " << Rank() << ": no step was speculated in any case";
    }
    if (seen.tiny_case_ran) {
      EXPECT_GT(seen.stopped_steps, 0)
          << "rank " << Rank() << ": no step stopped speculating on its "
          << "own norm in any case";
    }
  }
};
::testing::Environment* const kSpeculationSeen =
    ::testing::AddGlobalTestEnvironment(new SpeculationSeen);
// A gradient_clipping some steps exceed and others do not: the median of
// the norms of the same training without clipping (the norms depend on the
// world size: each rank adds a micro-batch).
double SomeClip(const std::vector<double>& unclipped_norms);
constexpr double kTinyClip = 1e-7;
struct Case {
  int stage;
  const char* device;  // offload_optimizer's: "cpu" or "nvme"
  const char* dtype;   // f32, bf16, fp16
  int accumulation;
  bool offload_param = false;  // stage 3's weights in host memory too
};

std::string Name(const Case& c) {
  return absl::StrCat("s", c.stage, "_", c.device, "_", c.dtype, "_a",
                      c.accumulation, c.offload_param ? "_param" : "");
}

// Where an update can begin during backward: host buckets (not NVMe).
bool Speculates(const Case& c) { return std::strcmp(c.device, "cpu") == 0; }

std::string NvmeDirectory() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string ConfigJson(const Case& c, double clipping, bool speculate) {
  std::string precision;
  if (std::strcmp(c.dtype, "bf16") == 0) {
    precision = R"("bf16": {"enabled": true},)";
  } else if (std::strcmp(c.dtype, "fp16") == 0) {
    // 2^24: the first step overflows and is skipped, the scale halves.
    precision =
        R"("fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 2, "hysteresis": 1},)";
  }
  const std::string device =
      std::strcmp(c.device, "nvme") == 0
          ? absl::StrCat(R"("device": "nvme", "nvme_path": ")", NvmeDirectory(),
                         R"(", "buffer_count": 2)")
          : R"("device": "cpu")";
  return absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": )",
      c.accumulation, R"(, "gradient_clipping": )", clipping, ",", precision,
      R"("optimizer": {"type": "AdamW", "params": {"lr": 0.01, "eps": 1e-3, "weight_decay": 0.01}},)",
      R"("scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 3}},)",
      R"("zero_optimization": {"stage": )", c.stage,
      // Several buckets, many chunks: the worker takes buckets as backward
      // finishes them and speculation stops mid-bucket.
      R"(, "reduce_bucket_size": 700, "sub_group_size": 100, "offload_optimizer": {)",
      device, speculate ? "" : R"(, "speculation_buffer_size": 0)", "}",
      c.offload_param ? R"(, "offload_param": {"device": "cpu"})" : "", "}}");
}

struct Training {
  std::vector<engine::StepReport> reports;
  std::vector<float> master;
  engine::Counters counters;
};

Training Train(const Case& c, double clipping, bool speculate) {
  Training run;
  absl::StatusOr<std::shared_ptr<nn::GptModel>> model = MakeGpt(
      SmallGpt(16, 1, 2), c.dtype == std::string("f32")    ? DType::kF32
                          : c.dtype == std::string("bf16") ? DType::kBF16
                                                           : DType::kF16);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return run;
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine =
      engine::Initialize(*model, ConfigJson(c, clipping, speculate), Comm());
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return run;
  for (int step = 0; step < kSteps; ++step) {
    absl::StatusOr<engine::StepReport> report = TrainStep(**engine, step);
    EXPECT_TRUE(report.ok()) << report.status();
    if (!report.ok()) return run;
    run.reports.push_back(*report);
  }
  absl::StatusOr<std::vector<float>> master = AllMasterWeights(**engine);
  EXPECT_TRUE(master.ok()) << master.status();
  if (master.ok()) run.master = *master;
  run.counters = (*engine)->counters();
  return run;
}

// Speculation changes when the update runs, never what it computes.
void ExpectSameTraining(const Training& speculated, const Training& exact,
                        const std::string& what) {
  ASSERT_EQ(speculated.reports.size(), exact.reports.size()) << what;
  for (size_t i = 0; i < exact.reports.size(); ++i) {
    // Bit for bit (a skipped step's NaN loss equals itself).
    EXPECT_EQ(std::memcmp(&speculated.reports[i].loss, &exact.reports[i].loss,
                          sizeof(double)),
              0)
        << what << " step " << i << ": loss " << speculated.reports[i].loss
        << " against " << exact.reports[i].loss;
    EXPECT_EQ(std::memcmp(&speculated.reports[i].grad_norm,
                          &exact.reports[i].grad_norm, sizeof(double)),
              0)
        << what << " step " << i << ": norm " << speculated.reports[i].grad_norm
        << " against " << exact.reports[i].grad_norm;
    EXPECT_EQ(speculated.reports[i].skipped, exact.reports[i].skipped)
        << what << " step " << i;
  }
  ASSERT_EQ(speculated.master.size(), exact.master.size()) << what;
  ASSERT_FALSE(exact.master.empty()) << what;
  EXPECT_EQ(std::memcmp(speculated.master.data(), exact.master.data(),
                        exact.master.size() * sizeof(float)),
            0)
      << what << ": the final master weights differ";
  // The synchronous update speculates nothing.
  EXPECT_EQ(exact.counters.speculation_committed, 0) << what;
  EXPECT_EQ(exact.counters.speculation_redone, 0) << what;
  EXPECT_EQ(exact.counters.speculation_not_speculated, kSteps) << what;
  const engine::Counters& k = speculated.counters;
  EXPECT_EQ(k.speculation_committed + k.speculation_redone +
                k.speculation_not_speculated,
            kSteps)
      << what;
}

double SomeClip(const std::vector<double>& unclipped_norms) {
  std::vector<double> finite;
  for (double norm : unclipped_norms) {
    if (std::isfinite(norm)) finite.push_back(norm);
  }
  std::sort(finite.begin(), finite.end());
  if (finite.size() < 2) return 1.0;
  // Between two norms, not at one: a step right at the limit clips by a
  // factor that may round to 1 in f32 (and then rightly commits).
  const size_t middle = finite.size() / 2;
  return (finite[middle - 1] + finite[middle]) / 2;
}

// Whether `value` holds on every rank (so that every rank repeats a run
// alike: the runs are collectives).
bool OnEveryRank(bool value) {
  float flag = value ? 1.0f : 0.0f;
  Tensor host = Tensor::Wrap(&flag, {1}, DType::kF32, Device::Cpu());
  absl::StatusOr<comm::Work> work =
      Comm()->AllReduce(host, host, comm::ReduceOp::kMin, Stream());
  EXPECT_TRUE(work.ok()) << work.status();
  if (work.ok()) EXPECT_TRUE(work->Wait().ok());
  return flag > 0;
}

// Whether the boundary's clip factor was 1 (ComputeGradClip's rule).
bool Unclipped(const engine::StepReport& report, double clipping) {
  return clipping / (report.grad_norm + zero::kClipEpsilon) >= 1.0;
}
// Near the limit the clip factor may be below 1 and still round to the
// unclipped f32 grad_scale: the speculation's arguments are then the
// step's, bit for bit, and commit. Either outcome is right there.
bool NearTheLimit(const engine::StepReport& report, double clipping) {
  return std::abs(report.grad_norm - clipping) <= 1e-5 * clipping;
}

// What each step's speculation became is consistent with its norm: only a
// step that clips nothing commits, only a clipped or skipped one is redone.
// (How much was speculated before the norm was known is a matter of timing:
// the worker takes buckets as backward hands them over.)
void ExpectOutcomesFitTheNorms(const Training& run, double clipping,
                               const std::string& what) {
  for (size_t i = 0; i < run.reports.size(); ++i) {
    const engine::StepReport& report = run.reports[i];
    if (report.speculation == zero::SpeculationOutcome::kCommitted) {
      EXPECT_TRUE(!report.skipped && (Unclipped(report, clipping) ||
                                      NearTheLimit(report, clipping)))
          << what << " step " << i << " committed with norm "
          << report.grad_norm;
      EXPECT_FALSE(report.speculation_stopped_by_norm) << what << " " << i;
    }
    if (report.speculation == zero::SpeculationOutcome::kRedone) {
      EXPECT_TRUE(report.skipped || !Unclipped(report, clipping) ||
                  NearTheLimit(report, clipping))
          << what << " step " << i << " redone with norm " << report.grad_norm;
    }
  }
}

class SpeculationTest : public ::testing::TestWithParam<Case> {};

TEST_P(SpeculationTest, SomeStepsClip) {
  const Case c = GetParam();
  std::vector<double> unclipped_norms;
  for (const engine::StepReport& report :
       Train(c, /*clipping=*/0.0, /*speculate=*/false).reports) {
    unclipped_norms.push_back(report.grad_norm);
  }
  const double clipping = SomeClip(unclipped_norms);
  const std::string what = absl::StrCat(Name(c), " clip ", clipping);
  const Training exact = Train(c, clipping, /*speculate=*/false);
  Training speculated;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    speculated = Train(c, clipping, /*speculate=*/true);
    ExpectSameTraining(speculated, exact, what);
    ExpectOutcomesFitTheNorms(speculated, clipping, what);
    if (OnEveryRank(!Speculates(c) ||
                    speculated.counters.speculation_committed +
                            speculated.counters.speculation_redone >
                        0)) {
      break;
    }
  }
  int clipped = 0, skipped = 0;
  std::string norms;
  for (const engine::StepReport& report : exact.reports) {
    skipped += report.skipped ? 1 : 0;
    clipped += !report.skipped && !Unclipped(report, clipping) ? 1 : 0;
    absl::StrAppend(&norms, " ", report.grad_norm);
  }
  const engine::Counters& k = speculated.counters;
  std::printf(
      "rank %d %s: norms%s; %d of %d steps clipped, %d skipped; speculation "
      "committed %lld, redone %lld, not speculated %lld\n",
      Rank(), what.c_str(), norms.c_str(), clipped, kSteps, skipped,
      static_cast<long long>(k.speculation_committed),
      static_cast<long long>(k.speculation_redone),
      static_cast<long long>(k.speculation_not_speculated));
  // The schedule is what the test is about: clipped and unclipped steps.
  EXPECT_GT(clipped, 0) << what;
  EXPECT_LT(clipped + skipped, kSteps) << what;
  if (c.dtype == std::string("fp16")) {
    EXPECT_GT(skipped, 0) << what << ": some loss scale must overflow";
  }
  if (!Speculates(c)) {
    EXPECT_EQ(k.speculation_not_speculated, kSteps) << what;
    return;
  }
  SeenSoFar().speculating_case_ran = true;
  SeenSoFar().speculated_steps +=
      k.speculation_committed + k.speculation_redone;
}

TEST_P(SpeculationTest, TinyClippingStopsSpeculationEarly) {
  const Case c = GetParam();
  const std::string what = absl::StrCat(Name(c), " clip ", kTinyClip);
  const Training exact = Train(c, kTinyClip, /*speculate=*/false);
  Training speculated;
  int stopped = 0;
  for (int attempt = 0; attempt < kAttempts && !OnEveryRank(stopped > 0);
       ++attempt) {
    speculated = Train(c, kTinyClip, /*speculate=*/true);
    ExpectSameTraining(speculated, exact, what);
    EXPECT_EQ(speculated.counters.speculation_committed, 0) << what;
    if (!Speculates(c)) return;
    ExpectOutcomesFitTheNorms(speculated, kTinyClip, what);
    // This rank's own gradients exceed the limit at its first chunk with a
    // nonzero gradient: the worker stops speculating there and waits for
    // the boundary (whenever it got to a chunk before the norm was known).
    for (const engine::StepReport& report : speculated.reports) {
      stopped += report.speculation_stopped_by_norm ? 1 : 0;
    }
  }
  std::printf(
      "rank %d %s: speculation stopped by the own norm in %d of %d "
      "steps; redone %lld, not speculated %lld\n",
      Rank(), what.c_str(), stopped, kSteps,
      static_cast<long long>(speculated.counters.speculation_redone),
      static_cast<long long>(speculated.counters.speculation_not_speculated));
  SeenSoFar().tiny_case_ran = true;
  SeenSoFar().stopped_steps += stopped;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (const char* dtype : {"f32", "bf16", "fp16"}) {
    for (int accumulation : {1, 3}) {
      for (int stage : {1, 2, 3}) {
        cases.push_back({stage, "cpu", dtype, accumulation});
      }
      cases.push_back({3, "cpu", dtype, accumulation, /*offload_param=*/true});
      cases.push_back({3, "nvme", dtype, accumulation});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Offload, SpeculationTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return Name(info.param);
                         });

}  // namespace
}  // namespace enginetest
}  // namespace ze

int main(int argc, char** argv) {
  return ze::enginetest::RunAllTests(argc, argv);
}
