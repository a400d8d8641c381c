#include "offload/nvme_store.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/file_cleanup.h"
#include "core/logging.h"
#include "core/status.h"

namespace ze {
namespace offload {
namespace {

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The file of a store: open, locked (flock, exclusive) for as long as the
// store lives, so that another process can tell a file in use from one left
// behind by a killed process (whose lock the kernel released).
struct OpenedFile {
  int fd = -1;
  bool direct = true;
  int64_t stale_bytes = -1;  // >= 0: a leftover of that size was taken over
};

// Opens `path` O_DIRECT where the filesystem allows it (else buffered,
// logged): creates it (O_EXCL), or, when it exists and no live process
// holds its lock, takes the leftover over (truncated to 0). A file whose
// lock is held is not touched: FailedPrecondition naming it.
absl::StatusOr<OpenedFile> OpenAndLock(const std::string& path) {
  OpenedFile opened;
  // A few rounds: between our open and flock another process may remove
  // the file (its owner ending) and a third create a new one.
  for (int attempt = 0; attempt < 8; ++attempt) {
    // O_DIRECT first; a filesystem that refuses it (EINVAL) gets buffered
    // I/O, said once.
    auto open_file = [&](int flags) {
      int fd = open(path.c_str(), flags | (opened.direct ? O_DIRECT : 0), 0600);
      if (fd < 0 && errno == EINVAL && opened.direct) {
        std::fprintf(stderr,
                     "NvmeStore %s: O_DIRECT refused by the filesystem; "
                     "using buffered I/O\n",
                     path.c_str());
        opened.direct = false;
        fd = open(path.c_str(), flags, 0600);
      }
      return fd;
    };
    bool created = true;
    int fd = open_file(O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC);
    if (fd < 0 && errno == EEXIST) {
      created = false;
      fd = open_file(O_RDWR | O_CLOEXEC);
      if (fd < 0 && errno == ENOENT) continue;  // removed meanwhile
    }
    if (fd < 0) {
      const int error = errno;
      const std::string message = absl::StrCat(
          "NvmeStore ", path, ": open (create) failed: ", std::strerror(error));
      if (error == EACCES || error == EPERM || error == EROFS ||
          error == ENOENT) {
        return absl::FailedPreconditionError(
            absl::StrCat(message, " (directory not writable)"));
      }
      return absl::InternalError(message);
    }
    const bool locked = flock(fd, LOCK_EX | LOCK_NB) == 0;
    const int lock_error = locked ? 0 : errno;
    if (!locked && created && lock_error != EWOULDBLOCK) {
      // A filesystem without locks: the file is ours (O_EXCL), but a later
      // job could not tell it in use.
      ZE_LOG(WARNING) << "NvmeStore " << path << ": flock failed ("
                      << std::strerror(lock_error)
                      << "); the file is used without a lock";
    } else if (!locked) {
      const int error = lock_error;
      close(fd);
      if (error == EWOULDBLOCK) {
        return absl::FailedPreconditionError(absl::StrCat(
            "NvmeStore ", path,
            ": the swap file is in use by another live process (it holds "
            "the file's lock); it was not touched. Two jobs cannot share an "
            "nvme_path: give each job its own directory, or end the other "
            "job"));
      }
      return absl::FailedPreconditionError(
          absl::StrCat("NvmeStore ", path,
                       ": the file exists and whether a live process "
                       "uses it cannot be checked (flock failed: ",
                       std::strerror(error), "); remove it if no job uses it"));
    }
    // Locked; but is it still the file at `path`? (Its owner may have
    // removed it between our open and flock.)
    struct stat held, named;
    if (fstat(fd, &held) != 0 || stat(path.c_str(), &named) != 0 ||
        held.st_dev != named.st_dev || held.st_ino != named.st_ino) {
      close(fd);
      continue;
    }
    if (!created) {
      opened.stale_bytes = static_cast<int64_t>(held.st_size);
      if (ftruncate(fd, 0) != 0) {
        const int error = errno;
        close(fd);
        return absl::InternalError(absl::StrCat("NvmeStore ", path,
                                                ": truncating the stale file "
                                                "failed: ",
                                                std::strerror(error)));
      }
    }
    opened.fd = fd;
    return opened;
  }
  return absl::UnavailableError(absl::StrCat(
      "NvmeStore ", path,
      ": the file kept being replaced by other processes while opening it"));
}

}  // namespace

void IoActivity::Accumulate(double now, Times& into) const {
  const double elapsed = now - since_;
  if (reads_ > 0) into.read_busy_seconds += elapsed;
  if (writes_ > 0) into.write_busy_seconds += elapsed;
  if (reads_ > 0 && writes_ > 0) into.duplex_seconds += elapsed;
  if (reads_ > 0 || writes_ > 0) into.busy_seconds += elapsed;
}

void IoActivity::Begin(bool is_write) {
  const double now = Now();
  std::lock_guard<std::mutex> lock(mutex_);
  Accumulate(now, times_);
  since_ = now;
  ++(is_write ? writes_ : reads_);
}

void IoActivity::End(bool is_write) {
  const double now = Now();
  std::lock_guard<std::mutex> lock(mutex_);
  Accumulate(now, times_);
  since_ = now;
  --(is_write ? writes_ : reads_);
}

IoActivity::Times IoActivity::times() const {
  const double now = Now();
  std::lock_guard<std::mutex> lock(mutex_);
  Times times = times_;
  Accumulate(now, times);
  return times;
}

NvmeOptions NvmeOptionsFromConfig(const config::AioConfig& aio,
                                  const std::string& directory) {
  NvmeOptions options;
  options.directory = directory;
  options.block_size = aio.block_size;
  options.queue_depth = static_cast<int>(aio.queue_depth);
  options.thread_count = static_cast<int>(aio.thread_count);
  options.single_submit = aio.single_submit;
  options.overlap_events = aio.overlap_events;
  return options;
}

struct NvmeStore::Ticket {
  bool is_write = false;
  int64_t bytes = 0;
  double submitted = 0;
  int64_t pending = 0;  // requests not finished; guarded by mutex_
  absl::Status status;  // first error; guarded by mutex_
};

absl::StatusOr<std::unique_ptr<NvmeStore>> NvmeStore::Create(
    const NvmeOptions& options, const std::string& file_name, int64_t bytes) {
  const std::string path = options.directory + "/" + file_name;
  if (options.block_size <= 0 || options.block_size % kAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NvmeStore ", path, ": aio block_size ", options.block_size,
        " must be a positive multiple of ", kAlignment));
  }
  if (options.queue_depth < 1 || options.thread_count < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NvmeStore ", path, ": aio queue_depth ", options.queue_depth,
        " and thread_count ", options.thread_count, " must be >= 1"));
  }
  if (bytes < 0 || file_name.empty() ||
      file_name.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("NvmeStore ", path, ": bad file name or size ", bytes));
  }
  struct stat dir_stat;
  if (stat(options.directory.c_str(), &dir_stat) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("NvmeStore: stat of directory ", options.directory,
                     " failed: ", std::strerror(errno)));
  }
  if (!S_ISDIR(dir_stat.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("NvmeStore: ", options.directory, " is not a directory"));
  }
  const int64_t size_bytes = NvmeStore::AlignedSize(bytes);
  ZE_ASSIGN_OR_RETURN(const OpenedFile opened, OpenAndLock(path));
  const int fd = opened.fd;
  // Removes the file while still holding its lock (so no other process can
  // have taken it over), then closes it.
  auto discard = [&] {
    UnregisterFileForRemoval(path);
    unlink(path.c_str());
    close(fd);
  };
  if (opened.stale_bytes >= 0) {
    ZE_LOG(WARNING) << "NvmeStore " << path << ": replacing a stale swap file ("
                    << opened.stale_bytes
                    << " bytes) that no live process holds: left by a job "
                       "that was killed (SIGKILL) or crashed";
  }
  if (absl::Status registered = RegisterFileForRemoval(path);
      !registered.ok()) {
    unlink(path.c_str());
    close(fd);
    return registered;
  }
  // Free space, counted after a stale file's blocks were released.
  int64_t free_bytes = options.pretend_free_bytes;
  if (free_bytes < 0) {
    struct statvfs fs;
    if (statvfs(options.directory.c_str(), &fs) != 0) {
      const int error = errno;
      discard();
      return absl::FailedPreconditionError(
          absl::StrCat("NvmeStore: statvfs of ", options.directory,
                       " failed: ", std::strerror(error)));
    }
    free_bytes =
        static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  }
  if (size_bytes > free_bytes) {
    discard();
    return absl::ResourceExhaustedError(
        absl::StrCat("NvmeStore ", path, ": needs ", size_bytes, " bytes, ",
                     free_bytes, " free in ", options.directory));
  }
  const bool direct = opened.direct;
  if (size_bytes > 0) {
    const int error = posix_fallocate(fd, 0, size_bytes);
    if (error != 0) {
      discard();
      const std::string message =
          absl::StrCat("NvmeStore ", path, ": fallocate of ", size_bytes,
                       " bytes failed: ", std::strerror(error));
      if (error == ENOSPC) return absl::ResourceExhaustedError(message);
      return absl::InternalError(message);
    }
  }
  // One io_uring instance per thread; refused in some containers
  // (-EPERM/-ENOSYS), where kAuto falls back to the threads backend.
  std::vector<std::unique_ptr<io_uring>> rings;
  if (options.backend != NvmeOptions::Backend::kThreads) {
    for (int i = 0; i < options.thread_count; ++i) {
      auto ring = std::make_unique<io_uring>();
      const int result = io_uring_queue_init(
          static_cast<unsigned>(options.queue_depth), ring.get(), 0);
      if (result < 0) {
        for (auto& made : rings) io_uring_queue_exit(made.get());
        rings.clear();
        if (options.backend == NvmeOptions::Backend::kIoUring) {
          discard();
          return absl::UnavailableError(absl::StrCat(
              "NvmeStore ", path,
              ": io_uring_queue_init failed: ", std::strerror(-result)));
        }
        std::fprintf(stderr,
                     "NvmeStore %s: io_uring refused (%s); using threads\n",
                     path.c_str(), std::strerror(-result));
        break;
      }
      rings.push_back(std::move(ring));
    }
  }
  return std::unique_ptr<NvmeStore>(
      new NvmeStore(options, path, fd, size_bytes, direct, std::move(rings)));
}

NvmeStore::NvmeStore(const NvmeOptions& options, std::string path, int fd,
                     int64_t size_bytes, bool direct,
                     std::vector<std::unique_ptr<io_uring>> rings)
    : options_(options),
      path_(std::move(path)),
      fd_(fd),
      size_bytes_(size_bytes),
      direct_(direct),
      rings_(std::move(rings)),
      activity_(options.activity != nullptr ? options.activity
                                            : std::make_shared<IoActivity>()) {
  if (rings_.empty()) {
    for (int i = 0; i < options_.thread_count; ++i) {
      workers_.emplace_back([this] { WorkerLoop(); });
    }
  } else {
    for (auto& ring : rings_) {
      io_uring* r = ring.get();
      workers_.emplace_back([this, r] { IoUringLoop(r); });
    }
  }
}

NvmeStore::~NvmeStore() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  // Workers drain the queue before they stop, so no I/O is outstanding
  // once they are joined.
  for (std::thread& worker : workers_) worker.join();
  for (auto& ring : rings_) io_uring_queue_exit(ring.get());
  // Unregistered first (a signal from here on leaves a stale file, which
  // the next job takes over), removed while still locked, then closed,
  // which releases the lock: no other process can have taken the file
  // over before it is gone.
  UnregisterFileForRemoval(path_);
  unlink(path_.c_str());
  close(fd_);
}

const char* NvmeStore::backend_name() const {
  if (!rings_.empty()) return direct_ ? "io_uring" : "io_uring (buffered)";
  return direct_ ? "threads" : "threads (buffered)";
}

absl::StatusOr<IoTicket> NvmeStore::Write(int64_t offset, const void* buffer,
                                          int64_t bytes) {
  return Submit(true, offset,
                const_cast<char*>(static_cast<const char*>(buffer)), bytes);
}

absl::StatusOr<IoTicket> NvmeStore::Read(int64_t offset, void* buffer,
                                         int64_t bytes) {
  return Submit(false, offset, static_cast<char*>(buffer), bytes);
}

absl::StatusOr<IoTicket> NvmeStore::Submit(bool is_write, int64_t offset,
                                           char* buffer, int64_t bytes) {
  const char* operation = is_write ? "write" : "read";
  const int64_t aligned = bytes < 0 ? -1 : NvmeStore::AlignedSize(bytes);
  if (bytes < 0 || offset < 0 || offset % kAlignment != 0 ||
      reinterpret_cast<uintptr_t>(buffer) % kAlignment != 0 ||
      offset + aligned > size_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NvmeStore ", path_, ": ", operation, " at offset ", offset, " of ",
        bytes, " bytes: buffer and offset must be aligned to ", kAlignment,
        " and the aligned range lie in the file of ", size_bytes_, " bytes"));
  }
  auto ticket = std::make_shared<Ticket>();
  ticket->is_write = is_write;
  ticket->bytes = bytes;
  ticket->submitted = Now();
  IoTicket result;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    result.id = next_ticket_++;
    tickets_[result.id] = ticket;
    for (int64_t done = 0; done < aligned; done += options_.block_size) {
      Request request;
      request.is_write = is_write;
      request.offset = offset + done;
      request.buffer = buffer + done;
      request.bytes = std::min(options_.block_size, aligned - done);
      request.index = is_write ? write_requests_++ : read_requests_++;
      request.ticket = ticket;
      queues_[is_write ? 1 : 0].push_back(std::move(request));
      ++ticket->pending;
    }
    // Under mutex_, so this ticket's End (in Finish, also under mutex_)
    // cannot come first. A ticket of no bytes has no request: never begun.
    if (ticket->pending > 0) activity_->Begin(is_write);
  }
  work_ready_.notify_all();
  return result;
}

NvmeStore::Request NvmeStore::TakeNext() {
  int direction = next_direction_;
  if (queues_[direction].empty()) direction = 1 - direction;
  Request request = std::move(queues_[direction].front());
  queues_[direction].pop_front();
  next_direction_ = 1 - direction;
  return request;
}

void NvmeStore::WorkerLoop() {
  for (;;) {
    Request request;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [this] { return stopping_ || Pending(); });
      if (!Pending()) return;  // stopping, and nothing left to do
      request = TakeNext();
    }
    Execute(request);
  }
}

void NvmeStore::Execute(const Request& request) { ExecuteFrom(request, 0); }

void NvmeStore::ExecuteFrom(const Request& request, int64_t done) {
  int error = 0;
  while (done < request.bytes) {
    ssize_t result;
    if (request.is_write) {
      if (request.index == options_.fail_write_request) {
        result = -1;
        errno = EIO;
      } else {
        result = pwrite(fd_, request.buffer + done, request.bytes - done,
                        request.offset + done);
      }
    } else {
      result = pread(fd_, request.buffer + done, request.bytes - done,
                     request.offset + done);
      if (result > 0 && request.index == options_.short_read_request) {
        done += result / 2;
        result = 0;  // as if the file ended here
      }
    }
    if (result < 0) {
      if (errno == EINTR) continue;
      error = errno;
      break;
    }
    if (result == 0) break;  // end of file: a short transfer
    done += result;
  }
  Finish(request, done, error);
}

void NvmeStore::Finish(const Request& request, int64_t done, int error) {
  const char* operation = request.is_write ? "write" : "read";
  absl::Status status;
  const std::string where =
      absl::StrCat("NvmeStore ", path_, ": ", operation, " at offset ",
                   request.offset, " of ", request.bytes, " bytes");
  if (error != 0) {
    status = absl::InternalError(
        absl::StrCat(where, " failed: ", std::strerror(error)));
  } else if (done < request.bytes) {
    status = absl::DataLossError(
        absl::StrCat(where, " was short: ", done, " bytes transferred"));
  }
  const double finished = Now();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Ticket& ticket = *request.ticket;
    if (!status.ok() && ticket.status.ok()) ticket.status = status;
    if (--ticket.pending == 0) {
      activity_->End(ticket.is_write);
      if (ticket.is_write) {
        counters_.bytes_written += ticket.bytes;
        counters_.write_seconds += finished - ticket.submitted;
      } else {
        counters_.bytes_read += ticket.bytes;
        counters_.read_seconds += finished - ticket.submitted;
      }
    }
  }
  ticket_done_.notify_all();
}

void NvmeStore::IoUringLoop(io_uring* ring) {
  int in_flight = 0;
  for (;;) {
    std::vector<Request> taken;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (in_flight == 0) {
        work_ready_.wait(lock, [this] { return stopping_ || Pending(); });
        if (!Pending()) return;  // stopping, and nothing left to do
      }
      // Without overlap_events, a new batch waits for the last to finish.
      const bool may_submit = options_.overlap_events || in_flight == 0;
      const int slots = may_submit ? options_.queue_depth - in_flight : 0;
      while (static_cast<int>(taken.size()) < slots && Pending()) {
        taken.push_back(TakeNext());
      }
    }
    int prepared = 0;
    for (Request& request : taken) {
      if (request.is_write && request.index == options_.fail_write_request) {
        Finish(request, 0, EIO);  // injected: never reaches the disk
        continue;
      }
      io_uring_sqe* sqe = io_uring_get_sqe(ring);
      if (sqe == nullptr) {
        // Cannot happen (at most queue_depth prepared per submit); if the
        // ring is full anyway, do the request synchronously.
        Execute(request);
        continue;
      }
      auto* owned = new Request(std::move(request));
      if (owned->is_write) {
        io_uring_prep_write(sqe, fd_, owned->buffer,
                            static_cast<unsigned>(owned->bytes), owned->offset);
      } else {
        io_uring_prep_read(sqe, fd_, owned->buffer,
                           static_cast<unsigned>(owned->bytes), owned->offset);
      }
      io_uring_sqe_set_data(sqe, owned);
      ++prepared;
      ++in_flight;
      if (options_.single_submit) io_uring_submit(ring);
    }
    if (prepared > 0 && !options_.single_submit) io_uring_submit(ring);
    if (in_flight == 0) continue;
    // Block for one completion when no more can be submitted now; else
    // only reap what is ready and go back to submitting.
    bool block;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      block = !Pending() || in_flight >= options_.queue_depth ||
              !options_.overlap_events;
    }
    io_uring_cqe* cqe = nullptr;
    int result =
        block ? io_uring_wait_cqe(ring, &cqe) : io_uring_peek_cqe(ring, &cqe);
    while (result == 0 && cqe != nullptr) {
      std::unique_ptr<Request> request(
          static_cast<Request*>(io_uring_cqe_get_data(cqe)));
      const int res = cqe->res;
      io_uring_cqe_seen(ring, cqe);
      --in_flight;
      if (res < 0) {
        Finish(*request, 0, -res);
      } else if (!request->is_write &&
                 request->index == options_.short_read_request) {
        Finish(*request, res / 2, 0);  // injected short read
      } else if (res < request->bytes && res > 0) {
        ExecuteFrom(*request, res);  // the rest synchronously
      } else {
        Finish(*request, res, 0);  // complete, or 0: end of file (short)
      }
      cqe = nullptr;
      result = io_uring_peek_cqe(ring, &cqe);
    }
  }
}

absl::Status NvmeStore::Wait(IoTicket ticket) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto found = tickets_.find(ticket.id);
  if (found == tickets_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("NvmeStore ", path_, ": Wait on unknown ticket ",
                     ticket.id, " (already waited for?)"));
  }
  std::shared_ptr<Ticket> state = found->second;
  ticket_done_.wait(lock, [&state] { return state->pending == 0; });
  tickets_.erase(ticket.id);
  return state->status;
}

absl::Status NvmeStore::WaitAll() {
  std::vector<int64_t> ids;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& entry : tickets_) ids.push_back(entry.first);
  }
  std::sort(ids.begin(), ids.end());
  absl::Status first;
  for (int64_t id : ids) {
    absl::Status status = Wait(IoTicket{id});
    if (first.ok() && !status.ok() && !absl::IsInvalidArgument(status)) {
      first = status;  // InvalidArgument: another thread waited for it
    }
  }
  return first;
}

NvmeStore::Counters NvmeStore::counters() const {
  Counters counters;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    counters = counters_;
  }
  counters.busy = activity_->times();
  return counters;
}

absl::StatusOr<AlignedBuffer> AlignedBuffer::Allocate(int64_t bytes) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("AlignedBuffer: negative size ", bytes));
  }
  AlignedBuffer buffer;
  buffer.size_ = NvmeStore::AlignedSize(bytes);
  void* memory = nullptr;
  if (buffer.size_ > 0) {
    if (posix_memalign(&memory, NvmeStore::kAlignment, buffer.size_) != 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "AlignedBuffer: posix_memalign of ", buffer.size_, " bytes failed"));
    }
    std::memset(memory, 0, buffer.size_);
  }
  buffer.data_ = static_cast<char*>(memory);
  return buffer;
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

}  // namespace offload
}  // namespace ze
