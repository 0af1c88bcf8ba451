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
//   rejoin                   rank 2 of 3 dies (SIGKILL): ranks 0 and 1 go on
//                            talking, sends and receives to 2 fail naming it,
//                            and a new process (not in the world) forms a
//                            group with rank 0 through the world's rendezvous
//   midmessage               rank 1 dies partway through sending rank 0 a
//                            large message, rank 2 partway through receiving
//                            one from rank 0: both of rank 0's waits fail
//                            within seconds naming the dead rank (not after
//                            the timeout), its pair with rank 3 still works,
//                            and rank 3's last message, sent before it
//                            exits, is taken after its exit
// Exit 0 when every worker did what was expected.
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
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

int Rejoin() {
  const int port = FreePort();
  const CommOptions options{.timeout = std::chrono::seconds(4)};
  // Exchanges `round` between world ranks 0 and 1 (tags 3 and 4).
  auto exchange = [](Communicator& c, int round) -> bool {
    int64_t mine = 100 * c.rank() + round, got = -1;
    const int peer = 1 - c.rank();
    Status s = c.rank() == 0 ? c.Send(&mine, 1, DType::kI64, peer, 3)
                             : c.Recv(&got, 1, DType::kI64, peer, 3);
    if (s.ok()) {
      s = c.rank() == 0 ? c.Recv(&got, 1, DType::kI64, peer, 4)
                        : c.Send(&mine, 1, DType::kI64, peer, 4);
    }
    std::printf("rank %d round %d: %s, got %lld\n", c.rank(), round, s.ToString().c_str(),
                static_cast<long long>(got));
    return s.ok() && got == 100 * peer + round;
  };
  auto worker = [&](int rank) -> int {
    auto world = World(rank, 3, port, options);
    const Status ready = world.ok() ? (*world)->Barrier() : world.status();
    if (!ready.ok()) {
      std::printf("rank %d: %s\n", rank, ready.ToString().c_str());
      return 1;
    }
    Communicator& w = **world;
    if (rank == 2) raise(SIGKILL);
    bool ok = exchange(w, 0);
    if (rank == 0) {
      // The dead rank: both directions fail at once, naming it.
      int64_t v = 0;
      const Status r = w.Recv(&v, 1, DType::kI64, 2, 7);
      const Status s = w.Send(&v, 1, DType::kI64, 2, 7);
      std::printf("rank 0 with rank 2 dead: %s / %s\n", r.ToString().c_str(), s.ToString().c_str());
      ok = ok && r.code() == StatusCode::kAborted && s.code() == StatusCode::kAborted &&
           r.message().find("receive from rank 2") != std::string::npos &&
           r.message().find("rank 0 on 'world': rank 0") == std::string::npos;
    }
    ok = exchange(w, 1) && ok;
    if (rank == 0) {
      // The newcomer, its member 1; then both ways and a collective.
      auto group = ConnectGlooGroup(w, "rejoin.2.1", 0, 2);
      if (!group.ok()) {
        std::printf("rank 0 group: %s\n", group.status().ToString().c_str());
        return 1;
      }
      int64_t x = 41, y = -1;
      Status s = (*group)->Send(&x, 1, DType::kI64, 1, 0);
      if (s.ok()) s = (*group)->Recv(&y, 1, DType::kI64, 1, 0);
      float sum = 1.5f;
      if (s.ok()) s = (*group)->AllReduce(&sum, &sum, 1, DType::kF32, ReduceOp::kSum);
      std::printf("rank 0 with the newcomer: %s, got %lld, sum %.1f\n", s.ToString().c_str(),
                  static_cast<long long>(y), sum);
      ok = ok && s.ok() && y == 42 && sum == 4.0f;
    }
    // The world's other pairs still work after the group formed.
    ok = exchange(w, 2) && ok;
    if (rank == 0) {
      // A group nobody else joins: named after the timeout.
      auto lonely = ConnectGlooGroup(w, "nobody", 0, 2);
      std::printf("rank 0 alone: %s\n", lonely.status().ToString().c_str());
      ok = ok && lonely.status().code() == StatusCode::kDeadlineExceeded &&
           lonely.status().message().find("group 'nobody'") != std::string::npos;
    }
    return ok ? 0 : 1;
  };
  std::vector<pid_t> pids;
  for (int r = 0; r < 3; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      const int rc = worker(r);
      std::fflush(stdout);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  int status = 0;
  waitpid(pids[2], &status, 0);
  const bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  // The process started in rank 2's place: outside the world, its table's.
  const pid_t newcomer = fork();
  if (newcomer == 0) {
    RankTable t{2, 3, "127.0.0.1", port, "test"};
    auto group = JoinGlooGroup(t, "rejoin.2.1", 1, 2, options);
    if (!group.ok()) {
      std::printf("newcomer: %s\n", group.status().ToString().c_str());
      std::fflush(stdout);
      _exit(1);
    }
    int64_t got = -1;
    Status s = (*group)->Recv(&got, 1, DType::kI64, 0, 0);
    int64_t reply = got + 1;
    if (s.ok()) s = (*group)->Send(&reply, 1, DType::kI64, 0, 0);
    float sum = 2.5f;
    if (s.ok()) s = (*group)->AllReduce(&sum, &sum, 1, DType::kF32, ReduceOp::kSum);
    std::printf("newcomer: %s, got %lld, sum %.1f\n", s.ToString().c_str(),
                static_cast<long long>(got), sum);
    std::fflush(stdout);
    _exit(s.ok() && got == 41 && sum == 4.0f ? 0 : 1);
  }
  pids[2] = newcomer;
  bool ok = killed;
  for (int r = 0; r < 3; ++r) {
    waitpid(pids[r], &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::printf("%s %d: exit %d\n", r == 2 ? "newcomer for rank" : "rank", r, code);
    ok = ok && code == 0;
  }
  return ok ? 0 : 1;
}

int MidMessage() {
  constexpr size_t kBytes = size_t{256} << 20;  // ~0.1 s on loopback here
  constexpr size_t kLast = size_t{1} << 20;     // rank 3's last message
  const auto timeout = std::chrono::seconds(30);
  // A page the workers share: rank 0 tells rank 1 there that rank 1's
  // bytes have started to arrive.
  auto* started = static_cast<std::atomic<int>*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (started) std::atomic<int>(0);
  // Spins until `done` (at most 10 s): false when it never came.
  auto until = [](const std::function<bool()>& done) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done()) {
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::yield();
    }
    return true;
  };
  // A byte Gloo's thread writes, read while it does.
  auto first = [](std::vector<char>& v) { return std::atomic_ref<char>(v[0]).load(); };
  return ForkEach(4, [&](int rank, int port) {
    auto world = World(rank, 4, port, {.timeout = timeout});
    if (!world.ok()) {
      std::printf("rank %d: %s\n", rank, world.status().ToString().c_str());
      return 1;
    }
    Communicator& w = **world;
    std::vector<char> buf(rank == 3 ? kLast : kBytes, rank == 0 ? '\xff' : '\0');
    std::vector<char> out(rank == 0 ? kBytes : 0, '\x5a');
    std::vector<char> last(rank == 0 ? kLast : 0, '\0');
    // Every receive is posted before the barrier: the data starts at once.
    Result<Request> in = rank == 0   ? w.IRecv(buf.data(), kBytes, DType::kU8, 1, 1)
                         : rank == 2 ? w.IRecv(buf.data(), kBytes, DType::kU8, 0, 2)
                                     : Result<Request>(Request());
    Result<Request> in_last =
        rank == 0 ? w.IRecv(last.data(), kLast, DType::kU8, 3, 5) : Result<Request>(Request());
    Status s = in.ok() && in_last.ok() ? w.Barrier() : in.status();
    if (!s.ok()) {
      std::printf("rank %d before the messages: %s\n", rank, s.ToString().c_str());
      return 1;
    }
    if (rank == 1) {  // dies once its bytes have started to arrive
      [[maybe_unused]] Result<Request> send = w.ISend(buf.data(), kBytes, DType::kU8, 0, 1);
      until([&] { return started->load() == 1; });
      raise(SIGKILL);
    }
    if (rank == 2) {  // dies once rank 0's bytes have started to arrive
      until([&] { return first(buf) != '\0'; });
      raise(SIGKILL);
    }
    if (rank == 3) {  // a round trip, then a last message, then it exits
      int64_t v = 0;
      s = w.Recv(&v, 1, DType::kI64, 0, 3);
      if (s.ok()) s = w.Send(&v, 1, DType::kI64, 0, 4);
      std::fill(buf.begin(), buf.end(), '\x33');
      if (s.ok()) s = w.Send(buf.data(), kLast, DType::kU8, 0, 5);
      std::printf("rank 3: %s, got %lld\n", s.ToString().c_str(), static_cast<long long>(v));
      return s.ok() && v == 7 ? 0 : 1;
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto since = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    Result<Request> out_req = w.ISend(out.data(), kBytes, DType::kU8, 2, 2);
    const bool arriving = until([&] { return first(buf) != '\xff'; });
    started->store(1);
    const Status r = in->Wait();
    const double recv_s = since();
    const Status snd = out_req.ok() ? out_req->Wait() : out_req.status();
    const double send_s = since();
    const size_t got = static_cast<size_t>(std::count(buf.begin(), buf.end(), '\0'));
    std::printf("rank 0 receiving from the dead rank 1 (%zu of %zu bytes came): %s (%.2f s)\n", got,
                kBytes, r.ToString().c_str(), recv_s);
    std::printf("rank 0 sending to the dead rank 2: %s (%.2f s)\n", snd.ToString().c_str(), send_s);
    int64_t v = 7, back = -1;
    s = w.Send(&v, 1, DType::kI64, 3, 3);
    if (s.ok()) s = w.Recv(&back, 1, DType::kI64, 3, 4);
    std::printf("rank 0 with rank 3: %s, got %lld\n", s.ToString().c_str(),
                static_cast<long long>(back));
    // Rank 3's last message, waited for well after it has exited (its pair
    // closed): it came whole, so the wait takes it.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const Status l = in_last->Wait();
    const bool whole = std::count(last.begin(), last.end(), '\x33') == kLast;
    std::printf("rank 0, rank 3's last message after its exit: %s, %s\n", l.ToString().c_str(),
                whole ? "whole" : "not whole");
    const bool mid = arriving && got > 0 && got < kBytes;  // else the kill missed the message
    return mid && r.code() == StatusCode::kAborted &&
                   r.message().find("rank 1 closed") != std::string::npos && recv_s < 5 &&
                   snd.code() == StatusCode::kAborted &&
                   snd.message().find("rank 2") != std::string::npos && send_s < 5 && s.ok() &&
                   back == 7 && l.ok() && whole
               ? 0
               : 1;
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
  if (mode == "rejoin") return Rejoin();
  if (mode == "midmessage") return MidMessage();
  std::fprintf(stderr,
               "usage: comm_gloo_test suite N [deterministic] | env N | mismatch | "
               "absent | deadpeer | rejoin | midmessage\n");
  return 2;
}
