#include "nn/kv_cache.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops.h"
#include "core/status.h"

namespace ze {
namespace nn {

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(
    int num_layers, int64_t batch, int num_heads, int64_t capacity,
    int64_t head_dim, DType dtype, const Device& device, const Stream& stream) {
  for (const auto& [name, value] :
       std::vector<std::pair<const char*, int64_t>>{{"num_layers", num_layers},
                                                    {"batch", batch},
                                                    {"num_heads", num_heads},
                                                    {"capacity", capacity},
                                                    {"head_dim", head_dim}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvCache: ", name, " = ", value, " must be positive"));
    }
  }
  if (dtype == DType::kI32) {
    return absl::InvalidArgumentError(
        "KvCache: dtype must be a float type, got i32");
  }
  std::unique_ptr<KvCache> cache(new KvCache());
  cache->batch_ = batch;
  cache->num_heads_ = num_heads;
  cache->capacity_ = capacity;
  cache->head_dim_ = head_dim;
  cache->dtype_ = dtype;
  cache->device_ = device;
  cache->lengths_.assign(batch, 0);
  // Device blocks belong to the stream that uses them.
  StreamGuard guard(stream);
  const Shape shape = {batch, num_heads, capacity, head_dim};
  for (int layer = 0; layer < num_layers; ++layer) {
    ZE_ASSIGN_OR_RETURN(Tensor keys, Tensor::Empty(shape, dtype, device));
    ZE_ASSIGN_OR_RETURN(Tensor values, Tensor::Empty(shape, dtype, device));
    cache->keys_.push_back(std::move(keys));
    cache->values_.push_back(std::move(values));
  }
  return cache;
}

int64_t KvCache::nbytes() const {
  int64_t bytes = 0;
  for (const Tensor& keys : keys_) bytes += 2 * keys.nbytes();
  return bytes;
}

absl::Status KvCache::Advance(const std::vector<int64_t>& rows, int64_t count) {
  std::set<int64_t> seen;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t row = rows[i];
    if (row < 0 || row >= batch_ || !seen.insert(row).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvCache::Advance: rows[", i, "] = ", row,
                       row < 0 || row >= batch_
                           ? absl::StrCat(" is outside [0, ", batch_, ")")
                           : std::string(" is listed twice")));
    }
    if (count < 0 || lengths_[row] + count > capacity_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KvCache::Advance: row ", row, " holds ", lengths_[row],
          " positions; ", count, " more do not fit its capacity ", capacity_));
    }
  }
  for (int64_t row : rows) lengths_[row] += count;
  return absl::OkStatus();
}

void KvCache::Reset() { lengths_.assign(batch_, 0); }

absl::StatusOr<CacheSlots> PrepareCacheSlots(
    const char* op, const Tensor& tokens, const std::vector<int64_t>& rows,
    const KvCache& cache, int64_t max_positions, const Device& device,
    const Stream& stream) {
  if (!tokens.defined() || tokens.dim() != 2 || tokens.dtype() != DType::kI32 ||
      tokens.size(0) < 1 || tokens.size(1) < 1 || tokens.device() != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": tokens must be (N >= 1, T >= 1) i32 on ", device.ToString(),
        ", got ", tokens.defined() ? tokens.DebugString() : "undefined"));
  }
  const int64_t n = tokens.size(0), seq = tokens.size(1);
  if (static_cast<int64_t>(rows.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": rows has ", rows.size(),
                     " entries, tokens has N = ", n, " sequences"));
  }
  // Host copies of the rows and their first new positions; checked here,
  // once, because the CUDA kernels trust them.
  ZE_ASSIGN_OR_RETURN(Tensor host_slots,
                      Tensor::Empty({2, n}, DType::kI32, Device::Cpu()));
  int32_t* slot_values = host_slots.data_as<int32_t>();
  std::vector<bool> listed(cache.batch(), false);
  bool empty_prefix = true;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = rows[i];
    if (row < 0 || row >= cache.batch() || listed[row]) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": rows[", i, "] = ", row,
                       row < 0 || row >= cache.batch()
                           ? absl::StrCat(" is outside the cache's batch [0, ",
                                          cache.batch(), ")")
                           : std::string(" is listed twice")));
    }
    listed[row] = true;
    const int64_t start = cache.length(row);
    const int64_t limit = std::min(cache.capacity(), max_positions);
    if (start + seq > limit) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": row ", row, " holds ", start, " positions; ", seq,
          " more exceed ",
          limit == cache.capacity() ? "the cache's capacity "
                                    : "the model's maximum positions ",
          limit));
    }
    slot_values[i] = static_cast<int32_t>(row);
    slot_values[n + i] = static_cast<int32_t>(start);
    empty_prefix = empty_prefix && start == 0;
  }
  Tensor slots = host_slots;
  if (device.is_cuda()) {
    StreamGuard guard(stream);
    ZE_ASSIGN_OR_RETURN(slots, Tensor::Empty({2, n}, DType::kI32, device));
    ZE_RETURN_IF_ERROR(Copy(host_slots, slots, stream));
  }
  CacheSlots result;
  result.rows = slots.Flat().Slice(0, n);
  result.starts = slots.Flat().Slice(n, n);
  result.empty_prefix = empty_prefix;
  return result;
}

absl::StatusOr<Tensor> LastPositions(const Tensor& x, const Stream& stream) {
  if (!x.defined() || x.dim() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("LastPositions: x must be (B, T, C), got ",
                     x.defined() ? ShapeToString(x.shape()) : "undefined"));
  }
  const int64_t batch = x.size(0), seq = x.size(1), channels = x.size(2);
  StreamGuard guard(stream);
  ZE_ASSIGN_OR_RETURN(
      Tensor last, Tensor::Empty({batch, 1, channels}, x.dtype(), x.device()));
  const Tensor from = x.Flat(), to = last.Flat();
  for (int64_t b = 0; b < batch; ++b) {
    ZE_RETURN_IF_ERROR(
        Copy(from.Slice((b * seq + seq - 1) * channels, channels),
             to.Slice(b * channels, channels), stream));
  }
  return last;
}

}  // namespace nn
}  // namespace ze
