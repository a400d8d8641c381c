#include "offload/swapped_weights.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace ze {
namespace offload {

SwappedWeights::SwappedWeights(const SwappedWeightsOptions& options,
                               std::vector<int64_t> elements)
    : options_(options), elements_(std::move(elements)) {
  int64_t offset = 0;
  for (int record = 0; record < num_records(); ++record) {
    offsets_.push_back(offset);
    offset += record_bytes(record);
    largest_record_ = std::max(largest_record_, elements_[record]);
  }
}

int64_t SwappedWeights::record_bytes(int record) const {
  return NvmeStore::AlignedSize(options_.element_bytes * elements_[record]);
}

int64_t SwappedWeights::BufferBytes(const SwappedWeightsOptions& options,
                                    int64_t largest_record) {
  return NvmeStore::AlignedSize(std::max<int64_t>(
      options.element_bytes * std::min(options.buffer_elements, largest_record),
      1));
}

int64_t SwappedWeights::FileBytes(const SwappedWeightsOptions& options,
                                  const std::vector<int64_t>& record_elements) {
  int64_t total = 0;
  for (int64_t elements : record_elements) {
    total += NvmeStore::AlignedSize(options.element_bytes * elements);
  }
  return total;
}

int64_t SwappedWeights::buffer_bytes() const {
  int64_t total = 0;
  for (const Buffer& buffer : buffers_) total += buffer.memory.size();
  return total;
}

absl::StatusOr<std::unique_ptr<SwappedWeights>> SwappedWeights::Create(
    const SwappedWeightsOptions& options,
    const std::vector<int64_t>& record_elements) {
  const std::string where = absl::StrCat(
      "swapped parameters ", options.nvme.directory, "/", options.file_name);
  if (options.buffer_count < 1 || options.element_bytes < 1 ||
      options.buffer_elements < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": buffer_count (", options.buffer_count, "), buffer_size (",
        options.buffer_elements, ") and element bytes (", options.element_bytes,
        ") must be >= 1"));
  }
  for (size_t r = 0; r < record_elements.size(); ++r) {
    if (record_elements[r] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": record ", r, " has a negative size"));
    }
    if (record_elements[r] > options.buffer_elements) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": record ", r, " has ", record_elements[r],
                       " elements, more than a swap buffer holds (buffer_size ",
                       options.buffer_elements, ")"));
    }
  }
  std::unique_ptr<SwappedWeights> swapped(
      new SwappedWeights(options, record_elements));
  ZE_ASSIGN_OR_RETURN(
      swapped->store_,
      NvmeStore::Create(
          options.nvme, options.file_name,
          std::max<int64_t>(FileBytes(options, record_elements), 1)));
  const int64_t bytes = BufferBytes(options, swapped->largest_record_);
  std::vector<HostRegistration::Span> spans;
  for (int i = 0; i < options.buffer_count; ++i) {
    ZE_ASSIGN_OR_RETURN(AlignedBuffer memory, AlignedBuffer::Allocate(bytes));
    spans.push_back({memory.data(), static_cast<size_t>(memory.size())});
    Buffer buffer;
    buffer.memory = std::move(memory);
    swapped->buffers_.push_back(std::move(buffer));
  }
  if (options.pin) {
    ZE_ASSIGN_OR_RETURN(swapped->pinned_,
                        HostRegistration::Create(std::move(spans)));
  }
  return swapped;
}

SwappedWeights::~SwappedWeights() {
  // Nothing may still read or write a buffer when its memory goes.
  for (Buffer& buffer : buffers_) {
    Settle(buffer).IgnoreError();
  }
}

absl::Status SwappedWeights::CheckRecord(int record) const {
  if (record < 0 || record >= num_records()) {
    return absl::InvalidArgumentError(
        absl::StrCat("swapped parameters ", store_->path(), ": no record ",
                     record, " (", num_records(), " records)"));
  }
  return absl::OkStatus();
}

int SwappedWeights::Find(int record) const {
  for (size_t i = 0; i < buffers_.size(); ++i) {
    if (buffers_[i].record == record) return static_cast<int>(i);
  }
  return -1;
}

bool SwappedWeights::cached(int record) const { return Find(record) >= 0; }

absl::Status SwappedWeights::Settle(Buffer& buffer) {
  absl::Status status;
  if (buffer.io) {
    status = store_->Wait(*buffer.io);
    buffer.io.reset();
    if (!status.ok() && buffer.reading) buffer.record = -1;  // bytes invalid
    buffer.reading = false;
  }
  if (buffer.before_reuse) {
    absl::Status reuse = buffer.before_reuse();
    buffer.before_reuse = nullptr;
    if (status.ok()) status = reuse;
  }
  return status;
}

absl::StatusOr<int> SwappedWeights::TakeFree() {
  int chosen = -1;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    const Buffer& buffer = buffers_[i];
    if (buffer.users > 0) continue;
    // An empty buffer first, else the least recently used.
    if (chosen < 0 || (buffer.record < 0 && buffers_[chosen].record >= 0) ||
        ((buffer.record < 0) == (buffers_[chosen].record < 0) &&
         buffer.last_use < buffers_[chosen].last_use)) {
      chosen = static_cast<int>(i);
    }
  }
  if (chosen < 0) return -1;
  Buffer& buffer = buffers_[chosen];
  absl::Status settled = Settle(buffer);
  buffer.record = -1;
  ZE_RETURN_IF_ERROR(settled);
  return chosen;
}

absl::Status SwappedWeights::ReadAhead(int record) {
  ZE_RETURN_IF_ERROR(CheckRecord(record));
  if (elements_[record] == 0 || Find(record) >= 0) return absl::OkStatus();
  ZE_ASSIGN_OR_RETURN(const int free, TakeFree());
  if (free < 0) return absl::OkStatus();
  Buffer& buffer = buffers_[free];
  ZE_ASSIGN_OR_RETURN(IoTicket ticket,
                      store_->Read(offsets_[record], buffer.memory.data(),
                                   record_bytes(record)));
  buffer.record = record;
  buffer.io = ticket;
  buffer.reading = true;
  buffer.last_use = ++clock_;
  return absl::OkStatus();
}

absl::StatusOr<char*> SwappedWeights::Acquire(int record) {
  ZE_RETURN_IF_ERROR(CheckRecord(record));
  int found = Find(record);
  if (found < 0) {
    ZE_RETURN_IF_ERROR(ReadAhead(record));
    found = Find(record);
    if (found < 0 && elements_[record] > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "swapped parameters ", store_->path(), ": all ", buffers_.size(),
          " swap buffers are in use (offload_param.buffer_count); record ",
          record, " cannot be read"));
    }
    if (found < 0) {
      // A record of 0 elements: any pointer will do, nothing is read.
      return buffers_[0].memory.data();
    }
  }
  Buffer& buffer = buffers_[found];
  // A write in flight reads the bytes the caller may now change.
  if (buffer.io) {
    absl::Status status = store_->Wait(*buffer.io);
    buffer.io.reset();
    const bool was_reading = buffer.reading;
    buffer.reading = false;
    if (!status.ok()) {
      if (was_reading) buffer.record = -1;
      return status;
    }
  }
  if (buffer.before_reuse && buffer.users == 0) {
    // Only readers ran before: the caller may write the bytes now.
    absl::Status reuse = buffer.before_reuse();
    buffer.before_reuse = nullptr;
    ZE_RETURN_IF_ERROR(reuse);
  }
  ++buffer.users;
  buffer.last_use = ++clock_;
  return buffer.memory.data();
}

absl::StatusOr<char*> SwappedWeights::AcquireForOverwrite(int record) {
  ZE_RETURN_IF_ERROR(CheckRecord(record));
  int found = Find(record);
  if (found >= 0) {
    Buffer& buffer = buffers_[found];
    if (buffer.users > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("swapped parameters ", store_->path(), ": record ",
                       record, " is acquired; it cannot be overwritten"));
    }
    absl::Status settled = Settle(buffer);
    // Its old bytes are dropped whatever the read did.
    buffer.record = record;
    ZE_RETURN_IF_ERROR(settled);
  } else {
    ZE_ASSIGN_OR_RETURN(found, TakeFree());
    if (found < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "swapped parameters ", store_->path(), ": all ", buffers_.size(),
          " swap buffers are in use (offload_param.buffer_count); record ",
          record, " cannot be written"));
    }
    buffers_[found].record = record;
  }
  Buffer& buffer = buffers_[found];
  ++buffer.users;
  buffer.last_use = ++clock_;
  return buffer.memory.data();
}

absl::Status SwappedWeights::Release(
    int record, bool dirty, std::function<absl::Status()> before_reuse) {
  ZE_RETURN_IF_ERROR(CheckRecord(record));
  const int found = Find(record);
  if (found < 0 || buffers_[found].users == 0) {
    if (elements_[record] == 0) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("swapped parameters ", store_->path(), ": record ", record,
                     " released but not acquired"));
  }
  Buffer& buffer = buffers_[found];
  --buffer.users;
  if (before_reuse) {
    if (buffer.before_reuse) {
      // Both must run: chain them.
      buffer.before_reuse = [first = std::move(buffer.before_reuse),
                             second = std::move(before_reuse)]() {
        absl::Status status = first();
        absl::Status later = second();
        return status.ok() ? later : status;
      };
    } else {
      buffer.before_reuse = std::move(before_reuse);
    }
  }
  if (!dirty) return absl::OkStatus();
  if (buffer.io) {
    // Only a write can be in flight on an acquired buffer's valid bytes
    // (Acquire waited for the read): it wrote the older value; the file must
    // end with this one, so this write goes after it.
    absl::Status status = store_->Wait(*buffer.io);
    buffer.io.reset();
    ZE_RETURN_IF_ERROR(status);
  }
  absl::StatusOr<IoTicket> ticket = store_->Write(
      offsets_[record], buffer.memory.data(), record_bytes(record));
  if (!ticket.ok()) {
    // The buffer holds bytes the file lacks, and nobody will write them:
    // drop them so no later reader trusts either copy silently.
    if (buffer.users == 0) buffer.record = -1;
    return ticket.status();
  }
  buffer.io = *ticket;
  buffer.reading = false;
  return absl::OkStatus();
}

absl::Status SwappedWeights::Flush() {
  absl::Status first;
  for (Buffer& buffer : buffers_) {
    if (!buffer.io) continue;
    absl::Status status = store_->Wait(*buffer.io);
    buffer.io.reset();
    if (!status.ok()) {
      // A failed read holds nothing; a failed write's bytes are not in the
      // file: forget both, so the next read goes to the file (which holds
      // the record's previous value) and the caller decides. A read ahead
      // that failed is not Flush's error: nobody asked for its bytes yet,
      // and the Acquire that does reads again and reports.
      buffer.record = -1;
      if (first.ok() && !buffer.reading) first = status;
    }
    buffer.reading = false;
  }
  return first;
}

absl::Status SwappedWeights::Forget(int record) {
  ZE_RETURN_IF_ERROR(CheckRecord(record));
  const int found = Find(record);
  if (found < 0) return absl::OkStatus();
  Buffer& buffer = buffers_[found];
  if (buffer.users > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("swapped parameters ", store_->path(), ": record ", record,
                     " is acquired; it cannot be forgotten"));
  }
  absl::Status settled = Settle(buffer);
  buffer.record = -1;
  return settled;
}

}  // namespace offload
}  // namespace ze
