// The in-process backend (comm/in_process.h): ranks are threads of one
// process and a collective is a rendezvous in a World shared by their
// communicators.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/in_process.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace ze {
namespace comm {
namespace {

using Clock = std::chrono::steady_clock;
using Bytes = std::shared_ptr<const std::vector<char>>;

// "all_reduce(sum) 53 x bf16", for mismatch messages.
std::string DescribeOp(const CollectiveOp& op) {
  std::string text = CollectiveKindName(op.kind);
  if (op.kind == CollectiveKind::kAllReduce ||
      op.kind == CollectiveKind::kReduceScatter) {
    absl::StrAppend(&text, "(", ReduceOpName(op.reduce_op), ")");
  }
  if (op.kind == CollectiveKind::kBroadcast) {
    absl::StrAppend(&text, "(root ", op.root, ")");
  }
  absl::StrAppend(&text, " ", op.input.numel(), " -> ", op.output.numel(),
                  " x ", DTypeName(op.input.dtype()));
  return text;
}

std::string DescribeGroup(const std::vector<CollectiveOp>& ops) {
  if (ops.empty()) return "barrier";
  std::string text;
  for (const CollectiveOp& op : ops) {
    absl::StrAppend(&text, text.empty() ? "" : ", ", DescribeOp(op));
  }
  return text;
}

bool SameOp(const CollectiveOp& a, const CollectiveOp& b) {
  const bool reduces = a.kind == CollectiveKind::kAllReduce ||
                       a.kind == CollectiveKind::kReduceScatter;
  return a.kind == b.kind && a.input.numel() == b.input.numel() &&
         a.output.numel() == b.output.numel() &&
         a.input.dtype() == b.input.dtype() &&
         (!reduces || a.reduce_op == b.reduce_op) &&
         (a.kind != CollectiveKind::kBroadcast || a.root == b.root);
}

std::vector<float> Widened(const Tensor& tensor, int64_t begin, int64_t count) {
  std::vector<float> values(count);
  const char* data =
      static_cast<const char*>(tensor.data()) + begin * SizeOf(tensor.dtype());
  ConvertElements(data, tensor.dtype(), values.data(), DType::kF32, count);
  return values;
}

// op over ranks of elements [begin, begin + count) of every rank's input,
// in rank order, in f32; rounded once to `dtype`.
Bytes Reduce(const std::vector<const CollectiveOp*>& ops, int64_t begin,
             int64_t count) {
  const CollectiveOp& first = *ops.front();
  std::vector<float> result = Widened(first.input, begin, count);
  for (size_t r = 1; r < ops.size(); ++r) {
    const std::vector<float> values = Widened(ops[r]->input, begin, count);
    for (int64_t i = 0; i < count; ++i) {
      switch (first.reduce_op) {
        case ReduceOp::kSum:
        case ReduceOp::kAverage:
          result[i] += values[i];
          break;
        case ReduceOp::kMax:
          result[i] = std::max(result[i], values[i]);
          break;
        case ReduceOp::kMin:
          result[i] = std::min(result[i], values[i]);
          break;
      }
    }
  }
  if (first.reduce_op == ReduceOp::kAverage) {
    for (float& value : result) value /= static_cast<float>(ops.size());
  }
  const DType dtype = first.input.dtype();
  auto bytes = std::make_shared<std::vector<char>>(count * SizeOf(dtype));
  ConvertElements(result.data(), DType::kF32, bytes->data(), dtype, count);
  return bytes;
}

Bytes CopyOf(const Tensor& tensor) {
  const char* data = static_cast<const char*>(tensor.data());
  return std::make_shared<std::vector<char>>(data, data + tensor.nbytes());
}

// The operations every rank posted under one sequence number (a coalesced
// group, one op, or a barrier: no op), and, once done, every rank's results.
struct Slot {
  explicit Slot(int world_size)
      : posted(world_size), has_posted(world_size, false) {}
  std::vector<std::vector<CollectiveOp>> posted;  // [rank][op]
  std::vector<bool> has_posted;
  int arrived = 0;
  bool done = false;
  absl::Status status;                      // a mismatch, once done
  std::vector<std::vector<Bytes>> results;  // [rank][op]: the output bytes
  int collected = 0;
};

// The state the communicators of one world share. Thread-safe.
class World {
 public:
  explicit World(int size) : size_(size), departed_(size, false) {}
  int size() const { return size_; }

  // Posts `rank`'s operations under `key` (the first sequence number); the
  // last rank to post computes every rank's results (outside the lock:
  // only the poster touches a slot between the last post and done).
  void Post(uint64_t key, int rank, std::vector<CollectiveOp> ops) {
    Slot* slot = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      slot = &slots_.try_emplace(key, size_).first->second;
      slot->posted[rank] = std::move(ops);
      slot->has_posted[rank] = true;
      if (++slot->arrived < size_) return;
    }
    Compute(key, *slot);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      slot->done = true;
    }
    changed_.notify_all();
  }

  // Copies `rank`'s results for `key` into its outputs once every rank has
  // posted. Returns true when copied; false when not done by `deadline`
  // (nullopt: do not wait). Errors: the slot's mismatch, or Aborted when a
  // rank that has not posted is gone.
  absl::StatusOr<bool> Collect(uint64_t key, int rank,
                               std::optional<Clock::time_point> deadline) {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto found = slots_.find(key);
    if (found == slots_.end()) {
      return absl::InternalError(
          absl::StrCat("rank ", rank, " (in_process backend): collective #",
                       key, " was already collected"));
    }
    Slot& slot = found->second;
    auto ready = [&] { return slot.done || MissingRank(slot) >= 0; };
    if (deadline.has_value()) {
      changed_.wait_until(lock, *deadline, ready);
    }
    if (!slot.done) {
      const int missing = MissingRank(slot);
      if (missing < 0) return false;
      return absl::AbortedError(absl::StrCat(
          "rank ", rank, " of ", size_,
          " (in_process backend): ", DescribeGroup(slot.posted[rank]), " #",
          key, " cannot complete: rank ", missing,
          " returned (its communicator was destroyed) without issuing it"));
    }
    absl::Status status = slot.status;
    if (status.ok()) {
      const std::vector<CollectiveOp>& ops = slot.posted[rank];
      for (size_t i = 0; i < ops.size(); ++i) {
        const std::vector<char>& bytes = *slot.results[rank][i];
        std::memcpy(ops[i].output.data(), bytes.data(), bytes.size());
      }
    }
    if (++slot.collected == size_) slots_.erase(key);
    if (!status.ok()) return status;
    return true;
  }

  // `rank` will post nothing more: ranks waiting for it fail.
  void Depart(int rank) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      departed_[rank] = true;
    }
    changed_.notify_all();
  }

 private:
  // A rank that has not posted to `slot` and never will; -1 when none.
  int MissingRank(const Slot& slot) const {
    for (int r = 0; r < size_; ++r) {
      if (!slot.has_posted[r] && departed_[r]) return r;
    }
    return -1;
  }

  void Compute(uint64_t key, Slot& slot) {
    for (int r = 1; r < size_; ++r) {
      bool same = slot.posted[r].size() == slot.posted[0].size();
      for (size_t i = 0; same && i < slot.posted[0].size(); ++i) {
        same = SameOp(slot.posted[0][i], slot.posted[r][i]);
      }
      if (!same) {
        slot.status = absl::FailedPreconditionError(absl::StrCat(
            "collective #", key, " (in_process backend): rank 0 issued ",
            DescribeGroup(slot.posted[0]), " but rank ", r, " issued ",
            DescribeGroup(slot.posted[r]),
            "; every rank must issue the same collectives in the same "
            "order"));
        return;
      }
    }
    const size_t num_ops = slot.posted[0].size();
    slot.results.assign(size_, std::vector<Bytes>(num_ops));
    for (size_t i = 0; i < num_ops; ++i) {
      std::vector<const CollectiveOp*> ops(size_);
      for (int r = 0; r < size_; ++r) ops[r] = &slot.posted[r][i];
      const CollectiveOp& op = *ops[0];
      switch (op.kind) {
        case CollectiveKind::kAllReduce: {
          const Bytes all = Reduce(ops, 0, op.input.numel());
          for (int r = 0; r < size_; ++r) slot.results[r][i] = all;
          break;
        }
        case CollectiveKind::kReduceScatter: {
          const int64_t count = op.output.numel();
          for (int r = 0; r < size_; ++r) {
            slot.results[r][i] = Reduce(ops, r * count, count);
          }
          break;
        }
        case CollectiveKind::kAllGather: {
          auto all = std::make_shared<std::vector<char>>();
          all->reserve(op.output.nbytes());
          for (int r = 0; r < size_; ++r) {
            const char* data = static_cast<const char*>(ops[r]->input.data());
            all->insert(all->end(), data, data + ops[r]->input.nbytes());
          }
          for (int r = 0; r < size_; ++r) slot.results[r][i] = all;
          break;
        }
        case CollectiveKind::kBroadcast: {
          const Bytes root = CopyOf(ops[op.root]->input);
          for (int r = 0; r < size_; ++r) slot.results[r][i] = root;
          break;
        }
        case CollectiveKind::kBarrier:
        case CollectiveKind::kSend:  // Validate refuses these as ops
        case CollectiveKind::kRecv:
          break;
      }
    }
  }

  const int size_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<uint64_t, Slot> slots_;  // guarded by mutex_; nodes stay put
  std::vector<bool> departed_;      // guarded by mutex_
};

// One Issue call of one rank: sequence numbers first..last.
struct Group {
  uint64_t first = 0;
  uint64_t last = 0;
  bool finished = false;
  absl::Status status;
};

class InProcessCommunicator;

class InProcessWork : public Work::Impl {
 public:
  InProcessWork(InProcessCommunicator* comm, std::shared_ptr<Group> group)
      : comm_(comm), group_(std::move(group)) {}
  absl::Status Wait() override;
  absl::Status StreamWait(const Stream&) override { return Wait(); }
  absl::StatusOr<bool> Poll() override;
  uint64_t first_sequence_number() const override { return group_->first; }

 private:
  InProcessCommunicator* comm_;
  std::shared_ptr<Group> group_;
};

class InProcessCommunicator : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<World> world, int rank,
                        double timeout_seconds)
      : Communicator(rank, world->size(), rank, Device::Cpu(), timeout_seconds,
                     world->size()),
        world_(std::move(world)) {}
  ~InProcessCommunicator() override { world_->Depart(rank()); }

  const char* backend_name() const override { return "in_process"; }

  // Completes this rank's groups in issue order up to `target`: waits for
  // each (until the timeout, unless `poll`) and copies its results out.
  // Returns whether `target` finished (false only when polling).
  absl::StatusOr<bool> Complete(const std::shared_ptr<Group>& target,
                                bool poll) {
    if (!target->status.ok()) return target->status;
    if (target->finished) return true;
    const Clock::time_point started = Clock::now();
    const Clock::time_point deadline =
        started + std::chrono::duration_cast<Clock::duration>(
                      std::chrono::duration<double>(timeout_seconds()));
    // Time blocked here is communication time (as the mpi backend's).
    struct AddWaitTime {
      InProcessCommunicator* self;
      Clock::time_point started;
      ~AddWaitTime() {
        if (self->timing()) {
          self->AddCommunicationMilliseconds(
              std::chrono::duration<double, std::milli>(Clock::now() - started)
                  .count());
        }
      }
    } add_wait_time{this, started};
    while (!target->finished) {
      const std::shared_ptr<Group> group = in_flight_.front();
      if (!group->status.ok()) {
        // An earlier group failed (the communicator is broken): so does
        // every later one.
        target->status = group->status;
        return group->status;
      }
      absl::StatusOr<bool> done = world_->Collect(
          group->first, rank(),
          poll ? std::nullopt : std::optional<Clock::time_point>(deadline));
      if (done.ok() && !*done) {
        if (poll) return false;
        done = TimeoutError(
            group->first, group->last,
            std::chrono::duration<double>(Clock::now() - started).count());
      }
      if (!done.ok()) return Fail(group, target, done.status());
      for (uint64_t s = group->first; s <= group->last; ++s) {
        recorder()->MarkCompleted(s);
      }
      group->finished = true;
      in_flight_.pop_front();
    }
    return true;
  }

 protected:
  bool AcceptsDevice(const Device& device) const override {
    return device.is_cpu();
  }

  absl::StatusOr<Work> Issue(const std::vector<CollectiveOp>& ops,
                             const std::vector<uint64_t>& sequence_numbers,
                             const Stream& /*stream*/) override {
    auto group = std::make_shared<Group>();
    group->first = sequence_numbers.front();
    group->last = sequence_numbers.back();
    world_->Post(group->first, rank(), ops);
    in_flight_.push_back(group);
    return Work(std::make_shared<InProcessWork>(this, group));
  }

  absl::Status BarrierImpl(uint64_t sequence_number) override {
    // Everything issued before the barrier completes first.
    if (!in_flight_.empty()) {
      ZE_RETURN_IF_ERROR(Complete(in_flight_.back(), false).status());
    }
    auto barrier = std::make_shared<Group>();
    barrier->first = barrier->last = sequence_number;
    world_->Post(sequence_number, rank(), {});
    in_flight_.push_back(barrier);
    return Complete(barrier, false).status();
  }

 private:
  // The communicator is broken after any failure (as the other backends).
  absl::Status Fail(const std::shared_ptr<Group>& group,
                    const std::shared_ptr<Group>& target, absl::Status status) {
    group->status = status;
    target->status = status;
    broken_ = status;
    for (uint64_t s = group->first; s <= group->last; ++s) {
      recorder()->MarkFailed(s);
    }
    return status;
  }

  std::shared_ptr<World> world_;
  // Issued and not yet copied out, oldest first.
  std::deque<std::shared_ptr<Group>> in_flight_;
};

absl::Status InProcessWork::Wait() {
  return comm_->Complete(group_, /*poll=*/false).status();
}

absl::StatusOr<bool> InProcessWork::Poll() {
  return comm_->Complete(group_, /*poll=*/true);
}

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateInProcessWorld(
    int world_size, double timeout_seconds) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CreateInProcessWorld: world_size must be >= 1, got ", world_size));
  }
  if (!(timeout_seconds > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateInProcessWorld: timeout_seconds must be > 0, got ",
                     timeout_seconds));
  }
  auto world = std::make_shared<World>(world_size);
  std::vector<std::unique_ptr<Communicator>> communicators;
  for (int rank = 0; rank < world_size; ++rank) {
    communicators.push_back(
        std::make_unique<InProcessCommunicator>(world, rank, timeout_seconds));
  }
  return communicators;
}

std::vector<absl::Status> RunInProcess(
    int world_size, const std::function<absl::Status(Communicator&)>& rank_main,
    double timeout_seconds) {
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> world =
      CreateInProcessWorld(world_size, timeout_seconds);
  if (!world.ok()) {
    return std::vector<absl::Status>(std::max(world_size, 1), world.status());
  }
  std::vector<absl::Status> statuses(world_size);
  ThreadPool threads(world_size);
  threads.RunOnEachThread([&](int rank) {
    statuses[rank] = rank_main(*(*world)[rank]);
    (*world)[rank].reset();  // ranks still waiting for this one fail now
  });
  return statuses;
}

}  // namespace comm
}  // namespace ze
