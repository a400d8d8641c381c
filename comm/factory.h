// CreateCommunicator: bootstraps this process's rank from the launcher and
// picks a backend.
#ifndef ZE_COMM_FACTORY_H_
#define ZE_COMM_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "comm/communicator.h"

namespace ze {
namespace comm {

struct CommOptions {
  // "auto": nccl when the device is cuda and every rank on this host has a
  // GPU of its own, else mpi. "mpi", "nccl": that backend or an error.
  // A process started without mpirun is rank 0 of 1 and gets the "local"
  // backend for "auto" and "mpi" (no MPI needed); "nccl" still means NCCL.
  std::string backend = "auto";
  // "auto": cuda:(local_rank % device_count) when GPUs are visible, else cpu.
  // "cpu", or "cuda" (the same GPU choice; FailedPrecondition without GPUs).
  std::string device = "auto";
  // Seconds a Work::Wait or Barrier may take before it fails with
  // DeadlineExceeded. 0: the environment variable ZE_COMM_TIMEOUT_SECONDS,
  // or 600 (10 minutes) when that is unset.
  double timeout_seconds = 0;
};

// Reads OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK (rank 0 of 1 when absent),
// chooses the device and backend as described in CommOptions, initialises
// the backend (MPI_Init_thread and ncclCommInitRank as needed) and calls
// ze::SetLogRank. Every rank must call it, with the same options, and
// collectively: it blocks until all ranks have (for mpi and nccl).
// Errors: InvalidArgument for an unknown backend/device or a bad
// environment variable (named); FailedPrecondition when the choice cannot
// work here (nccl without a GPU per rank, cuda without GPUs); the backend's
// translated error otherwise.
absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    const CommOptions &options = CommOptions());

}  // namespace comm
}  // namespace ze

#endif  // ZE_COMM_FACTORY_H_
