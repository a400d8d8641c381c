#include "pipeline/executor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/ops.h"
#include "core/status.h"
#include "nn/loss_model.h"
#include "nn/module.h"
#include "pipeline/step_time.h"

namespace ze {
namespace pipeline {
namespace {

// 48 bits of a digest of the schedule (its kind, stages per rank,
// micro-batches and lists), as two floats that carry 24 bits each exactly
// (the communicator moves floating-point tensors).
// Where the executor's small exchanges (the schedule's digest, the step's
// loss) live: the host, or the device for a backend without host tensors
// (nccl), on `stream`.
struct Exchange {
  Device device = Device::Cpu();
  Stream stream;
};
Exchange ExchangeOn(const comm::Communicator &comm, const Stream &stream) {
  if (comm.accepts_host_tensors()) return Exchange();
  return Exchange{comm.device(), stream};
}

absl::Status AgreeOnSchedule(comm::Communicator &pipeline,
                             const Schedule &schedule, const Stream &stream) {
  const std::string text = absl::StrCat(
      ScheduleName(schedule.kind), " v=", schedule.stages_per_rank,
      " m=", schedule.micro_batches, "\n", DescribeSchedule(schedule));
  uint64_t digest = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : text) {
    digest = (digest ^ c) * 1099511628211ull;
  }
  const int n = pipeline.world_size();
  const Exchange on = ExchangeOn(pipeline, stream);
  ZE_ASSIGN_OR_RETURN(
      Tensor mine,
      FromHostFloats({static_cast<float>(digest & 0xFFFFFF),
                      static_cast<float>((digest >> 24) & 0xFFFFFF)},
                     {2}, DType::kF32, on.device, on.stream));
  ZE_ASSIGN_OR_RETURN(
      Tensor all, Tensor::Zeros({2 * n}, DType::kF32, on.device, on.stream));
  ZE_ASSIGN_OR_RETURN(comm::Work work,
                      pipeline.AllGather(mine, all, on.stream));
  ZE_RETURN_IF_ERROR(work.Wait());
  ZE_ASSIGN_OR_RETURN(const std::vector<float> gathered,
                      ToHostFloats(all, on.stream));
  const float *values = gathered.data();
  std::string differing;
  for (int r = 0; r < n; ++r) {
    if (values[2 * r] != values[0] || values[2 * r + 1] != values[1]) {
      absl::StrAppend(&differing, differing.empty() ? "" : ", ", r);
    }
  }
  if (differing.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "pipeline rank ", pipeline.rank(), ": pipeline ranks ", differing,
      " built another schedule than pipeline rank 0 (check that every rank "
      "has the same gradient_accumulation_steps, pipeline.schedule and "
      "pipeline.stages_per_rank); this rank's is ",
      ScheduleName(schedule.kind), " over ", schedule.micro_batches,
      " micro-batches, ", schedule.stages_per_rank, " stage(s) per rank"));
}

}  // namespace

PipelineExecutor::PipelineExecutor(const ExecutorContext &context,
                                   Schedule schedule)
    : context_(context), schedule_(std::move(schedule)) {}

absl::StatusOr<std::unique_ptr<PipelineExecutor>> PipelineExecutor::Create(
    const ExecutorContext &context, Schedule schedule) {
  if (context.stages.empty() || context.strategy == nullptr ||
      context.pipeline == nullptr || context.stream == nullptr) {
    return absl::InvalidArgumentError(
        "PipelineExecutor: stages, strategy, pipeline and stream are needed");
  }
  for (const nn::PipelineStage *stage : context.stages) {
    if (stage == nullptr) {
      return absl::InvalidArgumentError("PipelineExecutor: a null stage");
    }
  }
  const comm::Communicator &pipe = *context.pipeline;
  if (schedule.ranks != pipe.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PipelineExecutor: the schedule has ", schedule.ranks,
        " ranks but the pipeline communicator ", pipe.world_size()));
  }
  const int rank = pipe.rank();
  if (static_cast<int>(context.stages.size()) != schedule.stages_per_rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("PipelineExecutor: pipeline rank ", rank, " holds ",
                     context.stages.size(), " stage(s) but the schedule ",
                     ScheduleName(schedule.kind), " puts ",
                     schedule.stages_per_rank, " on each rank"));
  }
  const std::vector<int> ids = schedule.StagesOfRank(rank);
  bool tied = false;
  for (size_t c = 0; c < ids.size(); ++c) {
    const nn::PipelineStage &stage = *context.stages[c];
    if (stage.is_first_stage() != (ids[c] == 0) ||
        stage.is_last_stage() != (ids[c] == schedule.stages() - 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PipelineExecutor: pipeline rank ", rank, "'s stage ", c,
          " (pipeline stage ", ids[c], " of ", schedule.stages(),
          ") holds layers [", stage.first_layer(), ", ", stage.last_layer(),
          ") of ", stage.num_pipeline_layers(),
          ", which is not that stage's place in the layer sequence"));
    }
    tied = tied || !context.stages[c]->TiedParameters().empty();
  }
  if (tied && (context.tied == nullptr || context.tied->world_size() != 2)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PipelineExecutor: pipeline rank ", rank,
        " holds tied parameters but no 2-rank communicator with the other "
        "stage holding them"));
  }
  if (context.pipeline->sends_wait_for_receiver()) {
    // nccl: a send holds up the rank's later messages until received, so
    // lists that rely on eager sends would hang; refused by name on every
    // rank instead (every rank builds the same lists).
    const absl::Status blocking = CheckBlockingMessages(schedule);
    if (!blocking.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "PipelineExecutor: schedule ", ScheduleName(schedule.kind),
          " cannot run over the ", context.pipeline->backend_name(),
          " backend, whose sends wait for their receiver: ", blocking.message(),
          ". Use gpipe, 1f1b or zb_h1 there, or the mpi "
          "backend"));
    }
  }
  ZE_RETURN_IF_ERROR(
      AgreeOnSchedule(*context.pipeline, schedule, *context.stream));
  std::unique_ptr<PipelineExecutor> executor(
      new PipelineExecutor(context, std::move(schedule)));
  executor->rank_ = rank;
  return executor;
}

absl::StatusOr<double> PipelineExecutor::RunStep(
    const std::vector<MicroBatch> &micro_batches, float backward_scale) {
  const int m = schedule_.micro_batches;
  if (static_cast<int>(micro_batches.size()) != m) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline step: the schedule runs ", m,
                     " micro-batches, got ", micro_batches.size()));
  }
  zero::ZeroStrategy &strategy = *context_.strategy;
  comm::Communicator &pipe = *context_.pipeline;
  const Stream &stream = *context_.stream;
  const int slots = schedule_.stages_per_rank * m;
  // The step's time, compute against waits (header: "Time"). A compute
  // action's interval ends once the stream finished its kernels.
  timer_.BeginStep();
  auto begin_compute = [&](ActionKind kind) { timer_.BeginCompute(kind); };
  auto end_compute = [&]() -> absl::Status {
    if (stream.device().is_cuda()) ZE_RETURN_IF_ERROR(stream.Synchronize());
    timer_.EndCompute();
    return absl::OkStatus();
  };

  // Per (chunk, micro-batch) slot: the stage's input (until its forward
  // ran), its output (until sent), the gradient received for the output
  // and the one computed for the input (until sent); per micro-batch the
  // last stage's mean-loss bookkeeping.
  std::vector<Tensor> input(slots), output(slots), output_grad(slots),
      input_grad(slots);
  std::vector<nn::MeanCrossEntropy> losses(m);
  double loss_sum = 0;
  // Sends in flight, with their tensors (the sender must keep them).
  std::vector<std::pair<comm::Work, std::vector<Tensor>>> sends;
  bool tied_summed = false;
  // ForwardStage calls per slot, and the saved micro-batches' peak.
  std::vector<int> forwards(slots, 0);
  recomputed_per_step_ = 0;
  peak_saved_micro_batches_ = 0;
  auto saved_micro_batches = [&]() {
    int saved = 0;
    for (nn::PipelineStage *stage : context_.stages) {
      const std::vector<nn::Module *> layers = stage->StageLayers();
      if (!layers.empty()) saved += layers.front()->SavedSlots();
    }
    return saved;
  };

  auto stage_of = [&](const Action &a) -> nn::PipelineStage & {
    return *context_.stages[ChunkOf(a.stage)];
  };
  auto boundary_buffer = [&](const Action &a) -> absl::StatusOr<Tensor> {
    const nn::PipelineStage &stage = stage_of(a);
    return Tensor::Empty(
        stage.BoundaryShape(micro_batches[a.micro_batch].inputs),
        stage.boundary_dtype(), stream.device());
  };
  auto wait_sends = [&]() -> absl::Status {
    timer_.BeginWait();
    for (auto &[work, tensors] : sends) ZE_RETURN_IF_ERROR(work.Wait());
    timer_.EndWait();
    sends.clear();
    return absl::OkStatus();
  };

  const std::vector<Action> &list = schedule_.actions[rank_];
  for (size_t i = 0; i < list.size();) {
    const Action &a = list[i];
    const int mb = a.micro_batch;
    if (IsCommunication(a.kind)) {
      // One group: its receives issued and waited for now, its sends
      // issued and waited for at the step's end (schedule.h).
      std::vector<comm::CollectiveOp> receive_ops, send_ops;
      std::vector<Tensor> sent;
      size_t end = i;
      while (true) {
        const Action &message = list[end++];
        const int k = Slot(message.stage, message.micro_batch);
        switch (message.kind) {
          case ActionKind::kSendActivation:
            send_ops.push_back(
                comm::CollectiveOp::Send(output[k], message.peer));
            sent.push_back(output[k]);
            output[k] = Tensor();
            break;
          case ActionKind::kSendGradient:
            send_ops.push_back(
                comm::CollectiveOp::Send(input_grad[k], message.peer));
            sent.push_back(input_grad[k]);
            input_grad[k] = Tensor();
            break;
          case ActionKind::kRecvActivation: {
            ZE_ASSIGN_OR_RETURN(input[k], boundary_buffer(message));
            receive_ops.push_back(
                comm::CollectiveOp::Recv(input[k], message.peer));
            break;
          }
          case ActionKind::kRecvGradient: {
            ZE_ASSIGN_OR_RETURN(output_grad[k], boundary_buffer(message));
            receive_ops.push_back(
                comm::CollectiveOp::Recv(output_grad[k], message.peer));
            break;
          }
          default:
            break;
        }
        if (!message.with_next) break;
      }
      comm::Work received;
      const bool receives = !receive_ops.empty();
      if (pipe.sends_wait_for_receiver()) {
        // nccl: one NCCL group, on the communicator's own stream. A peer
        // posts its half of an exchange as one group too (1F1B's steady
        // state: rank r sends an activation and receives a gradient while
        // r + 1 does the reverse); issued as two groups, each rank's send
        // would block its stream before its receive (CheckBlockingMessages).
        // The group's Work covers its sends, kept until the step's end.
        std::vector<comm::CollectiveOp> ops = std::move(receive_ops);
        ops.insert(ops.end(), send_ops.begin(), send_ops.end());
        ZE_ASSIGN_OR_RETURN(comm::Work work, pipe.Coalesced(ops, stream));
        if (receives) received = work;
        sends.emplace_back(work, std::move(sent));
      } else {
        if (!receive_ops.empty()) {
          ZE_ASSIGN_OR_RETURN(received, pipe.Coalesced(receive_ops, stream));
        }
        if (!send_ops.empty()) {
          ZE_ASSIGN_OR_RETURN(comm::Work work,
                              pipe.Coalesced(send_ops, stream));
          sends.emplace_back(work, std::move(sent));
        }
      }
      if (receives) {
        timer_.BeginWait();
        ZE_RETURN_IF_ERROR(received.Wait());
        timer_.EndWait();
      }
      i = end;
      continue;
    }
    if (a.kind == ActionKind::kReduceGradients) {
      // Once per rank, at its first reduce: the sends are done and every
      // backward of every stage of the rank ran. The tied parameters' two
      // halves (first and last stage) are summed on both before either
      // reduces over its data-parallel group: the reduction is linear, so
      // both then update alike.
      if (!tied_summed) {
        tied_summed = true;
        ZE_RETURN_IF_ERROR(wait_sends());
        std::vector<nn::Parameter *> tied;
        for (nn::PipelineStage *stage : context_.stages) {
          for (nn::Parameter *parameter : stage->TiedParameters()) {
            tied.push_back(parameter);
          }
        }
        // Communication, timed as a wait (StepTimes::tied_sum_ms): on one
        // shared GPU over mpi it is host-staged and takes longer than the
        // rank's compute, and the schedule's bubble is compute's share.
        if (!tied.empty()) {
          timer_.BeginWait(StepTimer::Wait::kTiedSum);
          ZE_RETURN_IF_ERROR(strategy.SumGradientsWith(tied, *context_.tied));
          if (stream.device().is_cuda()) {
            ZE_RETURN_IF_ERROR(stream.Synchronize());
          }
          timer_.EndWait();
        }
      }
      // Counted, empty (the sum above is a wait): every compute action of
      // the list is timed.
      begin_compute(a.kind);
      ZE_RETURN_IF_ERROR(end_compute());
      ++i;
      continue;
    }
    nn::PipelineStage &stage = stage_of(a);
    const bool last = stage.is_last_stage();
    const int k = Slot(a.stage, mb);
    // F(s,m)'s records, and the strategy's counted uses, in (s,m)'s own
    // slot, where B(s,m) finds them (the header's invariant).
    const nn::SavedStateSlot slot(k + 1);
    switch (a.kind) {
      case ActionKind::kForward: {
        if (stage.is_first_stage()) input[k] = micro_batches[mb].inputs;
        begin_compute(a.kind);
        ZE_RETURN_IF_ERROR(strategy.BeginForward());
        const absl::StatusOr<Tensor> out =
            stage.ForwardStage(input[k], micro_batches[mb].targets, stream);
        strategy.EndForward();
        ZE_RETURN_IF_ERROR(out.status());
        if (++forwards[k] > 1) ++recomputed_per_step_;
        peak_saved_micro_batches_ =
            std::max(peak_saved_micro_batches_, saved_micro_batches());
        if (last) {
          ZE_ASSIGN_OR_RETURN(
              const float loss,
              losses[mb].Forward(*out, micro_batches[mb].targets, stream));
          loss_sum += loss;
        } else {
          output[k] = *out;
        }
        ZE_RETURN_IF_ERROR(end_compute());
        // The layers keep what they need (a checkpointed one its input).
        input[k] = Tensor();
        break;
      }
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput: {
        Tensor grad = output_grad[k];
        begin_compute(a.kind);
        if (last) {
          ZE_ASSIGN_OR_RETURN(
              grad, losses[mb].Backward("pipeline backward", backward_scale));
        }
        const bool split = a.kind == ActionKind::kBackwardInput;
        ZE_RETURN_IF_ERROR(strategy.BeginBackward(
            /*boundary=*/false,
            split ? nn::BackwardPart::kInput : nn::BackwardPart::kWhole));
        absl::StatusOr<Tensor> grad_input;
        if (split) {
          // The split layers leave their weight gradients to Bw(s,m),
          // which finds them in this slot.
          const nn::SplitBackwardScope splitting;
          grad_input = stage.BackwardStage(grad, stream);
        } else {
          grad_input = stage.BackwardStage(grad, stream);
        }
        const absl::Status end = strategy.EndBackward();
        ZE_RETURN_IF_ERROR(grad_input.status());
        ZE_RETURN_IF_ERROR(end);
        ZE_RETURN_IF_ERROR(end_compute());
        input_grad[k] = *grad_input;
        input[k] = Tensor();
        output_grad[k] = Tensor();
        break;
      }
      case ActionKind::kBackwardWeight: {
        // The second part of B(s,m): the stage's deferred weight gradients,
        // in the strategy's bracket that counts their uses down and reduces
        // what is final (zero/strategy.h).
        begin_compute(a.kind);
        ZE_RETURN_IF_ERROR(strategy.BeginBackward(/*boundary=*/false,
                                                  nn::BackwardPart::kWeight));
        const absl::Status weights = stage.BackwardStageWeights(stream);
        const absl::Status end = strategy.EndBackward();
        ZE_RETURN_IF_ERROR(weights);
        ZE_RETURN_IF_ERROR(end);
        ZE_RETURN_IF_ERROR(end_compute());
        break;
      }
      default:
        return absl::InternalError(absl::StrCat("pipeline step: ", a.ToString(),
                                                " is not a compute action"));
    }
    ++i;
  }
  ZE_RETURN_IF_ERROR(wait_sends());
  // A split backward whose weight part never ran would leave its
  // micro-batch's gradients short and its deferred inputs held: a schedule
  // bug (SimulateSchedule refuses such lists), named here, not trained on.
  for (int c = 0; c < schedule_.stages_per_rank; ++c) {
    for (int mb = 0; mb < m; ++mb) {
      const nn::SavedStateSlot slot(c * m + mb + 1);
      if (context_.stages[c]->PendingStageWeightGradients() > 0) {
        return absl::InternalError(absl::StrCat(
            "pipeline step: pipeline stage ", rank_ + c * schedule_.ranks,
            ", micro-batch ", mb,
            ": weight gradients deferred by its input-gradient backward "
            "never ran (no Bw in the schedule)"));
      }
    }
  }

  // Every stage reports the step's loss: the last stage's, as two floats
  // (high and low parts) so the double arrives whole, summed with the
  // other ranks' zeros (exact). An all-reduce rather than a broadcast, so
  // no rank's step ends before every rank's: each rank's wall time is the
  // pipeline's step, as the simulation's makespan is (its idle time
  // includes waiting for the slowest rank's last action).
  // On the device over nccl (ExchangeOn), on the host otherwise.
  std::vector<float> parts = {0.0f, 0.0f};
  if (rank_ == schedule_.ranks - 1) {
    parts[0] = static_cast<float>(loss_sum);
    parts[1] = static_cast<float>(loss_sum - parts[0]);
  }
  const Exchange on = ExchangeOn(pipe, stream);
  ZE_ASSIGN_OR_RETURN(Tensor total, FromHostFloats(parts, {2}, DType::kF32,
                                                   on.device, on.stream));
  ZE_ASSIGN_OR_RETURN(
      comm::Work exchange,
      pipe.AllReduce(total, total, comm::ReduceOp::kSum, on.stream));
  timer_.BeginWait();
  ZE_RETURN_IF_ERROR(exchange.Wait());
  timer_.EndWait();
  timer_.EndStep();
  ZE_ASSIGN_OR_RETURN(parts, ToHostFloats(total, on.stream));
  return static_cast<double>(parts[0]) + static_cast<double>(parts[1]);
}

}  // namespace pipeline
}  // namespace ze
