// The MPI backend.
//
// Collectives are started with non-blocking MPI calls (MPI_Iallreduce, ...)
// when issued, in issue order (MPI requires every rank to start them in the
// same order), and progressed by MPI_Test calls from Work::Wait / Poll.
// bf16 and f16 are widened to f32 for reductions (MPI has no such types) and
// rounded once at the end. Device tensors are staged: the input is copied to
// pinned host memory on the caller's stream (the host waits for that copy
// before starting MPI), and the result is copied back on the same stream when
// the Work is waited on. Point-to-point groups (Send/Recv) complete on their
// own: waiting on one does not complete earlier ones, which lets a pipeline
// keep sends in flight while it waits for a receive.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <deque>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/backends.h"
#include "comm/mpi_runtime.h"
#include "core/allocator.h"
#include "core/logging.h"
#include "core/ops.h"
#include "core/status.h"

namespace ze {
namespace comm {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kPointToPointTag = 7;

// Reuses pinned staging blocks: cudaMallocHost is slow and would otherwise
// run for every collective on device tensors.
class PinnedPool {
 public:
  struct Block {
    void *data = nullptr;
    size_t bytes = 0;
  };

  ~PinnedPool() {
    for (auto &entry : free_) {
      PinnedHostMemory()->Deallocate(entry.second, entry.first);
    }
  }

  absl::StatusOr<Block> Acquire(size_t bytes) {
    const size_t rounded = std::max<size_t>(4096, (bytes + 4095) / 4096 * 4096);
    auto it = free_.find(rounded);
    if (it != free_.end()) {
      Block block{it->second, rounded};
      free_.erase(it);
      return block;
    }
    ZE_ASSIGN_OR_RETURN(void *data, PinnedHostMemory()->Allocate(rounded));
    return Block{data, rounded};
  }

  void Release(const Block &block) { free_.emplace(block.bytes, block.data); }

 private:
  std::multimap<size_t, void *> free_;  // rounded bytes -> block
};

MPI_Op ToMpiOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return MPI_SUM;
  }
  return MPI_SUM;
}

// The MPI type moving `dtype`'s bits unchanged (for gathers and broadcasts).
MPI_Datatype RawType(DType dtype) {
  return SizeOf(dtype) == 4 ? MPI_FLOAT : MPI_UINT16_T;
}

void WidenToF32(const Tensor &source, std::vector<float> *out) {
  out->resize(source.numel());
  ConvertElements(source.data(), source.dtype(), out->data(), DType::kF32,
                  source.numel());
}

// A Tensor view of `bytes` at `data`, on the host.
Tensor HostView(void *data, int64_t count, DType dtype) {
  return Tensor::Wrap(data, {count}, dtype, Device::Cpu());
}

// One collective in flight.
struct PendingOp {
  CollectiveOp op;  // the caller's tensors (kept alive while in flight)
  uint64_t sequence_number = 0;
  Tensor host_input;   // what MPI reads: the caller's or pinned staging
  Tensor host_output;  // what MPI writes (or f32 results are rounded into)
  std::vector<float> send_f32;
  std::vector<float> recv_f32;
  bool reduced_in_f32_buffer = false;  // results are in recv_f32
  MPI_Request request = MPI_REQUEST_NULL;
};

// One Issue call: one or more collectives on one stream.
struct Group {
  std::vector<PendingOp> ops;
  Stream stream;
  bool on_device = false;
  Event copied_back;  // recorded after the copies back to the device
  std::vector<PinnedPool::Block> blocks;
  bool mpi_done = false;
  bool finished = false;        // results written (and copies back queued)
  bool point_to_point = false;  // every op a send or a receive
  absl::Status status;
  uint64_t first_sequence() const { return ops.front().sequence_number; }
  uint64_t last_sequence() const { return ops.back().sequence_number; }
};

class MpiCommunicator;

class MpiWork : public Work::Impl {
 public:
  MpiWork(MpiCommunicator *comm, std::shared_ptr<Group> group)
      : comm_(comm), group_(std::move(group)) {}
  absl::Status Wait() override;
  absl::Status StreamWait(const Stream &stream) override;
  absl::StatusOr<bool> Poll() override;
  uint64_t first_sequence_number() const override {
    return group_->first_sequence();
  }

 private:
  MpiCommunicator *comm_;
  std::shared_ptr<Group> group_;
};

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(const LaunchInfo &info, const Device &device,
                  double timeout_seconds, MPI_Comm comm)
      : Communicator(info.rank, info.world_size, info.local_rank, device,
                     timeout_seconds, info.local_size),
        comm_(comm) {}

  ~MpiCommunicator() override {
    if (broken_.ok()) {
      // Finish what is in flight so MPI never writes into freed memory.
      for (const auto &group : std::vector<std::shared_ptr<Group>>(
               in_flight_.begin(), in_flight_.end())) {
        absl::Status status = WaitGroup(group, /*host_sync=*/true);
        if (!status.ok()) {
          ZE_LOG(ERROR) << "destroying communicator: " << status.message();
        }
      }
    }
    if (broken_.ok()) {
      std::lock_guard<std::mutex> lock(MpiMutex());
      MPI_Comm_free(&comm_);
    }
    // A broken communicator may still have MPI writing into its buffers: leak
    // them rather than free memory MPI owns.
    if (!broken_.ok()) {
      new std::deque<std::shared_ptr<Group>>(std::move(in_flight_));
    }
  }

  const char *backend_name() const override { return "mpi"; }
  bool supports_point_to_point() const override { return true; }

  absl::Status WaitGroup(const std::shared_ptr<Group> &target, bool host_sync);
  absl::StatusOr<bool> PollGroup(const std::shared_ptr<Group> &target);

 protected:
  bool AcceptsDevice(const Device &device) const override {
    return device.is_cpu() || device == this->device();
  }

  absl::StatusOr<Work> Issue(const std::vector<CollectiveOp> &ops,
                             const std::vector<uint64_t> &sequence_numbers,
                             const Stream &stream) override;
  absl::Status BarrierImpl(uint64_t sequence_number) override;
  absl::StatusOr<std::unique_ptr<Communicator>> SplitImpl(
      int color, int key, int new_rank, int new_size) override;

 private:
  absl::Status Stage(Group *group);
  absl::Status Start(PendingOp *pending);
  absl::Status Finish(Group *group);
  // Tests the group's requests once; sets mpi_done when all completed.
  absl::Status Test(Group *group);
  // Drives `group` to completion (MPI done and results written) by `deadline`.
  absl::Status Complete(Group *group, Clock::time_point deadline,
                        Clock::time_point started);
  absl::Status Fail(Group *group, absl::Status status);
  void Prune();

  // The f32 buffers bf16/f16 reductions widen into, kept between
  // collectives: a fresh one a collective cost its size in page faults and
  // zeroing, 5x the reduction itself (a 100 MB bf16 all-reduce: 0.42 s
  // against 0.05 s in f32, bench/comm_bench). At most kSpareF32Buffers
  // are kept (an all-reduce or a reduce-scatter takes two).
  static constexpr size_t kSpareF32Buffers = 2;
  std::vector<float> TakeF32Buffer();
  void ReturnF32Buffer(std::vector<float> buffer);

  MPI_Comm comm_;
  std::deque<std::shared_ptr<Group>> in_flight_;
  PinnedPool pool_;
  std::mutex spare_mutex_;
  std::vector<std::vector<float>> spare_f32_;  // under spare_mutex_
};

std::vector<float> MpiCommunicator::TakeF32Buffer() {
  std::lock_guard<std::mutex> lock(spare_mutex_);
  if (spare_f32_.empty()) return {};
  std::vector<float> buffer = std::move(spare_f32_.back());
  spare_f32_.pop_back();
  return buffer;
}

void MpiCommunicator::ReturnF32Buffer(std::vector<float> buffer) {
  if (buffer.capacity() == 0) return;
  std::lock_guard<std::mutex> lock(spare_mutex_);
  if (spare_f32_.size() < kSpareF32Buffers) {
    spare_f32_.push_back(std::move(buffer));
  }
}

absl::Status MpiWork::Wait() { return comm_->WaitGroup(group_, true); }

absl::Status MpiWork::StreamWait(const Stream &stream) {
  ZE_RETURN_IF_ERROR(comm_->WaitGroup(group_, /*host_sync=*/false));
  if (group_->on_device) return group_->copied_back.StreamWait(stream);
  return absl::OkStatus();
}

absl::StatusOr<bool> MpiWork::Poll() { return comm_->PollGroup(group_); }

// Gives every op host views for MPI: the caller's host tensors, or pinned
// staging filled from the device on the group's stream. Staging keeps the
// caller's aliasing (in place stays in place) by mapping the union of input
// and output onto one block.
absl::Status MpiCommunicator::Stage(Group *group) {
  for (PendingOp &pending : group->ops) {
    const CollectiveOp &op = pending.op;
    if (!group->on_device) {
      pending.host_input = op.input;
      pending.host_output = op.output;
      continue;
    }
    const char *in = static_cast<const char *>(op.input.data());
    const char *out = static_cast<const char *>(op.output.data());
    const bool overlap =
        in < out + op.output.nbytes() && out < in + op.input.nbytes();
    const DType dtype = op.input.dtype();
    if (overlap) {
      const char *begin = std::min(in, out);
      const char *end =
          std::max(in + op.input.nbytes(), out + op.output.nbytes());
      ZE_ASSIGN_OR_RETURN(PinnedPool::Block block,
                          pool_.Acquire(static_cast<size_t>(end - begin)));
      group->blocks.push_back(block);
      char *base = static_cast<char *>(block.data);
      pending.host_input =
          HostView(base + (in - begin), op.input.numel(), dtype);
      pending.host_output =
          HostView(base + (out - begin), op.output.numel(), dtype);
    } else {
      ZE_ASSIGN_OR_RETURN(PinnedPool::Block in_block,
                          pool_.Acquire(op.input.nbytes()));
      group->blocks.push_back(in_block);
      ZE_ASSIGN_OR_RETURN(PinnedPool::Block out_block,
                          pool_.Acquire(op.output.nbytes()));
      group->blocks.push_back(out_block);
      pending.host_input = HostView(in_block.data, op.input.numel(), dtype);
      pending.host_output = HostView(out_block.data, op.output.numel(), dtype);
    }
    const bool needs_input = op.kind == CollectiveKind::kBroadcast
                                 ? op.root == rank()
                                 : op.kind != CollectiveKind::kRecv;
    if (needs_input) {
      ZE_RETURN_IF_ERROR(Copy(op.input, pending.host_input, group->stream));
    }
  }
  // MPI reads the staging buffers from the host: the copies (and everything
  // queued on the stream before them) must have finished.
  return group->stream.Synchronize();
}

absl::Status MpiCommunicator::Start(PendingOp *pending) {
  const CollectiveOp &op = pending->op;
  const Tensor &in = pending->host_input;
  const Tensor &out = pending->host_output;
  const DType dtype = in.dtype();
  const bool f32 = dtype == DType::kF32;
  const std::string what =
      absl::StrCat("MPI collective for ", CollectiveKindName(op.kind), " #",
                   pending->sequence_number, " on rank ", rank());
  int error = MPI_SUCCESS;
  std::lock_guard<std::mutex> lock(MpiMutex());
  switch (op.kind) {
    case CollectiveKind::kAllReduce: {
      const int count = static_cast<int>(in.numel());
      if (f32) {
        const void *send = in.data() == out.data() ? MPI_IN_PLACE : in.data();
        error = MPI_Iallreduce(send, out.data(), count, MPI_FLOAT,
                               ToMpiOp(op.reduce_op), comm_, &pending->request);
      } else {
        // Out of place: Open MPI's in-place all-reduce copies the buffer
        // into a temporary it allocates per call (page faults and zeroing
        // of the whole size, most of a 100 MB bf16 all-reduce's time).
        pending->send_f32 = TakeF32Buffer();
        WidenToF32(in, &pending->send_f32);
        pending->recv_f32 = TakeF32Buffer();
        pending->recv_f32.resize(count);
        pending->reduced_in_f32_buffer = true;
        error = MPI_Iallreduce(pending->send_f32.data(),
                               pending->recv_f32.data(), count, MPI_FLOAT,
                               ToMpiOp(op.reduce_op), comm_, &pending->request);
      }
      break;
    }
    case CollectiveKind::kReduceScatter: {
      const int count = static_cast<int>(out.numel());
      const bool overlap =
          f32 && in.data() <= out.data() &&
          out.data() < static_cast<char *>(in.data()) + in.nbytes();
      const void *send = in.data();
      if (!f32) {
        pending->send_f32 = TakeF32Buffer();
        WidenToF32(in, &pending->send_f32);
        send = pending->send_f32.data();
      }
      void *recv = out.data();
      if (!f32 || overlap) {
        // MPI forbids the receive buffer inside the send buffer, and bf16 /
        // f16 results must be rounded from f32.
        pending->recv_f32 = TakeF32Buffer();
        pending->recv_f32.resize(count);
        pending->reduced_in_f32_buffer = true;
        recv = pending->recv_f32.data();
      }
      error = MPI_Ireduce_scatter_block(send, recv, count, MPI_FLOAT,
                                        ToMpiOp(op.reduce_op), comm_,
                                        &pending->request);
      break;
    }
    case CollectiveKind::kAllGather: {
      const int count = static_cast<int>(in.numel());
      const bool in_place =
          static_cast<char *>(in.data()) ==
          static_cast<char *>(out.data()) + rank() * in.nbytes();
      const void *send = in_place ? MPI_IN_PLACE : in.data();
      error = MPI_Iallgather(send, count, RawType(dtype), out.data(), count,
                             RawType(dtype), comm_, &pending->request);
      break;
    }
    case CollectiveKind::kBroadcast:
      error = MPI_Ibcast(out.data(), static_cast<int>(out.numel()),
                         RawType(dtype), op.root, comm_, &pending->request);
      break;
    case CollectiveKind::kBarrier:
      error = MPI_Ibarrier(comm_, &pending->request);
      break;
    // One tag for every message: MPI keeps messages between two ranks in
    // order per tag, which is the matching order the contract promises.
    case CollectiveKind::kSend:
      error = MPI_Isend(in.data(), static_cast<int>(in.numel()), RawType(dtype),
                        op.root, kPointToPointTag, comm_, &pending->request);
      break;
    case CollectiveKind::kRecv:
      error =
          MPI_Irecv(out.data(), static_cast<int>(out.numel()), RawType(dtype),
                    op.root, kPointToPointTag, comm_, &pending->request);
      break;
  }
  return MpiStatus(error, what);
}

absl::StatusOr<Work> MpiCommunicator::Issue(
    const std::vector<CollectiveOp> &ops,
    const std::vector<uint64_t> &sequence_numbers, const Stream &stream) {
  for (const CollectiveOp &op : ops) {
    if (op.input.numel() > INT_MAX || op.output.numel() > INT_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(
          CollectiveKindName(op.kind), " on rank ", rank(), ": ",
          std::max(op.input.numel(), op.output.numel()),
          " elements exceed the MPI backend's limit of ", INT_MAX));
    }
  }
  if (world_size() == 1) {
    return IssueWithinOneRank(ops, sequence_numbers, stream, recorder());
  }
  Prune();
  auto group = std::make_shared<Group>();
  group->stream = stream;
  group->on_device = stream.device().is_cuda();
  group->point_to_point =
      std::all_of(ops.begin(), ops.end(), [](const CollectiveOp &op) {
        return op.kind == CollectiveKind::kSend ||
               op.kind == CollectiveKind::kRecv;
      });
  for (size_t i = 0; i < ops.size(); ++i) {
    PendingOp pending;
    pending.op = ops[i];
    pending.sequence_number = sequence_numbers[i];
    group->ops.push_back(std::move(pending));
  }
  if (group->on_device) {
    ZE_ASSIGN_OR_RETURN(group->copied_back, Event::Create(stream.device()));
  }
  absl::Status status = Stage(group.get());
  if (!status.ok()) {
    for (const PinnedPool::Block &block : group->blocks) pool_.Release(block);
    return status;
  }
  // Once one op of the group has started, the others must start too, or the
  // ranks' MPI call orders diverge; a failure here breaks the communicator.
  for (PendingOp &pending : group->ops) {
    status = Start(&pending);
    if (!status.ok()) return Fail(group.get(), status);
  }
  in_flight_.push_back(group);
  return Work(std::make_shared<MpiWork>(this, group));
}

absl::Status MpiCommunicator::Test(Group *group) {
  if (group->mpi_done) return absl::OkStatus();
  std::vector<MPI_Request> requests;
  for (const PendingOp &pending : group->ops) {
    requests.push_back(pending.request);
  }
  int done = 0;
  int error;
  {
    std::lock_guard<std::mutex> lock(MpiMutex());
    error = MPI_Testall(static_cast<int>(requests.size()), requests.data(),
                        &done, MPI_STATUSES_IGNORE);
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    group->ops[i].request = requests[i];
  }
  if (error != MPI_SUCCESS) {
    return Fail(group,
                MpiStatus(error, absl::StrCat("MPI_Testall for collective #",
                                              group->first_sequence(),
                                              " on rank ", rank())));
  }
  group->mpi_done = done != 0;
  return absl::OkStatus();
}

absl::Status MpiCommunicator::Fail(Group *group, absl::Status status) {
  group->status = status;
  broken_ = status;
  MarkMpiUnrecoverable();
  for (const PendingOp &pending : group->ops) {
    recorder()->MarkFailed(pending.sequence_number);
  }
  return status;
}

// Writes results into the caller's output: rounds f32 sums, divides
// averages, and queues the copies back to the device.
absl::Status MpiCommunicator::Finish(Group *group) {
  for (PendingOp &pending : group->ops) {
    const CollectiveOp &op = pending.op;
    const Tensor &out = pending.host_output;
    const bool average = (op.kind == CollectiveKind::kAllReduce ||
                          op.kind == CollectiveKind::kReduceScatter) &&
                         op.reduce_op == ReduceOp::kAverage;
    if (pending.reduced_in_f32_buffer) {
      if (average) {
        for (float &value : pending.recv_f32) {
          value /= static_cast<float>(world_size());
        }
      }
      ConvertElements(pending.recv_f32.data(), DType::kF32, out.data(),
                      out.dtype(), out.numel());
    } else if (average) {
      float *data = out.data_as<float>();
      for (int64_t i = 0; i < out.numel(); ++i) {
        data[i] /= static_cast<float>(world_size());
      }
    }
    if (group->on_device) {
      const bool root_of_broadcast =
          op.kind == CollectiveKind::kBroadcast && op.root == rank();
      if (!root_of_broadcast && op.kind != CollectiveKind::kSend) {
        // Queued on the caller's stream, which need not be the one the
        // output was allocated on.
        ZE_RETURN_IF_ERROR(op.output.RecordStream(group->stream));
        ZE_RETURN_IF_ERROR(Copy(out, op.output, group->stream));
      }
    }
    ReturnF32Buffer(std::move(pending.send_f32));
    ReturnF32Buffer(std::move(pending.recv_f32));
    pending.send_f32 = std::vector<float>();
    pending.recv_f32 = std::vector<float>();
    recorder()->MarkCompleted(pending.sequence_number);
  }
  if (group->on_device) {
    ZE_RETURN_IF_ERROR(group->copied_back.Record(group->stream));
  }
  group->finished = true;
  return absl::OkStatus();
}

absl::Status MpiCommunicator::Complete(Group *group, Clock::time_point deadline,
                                       Clock::time_point started) {
  if (!group->status.ok()) return group->status;
  if (group->finished) return absl::OkStatus();
  // Spin briefly (small collectives finish in microseconds), then back off
  // so a waiting rank does not starve the others of CPU on shared machines.
  const Clock::time_point spin_until =
      Clock::now() + std::chrono::microseconds(200);
  while (true) {
    ZE_RETURN_IF_ERROR(Test(group));
    if (group->mpi_done) break;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      const double waited =
          std::chrono::duration<double>(now - started).count();
      return Fail(group, TimeoutError(group->first_sequence(),
                                      group->last_sequence(), waited));
    }
    if (now > spin_until)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  absl::Status status = Finish(group);
  if (!status.ok()) return Fail(group, status);
  return absl::OkStatus();
}

absl::Status MpiCommunicator::WaitGroup(const std::shared_ptr<Group> &target,
                                        bool host_sync) {
  if (!target->status.ok()) return target->status;
  if (!target->finished) {
    const Clock::time_point started = Clock::now();
    // Blocked here is communication time (MPI progresses in these calls).
    struct AddWaitTime {
      MpiCommunicator *self;
      Clock::time_point started;
      ~AddWaitTime() {
        if (self->timing()) {
          self->AddCommunicationMilliseconds(
              std::chrono::duration<double, std::milli>(Clock::now() - started)
                  .count());
        }
      }
    } add_wait_time{this, started};
    const Clock::time_point deadline =
        started + std::chrono::duration_cast<Clock::duration>(
                      std::chrono::duration<double>(timeout_seconds()));
    // Earlier collective groups first: MPI completes them in order anyway,
    // and their results must be written before later ones overwrite shared
    // outputs. Point-to-point groups complete on their own.
    for (const std::shared_ptr<Group> &group : in_flight_) {
      if (group != target &&
          (group->point_to_point || target->point_to_point)) {
        continue;
      }
      absl::Status status = Complete(group.get(), deadline, started);
      if (!status.ok()) {
        if (group != target) {
          target->status = status;
          for (const PendingOp &pending : target->ops) {
            recorder()->MarkFailed(pending.sequence_number);
          }
        }
        return status;
      }
      if (group == target) break;
    }
  }
  if (host_sync && target->on_device) {
    ZE_RETURN_IF_ERROR(target->copied_back.Synchronize());
  }
  Prune();
  return absl::OkStatus();
}

absl::StatusOr<bool> MpiCommunicator::PollGroup(
    const std::shared_ptr<Group> &target) {
  if (!target->status.ok()) return target->status;
  if (!target->finished) {
    for (const std::shared_ptr<Group> &group : in_flight_) {
      if (group != target &&
          (group->point_to_point || target->point_to_point)) {
        continue;
      }
      if (!group->finished) {
        ZE_RETURN_IF_ERROR(Test(group.get()));
        if (!group->mpi_done) return false;
        absl::Status status = Finish(group.get());
        if (!status.ok()) return Fail(group.get(), status);
      }
      if (group == target) break;
    }
  }
  return !target->on_device || target->copied_back.Query();
}

// Drops finished groups whose copies back have completed, returning their
// staging blocks to the pool.
void MpiCommunicator::Prune() {
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    Group *group = it->get();
    if (group->finished && (!group->on_device || group->copied_back.Query())) {
      for (const PinnedPool::Block &block : group->blocks) pool_.Release(block);
      group->blocks.clear();
      it = in_flight_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::Status MpiCommunicator::BarrierImpl(uint64_t sequence_number) {
  // Everything issued before the barrier completes first.
  for (const auto &group : std::vector<std::shared_ptr<Group>>(
           in_flight_.begin(), in_flight_.end())) {
    ZE_RETURN_IF_ERROR(WaitGroup(group, /*host_sync=*/true));
  }
  Group barrier;
  PendingOp pending;
  pending.op.kind = CollectiveKind::kBarrier;
  pending.sequence_number = sequence_number;
  barrier.ops.push_back(pending);
  absl::Status status = Start(&barrier.ops.front());
  if (!status.ok()) return Fail(&barrier, status);
  const Clock::time_point started = Clock::now();
  const Clock::time_point deadline =
      started + std::chrono::duration_cast<Clock::duration>(
                    std::chrono::duration<double>(timeout_seconds()));
  while (true) {
    ZE_RETURN_IF_ERROR(Test(&barrier));
    if (barrier.mpi_done) return absl::OkStatus();
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      return Fail(
          &barrier,
          TimeoutError(sequence_number, sequence_number,
                       std::chrono::duration<double>(now - started).count()));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

absl::StatusOr<std::unique_ptr<Communicator>> MpiCommunicator::SplitImpl(
    int color, int key, int new_rank, int new_size) {
  MPI_Comm split = MPI_COMM_NULL;
  int rank = -1, size = 0;
  {
    std::lock_guard<std::mutex> lock(MpiMutex());
    ZE_RETURN_IF_ERROR(
        MpiStatus(MPI_Comm_split(comm_, color, key, &split),
                  absl::StrCat("MPI_Comm_split(color ", color, ", key ", key,
                               ") on rank ", this->rank())));
    MPI_Comm_set_errhandler(split, MPI_ERRORS_RETURN);
    MPI_Comm_rank(split, &rank);
    MPI_Comm_size(split, &size);
  }
  if (rank != new_rank || size != new_size) {
    // MPI_Comm_split ranks as Split promises; a difference is a bug here.
    {
      std::lock_guard<std::mutex> lock(MpiMutex());
      MPI_Comm_free(&split);
    }
    return absl::InternalError(
        absl::StrCat("MPI_Comm_split(color ", color, ", key ", key,
                     ") on rank ", this->rank(), " gave rank ", rank, " of ",
                     size, ", expected ", new_rank, " of ", new_size));
  }
  LaunchInfo info;
  info.rank = rank;
  info.world_size = size;
  info.local_rank = local_rank();
  info.local_size = local_size();
  info.launched = true;
  return std::unique_ptr<Communicator>(
      new MpiCommunicator(info, device(), timeout_seconds(), split));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateMpiCommunicator(
    const LaunchInfo &info, const Device &device, double timeout_seconds) {
  ZE_RETURN_IF_ERROR(EnsureMpiInitialized());
  MPI_Comm comm = MPI_COMM_NULL;
  {
    std::lock_guard<std::mutex> lock(MpiMutex());
    int rank = -1, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank != info.rank || size != info.world_size) {
      return absl::FailedPreconditionError(absl::StrCat(
          "MPI says rank ", rank, " of ", size, " but the environment says ",
          info.rank, " of ", info.world_size));
    }
    // A private communicator keeps our traffic apart from anyone else's.
    ZE_RETURN_IF_ERROR(MpiStatus(MPI_Comm_dup(MPI_COMM_WORLD, &comm),
                                 "MPI_Comm_dup(MPI_COMM_WORLD)"));
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  }
  return std::unique_ptr<Communicator>(
      new MpiCommunicator(info, device, timeout_seconds, comm));
}

}  // namespace comm
}  // namespace ze
