#include "runtime/comm/communicator.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace tessera {

// The default non-blocking collectives: a thread of this rank running them
// in issue order on a duplicate communicator.
class AsyncLane {
 public:
  explicit AsyncLane(std::unique_ptr<Communicator> dup) : dup_(std::move(dup)) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~AsyncLane() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  AsyncLane(const AsyncLane&) = delete;
  AsyncLane& operator=(const AsyncLane&) = delete;

  Communicator& dup() { return *dup_; }

  // Queues `op` (a blocking collective on dup()); its request waits for it.
  Request Issue(std::function<Status(Communicator&)> op) {
    auto job = std::make_shared<Job>();
    job->op = std::move(op);
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(job);
    }
    cv_.notify_all();
    return Request(std::make_unique<JobRequest>(job));
  }

 private:
  struct Job {
    std::function<Status(Communicator&)> op;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    Status status;
  };
  class JobRequest : public Request::Impl {
   public:
    explicit JobRequest(std::shared_ptr<Job> job) : job_(std::move(job)) {}
    // A request dropped unwaited still waits: the lane writes into its
    // buffers until the collective completes.
    ~JobRequest() override {
      if (job_ != nullptr) (void)Wait();
    }
    Status Wait() override {
      std::unique_lock<std::mutex> lock(job_->mu);
      job_->cv.wait(lock, [&] { return job_->done; });
      Status s = job_->status;
      lock.unlock();
      job_.reset();
      return s;
    }

   private:
    std::shared_ptr<Job> job_;
  };

  void Loop() {
    while (true) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      // The backend's own timeout bounds every call: nothing waits for ever.
      Status s = job->op(*dup_);
      {
        std::lock_guard<std::mutex> lock(job->mu);
        job->status = std::move(s);
        job->done = true;
      }
      job->cv.notify_all();
    }
  }

  std::unique_ptr<Communicator> dup_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

Communicator::Communicator() = default;
Communicator::~Communicator() = default;

Result<AsyncLane*> Communicator::Lane() {
  if (lane_ == nullptr) {
    // Collective: every rank makes its lane at its first non-blocking
    // collective, the same call of the same sequence on every rank.
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> dup, Split(0, rank()));
    dup->set_name(name() + " (async)");
    lane_ = std::make_unique<AsyncLane>(std::move(dup));
  }
  return lane_.get();
}

Result<Request> Communicator::IAllReduce(const void* send, void* recv, int64_t count, DType dtype,
                                         ReduceOp op) {
  ASSIGN_OR_RETURN(AsyncLane * lane, Lane());
  return lane->Issue([=](Communicator& c) { return c.AllReduce(send, recv, count, dtype, op); });
}

Result<Request> Communicator::IReduceScatter(const void* send, void* recv, int64_t recv_count,
                                             DType dtype, ReduceOp op) {
  ASSIGN_OR_RETURN(AsyncLane * lane, Lane());
  return lane->Issue(
      [=](Communicator& c) { return c.ReduceScatter(send, recv, recv_count, dtype, op); });
}

Result<Request> Communicator::IAllGather(const void* send, int64_t count, void* recv, DType dtype) {
  ASSIGN_OR_RETURN(AsyncLane * lane, Lane());
  return lane->Issue([=](Communicator& c) { return c.AllGather(send, count, recv, dtype); });
}

Result<Request> Communicator::IAllToAll(const void* send, void* recv, int64_t count, DType dtype) {
  ASSIGN_OR_RETURN(AsyncLane * lane, Lane());
  return lane->Issue([=](Communicator& c) { return c.AllToAll(send, recv, count, dtype); });
}

Status Request::Wait() {
  if (impl_ == nullptr) return FailedPreconditionError("wait on a request that is not pending");
  Status s = impl_->Wait();
  impl_.reset();
  return s;
}

Status WaitAll(std::span<Request> requests) {
  Status first;
  for (Request& r : requests) {
    if (!r.pending()) continue;
    Status s = r.Wait();
    if (first.ok() && !s.ok()) first = std::move(s);
  }
  return first;
}

Status Communicator::AllGather(const void* send, int64_t count, void* recv, DType dtype) {
  return AllGatherV(send, count, recv, std::vector<int64_t>(size(), count), dtype);
}

Status Communicator::Gather(const void* send, int64_t count, void* recv, DType dtype, int root) {
  return GatherV(send, count, recv, std::vector<int64_t>(size(), count), dtype, root);
}

Status Communicator::Scatter(const void* send, void* recv, int64_t count, DType dtype, int root) {
  return ScatterV(send, std::vector<int64_t>(size(), count), recv, count, dtype, root);
}

Status Communicator::AllToAll(const void* send, void* recv, int64_t count, DType dtype) {
  const std::vector<int64_t> counts(size(), count);
  return AllToAllV(send, counts, recv, counts, dtype);
}

}  // namespace tessera
