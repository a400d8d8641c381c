#include "zero/partition_import.h"

#include <algorithm>

#include "core/ops.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace ze {
namespace zero {
namespace {

// Readers FillImport runs at once.
constexpr int kImportThreads = 8;

// The parameter's elements within bucket-buffer range [range_begin,
// range_end), or an empty overlap.
struct Overlap {
  int64_t param_begin = 0;   // first element within the parameter
  int64_t range_offset = 0;  // where it lands within the range
  int64_t count = 0;
};

Overlap Intersect(const ParamPlacement& place, int64_t range_begin,
                  int64_t range_end) {
  const int64_t low = std::max(place.offset, range_begin);
  const int64_t high = std::min(place.offset + place.numel, range_end);
  if (high <= low) return Overlap();
  return Overlap{low - place.offset, low - range_begin, high - low};
}

// Stages bucket elements [range_begin, + count) of `bucket` in `dtype` as
// `array`'s targets of `window` (ImportTarget::begin relative to
// range_begin) and lists the reads that fill them from the parameters'
// `kind`. Unfiltered: one target over the whole range, its padding (no
// read covers it) zeroed. Filtered: a target per selected parameter.
absl::Status StageRange(const PartitionedLayout& layout, int bucket, int array,
                        const std::string& kind, int64_t range_begin,
                        int64_t count, DType dtype, const ImportFilter& filter,
                        ImportWindow* window) {
  const BucketLayout& info = layout.bucket(bucket);
  const int64_t range_end = range_begin + count;
  if (filter) {
    for (int p = info.first_param; p < info.end_param; ++p) {
      if (!filter(p)) continue;
      const Overlap overlap =
          Intersect(layout.placement(p), range_begin, range_end);
      if (overlap.count == 0) continue;
      ZE_ASSIGN_OR_RETURN(Tensor staging,
                          Tensor::Empty({overlap.count}, dtype, Device::Cpu()));
      window->targets.push_back({bucket, array, overlap.range_offset, staging});
      window->reads.push_back(
          {kind, layout.param(p).name, overlap.param_begin, staging});
      window->bytes += staging.nbytes();
    }
    return absl::OkStatus();
  }
  ZE_ASSIGN_OR_RETURN(Tensor staging,
                      Tensor::Empty({count}, dtype, Device::Cpu()));
  std::vector<Overlap> overlaps;
  for (int p = info.first_param; p < info.end_param; ++p) {
    const Overlap overlap =
        Intersect(layout.placement(p), range_begin, range_end);
    if (overlap.count == 0) continue;
    overlaps.push_back(overlap);
    window->reads.push_back(
        {kind, layout.param(p).name, overlap.param_begin,
         staging.Slice(overlap.range_offset, overlap.count)});
  }
  std::sort(overlaps.begin(), overlaps.end(),
            [](const Overlap& a, const Overlap& b) {
              return a.range_offset < b.range_offset;
            });
  const Stream& cpu = Stream::Default(Device::Cpu());
  int64_t filled = 0;  // elements before this are covered or zeroed
  for (const Overlap& overlap : overlaps) {
    if (overlap.range_offset > filled) {
      ZE_RETURN_IF_ERROR(Fill(
          staging.Slice(filled, overlap.range_offset - filled), 0.0f, cpu));
    }
    filled = std::max(filled, overlap.range_offset + overlap.count);
  }
  if (count > filled) {
    ZE_RETURN_IF_ERROR(Fill(staging.Slice(filled, count - filled), 0.0f, cpu));
  }
  window->targets.push_back({bucket, array, 0, staging});
  window->bytes += staging.nbytes();
  return absl::OkStatus();
}

// The first state array a window stages: with aliasing, array 0 (the
// master) is the weights, staged as the weights.
int FirstStagedArray(const PartitionState& state) {
  return state.master_aliases_weights() ? 1 : 0;
}

}  // namespace

int64_t ImportBytes(const PartitionState& state, int arrays) {
  int64_t bytes = 0;
  for (int b = 0; b < state.num_buckets(); ++b) {
    bytes += std::max(0, arrays - FirstStagedArray(state)) *
             state.OwnRange(b).size() * int64_t{4};
    bytes += state.CheckpointWeightsRange(b).size() *
             static_cast<int64_t>(SizeOf(state.model_dtype()));
  }
  return bytes;
}

absl::StatusOr<ImportWindow> PlanImport(const PartitionState& state,
                                        int first_bucket, int end_bucket,
                                        int arrays,
                                        const ImportFilter& filter) {
  const PartitionedLayout& layout = state.layout();
  const std::vector<std::string> names = state.StateArrayNames();
  ImportWindow window;
  window.first_bucket = first_bucket;
  window.end_bucket = end_bucket;
  for (int b = first_bucket; b < end_bucket; ++b) {
    const PartitionSlice own = state.OwnRange(b);
    for (int a = FirstStagedArray(state); a < arrays; ++a) {
      ZE_RETURN_IF_ERROR(StageRange(layout, b, a, names[a], own.begin,
                                    own.size(), DType::kF32, filter, &window));
    }
    // The weights wherever they live (a swap file too: WriteWeights).
    const PartitionSlice weights = state.CheckpointWeightsRange(b);
    ZE_RETURN_IF_ERROR(StageRange(
        layout, b, ImportTarget::kWeights,
        state.master_aliases_weights() ? "master" : "weights", weights.begin,
        weights.size(), state.model_dtype(), filter, &window));
  }
  return window;
}

absl::Status FillImport(const ImportSource& source,
                        const ImportWindow& window) {
  const int64_t count = static_cast<int64_t>(window.reads.size());
  if (count == 0) return absl::OkStatus();
  ThreadPool pool(static_cast<int>(std::min<int64_t>(kImportThreads, count)));
  return pool.TryParallelFor(count, [&](int, int64_t i) -> absl::Status {
    const ImportRead& read = window.reads[i];
    return source(read.kind, read.name, read.param_begin, read.destination);
  });
}

absl::Status CommitImport(PartitionState& state,
                          const offload::UpdateJoined& joined,
                          const ImportWindow& window, const Stream& stream) {
  const std::vector<ImportTarget>& targets = window.targets;
  // A 16+16 master's high halves are the weights: a bucket's weights go in
  // first and its master after, so the master's exact split is what stays
  // (the file's weights may be rounded to even where hi rounds ties away).
  std::vector<size_t> order(targets.size());
  for (size_t t = 0; t < targets.size(); ++t) order[t] = t;
  if (state.split_master()) {
    // Targets come grouped by bucket: within each group, weights first.
    size_t next = 0;
    for (size_t begin = 0; begin < targets.size();) {
      size_t end = begin;
      while (end < targets.size() &&
             targets[end].bucket == targets[begin].bucket) {
        ++end;
      }
      for (int weights_pass = 1; weights_pass >= 0; --weights_pass) {
        for (size_t t = begin; t < end; ++t) {
          if ((targets[t].array == ImportTarget::kWeights) == weights_pass) {
            order[next++] = t;
          }
        }
      }
      begin = end;
    }
  }
  for (size_t t = 0; t < targets.size(); ++t) {
    const ImportTarget& target = targets[order[t]];
    const int b = target.bucket;
    const Tensor& values = target.staging;
    if (target.array == ImportTarget::kWeights) {
      ZE_RETURN_IF_ERROR(state.WriteWeights(b, target.begin, values, stream));
    } else {
      ZE_RETURN_IF_ERROR(state.WriteOwnState(joined, b, target.array,
                                             target.begin, values, stream));
      if (target.array == 0 && !state.trainable(b)) {
        // WriteOwnState leaves a frozen bucket's state alone, but its f32
        // master copy is what the export of "master" reads.
        const Tensor master = state.OwnMaster(b);
        if (master.defined()) {
          ZE_RETURN_IF_ERROR(CopyConverting(
              values, master.Slice(target.begin, values.numel()), stream));
        }
      }
    }
    // A bucket is complete (its staging may go) before the next begins.
    if (t + 1 == targets.size() || targets[order[t + 1]].bucket != b) {
      ZE_RETURN_IF_ERROR(stream.Synchronize());
    }
  }
  return absl::OkStatus();
}

absl::Status ImportState(PartitionState& state,
                         const offload::UpdateJoined& joined, int first_bucket,
                         int end_bucket, int arrays, const ImportSource& source,
                         const Stream& stream, const ImportFilter& filter) {
  for (int b = first_bucket; b < end_bucket; ++b) {
    ZE_ASSIGN_OR_RETURN(const ImportWindow window,
                        PlanImport(state, b, b + 1, arrays, filter));
    if (window.targets.empty()) continue;
    ZE_RETURN_IF_ERROR(FillImport(source, window));
    ZE_RETURN_IF_ERROR(CommitImport(state, joined, window, stream));
  }
  return absl::OkStatus();
}

}  // namespace zero
}  // namespace ze
