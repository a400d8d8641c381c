#include "pipeline/layout.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace ze {
namespace pipeline {

absl::StatusOr<PipelineLayout> PipelineLayout::Create(int world_size,
                                                      int stages,
                                                      const std::string &key) {
  if (stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, " = ", stages, ": a pipeline needs >= 1 stage"));
  }
  if (world_size < 1 || world_size % stages != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        key, " = ", stages, " does not divide the world size ", world_size,
        ": every stage needs the same number of data-parallel ranks"));
  }
  PipelineLayout layout;
  layout.world_size = world_size;
  layout.stages = stages;
  layout.data_parallel = world_size / stages;
  return layout;
}

std::string PipelineLayout::ToString() const {
  return absl::StrCat(stages, " stages x ", data_parallel,
                      " data-parallel over ", world_size, " ranks");
}

absl::StatusOr<PipelineGroups> CreatePipelineGroups(
    comm::Communicator &world, const PipelineLayout &layout) {
  if (world.world_size() != layout.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline layout (", layout.ToString(), ") on a world of ",
                     world.world_size(), " ranks"));
  }
  const int rank = world.rank();
  PipelineGroups groups;
  ZE_ASSIGN_OR_RETURN(
      groups.pipeline,
      world.Split(layout.DataParallelIndexOf(rank), layout.StageOf(rank)));
  ZE_ASSIGN_OR_RETURN(
      groups.data_parallel,
      world.Split(layout.StageOf(rank), layout.DataParallelIndexOf(rank)));
  if (layout.stages > 1) {
    // Every rank takes part in the split; the middle stages each get a
    // group of their own (a color no one else uses) and drop it.
    const int stage = layout.StageOf(rank);
    const bool end = stage == 0 || stage == layout.stages - 1;
    ZE_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> tied,
                        world.Split(end ? layout.DataParallelIndexOf(rank)
                                        : layout.data_parallel + rank,
                                    stage));
    if (end) groups.tied = std::move(tied);
  }
  return groups;
}

}  // namespace pipeline
}  // namespace ze
