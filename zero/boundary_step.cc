#include "zero/boundary_step.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops.h"
#include "core/status.h"
#include "zero/grad_clip.h"

namespace ze {
namespace zero {
namespace {

// 2^24: integers below it are exact in f32, so a 48-bit hash travels as two
// 24-bit halves through an f32 all-reduce.
constexpr uint64_t kHalf = uint64_t{1} << 24;

struct Statistics {
  double sum_of_squares = 0;  // over every rank's gradients
  bool overflow = false;      // some rank saw inf or NaN (fp16)
  double loss_sum = 0;        // over ranks
  int failed_ranks = 0;       // ranks whose previous offloaded update failed
};

// The sum of squares of this rank's own gradient elements of the named
// parameters (PartitionState::OwnGradientsOf), as a one-element f32 tensor
// on the partition's device.
absl::StatusOr<Tensor> SumOfSquaresCountedElsewhere(
    const PartitionState& partition, const std::vector<std::string>& names,
    const Stream& stream) {
  ZE_ASSIGN_OR_RETURN(Tensor sum,
                      Tensor::Empty({1}, DType::kF32, partition.device()));
  ZE_RETURN_IF_ERROR(Fill(sum, 0.0f, stream));
  for (const std::string& name : names) {
    ZE_ASSIGN_OR_RETURN(const int index, partition.layout().FindParam(name));
    if (!partition.trainable(partition.layout().placement(index).bucket)) {
      continue;
    }
    int64_t param_begin = 0;
    const Tensor own = partition.OwnGradientsOf(index, &param_begin);
    if (own.defined()) ZE_RETURN_IF_ERROR(SumOfSquares(own, sum, stream));
  }
  return sum;
}

// Step 1 and 2 of the header: the statistics all-reduce, with the schedule
// hash check when the strategy keeps one.
absl::StatusOr<Statistics> ReduceStatistics(const BoundaryStepContext& context,
                                            double loss_sum,
                                            const BoundaryStepHooks& hooks,
                                            bool previous_update_failed) {
  comm::Communicator& comm = *context.comm;
  const Stream& stream = *context.stream;
  PartitionState& partition = *context.partition;
  const Device device = partition.device();
  // [0] sum of squares, [1] overflow flag, [2] summed losses, [3] ranks
  // whose previous offloaded update failed.
  ZE_ASSIGN_OR_RETURN(Tensor stats, Tensor::Empty({4}, DType::kF32, device));
  ZE_RETURN_IF_ERROR(Fill(stats, 0.0f, stream));
  Tensor sum_of_squares = stats.Slice(0, 1);
  Tensor overflow = stats.Slice(1, 1);
  for (int b = 0; b < partition.num_buckets(); ++b) {
    if (!partition.trainable(b)) continue;
    Tensor own = partition.OwnGradients(b);
    ZE_RETURN_IF_ERROR(SumOfSquares(own, sum_of_squares, stream));
    if (context.training->checks_overflow()) {
      ZE_RETURN_IF_ERROR(HasInfOrNan(own, overflow, stream));
    }
  }
  if (context.gradients_counted_elsewhere != nullptr &&
      !context.gradients_counted_elsewhere->empty()) {
    ZE_ASSIGN_OR_RETURN(
        Tensor elsewhere,
        SumOfSquaresCountedElsewhere(
            partition, *context.gradients_counted_elsewhere, stream));
    ZE_RETURN_IF_ERROR(
        Axpby(-1.0f, elsewhere, 1.0f, sum_of_squares, sum_of_squares, stream));
  }
  if (!partition.policy().partition_optimizer) {
    // Every rank holds all the gradients: each contributes 1/N of its sum.
    ZE_RETURN_IF_ERROR(Scale(sum_of_squares, 1.0f / comm.world_size(), stream));
  }
  ZE_RETURN_IF_ERROR(
      Fill(stats.Slice(2, 1), static_cast<float>(loss_sum), stream));
  ZE_RETURN_IF_ERROR(
      Fill(stats.Slice(3, 1), previous_update_failed ? 1.0f : 0.0f, stream));

  Tensor hashes;
  uint64_t hash = 0;
  comm::Work work;
  if (hooks.schedule_hash.has_value()) {
    hash = *hooks.schedule_hash & ((kHalf * kHalf) - 1);
    const float high = static_cast<float>(hash / kHalf);
    const float low = static_cast<float>(hash % kHalf);
    ZE_ASSIGN_OR_RETURN(hashes, FromHostFloats({high, low, -high, -low}, {4},
                                               DType::kF32, device, stream));
    ZE_ASSIGN_OR_RETURN(
        work, comm.Coalesced({comm::CollectiveOp::AllReduce(
                                  stats, stats, comm::ReduceOp::kSum),
                              comm::CollectiveOp::AllReduce(
                                  hashes, hashes, comm::ReduceOp::kMax)},
                             stream));
  } else {
    ZE_ASSIGN_OR_RETURN(
        work, comm.AllReduce(stats, stats, comm::ReduceOp::kSum, stream));
  }
  ZE_RETURN_IF_ERROR(work.Wait());
  if (context.pipeline != nullptr && context.pipeline->world_size() > 1) {
    // The other stages' squares and overflow; the loss is every stage's
    // already (the executor broadcasts the last stage's).
    const Tensor across = stats.Slice(0, 2);
    ZE_ASSIGN_OR_RETURN(comm::Work pipeline_work,
                        context.pipeline->AllReduce(
                            across, across, comm::ReduceOp::kSum, stream));
    ZE_RETURN_IF_ERROR(pipeline_work.Wait());
  }
  ZE_ASSIGN_OR_RETURN(std::vector<float> values, ToHostFloats(stats, stream));
  if (hashes.defined()) {
    ZE_ASSIGN_OR_RETURN(std::vector<float> extremes,
                        ToHostFloats(hashes, stream));
    if (extremes[0] != -extremes[2] || extremes[1] != -extremes[3]) {
      const uint64_t max = static_cast<uint64_t>(extremes[0]) * kHalf +
                           static_cast<uint64_t>(extremes[1]);
      const uint64_t min = static_cast<uint64_t>(-extremes[2]) * kHalf +
                           static_cast<uint64_t>(-extremes[3]);
      return hooks.schedule_mismatch(max, min, hash);
    }
  }
  Statistics statistics;
  statistics.sum_of_squares = values[0];
  statistics.overflow = values[1] > 0 || !std::isfinite(values[0]);
  statistics.loss_sum = values[2];
  statistics.failed_ranks = static_cast<int>(values[3]);
  return statistics;
}

// The gradients hold the sum over ranks of loss_scale * (mean over the
// window) gradients, divided by the predivide factor when prescaling: the
// true gradient divides by all of that.
double GradientScale(const config::Config& config,
                     const TrainingState& training, int world) {
  double gradient_scale = training.loss_scale() * world;
  if (config.prescale_gradients) {
    gradient_scale /= config.gradient_predivide_factor;
  }
  return gradient_scale;
}

}  // namespace

absl::StatusOr<EarlyStepArgs> ArgsBeforeStatistics(
    const config::Config& config, const TrainingState& training, int world) {
  const double gradient_scale = GradientScale(config, training, world);
  ZE_ASSIGN_OR_RETURN(GradClip clip, ComputeGradClip(0.0, gradient_scale, 0.0));
  EarlyStepArgs early;
  early.args.lr = training.learning_rate();
  early.args.grad_scale = clip.grad_scale;
  training.FillMomentum(&early.args);
  const double max_norm = config.gradient_clipping.value();
  if (StepArgsNeedStatistics(config, training)) {
    early.speculation.emplace();
    if (max_norm > 0) {
      // The norm divides the stored gradients' root sum of squares by the
      // gradient scale (ComputeGradClip); a rank's own sum is part of the
      // global one, so beyond this the step clips.
      const double limit = max_norm * gradient_scale;
      early.speculation->sum_of_squares_limit = limit * limit;
    }
  }
  return early;
}

bool StepArgsNeedStatistics(const config::Config& config,
                            const TrainingState& training) {
  return config.gradient_clipping.value() > 0 || training.checks_overflow();
}

bool WorthBeginningEarly(const config::Config& config,
                         const TrainingState& training) {
  return !StepArgsNeedStatistics(config, training) ||
         !training.last_step_needed_statistics();
}

absl::StatusOr<StepReport> RunBoundaryStep(const BoundaryStepContext& context,
                                           double loss_sum,
                                           const BoundaryStepHooks& hooks) {
  const config::Config& config = *context.config;
  TrainingState& training = *context.training;
  PartitionState& partition = *context.partition;
  const Stream& stream = *context.stream;
  const int world = context.comm->world_size();
  StepReport report;
  report.boundary = true;
  report.loss_scale = training.loss_scale();

  // The previous step's offloaded update (PartitionState::UpdateWeights)
  // ends here at the latest; whether it failed on some rank travels with
  // the statistics, so every rank stops, not only the one that failed.
  const absl::Status previous = partition.FinishPreviousUpdate(stream);
  ZE_ASSIGN_OR_RETURN(
      Statistics statistics,
      ReduceStatistics(context, loss_sum, hooks, !previous.ok()));
  if (!previous.ok()) return previous;
  if (statistics.failed_ranks > 0) {
    return absl::AbortedError(absl::StrCat(
        "step ", context.step_number, " on rank ", context.comm->rank(),
        ": the previous step's offloaded optimizer update failed on ",
        statistics.failed_ranks,
        " other rank(s) (their logs say why); the weights are not updated"));
  }
  const int64_t accumulation = config.gradient_accumulation_steps.value();
  report.loss =
      statistics.loss_sum / (static_cast<double>(world) * accumulation);
  ZE_ASSIGN_OR_RETURN(GradClip clip,
                      ComputeGradClip(statistics.sum_of_squares,
                                      GradientScale(config, training, world),
                                      config.gradient_clipping.value()));
  report.grad_norm = clip.norm;
  report.learning_rate = training.learning_rate();
  training.set_last_step_needed_statistics(
      statistics.overflow || !clip.finite || clip.clip_coefficient < 1.0);
  if (training.checks_overflow()) {
    ZE_RETURN_IF_ERROR(
        training.UpdateLossScale(statistics.overflow, context.step_number));
  }
  if (hooks.after_statistics) ZE_RETURN_IF_ERROR(hooks.after_statistics());
  if (statistics.overflow && training.checks_overflow()) {
    report.skipped = true;
    ZE_RETURN_IF_ERROR(partition.DropSpeculation(stream));
    report.speculation = partition.speculation_outcome();
    report.speculation_stopped_by_norm =
        partition.last_speculation().stopped_by_norm;
    ZE_RETURN_IF_ERROR(partition.ResetGradients(stream));
    return report;
  }
  if (!training.checks_overflow() &&
      (statistics.overflow || !std::isfinite(report.loss))) {
    report.nonfinite = true;
    // A speculative update begun during backward is undone; an exact one
    // has already used these gradients.
    ZE_RETURN_IF_ERROR(partition.DropSpeculation(stream));
    if (!partition.update_begun_early()) {
      report.skipped = true;
      report.speculation = partition.speculation_outcome();
      report.speculation_stopped_by_norm =
          partition.last_speculation().stopped_by_norm;
      ZE_RETURN_IF_ERROR(partition.ResetGradients(stream));
      return report;
    }
  }

  StepArgs args;
  args.lr = report.learning_rate;
  args.grad_scale = clip.grad_scale;
  training.FillMomentum(&args);
  if (report.nonfinite) {
    // Only an update begun during backward gets here: it finishes with the
    // arguments it began with (a non-finite norm has no clip factor).
    ZE_ASSIGN_OR_RETURN(const EarlyStepArgs begun,
                        ArgsBeforeStatistics(config, training, world));
    args = begun.args;
  }
  ZE_RETURN_IF_ERROR(partition.UpdateWeights(args, stream));
  report.speculation = partition.speculation_outcome();
  report.speculation_stopped_by_norm =
      partition.last_speculation().stopped_by_norm;
  if (hooks.after_update) ZE_RETURN_IF_ERROR(hooks.after_update());
  ZE_RETURN_IF_ERROR(partition.ResetGradients(stream));
  training.AdvanceSchedule();
  return report;
}

}  // namespace zero
}  // namespace ze
