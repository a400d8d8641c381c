#include "comm/mpi_runtime.h"

#include <mpi.h>

#include <atomic>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "core/logging.h"

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

void MarkMpiUnrecoverable() { g_unrecoverable.store(true); }

}  // namespace comm
}  // namespace ze
