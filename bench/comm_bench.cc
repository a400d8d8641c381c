// comm_bench: time per collective and bus bandwidth per size, like
// nccl-tests. Launch with mpirun; rank 0 prints one JSON object per line:
//
//   {"collective":"all_reduce","backend":"nccl","dtype":"bf16","bytes":1048576,
//    "world_size":2,"time_us":12.3,"algbw_GBps":85.2,"busbw_GBps":85.2}
//
// bytes is the size of the larger buffer (nccl-tests' convention): the
// all-reduce buffer, the reduce-scatter input, the all-gather output, the
// broadcast buffer. algbw = bytes / time; busbw = algbw * 2(n-1)/n for
// all-reduce, (n-1)/n for reduce-scatter and all-gather, 1 for broadcast.
//
// Flags: --backend=auto|mpi|nccl --device=auto|cpu|cuda --dtype=f32|bf16|f16
//        --min_bytes=8 --max_bytes=1073741824 --factor=2 --iters=20
//        --warmup=5
//        --collectives=all_reduce,reduce_scatter,all_gather,broadcast
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "comm/factory.h"
#include "core/ops.h"
#include "core/status.h"

namespace {

using ze::comm::Communicator;
using ze::comm::Work;

struct Flags {
  std::string backend = "auto";
  std::string device = "auto";
  std::string dtype = "f32";
  int64_t min_bytes = 8;
  int64_t max_bytes = int64_t{1} << 30;
  int64_t factor = 2;
  int iters = 20;
  int warmup = 5;
  std::string collectives = "all_reduce,reduce_scatter,all_gather,broadcast";
};

bool TakeFlag(const std::string &arg, const char *name, std::string *value) {
  const std::string prefix = std::string("--") + name + "=";
  if (arg.rfind(prefix, 0) != 0) return false;
  *value = arg.substr(prefix.size());
  return true;
}

Flags ParseFlags(int argc, char **argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    std::string value;
    if (TakeFlag(arg, "backend", &flags.backend) ||
        TakeFlag(arg, "device", &flags.device) ||
        TakeFlag(arg, "dtype", &flags.dtype) ||
        TakeFlag(arg, "collectives", &flags.collectives)) {
    } else if (TakeFlag(arg, "min_bytes", &value)) {
      flags.min_bytes = std::atoll(value.c_str());
    } else if (TakeFlag(arg, "max_bytes", &value)) {
      flags.max_bytes = std::atoll(value.c_str());
    } else if (TakeFlag(arg, "factor", &value)) {
      flags.factor = std::max<int64_t>(2, std::atoll(value.c_str()));
    } else if (TakeFlag(arg, "iters", &value)) {
      flags.iters = std::max(1, std::atoi(value.c_str()));
    } else if (TakeFlag(arg, "warmup", &value)) {
      flags.warmup = std::max(0, std::atoi(value.c_str()));
    } else {
      std::fprintf(stderr, "comm_bench: unknown argument %s\n", arg.c_str());
      std::exit(2);
    }
  }
  return flags;
}

// Issues one collective of `bytes` (nccl-tests' convention) on views of the
// two preallocated buffers.
absl::StatusOr<Work> Issue(Communicator &comm, const std::string &collective,
                           const ze::Tensor &a, const ze::Tensor &b,
                           int64_t count, const ze::Stream &stream) {
  const int n = comm.world_size();
  if (collective == "all_reduce") {
    return comm.AllReduce(a.Slice(0, count), b.Slice(0, count),
                          ze::comm::ReduceOp::kSum, stream);
  }
  if (collective == "reduce_scatter") {
    return comm.ReduceScatter(a.Slice(0, count), b.Slice(0, count / n),
                              ze::comm::ReduceOp::kSum, stream);
  }
  if (collective == "all_gather") {
    return comm.AllGather(a.Slice(0, count / n), b.Slice(0, count), stream);
  }
  return comm.Broadcast(a.Slice(0, count), 0, stream);
}

double BusFactor(const std::string &collective, int n) {
  if (collective == "all_reduce") return 2.0 * (n - 1) / n;
  if (collective == "broadcast") return 1.0;
  return static_cast<double>(n - 1) / n;
}

}  // namespace

int main(int argc, char **argv) {
  const Flags flags = ParseFlags(argc, argv);
  ze::comm::CommOptions options;
  options.backend = flags.backend;
  options.device = flags.device;
  auto comm_or = ze::comm::CreateCommunicator(options);
  if (!comm_or.ok()) {
    std::fprintf(stderr, "comm_bench: %s\n",
                 comm_or.status().ToString().c_str());
    return 1;
  }
  Communicator &comm = **comm_or;
  auto dtype_or = ze::ParseDType(flags.dtype);
  ZE_CHECK_OK(dtype_or.status());
  const ze::DType dtype = *dtype_or;
  const size_t element = ze::SizeOf(dtype);
  ze::Stream stream;
  if (comm.device().is_cuda()) {
    auto created = ze::Stream::Create(comm.device(), /*high_priority=*/true);
    ZE_CHECK_OK(created.status());
    stream = *created;
  }
  const int64_t max_count = flags.max_bytes / static_cast<int64_t>(element);
  auto a = ze::Tensor::Empty({max_count}, dtype, comm.device());
  auto b = ze::Tensor::Empty({max_count}, dtype, comm.device());
  ZE_CHECK_OK(a.status());
  ZE_CHECK_OK(b.status());
  ZE_CHECK_OK(ze::Fill(*a, 1.0f, stream));
  ZE_CHECK_OK(ze::Fill(*b, 0.0f, stream));
  ZE_CHECK_OK(stream.Synchronize());
  const int n = comm.world_size();
  const std::vector<std::string> collectives =
      absl::StrSplit(flags.collectives, ',', absl::SkipEmpty());
  for (const std::string &collective : collectives) {
    for (int64_t bytes = flags.min_bytes; bytes <= flags.max_bytes;
         bytes *= flags.factor) {
      // Round down to whole elements per rank, as nccl-tests does.
      const int64_t count = bytes / static_cast<int64_t>(element) / n * n;
      if (count == 0) continue;
      const int64_t real_bytes = count * static_cast<int64_t>(element);
      for (int i = 0; i < flags.warmup; ++i) {
        auto work = Issue(comm, collective, *a, *b, count, stream);
        ZE_CHECK_OK(work.status());
        ZE_CHECK_OK(work->Wait());
      }
      ZE_CHECK_OK(comm.Barrier());
      const auto start = std::chrono::steady_clock::now();
      std::vector<Work> works;
      for (int i = 0; i < flags.iters; ++i) {
        auto work = Issue(comm, collective, *a, *b, count, stream);
        ZE_CHECK_OK(work.status());
        works.push_back(*work);
      }
      for (const Work &work : works) ZE_CHECK_OK(work.Wait());
      const double seconds = std::chrono::duration<double>(
                                 std::chrono::steady_clock::now() - start)
                                 .count() /
                             flags.iters;
      if (comm.rank() == 0) {
        const double algbw = real_bytes / seconds / 1e9;
        std::printf(
            "{\"collective\":\"%s\",\"backend\":\"%s\",\"dtype\":\"%s\","
            "\"bytes\":%lld,\"world_size\":%d,\"time_us\":%.3f,"
            "\"algbw_GBps\":%.3f,\"busbw_GBps\":%.3f}\n",
            collective.c_str(), comm.backend_name(), ze::DTypeName(dtype),
            static_cast<long long>(real_bytes), n, seconds * 1e6, algbw,
            algbw * BusFactor(collective, n));
        std::fflush(stdout);
      }
    }
  }
  ZE_CHECK_OK(comm.Barrier());
  return 0;
}
