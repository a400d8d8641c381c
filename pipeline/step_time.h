// Where one pipeline rank's step went: computing (its forward, backward,
// Bi, Bw and reduce actions) or not (blocked in receives, in waits for its
// sends and for the step's closing loss exchange, and the executor's own
// bookkeeping between actions). The idle share of a rank's step is its
// measured bubble, the quantity pipeline::SimulateSchedule predicts per
// rank (ScheduleStats::rank_bubble) from the schedule and action costs.
//
// The timer only adds up intervals of a clock it is given (the steady
// clock by default; a test's own), so the accounting is checked without
// timing anything (step_time_test). What an interval means on a GPU is the
// caller's: PipelineExecutor synchronises its compute stream at the end of
// each compute action, so a compute interval is the host's wall time until
// the action's kernels finished (pipeline/executor.h).
//
// Thread-compatible.
#ifndef ZE_PIPELINE_STEP_TIME_H_
#define ZE_PIPELINE_STEP_TIME_H_

#include <functional>

#include "pipeline/schedule.h"

namespace ze {
namespace pipeline {

// One rank's step, in milliseconds.
struct StepTimes {
  double wall_ms = 0;  // BeginStep to EndStep
  // The compute actions' intervals: forward_ms + backward_ms +
  // weight_gradient_ms + reduce_ms.
  double busy_ms = 0;
  double idle_ms = 0;  // wall_ms - busy_ms: waiting and everything else
  // The part of idle_ms spent blocked in waits (receives, sends, the tied
  // parameters' sum, the closing loss exchange); the rest of idle_ms is the
  // executor's own time between actions (issuing messages, allocating their
  // buffers).
  double wait_ms = 0;
  // The part of wait_ms in the tied parameters' gradient sum between the
  // first and last stage (GPT's embedding and head): communication, not
  // compute, which holds up both end ranks and, through the boundary's
  // all-reduce, every other (bench/pipeline_model's tied_reduce_ms).
  double tied_sum_ms = 0;
  double forward_ms = 0;          // kForward
  double backward_ms = 0;         // kBackward and kBackwardInput
  double weight_gradient_ms = 0;  // kBackwardWeight
  double reduce_ms = 0;           // kReduceGradients
  int compute_actions = 0;        // compute intervals counted
  int waits = 0;                  // wait intervals counted
  int steps = 0;                  // steps summed here (1 for one step)

  // idle_ms / wall_ms (0 for an empty step): the rank's measured bubble.
  double bubble_fraction() const;
  // Sums every field (steps too): the figures of several steps.
  StepTimes &operator+=(const StepTimes &other);
};

class StepTimer {
 public:
  // Seconds on a monotonic clock.
  using Clock = std::function<double()>;
  // std::chrono::steady_clock, in seconds.
  static double SteadySeconds();

  explicit StepTimer(Clock clock = SteadySeconds);

  // Starts a step, forgetting any interval left open by a failed one.
  void BeginStep();
  // One compute action's interval; `kind` must be a compute kind
  // (!IsCommunication). At most one interval (compute or wait) is open at a
  // time: a Begin closes none, an End without its Begin counts nothing.
  void BeginCompute(ActionKind kind);
  void EndCompute();
  // One interval blocked on communication: messages (receives, sends, the
  // loss exchange) or the tied parameters' sum (also in tied_sum_ms).
  enum class Wait { kMessages, kTiedSum };
  void BeginWait(Wait kind = Wait::kMessages);
  void EndWait();
  // Ends the step (wall_ms, idle_ms) and returns its figures; they stay
  // readable in last() until the next BeginStep.
  const StepTimes &EndStep();
  const StepTimes &last() const { return times_; }

 private:
  Clock clock_;
  StepTimes times_;
  double step_start_ = 0;
  double interval_start_ = 0;
  enum class Open { kNone, kCompute, kWait } open_ = Open::kNone;
  ActionKind open_kind_ = ActionKind::kForward;
  Wait open_wait_ = Wait::kMessages;
};

}  // namespace pipeline
}  // namespace ze

#endif  // ZE_PIPELINE_STEP_TIME_H_
