// A fixed pool of threads that runs one parallel loop at a time: the CPU
// optimizer's tiles, and every fan-out over independent work (checkpoint
// reads and checksums, parameter initialisation), which makes a pool for the
// call. The calling thread works too, so a pool of N threads starts N - 1
// workers; they sleep on a condition variable between loops.
// A loop is either one batch of tasks (ParallelFor, or TryParallelFor for
// tasks that can fail), one task per thread (RunOnEachThread), or a stream
// of batches with no barrier between them (RunBatches).
//
// Threads: the loop functions are called from one thread at a time (the
// pool's owner); tasks run on that thread and on the workers. Nothing a task
// captures is copied: it must stay alive until the loop returns, which it
// does (every loop returns only after all its tasks have).
#ifndef ZE_CORE_THREAD_POOL_H_
#define ZE_CORE_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace ze {

// The CPUs of one host that one of its ranks gives its CPU threads.
struct CpuShare {
  int count = 1;       // CPUs in the share, >= 1
  int first_cpu = 0;   // index, in the process's affinity mask, of the first
  int even_count = 1;  // an even split of the host among its ranks, >= 1
  // The launcher bound the process to fewer CPUs than an even split of the
  // host among its ranks would give it (Open MPI binds each rank to one
  // core by default at two ranks or fewer, unless --bind-to none).
  bool narrowed_by_launcher() const { return count < even_count; }
};

// Pure. `allowed_cpus`: CPUs in this process's affinity mask; `host_cpus`:
// the host's; `local_rank` of `local_size` ranks on the host. When the
// mask holds every host CPU (--bind-to none), the ranks split them evenly,
// local rank r taking the r-th run of host_cpus / local_size, so pinned
// threads of different ranks never share a CPU; when it holds fewer, the
// launcher chose this rank's CPUs and the whole mask is its share.
CpuShare PlanCpuShare(int allowed_cpus, int host_cpus, int local_rank,
                      int local_size);

// The CPUs in the calling thread's affinity mask (sched_getaffinity); the
// hardware's thread count when that fails.
int AllowedCpuCount();

class ThreadPool {
 public:
  // `num_threads` >= 1, the caller's thread included (values below 1 are
  // taken as 1).
  // `pin_workers`: worker w (thread index w + 1) is bound with
  // sched_setaffinity to the (first_cpu + w + 1)-th CPU of the process's
  // affinity mask (wrapping around), so a worker keeps its caches and its
  // NUMA node from step to step; the caller's thread is never re-bound.
  // Pinning is best effort: a refused sched_setaffinity leaves the worker
  // unpinned.
  explicit ThreadPool(int num_threads, bool pin_workers = false,
                      int first_cpu = 0);
  // Joins the workers (no loop may be running).
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs task(i) for every i in [0, num_tasks), each exactly once, on the
  // pool's threads and the caller's, taking indices in increasing order;
  // returns when all have finished. One loop at a time: not reentrant and
  // not to be called from two threads at once. `task` must not throw.
  void ParallelFor(int64_t num_tasks, const std::function<void(int64_t)>& task);

  // ParallelFor for tasks that can fail: task(thread_index, i) for i in
  // [0, num_tasks), indices taken in increasing order; thread_index in
  // [0, num_threads()) says which thread runs it (the caller's is 0), for
  // per-thread scratch that needs no lock. Once a task has failed no new
  // one starts (those running finish). Returns OK when every task did, else
  // the error of the lowest-indexed failed task: every lower index had
  // started, so that is the error a serial loop would have returned first.
  // Same restrictions as ParallelFor.
  absl::Status TryParallelFor(
      int64_t num_tasks,
      const std::function<absl::Status(int thread_index, int64_t i)>& task);

  // Runs task(thread_index) once on each of the num_threads() threads; the
  // caller's thread is index 0 and worker w is always index w + 1, so the
  // same index runs on the same thread every call (what a static split of
  // memory over threads needs for NUMA first-touch locality). Returns when
  // all have finished; same restrictions as ParallelFor.
  void RunOnEachThread(const std::function<void(int)>& task);

  // Runs a stream of batches of tasks, made one at a time, with no barrier
  // between batches: a thread that finds every task of the newest batch
  // taken makes (or waits for) the next batch and starts on it while other
  // threads still finish the batch before. A sequence of ParallelFor calls
  // instead idles every thread but one at each loop's end (its last, partial
  // wave of tasks) and wakes the workers again for the next.
  //
  // `next_batch()`: the task count (>= 1) of the next batch, or 0 when there
  // are no more (it is then not called again). Called by one thread at a
  // time, any of the pool's or the caller's, with no lock of the pool held;
  // it may block (the batch's inputs not there yet) while the others finish
  // the batch before.
  // `task(batch, i)`: task i of batch `batch` (batches count from 0 in the
  // order made); each exactly once, tasks of one batch taken in increasing
  // order, on any thread.
  // `batch_done(batch)`: once per batch, in batch order, after every task of
  // it and of every batch before it has returned; on any thread, with the
  // stream's lock held, so it must be short and must not call the pool.
  // Returns when next_batch has returned 0 and every batch made is done.
  // One loop at a time, as ParallelFor; none of the functions may throw.
  void RunBatches(const std::function<int64_t()>& next_batch,
                  const std::function<void(int64_t, int64_t)>& task,
                  const std::function<void(int64_t)>& batch_done);

 private:
  struct BatchStream;
  // Runs one loop on every thread: under the pool's lock `publish` sets what
  // the workers run (task_, per_thread_task_ or batch_stream_), the workers
  // are woken, the caller's thread runs `callers_part`, and this returns
  // once every worker has finished its part, with the loop unpublished.
  void RunLoop(const std::function<void()>& publish,
               const std::function<void()>& callers_part);
  void WorkerLoop(int thread_index);
  void RunTasks(const std::function<void(int64_t)>& task, int64_t num_tasks);
  // One thread's part of a RunBatches loop: returns when no task is left
  // to take and no batch is left to make.
  static void RunBatchStream(BatchStream& stream);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_;
  std::condition_variable done_;
  // Guarded by mutex_.
  uint64_t generation_ = 0;
  int busy_workers_ = 0;
  bool stopping_ = false;
  // Exactly one of task_ (ParallelFor), per_thread_task_ (RunOnEachThread)
  // and batch_stream_ (RunBatches) is set while a loop runs.
  const std::function<void(int64_t)>* task_ = nullptr;
  const std::function<void(int)>* per_thread_task_ = nullptr;
  BatchStream* batch_stream_ = nullptr;
  int64_t num_tasks_ = 0;
  // The next task index to take.
  std::atomic<int64_t> next_task_{0};
};

}  // namespace ze

#endif  // ZE_CORE_THREAD_POOL_H_
