#include "pipeline/step_time.h"

#include <chrono>

namespace ze {
namespace pipeline {

double StepTimes::bubble_fraction() const {
  return wall_ms > 0 ? idle_ms / wall_ms : 0;
}

StepTimes &StepTimes::operator+=(const StepTimes &other) {
  wall_ms += other.wall_ms;
  busy_ms += other.busy_ms;
  idle_ms += other.idle_ms;
  wait_ms += other.wait_ms;
  tied_sum_ms += other.tied_sum_ms;
  forward_ms += other.forward_ms;
  backward_ms += other.backward_ms;
  weight_gradient_ms += other.weight_gradient_ms;
  reduce_ms += other.reduce_ms;
  compute_actions += other.compute_actions;
  waits += other.waits;
  steps += other.steps;
  return *this;
}

double StepTimer::SteadySeconds() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

StepTimer::StepTimer(Clock clock) : clock_(std::move(clock)) {}

void StepTimer::BeginStep() {
  times_ = StepTimes();
  times_.steps = 1;
  open_ = Open::kNone;
  step_start_ = clock_();
}

void StepTimer::BeginCompute(ActionKind kind) {
  open_ = Open::kCompute;
  open_kind_ = kind;
  interval_start_ = clock_();
}

void StepTimer::EndCompute() {
  if (open_ != Open::kCompute) return;
  open_ = Open::kNone;
  const double ms = (clock_() - interval_start_) * 1e3;
  switch (open_kind_) {
    case ActionKind::kForward:
      times_.forward_ms += ms;
      break;
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput:
      times_.backward_ms += ms;
      break;
    case ActionKind::kBackwardWeight:
      times_.weight_gradient_ms += ms;
      break;
    default:  // kReduceGradients (communication kinds are not compute)
      times_.reduce_ms += ms;
      break;
  }
  times_.busy_ms += ms;
  ++times_.compute_actions;
}

void StepTimer::BeginWait(Wait kind) {
  open_ = Open::kWait;
  open_wait_ = kind;
  interval_start_ = clock_();
}

void StepTimer::EndWait() {
  if (open_ != Open::kWait) return;
  open_ = Open::kNone;
  const double ms = (clock_() - interval_start_) * 1e3;
  times_.wait_ms += ms;
  if (open_wait_ == Wait::kTiedSum) times_.tied_sum_ms += ms;
  ++times_.waits;
}

const StepTimes &StepTimer::EndStep() {
  open_ = Open::kNone;
  times_.wall_ms = (clock_() - step_start_) * 1e3;
  times_.idle_ms = times_.wall_ms - times_.busy_ms;
  return times_;
}

}  // namespace pipeline
}  // namespace ze
