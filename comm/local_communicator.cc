// The world of one process: a reduction over one rank is the input itself,
// a gather is a copy and a broadcast changes nothing. Copies are queued on
// the caller's stream; an event marks their end for device tensors. Other
// backends' communicators of one rank (a pipeline's data-parallel groups
// split from an MPI world) issue their collectives the same way.
#include "absl/strings/str_cat.h"
#include "comm/backends.h"
#include "core/ops.h"
#include "core/status.h"

namespace ze {
namespace comm {
namespace {

class LocalWork : public Work::Impl {
 public:
  LocalWork(Event done, uint64_t first, uint64_t last,
            std::shared_ptr<RecentCollectives> recorder)
      : done_(std::move(done)),
        first_(first),
        last_(last),
        recorder_(std::move(recorder)) {}

  absl::Status Wait() override {
    ZE_RETURN_IF_ERROR(done_.Synchronize());
    MarkCompleted();
    return absl::OkStatus();
  }
  absl::Status StreamWait(const Stream &stream) override {
    return done_.StreamWait(stream);
  }
  absl::StatusOr<bool> Poll() override {
    if (!done_.Query()) return false;
    MarkCompleted();
    return true;
  }
  uint64_t first_sequence_number() const override { return first_; }

 private:
  void MarkCompleted() {
    for (uint64_t s = first_; s <= last_; ++s) recorder_->MarkCompleted(s);
  }
  Event done_;
  uint64_t first_, last_;
  std::shared_ptr<RecentCollectives> recorder_;
};

class LocalCommunicator : public Communicator {
 public:
  LocalCommunicator(const Device &device, double timeout_seconds)
      : Communicator(0, 1, 0, device, timeout_seconds) {}
  const char *backend_name() const override { return "local"; }

 protected:
  bool AcceptsDevice(const Device &device) const override {
    return device.is_cpu() || device == this->device();
  }

  absl::StatusOr<Work> Issue(const std::vector<CollectiveOp> &ops,
                             const std::vector<uint64_t> &sequence_numbers,
                             const Stream &stream) override {
    return IssueWithinOneRank(ops, sequence_numbers, stream, recorder());
  }

  absl::Status BarrierImpl(uint64_t) override { return absl::OkStatus(); }

  // Every color names this one rank's world.
  absl::StatusOr<std::unique_ptr<Communicator>> SplitImpl(int, int, int,
                                                          int) override {
    return CreateLocalCommunicator(device(), timeout_seconds());
  }
};

}  // namespace

absl::StatusOr<Work> IssueWithinOneRank(
    const std::vector<CollectiveOp> &ops,
    const std::vector<uint64_t> &sequence_numbers, const Stream &stream,
    std::shared_ptr<RecentCollectives> recorder) {
  for (const CollectiveOp &op : ops) {
    if (op.input.data() != op.output.data()) {
      ZE_RETURN_IF_ERROR(Copy(op.input, op.output, stream));
    }
  }
  Event done;
  if (stream.device().is_cuda()) {
    ZE_ASSIGN_OR_RETURN(done, Event::Create(stream.device()));
    ZE_RETURN_IF_ERROR(done.Record(stream));
  }
  auto work =
      std::make_shared<LocalWork>(done, sequence_numbers.front(),
                                  sequence_numbers.back(), std::move(recorder));
  if (stream.device().is_cpu()) ZE_RETURN_IF_ERROR(work->Wait());
  return Work(work);
}

std::unique_ptr<Communicator> CreateLocalCommunicator(const Device &device,
                                                      double timeout_seconds) {
  return std::unique_ptr<Communicator>(
      new LocalCommunicator(device, timeout_seconds));
}

}  // namespace comm
}  // namespace ze
