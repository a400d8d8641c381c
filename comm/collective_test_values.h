// Values for collective tests, shared by the in-process backend's unit test
// (comm/in_process_test.cc) and the multi-rank tests under mpirun
// (tests/comm/collectives_mpi_test.cc). Rank r's element i is a small
// integer, so sums over up to 4 ranks are exact in bf16 and f16, and what
// every backend must produce is the reduction in f32 rounded once to the
// dtype (NCCL's average, which may scale before summing, aside).
#ifndef ZE_COMM_COLLECTIVE_TEST_VALUES_H_
#define ZE_COMM_COLLECTIVE_TEST_VALUES_H_

#include <algorithm>
#include <cstdint>

#include "comm/recent_collectives.h"
#include "core/dtype.h"

namespace ze {
namespace comm {

// Rank r's value at element i: an integer in [-5, 5].
inline float CollectiveTestValue(int rank, int64_t i) {
  return static_cast<float>((i * 7 + rank * 3) % 11) - 5.0f;
}

// `value` rounded to `dtype` and read back as f32.
inline float RoundedTo(DType dtype, float value) {
  uint32_t storage = 0;  // holds one element of any dtype
  StoreFromFloat(&storage, dtype, 0, value);
  return LoadAsFloat(&storage, dtype, 0);
}

// `op` over ranks 0..world_size-1 of CollectiveTestValue(r, i), in rank
// order in f32, rounded once to `dtype`.
inline float ExpectedReduction(ReduceOp op, DType dtype, int world_size,
                               int64_t i) {
  float result = CollectiveTestValue(0, i);
  for (int r = 1; r < world_size; ++r) {
    const float v = CollectiveTestValue(r, i);
    if (op == ReduceOp::kMax) {
      result = std::max(result, v);
    } else if (op == ReduceOp::kMin) {
      result = std::min(result, v);
    } else {
      result += v;
    }
  }
  if (op == ReduceOp::kAverage) result /= static_cast<float>(world_size);
  return RoundedTo(dtype, result);
}

}  // namespace comm
}  // namespace ze

#endif  // ZE_COMM_COLLECTIVE_TEST_VALUES_H_
