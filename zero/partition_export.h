// The one way values leave a rank's model state. Its f32 master weights,
// optimizer arrays and 16-bit (or f32) weights are read out only here, to
// a sink: checkpoint saving (StateCheckpoint::SaveState) exports every
// piece this rank saves, and the consolidated export of a parameter's f32
// master (GatherMaster: Engine::GatherMasterWeights, the Hugging Face
// export in examples/train_gpt.cc, the tests' weight comparisons) exports
// this rank's share of it before the ranks exchange shares. The way in is
// zero/partition_import.h.
//
// An export emits, for each piece (a run of one parameter's elements in
// one bucket, within the range the rank holds of every exported kind) and
// for each kind in the order asked, the piece's elements in chunks, in
// order, as CPU tensors of the kind's dtype. A state array is read over
// the bucket's own elements (PartitionState::ReadOwnState: from the
// device, host memory or the swap file), the weights over
// CheckpointWeights' range.
//
// Threading: ExportState runs on the caller's thread, which copies chunks
// to the host, and runs the sink on a writer thread of its own (one call at
// a time, in order), joined before it returns. GatherMaster runs on the
// caller's thread. Stream: reads are queued on `stream` and synchronised
// before a chunk reaches the sink.
#ifndef ZE_ZERO_PARTITION_EXPORT_H_
#define ZE_ZERO_PARTITION_EXPORT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "core/dtype.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "offload/host_update.h"
#include "zero/flat_layout.h"
#include "zero/partition_state.h"

namespace ze {
namespace zero {

// A kind of state an export reads: a name of PartitionState::
// StateArrayNames ("master", "exp_avg", ...; f32) or "weights" (the model's
// dtype).
struct ExportKind {
  std::string name;
  DType dtype = DType::kF32;
};

// Every kind a rank holds, in the order a checkpoint saves them: the state
// arrays, then "weights" unless the model trains in f32 (the master
// weights are then the weights).
std::vector<ExportKind> ExportKinds(const PartitionState& state);

// Receives the next elements of one piece of one kind: `values` is a CPU
// tensor of the kind's dtype holding the next run of parameter
// `piece.param_index`'s elements (a piece may arrive in several chunks, in
// order; all of one kind before the next kind). Valid only during the
// call. Runs on ExportState's writer thread; its error stops the export.
using ExportSink = std::function<absl::Status(
    const ExportKind& kind, const ParamShard& piece, const Tensor& values)>;

// Where ExportState's time went.
struct ExportTimes {
  double copy_seconds = 0;   // caller's thread: state copied to the host
  double stall_seconds = 0;  // caller's thread: waiting for a free
                             // buffer (the sink, e.g. the disk, is behind)
  double sink_seconds = 0;   // writer thread: inside the sink
  bool pinned = false;       // staging buffers are page-locked
};

// Emits each of `pieces` (each within OwnRange and CheckpointWeights'
// range of its bucket) with each of `kinds`, in that order, to `sink`. The
// caller's thread copies the next chunk (at most 2^24 elements) to the
// host while the writer thread hands earlier ones to the sink, through a
// bounded set of reused staging buffers (page-locked when some of what it
// reads is in GPU memory and pinning succeeds). `joined`: FinishUpdate's proof
// that no offloaded update writes the state meanwhile. Success: every chunk
// reached the sink. Failure: the sink's first error (nothing more is
// emitted), InvalidArgument for a kind the state does not hold, or a copy,
// NVMe read or allocation error. `times`, if given, receives where the
// time went.
absl::Status ExportState(const PartitionState& state,
                         const offload::UpdateJoined& joined,
                         const std::vector<ParamShard>& pieces,
                         const std::vector<ExportKind>& kinds,
                         const ExportSink& sink, const Stream& stream,
                         ExportTimes* times = nullptr);

// Parameter `index`'s f32 master values (numel of them), gathered from
// every rank: each rank exports its share; at stages 1-3 with more than
// one rank, one broadcast from each rank holding part of it, in rank order
// (a collective: every rank calls it for the same parameters in the same
// order), through one device buffer of at most the parameter's size.
// Errors of the export or the collectives.
absl::StatusOr<std::vector<float>> GatherMaster(
    const PartitionState& state, const offload::UpdateJoined& joined, int index,
    comm::Communicator& comm, const Stream& stream);

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_PARTITION_EXPORT_H_
