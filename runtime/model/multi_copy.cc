#include "runtime/model/multi_copy.h"

#include <algorithm>
#include <string>

namespace tessera {

MultiCopyRunner::MultiCopyRunner(std::vector<std::unique_ptr<OpGpt>> ops)
    : copies_(std::move(ops)), turns_(static_cast<int>(copies_.size())) {
  const GptGraph& g = copies_[0]->graph();
  width_ = g.config.embed;
  first_ = g.stage.first;
  last_ = g.stage.last;
  status_.resize(copies_.size());
  units_.resize(copies_.size());
  losses_.resize(copies_.size());
  SetSlots(1);
  for (int k = 1; k < copies(); ++k) threads_.emplace_back([this, k] { Worker(k); });
}

MultiCopyRunner::~MultiCopyRunner() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void MultiCopyRunner::SetSlots(int n) {
  for (auto& c : copies_) c->SetSlots(n);
  out_.resize(std::max(1, n));
  shape_.resize(std::max(1, n));
}

void MultiCopyRunner::Worker(int k) {
  uint64_t seen = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    Status s = RunCopy(k);
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_[k] = std::move(s);
      --running_;
    }
    done_.notify_all();
  }
}

Status MultiCopyRunner::RunCopy(int k) {
  ScopedTrace trace(trace_);
  if (k > 0 && counting_) kernels::CountUnits(true);
  OpGpt& ops = *copies_[k];
  ops.SetTurns(&turns_, k);
  turns_.Acquire(k);
  Status s = (*job_)(k);
  turns_.Finish(k);
  ops.SetTurns(nullptr, 0);
  if (k > 0 && counting_) {
    units_[k] = kernels::CountedUnits();
    kernels::CountUnits(false);
  }
  return s;
}

Status MultiCopyRunner::RunCopies(const std::function<Status(int)>& fn) {
  turns_.Reset();
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    trace_ = Trace::Current();
    counting_ = kernels::CountingUnits();
    running_ = copies() - 1;
    ++generation_;
  }
  start_.notify_all();
  Status first = RunCopy(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return running_ == 0; });
  for (int k = 1; k < copies() && counting_; ++k) {
    for (int i = 0; i < kKernelCount; ++i) {
      kernels::AddUnits(static_cast<Kernel>(i), units_[k][i]);
    }
  }
  for (int k = 1; k < copies() && first.ok(); ++k) first = status_[k];
  return first;
}

Result<float> MultiCopyRunner::ForwardStage(int slot, const int32_t* tokens, const float* x,
                                            const int32_t* targets, int B, int T) {
  const int n = copies();
  if (B % n != 0) {
    return InvalidArgumentError("micro_batch_interleave " + std::to_string(n) +
                                ": a micro-batch of " + std::to_string(B) +
                                " sequences per replica does not cut into " + std::to_string(n) +
                                " copies of whole sequences; use a batch whose micro-batches "
                                "hold a multiple of " +
                                std::to_string(n) + " sequences per replica");
  }
  const int b = B / n;
  const int64_t rows = static_cast<int64_t>(b) * T;
  shape_[slot] = {B, T};
  RETURN_IF_ERROR(RunCopies([&](int k) -> Status {
    ASSIGN_OR_RETURN(losses_[k],
                     copies_[k]->ForwardStage(slot, tokens ? tokens + k * rows : nullptr,
                                              x ? x + k * rows * width_ : nullptr,
                                              targets ? targets + k * rows : nullptr, b, T));
    return Status::Ok();
  }));
  if (!last_) {
    std::vector<float>& out = out_[slot];
    out.resize(static_cast<size_t>(B) * T * width_);
    for (int k = 0; k < n; ++k) {
      const float* o = copies_[k]->StageOutput(slot);
      std::copy(o, o + rows * width_, out.data() + k * rows * width_);
    }
  }
  // The micro-batch's mean loss: the mean of the copies' (equal sizes).
  float loss = 0;
  for (float l : losses_) loss += l;
  return loss / static_cast<float>(n);
}

Status MultiCopyRunner::BackwardStage(int slot, const float* dy, float dloss) {
  const int n = copies();
  const auto [B, T] = shape_[slot];
  const int64_t rows = static_cast<int64_t>(B / n) * T;
  const float dloss_copy = dloss / static_cast<float>(n);
  RETURN_IF_ERROR(RunCopies([&](int k) {
    return copies_[k]->BackwardStage(slot, dy ? dy + k * rows * width_ : nullptr, dloss_copy);
  }));
  if (!first_) {
    input_grad_.resize(static_cast<size_t>(B) * T * width_);
    for (int k = 0; k < n; ++k) {
      const float* g = copies_[k]->InputGradient();
      std::copy(g, g + rows * width_, input_grad_.data() + k * rows * width_);
    }
  }
  return Status::Ok();
}

int64_t MultiCopyRunner::ActivationBytes() const {
  int64_t n = static_cast<int64_t>(input_grad_.capacity() * sizeof(float));
  for (const auto& c : copies_) n += c->ActivationBytes();
  for (const auto& o : out_) n += static_cast<int64_t>(o.capacity() * sizeof(float));
  return n;
}

int64_t MultiCopyRunner::plans_built() const {
  int64_t n = 0;
  for (const auto& c : copies_) n += c->plans_built();
  return n;
}

double MultiCopyRunner::comm_seconds() const {
  double t = 0;
  for (const auto& c : copies_) t += c->comm_seconds();
  return t;
}

}  // namespace tessera
