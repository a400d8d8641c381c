// The collectives comm_bench measures, nccl-tests' size conventions for them,
// and the known-input check behind its #wrong column: what each rank puts in,
// what each rank must get out, and how many elements differ.
#ifndef ZE_BENCH_COLLECTIVE_CHECK_H_
#define ZE_BENCH_COLLECTIVE_CHECK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ze {
namespace bench {

enum class Collective { kAllReduce, kReduceScatter, kAllGather, kBroadcast };

// "all_reduce", "reduce_scatter", "all_gather", "broadcast".
const char *CollectiveName(Collective collective);
// The inverse; InvalidArgument naming the text and the choices otherwise.
absl::StatusOr<Collective> ParseCollective(const std::string &name);

// One collective at one size, in nccl-tests' terms. `count` is the element
// count of the larger buffer (the all-reduce buffer, the reduce-scatter
// input, the all-gather output, the broadcast buffer), a multiple of the
// world size; the table's "size" column is count times the element size.
struct CollectiveShape {
  int64_t count = 0;
  int64_t send_count = 0;  // elements each rank sends (its input)
  int64_t recv_count = 0;  // elements each rank receives (its output)
  // nccl-tests' "count" column: the count argument of the NCCL call (the
  // per-rank count for reduce-scatter and all-gather).
  int64_t param_count = 0;
};
CollectiveShape ShapeOf(Collective collective, int64_t count, int world_size);

// nccl-tests' bus bandwidth factor: 2(n-1)/n for all-reduce, (n-1)/n for
// reduce-scatter and all-gather, 1 for broadcast.
double BusFactor(Collective collective, int world_size);

// nccl-tests' "redop" and "root" columns: sum and -1 for the reductions,
// none and -1 for all-gather, none and 0 for broadcast (root 0).
const char *RedopColumn(Collective collective);
int RootColumn(Collective collective);

// The input rank `rank` holds: send_count small integers depending on the
// (scrambled) position, and for all-gather and broadcast on the rank too, so
// a missing, doubled or misplaced contribution shows; sums over up to 51
// ranks stay exact in bf16 (integers to 256), f16 and f32 whatever the
// reduction order.
std::vector<float> KnownInput(Collective collective, int rank, int world_size,
                              int64_t count);

// Elements of `output` (the recv_count values rank `rank` got, after every
// rank ran the collective, sum for the reductions, on KnownInput) that
// differ from the exact result; a size mismatch counts every expected
// element as wrong.
int64_t CountWrong(Collective collective, int rank, int world_size,
                   int64_t count, const std::vector<float> &output);

}  // namespace bench
}  // namespace ze

#endif  // ZE_BENCH_COLLECTIVE_CHECK_H_
