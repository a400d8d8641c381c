// SwappedState: optimizer state (f32 master weights and moments) kept on
// NVMe in one file and brought into host memory a chunk at a time for the
// CPU optimizer (ZeRO-Infinity's optimizer swapping). Knows no ZeRO stage:
// the caller cuts its state into chunks (of at most a few million
// elements) and names them by index.
//
// File layout: chunk i is one record of `arrays` f32 arrays of
// chunk_elements[i] each (array 0 the master weights, then the moments),
// padded to NvmeStore::kAlignment, records back to back; so a chunk is one
// read and one write.
//
// Update streams through `buffer_count` aligned host buffers: while the
// caller works on chunk k, the reads of the next chunks are in flight and
// the writes of the previous ones drain (DeepSpeed's pipeline_read /
// pipeline_write, always on). Not thread-safe: one caller at a time.
#ifndef ZE_OFFLOAD_SWAPPED_STATE_H_
#define ZE_OFFLOAD_SWAPPED_STATE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/nvme_store.h"

namespace ze {
namespace offload {

struct SwappedStateOptions {
  NvmeOptions nvme;       // directory and aio settings
  std::string file_name;  // inside nvme.directory, e.g. "rank0_optimizer.swp"
  int arrays = 3;         // f32 arrays per element: master + moments
  int buffer_count = 4;   // host buffers of the pipeline (>= 2)
};

class SwappedState {
 public:
  // Creates the file, sized and preallocated for every chunk, and the host
  // buffers. Errors from NvmeStore::Create (missing or unwritable
  // directory, too little space: each naming the path and the bytes), or
  // InvalidArgument for arrays < 1, buffer_count < 2 or a negative chunk.
  static absl::StatusOr<std::unique_ptr<SwappedState>> Create(
      const SwappedStateOptions& options,
      const std::vector<int64_t>& chunk_elements);

  // Writes chunk `chunk`: array 0 from `first` (chunk_elements values), the
  // other arrays zero. Synchronous.
  absl::Status Initialize(int chunk, const float* first);

  // For each chunk of `order`: its arrays in host memory (arrays[a], a <
  // arrays), passed to `visit`, which updates them in place; written back
  // after `visit` returns. Returns once every write is on disk (or failed).
  // The first error (a read, `visit`, a write) stops further visits and is
  // returned after the outstanding I/O has been waited for; chunks visited
  // before it are updated on disk, later ones are not.
  absl::Status Update(
      const std::vector<int>& order,
      const std::function<absl::Status(int chunk, float* const* arrays)>&
          visit);

  // Elements [begin, begin + count) of array `array` of chunk `chunk`.
  // Synchronous. Write is a read-modify-write of the chunk's record.
  absl::Status Read(int chunk, int array, int64_t begin, int64_t count,
                    float* out);
  absl::Status Write(int chunk, int array, int64_t begin, int64_t count,
                     const float* values);

  int num_chunks() const { return static_cast<int>(elements_.size()); }
  int64_t chunk_elements(int chunk) const { return elements_[chunk]; }
  // f32 arrays per element (options' `arrays`): master, then the moments.
  int arrays() const { return options_.arrays; }
  int64_t file_bytes() const { return store_->size_bytes(); }
  // Host bytes of the pipeline's buffers.
  int64_t buffer_bytes() const;
  NvmeStore& store() { return *store_; }
  const NvmeStore& store() const { return *store_; }

 private:
  SwappedState(const SwappedStateOptions& options,
               std::vector<int64_t> elements);
  int64_t record_bytes(int chunk) const;
  // Reads chunk's record into `buffer` (synchronously).
  absl::Status ReadRecord(int chunk, AlignedBuffer& buffer);

  SwappedStateOptions options_;
  std::vector<int64_t> elements_;
  std::vector<int64_t> offsets_;  // per chunk, bytes into the file
  int64_t largest_record_ = 0;
  std::unique_ptr<NvmeStore> store_;
  std::vector<AlignedBuffer> buffers_;
};

}  // namespace offload
}  // namespace ze

#endif  // ZE_OFFLOAD_SWAPPED_STATE_H_
