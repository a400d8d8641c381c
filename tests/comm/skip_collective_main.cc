// One rank skips a collective; every other rank must fail with the named
// DeadlineExceeded error within the timeout, and the job must end non-zero
// instead of hanging. Run by skip_collective_test.sh under mpirun.
//
//   skip_collective_main --timeout=3 [--device=cpu|cuda] [--backend=...]
//
// Prints, on each waiting rank, one line
//   "rank R: DeadlineExceeded: <message>"
// and exits non-zero (the communicator's exit handler aborts the MPI job,
// because the stuck collective can never be finalised).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "comm/factory.h"
#include "core/ops.h"
#include "core/status.h"

int main(int argc, char **argv) {
  ze::comm::CommOptions options;
  options.device = "cpu";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--device=", 0) == 0) options.device = arg.substr(9);
    if (arg.rfind("--backend=", 0) == 0) options.backend = arg.substr(10);
    if (arg.rfind("--timeout=", 0) == 0) {
      options.timeout_seconds = std::atof(arg.substr(10).c_str());
    }
  }
  auto comm_or = ze::comm::CreateCommunicator(options);
  ZE_CHECK_OK(comm_or.status());
  ze::comm::Communicator &comm = **comm_or;
  ze::Stream stream;
  if (comm.device().is_cuda() && options.device != "cpu") {
    auto created = ze::Stream::Create(comm.device());
    ZE_CHECK_OK(created.status());
    stream = *created;
  }
  const int skipper = comm.world_size() - 1;
  auto tensor_or =
      ze::FromHostFloats(std::vector<float>(53, 1.0f), {53}, ze::DType::kBF16,
                         stream.device(), stream);
  ZE_CHECK_OK(tensor_or.status());
  ze::Tensor tensor = *tensor_or;

  // Collective #1: everyone takes part.
  auto first = comm.AllReduce(tensor, tensor, ze::comm::ReduceOp::kSum, stream);
  ZE_CHECK_OK(first.status());
  ZE_CHECK_OK(first->Wait());

  if (comm.rank() == skipper) {
    std::printf("rank %d: skipping collective #2 and sleeping\n", comm.rank());
    std::fflush(stdout);
    // Long past the others' timeout; mpirun kills this rank when they fail.
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  // Collective #2: the skipper never joins.
  const auto started = std::chrono::steady_clock::now();
  auto second =
      comm.AllReduce(tensor, tensor, ze::comm::ReduceOp::kSum, stream);
  ZE_CHECK_OK(second.status());
  const absl::Status status = second->Wait();
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started)
          .count();
  if (status.ok()) {
    std::printf("rank %d: UNEXPECTED success of collective #2\n", comm.rank());
    return 1;
  }
  std::printf("rank %d: %s: %s (after %.2f s)\n", comm.rank(),
              absl::StatusCodeToString(status.code()).c_str(),
              std::string(status.message()).c_str(), waited);
  // The communicator is now broken: later operations fail at once.
  auto third = comm.AllReduce(tensor, tensor, ze::comm::ReduceOp::kSum, stream);
  std::printf("rank %d: after the timeout: %s\n", comm.rank(),
              third.ok() ? "UNEXPECTED ok" : third.status().ToString().c_str());
  std::fflush(stdout);
  // Let the other waiting ranks report their own timeout before this exit
  // aborts the job.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  return 2;
}
