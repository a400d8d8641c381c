// Where this process sits in the job: rank, world size, local rank and host,
// found from the launcher's environment and, for a launched job, from MPI
// itself; and which GPU the rank uses.
#ifndef ZE_COMM_BOOTSTRAP_H_
#define ZE_COMM_BOOTSTRAP_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace ze {
namespace comm {

// Where LaunchInfo's local_rank and local_size came from.
enum class LocalRankSource {
  // Not launched: rank 0 of 1 on its own.
  kSingleProcess,
  // The launcher's variables (OMPI_COMM_WORLD_LOCAL_RANK/_LOCAL_SIZE, or
  // MPI_LOCALRANKID/MPI_LOCALNRANKS under Hydra). Only a cross-check.
  kEnvironment,
  // Launched, but the launcher named no local rank: every rank was assumed
  // to be on one host (local = world). Only until MPI is asked.
  kAssumedOneHost,
  // MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED): the ranks
  // that share this host's memory. Authoritative for launched jobs.
  kMpiSharedMemorySplit,
};

const char *LocalRankSourceName(LocalRankSource source);

struct LaunchInfo {
  int rank = 0;
  // 0 from ParseLaunchInfo when the launcher exports no size (PMIx without
  // Slurm's variables); ReconcileLaunchInfo then takes MPI's.
  int world_size = 1;
  int local_rank = 0;  // rank among the processes on this host
  int local_size = 1;  // processes on this host
  // True when started by a recognised launcher (Open MPI's or Hydra's
  // world-size variable, or PMIx's rank, is set); false for a plain process,
  // which is rank 0 of 1 and needs no MPI.
  bool launched = false;
  LocalRankSource local_source = LocalRankSource::kSingleProcess;
  // This host's name, for messages: MPI_Get_processor_name for a launched
  // job, gethostname otherwise. Empty straight from ParseLaunchInfo.
  std::string host;
};

// Reads the launcher's variables through `getenv` (a lookup returning null
// for unset variables): Open MPI's OMPI_COMM_WORLD_SIZE, _RANK, _LOCAL_RANK
// and _LOCAL_SIZE; else MPICH/Intel MPI Hydra's PMI_SIZE, PMI_RANK,
// MPI_LOCALRANKID and MPI_LOCALNRANKS; else a PMIx launch's PMIX_RANK (Slurm's
// `srun --mpi=pmix`: world size from SLURM_STEP_NUM_TASKS when set, else 0
// for MPI to supply; SLURM_PROCID must equal PMIX_RANK when set). No
// variables set: rank 0 of 1, not launched. Local rank/size unset: local =
// world (kAssumedOneHost). Fails with InvalidArgument naming the variable when
// one is not a number or the values are inconsistent (rank >= size, ...).
absl::StatusOr<LaunchInfo> ParseLaunchInfo(
    const std::function<const char *(const char *)> &getenv);
// ParseLaunchInfo over the process environment.
absl::StatusOr<LaunchInfo> LaunchInfoFromEnvironment();

// What MPI itself says about this process (see DiscoverLaunchInfo).
struct MpiPlacement {
  int rank = 0;        // in MPI_COMM_WORLD
  int world_size = 1;  // of MPI_COMM_WORLD
  int local_rank = 0;  // in the MPI_COMM_TYPE_SHARED split
  int local_size = 1;  // of the MPI_COMM_TYPE_SHARED split
  std::string host;    // MPI_Get_processor_name
};

// Combines the launcher's environment with MPI's placement. MPI is
// authoritative: the result is MPI's rank, sizes and host with
// local_source kMpiSharedMemorySplit. The environment is the cross-check:
// FailedPrecondition naming the host and both values when its world rank or
// size (where it gave one) differs from MPI's (typically a program built
// against another MPI than the launcher's, where every process is a singleton),
// or when it named a local rank/size (kEnvironment) that differs from the
// split's. `from_environment` must be launched.
absl::StatusOr<LaunchInfo> ReconcileLaunchInfo(
    const LaunchInfo &from_environment, const MpiPlacement &from_mpi);

// This process's LaunchInfo. Launched (per the environment): initialises
// MPI (comm/mpi_runtime), splits MPI_COMM_WORLD by shared memory and
// reconciles as above; this is collective, every rank must call it. Not
// launched: rank 0 of 1 with gethostname's host, and MPI is never touched.
// Errors: ParseLaunchInfo's, MPI's (translated), ReconcileLaunchInfo's.
absl::StatusOr<LaunchInfo> DiscoverLaunchInfo();

// The GPU a rank uses: local_rank % device_count; -1 when there is none.
int DeviceIndexForRank(int local_rank, int device_count);

// The collective timeout: `option_seconds` when positive, else the value of
// ZE_COMM_TIMEOUT_SECONDS (read through `getenv`) when set, else 600.
// InvalidArgument naming the variable when it is not a positive number.
absl::StatusOr<double> ResolveTimeoutSeconds(
    double option_seconds,
    const std::function<const char *(const char *)> &getenv);

// Whether ranks may share a GPU: `option` when set, else the environment
// variable ZE_ALLOW_GPU_SHARING (read through `getenv`): "1" or "true" allow,
// "0", "false" or empty refuse, unset refuses. InvalidArgument naming the
// variable for any other value (a typo must not silently mean "no").
absl::StatusOr<bool> ResolveAllowGpuSharing(
    std::optional<bool> option,
    const std::function<const char *(const char *)> &getenv);

}  // namespace comm
}  // namespace ze

#endif  // ZE_COMM_BOOTSTRAP_H_
