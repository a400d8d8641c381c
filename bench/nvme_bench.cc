// nvme_bench: offload::NvmeStore's sequential write and read bandwidth
// against the disk's own, measured in the same run. Prints one JSON object
// per line:
//
//   {"bench":"baseline","directory":"/nvme","bytes":4294967296,
//    "direct":true,"write_GBps":2.1,"read_GBps":3.2}
//   {"bench":"nvme_store","backend":"io_uring","bytes":4294967296,
//    "block_size":1048576,"queue_depth":8,"thread_count":1,
//    "write_GBps":2.0,"read_GBps":3.1,"write_fraction":0.95,
//    "read_fraction":0.97}
//
// The baseline is dd-like: one thread, synchronous 1 MiB pwrite then pread
// of the whole size through an O_DIRECT file (buffered if the filesystem
// refuses O_DIRECT; then "direct":false and the numbers measure the page
// cache). Dropping the page cache is not possible in a container; O_DIRECT
// bypasses it, so reads come from the disk. The store run writes then reads
// the same size in --chunk pieces, all submitted before waiting. GB/s is
// 1e9 bytes per second, of wall time.
//
// Flags: --directory=/tmp --bytes=4GiB (suffixes KiB, MiB, GiB)
// --chunk=64MiB --block_size=1MiB --queue_depth=8 --thread_count=1
// --single_submit=0 --overlap_events=1 --backend=auto|io_uring|threads
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "offload/nvme_store.h"

namespace {

using ze::offload::AlignedBuffer;
using ze::offload::NvmeOptions;
using ze::offload::NvmeStore;

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t ParseBytes(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  const std::string suffix = end;
  double scale = 1;
  if (suffix == "KiB" || suffix == "K") scale = 1024.0;
  if (suffix == "MiB" || suffix == "M") scale = 1024.0 * 1024;
  if (suffix == "GiB" || suffix == "G") scale = 1024.0 * 1024 * 1024;
  return static_cast<int64_t>(value * scale);
}

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "nvme_bench: %s\n", message.c_str());
  std::exit(1);
}

struct Baseline {
  bool direct = true;
  double write_GBps = 0;
  double read_GBps = 0;
};

Baseline RunBaseline(const std::string& directory, int64_t bytes) {
  constexpr int64_t kBlock = 1 << 20;
  const std::string path = directory + "/nvme_bench_baseline";
  Baseline result;
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
  if (fd < 0 && errno == EINVAL) {
    result.direct = false;
    fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  }
  if (fd < 0) Die("open " + path + ": " + std::strerror(errno));
  auto buffer = AlignedBuffer::Allocate(kBlock);
  if (!buffer.ok()) Die(std::string(buffer.status().message()));
  std::memset(buffer->data(), 0x5a, kBlock);
  double start = Now();
  for (int64_t offset = 0; offset < bytes; offset += kBlock) {
    if (pwrite(fd, buffer->data(), kBlock, offset) != kBlock) {
      Die("pwrite " + path + ": " + std::strerror(errno));
    }
  }
  if (fsync(fd) != 0) Die("fsync " + path + ": " + std::strerror(errno));
  result.write_GBps = bytes / (Now() - start) / 1e9;
  start = Now();
  for (int64_t offset = 0; offset < bytes; offset += kBlock) {
    if (pread(fd, buffer->data(), kBlock, offset) != kBlock) {
      Die("pread " + path + ": " + std::strerror(errno));
    }
  }
  result.read_GBps = bytes / (Now() - start) / 1e9;
  close(fd);
  unlink(path.c_str());
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  std::string directory = "/tmp";
  int64_t bytes = 4LL << 30;
  int64_t chunk = 64LL << 20;
  NvmeOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
      Die("bad flag " + arg + " (want --name=value)");
    }
    const std::string name = arg.substr(2, eq - 2);
    const std::string value = arg.substr(eq + 1);
    if (name == "directory") {
      directory = value;
    } else if (name == "bytes") {
      bytes = ParseBytes(value);
    } else if (name == "chunk") {
      chunk = ParseBytes(value);
    } else if (name == "block_size") {
      options.block_size = ParseBytes(value);
    } else if (name == "queue_depth") {
      options.queue_depth = std::atoi(value.c_str());
    } else if (name == "thread_count") {
      options.thread_count = std::atoi(value.c_str());
    } else if (name == "single_submit") {
      options.single_submit = value == "1" || value == "true";
    } else if (name == "backend") {
      if (value == "auto") {
        options.backend = NvmeOptions::Backend::kAuto;
      } else if (value == "io_uring") {
        options.backend = NvmeOptions::Backend::kIoUring;
      } else if (value == "threads") {
        options.backend = NvmeOptions::Backend::kThreads;
      } else {
        Die("--backend must be auto, io_uring or threads");
      }
    } else if (name == "overlap_events") {
      options.overlap_events = value == "1" || value == "true";
    } else {
      Die("unknown flag " + arg);
    }
  }
  constexpr int64_t kMiB = 1 << 20;
  if (bytes <= 0 || bytes % kMiB != 0 || chunk <= 0 || chunk % kMiB != 0) {
    Die("--bytes and --chunk must be positive multiples of 1 MiB");
  }
  options.directory = directory;

  const Baseline baseline = RunBaseline(directory, bytes);
  std::printf(
      "{\"bench\":\"baseline\",\"directory\":\"%s\",\"bytes\":%lld,"
      "\"direct\":%s,\"write_GBps\":%.3f,\"read_GBps\":%.3f}\n",
      directory.c_str(), static_cast<long long>(bytes),
      baseline.direct ? "true" : "false", baseline.write_GBps,
      baseline.read_GBps);
  std::fflush(stdout);

  auto store = NvmeStore::Create(options, "nvme_bench_store", bytes);
  if (!store.ok()) Die(std::string(store.status().message()));
  auto buffer = AlignedBuffer::Allocate(std::min(chunk, bytes));
  if (!buffer.ok()) Die(std::string(buffer.status().message()));
  std::memset(buffer->data(), 0xa5, buffer->size());
  // One staging buffer reused by every chunk: the data is irrelevant to
  // bandwidth, and it keeps host memory small at 4 GiB.
  auto run = [&](bool is_write) {
    const double start = Now();
    std::vector<ze::offload::IoTicket> tickets;
    for (int64_t offset = 0; offset < bytes; offset += chunk) {
      const int64_t size = std::min(chunk, bytes - offset);
      auto ticket = is_write ? (*store)->Write(offset, buffer->data(), size)
                             : (*store)->Read(offset, buffer->data(), size);
      if (!ticket.ok()) Die(std::string(ticket.status().message()));
    }
    const absl::Status status = (*store)->WaitAll();
    if (!status.ok()) Die(std::string(status.message()));
    return bytes / (Now() - start) / 1e9;
  };
  const double write_GBps = run(true);
  const double read_GBps = run(false);
  std::printf(
      "{\"bench\":\"nvme_store\",\"backend\":\"%s\",\"bytes\":%lld,"
      "\"block_size\":%lld,\"queue_depth\":%d,\"thread_count\":%d,"
      "\"write_GBps\":%.3f,\"read_GBps\":%.3f,\"write_fraction\":%.3f,"
      "\"read_fraction\":%.3f}\n",
      (*store)->backend_name(), static_cast<long long>(bytes),
      static_cast<long long>(options.block_size), options.queue_depth,
      options.thread_count, write_GBps, read_GBps,
      write_GBps / baseline.write_GBps, read_GBps / baseline.read_GBps);
  return 0;
}
