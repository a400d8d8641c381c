#include "nn/init.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace ze {
namespace nn {
namespace {

constexpr uint32_t kPhiloxMultiplier0 = 0xD2511F53u;
constexpr uint32_t kPhiloxMultiplier1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kPhiloxWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

uint64_t Fnv1a64(absl::string_view text) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

// SplitMix64 finaliser: spreads the bits of seed ^ hash so nearby seeds give
// unrelated keys.
uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Maps 32 random bits to a float in (0, 1]: never 0, so log() is finite.
inline float ToUnitOpenClosed(uint32_t bits) {
  return (static_cast<float>(bits >> 8) + 1.0f) * (1.0f / 16777216.0f);
}

}  // namespace

Initializer Initializer::ScaledResidual(float std, int num_layers) {
  return Normal(std / std::sqrt(2.0f * static_cast<float>(num_layers)));
}

std::string Initializer::ToString() const {
  switch (kind) {
    case Kind::kZeros:
      return "zeros";
    case Kind::kOnes:
      return "ones";
    case Kind::kNormal:
      return absl::StrCat("normal(std=", std, ")");
  }
  return "unknown";
}

std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter,
                                   std::array<uint32_t, 2> key) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t product0 =
        static_cast<uint64_t>(kPhiloxMultiplier0) * counter[0];
    const uint64_t product1 =
        static_cast<uint64_t>(kPhiloxMultiplier1) * counter[2];
    const uint32_t hi0 = static_cast<uint32_t>(product0 >> 32);
    const uint32_t lo0 = static_cast<uint32_t>(product0);
    const uint32_t hi1 = static_cast<uint32_t>(product1 >> 32);
    const uint32_t lo1 = static_cast<uint32_t>(product1);
    counter = {hi1 ^ counter[1] ^ key[0], lo1, hi0 ^ counter[3] ^ key[1], lo0};
    key[0] += kPhiloxWeyl0;
    key[1] += kPhiloxWeyl1;
  }
  return counter;
}

std::array<uint32_t, 2> InitKey(uint64_t seed, absl::string_view name) {
  const uint64_t mixed = Mix64(seed ^ Mix64(Fnv1a64(name)));
  return {static_cast<uint32_t>(mixed), static_cast<uint32_t>(mixed >> 32)};
}

void GenerateInitialValues(const Initializer &init, uint64_t seed,
                           absl::string_view name, int64_t begin, int64_t count,
                           float *dst) {
  if (init.kind == Initializer::Kind::kZeros ||
      init.kind == Initializer::Kind::kOnes) {
    const float value = init.kind == Initializer::Kind::kOnes ? 1.0f : 0.0f;
    for (int64_t i = 0; i < count; ++i) dst[i] = value;
    return;
  }
  const std::array<uint32_t, 2> key = InitKey(seed, name);
  const float two_pi = 6.28318530717958647692f;
  int64_t i = 0;
  while (i < count) {
    const int64_t element = begin + i;
    const uint64_t pair = static_cast<uint64_t>(element) / 2;
    const std::array<uint32_t, 4> bits =
        Philox4x32({static_cast<uint32_t>(pair),
                    static_cast<uint32_t>(pair >> 32), 0u, 0u},
                   key);
    // Box-Muller: one pair of uniforms gives two independent normals.
    const float radius = std::sqrt(-2.0f * std::log(ToUnitOpenClosed(bits[0])));
    const float angle = two_pi * ToUnitOpenClosed(bits[1]);
    const float normal_even = radius * std::cos(angle);
    const float normal_odd = radius * std::sin(angle);
    if ((element & 1) == 0) {
      dst[i++] = init.std * normal_even;
      if (i < count) dst[i++] = init.std * normal_odd;
    } else {
      dst[i++] = init.std * normal_odd;
    }
  }
}

}  // namespace nn
}  // namespace ze
