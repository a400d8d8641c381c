// ZeroStrategy's checkpoint side: what a rank saves and how it loads state
// saved under any other layout (world size, stage, bucketing).
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops.h"
#include "core/status.h"
#include "zero/strategy.h"

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

}  // namespace

std::vector<ZeroStrategy::CheckpointKind> ZeroStrategy::CheckpointKinds()
    const {
  std::vector<CheckpointKind> kinds;
  for (const std::string& name : partition_->StateArrayNames()) {
    kinds.push_back(CheckpointKind{name, DType::kF32});
  }
  if (!partition_->master_aliases_weights()) {
    kinds.push_back(CheckpointKind{"weights", partition_->model_dtype()});
  }
  return kinds;
}

absl::Status ZeroStrategy::RequireCheckpointable(const char* what) {
  ZE_RETURN_IF_ERROR(RequireIdle(what));
  if (HasOpenScope()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " on rank ", rank(),
                     ": a GatherParameters scope is open; release it first"));
  }
  return partition_->FinishUpdate(stream());
}

absl::Status ZeroStrategy::SaveState(const CheckpointSink& sink) {
  ZE_RETURN_IF_ERROR(RequireCheckpointable("save_checkpoint"));
  const PartitionedLayout& layout = partition_->layout();
  const std::vector<CheckpointKind> kinds = CheckpointKinds();
  const int arrays = static_cast<int>(kinds.size()) -
                     (partition_->master_aliases_weights() ? 0 : 1);
  const std::vector<ParamShard> pieces = CheckpointPieces();

  // A pipeline: this thread copies the next chunk of state to the host
  // while a writer thread hands the previous ones to the sink (checksums
  // and file writes), so copies, hashing and the disk overlap. Chunks of at
  // most kSaveChunkElements, at most kSaveChunksInFlight of them queued:
  // the host memory a save needs is bounded, whatever the model.
  struct Chunk {
    size_t piece = 0;
    size_t kind = 0;
    Tensor host;
  };
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<Chunk> queue;
  bool closed = false;
  absl::Status written;  // the writer's first error
  std::thread writer([&] {
    while (true) {
      Chunk chunk;
      {
        std::unique_lock<std::mutex> lock(mutex);
        changed.wait(lock, [&] { return !queue.empty() || closed; });
        if (queue.empty()) return;
        chunk = std::move(queue.front());
        queue.pop_front();
      }
      changed.notify_all();
      absl::Status status =
          sink(kinds[chunk.kind], pieces[chunk.piece], chunk.host);
      if (!status.ok()) {
        std::lock_guard<std::mutex> lock(mutex);
        written = status;
        closed = true;
        queue.clear();
        changed.notify_all();
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
          piece.bucket_offset - partition_->OwnRange(b).begin;
      int64_t weights_begin = 0;
      const Tensor weights = partition_->CheckpointWeights(b, &weights_begin);
      for (size_t k = 0; k < kinds.size(); ++k) {
        for (int64_t done = 0; done < piece.count;) {
          const int64_t count =
              std::min(kSaveChunkElements, piece.count - done);
          Chunk chunk{i, k, Tensor()};
          ZE_ASSIGN_OR_RETURN(chunk.host, Tensor::Empty({count}, kinds[k].dtype,
                                                        Device::Cpu()));
          if (static_cast<int>(k) < arrays) {
            ZE_RETURN_IF_ERROR(partition_->ReadOwnState(b, static_cast<int>(k),
                                                        own_begin + done,
                                                        chunk.host, stream()));
          } else {
            ZE_RETURN_IF_ERROR(
                Copy(weights.Slice(piece.bucket_offset - weights_begin + done,
                                   count),
                     chunk.host, stream()));
            ZE_RETURN_IF_ERROR(stream().Synchronize());
          }
          done += count;
          std::unique_lock<std::mutex> lock(mutex);
          changed.wait(lock, [&] {
            return queue.size() < kSaveChunksInFlight || closed;
          });
          if (closed) return absl::OkStatus();  // the writer failed
          queue.push_back(std::move(chunk));
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

absl::Status ZeroStrategy::LoadState(const CheckpointSource& source,
                                     bool load_optimizer_states,
                                     int64_t optimizer_step_count) {
  ZE_RETURN_IF_ERROR(RequireCheckpointable("load_checkpoint"));
  const PartitionedLayout& layout = partition_->layout();
  const std::vector<std::string> arrays = partition_->StateArrayNames();
  const bool aliased = partition_->master_aliases_weights();
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
      const int threads =
          std::min<int>(kLoadThreads, static_cast<int>(wanted.size()));
      std::vector<absl::Status> statuses(std::max(threads, 1));
      auto work = [&](int thread) {
        for (size_t i = thread; i < wanted.size(); i += threads) {
          const int p = wanted[i];
          const Overlap overlap = Intersect(layout.placement(p), range_begin,
                                            range_begin + destination.numel());
          absl::Status status =
              source(kind, layout.param(p).name, overlap.param_begin,
                     destination.Slice(overlap.range_offset, overlap.count));
          if (!status.ok()) {
            statuses[thread] = status;
            return;
          }
        }
      };
      std::vector<std::thread> pool;
      for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
      if (threads > 0) work(0);
      for (std::thread& thread : pool) thread.join();
      for (const absl::Status& status : statuses) ZE_RETURN_IF_ERROR(status);
      return absl::OkStatus();
    };
    const PartitionSlice own = partition_->OwnRange(b);
    const int loaded_arrays =
        load_optimizer_states ? static_cast<int>(arrays.size()) : 1;
    // With aliasing, array 0 is the weights, loaded below.
    for (int a = aliased ? 1 : 0; a < loaded_arrays; ++a) {
      ZE_ASSIGN_OR_RETURN(
          Tensor host, Tensor::Empty({own.size()}, DType::kF32, Device::Cpu()));
      ZE_RETURN_IF_ERROR(gather(arrays[a], own.begin, host));
      ZE_RETURN_IF_ERROR(partition_->WriteOwnState(b, a, 0, host, stream()));
    }
    int64_t weights_begin = 0;
    const Tensor weights = partition_->CheckpointWeights(b, &weights_begin);
    ZE_ASSIGN_OR_RETURN(
        Tensor host,
        Tensor::Empty({weights.numel()}, weights.dtype(), Device::Cpu()));
    ZE_RETURN_IF_ERROR(
        gather(aliased ? "master" : "weights", weights_begin, host));
    ZE_RETURN_IF_ERROR(Copy(host, weights, stream()));
    ZE_RETURN_IF_ERROR(stream().Synchronize());
  }
  if (load_optimizer_states) {
    partition_->set_optimizer_step_count(optimizer_step_count);
  }
  ZE_RETURN_IF_ERROR(partition_->ResetGradients(stream()));
  ZE_RETURN_IF_ERROR(OnStateLoaded());
  return stream().Synchronize();
}

}  // namespace zero
}  // namespace ze
