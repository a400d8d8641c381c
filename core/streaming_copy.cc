#include "core/streaming_copy.h"

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace ze {

void StreamingCopy(void* destination, const void* source, size_t bytes) {
  auto* out = static_cast<char*>(destination);
  const auto* in = static_cast<const char*>(source);
  // Up to the destination's first 32-byte boundary: an ordinary copy.
  const size_t misaligned = reinterpret_cast<uintptr_t>(out) % 32;
  size_t head = misaligned == 0 ? 0 : 32 - misaligned;
  if (head > bytes) head = bytes;
  std::memcpy(out, in, head);
  out += head;
  in += head;
  bytes -= head;
  // Whole 32-byte vectors, streamed (the source may be unaligned).
  const size_t body = bytes / 32 * 32;
  for (size_t i = 0; i < body; i += 32) {
    _mm256_stream_si256(
        reinterpret_cast<__m256i*>(out + i),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
  }
  std::memcpy(out + body, in + body, bytes - body);
  // Non-temporal stores are weakly ordered: order them before whatever
  // publishes the copy.
  _mm_sfence();
}

}  // namespace ze
