// The in-process backend: a world of N ranks that are threads of one
// process, sharing its memory, so code that speaks the Communicator
// interface (the gradient reducer, the boundary step, the ZeRO strategies)
// gets plain, fast unit tests at 1-4 ranks without mpirun.
//
//   std::vector<absl::Status> statuses = comm::RunInProcess(
//       3, [&](comm::Communicator& comm) -> absl::Status {
//         ... comm.rank() of comm.world_size() ...
//       });
//
// What it implements: every operation of comm/communicator.h on CPU tensors
// (f32, bf16, f16), with the mpi backend's arithmetic: reductions widen to
// f32, sum in rank order (0, 1, ...), divide an average once by the world
// size and round to the dtype once at the end, so a result never depends on
// which thread came last. Gathers and broadcasts copy bytes.
//
// How: a rank's operation is posted to the world when issued (nothing is
// read yet); the rank that posts an operation last computes every rank's
// result from the posted inputs into temporaries; each rank copies its own
// result into its output on its own thread, in issue order, when it waits
// on the Work (Wait, StreamWait, Poll, or a later Work's wait). So nothing
// ever writes into a rank's memory from another thread, and a Work that is
// never waited on leaves its output untouched.
//
// Failures, never hangs: ranks that issue different operations under one
// sequence number (kind, reduce op, root, counts, dtype, or a barrier
// against a collective) fail it on every rank with FailedPrecondition
// naming both; a rank whose communicator is destroyed (RunInProcess: whose
// function returned) before issuing an operation another rank waits in
// fails that rank's wait at once with Aborted naming it; otherwise a wait
// times out with DeadlineExceeded as on the other backends.
#ifndef ZE_COMM_IN_PROCESS_H_
#define ZE_COMM_IN_PROCESS_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"

namespace ze {
namespace comm {

// The `world_size` communicators of one new in-process world: element r is
// rank r, local rank r of local size world_size (one host), on the CPU,
// backend_name() "in_process". As for every Communicator, one thread at a
// time uses each (normally rank r's own). They may be destroyed in any
// order and on any thread. InvalidArgument for world_size < 1 or a
// timeout <= 0.
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateInProcessWorld(
    int world_size, double timeout_seconds = 60);

// Runs rank_main(communicator) once for each rank of a new in-process world
// of `world_size`, each rank on a thread of its own (rank 0 on the caller's;
// core's ThreadPool), and returns once all have returned: element r is rank
// r's status. A rank's communicator is destroyed as soon as its function
// returns, so ranks still waiting for it fail at once (Aborted) instead of
// timing out. For a bad world_size or timeout, every element is that error.
// rank_main must not throw.
std::vector<absl::Status> RunInProcess(
    int world_size, const std::function<absl::Status(Communicator&)>& rank_main,
    double timeout_seconds = 60);

// RunInProcess for a rank function that returns a value: element r is rank
// r's value or error (every element the error for a bad world_size or
// timeout).
template <typename T>
std::vector<absl::StatusOr<T>> RunInProcessFor(
    int world_size,
    const std::function<absl::StatusOr<T>(Communicator&)>& rank_main,
    double timeout_seconds = 60) {
  std::vector<absl::StatusOr<T>> results(
      world_size > 0 ? world_size : 1,
      absl::StatusOr<T>(absl::UnknownError("rank did not run")));
  const std::vector<absl::Status> statuses = RunInProcess(
      world_size,
      [&](Communicator& comm) -> absl::Status {
        results[comm.rank()] = rank_main(comm);
        return results[comm.rank()].status();
      },
      timeout_seconds);
  for (size_t r = 0; r < statuses.size(); ++r) {
    if (!statuses[r].ok()) results[r] = statuses[r];
  }
  return results;
}

}  // namespace comm
}  // namespace ze

#endif  // ZE_COMM_IN_PROCESS_H_
