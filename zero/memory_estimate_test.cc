#include "zero/memory_estimate.h"

#include <vector>

#include "gtest/gtest.h"
#include "zero/flat_layout.h"

namespace ze {
namespace zero {
namespace {

constexpr int64_t kAdamState = 8;

// The ZeRO paper's example: 7.5B parameters, 64 ranks, mixed-precision Adam:
// 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
TEST(MemoryEstimateTest, PaperExample) {
  const int64_t psi = 7'500'000'000;
  const int n = 64;
  const int64_t per_rank = psi / n;  // divides exactly
  auto stage0 =
      PaperModelStateBytes(psi, n, 0, TrainingPrecision::kBf16, kAdamState);
  auto stage1 =
      PaperModelStateBytes(psi, n, 1, TrainingPrecision::kBf16, kAdamState);
  auto stage2 =
      PaperModelStateBytes(psi, n, 2, TrainingPrecision::kBf16, kAdamState);
  auto stage3 =
      PaperModelStateBytes(psi, n, 3, TrainingPrecision::kBf16, kAdamState);
  ASSERT_TRUE(stage0.ok() && stage1.ok() && stage2.ok() && stage3.ok());
  EXPECT_EQ(stage0->total(), 16 * psi);                 // 120 GB
  EXPECT_EQ(stage1->total(), 4 * psi + 12 * per_rank);  // 31.4 GB
  EXPECT_EQ(stage1->total(), 31'406'250'000);
  EXPECT_EQ(stage2->total(), 2 * psi + 14 * per_rank);  // 16.6 GB
  EXPECT_EQ(stage2->total(), 16'640'625'000);
  EXPECT_EQ(stage3->total(), 16 * per_rank);  // 1.9 GB
  // The breakdown: stage 2 keeps full 16-bit params only.
  EXPECT_EQ(stage2->params, 2 * psi);
  EXPECT_EQ(stage2->grads, 2 * per_rank);
  EXPECT_EQ(stage2->optimizer_states, 12 * per_rank);
}

TEST(MemoryEstimateTest, F32AndSgdVariants) {
  const int64_t psi = 1000;
  const int n = 4;
  auto f32_stage1 =
      PaperModelStateBytes(psi, n, 1, TrainingPrecision::kFp32, kAdamState);
  ASSERT_TRUE(f32_stage1.ok());
  EXPECT_EQ(f32_stage1->params, 4 * psi);
  EXPECT_EQ(f32_stage1->grads, 4 * psi);
  EXPECT_EQ(f32_stage1->optimizer_states, 8 * psi / n);
  auto f32_stage0 =
      PaperModelStateBytes(psi, n, 0, TrainingPrecision::kFp32, kAdamState);
  EXPECT_EQ(f32_stage0->total(), 16 * psi);
  auto f32_stage2 =
      PaperModelStateBytes(psi, n, 2, TrainingPrecision::kFp32, kAdamState);
  EXPECT_EQ(f32_stage2->total(), 4 * psi + 12 * psi / n);
  // SGD with momentum, mixed precision, stage 3: (2 + 2 + 4 + 4) psi / N.
  auto sgd = PaperModelStateBytes(psi, n, 3, TrainingPrecision::kBf16, 4);
  EXPECT_EQ(sgd->total(), 12 * psi / n);
  EXPECT_FALSE(
      PaperModelStateBytes(psi, n, 4, TrainingPrecision::kBf16, 8).ok());
  EXPECT_FALSE(
      PaperModelStateBytes(psi, 0, 1, TrainingPrecision::kBf16, 8).ok());
}

// With the real layout the estimate uses the padded sizes, and for a
// realistic model the padding stays far inside the 5% the engine allows.
TEST(MemoryEstimateTest, LayoutEstimateAddsOnlyPadding) {
  std::vector<ParamSpec> params;
  for (int layer = 0; layer < 12; ++layer) {
    const std::string prefix = "h." + std::to_string(layer) + ".";
    params.push_back({prefix + "ln_1.w", 768});
    params.push_back({prefix + "ln_1.b", 768});
    params.push_back({prefix + "attn.w", 768 * 2304});
    params.push_back({prefix + "attn.b", 2304});
    params.push_back({prefix + "proj.w", 768 * 768});
    params.push_back({prefix + "proj.b", 53});  // odd on purpose
    params.push_back({prefix + "fc.w", 768 * 3072});
    params.push_back({prefix + "fc.b", 3072});
  }
  for (int world_size : {1, 3, 4}) {
    LayoutOptions options;
    options.world_size = world_size;
    options.bucket_max_elements = 5'000'000;
    auto layout = PartitionedLayout::Build(params, options);
    ASSERT_TRUE(layout.ok());
    for (int stage = 0; stage <= 3; ++stage) {
      auto paper =
          PaperModelStateBytes(layout->total_param_elements(), world_size,
                               stage, TrainingPrecision::kBf16, kAdamState);
      auto real = EstimateModelStateBytes(*layout, stage,
                                          TrainingPrecision::kBf16, kAdamState);
      ASSERT_TRUE(paper.ok() && real.ok());
      EXPECT_GE(real->total(), paper->total());
      EXPECT_LT(real->total(), paper->total() * 1.001)
          << "world " << world_size << " stage " << stage;
      if (stage == 2) {
        EXPECT_EQ(real->params, 2 * layout->padded_total_elements());
        EXPECT_EQ(real->grads, 2 * layout->partition_elements());
        EXPECT_EQ(real->optimizer_states, 12 * layout->partition_elements());
      }
    }
  }
}

}  // namespace
}  // namespace zero
}  // namespace ze
