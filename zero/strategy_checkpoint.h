// StateCheckpoint: the checkpoint protocol of a ZeRO strategy's state, kept
// apart from the micro-step protocol of zero/strategy.h. A ZeroStrategy
// hands one out (ZeroStrategy::checkpoint()); engine/checkpoint/
// orchestration.cc speaks the file format and calls it for the state.
//
// Save and load both need the strategy idle, between optimizer steps, with
// no GatherParameters scope open (FailedPrecondition otherwise); both
// finish an offloaded update in progress first.
//
// A rank saves the pieces of its slice of every bucket (the layout's
// RankShards: parameter elements this rank owns under stage 1-3
// partitioning, whatever the stage; at stage 0 every rank holds them all
// and saves only its slice), and for each piece every kind of
// CheckpointKinds in order. A load reads this rank's state for the current
// layout from ranges of the saved parameters, whatever layout saved them.
//
// Threading: the engine's thread calls every method; SaveState runs the
// sink on the export's writer thread and LoadState calls the source from
// the import's reader threads, joining them before returning. Stream: work is
// queued on the strategy's compute stream and synchronised before returning.
#ifndef ZE_ZERO_STRATEGY_CHECKPOINT_H_
#define ZE_ZERO_STRATEGY_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "offload/host_update.h"
#include "zero/flat_layout.h"
#include "zero/partition_export.h"
#include "zero/partition_import.h"
#include "zero/partition_state.h"

namespace ze {
namespace zero {

// The kinds a checkpoint holds and what receives them: the export's
// (zero/partition_export.h).
using CheckpointKind = ExportKind;
using CheckpointSink = ExportSink;

// What a load reads from: "give me parameter P's `kind` elements [a, b)"
// (zero/partition_import.h).
using CheckpointSource = ImportSource;

// Where SaveState's time went.
using SaveTimes = ExportTimes;

// One read PrepareLoad asks its caller to perform.
using LoadRead = ImportRead;

// Host staging for a whole load (PrepareLoad: every bucket's window),
// written by CommitLoad.
struct StagedLoad {
  ImportWindow window;  // every bucket: its reads and staging
  bool load_optimizer_states = true;
};

class StateCheckpoint {
 public:
  // What the checkpoint borrows from its strategy; all of it outlives the
  // StateCheckpoint (ZeroStrategy::checkpoint() fills it).
  struct Access {
    PartitionState* partition = nullptr;
    const Stream* stream = nullptr;
    int rank = 0;
    // The strategy's checks before touching state (idle, no open scope),
    // then FinishUpdate: its proof. `what` names the operation in errors.
    std::function<absl::StatusOr<offload::UpdateJoined>(const char* what)>
        require_checkpointable;
    // After new weights were written: the strategy refreshes what it
    // derived from them (stage 3's persistent gathered parameters).
    std::function<absl::Status()> on_state_loaded;
  };
  explicit StateCheckpoint(Access access) : access_(std::move(access)) {}

  // "master" and the optimizer's state arrays (f32), then "weights" in the
  // model's dtype unless the model trains in f32 (then the master weights
  // are the weights).
  std::vector<CheckpointKind> CheckpointKinds() const;
  // This rank's pieces, in the order SaveState emits them.
  std::vector<ParamShard> CheckpointPieces() const {
    return partition().layout().RankShards(access_.rank);
  }
  const PartitionedLayout& layout() const { return partition().layout(); }
  int64_t optimizer_step_count() const {
    return partition().optimizer_step_count();
  }

  // Emits every piece of CheckpointPieces, each with every kind, in that
  // order, reading offloaded state back from host memory or the swap file:
  // the export (zero/partition_export.h, ExportState), whose sink runs on
  // a writer thread (one call at a time, in order) while the caller's
  // thread copies the next chunk to the host. The sink's error stops it
  // and is returned.
  // `times`, if given, receives where the time went.
  absl::Status SaveState(const CheckpointSink& sink,
                         SaveTimes* times = nullptr);

  // Loads this rank's state for the current layout from `source` (an
  // import, zero/partition_import.h, a bucket at a time): master
  // weights and weights always (with master_aliases_weights, the weights
  // from "master"), the optimizer's arrays and step count only with
  // `load_optimizer_states` (otherwise they keep their values). Gradients
  // are reset. Asks `source` for every range before writing, bucket by
  // bucket: an error from `source` in bucket b leaves buckets before b
  // loaded (the caller validates the checkpoint before calling).
  absl::Status LoadState(const CheckpointSource& source,
                         bool load_optimizer_states,
                         int64_t optimizer_step_count);

  // The same load in two phases, so that a checkpoint can be read once and
  // verified before anything changes (Engine::LoadCheckpoint's one-pass
  // path). PrepareLoad allocates host staging for everything LoadState
  // writes (per bucket: this rank's own optimizer arrays, and the weights
  // CheckpointWeights returns; the padding between parameters zeroed) and
  // lists the reads that fill it; the caller performs them, in any order
  // and on any threads, and checks them; CommitLoad then writes the staged
  // state into place as LoadState does (and resets gradients, refreshes
  // derived state, restores the optimizer step count with the optimizer
  // states). Nothing of the strategy's state changes before CommitLoad.
  // PrepareLoad fails with ResourceExhausted when the host memory cannot
  // be allocated; StagedLoadBytes says beforehand how much it takes.
  int64_t StagedLoadBytes(bool load_optimizer_states) const;
  absl::StatusOr<StagedLoad> PrepareLoad(bool load_optimizer_states);
  absl::Status CommitLoad(const StagedLoad& staged,
                          int64_t optimizer_step_count);

 private:
  // State arrays a load imports: all, or the master weights only.
  int LoadedArrays(bool load_optimizer_states) const;
  // After the import: the step count, gradients reset, derived state.
  absl::Status FinishLoad(bool load_optimizer_states,
                          int64_t optimizer_step_count);
  PartitionState& partition() const { return *access_.partition; }
  const Stream& stream() const { return *access_.stream; }

  Access access_;
};

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_STRATEGY_CHECKPOINT_H_
