// engine/step_monitor.h on the CPU, without an engine: the step's
// wall-clock breakdown (what a phase adds, that a step's times restart),
// the csv rows it writes and that a failed csv write ends csv monitoring
// without failing the step.
#include "engine/step_monitor.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "core/device.h"
#include "core/stream.h"
#include "engine/monitor.h"
#include "engine/reports.h"
#include "gtest/gtest.h"

namespace ze {
namespace engine {
namespace {

using Clock = StepMonitor::Clock;

std::string TestDirectory(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string directory =
      std::string(tmp != nullptr ? tmp : "/tmp") + "/step_monitor_" + name;
  std::filesystem::remove_all(directory);
  return directory;
}

config::Config LoadConfig(bool wall_clock_breakdown,
                          const std::string& output_path) {
  std::string json =
      R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,)"
      R"( "steps_per_print": 1, "wall_clock_breakdown": )";
  json += wall_clock_breakdown ? "true" : "false";
  if (!output_path.empty()) {
    json += R"(, "csv_monitor": {"enabled": true, "output_path": ")" +
            output_path + R"(", "job_name": "job"})";
  }
  json += "}";
  absl::StatusOr<config::Config> config =
      config::LoadConfigString(json, 1, "step_monitor_test.json");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : config::Config();
}

StepMonitor MakeMonitor(const config::Config& config) {
  absl::StatusOr<CsvMonitor> csv = CsvMonitor::Create(config.csv_monitor, 0);
  EXPECT_TRUE(csv.ok()) << csv.status();
  return StepMonitor(config, csv.ok() ? *std::move(csv) : CsvMonitor(),
                     Device::Cpu());
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// One micro-step whose forward took at least 20 ms and backward 10 ms (the
// phases' starts are set back), then the boundary step and its report.
void RunStep(StepMonitor& monitor, const Counters& counters) {
  const Stream& stream = Stream::Default(Device::Cpu());
  monitor.RecordMicroBatch(4);
  ASSERT_TRUE(monitor
                  .EndPhase(StepMonitor::kForward,
                            Clock::now() - std::chrono::milliseconds(20),
                            stream)
                  .ok());
  ASSERT_TRUE(monitor
                  .EndPhase(StepMonitor::kBackward,
                            Clock::now() - std::chrono::milliseconds(10),
                            stream)
                  .ok());
  monitor.CountMicroStep(1);
  ASSERT_TRUE(monitor.EndPhase(StepMonitor::kStep, Clock::now(), stream).ok());
  StepReport report;
  report.boundary = true;
  report.loss = 2.5;
  report.learning_rate = 0.1;
  monitor.ReportStep(report, counters, /*communication_ms=*/3.0);
}

TEST(StepMonitorTest, WallClockBreakdownTimesEachStepAfresh) {
  StepMonitor monitor = MakeMonitor(LoadConfig(true, ""));
  Counters counters;
  counters.global_steps = 1;
  RunStep(monitor, counters);
  const StepMonitor::StepTimes first = monitor.last_step_times();
  EXPECT_GE(first.forward_ms, 20.0);
  EXPECT_LT(first.forward_ms, 20.0 + 1000.0);
  EXPECT_GE(first.backward_ms, 10.0);
  EXPECT_LT(first.backward_ms, first.forward_ms);
  EXPECT_GE(first.step_ms, 0.0);
  EXPECT_EQ(first.communication_ms, 3.0);
  // A step without phases reports none: the previous step's times are not
  // carried over.
  StepReport report;
  counters.global_steps = 2;
  monitor.ReportStep(report, counters, 0.0);
  EXPECT_EQ(monitor.last_step_times().forward_ms, 0.0);
  EXPECT_EQ(monitor.last_step_times().backward_ms, 0.0);
}

TEST(StepMonitorTest, WithoutWallClockBreakdownNothingIsTimed) {
  StepMonitor monitor = MakeMonitor(LoadConfig(false, ""));
  Counters counters;
  counters.global_steps = 1;
  RunStep(monitor, counters);
  EXPECT_FALSE(monitor.wall_clock_breakdown());
  EXPECT_EQ(monitor.last_step_times().forward_ms, 0.0);
  EXPECT_EQ(monitor.last_step_times().communication_ms, 0.0);
}

TEST(StepMonitorTest, CsvRowsCarryTheStepAtTheSampleCount) {
  const std::string directory = TestDirectory("rows");
  StepMonitor monitor = MakeMonitor(LoadConfig(true, directory));
  ASSERT_TRUE(monitor.csv_enabled());
  Counters counters;
  counters.global_steps = 1;
  counters.global_samples = 8;
  RunStep(monitor, counters);
  EXPECT_EQ(ReadFile(directory + "/job/Train_Samples_train_loss.csv"),
            "step,train_loss\n8,2.5\n");
  EXPECT_EQ(
      ReadFile(directory + "/job/Train_Samples_elapsed_time_ms_communication"
                           ".csv"),
      "step,elapsed_time_ms_communication\n8,3\n");
  const std::string forward =
      ReadFile(directory + "/job/Train_Samples_elapsed_time_ms_forward.csv");
  EXPECT_EQ(forward.rfind("step,elapsed_time_ms_forward\n8,", 0), 0u)
      << forward;
  // Not fp16: no loss scale row.
  EXPECT_FALSE(
      std::filesystem::exists(directory + "/job/Train_Samples_loss_scale.csv"));
}

TEST(StepMonitorTest, FailedCsvWriteEndsCsvMonitoringNotTheStep) {
  const std::string directory = TestDirectory("failed");
  StepMonitor monitor = MakeMonitor(LoadConfig(false, directory));
  ASSERT_TRUE(monitor.csv_enabled());
  std::filesystem::remove_all(directory);
  // A file where the directory was: no row can be written.
  std::ofstream(directory) << "not a directory";
  Counters counters;
  counters.global_steps = 1;
  RunStep(monitor, counters);
  EXPECT_FALSE(monitor.csv_enabled());
  std::filesystem::remove(directory);
}

}  // namespace
}  // namespace engine
}  // namespace ze
