#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace ze {
namespace {

// Reference rounding of an f32 value to a format with `mantissa_bits`
// explicit mantissa bits, by exact arithmetic in double: the two neighbours
// are computed and the nearer (ties to even) chosen. Used to check every
// 16-bit pattern's neighbourhood, independently of the bit tricks.
bool IsNan(float value) { return std::isnan(value); }

TEST(DTypeTest, Bf16RoundTripsEveryPattern) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const float value = Bf16BitsToFloat(static_cast<uint16_t>(bits));
    const uint16_t back = FloatToBf16Bits(value);
    if (IsNan(value)) {
      EXPECT_TRUE(IsNan(Bf16BitsToFloat(back))) << bits;
      EXPECT_EQ(back & 0x8000, bits & 0x8000) << "NaN sign kept " << bits;
    } else {
      EXPECT_EQ(back, bits) << "pattern " << bits;
    }
  }
}

// The 16+16 master's code over every one of the 2^32 f32 patterns: Join
// inverts Split (so, the sets being equal in size, every (hi, lo) pair is
// some f32's code), and hi is FloatToBf16Bits except at the exact ties whose
// high half is even (one step up in magnitude) and for NaN.
TEST(DTypeTest, Bf16SplitIsExactForEveryF32Pattern) {
  uint64_t not_inverted = 0, unexpected_hi = 0, ties_moved = 0;
  uint32_t first_bad = 0;
  uint32_t bits = 0;
  do {
    const float value = BitsToFloat(bits);
    const Bf16Split split = SplitForBf16(value);
    if (FloatBits(JoinBf16Split(split.hi, split.lo)) != bits) {
      if (not_inverted++ == 0) first_bad = bits;
    }
    if (!IsNan(value)) {
      const bool even_tie =
          (bits & 0xffffu) == 0x8000u && (bits & 0x10000u) == 0;
      const uint16_t nearest = FloatToBf16Bits(value);
      const uint16_t expected = even_tie ? nearest + 1 : nearest;
      if (even_tie) ++ties_moved;
      if (split.hi != expected) {
        if (unexpected_hi++ == 0 && not_inverted == 0) first_bad = bits;
      }
    }
  } while (++bits != 0);
  EXPECT_EQ(not_inverted, 0u) << "first pattern " << first_bad;
  EXPECT_EQ(unexpected_hi, 0u) << "first pattern " << first_bad;
  // Half of the 2^16 high halves are even: 2^15 ties move, less the even
  // high halves in [0x7f80, 0x7fff] and [0xff80, 0xffff], whose ties are NaN
  // (64 of each sign).
  EXPECT_EQ(ties_moved, (1u << 15) - 128u);
}

TEST(DTypeTest, Bf16SplitEdgeCases) {
  struct Case {
    uint32_t bits;
    uint16_t hi;
  };
  const Case cases[] = {
      {0x00000000u, 0x0000},  // +0
      {0x80000000u, 0x8000},  // -0
      {0x3f808000u, 0x3f81},  // tie, even high half: away from zero (RNE 3f80)
      {0x3f818000u, 0x3f82},  // tie, odd high half: as RNE
      {0xbf808000u, 0xbf81},  // negative tie: away from zero too
      {0x3f807fffu, 0x3f80},  // below half: down
      {0x3fffffffu, 0x4000},  // carry across the exponent boundary
      {0x7f7f8000u, 0x7f80},  // half a step above the largest bf16: inf
      {0x7f7f7fffu, 0x7f7f},  // just below: the largest bf16
      {0x7f800000u, 0x7f80},  // +inf
      {0xff800000u, 0xff80},  // -inf
      {0x00008000u, 0x0001},  // smallest f32 subnormals round as RNE's up
      {0x007fffffu,
       0x0080},  // largest subnormal carries to the smallest normal
      {0x00000001u, 0x0000},  // tiny subnormal: down to zero
  };
  for (const Case& c : cases) {
    const Bf16Split split = SplitForBf16(BitsToFloat(c.bits));
    EXPECT_EQ(split.hi, c.hi) << std::hex << c.bits;
    EXPECT_EQ(split.lo, c.bits & 0xffffu) << std::hex << c.bits;
    EXPECT_EQ(FloatBits(JoinBf16Split(split.hi, split.lo)), c.bits)
        << std::hex << c.bits;
  }
  // A NaN whose carry leaves the NaN range keeps its exact code even though
  // hi reads as a zero (the documented exception).
  const Bf16Split nan = SplitForBf16(BitsToFloat(0x7fffffffu));
  EXPECT_EQ(nan.hi, 0x8000);
  EXPECT_EQ(FloatBits(JoinBf16Split(nan.hi, nan.lo)), 0x7fffffffu);
}

TEST(DTypeTest, F16RoundTripsEveryPattern) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const float value = F16BitsToFloat(static_cast<uint16_t>(bits));
    const uint16_t back = FloatToF16Bits(value);
    if (IsNan(value)) {
      EXPECT_TRUE(IsNan(F16BitsToFloat(back))) << bits;
      EXPECT_EQ(back & 0x8000, bits & 0x8000) << "NaN sign kept " << bits;
    } else {
      EXPECT_EQ(back, bits) << "pattern " << bits;
    }
  }
}

TEST(DTypeTest, F16DecodesKnownValues) {
  EXPECT_EQ(F16BitsToFloat(0x3c00), 1.0f);
  EXPECT_EQ(F16BitsToFloat(0xc000), -2.0f);
  EXPECT_EQ(F16BitsToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(F16BitsToFloat(0x0001),
            std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(F16BitsToFloat(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_TRUE(std::isinf(F16BitsToFloat(0x7c00)));
  EXPECT_TRUE(std::isinf(F16BitsToFloat(0xfc00)));
  EXPECT_TRUE(std::signbit(F16BitsToFloat(0x8000)));
}

// For every pair of adjacent finite 16-bit values, the midpoint rounds to the
// even one, and points just either side of it round to the nearer one.
template <typename Decode, typename Encode>
void CheckTiesToEven(Decode decode, Encode encode, const char* name) {
  for (uint32_t bits = 0; bits < 0x7fff; ++bits) {
    for (uint32_t sign : {0u, 0x8000u}) {
      const uint16_t low = static_cast<uint16_t>(bits | sign);
      const uint16_t high = static_cast<uint16_t>((bits + 1) | sign);
      const float a = decode(low);
      const float b = decode(high);
      if (!std::isfinite(a) || !std::isfinite(b)) continue;
      const double mid = (static_cast<double>(a) + b) / 2.0;
      const float mid_f = static_cast<float>(mid);
      if (static_cast<double>(mid_f) != mid) continue;  // not representable
      const uint16_t even = (low & 1) == 0 ? low : high;
      ASSERT_EQ(encode(mid_f), even)
          << name << " tie between " << low << " and " << high;
      const float below = std::nextafter(mid_f, a);
      const float above = std::nextafter(mid_f, b);
      if (below != a) ASSERT_EQ(encode(below), low) << name << " below " << low;
      if (above != b)
        ASSERT_EQ(encode(above), high) << name << " above " << low;
    }
  }
}

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  CheckTiesToEven(Bf16BitsToFloat, FloatToBf16Bits, "bf16");
}

TEST(DTypeTest, F16RoundsToNearestEven) {
  CheckTiesToEven(F16BitsToFloat, FloatToF16Bits, "f16");
}

TEST(DTypeTest, OverflowAndUnderflow) {
  EXPECT_EQ(FloatToF16Bits(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToF16Bits(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToF16Bits(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToF16Bits(std::ldexp(1.0f, -25)), 0x0000);  // tie to even 0
  EXPECT_EQ(FloatToF16Bits(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(FloatToF16Bits(-std::ldexp(1.0f, -30)), 0x8000);
  EXPECT_EQ(FloatToBf16Bits(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToBf16Bits(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(Bf16BitsToFloat(
      FloatToBf16Bits(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits only in the low bits must not become inf.
  EXPECT_TRUE(
      std::isnan(Bf16BitsToFloat(FloatToBf16Bits(BitsToFloat(0x7f800001u)))));
  EXPECT_TRUE(
      std::isnan(F16BitsToFloat(FloatToF16Bits(BitsToFloat(0x7f800001u)))));
}

TEST(DTypeTest, ConvertElementsRoundsOnceAndCopiesEqualTypes) {
  // 1 + 2^-9 is not a bf16: it rounds to nearest even (1.0), as
  // FloatToBf16Bits does; f16 holds it exactly.
  const float values[] = {1.0f + 1.0f / 512, -2.5f, 3.0f};
  uint16_t bf16[3];
  ConvertElements(values, DType::kF32, bf16, DType::kBF16, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(bf16[i], FloatToBf16Bits(values[i]));
  EXPECT_EQ(Bf16BitsToFloat(bf16[0]), 1.0f);
  uint16_t f16[3];
  ConvertElements(bf16, DType::kBF16, f16, DType::kF16, 3);
  float back[3];
  ConvertElements(f16, DType::kF16, back, DType::kF32, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(back[i], Bf16BitsToFloat(bf16[i]));
  // Equal dtypes: a byte copy, overlapping ranges allowed (memmove).
  float shifted[4] = {1, 2, 3, 4};
  ConvertElements(shifted, DType::kF32, shifted + 1, DType::kF32, 3);
  EXPECT_EQ(shifted[1], 1);
  EXPECT_EQ(shifted[3], 3);
  ConvertElements(values, DType::kF32, back, DType::kF32, 0);  // no-op
}

TEST(DTypeTest, ParsesNames) {
  EXPECT_EQ(*ParseDType("bf16"), DType::kBF16);
  EXPECT_EQ(*ParseDType("F16"), DType::kF16);
  EXPECT_EQ(*ParseDType("float32"), DType::kF32);
  EXPECT_FALSE(ParseDType("int8").ok());
  EXPECT_EQ(SizeOf(DType::kBF16), 2u);
}

}  // namespace
}  // namespace ze
