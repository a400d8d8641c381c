#include "zero/fetch_schedule.h"

#include <vector>

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

}  // namespace
}  // namespace zero
}  // namespace ze
