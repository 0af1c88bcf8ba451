// AddElapsed: adds the seconds of its own lifetime to a counter (time spent
// in collectives, waits); SteadySeconds and MedianSeconds, for the
// calibrations that time kernels and collectives. Steady clock.
#ifndef TESSERA_CORE_TIMER_H_
#define TESSERA_CORE_TIMER_H_

#include <algorithm>
#include <chrono>
#include <vector>

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

// Seconds on the steady clock since its epoch.
inline double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The median of `runs` (at least 1) timings of fn() (after one untimed
// run that warms caches and lazily built state, with `warm_up`).
template <typename F>
double MedianSeconds(int runs, F&& fn, bool warm_up = false) {
  if (warm_up) fn();
  if (runs < 1) runs = 1;
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    const double start = SteadySeconds();
    fn();
    t.push_back(SteadySeconds() - start);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace tessera

#endif  // TESSERA_CORE_TIMER_H_
