#include "pipeline/partition.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ze {
namespace pipeline {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A GPT-like sequence: a heavy embedding, 8 equal blocks, a light final
// norm and a heavy head (the tied table's compute).
const std::vector<int64_t> kGptLike = {40, 12, 12, 12, 12, 12,
                                       12, 12, 12, 1,  38};

int64_t Heaviest(const std::vector<int64_t> &weights,
                 const std::vector<LayerRange> &ranges) {
  int64_t heaviest = 0;
  for (const LayerRange &r : ranges) {
    int64_t sum = 0;
    for (int i = r.first; i < r.last; ++i) sum += weights[i];
    heaviest = std::max(heaviest, sum);
  }
  return heaviest;
}

// Every contiguous cut of n layers into s stages, to check optimality.
void AllCuts(int n, int s, int start, std::vector<int> *bounds,
             std::vector<std::vector<LayerRange>> *out) {
  if (s == 0) {
    if (start == n) {
      std::vector<LayerRange> ranges;
      for (size_t i = 0; i + 1 < bounds->size(); ++i) {
        ranges.push_back({(*bounds)[i], (*bounds)[i + 1]});
      }
      out->push_back(ranges);
    }
    return;
  }
  for (int end = start + 1; end <= n; ++end) {
    bounds->push_back(end);
    AllCuts(n, s - 1, end, bounds, out);
    bounds->pop_back();
  }
}

TEST(PartitionTest, ByParametersGivesTheEmbeddingAndHeadStagesFewerBlocks) {
  absl::StatusOr<std::vector<LayerRange>> ranges =
      PartitionLayers(kGptLike, 4, "parameters");
  ASSERT_TRUE(ranges.ok()) << ranges.status();
  ASSERT_EQ(ranges->size(), 4u);
  EXPECT_EQ(ranges->front().first, 0);
  EXPECT_EQ(ranges->back().last, 11);
  EXPECT_LT(ranges->front().size(), (*ranges)[1].size());
  EXPECT_LT(ranges->back().size(), (*ranges)[1].size());
}

TEST(PartitionTest, ByParametersIsOptimalOverEveryCut) {
  for (int stages = 1; stages <= 5; ++stages) {
    std::vector<std::vector<LayerRange>> cuts;
    std::vector<int> bounds = {0};
    AllCuts(static_cast<int>(kGptLike.size()), stages, 0, &bounds, &cuts);
    int64_t optimum = -1;
    for (const auto &cut : cuts) {
      const int64_t h = Heaviest(kGptLike, cut);
      if (optimum < 0 || h < optimum) optimum = h;
    }
    absl::StatusOr<std::vector<LayerRange>> ranges =
        PartitionLayers(kGptLike, stages, "best");
    ASSERT_TRUE(ranges.ok());
    EXPECT_EQ(Heaviest(kGptLike, *ranges), optimum) << stages << " stages";
    for (const LayerRange &r : *ranges) EXPECT_GT(r.size(), 0);
  }
}

TEST(PartitionTest, UniformGivesTheEarlyStagesTheRemainder) {
  absl::StatusOr<std::vector<LayerRange>> ranges =
      PartitionLayers(kGptLike, 3, "uniform");
  ASSERT_TRUE(ranges.ok());
  EXPECT_THAT(*ranges, ElementsAre(LayerRange{0, 4}, LayerRange{4, 8},
                                   LayerRange{8, 11}));
}

TEST(PartitionTest, ExplicitBoundaries) {
  absl::StatusOr<std::vector<LayerRange>> ranges =
      PartitionLayers(kGptLike, 2, "0,2,11");
  ASSERT_TRUE(ranges.ok()) << ranges.status();
  EXPECT_THAT(*ranges, ElementsAre(LayerRange{0, 2}, LayerRange{2, 11}));
  EXPECT_THAT(PartitionLayers(kGptLike, 2, "0,5,10").status().message(),
              HasSubstr("expected 3 boundaries from 0 to 11"));
  EXPECT_THAT(PartitionLayers(kGptLike, 3, "0,5,5,11").status().message(),
              HasSubstr("must increase"));
  EXPECT_THAT(PartitionLayers(kGptLike, 2, "0,x,11").status().message(),
              HasSubstr("\"x\" is not a layer index"));
}

TEST(PartitionTest, ErrorsNameTheKeys) {
  EXPECT_THAT(
      PartitionLayers({1, 2, 3}, 4, "uniform").status().message(),
      HasSubstr("pipeline.stages = 4: the model has 3 pipeline layers"));
  EXPECT_THAT(PartitionLayers({1, 2, 3}, 2, "type:Block").status().message(),
              HasSubstr("pipeline.partition = \"type:Block\""));
}

TEST(FormatStagesTest, NamesEachStagesLayersParametersAndMemory) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  std::vector<StageSummary> stages(3);
  stages[0] = {{0, 7}, 354e6, 5.5 * kGiB, 0};
  stages[1] = {{7, 14}, 1.25e9, 1.0 * kGiB, 17.25 * kGiB};
  stages[2] = {{14, 15}, 3872, 0.25 * 1024 * 1024, 512.0 * 1024 * 1024};
  EXPECT_EQ(FormatStages(stages),
            "stage 0: layers [0, 7), 354.0 M parameters, 5.5 GiB GPU + 0.0 "
            "MiB host; stage 1: layers [7, 14), 1.25 B parameters, 1.0 GiB "
            "GPU + 17.2 GiB host; stage 2: layers [14, 15), 3872 "
            "parameters, 0.2 MiB GPU + 512.0 MiB host");
  EXPECT_EQ(FormatStages({}), "");
}

// Several stages per rank: each stage names its rank, and each rank's
// memory (one plan for its stages) is shown once.
TEST(FormatStagesTest, InterleavedStagesNameTheirRankAndRanksTheirMemory) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  std::vector<StageSummary> stages(4);
  stages[0] = {{0, 2}, 2e6, 1.5 * kGiB, 0, 0};
  stages[1] = {{2, 3}, 1e6, 2.0 * kGiB, 0, 1};
  stages[2] = {{3, 4}, 1e6, 1.5 * kGiB, 0, 0};
  stages[3] = {{4, 6}, 3e6, 2.0 * kGiB, 0, 1};
  EXPECT_EQ(FormatStages(stages, 2),
            "stage 0: layers [0, 2), 2.0 M parameters on rank 0; stage 1: "
            "layers [2, 3), 1.0 M parameters on rank 1; stage 2: layers [3, "
            "4), 1.0 M parameters on rank 0; stage 3: layers [4, 6), 3.0 M "
            "parameters on rank 1; rank 0: 1.5 GiB GPU + 0.0 MiB host; rank "
            "1: 2.0 GiB GPU + 0.0 MiB host");
}

}  // namespace
}  // namespace pipeline
}  // namespace ze
