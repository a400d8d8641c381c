// nvme_bench: offload::NvmeStore's bandwidth against the disk's own,
// measured in the same run: each direction alone (solo) and both at once
// (duplex: the bound of a training step's swap traffic, which reads ahead
// while it writes back; the disk shares its bandwidth between directions).
// Prints one JSON object per line:
//
//   {"bench":"baseline","directory":"/nvme","bytes":4294967296,
//    "direct":true,"write_GBps":2.1,"read_GBps":3.2,
//    "duplex":{"read_GBps":1.6,"write_GBps":1.4,"combined_GBps":3.0,
//              "read_bytes":...,"write_bytes":...,"window_seconds":...}}
//   {"bench":"nvme_store","backend":"io_uring","bytes":4294967296,
//    "block_size":1048576,"queue_depth":8,"thread_count":1,
//    "write_GBps":2.0,"read_GBps":3.1,"write_fraction":0.95,
//    "read_fraction":0.97}
//   {"bench":"nvme_store_duplex","backend":"io_uring","bytes":4294967296,
//    "chunk":67108864,"block_size":1048576,"queue_depth":8,
//    "thread_count":1,"read_GBps":1.5,"write_GBps":1.4,"combined_GBps":2.9,
//    "combined_fraction":0.97,"window_seconds":...,
//    "whole_combined_GBps":2.9,"whole_seconds":...,"busy_seconds":...,
//    "duplex_seconds":...}
//
// The baseline is bench/disk_baseline.h's dd-like loop (one thread per
// direction, synchronous 1 MiB O_DIRECT pwrite/pread): file A written then
// read (solo), then A read while B is written (duplex), both threads
// stopping when the first has moved --bytes, so its figures cover only time
// when both directions ran.
//
// The store runs on one file of 2 x --bytes: solo, region A written then
// read in --chunk tickets, all submitted before waiting. Duplex: region A
// (written before, untimed when solo did not run) read while region B is
// written, the two directions' --chunk tickets submitted alternately, all
// before waiting (the store's workers then keep both directions in flight,
// as a step's read-ahead and write-back do). Its figures, like the
// baseline's, cover the window until the first direction finished: the
// other direction's bytes are those of its tickets done by then (a ticket
// still in flight is not counted, so the figure errs low); "whole_..." are
// over both directions' whole transfer. busy_seconds and duplex_seconds are
// the store's IoActivity (time any / both directions had I/O in flight).
// combined_fraction = combined_GBps / the baseline's duplex combined_GBps.
// GB/s is 1e9 bytes per second, of wall time.
//
// Flags: --directory=/tmp --bytes=4GiB (suffixes KiB, MiB, GiB)
// --mode=both|solo|duplex --chunk=64MiB --block_size=1MiB --queue_depth=8
// --thread_count=1 --single_submit=0 --overlap_events=1
// --backend=auto|io_uring|threads
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/disk_baseline.h"
#include "nlohmann/json.hpp"
#include "offload/nvme_store.h"

namespace {

using Json = nlohmann::ordered_json;
using ze::offload::AlignedBuffer;
using ze::offload::IoTicket;
using ze::offload::NvmeOptions;
using ze::offload::NvmeStore;

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "nvme_bench: %s\n", message.c_str());
  std::exit(1);
}

template <typename T>
T OrDie(absl::StatusOr<T> value) {
  if (!value.ok()) Die(std::string(value.status().message()));
  return std::move(value).value();
}

void OrDie(const absl::Status& status) {
  if (!status.ok()) Die(std::string(status.message()));
}

void Print(const Json& line) {
  std::printf("%s\n", line.dump().c_str());
  std::fflush(stdout);
}

// One direction of the store's duplex run: its tickets, waited for in
// submission order, and when each was done (its and the earlier ones').
struct Direction {
  std::vector<IoTicket> tickets;
  std::vector<int64_t> sizes;
  std::vector<double> done_at;
  absl::Status status;
};

void WaitDirection(NvmeStore& store, Direction& direction) {
  for (const IoTicket& ticket : direction.tickets) {
    absl::Status status = store.Wait(ticket);
    if (direction.status.ok()) direction.status = status;
    direction.done_at.push_back(Now());
  }
}

// Bytes of `direction` done by `time`.
int64_t DoneBy(const Direction& direction, double time) {
  int64_t bytes = 0;
  for (size_t i = 0; i < direction.done_at.size(); ++i) {
    if (direction.done_at[i] <= time) bytes += direction.sizes[i];
  }
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  std::string directory = "/tmp";
  std::string mode = "both";
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
    } else if (name == "mode") {
      mode = value;
    } else if (name == "bytes") {
      bytes = OrDie(ze::bench::ParseByteSize(value));
    } else if (name == "chunk") {
      chunk = OrDie(ze::bench::ParseByteSize(value));
    } else if (name == "block_size") {
      options.block_size = OrDie(ze::bench::ParseByteSize(value));
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
  if (mode != "both" && mode != "solo" && mode != "duplex") {
    Die("--mode must be both, solo or duplex");
  }
  const bool solo = mode != "duplex";
  const bool duplex = mode != "solo";
  options.directory = directory;

  const ze::bench::DiskBaseline baseline =
      OrDie(ze::bench::MeasureDiskBaseline(directory, bytes, duplex));
  Json baseline_line;
  baseline_line["bench"] = "baseline";
  baseline_line.update(ze::bench::DiskBaselineJson(baseline));
  Print(baseline_line);

  // Region A [0, bytes) is the solo run's and the duplex run's read
  // source; region B [bytes, 2 bytes) the duplex run's write target.
  std::unique_ptr<NvmeStore> store = OrDie(NvmeStore::Create(
      options, "nvme_bench_store", duplex ? 2 * bytes : bytes));
  // One staging buffer per direction reused by every chunk: the data is
  // irrelevant to bandwidth, and it keeps host memory small at 4 GiB.
  AlignedBuffer write_buffer =
      OrDie(AlignedBuffer::Allocate(std::min(chunk, bytes)));
  AlignedBuffer read_buffer =
      OrDie(AlignedBuffer::Allocate(std::min(chunk, bytes)));
  std::memset(write_buffer.data(), 0xa5, write_buffer.size());
  auto submit = [&](bool is_write, int64_t base, int64_t offset) {
    const int64_t size = std::min(chunk, bytes - offset);
    return OrDie(is_write
                     ? store->Write(base + offset, write_buffer.data(), size)
                     : store->Read(base + offset, read_buffer.data(), size));
  };
  auto run = [&](bool is_write) {
    const double start = Now();
    for (int64_t offset = 0; offset < bytes; offset += chunk) {
      submit(is_write, 0, offset);
    }
    OrDie(store->WaitAll());
    return bytes / (Now() - start) / 1e9;
  };
  Json common;
  common["backend"] = store->backend_name();
  common["bytes"] = bytes;
  if (solo) {
    const double write_GBps = run(true);
    const double read_GBps = run(false);
    Json line;
    line["bench"] = "nvme_store";
    line.update(common);
    line["block_size"] = options.block_size;
    line["queue_depth"] = options.queue_depth;
    line["thread_count"] = options.thread_count;
    line["write_GBps"] = write_GBps;
    line["read_GBps"] = read_GBps;
    line["write_fraction"] = write_GBps / baseline.solo.write_GBps;
    line["read_fraction"] = read_GBps / baseline.solo.read_GBps;
    Print(line);
  }
  if (duplex) {
    if (!solo) run(true);  // region A's contents, untimed
    Direction reads, writes;
    const ze::offload::IoActivity::Times before = store->counters().busy;
    const double start = Now();
    for (int64_t offset = 0; offset < bytes; offset += chunk) {
      const int64_t size = std::min(chunk, bytes - offset);
      reads.tickets.push_back(submit(false, 0, offset));
      reads.sizes.push_back(size);
      writes.tickets.push_back(submit(true, bytes, offset));
      writes.sizes.push_back(size);
    }
    std::thread read_waiter([&] { WaitDirection(*store, reads); });
    WaitDirection(*store, writes);
    read_waiter.join();
    OrDie(reads.status);
    OrDie(writes.status);
    const ze::offload::IoActivity::Times after = store->counters().busy;
    const double read_end = reads.done_at.back();
    const double write_end = writes.done_at.back();
    // The window while both directions ran: until the first finished.
    const double first_end = std::min(read_end, write_end);
    const double window = first_end - start;
    const int64_t read_bytes = DoneBy(reads, first_end);
    const int64_t write_bytes = DoneBy(writes, first_end);
    const double whole = std::max(read_end, write_end) - start;
    const double combined = (read_bytes + write_bytes) / window / 1e9;
    Json line;
    line["bench"] = "nvme_store_duplex";
    line.update(common);
    line["chunk"] = chunk;
    line["block_size"] = options.block_size;
    line["queue_depth"] = options.queue_depth;
    line["thread_count"] = options.thread_count;
    line["read_GBps"] = read_bytes / window / 1e9;
    line["write_GBps"] = write_bytes / window / 1e9;
    line["combined_GBps"] = combined;
    line["combined_fraction"] = combined / baseline.duplex.combined_GBps;
    line["window_seconds"] = window;
    line["whole_combined_GBps"] = 2.0 * bytes / whole / 1e9;
    line["whole_seconds"] = whole;
    line["busy_seconds"] = after.busy_seconds - before.busy_seconds;
    line["duplex_seconds"] = after.duplex_seconds - before.duplex_seconds;
    Print(line);
  }
  return 0;
}
