// ZeroStrategy's checkpoint side: what a rank saves and how it loads state
// saved under any other layout (world size, stage, bucketing).
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops.h"
#include "core/status.h"
#include "zero/strategy.h"

namespace ze {
namespace zero {
namespace {

// The parameter's elements [low, high) within bucket-buffer range
// [range_begin, range_end), or an empty range.
struct Overlap {
  int64_t param_begin = 0;   // first element within the parameter
  int64_t range_offset = 0;  // where it lands within the range
  int64_t count = 0;
};

Overlap Intersect(const ParamPlacement& place, int64_t range_begin,
                  int64_t range_end) {
  const int64_t low = std::max(place.offset, range_begin);
  const int64_t high = std::min(place.offset + place.numel, range_end);
  if (high <= low) return Overlap();
  return Overlap{low - place.offset, low - range_begin, high - low};
}

}  // namespace

std::vector<ZeroStrategy::CheckpointKind> ZeroStrategy::CheckpointKinds()
    const {
  std::vector<CheckpointKind> kinds;
  for (const std::string& name : partition_->StateArrayNames()) {
    kinds.push_back(CheckpointKind{name, DType::kF32});
  }
  if (!partition_->master_aliases_weights()) {
    kinds.push_back(CheckpointKind{"weights", partition_->model_dtype()});
  }
  return kinds;
}

absl::Status ZeroStrategy::RequireCheckpointable(const char* what) {
  ZE_RETURN_IF_ERROR(RequireIdle(what));
  if (HasOpenScope()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " on rank ", rank(),
                     ": a GatherParameters scope is open; release it first"));
  }
  return partition_->FinishUpdate(stream());
}

absl::Status ZeroStrategy::SaveState(const CheckpointSink& sink) {
  ZE_RETURN_IF_ERROR(RequireCheckpointable("save_checkpoint"));
  const PartitionedLayout& layout = partition_->layout();
  const std::vector<CheckpointKind> kinds = CheckpointKinds();
  const int arrays = static_cast<int>(kinds.size()) -
                     (partition_->master_aliases_weights() ? 0 : 1);
  const std::vector<ParamShard> pieces = CheckpointPieces();
  size_t next = 0;
  for (int b = 0; b < layout.num_buckets() && next < pieces.size(); ++b) {
    if (pieces[next].bucket != b) continue;
    // This rank's slice of the bucket, every kind, on the host.
    const PartitionSlice slice = layout.BucketSlice(b, rank());
    const int64_t own_begin = slice.begin - partition_->OwnRange(b).begin;
    std::vector<Tensor> host(kinds.size());
    for (int a = 0; a < arrays; ++a) {
      ZE_ASSIGN_OR_RETURN(
          host[a], Tensor::Empty({slice.size()}, DType::kF32, Device::Cpu()));
      ZE_RETURN_IF_ERROR(
          partition_->ReadOwnState(b, a, own_begin, host[a], stream()));
    }
    if (arrays < static_cast<int>(kinds.size())) {
      int64_t weights_begin = 0;
      const Tensor weights = partition_->CheckpointWeights(b, &weights_begin);
      ZE_ASSIGN_OR_RETURN(
          host[arrays], Tensor::Empty({slice.size()}, partition_->model_dtype(),
                                      Device::Cpu()));
      ZE_RETURN_IF_ERROR(
          Copy(weights.Slice(slice.begin - weights_begin, slice.size()),
               host[arrays], stream()));
      ZE_RETURN_IF_ERROR(stream().Synchronize());
    }
    for (; next < pieces.size() && pieces[next].bucket == b; ++next) {
      const ParamShard& piece = pieces[next];
      const int64_t at = piece.bucket_offset - slice.begin;
      for (size_t k = 0; k < kinds.size(); ++k) {
        ZE_RETURN_IF_ERROR(
            sink(kinds[k], piece, host[k].Slice(at, piece.count)));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ZeroStrategy::LoadState(const CheckpointSource& source,
                                     bool load_optimizer_states,
                                     int64_t optimizer_step_count) {
  ZE_RETURN_IF_ERROR(RequireCheckpointable("load_checkpoint"));
  const PartitionedLayout& layout = partition_->layout();
  const std::vector<std::string> arrays = partition_->StateArrayNames();
  const bool aliased = partition_->master_aliases_weights();
  for (int b = 0; b < layout.num_buckets(); ++b) {
    const BucketLayout& bucket = layout.bucket(b);
    // Fills `destination` (bucket elements [range_begin, + numel)) from the
    // source, padding zero.
    auto gather = [&](const std::string& kind, int64_t range_begin,
                      const Tensor& destination) -> absl::Status {
      ZE_RETURN_IF_ERROR(
          Fill(destination, 0.0f, Stream::Default(Device::Cpu())));
      for (int p = bucket.first_param; p < bucket.end_param; ++p) {
        const Overlap overlap = Intersect(layout.placement(p), range_begin,
                                          range_begin + destination.numel());
        if (overlap.count == 0) continue;
        ZE_RETURN_IF_ERROR(
            source(kind, layout.param(p).name, overlap.param_begin,
                   destination.Slice(overlap.range_offset, overlap.count)));
      }
      return absl::OkStatus();
    };
    const PartitionSlice own = partition_->OwnRange(b);
    const int loaded_arrays =
        load_optimizer_states ? static_cast<int>(arrays.size()) : 1;
    // With aliasing, array 0 is the weights, loaded below.
    for (int a = aliased ? 1 : 0; a < loaded_arrays; ++a) {
      ZE_ASSIGN_OR_RETURN(
          Tensor host, Tensor::Empty({own.size()}, DType::kF32, Device::Cpu()));
      ZE_RETURN_IF_ERROR(gather(arrays[a], own.begin, host));
      ZE_RETURN_IF_ERROR(partition_->WriteOwnState(b, a, 0, host, stream()));
    }
    int64_t weights_begin = 0;
    const Tensor weights = partition_->CheckpointWeights(b, &weights_begin);
    ZE_ASSIGN_OR_RETURN(
        Tensor host,
        Tensor::Empty({weights.numel()}, weights.dtype(), Device::Cpu()));
    ZE_RETURN_IF_ERROR(
        gather(aliased ? "master" : "weights", weights_begin, host));
    ZE_RETURN_IF_ERROR(Copy(host, weights, stream()));
    ZE_RETURN_IF_ERROR(stream().Synchronize());
  }
  if (load_optimizer_states) {
    partition_->set_optimizer_step_count(optimizer_step_count);
  }
  ZE_RETURN_IF_ERROR(partition_->ResetGradients(stream()));
  ZE_RETURN_IF_ERROR(OnStateLoaded());
  return stream().Synchronize();
}

}  // namespace zero
}  // namespace ze
