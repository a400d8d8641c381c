#include "offload/thread_pool.h"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ze {
namespace offload {
namespace {

TEST(ThreadPoolTest, RunsEveryTaskExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t num_tasks : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> runs(num_tasks);
      pool.ParallelFor(num_tasks, [&](int64_t i) { runs[i].fetch_add(1); });
      for (int64_t i = 0; i < num_tasks; ++i) {
        ASSERT_EQ(runs[i].load(), 1) << "task " << i << " of " << num_tasks
                                     << ", " << threads << " threads";
      }
    }
  }
}

TEST(CpuShareTest, SplitsAnUnboundHostAndKeepsALaunchersBinding) {
  // --bind-to none: every rank sees all 16 CPUs and takes its own run.
  for (int rank = 0; rank < 4; ++rank) {
    const CpuShare share = PlanCpuShare(16, 16, rank, 4);
    EXPECT_EQ(share.count, 4);
    EXPECT_EQ(share.first_cpu, 4 * rank);
    EXPECT_EQ(share.even_count, 4);
    EXPECT_FALSE(share.narrowed_by_launcher());
  }
  EXPECT_EQ(PlanCpuShare(16, 16, 0, 1).count, 16);
  // More ranks than CPUs: one each, wrapping.
  EXPECT_EQ(PlanCpuShare(2, 2, 3, 4).count, 1);
  // Bound by the launcher to one core of 16 at 2 ranks: that is the share,
  // and it is narrower than the even split of 8.
  CpuShare bound = PlanCpuShare(1, 16, 1, 2);
  EXPECT_EQ(bound.count, 1);
  EXPECT_EQ(bound.first_cpu, 0);
  EXPECT_EQ(bound.even_count, 8);
  EXPECT_TRUE(bound.narrowed_by_launcher());
  // Bound to a socket's 8 of 16 at 2 ranks: the whole even split.
  bound = PlanCpuShare(8, 16, 1, 2);
  EXPECT_EQ(bound.count, 8);
  EXPECT_FALSE(bound.narrowed_by_launcher());
  EXPECT_GE(AllowedCpuCount(), 1);
}

TEST(ThreadPoolTest, ReusableAcrossManyLoops) {
  ThreadPool pool(4);
  std::atomic<int64_t> sum{0};
  for (int loop = 0; loop < 500; ++loop) {
    pool.ParallelFor(16, [&](int64_t i) { sum.fetch_add(i); });
  }
  EXPECT_EQ(sum.load(), 500 * (15 * 16 / 2));
}

TEST(ThreadPoolTest, BelowOneMeansOne) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.num_threads(), 1);
  int runs = 0;
  pool.ParallelFor(3, [&](int64_t) { ++runs; });
  EXPECT_EQ(runs, 3);
}

// Each index once per call, always on the same thread (the static split's
// NUMA locality rests on this), mixed with ParallelFor loops; pinned or not.
TEST(ThreadPoolTest, RunOnEachThreadKeepsIndexOnItsThread) {
  for (bool pin : {false, true}) {
    ThreadPool pool(4, pin);
    std::vector<std::thread::id> first(4);
    std::mutex mutex;
    for (int call = 0; call < 50; ++call) {
      std::vector<std::atomic<int>> runs(4);
      pool.RunOnEachThread([&](int index) {
        runs[index].fetch_add(1);
        std::lock_guard<std::mutex> lock(mutex);
        if (call == 0) {
          first[index] = std::this_thread::get_id();
        } else {
          EXPECT_EQ(first[index], std::this_thread::get_id())
              << "index " << index << " moved at call " << call;
        }
      });
      for (int i = 0; i < 4; ++i) ASSERT_EQ(runs[i].load(), 1);
      EXPECT_EQ(first[0], std::this_thread::get_id());  // the caller is 0
      std::atomic<int64_t> sum{0};
      pool.ParallelFor(10, [&](int64_t i) { sum.fetch_add(i); });
      ASSERT_EQ(sum.load(), 45);
    }
  }
  ThreadPool single(1);
  int runs = 0;
  single.RunOnEachThread([&](int index) { runs += index + 1; });
  EXPECT_EQ(runs, 1);
}

}  // namespace
}  // namespace offload
}  // namespace ze
