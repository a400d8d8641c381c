// Flat, padded, partitioned buffer layout: where every parameter lives.
//
// ZeRO keeps parameters, gradients, master weights and optimizer state in
// flat buffers that every rank partitions the same way. This file computes
// that layout once, from the ordered parameter list and the world size, and
// answers every "where does it live" question the stages, the optimizer,
// offload and checkpointing ask. It allocates nothing and knows no dtype:
// offsets and sizes are in elements, so one layout serves the 16-bit model
// weights, the f32 master weights, the gradients and each optimizer moment.
//
// The design: buckets, each partitioned on its own.
//
//   The ordered parameter list is cut into buckets (at most
//   `bucket_max_elements` each; a larger parameter gets a bucket to itself).
//   Each bucket is one flat buffer: its parameters laid end to end, each
//   starting at a multiple of `param_alignment`, then padded so it divides
//   into `world_size` equal slices whose length is a multiple of
//   `slice_alignment`. Rank r owns slice r of every bucket.
//
//     bucket b buffer (padded_elements = world_size * slice_elements):
//       | slice 0 (rank 0) | slice 1 (rank 1) | ... | slice N-1 | ; a
//       parameter may straddle slices.
//
//   A rank's *partition* is the concatenation of its slices of every bucket,
//   in bucket order:
//
//     partition of rank r = [ b0.slice(r) | b1.slice(r) | ... ]
//
//   Every rank's partition has the same length, and bucket b's slice starts
//   at the same partition offset (BucketPartitionOffset(b)) on every rank.
//
// Why per-bucket partitions rather than one partition of one big buffer:
//
//   - Stage 2: when bucket b's gradients are complete, one reduce-scatter of
//     the bucket buffer (equal chunks of slice_elements, as NCCL requires)
//     lands each rank's reduced chunk contiguously in its gradient partition
//     at BucketPartitionOffset(b). No rank ever holds more than the buckets in
//     flight, and no reduce is split at partition boundaries.
//   - Stage 1/2: the optimizer updates the whole partition in one pass (the
//     master weights, moments and gradient partitions share this layout),
//     then each bucket's 16-bit weights are all-gathered from the partition
//     segment at BucketPartitionOffset(b) into the bucket buffer. Several
//     buckets can be all-gathered in one grouped call (allgather_bucket_size).
//   - Stage 3: a bucket per module (BuildFromGroups) is exactly the unit the
//     fetcher gathers and reduce-scatters.
//   The cost is padding per bucket (below world_size * slice_alignment +
//   param_alignment per parameter), negligible for buckets of millions.
//
// Padding elements belong to no parameter. Kept at zero in gradients and
// weights, they stay zero under every optimizer here (zero gradient, zero
// moments, decay of zero), so they never disturb norms or updates.
#ifndef ZE_ZERO_FLAT_LAYOUT_H_
#define ZE_ZERO_FLAT_LAYOUT_H_

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"

namespace ze {
namespace zero {

// 128 elements: 256 bytes of bf16/f16, 512 of f32. Every slice start is then
// aligned for 16-byte vector loads, NCCL's fast paths and the allocator's
// 256-byte blocks, whatever the element type.
inline constexpr int64_t kDefaultSliceAlignment = 128;
// 16 elements: 32 bytes of bf16 (64 of f32), so a per-parameter view into a
// bucket buffer is aligned for cuBLAS/TMA (16 bytes) and 16-byte vector
// loads. Costs under 16 elements per parameter.
inline constexpr int64_t kDefaultParamAlignment = 16;

// One parameter as the layout sees it: a name and its number of elements
// (the flattened shape).
struct ParamSpec {
  std::string name;
  int64_t numel = 0;
};

// The elements [begin, end) of one flat buffer (a bucket, or a partition)
// that `rank` owns. The small value every stage, the optimizer, offload and
// checkpointing speak in.
struct PartitionSlice {
  int rank = 0;
  int64_t begin = 0;
  int64_t end = 0;

  int64_t size() const { return end - begin; }
  bool Contains(int64_t index) const { return index >= begin && index < end; }
  friend bool operator==(const PartitionSlice& a, const PartitionSlice& b) {
    return a.rank == b.rank && a.begin == b.begin && a.end == b.end;
  }
};

// Where one whole parameter sits.
struct ParamPlacement {
  int bucket = 0;      // the bucket holding it
  int64_t offset = 0;  // its first element within the bucket buffer
  int64_t numel = 0;
};

// A contiguous piece of one parameter that one rank owns.
//   parameter elements [param_begin, param_begin + count)
//   == bucket buffer elements [bucket_offset, bucket_offset + count)
//   == rank's partition elements [partition_offset, partition_offset + count)
struct ParamShard {
  int param_index = 0;
  int rank = 0;
  int bucket = 0;
  int64_t param_begin = 0;
  int64_t count = 0;
  int64_t bucket_offset = 0;
  int64_t partition_offset = 0;

  friend bool operator==(const ParamShard& a, const ParamShard& b) {
    return a.param_index == b.param_index && a.rank == b.rank &&
           a.bucket == b.bucket && a.param_begin == b.param_begin &&
           a.count == b.count && a.bucket_offset == b.bucket_offset &&
           a.partition_offset == b.partition_offset;
  }
};

// One bucket: a flat buffer of consecutive parameters.
struct BucketLayout {
  int first_param = 0;  // parameters [first_param, end_param)
  int end_param = 0;
  int64_t content_elements = 0;  // end of the last parameter
  int64_t slice_elements = 0;    // each rank's share
  int64_t padded_elements = 0;   // world_size * slice_elements
  int64_t partition_offset = 0;  // where its slice sits in every partition
};

struct LayoutOptions {
  int world_size = 1;
  // Greedy bucketing: a bucket closes when the next parameter (with its
  // alignment padding) would take its content past this. 0: one bucket.
  // Counts elements, as DeepSpeed's reduce_bucket_size does.
  int64_t bucket_max_elements = 0;
  int64_t slice_alignment = kDefaultSliceAlignment;
  int64_t param_alignment = kDefaultParamAlignment;
};

// Immutable; cheap to copy. Build it once at initialisation; query it from
// any thread.
class PartitionedLayout {
 public:
  // Lays `params` out in order, cut into buckets per `options`.
  // Fails with InvalidArgument when world_size < 1, an alignment < 1,
  // bucket_max_elements < 0, a parameter has a negative size or two share a
  // name (the message names them). An empty list gives an empty layout.
  static absl::StatusOr<PartitionedLayout> Build(std::vector<ParamSpec> params,
                                                 const LayoutOptions& options);

  // Like Build, but each inner list is one bucket, whatever its size (stage
  // 3: one bucket per module). options.bucket_max_elements is ignored.
  // Empty groups are skipped.
  static absl::StatusOr<PartitionedLayout> BuildFromGroups(
      const std::vector<std::vector<ParamSpec>>& groups,
      const LayoutOptions& options);

  PartitionedLayout() = default;

  int world_size() const { return options_.world_size; }
  const LayoutOptions& options() const { return options_; }

  int num_params() const { return static_cast<int>(params_.size()); }
  const ParamSpec& param(int index) const { return params_[index]; }
  const ParamPlacement& placement(int index) const {
    return placements_[index];
  }
  // Index of the parameter called `name`; NotFound naming it otherwise.
  absl::StatusOr<int> FindParam(const std::string& name) const;

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  const BucketLayout& bucket(int index) const { return buckets_[index]; }
  // Rank `rank`'s slice of bucket `bucket`, in bucket-buffer elements.
  PartitionSlice BucketSlice(int bucket, int rank) const;

  // Elements in each rank's partition (equal for all ranks): the sum of the
  // buckets' slice_elements. Size of a rank's master weights, moments and
  // (stage 2) gradient partition.
  int64_t partition_elements() const { return partition_elements_; }
  // Sum of the buckets' padded sizes: world_size * partition_elements().
  // Size of the full (replicated) weights or gradients, padding included.
  int64_t padded_total_elements() const {
    return partition_elements_ * options_.world_size;
  }
  // Sum of the parameters' sizes (no padding): Psi.
  int64_t total_param_elements() const { return total_param_elements_; }
  // Rank `rank`'s partition as a slice of the concatenated bucket buffers
  // (for checkpoint manifests; begin = rank * partition_elements()).
  PartitionSlice RankPartition(int rank) const;

  // Every piece of every parameter that `rank` owns, in partition order
  // (which is parameter order). Stage 1/2 updates, manifests and resharding
  // use it. Zero-size parameters own nothing and never appear.
  std::vector<ParamShard> RankShards(int rank) const;

  // Which ranks own elements [begin, end) of parameter `param_index`, as
  // pieces in parameter order. Resharding loads each range a new layout
  // needs from the ranks of an old layout this way. Requires
  // 0 <= begin <= end <= numel (aborts otherwise: a caller bug).
  std::vector<ParamShard> LocateParamRange(int param_index, int64_t begin,
                                           int64_t end) const;

  // A one-line summary: world size, buckets, Psi, padded total, partition.
  std::string DebugString() const;

 private:
  // Places one bucket of params_[first, end) and appends it.
  void AppendBucket(int first, int end);

  LayoutOptions options_;
  std::vector<ParamSpec> params_;
  std::vector<ParamPlacement> placements_;
  std::vector<BucketLayout> buckets_;
  std::unordered_map<std::string, int> index_by_name_;
  int64_t partition_elements_ = 0;
  int64_t total_param_elements_ = 0;
};

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_FLAT_LAYOUT_H_
