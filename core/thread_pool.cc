#include "core/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <deque>
#include <utility>

namespace ze {

namespace {

// Binds the calling thread to the `index`-th CPU (wrapping around) of the
// process's affinity mask; best effort.
void PinToAllowedCpu(int index) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
  const int count = CPU_COUNT(&allowed);
  if (count == 0) return;
  int wanted = index % count;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    if (wanted-- == 0) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      sched_setaffinity(0, sizeof(one), &one);
      return;
    }
  }
}

}  // namespace

CpuShare PlanCpuShare(int allowed_cpus, int host_cpus, int local_rank,
                      int local_size) {
  local_size = std::max(1, local_size);
  host_cpus = std::max(1, host_cpus);
  CpuShare share;
  share.even_count = std::max(1, host_cpus / local_size);
  if (allowed_cpus >= host_cpus) {
    share.count = share.even_count;
    share.first_cpu = (std::max(0, local_rank) % local_size) * share.even_count;
    return share;
  }
  share.count = std::max(1, allowed_cpus);
  return share;
}

int AllowedCpuCount() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) {
    const int count = CPU_COUNT(&allowed);
    if (count > 0) return count;
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

ThreadPool::ThreadPool(int num_threads, bool pin_workers, int first_cpu) {
  const int workers = num_threads > 1 ? num_threads - 1 : 0;
  workers_.reserve(workers);
  for (int i = 0; i < workers; ++i) {
    workers_.emplace_back([this, i, pin_workers, first_cpu] {
      if (pin_workers) PinToAllowedCpu(first_cpu + i + 1);
      WorkerLoop(i + 1);
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  start_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::RunTasks(const std::function<void(int64_t)>& task,
                          int64_t num_tasks) {
  for (int64_t i = next_task_.fetch_add(1, std::memory_order_relaxed);
       i < num_tasks; i = next_task_.fetch_add(1, std::memory_order_relaxed)) {
    task(i);
  }
}

void ThreadPool::RunLoop(const std::function<void()>& publish,
                         const std::function<void()>& callers_part) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    publish();
    busy_workers_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  start_.notify_all();
  callers_part();
  // Every worker must have left the loop before what it runs goes out of
  // scope.
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [this] { return busy_workers_ == 0; });
  task_ = nullptr;
  per_thread_task_ = nullptr;
  batch_stream_ = nullptr;
}

void ThreadPool::ParallelFor(int64_t num_tasks,
                             const std::function<void(int64_t)>& task) {
  if (num_tasks <= 0) return;
  // One task or no workers: waking threads would cost more than it saves.
  if (workers_.empty() || num_tasks == 1) {
    for (int64_t i = 0; i < num_tasks; ++i) task(i);
    return;
  }
  RunLoop(
      [&] {
        task_ = &task;
        num_tasks_ = num_tasks;
        next_task_.store(0, std::memory_order_relaxed);
      },
      [&] { RunTasks(task, num_tasks); });
}

absl::Status ThreadPool::TryParallelFor(
    int64_t num_tasks, const std::function<absl::Status(int, int64_t)>& task) {
  if (num_tasks <= 0) return absl::OkStatus();
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mutex;
  int64_t first_failed = num_tasks;  // guarded by `mutex`
  absl::Status error;                // task first_failed's
  auto run = [&](int thread_index) {
    while (!failed.load(std::memory_order_relaxed)) {
      const int64_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= num_tasks) return;
      absl::Status status = task(thread_index, i);
      if (status.ok()) continue;
      std::lock_guard<std::mutex> lock(mutex);
      if (i < first_failed) {
        first_failed = i;
        error = std::move(status);
      }
      failed.store(true, std::memory_order_relaxed);
    }
  };
  // One task or no workers: waking threads would cost more than it saves.
  if (workers_.empty() || num_tasks == 1) {
    run(0);
  } else {
    RunOnEachThread(run);
  }
  return error;
}

void ThreadPool::RunOnEachThread(const std::function<void(int)>& task) {
  if (workers_.empty()) {
    task(0);
    return;
  }
  RunLoop([&] { per_thread_task_ = &task; }, [&] { task(0); });
}

// The shared state of one RunBatches loop; everything below `mutex` is
// guarded by it.
struct ThreadPool::BatchStream {
  const std::function<int64_t()>* next_batch = nullptr;
  const std::function<void(int64_t, int64_t)>* task = nullptr;
  const std::function<void(int64_t)>* batch_done = nullptr;

  struct Batch {
    int64_t num_tasks = 0;
    int64_t taken = 0;
    int64_t finished = 0;
  };

  std::mutex mutex;
  // Signalled when a batch is made, when no more will be, and when a batch
  // is done.
  std::condition_variable changed;
  // Batches made and not yet done, oldest first; only the newest can have
  // tasks left to take. `first_live` is the index of the front one.
  std::deque<Batch> live;
  int64_t first_live = 0;
  bool making = false;     // a thread is in next_batch
  bool exhausted = false;  // next_batch returned 0
};

void ThreadPool::RunBatchStream(BatchStream& stream) {
  std::unique_lock<std::mutex> lock(stream.mutex);
  while (true) {
    if (!stream.live.empty() &&
        stream.live.back().taken < stream.live.back().num_tasks) {
      const int64_t batch =
          stream.first_live + static_cast<int64_t>(stream.live.size()) - 1;
      const int64_t index = stream.live.back().taken++;
      lock.unlock();
      (*stream.task)(batch, index);
      lock.lock();
      // Not done before this task finished, so still in `live`.
      ++stream.live[batch - stream.first_live].finished;
      bool any_done = false;
      while (!stream.live.empty() &&
             stream.live.front().finished == stream.live.front().num_tasks) {
        (*stream.batch_done)(stream.first_live);
        stream.live.pop_front();
        ++stream.first_live;
        any_done = true;
      }
      if (any_done) stream.changed.notify_all();
      continue;
    }
    if (stream.exhausted) return;
    if (stream.making) {
      stream.changed.wait(lock);
      continue;
    }
    stream.making = true;
    lock.unlock();
    const int64_t num_tasks = (*stream.next_batch)();
    lock.lock();
    stream.making = false;
    if (num_tasks <= 0) {
      stream.exhausted = true;
    } else {
      stream.live.push_back(BatchStream::Batch{num_tasks, 0, 0});
    }
    stream.changed.notify_all();
  }
}

void ThreadPool::RunBatches(const std::function<int64_t()>& next_batch,
                            const std::function<void(int64_t, int64_t)>& task,
                            const std::function<void(int64_t)>& batch_done) {
  BatchStream stream;
  stream.next_batch = &next_batch;
  stream.task = &task;
  stream.batch_done = &batch_done;
  auto callers_part = [&] {
    RunBatchStream(stream);
    // Tasks others still run finish their batches.
    std::unique_lock<std::mutex> lock(stream.mutex);
    stream.changed.wait(lock, [&] { return stream.live.empty(); });
  };
  if (workers_.empty()) {
    callers_part();
    return;
  }
  RunLoop([&] { batch_stream_ = &stream; }, callers_part);
}

void ThreadPool::WorkerLoop(int thread_index) {
  uint64_t seen_generation = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    start_.wait(lock,
                [&] { return stopping_ || generation_ != seen_generation; });
    if (stopping_) return;
    seen_generation = generation_;
    const std::function<void(int64_t)>* task = task_;
    const std::function<void(int)>* per_thread_task = per_thread_task_;
    BatchStream* batch_stream = batch_stream_;
    const int64_t num_tasks = num_tasks_;
    lock.unlock();
    if (per_thread_task != nullptr) {
      (*per_thread_task)(thread_index);
    } else if (batch_stream != nullptr) {
      RunBatchStream(*batch_stream);
    } else {
      RunTasks(*task, num_tasks);
    }
    lock.lock();
    if (--busy_workers_ == 0) done_.notify_one();
  }
}

}  // namespace ze
