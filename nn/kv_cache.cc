#include "nn/kv_cache.h"

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
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

}  // namespace nn
}  // namespace ze
