// The one way values enter a rank's model state. Its 16-bit (or f32)
// weights, f32 master weights and optimizer arrays are written only here:
// checkpoint loading (zero/strategy_checkpoint.h), both strategies'
// LoadWeights and both strategies' GatherParameters scope releases (a
// modifier's values, ZeroStrategy::ImportScope) import through it, from a
// source that answers "parameter P's `kind` elements [a, b)" into host
// staging. The way out is zero/partition_export.h.
//
// An import covers a window of buckets [first_bucket, end_bucket): for each
// bucket, the weights the rank keeps of it (PartitionState::
// CheckpointWeights: the whole replicated bucket at stages 0-2, its slice
// at stage 3) and the elements its optimizer owns (OwnRange) of each
// imported state array; with an ImportFilter, only the selected
// parameters' elements of those ranges (a scope release writes the named
// parameters and must leave their bucket neighbours' f32 masters alone).
// PlanImport allocates host staging for the window and
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

// Which parameters (layout indices) an import covers. Empty: every one,
// and the ranges are imported whole (their padding written as zeros).
// Otherwise only the selected parameters' elements are read and written;
// everything else in the ranges keeps its values.
using ImportFilter = std::function<bool(int param_index)>;

// One read of a window: what its source is asked for.
struct ImportRead {
  std::string kind;  // as ImportSource's `kind`
  std::string name;
  int64_t param_begin = 0;
  Tensor destination;  // a view into the window's staging
};

// One staged run and where CommitImport writes it.
struct ImportTarget {
  int bucket = 0;
  // A state array (index into StateArrayNames: f32 over OwnRange), or
  // kWeights (CheckpointWeights' range, in its dtype).
  int array = 0;
  static constexpr int kWeights = -1;
  int64_t begin = 0;  // first element within that range
  Tensor staging;     // host; reads land in views of it
};

// Host staging for buckets [first_bucket, end_bucket) and the reads that
// fill it. Targets come bucket by bucket; within a bucket the state arrays
// in order, then the weights. Unfiltered, a target covers its whole range
// and the padding between and after parameters, which no read covers, is
// zeroed by PlanImport; filtered, a target is one selected parameter's
// overlap with the range. An array not imported (beyond `arrays`, and
// array 0 when the master aliases the weights: imported as the weights)
// has no target and keeps its values.
struct ImportWindow {
  int first_bucket = 0;
  int end_bucket = 0;
  std::vector<ImportRead> reads;
  std::vector<ImportTarget> targets;
  int64_t bytes = 0;  // host staging allocated
};

// The host bytes PlanImport allocates for every bucket with the first
// `arrays` state arrays (1: the master weights only; StateArrayNames().
// size(): all of them).
int64_t ImportBytes(const PartitionState& state, int arrays);

// Allocates staging for buckets [first_bucket, end_bucket) with the first
// `arrays` state arrays, and lists its reads (each parameter's overlap with
// each staged range; only `filter`'s parameters when it is set). Success:
// the window; nothing of `state` changes. Failure: ResourceExhausted when
// the host memory cannot be allocated.
absl::StatusOr<ImportWindow> PlanImport(const PartitionState& state,
                                        int first_bucket, int end_bucket,
                                        int arrays,
                                        const ImportFilter& filter = nullptr);

// Performs `window`'s reads with `source`, up to 8 parameters at once (a
// disk and the page cache both answer faster to several readers). Returns
// the first error of the source; staging may then be partly filled.
absl::Status FillImport(const ImportSource& source, const ImportWindow& window);

// Writes `window`'s staging into `state`, target by target: a staged array
// over the bucket's own elements (WriteOwnState; a frozen bucket's f32
// master copy, which the export of "master" reads, too), the weights into
// CheckpointWeights. `joined`: FinishUpdate's
// proof that no offloaded update writes the state meanwhile. Synchronous on
// return. Copy or NVMe write errors; buckets before the failing one stay
// written.
absl::Status CommitImport(PartitionState& state,
                          const offload::UpdateJoined& joined,
                          const ImportWindow& window, const Stream& stream);

// PlanImport, FillImport and CommitImport a bucket at a time over
// [first_bucket, end_bucket): every range of bucket b is read before any
// of it is written, so an error in bucket b leaves the buckets before it
// imported and b onwards untouched. A bucket `filter` selects nothing of
// is skipped.
absl::Status ImportState(PartitionState& state,
                         const offload::UpdateJoined& joined, int first_bucket,
                         int end_bucket, int arrays, const ImportSource& source,
                         const Stream& stream,
                         const ImportFilter& filter = nullptr);

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_PARTITION_IMPORT_H_
