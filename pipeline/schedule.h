// Pipeline schedules as data: for each rank of a pipeline group, the list of
// actions it runs in one training step (forward or backward of a micro-batch
// on one of its stages, sending or receiving an activation or its gradient,
// reducing a stage's gradients). One executor interprets the lists; this
// file only builds them and checks them, with no tensors and no
// communicator, so every schedule is unit-tested alone over many sizes and
// every rank, given the same (kind, ranks, micro-batches, stages per rank),
// builds the same lists.
//
// Stages and ranks. The model's layer sequence is cut into
// `ranks * stages_per_rank` stages, numbered in model order. Stage s lives on
// pipeline rank s % ranks (the looping placement of Megatron's interleaved
// schedule; with one stage per rank, stage s is rank s). An activation flows
// from stage s to s + 1, its gradient from s + 1 back to s.
//
// Communication. Every action that needs a tensor from another rank is
// preceded by a receive, every action whose result another rank needs is
// followed by a send. Consecutive sends and receives of a rank form one
// group (`with_next`), which the executor issues together. Sends are
// eager: the executor issues them and goes on, keeping the sent tensor
// alive until the step's end, where it waits for them all (MPI's Isend; on
// a GPU, sends on a stream of their own); a group waits only for its
// receives. Messages between two ranks are matched in issue order (first
// send to first receive), as NCCL's point-to-point does, so each rank's
// lists must post them in the same order on both sides; SimulateSchedule
// proves it by running all ranks' lists together.
//
// Thread-compatible value types.
#ifndef ZE_PIPELINE_SCHEDULE_H_
#define ZE_PIPELINE_SCHEDULE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config/config.h"

namespace ze {
namespace pipeline {

enum class ScheduleKind {
  // All forwards, then all backwards (PyTorch's Pipe(chunks=m)): m
  // micro-batches' activations live at once.
  kGPipe,
  // One forward, one backward (PipeDream-flush, DeepSpeed's TrainSchedule,
  // Megatron's default): rank r runs p - r - 1 warm-up forwards, then
  // alternates; at most p - r activations live.
  kOneFOneB,
  // 1F1B with several stages per rank (Megatron's interleaved schedule):
  // the bubble shrinks by the number of stages per rank, at the cost of
  // more messages. Micro-batches must be a multiple of the ranks.
  kInterleavedOneFOneB,
  // Zero bubble, ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline
  // Parallelism"): 1F1B's order of forwards and input-gradient backwards
  // (kBackwardInput, which alone feeds the previous stage), with the
  // weight-gradient halves (kBackwardWeight) deferred: rank r keeps up to
  // r of them pending in the steady state and runs one after each of its
  // cool-down's input gradients, then the rest, so they fill the time
  // 1F1B's cool-down waits for gradients. Rank r's forwards not yet
  // backpropagated are 1F1B's, min(m, p - r); with the deferred weight
  // gradients every rank holds at most min(m, p) micro-batches (F ran, W
  // not), 1F1B's peak (rank 0's). With equal F, B and W costs the bubble
  // is (p - 1) / (3m + p - 1) for m >= p, a third of 1F1B's idle time.
  // One stage per rank.
  kZeroBubbleH1,
};

// "gpipe", "1f1b", "interleaved_1f1b", "zb_h1".
const char *ScheduleName(ScheduleKind kind);
// The inverse of ScheduleName. InvalidArgument naming the accepted names.
absl::StatusOr<ScheduleKind> ParseScheduleKind(const std::string &name);
// The config's "pipeline.schedule" as a kind (the engine and train_gpt
// --dry_run both build the schedule from it).
ScheduleKind ScheduleKindOf(config::PipelineSchedule schedule);

enum class ActionKind {
  kForward,          // stage's forward of micro_batch; stashes its inputs
  kBackward,         // the whole backward (input and weight gradients)
  kBackwardInput,    // split backward: gradient w.r.t. the stage's input
                     // (and the parameter gradients a layer does not
                     // defer, nn/module.h BackwardPart)
  kBackwardWeight,   // split backward: the deferred weight gradients,
                     // after kBackwardInput of the same micro-batch
  kSendActivation,   // stage's output of micro_batch to stage + 1 (on peer)
  kRecvActivation,   // stage's input of micro_batch from stage - 1 (on peer)
  kSendGradient,     // gradient w.r.t. stage's input to stage - 1 (on peer)
  kRecvGradient,     // gradient w.r.t. stage's output from stage + 1 (peer)
  kReduceGradients,  // stage's gradients across its data-parallel group,
                     // after its last micro-batch's backward
};

// "F", "B", "Bi", "Bw", "sendA", "recvA", "sendG", "recvG", "reduce".
const char *ActionKindName(ActionKind kind);
bool IsCommunication(ActionKind kind);

struct Action {
  ActionKind kind = ActionKind::kForward;
  int stage = 0;         // the model stage (0 .. stages - 1) acted on
  int micro_batch = -1;  // -1 for kReduceGradients
  int peer = -1;         // communication: the other pipeline rank
  // Communication: issued and waited on together with the next action
  // (also communication) as one group.
  bool with_next = false;

  // "F(s1,m3)", "sendA(s1,m3)->2", "reduce(s1)".
  std::string ToString() const;
  bool operator==(const Action &other) const;
};

struct Schedule {
  ScheduleKind kind = ScheduleKind::kOneFOneB;
  int ranks = 1;            // pipeline ranks (p)
  int stages_per_rank = 1;  // v; > 1 only for the interleaved schedule
  int micro_batches = 1;    // m
  // actions[r]: what pipeline rank r runs, in order.
  std::vector<std::vector<Action>> actions;

  int stages() const { return ranks * stages_per_rank; }
  int RankOfStage(int stage) const { return stage % ranks; }
  // The stages rank r holds, in model order.
  std::vector<int> StagesOfRank(int rank) const;
};

// Builds `kind` for `ranks` pipeline ranks, `micro_batches` micro-batches and
// `stages_per_rank` stages on each rank (1 except for the interleaved
// schedule, which needs at least 2 ranks and a multiple of `ranks`
// micro-batches). Errors: InvalidArgument naming the bad size.
absl::StatusOr<Schedule> BuildSchedule(ScheduleKind kind, int ranks,
                                       int micro_batches,
                                       int stages_per_rank = 1);

// Durations for SimulateSchedule, in any one unit (relative by default;
// seconds for a step model). A full backward costs backward_input +
// backward_weight.
struct ActionCosts {
  double forward = 1;
  double backward_input = 1;
  double backward_weight = 1;
  // Per stage (stages() entries, model order), replacing the three above
  // when non-empty: a pipeline's first and last stages also carry the
  // embedding and the head, and a partition is rarely exact.
  std::vector<double> stage_forward;
  std::vector<double> stage_backward_input;
  std::vector<double> stage_backward_weight;
  // From a send's issue to its data's arrival (an activation or a gradient,
  // latency plus bytes over the link's bandwidth): a receive completes no
  // earlier than its send's issue plus this. The sender does not wait.
  double message = 0;
  // kReduceGradients: the stage's data-parallel gradient reduction (and
  // whatever else the step does once per stage, e.g. the optimizer).
  double reduce = 0;
  std::vector<double> stage_reduce;  // per stage when non-empty

  double Forward(int stage) const;
  double BackwardInput(int stage) const;
  double BackwardWeight(int stage) const;
  double Reduce(int stage) const;
};

// What running every rank's list together shows.
struct ScheduleStats {
  double makespan = 0;  // time of the last action's end (costs above)
  // Idle share of the ranks' time: 1 - busy / (ranks * makespan).
  double bubble_fraction = 0;
  // Per rank, the most micro-batches whose forward ran on one of the rank's
  // stages and whose input gradient has not (their stashed activations).
  std::vector<int> peak_activations;
  // Per rank, the most micro-batches whose input gradient ran and whose
  // weight gradient has not (split backwards' deferred W).
  std::vector<int> peak_deferred_weight_gradients;
  // Per rank, the most micro-batches whose forward ran and whose backward
  // has not finished (the whole one, or the weight half): what the rank
  // holds memory for, activations or a deferred weight gradient's inputs.
  std::vector<int> peak_in_flight;
  // Per rank, its compute time (the costs of its compute actions, reduce
  // included) and its idle share of the step, 1 - rank_busy / makespan:
  // what the executor measures on a rank of a real step
  // (pipeline/step_time.h StepTimes::bubble_fraction, every rank's step
  // ending together). bubble_fraction is their mean.
  std::vector<double> rank_busy;
  std::vector<double> rank_bubble;
  // Per rank, when each of its compute actions ran, in list order: the
  // simulated timeline, to replay through a StepTimer (step_time_test).
  struct Interval {
    size_t action = 0;  // index in the rank's list
    double start = 0;
    double end = 0;
  };
  std::vector<std::vector<Interval>> compute_intervals;
};

// Runs the ranks' lists together, sends eager (complete when issued) and a
// receive complete once its send was issued and costs.message has passed,
// and checks:
//   - every stage runs, for every micro-batch, exactly one forward and one
//     backward (or one kBackwardInput then one kBackwardWeight), the
//     forward first, on the rank that holds the stage;
//   - a stage's forward follows the receipt of its input (stage > 0) and its
//     backward the receipt of its output's gradient (not the last stage);
//   - every send matches the peer's receive of the same kind, stage and
//     micro-batch, in order, and nothing is left unmatched;
//   - no group waits forever (deadlock): the error names each rank's
//     blocked action;
//   - kReduceGradients for each stage exactly once, after its last
//     backward.
// Errors: Internal naming the rank, the action and the rule broken;
// InvalidArgument for per-stage costs of the wrong length or any negative
// cost.
absl::StatusOr<ScheduleStats> SimulateSchedule(
    const Schedule &schedule, const ActionCosts &costs = ActionCosts());

// Checks that the ranks' lists cannot deadlock where a send blocks until its
// receiver takes it (NCCL: ncclSend blocks its stream), as the executor runs
// them over such a backend (comm::Communicator::sends_wait_for_receiver):
// each group's sends and receives issued together as one group on one
// ordered stream per rank, a group complete once every message in it met
// its peer's matching message in the group the peer's stream is running
// (messages of one group progress independently), the host waiting for a
// group with receives right after issuing it, and for every group issued
// at its first kReduceGradients and at the end. Sends are not eager here:
// SimulateSchedule's lists must also pass this to run over nccl.
// Errors: Internal naming every blocked rank and the group its stream
// is blocked in.
absl::Status CheckBlockingMessages(const Schedule &schedule);

// The bubble fraction the literature gives for `schedule`'s kind and sizes
// with equal per-stage costs: (p - 1) / (m + p - 1) for GPipe and 1F1B,
// (p - 1) / (v m + p - 1) for interleaved 1F1B; for ZB-H1 with equal
// forward, input-gradient and weight-gradient costs, i = (p - 1) +
// max(0, p - m) idle units per rank over 3m + i (with fewer micro-batches
// than ranks there are too few weight gradients to fill the cool-down).
double ExpectedBubbleFraction(const Schedule &schedule);

// The most micro-batches a rank of `schedule` stashes activations for, by
// the schedule's design: m for GPipe; min(m, p - rank) for 1F1B and ZB-H1;
// for interleaved, Megatron's warm-up count plus one,
// min(v m, 2 (p - rank - 1) + (v - 1) p + 1).
int ActivationBound(const Schedule &schedule, int rank);

// The most micro-batches a rank of `schedule` holds in flight (forward ran,
// backward not finished; ScheduleStats::peak_in_flight): the activation
// bound, except for ZB-H1, whose deferred weight gradients raise every
// rank's to min(m, p), rank 0's under 1F1B.
int InFlightBound(const Schedule &schedule, int rank);

// One line per rank, its actions separated by spaces (for messages and
// debugging).
std::string DescribeSchedule(const Schedule &schedule);

}  // namespace pipeline
}  // namespace ze

#endif  // ZE_PIPELINE_SCHEDULE_H_
