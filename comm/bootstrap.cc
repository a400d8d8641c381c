#include "comm/bootstrap.h"

#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "comm/mpi_runtime.h"
#include "core/status.h"

namespace ze {
namespace comm {
namespace {

// The variables one launcher sets on every rank it starts.
struct LauncherVariables {
  const char *world_size;
  const char *rank;
  const char *local_rank;
  const char *local_size;
};

// Open MPI first: its mpirun is the documented launcher. Hydra (MPICH,
// Intel MPI, MVAPICH) second, so ranks it starts are not mistaken for
// independent single processes, each training alone.
constexpr LauncherVariables kLaunchers[] = {
    {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
};

// Reads an integer variable; `*value` keeps its default when unset.
absl::Status ReadInt(const std::function<const char *(const char *)> &getenv,
                     const char *name, int *value, bool *was_set) {
  const char *text = getenv(name);
  *was_set = text != nullptr;
  if (text == nullptr) return absl::OkStatus();
  if (!absl::SimpleAtoi(text, value) || *value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name, "=\"", text,
                     "\" is not a non-negative integer"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LaunchInfo> ParseLauncher(
    const std::function<const char *(const char *)> &getenv,
    const LauncherVariables &names) {
  LaunchInfo info;
  bool has_size = false, has_rank = false, has_local_rank = false,
       has_local_size = false;
  ZE_RETURN_IF_ERROR(
      ReadInt(getenv, names.world_size, &info.world_size, &has_size));
  ZE_RETURN_IF_ERROR(ReadInt(getenv, names.rank, &info.rank, &has_rank));
  ZE_RETURN_IF_ERROR(
      ReadInt(getenv, names.local_rank, &info.local_rank, &has_local_rank));
  ZE_RETURN_IF_ERROR(
      ReadInt(getenv, names.local_size, &info.local_size, &has_local_size));
  if (!has_size) {
    if (has_rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          names.rank, " is set but ", names.world_size, " is not"));
    }
    return LaunchInfo{};
  }
  info.launched = true;
  if (!has_rank) {
    return absl::InvalidArgumentError(
        absl::StrCat(names.world_size, " is set but ", names.rank, " is not"));
  }
  if (info.world_size < 1 || info.rank >= info.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(names.rank, "=", info.rank, " is not below ",
                     names.world_size, "=", info.world_size));
  }
  if (has_local_rank && has_local_size) {
    info.local_source = LocalRankSource::kEnvironment;
  } else {
    // Without both, a partial answer would be guessed; MPI's split decides.
    info.local_rank = info.rank;
    info.local_size = info.world_size;
    info.local_source = LocalRankSource::kAssumedOneHost;
  }
  if (info.local_size < 1 || info.local_rank >= info.local_size ||
      info.local_size > info.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        names.local_rank, "=", info.local_rank, " and ", names.local_size, "=",
        info.local_size, " are not a rank below a size of at most ",
        names.world_size, "=", info.world_size));
  }
  return info;
}

// A PMIx server's launch (Slurm's `srun --mpi=pmix`, PRRTE's prterun): the
// rank is PMIX_RANK, but PMIx exports no world size. srun's
// SLURM_STEP_NUM_TASKS is the step's size when present (cross-checked
// against MPI later); otherwise MPI alone says it (world_size 0).
absl::StatusOr<LaunchInfo> ParsePmixLaunch(
    const std::function<const char *(const char *)> &getenv) {
  LaunchInfo info;
  bool has_rank = false;
  ZE_RETURN_IF_ERROR(ReadInt(getenv, "PMIX_RANK", &info.rank, &has_rank));
  if (!has_rank) return LaunchInfo{};
  info.launched = true;
  bool has_size = false, has_slurm_rank = false;
  int slurm_rank = -1;
  ZE_RETURN_IF_ERROR(
      ReadInt(getenv, "SLURM_STEP_NUM_TASKS", &info.world_size, &has_size));
  ZE_RETURN_IF_ERROR(
      ReadInt(getenv, "SLURM_PROCID", &slurm_rank, &has_slurm_rank));
  if (has_slurm_rank && slurm_rank != info.rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("PMIX_RANK=", info.rank, " but SLURM_PROCID=", slurm_rank,
                     "; are the SLURM_ variables left over from another "
                     "step?"));
  }
  if (!has_size) {
    info.world_size = 0;
  } else if (info.world_size < 1 || info.rank >= info.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("PMIX_RANK=", info.rank,
                     " is not below SLURM_STEP_NUM_TASKS=", info.world_size));
  }
  // Which ranks share a host is MPI's shared-memory split's to say.
  info.local_rank = info.rank;
  info.local_size = info.world_size;
  info.local_source = LocalRankSource::kAssumedOneHost;
  return info;
}

std::string ThisHostName() {
  char name[HOST_NAME_MAX + 1] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown host";
  return name;
}

}  // namespace

const char *LocalRankSourceName(LocalRankSource source) {
  switch (source) {
    case LocalRankSource::kSingleProcess:
      return "single process";
    case LocalRankSource::kEnvironment:
      return "launcher environment";
    case LocalRankSource::kAssumedOneHost:
      return "assumption: one host";
    case LocalRankSource::kMpiSharedMemorySplit:
      return "MPI_COMM_TYPE_SHARED split";
  }
  return "unknown";
}

absl::StatusOr<LaunchInfo> ParseLaunchInfo(
    const std::function<const char *(const char *)> &getenv) {
  for (const LauncherVariables &names : kLaunchers) {
    ZE_ASSIGN_OR_RETURN(LaunchInfo info, ParseLauncher(getenv, names));
    if (info.launched) return info;
  }
  return ParsePmixLaunch(getenv);
}

absl::StatusOr<LaunchInfo> LaunchInfoFromEnvironment() {
  return ParseLaunchInfo([](const char *name) { return std::getenv(name); });
}

absl::StatusOr<LaunchInfo> ReconcileLaunchInfo(
    const LaunchInfo &from_environment, const MpiPlacement &from_mpi) {
  const LaunchInfo &env = from_environment;
  const bool size_differs =
      env.world_size != 0 && env.world_size != from_mpi.world_size;
  if (env.rank != from_mpi.rank || size_differs) {
    return absl::FailedPreconditionError(absl::StrCat(
        "on host ", from_mpi.host, ": MPI says rank ", from_mpi.rank, " of ",
        from_mpi.world_size, " but the launcher's environment says rank ",
        env.rank, " of ",
        env.world_size == 0 ? std::string("(size not given)")
                            : std::to_string(env.world_size),
        "; is the program linked against the MPI library of the launcher "
        "that started it?"));
  }
  if (env.local_source == LocalRankSource::kEnvironment &&
      (env.local_rank != from_mpi.local_rank ||
       env.local_size != from_mpi.local_size)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", from_mpi.rank, " on host ", from_mpi.host,
        ": MPI's shared-memory split says local rank ", from_mpi.local_rank,
        " of ", from_mpi.local_size,
        " but the launcher's environment says local rank ", env.local_rank,
        " of ", env.local_size,
        "; the GPU assignment cannot be trusted (are the OMPI_/PMI_ variables "
        "left over from another job?)"));
  }
  LaunchInfo info = env;
  info.world_size = from_mpi.world_size;
  info.local_rank = from_mpi.local_rank;
  info.local_size = from_mpi.local_size;
  info.local_source = LocalRankSource::kMpiSharedMemorySplit;
  info.host = from_mpi.host;
  return info;
}

absl::StatusOr<LaunchInfo> DiscoverLaunchInfo() {
  ZE_ASSIGN_OR_RETURN(LaunchInfo info, LaunchInfoFromEnvironment());
  if (!info.launched) {
    info.host = ThisHostName();
    return info;
  }
  ZE_ASSIGN_OR_RETURN(const MpiPlacement placement, QueryMpiPlacement());
  return ReconcileLaunchInfo(info, placement);
}

int DeviceIndexForRank(int local_rank, int device_count) {
  if (device_count <= 0) return -1;
  return local_rank % device_count;
}

absl::StatusOr<double> ResolveTimeoutSeconds(
    double option_seconds,
    const std::function<const char *(const char *)> &getenv) {
  if (option_seconds > 0) return option_seconds;
  const char *text = getenv("ZE_COMM_TIMEOUT_SECONDS");
  if (text == nullptr || *text == '\0') return 600.0;
  double seconds = 0;
  if (!absl::SimpleAtod(text, &seconds) || !(seconds > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ZE_COMM_TIMEOUT_SECONDS=\"", text,
                     "\" is not a positive number of seconds"));
  }
  return seconds;
}

absl::StatusOr<bool> ResolveAllowGpuSharing(
    std::optional<bool> option,
    const std::function<const char *(const char *)> &getenv) {
  if (option.has_value()) return *option;
  const char *text = getenv("ZE_ALLOW_GPU_SHARING");
  if (text == nullptr) return false;
  const std::string value = absl::AsciiStrToLower(text);
  if (value == "1" || value == "true") return true;
  if (value.empty() || value == "0" || value == "false") return false;
  return absl::InvalidArgumentError(
      absl::StrCat("environment variable ZE_ALLOW_GPU_SHARING=\"", text,
                   "\" is not 1, true, 0 or false"));
}

}  // namespace comm
}  // namespace ze
