#include "comm/communicator.h"

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/dtype.h"
#include "core/logging.h"
#include "core/ops.h"
#include "core/status.h"

namespace ze {
namespace comm {
namespace {

bool Overlap(const Tensor &a, const Tensor &b) {
  const auto a_begin = reinterpret_cast<uintptr_t>(a.data());
  const auto b_begin = reinterpret_cast<uintptr_t>(b.data());
  return a_begin < b_begin + b.nbytes() && b_begin < a_begin + a.nbytes();
}

}  // namespace

CollectiveOp CollectiveOp::AllReduce(const Tensor &input, const Tensor &output,
                                     ReduceOp op) {
  CollectiveOp result;
  result.kind = CollectiveKind::kAllReduce;
  result.input = input;
  result.output = output;
  result.reduce_op = op;
  return result;
}

CollectiveOp CollectiveOp::ReduceScatter(const Tensor &input,
                                         const Tensor &output, ReduceOp op) {
  CollectiveOp result = AllReduce(input, output, op);
  result.kind = CollectiveKind::kReduceScatter;
  return result;
}

CollectiveOp CollectiveOp::AllGather(const Tensor &input,
                                     const Tensor &output) {
  CollectiveOp result;
  result.kind = CollectiveKind::kAllGather;
  result.input = input;
  result.output = output;
  return result;
}

CollectiveOp CollectiveOp::Broadcast(const Tensor &tensor, int root) {
  CollectiveOp result;
  result.kind = CollectiveKind::kBroadcast;
  result.input = tensor;
  result.output = tensor;
  result.root = root;
  return result;
}

CollectiveOp CollectiveOp::Send(const Tensor &tensor, int peer) {
  CollectiveOp result = Broadcast(tensor, peer);
  result.kind = CollectiveKind::kSend;
  return result;
}

CollectiveOp CollectiveOp::Recv(const Tensor &tensor, int peer) {
  CollectiveOp result = Broadcast(tensor, peer);
  result.kind = CollectiveKind::kRecv;
  return result;
}

Communicator::Communicator(int rank, int world_size, int local_rank,
                           Device device, double timeout_seconds,
                           int local_size)
    : rank_(rank),
      world_size_(world_size),
      local_rank_(local_rank),
      local_size_(local_size < 1 ? 1 : local_size),
      device_(device),
      timeout_seconds_(timeout_seconds),
      recorder_(std::make_shared<RecentCollectives>(rank)) {}

absl::Status Communicator::Validate(const CollectiveOp &op) const {
  const std::string name = CollectiveKindName(op.kind);
  const std::string where =
      absl::StrCat(name, " on rank ", rank_, " of ", world_size_, " (",
                   backend_name(), " backend)");
  if (!op.input.defined() || !op.output.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": input or output tensor is undefined"));
  }
  if (!IsFloatingPoint(op.input.dtype()) ||
      op.input.dtype() != op.output.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": input and output must share one of f32, bf16, f16; got ",
        op.input.DebugString(), " and ", op.output.DebugString()));
  }
  if (op.input.device() != op.output.device()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": input and output on different devices: ",
                     op.input.DebugString(), " and ", op.output.DebugString()));
  }
  const Device &device = op.input.device();
  if (!AcceptsDevice(device) || (device.is_cuda() && device != device_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": tensor ", op.input.DebugString(),
        " is on a device this communicator does not serve (its device is ",
        device_.ToString(), ")"));
  }
  const int64_t in = op.input.numel();
  const int64_t out = op.output.numel();
  const bool same = op.input.data() == op.output.data();
  switch (op.kind) {
    case CollectiveKind::kAllReduce:
      if (in != out) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": input has ", in, " elements but output has ", out));
      }
      if (!same && Overlap(op.input, op.output)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": input and output partially overlap"));
      }
      break;
    case CollectiveKind::kReduceScatter: {
      if (in != out * world_size_) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": input must have world_size * output elements (",
            world_size_, " * ", out, "), got ", in,
            "; pad to equal slices (comm/equal_slices.h)"));
      }
      const bool in_place =
          static_cast<char *>(op.output.data()) ==
          static_cast<char *>(op.input.data()) + rank_ * op.output.nbytes();
      if (!in_place && Overlap(op.input, op.output)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": output overlaps input but is not this rank's slice"));
      }
      break;
    }
    case CollectiveKind::kAllGather: {
      if (out != in * world_size_) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": output must have world_size * input elements (",
            world_size_, " * ", in, "), got ", out));
      }
      const bool in_place =
          static_cast<char *>(op.input.data()) ==
          static_cast<char *>(op.output.data()) + rank_ * op.input.nbytes();
      if (!in_place && Overlap(op.input, op.output)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": input overlaps output but is not this rank's slice"));
      }
      break;
    }
    case CollectiveKind::kBroadcast:
      if (!same) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": broadcast is in place (input == output)"));
      }
      if (op.root < 0 || op.root >= world_size_) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": root ", op.root, " is outside [0, ", world_size_, ")"));
      }
      break;
    case CollectiveKind::kBarrier:
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": use Communicator::Barrier()"));
    case CollectiveKind::kSend:
    case CollectiveKind::kRecv:
      if (!supports_point_to_point()) {
        return absl::UnimplementedError(absl::StrCat(
            where, ": the ", backend_name(),
            " backend has no point-to-point operations (use mpi or nccl)"));
      }
      if (!same) {
        return absl::InvalidArgumentError(
            absl::StrCat(where,
                         ": point-to-point is in place (input == "
                         "output)"));
      }
      if (op.root < 0 || op.root >= world_size_ || op.root == rank_) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": peer ", op.root,
                         " is not another rank of [0, ", world_size_, ")"));
      }
      break;
  }
  return absl::OkStatus();
}

absl::StatusOr<Work> Communicator::AllReduce(const Tensor &input,
                                             const Tensor &output, ReduceOp op,
                                             const Stream &stream) {
  return Coalesced({CollectiveOp::AllReduce(input, output, op)}, stream);
}

absl::StatusOr<Work> Communicator::ReduceScatter(const Tensor &input,
                                                 const Tensor &output,
                                                 ReduceOp op,
                                                 const Stream &stream) {
  return Coalesced({CollectiveOp::ReduceScatter(input, output, op)}, stream);
}

absl::StatusOr<Work> Communicator::AllGather(const Tensor &input,
                                             const Tensor &output,
                                             const Stream &stream) {
  return Coalesced({CollectiveOp::AllGather(input, output)}, stream);
}

absl::StatusOr<Work> Communicator::Broadcast(const Tensor &tensor, int root,
                                             const Stream &stream) {
  return Coalesced({CollectiveOp::Broadcast(tensor, root)}, stream);
}

absl::StatusOr<Work> Communicator::Send(const Tensor &tensor, int peer,
                                        const Stream &stream) {
  return Coalesced({CollectiveOp::Send(tensor, peer)}, stream);
}

absl::StatusOr<Work> Communicator::Recv(const Tensor &tensor, int peer,
                                        const Stream &stream) {
  return Coalesced({CollectiveOp::Recv(tensor, peer)}, stream);
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Split(int color,
                                                                  int key) {
  if (!broken_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "communicator on rank ", rank_,
        " is unusable after an earlier error: ", broken_.message()));
  }
  // Every rank's (color, key), each int as two 16-bit halves of its bits
  // (exact in f32: the communicator moves floating-point tensors). Agreed
  // before the backend splits, so one rank's bad color fails every rank
  // here, and a rank that never calls Split makes this all-gather time out
  // rather than leave the others blocked in a backend split without one.
  const int n = world_size_;
  auto halves = [](int value, float *out) {
    const uint32_t bits = static_cast<uint32_t>(value);
    out[0] = static_cast<float>(bits >> 16);
    out[1] = static_cast<float>(bits & 0xFFFF);
  };
  auto whole = [](const float *in) {
    return static_cast<int>((static_cast<uint32_t>(in[0]) << 16) |
                            static_cast<uint32_t>(in[1]));
  };
  std::vector<float> mine(4);
  halves(color, &mine[0]);
  halves(key, &mine[2]);
  const Device on = accepts_host_tensors() ? Device::Cpu() : device_;
  const Stream stream = on.is_cuda() ? Stream::Default(on) : Stream();
  ZE_ASSIGN_OR_RETURN(const Tensor in,
                      FromHostFloats(mine, {4}, DType::kF32, on, stream));
  ZE_ASSIGN_OR_RETURN(const Tensor out,
                      Tensor::Empty({4 * int64_t{n}}, DType::kF32, on));
  ZE_ASSIGN_OR_RETURN(Work work, AllGather(in, out, stream));
  ZE_RETURN_IF_ERROR(work.Wait());
  ZE_ASSIGN_OR_RETURN(const std::vector<float> all, ToHostFloats(out, stream));
  std::vector<int> colors(n), keys(n);
  std::string negative;
  for (int r = 0; r < n; ++r) {
    colors[r] = whole(&all[4 * r]);
    keys[r] = whole(&all[4 * r + 2]);
    if (colors[r] < 0) {
      absl::StrAppend(&negative, negative.empty() ? "" : ", ", "rank ", r,
                      " passed ", colors[r]);
    }
  }
  if (!negative.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Split on rank ", rank_, ": color must be >= 0 (", negative, ")"));
  }
  // This rank's place: ranked by key, ties by rank here (MPI_Comm_split's
  // rule, which every backend's split must reproduce).
  int new_rank = 0, new_size = 0;
  for (int r = 0; r < n; ++r) {
    if (colors[r] != color) continue;
    ++new_size;
    if (keys[r] < key || (keys[r] == key && r < rank_)) ++new_rank;
  }
  return SplitImpl(color, key, new_rank, new_size);
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::SplitImpl(int, int,
                                                                      int,
                                                                      int) {
  return absl::UnimplementedError(
      absl::StrCat("Split on rank ", rank_, ": the ", backend_name(),
                   " backend cannot make sub-communicators (use mpi or nccl)"));
}

absl::StatusOr<Work> Communicator::Coalesced(
    const std::vector<CollectiveOp> &ops, const Stream &stream) {
  if (!broken_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "communicator on rank ", rank_,
        " is unusable after an earlier error: ", broken_.message()));
  }
  if (ops.empty()) return Work();
  for (const CollectiveOp &op : ops) {
    ZE_RETURN_IF_ERROR(Validate(op));
    if (op.input.device() != ops.front().input.device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "coalesced group on rank ", rank_, " mixes devices: ",
          ops.front().input.DebugString(), " and ", op.input.DebugString()));
    }
  }
  if (ops.front().input.device() != stream.device()) {
    return absl::InvalidArgumentError(
        absl::StrCat(CollectiveKindName(ops.front().kind), " on rank ", rank_,
                     ": tensors on ", ops.front().input.device().ToString(),
                     " but the stream is on ", stream.device().ToString()));
  }
  std::vector<uint64_t> sequence_numbers;
  sequence_numbers.reserve(ops.size());
  for (const CollectiveOp &op : ops) {
    CollectiveRecord record;
    record.kind = op.kind;
    record.reduce_op = op.reduce_op;
    record.root = op.kind == CollectiveKind::kBroadcast ||
                          op.kind == CollectiveKind::kSend ||
                          op.kind == CollectiveKind::kRecv
                      ? op.root
                      : -1;
    record.count = op.input.numel();
    record.dtype = op.input.dtype();
    sequence_numbers.push_back(recorder_->Issue(record));
  }
  const bool host_timed = timing_ && times_on_host();
  const auto issued = std::chrono::steady_clock::now();
  absl::StatusOr<Work> work = Issue(ops, sequence_numbers, stream);
  if (host_timed) {
    AddCommunicationMilliseconds(std::chrono::duration<double, std::milli>(
                                     std::chrono::steady_clock::now() - issued)
                                     .count());
  }
  if (!work.ok()) {
    for (uint64_t sequence : sequence_numbers) recorder_->MarkFailed(sequence);
  }
  return work;
}

double Communicator::TakeCommunicationMilliseconds() {
  CollectTimings();
  const double ms = communication_ms_;
  communication_ms_ = 0;
  return ms;
}

absl::Status Communicator::Barrier() {
  if (!broken_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "communicator on rank ", rank_,
        " is unusable after an earlier error: ", broken_.message()));
  }
  CollectiveRecord record;
  record.kind = CollectiveKind::kBarrier;
  const uint64_t sequence = recorder_->Issue(record);
  absl::Status status = BarrierImpl(sequence);
  if (status.ok()) {
    recorder_->MarkCompleted(sequence);
  } else {
    recorder_->MarkFailed(sequence);
  }
  return status;
}

absl::Status Communicator::TimeoutError(uint64_t first_sequence,
                                        uint64_t last_sequence,
                                        double waited_seconds) const {
  std::string ops;
  for (uint64_t sequence = first_sequence; sequence <= last_sequence;
       ++sequence) {
    const CollectiveRecord record = recorder_->Find(sequence);
    if (!ops.empty()) ops += ", ";
    if (record.sequence_number == 0) {
      absl::StrAppend(&ops, "#", sequence);
    } else {
      ops += record.Describe();
    }
  }
  const std::string message = absl::StrFormat(
      "rank %d of %d: collective %s (%s backend) did not complete within "
      "%.3g s (timeout; set by CommOptions::timeout_seconds or "
      "ZE_COMM_TIMEOUT_SECONDS); another rank probably skipped or reordered "
      "a collective, or died",
      rank_, world_size_, ops, backend_name(), waited_seconds);
  ZE_LOG(ERROR) << message << "\nrecent collectives on rank " << rank_ << ":\n"
                << recorder_->Dump();
  return absl::DeadlineExceededError(message);
}

}  // namespace comm
}  // namespace ze
