#include "pipeline/layout.h"

#include "comm/factory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ze {
namespace pipeline {
namespace {

using ::testing::HasSubstr;

TEST(PipelineLayoutTest, DataParallelRanksOfAStageAreNeighbours) {
  absl::StatusOr<PipelineLayout> layout =
      PipelineLayout::Create(6, 3, "pipeline.stages");
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->data_parallel, 2);
  const int expected_stage[] = {0, 0, 1, 1, 2, 2};
  for (int rank = 0; rank < 6; ++rank) {
    EXPECT_EQ(layout->StageOf(rank), expected_stage[rank]);
    EXPECT_EQ(layout->DataParallelIndexOf(rank), rank % 2);
    EXPECT_EQ(layout->RankAt(layout->StageOf(rank),
                             layout->DataParallelIndexOf(rank)),
              rank);
  }
  EXPECT_EQ(layout->ToString(), "3 stages x 2 data-parallel over 6 ranks");
}

TEST(PipelineLayoutTest, BadLayoutsNameTheKey) {
  EXPECT_THAT(
      PipelineLayout::Create(4, 3, "pipeline.stages").status().message(),
      HasSubstr("pipeline.stages = 3 does not divide the world size 4"));
  EXPECT_THAT(
      PipelineLayout::Create(4, 0, "pipeline.stages").status().message(),
      HasSubstr("pipeline.stages = 0"));
}

TEST(PipelineLayoutTest, GroupsOfAWorldOfOne) {
  comm::CommOptions options;
  options.device = "cpu";
  absl::StatusOr<std::unique_ptr<comm::Communicator>> world =
      comm::CreateCommunicator(options);
  ASSERT_TRUE(world.ok()) << world.status();
  absl::StatusOr<PipelineLayout> layout =
      PipelineLayout::Create(1, 1, "pipeline.stages");
  ASSERT_TRUE(layout.ok());
  absl::StatusOr<PipelineGroups> groups =
      CreatePipelineGroups(**world, *layout);
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_EQ(groups->pipeline->world_size(), 1);
  EXPECT_EQ(groups->data_parallel->world_size(), 1);
  absl::StatusOr<PipelineLayout> wrong =
      PipelineLayout::Create(2, 1, "pipeline.stages");
  ASSERT_TRUE(wrong.ok());
  EXPECT_THAT(CreatePipelineGroups(**world, *wrong).status().message(),
              HasSubstr("on a world of 1 ranks"));
}

}  // namespace
}  // namespace pipeline
}  // namespace ze
