#include "comm/factory.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "comm/backends.h"
#include "comm/mpi_runtime.h"
#include "core/logging.h"
#include "core/status.h"

namespace ze {
namespace comm {
namespace {

const char *Getenv(const char *name) { return std::getenv(name); }

// "rank 3 on host gpu-07": how every bootstrap error names its rank.
std::string RankOnHost(const LaunchInfo &info) {
  return absl::StrCat("rank ", info.rank, " on host ",
                      info.host.empty() ? "(unknown)" : info.host);
}

std::string Gpus(int count) {
  return absl::StrCat(count, count == 1 ? " visible GPU" : " visible GPUs");
}

// What a launch must settle before any backend exists; may differ by rank
// (environment, visible GPUs), hence agreed on by every rank.
struct Settings {
  CommPlan plan;
  double timeout_seconds = 0;
};

absl::StatusOr<Settings> Settle(const LaunchInfo &info,
                                const CommOptions &options) {
  Settings settings;
  ZE_ASSIGN_OR_RETURN(settings.timeout_seconds,
                      ResolveTimeoutSeconds(options.timeout_seconds, Getenv));
  ZE_ASSIGN_OR_RETURN(
      const bool allow_sharing,
      ResolveAllowGpuSharing(options.allow_gpu_sharing, Getenv));
  ZE_ASSIGN_OR_RETURN(settings.plan,
                      PlanCommunicator(info, CudaDeviceCount(), options.device,
                                       options.backend, allow_sharing));
  return settings;
}

}  // namespace

absl::StatusOr<CommPlan> PlanCommunicator(const LaunchInfo &info,
                                          int device_count,
                                          const std::string &device,
                                          const std::string &backend,
                                          bool allow_gpu_sharing) {
  if (device != "auto" && device != "cpu" && device != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat(
        "CommOptions.device \"", device, "\" is not one of auto, cpu, cuda"));
  }
  if (backend != "auto" && backend != "mpi" && backend != "nccl") {
    return absl::InvalidArgumentError(absl::StrCat(
        "CommOptions.backend \"", backend, "\" is not one of auto, mpi, nccl"));
  }
  CommPlan plan;
  if (device == "cuda" || (device == "auto" && device_count > 0)) {
    if (device_count <= 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("CommOptions.device is \"cuda\" but ", RankOnHost(info),
                       " sees no CUDA device"));
    }
    plan.device =
        Device::Cuda(DeviceIndexForRank(info.local_rank, device_count));
  }
  const bool gpu_per_rank = info.local_size <= device_count;
  if (plan.device.is_cuda() && !gpu_per_rank) {
    const std::string shared = absl::StrCat(
        RankOnHost(info), ": ", info.local_size,
        " ranks on this host (counted by ",
        LocalRankSourceName(info.local_source), ") but ", Gpus(device_count),
        ", so ranks would share a GPU (local rank i takes cuda:(i % ",
        device_count, "); this is local rank ", info.local_rank, " on ",
        plan.device.ToString(), ")");
    if (backend == "nccl") {
      return absl::FailedPreconditionError(absl::StrCat(
          "CommOptions.backend \"nccl\" needs one GPU per rank: ", shared,
          ". NCCL refuses two ranks on one GPU; start at most ", device_count,
          " rank(s) per host, or share the GPU over backend \"mpi\" with "
          "ZE_ALLOW_GPU_SHARING=1"));
    }
    if (!allow_gpu_sharing) {
      return absl::FailedPreconditionError(absl::StrCat(
          shared,
          ". Two ranks on one GPU are refused unless asked for: NCCL cannot "
          "run there and the mpi backend stages every collective through host "
          "memory. Start at most ",
          device_count, " rank(s) per host (mpirun --map-by ppr:", device_count,
          ":node), make more GPUs visible (CUDA_VISIBLE_DEVICES), ",
          device == "auto" ? "keep tensors on the host (device \"cpu\"), " : "",
          "or, to share GPUs on purpose (tests on one GPU), set "
          "ZE_ALLOW_GPU_SHARING=1 for every rank (mpirun -x "
          "ZE_ALLOW_GPU_SHARING=1) or CommOptions.allow_gpu_sharing"));
    }
  }
  if (backend == "nccl" && !plan.device.is_cuda()) {
    return absl::FailedPreconditionError(
        absl::StrCat("CommOptions.backend \"nccl\" needs CUDA tensors; ",
                     RankOnHost(info), " uses ", plan.device.ToString()));
  }
  plan.backend = backend;
  if (plan.backend == "auto") {
    plan.backend = plan.device.is_cuda() && gpu_per_rank ? "nccl" : "mpi";
  }
  // A process without a launcher is a world of one: no MPI needed.
  if (plan.backend == "mpi" && !info.launched) plan.backend = "local";
  return plan;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    const CommOptions &options) {
  ZE_ASSIGN_OR_RETURN(LaunchInfo info, LaunchInfoFromEnvironment());
  absl::StatusOr<Settings> settings;
  if (!info.launched) {
    ZE_ASSIGN_OR_RETURN(info, DiscoverLaunchInfo());
    settings = Settle(info, options);
    if (!settings.ok()) return settings.status();
  } else {
    // MPI's shared-memory split, not the environment, says how many ranks
    // share this host (and so its GPUs), whichever launcher started them.
    ZE_ASSIGN_OR_RETURN(const MpiPlacement placement, QueryMpiPlacement());
    absl::StatusOr<LaunchInfo> reconciled =
        ReconcileLaunchInfo(info, placement);
    if (reconciled.ok()) {
      info = *reconciled;
      settings = Settle(info, options);
    } else {
      settings = reconciled.status();
    }
    // Ranks may see different environments or GPUs; one refusing while the
    // others go on would leave them waiting in the backend's first collective.
    ZE_ASSIGN_OR_RETURN(const int failing, LowestFailingRank(!settings.ok()));
    if (!settings.ok()) return settings.status();
    if (failing >= 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "CreateCommunicator failed on rank ", failing,
          " (its error is in its output); ", RankOnHost(info), " stops too"));
    }
  }
  const CommPlan &plan = settings->plan;
  absl::StatusOr<std::unique_ptr<Communicator>> comm;
  if (plan.backend == "nccl") {
    comm = CreateNcclCommunicator(info, plan.device, settings->timeout_seconds);
  } else if (plan.backend == "mpi") {
    comm = CreateMpiCommunicator(info, plan.device, settings->timeout_seconds);
  } else {
    comm = CreateLocalCommunicator(plan.device, settings->timeout_seconds);
  }
  if (!comm.ok()) return comm.status();
  SetLogRank(info.rank, info.world_size);
  ZE_LOG(DEBUG) << RankOnHost(info) << ": local rank " << info.local_rank
                << " of " << info.local_size << " ("
                << LocalRankSourceName(info.local_source) << "), "
                << plan.device.ToString() << ", " << plan.backend << " backend";
  return comm;
}

}  // namespace comm
}  // namespace ze
