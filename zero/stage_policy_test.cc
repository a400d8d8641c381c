#include "zero/stage_policy.h"

#include "gtest/gtest.h"

namespace ze {
namespace zero {
namespace {

// The stage table of zero/partition_state.h, row by row: each stage adds
// one partitioned quantity to the previous one's.
TEST(StagePolicyTest, EachStagePartitionsOneMoreQuantity) {
  struct Row {
    int stage;
    bool optimizer, gradients, parameters;
  };
  const Row rows[] = {{0, false, false, false},
                      {1, true, false, false},
                      {2, true, true, false},
                      {3, true, true, true}};
  for (const Row& row : rows) {
    SCOPED_TRACE(row.stage);
    const StagePolicy policy = StagePolicy::ForStage(row.stage);
    EXPECT_EQ(policy.partition_optimizer, row.optimizer);
    EXPECT_EQ(policy.partition_gradients, row.gradients);
    EXPECT_EQ(policy.partition_parameters, row.parameters);
  }
}

TEST(StagePolicyTest, OutOfRangeStagesClampToTheEnds) {
  const StagePolicy below = StagePolicy::ForStage(-1);
  EXPECT_FALSE(below.partition_optimizer);
  EXPECT_FALSE(below.partition_parameters);
  const StagePolicy above = StagePolicy::ForStage(7);
  EXPECT_TRUE(above.partition_optimizer);
  EXPECT_TRUE(above.partition_parameters);
}

// Usable where a constant is needed (the policy is a pure function).
static_assert(StagePolicy::ForStage(2).partition_gradients &&
                  !StagePolicy::ForStage(2).partition_parameters,
              "stage 2 partitions gradients, not parameters");

}  // namespace
}  // namespace zero
}  // namespace ze
