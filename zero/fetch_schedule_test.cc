#include "zero/fetch_schedule.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ze {
namespace zero {
namespace {

using Phase = FetchSchedule::Phase;

FetchScheduleOptions Options(int64_t prefetch, int64_t max_live,
                             int64_t reuse) {
  FetchScheduleOptions options;
  options.prefetch_bucket_elements = prefetch;
  options.max_live_elements = max_live;
  options.max_reuse_distance = reuse;
  return options;
}

// Plays one micro-step of `requests`, gathering each on demand (as a caller
// that never prefetches would), and ends it.
void PlayOnDemand(FetchSchedule& schedule, const std::vector<int>& requests) {
  schedule.BeginMicroStep();
  for (int bucket : requests) {
    schedule.OnRequest(bucket);
    if (!schedule.gathered(bucket)) schedule.OnGathered(bucket);
    schedule.OnFreed(bucket);
  }
  schedule.EndMicroStep();
}

// Records `record` (a micro-step on demand), then begins the next one and
// requests `requests` of it.
void RecordThenRequest(FetchSchedule& schedule, const std::vector<int>& record,
                       const std::vector<int>& requests) {
  PlayOnDemand(schedule, record);
  schedule.BeginMicroStep();
  for (int bucket : requests) schedule.OnRequest(bucket);
}

TEST(FetchScheduleTest, FirstMicroStepRecords) {
  FetchSchedule schedule(Options(100, 1000, 0), {10, 10, 10}, {});
  EXPECT_EQ(schedule.phase(), Phase::kIdle);
  EXPECT_FALSE(schedule.has_record());
  schedule.BeginMicroStep();
  EXPECT_EQ(schedule.phase(), Phase::kRecording);
  for (int bucket : {0, 1, 2, 2, 1, 0}) {
    EXPECT_FALSE(schedule.OnRequest(bucket));
    // Nothing to prefetch or keep without a record.
    EXPECT_TRUE(schedule.PrefetchCandidates().empty());
    EXPECT_FALSE(schedule.ShouldKeep(bucket));
  }
  EXPECT_FALSE(schedule.EndMicroStep());  // there was no record to replace
  EXPECT_EQ(schedule.phase(), Phase::kIdle);
  EXPECT_TRUE(schedule.has_record());
  EXPECT_EQ(schedule.record(), (std::vector<int>{0, 1, 2, 2, 1, 0}));
}

// What offload_param nvme reads ahead: the record's next distinct buckets
// from the current request on, then (wrapping) the next micro-step's first,
// skipping gathered ones and those the caller does not want, at most
// `count`; nothing without a record to follow.
TEST(FetchScheduleTest, UpcomingBucketsFollowTheRecord) {
  const auto all = [](int) { return true; };
  FetchSchedule schedule(Options(0, 1000, 0), {10, 10, 10, 10, 10}, {});
  schedule.BeginMicroStep();
  schedule.OnRequest(0);
  EXPECT_TRUE(schedule.UpcomingBuckets(3, all).empty());  // recording
  schedule.EndMicroStep();
  RecordThenRequest(schedule, {0, 1, 2, 3, 4, 3, 2, 1, 0}, {0, 1});
  schedule.OnGathered(1);
  // Position 2: buckets 2, 3, 4 next (1 is gathered).
  EXPECT_EQ(schedule.UpcomingBuckets(3, all), (std::vector<int>{2, 3, 4}));
  EXPECT_EQ(schedule.UpcomingBuckets(1, all), (std::vector<int>{2}));
  EXPECT_EQ(schedule.UpcomingBuckets(3, [](int b) { return b != 3; }),
            (std::vector<int>{2, 4, 0}));
  // Near the end of the record the next micro-step's first requests follow.
  for (int bucket : {2, 3, 4, 3, 2}) schedule.OnRequest(bucket);
  EXPECT_EQ(schedule.UpcomingBuckets(4, all), (std::vector<int>{0, 2, 3, 4}));
  EXPECT_EQ(schedule.UpcomingBuckets(0, all), std::vector<int>{});
  // A departure from the record: nothing to read ahead by.
  schedule.OnRequest(4);
  EXPECT_EQ(schedule.phase(), Phase::kDiverged);
  EXPECT_TRUE(schedule.UpcomingBuckets(3, all).empty());
}

TEST(FetchScheduleTest, FollowsAndPrefetchesWithinBudgetAndLiveLimit) {
  // Buckets of 10, 20, 30, 40 elements; budget 50 per request.
  FetchSchedule schedule(Options(50, 1000, 0), {10, 20, 30, 40}, {});
  PlayOnDemand(schedule, {0, 1, 2, 3});
  schedule.BeginMicroStep();
  EXPECT_EQ(schedule.phase(), Phase::kFollowing);
  EXPECT_FALSE(schedule.OnRequest(0));
  schedule.OnGathered(0);
  // After request 0: 20 (bucket 1) + 30 (bucket 2) = 50 fit, 40 does not.
  EXPECT_EQ(schedule.PrefetchCandidates(), (std::vector<int>{1, 2}));
  schedule.OnGathered(1);
  schedule.OnGathered(2);
  EXPECT_EQ(schedule.live_elements(), 60);
  EXPECT_FALSE(schedule.OnRequest(1));
  // Bucket 2 is gathered already; bucket 3 (40) fits the budget.
  EXPECT_EQ(schedule.PrefetchCandidates(), (std::vector<int>{3}));

  // The live limit stops the list too: with 60 live and a limit of 90,
  // bucket 3 (40) would pass it.
  FetchSchedule limited(Options(50, 90, 0), {10, 20, 30, 40}, {});
  PlayOnDemand(limited, {0, 1, 2, 3});
  limited.BeginMicroStep();
  limited.OnRequest(0);
  limited.OnGathered(0);
  limited.OnGathered(1);
  limited.OnGathered(2);
  limited.OnRequest(1);
  EXPECT_TRUE(limited.PrefetchCandidates().empty());
  EXPECT_EQ(limited.peak_live_elements(), 60);
}

TEST(FetchScheduleTest, BucketLargerThanTheBudgetEndsTheList) {
  FetchSchedule schedule(Options(25, 1000, 0), {10, 30, 5}, {});
  PlayOnDemand(schedule, {0, 1, 2});
  schedule.BeginMicroStep();
  schedule.OnRequest(0);
  schedule.OnGathered(0);
  // Bucket 1 (30) exceeds the budget: prefetching stops there, even though
  // bucket 2 (5) would fit behind it.
  EXPECT_TRUE(schedule.PrefetchCandidates().empty());
}

TEST(FetchScheduleTest, ZeroBudgetPrefetchesNothing) {
  FetchSchedule schedule(Options(0, 1000, 0), {10, 10}, {});
  PlayOnDemand(schedule, {0, 1});
  schedule.BeginMicroStep();
  EXPECT_EQ(schedule.phase(), Phase::kFollowing);
  schedule.OnRequest(0);
  EXPECT_TRUE(schedule.PrefetchCandidates().empty());
}

TEST(FetchScheduleTest, ReuseDistanceKeepsOnlyBucketsNeededSoon) {
  // Record: 0 1 2 2 1 0 (forward then backward).
  FetchSchedule schedule(Options(0, 1000, 3), {10, 10, 10}, {});
  RecordThenRequest(schedule, {0, 1, 2, 2, 1, 0}, {0, 1, 2});
  // Position 3: bucket 2 is next requested at 3 (distance 0), bucket 1 at
  // 4 (distance 1), bucket 0 at 5 (distance 2): all within 3.
  EXPECT_TRUE(schedule.ShouldKeep(2));
  EXPECT_TRUE(schedule.ShouldKeep(1));
  EXPECT_TRUE(schedule.ShouldKeep(0));

  FetchSchedule near(Options(0, 1000, 2), {10, 10, 10}, {});
  RecordThenRequest(near, {0, 1, 2, 2, 1, 0}, {0, 1, 2});
  EXPECT_TRUE(near.ShouldKeep(2));
  EXPECT_TRUE(near.ShouldKeep(1));
  EXPECT_FALSE(near.ShouldKeep(0));  // distance 2 is not below 2
  near.OnRequest(2);
  near.OnRequest(1);
  near.OnRequest(0);
  EXPECT_FALSE(near.ShouldKeep(0));  // not needed again this micro-step

  // Over the live limit nothing is kept.
  FetchSchedule full(Options(0, 15, 3), {10, 10, 10}, {});
  PlayOnDemand(full, {0, 1, 2, 2, 1, 0});
  full.BeginMicroStep();
  full.OnRequest(0);
  full.OnGathered(0);
  full.OnGathered(1);
  EXPECT_FALSE(full.ShouldKeep(0));
}

TEST(FetchScheduleTest, EvictsTheBucketNeededFarthestAheadFirst) {
  // Record 0 1 2 3 0 1 2 3; at position 1, bucket 1 is next needed at 1,
  // 2 at 2, 3 at 3, 0 at 4.
  FetchSchedule schedule(Options(0, 1000, 0), {10, 10, 10, 10}, {});
  PlayOnDemand(schedule, {0, 1, 2, 3, 0, 1, 2, 3});
  schedule.BeginMicroStep();
  schedule.OnRequest(0);
  for (int bucket : {0, 1, 2, 3}) schedule.OnGathered(bucket);
  auto none_in_use = [](int) { return false; };
  EXPECT_EQ(schedule.EvictionVictim(none_in_use), 0);
  // In use is never chosen.
  EXPECT_EQ(schedule.EvictionVictim([](int b) { return b == 0; }), 3);
  // Not gathered is never chosen.
  schedule.OnFreed(0);
  EXPECT_EQ(schedule.EvictionVictim(none_in_use), 3);
  EXPECT_EQ(schedule.EvictionVictim([](int) { return true; }), -1);
}

TEST(FetchScheduleTest, EvictionTiesGoToTheHighestIndex) {
  // Outside kFollowing every bucket counts as never needed: a tie, which
  // the highest index wins.
  FetchSchedule schedule(Options(0, 1000, 0), {10, 10, 10}, {});
  for (int bucket : {0, 1, 2}) schedule.OnGathered(bucket);
  EXPECT_EQ(schedule.EvictionVictim([](int) { return false; }), 2);
  // Buckets not in the rest of the record tie as well.
  PlayOnDemand(schedule, {0});
  schedule.BeginMicroStep();
  schedule.OnRequest(0);
  EXPECT_EQ(schedule.EvictionVictim([](int) { return false; }), 2);
}

TEST(FetchScheduleTest, PersistentBucketsAreNeverEvicted) {
  FetchSchedule schedule(Options(0, 10, 0), {10, 10}, {false, true});
  schedule.OnGathered(1);
  schedule.OnGathered(0);
  EXPECT_TRUE(schedule.OverLiveLimit(10));
  EXPECT_EQ(schedule.EvictionVictim([](int) { return false; }), 0);
  schedule.OnFreed(0);
  EXPECT_EQ(schedule.EvictionVictim([](int) { return false; }), -1);
  EXPECT_FALSE(schedule.OverLiveLimit(0));
}

TEST(FetchScheduleTest, OrderChangeDivergesAndTheNewOrderIsRecorded) {
  FetchSchedule schedule(Options(100, 1000, 10), {10, 10, 10}, {});
  PlayOnDemand(schedule, {0, 1, 2});
  schedule.BeginMicroStep();
  EXPECT_FALSE(schedule.OnRequest(0));
  EXPECT_TRUE(schedule.OnRequest(2));  // the record says 1
  EXPECT_EQ(schedule.phase(), Phase::kDiverged);
  EXPECT_EQ(schedule.position(), 2u);
  // Said once; on demand for the rest of the micro-step.
  EXPECT_FALSE(schedule.OnRequest(1));
  EXPECT_TRUE(schedule.PrefetchCandidates().empty());
  EXPECT_FALSE(schedule.ShouldKeep(1));
  EXPECT_TRUE(schedule.EndMicroStep());
  EXPECT_EQ(schedule.record(), (std::vector<int>{0, 2, 1}));
  // The next micro-step follows the new record.
  schedule.BeginMicroStep();
  EXPECT_EQ(schedule.phase(), Phase::kFollowing);
  EXPECT_FALSE(schedule.OnRequest(0));
  EXPECT_EQ(schedule.PrefetchCandidates(), (std::vector<int>{2, 1}));
}

TEST(FetchScheduleTest, AShorterOrLongerMicroStepReplacesTheRecord) {
  FetchSchedule schedule(Options(0, 1000, 0), {10, 10, 10}, {});
  PlayOnDemand(schedule, {0, 1, 2});
  PlayOnDemand(schedule, {0, 1, 2});  // the same: kept, nothing said
  EXPECT_EQ(schedule.record(), (std::vector<int>{0, 1, 2}));
  schedule.BeginMicroStep();
  schedule.OnRequest(0);
  schedule.OnRequest(1);
  EXPECT_TRUE(schedule.EndMicroStep());  // ended short of the record
  EXPECT_EQ(schedule.record(), (std::vector<int>{0, 1}));
  schedule.BeginMicroStep();
  schedule.OnRequest(0);
  schedule.OnRequest(1);
  EXPECT_TRUE(schedule.OnRequest(2));  // past the record's end
  EXPECT_TRUE(schedule.EndMicroStep());
  EXPECT_EQ(schedule.record(), (std::vector<int>{0, 1, 2}));
}

// Two paths starting at different buckets (a pipeline rank's two stages
// under the interleaved schedule): once both are recorded, micro-steps of
// either follow their own record, prefetching along it, with nothing said;
// a third path is recorded beside them, and a changed order within a path
// replaces only that path's record.
TEST(FetchScheduleTest, EachFirstRequestFollowsItsOwnPath) {
  FetchSchedule schedule(Options(100, 1000, 0), {10, 10, 10, 10, 10}, {});
  PlayOnDemand(schedule, {0, 1, 1, 0});
  // A new first request: diverges from the record in use, then adds one.
  schedule.BeginMicroStep();
  EXPECT_TRUE(schedule.OnRequest(2));
  for (int bucket : {3, 3, 2}) EXPECT_FALSE(schedule.OnRequest(bucket));
  EXPECT_TRUE(schedule.EndMicroStep());
  for (int round = 0; round < 2; ++round) {
    for (const std::vector<int>& path :
         {std::vector<int>{0, 1, 1, 0}, std::vector<int>{2, 3, 3, 2}}) {
      SCOPED_TRACE(absl::StrCat("round ", round, ", path from ", path[0]));
      schedule.BeginMicroStep();
      EXPECT_EQ(schedule.phase(), Phase::kFollowing);
      EXPECT_FALSE(schedule.OnRequest(path[0]));
      schedule.OnGathered(path[0]);
      EXPECT_EQ(schedule.record(), path);
      EXPECT_EQ(schedule.PrefetchCandidates(), (std::vector<int>{path[1]}));
      schedule.OnFreed(path[0]);
      for (size_t q = 1; q < path.size(); ++q) {
        EXPECT_FALSE(schedule.OnRequest(path[q]));
      }
      EXPECT_EQ(schedule.phase(), Phase::kFollowing);
      EXPECT_FALSE(schedule.EndMicroStep());
    }
  }
  PlayOnDemand(schedule, {4, 4});
  schedule.BeginMicroStep();
  EXPECT_FALSE(schedule.OnRequest(2));
  EXPECT_TRUE(schedule.OnRequest(1));  // path 2's record says 3
  EXPECT_TRUE(schedule.EndMicroStep());
  EXPECT_EQ(schedule.record(), (std::vector<int>{2, 1}));
  for (const std::vector<int>& path :
       {std::vector<int>{0, 1, 1, 0}, std::vector<int>{4, 4}}) {
    schedule.BeginMicroStep();
    EXPECT_FALSE(schedule.OnRequest(path[0]));
    EXPECT_EQ(schedule.record(), path);
  }
}

TEST(FetchScheduleTest, TiedBucketRequestedTwicePrefetchesOnce) {
  // A tied table (bucket 0) is requested by the embedding and the head.
  FetchSchedule schedule(Options(100, 1000, 0), {10, 10, 10}, {});
  PlayOnDemand(schedule, {0, 1, 0, 2});
  schedule.BeginMicroStep();
  schedule.OnRequest(0);
  // 0 is gathered (kept by the caller), so only 1 and 2 are issued, once.
  schedule.OnGathered(0);
  EXPECT_EQ(schedule.PrefetchCandidates(), (std::vector<int>{1, 2}));
}

// zero/stage3.cc's use of FetchSchedule (Acquire, Release, MakeRoom,
// Prefetch, OnEndBackward, OnEndEval), logging every decision and checking
// the header's contract at each one (gtest failures name the trial).
class ScheduledStage3 {
 public:
  ScheduledStage3(const FetchScheduleOptions& options,
                  const std::vector<int64_t>& sizes,
                  const std::vector<bool>& persistent,
                  std::vector<std::string>* log)
      : options_(options),
        schedule_(options, sizes, persistent),
        sizes_(sizes),
        persistent_(persistent),
        users_(sizes.size(), 0),
        log_(log) {}

  void BeginMicroStep() {
    schedule_.BeginMicroStep();
    requests_.clear();
  }

  void Acquire(const std::vector<int>& entry, bool evaluating) {
    for (int b : entry) {
      if (!evaluating) {
        requests_.push_back(b);
        if (schedule_.OnRequest(b)) {
          log_->push_back(
              absl::StrCat("diverged at ", schedule_.position() - 1));
        }
      }
      if (!schedule_.gathered(b)) {
        MakeRoom(sizes_[b]);
        Gather(b);
      }
      ++users_[b];
    }
    // Every bucket is gathered before its module uses it.
    for (int b : entry) EXPECT_TRUE(schedule_.gathered(b)) << "bucket " << b;
    if (evaluating) return;
    const std::vector<int> candidates = schedule_.PrefetchCandidates();
    CheckPrefetch(candidates);
    for (int b : candidates) {
      Gather(b);
      ++prefetches_;
    }
  }

  void Release(const std::vector<int>& entry, bool evaluating) {
    for (int b : entry) {
      if (users_[b] > 0) --users_[b];
      if (users_[b] == 0 && !persistent_[b]) {
        if (!evaluating && schedule_.ShouldKeep(b)) {
          CheckKeep(b);
          log_->push_back(absl::StrCat("keep ", b));
          continue;
        }
        Free(b);
      }
    }
  }

  void EndBackward() {
    for (int b = 0; b < static_cast<int>(sizes_.size()); ++b) {
      if (users_[b] == 0 && !persistent_[b]) Free(b);
    }
    const bool had_record = schedule_.has_record();
    const std::vector<int> old_record = schedule_.record();
    if (schedule_.EndMicroStep()) {
      log_->push_back(
          absl::StrCat("new record of ", schedule_.record().size()));
    }
    // The record is the last micro-step's requests when it was adopted,
    // else unchanged because the micro-step followed it exactly.
    EXPECT_EQ(schedule_.phase(), Phase::kIdle);
    EXPECT_TRUE(schedule_.has_record());
    EXPECT_EQ(schedule_.record(), requests_);
    if (had_record && old_record != requests_) {
      EXPECT_EQ(log_->back().rfind("new record", 0), 0u);
    }
  }

  void EndEval() {
    for (int b = 0; b < static_cast<int>(sizes_.size()); ++b) {
      users_[b] = 0;
      if (!persistent_[b]) Free(b);
    }
  }

  int64_t peak() const { return schedule_.peak_live_elements(); }
  int64_t live() const { return schedule_.live_elements(); }
  int prefetches() const { return prefetches_; }

 private:
  // The record's next request of `b` from the current position, or -1.
  int64_t NextUse(int b) const {
    const std::vector<int>& record = schedule_.record();
    for (size_t q = schedule_.position(); q < record.size(); ++q) {
      if (record[q] == b) return static_cast<int64_t>(q);
    }
    return -1;
  }

  // Prefetch: only while following a record with a budget; never a gathered
  // bucket or one twice; only buckets the record requests ahead; within the
  // per-request budget and the live limit.
  void CheckPrefetch(const std::vector<int>& candidates) const {
    if (schedule_.phase() != Phase::kFollowing ||
        options_.prefetch_bucket_elements <= 0) {
      EXPECT_TRUE(candidates.empty());
      return;
    }
    int64_t total = 0;
    std::vector<bool> seen(sizes_.size(), false);
    for (int b : candidates) {
      EXPECT_FALSE(schedule_.gathered(b)) << "prefetch of gathered " << b;
      EXPECT_FALSE(seen[b]) << "prefetch twice of " << b;
      EXPECT_GE(NextUse(b), 0) << "prefetch of unneeded " << b;
      seen[b] = true;
      total += sizes_[b];
    }
    EXPECT_LE(total, options_.prefetch_bucket_elements);
    // (Live may already be past the limit when a module needs more; then
    // nothing is prefetched.)
    if (!candidates.empty()) {
      EXPECT_LE(schedule_.live_elements() + total, options_.max_live_elements);
    }
  }

  // Reuse: only while following, within the live limit, and when the
  // record requests the bucket again within max_reuse_distance requests.
  void CheckKeep(int b) const {
    EXPECT_EQ(schedule_.phase(), Phase::kFollowing);
    EXPECT_LE(schedule_.live_elements(), options_.max_live_elements);
    const int64_t next = NextUse(b);
    EXPECT_GE(next, 0) << "kept " << b << " not needed again";
    EXPECT_LT(next - static_cast<int64_t>(schedule_.position()),
              options_.max_reuse_distance)
        << "kept " << b;
  }

  void MakeRoom(int64_t incoming) {
    while (schedule_.OverLiveLimit(incoming)) {
      const int victim =
          schedule_.EvictionVictim([this](int b) { return users_[b] > 0; });
      if (victim < 0) break;
      // The victim is gathered, unused and not persistent, and no other
      // such bucket is needed later than it (Belady; never-needed-again
      // counts as farthest, ties to the highest index).
      EXPECT_TRUE(schedule_.gathered(victim));
      EXPECT_FALSE(persistent_[victim]) << "evicted persistent " << victim;
      EXPECT_EQ(users_[victim], 0) << "evicted in-use " << victim;
      const bool following = schedule_.phase() == Phase::kFollowing;
      auto distance = [&](int b) {
        const int64_t next = following ? NextUse(b) : -1;
        return next < 0 ? INT64_MAX : next;
      };
      for (int b = 0; b < static_cast<int>(sizes_.size()); ++b) {
        if (b == victim || !schedule_.gathered(b) || persistent_[b] ||
            users_[b] > 0) {
          continue;
        }
        EXPECT_TRUE(distance(b) < distance(victim) ||
                    (distance(b) == distance(victim) && b < victim))
            << "evicted " << victim << " before " << b;
      }
      log_->push_back(absl::StrCat("evict ", victim));
      Free(victim);
    }
    // Past the live limit only when nothing more can be freed: the rest is
    // in use or persistent (a module larger than the limit still runs).
    if (schedule_.OverLiveLimit(incoming)) {
      for (int b = 0; b < static_cast<int>(sizes_.size()); ++b) {
        if (schedule_.gathered(b)) {
          EXPECT_TRUE(persistent_[b] || users_[b] > 0)
              << "over the live limit with " << b << " freeable";
        }
      }
    }
  }
  void Gather(int b) {
    log_->push_back(absl::StrCat("gather ", b));
    schedule_.OnGathered(b);
    CheckResidency();
  }
  void Free(int b) {
    if (!schedule_.gathered(b)) return;
    log_->push_back(absl::StrCat("free ", b));
    schedule_.OnFreed(b);
    CheckResidency();
  }
  // Live elements are the gathered buckets' sizes; the peak bounds them.
  void CheckResidency() const {
    int64_t live = 0;
    for (size_t b = 0; b < sizes_.size(); ++b) {
      if (schedule_.gathered(static_cast<int>(b))) live += sizes_[b];
    }
    EXPECT_EQ(schedule_.live_elements(), live);
    EXPECT_GE(schedule_.peak_live_elements(), live);
  }

  FetchScheduleOptions options_;
  FetchSchedule schedule_;
  std::vector<int64_t> sizes_;
  std::vector<bool> persistent_;
  std::vector<int> users_;
  std::vector<int> requests_;  // this micro-step's training requests
  std::vector<std::string>* log_;
  int prefetches_ = 0;
};

// Random models (bucket sizes, persistence, modules reading one or two
// buckets, tied ones), options and micro-steps (mostly repeating, sometimes
// reordered, shortened or lengthened, with nested module calls;
// evaluations before, between forward and backward, some failing midway),
// driven as zero/stage3.cc drives the schedule: every decision keeps the
// header's contract (checked in ScheduledStage3), persistent buckets stay
// gathered once gathered, and two ranks fed the same events decide alike.
TEST(FetchScheduleTest, RandomRunsKeepTheContract) {
  constexpr int64_t kUnlimited = 1'000'000'000;
  std::mt19937 rng(20261203);
  auto pick = [&](int n) {
    return static_cast<int>(std::uniform_int_distribution<int>(0, n - 1)(rng));
  };
  const int64_t prefetch_choices[] = {0, 150, 600, kUnlimited};
  const int64_t live_choices[] = {250, 700, 1500, kUnlimited};
  const int64_t reuse_choices[] = {0, 1, 2, 4, kUnlimited};
  int divergences = 0, keeps = 0, evictions = 0, prefetched = 0;
  for (int trial = 0; trial < 400; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    const int num_buckets = 2 + pick(6);
    std::vector<int64_t> sizes(num_buckets);
    std::vector<bool> persistent(num_buckets);
    for (int b = 0; b < num_buckets; ++b) {
      sizes[b] = 1 + pick(400);
      persistent[b] = pick(6) == 0;
    }
    const FetchScheduleOptions options =
        Options(prefetch_choices[pick(4)], live_choices[pick(4)],
                reuse_choices[pick(5)]);
    std::vector<std::vector<int>> entries;
    for (int b = 0; b < num_buckets; ++b) entries.push_back({b});
    for (int extra = pick(3); extra > 0; --extra) {
      entries.push_back({pick(num_buckets), pick(num_buckets)});
    }
    std::vector<int> program;  // module (entry) calls of one forward
    for (int n = 2 + pick(6); n > 0; --n) {
      program.push_back(pick(static_cast<int>(entries.size())));
    }
    // Two ranks: the same events, so the same decisions.
    std::vector<std::string> log, other_log;
    ScheduledStage3 rank(options, sizes, persistent, &log);
    ScheduledStage3 other(options, sizes, persistent, &other_log);
    std::vector<bool> ever_gathered(num_buckets, false);
    auto acquire = [&](int e, bool evaluating) {
      rank.Acquire(entries[e], evaluating);
      other.Acquire(entries[e], evaluating);
      for (int b : entries[e]) ever_gathered[b] = true;
    };
    auto release = [&](int e, bool evaluating) {
      rank.Release(entries[e], evaluating);
      other.Release(entries[e], evaluating);
    };
    auto evaluation = [&] {
      const int outer = pick(static_cast<int>(entries.size()));
      const int inner = pick(static_cast<int>(entries.size()));
      acquire(outer, true);
      acquire(inner, true);
      release(inner, true);
      if (pick(4) != 0) release(outer, true);  // else a failed one
      rank.EndEval();
      other.EndEval();
    };
    for (int step = 0; step < 8; ++step) {
      switch (pick(6)) {  // change the module order now and then
        case 0:
          std::swap(program[pick(program.size())],
                    program[pick(program.size())]);
          break;
        case 1:
          if (program.size() > 1) program.pop_back();
          break;
        case 2:
          program.push_back(pick(static_cast<int>(entries.size())));
          break;
        default:
          break;
      }
      if (pick(5) == 0) evaluation();
      rank.BeginMicroStep();
      other.BeginMicroStep();
      for (size_t i = 0; i < program.size(); ++i) {
        if (i + 1 < program.size() && pick(4) == 0) {  // a nested call
          acquire(program[i], false);
          acquire(program[i + 1], false);
          release(program[i + 1], false);
          release(program[i], false);
          ++i;
          continue;
        }
        acquire(program[i], false);
        release(program[i], false);
      }
      if (pick(5) == 0) evaluation();
      for (size_t i = program.size(); i-- > 0;) {  // backward
        acquire(program[i], false);
        release(program[i], false);
      }
      rank.EndBackward();
      other.EndBackward();
      ASSERT_EQ(log, other_log) << "step " << step;
      ASSERT_EQ(rank.live(), other.live());
      ASSERT_EQ(rank.peak(), other.peak());
    }
    // Persistent buckets, once gathered, are never freed.
    for (int b = 0; b < num_buckets; ++b) {
      if (persistent[b] && ever_gathered[b]) {
        for (const std::string& line : log) {
          EXPECT_NE(line, absl::StrCat("free ", b)) << "persistent freed";
        }
      }
    }
    for (const std::string& line : log) {
      divergences += line.rfind("diverged", 0) == 0;
      keeps += line.rfind("keep", 0) == 0;
      evictions += line.rfind("evict", 0) == 0;
    }
    prefetched += rank.prefetches();
  }
  // The random cases reached every kind of decision.
  EXPECT_GT(divergences, 50);
  EXPECT_GT(keeps, 50);
  EXPECT_GT(evictions, 50);
  EXPECT_GT(prefetched, 50);
}

}  // namespace
}  // namespace zero
}  // namespace ze
