// The one way values enter a rank's model state. Its 16-bit (or f32)
// weights, f32 master weights and optimizer arrays are written only here:
// checkpoint loading (zero/strategy_checkpoint.h) and both strategies'
// LoadWeights import through it, from a source that answers "parameter P's
// `kind` elements [a, b)" into host staging.
//
// An import covers a window of buckets [first_bucket, end_bucket): for each
// bucket, the weights the rank keeps of it (PartitionState::
// CheckpointWeights: the whole replicated bucket at stages 0-2, its slice
// at stage 3) and the elements its optimizer owns (OwnRange) of each
// imported state array. PlanImport allocates host staging for the window and
// lists the reads that fill it; FillImport performs them with a source;
// CommitImport writes the staging into place. ImportState runs the three a
// bucket at a time (host memory for one bucket); a whole-model window
// staged at once lets a caller verify everything read before anything
// changes (Engine::LoadCheckpoint's one-pass path).
//
// Threading: every function runs on the caller's thread; FillImport calls
// the source from several threads at once and joins them. Stream:
// CommitImport queues its copies on `stream` and synchronises it.
#ifndef ZE_ZERO_PARTITION_IMPORT_H_
#define ZE_ZERO_PARTITION_IMPORT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "offload/host_update.h"
#include "zero/partition_state.h"

namespace ze {
namespace zero {

// Fills `destination` (a CPU tensor: f32 for "master" and the optimizer's
// arrays, the model's dtype for "weights") with parameter `name`'s `kind`
// elements [param_begin, param_begin + destination.numel()). `kind` is
// "weights", or a name of PartitionState::StateArrayNames ("master",
// "exp_avg", ...); with master_aliases_weights the weights are asked for
// as "master". Called from several threads at once (for different
// destinations): must be thread-safe. Its error stops the import.
using ImportSource =
    std::function<absl::Status(const std::string& kind, const std::string& name,
                               int64_t param_begin, const Tensor& destination)>;

// One read of a window: what its source is asked for.
struct ImportRead {
  std::string kind;  // as ImportSource's `kind`
  std::string name;
  int64_t param_begin = 0;
  Tensor destination;  // a view into the window's staging
};

// Host staging for buckets [first_bucket, end_bucket) (index i below is
// bucket first_bucket + i), and the reads that fill it. The padding between
// and after parameters, which no read covers, is zeroed by PlanImport.
struct ImportWindow {
  int first_bucket = 0;
  int end_bucket = 0;
  std::vector<ImportRead> reads;
  // [i][array] (f32, this rank's OwnRange); undefined: not imported (the
  // array keeps its values), and array 0 when the master aliases the
  // weights (imported as the weights).
  std::vector<std::vector<Tensor>> arrays;
  std::vector<Tensor> weights;  // [i]: CheckpointWeights' range and dtype
  int64_t bytes = 0;            // host staging allocated
};

// The host bytes PlanImport allocates for every bucket with the first
// `arrays` state arrays (1: the master weights only; StateArrayNames().
// size(): all of them).
int64_t ImportBytes(const PartitionState& state, int arrays);

// Allocates staging for buckets [first_bucket, end_bucket) with the first
// `arrays` state arrays, and lists its reads (each parameter's overlap with
// each staged range). Success: the window; nothing of `state` changes.
// Failure: ResourceExhausted when the host memory cannot be allocated.
absl::StatusOr<ImportWindow> PlanImport(const PartitionState& state,
                                        int first_bucket, int end_bucket,
                                        int arrays);

// Performs `window`'s reads with `source`, up to 8 parameters at once (a
// disk and the page cache both answer faster to several readers). Returns
// the first error of the source; staging may then be partly filled.
absl::Status FillImport(const ImportSource& source, const ImportWindow& window);

// Writes `window`'s staging into `state`: each staged array over the
// bucket's own elements (WriteOwnState; a frozen bucket's f32 master copy,
// which GatherMaster reads, too), then the weights. `joined`: FinishUpdate's
// proof that no offloaded update writes the state meanwhile. Synchronous on
// return. Copy or NVMe write errors; buckets before the failing one stay
// written.
absl::Status CommitImport(PartitionState& state,
                          const offload::UpdateJoined& joined,
                          const ImportWindow& window, const Stream& stream);

// PlanImport, FillImport and CommitImport a bucket at a time over
// [first_bucket, end_bucket): every range of bucket b is read before any
// of it is written, so an error in bucket b leaves the buckets before it
// imported and b onwards untouched.
absl::Status ImportState(PartitionState& state,
                         const offload::UpdateJoined& joined, int first_bucket,
                         int end_bucket, int arrays, const ImportSource& source,
                         const Stream& stream);

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_PARTITION_IMPORT_H_
