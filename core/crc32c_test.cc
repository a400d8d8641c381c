#include "core/crc32c.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ze {
namespace {

TEST(Crc32cTest, KnownVectors) {
  // The check value of CRC-32C, and RFC 3720's (iSCSI) test patterns.
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF), ascending(32);
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(ascending.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(Crc32cToString(0xE3069283u), "crc32c:e3069283");
}

TEST(Crc32cTest, ChunkingAndAlignmentDoNotMatter) {
  std::mt19937 random(7);
  std::vector<uint8_t> data(10007);
  for (auto& byte : data) byte = static_cast<uint8_t>(random());
  const uint32_t whole = Crc32c(data.data(), data.size());
  for (size_t split : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{13},
                       size_t{4096}, data.size()}) {
    uint32_t crc = Crc32cExtend(0, data.data(), split);
    crc = Crc32cExtend(crc, data.data() + split, data.size() - split);
    EXPECT_EQ(crc, whole) << "split at " << split;
  }
  // Unaligned starts take the byte-wise head.
  for (size_t offset = 1; offset < 8; ++offset) {
    std::vector<uint8_t> shifted(offset, 0);
    shifted.insert(shifted.end(), data.begin(), data.end());
    EXPECT_EQ(Crc32c(shifted.data() + offset, data.size()), whole);
  }
}

TEST(Crc32cTest, CombineEqualsTheCrcOfTheConcatenation) {
  std::mt19937 random(11);
  std::vector<uint8_t> data(100003);
  for (auto& byte : data) byte = static_cast<uint8_t>(random());
  const uint32_t whole = Crc32c(data.data(), data.size());
  for (size_t split : {size_t{0}, size_t{1}, size_t{9}, size_t{4096},
                       size_t{65537}, data.size()}) {
    const uint32_t a = Crc32c(data.data(), split);
    const uint32_t b = Crc32c(data.data() + split, data.size() - split);
    EXPECT_EQ(Crc32cCombine(a, b, data.size() - split), whole)
        << "split at " << split;
  }
}

TEST(Crc32cTest, OneFlippedBitChangesIt) {
  std::string text(1000, 'x');
  const uint32_t before = Crc32c(text.data(), text.size());
  text[500] ^= 0x10;
  EXPECT_NE(Crc32c(text.data(), text.size()), before);
}

}  // namespace
}  // namespace ze
