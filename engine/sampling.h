// Next-token choice for Engine::Generate, on the host, from one position's
// logits (vocabulary sized, so the device is not worth it). Internal to
// engine/.
#ifndef ZE_ENGINE_SAMPLING_H_
#define ZE_ENGINE_SAMPLING_H_

#include <cstdint>

namespace ze {
namespace engine {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy; must be >= 0 (callers check)
  int top_k = 0;             // 0: every token competes; must be >= 0
  uint64_t seed = 0;
};

// A uniform double in [0, 1) that is a pure function of (seed, sequence,
// step): the project's Philox-4x32-10 (nn/init.h) keyed by the seed, with
// (step, sequence) as the counter, 53 of its bits scaled. Reproducible
// across runs, machines and batch compositions.
double UniformSample(uint64_t seed, uint64_t sequence, uint64_t step);

// The next token from logits[0, vocab) (vocab >= 1):
//   temperature 0: the first maximum (greedy);
//   otherwise a draw from softmax(logits / temperature) over the top_k
//   largest logits (all when top_k is 0 or >= vocab; ties go to the lower
//   id, so top_k = 1 is greedy), with UniformSample(seed, sequence, step).
// The softmax is formed in double after subtracting the maximum, so a
// temperature near 0 approaches greedy without overflow.
int32_t ChooseToken(const float* logits, int64_t vocab,
                    const SamplingParams& params, uint64_t sequence,
                    uint64_t step);

}  // namespace engine
}  // namespace ze

#endif  // ZE_ENGINE_SAMPLING_H_
