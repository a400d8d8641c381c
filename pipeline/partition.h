// Partitioning a model's top-level layer sequence into pipeline stages.
//
// A model offers its layers as a sequence whose i-th output is the
// (i+1)-th input (GPT: the embedding, each block, the final LayerNorm, the
// head); a partition cuts it into `stages` contiguous, non-empty ranges.
// Methods, as DeepSpeed's PipelineModule names them:
//   "parameters"  balance the stages' weights (a layer's parameter count,
//                 or whatever weight the caller gives): the cut that
//                 minimises the heaviest stage. This is what puts fewer
//                 blocks beside a large embedding or head, as torchtitan
//                 and Megatron do by hand. "best" (DeepSpeed's config
//                 default) means the same here.
//   "uniform"     the same number of layers per stage (the first
//                 n % stages stages one more), weights ignored.
//   "0,3,6,9"     explicit boundaries: stages + 1 increasing indices from 0
//                 to the number of layers; stage s holds [b[s], b[s+1]).
// Pure functions; no model, no communicator.
#ifndef ZE_PIPELINE_PARTITION_H_
#define ZE_PIPELINE_PARTITION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ze {
namespace pipeline {

// Layers [first, last) of the sequence.
struct LayerRange {
  int first = 0;
  int last = 0;
  int size() const { return last - first; }
  bool operator==(const LayerRange &other) const {
    return first == other.first && last == other.last;
  }
};

// Cuts layers with `weights` (one per layer, >= 0) into `stages` ranges by
// `method` (above). `stages_key` and `method_key` name the config keys in
// errors. Errors (InvalidArgument): more stages than layers (naming
// stages_key and the layer count), an unknown method or malformed / out of
// range boundaries (naming method_key), a negative weight.
absl::StatusOr<std::vector<LayerRange>> PartitionLayers(
    const std::vector<int64_t> &weights, int stages, const std::string &method,
    const std::string &stages_key = "pipeline.stages",
    const std::string &method_key = "pipeline.partition");

// One stage as the startup line shows it: its layers, its parameters, and
// its pipeline rank's model-state memory (the plan's device and host bytes,
// for all the rank's stages), gathered from the stages' first data-parallel
// ranks.
struct StageSummary {
  LayerRange layers;
  double parameters = 0;
  double device_bytes = 0;
  double host_bytes = 0;
  int rank = 0;  // the pipeline rank holding the stage
};
// One stage per rank: "stage 0: layers [0, 7), 354.0 M parameters, 5.5 GiB
// GPU + 0.0 MiB host; stage 1: ..." (parameters in B from 10^9, M from
// 10^6; memory in GiB from 1 GiB, else MiB). Several (stages_per_rank > 1,
// the memory being the rank's): "stage 0: layers [0, 2), 1.2 M parameters
// on rank 0; ...; rank 0: 5.5 GiB GPU + 0.0 MiB host; rank 1: ...", the
// ranks' memory from their first stage's summary. Pure.
std::string FormatStages(const std::vector<StageSummary> &stages,
                         int stages_per_rank = 1);

}  // namespace pipeline
}  // namespace ze

#endif  // ZE_PIPELINE_PARTITION_H_
