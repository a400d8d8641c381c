// CreateCommunicator: bootstraps this process's rank from the launcher and
// MPI, picks the device and backend, and refuses launches that would put two
// ranks on one GPU unless asked to.
#ifndef ZE_COMM_FACTORY_H_
#define ZE_COMM_FACTORY_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "core/device.h"

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
  // Whether more ranks on one host than it has visible GPUs may share them
  // (several ranks on one GPU, over the mpi backend staging through host
  // memory: for testing multi-rank code on one GPU, not for speed). Without
  // it such a launch fails with FailedPrecondition on every rank. Unset: the
  // environment variable ZE_ALLOW_GPU_SHARING (1/true allow; unset, 0 or
  // false refuse) — how users and tests ask, since engine::Initialize builds
  // its own CommOptions. NCCL refuses shared GPUs either way.
  std::optional<bool> allow_gpu_sharing;
};

// The device and backend a rank will use. backend is "nccl", "mpi" or
// "local".
struct CommPlan {
  Device device = Device::Cpu();
  std::string backend;
};

// The decision CreateCommunicator makes, without touching GPUs or MPI:
// `device` and `backend` as in CommOptions, `device_count` the CUDA devices
// this rank sees, `info` where it sits (local_size: ranks on this host).
// The GPU is cuda:(local_rank % device_count). On a CUDA device with more
// ranks on the host than GPUs, the plan is refused unless
// `allow_gpu_sharing` (then "auto" means mpi; "nccl" is refused anyway).
// Errors: InvalidArgument for an unknown device or backend;
// FailedPrecondition naming the rank, host, local ranks and visible GPUs for
// shared GPUs, nccl without a GPU per rank or cuda tensors, and cuda without
// GPUs.
absl::StatusOr<CommPlan> PlanCommunicator(const LaunchInfo &info,
                                          int device_count,
                                          const std::string &device,
                                          const std::string &backend,
                                          bool allow_gpu_sharing);

// Finds this rank (DiscoverLaunchInfo: the launcher's environment, then
// MPI's shared-memory split for a launched job; rank 0 of 1 without a
// launcher, which never initialises MPI), plans the device and backend
// (PlanCommunicator), agrees on the plan with every rank of a launched job
// (so one rank's refusal fails them all), initialises the backend
// (ncclCommInitRank as needed) and calls ze::SetLogRank. Every rank must
// call it, with the same options, and collectively: it blocks until all
// ranks have (for launched jobs).
// Errors: InvalidArgument for an unknown backend/device or a bad
// environment variable (named); FailedPrecondition when the choice cannot
// work here (see PlanCommunicator; a rank whose own plan was fine reports
// which rank refused); the backend's translated error otherwise.
absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    const CommOptions &options = CommOptions());

}  // namespace comm
}  // namespace ze

#endif  // ZE_COMM_FACTORY_H_
