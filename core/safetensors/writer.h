// Writing safetensors files as a stream, atomically.
//
//   ZE_ASSIGN_OR_RETURN(auto writer, safetensors::Writer::Create(
//       path, {{"wte.weight", ElementType::kF32, {V, C}}, ...}, metadata));
//   ZE_RETURN_IF_ERROR(writer->Append("wte.weight", first_rows));  // chunks
//   ZE_RETURN_IF_ERROR(writer->Append("wte.weight", other_rows));  // in order
//   ...
//   ZE_RETURN_IF_ERROR(writer->Finish());
//
// Every tensor's name, dtype and shape is declared up front, which fixes the
// header; the data then streams in declaration order, each tensor in one or
// more chunks (e.g. one per rank's shard, or one per slice of a bigger flat
// buffer), so the whole file never has to be in memory.
//
// Atomicity: bytes go to a temporary file beside `path` ("<path>.tmp.XXXXXX");
// Finish fsyncs it, renames it over `path` and fsyncs the directory. Until
// Finish succeeds, `path` is untouched (an older file there survives), and a
// writer that fails or is destroyed unfinished deletes its temporary file.
//
// Direct I/O (WriterOptions::direct_io): the file is opened with O_DIRECT
// and bytes are gathered into 4096-aligned 32 MiB blocks that an I/O thread
// writes while the caller fills the next (at most three queued), so the
// disk is busy from the first block on instead of when the kernel's
// dirty-page writeback starts (a buffered writer of a file much smaller
// than RAM leaves nearly all of it to the final fsync). The last partial
// block's aligned part is written direct, the rest (< 4096 bytes) buffered.
// Where the file system refuses O_DIRECT (tmpfs, some overlays) the writer
// falls back to buffered writes silently (stats().direct_io says which).
// Crash safety and the CRC are the same either way.
//
// A Writer is not thread-safe; use one per thread.
#ifndef ZE_CORE_SAFETENSORS_WRITER_H_
#define ZE_CORE_SAFETENSORS_WRITER_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/safetensors/format.h"
#include "core/tensor.h"

namespace ze {
namespace safetensors {

struct WriterOptions {
  bool direct_io = false;
};

class DirectSink;  // writer.cc

class Writer {
 public:
  // Validates the declarations (format.h SerializeHeader), creates the
  // temporary file in `path`'s directory and writes the header.
  // InvalidArgument for bad declarations; NotFound when the directory does
  // not exist; PermissionDenied when it is not writable; ResourceExhausted
  // when the disk is full. Messages name `path`.
  static absl::StatusOr<std::unique_ptr<Writer>> Create(
      std::string path, std::vector<TensorSpec> tensors,
      const Metadata &metadata = {}, const WriterOptions &options = {});

  // Deletes the temporary file unless Finish succeeded.
  ~Writer();
  Writer(const Writer &) = delete;
  Writer &operator=(const Writer &) = delete;

  // Appends the elements of `values` (a CPU tensor of the tensor's dtype;
  // its shape is irrelevant, only its row-major elements count) to tensor
  // `name`. `name` must be the tensor being written: the first declared
  // tensor that is not yet complete. FailedPrecondition for another name or
  // after a failure or Finish; InvalidArgument when the dtype differs, the
  // tensor is not on the CPU, or it has more elements than `name` still
  // lacks. Write errors (ResourceExhausted for a full disk) name the path;
  // after one the writer is failed and its temporary file is gone.
  absl::Status Append(absl::string_view name, const Tensor &values);

  // Like Append with raw little-endian bytes; `bytes` must be a multiple of
  // the element size.
  absl::Status AppendBytes(absl::string_view name, const void *data,
                           size_t bytes);

  // Checks every declared byte was written (FailedPrecondition naming the
  // first incomplete tensor otherwise), then flushes, fsyncs, renames over
  // `path` and fsyncs the directory. On error nothing is left at the
  // temporary name and `path` holds what it held before.
  absl::Status Finish();

  const std::string &path() const { return path_; }
  // CRC-32C (core/crc32c.h) and count of every byte written so far: after
  // Finish, of the whole file (length, header, data), computed as the bytes
  // went out.
  uint32_t crc32c() const { return crc32c_; }
  uint64_t bytes_written() const { return bytes_written_; }
  // The declared tensors with their assigned data offsets.
  const std::vector<TensorInfo> &layout() const { return layout_; }

  // Where the time went, for benchmarks (seconds, wall clock).
  struct Stats {
    bool direct_io = false;     // the file is written with O_DIRECT
    double crc_seconds = 0;     // checksumming, on the caller's thread
    double copy_seconds = 0;    // direct: into the aligned blocks
    double stall_seconds = 0;   // the caller blocked on the disk: buffered
                                // write() calls, or (direct) waiting for a
                                // free block
    double write_seconds = 0;   // direct: the I/O thread inside pwrite
    double finish_seconds = 0;  // Finish: last writes, fsync, rename
  };
  const Stats &stats() const { return stats_; }

 private:
  Writer(std::string path, std::string temp_path, int fd,
         std::vector<TensorInfo> layout);
  // Skips completed (incl. zero-size) tensors.
  void AdvancePastCompleteTensors();
  absl::Status Write(const void *data, size_t bytes);
  absl::Status WriteBuffered(const void *data, size_t bytes);
  absl::Status Flush();
  // Records `status` as the writer's failure and removes the temp file.
  absl::Status Fail(absl::Status status);

  std::string path_;
  std::string temp_path_;
  int fd_;
  std::vector<TensorInfo> layout_;
  size_t current_ = 0;  // index into layout_ of the tensor being filled
  uint64_t written_in_current_ = 0;
  std::string buffer_;    // small appends are batched into one write
  absl::Status failure_;  // sticky: every call after a failure returns it
  bool finished_ = false;
  uint32_t crc32c_ = 0;
  uint64_t bytes_written_ = 0;
  std::unique_ptr<DirectSink> direct_;  // null: buffered writes
  Stats stats_;
};

// Writes whole CPU tensors, in the given order, in one call (Create, Append
// each, Finish); same errors as those.
absl::Status WriteFile(
    const std::string &path,
    const std::vector<std::pair<std::string, Tensor>> &tensors,
    const Metadata &metadata = {});

}  // namespace safetensors
}  // namespace ze

#endif  // ZE_CORE_SAFETENSORS_WRITER_H_
