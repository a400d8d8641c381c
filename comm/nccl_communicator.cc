// The NCCL backend: device memory, one GPU per rank.
//
// Collectives are queued on the caller's stream (several at once inside an
// NCCL group), followed by an event. A collective issued on another stream
// than the one before it (stage 3 gathers on its communication stream while
// the boundary step all-reduces on the compute stream) first makes its stream
// wait for that event: NCCL does not promise that two operations of one
// communicator on different streams can progress at the same time, so the
// device must run them in issue order, which every rank shares, or ranks
// could each block in a different one. Waiting polls the event and NCCL's
// asynchronous error; on an error or past the timeout the communicator is
// aborted (ncclCommAbort), which also releases kernels stuck waiting for a
// peer, and becomes unusable.
//
// Point-to-point (a group of only sends and receives) runs on a stream of
// the communicator's own instead of the caller's: the p2p stream first
// waits for an event recorded on the caller's stream (the input is read,
// and the output written, after the caller's earlier work), then the
// sends and receives are queued in one NCCL group, followed by the group's
// event. The caller's stream waits only when asked (Work::StreamWait), so a
// compute stream never waits for a send it does not read, nor for a
// receive before it needs its tensor. ncclSend and ncclRecv block their
// stream until the peer's matching call runs, and NCCL does not promise
// that two of a communicator's operations progress at once, so the groups
// run in issue order on that one stream (and are ordered with the
// collectives as above): a rank must post the sends and receives that its
// peers post together in one group (sends_wait_for_receiver()).
//
// Split is ncclCommSplit (NCCL 2.18+) on the parent, after the generic
// Split's all-gather of every rank's (color, key): the key passed to NCCL
// is the rank the child must give this rank (ranked by key, ties by parent
// rank, as MPI_Comm_split), so the child's ranks do not depend on how NCCL
// breaks ties, and they are checked against NCCL's answer.
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <deque>
#include <thread>

#include "absl/strings/str_cat.h"
#include "comm/backends.h"
#include "comm/mpi_runtime.h"
#include "core/logging.h"
#include "core/status.h"

namespace ze {
namespace comm {
namespace {

using Clock = std::chrono::steady_clock;

// The one place NCCL result codes become Statuses.
absl::Status NcclStatus(ncclResult_t result, const std::string &what,
                        ncclComm_t comm = nullptr) {
  if (result == ncclSuccess) return absl::OkStatus();
  std::string message =
      absl::StrCat(what, " failed: ", ncclGetErrorString(result));
  const char *detail = ncclGetLastError(comm);
  if (detail != nullptr && *detail != '\0') {
    absl::StrAppend(&message, " (", detail, ")");
  }
  switch (result) {
    case ncclInvalidArgument:
      return absl::InvalidArgumentError(message);
    case ncclInvalidUsage:
      return absl::FailedPreconditionError(message);
    case ncclRemoteError:
      return absl::UnavailableError(message);
    case ncclInProgress:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

ncclDataType_t ToNcclType(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclHalf;
    default:
      return ncclFloat32;
  }
}

ncclRedOp_t ToNcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kAverage:
      return ncclAvg;
    case ReduceOp::kSum:
      return ncclSum;
  }
  return ncclSum;
}

// The group's operations for messages: each collective's name, and each
// send's and receive's peer, which is what a hung or failed exchange needs.
std::string DescribeOps(const std::vector<CollectiveOp> &ops,
                        const std::vector<uint64_t> &sequence_numbers, int rank,
                        int world_size) {
  std::string text = "NCCL ";
  for (size_t i = 0; i < ops.size(); ++i) {
    const CollectiveOp &op = ops[i];
    if (i > 0) text += "+";
    text += CollectiveKindName(op.kind);
    if (op.kind == CollectiveKind::kSend) {
      absl::StrAppend(&text, "(to ", op.root, ")");
    } else if (op.kind == CollectiveKind::kRecv) {
      absl::StrAppend(&text, "(from ", op.root, ")");
    }
  }
  absl::StrAppend(&text, " #", sequence_numbers.front());
  if (sequence_numbers.size() > 1) {
    absl::StrAppend(&text, "-", sequence_numbers.back());
  }
  absl::StrAppend(&text, " on rank ", rank, " of ", world_size);
  return text;
}

bool IsPointToPoint(const CollectiveOp &op) {
  return op.kind == CollectiveKind::kSend || op.kind == CollectiveKind::kRecv;
}

struct NcclGroup {
  std::vector<CollectiveOp> ops;  // keeps the tensors alive while queued
  uint64_t first_sequence = 0;
  uint64_t last_sequence = 0;
  // "NCCL send(to 1)+recv(from 1) #7-8 on rank 0 of 2": errors name it.
  std::string what;
  void *stream = nullptr;  // the cudaStream_t it was queued on
  Event start;             // with timing: recorded just before the group
  Event done;
  bool completed = false;
  absl::Status status;
};

class NcclCommunicator;

class NcclWork : public Work::Impl {
 public:
  NcclWork(NcclCommunicator *comm, std::shared_ptr<NcclGroup> group)
      : comm_(comm), group_(std::move(group)) {}
  absl::Status Wait() override;
  absl::Status StreamWait(const Stream &stream) override;
  absl::StatusOr<bool> Poll() override;
  uint64_t first_sequence_number() const override {
    return group_->first_sequence;
  }

 private:
  NcclCommunicator *comm_;
  std::shared_ptr<NcclGroup> group_;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(const LaunchInfo &info, const Device &device,
                   double timeout_seconds, ncclComm_t comm)
      : Communicator(info.rank, info.world_size, info.local_rank, device,
                     timeout_seconds, info.local_size),
        comm_(comm) {}

  ~NcclCommunicator() override {
    if (aborted_) {
      // The device may still reference the tensors of aborted work; keep them.
      new std::deque<std::shared_ptr<NcclGroup>>(std::move(in_flight_));
      return;
    }
    SetCurrentDevice(device()).IgnoreError();
    // Flushes queued operations, then frees the communicator's resources.
    absl::Status status =
        NcclStatus(ncclCommFinalize(comm_), "ncclCommFinalize", comm_);
    if (status.ok()) {
      for (const auto &group : in_flight_)
        group->done.Synchronize().IgnoreError();
      status = NcclStatus(ncclCommDestroy(comm_), "ncclCommDestroy");
    }
    if (!status.ok()) {
      ZE_LOG(ERROR) << "destroying NCCL communicator: " << status.message();
    }
  }

  const char *backend_name() const override { return "nccl"; }
  bool supports_point_to_point() const override { return true; }
  bool sends_wait_for_receiver() const override { return true; }

 protected:
  // Timed on the device, by events around each group.
  bool times_on_host() const override { return false; }
  void CollectTimings() override { Prune(); }

 public:
  // Polls `group` once: its event, then NCCL's asynchronous error.
  absl::StatusOr<bool> PollGroup(NcclGroup *group) {
    if (!group->status.ok()) return group->status;
    if (group->completed) return true;
    if (group->done.Query()) {
      MarkCompleted(group);
      return true;
    }
    ncclResult_t async_error = ncclSuccess;
    absl::Status status = NcclStatus(ncclCommGetAsyncError(comm_, &async_error),
                                     "ncclCommGetAsyncError", comm_);
    if (status.ok() && async_error != ncclSuccess &&
        async_error != ncclInProgress) {
      status = NcclStatus(async_error, group->what, comm_);
    }
    if (!status.ok()) return Abort(group, status);
    return false;
  }

  absl::Status WaitGroup(NcclGroup *group) {
    const Clock::time_point started = Clock::now();
    const Clock::time_point deadline =
        started + std::chrono::duration_cast<Clock::duration>(
                      std::chrono::duration<double>(timeout_seconds()));
    const Clock::time_point spin_until =
        started + std::chrono::microseconds(200);
    while (true) {
      ZE_ASSIGN_OR_RETURN(bool done, PollGroup(group));
      if (done) return absl::OkStatus();
      const Clock::time_point now = Clock::now();
      if (now >= deadline) {
        return Abort(
            group,
            TimeoutError(group->first_sequence, group->last_sequence,
                         std::chrono::duration<double>(now - started).count()));
      }
      if (now > spin_until) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

 protected:
  bool AcceptsDevice(const Device &device) const override {
    return device.is_cuda() && device == this->device();
  }

  absl::StatusOr<Work> Issue(const std::vector<CollectiveOp> &ops,
                             const std::vector<uint64_t> &sequence_numbers,
                             const Stream &stream) override {
    const bool point_to_point = IsPointToPoint(ops.front());
    for (const CollectiveOp &op : ops) {
      if (IsPointToPoint(op) != point_to_point) {
        // They run on different streams (top of the file); nothing issued.
        return absl::InvalidArgumentError(absl::StrCat(
            DescribeOps(ops, sequence_numbers, rank(), world_size()),
            ": a group mixes point-to-point operations with collectives; "
            "issue them as separate groups"));
      }
    }
    Prune();
    ZE_RETURN_IF_ERROR(SetCurrentDevice(device()));
    auto group = std::make_shared<NcclGroup>();
    group->ops = ops;
    group->first_sequence = sequence_numbers.front();
    group->last_sequence = sequence_numbers.back();
    group->what = DescribeOps(ops, sequence_numbers, rank(), world_size());
    const std::string &what = group->what;
    ZE_ASSIGN_OR_RETURN(group->done, Event::Create(device(), timing()));
    // Where the group runs: the caller's stream, or for point-to-point the
    // communicator's own, after the caller's work so far.
    Stream run_on = stream;
    if (point_to_point) {
      if (p2p_stream_.native() == nullptr) {
        ZE_ASSIGN_OR_RETURN(p2p_stream_,
                            Stream::Create(device(), /*high_priority=*/true));
      }
      ZE_ASSIGN_OR_RETURN(Event queued, Event::Create(device()));
      ZE_RETURN_IF_ERROR(queued.Record(stream));
      ZE_RETURN_IF_ERROR(queued.StreamWait(p2p_stream_));
      run_on = p2p_stream_;
    }
    auto cuda_stream = static_cast<cudaStream_t>(run_on.native());
    group->stream = run_on.native();
    // Issue order on the device (see the top of the file). Only the newest
    // unfinished group matters: it was itself ordered after the ones before.
    if (!in_flight_.empty() && in_flight_.back()->stream != group->stream) {
      ZE_RETURN_IF_ERROR(in_flight_.back()->done.StreamWait(run_on));
    }
    if (timing()) {
      ZE_ASSIGN_OR_RETURN(group->start, Event::Create(device(), true));
      ZE_RETURN_IF_ERROR(group->start.Record(run_on));
    }
    // The operations read and write the callers' tensors on `run_on`,
    // usually not the stream they were allocated on: recorded, the memory
    // is not handed out again before they are done, however soon the
    // caller frees it.
    for (const CollectiveOp &op : ops) {
      ZE_RETURN_IF_ERROR(op.input.RecordStream(run_on));
      ZE_RETURN_IF_ERROR(op.output.RecordStream(run_on));
    }
    ZE_RETURN_IF_ERROR(NcclStatus(ncclGroupStart(), what, comm_));
    absl::Status status;
    for (const CollectiveOp &op : ops) {
      const ncclDataType_t type = ToNcclType(op.input.dtype());
      ncclResult_t result = ncclSuccess;
      std::string call;
      switch (op.kind) {
        case CollectiveKind::kAllReduce:
          result =
              ncclAllReduce(op.input.data(), op.output.data(), op.input.numel(),
                            type, ToNcclOp(op.reduce_op), comm_, cuda_stream);
          break;
        case CollectiveKind::kReduceScatter:
          result = ncclReduceScatter(
              op.input.data(), op.output.data(), op.output.numel(), type,
              ToNcclOp(op.reduce_op), comm_, cuda_stream);
          break;
        case CollectiveKind::kAllGather:
          result = ncclAllGather(op.input.data(), op.output.data(),
                                 op.input.numel(), type, comm_, cuda_stream);
          break;
        case CollectiveKind::kBroadcast:
          result =
              ncclBroadcast(op.input.data(), op.output.data(), op.input.numel(),
                            type, op.root, comm_, cuda_stream);
          break;
        // Within the group every send and receive progresses on its own
        // (NCCL's group semantics), so a rank may send to and receive from
        // the same peer here; between two ranks they match in issue order.
        case CollectiveKind::kSend:
          result = ncclSend(op.input.data(), op.input.numel(), type, op.root,
                            comm_, cuda_stream);
          call = absl::StrCat(" (ncclSend of ", op.input.numel(), " ",
                              DTypeName(op.input.dtype()), " to rank ", op.root,
                              ")");
          break;
        case CollectiveKind::kRecv:
          result = ncclRecv(op.output.data(), op.output.numel(), type, op.root,
                            comm_, cuda_stream);
          call = absl::StrCat(" (ncclRecv of ", op.output.numel(), " ",
                              DTypeName(op.output.dtype()), " from rank ",
                              op.root, ")");
          break;
        case CollectiveKind::kBarrier:  // refused by Validate
          break;
      }
      status = NcclStatus(result, absl::StrCat(what, call), comm_);
      if (!status.ok()) break;
    }
    const absl::Status end = NcclStatus(ncclGroupEnd(), what, comm_);
    if (status.ok()) status = end;
    if (status.ok()) status = group->done.Record(run_on);
    if (!status.ok()) {
      // Some ranks may have queued their part: the communicator cannot be
      // trusted any more.
      return Abort(group.get(), status);
    }
    in_flight_.push_back(group);
    return Work(std::make_shared<NcclWork>(this, group));
  }

  absl::StatusOr<std::unique_ptr<Communicator>> SplitImpl(
      int color, int key, int new_rank, int new_size) override {
    const std::string what =
        absl::StrCat("ncclCommSplit(color ", color, ", key ", key, ") on rank ",
                     rank(), " of ", world_size());
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
    ZE_RETURN_IF_ERROR(SetCurrentDevice(device()));
    ncclComm_t child = nullptr;
    // new_rank as NCCL's key: the child ranks as Split promises whatever
    // NCCL's tie-breaking; null config: the parent's settings.
    ZE_RETURN_IF_ERROR(NcclStatus(
        ncclCommSplit(comm_, color, new_rank, &child, nullptr), what, comm_));
    if (child == nullptr) {
      return absl::InternalError(
          absl::StrCat(what, " returned no communicator for color ", color));
    }
    int child_rank = -1, child_size = 0;
    absl::Status status =
        NcclStatus(ncclCommUserRank(child, &child_rank), what, child);
    if (status.ok()) {
      status = NcclStatus(ncclCommCount(child, &child_size), what, child);
    }
    if (status.ok() && (child_rank != new_rank || child_size != new_size)) {
      status = absl::InternalError(
          absl::StrCat(what, " gave rank ", child_rank, " of ", child_size,
                       ", expected ", new_rank, " of ", new_size));
    }
    if (!status.ok()) {
      ncclCommDestroy(child);
      return status;
    }
    LaunchInfo info;
    info.rank = new_rank;
    info.world_size = new_size;
    info.local_rank = local_rank();
    info.local_size = local_size();
    info.launched = true;
    return std::unique_ptr<Communicator>(
        new NcclCommunicator(info, device(), timeout_seconds(), child));
#else
    return absl::UnimplementedError(
        absl::StrCat(what, ": this NCCL (", NCCL_MAJOR, ".", NCCL_MINOR,
                     ") has no ncclCommSplit; it needs 2.18 or later"));
#endif
  }

  absl::Status BarrierImpl(uint64_t sequence_number) override {
    // NCCL has no barrier: an all-reduce of one element, waited on, is one.
    ZE_RETURN_IF_ERROR(SetCurrentDevice(device()));
    if (!barrier_scratch_.defined()) {
      ZE_ASSIGN_OR_RETURN(barrier_stream_, Stream::Create(device()));
      // Zeroed on the stream the all-reduces use: ordered, no host wait.
      ZE_ASSIGN_OR_RETURN(
          barrier_scratch_,
          Tensor::Zeros({1}, DType::kF32, device(), barrier_stream_));
    }
    for (const auto &group :
         std::deque<std::shared_ptr<NcclGroup>>(in_flight_)) {
      ZE_RETURN_IF_ERROR(WaitGroup(group.get()));
    }
    auto group = std::make_shared<NcclGroup>();
    group->first_sequence = group->last_sequence = sequence_number;
    ZE_ASSIGN_OR_RETURN(group->done, Event::Create(device()));
    const std::string what =
        absl::StrCat("NCCL barrier #", sequence_number, " on rank ", rank());
    group->what = what;
    absl::Status status = NcclStatus(
        ncclAllReduce(barrier_scratch_.data(), barrier_scratch_.data(), 1,
                      ncclFloat32, ncclSum, comm_,
                      static_cast<cudaStream_t>(barrier_stream_.native())),
        what, comm_);
    if (status.ok()) status = group->done.Record(barrier_stream_);
    if (!status.ok()) return Abort(group.get(), status);
    return WaitGroup(group.get());
  }

 private:
  absl::Status Abort(NcclGroup *group, absl::Status status) {
    group->status = status;
    for (uint64_t s = group->first_sequence; s <= group->last_sequence; ++s) {
      recorder()->MarkFailed(s);
    }
    if (!aborted_) {
      aborted_ = true;
      broken_ = status;
      const absl::Status abort =
          NcclStatus(ncclCommAbort(comm_), "ncclCommAbort");
      if (!abort.ok()) ZE_LOG(ERROR) << abort.message();
    }
    return status;
  }

  // A group's end event has been reached: its collectives are complete,
  // and with timing its device time counts.
  void MarkCompleted(NcclGroup *group) {
    group->completed = true;
    for (uint64_t s = group->first_sequence; s <= group->last_sequence; ++s) {
      recorder()->MarkCompleted(s);
    }
    // Zero for a group issued without timing (no start event).
    absl::StatusOr<float> ms = Event::ElapsedMs(group->start, group->done);
    if (ms.ok()) AddCommunicationMilliseconds(*ms);
  }

  void Prune() {
    while (!in_flight_.empty()) {
      NcclGroup *group = in_flight_.front().get();
      if (!group->completed && !group->done.Query()) break;
      if (!group->completed) MarkCompleted(group);
      in_flight_.pop_front();
    }
  }

  ncclComm_t comm_;
  bool aborted_ = false;
  std::deque<std::shared_ptr<NcclGroup>> in_flight_;
  Tensor barrier_scratch_;
  Stream barrier_stream_;
  // Point-to-point groups run here (created at the first one).
  Stream p2p_stream_;
};

absl::Status NcclWork::Wait() {
  ZE_RETURN_IF_ERROR(comm_->WaitGroup(group_.get()));
  // Work after Wait on the host may read the output: the event covers it.
  return absl::OkStatus();
}

absl::Status NcclWork::StreamWait(const Stream &stream) {
  ZE_ASSIGN_OR_RETURN(bool done, comm_->PollGroup(group_.get()));
  if (done) return absl::OkStatus();
  return group_->done.StreamWait(stream);
}

absl::StatusOr<bool> NcclWork::Poll() { return comm_->PollGroup(group_.get()); }

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    const LaunchInfo &info, const Device &device, double timeout_seconds) {
  if (!device.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the nccl backend needs a cuda device, got ", device.ToString()));
  }
  ZE_RETURN_IF_ERROR(SetCurrentDevice(device));
  ncclUniqueId id;
  if (info.rank == 0) {
    ZE_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
  }
  if (info.world_size > 1) {
    ZE_RETURN_IF_ERROR(EnsureMpiInitialized());
    std::lock_guard<std::mutex> lock(MpiMutex());
    ZE_RETURN_IF_ERROR(
        MpiStatus(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD),
                  "MPI_Bcast of the NCCL unique id"));
  }
  ncclComm_t comm = nullptr;
  ZE_RETURN_IF_ERROR(
      NcclStatus(ncclCommInitRank(&comm, info.world_size, id, info.rank),
                 absl::StrCat("ncclCommInitRank(rank ", info.rank, " of ",
                              info.world_size, ", ", device.ToString(), ")")));
  return std::unique_ptr<Communicator>(
      new NcclCommunicator(info, device, timeout_seconds, comm));
}

}  // namespace comm
}  // namespace ze
