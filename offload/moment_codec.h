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
// Each value is rounded to a coarse grid of floats, the floats whose low
// `shift` bits are 0: v to 3 significand bits (8 grid points an octave,
// neighbours 6-12% apart), |m| to 2 (4 an octave, 12-25% apart). On that
// grid a float's bits >> shift number the points in order, so a value is
// stored as how many points it lies below the block's largest rounded
// value, the block's `top` (its one f32 per moment):
//   v: code c in [1, 255] is the point 255 - c below top; 0 is 0.
//   m: code q in [-127, 127]: the sign, and |q| in [1, 127] the point
//      127 - |q| below m's top; 0 is 0.
// So v spans 254 points, 31.75 octaves (sqrt(v), the update's denominator,
// down to 1.7e-5 of the block's largest), |m| 126 points, 31.5 octaves,
// with the same relative precision at every magnitude. A value under the
// lowest point (`lowest`) becomes 0 or `lowest`.
// Why a grid of floats (bench/convergence/README.md): the earlier codes
// were linear in sqrt|m| and v^(1/4) of the block's largest: fine at the
// top, a few levels wide for a block's quiet elements, whose steps came
// out 38% larger than f32's on bench/moment_bias's stream (their |m| kept
// the noise of codes 1-4, their sqrt(v) 13% high), 12.6% overall, and the
// 350M runs ended 0.018 lower than f32's. On the grid: 1.3% and 2%.
// The update rounds stochastically: a value between two points rounds up
// with probability (value - lower) / (upper - lower), which within the
// grid is the dropped bits / 2^shift (points are evenly spaced within an
// octave and its end), so the decoded value is unbiased in m and in v
// (not only in sqrt(v): an excess in v compounds through Adam's recursion)
// and Adam's decay happens on average however quiet the element. Under
// `lowest`, up to `lowest` with probability value / lowest. Noise as
// bf16's (RoundingNoise of the step's key and the element's index:
// reproducible, no state), one 32-bit hash per element for both moments:
// its top 16 bits round v (VCodeNoise), its low 16 bits m (MCodeNoise).
// Conversions (checkpoints, ReadState / WriteState) round to nearest.
// top is the largest *rounded* index, so a block's largest element decodes
// to top exactly and a state decoded to f32 and encoded again (to nearest)
// gives back the same codes and tops, bit for bit (moment_codec_test).
// Where v's code is 0 the update stores m as 0 too: read back, its step
// m / (sqrt(v) + eps) would otherwise be m / eps, a jump no f32 state
// makes (an embedding row absent from a batch has g = 0 but m != 0); the
// element restarts from zero moments instead.
// Everything is integer arithmetic on the bits, comparisons, and products
// that are exact (a 16-bit integer times a grid point of at most 3
// significand bits; powers of two), so every path gives the same codes.
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

// The SIMD max semantics (x86 maxps with the constant second): a NaN `x`
// gives `bound`.
ZE_MOMENT_HD float MomentMax(float x, float bound) {
  return x > bound ? x : bound;
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

// One moment's grid: the low `shift` bits of the float dropped, codes
// 1..levels above 0.
struct MomentGrid {
  int shift;
  uint32_t levels;
};
constexpr MomentGrid kVGrid = {20, 255};
constexpr MomentGrid kMGrid = {21, 127};

ZE_MOMENT_HD float AbsMoment(float value) {
  return MomentBitsFloat(MomentFloatBits(value) & 0x7fffffffu);
}

// The grid index of `magnitude` (>= 0), rounded to nearest (ties up) or
// up with probability dropped / 2^shift from `noise16` (uniform in
// [0, 2^16)). 0 for 0.
ZE_MOMENT_HD uint32_t GridIndexNearest(float magnitude, MomentGrid grid) {
  return (MomentFloatBits(magnitude) + (1u << (grid.shift - 1))) >> grid.shift;
}
ZE_MOMENT_HD uint32_t GridIndexStochastic(float magnitude, MomentGrid grid,
                                          uint32_t noise16) {
  return (MomentFloatBits(magnitude) + (noise16 << (grid.shift - 16))) >>
         grid.shift;
}
ZE_MOMENT_HD float GridPoint(uint32_t index, MomentGrid grid) {
  return MomentBitsFloat(index << grid.shift);
}

// A block's top from the largest rounded index, its index back, and its
// lowest point (0 when the grid below top holds fewer than `levels`
// points: every value then has a code).
ZE_MOMENT_HD float GridTop(uint32_t largest_index, MomentGrid grid) {
  return GridPoint(largest_index, grid);
}
ZE_MOMENT_HD uint32_t GridTopIndex(float top, MomentGrid grid) {
  return MomentFloatBits(top) >> grid.shift;
}
ZE_MOMENT_HD float GridLowest(float top, MomentGrid grid) {
  const uint32_t top_index = GridTopIndex(top, grid);
  return top_index >= grid.levels
             ? GridPoint(top_index - (grid.levels - 1), grid)
             : 0.0f;
}

// The code of a value at grid index `index` (>= lowest's; rounded the same
// way as the block's top): levels at the top, one less a point below; 0
// for index 0.
ZE_MOMENT_HD uint32_t GridCodeOfIndex(uint32_t index, float top,
                                      MomentGrid grid) {
  return index == 0 ? 0u : grid.levels - (GridTopIndex(top, grid) - index);
}
// The code of `magnitude` whose grid index is `index`, given the block's
// top and lowest point; under lowest: 1 with probability magnitude /
// lowest (stochastic: noise16 / 2^16 below it, compared exactly as
// noise16 * lowest < magnitude * 2^16) or when at least lowest / 2
// (nearest).
ZE_MOMENT_HD uint32_t GridCode(float magnitude, uint32_t index, float top,
                               float lowest, MomentGrid grid) {
  if (magnitude < lowest) return magnitude >= lowest * 0.5f ? 1u : 0u;
  return GridCodeOfIndex(index, top, grid);
}
ZE_MOMENT_HD uint32_t GridCodeStochastic(float magnitude, uint32_t index,
                                         float top, float lowest,
                                         MomentGrid grid, uint32_t noise16) {
  if (magnitude < lowest) {
    return static_cast<float>(noise16) * lowest < magnitude * 0x1p16f ? 1u : 0u;
  }
  return GridCodeOfIndex(index, top, grid);
}
// The magnitude of code `code` (> 0) under `top`.
ZE_MOMENT_HD float GridValue(uint32_t code, float top, MomentGrid grid) {
  return GridPoint(GridTopIndex(top, grid) - (grid.levels - code), grid);
}

ZE_MOMENT_HD float DecodeV(uint8_t code, float top) {
  return code == 0 ? 0.0f : GridValue(code, top, kVGrid);
}
ZE_MOMENT_HD float DecodeM(int8_t code, float top) {
  if (code == 0) return 0.0f;
  const float magnitude =
      GridValue(static_cast<uint32_t>(code < 0 ? -code : code), top, kMGrid);
  return code < 0 ? -magnitude : magnitude;
}
ZE_MOMENT_HD int8_t SignedCode(uint32_t magnitude_code, float value) {
  const int code = static_cast<int>(magnitude_code);
  return static_cast<int8_t>(value < 0.0f ? -code : code);
}

// The update's codes round stochastically (file comment), from one 32-bit
// hash per element: v from its top half, m from its low half.
ZE_MOMENT_HD uint32_t VCodeNoise(uint32_t noise) { return noise >> 16; }
ZE_MOMENT_HD uint32_t MCodeNoise(uint32_t noise) { return noise & 0xffffu; }

// Encodes `n` (<= kMomentBlock) f32 values of one block of v, or of m, to
// nearest (conversions).
ZE_MOMENT_HD void EncodeVBlock(const float* v, int64_t n, uint8_t* codes,
                               float* top) {
  uint32_t largest = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t index = GridIndexNearest(v[i], kVGrid);
    largest = index > largest ? index : largest;
  }
  *top = GridTop(largest, kVGrid);
  const float lowest = GridLowest(*top, kVGrid);
  for (int64_t i = 0; i < n; ++i) {
    codes[i] = static_cast<uint8_t>(
        GridCode(v[i], GridIndexNearest(v[i], kVGrid), *top, lowest, kVGrid));
  }
}
ZE_MOMENT_HD void EncodeMBlock(const float* m, int64_t n, int8_t* codes,
                               float* top) {
  uint32_t largest = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t index = GridIndexNearest(AbsMoment(m[i]), kMGrid);
    largest = index > largest ? index : largest;
  }
  *top = GridTop(largest, kMGrid);
  const float lowest = GridLowest(*top, kMGrid);
  for (int64_t i = 0; i < n; ++i) {
    const float magnitude = AbsMoment(m[i]);
    codes[i] =
        SignedCode(GridCode(magnitude, GridIndexNearest(magnitude, kMGrid),
                            *top, lowest, kMGrid),
                   m[i]);
  }
}

// A block's new moments, v first, then m zeroed where v's code is 0 (in
// `m`, which the caller gives up), then m: to nearest (EncodeBlock8), or
// with the update's stochastic codes (EncodeBlock8Stochastic: element i's
// noise is RoundingNoise(key, first + i), `first` the block's first
// element in the optimizer's state).
ZE_MOMENT_HD void EncodeBlock8(float* m, const float* v, int64_t n,
                               int8_t* m_codes, uint8_t* v_codes, float* m_top,
                               float* v_top) {
  EncodeVBlock(v, n, v_codes, v_top);
  for (int64_t i = 0; i < n; ++i) {
    if (v_codes[i] == 0) m[i] = 0.0f;
  }
  EncodeMBlock(m, n, m_codes, m_top);
}
ZE_MOMENT_HD void EncodeBlock8Stochastic(float* m, const float* v, int64_t n,
                                         int8_t* m_codes, uint8_t* v_codes,
                                         float* m_top, float* v_top,
                                         uint32_t key, int64_t first) {
  uint32_t noise[kMomentBlock];
  uint32_t largest = 0;
  for (int64_t i = 0; i < n; ++i) {
    noise[i] = RoundingNoise(key, static_cast<uint32_t>(first + i));
    const uint32_t index =
        GridIndexStochastic(v[i], kVGrid, VCodeNoise(noise[i]));
    largest = index > largest ? index : largest;
  }
  *v_top = GridTop(largest, kVGrid);
  const float v_lowest = GridLowest(*v_top, kVGrid);
  largest = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t v_noise = VCodeNoise(noise[i]);
    v_codes[i] = static_cast<uint8_t>(
        GridCodeStochastic(v[i], GridIndexStochastic(v[i], kVGrid, v_noise),
                           *v_top, v_lowest, kVGrid, v_noise));
    if (v_codes[i] == 0) m[i] = 0.0f;
    const uint32_t index =
        GridIndexStochastic(AbsMoment(m[i]), kMGrid, MCodeNoise(noise[i]));
    largest = index > largest ? index : largest;
  }
  *m_top = GridTop(largest, kMGrid);
  const float m_lowest = GridLowest(*m_top, kMGrid);
  for (int64_t i = 0; i < n; ++i) {
    const float magnitude = AbsMoment(m[i]);
    const uint32_t m_noise = MCodeNoise(noise[i]);
    m_codes[i] = SignedCode(
        GridCodeStochastic(magnitude,
                           GridIndexStochastic(magnitude, kMGrid, m_noise),
                           *m_top, m_lowest, kMGrid, m_noise),
        m[i]);
  }
}

}  // namespace offload
}  // namespace ze

#endif  // ZE_OFFLOAD_MOMENT_CODEC_H_
