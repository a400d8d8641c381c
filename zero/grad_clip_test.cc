#include "zero/grad_clip.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "zero/flat_layout.h"

namespace ze {
namespace zero {
namespace {

TEST(GradClipTest, HandComputedCoefficients) {
  // Gradients (3, 4): norm 5. Stored times a loss scale of 1024.
  const double sum = (9.0 + 16.0) * 1024.0 * 1024.0;
  auto clipped = ComputeGradClip(sum, 1024.0, 1.0);
  ASSERT_TRUE(clipped.ok());
  EXPECT_TRUE(clipped->finite);
  EXPECT_DOUBLE_EQ(clipped->norm, 5.0);
  EXPECT_DOUBLE_EQ(clipped->clip_coefficient, 1.0 / (5.0 + 1e-6));
  EXPECT_FLOAT_EQ(clipped->grad_scale, static_cast<float>(0.2 / 1024.0));

  auto loose = ComputeGradClip(sum, 1024.0, 10.0);  // below the threshold
  ASSERT_TRUE(loose.ok());
  EXPECT_EQ(loose->clip_coefficient, 1.0);
  EXPECT_EQ(loose->grad_scale, 1.0f / 1024);

  auto off = ComputeGradClip(25.0, 1.0, 0.0);  // gradient_clipping 0
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->clip_coefficient, 1.0);
  EXPECT_EQ(off->grad_scale, 1.0f);
  EXPECT_DOUBLE_EQ(off->norm, 5.0);
}

TEST(GradClipTest, NonFiniteSumIsAnOverflowNotAnError) {
  for (double bad : {std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()}) {
    auto clip = ComputeGradClip(bad, 65536.0, 1.0);
    ASSERT_TRUE(clip.ok());
    EXPECT_FALSE(clip->finite);
    EXPECT_EQ(clip->grad_scale, 0.0f);
  }
  EXPECT_EQ(ComputeGradClip(1.0, 0.0, 1.0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ComputeGradClip(1.0, 1.0, -1.0).ok());
}

// Each rank sums squares over its own partition of the layout; the sum of
// the partials gives the same norm at every world size.
TEST(GradClipTest, NormIsTheSameWhateverTheWorldSize) {
  const std::vector<int64_t> sizes = {53, 1000, 7, 4096, 300};
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> grads;
  double exact = 0.0;
  for (int64_t n : sizes) {
    std::vector<float> g(n);
    for (float& x : g) {
      x = normal(rng);
      exact += double(x) * x;
    }
    grads.push_back(g);
  }
  std::vector<ParamSpec> params;
  for (size_t i = 0; i < sizes.size(); ++i) {
    params.push_back({"p" + std::to_string(i), sizes[i]});
  }
  for (int world_size : {1, 2, 3, 5, 8}) {
    LayoutOptions options;
    options.world_size = world_size;
    options.bucket_max_elements = 1500;
    auto layout = PartitionedLayout::Build(params, options);
    ASSERT_TRUE(layout.ok());
    std::vector<float> partials;
    for (int rank = 0; rank < world_size; ++rank) {
      float partial = 0.0f;  // f32, as the device kernels accumulate
      for (const ParamShard& shard : layout->RankShards(rank)) {
        for (int64_t e = 0; e < shard.count; ++e) {
          const float x = grads[shard.param_index][shard.param_begin + e];
          partial += x * x;
        }
      }
      partials.push_back(partial);
    }
    auto clip = ComputeGradClip(SumPartials(partials), 1.0, 1.0);
    ASSERT_TRUE(clip.ok());
    EXPECT_NEAR(clip->norm, std::sqrt(exact), 1e-5 * std::sqrt(exact))
        << "world size " << world_size;
  }
}

}  // namespace
}  // namespace zero
}  // namespace ze
