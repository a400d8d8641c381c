#include "offload/nvme_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ze {
namespace offload {
namespace {

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

NvmeOptions Options() {
  NvmeOptions options;
  options.directory = TempDir();
  options.block_size = 8192;
  options.queue_depth = 4;
  options.thread_count = 2;
  return options;
}

bool Exists(const std::string& path) {
  return ::access(path.c_str(), F_OK) == 0;
}

void ExpectMessageHas(const absl::Status& status,
                      const std::vector<std::string>& needles) {
  for (const std::string& needle : needles) {
    EXPECT_NE(status.message().find(needle), std::string::npos)
        << "\"" << needle << "\" missing from: " << status;
  }
}

// Random data at odd sizes and offsets, many tickets in flight, waited in
// reverse order; the file is gone after the store.
TEST(NvmeStoreTest, RoundTripsManyRequestsInFlight) {
  std::string path;
  {
    absl::StatusOr<std::unique_ptr<NvmeStore>> store =
        NvmeStore::Create(Options(), "round_trip.swp", 1 << 20);
    ASSERT_TRUE(store.ok()) << store.status();
    path = (*store)->path();
    EXPECT_TRUE(Exists(path));
    std::mt19937 random(7);
    const std::vector<int64_t> sizes = {1, 4096, 5000, 8192, 30000, 100000};
    std::vector<AlignedBuffer> written, read;
    std::vector<IoTicket> tickets;
    int64_t offset = 0;
    std::vector<int64_t> offsets;
    for (int64_t size : sizes) {
      absl::StatusOr<AlignedBuffer> buffer = AlignedBuffer::Allocate(size);
      ASSERT_TRUE(buffer.ok());
      for (int64_t i = 0; i < buffer->size(); ++i) {
        buffer->data()[i] = static_cast<char>(random());
      }
      absl::StatusOr<IoTicket> ticket =
          (*store)->Write(offset, buffer->data(), size);
      ASSERT_TRUE(ticket.ok()) << ticket.status();
      tickets.push_back(*ticket);
      offsets.push_back(offset);
      offset += buffer->size();
      written.push_back(std::move(*buffer));
    }
    for (auto it = tickets.rbegin(); it != tickets.rend(); ++it) {
      ASSERT_TRUE((*store)->Wait(*it).ok());
    }
    tickets.clear();
    for (size_t i = 0; i < sizes.size(); ++i) {
      absl::StatusOr<AlignedBuffer> buffer = AlignedBuffer::Allocate(sizes[i]);
      ASSERT_TRUE(buffer.ok());
      absl::StatusOr<IoTicket> ticket =
          (*store)->Read(offsets[i], buffer->data(), sizes[i]);
      ASSERT_TRUE(ticket.ok());
      tickets.push_back(*ticket);
      read.push_back(std::move(*buffer));
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      ASSERT_TRUE((*store)->Wait(tickets[i]).ok());
      EXPECT_EQ(std::memcmp(read[i].data(), written[i].data(), sizes[i]), 0)
          << "size " << sizes[i];
    }
    EXPECT_GT((*store)->counters().bytes_written, 0);
    EXPECT_GT((*store)->counters().bytes_read, 0);
    EXPECT_FALSE((*store)->Wait(tickets[0]).ok());  // waited already
  }
  EXPECT_FALSE(Exists(path));
}

TEST(NvmeStoreTest, MissingDirectoryAndFileForDirectory) {
  NvmeOptions options = Options();
  options.directory = TempDir() + "/no/such/dir";
  absl::Status status = NvmeStore::Create(options, "x.swp", 4096).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  ExpectMessageHas(status, {options.directory, "No such file"});

  const std::string file = TempDir() + "/plain_file";
  FILE* handle = std::fopen(file.c_str(), "w");
  ASSERT_NE(handle, nullptr);
  std::fclose(handle);
  options.directory = file;
  status = NvmeStore::Create(options, "x.swp", 4096).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  ExpectMessageHas(status, {file, "not a directory"});
}

// A directory no one can create files in, even root: /proc is not
// writable.
TEST(NvmeStoreTest, UnwritableDirectory) {
  NvmeOptions options = Options();
  options.directory = "/proc";
  absl::Status status = NvmeStore::Create(options, "x.swp", 4096).status();
  EXPECT_FALSE(status.ok());
  ExpectMessageHas(status, {"/proc", "x.swp"});
}

TEST(NvmeStoreTest, TooLittleSpaceNamesBytesNeededAndFree) {
  NvmeOptions options = Options();
  options.pretend_free_bytes = 10000;
  absl::Status status = NvmeStore::Create(options, "big.swp", 1 << 20).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  ExpectMessageHas(status,
                   {TempDir(), "big.swp", "needs 1048576 bytes", "10000 free"});
  EXPECT_FALSE(Exists(TempDir() + "/big.swp"));
}

// An I/O error and a short read mid-run: named errors, later requests work,
// the file is still removed.
TEST(NvmeStoreTest, InjectedErrorsAreNamedAndNotFatal) {
  NvmeOptions options = Options();
  options.fail_write_request = 1;
  options.short_read_request = 0;
  std::string path;
  {
    absl::StatusOr<std::unique_ptr<NvmeStore>> store =
        NvmeStore::Create(options, "faults.swp", 1 << 16);
    ASSERT_TRUE(store.ok()) << store.status();
    path = (*store)->path();
    absl::StatusOr<AlignedBuffer> buffer = AlignedBuffer::Allocate(16384);
    ASSERT_TRUE(buffer.ok());
    std::memset(buffer->data(), 3, buffer->size());
    // Two 8 KiB requests: the second (request 1) fails.
    absl::StatusOr<IoTicket> write = (*store)->Write(0, buffer->data(), 16384);
    ASSERT_TRUE(write.ok());
    absl::Status status = (*store)->Wait(*write);
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
    ExpectMessageHas(status, {path, "write", "offset 8192", "Input/output"});
    write = (*store)->Write(0, buffer->data(), 16384);
    ASSERT_TRUE(write.ok());
    EXPECT_TRUE((*store)->Wait(*write).ok());
    absl::StatusOr<IoTicket> read = (*store)->Read(0, buffer->data(), 8192);
    ASSERT_TRUE(read.ok());
    status = (*store)->Wait(*read);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
    ExpectMessageHas(status, {path, "short read", "4096 of 8192"});
    read = (*store)->Read(0, buffer->data(), 8192);
    ASSERT_TRUE(read.ok());
    EXPECT_TRUE((*store)->Wait(*read).ok());
    // Misaligned requests are refused before anything is queued.
    EXPECT_EQ((*store)->Write(100, buffer->data(), 10).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*store)->Read(0, buffer->data(), 1 << 20).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_FALSE(Exists(path));
}

}  // namespace
}  // namespace offload
}  // namespace ze
