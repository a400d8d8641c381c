#include "zero/gradient_reducer.h"

#include <utility>

#include "core/ops.h"
#include "core/status.h"

namespace ze {
namespace zero {
GradientReducer::GradientReducer(
    const GradientReducerOptions& options, PartitionState* state,
    comm::Communicator* comm, const Stream* compute_stream,
    const Stream* communication_stream,
    std::function<absl::Status(int bucket)> on_finished)
    : options_(options),
      state_(state),
      comm_(comm),
      compute_stream_(compute_stream),
      communication_stream_(communication_stream),
      on_finished_(std::move(on_finished)) {}

bool LayersWriteThePartition(const GradientReducerOptions& options,
                             int world_size, bool casts, bool accumulates) {
  return options.kind == ReductionKind::kReduceScatterToPartition &&
         world_size == 1 && !casts && !(options.prescale && accumulates);
}

bool GradientReducer::ReducesInPartition(int bucket) const {
  return LayersWriteThePartition(options_, comm_->world_size(), casts(),
                                 state_->gradients_current(bucket));
}

absl::Status GradientReducer::Issue(int bucket, const Tensor& gradients) {
  const Stream& compute = *compute_stream_;
  const Stream& communication = *communication_stream_;
  const int64_t slice = state_->layout().bucket(bucket).slice_elements;
  const bool in_place =
      options_.kind != ReductionKind::kReduceScatterToPartition;
  if (in_place) {
    // A boundary backward run twice before its step: the earlier collective
    // may still use the buffers, whose blocks the new ones may get.
    for (auto it = in_flight_.begin(); it != in_flight_.end(); ++it) {
      if (it->bucket != bucket) continue;
      ZE_RETURN_IF_ERROR(it->work.StreamWait(compute));
      in_flight_.erase(it);
      break;
    }
  }
  InFlight flight;
  flight.bucket = bucket;
  flight.overwrite = !state_->gradients_current(bucket);
  if (options_.prescale) {
    ZE_RETURN_IF_ERROR(
        Scale(gradients, static_cast<float>(1.0 / options_.predivide_factor),
              compute));
  }
  // Already the partition slice (stage 2, one rank): the layers wrote (or
  // added to) the result itself; nothing to reduce.
  const bool already_in_partition =
      !in_place && ReducesInPartition(bucket) &&
      gradients.data() == state_->OwnGradients(bucket).data();
  // What the collective reads: the gradients, or a copy cast to
  // communication_data_type (the sums are then formed in it and rounded to
  // the model's dtype once, when finished).
  Tensor wire = gradients;
  if (casts() && !already_in_partition) {
    ZE_ASSIGN_OR_RETURN(
        wire, Tensor::Empty(gradients.shape(), options_.communication_dtype,
                            gradients.device()));
    ZE_RETURN_IF_ERROR(Copy(gradients, wire, compute));
    flight.wire = wire;
  }
  if (communication.native() != compute.native()) {
    // The collective must read the gradients only after the backward
    // kernels that produced them.
    ZE_ASSIGN_OR_RETURN(Event produced, Event::Create(gradients.device()));
    ZE_RETURN_IF_ERROR(produced.Record(compute));
    ZE_RETURN_IF_ERROR(produced.StreamWait(communication));
  }
  const int rank = comm_->rank();
  switch (options_.kind) {
    case ReductionKind::kAllReduce: {
      ZE_ASSIGN_OR_RETURN(
          flight.work,
          comm_->AllReduce(wire, wire, comm::ReduceOp::kSum, communication));
      break;
    }
    case ReductionKind::kReduceScatterInPlace: {
      ZE_ASSIGN_OR_RETURN(
          flight.work,
          comm_->ReduceScatter(wire, wire.Slice(rank * slice, slice),
                               comm::ReduceOp::kSum, communication));
      break;
    }
    case ReductionKind::kReduceScatterToPartition: {
      state_->set_gradients_current(bucket);
      if (already_in_partition) break;
      Tensor output = state_->OwnGradients(bucket);
      if (!flight.overwrite || casts()) {
        // The collective's output; freed in Finish, once the compute stream
        // has waited for the collective and read it.
        ZE_ASSIGN_OR_RETURN(flight.reduced, Tensor::Empty({slice}, wire.dtype(),
                                                          gradients.device()));
        output = flight.reduced;
      }
      ZE_ASSIGN_OR_RETURN(
          flight.work, comm_->ReduceScatter(wire, output, comm::ReduceOp::kSum,
                                            communication));
      break;
    }
  }
  in_flight_.push_back(std::move(flight));
  if (!in_place && in_flight_.size() > kMaxReductionsInFlight) {
    InFlight oldest = std::move(in_flight_.front());
    in_flight_.pop_front();
    ZE_RETURN_IF_ERROR(Finish(oldest));
  }
  return absl::OkStatus();
}

absl::Status GradientReducer::Finish(InFlight& flight) {
  const Stream& compute = *compute_stream_;
  ZE_RETURN_IF_ERROR(flight.work.StreamWait(compute));
  const int bucket = flight.bucket;
  Tensor own = state_->OwnGradients(bucket);
  if (options_.kind != ReductionKind::kReduceScatterToPartition) {
    if (flight.wire.defined()) {
      // Reduced in communication_data_type: round this rank's part back.
      const int64_t slice = state_->layout().bucket(bucket).slice_elements;
      Tensor reduced = options_.kind == ReductionKind::kAllReduce
                           ? flight.wire
                           : flight.wire.Slice(comm_->rank() * slice, slice);
      ZE_RETURN_IF_ERROR(Copy(reduced, own, compute));
    }
    return on_finished_ ? on_finished_(bucket) : absl::OkStatus();
  }
  // Without an output of its own the reduction landed in the partition
  // (or the layers wrote it there).
  if (flight.reduced.defined()) {
    ZE_RETURN_IF_ERROR(flight.overwrite
                           // Reduced in communication_data_type: rounded
                           // into the partition.
                           ? Copy(flight.reduced, own, compute)
                           : Add(own, flight.reduced, own, compute));
  }
  // The caching allocator may hand these blocks out again at once; work
  // queued on the compute stream is ordered after the reads above.
  flight = InFlight();
  return on_finished_ ? on_finished_(bucket) : absl::OkStatus();
}

absl::Status GradientReducer::FinishAll() {
  while (!in_flight_.empty()) {
    InFlight flight = std::move(in_flight_.front());
    in_flight_.pop_front();
    ZE_RETURN_IF_ERROR(Finish(flight));
  }
  return absl::OkStatus();
}

}  // namespace zero
}  // namespace ze
