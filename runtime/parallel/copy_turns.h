// Multi-copy parallelism's turns (MindSpore's MicroBatchInterleaved,
// MindFormers' fine_grain_interleave): N copies of one stage's work run on
// N threads, one of them computing at a time, in turn (copy 0, 1, ...,
// N - 1, 0, ...). A copy hands the turn on while a collective of its is in
// flight and takes it back, in its place of the rotation, once the
// collective has completed: copy k's communication runs while copy k + 1
// computes. The turn order is the same on every rank, so the ranks issue
// their collectives in the same order, and every parameter's gradient
// accumulates copy after copy.
#ifndef TESSERA_RUNTIME_PARALLEL_COPY_TURNS_H_
#define TESSERA_RUNTIME_PARALLEL_COPY_TURNS_H_

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

namespace tessera {

class CopyTurns {
 public:
  explicit CopyTurns(int copies) : done_(copies, false), arrived_(copies) {}
  CopyTurns(const CopyTurns&) = delete;
  CopyTurns& operator=(const CopyTurns&) = delete;

  int copies() const { return static_cast<int>(done_.size()); }
  // Every copy back in the rotation, copy 0's turn. Not while copies run.
  void Reset();
  // Blocks until it is `copy`'s turn.
  void Acquire(int copy);
  // `copy`, holding the turn, hands it to the next copy still running (to
  // itself when none is).
  void Pass(int copy);
  // `copy` is done: it leaves the rotation, handing the turn on if it
  // holds it.
  void Finish(int copy);
  // When the turn last came to `copy` (steady clock): with the time its
  // collective completed, what of the collective no copy's compute hid.
  std::chrono::steady_clock::time_point Arrived(int copy);

 private:
  int NextLocked(int copy) const;
  void GiveLocked(int copy);

  std::mutex mu_;
  std::condition_variable cv_;
  int turn_ = 0;
  std::vector<bool> done_;
  std::vector<std::chrono::steady_clock::time_point> arrived_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_PARALLEL_COPY_TURNS_H_
