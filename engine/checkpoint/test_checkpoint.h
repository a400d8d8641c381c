// Synthetic checkpoints for tests: parameters split over ranks the way a
// ZeRO flat partition splits them, every kind's values a known function of
// (kind, parameter, element), written with the real save protocol
// (BeginSave, RankFileWriter, CommitSave) from one process. Test-only.
#ifndef ZE_ENGINE_CHECKPOINT_TEST_CHECKPOINT_H_
#define ZE_ENGINE_CHECKPOINT_TEST_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "engine/checkpoint/checkpoint_format.h"

namespace ze {
namespace checkpoint {
namespace testing {

using NamesAndShapes = std::vector<std::pair<std::string, Shape>>;

// Parameters of every awkward size: a matrix that straddles two ranks, a
// 53-element vector (prime: never a multiple of the world size), a single
// element, one with no elements, and one bigger than a rank's share (it
// spans three ranks at world size 3). 384 elements in all.
NamesAndShapes AwkwardModel();

// The pieces of `parameters` under a ZeRO flat partition at `world_size`:
// the parameters concatenated in order, padded to a multiple of
// `world_size`, and rank r owning the r-th equal slice.
std::vector<ParameterRecord> PartitionLikeZero(const NamesAndShapes& parameters,
                                               int world_size);

// The value written for element `element` of parameter number `parameter`
// (its index in the model) for `kind`, before rounding to the kind's dtype:
// a multiple of 2^-14 with up to 20 significant bits (exact in f32, not in
// bf16 or f16, so conversions show), distinct across kinds. `generation`
// changes every value (a re-save that must be told apart).
float TestValue(const std::string& kind, int parameter, int64_t element,
                int generation = 0);
// TestValue as the checkpoint stores it: rounded to `stored` (nearest even).
float StoredTestValue(const std::string& kind, int parameter, int64_t element,
                      DType stored, int generation = 0);

struct TestCheckpointOptions {
  std::string tag = "global_step1";
  int world_size = 3;
  int zero_stage = 3;
  DType model_dtype = DType::kBF16;  // the "weights" kind's dtype
  std::vector<std::string> kinds = {kMaster, kExpAvg, kExpAvgSq, kWeights};
  int64_t global_steps = 1;
  int generation = 0;
  // Ranks whose files are written (-1: all), and whether CommitSave runs:
  // a save that died part way leaves only some files and no commit.
  int ranks_to_write = -1;
  bool commit = true;
};

// Writes a checkpoint of `parameters` into `directory` with the save
// protocol and returns its manifest (complete with file records even when
// not committed). training_state holds global_steps, skipped_steps 0,
// micro_steps 2 * global_steps and global_samples 8 * global_steps.
absl::StatusOr<Manifest> WriteTestCheckpoint(
    const std::string& directory, const NamesAndShapes& parameters,
    const TestCheckpointOptions& options = {});

// The full value of parameter number `parameter` (shape `shape`) for
// `kind`, as stored (rounded to `stored`), then converted to `dtype`: what
// a correct read or consolidation gives.
absl::StatusOr<Tensor> ExpectedParameter(const std::string& kind, int parameter,
                                         const Shape& shape, DType stored,
                                         DType dtype, int generation = 0);

// A directory for the running gtest test alone (under TempDir, named after
// the suite and the test), emptied: what each checkpoint test writes into.
std::string FreshTestDirectory();

}  // namespace testing
}  // namespace checkpoint
}  // namespace ze

#endif  // ZE_ENGINE_CHECKPOINT_TEST_CHECKPOINT_H_
