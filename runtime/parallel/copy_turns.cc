#include "runtime/parallel/copy_turns.h"

#include <algorithm>

namespace tessera {

void CopyTurns::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  std::fill(done_.begin(), done_.end(), false);
  GiveLocked(0);
}

void CopyTurns::GiveLocked(int copy) {
  turn_ = copy;
  arrived_[copy] = std::chrono::steady_clock::now();
}

std::chrono::steady_clock::time_point CopyTurns::Arrived(int copy) {
  std::lock_guard<std::mutex> lock(mu_);
  return arrived_[copy];
}

void CopyTurns::Acquire(int copy) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return turn_ == copy; });
}

int CopyTurns::NextLocked(int copy) const {
  const int n = copies();
  for (int i = 1; i < n; ++i) {
    const int next = (copy + i) % n;
    if (!done_[next]) return next;
  }
  return copy;
}

void CopyTurns::Pass(int copy) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    GiveLocked(NextLocked(copy));
  }
  cv_.notify_all();
}

void CopyTurns::Finish(int copy) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_[copy] = true;
    if (turn_ == copy) GiveLocked(NextLocked(copy));
  }
  cv_.notify_all();
}

}  // namespace tessera
