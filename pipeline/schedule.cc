#include "pipeline/schedule.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ze {
namespace pipeline {
namespace {

Action Compute(ActionKind kind, int stage, int micro_batch) {
  Action action;
  action.kind = kind;
  action.stage = stage;
  action.micro_batch = micro_batch;
  return action;
}

Action Message(ActionKind kind, int stage, int micro_batch, int peer) {
  Action action = Compute(kind, stage, micro_batch);
  action.peer = peer;
  return action;
}

bool IsBackwardStart(ActionKind kind) {
  return kind == ActionKind::kBackward || kind == ActionKind::kBackwardInput;
}

// The compute actions of rank `rank` in order, before communication is
// added: this is what distinguishes one schedule from another.
std::vector<Action> ComputeOrder(const Schedule &s, int rank) {
  const int p = s.ranks;
  const int m = s.micro_batches;
  std::vector<Action> order;
  switch (s.kind) {
    case ScheduleKind::kGPipe:
      for (int mb = 0; mb < m; ++mb) {
        order.push_back(Compute(ActionKind::kForward, rank, mb));
      }
      // Ascending, as gradient accumulation on one rank sums them, so the
      // stage's gradient sums round alike.
      for (int mb = 0; mb < m; ++mb) {
        order.push_back(Compute(ActionKind::kBackward, rank, mb));
      }
      break;
    case ScheduleKind::kOneFOneB: {
      const int warmup = std::min(p - rank - 1, m);
      for (int mb = 0; mb < warmup; ++mb) {
        order.push_back(Compute(ActionKind::kForward, rank, mb));
      }
      for (int i = 0; i < m - warmup; ++i) {
        order.push_back(Compute(ActionKind::kForward, rank, warmup + i));
        order.push_back(Compute(ActionKind::kBackward, rank, i));
      }
      for (int mb = m - warmup; mb < m; ++mb) {
        order.push_back(Compute(ActionKind::kBackward, rank, mb));
      }
      break;
    }
    case ScheduleKind::kInterleavedOneFOneB: {
      // Megatron's order: micro-batches in groups of p, each group through
      // all of the rank's stages (chunks) before the next group; backward
      // visits the chunks in reverse.
      const int v = s.stages_per_rank;
      const int total = m * v;
      auto forward = [&](int k) {
        const int chunk = (k / p) % v;
        const int mb = (k / (p * v)) * p + k % p;
        return Compute(ActionKind::kForward, chunk * p + rank, mb);
      };
      auto backward = [&](int k) {
        const int chunk = v - 1 - (k / p) % v;
        const int mb = (k / (p * v)) * p + k % p;
        return Compute(ActionKind::kBackward, chunk * p + rank, mb);
      };
      const int warmup = std::min((p - rank - 1) * 2 + (v - 1) * p, total);
      for (int k = 0; k < warmup; ++k) order.push_back(forward(k));
      for (int i = 0; i < total - warmup; ++i) {
        order.push_back(forward(warmup + i));
        order.push_back(backward(i));
      }
      for (int k = total - warmup; k < total; ++k) {
        order.push_back(backward(k));
      }
      break;
    }
    case ScheduleKind::kZeroBubbleH1: {
      // 1F1B's forwards and input gradients. Rank r defers up to r weight
      // gradients in the steady state (the last rank, which 1F1B keeps at
      // one micro-batch in flight, the most), so every rank holds at most
      // p micro-batches; in the cool-down each input gradient is followed
      // by one weight gradient, which fills the wait for the next input
      // gradient from rank r + 1; the rest close the step. Weight gradients
      // run in micro-batch order, so a stage's gradient sums round as a
      // single rank's accumulation does.
      const int warmup = std::min(p - rank - 1, m);
      std::vector<int> deferred;  // a queue: front first
      size_t front = 0;
      auto weight = [&]() {
        order.push_back(
            Compute(ActionKind::kBackwardWeight, rank, deferred[front++]));
      };
      auto input = [&](int mb) {
        order.push_back(Compute(ActionKind::kBackwardInput, rank, mb));
        deferred.push_back(mb);
      };
      for (int mb = 0; mb < warmup; ++mb) {
        order.push_back(Compute(ActionKind::kForward, rank, mb));
      }
      for (int i = 0; i < m - warmup; ++i) {
        order.push_back(Compute(ActionKind::kForward, rank, warmup + i));
        input(i);
        if (static_cast<int>(deferred.size() - front) > rank) weight();
      }
      for (int mb = m - warmup; mb < m; ++mb) {
        input(mb);
        weight();
      }
      while (front < deferred.size()) weight();
      break;
    }
  }
  return order;
}

// Adds the receives before and sends after each compute action, groups
// each run of consecutive messages, and ends with the gradient reductions.
std::vector<Action> WithCommunication(const Schedule &s,
                                      const std::vector<Action> &order,
                                      int rank) {
  const int last = s.stages() - 1;
  std::vector<Action> out;
  auto add_message = [&](Action message) {
    if (!out.empty() && IsCommunication(out.back().kind)) {
      out.back().with_next = true;
    }
    out.push_back(message);
  };
  for (const Action &a : order) {
    if (a.kind == ActionKind::kForward && a.stage > 0) {
      add_message(Message(ActionKind::kRecvActivation, a.stage, a.micro_batch,
                          s.RankOfStage(a.stage - 1)));
    }
    if (IsBackwardStart(a.kind) && a.stage < last) {
      add_message(Message(ActionKind::kRecvGradient, a.stage, a.micro_batch,
                          s.RankOfStage(a.stage + 1)));
    }
    out.push_back(a);
    if (a.kind == ActionKind::kForward && a.stage < last) {
      add_message(Message(ActionKind::kSendActivation, a.stage, a.micro_batch,
                          s.RankOfStage(a.stage + 1)));
    }
    if (IsBackwardStart(a.kind) && a.stage > 0) {
      add_message(Message(ActionKind::kSendGradient, a.stage, a.micro_batch,
                          s.RankOfStage(a.stage - 1)));
    }
  }
  std::vector<int> stages = s.StagesOfRank(rank);
  std::reverse(stages.begin(), stages.end());  // last finished first
  for (int stage : stages) {
    out.push_back(Compute(ActionKind::kReduceGradients, stage, -1));
  }
  return out;
}

// One message posted on a channel (sender -> receiver).
struct Posted {
  Action action;
  double time = 0;
};

// The simulation's view of one rank.
struct RankState {
  size_t next = 0;       // index of the next action
  double clock = 0;      // when the previous action ended
  double busy = 0;       // compute time so far
  bool posted = false;   // the current group's messages are posted
  size_t group_end = 0;  // one past the current group's last action
  // (index on the channel) of each message of the posted group.
  std::vector<size_t> slots;
  int stashed = 0;
  int deferred = 0;
};

using StageMb = std::pair<int, int>;

}  // namespace

const char *ScheduleName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::kOneFOneB:
      return "1f1b";
    case ScheduleKind::kInterleavedOneFOneB:
      return "interleaved_1f1b";
    case ScheduleKind::kZeroBubbleH1:
      return "zb_h1";
  }
  return "?";
}

ScheduleKind ScheduleKindOf(config::PipelineSchedule schedule) {
  switch (schedule) {
    case config::PipelineSchedule::kGPipe:
      return ScheduleKind::kGPipe;
    case config::PipelineSchedule::kOneFOneB:
      return ScheduleKind::kOneFOneB;
    case config::PipelineSchedule::kInterleavedOneFOneB:
      return ScheduleKind::kInterleavedOneFOneB;
    case config::PipelineSchedule::kZeroBubbleH1:
      return ScheduleKind::kZeroBubbleH1;
  }
  return ScheduleKind::kOneFOneB;
}

absl::StatusOr<ScheduleKind> ParseScheduleKind(const std::string &name) {
  for (ScheduleKind kind :
       {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
        ScheduleKind::kInterleavedOneFOneB, ScheduleKind::kZeroBubbleH1}) {
    if (name == ScheduleName(kind)) return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown pipeline schedule \"", name,
                   "\"; expected one of gpipe, 1f1b, interleaved_1f1b, zb_h1"));
}

const char *ActionKindName(ActionKind kind) {
  switch (kind) {
    case ActionKind::kForward:
      return "F";
    case ActionKind::kBackward:
      return "B";
    case ActionKind::kBackwardInput:
      return "Bi";
    case ActionKind::kBackwardWeight:
      return "Bw";
    case ActionKind::kSendActivation:
      return "sendA";
    case ActionKind::kRecvActivation:
      return "recvA";
    case ActionKind::kSendGradient:
      return "sendG";
    case ActionKind::kRecvGradient:
      return "recvG";
    case ActionKind::kReduceGradients:
      return "reduce";
  }
  return "?";
}

bool IsCommunication(ActionKind kind) {
  return kind == ActionKind::kSendActivation ||
         kind == ActionKind::kRecvActivation ||
         kind == ActionKind::kSendGradient || kind == ActionKind::kRecvGradient;
}

std::string Action::ToString() const {
  if (kind == ActionKind::kReduceGradients) {
    return absl::StrCat(ActionKindName(kind), "(s", stage, ")");
  }
  std::string text =
      absl::StrCat(ActionKindName(kind), "(s", stage, ",m", micro_batch, ")");
  if (IsCommunication(kind)) {
    const bool send = kind == ActionKind::kSendActivation ||
                      kind == ActionKind::kSendGradient;
    absl::StrAppend(&text, send ? "->" : "<-", peer, with_next ? "+" : "");
  }
  return text;
}

bool Action::operator==(const Action &other) const {
  return std::tie(kind, stage, micro_batch, peer, with_next) ==
         std::tie(other.kind, other.stage, other.micro_batch, other.peer,
                  other.with_next);
}

std::vector<int> Schedule::StagesOfRank(int rank) const {
  std::vector<int> stages;
  for (int chunk = 0; chunk < stages_per_rank; ++chunk) {
    stages.push_back(chunk * ranks + rank);
  }
  return stages;
}

absl::StatusOr<Schedule> BuildSchedule(ScheduleKind kind, int ranks,
                                       int micro_batches, int stages_per_rank) {
  const std::string what =
      absl::StrCat("pipeline schedule ", ScheduleName(kind));
  if (ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": pipeline ranks must be >= 1, got ", ranks));
  }
  if (micro_batches < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": micro-batches must be >= 1, got ", micro_batches));
  }
  if (kind == ScheduleKind::kInterleavedOneFOneB) {
    if (stages_per_rank < 2 || ranks < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " needs at least 2 ranks and 2 stages per rank, got ", ranks,
          " ranks and ", stages_per_rank, " stages per rank"));
    }
    if (micro_batches % ranks != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " needs micro-batches (", micro_batches,
          ") to be a multiple of the pipeline ranks (", ranks, ")"));
    }
  } else if (stages_per_rank != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " holds one stage per rank; got ", stages_per_rank,
                     " (use interleaved_1f1b for several)"));
  }
  Schedule schedule;
  schedule.kind = kind;
  schedule.ranks = ranks;
  schedule.stages_per_rank = stages_per_rank;
  schedule.micro_batches = micro_batches;
  for (int rank = 0; rank < ranks; ++rank) {
    schedule.actions.push_back(
        WithCommunication(schedule, ComputeOrder(schedule, rank), rank));
  }
  return schedule;
}

namespace {

double StageOr(const std::vector<double> &per_stage, double uniform,
               int stage) {
  return per_stage.empty() ? uniform : per_stage[stage];
}

absl::Status CheckCosts(const ActionCosts &costs, int stages) {
  for (const auto &[name, per_stage, uniform] :
       {std::tuple<const char *, const std::vector<double> *, double>{
            "forward", &costs.stage_forward, costs.forward},
        {"backward_input", &costs.stage_backward_input, costs.backward_input},
        {"backward_weight", &costs.stage_backward_weight,
         costs.backward_weight},
        {"reduce", &costs.stage_reduce, costs.reduce}}) {
    if (!per_stage->empty() && static_cast<int>(per_stage->size()) != stages) {
      return absl::InvalidArgumentError(
          absl::StrCat("ActionCosts: stage_", name, " has ", per_stage->size(),
                       " entries for ", stages, " stages"));
    }
    bool negative = uniform < 0;
    for (double cost : *per_stage) negative = negative || cost < 0;
    if (negative) {
      return absl::InvalidArgumentError(
          absl::StrCat("ActionCosts: a negative ", name, " cost"));
    }
  }
  if (costs.message < 0) {
    return absl::InvalidArgumentError("ActionCosts: a negative message time");
  }
  return absl::OkStatus();
}

}  // namespace

double ActionCosts::Forward(int stage) const {
  return StageOr(stage_forward, forward, stage);
}
double ActionCosts::BackwardInput(int stage) const {
  return StageOr(stage_backward_input, backward_input, stage);
}
double ActionCosts::BackwardWeight(int stage) const {
  return StageOr(stage_backward_weight, backward_weight, stage);
}
double ActionCosts::Reduce(int stage) const {
  return StageOr(stage_reduce, reduce, stage);
}

absl::StatusOr<ScheduleStats> SimulateSchedule(const Schedule &s,
                                               const ActionCosts &costs) {
  const int p = s.ranks;
  const int last = s.stages() - 1;
  if (absl::Status bad = CheckCosts(costs, s.stages()); !bad.ok()) return bad;
  if (static_cast<int>(s.actions.size()) != p) {
    return absl::InternalError(absl::StrCat("schedule has ", s.actions.size(),
                                            " action lists for ", p, " ranks"));
  }
  std::vector<RankState> state(p);
  ScheduleStats stats;
  stats.peak_activations.assign(p, 0);
  stats.peak_deferred_weight_gradients.assign(p, 0);
  stats.peak_in_flight.assign(p, 0);
  stats.compute_intervals.assign(p, {});
  // (sender, receiver) -> messages in posting order, sends and receives.
  std::map<std::pair<int, int>, std::vector<Posted>> sends, receives;
  std::set<StageMb> forwarded, input_graded, weight_graded, received_act,
      received_grad;
  std::set<int> reduced;

  auto fail = [&](int rank, const Action &a, const std::string &rule) {
    return absl::InternalError(
        absl::StrCat(ScheduleName(s.kind), " p=", p, " v=", s.stages_per_rank,
                     " m=", s.micro_batches, ": rank ", rank, " action ",
                     a.ToString(), ": ", rule));
  };
  auto is_send = [](ActionKind k) {
    return k == ActionKind::kSendActivation || k == ActionKind::kSendGradient;
  };

  // Checks what a message may only do once its data exists, and its peer.
  auto check_message = [&](int rank, const Action &a) -> absl::Status {
    const StageMb key{a.stage, a.micro_batch};
    int want_peer = -1;
    switch (a.kind) {
      case ActionKind::kSendActivation:
        if (a.stage >= last || !forwarded.count(key)) {
          return fail(rank, a, "sends an activation it has not computed");
        }
        want_peer = s.RankOfStage(a.stage + 1);
        break;
      case ActionKind::kSendGradient:
        if (a.stage <= 0 || !input_graded.count(key)) {
          return fail(rank, a, "sends a gradient it has not computed");
        }
        want_peer = s.RankOfStage(a.stage - 1);
        break;
      case ActionKind::kRecvActivation:
        if (a.stage <= 0) return fail(rank, a, "stage 0 receives no input");
        want_peer = s.RankOfStage(a.stage - 1);
        break;
      case ActionKind::kRecvGradient:
        if (a.stage >= last) {
          return fail(rank, a, "the last stage receives no gradient");
        }
        want_peer = s.RankOfStage(a.stage + 1);
        break;
      default:
        break;
    }
    if (a.peer != want_peer) {
      return fail(rank, a, absl::StrCat("peer should be rank ", want_peer));
    }
    if (s.RankOfStage(a.stage) != rank) {
      return fail(rank, a, "stage is not held by this rank");
    }
    return absl::OkStatus();
  };

  // Runs one compute action (checked) on `rank`.
  auto run_compute = [&](int rank, const Action &a) -> absl::Status {
    RankState &r = state[rank];
    const StageMb key{a.stage, a.micro_batch};
    if (s.RankOfStage(a.stage) != rank || a.stage < 0 || a.stage > last) {
      return fail(rank, a, "stage is not held by this rank");
    }
    if (a.kind != ActionKind::kReduceGradients &&
        (a.micro_batch < 0 || a.micro_batch >= s.micro_batches)) {
      return fail(rank, a, "micro-batch out of range");
    }
    double cost = 0;
    switch (a.kind) {
      case ActionKind::kForward:
        if (forwarded.count(key)) return fail(rank, a, "second forward");
        if (a.stage > 0 && !received_act.count(key)) {
          return fail(rank, a, "forward before its input was received");
        }
        forwarded.insert(key);
        ++r.stashed;
        cost = costs.Forward(a.stage);
        break;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput:
        if (!forwarded.count(key)) {
          return fail(rank, a, "backward before its forward");
        }
        if (input_graded.count(key)) return fail(rank, a, "second backward");
        if (a.stage < last && !received_grad.count(key)) {
          return fail(rank, a, "backward before its gradient was received");
        }
        input_graded.insert(key);
        --r.stashed;
        if (a.kind == ActionKind::kBackward) {
          weight_graded.insert(key);
          cost = costs.BackwardInput(a.stage) + costs.BackwardWeight(a.stage);
        } else {
          ++r.deferred;
          cost = costs.BackwardInput(a.stage);
        }
        break;
      case ActionKind::kBackwardWeight:
        if (!input_graded.count(key) || weight_graded.count(key)) {
          return fail(rank, a,
                      "weight gradient not right after one input gradient");
        }
        weight_graded.insert(key);
        --r.deferred;
        cost = costs.BackwardWeight(a.stage);
        break;
      case ActionKind::kReduceGradients:
        if (reduced.count(a.stage)) return fail(rank, a, "second reduction");
        for (int mb = 0; mb < s.micro_batches; ++mb) {
          if (!weight_graded.count({a.stage, mb})) {
            return fail(rank, a,
                        absl::StrCat("reduction before micro-batch ", mb,
                                     "'s backward"));
          }
        }
        reduced.insert(a.stage);
        cost = costs.Reduce(a.stage);
        break;
      default:
        return fail(rank, a, "not a compute action");
    }
    stats.compute_intervals[rank].push_back({r.next, r.clock, r.clock + cost});
    r.clock += cost;
    r.busy += cost;
    stats.peak_activations[rank] =
        std::max(stats.peak_activations[rank], r.stashed);
    stats.peak_deferred_weight_gradients[rank] =
        std::max(stats.peak_deferred_weight_gradients[rank], r.deferred);
    stats.peak_in_flight[rank] =
        std::max(stats.peak_in_flight[rank], r.stashed + r.deferred);
    return absl::OkStatus();
  };

  // Tries to advance `rank` by one action or group; sets *progressed.
  auto step = [&](int rank, bool *progressed) -> absl::Status {
    RankState &r = state[rank];
    const std::vector<Action> &list = s.actions[rank];
    const Action &a = list[r.next];
    if (!IsCommunication(a.kind)) {
      absl::Status status = run_compute(rank, a);
      if (!status.ok()) return status;
      ++r.next;
      *progressed = true;
      return absl::OkStatus();
    }
    if (!r.posted) {
      size_t end = r.next;
      while (true) {
        const Action &m = list[end];
        if (!IsCommunication(m.kind)) {
          return fail(rank, list[r.next],
                      "a group continues into a compute action");
        }
        absl::Status status = check_message(rank, m);
        if (!status.ok()) return status;
        ++end;
        if (!m.with_next) break;
        if (end == list.size()) {
          return fail(rank, m, "the list ends inside a group");
        }
      }
      r.group_end = end;
      r.slots.clear();
      for (size_t i = r.next; i < end; ++i) {
        const Action &m = list[i];
        if (is_send(m.kind)) {
          auto &channel = sends[{rank, m.peer}];
          r.slots.push_back(channel.size());
          channel.push_back({m, r.clock});
        } else {
          auto &channel = receives[{m.peer, rank}];
          r.slots.push_back(channel.size());
          channel.push_back({m, r.clock});
        }
      }
      r.posted = true;
      *progressed = true;
    }
    // Complete when every message has its partner posted.
    double done_at = r.clock;
    for (size_t i = r.next; i < r.group_end; ++i) {
      const Action &m = list[i];
      const size_t slot = r.slots[i - r.next];
      const bool send = is_send(m.kind);
      const auto &other =
          send ? receives[{rank, m.peer}] : sends[{m.peer, rank}];
      if (other.size() <= slot) {
        if (send) continue;       // eager: matched (and checked) by the receive
        return absl::OkStatus();  // not yet
      }
      const Action &partner = other[slot].action;
      const Action &sent = send ? m : partner;
      const Action &got = send ? partner : m;
      const bool activation = sent.kind == ActionKind::kSendActivation;
      const bool kinds_match = activation
                                   ? got.kind == ActionKind::kRecvActivation
                                   : got.kind == ActionKind::kRecvGradient;
      const int want_stage = activation ? sent.stage + 1 : sent.stage - 1;
      if (!kinds_match || got.stage != want_stage ||
          got.micro_batch != sent.micro_batch) {
        return fail(rank, m,
                    absl::StrCat("matched in order with rank ", m.peer, "'s ",
                                 partner.ToString(), ", not its counterpart"));
      }
      if (!send) done_at = std::max(done_at, other[slot].time + costs.message);
    }
    for (size_t i = r.next; i < r.group_end; ++i) {
      const Action &m = list[i];
      if (m.kind == ActionKind::kRecvActivation) {
        received_act.insert({m.stage, m.micro_batch});
      } else if (m.kind == ActionKind::kRecvGradient) {
        received_grad.insert({m.stage, m.micro_batch});
      }
    }
    r.clock = done_at;
    r.next = r.group_end;
    r.posted = false;
    *progressed = true;
    return absl::OkStatus();
  };

  while (true) {
    bool all_done = true;
    bool progressed = false;
    for (int rank = 0; rank < p; ++rank) {
      // Each rank runs as far as it can before the next rank's turn; the
      // times are event times, so the interleaving does not change them.
      while (state[rank].next < s.actions[rank].size()) {
        bool moved = false;
        absl::Status status = step(rank, &moved);
        if (!status.ok()) return status;
        if (!moved) break;
        progressed = true;
      }
      if (state[rank].next < s.actions[rank].size()) all_done = false;
    }
    if (all_done) break;
    if (!progressed) {
      std::vector<std::string> blocked;
      for (int rank = 0; rank < p; ++rank) {
        if (state[rank].next < s.actions[rank].size()) {
          blocked.push_back(
              absl::StrCat("rank ", rank, " at ",
                           s.actions[rank][state[rank].next].ToString()));
        }
      }
      return absl::InternalError(absl::StrCat(
          ScheduleName(s.kind), " p=", p, " v=", s.stages_per_rank, " m=",
          s.micro_batches, ": deadlock: ", absl::StrJoin(blocked, "; ")));
    }
  }

  // Everything ran and every message found its partner.
  for (int stage = 0; stage <= last; ++stage) {
    for (int mb = 0; mb < s.micro_batches; ++mb) {
      if (!weight_graded.count({stage, mb})) {
        return absl::InternalError(
            absl::StrCat(ScheduleName(s.kind), ": stage ", stage,
                         " never finished micro-batch ", mb, "'s backward"));
      }
    }
    if (!reduced.count(stage)) {
      return absl::InternalError(absl::StrCat(ScheduleName(s.kind), ": stage ",
                                              stage, " never reduced"));
    }
  }
  for (const auto &[channel, posted] : sends) {
    if (receives[channel].size() != posted.size()) {
      return absl::InternalError(absl::StrCat(
          ScheduleName(s.kind), ": rank ", channel.first, " sends ",
          posted.size(), " messages to rank ", channel.second,
          ", which receives ", receives[channel].size()));
    }
  }
  for (const auto &[channel, posted] : receives) {
    if (sends[channel].size() != posted.size()) {
      return absl::InternalError(
          absl::StrCat(ScheduleName(s.kind), ": rank ", channel.second,
                       " receives ", posted.size(), " messages from rank ",
                       channel.first, ", which sends ", sends[channel].size()));
    }
  }
  double busy = 0;
  for (const RankState &r : state) {
    stats.makespan = std::max(stats.makespan, r.clock);
    busy += r.busy;
    stats.rank_busy.push_back(r.busy);
  }
  for (const RankState &r : state) {
    stats.rank_bubble.push_back(
        stats.makespan > 0 ? 1.0 - r.busy / stats.makespan : 0);
  }
  stats.bubble_fraction =
      stats.makespan > 0 ? 1.0 - busy / (p * stats.makespan) : 0;
  return stats;
}

double ExpectedBubbleFraction(const Schedule &s) {
  const double p = s.ranks;
  const double m = s.micro_batches;
  const double v = s.stages_per_rank;
  switch (s.kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::kOneFOneB:
      return (p - 1) / (m + p - 1);
    case ScheduleKind::kInterleavedOneFOneB:
      return (p - 1) / (v * m + p - 1);
    case ScheduleKind::kZeroBubbleH1: {
      const double idle = (p - 1) + std::max(0.0, p - m);
      return idle / (3 * m + idle);
    }
  }
  return 0;
}

int ActivationBound(const Schedule &s, int rank) {
  const int p = s.ranks;
  const int m = s.micro_batches;
  const int v = s.stages_per_rank;
  switch (s.kind) {
    case ScheduleKind::kGPipe:
      return m * v;
    case ScheduleKind::kOneFOneB:
    case ScheduleKind::kZeroBubbleH1:
      return std::min(m, p - rank);
    case ScheduleKind::kInterleavedOneFOneB:
      return std::min(v * m, 2 * (p - rank - 1) + (v - 1) * p + 1);
  }
  return 0;
}

int InFlightBound(const Schedule &s, int rank) {
  if (s.kind == ScheduleKind::kZeroBubbleH1) {
    return std::min(s.micro_batches, s.ranks);
  }
  return ActivationBound(s, rank);
}

std::string DescribeSchedule(const Schedule &s) {
  std::string text;
  for (int rank = 0; rank < s.ranks; ++rank) {
    absl::StrAppend(&text, "rank ", rank, ":");
    for (const Action &a : s.actions[rank]) {
      absl::StrAppend(&text, " ", a.ToString());
    }
    text += "\n";
  }
  return text;
}

absl::Status CheckBlockingMessages(const Schedule &s) {
  const int p = s.ranks;
  if (static_cast<int>(s.actions.size()) != p) {
    return absl::InternalError(
        absl::StrCat("CheckBlockingMessages: ", s.actions.size(), " lists for ",
                     p, " ranks"));
  }
  auto is_send = [](const Action &a) {
    return a.kind == ActionKind::kSendActivation ||
           a.kind == ActionKind::kSendGradient;
  };
  struct Message {
    int action = 0;  // index in the rank's list
    int group = -1;  // the issued group holding it (-1: not issued yet)
    bool done = false;
  };
  struct RankState {
    std::vector<Message> messages;
    // The list's groups (message indices), by their first action.
    std::map<size_t, std::vector<int>> list_groups;
    std::vector<std::vector<int>> issued;  // groups as issued
    std::deque<int> queue;  // issued groups not completed, in order
    size_t pc = 0;
    int waiting_for = -1;  // an issued group; kAll: every one
    bool reduced = false;
    bool finished = false;
  };
  constexpr int kAll = -2;
  std::vector<RankState> ranks(p);
  // (from, to, ordinal) -> (rank, message), for sends and for receives.
  std::map<std::tuple<int, int, int>, std::pair<int, int>> sends, receives;
  for (int r = 0; r < p; ++r) {
    RankState &state = ranks[r];
    const std::vector<Action> &list = s.actions[r];
    std::map<std::pair<int, bool>, int> ordinal;  // (peer, send) -> count
    size_t first = 0;
    for (size_t i = 0; i < list.size(); ++i) {
      if (!IsCommunication(list[i].kind)) continue;
      if (i == 0 || !IsCommunication(list[i - 1].kind) ||
          !list[i - 1].with_next) {
        first = i;
      }
      const Action &a = list[i];
      const int k = static_cast<int>(state.messages.size());
      state.messages.push_back({static_cast<int>(i), -1, false});
      state.list_groups[first].push_back(k);
      const int n = ordinal[{a.peer, is_send(a)}]++;
      if (is_send(a)) {
        sends[{r, a.peer, n}] = {r, k};
      } else {
        receives[{a.peer, r, n}] = {r, k};
      }
    }
  }
  std::map<std::pair<int, int>, std::pair<int, int>> counterpart;
  for (const auto &[key, send] : sends) {
    const auto found = receives.find(key);
    if (found == receives.end()) continue;
    counterpart[send] = found->second;
    counterpart[found->second] = send;
  }
  auto issue = [&](RankState &state, std::vector<int> messages) {
    const int g = static_cast<int>(state.issued.size());
    for (int k : messages) state.messages[k].group = g;
    state.issued.push_back(std::move(messages));
    state.queue.push_back(g);
    return g;
  };
  bool progress = true;
  while (progress) {
    progress = false;
    // Each host runs until it must wait.
    for (int r = 0; r < p; ++r) {
      RankState &state = ranks[r];
      const std::vector<Action> &list = s.actions[r];
      while (!state.finished) {
        if (state.waiting_for == kAll) {
          if (!state.queue.empty()) break;
          state.waiting_for = -1;
          progress = true;
          if (state.pc >= list.size()) {
            state.finished = true;
            break;
          }
          continue;
        }
        if (state.waiting_for >= 0) {
          const auto &q = state.queue;
          if (std::find(q.begin(), q.end(), state.waiting_for) != q.end()) {
            break;
          }
          state.waiting_for = -1;
        }
        const bool at_end = state.pc >= list.size();
        const bool first_reduce =
            !at_end && list[state.pc].kind == ActionKind::kReduceGradients &&
            !state.reduced;
        if (at_end || first_reduce) {
          // The executor waits for every group it issued (its sends).
          state.waiting_for = kAll;
          if (first_reduce) {
            state.reduced = true;
            ++state.pc;
          }
          progress = true;
          continue;
        }
        const Action &a = list[state.pc];
        progress = true;
        if (!IsCommunication(a.kind)) {
          ++state.pc;
          continue;
        }
        const std::vector<int> &group = state.list_groups.at(state.pc);
        state.pc += group.size();
        bool receives_any = false;
        for (int k : group) {
          receives_any |= !is_send(list[state.messages[k].action]);
        }
        // Issued at once; the host waits for a group with receives.
        const int issued = issue(state, group);
        if (receives_any) state.waiting_for = issued;
      }
    }
    // The devices: a message completes once both ends are in the groups
    // their ranks' streams are running (the heads of the queues).
    for (int r = 0; r < p; ++r) {
      RankState &state = ranks[r];
      if (state.queue.empty()) continue;
      for (int k : state.issued[state.queue.front()]) {
        if (state.messages[k].done) continue;
        const auto found = counterpart.find({r, k});
        if (found == counterpart.end()) {
          return absl::InternalError(
              absl::StrCat("rank ", r, "'s ",
                           s.actions[r][state.messages[k].action].ToString(),
                           " has no matching message on its peer"));
        }
        const auto [q, j] = found->second;
        RankState &peer = ranks[q];
        if (!peer.queue.empty() &&
            peer.queue.front() == peer.messages[j].group) {
          state.messages[k].done = true;
          peer.messages[j].done = true;
          progress = true;
        }
      }
    }
    for (RankState &state : ranks) {
      while (!state.queue.empty()) {
        bool all = true;
        for (int k : state.issued[state.queue.front()]) {
          all = all && state.messages[k].done;
        }
        if (!all) break;
        state.queue.pop_front();
        progress = true;
      }
    }
  }
  std::string blocked;
  for (int r = 0; r < p; ++r) {
    const RankState &state = ranks[r];
    if (state.finished) continue;
    absl::StrAppend(&blocked, blocked.empty() ? "" : "; ", "rank ", r,
                    " waits for ",
                    state.waiting_for == kAll ? "its sends" : "a receive");
    if (!state.queue.empty()) {
      std::vector<std::string> head;
      for (int k : state.issued[state.queue.front()]) {
        head.push_back(s.actions[r][state.messages[k].action].ToString());
      }
      absl::StrAppend(&blocked, ", its stream blocked in ",
                      absl::StrJoin(head, " "));
    }
  }
  if (blocked.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(
      ScheduleName(s.kind), " over ", p, " ranks, ", s.micro_batches,
      " micro-batches deadlocks when a send waits for its receiver: ",
      blocked));
}

}  // namespace pipeline
}  // namespace ze
