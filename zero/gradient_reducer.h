// GradientReducer: the one gradient reduction pipeline of every ZeRO stage.
// A strategy hands it a bucket's gradients when they are final; it applies
// prescale_gradients, casts to communication_data_type, orders the
// collective after the kernels that produced the gradients, issues it on
// the communication stream, and finishes it:
//
//   kind                      stages  collective               result in
//   kAllReduce                0       all-reduce, in place     the bucket
//   kReduceScatterInPlace     1       reduce-scatter, in place this rank's
//                                                              slice of it
//   kReduceScatterToPartition 2, 3    reduce-scatter           the gradient
//                                                              partition
//
// In-place kinds are finished by FinishAll at the step (the gradients are
// the replicated buffer; nothing is freed). kReduceScatterToPartition keeps
// at most two buckets in flight: issuing a third finishes the oldest, which
// waits for its collective on the compute stream and then writes
// (overwrite) or adds its slice into the partition. Overwrite-or-add is
// decided per bucket by PartitionState::gradients_current: the window's
// first reduction of a bucket writes the slice directly (into the
// partition itself when no cast is needed), later ones add through a
// temporary; at one rank without a cast the layers accumulate into the
// partition itself in every micro-batch (ReducesInPartition). When
// communication_data_type differs from the model's dtype, sums are formed in it
// and rounded back to the model's dtype once.
//
// Streams: every kernel the reducer queues runs on the compute stream; the
// collective runs on the communication stream (which may be the compute
// stream), after an event. Temporaries live until the compute stream has
// waited for the collective that uses them.
//
// Not thread-safe; driven by the strategy on the engine's thread.
#ifndef ZE_ZERO_GRADIENT_REDUCER_H_
#define ZE_ZERO_GRADIENT_REDUCER_H_

#include <deque>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "comm/communicator.h"
#include "core/dtype.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "zero/partition_state.h"

namespace ze {
namespace zero {

// Buckets of kReduceScatterToPartition in flight at once: enough to overlap
// one bucket's collective with the next bucket's backward, few enough to
// bound the full-size gradient buffers alive (the plan counts them:
// GradientBucketTransientBytes in zero/plan.h).
inline constexpr size_t kMaxReductionsInFlight = 2;

enum class ReductionKind {
  kAllReduce,
  kReduceScatterInPlace,
  kReduceScatterToPartition,
};

struct GradientReducerOptions {
  ReductionKind kind = ReductionKind::kAllReduce;
  DType communication_dtype = DType::kF32;  // the model's when unset
  // prescale_gradients: divide by gradient_predivide_factor before the
  // collective (the boundary step multiplies it back).
  bool prescale = false;
  double predivide_factor = 1.0;
};

// Whether the layers can write a bucket's gradients into the partition
// itself and the reduction be skipped: kReduceScatterToPartition at one
// rank without a cast (`casts`: communication_data_type differs from the
// model's dtype), for a micro-batch that `accumulates` onto the window's
// earlier sum too, except under prescale_gradients (its scaling would
// reach that sum). GradientReducer::ReducesInPartition applies it per
// bucket; the plan counts the buckets' memory by it
// (GradientBucketTransientBytes).
bool LayersWriteThePartition(const GradientReducerOptions& options,
                             int world_size, bool casts, bool accumulates);

class GradientReducer {
 public:
  // `state`, `comm` and the streams must outlive the reducer.
  // `on_finished(bucket)` runs once a bucket's reduced slice is in place
  // (for kReduceScatterToPartition in the partition: the strategy frees its
  // full gradients there; an offloaded update begun early takes it).
  GradientReducer(const GradientReducerOptions& options, PartitionState* state,
                  comm::Communicator* comm, const Stream* compute_stream,
                  const Stream* communication_stream,
                  std::function<absl::Status(int bucket)> on_finished);
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Whether kReduceScatterToPartition at world size 1 can skip the
  // collective for `bucket`: no cast, and not a later micro-batch under
  // prescale_gradients (whose scaling would reach the window's sum). Then
  // the strategy lets the layers write the partition slice itself
  // (PartitionState::OwnGradients, which is the whole bucket), zeroed
  // only for the window's first micro-batch, and Issue only records it:
  // no full-size buffer, no output slice, no add (the sum is formed in
  // the layers' accumulation, rounded once a micro-batch instead of
  // twice).
  bool ReducesInPartition(int bucket) const;

  // Issues the reduction of `bucket`'s gradients, (padded) model dtype,
  // final on the compute stream. For kReduceScatterToPartition they must
  // stay alive until on_finished(bucket). Errors from the collective.
  absl::Status Issue(int bucket, const Tensor& gradients);
  // Waits (on the compute stream) for every issued reduction and puts its
  // result in place: for in-place kinds rounds communication_dtype sums
  // back; for the partition kind writes or adds; then calls on_finished.
  absl::Status FinishAll();
  // Whether any bucket's reduction is issued and not finished.
  bool idle() const { return in_flight_.empty(); }

 private:
  struct InFlight {
    int bucket = -1;
    Tensor wire;             // (padded) cast copy in communication_dtype
    Tensor reduced;          // (slice) the reduce-scatter's output, when not
                             // written straight into the partition
    bool overwrite = false;  // the window's first reduction of the bucket
    comm::Work work;
  };
  bool casts() const {
    return options_.communication_dtype != state_->model_dtype();
  }
  absl::Status Finish(InFlight& flight);

  GradientReducerOptions options_;
  PartitionState* state_;
  comm::Communicator* comm_;
  const Stream* compute_stream_;
  const Stream* communication_stream_;
  std::function<absl::Status(int)> on_finished_;
  std::deque<InFlight> in_flight_;
};

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_GRADIENT_REDUCER_H_
