#include "zero/fetch_schedule.h"

#include <algorithm>
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
  PlayOnDemand(schedule, {0, 1, 2, 2, 1, 0});
  schedule.BeginMicroStep();
  schedule.OnRequest(0);
  schedule.OnRequest(1);
  schedule.OnRequest(2);
  // Position 3: bucket 2 is next requested at 3 (distance 0), bucket 1 at
  // 4 (distance 1), bucket 0 at 5 (distance 2): all within 3.
  EXPECT_TRUE(schedule.ShouldKeep(2));
  EXPECT_TRUE(schedule.ShouldKeep(1));
  EXPECT_TRUE(schedule.ShouldKeep(0));

  FetchSchedule near(Options(0, 1000, 2), {10, 10, 10}, {});
  PlayOnDemand(near, {0, 1, 2, 2, 1, 0});
  near.BeginMicroStep();
  near.OnRequest(0);
  near.OnRequest(1);
  near.OnRequest(2);
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

// The scheduling code of engine/stage3.cc before FetchSchedule existed
// (ffdde73), transcribed with its tensors and collectives replaced by a
// log: FetchSchedule, driven as zero/stage3.cc drives it, must match it
// decision for decision.
class LegacyStage3 {
 public:
  LegacyStage3(const FetchScheduleOptions& options,
               const std::vector<int64_t>& sizes,
               const std::vector<bool>& persistent,
               std::vector<std::string>* log)
      : options_(options), buckets_(sizes.size()), log_(log) {
    for (size_t b = 0; b < sizes.size(); ++b) {
      buckets_[b].padded_elements = sizes[b];
      buckets_[b].persistent = persistent[b];
    }
  }

  void BeginMicroStep() {
    position_ = 0;
    observed_.clear();
    order_changed_ = false;
    following_ = trace_valid_;
    prefetching_ = following_ && options_.prefetch_bucket_elements > 0;
  }

  void Acquire(const std::vector<int>& entry, bool evaluating) {
    if (evaluating) {
      for (int b : entry) {
        if (!buckets_[b].gathered) {
          MakeRoom(buckets_[b].padded_elements);
          IssueGather(b);
        }
        ++buckets_[b].users;
      }
      return;
    }
    for (int b : entry) {
      if (following_ &&
          (position_ >= trace_.size() || trace_[position_] != b)) {
        log_->push_back(absl::StrCat("diverged at ", position_));
        following_ = false;
        prefetching_ = false;
        order_changed_ = true;
      }
      ++position_;
      observed_.push_back(b);
      if (!buckets_[b].gathered) {
        MakeRoom(buckets_[b].padded_elements);
        IssueGather(b);
      }
      ++buckets_[b].users;
    }
    if (prefetching_) Prefetch();
  }

  void Release(const std::vector<int>& entry, bool evaluating) {
    for (int b : entry) {
      Bucket& bucket = buckets_[b];
      if (bucket.users > 0) --bucket.users;
      if (bucket.users == 0 && !bucket.persistent) {
        if (!evaluating && ShouldKeep(b)) {
          log_->push_back(absl::StrCat("keep ", b));
          continue;
        }
        FreeGathered(b);
      }
    }
  }

  void EndBackward() {
    for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) {
      if (buckets_[b].users == 0 && !buckets_[b].persistent) {
        FreeGathered(b);
      }
    }
    following_ = false;
    prefetching_ = false;
    if (!trace_valid_ || order_changed_ || observed_ != trace_) {
      if (trace_valid_) {
        log_->push_back(absl::StrCat("new record of ", observed_.size()));
      }
      trace_ = observed_;
      trace_valid_ = true;
    }
  }

  void EndEval() {
    for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) {
      buckets_[b].users = 0;
      if (!buckets_[b].persistent) FreeGathered(b);
    }
  }

  int64_t peak() const { return peak_live_elements_; }
  int64_t live() const { return live_elements_; }

 private:
  struct Bucket {
    int64_t padded_elements = 0;
    bool persistent = false;
    bool gathered = false;
    int users = 0;
  };

  void IssueGather(int b) {
    buckets_[b].gathered = true;
    log_->push_back(absl::StrCat("gather ", b));
    live_elements_ += buckets_[b].padded_elements;
    peak_live_elements_ = std::max(peak_live_elements_, live_elements_);
  }
  void FreeGathered(int b) {
    if (!buckets_[b].gathered) return;
    buckets_[b].gathered = false;
    log_->push_back(absl::StrCat("free ", b));
    live_elements_ -= buckets_[b].padded_elements;
  }
  size_t NextUse(int b) const {
    if (!following_) return trace_.size();
    for (size_t q = position_; q < trace_.size(); ++q) {
      if (trace_[q] == b) return q;
    }
    return trace_.size();
  }
  bool ShouldKeep(int b) const {
    const int64_t distance = options_.max_reuse_distance;
    if (!following_ || distance <= 0) return false;
    if (live_elements_ > options_.max_live_elements) return false;
    const size_t next = NextUse(b);
    return next < trace_.size() &&
           static_cast<int64_t>(next - position_) < distance;
  }
  void MakeRoom(int64_t incoming) {
    const int64_t max_live = options_.max_live_elements;
    while (live_elements_ + incoming > max_live) {
      int victim = -1;
      size_t victim_next = 0;
      for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) {
        const Bucket& bucket = buckets_[b];
        if (!bucket.gathered || bucket.persistent || bucket.users > 0) {
          continue;
        }
        const size_t next = NextUse(b);
        if (victim < 0 || next >= victim_next) {
          victim = b;
          victim_next = next;
        }
      }
      if (victim < 0) break;
      log_->push_back(absl::StrCat("evict ", victim));
      FreeGathered(victim);
    }
  }
  void Prefetch() {
    int64_t budget = options_.prefetch_bucket_elements;
    const int64_t max_live = options_.max_live_elements;
    for (size_t q = position_; q < trace_.size(); ++q) {
      const int b = trace_[q];
      if (buckets_[b].gathered) continue;
      const int64_t elements = buckets_[b].padded_elements;
      if (elements > budget || live_elements_ + elements > max_live) break;
      budget -= elements;
      IssueGather(b);
    }
  }

  FetchScheduleOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<std::string>* log_;
  std::vector<int> trace_;
  std::vector<int> observed_;
  bool trace_valid_ = false;
  bool following_ = false;
  bool prefetching_ = false;
  bool order_changed_ = false;
  size_t position_ = 0;
  int64_t live_elements_ = 0;
  int64_t peak_live_elements_ = 0;
};

// zero/stage3.cc's use of FetchSchedule (Acquire, Release, MakeRoom,
// Prefetch, OnEndBackward, OnEndEval), with the same log.
class ScheduledStage3 {
 public:
  ScheduledStage3(const FetchScheduleOptions& options,
                  const std::vector<int64_t>& sizes,
                  const std::vector<bool>& persistent,
                  std::vector<std::string>* log)
      : schedule_(options, sizes, persistent),
        sizes_(sizes),
        persistent_(persistent),
        users_(sizes.size(), 0),
        log_(log) {}

  void BeginMicroStep() { schedule_.BeginMicroStep(); }

  void Acquire(const std::vector<int>& entry, bool evaluating) {
    for (int b : entry) {
      if (!evaluating && schedule_.OnRequest(b)) {
        log_->push_back(absl::StrCat("diverged at ", schedule_.position() - 1));
      }
      if (!schedule_.gathered(b)) {
        MakeRoom(sizes_[b]);
        Gather(b);
      }
      ++users_[b];
    }
    if (evaluating) return;
    for (int b : schedule_.PrefetchCandidates()) {
      Gather(b);
      ++prefetches_;
    }
  }

  void Release(const std::vector<int>& entry, bool evaluating) {
    for (int b : entry) {
      if (users_[b] > 0) --users_[b];
      if (users_[b] == 0 && !persistent_[b]) {
        if (!evaluating && schedule_.ShouldKeep(b)) {
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
    if (schedule_.EndMicroStep()) {
      log_->push_back(
          absl::StrCat("new record of ", schedule_.record().size()));
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
  void MakeRoom(int64_t incoming) {
    while (schedule_.OverLiveLimit(incoming)) {
      const int victim =
          schedule_.EvictionVictim([this](int b) { return users_[b] > 0; });
      if (victim < 0) break;
      log_->push_back(absl::StrCat("evict ", victim));
      Free(victim);
    }
  }
  void Gather(int b) {
    log_->push_back(absl::StrCat("gather ", b));
    schedule_.OnGathered(b);
  }
  void Free(int b) {
    if (!schedule_.gathered(b)) return;
    log_->push_back(absl::StrCat("free ", b));
    schedule_.OnFreed(b);
  }

  FetchSchedule schedule_;
  std::vector<int64_t> sizes_;
  std::vector<bool> persistent_;
  std::vector<int> users_;
  std::vector<std::string>* log_;
  int prefetches_ = 0;
};

// Random models (bucket sizes, persistence, modules reading one or two
// buckets, tied ones), options and micro-steps (mostly repeating, sometimes
// reordered, shortened or lengthened, with nested module calls;
// evaluations before, between forward and backward, some failing midway):
// both log the same gathers, frees, keeps, evictions, divergences and
// records, and reach the same live and peak elements.
TEST(FetchScheduleTest, DecidesExactlyAsTheStage3CodeItReplaced) {
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
    std::vector<std::string> legacy_log, new_log;
    LegacyStage3 legacy(options, sizes, persistent, &legacy_log);
    ScheduledStage3 scheduled(options, sizes, persistent, &new_log);
    auto both_acquire = [&](int e, bool evaluating) {
      legacy.Acquire(entries[e], evaluating);
      scheduled.Acquire(entries[e], evaluating);
    };
    auto both_release = [&](int e, bool evaluating) {
      legacy.Release(entries[e], evaluating);
      scheduled.Release(entries[e], evaluating);
    };
    auto evaluation = [&] {
      const int outer = pick(static_cast<int>(entries.size()));
      const int inner = pick(static_cast<int>(entries.size()));
      both_acquire(outer, true);
      both_acquire(inner, true);
      both_release(inner, true);
      if (pick(4) != 0) both_release(outer, true);  // else a failed one
      legacy.EndEval();
      scheduled.EndEval();
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
      legacy.BeginMicroStep();
      scheduled.BeginMicroStep();
      for (size_t i = 0; i < program.size(); ++i) {
        if (i + 1 < program.size() && pick(4) == 0) {  // a nested call
          both_acquire(program[i], false);
          both_acquire(program[i + 1], false);
          both_release(program[i + 1], false);
          both_release(program[i], false);
          ++i;
          continue;
        }
        both_acquire(program[i], false);
        both_release(program[i], false);
      }
      if (pick(5) == 0) evaluation();
      for (size_t i = program.size(); i-- > 0;) {  // backward
        both_acquire(program[i], false);
        both_release(program[i], false);
      }
      legacy.EndBackward();
      scheduled.EndBackward();
      ASSERT_EQ(new_log, legacy_log) << "step " << step;
      ASSERT_EQ(scheduled.live(), legacy.live());
      ASSERT_EQ(scheduled.peak(), legacy.peak());
    }
    for (const std::string& line : new_log) {
      divergences += line.rfind("diverged", 0) == 0;
      keeps += line.rfind("keep", 0) == 0;
      evictions += line.rfind("evict", 0) == 0;
    }
    prefetched += scheduled.prefetches();
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
