// Where this process sits in the job: rank, world size and local rank, read
// from the launcher's environment, and which GPU the rank uses.
#ifndef ZE_COMM_BOOTSTRAP_H_
#define ZE_COMM_BOOTSTRAP_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace ze {
namespace comm {

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // rank among the processes on this host
  int local_size = 1;  // processes on this host
  // True when started by mpirun (OMPI_COMM_WORLD_SIZE is set); false for a
  // plain process, which is rank 0 of 1 and needs no MPI.
  bool launched = false;
};

// Reads OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK and _LOCAL_SIZE through
// `getenv` (a lookup returning null for unset variables). No variables set:
// rank 0 of 1. Fails with InvalidArgument naming the variable when one is
// not a number or the values are inconsistent (rank >= size, ...).
absl::StatusOr<LaunchInfo> ParseLaunchInfo(
    const std::function<const char *(const char *)> &getenv);
// ParseLaunchInfo over the process environment.
absl::StatusOr<LaunchInfo> LaunchInfoFromEnvironment();

// The GPU a rank uses: local_rank % device_count; -1 when there is none.
int DeviceIndexForRank(int local_rank, int device_count);

// The collective timeout: `option_seconds` when positive, else the value of
// ZE_COMM_TIMEOUT_SECONDS (read through `getenv`) when set, else 600.
// InvalidArgument naming the variable when it is not a positive number.
absl::StatusOr<double> ResolveTimeoutSeconds(
    double option_seconds,
    const std::function<const char *(const char *)> &getenv);

}  // namespace comm
}  // namespace ze

#endif  // ZE_COMM_BOOTSTRAP_H_
