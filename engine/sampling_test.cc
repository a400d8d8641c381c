// Generate's token choice: greedy limits (temperature 0 and near 0, top_k
// 1), reproducibility by seed, top-k's support and the sampled frequencies
// against the softmax.
#include "engine/sampling.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace ze {
namespace engine {
namespace {

std::vector<float> Logits(uint64_t seed, int64_t vocab) {
  std::vector<float> logits(vocab);
  for (int64_t i = 0; i < vocab; ++i) {
    logits[i] = static_cast<float>(4.0 * UniformSample(seed, 99, i) - 2.0);
  }
  return logits;
}

int32_t Greedy(const std::vector<float>& logits) {
  return ChooseToken(logits.data(), logits.size(), SamplingParams(), 0, 0);
}

TEST(SamplingTest, GreedyIsTheFirstMaximum) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(Greedy(logits), 1);
  SamplingParams top1;
  top1.temperature = 1.0f;
  top1.top_k = 1;
  for (uint64_t step = 0; step < 50; ++step) {
    EXPECT_EQ(ChooseToken(logits.data(), 4, top1, 0, step), 1);
  }
}

TEST(SamplingTest, TopOneAndTinyTemperatureAreGreedy) {
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const std::vector<float> logits = Logits(seed, 50);
    SamplingParams top1{0.7f, 1, seed};
    SamplingParams cold{1e-6f, 0, seed};
    EXPECT_EQ(ChooseToken(logits.data(), 50, top1, 3, seed), Greedy(logits));
    EXPECT_EQ(ChooseToken(logits.data(), 50, cold, 3, seed), Greedy(logits));
  }
}

TEST(SamplingTest, SameSeedSameTokensOtherSeedsDiffer) {
  const std::vector<float> logits(64, 0.0f);  // uniform: every draw counts
  std::vector<int32_t> a, b, c;
  for (uint64_t step = 0; step < 40; ++step) {
    a.push_back(ChooseToken(logits.data(), 64, {1.0f, 0, 7}, 2, step));
    b.push_back(ChooseToken(logits.data(), 64, {1.0f, 0, 7}, 2, step));
    c.push_back(ChooseToken(logits.data(), 64, {1.0f, 0, 8}, 2, step));
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // Another sequence of the same seed draws differently too.
  std::vector<int32_t> other;
  for (uint64_t step = 0; step < 40; ++step) {
    other.push_back(ChooseToken(logits.data(), 64, {1.0f, 0, 7}, 3, step));
  }
  EXPECT_NE(a, other);
}

TEST(SamplingTest, FrequenciesFollowTheSoftmaxWithinTopK) {
  // p proportional to 1, 2, 3, 4 at temperature 1; 0.5 sharpens to 1:4:9:16.
  const std::vector<float> logits = {std::log(1.0f), std::log(2.0f),
                                     std::log(3.0f), std::log(4.0f)};
  const int draws = 40000;
  for (float temperature : {1.0f, 0.5f}) {
    std::vector<int> counts(4, 0);
    for (int step = 0; step < draws; ++step) {
      ++counts[ChooseToken(logits.data(), 4, {temperature, 0, 11}, 0, step)];
    }
    double norm = 0;
    for (int i = 1; i <= 4; ++i) norm += std::pow(i, 1.0 / temperature);
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(counts[i] / double(draws),
                  std::pow(i + 1, 1.0 / temperature) / norm, 0.01)
          << "token " << i << " temperature " << temperature;
    }
  }
  // top_k = 2: only tokens 3 and 2, in proportion 4 : 3.
  std::vector<int> counts(4, 0);
  for (int step = 0; step < draws; ++step) {
    ++counts[ChooseToken(logits.data(), 4, {1.0f, 2, 5}, 1, step)];
  }
  EXPECT_EQ(counts[0] + counts[1], 0);
  EXPECT_NEAR(counts[3] / double(draws), 4.0 / 7.0, 0.01);
}

TEST(SamplingTest, UniformSampleIsInTheUnitInterval) {
  double sum = 0;
  for (uint64_t i = 0; i < 10000; ++i) {
    const double u = UniformSample(1, i / 100, i % 100);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.01);
}

}  // namespace
}  // namespace engine
}  // namespace ze
