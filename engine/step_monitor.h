// StepMonitor: everything the engine measures and reports about training
// steps, as DeepSpeed's keys say, in one place:
//   - steps_per_print: every that many steps rank 0 logs step, loss,
//     learning rate, loss scale, skipped steps, samples/s and tokens/s
//     (over the steps since the last print);
//   - wall_clock_breakdown: each phase (forward, backward, step) is timed,
//     its queued device work included (EndPhase synchronises the stream),
//     and the print adds the mean forward and backward time per micro-step,
//     step time per step and the collectives' own time per step;
//     With the optimizer offloaded to the CPU it adds the CPU update's
//     time a step, the part of it the engine waited for, and the
//     offload_optimizer.ratio at which backward would have hidden it
//     (AdviseOffloadRatio);
//   - memory_breakdown: the allocator's bytes in use after each phase, and
//     at the print its peak since the last print (whose peak it then
//     resets);
//   - csv_monitor (engine/monitor.h's CsvMonitor): at each step
//     Train/Samples/{train_loss, lr, loss_scale (fp16), tokens_per_second,
//     memory_allocated_bytes, memory_peak_bytes} and, with
//     wall_clock_breakdown, elapsed_time_ms_{forward, backward, step,
//     communication}. A failed write is logged once and ends csv
//     monitoring; it never fails the step (only rank 0 writes, so an error
//     would stop rank 0 alone and leave the others in the next collective).
//
// The engine calls, per micro-step: RecordMicroBatch after its forward,
// EndPhase at the end of each phase, CountMicroStep in Step, and at a
// boundary ReportStep once the update is done.
//
// Threading: one thread (the engine's) calls it.
#ifndef ZE_ENGINE_STEP_MONITOR_H_
#define ZE_ENGINE_STEP_MONITOR_H_

#include <chrono>
#include <cstdint>

#include "absl/status/status.h"
#include "config/config.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/stream.h"
#include "engine/monitor.h"
#include "engine/reports.h"

namespace ze {
namespace engine {

// The offloaded optimizer's totals since Initialize (HostUpdateTimes' sums)
// and what its placement was planned from, for the print's offload line.
struct OffloadTotals {
  int64_t updates = 0;
  double update_seconds = 0;  // the CPU optimizer's time
  double wait_seconds = 0;    // the engine blocked on it
  double ratio = 1.0;         // offload_optimizer.ratio
  // This rank's master weights and optimizer state on the host or NVMe
  // (the plan's host_optimizer_bytes + nvme_optimizer_bytes).
  int64_t offloaded_optimizer_bytes = 0;
  bool nvme = false;  // offload_optimizer.device nvme: times only
};

// What the offload line suggests. The part of the update that overlapped
// compute (update - wait) is taken as the window a smaller CPU share could
// fill; the update's time as proportional to its share. So the ratio whose
// update that window would hide is ratio * (update - wait) / update, and
// the state it moves back to the device is offloaded_bytes * (1 - that /
// ratio). Pure; a heuristic from one run's figures (run 73: the window
// stayed 88-103 ms over ratios 0.4-1.0). Only for the CPU tier: with NVMe
// the wait is mostly the swap file's I/O.
struct OffloadRatioAdvice {
  enum Kind {
    kHidden,     // the engine waited at most 5% of the update (or < 1 ms)
    kSuggest,    // `ratio` and `more_device_bytes` say what would hide it
    kNotUpdate,  // it waited longer than the update ran: something else
                 // (gradient copies, uploads) held it; no ratio fixes that
  };
  Kind kind = kHidden;
  double ratio = 1.0;
  int64_t more_device_bytes = 0;
};
OffloadRatioAdvice AdviseOffloadRatio(double ratio, double update_ms,
                                      double wait_ms,
                                      int64_t offloaded_optimizer_bytes);

class StepMonitor {
 public:
  using Clock = std::chrono::steady_clock;
  enum Phase { kForward = 0, kBackward = 1, kStep = 2 };

  // One step's wall-clock breakdown (milliseconds; zeros without
  // wall_clock_breakdown): what the csv rows elapsed_time_ms_* say.
  struct StepTimes {
    double forward_ms = 0;        // summed over the step's micro-steps
    double backward_ms = 0;       // summed over the step's micro-steps
    double step_ms = 0;           // the boundary step
    double communication_ms = 0;  // the collectives' own time
  };

  // Reads wall_clock_breakdown, memory_breakdown, steps_per_print,
  // train_batch_size and the precision from `config`; `csv` writes the rows
  // (a disabled one: none); `device` is the model's, whose allocator is
  // reported. The throughput windows start now.
  StepMonitor(const config::Config& config, CsvMonitor csv, Device device);

  bool wall_clock_breakdown() const { return wall_clock_breakdown_; }
  bool csv_enabled() const { return csv_.enabled(); }

  // This rank's last micro-batch, for throughput: its tokens (i32 token
  // ids: their count) or samples.
  void RecordMicroBatch(int64_t tokens) { last_tokens_ = tokens; }
  // At the end of `phase`, which began at `start`. With
  // wall_clock_breakdown it first synchronises `stream` (the phase's queued
  // work is part of its time): that error is returned. With
  // memory_breakdown it records the allocator's state.
  absl::Status EndPhase(Phase phase, Clock::time_point start,
                        const Stream& stream);
  // A micro-step is counted (Engine::Step): the last micro-batch, times
  // `world_size` ranks, joins both throughput windows.
  void CountMicroStep(int world_size);
  // At a boundary, after the update: the csv rows, and every
  // steps_per_print steps (counters.global_steps) the log lines; then the
  // step's times restart. `communication_ms`: the collectives' time of this
  // step (Communicator::TakeCommunicationMilliseconds; used only with
  // wall_clock_breakdown). `offload`: the offloaded optimizer's totals now
  // (null without a CPU optimizer; used only with wall_clock_breakdown).
  // Never fails (see the header comment).
  void ReportStep(const StepReport& report, const Counters& counters,
                  double communication_ms,
                  const OffloadTotals* offload = nullptr);
  // After a checkpoint load: the throughput window restarts and the last
  // micro-batch is forgotten.
  void RestartWindow();

  // The last reported step's breakdown.
  const StepTimes& last_step_times() const { return last_step_times_; }

 private:
  bool wall_clock_breakdown_;
  bool memory_breakdown_;
  bool fp16_;
  int64_t steps_per_print_;
  int64_t train_batch_size_;
  Device device_;
  CsvMonitor csv_;
  // Throughput: this rank's last micro-batch; tokens over all ranks since
  // the last print (window) and since the last step's report (step).
  int64_t last_tokens_ = 0;
  double window_tokens_ = 0;
  Clock::time_point window_start_;
  double step_tokens_ = 0;
  Clock::time_point last_report_;
  // wall_clock_breakdown: milliseconds and counts per phase since the last
  // print, and within the current step; the collectives' time and steps
  // since the last print.
  double window_phase_ms_[3] = {0, 0, 0};
  int64_t window_phase_count_[3] = {0, 0, 0};
  double step_phase_ms_[3] = {0, 0, 0};
  double window_communication_ms_ = 0;
  int64_t window_steps_ = 0;
  StepTimes last_step_times_;
  // The offload totals at the last print (the line shows the window's).
  OffloadTotals printed_offload_;
  // memory_breakdown: the allocator after each phase's latest run.
  AllocatorStats phase_memory_[3];
};

}  // namespace engine
}  // namespace ze

#endif  // ZE_ENGINE_STEP_MONITOR_H_
