// AddElapsed: adds the seconds of its own lifetime to a counter (time spent
// in collectives, waits). Steady clock.
#ifndef TESSERA_CORE_TIMER_H_
#define TESSERA_CORE_TIMER_H_

#include <chrono>

namespace tessera {

class AddElapsed {
 public:
  explicit AddElapsed(double* total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~AddElapsed() {
    *total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  AddElapsed(const AddElapsed&) = delete;
  AddElapsed& operator=(const AddElapsed&) = delete;

 private:
  double* total_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tessera

#endif  // TESSERA_CORE_TIMER_H_
