#include "comm/recent_collectives.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ze {
namespace comm {

const char *CollectiveKindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kBarrier:
      return "barrier";
    case CollectiveKind::kSend:
      return "send";
    case CollectiveKind::kRecv:
      return "recv";
  }
  return "unknown";
}

const char *ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kAverage:
      return "avg";
  }
  return "unknown";
}

std::string CollectiveRecord::Describe() const {
  std::string name = CollectiveKindName(kind);
  if (kind == CollectiveKind::kAllReduce ||
      kind == CollectiveKind::kReduceScatter) {
    absl::StrAppend(&name, "(", ReduceOpName(reduce_op), ")");
  } else if (kind == CollectiveKind::kBroadcast) {
    absl::StrAppend(&name, "(root ", root, ")");
  } else if (kind == CollectiveKind::kSend) {
    absl::StrAppend(&name, "(to ", root, ")");
  } else if (kind == CollectiveKind::kRecv) {
    absl::StrAppend(&name, "(from ", root, ")");
  }
  if (kind == CollectiveKind::kBarrier) {
    return absl::StrCat(name, " #", sequence_number);
  }
  return absl::StrCat(name, " #", sequence_number, ": ", count, " x ",
                      DTypeName(dtype));
}

uint64_t RecentCollectives::Issue(CollectiveRecord record) {
  std::lock_guard<std::mutex> lock(mutex_);
  record.sequence_number = next_++;
  record.issued_at = std::chrono::steady_clock::now();
  record.state = CollectiveRecord::State::kIssued;
  records_.push_back(record);
  while (records_.size() > capacity_) records_.pop_front();
  return record.sequence_number;
}

void RecentCollectives::SetState(uint64_t sequence_number,
                                 CollectiveRecord::State state) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = records_.rbegin(); it != records_.rend(); ++it) {
    if (it->sequence_number != sequence_number) continue;
    if (it->state == CollectiveRecord::State::kIssued) {
      it->state = state;
      it->seconds_to_complete =
          std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                        it->issued_at)
              .count();
    }
    return;
  }
}

void RecentCollectives::MarkCompleted(uint64_t sequence_number) {
  SetState(sequence_number, CollectiveRecord::State::kCompleted);
}

void RecentCollectives::MarkFailed(uint64_t sequence_number) {
  SetState(sequence_number, CollectiveRecord::State::kFailed);
}

CollectiveRecord RecentCollectives::Find(uint64_t sequence_number) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const CollectiveRecord &record : records_) {
    if (record.sequence_number == sequence_number) return record;
  }
  return CollectiveRecord{};
}

uint64_t RecentCollectives::next() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return next_;
}

std::string RecentCollectives::Dump() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  std::string out;
  for (const CollectiveRecord &record : records_) {
    absl::StrAppend(&out, "rank ", rank_, ": ", record.Describe());
    switch (record.state) {
      case CollectiveRecord::State::kIssued:
        absl::StrAppend(
            &out,
            absl::StrFormat(
                " PENDING for %.3f s",
                std::chrono::duration<double>(now - record.issued_at).count()));
        break;
      case CollectiveRecord::State::kCompleted:
        absl::StrAppend(&out, absl::StrFormat(" completed in %.6f s",
                                              record.seconds_to_complete));
        break;
      case CollectiveRecord::State::kFailed:
        absl::StrAppend(&out, absl::StrFormat(" FAILED after %.3f s",
                                              record.seconds_to_complete));
        break;
    }
    out += "\n";
  }
  if (records_.empty()) absl::StrAppend(&out, "rank ", rank_, ": (none)\n");
  return out;
}

}  // namespace comm
}  // namespace ze
