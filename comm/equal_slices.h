// Equal slices of a flat buffer across ranks, padded so any total divides.
//
// ReduceScatter and AllGather move equal slices. A buffer of `total`
// elements (53, say, at 3 ranks) is laid out as world_size slices of
// `slice` = ceil(total / world_size) elements, rounded up to `alignment`;
// the padded buffer has padded_total() = slice * world_size elements, the
// tail past `total` being padding (zeros by convention, so sums stay right).
//
//   EqualSlices s = EqualSlices::Make(53, 3);  // slice 18, padded_total 54
//   // rank 2 owns [36, 54): 17 real elements and 1 of padding.
#ifndef ZE_COMM_EQUAL_SLICES_H_
#define ZE_COMM_EQUAL_SLICES_H_

#include <algorithm>
#include <cstdint>

namespace ze {
namespace comm {

struct EqualSlices {
  int64_t total = 0;  // real elements
  int world_size = 1;
  int64_t slice = 0;  // elements per rank, padding included

  // `world_size` >= 1, `alignment` >= 1 (elements); a total of 0 gives empty
  // slices.
  static EqualSlices Make(int64_t total, int world_size,
                          int64_t alignment = 1) {
    EqualSlices slices;
    slices.total = total;
    slices.world_size = world_size;
    const int64_t per_rank = (total + world_size - 1) / world_size;
    slices.slice = (per_rank + alignment - 1) / alignment * alignment;
    return slices;
  }

  int64_t padded_total() const { return slice * world_size; }
  // First element of `rank`'s slice in the padded buffer.
  int64_t offset(int rank) const { return slice * rank; }
  // Real (non-padding) elements in `rank`'s slice: between 0 and slice.
  int64_t valid_count(int rank) const {
    return std::max<int64_t>(0, std::min(slice, total - offset(rank)));
  }
};

}  // namespace comm
}  // namespace ze

#endif  // ZE_COMM_EQUAL_SLICES_H_
