// Sequence numbers and a ring of recent collectives, for diagnosing hangs.
//
// Every collective a communicator issues gets the next sequence number
// (1, 2, ...). When ranks disagree about the order of collectives (one rank
// skipped one), the sequence numbers in each rank's dump show where they
// diverged.
#ifndef ZE_COMM_RECENT_COLLECTIVES_H_
#define ZE_COMM_RECENT_COLLECTIVES_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "core/dtype.h"

namespace ze {
namespace comm {

enum class CollectiveKind {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kBarrier,
  // Point-to-point (comm/communicator.h's Send and Recv): only the two ranks
  // involved issue them, so sequence numbers stop lining up across ranks
  // once a rank has sent or received.
  kSend,
  kRecv,
};

enum class ReduceOp { kSum, kMax, kMin, kAverage };

// "all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier",
// "send", "recv".
const char *CollectiveKindName(CollectiveKind kind);
// "sum", "max", "min", "avg".
const char *ReduceOpName(ReduceOp op);

// What one collective was asked to do, and how far it got.
struct CollectiveRecord {
  enum class State { kIssued, kCompleted, kFailed };

  uint64_t sequence_number = 0;
  CollectiveKind kind = CollectiveKind::kAllReduce;
  ReduceOp reduce_op = ReduceOp::kSum;  // reductions only
  int root = -1;                        // broadcast: root; send/recv: peer
  int64_t count = 0;                    // elements of the input
  DType dtype = DType::kF32;
  State state = State::kIssued;
  std::chrono::steady_clock::time_point issued_at;
  double seconds_to_complete = 0;  // when completed or failed

  // "all_reduce(sum) #7: 53 x bf16" (no state).
  std::string Describe() const;
};

// Thread-safe. Keeps the last `capacity` records.
class RecentCollectives {
 public:
  explicit RecentCollectives(int rank, size_t capacity = 64)
      : rank_(rank), capacity_(capacity) {}

  // Records a new collective (its sequence_number and issued_at are filled
  // in here) and returns its sequence number.
  uint64_t Issue(CollectiveRecord record);
  // Marks a recorded collective done; a no-op for one already out of the ring.
  void MarkCompleted(uint64_t sequence_number);
  void MarkFailed(uint64_t sequence_number);
  // The record for `sequence_number`, or a record with sequence_number 0
  // when it is no longer in the ring.
  CollectiveRecord Find(uint64_t sequence_number) const;
  // The sequence number the next Issue returns.
  uint64_t next() const;
  // One line per record, oldest first:
  //   "rank 1: #7 all_reduce(sum): 53 x bf16 completed in 0.000123 s"
  std::string Dump() const;

 private:
  void SetState(uint64_t sequence_number, CollectiveRecord::State state);

  const int rank_;
  const size_t capacity_;
  mutable std::mutex mutex_;
  uint64_t next_ = 1;
  std::deque<CollectiveRecord> records_;
};

}  // namespace comm
}  // namespace ze

#endif  // ZE_COMM_RECENT_COLLECTIVES_H_
