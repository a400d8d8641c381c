#include "zero/forward_uses.h"

#include "gtest/gtest.h"
#include "nn/module.h"

namespace ze {
namespace zero {
namespace {

// One forward at a time in slot 0 (the engine's micro-steps): the old
// per-bracket count, and BeginForward forgets an unbackpropagated forward.
TEST(ForwardUses, OneSlotCountsPerBracket) {
  ForwardUses uses(3);
  uses.BeginForward();
  uses.Count(0);
  uses.Count(0);
  uses.Count(2);
  EXPECT_EQ(uses.pending(0), 2);
  EXPECT_FALSE(uses.CountDown(0));
  EXPECT_TRUE(uses.CountDown(0));
  EXPECT_FALSE(uses.CountDown(0));  // none pending
  EXPECT_EQ(uses.pending(1), 0);
  uses.BeginForward();  // the forward whose backward never came
  EXPECT_EQ(uses.pending(2), 0);
  uses.EndBackward();
  EXPECT_EQ(uses.slots(), 0);
}

// 1F1B's order: F(1) counts between F(0) and B(0); B(0) counts down F(0)'s
// uses only, so index 0 is final at B(0)'s first count-down although F(1)
// used it too, and B(1) still finds its own.
TEST(ForwardUses, EachSlotCountsDownItsOwnForward) {
  ForwardUses uses(2);
  {
    nn::SavedStateSlot slot(1);
    uses.BeginForward();
    uses.Count(0);
  }
  {
    nn::SavedStateSlot slot(2);
    uses.BeginForward();
    uses.Count(0);
    uses.Count(1);
  }
  EXPECT_EQ(uses.slots(), 2);
  {
    nn::SavedStateSlot slot(1);
    EXPECT_EQ(uses.pending(1), 0);
    EXPECT_TRUE(uses.CountDown(0));
    uses.EndBackward();
  }
  EXPECT_EQ(uses.slots(), 1);
  EXPECT_EQ(uses.pending(0), 0);  // slot 0 has none
  {
    nn::SavedStateSlot slot(2);
    EXPECT_EQ(uses.pending(0), 1);
    EXPECT_TRUE(uses.CountDown(1));
    EXPECT_TRUE(uses.CountDown(0));
    uses.EndBackward();
  }
  EXPECT_EQ(uses.slots(), 0);
}

}  // namespace
}  // namespace zero
}  // namespace ze
