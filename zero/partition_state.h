// PartitionState: the model state one rank owns under ZeRO, bucket by
// bucket, for every stage: the 16-bit (or f32) weights, the f32 master
// weights, the gradients and the optimizer state. Both stage strategies
// (zero/stages_0_to_2.h, zero/stage3.h) keep their state here, the boundary
// step (zero/boundary_step.h) updates it, and checkpoints will read it.
//
// What is replicated and what is this rank's slice depends on the stage:
//
//   stage  weights            gradients          master + optimizer state
//   0      replicated         replicated         replicated (whole buckets)
//   1      replicated         replicated         rank slice
//   2      replicated         rank slice         rank slice
//   3      rank slice         rank slice         rank slice
//
// A replicated buffer is (padded_total) elements, bucket b at
// bucket_offset(b); a partitioned one is (partition) elements, bucket b's
// slice at layout.bucket(b).partition_offset (zero/flat_layout.h). In f32
// training the master weights are the weights themselves (no copy).
//
// Placement: where each kind of state lives. Everything is on the model's
// device today; the offload issue adds pinned host memory and NVMe for the
// master weights and optimizer state, behind the same accessors.
//
// Not thread-safe; owned and driven by one strategy on the engine's thread.
#ifndef ZE_ZERO_PARTITION_STATE_H_
#define ZE_ZERO_PARTITION_STATE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "zero/flat_layout.h"
#include "zero/optimizer.h"

namespace ze {
namespace zero {

// Where a kind of model state lives.
enum class Placement {
  kDevice,  // the model's device (GPU memory, or host memory on CPU)
};
const char* PlacementName(Placement placement);

struct PartitionStateOptions {
  int stage = 0;  // 0-3: which quantities are replicated (table above)
  int rank = 0;
  DType model_dtype = DType::kF32;
  Device device = Device::Cpu();
  OptimizerOptions optimizer;
  // Per bucket: false for stage 3's frozen buckets (no gradients, no
  // optimizer, never updated). Empty: every bucket is trainable.
  std::vector<bool> trainable;
  // Turns an allocation failure into the error the user sees (the engine
  // states the bytes the plan needs). May be null.
  std::function<absl::Status(const absl::Status&)> annotate_allocation_error;
};

class PartitionState {
 public:
  // Allocates the weights (zero-filled) only: the strategy moves or
  // initialises the model's values into them before AllocateTrainingState,
  // so the model's own storage can be freed before the rest is allocated
  // (what keeps the peak at the plan). ResourceExhausted (annotated) when
  // the device cannot hold them.
  static absl::StatusOr<std::unique_ptr<PartitionState>> Create(
      const PartitionedLayout& layout, const PartitionStateOptions& options,
      const Stream& stream);
  PartitionState(const PartitionState&) = delete;
  PartitionState& operator=(const PartitionState&) = delete;

  // Allocates the gradients (zeroed), the master weights (a copy of this
  // rank's weights, unless f32 training aliases them) and one optimizer per
  // trainable bucket, queued on `stream`. Errors as Create.
  absl::Status AllocateTrainingState(const Stream& stream);

  const PartitionedLayout& layout() const { return layout_; }
  int num_buckets() const { return layout_.num_buckets(); }
  bool trainable(int bucket) const { return trainable_[bucket]; }
  int stage() const { return options_.stage; }
  DType model_dtype() const { return options_.model_dtype; }
  bool master_aliases_weights() const {
    return options_.model_dtype == DType::kF32;
  }
  // Start of bucket b in a replicated (padded_total) buffer.
  int64_t bucket_offset(int bucket) const { return bucket_offsets_[bucket]; }

  // The whole weights buffer: (padded_total) when replicated, (partition)
  // at stage 3. Parameters' data are views into it at stages 0-2.
  const Tensor& weights() const { return weights_; }
  // (padded) bucket b of the replicated weights (stages 0-2 only).
  Tensor FullWeights(int bucket) const;
  // (padded) bucket b of the replicated gradients (stages 0-1 only).
  Tensor FullGradients(int bucket) const;
  // What this rank's optimizer for bucket b reads and writes: the whole
  // bucket at stage 0, this rank's (slice) from stage 1 on.
  Tensor OwnWeights(int bucket) const;
  Tensor OwnMaster(int bucket) const;  // f32; OwnWeights in f32 training
  Tensor OwnGradients(int bucket) const;
  // The partitioned gradient buffer (stages 2-3): (partition).
  const Tensor& gradient_partition() const { return gradients_; }
  const Tensor& master() const { return master_; }
  FlatOptimizer& optimizer(int bucket) { return *optimizers_[bucket]; }

  // Whether bucket b's gradients hold this accumulation window's values.
  // Stages 2-3: until they do, the slice is stale and the window's first
  // reduction writes it instead of adding (no zero fill, no temporary).
  bool gradients_current(int bucket) const {
    return gradients_current_[bucket];
  }
  void set_gradients_current(int bucket) { gradients_current_[bucket] = true; }
  // After a step (taken or skipped): replicated gradients are zero-filled
  // on `stream`; partitioned ones are marked stale.
  absl::Status ResetGradients(const Stream& stream);
  // Before the boundary step: a partitioned bucket no reduction reached in
  // this window has zero gradients; fill them (on `stream`).
  absl::Status ZeroStaleGradients(const Stream& stream);

  // The part of parameter `index`'s f32 master this rank holds, as a view,
  // and through *begin its first element within the parameter. Undefined
  // when this rank holds none of it.
  Tensor MasterPiece(int index, int64_t* begin) const;
  // Parameter `name`'s f32 master values, gathered from every rank (a
  // collective at stages 1-3 with more than one rank).
  absl::StatusOr<std::vector<float>> GatherMaster(int index,
                                                  comm::Communicator& comm,
                                                  const Stream& stream) const;

  Placement weights_placement() const { return Placement::kDevice; }
  Placement master_placement() const { return Placement::kDevice; }
  Placement gradients_placement() const { return Placement::kDevice; }
  Placement optimizer_state_placement() const { return Placement::kDevice; }

 private:
  PartitionState(const PartitionedLayout& layout,
                 const PartitionStateOptions& options);
  bool weights_replicated() const { return options_.stage <= 2; }
  bool gradients_replicated() const { return options_.stage <= 1; }
  bool updates_whole_buckets() const { return options_.stage == 0; }
  absl::StatusOr<Tensor> Allocate(int64_t elements, DType dtype,
                                  const Stream& stream) const;

  PartitionedLayout layout_;
  PartitionStateOptions options_;
  std::vector<bool> trainable_;
  std::vector<int64_t> bucket_offsets_;
  Tensor weights_;    // (padded_total) stages 0-2, (partition) stage 3
  Tensor gradients_;  // (padded_total) stages 0-1, (partition) stages 2-3
  Tensor master_;     // f32: (padded_total) stage 0, (partition) 1-3
  std::vector<std::unique_ptr<FlatOptimizer>> optimizers_;  // per bucket
  std::vector<bool> gradients_current_;
};

// dst (any device) = src (host, any float dtype), converting on the host
// first when a host-to-device transfer would otherwise need equal dtypes.
// Waits for the transfer when it staged a temporary.
absl::Status CopyFromHost(const Tensor& src, const Tensor& dst,
                          const Stream& stream);

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_PARTITION_STATE_H_
