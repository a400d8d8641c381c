// The loss scaler's static and dynamic sequences. Declared boilerplate: each
// test sets its options field by field, as a config would.
#include "zero/loss_scaler.h"

#include <vector>

#include "gtest/gtest.h"

namespace ze {
namespace zero {
namespace {

struct Expected {
  bool overflow;
  double scale_used;  // the scale this iteration ran with
  bool skipped;
};

void RunScript(LossScaler& scaler, const std::vector<Expected>& script) {
  for (size_t i = 0; i < script.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "iteration " << i);
    EXPECT_EQ(scaler.scale(), script[i].scale_used);
    auto update = scaler.Update(script[i].overflow);
    ASSERT_TRUE(update.ok()) << update.status();
    EXPECT_EQ(update->step_skipped, script[i].skipped);
    EXPECT_EQ(update->old_scale, script[i].scale_used);
    EXPECT_EQ(update->new_scale, scaler.scale());
  }
}

// hysteresis 2, window 4, initial 2^4, floor 2. Worked by hand from the
// rules in loss_scaler.h (o = overflow, . = clean):
//   it  0 . 16   (0 - -1) % 4 = 1
//   it  1 . 16
//   it  2 . 16
//   it  3 . 16   (3 - -1) % 4 = 0 -> 32
//   it  4 o 32   counter 2 -> 1, scale kept, skipped
//   it  5 o 32   counter 1 -> halve to 16 (counter stays 1)
//   it  6 . 16   (6 - 5) % 4 = 1
//   it  7 o 16   counter still 1 -> 8
//   it  8 . 8, it 9 . 8, it 10 . 8
//   it 11 . 8    (11 - 7) % 4 = 0 -> 16, counter restored to 2
//   it 12 o 16   counter 2 -> 1
//   it 13 . 16
//   it 14 o 16   -> 8
//   it 15 o 8    -> 4
//   it 16 o 4    -> max(2, 2) = 2
//   it 17 o 2    -> max(1, 2) = 2 (the floor)
//   it 18 . 2
TEST(LossScalerTest, DynamicScaleSequenceWithHysteresisWindowAndFloor) {
  LossScalerOptions options;
  options.initial_scale_power = 4;
  options.loss_scale_window = 4;
  options.hysteresis = 2;
  options.min_loss_scale = 2;
  options.raise_error_at_min_scale = false;
  auto scaler = LossScaler::Create(options);
  ASSERT_TRUE(scaler.ok());
  EXPECT_TRUE(scaler->dynamic());
  RunScript(*scaler, {{false, 16, false},
                      {false, 16, false},
                      {false, 16, false},
                      {false, 16, false},
                      {true, 32, true},
                      {true, 32, true},
                      {false, 16, false},
                      {true, 16, true},
                      {false, 8, false},
                      {false, 8, false},
                      {false, 8, false},
                      {false, 8, false},
                      {true, 16, true},
                      {false, 16, false},
                      {true, 16, true},
                      {true, 8, true},
                      {true, 4, true},
                      {true, 2, true},
                      {false, 2, false}});
  EXPECT_EQ(scaler->scale(), 2);
  EXPECT_EQ(scaler->state().cur_iter, 19);
  EXPECT_EQ(scaler->state().last_overflow_iter, 17);
}

// With consecutive_hysteresis every clean step restores the counter, so
// isolated overflows never halve; without it the second one does.
//   pattern o . o . o
//   consecutive:     counter 2->1, restore 2, 2->1, restore 2, 2->1: 16 all
//   not consecutive: 2->1 (16), clean (16), halve (16 -> 8), clean, halve
TEST(LossScalerTest, ConsecutiveHysteresisRestoresOnEveryCleanStep) {
  LossScalerOptions options;
  options.initial_scale_power = 4;
  options.loss_scale_window = 100;
  options.hysteresis = 2;
  options.consecutive_hysteresis = true;
  auto consecutive = LossScaler::Create(options);
  ASSERT_TRUE(consecutive.ok());
  RunScript(*consecutive, {{true, 16, true},
                           {false, 16, false},
                           {true, 16, true},
                           {false, 16, false},
                           {true, 16, true}});
  EXPECT_EQ(consecutive->scale(), 16);
  EXPECT_EQ(consecutive->state().cur_hysteresis, 1);

  options.consecutive_hysteresis = false;
  auto plain = LossScaler::Create(options);
  ASSERT_TRUE(plain.ok());
  RunScript(*plain, {{true, 16, true},
                     {false, 16, false},
                     {true, 16, true},
                     {false, 8, false},
                     {true, 8, true}});
  EXPECT_EQ(plain->scale(), 4);
}

TEST(LossScalerTest, HysteresisOneHalvesAtOnceAndWindowDoubles) {
  LossScalerOptions options;  // defaults: 2^16, window 1000, hysteresis 2
  options.hysteresis = 1;
  options.loss_scale_window = 2;
  auto scaler = LossScaler::Create(options);
  ASSERT_TRUE(scaler.ok());
  RunScript(*scaler, {{true, 65536, true},
                      {false, 32768, false},
                      {false, 32768, false},  // (2 - 0) % 2 = 0 -> double
                      {false, 65536, false},
                      {false, 65536, false}});
  EXPECT_EQ(scaler->scale(), 131072);
}

TEST(LossScalerTest, OverflowAtTheFloorIsAnErrorByDefault) {
  LossScalerOptions options;
  options.initial_scale_power = 1;  // 2
  options.hysteresis = 1;
  auto scaler = LossScaler::Create(options);
  ASSERT_TRUE(scaler.ok());
  ASSERT_TRUE(scaler->Update(true).ok());  // 2 -> 1
  EXPECT_EQ(scaler->scale(), 1);
  const LossScalerState before = scaler->state();
  auto update = scaler->Update(true);
  EXPECT_EQ(update.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(update.status().message().find("min_loss_scale"),
            std::string::npos);
  EXPECT_EQ(scaler->state(), before);
}

TEST(LossScalerTest, StaticScaleNeverChangesButSkipsOverflows) {
  LossScalerOptions options;
  options.loss_scale = 128;
  auto scaler = LossScaler::Create(options);
  ASSERT_TRUE(scaler.ok());
  EXPECT_FALSE(scaler->dynamic());
  RunScript(*scaler,
            {{true, 128, true}, {true, 128, true}, {false, 128, false}});
}

TEST(LossScalerTest, MessagesNameOldAndNewScale) {
  LossScalerOptions options;
  options.initial_scale_power = 16;
  auto scaler = LossScaler::Create(options);
  ASSERT_TRUE(scaler.ok());
  auto first = scaler->Update(true);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->Message(),
            "OVERFLOW! Skipping step. Attempted loss scale: 65536, but "
            "hysteresis is 2. Reducing hysteresis to 1");
  auto second = scaler->Update(true);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->Message(),
            "OVERFLOW! Skipping step. Attempted loss scale: 65536, reducing "
            "to 32768");
}

TEST(LossScalerTest, StateRoundTripsAndIsValidated) {
  LossScalerOptions options;
  options.initial_scale_power = 8;
  options.loss_scale_window = 3;
  auto original = LossScaler::Create(options);
  ASSERT_TRUE(original.ok());
  const std::vector<bool> pattern = {false, true,  false, true,  true,
                                     false, false, false, false, true};
  for (bool overflow : pattern) ASSERT_TRUE(original->Update(overflow).ok());

  auto resumed = LossScaler::Create(options);
  ASSERT_TRUE(resumed.ok());
  ASSERT_TRUE(resumed->Restore(original->state()).ok());
  for (bool overflow : {false, false, false, true, false, false, false}) {
    auto a = original->Update(overflow);
    auto b = resumed->Update(overflow);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->new_scale, b->new_scale);
  }
  EXPECT_EQ(original->state(), resumed->state());

  LossScalerState bad = original->state();
  bad.cur_hysteresis = 5;
  EXPECT_EQ(resumed->Restore(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = original->state();
  bad.cur_scale = 0;
  EXPECT_FALSE(resumed->Restore(bad).ok());
}

TEST(LossScalerTest, RejectsBadOptions) {
  LossScalerOptions options;
  options.loss_scale_window = 0;
  EXPECT_EQ(LossScaler::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = LossScalerOptions();
  options.hysteresis = 0;
  EXPECT_FALSE(LossScaler::Create(options).ok());
  options = LossScalerOptions();
  options.min_loss_scale = 0;
  EXPECT_FALSE(LossScaler::Create(options).ok());
  options = LossScalerOptions();
  options.loss_scale = -1;
  EXPECT_FALSE(LossScaler::Create(options).ok());
}

}  // namespace
}  // namespace zero
}  // namespace ze
