// StateCheckpoint: what a rank saves and how it loads state saved under any
// other layout (world size, stage, bucketing).
#include "zero/strategy_checkpoint.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/ops.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace ze {
namespace zero {
namespace {

// Threads LoadState reads a bucket's parameters with.
constexpr int kLoadThreads = 8;
// SaveState's unit of work (64 MiB of f32) and how many wait for the writer.
constexpr int64_t kSaveChunkElements = int64_t{1} << 24;
constexpr size_t kSaveChunksInFlight = 3;

// The parameter's elements [low, high) within bucket-buffer range
// [range_begin, range_end), or an empty range.
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

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// The reads that fill `destination` (bucket elements [range_begin,
// + numel)) of bucket `bucket` from the parameters' `kind`; the padding
// between parameters (which no read covers) is zeroed.
absl::Status PlanBucketRange(const PartitionedLayout& layout, int bucket,
                             const std::string& kind, int64_t range_begin,
                             const Tensor& destination,
                             std::vector<LoadRead>* reads) {
  const BucketLayout& info = layout.bucket(bucket);
  const int64_t range_end = range_begin + destination.numel();
  std::vector<Overlap> overlaps;
  for (int p = info.first_param; p < info.end_param; ++p) {
    const Overlap overlap =
        Intersect(layout.placement(p), range_begin, range_end);
    if (overlap.count == 0) continue;
    overlaps.push_back(overlap);
    reads->push_back({kind, layout.param(p).name, overlap.param_begin,
                      destination.Slice(overlap.range_offset, overlap.count)});
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
          destination.Slice(filled, overlap.range_offset - filled), 0.0f, cpu));
    }
    filled = std::max(filled, overlap.range_offset + overlap.count);
  }
  if (destination.numel() > filled) {
    ZE_RETURN_IF_ERROR(Fill(
        destination.Slice(filled, destination.numel() - filled), 0.0f, cpu));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<CheckpointKind> StateCheckpoint::CheckpointKinds() const {
  std::vector<CheckpointKind> kinds;
  for (const std::string& name : partition().StateArrayNames()) {
    kinds.push_back(CheckpointKind{name, DType::kF32});
  }
  if (!partition().master_aliases_weights()) {
    kinds.push_back(CheckpointKind{"weights", partition().model_dtype()});
  }
  return kinds;
}

absl::Status StateCheckpoint::SaveState(const CheckpointSink& sink,
                                        SaveTimes* times) {
  ZE_ASSIGN_OR_RETURN(const offload::UpdateJoined joined,
                      access_.require_checkpointable("save_checkpoint"));
  SaveTimes local_times;
  SaveTimes& spent = times != nullptr ? *times : local_times;
  spent = SaveTimes();
  const std::vector<CheckpointKind> kinds = CheckpointKinds();
  const int arrays = static_cast<int>(kinds.size()) -
                     (partition().master_aliases_weights() ? 0 : 1);
  const std::vector<ParamShard> pieces = CheckpointPieces();

  // A pipeline: this thread copies the next chunk of state to the host
  // while a writer thread hands the previous ones to the sink (checksums
  // and file writes), so copies, hashing and the disk overlap. Chunks of at
  // most kSaveChunkElements in kSaveChunksInFlight + 1 reused buffers: the
  // host memory a save needs is bounded, whatever the model. The buffers
  // are page-locked when the model is on a GPU (device-to-pageable copies
  // go through the driver's own staging at a fraction of the speed, and a
  // fresh allocation per chunk would pay its page faults every time); in
  // ordinary host memory otherwise, or when pinning fails.
  const int buffer_count = static_cast<int>(kSaveChunksInFlight) + 1;
  std::vector<Tensor> buffers;
  Allocator* allocator =
      partition().device().is_cpu() ? HostMemory() : PinnedHostMemory();
  for (int i = 0; i < buffer_count; ++i) {
    absl::StatusOr<Tensor> buffer = Tensor::Empty(
        {kSaveChunkElements}, DType::kF32, Device::Cpu(), allocator);
    if (!buffer.ok() && allocator != HostMemory()) {
      allocator = HostMemory();
      buffers.clear();
      i = -1;
      continue;
    }
    ZE_RETURN_IF_ERROR(buffer.status());
    buffers.push_back(*buffer);
  }
  spent.pinned = allocator != HostMemory();

  struct Chunk {
    size_t piece = 0;
    size_t kind = 0;
    int buffer = 0;
    int64_t count = 0;
  };
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<Chunk> queue;
  std::deque<int> free_buffers;
  for (int i = 0; i < buffer_count; ++i) free_buffers.push_back(i);
  bool closed = false;
  absl::Status written;  // the writer's first error
  auto view = [&](int buffer, int64_t count, DType dtype) {
    return Tensor::Wrap(buffers[buffer].data(), {count}, dtype, Device::Cpu());
  };
  std::thread writer([&] {
    while (true) {
      Chunk chunk;
      {
        std::unique_lock<std::mutex> lock(mutex);
        changed.wait(lock, [&] { return !queue.empty() || closed; });
        if (queue.empty()) return;
        chunk = queue.front();
        queue.pop_front();
      }
      const auto start = std::chrono::steady_clock::now();
      absl::Status status =
          sink(kinds[chunk.kind], pieces[chunk.piece],
               view(chunk.buffer, chunk.count, kinds[chunk.kind].dtype));
      const double seconds = SecondsSince(start);
      std::lock_guard<std::mutex> lock(mutex);
      spent.sink_seconds += seconds;
      free_buffers.push_back(chunk.buffer);
      changed.notify_all();
      if (!status.ok()) {
        written = status;
        closed = true;
        queue.clear();
        return;
      }
    }
  });
  absl::Status prepared = [&]() -> absl::Status {
    for (size_t i = 0; i < pieces.size(); ++i) {
      const ParamShard& piece = pieces[i];
      const int b = piece.bucket;
      // The piece within this rank's own state and within the saved weights.
      const int64_t own_begin =
          piece.bucket_offset - partition().OwnRange(b).begin;
      int64_t weights_begin = 0;
      const Tensor weights = partition().CheckpointWeights(b, &weights_begin);
      for (size_t k = 0; k < kinds.size(); ++k) {
        for (int64_t done = 0; done < piece.count;) {
          const int64_t count =
              std::min(kSaveChunkElements, piece.count - done);
          Chunk chunk{i, k, 0, count};
          {
            std::unique_lock<std::mutex> lock(mutex);
            const auto start = std::chrono::steady_clock::now();
            changed.wait(lock, [&] { return !free_buffers.empty() || closed; });
            spent.stall_seconds += SecondsSince(start);
            if (closed) return absl::OkStatus();  // the writer failed
            chunk.buffer = free_buffers.front();
            free_buffers.pop_front();
          }
          const Tensor host = view(chunk.buffer, count, kinds[k].dtype);
          const auto start = std::chrono::steady_clock::now();
          if (static_cast<int>(k) < arrays) {
            ZE_RETURN_IF_ERROR(
                partition().ReadOwnState(joined, b, static_cast<int>(k),
                                         own_begin + done, host, stream()));
          } else {
            ZE_RETURN_IF_ERROR(
                Copy(weights.Slice(piece.bucket_offset - weights_begin + done,
                                   count),
                     host, stream()));
            ZE_RETURN_IF_ERROR(stream().Synchronize());
          }
          spent.copy_seconds += SecondsSince(start);
          done += count;
          std::lock_guard<std::mutex> lock(mutex);
          if (closed) return absl::OkStatus();
          queue.push_back(chunk);
          changed.notify_all();
        }
      }
    }
    return absl::OkStatus();
  }();
  {
    std::lock_guard<std::mutex> lock(mutex);
    closed = true;
    if (!prepared.ok()) queue.clear();
  }
  changed.notify_all();
  writer.join();
  ZE_RETURN_IF_ERROR(prepared);
  return written;
}

absl::Status StateCheckpoint::LoadState(const CheckpointSource& source,
                                        bool load_optimizer_states,
                                        int64_t optimizer_step_count) {
  ZE_ASSIGN_OR_RETURN(const offload::UpdateJoined joined,
                      access_.require_checkpointable("load_checkpoint"));
  const PartitionedLayout& layout = partition().layout();
  const std::vector<std::string> arrays = partition().StateArrayNames();
  const bool aliased = partition().master_aliases_weights();
  for (int b = 0; b < layout.num_buckets(); ++b) {
    const BucketLayout& bucket = layout.bucket(b);
    // Fills `destination` (bucket elements [range_begin, + numel)) from the
    // source, padding zero.
    auto gather = [&](const std::string& kind, int64_t range_begin,
                      const Tensor& destination) -> absl::Status {
      ZE_RETURN_IF_ERROR(
          Fill(destination, 0.0f, Stream::Default(Device::Cpu())));
      // Parameters are independent ranges: several threads read them (a
      // disk and the page cache both answer faster to several readers).
      std::vector<int> wanted;
      for (int p = bucket.first_param; p < bucket.end_param; ++p) {
        if (Intersect(layout.placement(p), range_begin,
                      range_begin + destination.numel())
                .count > 0) {
          wanted.push_back(p);
        }
      }
      ThreadPool pool(
          std::min<int>(kLoadThreads, static_cast<int>(wanted.size())));
      return pool.TryParallelFor(
          static_cast<int64_t>(wanted.size()),
          [&](int, int64_t i) -> absl::Status {
            const int p = wanted[i];
            const Overlap overlap =
                Intersect(layout.placement(p), range_begin,
                          range_begin + destination.numel());
            return source(
                kind, layout.param(p).name, overlap.param_begin,
                destination.Slice(overlap.range_offset, overlap.count));
          });
    };
    const PartitionSlice own = partition().OwnRange(b);
    const int loaded_arrays =
        load_optimizer_states ? static_cast<int>(arrays.size()) : 1;
    // With aliasing, array 0 is the weights, loaded below.
    for (int a = aliased ? 1 : 0; a < loaded_arrays; ++a) {
      ZE_ASSIGN_OR_RETURN(
          Tensor host, Tensor::Empty({own.size()}, DType::kF32, Device::Cpu()));
      ZE_RETURN_IF_ERROR(gather(arrays[a], own.begin, host));
      ZE_RETURN_IF_ERROR(
          partition().WriteOwnState(joined, b, a, 0, host, stream()));
    }
    int64_t weights_begin = 0;
    const Tensor weights = partition().CheckpointWeights(b, &weights_begin);
    ZE_ASSIGN_OR_RETURN(
        Tensor host,
        Tensor::Empty({weights.numel()}, weights.dtype(), Device::Cpu()));
    ZE_RETURN_IF_ERROR(
        gather(aliased ? "master" : "weights", weights_begin, host));
    ZE_RETURN_IF_ERROR(Copy(host, weights, stream()));
    ZE_RETURN_IF_ERROR(stream().Synchronize());
  }
  if (load_optimizer_states) {
    partition().set_optimizer_step_count(optimizer_step_count);
  }
  ZE_RETURN_IF_ERROR(partition().ResetGradients(stream()));
  ZE_RETURN_IF_ERROR(access_.on_state_loaded());
  return stream().Synchronize();
}

int64_t StateCheckpoint::StagedLoadBytes(bool load_optimizer_states) const {
  const PartitionedLayout& layout = partition().layout();
  const int arrays = static_cast<int>(partition().StateArrayNames().size());
  const int loaded_arrays = load_optimizer_states ? arrays : 1;
  const int first = partition().master_aliases_weights() ? 1 : 0;
  int64_t bytes = 0;
  for (int b = 0; b < layout.num_buckets(); ++b) {
    bytes += std::max(0, loaded_arrays - first) *
             partition().OwnRange(b).size() * int64_t{4};
    int64_t weights_begin = 0;
    const Tensor weights = partition().CheckpointWeights(b, &weights_begin);
    bytes += weights.nbytes();
  }
  return bytes;
}

absl::StatusOr<StagedLoad> StateCheckpoint::PrepareLoad(
    bool load_optimizer_states) {
  ZE_RETURN_IF_ERROR(
      access_.require_checkpointable("load_checkpoint").status());
  const PartitionedLayout& layout = partition().layout();
  const std::vector<std::string> arrays = partition().StateArrayNames();
  const bool aliased = partition().master_aliases_weights();
  StagedLoad staged;
  staged.load_optimizer_states = load_optimizer_states;
  staged.arrays.resize(layout.num_buckets());
  staged.weights.resize(layout.num_buckets());
  const int loaded_arrays =
      load_optimizer_states ? static_cast<int>(arrays.size()) : 1;
  for (int b = 0; b < layout.num_buckets(); ++b) {
    const PartitionSlice own = partition().OwnRange(b);
    staged.arrays[b].resize(arrays.size());
    // With aliasing, array 0 is the weights, staged below.
    for (int a = aliased ? 1 : 0; a < loaded_arrays; ++a) {
      ZE_ASSIGN_OR_RETURN(
          Tensor host, Tensor::Empty({own.size()}, DType::kF32, Device::Cpu()));
      ZE_RETURN_IF_ERROR(PlanBucketRange(layout, b, arrays[a], own.begin, host,
                                         &staged.reads));
      staged.bytes += host.nbytes();
      staged.arrays[b][a] = host;
    }
    int64_t weights_begin = 0;
    const Tensor weights = partition().CheckpointWeights(b, &weights_begin);
    ZE_ASSIGN_OR_RETURN(
        Tensor host,
        Tensor::Empty({weights.numel()}, weights.dtype(), Device::Cpu()));
    ZE_RETURN_IF_ERROR(PlanBucketRange(layout, b,
                                       aliased ? "master" : "weights",
                                       weights_begin, host, &staged.reads));
    staged.bytes += host.nbytes();
    staged.weights[b] = host;
  }
  return staged;
}

absl::Status StateCheckpoint::CommitLoad(const StagedLoad& staged,
                                         int64_t optimizer_step_count) {
  ZE_ASSIGN_OR_RETURN(const offload::UpdateJoined joined,
                      access_.require_checkpointable("load_checkpoint"));
  const PartitionedLayout& layout = partition().layout();
  if (staged.arrays.size() != static_cast<size_t>(layout.num_buckets()) ||
      staged.weights.size() != static_cast<size_t>(layout.num_buckets())) {
    return absl::InvalidArgumentError(
        "CommitLoad: the staged state was prepared for another layout");
  }
  for (int b = 0; b < layout.num_buckets(); ++b) {
    for (size_t a = 0; a < staged.arrays[b].size(); ++a) {
      if (!staged.arrays[b][a].defined()) continue;
      ZE_RETURN_IF_ERROR(partition().WriteOwnState(
          joined, b, static_cast<int>(a), 0, staged.arrays[b][a], stream()));
    }
    int64_t weights_begin = 0;
    const Tensor weights = partition().CheckpointWeights(b, &weights_begin);
    ZE_RETURN_IF_ERROR(Copy(staged.weights[b], weights, stream()));
    ZE_RETURN_IF_ERROR(stream().Synchronize());
  }
  if (staged.load_optimizer_states) {
    partition().set_optimizer_step_count(optimizer_step_count);
  }
  ZE_RETURN_IF_ERROR(partition().ResetGradients(stream()));
  ZE_RETURN_IF_ERROR(access_.on_state_loaded());
  return stream().Synchronize();
}

}  // namespace zero
}  // namespace ze
