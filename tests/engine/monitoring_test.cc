// Monitoring keys through the public engine API, alone and at 2 ranks:
//   - csv_monitor writes DeepSpeed's files on rank 0 only: one per metric
//     (Train_Samples_train_loss.csv, ...lr.csv, ...loss_scale.csv under fp16,
//     the elapsed_time_ms files under wall_clock_breakdown), a "step,<name>"
//     header, one row per optimizer step keyed by the global sample count,
//     the values the steps returned;
//   - wall_clock_breakdown and memory_breakdown add their lines to the
//     steps_per_print log on rank 0;
//   - a write that fails mid-run is logged once and training goes on;
//   - a csv_monitor directory that cannot be created fails Initialize on
//     every rank (rank 0 names the directory), instead of leaving the other
//     ranks waiting.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"

namespace ze {
namespace enginetest {
namespace {

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

// Every rank must use the same directory (only rank 0 writes it), and
// separate test runs must not share one.
std::string RunDirectory(const std::string& name) {
  return absl::StrCat(TempDir(), "/monitoring_", name, "_w", World());
}

std::string Config(const std::string& dtype_section,
                   const std::string& monitoring) {
  return absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,)",
      R"("steps_per_print": 1, "gradient_clipping": 1.0,)", dtype_section,
      R"("optimizer": {"type": "AdamW", "params": {"lr": 0.01}},)",
      R"("scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4}},)",
      monitoring, R"("zero_optimization": {"stage": 2}})");
}

// The csv_monitor section (with a trailing comma), job name "job".
std::string CsvMonitorKeys(const std::string& output_path) {
  return absl::StrCat(R"("csv_monitor": {"enabled": true, "output_path": ")",
                      output_path, R"(", "job_name": "job"},)");
}

absl::StatusOr<std::shared_ptr<nn::LossModel>> MakeModel(DType dtype) {
  ZE_ASSIGN_OR_RETURN(std::shared_ptr<nn::GptModel> model,
                      MakeGpt(SmallGpt(), dtype));
  return std::shared_ptr<nn::LossModel>(model);
}

// The rows of a CSV file, split at commas; empty when it does not exist.
std::vector<std::vector<std::string>> ReadCsv(const std::string& path) {
  std::vector<std::vector<std::string>> rows;
  std::ifstream file(path);
  std::string line;
  while (std::getline(file, line)) {
    rows.push_back(absl::StrSplit(line, ','));
  }
  return rows;
}

struct Expected {
  std::vector<int64_t> samples;
  std::vector<double> values;
};

void ExpectCsv(const std::string& path, const std::string& header,
               const Expected& expected) {
  SCOPED_TRACE(path);
  const std::vector<std::vector<std::string>> rows = ReadCsv(path);
  ASSERT_EQ(rows.size(), expected.samples.size() + 1);
  EXPECT_EQ(rows[0], (std::vector<std::string>{"step", header}));
  for (size_t i = 0; i < expected.samples.size(); ++i) {
    ASSERT_EQ(rows[i + 1].size(), 2u) << "row " << i + 1;
    EXPECT_EQ(rows[i + 1][0], std::to_string(expected.samples[i]));
    if (!expected.values.empty()) {
      const double value = std::strtod(rows[i + 1][1].c_str(), nullptr);
      EXPECT_NEAR(value, expected.values[i],
                  1e-7 * std::max(1.0, std::abs(expected.values[i])))
          << "row " << i + 1;
    }
  }
}

TEST(CsvMonitorTest, WritesDeepSpeedFilesOnRankZero) {
  for (const bool fp16 : {false, true}) {
    SCOPED_TRACE(fp16 ? "fp16" : "f32");
    const std::string directory = RunDirectory(fp16 ? "csv_fp16" : "csv_f32");
    const std::string monitoring = absl::StrCat(
        R"("wall_clock_breakdown": true,)", CsvMonitorKeys(directory));
    absl::StatusOr<std::shared_ptr<nn::LossModel>> model =
        MakeModel(fp16 ? DType::kF16 : DType::kF32);
    ASSERT_TRUE(model.ok()) << model.status();
    absl::StatusOr<std::unique_ptr<engine::Engine>> engine = engine::Initialize(
        *model,
        Config(fp16 ? R"("fp16": {"enabled": true, "initial_scale_power": 8},)"
                    : "",
               monitoring),
        Comm());
    ASSERT_TRUE(engine.ok()) << engine.status();
    constexpr int kSteps = 3;
    Expected loss, lr, scale, times;
    for (int step = 0; step < kSteps; ++step) {
      absl::StatusOr<engine::StepReport> report = TrainStep(**engine, step);
      ASSERT_TRUE(report.ok()) << report.status();
      // 2 micro-steps of 2 samples on every rank.
      const int64_t samples = int64_t{4} * World() * (step + 1);
      for (Expected* e : {&loss, &lr, &scale, &times}) {
        e->samples.push_back(samples);
      }
      loss.values.push_back(report->loss);
      lr.values.push_back(report->learning_rate);
      scale.values.push_back(report->loss_scale);
    }
    // Rank 0 wrote every row before its last Step returned; the barrier
    // makes sure it has before another rank looks.
    ASSERT_TRUE(Comm()->Barrier().ok());
    const std::string job = directory + "/job/";
    ExpectCsv(job + "Train_Samples_train_loss.csv", "train_loss", loss);
    ExpectCsv(job + "Train_Samples_lr.csv", "lr", lr);
    if (fp16) {
      ExpectCsv(job + "Train_Samples_loss_scale.csv", "loss_scale", scale);
    } else {
      EXPECT_FALSE(std::ifstream(job + "Train_Samples_loss_scale.csv"))
          << "loss_scale is written under fp16 only";
    }
    for (const char* name :
         {"tokens_per_second", "memory_allocated_bytes", "memory_peak_bytes"}) {
      const auto rows =
          ReadCsv(job + "Train_Samples_" + std::string(name) + ".csv");
      ASSERT_EQ(rows.size(), loss.values.size() + 1) << name;  // + header
      for (const auto& row : rows) {
        if (row[0] == "step") continue;
        EXPECT_GT(std::strtod(row[1].c_str(), nullptr), 0.0) << name;
      }
    }
    for (const char* phase : {"forward", "backward", "step", "communication"}) {
      const std::string name = absl::StrCat("elapsed_time_ms_", phase);
      ExpectCsv(job + "Train_Samples_" + name + ".csv", name, times);
      for (const auto& row : ReadCsv(job + "Train_Samples_" + name + ".csv")) {
        if (row[0] == "step") continue;
        const double ms = std::strtod(row[1].c_str(), nullptr);
        EXPECT_GE(ms, 0.0) << name;
        // Several ranks reduce gradients every step: time spent in the
        // collectives (on the host for the CPU's mpi backend).
        if (std::string(phase) == "communication" && World() > 1) {
          EXPECT_GT(ms, 0.0) << name;
        }
      }
    }
    ASSERT_TRUE(Comm()->Barrier().ok());  // before the next run's files
  }
}

TEST(CsvMonitorTest, BreakdownLinesJoinTheStepLog) {
  const std::string monitoring =
      R"("wall_clock_breakdown": true, "memory_breakdown": true,)";
  absl::StatusOr<std::shared_ptr<nn::LossModel>> model = MakeModel(DType::kF32);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine =
      engine::Initialize(*model, Config("", monitoring), Comm());
  ASSERT_TRUE(engine.ok()) << engine.status();
  StderrCapture capture;
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(TrainStep(**engine, step).ok());
  }
  const std::string log = capture.Finish();
  if (Rank() != 0) return;
  for (const char* expected :
       {"step 2 loss", "time (ms) | forward: ", " | backward: ", " | step: ",
        " | communication: ", "memory (GiB, host) | after forward: ",
        "| peak since last print: "}) {
    EXPECT_NE(log.find(expected), std::string::npos)
        << "missing '" << expected << "' in:\n"
        << log;
  }
}

// A write that fails mid-run (here the directory is removed) must not fail
// the step on rank 0 alone, which would leave the other ranks waiting in the
// next collective: it is logged and monitoring stops.
TEST(CsvMonitorTest, FailedWriteIsLoggedAndTrainingGoesOn) {
  const std::string directory = RunDirectory("removed");
  const std::string monitoring = CsvMonitorKeys(directory);
  absl::StatusOr<std::shared_ptr<nn::LossModel>> model = MakeModel(DType::kF32);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine =
      engine::Initialize(*model, Config("", monitoring), Comm());
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE(TrainStep(**engine, 0).ok());
  ASSERT_TRUE(Comm()->Barrier().ok());
  if (Rank() == 0) {
    std::filesystem::remove_all(directory);
  }
  StderrCapture capture;
  for (int step = 1; step < 3; ++step) {
    absl::StatusOr<engine::StepReport> report = TrainStep(**engine, step);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_TRUE(report->boundary);
  }
  const std::string log = capture.Finish();
  EXPECT_EQ((*engine)->counters().global_steps, 3);
  if (Rank() == 0) {
    EXPECT_NE(log.find("csv_monitor: cannot open"), std::string::npos) << log;
    EXPECT_NE(log.find("csv_monitor stops here"), std::string::npos) << log;
    // Logged once, not at every later step.
    EXPECT_EQ(log.find("csv_monitor stops here"),
              log.rfind("csv_monitor stops here"))
        << log;
  }
}

TEST(CsvMonitorTest, UncreatableDirectoryFailsOnEveryRank) {
  // A regular file where the directory should go.
  const std::string blocker = RunDirectory("blocker");
  if (Rank() == 0) {
    std::ofstream(blocker) << "not a directory\n";
  }
  ASSERT_TRUE(Comm()->Barrier().ok());
  const std::string monitoring = CsvMonitorKeys(blocker + "/sub");
  absl::StatusOr<std::shared_ptr<nn::LossModel>> model = MakeModel(DType::kF32);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine =
      engine::Initialize(*model, Config("", monitoring), Comm());
  ASSERT_FALSE(engine.ok());
  const std::string message(engine.status().message());
  EXPECT_NE(message.find("csv_monitor"), std::string::npos) << message;
  if (Rank() == 0) {
    EXPECT_NE(message.find(blocker + "/sub/job"), std::string::npos) << message;
  } else {
    EXPECT_NE(message.find("another rank"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace enginetest
}  // namespace ze

int main(int argc, char** argv) {
  return ze::enginetest::RunAllTests(argc, argv);
}
