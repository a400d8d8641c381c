#include "zero/partition_state.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/ops.h"
#include "core/status.h"

namespace ze {
namespace zero {

const char* PlacementName(Placement placement) {
  switch (placement) {
    case Placement::kDevice:
      return "device";
  }
  return "?";
}

PartitionState::PartitionState(const PartitionedLayout& layout,
                               const PartitionStateOptions& options)
    : layout_(layout), options_(options) {
  trainable_ = options_.trainable.empty()
                   ? std::vector<bool>(layout_.num_buckets(), true)
                   : options_.trainable;
  int64_t offset = 0;
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    bucket_offsets_.push_back(offset);
    offset += layout_.bucket(b).padded_elements;
  }
  gradients_current_.assign(layout_.num_buckets(), false);
}

absl::StatusOr<Tensor> PartitionState::Allocate(int64_t elements, DType dtype,
                                                const Stream& stream) const {
  absl::StatusOr<Tensor> tensor =
      Tensor::Zeros({elements}, dtype, options_.device, stream);
  if (!tensor.ok() && options_.annotate_allocation_error) {
    return options_.annotate_allocation_error(tensor.status());
  }
  return tensor;
}

absl::StatusOr<std::unique_ptr<PartitionState>> PartitionState::Create(
    const PartitionedLayout& layout, const PartitionStateOptions& options,
    const Stream& stream) {
  std::unique_ptr<PartitionState> state(new PartitionState(layout, options));
  const int64_t elements = state->weights_replicated()
                               ? layout.padded_total_elements()
                               : layout.partition_elements();
  ZE_ASSIGN_OR_RETURN(state->weights_,
                      state->Allocate(elements, options.model_dtype, stream));
  return state;
}

absl::Status PartitionState::AllocateTrainingState(const Stream& stream) {
  const int64_t padded = layout_.padded_total_elements();
  const int64_t partition = layout_.partition_elements();
  ZE_ASSIGN_OR_RETURN(gradients_,
                      Allocate(gradients_replicated() ? padded : partition,
                               options_.model_dtype, stream));
  if (!master_aliases_weights()) {
    ZE_ASSIGN_OR_RETURN(master_,
                        Allocate(updates_whole_buckets() ? padded : partition,
                                 DType::kF32, stream));
  }
  optimizers_.resize(layout_.num_buckets());
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    if (!trainable_[b]) continue;
    const int64_t count = updates_whole_buckets()
                              ? layout_.bucket(b).padded_elements
                              : layout_.bucket(b).slice_elements;
    absl::StatusOr<std::unique_ptr<FlatOptimizer>> optimizer =
        FlatOptimizer::Create(options_.optimizer, count, options_.device);
    if (!optimizer.ok()) {
      return options_.annotate_allocation_error
                 ? options_.annotate_allocation_error(optimizer.status())
                 : optimizer.status();
    }
    optimizers_[b] = std::move(optimizer).value();
    if (!master_aliases_weights()) {
      ZE_RETURN_IF_ERROR(Copy(OwnWeights(b), OwnMaster(b), stream));
    }
  }
  return absl::OkStatus();
}

Tensor PartitionState::FullWeights(int bucket) const {
  return weights_.Slice(bucket_offsets_[bucket],
                        layout_.bucket(bucket).padded_elements);
}

Tensor PartitionState::FullGradients(int bucket) const {
  return gradients_.Slice(bucket_offsets_[bucket],
                          layout_.bucket(bucket).padded_elements);
}

Tensor PartitionState::OwnWeights(int bucket) const {
  const BucketLayout& layout = layout_.bucket(bucket);
  if (updates_whole_buckets()) return FullWeights(bucket);
  if (weights_replicated()) {
    return weights_.Slice(
        bucket_offsets_[bucket] + options_.rank * layout.slice_elements,
        layout.slice_elements);
  }
  return weights_.Slice(layout.partition_offset, layout.slice_elements);
}

Tensor PartitionState::OwnMaster(int bucket) const {
  if (master_aliases_weights()) return OwnWeights(bucket);
  const BucketLayout& layout = layout_.bucket(bucket);
  if (updates_whole_buckets()) {
    return master_.Slice(bucket_offsets_[bucket], layout.padded_elements);
  }
  return master_.Slice(layout.partition_offset, layout.slice_elements);
}

Tensor PartitionState::OwnGradients(int bucket) const {
  const BucketLayout& layout = layout_.bucket(bucket);
  if (updates_whole_buckets()) return FullGradients(bucket);
  if (gradients_replicated()) {
    return gradients_.Slice(
        bucket_offsets_[bucket] + options_.rank * layout.slice_elements,
        layout.slice_elements);
  }
  return gradients_.Slice(layout.partition_offset, layout.slice_elements);
}

absl::Status PartitionState::ResetGradients(const Stream& stream) {
  std::fill(gradients_current_.begin(), gradients_current_.end(), false);
  if (gradients_replicated()) return Fill(gradients_, 0.0f, stream);
  return absl::OkStatus();
}

absl::Status PartitionState::ZeroStaleGradients(const Stream& stream) {
  if (gradients_replicated()) return absl::OkStatus();
  for (int b = 0; b < layout_.num_buckets(); ++b) {
    if (!trainable_[b] || gradients_current_[b]) continue;
    // No backward in this window reached the bucket: its gradient is 0.
    ZE_RETURN_IF_ERROR(Fill(OwnGradients(b), 0.0f, stream));
    gradients_current_[b] = true;
  }
  return absl::OkStatus();
}

Tensor PartitionState::MasterPiece(int index, int64_t* begin) const {
  const ParamPlacement& place = layout_.placement(index);
  if (updates_whole_buckets()) {
    *begin = 0;
    return OwnMaster(place.bucket).Slice(place.offset, place.numel);
  }
  // This rank owns [rank * slice, (rank + 1) * slice) of the bucket; the
  // parameter lies at [offset, offset + numel).
  const int64_t slice = layout_.bucket(place.bucket).slice_elements;
  const int64_t rank = options_.rank;
  const int64_t low = std::max<int64_t>(place.offset, rank * slice);
  const int64_t high =
      std::min<int64_t>(place.offset + place.numel, (rank + 1) * slice);
  if (high <= low) return Tensor();
  *begin = low - place.offset;
  return OwnMaster(place.bucket).Slice(low - rank * slice, high - low);
}

absl::StatusOr<std::vector<float>> PartitionState::GatherMaster(
    int index, comm::Communicator& comm, const Stream& stream) const {
  const ParamPlacement& place = layout_.placement(index);
  const BucketLayout& layout = layout_.bucket(place.bucket);
  ZE_ASSIGN_OR_RETURN(Tensor full, Tensor::Empty({layout.padded_elements},
                                                 DType::kF32, options_.device));
  // The master slice is f32 in every mode (in f32 training it is the
  // weights themselves), so it gathers as it is.
  Tensor own = OwnMaster(place.bucket);
  if (updates_whole_buckets() || comm.world_size() == 1) {
    ZE_RETURN_IF_ERROR(Copy(own, full, stream));
  } else {
    ZE_ASSIGN_OR_RETURN(comm::Work work, comm.AllGather(own, full, stream));
    ZE_RETURN_IF_ERROR(work.Wait());
  }
  ZE_ASSIGN_OR_RETURN(std::vector<float> values, ToHostFloats(full, stream));
  return std::vector<float>(values.begin() + place.offset,
                            values.begin() + place.offset + place.numel);
}

absl::Status CopyFromHost(const Tensor& src, const Tensor& dst,
                          const Stream& stream) {
  if (dst.device().is_cuda() && src.dtype() != dst.dtype()) {
    ZE_ASSIGN_OR_RETURN(Tensor converted,
                        Tensor::Empty(src.shape(), dst.dtype(), Device::Cpu()));
    ZE_RETURN_IF_ERROR(Copy(src, converted, stream));
    ZE_RETURN_IF_ERROR(Copy(converted, dst, stream));
    return stream.Synchronize();  // `converted` dies here
  }
  return Copy(src, dst, stream);
}

}  // namespace zero
}  // namespace ze
