#include "core/dtype.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ze {

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
  }
  return "unknown";
}

const char* DTypeSafetensorsName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kI32:
      return "I32";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(absl::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  if (lower == "f32" || lower == "fp32" || lower == "float32" ||
      lower == "float") {
    return DType::kF32;
  }
  if (lower == "bf16" || lower == "bfloat16") return DType::kBF16;
  if (lower == "f16" || lower == "fp16" || lower == "float16" ||
      lower == "half") {
    return DType::kF16;
  }
  if (lower == "i32" || lower == "int32") return DType::kI32;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dtype \"", text, "\" (expected one of f32, bf16, f16, i32)"));
}

uint16_t FloatToF16Bits(float value) {
  const uint32_t bits = FloatBits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;

  if (magnitude > 0x7f800000u) {  // NaN: keep a quiet NaN with some payload.
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  if (magnitude >= 0x477ff000u) {
    // >= 65520 rounds to infinity (65504 is the largest finite f16; halfway
    // to the next power, ties to even, goes up).
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (magnitude < 0x38800000u) {
    // Below the smallest normal f16 (2^-14): a subnormal or zero. The value is
    // mantissa * 2^(exponent-150); f16 subnormals are multiples of 2^-24.
    if (magnitude < 0x33000000u) {
      // < 2^-25: rounds to zero (2^-25 itself is a tie and goes to even, 0).
      return sign;
    }
    const uint32_t exponent = magnitude >> 23;
    const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    // Shift so the result counts units of 2^-24: value / 2^-24 =
    // mantissa * 2^(exponent - 126).
    const uint32_t shift = 126 - exponent;  // in [14, 24] here
    uint32_t result = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (result & 1u))) {
      ++result;  // may carry into the smallest normal: still correct bits
    }
    return static_cast<uint16_t>(sign | result);
  }
  // Normal: rebias the exponent (127 -> 15) and round 23 -> 10 mantissa bits.
  uint32_t result = magnitude - 0x38000000u;  // exponent - 112 in place
  const uint32_t remainder = result & 0x1fffu;
  result >>= 13;
  if (remainder > 0x1000u || (remainder == 0x1000u && (result & 1u))) {
    ++result;  // a carry into the exponent is the correctly rounded value
  }
  return static_cast<uint16_t>(sign | result);
}

float F16BitsToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) {
    // Inf or NaN; a NaN's payload moves to the top of the f32 mantissa.
    return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent == 0) {
    if (mantissa == 0) return BitsToFloat(sign);
    // Subnormal: mantissa * 2^-24, exact in f32.
    const float magnitude =
        static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  return BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

void ConvertElements(const void* source, DType source_dtype, void* destination,
                     DType destination_dtype, int64_t count) {
  if (count <= 0) return;
  if (source_dtype == destination_dtype) {
    if (source != destination) {
      std::memmove(destination, source, count * SizeOf(source_dtype));
    }
    return;
  }
  // The pairs large host buffers convert (the mpi backend's bf16
  // reductions widen and round every element: 0.42 s for 100 MB through the
  // per-element dtype switch below, bench/comm_bench): loops the compiler
  // vectorises, the same functions on each element, so the same bits.
  if (source_dtype == DType::kBF16 && destination_dtype == DType::kF32) {
    const uint16_t* in = static_cast<const uint16_t*>(source);
    float* out = static_cast<float*>(destination);
    for (int64_t i = 0; i < count; ++i) out[i] = Bf16BitsToFloat(in[i]);
    return;
  }
  if (source_dtype == DType::kF32 && destination_dtype == DType::kBF16) {
    const float* in = static_cast<const float*>(source);
    uint16_t* out = static_cast<uint16_t*>(destination);
    for (int64_t i = 0; i < count; ++i) out[i] = FloatToBf16Bits(in[i]);
    return;
  }
  for (int64_t i = 0; i < count; ++i) {
    StoreFromFloat(destination, destination_dtype, i,
                   LoadAsFloat(source, source_dtype, i));
  }
}

}  // namespace ze
