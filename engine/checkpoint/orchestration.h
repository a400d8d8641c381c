// The engine's checkpointing: the collective choreography of
// Engine::SaveCheckpoint and Engine::LoadCheckpoint (their contracts are in
// engine/engine.h) around the on-disk format (checkpoint_format.h,
// consolidate.h, beside this file) and the strategy's state
// (zero::StateCheckpoint::SaveState / PrepareLoad / CommitLoad / LoadState,
// zero/strategy_checkpoint.h).
//
// Layering: this is a separate target (//engine/checkpoint:orchestration)
// above the format target, which knows no engine and no ZeRO stage; the
// engine reaches it through CheckpointedState, a borrowed view of the state
// a checkpoint holds, so neither depends on the Engine class.
//
// Threading: the engine's thread calls these (the writer and readers start
// their own threads and join them before returning). Stream: everything is
// queued on `stream` and synchronised before returning.
#ifndef ZE_ENGINE_CHECKPOINT_ORCHESTRATION_H_
#define ZE_ENGINE_CHECKPOINT_ORCHESTRATION_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "core/host_facts.h"
#include "core/stream.h"
#include "engine/reports.h"
#include "nlohmann/json.hpp"
#include "nn/loss_model.h"
#include "zero/strategy.h"
#include "zero/training_state.h"

namespace ze {
namespace engine {

// What a checkpoint saves and a load restores, borrowed from the engine for
// one call (every pointer non-null and outliving it). A load writes the
// strategy's state, the training state and the counters.
struct CheckpointedState {
  const config::Config* config = nullptr;
  comm::Communicator* comm = nullptr;
  const Stream* stream = nullptr;  // the compute stream
  nn::LossModel* model = nullptr;
  zero::ZeroStrategy* strategy = nullptr;
  zero::TrainingState* training = nullptr;
  Counters* counters = nullptr;
  // What the engine read from the environment at setup (the staging limit).
  const HostFacts* host = nullptr;
  // bf16/f32: the last step applied its update although its loss
  // (last_nonfinite_loss) or gradient norm was not finite; such state is
  // never saved.
  bool last_update_nonfinite = false;
  double last_nonfinite_loss = 0;
  // A wider group that must also agree, after `comm`, before a load
  // changes anything (a pipeline's whole job: no stage loads unless every
  // stage validated). Null: `comm` alone.
  comm::Communicator* agree_also = nullptr;
};

// A pipeline engine's place in its checkpoints (pipeline.stages > 1).
struct PipelineCheckpointLayout {
  comm::Communicator* world = nullptr;  // every rank of the job
  int stage = 0;  // this rank's pipeline rank (its stage when one per rank)
  // pipeline.stages_per_rank: with more than 1 (interleaved), the rank's
  // stages are saved together, under pipeline_rank_<r>/ (one strategy
  // holds them: its state is one checkpoint), and pipeline.json records
  // the count.
  int stages_per_rank = 1;
  // Each stage's pipeline layers [first, last), in stage order (all
  // ranks x stages_per_rank of them).
  std::vector<std::pair<int64_t, int64_t>> layer_ranges;
};

// Engine::SaveCheckpoint and LoadCheckpoint of a pipeline. `directory`
// holds pipeline.json (the stage count and each stage's layer range),
// `latest`, and one ordinary checkpoint per stage under
// pipeline_stage_<s>/ (with several stages per rank, per pipeline rank
// under pipeline_rank_<r>/), written and read by that stage's data-parallel
// ranks (`engine.comm`) as SaveCheckpoint and LoadCheckpoint below do, so
// a stage reshards over another data-parallel size or ZeRO stage as any
// checkpoint does. The top-level `latest` moves only once every stage has
// committed, so a crash between stages leaves the previous complete
// checkpoint the one loaded. A load resolves the tag once (world rank 0),
// and no stage changes anything until every stage has validated its files.
// Collectives over `pipeline.world`. Errors: a directory holding another
// pipeline layout's checkpoint (FailedPrecondition naming both layouts,
// on save and load), one without pipeline.json on load (NotFound), and
// those of SaveCheckpoint / LoadCheckpoint, on every rank.
absl::Status SavePipelineCheckpoint(const CheckpointedState& engine,
                                    const PipelineCheckpointLayout& pipeline,
                                    const std::string& directory,
                                    const std::string& tag,
                                    const nlohmann::json& client_state,
                                    CheckpointSaveReport* report);
absl::StatusOr<LoadedCheckpoint> LoadPipelineCheckpoint(
    const CheckpointedState& engine, const PipelineCheckpointLayout& pipeline,
    const std::string& directory, const std::string& tag,
    bool load_optimizer_states);

// Engine::SaveCheckpoint after its own checks (no backward owed): checks
// the accumulation boundary and everything else that contract lists, then
// saves. `report` (non-null) is reset, then filled as far as the call got.
absl::Status SaveCheckpoint(const CheckpointedState& engine,
                            const std::string& directory,
                            const std::string& tag,
                            const nlohmann::json& client_state,
                            CheckpointSaveReport* report);

// Engine::LoadCheckpoint after its own checks (no backward owed), as that
// contract says. The caller restarts what is not checkpointed (the step's
// summed loss, the throughput window).
absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const CheckpointedState& engine,
                                                const std::string& directory,
                                                const std::string& tag,
                                                bool load_optimizer_states);

}  // namespace engine
}  // namespace ze

#endif  // ZE_ENGINE_CHECKPOINT_ORCHESTRATION_H_
