// The Gloo backend across real processes, started the way a launcher starts
// them: this program forks N workers, each of which learns its place from a
// rank table (as from TESSERA_RANK / TESSERA_WORLD_SIZE / TESSERA_MASTER)
// and creates the Gloo world over loopback TCP. Modes (one CTest entry each):
//   suite N [deterministic]  every collective + mesh groups on N processes
//   env N                    the same table read from torchrun's variables
//                            through LaunchRanks' auto backend
//   mismatch                 ranks pass different counts (CommOptions::check):
//                            every rank gets the error naming both
//   absent                   rank 2 of 3 never starts: ranks 0 and 1 fail
//                            within the timeout naming it
//   deadpeer                 rank 1 dies (SIGKILL) before an allreduce: rank 0
//                            fails (Aborted or DeadlineExceeded), no hang
// Exit 0 when every worker did what was expected.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "runtime/comm/gloo.h"
#include "runtime/comm/launch.h"
#include "tests/runtime/comm/collective_suite.h"
#include "tests/runtime/comm/free_port.h"

using namespace tessera;

namespace {

using testing::FreePort;

// Forks `n` workers running fn(rank, port) (but rank `skip`); returns each
// one's exit code, -1 for a signal (and 0 for the skipped rank).
std::vector<int> ForkEach(int n, const std::function<int(int rank, int port)>& fn, int skip = -1) {
  const int port = FreePort();
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    if (r == skip) continue;
    const pid_t pid = fork();
    if (pid == 0) {
      const int rc = fn(r, port);
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes(n, 0);
  size_t i = 0;
  for (int r = 0; r < n; ++r) {
    if (r == skip) continue;
    int status = 0;
    waitpid(pids[i++], &status, 0);
    codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (WIFSIGNALED(status)) std::printf("worker %d killed by signal %d\n", r, WTERMSIG(status));
  }
  return codes;
}

// 0 when every worker exits 0.
int Fork(int n, const std::function<int(int rank, int port)>& fn, int skip = -1) {
  for (int c : ForkEach(n, fn, skip)) {
    if (c != 0) return 1;
  }
  return 0;
}

Result<std::unique_ptr<Communicator>> World(int rank, int n, int port, CommOptions options) {
  RankTable t{rank, n, "127.0.0.1", port, "test"};
  return CreateGlooWorld(t, options);
}

int Suite(int n, bool deterministic) {
  return Fork(n, [&](int rank, int port) {
    CommOptions options;
    options.check = true;
    options.deterministic = deterministic;
    options.timeout = std::chrono::seconds(60);
    auto world = World(rank, n, port, options);
    if (!world.ok()) {
      std::fprintf(stderr, "%s\n", world.status().ToString().c_str());
      return 1;
    }
    auto failures = testing::RunCollectiveSuite(
        **world, {.bitwise_order = deterministic, .reports_mismatch = true});
    if (failures.empty()) failures = testing::RunMeshSuite(**world);
    for (const auto& f : failures) std::fprintf(stderr, "FAIL %s\n", f.c_str());
    std::printf("gloo rank %d of %d%s: %s\n", rank, n, deterministic ? " (deterministic)" : "",
                failures.empty() ? "ok" : "FAILED");
    return failures.empty() ? 0 : 1;
  });
}

int Env(int n) {
  return Fork(n, [&](int rank, int port) {
    for (const char* v : {"TESSERA_RANK", "TESSERA_WORLD_SIZE", "TESSERA_MASTER"}) unsetenv(v);
    setenv("RANK", std::to_string(rank).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
    setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
    setenv("MASTER_ADDR", "localhost", 1);
    setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    Status s = LaunchRanks({}, [&](Communicator& world) -> Status {
      if (world.backend() != "gloo" || world.rank() != rank || world.size() != n) {
        return InternalError("auto picked " + std::string(world.backend()));
      }
      int64_t v = rank + 1;
      RETURN_IF_ERROR(world.AllReduce(&v, &v, 1, DType::kI64, ReduceOp::kSum));
      if (v != int64_t{n} * (n + 1) / 2) return InternalError("wrong sum " + std::to_string(v));
      return Status::Ok();
    });
    std::printf("torchrun variables, rank %d: %s\n", rank, s.ToString().c_str());
    return s.ok() ? 0 : 1;
  });
}

int Mismatch() {
  return Fork(2, [&](int rank, int port) {
    auto world = World(rank, 2, port, {.timeout = std::chrono::seconds(30), .check = true});
    if (!world.ok()) return 1;
    float buf[16] = {};
    Status s = (*world)->AllReduce(buf, buf, rank == 0 ? 10 : 11, DType::kF32, ReduceOp::kSum);
    std::printf("rank %d: %s\n", rank, s.ToString().c_str());
    const bool named = s.code() == StatusCode::kInvalidArgument &&
                       s.message().find("rank 0: allreduce of 10 f32") != std::string::npos &&
                       s.message().find("rank 1: allreduce of 11 f32") != std::string::npos;
    return named && (*world)->Barrier().ok() ? 0 : 1;
  });
}

int Absent() {
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = Fork(
      3,
      [&](int rank, int port) {
        auto world = World(rank, 3, port, {.timeout = std::chrono::seconds(2)});
        std::printf("rank %d: %s\n", rank, world.status().ToString().c_str());
        const bool named =
            world.status().code() == StatusCode::kDeadlineExceeded &&
            world.status().message().find("rank(s) 2 did not join") != std::string::npos;
        return named ? 0 : 1;
      },
      /*skip=*/2);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("absent rank reported after %.1f s\n", s);
  return rc == 0 && s < 20 ? 0 : 1;
}

int DeadPeer() {
  // Rank 1's SIGKILL is the point: only rank 0's result counts.
  return ForkEach(2, [&](int rank, int port) {
    auto world = World(rank, 2, port, {.timeout = std::chrono::seconds(10)});
    const Status ready = world.ok() ? (*world)->Barrier() : world.status();
    if (!ready.ok()) {
      std::printf("rank %d before the allreduce: %s\n", rank, ready.ToString().c_str());
      return 1;
    }
    if (rank == 1) raise(SIGKILL);
    float buf[4] = {};
    const auto t0 = std::chrono::steady_clock::now();
    Status s = (*world)->AllReduce(buf, buf, 4, DType::kF32, ReduceOp::kSum);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("rank 0 after its peer died: %s (%.1f s)\n", s.ToString().c_str(), secs);
    return !s.ok() && s.message().find("rank 0") != std::string::npos && secs < 30 ? 0 : 1;
  })[0];
}

}  // namespace

int main(int argc, char** argv) {
  std::fflush(stdout);  // nothing buffered is duplicated into the workers
  const std::string mode = argc > 1 ? argv[1] : "";
  const int n = argc > 2 ? std::atoi(argv[2]) : 2;
  if (mode == "suite") return Suite(n, argc > 3 && std::string(argv[3]) == "deterministic");
  if (mode == "env") return Env(n);
  if (mode == "mismatch") return Mismatch();
  if (mode == "absent") return Absent();
  if (mode == "deadpeer") return DeadPeer();
  std::fprintf(stderr,
               "usage: comm_gloo_test suite N [deterministic] | env N | mismatch | "
               "absent | deadpeer\n");
  return 2;
}
