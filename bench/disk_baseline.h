// The disk's own bandwidth, dd-like, for the benchmarks that compare the
// NVMe tier against it (nvme_bench, train_bench --disk_baseline=1): the one
// implementation of the loop, so both programs measure the same thing.
//
// The loop is dd's with direct I/O (`dd bs=1M oflag=direct` /
// `iflag=direct`): one thread per direction, synchronous 1 MiB pwrite or
// pread, one request in flight, through a file opened O_DIRECT (buffered
// when the filesystem refuses O_DIRECT: then `direct` is false and the
// figures measure the page cache). Dropping the page cache is not possible
// in a container; O_DIRECT bypasses it, so reads come from the disk. GB/s is
// 1e9 bytes per second of wall time.
#ifndef ZE_BENCH_DISK_BASELINE_H_
#define ZE_BENCH_DISK_BASELINE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace ze {
namespace bench {

// Solo: file A written, then read back (each direction alone).
struct SoloBaseline {
  double write_GBps = 0;  // the write includes the closing fsync
  double read_GBps = 0;
};

// Both directions at once: file A read while file B is written, each by
// its own thread, started together. Each stops when the first of them has
// moved its `bytes` (the other after its block in flight), so every figure
// is over a window where both directions ran: no solo tail inflates the
// combined figure. window_seconds is from the start to the later stop.
struct DuplexBaseline {
  int64_t read_bytes = 0;   // moved in the window
  int64_t write_bytes = 0;  // moved in the window
  double window_seconds = 0;
  double read_GBps = 0;      // read_bytes / window
  double write_GBps = 0;     // write_bytes / window
  double combined_GBps = 0;  // (read_bytes + write_bytes) / window: the
                             // disk's bound for traffic in both directions
};

struct DiskBaseline {
  std::string directory;
  int64_t bytes = 0;  // per file
  bool direct = true;
  SoloBaseline solo;
  DuplexBaseline duplex;
};

// Runs the solo write and read of file A (`bytes`, a positive multiple of
// 1 MiB), then, with `duplex`, reads A while writing B, in `directory`; the
// files (nvme_bench_baseline_{a,b}) are removed on return, also on error.
// Needs 2 x bytes free with `duplex`. Errors name the file and the call
// (open, pwrite, pread, fsync) with strerror: FailedPrecondition for a
// directory that cannot be written, Internal otherwise; InvalidArgument for
// a bad size.
absl::StatusOr<DiskBaseline> MeasureDiskBaseline(const std::string& directory,
                                                 int64_t bytes, bool duplex);

// {"directory","bytes","direct","write_GBps","read_GBps"} and, when the
// duplex run happened (window_seconds > 0), "duplex": {"read_GBps",
// "write_GBps","combined_GBps","read_bytes","write_bytes","window_seconds"}.
nlohmann::ordered_json DiskBaselineJson(const DiskBaseline& baseline);

// "4GiB", "64MiB", "512KiB", "4096" (suffixes KiB/K, MiB/M, GiB/G): bytes;
// InvalidArgument for anything else or a negative size.
absl::StatusOr<int64_t> ParseByteSize(const std::string& text);

}  // namespace bench
}  // namespace ze

#endif  // ZE_BENCH_DISK_BASELINE_H_
