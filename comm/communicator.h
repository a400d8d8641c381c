// Communicator: collective operations over ze::Tensors across the ranks of a
// job launched by mpirun (or a single process, which is rank 0 of 1).
//
// Backends (chosen by CreateCommunicator in comm/factory.h):
//   "nccl"  device memory only, one GPU per rank; ops queued on CUDA streams.
//   "mpi"   host memory; device memory is staged through pinned host buffers,
//           so several ranks may share one GPU (how multi-rank GPU code is
//           tested on a single GPU). bf16/f16 are reduced in f32.
//   "local" a world of one process started without a launcher; every
//           collective is a copy (or nothing).
//
// Every operation is asynchronous and stream-ordered:
//   * It reads its input after all work queued on `stream` before the call
//     (on the CPU stream, the input as it is at the call).
//   * When the call returns OK, the operation has been queued or started;
//     nothing is guaranteed to have completed. The returned Work is the
//     handle to its completion.
//   * Neither the input nor the output may be read or written by anyone until
//     Work::Wait() (host) or Work::StreamWait(s) (work later queued on s)
//     has returned OK. Only then is the output defined.
//   * Operations run in issue order, whatever streams they are issued on:
//     one issued on another stream than the operation before it waits for
//     that operation (on the device for nccl, on the host's issue order for
//     mpi), so callers may spread collectives over streams freely.
//   * All ranks must issue the same collectives, with the same element
//     counts, dtypes, reduce ops and roots, in the same order. A rank that
//     skips or reorders one makes the others' Wait fail with
//     DeadlineExceeded after the timeout (see CommOptions), naming the
//     operation and its sequence number; they never hang silently.
//
// Tensors must be contiguous (all ze::Tensors are), have the same dtype on
// input and output (f32, bf16 or f16), and live on the communicator's
// device() (or on the host, for the mpi and local backends). Shapes do not
// matter; element counts do.
//
// A Communicator is not thread-safe: one thread at a time issues operations
// and waits on their Work. A Work must not outlive its communicator.
#ifndef ZE_COMM_COMMUNICATOR_H_
#define ZE_COMM_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/recent_collectives.h"
#include "core/device.h"
#include "core/stream.h"
#include "core/tensor.h"

namespace ze {
namespace comm {

// The handle to one issued operation (or one coalesced group). Cheap to copy;
// copies refer to the same operation. A default-constructed Work is complete.
class Work {
 public:
  // What a backend implements; users only see Work.
  class Impl {
   public:
    virtual ~Impl() = default;
    virtual absl::Status Wait() = 0;
    virtual absl::Status StreamWait(const Stream &stream) = 0;
    virtual absl::StatusOr<bool> Poll() = 0;
    virtual uint64_t first_sequence_number() const = 0;
  };

  Work() = default;
  explicit Work(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

  // Blocks the host until the operation has completed on every rank it
  // depends on and its output is defined and visible to the host (for device
  // tensors: to work queued afterwards on the operation's stream, and, after
  // a host synchronisation of that stream, to the host).
  // Fails with DeadlineExceeded when it has not completed within the
  // communicator's timeout (counted from the start of this Wait); the message
  // names the operation, its sequence number, element count, dtype and this
  // rank, and the communicator logs its recent collectives. After a timeout
  // or a backend error the communicator is broken: later operations fail
  // with FailedPrecondition. Calling Wait again after success is a no-op.
  absl::Status Wait() const { return impl_ ? impl_->Wait() : absl::OkStatus(); }

  // Makes work queued later on `stream` wait for this operation's output
  // without blocking the host where the backend can (nccl: an event wait).
  // The mpi backend with device tensors must block the host until the MPI
  // transfer completes (then queues the copy back to the device), with the
  // same timeout as Wait.
  absl::Status StreamWait(const Stream &stream) const {
    return impl_ ? impl_->StreamWait(stream) : absl::OkStatus();
  }

  // Non-blocking test: true once Wait would return OK at once. Errors as
  // for Wait, except that it never times out.
  absl::StatusOr<bool> Poll() const {
    return impl_ ? impl_->Poll() : absl::StatusOr<bool>(true);
  }

  // The sequence number of the (first) operation; 0 for an empty Work.
  uint64_t sequence_number() const {
    return impl_ ? impl_->first_sequence_number() : 0;
  }

 private:
  std::shared_ptr<Impl> impl_;
};

// One collective, as given to Communicator::Coalesced. Holding the tensors
// keeps their storage alive while the operation is in flight.
struct CollectiveOp {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  Tensor input;
  Tensor output;  // Broadcast: same as input
  ReduceOp reduce_op = ReduceOp::kSum;
  int root = 0;  // Broadcast: the root; Send/Recv: the peer rank

  static CollectiveOp AllReduce(const Tensor &input, const Tensor &output,
                                ReduceOp op = ReduceOp::kSum);
  static CollectiveOp ReduceScatter(const Tensor &input, const Tensor &output,
                                    ReduceOp op = ReduceOp::kSum);
  static CollectiveOp AllGather(const Tensor &input, const Tensor &output);
  static CollectiveOp Broadcast(const Tensor &tensor, int root);
  static CollectiveOp Send(const Tensor &tensor, int peer);
  static CollectiveOp Recv(const Tensor &tensor, int peer);
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator &) = delete;
  Communicator &operator=(const Communicator &) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // Rank among the processes on this host (MPI's MPI_COMM_TYPE_SHARED split
  // for a launched job; 0 for a single process).
  int local_rank() const { return local_rank_; }
  // Processes on this host (the same split; 1 for a single process): how
  // many ranks share its CPU cores, memory and GPUs (the offloaded optimizer
  // sizes its thread pool by it).
  int local_size() const { return local_size_; }
  // The device this rank's tensors live on (cuda:local_rank % device_count,
  // or cpu).
  const Device &device() const { return device_; }
  // "mpi", "nccl" or "local".
  virtual const char *backend_name() const = 0;

  // output[i] = op over ranks of input[i], on every rank.
  // Sizes: input and output have the same element count (any count, e.g. 53
  // at 3 ranks). In place when input and output are the same tensor (same
  // data pointer); partial overlap is not allowed. kAverage is the sum
  // divided by world_size, rounded once to the dtype.
  absl::StatusOr<Work> AllReduce(const Tensor &input, const Tensor &output,
                                 ReduceOp op, const Stream &stream);

  // Reduces across ranks, and leaves slice `rank` of the result on each rank:
  // output[i] = op over ranks of input[rank * count + i].
  // Sizes: input has world_size * count elements, output has count. In place
  // when output is exactly this rank's slice of input
  // (input.Slice(rank * count, count)); other overlaps are not allowed.
  // For a total that does not divide by world_size, pad (comm/equal_slices.h).
  absl::StatusOr<Work> ReduceScatter(const Tensor &input, const Tensor &output,
                                     ReduceOp op, const Stream &stream);

  // Concatenates every rank's input, in rank order, into output on every
  // rank: output[r * count + i] = input of rank r [i].
  // Sizes: input has count elements, output world_size * count. In place when
  // input is exactly this rank's slice of output
  // (output.Slice(rank * count, count)); other overlaps are not allowed.
  absl::StatusOr<Work> AllGather(const Tensor &input, const Tensor &output,
                                 const Stream &stream);

  // Copies `root`'s tensor into `tensor` on every other rank (in place on
  // every rank; the root's tensor is only read). Every rank passes the same
  // element count. Fails with InvalidArgument for a root outside
  // [0, world_size).
  absl::StatusOr<Work> Broadcast(const Tensor &tensor, int root,
                                 const Stream &stream);

  // Point-to-point: sends `tensor` to rank `peer`, which must issue a Recv
  // from this rank with the same element count and dtype. Messages between
  // two ranks match in issue order (the first Send to `peer` with the first
  // Recv from this rank on `peer`), whatever else either issues in between;
  // only the two ranks take part, so other ranks' collectives do not wait
  // for it and it does not count among the collectives every rank must
  // issue alike. The sender must not write `tensor` until the Work
  // completes. Completion: the data has left `tensor` (MPI: the send
  // request completed; the receiver may not have it yet; NCCL: the peer's
  // receive has taken it). On mpi, Work::Wait on a send or receive waits
  // for that operation alone, not for earlier point-to-point operations
  // (collectives still complete in issue order), so a rank may issue a
  // send, then wait for a later receive: that is how a pipeline keeps a
  // send in flight while it waits for its next input. On nccl the
  // point-to-point groups run in issue order on the communicator's own
  // stream (which first waits for the work queued on `stream` before the
  // call, so the input is read and the output written after it; `stream`
  // itself waits only through Work::StreamWait or Wait): a later group
  // completes after the earlier ones, and a send completes only when the
  // peer receives it (sends_wait_for_receiver()). A point-to-point group
  // and a collective of one nccl communicator are still ordered on the
  // device in issue order, as collectives on different streams are.
  // Errors: InvalidArgument for a peer outside [0, world_size) or equal to
  // rank(); Unimplemented on backends without point-to-point
  // (supports_point_to_point()); nccl: a group mixing point-to-point
  // operations with collectives is InvalidArgument.
  absl::StatusOr<Work> Send(const Tensor &tensor, int peer,
                            const Stream &stream);
  // Receives into `tensor` (written) what rank `peer` sends, as above. The
  // output is defined once the Work completes.
  absl::StatusOr<Work> Recv(const Tensor &tensor, int peer,
                            const Stream &stream);
  // Whether Send, Recv and Send/Recv ops in Coalesced work here: the mpi
  // and nccl backends (and the local one, whose world has no peer to name).
  virtual bool supports_point_to_point() const { return false; }
  // Whether a send can complete only once its peer has posted the matching
  // receive, and holds up what this communicator issued after it until then
  // (nccl: ncclSend blocks its stream, and this backend runs its
  // point-to-point groups in issue order on one stream). Two ranks that
  // send to each other must then put the send and the receive in ONE
  // Coalesced group (an NCCL group, whose operations progress
  // independently), or each blocks in its send before reaching its
  // receive. False for mpi: MPI_Isend progresses without the receiver's
  // host, so separate groups in any order work there.
  virtual bool sends_wait_for_receiver() const { return false; }
  // Whether tensors on the host are accepted (mpi, local, in_process); nccl
  // takes device tensors only, so callers exchanging small host values put
  // them on device() first.
  bool accepts_host_tensors() const { return AcceptsDevice(Device::Cpu()); }

  // A communicator over the ranks that pass the same `color` (>= 0), ranked
  // by `key` (ties by this communicator's rank): how a pipeline group and a
  // data-parallel group are made from the world. Collective: every rank of
  // this communicator calls it, in the same order relative to its other
  // collectives. Every rank's (color, key) is first all-gathered over this
  // communicator (it counts as one of its collectives), so a negative
  // color on any rank fails Split on every rank alike, and a rank that never
  // calls it makes the others time out (DeadlineExceeded) instead of
  // blocking in the backend's split. The new communicator has its own
  // sequence numbers and timeout (this one's); this one stays usable. Its
  // device, backend and local rank/size are this one's (local rank and size
  // still describe the host). Errors: InvalidArgument naming the ranks with
  // a negative color; FailedPrecondition when this communicator is broken;
  // Unimplemented on backends that cannot split (in_process); the backend's
  // translated error (nccl: ncclCommSplit's, naming color, key and rank).
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key);

  // Issues several operations as one group: a backend may fuse them (NCCL
  // group) and every rank must pass the same list. Each operation obeys its
  // own contract above and gets its own sequence number; operations within
  // a group must not write memory another op of the group reads. The Work
  // completes when all of them have. An empty list returns a complete Work.
  absl::StatusOr<Work> Coalesced(const std::vector<CollectiveOp> &ops,
                                 const Stream &stream);

  // Blocks the host until every rank has called Barrier (and every operation
  // this rank issued before it has completed). Fails like Work::Wait.
  absl::Status Barrier();

  // The last (up to 64) collectives this communicator issued, one per line,
  // oldest first, with sequence number, op, count, dtype and state.
  std::string DumpRecentCollectives() const { return recorder_->Dump(); }
  // The sequence number the next collective will get (starts at 1).
  uint64_t next_sequence_number() const { return recorder_->next(); }
  // Seconds a Wait may take before it fails with DeadlineExceeded.
  double timeout_seconds() const { return timeout_seconds_; }

  // Communication time (wall_clock_breakdown). While timing is on, the
  // communicator sums, per operation: on the device (nccl) the time between
  // events recorded just before and after it on its stream, so earlier work
  // queued on that stream is not counted but waiting for peers is; on the
  // host (mpi, local) the time the calling thread spends issuing
  // operations and blocked waiting for them (MPI progresses inside those
  // calls). Collectives on a stream of their own overlap compute, so the
  // sum is not a share of the step's wall time.
  void set_timing(bool enabled) { timing_ = enabled; }
  bool timing() const { return timing_; }
  // The sum for operations completed since the previous call (nccl: whose
  // end event has been reached; later ones count at a later call), in
  // milliseconds; starts a new sum.
  double TakeCommunicationMilliseconds();

 protected:
  Communicator(int rank, int world_size, int local_rank, Device device,
               double timeout_seconds, int local_size = 1);

  // Issues `ops` (already validated; never empty). `sequence_numbers[i]` is
  // ops[i]'s number, already recorded as issued.
  virtual absl::StatusOr<Work> Issue(
      const std::vector<CollectiveOp> &ops,
      const std::vector<uint64_t> &sequence_numbers, const Stream &stream) = 0;
  // Backend barrier: blocks until all ranks arrive (timeout as Wait).
  virtual absl::Status BarrierImpl(uint64_t sequence_number) = 0;
  // Whether this backend accepts tensors on `device`.
  virtual bool AcceptsDevice(const Device &device) const = 0;
  // Split's backend part (every rank's arguments checked, communicator not
  // broken). `new_rank` and `new_size` are what the split must give this
  // rank (from the all-gathered colors and keys: ranked by key, ties by
  // this communicator's rank), for backends to pass on or check.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> SplitImpl(int color,
                                                                  int key,
                                                                  int new_rank,
                                                                  int new_size);

  // The DeadlineExceeded status for the operations `first`..`last` after
  // `seconds`; logs the recent collectives at ERROR.
  absl::Status TimeoutError(uint64_t first_sequence, uint64_t last_sequence,
                            double waited_seconds) const;
  const std::shared_ptr<RecentCollectives> &recorder() const {
    return recorder_;
  }

  // Set once a timeout or backend error made the communicator unusable.
  absl::Status broken_ = absl::OkStatus();

  // Timing (see set_timing): backends that time on the host add their wait
  // time here; Coalesced adds the time of Issue for them
  // (times_on_host()). A device-timed backend folds in its completed
  // operations' event times in CollectTimings.
  virtual bool times_on_host() const { return true; }
  virtual void CollectTimings() {}
  void AddCommunicationMilliseconds(double ms) { communication_ms_ += ms; }

 private:
  absl::Status Validate(const CollectiveOp &op) const;

  int rank_;
  int world_size_;
  int local_rank_;
  int local_size_;
  Device device_;
  double timeout_seconds_;
  std::shared_ptr<RecentCollectives> recorder_;
  bool timing_ = false;
  double communication_ms_ = 0;
};

}  // namespace comm
}  // namespace ze

#endif  // ZE_COMM_COMMUNICATOR_H_
