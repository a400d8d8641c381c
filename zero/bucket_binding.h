// Binding parameters to flat buckets. ZeRO keeps a bucket's parameters in
// one flat buffer ([padded_elements]: each parameter at its layout offset,
// padding between and after), while the model's layers reach them through
// each nn::Parameter's data and grad slots. This is the one place that
// makes those slots views of a bucket buffer, or empties them: the stage
// strategies bind the full weights (stages 0-2), the gathered weights
// (stage 3), the gradient buffers (every stage) and stage 3's shards
// (each parameter's piece of the rank's slice of a bucket) through it.
#ifndef ZE_ZERO_BUCKET_BINDING_H_
#define ZE_ZERO_BUCKET_BINDING_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/tensor.h"
#include "nn/parameter.h"
#include "zero/flat_layout.h"

namespace ze {
namespace zero {

// Which slot of a parameter a bucket buffer backs: the full data, the
// gradient, or the shard (nn::Parameter::SetShard: the parameter's
// elements within a range of the bucket, e.g. the rank's stage-3 slice).
enum class ParameterSlot { kData, kGrad, kShard };

// Parameter `index`'s elements of its bucket's flat buffer `buffer`
// ([padded_elements] or at least [content_elements]), viewed with the
// parameter's `shape`. Shares `buffer`'s storage (no copy, no stream work).
Tensor ParameterView(const PartitionedLayout& layout, int index,
                     const Tensor& buffer, const Shape& shape);

// Makes `slot` of every parameter of bucket `bucket` (params[first_param,
// end_param): `params` is indexed like the layout) a view of its elements
// of `buffer`; an undefined `buffer` empties those slots instead. kData and
// kGrad: `buffer` is the whole bucket ([padded_elements], or at least
// [content_elements]) and `buffer_begin` 0. kShard: `buffer` holds bucket
// elements [buffer_begin, buffer_begin + numel) (any device); a parameter
// with elements there gets them as its shard (flat, at its offset within
// the parameter), one without has its shard emptied.
// Success: every slot of the bucket set (or emptied). Failure:
// InvalidArgument naming the bucket when `buffer` is shorter than the
// bucket's content or a whole-bucket slot gets a buffer_begin, or
// SetData/SetGrad/SetShard's InvalidArgument (dtype, device, range) naming
// the parameter; slots of parameters before it are already bound.
// Ownership: the views share `buffer`'s storage, so each parameter keeps it
// alive until its slot is emptied or rebound. Thread: the caller's; queues
// nothing on any stream (ordering writes into `buffer` is the caller's).
absl::Status BindBucket(const PartitionedLayout& layout, int bucket,
                        const std::vector<nn::Parameter*>& params,
                        ParameterSlot slot, const Tensor& buffer,
                        int64_t buffer_begin = 0);

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_BUCKET_BINDING_H_
