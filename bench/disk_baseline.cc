#include "bench/disk_baseline.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "offload/nvme_store.h"

namespace ze {
namespace bench {
namespace {

constexpr int64_t kBlock = int64_t{1} << 20;  // dd's bs=1M

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::Status IoError(const std::string& call, const std::string& path,
                     int error) {
  const std::string message = absl::StrCat("disk baseline: ", call, " ", path,
                                           ": ", std::strerror(error));
  if (error == EACCES || error == EPERM || error == EROFS || error == ENOENT) {
    return absl::FailedPreconditionError(message);
  }
  return absl::InternalError(message);
}

// The files of one measurement, closed and removed however it ends.
struct BaselineFiles {
  std::string paths[2];
  int fds[2] = {-1, -1};
  ~BaselineFiles() {
    for (int i = 0; i < 2; ++i) {
      if (fds[i] >= 0) {
        close(fds[i]);
        unlink(paths[i].c_str());
      }
    }
  }
};

// Opens `path` fresh (created, truncated, as dd's of= does) O_DIRECT, or
// buffered where the filesystem refuses O_DIRECT (clears *direct).
absl::StatusOr<int> OpenFresh(const std::string& path, bool* direct) {
  int fd = -1;
  if (*direct) {
    fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC,
              0600);
    if (fd < 0 && errno == EINVAL) *direct = false;
  }
  if (!*direct) {
    fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  }
  if (fd < 0) return IoError("open", path, errno);
  return fd;
}

// dd's loop: 1 MiB blocks from offset 0, one synchronous call at a time,
// until `bytes` moved or `stop` is set (checked before each block). A write
// loop that finishes fsyncs (in its time, as dd's conv=fsync). Sets *moved.
absl::Status DdLoop(int fd, const std::string& path, bool is_write,
                    int64_t bytes, char* buffer, const std::atomic<bool>& stop,
                    int64_t* moved) {
  int64_t offset = 0;
  for (; offset < bytes && !stop.load(std::memory_order_relaxed);
       offset += kBlock) {
    const ssize_t done = is_write ? pwrite(fd, buffer, kBlock, offset)
                                  : pread(fd, buffer, kBlock, offset);
    if (done != kBlock) {
      *moved = offset;
      if (done >= 0) {
        return absl::InternalError(absl::StrCat(
            "disk baseline: ", is_write ? "pwrite " : "pread ", path, " at ",
            offset, ": ", done, " of ", kBlock, " bytes"));
      }
      return IoError(is_write ? "pwrite" : "pread", path, errno);
    }
  }
  *moved = offset;
  if (is_write && fsync(fd) != 0) return IoError("fsync", path, errno);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> ParseByteSize(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  const std::string suffix = end == nullptr ? "" : end;
  double scale = 0;
  if (suffix.empty()) scale = 1;
  if (suffix == "KiB" || suffix == "K") scale = 1024.0;
  if (suffix == "MiB" || suffix == "M") scale = 1024.0 * 1024;
  if (suffix == "GiB" || suffix == "G") scale = 1024.0 * 1024 * 1024;
  if (text.empty() || end == text.c_str() || scale == 0 || !(value >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", text, "' is not a size (a number with KiB, MiB or GiB)"));
  }
  return static_cast<int64_t>(value * scale);
}

absl::StatusOr<DiskBaseline> MeasureDiskBaseline(const std::string& directory,
                                                 int64_t bytes, bool duplex) {
  if (bytes <= 0 || bytes % kBlock != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "disk baseline: size ", bytes, " is not a positive multiple of 1 MiB"));
  }
  DiskBaseline result;
  result.directory = directory;
  result.bytes = bytes;
  BaselineFiles files;
  files.paths[0] = directory + "/nvme_bench_baseline_a";
  files.paths[1] = directory + "/nvme_bench_baseline_b";
  absl::StatusOr<offload::AlignedBuffer> write_buffer =
      offload::AlignedBuffer::Allocate(kBlock);
  if (!write_buffer.ok()) return write_buffer.status();
  absl::StatusOr<offload::AlignedBuffer> read_buffer =
      offload::AlignedBuffer::Allocate(kBlock);
  if (!read_buffer.ok()) return read_buffer.status();
  std::memset(write_buffer->data(), 0x5a, kBlock);

  absl::StatusOr<int> a = OpenFresh(files.paths[0], &result.direct);
  if (!a.ok()) return a.status();
  files.fds[0] = *a;
  const std::atomic<bool> never(false);
  int64_t moved = 0;
  double start = Now();
  if (absl::Status s = DdLoop(*a, files.paths[0], true, bytes,
                              write_buffer->data(), never, &moved);
      !s.ok()) {
    return s;
  }
  result.solo.write_GBps = bytes / (Now() - start) / 1e9;
  start = Now();
  if (absl::Status s = DdLoop(*a, files.paths[0], false, bytes,
                              read_buffer->data(), never, &moved);
      !s.ok()) {
    return s;
  }
  result.solo.read_GBps = bytes / (Now() - start) / 1e9;
  if (!duplex) return result;

  // B opened as A was (a filesystem that refused O_DIRECT for A does so
  // for B).
  absl::StatusOr<int> b = OpenFresh(files.paths[1], &result.direct);
  if (!b.ok()) return b.status();
  files.fds[1] = *b;
  // Both threads wait for `go` so neither runs alone at the start; the
  // first to finish its bytes sets `stop`, ending the other's loop.
  std::atomic<bool> go(false);
  std::atomic<bool> stop(false);
  int64_t read_moved = 0;
  int64_t write_moved = 0;
  double read_end = 0;
  double write_end = 0;
  absl::Status read_status;
  absl::Status write_status;
  auto direction = [&](bool is_write) {
    while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
    absl::Status status =
        DdLoop(is_write ? *b : *a, files.paths[is_write ? 1 : 0], is_write,
               bytes, is_write ? write_buffer->data() : read_buffer->data(),
               stop, is_write ? &write_moved : &read_moved);
    (is_write ? write_end : read_end) = Now();
    (is_write ? write_status : read_status) = status;
    stop.store(true, std::memory_order_relaxed);
  };
  std::thread reader(direction, false);
  std::thread writer(direction, true);
  start = Now();
  go.store(true, std::memory_order_release);
  reader.join();
  writer.join();
  if (!read_status.ok()) return read_status;
  if (!write_status.ok()) return write_status;
  DuplexBaseline& d = result.duplex;
  d.read_bytes = read_moved;
  d.write_bytes = write_moved;
  d.window_seconds = std::max(read_end, write_end) - start;
  d.read_GBps = read_moved / d.window_seconds / 1e9;
  d.write_GBps = write_moved / d.window_seconds / 1e9;
  d.combined_GBps = (read_moved + write_moved) / d.window_seconds / 1e9;
  return result;
}

nlohmann::ordered_json DiskBaselineJson(const DiskBaseline& baseline) {
  nlohmann::ordered_json json;
  json["directory"] = baseline.directory;
  json["bytes"] = baseline.bytes;
  json["direct"] = baseline.direct;
  json["write_GBps"] = baseline.solo.write_GBps;
  json["read_GBps"] = baseline.solo.read_GBps;
  if (baseline.duplex.window_seconds > 0) {
    const DuplexBaseline& d = baseline.duplex;
    json["duplex"] = {{"read_GBps", d.read_GBps},
                      {"write_GBps", d.write_GBps},
                      {"combined_GBps", d.combined_GBps},
                      {"read_bytes", d.read_bytes},
                      {"write_bytes", d.write_bytes},
                      {"window_seconds", d.window_seconds}};
  }
  return json;
}

}  // namespace bench
}  // namespace ze
