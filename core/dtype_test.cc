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
