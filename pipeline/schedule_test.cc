#include "pipeline/schedule.h"

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ze {
namespace pipeline {
namespace {

using ::testing::HasSubstr;

// Every schedule over a grid of sizes: the simulation's checks pass (each
// micro-batch's forward before its backward on every stage, sends matched
// in order by the peer's receives, no deadlock, one reduction per stage
// after its last backward), activations in flight stay within the
// schedule's bound, and the bubble measured from the lists is the
// literature's formula.
struct GridCase {
  ScheduleKind kind;
  int ranks;
  int stages_per_rank;
  int micro_batches;
};

int Find(const std::vector<Action> &list, ActionKind kind, int mb) {
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].kind == kind && list[i].micro_batch == mb) return i;
  }
  return -1;
}

std::vector<GridCase> Grid() {
  std::vector<GridCase> cases;
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
                            ScheduleKind::kZeroBubbleH1}) {
    for (int p = 1; p <= 6; ++p) {
      for (int m = 1; m <= 12; ++m) cases.push_back({kind, p, 1, m});
    }
  }
  for (int p = 2; p <= 5; ++p) {
    for (int v = 2; v <= 3; ++v) {
      for (int m = p; m <= 4 * p; m += p) {
        cases.push_back({ScheduleKind::kInterleavedOneFOneB, p, v, m});
      }
    }
  }
  return cases;
}

TEST(ScheduleTest, EveryScheduleOverAGridOfSizes) {
  for (const GridCase &c : Grid()) {
    SCOPED_TRACE(testing::Message()
                 << ScheduleName(c.kind) << " p=" << c.ranks
                 << " v=" << c.stages_per_rank << " m=" << c.micro_batches);
    absl::StatusOr<Schedule> schedule =
        BuildSchedule(c.kind, c.ranks, c.micro_batches, c.stages_per_rank);
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    // Equal forward and backward halves, so the formulas hold exactly.
    ActionCosts costs;
    costs.forward = 1;
    costs.backward_input = 1;
    costs.backward_weight = 1;
    absl::StatusOr<ScheduleStats> stats = SimulateSchedule(*schedule, costs);
    ASSERT_TRUE(stats.ok()) << stats.status() << "\n"
                            << DescribeSchedule(*schedule);
    for (int rank = 0; rank < c.ranks; ++rank) {
      EXPECT_LE(stats->peak_activations[rank], ActivationBound(*schedule, rank))
          << "rank " << rank << "\n"
          << DescribeSchedule(*schedule);
      if (c.kind != ScheduleKind::kInterleavedOneFOneB) {
        // The bound is reached: it is the schedule's, not a loose one.
        EXPECT_EQ(stats->peak_activations[rank],
                  ActivationBound(*schedule, rank));
      }
      // Memory held for a micro-batch (its activations, or a deferred
      // weight gradient's inputs) stays within the schedule's bound, which
      // it reaches except for interleaved.
      EXPECT_LE(stats->peak_in_flight[rank], InFlightBound(*schedule, rank));
      if (c.kind != ScheduleKind::kInterleavedOneFOneB) {
        EXPECT_EQ(stats->peak_in_flight[rank], InFlightBound(*schedule, rank))
            << "rank " << rank << "\n"
            << DescribeSchedule(*schedule);
      }
      if (c.kind == ScheduleKind::kZeroBubbleH1) {
        // Rank r defers at most r weight gradients past the steady state's
        // input gradients (at most r + 1 while its cool-down runs).
        EXPECT_LE(stats->peak_deferred_weight_gradients[rank],
                  std::min(c.micro_batches, rank + 1));
      } else {
        EXPECT_EQ(stats->peak_deferred_weight_gradients[rank], 0);
      }
    }
    EXPECT_NEAR(stats->bubble_fraction, ExpectedBubbleFraction(*schedule),
                1e-12)
        << DescribeSchedule(*schedule);
  }
}

// GPipe and 1F1B have the same bubble whatever the forward/backward ratio.
TEST(ScheduleTest, BubbleOfGPipeAndOneFOneBWithBackwardTwiceForward) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
    for (int p = 1; p <= 5; ++p) {
      for (int m = 1; m <= 9; ++m) {
        absl::StatusOr<Schedule> schedule = BuildSchedule(kind, p, m);
        ASSERT_TRUE(schedule.ok());
        ActionCosts costs;
        costs.forward = 1;
        costs.backward_input = 1.25;
        costs.backward_weight = 0.75;
        absl::StatusOr<ScheduleStats> stats =
            SimulateSchedule(*schedule, costs);
        ASSERT_TRUE(stats.ok()) << stats.status();
        EXPECT_NEAR(stats->bubble_fraction, (p - 1.0) / (m + p - 1.0), 1e-12)
            << ScheduleName(kind) << " p=" << p << " m=" << m;
        EXPECT_NEAR(stats->makespan, 3.0 * (m + p - 1), 1e-12);
      }
    }
  }
}

// Every micro-batch's input gradient comes before its weight gradient, and
// each stage's weight gradients run in micro-batch order (so its gradient
// sums round as a single rank's accumulation): ZB-H1 over the grid.
TEST(ScheduleTest, ZeroBubbleRunsEveryWeightGradientInOrderAfterItsInput) {
  for (int p = 1; p <= 6; ++p) {
    for (int m = 1; m <= 12; ++m) {
      absl::StatusOr<Schedule> s =
          BuildSchedule(ScheduleKind::kZeroBubbleH1, p, m);
      ASSERT_TRUE(s.ok()) << s.status();
      for (int rank = 0; rank < p; ++rank) {
        const std::vector<Action> &list = s->actions[rank];
        int last_weight = -1;
        for (int mb = 0; mb < m; ++mb) {
          const int forward = Find(list, ActionKind::kForward, mb);
          const int input = Find(list, ActionKind::kBackwardInput, mb);
          const int weight = Find(list, ActionKind::kBackwardWeight, mb);
          ASSERT_GE(forward, 0);
          EXPECT_LT(forward, input) << "p=" << p << " m=" << m;
          EXPECT_LT(input, weight) << "p=" << p << " m=" << m;
          EXPECT_LT(last_weight, weight) << "p=" << p << " m=" << m;
          last_weight = weight;
          EXPECT_EQ(Find(list, ActionKind::kBackward, mb), -1);
        }
      }
    }
  }
}

// The point of ZB-H1: with the paper's equal F, B and W costs its bubble is
// 1F1B's idle time cut to a third (p - 1 units instead of 3 (p - 1)) once
// there are at least as many micro-batches as ranks, and never more than
// 1F1B's at any size; also with the weight half cheaper than the input
// half, and with a message time.
TEST(ScheduleTest, ZeroBubbleBubbleIsAThirdOfOneFOneBs) {
  for (int p = 2; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      absl::StatusOr<Schedule> zb =
          BuildSchedule(ScheduleKind::kZeroBubbleH1, p, m);
      absl::StatusOr<Schedule> one =
          BuildSchedule(ScheduleKind::kOneFOneB, p, m);
      ASSERT_TRUE(zb.ok() && one.ok());
      ActionCosts equal;  // F = B = W = 1
      absl::StatusOr<ScheduleStats> z = SimulateSchedule(*zb, equal);
      absl::StatusOr<ScheduleStats> o = SimulateSchedule(*one, equal);
      ASSERT_TRUE(z.ok() && o.ok()) << z.status() << o.status();
      SCOPED_TRACE(testing::Message() << "p=" << p << " m=" << m);
      EXPECT_LT(z->bubble_fraction, o->bubble_fraction);
      if (m >= p) {
        EXPECT_DOUBLE_EQ(z->makespan, 3.0 * m + (p - 1));
        EXPECT_DOUBLE_EQ(o->makespan - 3.0 * m, 3.0 * (p - 1));
      }
      for (ActionCosts costs : {ActionCosts{1, 1.2, 0.8}, ActionCosts{}}) {
        costs.message = 0.1;
        z = SimulateSchedule(*zb, costs);
        o = SimulateSchedule(*one, costs);
        ASSERT_TRUE(z.ok() && o.ok());
        EXPECT_LT(z->makespan, o->makespan);
      }
    }
  }
}

// The exact lists of a small ZB-H1: rank 0 runs each weight gradient right
// after its input gradient; rank 1 (the last) defers one, fills its
// cool-down with it and closes with the last.
TEST(ScheduleTest, ZeroBubbleTwoRanksThreeMicroBatchesExactly) {
  absl::StatusOr<Schedule> schedule =
      BuildSchedule(ScheduleKind::kZeroBubbleH1, 2, 3);
  ASSERT_TRUE(schedule.ok());
  EXPECT_EQ(DescribeSchedule(*schedule),
            "rank 0: F(s0,m0) sendA(s0,m0)->1 F(s0,m1) sendA(s0,m1)->1+ "
            "recvG(s0,m0)<-1 Bi(s0,m0) Bw(s0,m0) F(s0,m2) sendA(s0,m2)->1+ "
            "recvG(s0,m1)<-1 Bi(s0,m1) Bw(s0,m1) recvG(s0,m2)<-1 Bi(s0,m2) "
            "Bw(s0,m2) reduce(s0)\n"
            "rank 1: recvA(s1,m0)<-0 F(s1,m0) Bi(s1,m0) sendG(s1,m0)->0+ "
            "recvA(s1,m1)<-0 F(s1,m1) Bi(s1,m1) sendG(s1,m1)->0 Bw(s1,m0) "
            "recvA(s1,m2)<-0 F(s1,m2) Bi(s1,m2) sendG(s1,m2)->0 Bw(s1,m1) "
            "Bw(s1,m2) reduce(s1)\n");
}

// The step model's costs: a message delays each receive, the bottleneck
// stage sets the pace, the reduction adds at the end.
TEST(ScheduleTest, MessagesStageCostsAndReductionsTakeTime) {
  // GPipe with uniform costs and a message time c: the forwards pipeline
  // with f + c between ranks, the backwards with b + c, so the step is
  // m (f + b) + (p - 1) (f + b + 2c).
  for (int p = 1; p <= 5; ++p) {
    for (int m = 1; m <= 6; ++m) {
      absl::StatusOr<Schedule> gpipe =
          BuildSchedule(ScheduleKind::kGPipe, p, m);
      ASSERT_TRUE(gpipe.ok());
      ActionCosts costs;
      costs.forward = 1;
      costs.backward_input = 1.5;
      costs.backward_weight = 0.5;
      costs.message = 0.25;
      absl::StatusOr<ScheduleStats> stats = SimulateSchedule(*gpipe, costs);
      ASSERT_TRUE(stats.ok()) << stats.status();
      EXPECT_NEAR(stats->makespan, m * 3.0 + (p - 1) * 3.5, 1e-12)
          << "p=" << p << " m=" << m;
      // The messages are idle time: the bubble grows past (p-1)/(m+p-1).
      if (p > 1) {
        EXPECT_GT(stats->bubble_fraction, (p - 1.0) / (m + p - 1.0));
      }
    }
  }

  // Two stages, the second twice as expensive: by hand, rank 1's forwards
  // run back to back from t = 1 (ending at 9), its backwards from 9 to 25,
  // and rank 0's last backward (2) follows the last gradient: 27.
  absl::StatusOr<Schedule> two = BuildSchedule(ScheduleKind::kGPipe, 2, 4);
  ASSERT_TRUE(two.ok());
  ActionCosts uneven;
  uneven.stage_forward = {1, 2};
  uneven.stage_backward_input = {2, 4};
  uneven.stage_backward_weight = {0, 0};
  absl::StatusOr<ScheduleStats> stats = SimulateSchedule(*two, uneven);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_DOUBLE_EQ(stats->makespan, 27);
  // Rank 0 is busy 12 of 27, rank 1 24 of 27.
  EXPECT_NEAR(stats->bubble_fraction, 1 - 36.0 / 54.0, 1e-12);

  // The reduction of stage 0 is the last action of the step.
  uneven.reduce = 0.5;
  stats = SimulateSchedule(*two, uneven);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_DOUBLE_EQ(stats->makespan, 27.5);

  // Per-stage costs must cover every stage; no cost may be negative.
  uneven.stage_reduce = {1, 2, 3};
  stats = SimulateSchedule(*two, uneven);
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(stats.status().message().find("stage_reduce has 3 entries for 2"),
            std::string::npos)
      << stats.status();
  ActionCosts negative;
  negative.message = -1;
  EXPECT_EQ(SimulateSchedule(*two, negative).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The exact lists of a small 1F1B: warm-up, steady state with each
// send grouped with the following receive, cool-down, reduction.
TEST(ScheduleTest, OneFOneBTwoRanksThreeMicroBatchesExactly) {
  absl::StatusOr<Schedule> schedule =
      BuildSchedule(ScheduleKind::kOneFOneB, 2, 3);
  ASSERT_TRUE(schedule.ok());
  EXPECT_EQ(DescribeSchedule(*schedule),
            "rank 0: F(s0,m0) sendA(s0,m0)->1 F(s0,m1) sendA(s0,m1)->1+ "
            "recvG(s0,m0)<-1 B(s0,m0) F(s0,m2) sendA(s0,m2)->1+ "
            "recvG(s0,m1)<-1 B(s0,m1) recvG(s0,m2)<-1 B(s0,m2) reduce(s0)\n"
            "rank 1: recvA(s1,m0)<-0 F(s1,m0) B(s1,m0) sendG(s1,m0)->0+ "
            "recvA(s1,m1)<-0 F(s1,m1) B(s1,m1) sendG(s1,m1)->0+ "
            "recvA(s1,m2)<-0 F(s1,m2) B(s1,m2) sendG(s1,m2)->0 "
            "reduce(s1)\n");
}

TEST(ScheduleTest, InterleavedPlacesStagesLooping) {
  absl::StatusOr<Schedule> schedule =
      BuildSchedule(ScheduleKind::kInterleavedOneFOneB, 2, 4, 2);
  ASSERT_TRUE(schedule.ok());
  EXPECT_EQ(schedule->stages(), 4);
  EXPECT_EQ(schedule->StagesOfRank(1), (std::vector<int>{1, 3}));
  EXPECT_EQ(schedule->RankOfStage(2), 0);
}

// The split backward's halves are accepted in place of a backward, and a
// deferred weight gradient is counted.
TEST(ScheduleTest, SplitBackwardHalvesAreChecked) {
  absl::StatusOr<Schedule> s = BuildSchedule(ScheduleKind::kOneFOneB, 3, 4);
  ASSERT_TRUE(s.ok());
  for (std::vector<Action> &list : s->actions) {
    std::vector<Action> split;
    std::vector<Action> weights;
    for (const Action &a : list) {
      if (a.kind == ActionKind::kBackward) {
        Action input = a;
        input.kind = ActionKind::kBackwardInput;
        split.push_back(input);
        Action weight = a;
        weight.kind = ActionKind::kBackwardWeight;
        weights.push_back(weight);  // all deferred to the end
      } else if (a.kind == ActionKind::kReduceGradients) {
        split.insert(split.end(), weights.begin(), weights.end());
        weights.clear();
        split.push_back(a);
      } else {
        split.push_back(a);
      }
    }
    list = split;
  }
  absl::StatusOr<ScheduleStats> stats = SimulateSchedule(*s);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->peak_deferred_weight_gradients, (std::vector<int>{4, 4, 4}));
  // A weight gradient before its input gradient is refused.
  std::vector<Action> &rank2 = s->actions[2];
  const int weight = Find(rank2, ActionKind::kBackwardWeight, 0);
  ASSERT_GE(weight, 0);
  rank2.insert(rank2.begin() + 1, rank2[weight]);
  rank2.erase(rank2.begin() + weight + 1);
  EXPECT_THAT(SimulateSchedule(*s).status().message(),
              HasSubstr("weight gradient not right after"));
}

// The checker itself: schedules broken by hand fail with the rule named.
Schedule OneFOneB(int p, int m) {
  absl::StatusOr<Schedule> schedule =
      BuildSchedule(ScheduleKind::kOneFOneB, p, m);
  EXPECT_TRUE(schedule.ok());
  return *schedule;
}

TEST(ScheduleCheckTest, BackwardBeforeForwardFails) {
  Schedule s = OneFOneB(1, 2);
  std::swap(s.actions[0][0], s.actions[0][1]);  // B(m0) before F(m0)
  EXPECT_THAT(SimulateSchedule(s).status().message(),
              HasSubstr("backward before its forward"));
}

TEST(ScheduleCheckTest, SendsOutOfOrderFail) {
  // Rank 0 sends m1's activation before m0's; rank 1 receives m0 first.
  absl::StatusOr<Schedule> s = BuildSchedule(ScheduleKind::kGPipe, 2, 2);
  ASSERT_TRUE(s.ok());
  std::vector<Action> &rank0 = s->actions[0];
  const int first = Find(rank0, ActionKind::kSendActivation, 0);
  const int second = Find(rank0, ActionKind::kSendActivation, 1);
  std::swap(rank0[first].micro_batch, rank0[second].micro_batch);
  EXPECT_FALSE(SimulateSchedule(*s).ok());
}

TEST(ScheduleCheckTest, MissingReceiveDeadlocksOrIsUnmatched) {
  Schedule s = OneFOneB(2, 2);
  std::vector<Action> &rank1 = s.actions[1];
  const int recv = Find(rank1, ActionKind::kRecvActivation, 1);
  ASSERT_GE(recv, 0);
  if (recv > 0 && rank1[recv - 1].with_next) rank1[recv - 1].with_next = false;
  rank1.erase(rank1.begin() + recv);
  EXPECT_FALSE(SimulateSchedule(s).ok());
}

TEST(ScheduleCheckTest, DeadlockIsNamed) {
  // Both ranks receive first: each waits for the other forever.
  Schedule s = OneFOneB(2, 1);
  Action recv_grad = s.actions[0][2];  // recvG(s0,m0)<-1
  ASSERT_EQ(recv_grad.kind, ActionKind::kRecvGradient);
  s.actions[0].erase(s.actions[0].begin() + 2);
  s.actions[0].insert(s.actions[0].begin(), recv_grad);
  s.actions[0][1].with_next = false;
  absl::Status status = SimulateSchedule(s).status();
  EXPECT_THAT(status.message(), HasSubstr("deadlock"));
  EXPECT_THAT(status.message(), HasSubstr("rank 0 at recvG(s0,m0)<-1"));
}

// Over nccl a send blocks until its receiver takes it (ncclSend), and a
// rank's groups run in order on one stream: GPipe, 1F1B and ZB-H1 over the
// grid still run, their groups issued whole (the executor issues a group's
// sends and receives as one NCCL group there). The interleaved lists rely
// on eager sends: with 2 ranks, rank 0's stream blocks in a gradient send
// that rank 1 receives only after a group needing rank 0's next group
// (rank 1's activation send). The executor refuses them over nccl by
// this check's error.
TEST(BlockingMessagesTest, EveryScheduleButInterleavedRunsOverAGrid) {
  for (const GridCase &c : Grid()) {
    SCOPED_TRACE(testing::Message()
                 << ScheduleName(c.kind) << " p=" << c.ranks
                 << " v=" << c.stages_per_rank << " m=" << c.micro_batches);
    absl::StatusOr<Schedule> schedule =
        BuildSchedule(c.kind, c.ranks, c.micro_batches, c.stages_per_rank);
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    const absl::Status status = CheckBlockingMessages(*schedule);
    if (c.kind != ScheduleKind::kInterleavedOneFOneB) {
      EXPECT_TRUE(status.ok()) << status << "\n" << DescribeSchedule(*schedule);
    }
  }
  absl::StatusOr<Schedule> interleaved =
      BuildSchedule(ScheduleKind::kInterleavedOneFOneB, 2, 4, 2);
  ASSERT_TRUE(interleaved.ok());
  EXPECT_THAT(CheckBlockingMessages(*interleaved).message(),
              HasSubstr("interleaved_1f1b over 2 ranks, 4 micro-batches "
                        "deadlocks when a send waits for its receiver"));
}

// Two ranks exchanging in one step (1F1B's steady state: rank 0 sends an
// activation and receives a gradient, rank 1 the reverse) deadlock once
// each group is cut in two, the send first: each rank's stream blocks in
// its send, its receive queued behind it. Eager sends (SimulateSchedule,
// MPI) do not see it.
TEST(BlockingMessagesTest, ExchangeCutInTwoDeadlocksByName) {
  absl::StatusOr<Schedule> s = BuildSchedule(ScheduleKind::kOneFOneB, 2, 4);
  ASSERT_TRUE(s.ok());
  bool cut = false;
  for (std::vector<Action> &list : s->actions) {
    for (size_t i = 0; i + 1 < list.size(); ++i) {
      if (!list[i].with_next) continue;
      // The send first, then the receive, as two groups.
      const bool send_first = list[i].kind == ActionKind::kSendActivation ||
                              list[i].kind == ActionKind::kSendGradient;
      if (!send_first) std::swap(list[i], list[i + 1]);
      list[i].with_next = false;
      list[i + 1].with_next = false;
      cut = true;
    }
  }
  ASSERT_TRUE(cut) << DescribeSchedule(*s);
  EXPECT_TRUE(SimulateSchedule(*s).ok());
  const absl::Status status = CheckBlockingMessages(*s);
  EXPECT_THAT(status.message(), HasSubstr("deadlocks"));
  EXPECT_THAT(status.message(), HasSubstr("rank 0 waits for a receive"));
  EXPECT_THAT(status.message(), HasSubstr("its stream blocked in sendA"));
}

TEST(ScheduleCheckTest, MismatchedMicroBatchesFail) {
  Schedule s = OneFOneB(2, 2);
  for (Action &a : s.actions[1]) {
    if (a.kind == ActionKind::kRecvActivation)
      a.micro_batch = 1 - a.micro_batch;
  }
  EXPECT_THAT(SimulateSchedule(s).status().message(),
              HasSubstr("not its counterpart"));
}

TEST(ScheduleCheckTest, MissingReductionFails) {
  Schedule s = OneFOneB(2, 2);
  s.actions[1].pop_back();
  EXPECT_THAT(SimulateSchedule(s).status().message(),
              HasSubstr("never reduced"));
}

TEST(ScheduleBuildTest, BadSizesAreNamed) {
  EXPECT_THAT(BuildSchedule(ScheduleKind::kOneFOneB, 0, 4).status().message(),
              HasSubstr("pipeline ranks must be >= 1"));
  EXPECT_THAT(BuildSchedule(ScheduleKind::kGPipe, 2, 0).status().message(),
              HasSubstr("micro-batches must be >= 1"));
  EXPECT_THAT(BuildSchedule(ScheduleKind::kInterleavedOneFOneB, 2, 3, 2)
                  .status()
                  .message(),
              HasSubstr("multiple of the pipeline ranks"));
  EXPECT_THAT(
      BuildSchedule(ScheduleKind::kOneFOneB, 2, 4, 2).status().message(),
      HasSubstr("use interleaved_1f1b"));
}

TEST(ScheduleBuildTest, NamesRoundTrip) {
  for (ScheduleKind kind :
       {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
        ScheduleKind::kInterleavedOneFOneB, ScheduleKind::kZeroBubbleH1}) {
    absl::StatusOr<ScheduleKind> parsed = ParseScheduleKind(ScheduleName(kind));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, kind);
  }
  EXPECT_THAT(ParseScheduleKind("pipedream").status().message(),
              HasSubstr("expected one of gpipe, 1f1b"));
}

TEST(ScheduleBuildTest, TheConfigsScheduleIsTheKindOfTheSameName) {
  EXPECT_EQ(ScheduleKindOf(config::PipelineSchedule::kGPipe),
            ScheduleKind::kGPipe);
  EXPECT_EQ(ScheduleKindOf(config::PipelineSchedule::kOneFOneB),
            ScheduleKind::kOneFOneB);
  EXPECT_EQ(ScheduleKindOf(config::PipelineSchedule::kInterleavedOneFOneB),
            ScheduleKind::kInterleavedOneFOneB);
  EXPECT_EQ(ScheduleKindOf(config::PipelineSchedule::kZeroBubbleH1),
            ScheduleKind::kZeroBubbleH1);
}

}  // namespace
}  // namespace pipeline
}  // namespace ze
