// Process-wide MPI state shared by the MPI and NCCL backends (internal to
// comm/). This is the one place MPI error codes become Statuses.
#ifndef ZE_COMM_MPI_RUNTIME_H_
#define ZE_COMM_MPI_RUNTIME_H_

#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/bootstrap.h"

namespace ze {
namespace comm {

// Translates an MPI error code into a Status naming `what` failed, with MPI's
// error string. OK for MPI_SUCCESS.
absl::Status MpiStatus(int mpi_error, const std::string &what);

// Initialises MPI once per process (MPI_Init_thread asking for
// MPI_THREAD_MULTIPLE, accepting MPI_THREAD_SERIALIZED or better: every MPI
// call in comm/ holds MpiMutex()). Registers MPI_Finalize at exit.
// FailedPrecondition when the library grants less.
absl::Status EnsureMpiInitialized();

// Where MPI puts this process: its rank and size in MPI_COMM_WORLD, its rank
// and size among the ranks sharing this host's memory
// (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), keyed by world rank so local
// ranks follow world order), and MPI_Get_processor_name. Initialises MPI if
// needed. Collective over MPI_COMM_WORLD: every rank must call it.
absl::StatusOr<MpiPlacement> QueryMpiPlacement();

// Agreement on a check every rank made for itself: returns the lowest world
// rank whose `failed` is true, or -1 when none is. One MPI_Allreduce over
// MPI_COMM_WORLD (collective), so a failure on one rank becomes an error on
// every rank instead of a hang in the next collective. MPI must be
// initialised.
absl::StatusOr<int> LowestFailingRank(bool failed);

// Held around every MPI call comm/ makes.
std::mutex &MpiMutex();

// After a collective timed out, MPI_Finalize could wait forever for it; from
// then on the exit handler calls MPI_Abort instead, so the job ends (non-zero)
// instead of hanging.
void MarkMpiUnrecoverable();

}  // namespace comm
}  // namespace ze

#endif  // ZE_COMM_MPI_RUNTIME_H_
