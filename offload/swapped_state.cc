#include "offload/swapped_state.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace ze {
namespace offload {
namespace {}  // namespace

SwappedState::SwappedState(const SwappedStateOptions& options,
                           std::vector<int64_t> elements)
    : options_(options), elements_(std::move(elements)) {
  int64_t offset = 0;
  for (int chunk = 0; chunk < num_chunks(); ++chunk) {
    offsets_.push_back(offset);
    offset += record_bytes(chunk);
    largest_record_ = std::max(largest_record_, record_bytes(chunk));
  }
}

int64_t SwappedState::record_bytes(int chunk) const {
  return NvmeStore::AlignedSize(int64_t{4} * options_.arrays *
                                elements_[chunk]);
}

int64_t SwappedState::buffer_bytes() const {
  return largest_record_ * static_cast<int64_t>(buffers_.size());
}

absl::StatusOr<std::unique_ptr<SwappedState>> SwappedState::Create(
    const SwappedStateOptions& options,
    const std::vector<int64_t>& chunk_elements) {
  if (options.arrays < 1 || options.buffer_count < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "swapped optimizer state: arrays (", options.arrays,
        ") must be >= 1 and buffer_count (", options.buffer_count, ") >= 2"));
  }
  for (int64_t elements : chunk_elements) {
    if (elements < 0) {
      return absl::InvalidArgumentError(
          "swapped optimizer state: a chunk has a negative size");
    }
  }
  std::unique_ptr<SwappedState> state(
      new SwappedState(options, chunk_elements));
  int64_t total = 0;
  for (int chunk = 0; chunk < state->num_chunks(); ++chunk) {
    total += state->record_bytes(chunk);
  }
  ZE_ASSIGN_OR_RETURN(state->store_,
                      NvmeStore::Create(options.nvme, options.file_name,
                                        std::max<int64_t>(total, 1)));
  const int64_t buffer =
      std::max<int64_t>(state->largest_record_, NvmeStore::kAlignment);
  for (int i = 0; i < options.buffer_count; ++i) {
    ZE_ASSIGN_OR_RETURN(AlignedBuffer allocated,
                        AlignedBuffer::Allocate(buffer));
    state->buffers_.push_back(std::move(allocated));
  }
  return state;
}

absl::Status SwappedState::ReadRecord(int chunk, AlignedBuffer& buffer) {
  ZE_ASSIGN_OR_RETURN(
      IoTicket ticket,
      store_->Read(offsets_[chunk], buffer.data(), record_bytes(chunk)));
  return store_->Wait(ticket);
}

absl::Status SwappedState::Initialize(int chunk, const float* first) {
  AlignedBuffer& buffer = buffers_[0];
  std::memset(buffer.data(), 0, record_bytes(chunk));
  std::memcpy(buffer.data(), first, sizeof(float) * elements_[chunk]);
  ZE_ASSIGN_OR_RETURN(
      IoTicket ticket,
      store_->Write(offsets_[chunk], buffer.data(), record_bytes(chunk)));
  return store_->Wait(ticket);
}

absl::Status SwappedState::Update(
    const std::vector<int>& order,
    const std::function<absl::Status(int chunk, float* const* arrays)>& visit) {
  const int slots = static_cast<int>(buffers_.size());
  // Per slot: the I/O in flight on its buffer (a read ahead, or a write
  // behind).
  std::vector<std::optional<IoTicket>> pending(slots);
  absl::Status failure;
  auto settle = [&](int slot) {
    if (!pending[slot]) return;
    absl::Status status = store_->Wait(*pending[slot]);
    pending[slot].reset();
    if (failure.ok() && !status.ok()) failure = status;
  };
  // Keeps reads ahead of the visits, on the slots no visit is using.
  size_t next_read = 0;
  auto read_ahead = [&](size_t visiting) {
    while (failure.ok() && next_read < order.size() &&
           next_read < visiting + static_cast<size_t>(slots) - 1) {
      const int slot = static_cast<int>(next_read % slots);
      settle(slot);  // the write behind of the chunk that used it
      if (!failure.ok()) return;
      const int chunk = order[next_read];
      absl::StatusOr<IoTicket> ticket = store_->Read(
          offsets_[chunk], buffers_[slot].data(), record_bytes(chunk));
      if (!ticket.ok()) {
        failure = ticket.status();
        return;
      }
      pending[slot] = *ticket;
      ++next_read;
    }
  };
  for (size_t i = 0; i < order.size() && failure.ok(); ++i) {
    read_ahead(i);
    if (!failure.ok()) break;
    const int slot = static_cast<int>(i % slots);
    settle(slot);  // this chunk's read
    if (!failure.ok()) break;
    const int chunk = order[i];
    std::vector<float*> arrays(options_.arrays);
    for (int a = 0; a < options_.arrays; ++a) {
      arrays[a] = reinterpret_cast<float*>(buffers_[slot].data()) +
                  static_cast<int64_t>(a) * elements_[chunk];
    }
    absl::Status visited = visit(chunk, arrays.data());
    if (!visited.ok()) {
      failure = visited;
      break;
    }
    absl::StatusOr<IoTicket> written = store_->Write(
        offsets_[chunk], buffers_[slot].data(), record_bytes(chunk));
    if (!written.ok()) {
      failure = written.status();
      break;
    }
    pending[slot] = *written;
  }
  for (int slot = 0; slot < slots; ++slot) settle(slot);
  return failure;
}

absl::Status SwappedState::Read(int chunk, int array, int64_t begin,
                                int64_t count, float* out) {
  AlignedBuffer& buffer = buffers_[0];
  ZE_RETURN_IF_ERROR(ReadRecord(chunk, buffer));
  const float* values = reinterpret_cast<const float*>(buffer.data()) +
                        static_cast<int64_t>(array) * elements_[chunk] + begin;
  std::memcpy(out, values, sizeof(float) * count);
  return absl::OkStatus();
}

absl::Status SwappedState::Write(int chunk, int array, int64_t begin,
                                 int64_t count, const float* values) {
  AlignedBuffer& buffer = buffers_[0];
  ZE_RETURN_IF_ERROR(ReadRecord(chunk, buffer));
  float* destination = reinterpret_cast<float*>(buffer.data()) +
                       static_cast<int64_t>(array) * elements_[chunk] + begin;
  std::memcpy(destination, values, sizeof(float) * count);
  ZE_ASSIGN_OR_RETURN(
      IoTicket ticket,
      store_->Write(offsets_[chunk], buffer.data(), record_bytes(chunk)));
  return store_->Wait(ticket);
}

}  // namespace offload
}  // namespace ze
