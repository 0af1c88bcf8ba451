// train_gpt's command line: the model and data, the parallel
// configuration (by hand, from a strategy file or searched), checkpoints,
// the launch, and the fault points the tests use.
#ifndef TESSERA_SAMPLES_GPT_TRAIN_OPTIONS_H_
#define TESSERA_SAMPLES_GPT_TRAIN_OPTIONS_H_

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/launch.h"
#include "runtime/model/gpt.h"
#include "runtime/model/parallel_gpt.h"
#include "runtime/train/optim.h"
#include "runtime/train/sliced_checkpoint.h"

namespace tessera {

// --fault-kill POINT:STEP:RANK, for the fault tests: rank RANK kills its
// own process (SIGKILL, as a crashed host would die) at POINT of step STEP
// (under tessera-run only in the first attempt: RestartCount() 0):
// "step" as the step begins, or a point of a sliced save (see
// SlicedWriteOptions::fault_hook: write, redundancy, commit, rename,
// committed).
struct FaultKill {
  std::string point;
  int64_t step = -1;
  int rank = -1;
  bool hang = false;  // --fault-hang: stop there for ever (a hung rank) instead
  double stall = 0;   // --fault-stall: with --fault-hang, stop that long and go on
  static Result<FaultKill> Parse(const std::string& text) {
    FaultKill f;
    if (text.empty()) return f;
    const size_t a = text.find(':'), b = text.rfind(':');
    const Status usage = InvalidArgumentError("--fault-kill '" + text + "': use POINT:STEP:RANK");
    if (a == std::string::npos || a == b) return usage;
    try {
      f.point = text.substr(0, a);
      f.step = std::stoll(text.substr(a + 1, b - a - 1));
      f.rank = std::stoi(text.substr(b + 1));
    } catch (...) {
      return usage;
    }
    if (f.point != "step" && f.point != "write" && f.point != "redundancy" && f.point != "commit" &&
        f.point != "rename" && f.point != "committed") {
      return InvalidArgumentError(
          "--fault-kill '" + text +
          "': POINT is step, write, redundancy, commit, rename or committed");
    }
    return f;
  }
  void At(std::string_view point, int64_t step, int rank) const {
    // Under a launcher, only in the job's first attempt: the restarted job
    // runs through.
    static const bool restarted = RestartCount() > 0;
    if (restarted) return;
    if (point == this->point && step == this->step && rank == this->rank) {
      std::fprintf(stderr, "train_gpt: --fault-%s: rank %d %s at %s of step %lld\n",
                   hang ? "hang" : "kill", rank, hang ? "hangs" : "kills itself",
                   std::string(point).c_str(), static_cast<long long>(step));
      std::fflush(stderr);
      if (hang && stall > 0) {
        std::this_thread::sleep_for(std::chrono::duration<double>(stall));
        std::fprintf(stderr, "train_gpt: --fault-stall: rank %d goes on after %g s\n", rank, stall);
        std::fflush(stderr);
        return;
      }
      if (hang) {
        while (true) pause();
      }
      kill(getpid(), SIGKILL);
    }
  }
};

struct Options {
  GptConfig config;
  std::string data, save, export_dir, export_dtype, save_mode = "merged", strategy_out;
  std::string trace;  // --trace PREFIX: PREFIX.rank<R>.json per rank
  FaultKill fault;
  Redundancy redundancy;
  std::vector<std::string> hosts;  // --hosts: one per rank; empty: the real ones
  int batch = 8, seq = 0, steps = 20, save_every = 0, keep = 0;
  uint64_t seed = 1;
  AdamWConfig adam;
  float max_norm = 1.0f;
  bool resume = false, quiet = false, async_save = false, print_ops = false;
  std::string dataset_strategy = "data_parallel";  // or full_batch
  ParallelConfig parallel;
  // --auto-parallel: the search's mode; the machine's profile (empty:
  // calibrate now); the per-rank memory budget.
  std::string auto_parallel, profile, calibrate_out;
  int64_t rank_memory = 0;
  // How the ranks start, and the compute threads of each.
  LaunchOptions launch;
  int compute_threads = 0;  // 0: every core
  // --matmul-library (empty: the profile's, else OpenBLAS).
  std::string matmul_library;
  // Asynchronous parameter servers whose workers a launcher replaces one
  // by one (tessera-run --ps-replace-workers: TESSERA_PS_REPLACEABLE):
  // the servers drop a dead worker, take its replacement back and save
  // the checkpoints themselves. ps_rejoin: this process is replacement
  // number n (TESSERA_PS_REJOIN) of its rank's worker; 0: it is not.
  bool ps_replaceable = false;
  int ps_rejoin = 0;
};

// Parses the command line into `o`. Returns -1 to go on, else the exit
// code (0 after --help; 1 after a bad flag, said on stderr).
int ParseOptions(int argc, char** argv, Options* o);
// What parameter servers do not combine with (ParseOptions checks it; a
// server count set later, by MS_SERVER_NUM, is checked again).
Status RefuseWithServers(const Options& o);

}  // namespace tessera

#endif  // TESSERA_SAMPLES_GPT_TRAIN_OPTIONS_H_
