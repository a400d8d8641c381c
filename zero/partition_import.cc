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

// Allocates staging for bucket elements [range_begin, + count) of `bucket`
// in `dtype`, lists the reads that fill it from the parameters' `kind`, and
// zeroes the padding no read covers.
absl::StatusOr<Tensor> StageRange(const PartitionedLayout& layout, int bucket,
                                  const std::string& kind, int64_t range_begin,
                                  int64_t count, DType dtype,
                                  std::vector<ImportRead>* reads) {
  ZE_ASSIGN_OR_RETURN(Tensor staging,
                      Tensor::Empty({count}, dtype, Device::Cpu()));
  const BucketLayout& info = layout.bucket(bucket);
  const int64_t range_end = range_begin + count;
  std::vector<Overlap> overlaps;
  for (int p = info.first_param; p < info.end_param; ++p) {
    const Overlap overlap =
        Intersect(layout.placement(p), range_begin, range_end);
    if (overlap.count == 0) continue;
    overlaps.push_back(overlap);
    reads->push_back({kind, layout.param(p).name, overlap.param_begin,
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
  return staging;
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
    int64_t weights_begin = 0;
    bytes += state.CheckpointWeights(b, &weights_begin).nbytes();
  }
  return bytes;
}

absl::StatusOr<ImportWindow> PlanImport(const PartitionState& state,
                                        int first_bucket, int end_bucket,
                                        int arrays) {
  const PartitionedLayout& layout = state.layout();
  const std::vector<std::string> names = state.StateArrayNames();
  ImportWindow window;
  window.first_bucket = first_bucket;
  window.end_bucket = end_bucket;
  for (int b = first_bucket; b < end_bucket; ++b) {
    const PartitionSlice own = state.OwnRange(b);
    std::vector<Tensor>& staged = window.arrays.emplace_back(names.size());
    for (int a = FirstStagedArray(state); a < arrays; ++a) {
      ZE_ASSIGN_OR_RETURN(staged[a],
                          StageRange(layout, b, names[a], own.begin, own.size(),
                                     DType::kF32, &window.reads));
      window.bytes += staged[a].nbytes();
    }
    int64_t weights_begin = 0;
    const Tensor weights = state.CheckpointWeights(b, &weights_begin);
    ZE_ASSIGN_OR_RETURN(
        Tensor staging,
        StageRange(
            layout, b, state.master_aliases_weights() ? "master" : "weights",
            weights_begin, weights.numel(), weights.dtype(), &window.reads));
    window.bytes += staging.nbytes();
    window.weights.push_back(staging);
  }
  return window;
}

absl::Status FillImport(const ImportSource& source,
                        const ImportWindow& window) {
  const int64_t count = static_cast<int64_t>(window.reads.size());
  ThreadPool pool(static_cast<int>(std::min<int64_t>(kImportThreads, count)));
  return pool.TryParallelFor(count, [&](int, int64_t i) -> absl::Status {
    const ImportRead& read = window.reads[i];
    return source(read.kind, read.name, read.param_begin, read.destination);
  });
}

absl::Status CommitImport(PartitionState& state,
                          const offload::UpdateJoined& joined,
                          const ImportWindow& window, const Stream& stream) {
  for (int b = window.first_bucket; b < window.end_bucket; ++b) {
    const int i = b - window.first_bucket;
    for (size_t a = 0; a < window.arrays[i].size(); ++a) {
      const Tensor& values = window.arrays[i][a];
      if (!values.defined()) continue;
      ZE_RETURN_IF_ERROR(state.WriteOwnState(joined, b, static_cast<int>(a), 0,
                                             values, stream));
      if (a == 0 && !state.trainable(b)) {
        // WriteOwnState leaves a frozen bucket's state alone, but its f32
        // master copy is what GatherMaster reads.
        const Tensor master = state.OwnMaster(b);
        if (master.defined()) {
          ZE_RETURN_IF_ERROR(CopyConverting(values, master, stream));
        }
      }
    }
    int64_t weights_begin = 0;
    const Tensor weights = state.CheckpointWeights(b, &weights_begin);
    ZE_RETURN_IF_ERROR(Copy(window.weights[i], weights, stream));
    ZE_RETURN_IF_ERROR(stream.Synchronize());
  }
  return absl::OkStatus();
}

absl::Status ImportState(PartitionState& state,
                         const offload::UpdateJoined& joined, int first_bucket,
                         int end_bucket, int arrays, const ImportSource& source,
                         const Stream& stream) {
  for (int b = first_bucket; b < end_bucket; ++b) {
    ZE_ASSIGN_OR_RETURN(const ImportWindow window,
                        PlanImport(state, b, b + 1, arrays));
    ZE_RETURN_IF_ERROR(FillImport(source, window));
    ZE_RETURN_IF_ERROR(CommitImport(state, joined, window, stream));
  }
  return absl::OkStatus();
}

}  // namespace zero
}  // namespace ze
