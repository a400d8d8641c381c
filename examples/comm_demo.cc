// comm_demo: the communicator at work across ranks.
//
//   mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4 comm_demo
//
// Each rank bootstraps from mpirun's environment, runs an all-reduce, a
// reduce-scatter, an all-gather and a broadcast, prints what it got, and
// checks it against the value every rank can compute on its own. Rank 0
// ends with "comm_demo: OK ..." when every rank agreed; any mismatch or
// error exits non-zero. Started without mpirun it is a world of one.
//
// Flags: --backend=auto|mpi|nccl --device=auto|cpu|cuda (default cpu).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "comm/factory.h"
#include "core/ops.h"
#include "core/status.h"

namespace {

using ze::comm::Communicator;
using ze::comm::ReduceOp;

std::string Join(const std::vector<float> &values) {
  return absl::StrJoin(values, " ");
}

absl::Status Demo(Communicator &comm, const ze::Stream &stream) {
  const int n = comm.world_size();
  const int me = comm.rank();
  const ze::Device device = stream.device();
  int mismatches = 0;
  const auto check = [&](const char *what, const std::vector<float> &got,
                         const std::vector<float> &want) {
    const bool ok = got == want;
    if (!ok) ++mismatches;
    std::printf("rank %d: %-14s -> [%s]%s\n", me, what, Join(got).c_str(),
                ok ? "" : (" MISMATCH, expected [" + Join(want) + "]").c_str());
  };

  // All-reduce (bf16, reduced in f32): element i is sum over ranks of (r + i).
  std::vector<float> mine(5), want(5);
  for (int i = 0; i < 5; ++i) {
    mine[i] = static_cast<float>(me + i);
    want[i] = static_cast<float>(n * (n - 1) / 2 + n * i);
  }
  ZE_ASSIGN_OR_RETURN(
      ze::Tensor x,
      ze::FromHostFloats(mine, {5}, ze::DType::kBF16, device, stream));
  ZE_ASSIGN_OR_RETURN(ze::comm::Work work,
                      comm.AllReduce(x, x, ReduceOp::kSum, stream));
  ZE_RETURN_IF_ERROR(work.Wait());
  ZE_ASSIGN_OR_RETURN(std::vector<float> got, ze::ToHostFloats(x, stream));
  check("all_reduce sum", got, want);

  // Reduce-scatter: every rank contributes 1..2n; rank r keeps elements
  // [2r, 2r+2) of the sum, i.e. n * (2r+1), n * (2r+2).
  std::vector<float> ones(2 * n);
  for (int i = 0; i < 2 * n; ++i) ones[i] = static_cast<float>(i + 1);
  ZE_ASSIGN_OR_RETURN(
      ze::Tensor full,
      ze::FromHostFloats(ones, {2 * n}, ze::DType::kF32, device, stream));
  ZE_ASSIGN_OR_RETURN(ze::Tensor shard,
                      ze::Tensor::Empty({2}, ze::DType::kF32, device));
  ZE_ASSIGN_OR_RETURN(work,
                      comm.ReduceScatter(full, shard, ReduceOp::kSum, stream));
  ZE_RETURN_IF_ERROR(work.Wait());
  ZE_ASSIGN_OR_RETURN(got, ze::ToHostFloats(shard, stream));
  check("reduce_scatter", got,
        {static_cast<float>(n * (2 * me + 1)),
         static_cast<float>(n * (2 * me + 2))});

  // All-gather of each rank's id (f16).
  ZE_ASSIGN_OR_RETURN(ze::Tensor id,
                      ze::FromHostFloats({static_cast<float>(me)}, {1},
                                         ze::DType::kF16, device, stream));
  ZE_ASSIGN_OR_RETURN(ze::Tensor ids,
                      ze::Tensor::Empty({n}, ze::DType::kF16, device));
  ZE_ASSIGN_OR_RETURN(work, comm.AllGather(id, ids, stream));
  ZE_RETURN_IF_ERROR(work.Wait());
  ZE_ASSIGN_OR_RETURN(got, ze::ToHostFloats(ids, stream));
  std::vector<float> all_ids(n);
  for (int r = 0; r < n; ++r) all_ids[r] = static_cast<float>(r);
  check("all_gather ids", got, all_ids);

  // Broadcast from the last rank.
  const int root = n - 1;
  ZE_ASSIGN_OR_RETURN(
      ze::Tensor message,
      ze::FromHostFloats(me == root ? std::vector<float>{3, 1, 4}
                                    : std::vector<float>{0, 0, 0},
                         {3}, ze::DType::kF32, device, stream));
  ZE_ASSIGN_OR_RETURN(work, comm.Broadcast(message, root, stream));
  ZE_RETURN_IF_ERROR(work.Wait());
  ZE_ASSIGN_OR_RETURN(got, ze::ToHostFloats(message, stream));
  check("broadcast", got, {3, 1, 4});

  // Did every rank pass? An all-reduce (max) of the mismatch counts says.
  ZE_ASSIGN_OR_RETURN(ze::Tensor bad,
                      ze::FromHostFloats({static_cast<float>(mismatches)}, {1},
                                         ze::DType::kF32, device, stream));
  ZE_ASSIGN_OR_RETURN(work, comm.AllReduce(bad, bad, ReduceOp::kMax, stream));
  ZE_RETURN_IF_ERROR(work.Wait());
  ZE_ASSIGN_OR_RETURN(got, ze::ToHostFloats(bad, stream));
  ZE_RETURN_IF_ERROR(comm.Barrier());
  if (got[0] != 0) {
    return absl::InternalError(
        absl::StrCat("a rank saw ", got[0], " mismatches"));
  }
  if (me == 0) {
    std::printf(
        "comm_demo: OK (%d rank%s, backend %s, tensors on %s, %llu "
        "collectives)\n",
        n, n == 1 ? "" : "s", comm.backend_name(), device.ToString().c_str(),
        static_cast<unsigned long long>(comm.next_sequence_number() - 1));
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char **argv) {
  ze::comm::CommOptions options;
  options.device = "cpu";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--device=", 0) == 0) options.device = arg.substr(9);
    if (arg.rfind("--backend=", 0) == 0) options.backend = arg.substr(10);
  }
  auto comm = ze::comm::CreateCommunicator(options);
  if (!comm.ok()) {
    std::fprintf(stderr, "comm_demo: %s\n", comm.status().ToString().c_str());
    return 1;
  }
  ze::Stream stream;
  if ((*comm)->device().is_cuda()) {
    auto created = ze::Stream::Create((*comm)->device());
    if (!created.ok()) {
      std::fprintf(stderr, "comm_demo: %s\n",
                   created.status().ToString().c_str());
      return 1;
    }
    stream = *created;
  }
  std::printf("rank %d of %d: local rank %d, backend %s, device %s\n",
              (*comm)->rank(), (*comm)->world_size(), (*comm)->local_rank(),
              (*comm)->backend_name(), (*comm)->device().ToString().c_str());
  const absl::Status status = Demo(**comm, stream);
  if (!status.ok()) {
    std::fprintf(stderr, "rank %d: comm_demo failed: %s\n", (*comm)->rank(),
                 status.ToString().c_str());
    return 1;
  }
  return 0;
}
