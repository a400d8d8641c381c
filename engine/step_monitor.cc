#include "engine/step_monitor.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/logging.h"
#include "core/status.h"

namespace ze {
namespace engine {

StepMonitor::StepMonitor(const config::Config& config, CsvMonitor csv,
                         Device device)
    : wall_clock_breakdown_(config.wall_clock_breakdown),
      memory_breakdown_(config.memory_breakdown),
      fp16_(config::GetTrainingPrecision(config) ==
            config::TrainingPrecision::kFp16),
      steps_per_print_(config.steps_per_print),
      train_batch_size_(config.train_batch_size.value()),
      device_(device),
      csv_(std::move(csv)),
      window_start_(Clock::now()),
      last_report_(window_start_) {}

absl::Status StepMonitor::EndPhase(Phase phase, Clock::time_point start,
                                   const Stream& stream) {
  if (wall_clock_breakdown_) {
    // The phase's queued work is part of its time.
    ZE_RETURN_IF_ERROR(stream.Synchronize());
    const double ms =
        std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    window_phase_ms_[phase] += ms;
    window_phase_count_[phase] += 1;
    step_phase_ms_[phase] += ms;
  }
  if (memory_breakdown_) {
    phase_memory_[phase] = GetAllocator(device_)->stats();
  }
  return absl::OkStatus();
}

void StepMonitor::CountMicroStep(int world_size) {
  window_tokens_ += last_tokens_ * world_size;
  step_tokens_ += last_tokens_ * world_size;
}

void StepMonitor::RestartWindow() {
  last_tokens_ = 0;
  window_start_ = Clock::now();
}

OffloadRatioAdvice AdviseOffloadRatio(double ratio, double update_ms,
                                      double wait_ms,
                                      int64_t offloaded_optimizer_bytes) {
  OffloadRatioAdvice advice;
  advice.ratio = ratio;
  if (update_ms <= 0 || wait_ms <= std::max(1.0, 0.05 * update_ms)) {
    return advice;
  }
  if (wait_ms > update_ms) {
    advice.kind = OffloadRatioAdvice::kNotUpdate;
    return advice;
  }
  advice.kind = OffloadRatioAdvice::kSuggest;
  advice.ratio = ratio * (update_ms - wait_ms) / update_ms;
  advice.more_device_bytes =
      static_cast<int64_t>(static_cast<double>(offloaded_optimizer_bytes) *
                           (1.0 - advice.ratio / ratio));
  return advice;
}

void StepMonitor::ReportStep(const StepReport& report, const Counters& counters,
                             double communication_ms,
                             const OffloadTotals* offload) {
  last_step_times_ = StepTimes();
  if (wall_clock_breakdown_) {
    last_step_times_ = {step_phase_ms_[kForward], step_phase_ms_[kBackward],
                        step_phase_ms_[kStep], communication_ms};
    window_communication_ms_ += communication_ms;
    window_steps_ += 1;
  }
  // A failed csv write (a full disk, a removed directory) must not fail the
  // step: the update has been applied, and only rank 0 writes, so an error
  // here would stop rank 0 alone and leave the others waiting in the next
  // collective. It is logged once and monitoring stops; training goes on.
  absl::Status csv_status;
  if (csv_.enabled()) {
    const int64_t samples = counters.global_samples;
    auto write = [&](const char* name, double value) {
      if (csv_status.ok()) csv_status = csv_.Write(name, value, samples);
    };
    write("Train/Samples/train_loss", report.loss);
    write("Train/Samples/lr", report.learning_rate);
    if (fp16_) write("Train/Samples/loss_scale", report.loss_scale);
    // Throughput since the previous step's report (over every rank), and
    // the model device's allocator: bytes in use now and the peak so far.
    const double seconds =
        std::chrono::duration<double>(Clock::now() - last_report_).count();
    if (seconds > 0) {
      write("Train/Samples/tokens_per_second", step_tokens_ / seconds);
    }
    const AllocatorStats memory = GetAllocator(device_)->stats();
    write("Train/Samples/memory_allocated_bytes",
          static_cast<double>(memory.bytes_in_use));
    write("Train/Samples/memory_peak_bytes",
          static_cast<double>(memory.peak_bytes_in_use));
    if (wall_clock_breakdown_) {
      write("Train/Samples/elapsed_time_ms_forward",
            last_step_times_.forward_ms);
      write("Train/Samples/elapsed_time_ms_backward",
            last_step_times_.backward_ms);
      write("Train/Samples/elapsed_time_ms_step", last_step_times_.step_ms);
      write("Train/Samples/elapsed_time_ms_communication",
            last_step_times_.communication_ms);
    }
    if (!csv_status.ok()) {
      ZE_LOG(WARNING) << csv_status.message()
                      << "; csv_monitor stops here, training goes on (rows "
                         "written before stay in "
                      << csv_.directory() << ")";
      csv_ = CsvMonitor();
    }
  }
  for (double& ms : step_phase_ms_) ms = 0;
  step_tokens_ = 0;
  last_report_ = Clock::now();
  if (steps_per_print_ <= 0 || counters.global_steps % steps_per_print_ != 0) {
    return;
  }
  const double seconds =
      std::chrono::duration<double>(Clock::now() - window_start_).count();
  const double samples =
      static_cast<double>(steps_per_print_) * train_batch_size_;
  ZE_LOG_RANK0(INFO) << absl::StrFormat(
      "step %d loss %.6f lr %.6g loss_scale %g skipped %d samples/s %.1f "
      "tokens/s %.1f",
      counters.global_steps, report.loss, report.learning_rate,
      report.loss_scale, counters.skipped_steps, samples / seconds,
      window_tokens_ / seconds);
  window_start_ = Clock::now();
  window_tokens_ = 0;
  if (wall_clock_breakdown_) {
    auto mean = [&](int phase) {
      return window_phase_count_[phase] > 0
                 ? window_phase_ms_[phase] / window_phase_count_[phase]
                 : 0.0;
    };
    ZE_LOG_RANK0(INFO) << absl::StrFormat(
        "time (ms) | forward: %.2f | backward: %.2f | step: %.2f | "
        "communication: %.2f (means per micro-step, per step and, for "
        "communication, the collectives' own time per step since the last "
        "print; collectives on their own stream overlap compute)",
        mean(kForward), mean(kBackward), mean(kStep),
        window_steps_ > 0 ? window_communication_ms_ / window_steps_ : 0.0);
    if (offload != nullptr && offload->updates > printed_offload_.updates) {
      const double updates =
          static_cast<double>(offload->updates - printed_offload_.updates);
      const double update_ms =
          (offload->update_seconds - printed_offload_.update_seconds) * 1e3 /
          updates;
      const double wait_ms =
          (offload->wait_seconds - printed_offload_.wait_seconds) * 1e3 /
          updates;
      const OffloadRatioAdvice advice =
          AdviseOffloadRatio(offload->ratio, update_ms, wait_ms,
                             offload->offloaded_optimizer_bytes);
      constexpr double kGib = 1024.0 * 1024.0 * 1024.0;
      std::string verdict;
      if (offload->nvme) {
        verdict = "NVMe: the wait includes the swap file's reads and writes";
      } else if (advice.kind == OffloadRatioAdvice::kHidden) {
        verdict = "backward hides it";
      } else if (advice.kind == OffloadRatioAdvice::kNotUpdate) {
        verdict =
            "the engine waited longer than the update ran: gradient copies "
            "or weight uploads held it, not the CPU";
      } else {
        verdict = absl::StrFormat(
            "offload_optimizer.ratio %.2g: about %.2f would let backward "
            "hide it (%.2f GiB more optimizer state on the device a rank)",
            offload->ratio, advice.ratio,
            static_cast<double>(advice.more_device_bytes) / kGib);
      }
      ZE_LOG_RANK0(INFO) << absl::StrFormat(
          "offload (ms per step) | CPU update: %.2f | waited for it: %.2f | "
          "%s",
          update_ms, wait_ms, verdict);
      printed_offload_ = *offload;
    }
    for (int phase = 0; phase < 3; ++phase) {
      window_phase_ms_[phase] = 0;
      window_phase_count_[phase] = 0;
    }
    window_communication_ms_ = 0;
    window_steps_ = 0;
  }
  if (memory_breakdown_) {
    Allocator* allocator = GetAllocator(device_);
    const AllocatorStats now = allocator->stats();
    constexpr double kGib = 1024.0 * 1024.0 * 1024.0;
    ZE_LOG_RANK0(INFO) << absl::StrFormat(
        "memory (GiB, %s) | after forward: %.3f | after backward: %.3f | "
        "after step: %.3f | peak since last print: %.3f | reserved: %.3f",
        allocator->name(), phase_memory_[kForward].bytes_in_use / kGib,
        phase_memory_[kBackward].bytes_in_use / kGib,
        phase_memory_[kStep].bytes_in_use / kGib, now.peak_bytes_in_use / kGib,
        now.bytes_reserved / kGib);
    allocator->ResetPeak();
  }
}

}  // namespace engine
}  // namespace ze
