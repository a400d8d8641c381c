// Constructors of the backends (internal to comm/; users call
// CreateCommunicator in comm/factory.h).
#ifndef ZE_COMM_BACKENDS_H_
#define ZE_COMM_BACKENDS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "comm/recent_collectives.h"
#include "core/device.h"

namespace ze {
namespace comm {

// MPI over a duplicate of MPI_COMM_WORLD (initialising MPI if needed).
// `device` is cpu, or the cuda device whose tensors it stages through pinned
// host memory.
absl::StatusOr<std::unique_ptr<Communicator>> CreateMpiCommunicator(
    const LaunchInfo &info, const Device &device, double timeout_seconds);

// NCCL on `device` (cuda). With more than one rank, MPI broadcasts the
// unique id from rank 0; a world of one needs no MPI.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    const LaunchInfo &info, const Device &device, double timeout_seconds);

// A world of one: every collective is a copy (or nothing).
std::unique_ptr<Communicator> CreateLocalCommunicator(const Device &device,
                                                      double timeout_seconds);

// The collectives `ops` of a communicator with one rank (validated by
// Communicator; no point-to-point, which needs a peer): each output is a
// copy of its input on `stream` (nothing when in place; kAverage over one
// rank is the input too). The Work completes when the copies have (at
// once on the host); it marks `recorder`'s entries completed. What the
// local backend does, and the mpi backend for a group of one, so that a
// pipeline's data-parallel group of one rank does not stage its gradients
// through host memory to reduce them over nobody.
absl::StatusOr<Work> IssueWithinOneRank(
    const std::vector<CollectiveOp> &ops,
    const std::vector<uint64_t> &sequence_numbers, const Stream &stream,
    std::shared_ptr<RecentCollectives> recorder);

}  // namespace comm
}  // namespace ze

#endif  // ZE_COMM_BACKENDS_H_
