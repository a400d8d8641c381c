// The encodings of Adam's compressed moments (MomentFormat, in
// step_coefficients.h), element by element: what the CPU kernels (scalar
// and SIMD, offload/cpu_optimizer_kernels.cc), the CUDA kernel
// (zero/optimizer_cuda.cu) and the checkpoint conversions evaluate. Plain
// C++ with no dependencies, compiled by nvcc too (host and device), so the
// two sides share one definition. None of these functions contains a
// multiply followed by an add, so no compiler may contract one into an fma:
// every value is the same on every path, bit for bit.
//
// bf16 moments: m and v rounded to bf16, to nearest even (NearestBf16) or
// stochastically (StochasticBf16: add 16 bits of noise below the kept bits
// and truncate; unbiased, E[rounded] = value). The noise of element n of a
// step is RoundingNoise(RoundingKey(seed, step, moment), n mod 2^32): a
// counter-based hash, so ranks and reruns agree and tests are reproducible,
// with no generator state to save in a checkpoint. (Elements 2^32 apart in
// one optimizer share noise within a step; each rounding stays unbiased.)
//
// 8-bit block-wise moments: the state is cut into blocks of kMomentBlock
// elements (from the optimizer's element 0; the last block may be short).
// Per block and moment one f32 step d:
//   m: signed codes q in [-127, 127] of sign(m) sqrt|m|,
//      m = sign(q) (|q| d_m)^2,  d_m >= sqrt(absmax |m|) / 127
//   v: unsigned codes c in [0, 255] of v^(1/4), v = (c * d_v)^4,
//      d_v >= (max v)^(1/4) / 255
// Both are coded through roots (IEEE square roots) because a block's
// gradients spread over decades (an embedding's rare rows beside its
// frequent ones, a layer's quiet and busy units): a linear code of 127
// levels would flatten every m below 1/254 of the block's largest to 0.
// The square root spans 127^2 (16129):1 of |m| and the fourth root 255^4
// (4e9):1 of v, i.e. 65025:1 of the denominator sqrt(v); both codes are
// then linear in sqrt|gradient|. The relative error is at most 1/|q| for
// m and 1/c for sqrt(v) at a code (under 1% at the top of a block).
// Where v's code is 0 the element's m is stored as 0 too (encoded v
// first, and m's absmax taken after): read back, its step
// m / (sqrt(v) + eps) would otherwise be m / eps, a jump no f32 state
// makes (an embedding row absent from a batch has g = 0 but m != 0); the
// element restarts from zero moments instead.
// Steps keep 17 (m) and 16 (v) significant bits (RoundUpSignificand), so
// q * d is exact, and sqrt(RN(x * x)) == x for every float: a state decoded to
// f32 and encoded again (a checkpoint saved as f32 and loaded) gives back the
// same codes and steps, bit for bit (moment_codec_test checks it).
//
// Non-finite moments (a run already diverged) give codes no test pins.
#ifndef ZE_OFFLOAD_MOMENT_CODEC_H_
#define ZE_OFFLOAD_MOMENT_CODEC_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ZE_MOMENT_HD __host__ __device__ __forceinline__
#else
#include <cmath>
#define ZE_MOMENT_HD inline
#endif

namespace ze {
namespace offload {

// Elements per 8-bit block (one f32 step per moment each).
constexpr int64_t kMomentBlock = 256;
// An optimizer over fewer elements keeps f32 moments when 8-bit ones are
// asked for: the steps would cost a large share of its few bytes, and
// small tensors (norm gains, biases) are the most sensitive to them.
constexpr int64_t kMin8BitElements = 4096;
constexpr float kMCodeMax = 127.0f;
constexpr float kVCodeMax = 255.0f;

// The bits of a float as uint32_t and back (memcpy: device code has it
// too, and it compiles to a register move on either side).
template <typename To, typename From>
ZE_MOMENT_HD To MomentBitCast(From value) {
  static_assert(sizeof(To) == sizeof(From), "a bit cast keeps the size");
  To out;
  memcpy(&out, &value, sizeof(out));
  return out;
}
ZE_MOMENT_HD uint32_t MomentFloatBits(float value) {
  return MomentBitCast<uint32_t>(value);
}
ZE_MOMENT_HD float MomentBitsFloat(uint32_t bits) {
  return MomentBitCast<float>(bits);
}

// Round to nearest, ties to even (IEEE rint in the default mode).
ZE_MOMENT_HD float MomentRint(float value) {
#if defined(__CUDA_ARCH__)
  return rintf(value);
#else
  return std::nearbyint(value);
#endif
}

// The SIMD max/min semantics (x86 maxps/minps with the constant second):
// a NaN `x` gives `bound`.
ZE_MOMENT_HD float MomentMax(float x, float bound) {
  return x > bound ? x : bound;
}
ZE_MOMENT_HD float MomentMin(float x, float bound) {
  return x < bound ? x : bound;
}

// f32 to bf16 bits, to nearest even; a NaN stays a (quiet) NaN with its
// sign (core's FloatToBf16Bits).
ZE_MOMENT_HD uint16_t NearestBf16(float value) {
  const uint32_t bits = MomentFloatBits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x40u);
  }
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// f32 to bf16 bits rounded stochastically: the dropped 16 bits plus the
// top 16 bits of `noise` carry into the kept ones with probability
// dropped / 2^16, so the expectation is the value itself. NaN as above.
ZE_MOMENT_HD uint16_t StochasticBf16(float value, uint32_t noise) {
  const uint32_t bits = MomentFloatBits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x40u);
  }
  return static_cast<uint16_t>((bits + (noise >> 16)) >> 16);
}

ZE_MOMENT_HD float Bf16ToFloat(uint16_t bits) {
  return MomentBitsFloat(static_cast<uint32_t>(bits) << 16);
}

// The noise of element `index` under `key`: a 32-bit integer hash (two
// multiply-xorshift rounds) of index ^ key.
ZE_MOMENT_HD uint32_t RoundingNoise(uint32_t key, uint32_t index) {
  uint32_t x = index ^ key;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// The key of one step's rounding of one moment (0: m, 1: v): splitmix64 of
// the seed, the 1-based step and the moment. Host side, once a step.
inline uint32_t RoundingKey(uint64_t seed, int64_t step, int moment) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(step) +
               0xd1b54a32d192ed03ull * static_cast<uint64_t>(moment + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint32_t>((z ^ (z >> 31)) >> 32);
}

// `value` (>= 0, finite) rounded up to the nearest float whose significand
// bits under `drop_mask` are zero.
ZE_MOMENT_HD float RoundUpSignificand(float value, uint32_t drop_mask) {
  const uint32_t bits = MomentFloatBits(value);
  return MomentBitsFloat((bits + drop_mask) & ~drop_mask);
}

// A block's steps from its largest |m| and largest v.
ZE_MOMENT_HD float MStep(float absmax_m) {
  return RoundUpSignificand(sqrtf(absmax_m) / kMCodeMax, 0x7fu);
}
// The same from the block's largest sqrt(v) (sqrt is monotone and
// correctly rounded, so sqrtf(max v) is the largest root): for kernels that
// have the roots at hand from the update's denominator.
ZE_MOMENT_HD float VStepOfRoot(float max_root) {
  return RoundUpSignificand(sqrtf(max_root) / kVCodeMax, 0xffu);
}
ZE_MOMENT_HD float VStep(float max_v) { return VStepOfRoot(sqrtf(max_v)); }
// 1 / step, or 0 for an all-zero block (every code then 0).
ZE_MOMENT_HD float InverseStep(float step) {
  return step > 0.0f ? 1.0f / step : 0.0f;
}

ZE_MOMENT_HD float AbsMoment(float value) {
  return MomentBitsFloat(MomentFloatBits(value) & 0x7fffffffu);
}

ZE_MOMENT_HD int8_t EncodeM(float m, float inverse_step) {
  const float root = MomentRint(MomentMin(
      MomentMax(sqrtf(AbsMoment(m)) * inverse_step, 0.0f), kMCodeMax));
  return static_cast<int8_t>(m < 0.0f ? -root : root);
}
ZE_MOMENT_HD uint8_t EncodeV(float v, float inverse_step) {
  return static_cast<uint8_t>(MomentRint(
      MomentMin(MomentMax(sqrtf(sqrtf(v)) * inverse_step, 0.0f), kVCodeMax)));
}
ZE_MOMENT_HD float DecodeM(int8_t q, float step) {
  const float root = static_cast<float>(q) * step;
  return root * AbsMoment(root);
}
ZE_MOMENT_HD float DecodeV(uint8_t c, float step) {
  const float root = static_cast<float>(c) * step;
  const float square = root * root;
  return square * square;
}
// The update's codes round stochastically (issue 28, bench/moment_bias):
// a code rounded to nearest cannot follow a moment that changes by less
// than half a code a step. Adam's decay is such a change for every
// element low in its block (m shrinks by 1 - sqrt(beta1) of its code a
// step, 5% at beta1 0.9, so below code 10 an m whose gradients average
// out stays where it is; v by 1 - beta2^(1/4), below code 39 at beta2
// 0.95): quiet elements kept |m| and v of their loudest recent steps, and
// took steps up to 1.9x f32's. Rounded up with probability
//   (x^2 - floor(x)^2) / (2 floor(x) + 1)
// (x the exact code), the decoded value is unbiased in code^2, i.e. in m
// for m and in sqrt(v), the update's denominator, for v: E[decoded] is the
// f32 value, and the decay happens on average. (Unbiased in v instead,
// code^4, sqrt(v) of the quietest elements came out 12% low and their
// steps larger; in the code itself, 26% high: bench/convergence/README.md.)
// Noise as bf16's (RoundingNoise of the step's key and the element's
// index: reproducible, no state), one 32-bit hash per element for both
// codes: its top 16 bits round v's code (VCodeNoise), its low 16 bits m's
// (MCodeNoise). (Two hashes and a division per element cost the 8-bit CPU
// Adam 39% of its throughput; 16 bits of noise leave a bias under 2^-16
// of a code.) Conversions (checkpoints, ReadState / WriteState) still
// round to nearest: an exact code stays itself either way.
ZE_MOMENT_HD uint32_t VCodeNoise(uint32_t noise) { return noise >> 16; }
ZE_MOMENT_HD uint32_t MCodeNoise(uint32_t noise) { return noise & 0xffffu; }

// `x` (>= 0, at most the top code) rounded to k = floor(x) or k + 1, up
// with probability (x^2 - k^2) / ((k + 1)^2 - k^2) from `noise16` (in
// [0, 2^16), uniform): up where noise16 (2k + 1) < (x^2 - k^2) 2^16, so
// code^2 is unbiased (to 2^-16 of a code; no division). An x within
// kSureUp of k + 1 always rounds up: the block's largest element (x within
// 2^-16 of the top code, its step being rounded up) keeps the top code, so
// a state decoded to f32 and encoded again (a checkpoint, ReadState /
// WriteState) recomputes the same step and codes; the bias this leaves is
// under 2^-7 of a code. An explicit fma, then products and sums that are
// exact or rounded once (integers below 2^25, a power-of-two scale, k +
// kSureUp), the same operations on every path, so every path gives the
// same code.
constexpr float kSureUp = 1.0f - 0x1p-7f;
ZE_MOMENT_HD float StochasticCode(float x, uint32_t noise16) {
#if defined(__CUDA_ARCH__)
  const float k = floorf(x);
  const float above = fmaf(x, x, -(k * k));  // x^2 - k^2
#else
  const float k = std::floor(x);
  const float above = std::fma(x, x, -(k * k));
#endif
  const float draw = static_cast<float>(noise16) * (k + k + 1.0f);
  return draw < above * 0x1p16f || x >= k + kSureUp ? k + 1.0f : k;
}

ZE_MOMENT_HD int8_t EncodeMStochastic(float m, float inverse_step,
                                      uint32_t noise16) {
  const float root = StochasticCode(
      MomentMin(MomentMax(sqrtf(AbsMoment(m)) * inverse_step, 0.0f), kMCodeMax),
      noise16);
  return static_cast<int8_t>(m < 0.0f ? -root : root);
}
ZE_MOMENT_HD uint8_t EncodeVStochastic(float v, float inverse_step,
                                       uint32_t noise16) {
  return static_cast<uint8_t>(StochasticCode(
      MomentMin(MomentMax(sqrtf(sqrtf(v)) * inverse_step, 0.0f), kVCodeMax),
      noise16));
}

// Encodes `n` (<= kMomentBlock) f32 values of one block of v, or of m.
ZE_MOMENT_HD void EncodeVBlock(const float* v, int64_t n, uint8_t* codes,
                               float* step) {
  float max_v = 0.0f;
  for (int64_t i = 0; i < n; ++i) max_v = MomentMax(v[i], max_v);
  *step = VStep(max_v);
  const float inverse = InverseStep(*step);
  for (int64_t i = 0; i < n; ++i) codes[i] = EncodeV(v[i], inverse);
}
ZE_MOMENT_HD void EncodeMBlock(const float* m, int64_t n, int8_t* codes,
                               float* step) {
  float absmax = 0.0f;
  for (int64_t i = 0; i < n; ++i) absmax = MomentMax(AbsMoment(m[i]), absmax);
  *step = MStep(absmax);
  const float inverse = InverseStep(*step);
  for (int64_t i = 0; i < n; ++i) codes[i] = EncodeM(m[i], inverse);
}

// The update's encoding of one block's new moments: v first, then m
// zeroed where v's code is 0 (in `m`, which the caller gives up), then m.
ZE_MOMENT_HD void EncodeBlock8(float* m, const float* v, int64_t n,
                               int8_t* m_codes, uint8_t* v_codes, float* m_step,
                               float* v_step) {
  EncodeVBlock(v, n, v_codes, v_step);
  for (int64_t i = 0; i < n; ++i) {
    if (v_codes[i] == 0) m[i] = 0.0f;
  }
  EncodeMBlock(m, n, m_codes, m_step);
}

// EncodeBlock8 with the update's stochastic codes: element i's noise is
// RoundingNoise(key, first + i), `first` the block's first element in the
// optimizer's state (v's code from its VCodeNoise, m's from its
// MCodeNoise).
ZE_MOMENT_HD void EncodeBlock8Stochastic(float* m, const float* v, int64_t n,
                                         int8_t* m_codes, uint8_t* v_codes,
                                         float* m_step, float* v_step,
                                         uint32_t key, int64_t first) {
  float max_v = 0.0f;
  for (int64_t i = 0; i < n; ++i) max_v = MomentMax(v[i], max_v);
  *v_step = VStep(max_v);
  const float inverse_v = InverseStep(*v_step);
  float absmax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    v_codes[i] = EncodeVStochastic(
        v[i], inverse_v,
        VCodeNoise(RoundingNoise(key, static_cast<uint32_t>(first + i))));
    if (v_codes[i] == 0) m[i] = 0.0f;
    absmax = MomentMax(AbsMoment(m[i]), absmax);
  }
  *m_step = MStep(absmax);
  const float inverse_m = InverseStep(*m_step);
  for (int64_t i = 0; i < n; ++i) {
    m_codes[i] = EncodeMStochastic(
        m[i], inverse_m,
        MCodeNoise(RoundingNoise(key, static_cast<uint32_t>(first + i))));
  }
}

}  // namespace offload
}  // namespace ze

#endif  // ZE_OFFLOAD_MOMENT_CODEC_H_
