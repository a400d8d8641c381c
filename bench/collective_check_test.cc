// The #wrong check without ranks: each collective simulated on the host from
// every rank's KnownInput must count 0 wrong, and a corrupted, misplaced or
// missing contribution must be counted.
#include "bench/collective_check.h"

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"

namespace ze {
namespace bench {
namespace {

constexpr Collective kAll[] = {Collective::kAllReduce,
                               Collective::kReduceScatter,
                               Collective::kAllGather, Collective::kBroadcast};

// What a correct collective leaves on `rank`, computed from every rank's
// KnownInput.
std::vector<float> Simulate(Collective collective, int rank, int world_size,
                            int64_t count) {
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < world_size; ++r) {
    inputs.push_back(KnownInput(collective, r, world_size, count));
  }
  const CollectiveShape shape = ShapeOf(collective, count, world_size);
  std::vector<float> output(shape.recv_count, 0.0f);
  for (int64_t i = 0; i < shape.recv_count; ++i) {
    switch (collective) {
      case Collective::kAllReduce:
        for (int r = 0; r < world_size; ++r) output[i] += inputs[r][i];
        break;
      case Collective::kReduceScatter:
        for (int r = 0; r < world_size; ++r) {
          output[i] += inputs[r][rank * shape.recv_count + i];
        }
        break;
      case Collective::kAllGather:
        output[i] = inputs[i / shape.send_count][i % shape.send_count];
        break;
      case Collective::kBroadcast:
        output[i] = inputs[0][i];
        break;
    }
  }
  return output;
}

TEST(CollectiveCheckTest, ShapesFollowNcclTests) {
  CollectiveShape shape = ShapeOf(Collective::kAllReduce, 12, 3);
  EXPECT_EQ(shape.send_count, 12);
  EXPECT_EQ(shape.recv_count, 12);
  EXPECT_EQ(shape.param_count, 12);
  shape = ShapeOf(Collective::kReduceScatter, 12, 3);
  EXPECT_EQ(shape.send_count, 12);
  EXPECT_EQ(shape.recv_count, 4);
  EXPECT_EQ(shape.param_count, 4);
  shape = ShapeOf(Collective::kAllGather, 12, 3);
  EXPECT_EQ(shape.send_count, 4);
  EXPECT_EQ(shape.recv_count, 12);
  EXPECT_EQ(shape.param_count, 4);
  EXPECT_DOUBLE_EQ(BusFactor(Collective::kAllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(BusFactor(Collective::kAllGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(BusFactor(Collective::kBroadcast, 4), 1.0);
  EXPECT_STREQ(RedopColumn(Collective::kReduceScatter), "sum");
  EXPECT_STREQ(RedopColumn(Collective::kAllGather), "none");
  EXPECT_EQ(RootColumn(Collective::kBroadcast), 0);
  EXPECT_EQ(RootColumn(Collective::kAllReduce), -1);
  for (Collective collective : kAll) {
    EXPECT_EQ(*ParseCollective(CollectiveName(collective)), collective);
  }
  EXPECT_FALSE(ParseCollective("alltoall").ok());
}

TEST(CollectiveCheckTest, CorrectResultsHaveNoWrongElements) {
  for (Collective collective : kAll) {
    for (int world_size : {1, 2, 3, 5, 8}) {
      for (int64_t count : {world_size, 6 * world_size, 53 * world_size}) {
        for (int rank = 0; rank < world_size; ++rank) {
          EXPECT_EQ(CountWrong(collective, rank, world_size, count,
                               Simulate(collective, rank, world_size, count)),
                    0)
              << CollectiveName(collective) << " rank " << rank << " of "
              << world_size << ", " << count << " elements";
        }
      }
    }
  }
}

TEST(CollectiveCheckTest, CountsCorruptedMisplacedAndMissingElements) {
  for (Collective collective : kAll) {
    std::vector<float> output = Simulate(collective, 1, 3, 30);
    output[2] += 1;
    EXPECT_EQ(CountWrong(collective, 1, 3, 30, output), 1)
        << CollectiveName(collective);
    output.pop_back();
    EXPECT_EQ(CountWrong(collective, 1, 3, 30, output),
              ShapeOf(collective, 30, 3).recv_count)
        << CollectiveName(collective);
  }
  // Another rank's slice of the reduce-scatter, or one rank's contribution
  // missing from the all-reduce, is wrong nearly everywhere.
  EXPECT_GT(CountWrong(Collective::kReduceScatter, 1, 3, 30,
                       Simulate(Collective::kReduceScatter, 2, 3, 30)),
            5);
  std::vector<float> two_ranks = Simulate(Collective::kAllReduce, 0, 2, 30);
  EXPECT_EQ(CountWrong(Collective::kAllReduce, 0, 3, 30, two_ranks), 30);
  // All-gather parts in the wrong order.
  std::vector<float> gathered = Simulate(Collective::kAllGather, 0, 3, 30);
  std::rotate(gathered.begin(), gathered.begin() + 10, gathered.end());
  EXPECT_GT(CountWrong(Collective::kAllGather, 0, 3, 30, gathered), 10);
  // A broadcast from rank 1 instead of 0.
  EXPECT_GT(CountWrong(Collective::kBroadcast, 2, 3, 30,
                       KnownInput(Collective::kBroadcast, 1, 3, 30)),
            10);
}

TEST(CollectiveCheckTest, KnownValuesMatchTheTorchReference) {
  // bench/torch_comm_reference_test.py holds the same numbers: both
  // implementations of Scramble must give them.
  EXPECT_EQ(KnownInput(Collective::kAllReduce, 3, 1, 12),
            std::vector<float>({1, 3, 2, 3, 4, 1, 3, 1, 3, 1, 2, 2}));
  EXPECT_EQ(KnownInput(Collective::kBroadcast, 1, 2, 12),
            std::vector<float>(
                {2, 239, 152, 126, 52, 68, 187, 99, 103, 199, 135, 165}));
}

TEST(CollectiveCheckTest, InputsStayExactInBf16) {
  // Reductions: at most 5 per rank, so 51 ranks sum to at most 255, and every
  // integer up to 256 is exact in bf16: the check never blames rounding.
  // Copies: at most 251.
  for (Collective collective : kAll) {
    const bool reduction = collective == Collective::kAllReduce ||
                           collective == Collective::kReduceScatter;
    float largest = 0;
    for (int rank = 0; rank < 51; ++rank) {
      for (float value : KnownInput(collective, rank, 51, int64_t{51} * 40)) {
        EXPECT_GE(value, 1.0f);
        EXPECT_EQ(value, static_cast<float>(static_cast<int>(value)));
        largest = std::max(largest, value);
      }
    }
    EXPECT_EQ(largest, reduction ? 5.0f : 251.0f) << CollectiveName(collective);
  }
}

TEST(CollectiveCheckTest, ReductionSumsDependOnPositionAtEveryWorldSize) {
  // A block of the result shifted by any amount must not pass: the expected
  // sums are not one repeating value, whatever the world size.
  for (int world_size = 1; world_size <= 16; ++world_size) {
    const int64_t count = int64_t{40} * world_size;
    std::vector<float> sums =
        Simulate(Collective::kAllReduce, 0, world_size, count);
    std::vector<float> shifted(sums.begin() + 1, sums.end());
    shifted.push_back(sums.front());
    EXPECT_GT(CountWrong(Collective::kAllReduce, 0, world_size, count, shifted),
              count / 2)
        << world_size << " ranks";
  }
}

}  // namespace
}  // namespace bench
}  // namespace ze
