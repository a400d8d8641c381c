#include "bench/collective_check.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ze {
namespace bench {
namespace {

// A scrambled position, so a shifted or swapped block of the result does not
// line up with a repeating pattern and pass as correct.
uint64_t Scramble(int64_t index) {
  uint64_t x = static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull;
  return x ^ (x >> 31);
}

bool IsReduction(Collective collective) {
  return collective == Collective::kAllReduce ||
         collective == Collective::kReduceScatter;
}

// What rank `rank` contributes at position `index` of the whole buffer
// (input index for all-reduce, reduce-scatter and broadcast; output index
// for all-gather, where rank r owns [r*m, (r+1)*m)).
// Reductions: 1..5 by position alone, so the sum n*(1..5) shows a missing or
// doubled rank and a misplaced block, and stays exact in bf16 (integers to
// 256) up to 51 ranks. Copies: 1..251 by position and rank, so another
// rank's block or position shows, exact in bf16 too.
float Value(Collective collective, int rank, int64_t index) {
  if (IsReduction(collective)) {
    return static_cast<float>(1 + Scramble(index) % 5);
  }
  return static_cast<float>(1 + (Scramble(index) + rank) % 251);
}

}  // namespace

const char *CollectiveName(Collective collective) {
  switch (collective) {
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kBroadcast:
      return "broadcast";
  }
  return "unknown";
}

absl::StatusOr<Collective> ParseCollective(const std::string &name) {
  for (Collective collective :
       {Collective::kAllReduce, Collective::kReduceScatter,
        Collective::kAllGather, Collective::kBroadcast}) {
    if (name == CollectiveName(collective)) return collective;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown collective \"", name,
                   "\"; use all_reduce, reduce_scatter, all_gather or "
                   "broadcast"));
}

CollectiveShape ShapeOf(Collective collective, int64_t count, int world_size) {
  CollectiveShape shape;
  shape.count = count;
  const int64_t per_rank = count / world_size;
  switch (collective) {
    case Collective::kAllReduce:
    case Collective::kBroadcast:
      shape.send_count = shape.recv_count = shape.param_count = count;
      break;
    case Collective::kReduceScatter:
      shape.send_count = count;
      shape.recv_count = shape.param_count = per_rank;
      break;
    case Collective::kAllGather:
      shape.send_count = shape.param_count = per_rank;
      shape.recv_count = count;
      break;
  }
  return shape;
}

double BusFactor(Collective collective, int world_size) {
  const double n = world_size;
  switch (collective) {
    case Collective::kAllReduce:
      return 2.0 * (n - 1) / n;
    case Collective::kBroadcast:
      return 1.0;
    case Collective::kReduceScatter:
    case Collective::kAllGather:
      return (n - 1) / n;
  }
  return 0;
}

const char *RedopColumn(Collective collective) {
  return IsReduction(collective) ? "sum" : "none";
}

int RootColumn(Collective collective) {
  return collective == Collective::kBroadcast ? 0 : -1;
}

std::vector<float> KnownInput(Collective collective, int rank, int world_size,
                              int64_t count) {
  const CollectiveShape shape = ShapeOf(collective, count, world_size);
  // All-gather's input is the rank's own part of the output.
  const int64_t first =
      collective == Collective::kAllGather ? rank * shape.send_count : 0;
  std::vector<float> input(shape.send_count);
  for (int64_t i = 0; i < shape.send_count; ++i) {
    input[i] = Value(collective, rank, first + i);
  }
  return input;
}

int64_t CountWrong(Collective collective, int rank, int world_size,
                   int64_t count, const std::vector<float> &output) {
  const CollectiveShape shape = ShapeOf(collective, count, world_size);
  if (static_cast<int64_t>(output.size()) != shape.recv_count) {
    return shape.recv_count;
  }
  // Reduce-scatter's output is the rank's own slice of the sum.
  const int64_t first =
      collective == Collective::kReduceScatter ? rank * shape.recv_count : 0;
  int64_t wrong = 0;
  for (int64_t i = 0; i < shape.recv_count; ++i) {
    const int64_t index = first + i;
    float expected = 0;
    switch (collective) {
      case Collective::kAllReduce:
      case Collective::kReduceScatter:
        expected = world_size * Value(collective, 0, index);
        break;
      case Collective::kAllGather:
        expected = Value(collective, static_cast<int>(index / shape.send_count),
                         index);
        break;
      case Collective::kBroadcast:
        expected = Value(collective, RootColumn(collective), index);
        break;
    }
    if (output[i] != expected) ++wrong;
  }
  return wrong;
}

}  // namespace bench
}  // namespace ze
