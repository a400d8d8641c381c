#include "offload/swapped_state.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ze {
namespace offload {
namespace {

SwappedStateOptions Options(const std::string& name, int buffers) {
  SwappedStateOptions options;
  options.nvme.directory = ::testing::TempDir();
  options.nvme.block_size = 8192;
  options.file_name = name;
  options.arrays = 3;
  options.buffer_count = buffers;
  return options;
}

// Every chunk round-trips through Update: each visit sees the values the
// previous one left (master from Initialize, moments from zero), in any
// order, with fewer buffers than chunks; odd sizes straddle blocks.
TEST(SwappedStateTest, UpdatesEveryChunkInPlaceAcrossPasses) {
  const std::vector<int64_t> sizes = {1, 1000, 3001, 4096, 7, 12345};
  for (int buffers : {2, 3, 8}) {
    absl::StatusOr<std::unique_ptr<SwappedState>> state = SwappedState::Create(
        Options("update" + std::to_string(buffers) + ".swp", buffers), sizes);
    ASSERT_TRUE(state.ok()) << state.status();
    for (int c = 0; c < static_cast<int>(sizes.size()); ++c) {
      std::vector<float> master(sizes[c]);
      for (int64_t i = 0; i < sizes[c]; ++i) master[i] = c * 100000.0f + i;
      ASSERT_TRUE((*state)->Initialize(c, master.data()).ok());
    }
    const std::vector<int> order = {5, 0, 3, 1, 4, 2};
    for (int pass = 1; pass <= 3; ++pass) {
      std::vector<int> seen;
      absl::Status status = (*state)->Update(
          order, [&](int chunk, float* const* arrays) -> absl::Status {
            seen.push_back(chunk);
            for (int64_t i = 0; i < sizes[chunk]; ++i) {
              EXPECT_EQ(arrays[0][i], chunk * 100000.0f + i + (pass - 1));
              EXPECT_EQ(arrays[1][i], static_cast<float>(pass - 1));
              EXPECT_EQ(arrays[2][i], static_cast<float>(2 * (pass - 1)));
              arrays[0][i] += 1;
              arrays[1][i] += 1;
              arrays[2][i] += 2;
            }
            return absl::OkStatus();
          });
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_EQ(seen, order);
    }
    // Random access reads and read-modify-writes.
    std::vector<float> values(10);
    ASSERT_TRUE((*state)->Read(5, 0, 100, 10, values.data()).ok());
    EXPECT_EQ(values[0], 5 * 100000.0f + 100 + 3);
    std::vector<float> written(10, -1.0f);
    ASSERT_TRUE((*state)->Write(5, 1, 100, 10, written.data()).ok());
    ASSERT_TRUE((*state)->Read(5, 1, 95, 10, values.data()).ok());
    EXPECT_EQ(values[4], 3.0f);
    EXPECT_EQ(values[5], -1.0f);
    ASSERT_TRUE((*state)->Read(5, 0, 100, 1, values.data()).ok());
    EXPECT_EQ(values[0], 5 * 100000.0f + 100 + 3);  // other arrays intact
  }
}

// A failing visit stops the pass: chunks after it are not visited, the
// error comes back, and the chunks before it keep their update.
TEST(SwappedStateTest, VisitErrorStopsThePass) {
  absl::StatusOr<std::unique_ptr<SwappedState>> state =
      SwappedState::Create(Options("error.swp", 2), {64, 64, 64});
  ASSERT_TRUE(state.ok()) << state.status();
  std::vector<float> zeros(64, 0.0f);
  for (int c = 0; c < 3; ++c)
    ASSERT_TRUE((*state)->Initialize(c, zeros.data()).ok());
  int visits = 0;
  absl::Status status = (*state)->Update(
      {0, 1, 2}, [&](int chunk, float* const* arrays) -> absl::Status {
        ++visits;
        if (chunk == 1) return absl::InternalError("visit failed");
        arrays[0][0] = 7;
        return absl::OkStatus();
      });
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(visits, 2);
  float value = 0;
  ASSERT_TRUE((*state)->Read(0, 0, 0, 1, &value).ok());
  EXPECT_EQ(value, 7.0f);
  ASSERT_TRUE((*state)->Read(2, 0, 0, 1, &value).ok());
  EXPECT_EQ(value, 0.0f);
}

TEST(SwappedStateTest, BadOptionsAreRefused) {
  SwappedStateOptions options = Options("bad.swp", 1);
  EXPECT_EQ(SwappedState::Create(options, {10}).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Options("bad2.swp", 2);
  options.nvme.directory = ::testing::TempDir() + "/does/not/exist";
  absl::Status status = SwappedState::Create(options, {10}).status();
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("does/not/exist"), std::string::npos)
      << status;
}

}  // namespace
}  // namespace offload
}  // namespace ze
