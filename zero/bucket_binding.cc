#include "zero/bucket_binding.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace ze {
namespace zero {

Tensor ParameterView(const PartitionedLayout& layout, int index,
                     const Tensor& buffer, const Shape& shape) {
  const ParamPlacement& place = layout.placement(index);
  return buffer.Slice(place.offset, place.numel).View(shape);
}

absl::Status BindBucket(const PartitionedLayout& layout, int bucket,
                        const std::vector<nn::Parameter*>& params,
                        ParameterSlot slot, const Tensor& buffer) {
  const BucketLayout& info = layout.bucket(bucket);
  if (buffer.defined() && buffer.numel() < info.content_elements) {
    return absl::InvalidArgumentError(absl::StrCat(
        "binding bucket ", bucket, ": its buffer has ", buffer.numel(),
        " elements, its parameters need ", info.content_elements));
  }
  for (int i = info.first_param; i < info.end_param; ++i) {
    nn::Parameter* parameter = params[i];
    if (!buffer.defined()) {
      if (slot == ParameterSlot::kData) {
        parameter->ReleaseData();
      } else {
        parameter->ReleaseGrad();
      }
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
