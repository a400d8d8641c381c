#include "core/thread_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ze {
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

TEST(ThreadPoolTest, TryParallelForRunsEveryTaskAndGivesEachThreadItsIndex) {
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    std::vector<std::atomic<int>> runs(100);
    std::vector<std::thread::id> owner(threads);
    std::mutex mutex;
    bool index_shared = false;
    const absl::Status status =
        pool.TryParallelFor(100, [&](int thread, int64_t i) {
          runs[i].fetch_add(1);
          std::lock_guard<std::mutex> lock(mutex);
          if (owner[thread] == std::thread::id()) {
            owner[thread] = std::this_thread::get_id();
          }
          // Per-thread scratch is only safe if an index is one thread's.
          if (owner[thread] != std::this_thread::get_id()) index_shared = true;
          return absl::OkStatus();
        });
    EXPECT_TRUE(status.ok()) << status;
    EXPECT_FALSE(index_shared);
    for (int i = 0; i < 100; ++i) ASSERT_EQ(runs[i].load(), 1) << i;
  }
  ThreadPool pool(2);
  EXPECT_TRUE(
      pool.TryParallelFor(
              0, [](int, int64_t) { return absl::InternalError("never runs"); })
          .ok());
}

TEST(ThreadPoolTest, TryParallelForReturnsTheLowestFailureAndStopsStarting) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    std::atomic<int> started{0};
    const absl::Status status =
        pool.TryParallelFor(1000, [&](int, int64_t i) -> absl::Status {
          started.fetch_add(1);
          if (i == 7) {
            // Fails last, after task 9 has (with several threads): the
            // lower index must still be the one reported.
            if (threads > 1) {
              std::this_thread::sleep_for(std::chrono::milliseconds(20));
            }
            return absl::NotFoundError("task 7");
          }
          if (i == 9) return absl::NotFoundError("task 9");
          return absl::OkStatus();
        });
    // A lost error would read OK; "task 9" is not what a serial loop says.
    EXPECT_EQ(status, absl::NotFoundError("task 7")) << threads << " threads";
    // No task starts after a failure: one thread stops at task 7.
    if (threads == 1) EXPECT_EQ(started.load(), 8);
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

// Every task of every batch runs once, and each batch is reported done once,
// in order, only after its own tasks and every earlier batch's finished.
TEST(ThreadPoolTest, RunBatchesRunsEveryTaskAndReportsBatchesInOrder) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int round = 0; round < 20; ++round) {
      const std::vector<int64_t> sizes = {1, 7, 2, 40, 1, 1, 15, 3};
      std::vector<std::vector<std::atomic<int>>> runs;
      for (int64_t size : sizes) {
        runs.emplace_back(static_cast<size_t>(size));
      }
      size_t made = 0;
      std::vector<int64_t> done_order;
      pool.RunBatches(
          [&]() -> int64_t { return made < sizes.size() ? sizes[made++] : 0; },
          [&](int64_t batch, int64_t i) { runs[batch][i].fetch_add(1); },
          [&](int64_t batch) {
            for (const std::atomic<int>& run : runs[batch]) {
              EXPECT_EQ(run.load(), 1) << "batch " << batch << " done early";
            }
            done_order.push_back(batch);
          });
      ASSERT_EQ(done_order.size(), sizes.size()) << threads << " threads";
      for (size_t b = 0; b < sizes.size(); ++b) {
        EXPECT_EQ(done_order[b], static_cast<int64_t>(b));
        for (const std::atomic<int>& run : runs[b]) ASSERT_EQ(run.load(), 1);
      }
    }
    // No batch at all.
    pool.RunBatches([] { return int64_t{0}; }, [](int64_t, int64_t) {},
                    [](int64_t) { ADD_FAILURE() << "no batch was made"; });
  }
}

// The point of RunBatches: while one thread still runs batch 0's last task,
// another makes batch 1 and runs it. Batch 0's slow task waits (up to 10 s)
// for batch 1's task to start; with a barrier between batches it would
// wait in vain.
TEST(ThreadPoolTest, RunBatchesStartsTheNextBatchBeforeTheLastOneEnds) {
  ThreadPool pool(2);
  std::mutex mutex;
  std::condition_variable changed;
  bool next_batch_started = false;
  bool overlapped = false;
  int batches = 0;
  pool.RunBatches(
      [&]() -> int64_t { return batches < 2 ? (++batches == 1 ? 2 : 1) : 0; },
      [&](int64_t batch, int64_t i) {
        std::unique_lock<std::mutex> lock(mutex);
        if (batch == 0 && i == 0) {
          overlapped = changed.wait_for(lock, std::chrono::seconds(10),
                                        [&] { return next_batch_started; });
        } else if (batch == 1) {
          next_batch_started = true;
          changed.notify_all();
        }
      },
      [](int64_t) {});
  EXPECT_TRUE(overlapped);
}

}  // namespace
}  // namespace ze
