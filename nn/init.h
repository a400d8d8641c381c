// Deterministic parameter initialisation.
//
// Every initial value is a pure function of (seed, full parameter name,
// element index): a counter-based generator (Philox-4x32-10) keyed by the
// seed and a hash of the name, with the element index as the counter. So any
// rank can produce any slice [begin, end) of any parameter without building
// the rest, and the slice is bit-identical to the same range of the whole.
// That is what partitioned construction (ZeRO-3) relies on.
#ifndef ZE_NN_INIT_H_
#define ZE_NN_INIT_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace ze {
namespace nn {

// How a parameter is initialised. Layers declare one per parameter.
struct Initializer {
  enum class Kind { kZeros, kOnes, kNormal };
  Kind kind = Kind::kZeros;
  float std = 0.0f;  // kNormal only: values are normal(0, std)

  static Initializer Zeros() { return {Kind::kZeros, 0.0f}; }
  static Initializer Ones() { return {Kind::kOnes, 0.0f}; }
  static Initializer Normal(float std) { return {Kind::kNormal, std}; }
  // GPT-2's init for projections that feed the residual stream: the variance
  // added per block is kept constant as depth grows.
  static Initializer ScaledResidual(float std, int num_layers);

  // "zeros", "ones", "normal(std=0.02)".
  std::string ToString() const;
};

// Philox-4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as
// easy as 1, 2, 3", SC'11): four 32-bit outputs from a 128-bit counter and a
// 64-bit key.
std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter,
                                   std::array<uint32_t, 2> key);

// The generator key of a parameter: mixes `seed` with a 64-bit FNV-1a hash
// of `name` so parameters get independent streams.
std::array<uint32_t, 2> InitKey(uint64_t seed, absl::string_view name);

// Writes the initial values of elements [begin, begin + count) of the
// parameter called `name` to dst[0 .. count) as f32. For kNormal, element i
// takes the cosine (even i) or sine (odd i) Box-Muller output of counter
// i / 2, so every element depends only on (seed, name, i).
void GenerateInitialValues(const Initializer &init, uint64_t seed,
                           absl::string_view name, int64_t begin, int64_t count,
                           float *dst);

}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_INIT_H_
