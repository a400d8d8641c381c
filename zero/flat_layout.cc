#include "zero/flat_layout.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace ze {
namespace zero {
namespace {

int64_t RoundUp(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

int64_t CeilDiv(int64_t value, int64_t divisor) {
  return (value + divisor - 1) / divisor;
}

absl::Status ValidateOptions(const LayoutOptions& options) {
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout: world_size must be >= 1, got ", options.world_size));
  }
  if (options.slice_alignment < 1 || options.param_alignment < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout: alignments must be >= 1, got slice_alignment ",
                     options.slice_alignment, " and param_alignment ",
                     options.param_alignment));
  }
  if (options.bucket_max_elements < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout: bucket_max_elements must be >= 0, got ",
                     options.bucket_max_elements));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PartitionedLayout> PartitionedLayout::BuildFromGroups(
    const std::vector<std::vector<ParamSpec>>& groups,
    const LayoutOptions& options) {
  ZE_RETURN_IF_ERROR(ValidateOptions(options));
  PartitionedLayout layout;
  layout.options_ = options;
  for (const auto& group : groups) {
    if (group.empty()) continue;
    const int first = layout.num_params();
    for (const ParamSpec& spec : group) {
      if (spec.numel < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("layout: parameter '", spec.name,
                         "' has negative size ", spec.numel));
      }
      if (!layout.index_by_name_.emplace(spec.name, layout.num_params())
               .second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "layout: parameter name '", spec.name, "' appears twice"));
      }
      layout.params_.push_back(spec);
      layout.total_param_elements_ += spec.numel;
    }
    layout.AppendBucket(first, layout.num_params());
  }
  return layout;
}

absl::StatusOr<PartitionedLayout> PartitionedLayout::Build(
    std::vector<ParamSpec> params, const LayoutOptions& options) {
  ZE_RETURN_IF_ERROR(ValidateOptions(options));
  // Greedy cut in order: the gradient of a bucket is reduced when its last
  // parameter's gradient arrives, so buckets must be runs of the order the
  // caller chose (for stage 2, the order gradients become ready).
  std::vector<std::vector<ParamSpec>> groups;
  int64_t content = 0;
  for (ParamSpec& spec : params) {
    const int64_t end_if_added = RoundUp(content, options.param_alignment) +
                                 std::max<int64_t>(spec.numel, 0);
    const bool closes = options.bucket_max_elements > 0 && !groups.empty() &&
                        !groups.back().empty() &&
                        end_if_added > options.bucket_max_elements;
    if (groups.empty() || closes) {
      groups.emplace_back();
      content = 0;
    }
    content = RoundUp(content, options.param_alignment) +
              std::max<int64_t>(spec.numel, 0);
    groups.back().push_back(std::move(spec));
  }
  return BuildFromGroups(groups, options);
}

void PartitionedLayout::AppendBucket(int first, int end) {
  BucketLayout bucket;
  bucket.first_param = first;
  bucket.end_param = end;
  int64_t cursor = 0;
  for (int i = first; i < end; ++i) {
    cursor = RoundUp(cursor, options_.param_alignment);
    placements_.push_back(
        ParamPlacement{num_buckets(), cursor, params_[i].numel});
    cursor += params_[i].numel;
  }
  bucket.content_elements = cursor;
  // Equal slices, each a multiple of slice_alignment, so every slice start
  // (a multiple of the slice length) is aligned too.
  bucket.slice_elements =
      RoundUp(CeilDiv(cursor, options_.world_size), options_.slice_alignment);
  bucket.padded_elements = bucket.slice_elements * options_.world_size;
  bucket.partition_offset = partition_elements_;
  partition_elements_ += bucket.slice_elements;
  buckets_.push_back(bucket);
}

absl::StatusOr<int> PartitionedLayout::FindParam(
    const std::string& name) const {
  auto it = index_by_name_.find(name);
  if (it == index_by_name_.end()) {
    return absl::NotFoundError(
        absl::StrCat("layout: no parameter named '", name, "'"));
  }
  return it->second;
}

PartitionSlice PartitionedLayout::BucketSlice(int bucket, int rank) const {
  ZE_CHECK(bucket >= 0 && bucket < num_buckets());
  ZE_CHECK(rank >= 0 && rank < world_size());
  const int64_t slice = buckets_[bucket].slice_elements;
  return PartitionSlice{rank, rank * slice, (rank + 1) * slice};
}

PartitionSlice PartitionedLayout::RankPartition(int rank) const {
  ZE_CHECK(rank >= 0 && rank < world_size());
  return PartitionSlice{rank, rank * partition_elements_,
                        (rank + 1) * partition_elements_};
}

std::vector<ParamShard> PartitionedLayout::RankShards(int rank) const {
  ZE_CHECK(rank >= 0 && rank < world_size());
  std::vector<ParamShard> shards;
  for (int b = 0; b < num_buckets(); ++b) {
    const BucketLayout& bucket = buckets_[b];
    const PartitionSlice slice = BucketSlice(b, rank);
    for (int i = bucket.first_param; i < bucket.end_param; ++i) {
      const ParamPlacement& place = placements_[i];
      const int64_t begin = std::max(place.offset, slice.begin);
      const int64_t end = std::min(place.offset + place.numel, slice.end);
      if (begin >= end) continue;
      shards.push_back(
          ParamShard{i, rank, b, begin - place.offset, end - begin, begin,
                     bucket.partition_offset + (begin - slice.begin)});
    }
  }
  return shards;
}

std::vector<ParamShard> PartitionedLayout::LocateParamRange(int param_index,
                                                            int64_t begin,
                                                            int64_t end) const {
  ZE_CHECK(param_index >= 0 && param_index < num_params());
  const ParamPlacement& place = placements_[param_index];
  ZE_CHECK(begin >= 0 && begin <= end && end <= place.numel);
  const BucketLayout& bucket = buckets_[place.bucket];
  std::vector<ParamShard> pieces;
  int64_t cursor = place.offset + begin;  // in bucket-buffer elements
  const int64_t stop = place.offset + end;
  while (cursor < stop) {
    const int rank = static_cast<int>(cursor / bucket.slice_elements);
    const PartitionSlice slice = BucketSlice(place.bucket, rank);
    const int64_t piece_end = std::min(stop, slice.end);
    pieces.push_back(
        ParamShard{param_index, rank, place.bucket, cursor - place.offset,
                   piece_end - cursor, cursor,
                   bucket.partition_offset + (cursor - slice.begin)});
    cursor = piece_end;
  }
  return pieces;
}

std::string PartitionedLayout::DebugString() const {
  return absl::StrCat("PartitionedLayout(world_size ", world_size(), ", ",
                      num_params(), " params, ", num_buckets(),
                      " buckets, psi ", total_param_elements_,
                      ", padded total ", padded_total_elements(),
                      ", partition ", partition_elements_, ")");
}

}  // namespace zero
}  // namespace ze
