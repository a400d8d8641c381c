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

// Run 73's figures (1.3B, stage 2, H100): at ratio 1.0 the CPU update took
// 328 ms and the engine waited 225 ms for it; the 103 ms overlapped suggest
// ratio 0.31, moving 69% of the offloaded state back to the device.
TEST(AdviseOffloadRatioTest, SuggestsTheShareTheOverlapWouldHide) {
  const int64_t offloaded = int64_t{1000} << 20;
  const OffloadRatioAdvice advice =
      AdviseOffloadRatio(1.0, 328.0, 225.0, offloaded);
  EXPECT_EQ(advice.kind, OffloadRatioAdvice::kSuggest);
  EXPECT_NEAR(advice.ratio, 103.0 / 328.0, 1e-12);
  EXPECT_NEAR(static_cast<double>(advice.more_device_bytes),
              static_cast<double>(offloaded) * (1.0 - 103.0 / 328.0), 1.0);
  // From ratio 0.5 the suggestion scales with the share already there.
  const OffloadRatioAdvice half = AdviseOffloadRatio(0.5, 193.0, 105.0, 100);
  EXPECT_EQ(half.kind, OffloadRatioAdvice::kSuggest);
  EXPECT_NEAR(half.ratio, 0.5 * 88.0 / 193.0, 1e-12);
  EXPECT_EQ(half.more_device_bytes,
            static_cast<int64_t>(100 * (1.0 - 88.0 / 193.0)));
}

TEST(AdviseOffloadRatioTest, NothingToSuggestWhenBackwardHidesIt) {
  // Waits of at most 5% of the update, or under a millisecond.
  EXPECT_EQ(AdviseOffloadRatio(0.4, 168.0, 8.0, 100).kind,
            OffloadRatioAdvice::kHidden);
  EXPECT_EQ(AdviseOffloadRatio(1.0, 10.0, 0.9, 100).kind,
            OffloadRatioAdvice::kHidden);
  EXPECT_EQ(AdviseOffloadRatio(1.0, 0.0, 0.0, 100).kind,
            OffloadRatioAdvice::kHidden);
  const OffloadRatioAdvice hidden = AdviseOffloadRatio(0.4, 168.0, 8.0, 100);
  EXPECT_EQ(hidden.ratio, 0.4);
  EXPECT_EQ(hidden.more_device_bytes, 0);
  // An update the engine waited for entirely overlapped nothing: ratio 0.
  const OffloadRatioAdvice none = AdviseOffloadRatio(1.0, 300.0, 300.0, 100);
  EXPECT_EQ(none.kind, OffloadRatioAdvice::kSuggest);
  EXPECT_EQ(none.ratio, 0.0);
  EXPECT_EQ(none.more_device_bytes, 100);
}

// Waiting longer than the update ran is not the update's time (this
// test's CPU NVMe run: 0.41 ms of update, 9.66 ms of waiting): no ratio.
TEST(AdviseOffloadRatioTest, AWaitLongerThanTheUpdateIsNotTheUpdates) {
  const OffloadRatioAdvice advice = AdviseOffloadRatio(1.0, 0.41, 9.66, 100);
  EXPECT_EQ(advice.kind, OffloadRatioAdvice::kNotUpdate);
  EXPECT_EQ(advice.ratio, 1.0);
  EXPECT_EQ(advice.more_device_bytes, 0);
}

}  // namespace
}  // namespace engine
}  // namespace ze
