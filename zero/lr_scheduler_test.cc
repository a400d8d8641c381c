// The LR schedules against hand-computed values. Declared boilerplate: each
// test sets its schedule's parameters field by field, as a config would.
#include "zero/lr_scheduler.h"

#include <cmath>

#include "gtest/gtest.h"

namespace ze {
namespace zero {
namespace {

constexpr double kTol = 1e-12;

TEST(LrSchedulerTest, WarmupLRLog) {
  // min 0, max 0.01, 100 steps: gamma(i) = log(i + 1) / log(100).
  WarmupLRParams params;
  params.warmup_min_lr = 0.0;
  params.warmup_max_lr = 0.01;
  params.warmup_num_steps = 100;
  auto schedule = MakeWarmupLR(params);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  const LrSchedule& s = **schedule;
  EXPECT_STREQ(s.name(), "WarmupLR");
  EXPECT_NEAR(s.LearningRate(-1), 0.0, kTol);
  EXPECT_NEAR(s.LearningRate(0), 0.0, kTol);     // log 1 = 0
  EXPECT_NEAR(s.LearningRate(9), 0.005, kTol);   // log 10 / log 100 = 1/2
  EXPECT_NEAR(s.LearningRate(99), 0.01, kTol);   // log 100 / log 100
  EXPECT_NEAR(s.LearningRate(100), 0.01, kTol);  // constant after warmup
  EXPECT_NEAR(s.LearningRate(5000), 0.01, kTol);
  EXPECT_FALSE(s.Momentum(3).has_value());
}

TEST(LrSchedulerTest, WarmupLRLinearAndTheMinimumOfTwoWarmupSteps) {
  WarmupLRParams params;
  params.warmup_min_lr = 0.001;
  params.warmup_max_lr = 0.011;
  params.warmup_num_steps = 10;
  params.warmup_type = WarmupType::kLinear;
  auto schedule = MakeWarmupLR(params);
  ASSERT_TRUE(schedule.ok());
  EXPECT_NEAR((*schedule)->LearningRate(-1), 0.001, kTol);
  EXPECT_NEAR((*schedule)->LearningRate(0), 0.001, kTol);
  EXPECT_NEAR((*schedule)->LearningRate(5), 0.006, kTol);  // 0.001 + 0.01/2
  EXPECT_NEAR((*schedule)->LearningRate(10), 0.011, kTol);

  // warmup_num_steps 1 acts as 2 (DeepSpeed's max(2, n)): log 1/log 2 = 0,
  // then log 2 / log 2 = 1 would be i = 1, which is already past warmup.
  params.warmup_num_steps = 1;
  params.warmup_type = WarmupType::kLog;
  auto short_warmup = MakeWarmupLR(params);
  ASSERT_TRUE(short_warmup.ok());
  EXPECT_NEAR((*short_warmup)->LearningRate(0), 0.001, kTol);
  EXPECT_NEAR((*short_warmup)->LearningRate(1), 0.001 + 0.01 * 1.0, kTol);
}

TEST(LrSchedulerTest, WarmupDecayLR) {
  // Linear warmup 0 -> 0.1 over 10, then 0.1 * (110 - i) / 100.
  WarmupDecayLRParams params;
  params.warmup.warmup_min_lr = 0.0;
  params.warmup.warmup_max_lr = 0.1;
  params.warmup.warmup_num_steps = 10;
  params.warmup.warmup_type = WarmupType::kLinear;
  params.total_num_steps = 110;
  auto schedule = MakeWarmupDecayLR(params);
  ASSERT_TRUE(schedule.ok());
  const LrSchedule& s = **schedule;
  EXPECT_STREQ(s.name(), "WarmupDecayLR");
  EXPECT_NEAR(s.LearningRate(5), 0.05, kTol);
  EXPECT_NEAR(s.LearningRate(10), 0.1, kTol);
  EXPECT_NEAR(s.LearningRate(60), 0.05, kTol);
  EXPECT_NEAR(s.LearningRate(100), 0.01, kTol);
  EXPECT_NEAR(s.LearningRate(110), 0.0, kTol);
  EXPECT_NEAR(s.LearningRate(200), 0.0, kTol);  // clamped at 0
}

TEST(LrSchedulerTest, WarmupCosineLR) {
  // base 0.1, linear warmup over 10 from ratio 0.1, cosine to 0.01 at 110.
  WarmupCosineLRParams params;
  params.base_lr = 0.1;
  params.total_num_steps = 110;
  params.warmup_num_steps = 10;
  params.warmup_min_ratio = 0.1;
  params.cos_min_ratio = 0.01;
  params.warmup_type = WarmupType::kLinear;
  auto schedule = MakeWarmupCosineLR(params);
  ASSERT_TRUE(schedule.ok());
  const LrSchedule& s = **schedule;
  EXPECT_NEAR(s.LearningRate(-1), 0.0, kTol);
  EXPECT_NEAR(s.LearningRate(0), 0.01, kTol);   // ratio 0.1
  EXPECT_NEAR(s.LearningRate(5), 0.055, kTol);  // 0.1 + 0.5 * 0.9
  // i = 10: p = 1/100; ratio = 0.01 + 0.99 (1 + cos(0.01 pi)) / 2.
  EXPECT_NEAR(s.LearningRate(10),
              0.1 * (0.01 + 0.99 * (1 + std::cos(0.01 * M_PI)) / 2), kTol);
  EXPECT_NEAR(s.LearningRate(10), 0.09997557474, 1e-11);
  EXPECT_NEAR(s.LearningRate(59), 0.0505, kTol);  // p = 1/2: cos = 0
  EXPECT_NEAR(s.LearningRate(109), 0.001, kTol);  // p = 1: the floor
  EXPECT_NEAR(s.LearningRate(500), 0.001, kTol);  // stays at the floor
}

TEST(LrSchedulerTest, OneCycleTriangleDecayAndMomentum) {
  // 0.001 <-> 0.01 over 10 + 10, then decay 0.5 per 5 steps; momentum
  // 0.9 <-> 0.8, then decay 0.01 per 5 steps.
  OneCycleParams params;
  params.cycle_min_lr = 0.001;
  params.cycle_max_lr = 0.01;
  params.cycle_first_step_size = 10;
  params.decay_step_size = 5;
  params.decay_lr_rate = 0.5;
  params.cycle_min_mom = 0.8;
  params.cycle_max_mom = 0.9;
  params.decay_mom_rate = 0.01;
  auto schedule = MakeOneCycle(params);
  ASSERT_TRUE(schedule.ok());
  const LrSchedule& s = **schedule;
  EXPECT_NEAR(s.LearningRate(-1), 0.001, kTol);
  EXPECT_NEAR(s.Momentum(-1)->beta1, 0.8, kTol);
  EXPECT_NEAR(s.Momentum(-1)->beta2, 0.99, kTol);
  // i = 4: batch 5, x = 0.25, scale 0.5.
  EXPECT_NEAR(s.LearningRate(4), 0.0055, kTol);
  EXPECT_NEAR(s.Momentum(4)->beta1, 0.85, kTol);
  // i = 9: the peak.
  EXPECT_NEAR(s.LearningRate(9), 0.01, kTol);
  EXPECT_NEAR(s.Momentum(9)->beta1, 0.8, kTol);
  // i = 14: x = 0.75, scale (0.75 - 1) / (0.5 - 1) = 0.5.
  EXPECT_NEAR(s.LearningRate(14), 0.0055, kTol);
  // i = 19: batch 20 starts the next cycle, scale 0.
  EXPECT_NEAR(s.LearningRate(19), 0.001, kTol);
  EXPECT_NEAR(s.Momentum(19)->beta1, 0.9, kTol);
  // i = 20: decay interval 1/5: 0.001 / 1.1; momentum 0.9 * 1.002.
  EXPECT_NEAR(s.LearningRate(20), 0.001 / 1.1, kTol);
  EXPECT_NEAR(s.Momentum(20)->beta1, 0.9018, kTol);
  // i = 29: interval 10/5 = 2: 0.001 / 2; momentum 0.9 * 1.02.
  EXPECT_NEAR(s.LearningRate(29), 0.0005, kTol);
  EXPECT_NEAR(s.Momentum(29)->beta1, 0.918, kTol);
}

TEST(LrSchedulerTest, OneCycleStairsAndNoDecay) {
  // Two stairs per half cycle of 10: the scale holds at 0, 0.5, 1.
  OneCycleParams params;
  params.cycle_min_lr = 0.001;
  params.cycle_max_lr = 0.01;
  params.cycle_first_step_size = 10;
  params.cycle_first_stair_count = 2;
  params.cycle_momentum = false;
  auto schedule = MakeOneCycle(params);
  ASSERT_TRUE(schedule.ok());
  const LrSchedule& s = **schedule;
  EXPECT_NEAR(s.LearningRate(3), 0.001, kTol);    // batch 4: 0.8 -> stair 0
  EXPECT_NEAR(s.LearningRate(4), 0.0055, kTol);   // batch 5: 1.0 -> stair 1
  EXPECT_NEAR(s.LearningRate(8), 0.0055, kTol);   // batch 9: 1.8 -> stair 1
  EXPECT_NEAR(s.LearningRate(9), 0.01, kTol);     // batch 10: the peak
  EXPECT_NEAR(s.LearningRate(10), 0.0055, kTol);  // batch 11: (20-11)*2/10
  EXPECT_NEAR(s.LearningRate(25), 0.001, kTol);   // no decay: min lr
  EXPECT_FALSE(s.Momentum(5).has_value());
}

TEST(LrSchedulerTest, PureFunctionsOfTheIteration) {
  WarmupCosineLRParams params;
  params.total_num_steps = 1000;
  auto a = MakeWarmupCosineLR(params);
  auto b = MakeWarmupCosineLR(params);
  ASSERT_TRUE(a.ok() && b.ok());
  // Querying out of order (as a resumed run does) changes nothing.
  const double at_700 = (*a)->LearningRate(700);
  for (int64_t i = 0; i < 700; ++i) (*b)->LearningRate(i);
  EXPECT_EQ((*b)->LearningRate(700), at_700);
}

TEST(LrSchedulerTest, RejectsBadParams) {
  WarmupLRParams warmup;
  warmup.warmup_num_steps = 0;
  auto bad = MakeWarmupLR(warmup);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("warmup_num_steps"), std::string::npos);
  WarmupDecayLRParams decay;
  decay.total_num_steps = 0;
  EXPECT_FALSE(MakeWarmupDecayLR(decay).ok());
  OneCycleParams cycle;
  cycle.cycle_first_step_size = 0;
  EXPECT_FALSE(MakeOneCycle(cycle).ok());
  EXPECT_EQ(*ParseWarmupType("Linear"), WarmupType::kLinear);
  EXPECT_FALSE(ParseWarmupType("cosine").ok());
}

}  // namespace
}  // namespace zero
}  // namespace ze
