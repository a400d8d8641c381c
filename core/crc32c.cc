#include "core/crc32c.h"

#include <array>
#include <cstring>

#include "absl/strings/str_format.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace ze {
namespace {

constexpr uint32_t kReflectedPolynomial = 0x82F63B78u;

// Byte-at-a-time table for the portable path.
std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t value = byte;
    for (int bit = 0; bit < 8; ++bit) {
      value = (value >> 1) ^ ((value & 1u) ? kReflectedPolynomial : 0u);
    }
    table[byte] = value;
  }
  return table;
}

// `state` is the inverted running CRC (the register, not the value).
uint32_t ExtendPortable(uint32_t state, const uint8_t* data, size_t size) {
  static const std::array<uint32_t, 256> table = MakeTable();
  for (size_t i = 0; i < size; ++i) {
    state = table[(state ^ data[i]) & 0xFFu] ^ (state >> 8);
  }
  return state;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t ExtendHardware(uint32_t state,
                                                          const uint8_t* data,
                                                          size_t size) {
  // Head: single bytes up to 8-byte alignment, then 8 bytes per instruction.
  while (size > 0 && (reinterpret_cast<uintptr_t>(data) & 7u) != 0) {
    state = _mm_crc32_u8(state, *data++);
    --size;
  }
  uint64_t wide = state;
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, data, 8);
    wide = _mm_crc32_u64(wide, word);
    data += 8;
    size -= 8;
  }
  state = static_cast<uint32_t>(wide);
  while (size > 0) {
    state = _mm_crc32_u8(state, *data++);
    --size;
  }
  return state;
}
#endif

bool HasHardwareCrc() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
#else
  return false;
#endif
}

}  // namespace

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  uint32_t state = ~crc;
#if defined(__x86_64__)
  if (HasHardwareCrc()) return ~ExtendHardware(state, bytes, size);
#endif
  return ~ExtendPortable(state, bytes, size);
}

namespace {

// Polynomials over GF(2) modulo the CRC polynomial, in the CRC's reflected
// bit order (bit 31 is x^0). A CRC is linear in its message, so appending
// n bytes to A multiplies A's register by x^(8n); the conditioning (initial
// and final inversion) cancels between the two parts.
uint32_t MultiplyModulo(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t mask = 1u << 31; mask != 0; mask >>= 1) {
    if (a & mask) product ^= b;
    b = (b & 1u) ? (b >> 1) ^ kReflectedPolynomial : b >> 1;
  }
  return product;
}

// x^(8 * bytes) modulo the polynomial, by squaring.
uint32_t ShiftForBytes(uint64_t bytes) {
  uint32_t result = 1u << 31;  // x^0
  uint32_t power = 1u << 23;   // x^8: one byte
  while (bytes != 0) {
    if (bytes & 1u) result = MultiplyModulo(result, power);
    power = MultiplyModulo(power, power);
    bytes >>= 1;
  }
  return result;
}

}  // namespace

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  return MultiplyModulo(ShiftForBytes(length_b), crc_a) ^ crc_b;
}

std::string Crc32cToString(uint32_t crc) {
  return absl::StrFormat("crc32c:%08x", crc);
}

bool Crc32cIsHardwareAccelerated() { return HasHardwareCrc(); }

}  // namespace ze
