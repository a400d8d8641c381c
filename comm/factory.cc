#include "comm/factory.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "comm/backends.h"
#include "comm/bootstrap.h"
#include "core/logging.h"
#include "core/status.h"

namespace ze {
namespace comm {

absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    const CommOptions &options) {
  ZE_ASSIGN_OR_RETURN(const LaunchInfo info, LaunchInfoFromEnvironment());
  ZE_ASSIGN_OR_RETURN(
      const double timeout,
      ResolveTimeoutSeconds(options.timeout_seconds, [](const char *name) {
        return std::getenv(name);
      }));
  const int device_count = CudaDeviceCount();
  Device device = Device::Cpu();
  if (options.device == "cuda" ||
      (options.device == "auto" && device_count > 0)) {
    if (device_count == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("CommOptions.device is \"cuda\" but rank ", info.rank,
                       " sees no CUDA device"));
    }
    device = Device::Cuda(DeviceIndexForRank(info.local_rank, device_count));
  } else if (options.device != "cpu" && options.device != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("CommOptions.device \"", options.device,
                     "\" is not one of auto, cpu, cuda"));
  }
  const bool gpu_per_rank = device.is_cuda() && info.local_size <= device_count;
  std::string backend = options.backend;
  if (backend == "auto") backend = gpu_per_rank ? "nccl" : "mpi";
  absl::StatusOr<std::unique_ptr<Communicator>> comm;
  if (backend == "nccl") {
    if (!device.is_cuda()) {
      return absl::FailedPreconditionError(
          absl::StrCat("CommOptions.backend \"nccl\" needs CUDA tensors; rank ",
                       info.rank, " uses ", device.ToString()));
    }
    if (!gpu_per_rank) {
      return absl::FailedPreconditionError(absl::StrCat(
          "CommOptions.backend \"nccl\" needs one GPU per rank: ",
          info.local_size, " ranks on this host share ", device_count,
          " GPU(s) (NCCL refuses two ranks on one GPU; use \"mpi\")"));
    }
    comm = CreateNcclCommunicator(info, device, timeout);
  } else if (backend == "mpi") {
    if (info.launched) {
      comm = CreateMpiCommunicator(info, device, timeout);
    } else {
      comm = CreateLocalCommunicator(device, timeout);
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("CommOptions.backend \"", options.backend,
                     "\" is not one of auto, mpi, nccl"));
  }
  if (!comm.ok()) return comm.status();
  SetLogRank(info.rank, info.world_size);
  return comm;
}

}  // namespace comm
}  // namespace ze
