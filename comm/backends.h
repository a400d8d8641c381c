// Constructors of the backends (internal to comm/; users call
// CreateCommunicator in comm/factory.h).
#ifndef ZE_COMM_BACKENDS_H_
#define ZE_COMM_BACKENDS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "comm/bootstrap.h"
#include "comm/communicator.h"
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

}  // namespace comm
}  // namespace ze

#endif  // ZE_COMM_BACKENDS_H_
