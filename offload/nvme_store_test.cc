#include "offload/nvme_store.h"

#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ze {
namespace offload {
namespace {

using Backend = NvmeOptions::Backend;

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

NvmeOptions SmallOptions(Backend backend) {
  NvmeOptions options;
  options.directory = ::testing::TempDir();
  options.block_size = 3 * NvmeStore::kAlignment;  // odd number of pages
  options.queue_depth = 4;
  options.thread_count = 3;
  options.backend = backend;
  return options;
}

void FillRandom(char* data, int64_t bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < bytes; ++i) data[i] = static_cast<char>(rng());
}

// An aligned buffer of `bytes` random bytes (from `seed`): what a test
// writes.
absl::StatusOr<AlignedBuffer> RandomBuffer(int64_t bytes, uint32_t seed) {
  absl::StatusOr<AlignedBuffer> buffer = AlignedBuffer::Allocate(bytes);
  if (buffer.ok()) FillRandom(buffer->data(), bytes, seed);
  return buffer;
}

class NvmeStoreTest : public ::testing::TestWithParam<Backend> {};

// Creates a store with the test's backend; io_uring refused by this kernel
// or container skips the test (kAuto then covers the fallback).
#define CREATE_OR_SKIP(var, options, name, bytes)                           \
  auto var = NvmeStore::Create(options, name, bytes);                       \
  if (GetParam() == Backend::kIoUring && absl::IsUnavailable(var.status())) \
    GTEST_SKIP() << var.status();                                           \
  ASSERT_TRUE(var.ok()) << var.status()

TEST_P(NvmeStoreTest, RoundTripsOddSizesAndOffsets) {
  CREATE_OR_SKIP(store, SmallOptions(GetParam()), "round_trip", 1'000'000);
  NvmeStore& s = **store;
  const std::string backend = s.backend_name();
  if (GetParam() == Backend::kIoUring)
    EXPECT_EQ(backend.rfind("io_uring", 0), 0);
  if (GetParam() == Backend::kThreads)
    EXPECT_EQ(backend.rfind("threads", 0), 0);
  std::printf("backend: %s\n", backend.c_str());
  EXPECT_EQ(s.size_bytes(), 1'003'520);  // rounded up to 4096
  EXPECT_TRUE(Exists(s.path()));
  // Sizes spanning several blocks with a partial last one, at aligned
  // offsets that are not block multiples.
  const int64_t sizes[] = {1, 4095, 4097, 12288, 12289, 50'000, 123'457};
  const int64_t offsets[] = {0, 4096, 8192 * 5, 409'600, 700'416};
  uint32_t seed = 1;
  for (int64_t size : sizes) {
    for (int64_t offset : offsets) {
      auto out = RandomBuffer(size, seed++);
      auto in = AlignedBuffer::Allocate(size);
      ASSERT_TRUE(out.ok() && in.ok());
      auto write = s.Write(offset, out->data(), size);
      ASSERT_TRUE(write.ok()) << write.status();
      ASSERT_TRUE(s.Wait(*write).ok());
      auto read = s.Read(offset, in->data(), size);
      ASSERT_TRUE(read.ok()) << read.status();
      ASSERT_TRUE(s.Wait(*read).ok());
      ASSERT_EQ(std::memcmp(out->data(), in->data(), size), 0)
          << "size " << size << " offset " << offset;
    }
  }
  const NvmeStore::Counters counters = s.counters();
  EXPECT_GT(counters.bytes_written, 0);
  EXPECT_EQ(counters.bytes_written, counters.bytes_read);
}

TEST_P(NvmeStoreTest, ManyTicketsInFlight) {
  constexpr int kChunks = 40;
  constexpr int64_t kChunk = 5 * NvmeStore::kAlignment + 100;
  constexpr int64_t kStride = 6 * NvmeStore::kAlignment;
  CREATE_OR_SKIP(store, SmallOptions(GetParam()), "many", kChunks * kStride);
  NvmeStore& s = **store;
  auto out = RandomBuffer(kChunks * kStride, 7);
  auto in = AlignedBuffer::Allocate(kChunks * kStride);
  ASSERT_TRUE(out.ok() && in.ok());
  std::vector<IoTicket> tickets;
  for (int i = 0; i < kChunks; ++i) {
    auto t = s.Write(i * kStride, out->data() + i * kStride, kChunk);
    ASSERT_TRUE(t.ok()) << t.status();
    tickets.push_back(*t);
  }
  // Wait in reverse order for half, WaitAll for the rest.
  for (int i = kChunks - 1; i >= kChunks / 2; --i) {
    ASSERT_TRUE(s.Wait(tickets[i]).ok());
  }
  ASSERT_TRUE(s.WaitAll().ok());
  EXPECT_FALSE(s.Wait(tickets[0]).ok());  // already waited for
  for (int i = 0; i < kChunks; ++i) {
    ASSERT_TRUE(s.Read(i * kStride, in->data() + i * kStride, kChunk).ok());
  }
  ASSERT_TRUE(s.WaitAll().ok());
  for (int i = 0; i < kChunks; ++i) {
    ASSERT_EQ(std::memcmp(out->data() + i * kStride, in->data() + i * kStride,
                          kChunk),
              0)
        << "chunk " << i;
  }
}

// DeepSpeed's single_submit and overlap_events switched the other way.
TEST_P(NvmeStoreTest, SingleSubmitWithoutOverlap) {
  NvmeOptions options = SmallOptions(GetParam());
  options.single_submit = true;
  options.overlap_events = false;
  options.queue_depth = 2;
  options.thread_count = 2;
  constexpr int64_t kBytes = 29 * NvmeStore::kAlignment + 7;
  CREATE_OR_SKIP(store, options, "single", 4 * kBytes);
  NvmeStore& s = **store;
  auto out = RandomBuffer(4 * kBytes, 11);
  auto in = AlignedBuffer::Allocate(4 * kBytes);
  const int64_t stride = (kBytes + 4095) / 4096 * 4096;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(s.Write(i * stride, out->data() + i * stride, kBytes).ok());
  }
  ASSERT_TRUE(s.WaitAll().ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(s.Read(i * stride, in->data() + i * stride, kBytes).ok());
  }
  ASSERT_TRUE(s.WaitAll().ok());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(
        std::memcmp(out->data() + i * stride, in->data() + i * stride, kBytes),
        0);
  }
}

// Reads submitted behind a backlog of writes are served among them, not
// after them: one worker, a 16 MiB write, then a read of the write's last
// block. Served in turn, the read comes second or so and finds the block as
// fallocate left it (zeros); behind the writes it would find their bytes.
TEST_P(NvmeStoreTest, ReadIsServedAmongQueuedWrites) {
  NvmeOptions options = SmallOptions(GetParam());
  options.thread_count = 1;
  options.queue_depth = 1;
  options.block_size = NvmeStore::kAlignment;
  constexpr int64_t kBytes = int64_t{16} << 20;
  CREATE_OR_SKIP(store, options, "interleave", kBytes);
  NvmeStore& s = **store;
  auto out = AlignedBuffer::Allocate(kBytes);
  auto in = AlignedBuffer::Allocate(NvmeStore::kAlignment);
  ASSERT_TRUE(out.ok() && in.ok());
  std::memset(out->data(), 0x77, kBytes);
  std::memset(in->data(), 0x11, NvmeStore::kAlignment);
  auto written = s.Write(0, out->data(), kBytes);
  auto read =
      s.Read(kBytes - NvmeStore::kAlignment, in->data(), NvmeStore::kAlignment);
  ASSERT_TRUE(written.ok() && read.ok());
  ASSERT_TRUE(s.Wait(*read).ok());
  ASSERT_TRUE(s.Wait(*written).ok());
  for (int64_t i = 0; i < NvmeStore::kAlignment; ++i) {
    ASSERT_EQ(in->data()[i], 0) << "byte " << i;
  }
}

// The busy clock: both directions' tickets in flight at once count once in
// busy_seconds and in duplex_seconds; two stores sharing an IoActivity
// report the same union.
TEST_P(NvmeStoreTest, ActivityCountsTheUnionOfInFlightTime) {
  NvmeOptions options = SmallOptions(GetParam());
  options.activity = std::make_shared<IoActivity>();
  CREATE_OR_SKIP(first, options, "activity_a", 4 << 20);
  CREATE_OR_SKIP(second, options, "activity_b", 4 << 20);
  EXPECT_EQ((*first)->activity(), options.activity);
  auto data = RandomBuffer(4 << 20, 3);
  auto back = AlignedBuffer::Allocate(4 << 20);
  ASSERT_TRUE(data.ok() && back.ok());
  ASSERT_TRUE((*first)->Write(0, data->data(), 4 << 20).ok());
  ASSERT_TRUE((*first)->WaitAll().ok());
  ASSERT_TRUE((*first)->Read(0, back->data(), 4 << 20).ok());
  ASSERT_TRUE((*second)->Write(0, data->data(), 4 << 20).ok());
  ASSERT_TRUE((*first)->WaitAll().ok());
  ASSERT_TRUE((*second)->WaitAll().ok());
  const NvmeStore::Counters a = (*first)->counters();
  const NvmeStore::Counters b = (*second)->counters();
  EXPECT_EQ(a.bytes_written, 4 << 20);
  EXPECT_EQ(a.bytes_read, 4 << 20);
  EXPECT_EQ(b.bytes_written, 4 << 20);
  // Nothing in flight now: the shared clock is stopped, both read it.
  EXPECT_DOUBLE_EQ(a.busy.busy_seconds, b.busy.busy_seconds);
  const IoActivity::Times& t = a.busy;
  EXPECT_GT(t.busy_seconds, 0);
  EXPECT_GT(t.read_busy_seconds, 0);
  EXPECT_GT(t.write_busy_seconds, 0);
  // Inclusion-exclusion holds exactly by construction; the union is no
  // longer than the per-ticket sums (up to the microseconds between a
  // ticket's own timestamps and the clock's, taken under the locks).
  EXPECT_NEAR(t.read_busy_seconds + t.write_busy_seconds - t.duplex_seconds,
              t.busy_seconds, 1e-9);
  EXPECT_LE(t.busy_seconds, a.write_seconds + a.read_seconds + b.write_seconds +
                                b.read_seconds + 1e-3);
}

TEST_P(NvmeStoreTest, RejectsBadArguments) {
  CREATE_OR_SKIP(store, SmallOptions(GetParam()), "args", 65536);
  auto buffer = AlignedBuffer::Allocate(2 * 65536);
  ASSERT_TRUE(buffer.ok());
  EXPECT_FALSE((*store)->Write(100, buffer->data(), 10).ok());      // offset
  EXPECT_FALSE((*store)->Write(0, buffer->data() + 8, 10).ok());    // buffer
  EXPECT_FALSE((*store)->Write(61440, buffer->data(), 4097).ok());  // end
  EXPECT_FALSE((*store)->Read(0, buffer->data(), -1).ok());
  auto empty = (*store)->Write(0, buffer->data(), 0);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE((*store)->Wait(*empty).ok());
}

TEST_P(NvmeStoreTest, InjectedWriteErrorNamesPathAndLaterRequestsWork) {
  NvmeOptions options = SmallOptions(GetParam());
  options.fail_write_request = 2;  // the third block of the first write
  std::string path;
  {
    CREATE_OR_SKIP(store, options, "fail_write", 1 << 20);
    NvmeStore& s = **store;
    path = s.path();
    const int64_t bytes = 5 * options.block_size;
    auto out = RandomBuffer(bytes, 3);
    auto in = AlignedBuffer::Allocate(bytes);
    auto failing = s.Write(0, out->data(), bytes);
    ASSERT_TRUE(failing.ok());
    absl::Status status = s.Wait(*failing);
    EXPECT_TRUE(absl::IsInternal(status)) << status;
    EXPECT_NE(status.message().find(path), std::string::npos) << status;
    EXPECT_NE(status.message().find("write"), std::string::npos) << status;
    EXPECT_NE(status.message().find(std::strerror(EIO)), std::string::npos)
        << status;
    // The same write again succeeds and reads back.
    auto again = s.Write(0, out->data(), bytes);
    ASSERT_TRUE(again.ok());
    ASSERT_TRUE(s.Wait(*again).ok());
    auto read = s.Read(0, in->data(), bytes);
    ASSERT_TRUE(read.ok());
    ASSERT_TRUE(s.Wait(*read).ok());
    EXPECT_EQ(std::memcmp(out->data(), in->data(), bytes), 0);
  }
  EXPECT_FALSE(Exists(path));
}

TEST_P(NvmeStoreTest, ShortReadIsDataLossNamingPathAndLaterReadsWork) {
  NvmeOptions options = SmallOptions(GetParam());
  options.short_read_request = 1;
  const int64_t bytes = 3 * options.block_size;
  std::string path;
  {
    CREATE_OR_SKIP(store, options, "short_read", 1 << 20);
    NvmeStore& s = **store;
    path = s.path();
    auto out = RandomBuffer(bytes, 5);
    auto in = AlignedBuffer::Allocate(bytes);
    ASSERT_TRUE(s.Wait(*s.Write(0, out->data(), bytes)).ok());
    absl::Status status = s.Wait(*s.Read(0, in->data(), bytes));
    EXPECT_TRUE(absl::IsDataLoss(status)) << status;
    EXPECT_NE(status.message().find(path), std::string::npos) << status;
    EXPECT_NE(status.message().find("read"), std::string::npos) << status;
    std::memset(in->data(), 0, bytes);
    ASSERT_TRUE(s.Wait(*s.Read(0, in->data(), bytes)).ok());
    EXPECT_EQ(std::memcmp(out->data(), in->data(), bytes), 0);
  }
  EXPECT_FALSE(Exists(path));
}

TEST_P(NvmeStoreTest, DestructorWaitsAndRemovesFile) {
  std::string path;
  auto buffer = AlignedBuffer::Allocate(1 << 20);
  {
    CREATE_OR_SKIP(store, SmallOptions(GetParam()), "dtor", 1 << 20);
    path = (*store)->path();
    ASSERT_TRUE((*store)->Write(0, buffer->data(), 1 << 20).ok());
    // Not waited for: the destructor must wait.
  }
  EXPECT_FALSE(Exists(path));
}

INSTANTIATE_TEST_SUITE_P(Backends, NvmeStoreTest,
                         ::testing::Values(Backend::kAuto, Backend::kIoUring,
                                           Backend::kThreads));

// A file in use (here by another store of this process: the lock is per
// open file, as between processes) is refused by name and left as it is.
TEST(NvmeStoreCreateTest, FileInUseIsNotOverwritten) {
  NvmeOptions options = SmallOptions(Backend::kThreads);
  auto first = NvmeStore::Create(options, "twice", 4096);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = NvmeStore::Create(options, "twice", 8192);
  EXPECT_TRUE(absl::IsFailedPrecondition(second.status())) << second.status();
  EXPECT_NE(second.status().message().find((*first)->path()),
            std::string::npos);
  EXPECT_NE(second.status().message().find("in use"), std::string::npos);
  struct stat info;
  ASSERT_EQ(stat((*first)->path().c_str(), &info), 0);
  EXPECT_EQ(info.st_size, 4096);
}

// Another process's store: its lock keeps this one off the file, whose
// contents stay as they were.
TEST(NvmeStoreCreateTest, FileOfALiveProcessIsNotTouched) {
  const NvmeOptions options = SmallOptions(Backend::kThreads);
  const std::string path = options.directory + "/other_process";
  int ready[2], finish[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(finish), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto store = NvmeStore::Create(options, "other_process", 4096);
    if (!store.ok()) std::_Exit(2);
    auto buffer = AlignedBuffer::Allocate(4096);
    std::memset(buffer->data(), 'x', 4096);
    auto ticket = (*store)->Write(0, buffer->data(), 4096);
    if (!ticket.ok() || !(*store)->Wait(*ticket).ok()) std::_Exit(3);
    char byte = 1;
    if (write(ready[1], &byte, 1) != 1) std::_Exit(4);
    if (read(finish[0], &byte, 1) != 1) std::_Exit(5);
    std::_Exit(0);  // no destructor: the parent checks the file
  }
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  auto store = NvmeStore::Create(options, "other_process", 1 << 20);
  EXPECT_TRUE(absl::IsFailedPrecondition(store.status())) << store.status();
  EXPECT_NE(store.status().message().find(path), std::string::npos)
      << store.status();
  ASSERT_EQ(write(finish[1], &byte, 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  FILE* file = std::fopen(path.c_str(), "rb");
  ASSERT_NE(file, nullptr);
  std::vector<char> contents(8192);
  EXPECT_EQ(std::fread(contents.data(), 1, contents.size(), file), 4096u);
  std::fclose(file);
  EXPECT_EQ(contents[0], 'x');
  EXPECT_EQ(contents[4095], 'x');
  unlink(path.c_str());
}

// A process killed with SIGKILL leaves its file; the next store of that
// name takes it over, with a warning naming it, and removes it at the end.
TEST(NvmeStoreCreateTest, FileOfAKilledProcessIsReplacedWithAWarning) {
  const NvmeOptions options = SmallOptions(Backend::kThreads);
  const std::string path = options.directory + "/killed";
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto store = NvmeStore::Create(options, "killed", 3 * 4096);
    char byte = store.ok() ? 1 : 0;
    if (write(ready[1], &byte, 1) != 1) std::_Exit(4);
    pause();
    std::_Exit(0);
  }
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  ASSERT_EQ(byte, 1);
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(Exists(path));
  ::testing::internal::CaptureStderr();
  auto store = NvmeStore::Create(options, "killed", 4096);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_NE(log.find(path), std::string::npos) << log;
  EXPECT_NE(log.find("stale"), std::string::npos) << log;
  EXPECT_NE(log.find("12288 bytes"), std::string::npos) << log;
  struct stat info;
  ASSERT_EQ(stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_size, 4096);
  store->reset();
  EXPECT_FALSE(Exists(path));
}

TEST(NvmeStoreCreateTest, MissingDirectory) {
  NvmeOptions options = SmallOptions(Backend::kThreads);
  options.directory = ::testing::TempDir() + "/does/not/exist";
  auto store = NvmeStore::Create(options, "f", 4096);
  EXPECT_TRUE(absl::IsFailedPrecondition(store.status())) << store.status();
  EXPECT_NE(store.status().message().find(options.directory),
            std::string::npos);
}

TEST(NvmeStoreCreateTest, DirectoryIsARegularFile) {
  NvmeOptions options = SmallOptions(Backend::kThreads);
  options.directory = ::testing::TempDir() + "/plain_file";
  FILE* file = std::fopen(options.directory.c_str(), "w");
  ASSERT_NE(file, nullptr);
  std::fclose(file);
  auto store = NvmeStore::Create(options, "f", 4096);
  EXPECT_TRUE(absl::IsFailedPrecondition(store.status())) << store.status();
  EXPECT_NE(store.status().message().find("not a directory"),
            std::string::npos);
  // A path whose parent is a regular file.
  options.directory += "/sub";
  store = NvmeStore::Create(options, "f", 4096);
  EXPECT_TRUE(absl::IsFailedPrecondition(store.status())) << store.status();
}

// Root ignores permission bits, so "unwritable" is a directory where file
// creation fails even for root: /proc (no regular files can be created).
TEST(NvmeStoreCreateTest, UnwritableDirectory) {
  NvmeOptions options = SmallOptions(Backend::kThreads);
  options.directory = "/proc";
  options.pretend_free_bytes = 1 << 30;  // /proc reports no free space
  auto store = NvmeStore::Create(options, "ze_nvme_probe", 4096);
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("/proc/ze_nvme_probe"),
            std::string::npos)
      << store.status();
  EXPECT_NE(store.status().message().find("open"), std::string::npos)
      << store.status();
}

TEST(NvmeStoreCreateTest, TooLittleSpacePretended) {
  NvmeOptions options = SmallOptions(Backend::kThreads);
  options.pretend_free_bytes = 8192;
  auto store = NvmeStore::Create(options, "big", 10'000);
  EXPECT_TRUE(absl::IsResourceExhausted(store.status())) << store.status();
  EXPECT_NE(store.status().message().find("needs 12288 bytes, 8192 free"),
            std::string::npos)
      << store.status();
  EXPECT_FALSE(Exists(options.directory + "/big"));
}

TEST(NvmeStoreCreateTest, TooLittleSpaceOnRealTmpfs) {
  const std::string mount_point = ::testing::TempDir() + "/small_tmpfs";
  ASSERT_EQ(mkdir(mount_point.c_str(), 0700), 0);
  if (mount("tmpfs", mount_point.c_str(), "tmpfs", 0, "size=1m") != 0) {
    rmdir(mount_point.c_str());
    GTEST_SKIP() << "mounting a 1 MiB tmpfs is not permitted here: "
                 << std::strerror(errno);
  }
  NvmeOptions options = SmallOptions(Backend::kThreads);
  options.directory = mount_point;
  auto store = NvmeStore::Create(options, "big", 4 << 20);
  EXPECT_TRUE(absl::IsResourceExhausted(store.status())) << store.status();
  auto fits = NvmeStore::Create(options, "fits", 256 << 10);
  EXPECT_TRUE(fits.ok()) << fits.status();
  fits->reset();
  umount(mount_point.c_str());
  rmdir(mount_point.c_str());
}

// IoActivity alone, on a timeline the test makes: read alone, both, write
// alone.
TEST(IoActivityTest, SplitsTimeByDirection) {
  IoActivity activity;
  auto pause = [] { usleep(20'000); };
  activity.Begin(/*is_write=*/false);
  pause();
  activity.Begin(/*is_write=*/true);
  pause();
  activity.End(/*is_write=*/false);
  pause();
  // Still in flight: counted up to now.
  const IoActivity::Times open = activity.times();
  EXPECT_GE(open.busy_seconds, 0.06);
  activity.End(/*is_write=*/true);
  const IoActivity::Times t = activity.times();
  EXPECT_GE(t.busy_seconds, open.busy_seconds);
  EXPECT_GE(t.duplex_seconds, 0.02);
  EXPECT_GE(t.read_busy_seconds, 0.04);
  EXPECT_GE(t.write_busy_seconds, 0.04);
  EXPECT_LT(t.duplex_seconds, t.read_busy_seconds);
  EXPECT_LT(t.duplex_seconds, t.write_busy_seconds);
  EXPECT_NEAR(t.read_busy_seconds + t.write_busy_seconds - t.duplex_seconds,
              t.busy_seconds, 1e-9);
  // Idle time adds nothing.
  pause();
  EXPECT_EQ(activity.times().busy_seconds, t.busy_seconds);
}

TEST(NvmeStoreCreateTest, BadOptions) {
  NvmeOptions options = SmallOptions(Backend::kThreads);
  options.block_size = 1000;
  EXPECT_TRUE(
      absl::IsInvalidArgument(NvmeStore::Create(options, "f", 4096).status()));
  options = SmallOptions(Backend::kThreads);
  options.thread_count = 0;
  EXPECT_TRUE(
      absl::IsInvalidArgument(NvmeStore::Create(options, "f", 4096).status()));
}

TEST(NvmeStoreCreateTest, OptionsFromConfig) {
  config::AioConfig aio;
  aio.block_size = 2 << 20;
  aio.queue_depth = 16;
  aio.thread_count = 2;
  aio.single_submit = true;
  aio.overlap_events = false;
  NvmeOptions options = NvmeOptionsFromConfig(aio, "/nvme");
  EXPECT_EQ(options.directory, "/nvme");
  EXPECT_EQ(options.block_size, 2 << 20);
  EXPECT_EQ(options.queue_depth, 16);
  EXPECT_EQ(options.thread_count, 2);
  EXPECT_TRUE(options.single_submit);
  EXPECT_FALSE(options.overlap_events);
}

// A process returning from main with a leaked store leaves no file: run a
// child that leaks one and exits normally.
TEST(NvmeStoreCreateTest, ExitRemovesLeakedFile) {
  const std::string path = ::testing::TempDir() + "/leaked";
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    NvmeOptions options = SmallOptions(Backend::kThreads);
    auto store = NvmeStore::Create(options, "leaked", 4096);
    if (!store.ok() || !Exists(path)) std::_Exit(2);
    store->release();  // leaked: never destroyed
    std::exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_FALSE(Exists(path));
}

}  // namespace
}  // namespace offload
}  // namespace ze
