// A fixed pool of threads that runs one parallel loop at a time: the CPU
// optimizer's tiles. The calling thread works too, so a pool of N threads
// starts N - 1 workers; they sleep on a condition variable between loops.
#ifndef ZE_OFFLOAD_THREAD_POOL_H_
#define ZE_OFFLOAD_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ze {
namespace offload {

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

  // Runs task(thread_index) once on each of the num_threads() threads; the
  // caller's thread is index 0 and worker w is always index w + 1, so the
  // same index runs on the same thread every call (what a static split of
  // memory over threads needs for NUMA first-touch locality). Returns when
  // all have finished; same restrictions as ParallelFor.
  void RunOnEachThread(const std::function<void(int)>& task);

 private:
  void WorkerLoop(int thread_index);
  void RunTasks(const std::function<void(int64_t)>& task, int64_t num_tasks);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_;
  std::condition_variable done_;
  // Guarded by mutex_.
  uint64_t generation_ = 0;
  int busy_workers_ = 0;
  bool stopping_ = false;
  // Exactly one of task_ (ParallelFor) and per_thread_task_
  // (RunOnEachThread) is set while a loop runs.
  const std::function<void(int64_t)>* task_ = nullptr;
  const std::function<void(int)>* per_thread_task_ = nullptr;
  int64_t num_tasks_ = 0;
  // The next task index to take.
  std::atomic<int64_t> next_task_{0};
};

}  // namespace offload
}  // namespace ze

#endif  // ZE_OFFLOAD_THREAD_POOL_H_
