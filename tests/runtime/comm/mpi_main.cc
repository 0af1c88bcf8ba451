// The collective suite under mpirun, and the MPI failure cases. Each mode
// is one CTest entry (see tests/CMakeLists.txt):
//   suite [deterministic|library]
//                          every collective + mesh groups; exit 0 when all
//                          pass (library: ReduceScatter through
//                          MPI_Reduce_scatter_block, not the Alltoall and fold
//                          small jobs use)
//   mismatch               ranks pass different counts: every rank gets the error
//   deadpeer               rank 1 is killed (SIGKILL) before an allreduce
//   timeout                rank 1 never joins; the watchdog aborts the job
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "runtime/comm/mpi.h"
#include "tests/runtime/comm/collective_suite.h"

using namespace tessera;

namespace {

int Suite(bool deterministic, bool library) {
  CommOptions options;
  options.check = true;
  options.deterministic = deterministic;
  if (library) options.fold_reduce_scatter_ranks = 0;
  options.timeout = std::chrono::seconds(120);
  auto world = CreateMpiWorld(options);
  if (!world.ok()) {
    std::fprintf(stderr, "%s\n", world.status().ToString().c_str());
    return 1;
  }
  auto failures = testing::RunCollectiveSuite(
      **world, {.bitwise_order = deterministic, .reports_mismatch = true});
  if (failures.empty()) failures = testing::RunMeshSuite(**world);
  for (const auto& f : failures) std::fprintf(stderr, "FAIL %s\n", f.c_str());
  std::printf("rank %d: %s\n", (*world)->rank(), failures.empty() ? "ok" : "FAILED");
  return failures.empty() ? 0 : 1;
}

int Mismatch() {
  CommOptions options;
  options.check = true;
  auto world = CreateMpiWorld(options);
  if (!world.ok()) return 1;
  Communicator& c = **world;
  float buf[16] = {};
  Status s = c.AllReduce(buf, buf, c.rank() == 0 ? 10 : 11, DType::kF32, ReduceOp::kSum);
  std::printf("rank %d: %s\n", c.rank(), s.ToString().c_str());
  const bool named = s.code() == StatusCode::kInvalidArgument &&
                     s.message().find("rank 0: allreduce of 10 f32") != std::string::npos &&
                     s.message().find("rank 1: allreduce of 11 f32") != std::string::npos;
  return named && c.Barrier().ok() ? 0 : 1;
}

int DeadPeer() {
  auto world = CreateMpiWorld({.timeout = std::chrono::seconds(60)});
  if (!world.ok()) return 1;
  Communicator& c = **world;
  if (!c.Barrier().ok()) return 1;
  if (c.rank() == 1) raise(SIGKILL);
  float x[1024] = {};
  Status s = c.AllReduce(x, x, 1024, DType::kF32, ReduceOp::kSum);
  std::printf("rank %d: allreduce returned %s\n", c.rank(), s.ToString().c_str());
  return s.ok() ? 0 : 1;
}

int Timeout() {
  CommOptions options;
  options.timeout = std::chrono::seconds(2);
  options.on_timeout = [](const Status& s) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    std::fflush(stderr);
  };
  auto world = CreateMpiWorld(options);
  if (!world.ok()) return 1;
  Communicator& c = **world;
  if (c.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(60));  // never joins
    return 0;
  }
  float x[1024] = {};
  Status s = c.AllReduce(x, x, 1024, DType::kF32, ReduceOp::kSum);
  std::printf("rank %d: allreduce returned %s\n", c.rank(), s.ToString().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "suite";
  int rc = 2;
  if (mode == "suite") {
    const std::string how = argc > 2 ? argv[2] : "";
    rc = Suite(how == "deterministic", how == "library");
  }
  if (mode == "mismatch") rc = Mismatch();
  if (mode == "deadpeer") rc = DeadPeer();
  if (mode == "timeout") rc = Timeout();
  if (rc != 0) AbortMpiJob(rc);
  return 0;
}
