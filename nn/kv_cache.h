// Incremental decoding: a key/value cache and the model interface that
// fills and reads it (Hugging Face's past_key_values and generate's
// prefill / decode split).
//
//   ZE_ASSIGN_OR_RETURN(std::unique_ptr<nn::KvCache> cache,
//                       model.NewKvCache(batch, capacity, stream));
//   // Prefill: each prompt in one forward (rows of equal length together).
//   ZE_ASSIGN_OR_RETURN(Tensor logits,            // (N, 1, V)
//                       model.ForwardCached(prompts, rows, *cache, stream));
//   // Decode: one new token per row at its own position.
//   ZE_ASSIGN_OR_RETURN(logits,                   // (B, 1, V)
//                       model.ForwardCached(next, all_rows, *cache, stream));
//
// The cache is activations: the caller owns it (one per generation, sized
// for its batch and maximum length), nothing in it is a parameter, and
// under ZeRO-3 every rank keeps its own.
#ifndef ZE_NN_KV_CACHE_H_
#define ZE_NN_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/stream.h"
#include "core/tensor.h"

namespace ze {
namespace nn {

// Per layer, the keys and values of the positions each row (sequence) of a
// batch has seen so far: two (B, H, T_max, D) tensors, allocated once by
// Create. Rows fill independently: row b holds positions [0, length(b)),
// and what lies beyond is stale. Not copyable; not thread-safe.
class KvCache {
 public:
  // Allocates num_layers pairs of (batch, num_heads, capacity, head_dim)
  // tensors of `dtype` on `device` (contents undefined; every length 0),
  // owned by `stream` (the stream that will use them, core/allocator.h).
  // InvalidArgument naming the first size that is not positive or a dtype
  // that is not a float type; ResourceExhausted when the allocator refuses.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(
      int num_layers, int64_t batch, int num_heads, int64_t capacity,
      int64_t head_dim, DType dtype, const Device& device,
      const Stream& stream);
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int num_layers() const { return static_cast<int>(keys_.size()); }
  int64_t batch() const { return batch_; }
  int num_heads() const { return num_heads_; }
  int64_t capacity() const { return capacity_; }  // T_max
  int64_t head_dim() const { return head_dim_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  // Bytes of the caches' storage (2 * layers * B * H * T_max * D elements).
  int64_t nbytes() const;

  // Layer `layer`'s keys / values (B, H, T_max, D); `layer` in
  // [0, num_layers()).
  const Tensor& keys(int layer) const { return keys_[layer]; }
  const Tensor& values(int layer) const { return values_[layer]; }

  // Positions row `row` holds; `row` in [0, batch()).
  int64_t length(int64_t row) const { return lengths_[row]; }
  const std::vector<int64_t>& lengths() const { return lengths_; }

  // Records that `count` more positions of each listed row were written to
  // every layer (the model calls this after a successful cached forward).
  // InvalidArgument naming the row when one is out of range, listed twice,
  // or would exceed the capacity; nothing changes then.
  absl::Status Advance(const std::vector<int64_t>& rows, int64_t count);
  // Forgets every row's positions (all lengths 0); the storage is kept for
  // another generation of the same shape.
  void Reset();

 private:
  KvCache() = default;

  int64_t batch_ = 0;
  int num_heads_ = 0;
  int64_t capacity_ = 0;
  int64_t head_dim_ = 0;
  DType dtype_ = DType::kF32;
  Device device_;
  std::vector<Tensor> keys_;      // per layer (B, H, T_max, D)
  std::vector<Tensor> values_;    // per layer (B, H, T_max, D)
  std::vector<int64_t> lengths_;  // (B)
};

// What every IncrementalDecoder::ForwardCached checks and prepares before
// its forward (one place for GptModel and DecoderModel): the rows and each
// row's first new position, checked on the host, then on the model's device.
struct CacheSlots {
  Tensor rows;    // (N) i32 on the model's device: cache row of sequence i
  Tensor starts;  // (N) i32 on the model's device: its first new position
  // Every start is 0 (a prefill): a model may attend over the input alone.
  bool empty_prefix = false;
};

// Checks tokens (N >= 1, T >= 1) i32 on `device`, that `rows` has N
// distinct entries in [0, cache.batch()), and that each row's T new
// positions fit both the cache's capacity and `max_positions`; then copies
// the rows and starts to `device` (queued on `stream`). InvalidArgument
// starting with `op` and naming the argument (and the row) otherwise.
absl::StatusOr<CacheSlots> PrepareCacheSlots(
    const char* op, const Tensor& tokens, const std::vector<int64_t>& rows,
    const KvCache& cache, int64_t max_positions, const Device& device,
    const Stream& stream);

// x (B, T, C) -> its last positions (B, 1, C), a new tensor on x's device
// (a model's head on each sequence's last position only, during a cached
// forward).
absl::StatusOr<Tensor> LastPositions(const Tensor& x, const Stream& stream);

// A model that decodes incrementally over a KvCache (GptModel). Its
// ForwardCached runs through the public Module::Forward, so every hook
// fires as in a plain forward: ZeRO-3 gathers each module's parameters
// before it runs and releases them after, exactly as for EvalForward.
class IncrementalDecoder {
 public:
  virtual ~IncrementalDecoder() = default;

  // The longest sequence the model can attend over (its position table).
  virtual int64_t max_positions() const = 0;

  // A cache for `batch` rows of up to `capacity` positions each, on the
  // model's device and in its dtype. InvalidArgument when capacity exceeds
  // max_positions() or a size is not positive; ResourceExhausted when it
  // does not fit. `stream` is where later use is queued (allocation only).
  virtual absl::StatusOr<std::unique_ptr<KvCache>> NewKvCache(
      int64_t batch, int64_t capacity, const Stream& stream) const = 0;

  // Runs the model on T new tokens of each of N sequences:
  //   tokens (N, T) i32 on the model's device; sequence i is cache row
  //   rows[i] (distinct, in [0, cache.batch())) and its new tokens take
  //   positions [cache.length(rows[i]), + T).
  // Every layer appends the new positions' keys and values to the cache and
  // attends over the row's cached prefix and the new positions (causal).
  // Returns the logits of each sequence's last new position, (N, 1, V), a
  // fresh tensor on the model's device (queued on `stream`). On success the
  // listed rows' lengths grow by T; other rows are untouched. Prefill is a
  // call with rows of length 0 (the whole prompt as T); decoding, a call
  // with T = 1. Saves nothing for backward (no NoSaveScope needed).
  // InvalidArgument naming the argument (and the row) for bad shapes, a
  // cache of another model, dtype or device, or positions beyond the
  // capacity; a module's error otherwise. On failure the lengths are
  // unchanged (positions written beyond them are stale, overwritten later).
  virtual absl::StatusOr<Tensor> ForwardCached(const Tensor& tokens,
                                               const std::vector<int64_t>& rows,
                                               KvCache& cache,
                                               const Stream& stream) = 0;
};

}  // namespace nn
}  // namespace ze

#endif  // ZE_NN_KV_CACHE_H_
