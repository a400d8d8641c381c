#include "comm/mpi_runtime.h"

#include <mpi.h>

#include <atomic>
#include <climits>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status.h"

namespace ze {
namespace comm {
namespace {

std::atomic<bool> g_unrecoverable{false};

void FinalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (g_unrecoverable.load()) {
    // Pending collectives would make MPI_Finalize wait forever.
    MPI_Abort(MPI_COMM_WORLD, 1);
    return;
  }
  MPI_Finalize();
}

}  // namespace

absl::Status MpiStatus(int mpi_error, const std::string &what) {
  if (mpi_error == MPI_SUCCESS) return absl::OkStatus();
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  if (MPI_Error_string(mpi_error, text, &length) != MPI_SUCCESS) length = 0;
  int error_class = 0;
  MPI_Error_class(mpi_error, &error_class);
  const std::string message =
      absl::StrCat(what, " failed: MPI error ", mpi_error, " (",
                   std::string(text, length), ")");
  switch (error_class) {
    case MPI_ERR_BUFFER:
    case MPI_ERR_COUNT:
    case MPI_ERR_TYPE:
    case MPI_ERR_ROOT:
    case MPI_ERR_OP:
    case MPI_ERR_ARG:
    case MPI_ERR_RANK:
    case MPI_ERR_COMM:
      return absl::InvalidArgumentError(message);
    case MPI_ERR_NO_MEM:
      return absl::ResourceExhaustedError(message);
    case MPI_ERR_PENDING:
    case MPI_ERR_IN_STATUS:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

std::mutex &MpiMutex() {
  static std::mutex mutex;
  return mutex;
}

absl::Status EnsureMpiInitialized() {
  static std::mutex init_mutex;
  std::lock_guard<std::mutex> init_lock(init_mutex);
  std::lock_guard<std::mutex> lock(MpiMutex());
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return absl::OkStatus();
  int provided = 0;
  absl::Status status = MpiStatus(
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided),
      "MPI_Init_thread");
  if (!status.ok()) return status;
  if (provided < MPI_THREAD_SERIALIZED) {
    return absl::FailedPreconditionError(
        absl::StrCat("MPI_Init_thread granted thread level ", provided,
                     "; comm/ needs at least MPI_THREAD_SERIALIZED"));
  }
  // Errors come back as codes (translated by MpiStatus), not aborts.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  std::atexit(FinalizeAtExit);
  return absl::OkStatus();
}

absl::StatusOr<MpiPlacement> QueryMpiPlacement() {
  ZE_RETURN_IF_ERROR(EnsureMpiInitialized());
  std::lock_guard<std::mutex> lock(MpiMutex());
  MpiPlacement placement;
  ZE_RETURN_IF_ERROR(MpiStatus(MPI_Comm_rank(MPI_COMM_WORLD, &placement.rank),
                               "MPI_Comm_rank(MPI_COMM_WORLD)"));
  ZE_RETURN_IF_ERROR(
      MpiStatus(MPI_Comm_size(MPI_COMM_WORLD, &placement.world_size),
                "MPI_Comm_size(MPI_COMM_WORLD)"));
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int length = 0;
  ZE_RETURN_IF_ERROR(MpiStatus(
      MPI_Get_processor_name(name, &length),
      absl::StrCat("MPI_Get_processor_name on rank ", placement.rank)));
  placement.host.assign(name, length);
  MPI_Comm host_comm = MPI_COMM_NULL;
  ZE_RETURN_IF_ERROR(MpiStatus(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, placement.rank,
                          MPI_INFO_NULL, &host_comm),
      absl::StrCat("MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) on rank ",
                   placement.rank, " (host ", placement.host, ")")));
  absl::Status status =
      MpiStatus(MPI_Comm_rank(host_comm, &placement.local_rank),
                "MPI_Comm_rank of the shared-memory split");
  if (status.ok()) {
    status = MpiStatus(MPI_Comm_size(host_comm, &placement.local_size),
                       "MPI_Comm_size of the shared-memory split");
  }
  MPI_Comm_free(&host_comm);
  if (!status.ok()) return status;
  return placement;
}

absl::StatusOr<int> LowestFailingRank(bool failed) {
  std::lock_guard<std::mutex> lock(MpiMutex());
  int rank = 0;
  ZE_RETURN_IF_ERROR(MpiStatus(MPI_Comm_rank(MPI_COMM_WORLD, &rank),
                               "MPI_Comm_rank(MPI_COMM_WORLD)"));
  const int mine = failed ? rank : INT_MAX;
  int lowest = INT_MAX;
  ZE_RETURN_IF_ERROR(MpiStatus(
      MPI_Allreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD),
      absl::StrCat(
          "MPI_Allreduce agreeing on CreateCommunicator's checks (rank ", rank,
          ")")));
  return lowest == INT_MAX ? -1 : lowest;
}

void MarkMpiUnrecoverable() { g_unrecoverable.store(true); }

}  // namespace comm
}  // namespace ze
