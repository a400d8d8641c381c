#include "zero/bucket_binding.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace ze {
namespace zero {

Tensor ParameterView(const PartitionedLayout& layout, int index,
                     const Tensor& buffer, const Shape& shape) {
  const ParamPlacement& place = layout.placement(index);
  return buffer.Slice(place.offset, place.numel).View(shape);
}

namespace {

// Parameter `index`'s elements within bucket elements [begin, begin +
// buffer.numel()) as its shard, or an empty shard when it has none there.
absl::Status BindShard(const PartitionedLayout& layout, int index,
                       nn::Parameter* parameter, const Tensor& buffer,
                       int64_t begin) {
  const ParamPlacement& place = layout.placement(index);
  const int64_t low = std::max(place.offset, begin);
  const int64_t high =
      std::min(place.offset + place.numel, begin + buffer.numel());
  if (high <= low) {
    parameter->ReleaseShard();
    return absl::OkStatus();
  }
  return parameter->SetShard(buffer.Slice(low - begin, high - low),
                             low - place.offset);
}

}  // namespace

absl::Status BindBucket(const PartitionedLayout& layout, int bucket,
                        const std::vector<nn::Parameter*>& params,
                        ParameterSlot slot, const Tensor& buffer,
                        int64_t buffer_begin) {
  const BucketLayout& info = layout.bucket(bucket);
  const bool whole_bucket = slot != ParameterSlot::kShard;
  if (whole_bucket && buffer_begin != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("binding bucket ", bucket,
                     ": a data or grad buffer holds the whole "
                     "bucket, so it cannot begin at element ",
                     buffer_begin));
  }
  if (whole_bucket && buffer.defined() &&
      buffer.numel() < info.content_elements) {
    return absl::InvalidArgumentError(absl::StrCat(
        "binding bucket ", bucket, ": its buffer has ", buffer.numel(),
        " elements, its parameters need ", info.content_elements));
  }
  for (int i = info.first_param; i < info.end_param; ++i) {
    nn::Parameter* parameter = params[i];
    if (!buffer.defined()) {
      switch (slot) {
        case ParameterSlot::kData:
          parameter->ReleaseData();
          break;
        case ParameterSlot::kGrad:
          parameter->ReleaseGrad();
          break;
        case ParameterSlot::kShard:
          parameter->ReleaseShard();
          break;
      }
      continue;
    }
    if (slot == ParameterSlot::kShard) {
      ZE_RETURN_IF_ERROR(BindShard(layout, i, parameter, buffer, buffer_begin));
      continue;
    }
    const Tensor view = ParameterView(layout, i, buffer, parameter->shape());
    ZE_RETURN_IF_ERROR(slot == ParameterSlot::kData ? parameter->SetData(view)
                                                    : parameter->SetGrad(view));
  }
  return absl::OkStatus();
}

}  // namespace zero
}  // namespace ze
