// NvmeStore: one preallocated file on a fast local disk (DeepSpeed's
// nvme_path) that a rank swaps offloaded state to and from, with
// asynchronous direct I/O.
//
// Requests are split into `block_size` pieces and served by a pool of
// thread_count x queue_depth I/O threads (pread/pwrite on an O_DIRECT file
// descriptor: the caller's thread never blocks on the disk until Wait).
// O_DIRECT needs aligned memory, offsets and lengths (kAlignment); a
// filesystem that refuses O_DIRECT (tmpfs) gets buffered I/O instead,
// logged once and reported by direct_io().
//
// The file is created at Create (O_EXCL: two ranks or two runs never share
// one), preallocated so a full disk shows up at start, and removed by the
// destructor, and at process exit for a store that was never destroyed (a
// SIGKILL leaves it behind: nothing can run then).
//
// Thread-safe: Write, Read and Wait may be called from any thread.
#ifndef ZE_OFFLOAD_NVME_STORE_H_
#define ZE_OFFLOAD_NVME_STORE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config/config.h"

namespace ze {
namespace offload {

struct NvmeOptions {
  std::string directory;         // nvme_path: must exist and be writable
  int64_t block_size = 1 << 20;  // bytes per request (multiple of 4096)
  int queue_depth = 8;           // requests in flight per thread
  int thread_count = 1;          // "submitting threads" (aio.thread_count)
  // Tests only: inject failures, counting requests from 0 after Create;
  // -1 = never.
  int64_t fail_write_request = -1;  // that write request fails with EIO
  int64_t short_read_request = -1;  // that read returns half its bytes
  int64_t pretend_free_bytes = -1;  // the free-space check sees this
};

// DeepSpeed's "aio" block and the directory. aio.single_submit and
// aio.overlap_events have no effect on this thread-based backend (every
// request is submitted on its own and completions never block submission).
NvmeOptions NvmeOptionsFromConfig(const config::AioConfig& aio,
                                  const std::string& directory);

// An owning, kAlignment-aligned host buffer for I/O staging. Movable.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  static absl::StatusOr<AlignedBuffer> Allocate(int64_t bytes);
  char* data() const { return data_.get(); }
  int64_t size() const { return size_; }

 private:
  struct Free {
    void operator()(char* data) const;
  };
  std::unique_ptr<char, Free> data_;
  int64_t size_ = 0;
};

// Names one Write or Read until Wait.
using IoTicket = int64_t;

class NvmeStore {
 public:
  static constexpr int64_t kAlignment = 4096;

  // Creates `directory/file_name` preallocated to `bytes` (rounded up to
  // kAlignment) after checking the free space. Errors name the path and
  // the operation: FailedPrecondition for a directory that is missing, not
  // a directory, or where the file cannot be created; ResourceExhausted
  // for too little space ("needs N bytes, M free") or a failed
  // preallocation; InvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<NvmeStore>> Create(
      const NvmeOptions& options, const std::string& file_name, int64_t bytes);
  // Waits for outstanding requests, closes and removes the file.
  ~NvmeStore();
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  // Queue `bytes` from `buffer` to the file at `offset` (Write) or the
  // reverse (Read). `buffer` and `offset` must be kAlignment-aligned and
  // [offset, offset + bytes) inside the file; `bytes` is rounded up to
  // kAlignment, so the buffer must extend to the rounded size. The buffer
  // must stay alive and untouched until Wait(ticket). InvalidArgument for
  // a misaligned or out-of-range request (nothing queued).
  absl::StatusOr<IoTicket> Write(int64_t offset, const void* buffer,
                                 int64_t bytes);
  absl::StatusOr<IoTicket> Read(int64_t offset, void* buffer, int64_t bytes);
  // Blocks until every piece of `ticket` is done. The first failure, naming
  // the path, the operation, the offset, the bytes and the OS error
  // (DataLoss for a short read, Internal for an I/O error). Each ticket is
  // waited for once; in any order.
  absl::Status Wait(IoTicket ticket);

  const std::string& path() const { return path_; }
  int64_t size_bytes() const { return size_; }
  bool direct_io() const { return direct_; }
  const char* backend_name() const { return "threads"; }
  struct Counters {
    int64_t bytes_written = 0;
    int64_t bytes_read = 0;
    double write_seconds = 0;  // summed over tickets, submit to last piece
    double read_seconds = 0;
  };
  Counters counters() const;

 private:
  struct Ticket {
    bool write = false;
    int64_t offset = 0;
    int64_t bytes = 0;
    int remaining = 0;
    absl::Status status;
    double start = 0;
  };
  struct Piece {
    IoTicket ticket;
    bool write;
    int64_t offset;
    char* buffer;
    int64_t bytes;
    int64_t request;  // index among requests of its kind, for injection
  };
  NvmeStore(const NvmeOptions& options, std::string path, int fd, bool direct,
            int64_t size);
  absl::StatusOr<IoTicket> Submit(bool write, int64_t offset, char* buffer,
                                  int64_t bytes);
  void IoLoop();
  absl::Status Run(const Piece& piece);

  NvmeOptions options_;
  std::string path_;
  int fd_;
  bool direct_;
  int64_t size_;
  std::vector<std::thread> threads_;
  mutable std::mutex mutex_;
  std::condition_variable work_;
  std::condition_variable done_;
  // Guarded by mutex_.
  std::deque<Piece> queue_;
  std::map<IoTicket, Ticket> tickets_;
  IoTicket next_ticket_ = 1;
  int64_t write_requests_ = 0;
  int64_t read_requests_ = 0;
  bool stopping_ = false;
  Counters counters_;
};

}  // namespace offload
}  // namespace ze

#endif  // ZE_OFFLOAD_NVME_STORE_H_
