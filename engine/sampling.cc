#include "engine/sampling.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <vector>

#include "nn/init.h"

namespace ze {
namespace engine {

double UniformSample(uint64_t seed, uint64_t sequence, uint64_t step) {
  const std::array<uint32_t, 4> bits = nn::Philox4x32(
      {static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32),
       static_cast<uint32_t>(sequence), static_cast<uint32_t>(sequence >> 32)},
      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  // 53 random bits: every double in [0, 1) on a 2^-53 grid, never 1.
  const uint64_t mantissa =
      (static_cast<uint64_t>(bits[0]) << 21) | (bits[1] >> 11);
  return static_cast<double>(mantissa) * (1.0 / 9007199254740992.0);
}

int32_t ChooseToken(const float* logits, int64_t vocab,
                    const SamplingParams& params, uint64_t sequence,
                    uint64_t step) {
  if (params.temperature == 0.0f) {
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) -
                                logits);
  }
  // Candidates in the order the draw walks them: by logit (then id) for
  // top-k, by id otherwise.
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  if (params.top_k > 0 && params.top_k < vocab) {
    std::partial_sort(ids.begin(), ids.begin() + params.top_k, ids.end(),
                      [logits](int32_t a, int32_t b) {
                        return logits[a] > logits[b] ||
                               (logits[a] == logits[b] && a < b);
                      });
    ids.resize(params.top_k);
  }
  double max_logit = -INFINITY;
  for (int32_t id : ids) max_logit = std::max(max_logit, double{logits[id]});
  std::vector<double> weights(ids.size());
  double total = 0.0;
  for (size_t i = 0; i < ids.size(); ++i) {
    weights[i] = std::exp((logits[ids[i]] - max_logit) / params.temperature);
    total += weights[i];
  }
  const double target = UniformSample(params.seed, sequence, step) * total;
  double cumulative = 0.0;
  int32_t last_possible = ids.front();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (weights[i] <= 0.0) continue;
    cumulative += weights[i];
    last_possible = ids[i];
    if (target < cumulative) return ids[i];
  }
  // Rounding left the target at the very top: the last token that can win.
  return last_possible;
}

}  // namespace engine
}  // namespace ze
