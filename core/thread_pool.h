// A small fixed-size thread pool. Tasks run in submission order per worker
// availability; Wait() blocks until every submitted task has finished.
#ifndef TESSERA_CORE_THREAD_POOL_H_
#define TESSERA_CORE_THREAD_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/status.h"

namespace tessera {

class ThreadPool {
 public:
  // num_threads <= 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()); }

  void Submit(std::function<void()> task);
  // Blocks until the queue is empty and no task is running.
  void Wait();

  // Runs fn(i) for i in [0, n) on the pool and waits. Returns the first
  // non-OK status (by index), or OK. Must not be called from a pool task.
  Status ParallelFor(int64_t n, const std::function<Status(int64_t)>& fn);

 private:
  void WorkerLoop();

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable idle_cv_;
  std::deque<std::function<void()>> queue_;
  int64_t running_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace tessera

#endif  // TESSERA_CORE_THREAD_POOL_H_
