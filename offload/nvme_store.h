// NvmeStore: a file-backed block store for one rank's offloaded state
// (ZeRO-Infinity's NVMe tier), with asynchronous direct I/O. A layer below
// zero/: it uses core/ and config/ only.
//
// Backends: io_uring (liburing, linked statically), thread_count rings of
// queue_depth entries, each served by one thread; where io_uring is refused
// (containers: io_uring_queue_init gives -EPERM/-ENOSYS) Backend::kAuto
// falls back, with a one-line log, to "threads": thread_count threads doing
// pread/pwrite.
#ifndef ZE_OFFLOAD_NVME_STORE_H_
#define ZE_OFFLOAD_NVME_STORE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config/config.h"

struct io_uring;

namespace ze {
namespace offload {

// When a rank's swap I/O was in flight: the union of the intervals from a
// ticket's submission to its last request's completion, per direction and
// for both at once, over every store sharing it (the optimizer state's and
// the weights' files share one, so I/O of the two files at the same time is
// counted once). Summed per-ticket seconds (NvmeStore::Counters'
// write_seconds, read_seconds) count overlapping tickets twice; these do
// not, so bytes / busy_seconds is the rate the disk was driven at while it
// had work. A queued request counts as in flight: the disk has work. Time
// is the steady clock's. Thread-safe.
class IoActivity {
 public:
  struct Times {
    double busy_seconds = 0;        // a read or a write in flight
    double read_busy_seconds = 0;   // a read in flight
    double write_busy_seconds = 0;  // a write in flight
    double duplex_seconds = 0;      // a read and a write in flight
  };
  // A ticket of that direction started / finished.
  void Begin(bool is_write);
  void End(bool is_write);
  // Up to now (an interval still open counts until now).
  Times times() const;

 private:
  // Adds the time since the last change, by what was in flight, to `into`.
  void Accumulate(double now, Times& into) const;

  mutable std::mutex mutex_;
  // Guarded by mutex_.
  int64_t reads_ = 0;
  int64_t writes_ = 0;
  double since_ = 0;  // the last Begin or End
  Times times_;
};

// From DeepSpeed's "aio" block (config::AioConfig) plus the directory.
struct NvmeOptions {
  enum class Backend { kAuto, kIoUring, kThreads };
  std::string directory;         // nvme_path; must exist and be writable
  int64_t block_size = 1 << 20;  // bytes per I/O request (multiple of 4096)
  int queue_depth = 8;           // requests in flight (io_uring only)
  int thread_count = 1;        // submitting threads (threads backend: workers)
  bool single_submit = false;  // io_uring only: submit one by one
  bool overlap_events = true;  // io_uring only: submit while reaping
  Backend backend = Backend::kAuto;
  // Where the store records its in-flight intervals; stores given the same
  // one are timed as one disk's traffic. Null: Create makes the store its
  // own.
  std::shared_ptr<IoActivity> activity;
  // Tests only: inject failures (no environment variables). Count requests
  // (of block_size or less) from 0 after Create, writes and reads
  // separately; -1 = never.
  int64_t fail_write_request = -1;  // that write request fails with EIO
  int64_t short_read_request = -1;  // that read returns fewer bytes
  int64_t pretend_free_bytes = -1;  // statvfs answer override
};

// Copies the aio block's settings; `directory` is the offload nvme_path.
NvmeOptions NvmeOptionsFromConfig(const config::AioConfig& aio,
                                  const std::string& directory);

// Names one asynchronous Write or Read; valid until passed to Wait (or
// WaitAll), once.
struct IoTicket {
  int64_t id = -1;
};

class NvmeStore {
 public:
  static constexpr int64_t kAlignment = 4096;
  // `bytes` rounded up to a multiple of kAlignment (what a request moves).
  static int64_t AlignedSize(int64_t bytes) {
    return (bytes + kAlignment - 1) / kAlignment * kAlignment;
  }

  // Creates (O_CREAT|O_EXCL) the file `directory/file_name`, preallocated
  // (posix_fallocate) to `bytes` rounded up to kAlignment, after checking
  // free space with statvfs. Opens it O_DIRECT; a filesystem refusing
  // O_DIRECT (EINVAL) gets buffered I/O, logged in one line to stderr and
  // reported by is_direct()/backend_name(). Errors, each naming the path
  // and the operation: bad options (InvalidArgument); directory missing, not
  // a directory or not writable (FailedPrecondition); too little space
  // (ResourceExhausted "needs N bytes, M free"); other open/fallocate
  // failures (Internal, with strerror).
  //
  // The store holds an exclusive flock on its file while it lives. A file
  // of that name whose lock a live process holds (another job on the same
  // nvme_path, or another store of this process) is never touched:
  // FailedPrecondition naming it. One that nobody holds is a leftover of a
  // killed process (SIGKILL: nothing could remove it): it is taken over,
  // with a warning naming it and its size.
  //
  // The file is removed by the destructor; and, through core/file_cleanup.h
  // (where the store registers it), at exit if the store is never
  // destroyed, and on SIGINT/SIGTERM/SIGHUP once the program (the engine's
  // Initialize) has installed the removal handlers.
  static absl::StatusOr<std::unique_ptr<NvmeStore>> Create(
      const NvmeOptions& options, const std::string& file_name, int64_t bytes);

  // Waits for outstanding I/O, closes and removes the file.
  ~NvmeStore();
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  // Asynchronous whole-range I/O split into block_size requests. `buffer`
  // must be kAlignment-aligned and `offset` a multiple of kAlignment;
  // `bytes` >= 0 is any size, but the I/O covers `bytes` rounded up to
  // kAlignment: the caller's buffer must extend to that aligned size (Write
  // writes the padding bytes as they are; Read overwrites them), and the
  // aligned range must lie in the file. The buffer must stay alive and
  // untouched until Wait on the returned ticket. Argument errors come back
  // at once (InvalidArgument); I/O errors at Wait: Internal (write/read
  // failure) or DataLoss (short read), naming path, operation
  // ("write"/"read"), offset, bytes and the errno text. A failed request
  // does not affect later ones. Thread-safe.
  absl::StatusOr<IoTicket> Write(int64_t offset, const void* buffer,
                                 int64_t bytes);
  absl::StatusOr<IoTicket> Read(int64_t offset, void* buffer, int64_t bytes);
  // Blocks until every request of `ticket` finished; returns the first
  // error of them. An unknown or already waited ticket: InvalidArgument.
  absl::Status Wait(IoTicket ticket);
  // Waits for every ticket not yet waited for; returns the first error.
  absl::Status WaitAll();

  const std::string& path() const { return path_; }
  int64_t size_bytes() const { return size_bytes_; }
  // "io_uring" or "threads", with " (buffered)" when O_DIRECT was refused.
  const char* backend_name() const;
  bool is_direct() const { return direct_; }

  // Bytes and seconds of finished I/O (for bandwidth reports); seconds are
  // summed per ticket from submission to its last request's completion.
  // `busy` is the store's IoActivity's (shared with other stores when the
  // options named a shared one: then it covers their I/O too).
  struct Counters {
    int64_t bytes_written = 0;
    int64_t bytes_read = 0;
    double write_seconds = 0;
    double read_seconds = 0;
    IoActivity::Times busy;
  };
  Counters counters() const;
  const std::shared_ptr<IoActivity>& activity() const { return activity_; }

 private:
  struct Ticket;
  struct Request {
    bool is_write;
    int64_t offset;
    char* buffer;
    int64_t bytes;  // aligned length of this request
    int64_t index;  // request number among its kind, for injection
    std::shared_ptr<Ticket> ticket;
  };

  NvmeStore(const NvmeOptions& options, std::string path, int fd,
            int64_t size_bytes, bool direct,
            std::vector<std::unique_ptr<io_uring>> rings);
  absl::StatusOr<IoTicket> Submit(bool is_write, int64_t offset, char* buffer,
                                  int64_t bytes);
  void WorkerLoop();
  // Whether a request waits; the next one, alternating directions when both
  // have some (callers hold mutex_ and check Pending first).
  bool Pending() const { return !queues_[0].empty() || !queues_[1].empty(); }
  Request TakeNext();
  // io_uring backend: one thread per ring submits up to queue_depth
  // requests and reaps their completions.
  void IoUringLoop(io_uring* ring);
  // Threads backend: pread/pwrite the whole request (ExecuteFrom: from
  // byte `done` on, also used to finish a partial io_uring transfer).
  void Execute(const Request& request);
  void ExecuteFrom(const Request& request, int64_t done);
  // Records the request's outcome in its ticket.
  void Finish(const Request& request, int64_t done, int error);

  const NvmeOptions options_;
  const std::string path_;
  const int fd_;
  const int64_t size_bytes_;
  const bool direct_;
  // Empty: the threads backend runs.
  std::vector<std::unique_ptr<io_uring>> rings_;
  const std::shared_ptr<IoActivity> activity_;

  mutable std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable ticket_done_;
  // Guarded by mutex_. Requests waiting for a worker, per direction
  // (0 reads, 1 writes), each in submission order. Workers take from the
  // two in turn, so reads and writes submitted at once are in flight at
  // once (the disk's duplex bandwidth) rather than one direction's backlog
  // holding back the other (a write-back ahead of a read-ahead). There is
  // no order between a read and a write: callers never have both in flight
  // on one range.
  std::deque<Request> queues_[2];
  int next_direction_ = 0;
  std::unordered_map<int64_t, std::shared_ptr<Ticket>> tickets_;
  int64_t next_ticket_ = 0;
  int64_t write_requests_ = 0;
  int64_t read_requests_ = 0;
  bool stopping_ = false;
  Counters counters_;

  std::vector<std::thread> workers_;
};

// An aligned host buffer (posix_memalign, NvmeStore::kAlignment) for I/O
// staging; size() is the requested size rounded up to kAlignment. The
// caller may pin it. Owning, movable; the memory is zero-filled.
class AlignedBuffer {
 public:
  // bytes >= 0; ResourceExhausted if the allocation fails.
  static absl::StatusOr<AlignedBuffer> Allocate(int64_t bytes);
  AlignedBuffer() = default;
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();

  char* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  char* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace offload
}  // namespace ze

#endif  // ZE_OFFLOAD_NVME_STORE_H_
