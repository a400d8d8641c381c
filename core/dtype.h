// Element types and their conversions.
//
// f32 is the compute type on CPU; bf16 and f16 are storage formats there
// (every conversion rounds to nearest, ties to even, like the hardware), and
// compute formats on CUDA (with f32 accumulation).
#ifndef ZE_CORE_DTYPE_H_
#define ZE_CORE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ze {

// kI32 is for integer data (token ids, targets); it is not a float format:
// casts to or from it are not supported by the kernels in core/ops.h.
enum class DType : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2, kI32 = 3 };

// Whether `dtype` holds floating-point numbers (f32, bf16, f16; not i32).
constexpr bool IsFloatingPoint(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}

// Bytes per element: 4 for f32 and i32, 2 for bf16 and f16.
constexpr size_t SizeOf(DType dtype) {
  return (dtype == DType::kF32 || dtype == DType::kI32) ? 4 : 2;
}

// "f32", "bf16", "f16".
const char* DTypeName(DType dtype);
// safetensors spelling: "F32", "BF16", "F16".
const char* DTypeSafetensorsName(DType dtype);
// Parses either spelling (case-insensitive; also "float32", "bfloat16",
// "float16", "fp32", "fp16"); InvalidArgument naming the text otherwise.
absl::StatusOr<DType> ParseDType(absl::string_view text);

inline uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline float BitsToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// f32 -> bf16, round to nearest even. NaN stays NaN (quiet, sign kept);
// overflow rounds to infinity as IEEE requires.
inline uint16_t FloatToBf16Bits(float value) {
  const uint32_t bits = FloatBits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

inline float Bf16BitsToFloat(uint16_t bits) {
  return BitsToFloat(static_cast<uint32_t>(bits) << 16);
}

// The exact 16+16 master (bf16.master_weights_16_plus_16): an f32 master
// weight stored as `hi`, the bf16 weight the forward uses, and a 16-bit
// remainder `lo`, so that f32 = JoinBf16Split(hi, lo) bit for bit.
//
// hi cannot be the round-to-nearest-even bf16 of the value. Proof
// (pigeonhole): (hi, lo) has 2^32 patterns, as many as f32, so a lossless
// code must give every hi exactly 2^16 preimages. Under round-to-nearest-
// even an even hi h (finite) is the rounding of the values with high half h
// and low half in [0, 0x8000] (0x8001 of them: the tie 0x8000 rounds down to
// the even h) and of those with high half h - 1 and low half in [0x8000,
// 0xffff] (0x8000: h - 1 is odd, so its tie rounds up): 0x10001 preimages,
// one too many; an odd hi gets 0xffff. No 16-bit remainder, signed or not,
// can tell the two ties apart.
//
// So hi rounds ties away from zero instead: hi = the top half of
// (bits + 0x8000) mod 2^32, lo = the low half of bits. Every hi then has
// exactly 2^16 preimages, and decoding subtracts the carry: bits = (hi << 16
// | lo) - (lo >= 0x8000 ? 0x10000 : 0) mod 2^32, the inverse for all 2^32
// patterns (core/dtype_test checks every one). hi equals FloatToBf16Bits
// except (a) at an exact tie (lo == 0x8000) whose high half is even, where
// hi is one bf16 step larger in magnitude (round-to-nearest-even keeps the
// even half; the value is exactly halfway, so both are nearest), and (b) for
// NaN, where hi is the carried pattern: a NaN, or ±inf or ±0 for the NaNs
// whose carry leaves the NaN range (the bf16 NaNs are too few to take every
// f32 NaN's 2^16 patterns). Subnormals, zeros, infinities and the overflow
// to infinity (above the largest bf16 by half a step or more) behave as in
// FloatToBf16Bits.
struct Bf16Split {
  uint16_t hi = 0;  // bf16 bits: the value rounded, ties away from zero
  uint16_t lo = 0;  // the value's low 16 bits
};

inline Bf16Split SplitForBf16(float value) {
  const uint32_t bits = FloatBits(value);
  Bf16Split split;
  split.hi = static_cast<uint16_t>((bits + 0x8000u) >> 16);
  split.lo = static_cast<uint16_t>(bits);
  return split;
}

inline float JoinBf16Split(uint16_t hi, uint16_t lo) {
  const uint32_t carry = (static_cast<uint32_t>(lo) & 0x8000u) << 1;
  return BitsToFloat(((static_cast<uint32_t>(hi) << 16) | lo) - carry);
}

// f32 -> IEEE binary16, round to nearest even, with subnormals, overflow to
// infinity, and NaN kept NaN (quiet, sign kept).
uint16_t FloatToF16Bits(float value);
float F16BitsToFloat(uint16_t bits);

// Storage-only 16-bit types: a bit pattern with conversions. Arithmetic
// happens in f32.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float value) : bits(FloatToBf16Bits(value)) {}
  static bf16 FromBits(uint16_t bits) {
    bf16 value;
    value.bits = bits;
    return value;
  }
  explicit operator float() const { return Bf16BitsToFloat(bits); }
};

struct f16 {
  uint16_t bits = 0;
  f16() = default;
  explicit f16(float value) : bits(FloatToF16Bits(value)) {}
  static f16 FromBits(uint16_t bits) {
    f16 value;
    value.bits = bits;
    return value;
  }
  explicit operator float() const { return F16BitsToFloat(bits); }
};

// Maps a C++ element type to its DType.
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<bf16> {
  static constexpr DType value = DType::kBF16;
};
template <>
struct DTypeOf<f16> {
  static constexpr DType value = DType::kF16;
};

// Reads element `index` of a buffer of `dtype` as f32.
inline float LoadAsFloat(const void* data, DType dtype, size_t index) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(data)[index];
    case DType::kBF16:
      return Bf16BitsToFloat(static_cast<const uint16_t*>(data)[index]);
    case DType::kF16:
      return F16BitsToFloat(static_cast<const uint16_t*>(data)[index]);
    case DType::kI32:
      return static_cast<float>(static_cast<const int32_t*>(data)[index]);
  }
  return 0.0f;
}

// Writes f32 `value`, rounded to `dtype`, to element `index`.
inline void StoreFromFloat(void* data, DType dtype, size_t index, float value) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(data)[index] = value;
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(data)[index] = FloatToBf16Bits(value);
      return;
    case DType::kF16:
      static_cast<uint16_t*>(data)[index] = FloatToF16Bits(value);
      return;
    case DType::kI32:
      static_cast<int32_t*>(data)[index] = static_cast<int32_t>(value);
      return;
  }
}

// The one host conversion between element types: `count` elements at
// `source` (of `source_dtype`) into `destination` (of `destination_dtype`),
// each read as f32 and rounded to nearest even (LoadAsFloat, StoreFromFloat).
// Equal dtypes copy the bytes, and then the ranges may overlap; differing
// ones must not overlap. Both pointers are host memory.
void ConvertElements(const void* source, DType source_dtype, void* destination,
                     DType destination_dtype, int64_t count);

}  // namespace ze

#endif  // ZE_CORE_DTYPE_H_
