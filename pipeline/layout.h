// PipelineLayout: where a rank sits in a pipeline x data-parallel grid, and
// the two sub-communicators it talks over.
//
// The world of W ranks is `stages` pipeline stages (groups of consecutive
// ranks) times `data_parallel` = W / stages replicas:
//
//   stage      = rank / data_parallel
//   dp_index   = rank % data_parallel
//
//   W = 4, stages = 2:   rank 0 (stage 0, dp 0)   rank 1 (stage 0, dp 1)
//                        rank 2 (stage 1, dp 0)   rank 3 (stage 1, dp 1)
//
// so the ranks of one stage (which reduce its gradients together, the
// heavier traffic) are neighbours, on one host when the host holds at least
// data_parallel ranks, as DeepSpeed's PipeDataParallelTopology and
// Megatron order them (data-parallel fastest). A pipeline group is the
// ranks with one dp_index (one replica of the whole model, ranked by
// stage); a data-parallel group the ranks of one stage (ranked by
// dp_index).
//
// Thread-compatible value type.
#ifndef ZE_PIPELINE_LAYOUT_H_
#define ZE_PIPELINE_LAYOUT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "comm/communicator.h"

namespace ze {
namespace pipeline {

struct PipelineLayout {
  int world_size = 1;
  int stages = 1;
  int data_parallel = 1;  // world_size / stages

  // The layout of `world_size` ranks into `stages` stages. InvalidArgument
  // naming `key` (the config key that set `stages`, e.g. "pipeline.stages")
  // when stages < 1 or does not divide world_size.
  static absl::StatusOr<PipelineLayout> Create(int world_size, int stages,
                                               const std::string &key);

  int StageOf(int rank) const { return rank / data_parallel; }
  int DataParallelIndexOf(int rank) const { return rank % data_parallel; }
  // The world rank at (stage, dp_index).
  int RankAt(int stage, int dp_index) const {
    return stage * data_parallel + dp_index;
  }
  // "2 stages x 2 data-parallel over 4 ranks".
  std::string ToString() const;
};

// One rank's two groups, split from the world communicator.
struct PipelineGroups {
  // The ranks of this rank's pipeline (one per stage); rank() is the stage.
  std::unique_ptr<comm::Communicator> pipeline;
  // The ranks holding this rank's stage; rank() is the dp_index.
  std::unique_ptr<comm::Communicator> data_parallel;
  // With 2 or more stages, on the first and the last stage: those two
  // stages of this replica (rank() 0 is the first stage), which sum the
  // tied parameters' gradients (GPT's token table). Null elsewhere.
  std::unique_ptr<comm::Communicator> tied;
};

// Splits `world` into the layout's groups (two or three Split calls,
// collective over `world`: every rank calls it, in the same order relative
// to its other collectives). InvalidArgument when `layout` is not for
// world's size; the backend's error otherwise (Unimplemented where it
// cannot split).
absl::StatusOr<PipelineGroups> CreatePipelineGroups(
    comm::Communicator &world, const PipelineLayout &layout);

}  // namespace pipeline
}  // namespace ze

#endif  // ZE_PIPELINE_LAYOUT_H_
