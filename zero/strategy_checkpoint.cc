// StateCheckpoint: what a rank saves and how it loads state saved under any
// other layout (world size, stage, bucketing).
#include "zero/strategy_checkpoint.h"

#include <string>
#include <vector>

#include "core/status.h"
#include "zero/partition_export.h"
#include "zero/partition_import.h"

namespace ze {
namespace zero {
std::vector<CheckpointKind> StateCheckpoint::CheckpointKinds() const {
  return ExportKinds(partition());
}

absl::Status StateCheckpoint::SaveState(const CheckpointSink& sink,
                                        SaveTimes* times) {
  ZE_ASSIGN_OR_RETURN(const offload::UpdateJoined joined,
                      access_.require_checkpointable("save_checkpoint"));
  return ExportState(partition(), joined, CheckpointPieces(), CheckpointKinds(),
                     sink, stream(), times);
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
