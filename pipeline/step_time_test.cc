#include "pipeline/step_time.h"

#include <vector>

#include "gtest/gtest.h"
#include "pipeline/schedule.h"

namespace ze {
namespace pipeline {
namespace {

// A clock the test moves by hand (seconds).
struct FakeClock {
  double now = 0;
  StepTimer::Clock clock() {
    return [this] { return now; };
  }
};

TEST(StepTimerTest, SplitsTheWallIntoComputeWaitsAndTheRest) {
  FakeClock t;
  StepTimer timer(t.clock());
  t.now = 10;
  timer.BeginStep();
  t.now = 11;  // 1 s of bookkeeping: idle, not waiting
  timer.BeginCompute(ActionKind::kForward);
  t.now = 13;
  timer.EndCompute();
  t.now = 14;
  timer.BeginWait();
  t.now = 17;
  timer.EndWait();
  timer.BeginCompute(ActionKind::kBackwardInput);
  t.now = 18;
  timer.EndCompute();
  timer.BeginCompute(ActionKind::kBackwardWeight);
  t.now = 19.5;
  timer.EndCompute();
  t.now = 19.75;
  timer.BeginWait(StepTimer::Wait::kTiedSum);
  t.now = 20;
  timer.EndWait();
  timer.BeginCompute(ActionKind::kReduceGradients);
  t.now = 20.5;
  timer.EndCompute();
  t.now = 21;
  const StepTimes &s = timer.EndStep();
  EXPECT_DOUBLE_EQ(s.wall_ms, 11000);
  EXPECT_DOUBLE_EQ(s.forward_ms, 2000);
  EXPECT_DOUBLE_EQ(s.backward_ms, 1000);
  EXPECT_DOUBLE_EQ(s.weight_gradient_ms, 1500);
  EXPECT_DOUBLE_EQ(s.reduce_ms, 500);
  EXPECT_DOUBLE_EQ(s.busy_ms, 5000);
  EXPECT_DOUBLE_EQ(s.wait_ms, 3250);  // messages 3 s, the tied sum 0.25 s
  EXPECT_DOUBLE_EQ(s.tied_sum_ms, 250);
  EXPECT_DOUBLE_EQ(s.idle_ms, 6000);  // 3.25 s waiting, 2.75 s in between
  EXPECT_DOUBLE_EQ(s.busy_ms + s.idle_ms, s.wall_ms);
  EXPECT_EQ(s.compute_actions, 4);
  EXPECT_EQ(s.waits, 2);
  EXPECT_DOUBLE_EQ(s.bubble_fraction(), 6.0 / 11.0);
}

TEST(StepTimerTest, UnmatchedEndsCountNothingAndBeginStepForgetsAnOpenOne) {
  FakeClock t;
  StepTimer timer(t.clock());
  timer.BeginStep();
  timer.BeginCompute(ActionKind::kForward);
  t.now = 1;
  timer.EndWait();  // not the open interval's end
  timer.EndCompute();
  timer.EndCompute();  // already closed
  timer.BeginWait();   // left open by a failed step
  t.now = 2;
  timer.BeginStep();
  t.now = 3;
  timer.EndWait();
  const StepTimes &s = timer.EndStep();
  EXPECT_DOUBLE_EQ(s.wall_ms, 1000);
  EXPECT_DOUBLE_EQ(s.busy_ms, 0);
  EXPECT_DOUBLE_EQ(s.wait_ms, 0);
  EXPECT_EQ(s.compute_actions, 0);
  EXPECT_EQ(s.waits, 0);
}

TEST(StepTimerTest, SumsSteps) {
  FakeClock t;
  StepTimer timer(t.clock());
  StepTimes total;
  for (int step = 0; step < 3; ++step) {
    timer.BeginStep();
    timer.BeginCompute(ActionKind::kBackward);
    t.now += 1;
    timer.EndCompute();
    timer.BeginWait();
    t.now += 0.5;
    timer.EndWait();
    total += timer.EndStep();
  }
  EXPECT_EQ(total.steps, 3);
  EXPECT_DOUBLE_EQ(total.wall_ms, 4500);
  EXPECT_DOUBLE_EQ(total.backward_ms, 3000);
  EXPECT_DOUBLE_EQ(total.idle_ms, 1500);
  EXPECT_DOUBLE_EQ(total.bubble_fraction(), 1.0 / 3.0);
}

// Replays every rank's simulated timeline through a timer, as the executor
// drives it: the time between two compute actions is the wait of the
// message group between them, the time after the rank's last action the
// closing exchange's wait for the slowest rank.
std::vector<StepTimes> Replay(const Schedule &schedule,
                              const ScheduleStats &stats) {
  std::vector<StepTimes> times;
  for (int rank = 0; rank < schedule.ranks; ++rank) {
    FakeClock t;
    StepTimer timer(t.clock());
    timer.BeginStep();
    for (const ScheduleStats::Interval &interval :
         stats.compute_intervals[rank]) {
      if (interval.start > t.now) {
        timer.BeginWait();
        t.now = interval.start;
        timer.EndWait();
      }
      timer.BeginCompute(schedule.actions[rank][interval.action].kind);
      t.now = interval.end;
      timer.EndCompute();
    }
    timer.BeginWait();
    t.now = stats.makespan;
    timer.EndWait();
    times.push_back(timer.EndStep());
  }
  return times;
}

// Each rank's measured bubble is the simulation's for that rank, and their
// mean the schedule's bubble, for every schedule.
TEST(StepTimerTest, ReplayedScheduleMeasuresTheSimulatedBubblePerRank) {
  struct Case {
    ScheduleKind kind;
    int ranks, micro_batches, per_rank;
  };
  for (const Case c : {Case{ScheduleKind::kGPipe, 4, 6, 1},
                       Case{ScheduleKind::kOneFOneB, 3, 5, 1},
                       Case{ScheduleKind::kZeroBubbleH1, 4, 8, 1},
                       Case{ScheduleKind::kInterleavedOneFOneB, 2, 4, 2}}) {
    absl::StatusOr<Schedule> schedule =
        BuildSchedule(c.kind, c.ranks, c.micro_batches, c.per_rank);
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    ActionCosts costs;
    costs.backward_input = 1.5;
    costs.backward_weight = 0.5;
    costs.reduce = 0.25;
    absl::StatusOr<ScheduleStats> stats = SimulateSchedule(*schedule, costs);
    ASSERT_TRUE(stats.ok()) << stats.status();
    const std::vector<StepTimes> times = Replay(*schedule, *stats);
    double mean = 0;
    for (int rank = 0; rank < c.ranks; ++rank) {
      SCOPED_TRACE(::testing::Message()
                   << ScheduleName(c.kind) << " rank " << rank);
      const StepTimes &s = times[rank];
      EXPECT_NEAR(s.busy_ms, stats->rank_busy[rank] * 1e3, 1e-9);
      EXPECT_NEAR(s.bubble_fraction(), stats->rank_bubble[rank], 1e-12);
      EXPECT_NEAR(s.wait_ms, s.idle_ms, 1e-9);  // no time between actions
      // Every compute action of the rank's list timed once.
      int compute = 0;
      for (const Action &a : schedule->actions[rank]) {
        compute += IsCommunication(a.kind) ? 0 : 1;
      }
      EXPECT_EQ(s.compute_actions, compute);
      EXPECT_NEAR(s.reduce_ms, 0.25e3 * c.per_rank, 1e-9);
      mean += s.bubble_fraction() / c.ranks;
    }
    EXPECT_NEAR(mean, stats->bubble_fraction, 1e-12);
    // With equal stages the measured bubble is the formula's.
    if (c.kind != ScheduleKind::kZeroBubbleH1) {
      ActionCosts equal;
      absl::StatusOr<ScheduleStats> even = SimulateSchedule(*schedule, equal);
      ASSERT_TRUE(even.ok());
      double even_mean = 0;
      for (const StepTimes &s : Replay(*schedule, *even)) {
        even_mean += s.bubble_fraction() / c.ranks;
      }
      EXPECT_NEAR(even_mean, ExpectedBubbleFraction(*schedule), 1e-12);
    }
  }
}

// A rank whose neighbour is slow waits: 1F1B over 2 ranks, rank 1's
// forward five times rank 0's. Rank 0 computes as much as before and is
// idle for longer, all of it in waits; rank 1, the bottleneck, is idle
// only while the first activation and the last gradient travel.
TEST(StepTimerTest, ARankWaitingForASlowNeighbourShowsIdle) {
  absl::StatusOr<Schedule> schedule =
      BuildSchedule(ScheduleKind::kOneFOneB, 2, 4);
  ASSERT_TRUE(schedule.ok());
  ActionCosts even;
  ActionCosts slow;
  slow.stage_forward = {1, 5};
  slow.stage_backward_input = {1, 1};
  slow.stage_backward_weight = {1, 1};
  absl::StatusOr<ScheduleStats> a = SimulateSchedule(*schedule, even);
  absl::StatusOr<ScheduleStats> b = SimulateSchedule(*schedule, slow);
  ASSERT_TRUE(a.ok() && b.ok());
  const std::vector<StepTimes> before = Replay(*schedule, *a);
  const std::vector<StepTimes> after = Replay(*schedule, *b);
  EXPECT_DOUBLE_EQ(after[0].busy_ms, before[0].busy_ms);
  // Idle 3 units with even stages, 19 with the slow one: rank 0 waits 4
  // units longer for each of its 4 gradients.
  EXPECT_DOUBLE_EQ(before[0].idle_ms, 3e3);
  EXPECT_DOUBLE_EQ(after[0].idle_ms, 19e3);
  EXPECT_NEAR(after[0].wait_ms, after[0].idle_ms, 1e-9);
  EXPECT_GT(after[0].bubble_fraction(), 0.5);
  // Rank 1: busy 4 x (5 + 2) = 28 units, idle only until rank 0's first
  // forward arrives (1 unit) and after its last backward (rank 0's, 2).
  EXPECT_DOUBLE_EQ(after[1].busy_ms, 28e3);
  EXPECT_DOUBLE_EQ(after[1].idle_ms, 3e3);
}

}  // namespace
}  // namespace pipeline
}  // namespace ze
