#include "core/thread_pool.h"

#include <atomic>

namespace tessera {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) {
    num_threads = static_cast<int>(std::thread::hardware_concurrency());
    if (num_threads <= 0) num_threads = 1;
  }
  workers_.reserve(num_threads);
  for (int i = 0; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::Submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  work_cv_.notify_one();
}

void ThreadPool::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [this] { return queue_.empty() && running_ == 0; });
}

void ThreadPool::WorkerLoop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    task();
    {
      std::lock_guard<std::mutex> lock(mu_);
      --running_;
      if (queue_.empty() && running_ == 0) idle_cv_.notify_all();
    }
  }
}

Status ThreadPool::ParallelFor(int64_t n, const std::function<Status(int64_t)>& fn) {
  if (n <= 0) return Status::Ok();
  std::vector<Status> statuses(n);
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  const int64_t tasks = std::min<int64_t>(n, size());
  std::mutex done_mu;
  std::condition_variable done_cv;
  int64_t done = 0;
  for (int64_t t = 0; t < tasks; ++t) {
    Submit([&] {
      for (int64_t i = next++; i < n; i = next++) {
        if (failed.load()) break;  // stop early after a failure
        statuses[i] = fn(i);
        if (!statuses[i].ok()) failed = true;
      }
      std::lock_guard<std::mutex> lock(done_mu);
      if (++done == tasks) done_cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(done_mu);
  done_cv.wait(lock, [&] { return done == tasks; });
  for (Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

}  // namespace tessera
