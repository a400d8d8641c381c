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
#include "zero/partition_import.h"

namespace ze {
namespace zero {
namespace {

// SaveState's unit of work (64 MiB of f32) and how many wait for the writer.
constexpr int64_t kSaveChunkElements = int64_t{1} << 24;
constexpr size_t kSaveChunksInFlight = 3;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
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
  ZE_RETURN_IF_ERROR(
      ImportState(partition(), joined, 0, partition().num_buckets(),
                  LoadedArrays(load_optimizer_states), source, stream()));
  return FinishLoad(load_optimizer_states, optimizer_step_count);
}

int StateCheckpoint::LoadedArrays(bool load_optimizer_states) const {
  return load_optimizer_states
             ? static_cast<int>(partition().StateArrayNames().size())
             : 1;
}

absl::Status StateCheckpoint::FinishLoad(bool load_optimizer_states,
                                         int64_t optimizer_step_count) {
  if (load_optimizer_states) {
    partition().set_optimizer_step_count(optimizer_step_count);
  }
  ZE_RETURN_IF_ERROR(partition().ResetGradients(stream()));
  ZE_RETURN_IF_ERROR(access_.on_state_loaded());
  return stream().Synchronize();
}

int64_t StateCheckpoint::StagedLoadBytes(bool load_optimizer_states) const {
  return ImportBytes(partition(), LoadedArrays(load_optimizer_states));
}

absl::StatusOr<StagedLoad> StateCheckpoint::PrepareLoad(
    bool load_optimizer_states) {
  ZE_RETURN_IF_ERROR(
      access_.require_checkpointable("load_checkpoint").status());
  StagedLoad staged;
  ZE_ASSIGN_OR_RETURN(staged.window,
                      PlanImport(partition(), 0, partition().num_buckets(),
                                 LoadedArrays(load_optimizer_states)));
  staged.load_optimizer_states = load_optimizer_states;
  return staged;
}

absl::Status StateCheckpoint::CommitLoad(const StagedLoad& staged,
                                         int64_t optimizer_step_count) {
  ZE_ASSIGN_OR_RETURN(const offload::UpdateJoined joined,
                      access_.require_checkpointable("load_checkpoint"));
  if (staged.window.first_bucket != 0 ||
      staged.window.end_bucket != partition().num_buckets()) {
    return absl::InvalidArgumentError(
        "CommitLoad: the staged state was prepared for another layout");
  }
  ZE_RETURN_IF_ERROR(
      CommitImport(partition(), joined, staged.window, stream()));
  return FinishLoad(staged.load_optimizer_states, optimizer_step_count);
}

}  // namespace zero
}  // namespace ze
