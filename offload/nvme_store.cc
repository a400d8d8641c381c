#include "offload/nvme_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

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

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string ErrnoText(int error) { return std::strerror(error); }

int64_t RoundUp(int64_t bytes) {
  return (bytes + NvmeStore::kAlignment - 1) / NvmeStore::kAlignment *
         NvmeStore::kAlignment;
}

// Files of stores that are still alive, removed at exit if their owner was
// never destroyed (std::exit from main with the engine leaked, say).
std::mutex& LiveFilesMutex() {
  static auto* mutex = new std::mutex;
  return *mutex;
}
std::set<std::string>& LiveFiles() {
  static auto* files = new std::set<std::string>;
  return *files;
}
void RemoveLiveFiles() {
  std::lock_guard<std::mutex> lock(LiveFilesMutex());
  for (const std::string& path : LiveFiles()) ::unlink(path.c_str());
}
void RegisterLiveFile(const std::string& path) {
  static const bool registered = [] {
    std::atexit(RemoveLiveFiles);
    return true;
  }();
  (void)registered;
  std::lock_guard<std::mutex> lock(LiveFilesMutex());
  LiveFiles().insert(path);
}
void ForgetLiveFile(const std::string& path) {
  std::lock_guard<std::mutex> lock(LiveFilesMutex());
  LiveFiles().erase(path);
}

}  // namespace

NvmeOptions NvmeOptionsFromConfig(const config::AioConfig& aio,
                                  const std::string& directory) {
  NvmeOptions options;
  options.directory = directory;
  options.block_size = aio.block_size;
  options.queue_depth = static_cast<int>(aio.queue_depth);
  options.thread_count = static_cast<int>(aio.thread_count);
  return options;
}

void AlignedBuffer::Free::operator()(char* data) const { std::free(data); }

absl::StatusOr<AlignedBuffer> AlignedBuffer::Allocate(int64_t bytes) {
  AlignedBuffer buffer;
  const int64_t rounded =
      std::max<int64_t>(RoundUp(bytes), NvmeStore::kAlignment);
  void* data = nullptr;
  if (posix_memalign(&data, NvmeStore::kAlignment,
                     static_cast<size_t>(rounded)) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate an I/O buffer of ", rounded, " bytes"));
  }
  buffer.data_.reset(static_cast<char*>(data));
  buffer.size_ = rounded;
  return buffer;
}

absl::StatusOr<std::unique_ptr<NvmeStore>> NvmeStore::Create(
    const NvmeOptions& options, const std::string& file_name, int64_t bytes) {
  if (options.block_size <= 0 || options.block_size % kAlignment != 0 ||
      options.queue_depth < 1 || options.thread_count < 1 || bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NVMe store: aio.block_size (", options.block_size,
        ") must be a positive multiple of ", kAlignment, ", aio.queue_depth (",
        options.queue_depth, ") and aio.thread_count (", options.thread_count,
        ") at least 1"));
  }
  const std::string& directory = options.directory;
  struct stat info;
  if (::stat(directory.c_str(), &info) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("nvme_path ", directory, ": ", ErrnoText(errno)));
  }
  if (!S_ISDIR(info.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("nvme_path ", directory, " is not a directory"));
  }
  const int64_t size = RoundUp(std::max<int64_t>(bytes, 1));
  struct statvfs space;
  if (::statvfs(directory.c_str(), &space) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("nvme_path ", directory, ": statvfs: ", ErrnoText(errno)));
  }
  const int64_t free_bytes = options.pretend_free_bytes >= 0
                                 ? options.pretend_free_bytes
                                 : static_cast<int64_t>(space.f_bavail) *
                                       static_cast<int64_t>(space.f_frsize);
  const std::string path = absl::StrCat(directory, "/", file_name);
  if (free_bytes < size) {
    return absl::ResourceExhaustedError(
        absl::StrCat("nvme_path ", directory, ": ", path, " needs ", size,
                     " bytes, ", free_bytes, " free"));
  }
  bool direct = true;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT, 0600);
  if (fd < 0 && errno == EINVAL) {
    // The filesystem refuses O_DIRECT (tmpfs): buffered I/O instead.
    direct = false;
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) {
      std::fprintf(stderr,
                   "NVMe store: %s does not take O_DIRECT; using buffered "
                   "I/O\n",
                   path.c_str());
    }
  }
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat("nvme_path ", directory,
                                                      ": cannot create ", path,
                                                      ": ", ErrnoText(errno)));
  }
  const int allocated = ::posix_fallocate(fd, 0, size);
  if (allocated != 0) {
    ::close(fd);
    ::unlink(path.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("nvme_path ", directory, ": preallocating ", size,
                     " bytes for ", path, ": ", ErrnoText(allocated)));
  }
  RegisterLiveFile(path);
  std::unique_ptr<NvmeStore> store(
      new NvmeStore(options, path, fd, direct, size));
  return store;
}

NvmeStore::NvmeStore(const NvmeOptions& options, std::string path, int fd,
                     bool direct, int64_t size)
    : options_(options),
      path_(std::move(path)),
      fd_(fd),
      direct_(direct),
      size_(size) {
  const int threads = options_.thread_count * options_.queue_depth;
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { IoLoop(); });
}

NvmeStore::~NvmeStore() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return queue_.empty(); });
    stopping_ = true;
  }
  work_.notify_all();
  for (std::thread& thread : threads_) thread.join();
  ::close(fd_);
  ::unlink(path_.c_str());
  ForgetLiveFile(path_);
}

absl::StatusOr<IoTicket> NvmeStore::Write(int64_t offset, const void* buffer,
                                          int64_t bytes) {
  return Submit(true, offset, static_cast<char*>(const_cast<void*>(buffer)),
                bytes);
}

absl::StatusOr<IoTicket> NvmeStore::Read(int64_t offset, void* buffer,
                                         int64_t bytes) {
  return Submit(false, offset, static_cast<char*>(buffer), bytes);
}

absl::StatusOr<IoTicket> NvmeStore::Submit(bool write, int64_t offset,
                                           char* buffer, int64_t bytes) {
  const int64_t rounded = RoundUp(bytes);
  if (offset < 0 || offset % kAlignment != 0 ||
      reinterpret_cast<uintptr_t>(buffer) % kAlignment != 0 ||
      offset + rounded > size_ || bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": ", write ? "write" : "read", " of ", bytes, " bytes at ",
        offset, ": offset and buffer must be ", kAlignment,
        "-aligned and the range inside the file of ", size_, " bytes"));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const IoTicket id = next_ticket_++;
  Ticket& ticket = tickets_[id];
  ticket.write = write;
  ticket.offset = offset;
  ticket.bytes = bytes;
  ticket.start = Now();
  for (int64_t done = 0; done < rounded; done += options_.block_size) {
    const int64_t piece = std::min(options_.block_size, rounded - done);
    const int64_t request = write ? write_requests_++ : read_requests_++;
    queue_.push_back({id, write, offset + done, buffer + done, piece, request});
    ++ticket.remaining;
  }
  work_.notify_all();
  return id;
}

absl::Status NvmeStore::Run(const Piece& piece) {
  const char* operation = piece.write ? "write" : "read";
  auto failure = [&](int error) {
    return absl::InternalError(absl::StrCat(
        path_, ": ", operation, " of ", piece.bytes, " bytes at offset ",
        piece.offset, " failed: ", ErrnoText(error)));
  };
  if (piece.write && piece.request == options_.fail_write_request) {
    return failure(EIO);
  }
  int64_t done = 0;
  int64_t want = piece.bytes;
  if (!piece.write && piece.request == options_.short_read_request) {
    want = piece.bytes / 2;
  }
  while (done < want) {
    const ssize_t n = piece.write ? ::pwrite(fd_, piece.buffer + done,
                                             want - done, piece.offset + done)
                                  : ::pread(fd_, piece.buffer + done,
                                            want - done, piece.offset + done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return failure(errno);
    }
    if (n == 0) break;
    done += n;
  }
  if (done < piece.bytes) {
    return absl::DataLossError(
        absl::StrCat(path_, ": short ", operation, " at offset ", piece.offset,
                     ": ", done, " of ", piece.bytes, " bytes"));
  }
  return absl::OkStatus();
}

void NvmeStore::IoLoop() {
  while (true) {
    Piece piece;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      piece = queue_.front();
      queue_.pop_front();
    }
    absl::Status status = Run(piece);
    std::lock_guard<std::mutex> lock(mutex_);
    Ticket& ticket = tickets_[piece.ticket];
    if (ticket.status.ok() && !status.ok()) ticket.status = status;
    if (--ticket.remaining == 0) {
      const double seconds = Now() - ticket.start;
      if (ticket.write) {
        counters_.bytes_written += ticket.bytes;
        counters_.write_seconds += seconds;
      } else {
        counters_.bytes_read += ticket.bytes;
        counters_.read_seconds += seconds;
      }
    }
    done_.notify_all();
  }
}

absl::Status NvmeStore::Wait(IoTicket id) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto found = tickets_.find(id);
  if (found == tickets_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": unknown or already waited I/O ticket ", id));
  }
  done_.wait(lock, [&] { return found->second.remaining == 0; });
  absl::Status status = found->second.status;
  tickets_.erase(found);
  return status;
}

NvmeStore::Counters NvmeStore::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

}  // namespace offload
}  // namespace ze
