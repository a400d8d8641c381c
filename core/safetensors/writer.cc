#include "core/safetensors/writer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/crc32c.h"
#include "core/safetensors/file_io.h"
#include "core/status.h"

namespace ze {
namespace safetensors {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; this writer copies bytes "
              "as they are");

// Appends smaller than this are batched; larger ones go straight to write().
constexpr size_t kBufferBytes = size_t{1} << 20;

std::string DirectoryOf(const std::string &path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Makes the rename durable: without it a crash could forget the new name.
absl::Status SyncDirectory(const std::string &directory) {
  const int fd = open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "open directory", directory);
  const int result = fsync(fd);
  const int error = errno;
  close(fd);
  // Some file systems cannot fsync a directory (EINVAL); the data itself is
  // already synced, so that is not a failure.
  if (result != 0 && error != EINVAL) {
    return ErrnoToStatus(error, "fsync directory", directory);
  }
  return absl::OkStatus();
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// pwrite of all `bytes` at `offset`, retrying short writes and EINTR.
// Returns the errno of a failure, 0 on success.
int WriteFullyAt(int fd, const char *data, size_t bytes, uint64_t offset) {
  while (bytes > 0) {
    const ssize_t put = pwrite(fd, data, bytes, static_cast<off_t>(offset));
    if (put < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (put == 0) return EIO;
    data += put;
    offset += static_cast<uint64_t>(put);
    bytes -= static_cast<size_t>(put);
  }
  return 0;
}

bool ClearDirect(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  return flags >= 0 && fcntl(fd, F_SETFL, flags & ~O_DIRECT) == 0;
}

}  // namespace

// The direct-I/O path (see writer.h): the caller's bytes are copied into
// aligned blocks; full blocks are written, in file order, by one I/O thread
// at explicit offsets. One write in flight suffices: each is 32 MiB (the
// block layer splits it into many device requests), and dd with 1 MiB
// direct writes one at a time already reaches the disk's bandwidth.
class DirectSink {
 public:
  static constexpr size_t kAlignment = 4096;
  static constexpr size_t kBlockBytes = size_t{32} << 20;
  static constexpr int kBlocks = 3;

  static std::unique_ptr<DirectSink> Create(int fd, const std::string &path,
                                            Writer::Stats *stats) {
    std::unique_ptr<DirectSink> sink(new DirectSink(fd, path, stats));
    for (int i = 0; i < kBlocks; ++i) {
      void *block = nullptr;
      if (posix_memalign(&block, kAlignment, kBlockBytes) != 0) return nullptr;
      sink->blocks_.push_back(static_cast<char *>(block));
      sink->free_.push_back(i);
    }
    sink->thread_ = std::thread([raw = sink.get()] { raw->Run(); });
    return sink;
  }

  ~DirectSink() {
    Stop();
    for (char *block : blocks_) free(block);
  }

  // Copies `bytes` into the current block, handing full ones to the I/O
  // thread. The I/O thread's error, once it has one.
  absl::Status Append(const char *data, size_t bytes) {
    while (bytes > 0) {
      if (current_ < 0) ZE_RETURN_IF_ERROR(TakeFreeBlock());
      const size_t take = std::min(bytes, kBlockBytes - filled_);
      const auto start = std::chrono::steady_clock::now();
      std::memcpy(blocks_[current_] + filled_, data, take);
      stats_->copy_seconds += SecondsSince(start);
      filled_ += take;
      data += take;
      bytes -= take;
      if (filled_ == kBlockBytes) Submit(filled_);
    }
    return absl::OkStatus();
  }

  // Writes everything still held: the current block's aligned part direct,
  // its tail buffered. Waits for the I/O thread; its error, if any.
  absl::Status Flush() {
    const size_t tail = current_ < 0 ? 0 : filled_ % kAlignment;
    const size_t aligned = current_ < 0 ? 0 : filled_ - tail;
    const char *tail_data = nullptr;
    int tail_block = -1;
    if (current_ >= 0) {
      tail_block = current_;
      tail_data = blocks_[current_] + aligned;
      if (aligned > 0) {
        // The block stays out of the free list until its tail is written.
        std::lock_guard<std::mutex> lock(mutex_);
        queue_.push_back({current_, aligned, offset_, /*release=*/false});
        offset_ += aligned;
        changed_.notify_all();
      }
      current_ = -1;
      filled_ = 0;
    }
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return queue_.empty() && !busy_; });
      if (!error_.ok()) return error_;
    }
    if (tail > 0) {
      // An unaligned length cannot go direct; the tail starts on an aligned
      // offset, so no page of it was written direct.
      if (direct() && !ClearDirect(fd_)) {
        return ErrnoToStatus(errno, "clear O_DIRECT on", path_);
      }
      const auto start = std::chrono::steady_clock::now();
      const int error = WriteFullyAt(fd_, tail_data, tail, offset_);
      stats_->write_seconds += SecondsSince(start);
      if (error != 0) return ErrnoToStatus(error, "write", path_);
      offset_ += tail;
    }
    if (tail_block >= 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      free_.push_back(tail_block);
    }
    return absl::OkStatus();
  }

  // Ends the I/O thread (queued blocks are written first). Idempotent.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      changed_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

  // False once a block's write was refused with EINVAL and the file fell
  // back to buffered writes (the tail's buffered write does not count).
  bool direct() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return direct_;
  }

 private:
  struct Job {
    int block = 0;
    size_t bytes = 0;
    uint64_t offset = 0;
    bool release = true;  // back to the free list once written
  };

  DirectSink(int fd, std::string path, Writer::Stats *stats)
      : fd_(fd), path_(std::move(path)), stats_(stats) {}

  absl::Status TakeFreeBlock() {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto start = std::chrono::steady_clock::now();
    changed_.wait(lock, [&] { return !free_.empty() || !error_.ok(); });
    stats_->stall_seconds += SecondsSince(start);
    if (!error_.ok()) return error_;
    current_ = free_.front();
    free_.pop_front();
    filled_ = 0;
    return absl::OkStatus();
  }

  void Submit(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({current_, bytes, offset_, true});
    offset_ += bytes;
    current_ = -1;
    filled_ = 0;
    changed_.notify_all();
  }

  void Run() {
    while (true) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return !queue_.empty() || stopping_; });
        if (queue_.empty()) return;
        job = queue_.front();
        queue_.pop_front();
        busy_ = true;
      }
      if (error_ok()) {
        const auto start = std::chrono::steady_clock::now();
        int error =
            WriteFullyAt(fd_, blocks_[job.block], job.bytes, job.offset);
        if (error == EINVAL && direct()) {
          // Opened with O_DIRECT but refused (a file system that wants a
          // larger alignment, or no direct I/O after all): buffered.
          {
            std::lock_guard<std::mutex> lock(mutex_);
            direct_ = false;
          }
          error = ClearDirect(fd_) ? WriteFullyAt(fd_, blocks_[job.block],
                                                  job.bytes, job.offset)
                                   : errno;
        }
        const double seconds = SecondsSince(start);
        std::lock_guard<std::mutex> lock(mutex_);
        stats_->write_seconds += seconds;
        if (error != 0) error_ = ErrnoToStatus(error, "write", path_);
      }
      std::lock_guard<std::mutex> lock(mutex_);
      if (job.release) free_.push_back(job.block);
      busy_ = false;
      changed_.notify_all();
    }
  }

  bool error_ok() {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_.ok();
  }

  const int fd_;
  const std::string path_;
  Writer::Stats *stats_;
  std::vector<char *> blocks_;
  int current_ = -1;     // the block being filled (caller's), or -1
  size_t filled_ = 0;    // bytes in it
  uint64_t offset_ = 0;  // file offset of the next block submitted

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<int> free_;
  std::deque<Job> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  bool direct_ = true;
  absl::Status error_;
  std::thread thread_;  // last: started once the rest is constructed
};

absl::StatusOr<std::unique_ptr<Writer>> Writer::Create(
    std::string path, std::vector<TensorSpec> tensors, const Metadata &metadata,
    const WriterOptions &options) {
  std::vector<TensorInfo> layout;
  ZE_ASSIGN_OR_RETURN(std::string header,
                      SerializeHeader(tensors, metadata, path, &layout));

  // mkstemp in the destination's directory: rename is only atomic within
  // one file system, and a unique name lets writers of the same path race
  // without corrupting each other's temporary files.
  std::string temp_path = path + ".tmp.XXXXXX";
  const int fd = mkostemp(temp_path.data(), O_CLOEXEC);
  if (fd < 0) {
    return ErrnoToStatus(
        errno,
        absl::StrCat("create a temporary file in ", DirectoryOf(path), " for"),
        path);
  }
  // mkstemp creates 0600; a weights file is ordinarily world-readable.
  fchmod(fd, 0644);
  std::unique_ptr<Writer> writer(
      new Writer(path, std::move(temp_path), fd, std::move(layout)));
  if (options.direct_io) {
    // Refused (EINVAL) by file systems without direct I/O: stay buffered.
    const int flags = fcntl(fd, F_GETFL);
    if (flags >= 0 && fcntl(fd, F_SETFL, flags | O_DIRECT) == 0) {
      writer->direct_ =
          DirectSink::Create(fd, writer->temp_path_, &writer->stats_);
      if (writer->direct_ == nullptr) ClearDirect(fd);
    }
    writer->stats_.direct_io = writer->direct_ != nullptr;
  }

  unsigned char length_bytes[kHeaderLengthBytes];
  uint64_t length = header.size();
  for (size_t i = 0; i < kHeaderLengthBytes; ++i) {
    length_bytes[i] = static_cast<unsigned char>(length & 0xff);
    length >>= 8;
  }
  ZE_RETURN_IF_ERROR(writer->Write(length_bytes, sizeof(length_bytes)));
  ZE_RETURN_IF_ERROR(writer->Write(header.data(), header.size()));
  writer->AdvancePastCompleteTensors();
  return writer;
}

Writer::Writer(std::string path, std::string temp_path, int fd,
               std::vector<TensorInfo> layout)
    : path_(std::move(path)),
      temp_path_(std::move(temp_path)),
      fd_(fd),
      layout_(std::move(layout)) {}

Writer::~Writer() {
  direct_.reset();  // joins the I/O thread before the descriptor closes
  if (fd_ >= 0) close(fd_);
  if (!finished_ && failure_.ok()) unlink(temp_path_.c_str());
}

absl::Status Writer::Fail(absl::Status status) {
  failure_ = status;
  if (direct_ != nullptr) direct_->Stop();
  if (fd_ >= 0) {
    close(fd_);
    fd_ = -1;
  }
  unlink(temp_path_.c_str());
  return status;
}

void Writer::AdvancePastCompleteTensors() {
  while (current_ < layout_.size() &&
         written_in_current_ == layout_[current_].num_bytes()) {
    ++current_;
    written_in_current_ = 0;
  }
}

absl::Status Writer::Flush() {
  if (buffer_.empty()) return absl::OkStatus();
  absl::Status status =
      internal::WriteFully(fd_, buffer_.data(), buffer_.size(), temp_path_);
  buffer_.clear();
  if (!status.ok()) return Fail(status);
  return absl::OkStatus();
}

absl::Status Writer::Write(const void *data, size_t bytes) {
  // Every byte of the file passes here once, in order.
  auto start = std::chrono::steady_clock::now();
  crc32c_ = Crc32cExtend(crc32c_, data, bytes);
  stats_.crc_seconds += SecondsSince(start);
  bytes_written_ += bytes;
  if (direct_ != nullptr) {
    absl::Status status =
        direct_->Append(static_cast<const char *>(data), bytes);
    if (!status.ok()) return Fail(status);
    return absl::OkStatus();
  }
  start = std::chrono::steady_clock::now();
  absl::Status status = WriteBuffered(data, bytes);
  stats_.stall_seconds += SecondsSince(start);
  return status;
}

absl::Status Writer::WriteBuffered(const void *data, size_t bytes) {
  if (buffer_.size() + bytes <= kBufferBytes) {
    buffer_.append(static_cast<const char *>(data), bytes);
    return absl::OkStatus();
  }
  ZE_RETURN_IF_ERROR(Flush());
  if (bytes < kBufferBytes) {
    buffer_.append(static_cast<const char *>(data), bytes);
    return absl::OkStatus();
  }
  absl::Status status = internal::WriteFully(fd_, data, bytes, temp_path_);
  if (!status.ok()) return Fail(status);
  return absl::OkStatus();
}

absl::Status Writer::AppendBytes(absl::string_view name, const void *data,
                                 size_t bytes) {
  if (!failure_.ok()) return failure_;
  if (finished_) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": Append after Finish (tensor \"", name, "\")"));
  }
  if (bytes == 0) {
    // Nothing to write; zero-size tensors are complete from the start, so
    // this is valid for any declared tensor (WriteFile appends them too).
    for (const TensorInfo &info : layout_) {
      if (info.name == name) return absl::OkStatus();
    }
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": no tensor \"", name, "\" was declared"));
  }
  if (current_ >= layout_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path_, ": every declared tensor is complete; cannot append to \"", name,
        "\""));
  }
  const TensorInfo &info = layout_[current_];
  if (name != info.name) {
    return absl::FailedPreconditionError(absl::StrCat(
        path_,
        ": tensors are written in declaration order: expected data "
        "for \"",
        info.name, "\" next, got \"", name, "\""));
  }
  const size_t element_size = ElementSize(info.dtype);
  if (bytes % element_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor \"", name, "\": ", bytes,
                     " bytes is not a whole number of ",
                     ElementTypeName(info.dtype), " elements"));
  }
  const uint64_t remaining = info.num_bytes() - written_in_current_;
  if (bytes > remaining) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": tensor \"", name, "\": appending ", bytes / element_size,
        " elements but only ", remaining / element_size, " of its ",
        info.num_elements(), " remain"));
  }
  ZE_RETURN_IF_ERROR(Write(data, bytes));
  written_in_current_ += bytes;
  AdvancePastCompleteTensors();
  return absl::OkStatus();
}

absl::Status Writer::Append(absl::string_view name, const Tensor &values) {
  if (!values.defined() || !values.device().is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor \"", name,
                     "\": values must be a defined CPU tensor, got ",
                     values.defined() ? values.DebugString() : "undefined"));
  }
  if (failure_.ok() && !finished_ && current_ < layout_.size() &&
      name == layout_[current_].name &&
      ElementTypeOf(values.dtype()) != layout_[current_].dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor \"", name, "\" is declared ",
                     ElementTypeName(layout_[current_].dtype), " but got ",
                     values.DebugString()));
  }
  return AppendBytes(name, values.data(), values.nbytes());
}

absl::Status Writer::Finish() {
  if (!failure_.ok()) return failure_;
  if (finished_) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": Finish called twice"));
  }
  if (current_ < layout_.size()) {
    const TensorInfo &info = layout_[current_];
    // Not sticky: the caller may still append the rest and Finish again.
    return absl::FailedPreconditionError(absl::StrCat(
        path_, ": Finish before all data was written: tensor \"", info.name,
        "\" has ", written_in_current_, " of its ", info.num_bytes(),
        " bytes (", layout_.size() - current_, " tensors incomplete)"));
  }
  const auto start = std::chrono::steady_clock::now();
  ZE_RETURN_IF_ERROR(Flush());
  if (direct_ != nullptr) {
    absl::Status flushed = direct_->Flush();
    stats_.direct_io = direct_->direct();
    direct_->Stop();
    if (!flushed.ok()) return Fail(flushed);
  }
  if (fsync(fd_) != 0) {
    return Fail(ErrnoToStatus(errno, "fsync", temp_path_));
  }
  const int fd = fd_;
  fd_ = -1;
  if (close(fd) != 0) {
    return Fail(ErrnoToStatus(errno, "close", temp_path_));
  }
  if (rename(temp_path_.c_str(), path_.c_str()) != 0) {
    return Fail(ErrnoToStatus(errno, absl::StrCat("rename ", temp_path_, " to"),
                              path_));
  }
  finished_ = true;
  absl::Status synced = SyncDirectory(DirectoryOf(path_));
  stats_.finish_seconds = SecondsSince(start);
  return synced;
}

absl::Status WriteFile(
    const std::string &path,
    const std::vector<std::pair<std::string, Tensor>> &tensors,
    const Metadata &metadata) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const auto &[name, tensor] : tensors) {
    if (!tensor.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor \"", name, "\" is undefined"));
    }
    specs.push_back({name, ElementTypeOf(tensor.dtype()), tensor.shape()});
  }
  ZE_ASSIGN_OR_RETURN(std::unique_ptr<Writer> writer,
                      Writer::Create(path, std::move(specs), metadata));
  for (const auto &[name, tensor] : tensors) {
    ZE_RETURN_IF_ERROR(writer->Append(name, tensor));
  }
  return writer->Finish();
}

}  // namespace safetensors
}  // namespace ze
