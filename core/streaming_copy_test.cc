#include "core/streaming_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace ze {
namespace {

// Every alignment of source and destination within a vector, and sizes
// around the 32-byte boundaries, copy exactly and touch nothing else.
TEST(StreamingCopyTest, EqualsMemcpyAtEveryAlignmentAndSize) {
  std::vector<uint8_t> source(4096 + 64);
  for (size_t i = 0; i < source.size(); ++i) {
    source[i] = static_cast<uint8_t>(i * 131 + 7);
  }
  for (size_t source_offset = 0; source_offset < 33; source_offset += 3) {
    for (size_t destination_offset = 0; destination_offset < 33;
         ++destination_offset) {
      for (size_t bytes : {0, 1, 17, 31, 32, 33, 63, 64, 65, 100, 1000, 4096}) {
        std::vector<uint8_t> destination(4096 + 128, 0xAB);
        StreamingCopy(destination.data() + destination_offset,
                      source.data() + source_offset, bytes);
        for (size_t i = 0; i < destination.size(); ++i) {
          const bool inside =
              i >= destination_offset && i < destination_offset + bytes;
          const uint8_t want =
              inside ? source[source_offset + i - destination_offset] : 0xAB;
          ASSERT_EQ(destination[i], want)
              << "byte " << i << " of a " << bytes << "-byte copy from +"
              << source_offset << " to +" << destination_offset;
        }
      }
    }
  }
}

}  // namespace
}  // namespace ze
