// comm_bench: time per collective and bus bandwidth per size, out of place
// and in place, with each result checked, like nccl-tests. Launch with
// mpirun; rank 0 prints.
//
// --format=json (the default): one JSON object per collective, size and
// placement:
//
//   {"collective":"all_reduce","backend":"nccl","dtype":"bf16","bytes":1048576,
//    "world_size":2,"in_place":false,"time_us":12.3,"algbw_GBps":85.2,
//    "busbw_GBps":85.2,"wrong":0}
//
// --format=table: nccl-tests' table, one per collective (size, count, type,
// redop, root, then time/algbw/busbw/#wrong out of place and in place),
// ending with "# Out of bounds values" (results with wrong elements) and
// "# Avg bus bandwidth" (the mean busbw over the table's results).
//
// bytes is the size of the larger buffer (nccl-tests' convention): the
// all-reduce buffer, the reduce-scatter input, the all-gather output, the
// broadcast buffer; count in the table is the count argument of the call
// (per rank for reduce-scatter and all-gather). algbw = bytes / time; busbw =
// algbw * 2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter and
// all-gather, 1 for broadcast. time is rank 0's mean over the timed
// iterations (issued back to back, then waited for). On the mpi backend
// each 16-bit reduction in flight needs f32 buffers of its own and only two
// are kept between collectives, so --iters above 1 times fresh allocations
// there too; --iters=1 (after --warmup) gives the steady cost of one at a
// time, as the engine's tied-gradient sum issues it.
//
// In place: all-reduce with input = output, reduce-scatter into its own
// slice of the input, all-gather from its own slice of the output. Broadcast
// is always in place (Communicator::Broadcast has one buffer), so it has no
// out-of-place result (N/A in the table, no JSON object).
//
// wrong: after the timed iterations, once per size and placement and outside
// the timing, every rank fills its input with known values
// (bench/collective_check.h), runs the collective once and counts the
// output elements that differ from the exact result; the count is summed
// over ranks. Any wrong element makes the exit status 1. --check=0 skips it
// (wrong -1).
//
// Flags: --backend=auto|mpi|nccl --device=auto|cpu|cuda --dtype=f32|bf16|f16
//        --min_bytes=8 --max_bytes=1073741824 --factor=2 --iters=20
//        --warmup=5 --check=1 --format=json|table
//        --collectives=all_reduce,reduce_scatter,all_gather,broadcast
// bench/torch_comm_reference.py prints the same JSON for torch.distributed.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "bench/collective_check.h"
#include "comm/factory.h"
#include "core/ops.h"
#include "core/status.h"

namespace {

using ze::bench::Collective;
using ze::bench::CollectiveShape;
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
  bool check = true;
  std::string format = "json";
  std::string collectives = "all_reduce,reduce_scatter,all_gather,broadcast";
};

bool TakeFlag(const std::string &arg, const char *name, std::string *value) {
  const std::string prefix = std::string("--") + name + "=";
  if (arg.rfind(prefix, 0) != 0) return false;
  *value = arg.substr(prefix.size());
  return true;
}

[[noreturn]] void Usage(const std::string &problem) {
  std::fprintf(stderr, "comm_bench: %s\n", problem.c_str());
  std::exit(2);
}

Flags ParseFlags(int argc, char **argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    std::string value;
    if (TakeFlag(arg, "backend", &flags.backend) ||
        TakeFlag(arg, "device", &flags.device) ||
        TakeFlag(arg, "dtype", &flags.dtype) ||
        TakeFlag(arg, "format", &flags.format) ||
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
    } else if (TakeFlag(arg, "check", &value)) {
      if (value != "0" && value != "1") Usage("--check is 0 or 1");
      flags.check = value == "1";
    } else {
      Usage("unknown argument " + arg);
    }
  }
  if (flags.format != "json" && flags.format != "table") {
    Usage("--format=" + flags.format + " is not json or table");
  }
  if (flags.min_bytes < 1 || flags.max_bytes < flags.min_bytes) {
    Usage("need 1 <= --min_bytes <= --max_bytes");
  }
  return flags;
}

// Dies with the rank and what failed: a benchmark has no caller to return to.
void CheckOk(const absl::Status &status, const Communicator &comm,
             const char *what) {
  if (status.ok()) return;
  std::fprintf(stderr, "comm_bench: rank %d: %s: %s\n", comm.rank(), what,
               status.ToString().c_str());
  std::exit(1);
}

// The views one collective of `shape` reads and writes in the two
// preallocated buffers: out of place from `a` into `b`, in place within `b`.
struct Views {
  ze::Tensor input;
  ze::Tensor output;
};

Views ViewsFor(Collective collective, const CollectiveShape &shape, int rank,
               bool in_place, const ze::Tensor &a, const ze::Tensor &b) {
  if (!in_place) {
    return {a.Slice(0, shape.send_count), b.Slice(0, shape.recv_count)};
  }
  switch (collective) {
    case Collective::kReduceScatter:
      return {b.Slice(0, shape.count),
              b.Slice(rank * shape.recv_count, shape.recv_count)};
    case Collective::kAllGather:
      return {b.Slice(rank * shape.send_count, shape.send_count),
              b.Slice(0, shape.count)};
    case Collective::kAllReduce:
    case Collective::kBroadcast:
      break;
  }
  return {b.Slice(0, shape.count), b.Slice(0, shape.count)};
}

absl::StatusOr<Work> Issue(Communicator &comm, Collective collective,
                           const Views &views, const ze::Stream &stream) {
  switch (collective) {
    case Collective::kAllReduce:
      return comm.AllReduce(views.input, views.output, ze::comm::ReduceOp::kSum,
                            stream);
    case Collective::kReduceScatter:
      return comm.ReduceScatter(views.input, views.output,
                                ze::comm::ReduceOp::kSum, stream);
    case Collective::kAllGather:
      return comm.AllGather(views.input, views.output, stream);
    case Collective::kBroadcast:
      break;
  }
  return comm.Broadcast(views.output, /*root=*/0, stream);
}

// Elements wrong on all ranks together. Each rank's count travels as two
// base-65536 digits through an all-gather (a copy, exact at any world size),
// since a sum of large counts would round in f32.
int64_t WrongOnAllRanks(Communicator &comm, int64_t mine,
                        const ze::Stream &stream) {
  const int64_t n = comm.world_size();
  auto digits = ze::FromHostFloats(
      {static_cast<float>(mine >> 16), static_cast<float>(mine & 0xFFFF)}, {2},
      ze::DType::kF32, comm.device(), stream);
  CheckOk(digits.status(), comm, "uploading the wrong count");
  auto all = ze::Tensor::Empty({2 * n}, ze::DType::kF32, comm.device());
  CheckOk(all.status(), comm, "allocating the wrong counts");
  auto work = comm.AllGather(*digits, *all, stream);
  CheckOk(work.status(), comm, "all-gather of the wrong counts");
  CheckOk(work->Wait(), comm, "all-gather of the wrong counts");
  auto values = ze::ToHostFloats(*all, stream);
  CheckOk(values.status(), comm, "reading the wrong counts");
  int64_t total = 0;
  for (int64_t r = 0; r < n; ++r) {
    total += (static_cast<int64_t>((*values)[2 * r]) << 16) +
             static_cast<int64_t>((*values)[2 * r + 1]);
  }
  return total;
}

// Runs the collective once on known inputs and returns the wrong elements
// over all ranks. Outputs are first filled with -1 (no known value), so an
// element the collective never wrote counts as wrong.
int64_t CheckOnce(Communicator &comm, Collective collective,
                  const CollectiveShape &shape, const Views &views,
                  ze::DType dtype, const ze::Stream &stream) {
  const int n = comm.world_size();
  const std::vector<float> input =
      ze::bench::KnownInput(collective, comm.rank(), n, shape.count);
  CheckOk(ze::Fill(views.output, -1.0f, stream), comm, "clearing the output");
  auto known = ze::FromHostFloats(input, {static_cast<int64_t>(input.size())},
                                  dtype, comm.device(), stream);
  CheckOk(known.status(), comm, "uploading the known input");
  CheckOk(ze::Copy(*known, views.input, stream), comm,
          "writing the known input");
  auto work = Issue(comm, collective, views, stream);
  CheckOk(work.status(), comm, "the checked collective");
  CheckOk(work->Wait(), comm, "the checked collective");
  auto output = ze::ToHostFloats(views.output, stream);
  CheckOk(output.status(), comm, "reading the output");
  return WrongOnAllRanks(
      comm,
      ze::bench::CountWrong(collective, comm.rank(), n, shape.count, *output),
      stream);
}

struct Result {
  bool measured = false;
  double time_us = 0;
  double algbw = 0;
  double busbw = 0;
  int64_t wrong = -1;  // -1: not checked
};

Result Measure(Communicator &comm, Collective collective,
               const CollectiveShape &shape, bool in_place, const Flags &flags,
               ze::DType dtype, const ze::Tensor &a, const ze::Tensor &b,
               const ze::Stream &stream) {
  const Views views = ViewsFor(collective, shape, comm.rank(), in_place, a, b);
  // In place, reductions feed their output back in; zeros keep it finite.
  if (in_place) {
    CheckOk(ze::Fill(views.input, 0.0f, stream), comm, "Fill");
    CheckOk(ze::Fill(views.output, 0.0f, stream), comm, "Fill");
  }
  for (int i = 0; i < flags.warmup; ++i) {
    auto work = Issue(comm, collective, views, stream);
    CheckOk(work.status(), comm, "warm-up collective");
    CheckOk(work->Wait(), comm, "warm-up collective");
  }
  CheckOk(comm.Barrier(), comm, "Barrier");
  const auto start = std::chrono::steady_clock::now();
  std::vector<Work> works;
  for (int i = 0; i < flags.iters; ++i) {
    auto work = Issue(comm, collective, views, stream);
    CheckOk(work.status(), comm, "timed collective");
    works.push_back(*work);
  }
  for (const Work &work : works) CheckOk(work.Wait(), comm, "timed collective");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count() /
      flags.iters;
  Result result;
  result.measured = true;
  result.time_us = seconds * 1e6;
  const int64_t bytes = shape.count * static_cast<int64_t>(ze::SizeOf(dtype));
  result.algbw = bytes / seconds / 1e9;
  result.busbw =
      result.algbw * ze::bench::BusFactor(collective, comm.world_size());
  if (flags.check) {
    result.wrong = CheckOnce(comm, collective, shape, views, dtype, stream);
  }
  return result;
}

// nccl-tests' type names, so tables compare column for column.
const char *TableTypeName(ze::DType dtype) {
  switch (dtype) {
    case ze::DType::kF32:
      return "float";
    case ze::DType::kBF16:
      return "bfloat16";
    case ze::DType::kF16:
      return "half";
    default:
      return ze::DTypeName(dtype);
  }
}

void PrintTableHeader(const Communicator &comm, Collective collective,
                      const Flags &flags, ze::DType dtype) {
  std::printf(
      "# comm_bench %s: backend %s, device %s (rank 0), world size %d, dtype "
      "%s\n"
      "# minBytes %lld maxBytes %lld step: %lld(factor) warmup iters: %d "
      "iters: %d validation: %d\n#\n",
      ze::bench::CollectiveName(collective), comm.backend_name(),
      comm.device().ToString().c_str(), comm.world_size(), ze::DTypeName(dtype),
      static_cast<long long>(flags.min_bytes),
      static_cast<long long>(flags.max_bytes),
      static_cast<long long>(flags.factor), flags.warmup, flags.iters,
      flags.check ? 1 : 0);
  std::printf(
      "# %10s  %12s  %8s  %6s  %6s           out-of-place                "
      "       in-place          \n",
      "", "", "", "", "");
  std::printf(
      "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n",
      "size", "count", "type", "redop", "root", "time", "algbw", "busbw",
      "#wrong", "time", "algbw", "busbw", "#wrong");
  std::printf(
      "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n",
      "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)",
      "(GB/s)", "(GB/s)", "");
}

// nccl-tests' time column: fewer decimals as the time grows.
std::string TableTime(double us) {
  char text[32];
  std::snprintf(text, sizeof(text),
                us >= 10000.0 ? "%7.0f"
                : us >= 100.0 ? "%7.1f"
                              : "%7.2f",
                us);
  return text;
}

void PrintTableResult(const Result &result) {
  if (!result.measured) {
    std::printf("  %7s  %6s  %6s  %5s", "N/A", "N/A", "N/A", "N/A");
    return;
  }
  std::printf("  %7s  %6.2f  %6.2f  %5lld", TableTime(result.time_us).c_str(),
              result.algbw, result.busbw, static_cast<long long>(result.wrong));
}

void PrintJson(const Communicator &comm, Collective collective, ze::DType dtype,
               int64_t bytes, bool in_place, const Result &result) {
  std::printf(
      "{\"collective\":\"%s\",\"backend\":\"%s\",\"dtype\":\"%s\","
      "\"bytes\":%lld,\"world_size\":%d,\"in_place\":%s,\"time_us\":%.3f,"
      "\"algbw_GBps\":%.3f,\"busbw_GBps\":%.3f,\"wrong\":%lld}\n",
      ze::bench::CollectiveName(collective), comm.backend_name(),
      ze::DTypeName(dtype), static_cast<long long>(bytes), comm.world_size(),
      in_place ? "true" : "false", result.time_us, result.algbw, result.busbw,
      static_cast<long long>(result.wrong));
}

}  // namespace

int main(int argc, char **argv) {
  const Flags flags = ParseFlags(argc, argv);
  std::vector<Collective> collectives;
  for (const std::string &name : std::vector<std::string>(
           absl::StrSplit(flags.collectives, ',', absl::SkipEmpty()))) {
    auto collective = ze::bench::ParseCollective(name);
    if (!collective.ok()) Usage(std::string(collective.status().message()));
    collectives.push_back(*collective);
  }
  auto dtype_or = ze::ParseDType(flags.dtype);
  if (!dtype_or.ok()) Usage(std::string(dtype_or.status().message()));
  const ze::DType dtype = *dtype_or;
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
  const size_t element = ze::SizeOf(dtype);
  ze::Stream stream;
  if (comm.device().is_cuda()) {
    auto created = ze::Stream::Create(comm.device(), /*high_priority=*/true);
    CheckOk(created.status(), comm, "Stream::Create");
    stream = *created;
  }
  const int64_t max_count = flags.max_bytes / static_cast<int64_t>(element);
  auto a = ze::Tensor::Empty({max_count}, dtype, comm.device());
  auto b = ze::Tensor::Empty({max_count}, dtype, comm.device());
  CheckOk(a.status(), comm, "allocating the input buffer");
  CheckOk(b.status(), comm, "allocating the output buffer");
  CheckOk(ze::Fill(*a, 1.0f, stream), comm, "Fill");
  CheckOk(ze::Fill(*b, 0.0f, stream), comm, "Fill");
  CheckOk(stream.Synchronize(), comm, "Synchronize");
  const int n = comm.world_size();
  const bool table = flags.format == "table";
  const bool prints = comm.rank() == 0;
  int64_t results_with_wrong = 0;
  for (const Collective collective : collectives) {
    if (table && prints) PrintTableHeader(comm, collective, flags, dtype);
    double busbw_sum = 0;
    int busbw_count = 0;
    int64_t table_errors = 0;
    for (int64_t bytes = flags.min_bytes; bytes <= flags.max_bytes;
         bytes *= flags.factor) {
      // Round down to whole elements per rank, as nccl-tests does.
      const int64_t count = bytes / static_cast<int64_t>(element) / n * n;
      if (count == 0) continue;
      const CollectiveShape shape = ze::bench::ShapeOf(collective, count, n);
      const int64_t real_bytes = count * static_cast<int64_t>(element);
      Result placements[2];
      for (const bool in_place : {false, true}) {
        if (!in_place && collective == Collective::kBroadcast) continue;
        placements[in_place] = Measure(comm, collective, shape, in_place, flags,
                                       dtype, *a, *b, stream);
        const Result &result = placements[in_place];
        if (result.wrong > 0) ++table_errors;
        busbw_sum += result.busbw;
        ++busbw_count;
        if (!table && prints) {
          PrintJson(comm, collective, dtype, real_bytes, in_place, result);
          std::fflush(stdout);
        }
      }
      if (table && prints) {
        std::printf("%12lld  %12lld  %8s  %6s  %6d",
                    static_cast<long long>(real_bytes),
                    static_cast<long long>(shape.param_count),
                    TableTypeName(dtype), ze::bench::RedopColumn(collective),
                    ze::bench::RootColumn(collective));
        PrintTableResult(placements[0]);
        PrintTableResult(placements[1]);
        std::printf("\n");
        std::fflush(stdout);
      }
    }
    results_with_wrong += table_errors;
    if (table && prints) {
      std::printf("# Out of bounds values : %lld %s\n",
                  static_cast<long long>(table_errors),
                  table_errors == 0 ? "OK" : "FAILED");
      std::printf("# Avg bus bandwidth    : %g \n#\n",
                  busbw_count > 0 ? busbw_sum / busbw_count : 0.0);
      std::fflush(stdout);
    }
  }
  CheckOk(comm.Barrier(), comm, "Barrier");
  if (results_with_wrong > 0) {
    std::fprintf(stderr,
                 "comm_bench: rank %d: %lld result(s) had wrong elements\n",
                 comm.rank(), static_cast<long long>(results_with_wrong));
    return 1;
  }
  return 0;
}
