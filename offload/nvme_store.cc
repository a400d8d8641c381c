#include "offload/nvme_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ze {
namespace offload {
namespace {

int64_t RoundUp(int64_t bytes) {
  return (bytes + NvmeStore::kAlignment - 1) / NvmeStore::kAlignment *
         NvmeStore::kAlignment;
}

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Paths of live stores, removed at exit if their store was never destroyed
// (a process returning from main with a leaked store).
std::mutex& CleanupMutex() {
  static std::mutex* mutex = new std::mutex;
  return *mutex;
}
std::set<std::string>& CleanupPaths() {
  static std::set<std::string>* paths = new std::set<std::string>;
  return *paths;
}
void RemoveLeftoverFiles() {
  std::lock_guard<std::mutex> lock(CleanupMutex());
  for (const std::string& path : CleanupPaths()) unlink(path.c_str());
  CleanupPaths().clear();
}
void RegisterForCleanup(const std::string& path) {
  static const bool registered = (std::atexit(RemoveLeftoverFiles), true);
  (void)registered;
  std::lock_guard<std::mutex> lock(CleanupMutex());
  CleanupPaths().insert(path);
}
void UnregisterForCleanup(const std::string& path) {
  std::lock_guard<std::mutex> lock(CleanupMutex());
  CleanupPaths().erase(path);
}

}  // namespace

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
  if (options.backend == NvmeOptions::Backend::kIoUring) {
    return absl::UnimplementedError(absl::StrCat(
        "NvmeStore ", path, ": the io_uring backend is not built"));
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
  const int64_t size_bytes = RoundUp(bytes);
  int64_t free_bytes = options.pretend_free_bytes;
  if (free_bytes < 0) {
    struct statvfs fs;
    if (statvfs(options.directory.c_str(), &fs) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("NvmeStore: statvfs of ", options.directory,
                       " failed: ", std::strerror(errno)));
    }
    free_bytes =
        static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  }
  if (size_bytes > free_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("NvmeStore ", path, ": needs ", size_bytes, " bytes, ",
                     free_bytes, " free in ", options.directory));
  }
  const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
  bool direct = true;
  int fd = open(path.c_str(), flags | O_DIRECT, 0600);
  if (fd < 0 && errno == EINVAL) {
    std::fprintf(stderr,
                 "NvmeStore %s: O_DIRECT refused by the filesystem; using "
                 "buffered I/O\n",
                 path.c_str());
    direct = false;
    fd = open(path.c_str(), flags, 0600);
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
  RegisterForCleanup(path);
  if (size_bytes > 0) {
    const int error = posix_fallocate(fd, 0, size_bytes);
    if (error != 0) {
      close(fd);
      unlink(path.c_str());
      UnregisterForCleanup(path);
      const std::string message =
          absl::StrCat("NvmeStore ", path, ": fallocate of ", size_bytes,
                       " bytes failed: ", std::strerror(error));
      if (error == ENOSPC) return absl::ResourceExhaustedError(message);
      return absl::InternalError(message);
    }
  }
  return std::unique_ptr<NvmeStore>(
      new NvmeStore(options, path, fd, size_bytes, direct));
}

NvmeStore::NvmeStore(const NvmeOptions& options, std::string path, int fd,
                     int64_t size_bytes, bool direct)
    : options_(options),
      path_(std::move(path)),
      fd_(fd),
      size_bytes_(size_bytes),
      direct_(direct) {
  for (int i = 0; i < options_.thread_count; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
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
  close(fd_);
  unlink(path_.c_str());
  UnregisterForCleanup(path_);
}

const char* NvmeStore::backend_name() const {
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
  const int64_t aligned = bytes < 0 ? -1 : RoundUp(bytes);
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
      queue_.push_back(std::move(request));
      ++ticket->pending;
    }
  }
  work_ready_.notify_all();
  return result;
}

void NvmeStore::WorkerLoop() {
  for (;;) {
    Request request;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to do
      request = std::move(queue_.front());
      queue_.pop_front();
    }
    Execute(request);
  }
}

void NvmeStore::Execute(const Request& request) {
  const char* operation = request.is_write ? "write" : "read";
  int64_t done = 0;
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
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

absl::StatusOr<AlignedBuffer> AlignedBuffer::Allocate(int64_t bytes) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("AlignedBuffer: negative size ", bytes));
  }
  AlignedBuffer buffer;
  buffer.size_ = RoundUp(bytes);
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
