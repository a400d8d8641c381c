// Process-wide MPI state shared by the MPI and NCCL backends (internal to
// comm/). This is the one place MPI error codes become Statuses.
#ifndef ZE_COMM_MPI_RUNTIME_H_
#define ZE_COMM_MPI_RUNTIME_H_

#include <mutex>
#include <string>

#include "absl/status/status.h"

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

// Held around every MPI call comm/ makes.
std::mutex &MpiMutex();

// After a collective timed out, MPI_Finalize could wait forever for it; from
// then on the exit handler calls MPI_Abort instead, so the job ends (non-zero)
// instead of hanging.
void MarkMpiUnrecoverable();

}  // namespace comm
}  // namespace ze

#endif  // ZE_COMM_MPI_RUNTIME_H_
