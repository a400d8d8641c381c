// SwappedWeights: stage 3's 16-bit (or f32) parameter partition on NVMe
// (ZeRO-Infinity's parameter tier, offload_param.device "nvme"), a record
// per bucket in one swap file, brought into host memory through a bounded
// set of aligned host buffers (offload_param.buffer_count buffers of at most
// buffer_size elements each). Knows no ZeRO stage: the caller
// (zero::PartitionState) names records by index and says which to read
// ahead (the fetch schedule's order).
//
// The file layer is NvmeStore's (offload/nvme_store.h): the file is created
// and preallocated at Create after the free space is checked, every error
// names the path, and the I/O runs on NvmeStore's workers. This class only
// owns the records' placement in the file and the buffers; it runs no thread
// of its own (read-ahead is NvmeStore's asynchronous reads, waited for when
// the record is acquired).
//
// The buffers are a small cache: a buffer holds at most one record, and a
// record is in at most one buffer (so a record's newest bytes are either
// in its buffer or, when no buffer holds it, in the file). A buffer is
// taken for another record only when nobody holds it; its I/O in flight is
// waited for first, and the caller's `before_reuse` (a CUDA upload reading
// from it) is called. The least recently used free buffer goes first.
//
// File layout: record r is bytes [offset(r), offset(r) + record_bytes(r))
// with record_bytes rounded up to NvmeStore::kAlignment; records of 0
// elements take no space (buckets kept in host memory, max_in_cpu).
//
// Not thread-safe: one caller (the engine thread) at a time.
#ifndef ZE_OFFLOAD_SWAPPED_WEIGHTS_H_
#define ZE_OFFLOAD_SWAPPED_WEIGHTS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/allocator.h"
#include "offload/nvme_store.h"

namespace ze {
namespace offload {

struct SwappedWeightsOptions {
  NvmeOptions nvme;       // directory (offload_param.nvme_path), aio settings
  std::string file_name;  // inside nvme.directory, e.g. "rank0_params.swp"
  int64_t element_bytes = 2;  // the model dtype's size
  int buffer_count = 5;       // offload_param.buffer_count (>= 1)
  // offload_param.buffer_size: elements a buffer holds at most; every
  // record must fit. Buffers are allocated at the largest record's size
  // when that is smaller (nothing larger is ever read).
  int64_t buffer_elements = 100'000'000;
  // Page-lock the buffers (core/allocator.h's HostRegistration; nothing
  // without a CUDA device): pin_memory.
  bool pin = false;
};

class SwappedWeights {
 public:
  // Creates the file (sized for every record, preallocated) and the
  // buffers. Errors: NvmeStore::Create's (directory missing or not
  // writable, too little space: each naming the path and the bytes);
  // InvalidArgument for buffer_count < 1, element_bytes < 1, a negative
  // record, or a record larger than buffer_elements (naming both sizes).
  static absl::StatusOr<std::unique_ptr<SwappedWeights>> Create(
      const SwappedWeightsOptions& options,
      const std::vector<int64_t>& record_elements);
  // Waits for outstanding I/O (errors dropped: Flush reports them) and
  // removes the file (NvmeStore's destructor).
  ~SwappedWeights();
  SwappedWeights(const SwappedWeights&) = delete;
  SwappedWeights& operator=(const SwappedWeights&) = delete;

  // Starts reading record `record` into a free buffer, unless a buffer
  // holds it already or none is free (read-ahead is best effort: Acquire
  // reads what was not read ahead). Errors: a submission refused, or the
  // previous I/O of the buffer taken (a write that failed), naming the path.
  absl::Status ReadAhead(int record);
  // The record's bytes in a host buffer (kAlignment-aligned), after its read
  // finished: read now if no buffer holds it. Valid, and not taken for
  // another record, until Release. May be acquired more than once (each
  // needs its Release). The caller may modify the bytes, then Release with
  // `dirty`. Errors: no buffer free (every one acquired: FailedPrecondition),
  // or the read's (Internal/DataLoss naming path, offset and bytes; the
  // buffer is then released and holds nothing).
  absl::StatusOr<char*> Acquire(int record);
  // As Acquire, without reading: the caller overwrites every byte of the
  // record (write-back of values held elsewhere). Waits for I/O in flight on
  // the buffer first.
  absl::StatusOr<char*> AcquireForOverwrite(int record);
  // Ends one Acquire. `dirty`: the buffer's bytes are the record's new
  // value; a write to the file is started (asynchronous; its error comes
  // back from Flush or from the I/O that next needs the buffer).
  // `before_reuse` (may be null): called before the buffer is next taken,
  // overwritten or the store destroyed, e.g. to wait for a device copy
  // still reading it; its error is returned from that call.
  absl::Status Release(int record, bool dirty,
                       std::function<absl::Status()> before_reuse = nullptr);
  // Waits for every write and read in flight; returns the first write's
  // error (a failed read ahead is forgotten: the Acquire that needs it reads
  // again and reports). Buffers keep their records (a later Acquire needs no
  // read).
  absl::Status Flush();
  // Forgets what buffer holds `record` (the caller's copy elsewhere is
  // newer, or the record is to be read from the file again). Waits for its
  // I/O first. FailedPrecondition while it is acquired.
  absl::Status Forget(int record);

  int num_records() const { return static_cast<int>(elements_.size()); }
  int64_t record_elements(int record) const { return elements_[record]; }
  // Whether any buffer holds the record (tests, reports).
  bool cached(int record) const;
  int64_t file_bytes() const { return store_->size_bytes(); }
  // Host bytes of the buffers.
  int64_t buffer_bytes() const;
  const NvmeStore& store() const { return *store_; }

  // Bytes one buffer takes for records of up to `largest_record` elements
  // (the plan's figure: zero/plan.h).
  static int64_t BufferBytes(const SwappedWeightsOptions& options,
                             int64_t largest_record);
  // File bytes of records of these sizes.
  static int64_t FileBytes(const SwappedWeightsOptions& options,
                           const std::vector<int64_t>& record_elements);

 private:
  struct Buffer {
    AlignedBuffer memory;
    int record = -1;  // the record whose bytes it holds (or is reading)
    std::optional<IoTicket> io;  // read or write in flight
    bool reading = false;        // `io` is a read (bytes not valid yet)
    int users = 0;               // Acquire without Release
    int64_t last_use = 0;        // for least-recently-used reuse
    std::function<absl::Status()> before_reuse;
  };
  SwappedWeights(const SwappedWeightsOptions& options,
                 std::vector<int64_t> elements);
  int64_t record_bytes(int record) const;
  absl::Status CheckRecord(int record) const;
  // The buffer holding `record`, or -1.
  int Find(int record) const;
  // Waits for the buffer's I/O in flight and its before_reuse.
  absl::Status Settle(Buffer& buffer);
  // A buffer nobody holds, emptied (settled) for new contents; -1 when
  // every buffer is acquired.
  absl::StatusOr<int> TakeFree();

  SwappedWeightsOptions options_;
  std::vector<int64_t> elements_;
  std::vector<int64_t> offsets_;
  int64_t largest_record_ = 0;
  std::unique_ptr<NvmeStore> store_;
  std::vector<Buffer> buffers_;
  HostRegistration pinned_;
  int64_t clock_ = 0;
};

}  // namespace offload
}  // namespace ze

#endif  // ZE_OFFLOAD_SWAPPED_WEIGHTS_H_
