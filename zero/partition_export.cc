#include "zero/partition_export.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/ops.h"
#include "core/status.h"

namespace ze {
namespace zero {
namespace {

// ExportState's unit of work (64 MiB of f32) and how many wait for the
// writer.
constexpr int64_t kExportChunkElements = int64_t{1} << 24;
constexpr int kExportChunksInFlight = 3;

// Where a kind is read from: a state array's index, or the weights.
constexpr int kWeightsKind = -1;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// Bucket elements [low, high); empty when high <= low.
struct BucketSpan {
  int64_t low = 0;
  int64_t high = 0;
  bool empty() const { return high <= low; }
  int64_t size() const { return high - low; }
};

// The elements of the parameter at `place` within bucket elements
// [begin, end): a rank's share when it holds that range.
BucketSpan Share(const ParamPlacement& place, int64_t begin, int64_t end) {
  return BucketSpan{std::max<int64_t>(place.offset, begin),
                    std::min<int64_t>(place.offset + place.numel, end)};
}

// `kinds` as state array indices (kWeightsKind for "weights").
absl::StatusOr<std::vector<int>> ResolveKinds(
    const PartitionState& state, const std::vector<ExportKind>& kinds) {
  const std::vector<std::string> names = state.StateArrayNames();
  std::vector<int> resolved;
  for (const ExportKind& kind : kinds) {
    if (kind.name == "weights" && !state.master_aliases_weights()) {
      resolved.push_back(kWeightsKind);
      continue;
    }
    auto found = std::find(names.begin(), names.end(), kind.name);
    if (found == names.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ExportState: this rank's state holds no kind '", kind.name, "'"));
    }
    resolved.push_back(static_cast<int>(found - names.begin()));
  }
  return resolved;
}

// Whether the export copies from device memory: the weights (unless they
// live in host memory) or a state array of a bucket whose optimizer is on
// a GPU. Host-resident state (offload) is read by memcpy, which pinning
// would only slow down by its page locking.
bool ReadsDeviceMemory(const PartitionState& state,
                       const std::vector<ParamShard>& pieces,
                       const std::vector<int>& sources) {
  if (state.device().is_cpu()) return false;
  for (int source : sources) {
    if (source == kWeightsKind &&
        state.weights_placement() == Placement::kDevice) {
      return true;
    }
  }
  for (const ParamShard& piece : pieces) {
    if (state.optimizer_placement(piece.bucket) == Placement::kDevice) {
      return true;
    }
  }
  return false;
}

// Reused host buffers of `elements` f32 each: page-locked when `pin`
// (device-to-pageable copies go through the driver's own staging at a
// fraction of the speed, and a fresh allocation per chunk would pay its
// page faults every time), in ordinary host memory otherwise or when
// pinning fails.
absl::StatusOr<std::vector<Tensor>> StagingBuffers(bool pin, int count,
                                                   int64_t elements,
                                                   bool* pinned) {
  std::vector<Tensor> buffers;
  Allocator* allocator = pin ? PinnedHostMemory() : HostMemory();
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<Tensor> buffer =
        Tensor::Empty({elements}, DType::kF32, Device::Cpu(), allocator);
    if (!buffer.ok() && allocator != HostMemory()) {
      allocator = HostMemory();
      buffers.clear();
      i = -1;
      continue;
    }
    ZE_RETURN_IF_ERROR(buffer.status());
    buffers.push_back(*buffer);
  }
  *pinned = allocator != HostMemory();
  return buffers;
}

}  // namespace

std::vector<ExportKind> ExportKinds(const PartitionState& state) {
  std::vector<ExportKind> kinds;
  // bf16 moments are saved as they are (half the bytes; exact); every
  // other state array as f32 (8-bit moments as their exact decoded values).
  const OptimizerOptions& optimizer = state.optimizer_options();
  const bool bf16_moments = optimizer.type != OptimizerType::kSgd &&
                            optimizer.moments == MomentFormat::kBf16;
  for (const std::string& name : state.StateArrayNames()) {
    const bool moment = name == "exp_avg" || name == "exp_avg_sq";
    kinds.push_back(
        ExportKind{name, moment && bf16_moments ? DType::kBF16 : DType::kF32});
  }
  if (!state.master_aliases_weights()) {
    kinds.push_back(ExportKind{"weights", state.model_dtype()});
  }
  return kinds;
}

absl::Status ExportState(const PartitionState& state,
                         const offload::UpdateJoined& joined,
                         const std::vector<ParamShard>& pieces,
                         const std::vector<ExportKind>& kinds,
                         const ExportSink& sink, const Stream& stream,
                         ExportTimes* times) {
  ExportTimes local_times;
  ExportTimes& spent = times != nullptr ? *times : local_times;
  spent = ExportTimes();
  ZE_ASSIGN_OR_RETURN(const std::vector<int> sources,
                      ResolveKinds(state, kinds));
  int64_t chunks = 0;
  int64_t largest = 0;
  for (const ParamShard& piece : pieces) {
    chunks += (piece.count + kExportChunkElements - 1) / kExportChunkElements;
    largest = std::max(largest, piece.count);
  }
  chunks *= static_cast<int64_t>(kinds.size());
  if (chunks == 0) return absl::OkStatus();

  // A pipeline: this thread copies the next chunk of state to the host
  // while a writer thread hands the previous ones to the sink (for a save:
  // checksums and file writes), so copies, hashing and the disk overlap.
  // Chunks of at most kExportChunkElements in kExportChunksInFlight + 1
  // reused buffers (fewer and smaller for a small export): the host memory
  // an export needs is bounded, whatever the model.
  const int buffer_count =
      static_cast<int>(std::min<int64_t>(kExportChunksInFlight + 1, chunks));
  ZE_ASSIGN_OR_RETURN(
      const std::vector<Tensor> buffers,
      StagingBuffers(ReadsDeviceMemory(state, pieces, sources), buffer_count,
                     std::min(kExportChunkElements, largest), &spent.pinned));

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
      // The piece within this rank's own state and within its weights.
      const int64_t own_begin = piece.bucket_offset - state.OwnRange(b).begin;
      const int64_t weights_begin = state.CheckpointWeightsRange(b).begin;
      for (size_t k = 0; k < kinds.size(); ++k) {
        for (int64_t done = 0; done < piece.count;) {
          const int64_t count =
              std::min(kExportChunkElements, piece.count - done);
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
          if (sources[k] != kWeightsKind) {
            ZE_RETURN_IF_ERROR(state.ReadOwnState(
                joined, b, sources[k], own_begin + done, host, stream));
          } else {
            // Wherever the weights live (a swap file too), synchronous.
            ZE_RETURN_IF_ERROR(state.ReadWeights(
                b, piece.bucket_offset - weights_begin + done, host, stream));
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

absl::StatusOr<std::vector<float>> GatherMaster(
    const PartitionState& state, const offload::UpdateJoined& joined, int index,
    comm::Communicator& comm, const Stream& stream) {
  const ParamPlacement& place = state.layout().placement(index);
  std::vector<float> values(place.numel);
  // This rank's share, exported into `values` at its place.
  const PartitionSlice own = state.OwnRange(place.bucket);
  const BucketSpan share = Share(place, own.begin, own.end);
  if (!share.empty()) {
    ParamShard piece;
    piece.param_index = index;
    piece.rank = comm.rank();
    piece.bucket = place.bucket;
    piece.param_begin = share.low - place.offset;
    piece.count = share.size();
    piece.bucket_offset = share.low;
    int64_t done = 0;  // the sink's chunks arrive in order
    ZE_RETURN_IF_ERROR(ExportState(
        state, joined, {piece}, {ExportKind{"master", DType::kF32}},
        [&](const ExportKind&, const ParamShard& piece,
            const Tensor& chunk) -> absl::Status {
          std::memcpy(values.data() + piece.param_begin + done,
                      chunk.data_as<float>(), chunk.numel() * sizeof(float));
          done += chunk.numel();
          return absl::OkStatus();
        },
        stream));
  }
  // Every rank holds the whole bucket: no collective.
  if (!state.policy().partition_optimizer || comm.world_size() == 1) {
    return values;
  }
  const int64_t slice = state.layout().bucket(place.bucket).slice_elements;
  // The ranks holding a share of the parameter, in rank order.
  for (int64_t root = place.offset / slice;
       root * slice < place.offset + place.numel; ++root) {
    const BucketSpan held = Share(place, root * slice, (root + 1) * slice);
    float* into = values.data() + (held.low - place.offset);
    // Collectives work on the model's device.
    ZE_ASSIGN_OR_RETURN(Tensor piece, Tensor::Empty({held.size()}, DType::kF32,
                                                    state.device()));
    if (root == comm.rank()) {
      ZE_RETURN_IF_ERROR(
          Copy(Tensor::Wrap(into, {held.size()}, DType::kF32, Device::Cpu()),
               piece, stream));
    }
    ZE_ASSIGN_OR_RETURN(comm::Work work,
                        comm.Broadcast(piece, static_cast<int>(root), stream));
    ZE_RETURN_IF_ERROR(work.Wait());
    ZE_ASSIGN_OR_RETURN(std::vector<float> received,
                        ToHostFloats(piece, stream));
    std::copy(received.begin(), received.end(), into);
  }
  return values;
}

}  // namespace zero
}  // namespace ze
