#include "offload/swapped_weights.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ze {
namespace offload {
namespace {

SwappedWeightsOptions Options(const std::string& name, int buffers,
                              int64_t buffer_elements = 1 << 20) {
  SwappedWeightsOptions options;
  options.nvme.directory = ::testing::TempDir();
  options.nvme.block_size = 8192;
  options.file_name = name;
  options.element_bytes = 2;
  options.buffer_count = buffers;
  options.buffer_elements = buffer_elements;
  return options;
}

uint16_t Value(int record, int64_t i, int generation) {
  return static_cast<uint16_t>(record * 1000 + i * 7 + generation * 13);
}

// Writes generation `generation` of every record through the buffers.
void WriteAll(SwappedWeights& swapped, const std::vector<int64_t>& sizes,
              int generation) {
  for (int r = 0; r < static_cast<int>(sizes.size()); ++r) {
    absl::StatusOr<char*> bytes = swapped.AcquireForOverwrite(r);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    auto* values = reinterpret_cast<uint16_t*>(*bytes);
    for (int64_t i = 0; i < sizes[r]; ++i) values[i] = Value(r, i, generation);
    ASSERT_TRUE(swapped.Release(r, /*dirty=*/true).ok());
  }
}

void ExpectGeneration(SwappedWeights& swapped, int r, int64_t size,
                      int generation) {
  absl::StatusOr<char*> bytes = swapped.Acquire(r);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const auto* values = reinterpret_cast<const uint16_t*>(*bytes);
  for (int64_t i = 0; i < size; ++i) {
    ASSERT_EQ(values[i], Value(r, i, generation))
        << "record " << r << " @" << i;
  }
  ASSERT_TRUE(swapped.Release(r, /*dirty=*/false).ok());
}

// More records than buffers: every record's newest bytes come back, whether
// its buffer still holds them or they went to the file and are read again,
// in any order, with read-ahead or without; records of 0 elements take no
// file space.
TEST(SwappedWeightsTest, RecordsRoundTripThroughFewerBuffers) {
  const std::vector<int64_t> sizes = {1, 3000, 0, 4096, 2049, 7, 5000};
  for (int buffers : {1, 2, 3}) {
    SCOPED_TRACE(buffers);
    auto swapped = SwappedWeights::Create(
        Options("round" + std::to_string(buffers) + ".swp", buffers), sizes);
    ASSERT_TRUE(swapped.ok()) << swapped.status();
    EXPECT_EQ((*swapped)->file_bytes(),
              SwappedWeights::FileBytes(Options("x", 1), sizes));
    EXPECT_EQ((*swapped)->buffer_bytes(),
              buffers * SwappedWeights::BufferBytes(Options("x", 1), 5000));
    for (int generation = 0; generation < 3; ++generation) {
      WriteAll(**swapped, sizes, generation);
      const std::vector<int> order = {6, 0, 3, 1, 5, 4, 2, 0};
      for (size_t k = 0; k < order.size(); ++k) {
        // Read the next records ahead, as the fetch schedule does.
        for (size_t ahead = k + 1; ahead < order.size() && ahead < k + buffers;
             ++ahead) {
          ASSERT_TRUE((*swapped)->ReadAhead(order[ahead]).ok());
        }
        ExpectGeneration(**swapped, order[k], sizes[order[k]], generation);
      }
    }
    ASSERT_TRUE((*swapped)->Flush().ok());
    // Written to the disk (not only cached): a buffer's worth of reads of
    // other records evicts them all.
    EXPECT_GT((*swapped)->store().counters().bytes_written, 0);
    EXPECT_GT((*swapped)->store().counters().bytes_read, 0);
  }
}

// Read-ahead brings a record into a buffer without the caller waiting; an
// acquired buffer is never taken for another record, and when every buffer
// is acquired, Acquire of another record says so.
TEST(SwappedWeightsTest, ReadAheadAndBufferExhaustion) {
  const std::vector<int64_t> sizes = {100, 200, 300};
  auto swapped = SwappedWeights::Create(Options("ahead.swp", 2), sizes);
  ASSERT_TRUE(swapped.ok()) << swapped.status();
  WriteAll(**swapped, sizes, 5);
  ASSERT_TRUE((*swapped)->Flush().ok());
  ASSERT_TRUE((*swapped)->Forget(0).ok());
  ASSERT_TRUE((*swapped)->Forget(1).ok());
  ASSERT_TRUE((*swapped)->Forget(2).ok());
  ASSERT_TRUE((*swapped)->ReadAhead(1).ok());
  EXPECT_TRUE((*swapped)->cached(1));
  ASSERT_TRUE((*swapped)->Acquire(1).ok());
  ASSERT_TRUE((*swapped)->Acquire(2).ok());
  // Both buffers held: read-ahead is skipped, Acquire fails, by name.
  ASSERT_TRUE((*swapped)->ReadAhead(0).ok());
  EXPECT_FALSE((*swapped)->cached(0));
  absl::StatusOr<char*> none = (*swapped)->Acquire(0);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(none.status().message().find("buffer_count"), std::string::npos);
  ASSERT_TRUE((*swapped)->Release(1, false).ok());
  ASSERT_TRUE((*swapped)->Release(2, false).ok());
  ExpectGeneration(**swapped, 0, sizes[0], 5);
  // A release without an acquire is the caller's bug, said at once.
  EXPECT_EQ((*swapped)->Release(0, false).code(),
            absl::StatusCode::kFailedPrecondition);
}

// before_reuse runs before the buffer's bytes can change: before it is
// taken for another record.
TEST(SwappedWeightsTest, BeforeReuseRunsBeforeTheBufferIsTaken) {
  const std::vector<int64_t> sizes = {10, 10};
  auto swapped = SwappedWeights::Create(Options("reuse.swp", 1), sizes);
  ASSERT_TRUE(swapped.ok()) << swapped.status();
  WriteAll(**swapped, sizes, 1);
  int calls = 0;
  ASSERT_TRUE((*swapped)->Acquire(0).ok());
  ASSERT_TRUE((*swapped)
                  ->Release(0, false,
                            [&calls] {
                              ++calls;
                              return absl::OkStatus();
                            })
                  .ok());
  EXPECT_EQ(calls, 0);
  ExpectGeneration(**swapped, 1, sizes[1], 1);
  EXPECT_EQ(calls, 1);
  // Its error comes back from the call that needed the buffer.
  ASSERT_TRUE((*swapped)->Acquire(1).ok());
  ASSERT_TRUE(
      (*swapped)
          ->Release(1, false, [] { return absl::InternalError("upload"); })
          .ok());
  EXPECT_EQ((*swapped)->Acquire(0).status().code(),
            absl::StatusCode::kInternal);
}

// The optimizer tier's errors, from the same file layer: a missing
// directory and too little space are refused at Create naming the path; a
// record larger than a buffer names buffer_size; a failed write is named
// at Flush, and the record is then read from the file again (its previous
// value: the state the file holds is unchanged).
TEST(SwappedWeightsTest, ErrorsNameThePathAndTheSizes) {
  SwappedWeightsOptions missing = Options("missing.swp", 2);
  missing.nvme.directory = ::testing::TempDir() + "/no/such/dir";
  auto refused = SwappedWeights::Create(missing, {10});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("no/such/dir"), std::string::npos);

  SwappedWeightsOptions full = Options("full.swp", 2);
  full.nvme.pretend_free_bytes = 4096;
  auto no_space = SwappedWeights::Create(full, {10000});
  EXPECT_EQ(no_space.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(no_space.status().message().find("full.swp"), std::string::npos);

  auto too_big = SwappedWeights::Create(Options("big.swp", 2, 100), {50, 101});
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.status().message().find("buffer_size 100"),
            std::string::npos);

  SwappedWeightsOptions failing = Options("fail.swp", 1);
  failing.nvme.fail_write_request = 1;  // the second write request
  const std::vector<int64_t> sizes = {10, 10};
  auto swapped = SwappedWeights::Create(failing, sizes);
  ASSERT_TRUE(swapped.ok()) << swapped.status();
  WriteAll(**swapped, sizes, 2);  // record 1's write fails
  absl::Status flushed = (*swapped)->Flush();
  EXPECT_EQ(flushed.code(), absl::StatusCode::kInternal);
  EXPECT_NE(flushed.message().find("fail.swp"), std::string::npos);
  EXPECT_NE(flushed.message().find("write"), std::string::npos);
  ExpectGeneration(**swapped, 0, sizes[0], 2);
  // Record 1 was never written: the file's zeros come back, not the bytes
  // that failed.
  absl::StatusOr<char*> bytes = (*swapped)->Acquire(1);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(reinterpret_cast<const uint16_t*>(*bytes)[3], 0);
  ASSERT_TRUE((*swapped)->Release(1, false).ok());

  SwappedWeightsOptions short_read = Options("short.swp", 1);
  short_read.nvme.short_read_request = 0;
  auto reading = SwappedWeights::Create(short_read, {10000});
  ASSERT_TRUE(reading.ok()) << reading.status();
  absl::StatusOr<char*> read = (*reading)->Acquire(0);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(read.status().message().find("short.swp"), std::string::npos);
  // The buffer was given back: the next read works.
  EXPECT_TRUE((*reading)->Acquire(0).ok());
}

}  // namespace
}  // namespace offload
}  // namespace ze
