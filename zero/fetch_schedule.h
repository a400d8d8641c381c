// FetchSchedule: stage 3's parameter-fetch decisions, as a pure object (no
// tensors, no communicator, no model), so they are unit-tested alone and
// every rank, fed the same events, decides alike.
//
// Buckets (one per module's parameters, zero/stage3.h) are identified by
// index and known by their padded element count. The caller reports what
// happens; the schedule answers what to do:
//
//   events                          decisions
//   BeginMicroStep                  PrefetchCandidates: gathers to issue ahead
//   OnRequest(b)  (training only)   ShouldKeep(b): keep a bucket its last
//   OnGathered(b) / OnFreed(b)        user released, for reuse soon
//   EndMicroStep                    EvictionVictim: what to free to make room
//
// Phases of a micro-step (replacing four booleans):
//
//   kIdle ----BeginMicroStep----> kRecording   (no record yet)
//                            \--> kFollowing   (a record exists)
//   kFollowing --a request differs from the record--> kDiverged
//   kRecording, kFollowing, kDiverged --EndMicroStep--> kIdle
//
// The record is the sequence of bucket requests of a micro-step (forward and
// backward, a bucket once per request, so a tied table appears twice).
// EndMicroStep adopts the micro-step's requests as the new record when
// there was none, when the order diverged, or when it ended short of (or
// past) the record.
//
// Several paths: one record is kept per first request (up to
// kMaxRecords, the least recently used replaced), and a micro-step's first
// request picks the record that starts with it. A model whose micro-steps
// take a few paths that start at different modules (a pipeline rank's
// several stages under the interleaved schedule, pipeline/executor.h: each
// micro-step is one stage's forward and backward) follows each path's own
// record instead of diverging at every change of path. A first request no
// record starts with diverges (as a changed order does) and, at
// EndMicroStep, adds its path's record. record() is the record in use.
//
// kFollowing: requests so far match the record. Then
//   - prefetch: after each request, the record's next buckets that are not
//     gathered are issued, while they fit in stage3_prefetch_bucket_size
//     elements (the budget, per request) and stage3_max_live_parameters
//     (live elements); the first that does not fit ends the list. Off when
//     the budget is 0.
//   - reuse: a bucket whose last user released it is kept gathered when the
//     record requests it again within stage3_max_reuse_distance requests of
//     the current position and live elements are within the live limit.
//     When the caller says the next micro-step follows with the same
//     weights (set_next_micro_step_follows: gradient accumulation before its
//     boundary), the record's requests of the next micro-step count too, at
//     their distance past this one's end: the first layers, released last
//     in backward, stay for the next forward.
// kRecording, kDiverged and kIdle: on demand only; nothing is kept.
//
// Live limit: before an on-demand gather that would take the live elements
// past stage3_max_live_parameters, unused gathered buckets are freed one at
// a time, the one the record needs farthest ahead first (Belady; a bucket
// not needed again, or any bucket outside kFollowing, counts as farthest;
// ties go to the highest index). Persistent buckets are never evicted.
//
// Not thread-safe; one per Stage3.
#ifndef ZE_ZERO_FETCH_SCHEDULE_H_
#define ZE_ZERO_FETCH_SCHEDULE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace ze {
namespace zero {

struct FetchScheduleOptions {
  int64_t prefetch_bucket_elements = 0;  // stage3_prefetch_bucket_size
  int64_t max_live_elements = 0;         // stage3_max_live_parameters
  int64_t max_reuse_distance = 0;  // stage3_max_reuse_distance, in requests
};

class FetchSchedule {
 public:
  enum class Phase { kIdle, kRecording, kFollowing, kDiverged };

  // bucket_elements[b]: bucket b's padded size; persistent[b]: never
  // evicted (stage3_param_persistence_threshold).
  FetchSchedule(const FetchScheduleOptions& options,
                std::vector<int64_t> bucket_elements,
                std::vector<bool> persistent);

  // Records kept, one per first request.
  static constexpr int kMaxRecords = 16;

  Phase phase() const { return phase_; }
  bool has_record() const { return !records_.empty(); }
  // The record in use: the one the current (or last) micro-step's first
  // request picked; empty without records.
  const std::vector<int>& record() const {
    return active_ < 0 ? empty_ : records_[active_].requests;
  }
  // Requests so far in this micro-step.
  size_t position() const { return position_; }

  // A training micro-step begins (its first forward request is next).
  void BeginMicroStep();
  // A training module call requests bucket `b` (evaluation requests are not
  // reported). The micro-step's first request picks the record starting
  // with it. Returns true when this request is the first of the
  // micro-step to depart from the records (kFollowing -> kDiverged), so the
  // caller can say so.
  bool OnRequest(int bucket);
  // The micro-step's last backward is done. Returns true when a record
  // existed and the micro-step's order was adopted as a new or different
  // one (the caller logs it).
  bool EndMicroStep();

  // Residency, for every gather and free (evaluation's included).
  void OnGathered(int bucket);
  void OnFreed(int bucket);
  bool gathered(int bucket) const { return gathered_[bucket]; }
  int64_t live_elements() const { return live_elements_; }
  int64_t peak_live_elements() const { return peak_live_elements_; }

  // The buckets to gather ahead now, in order (kFollowing with a budget).
  std::vector<int> PrefetchCandidates() const;
  // Up to `count` distinct buckets the record requests next (from this
  // request on, then the next micro-step's first ones), skipping gathered
  // ones and those `wanted` refuses, in order; empty unless kFollowing.
  // What offload_param nvme reads ahead from its swap file
  // (zero::PartitionState::ReadAheadWeights).
  std::vector<int> UpcomingBuckets(
      size_t count, const std::function<bool(int)>& wanted) const;
  // Whether the bucket its last user just released stays gathered.
  bool ShouldKeep(int bucket) const;
  // Whether the next micro-step repeats the record with the same weights
  // (not after an optimizer step): its requests count for reuse and
  // eviction. Off by default; the caller sets it for each micro-step.
  void set_next_micro_step_follows(bool follows) { next_follows_ = follows; }
  bool next_micro_step_follows() const { return next_follows_; }
  // Whether `incoming` more elements would exceed the live limit.
  bool OverLiveLimit(int64_t incoming) const {
    return live_elements_ + incoming > options_.max_live_elements;
  }
  // The gathered bucket to free first to make room, among those `in_use`
  // says are unused and that are not persistent; -1 when there is none.
  int EvictionVictim(const std::function<bool(int)>& in_use) const;

 private:
  // The record's next request of `bucket` at or after position_; with
  // next_follows_, else the next micro-step's first, as record().size() +
  // its index; Never() when none or not kFollowing.
  size_t NextUse(int bucket) const;
  size_t Never() const { return 2 * record().size(); }
  // The record starting with `first` (-1: an empty micro-step), or -1.
  int FindRecord(int first) const;

  FetchScheduleOptions options_;
  std::vector<int64_t> bucket_elements_;
  std::vector<bool> persistent_;
  struct Record {
    std::vector<int> requests;  // the recorded request order
    int64_t last_used = 0;      // micro-step count at its last use
  };
  Phase phase_ = Phase::kIdle;
  bool next_follows_ = false;
  std::vector<Record> records_;
  int active_ = -1;  // index in records_ of record()
  int64_t micro_steps_ = 0;
  std::vector<int> empty_;
  std::vector<int> observed_;  // this micro-step's requests
  size_t position_ = 0;
  std::vector<bool> gathered_;
  int64_t live_elements_ = 0;
  int64_t peak_live_elements_ = 0;
};

}  // namespace zero
}  // namespace ze

#endif  // ZE_ZERO_FETCH_SCHEDULE_H_
