// Asynchronous parameter servers over Gloo processes that lose a worker
// and take a replacement: 2 servers and 2 workers (staleness 1) forked as
// a launcher starts them, each with its rank table. Worker 1 is killed
// (SIGKILL) after its push of step 4; the servers drop it and go on with
// worker 0; a new process started in its place (PsClient::Rejoin, restart
// 1) registers with both servers; each sends it, at its next round
// boundary, its step and its pieces' weights (checked against those worker
// 0 installed for the same round of that server) and goes on without
// waiting; the replacement trains to the end (14 steps), each server
// taking its pushes from its next boundary after the replacement started.
// With argument "both", both workers are killed after step 4: the servers,
// with no live worker, wait for replacements; both rejoin and train to
// the end. With "abort", worker 1 stops on an error of its own (it sends
// kAbort and exits): that is no death, and the servers fail naming it. Exit 0 when every process
// did what was expected.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/gloo.h"
#include "runtime/comm/launch.h"
#include "runtime/model/param_server.h"
#include "tests/runtime/comm/free_port.h"

using namespace tessera;

namespace {

constexpr int kServers = 2, kWorkers = 2, kSteps = 14, kStaleness = 1, kKilledAfter = 4;
bool g_both = false;   // both workers killed and replaced
bool g_abort = false;  // worker 1 stops on an error instead: the job fails
const GptConfig kConfig{.layers = 1, .heads = 2, .embed = 16, .context = 8, .vocab = 32};
const CommOptions kOptions{.timeout = std::chrono::seconds(20)};

// The weights of server `server`'s pieces.
uint64_t Hash(const std::vector<float>& v, const PsProtocol& protocol, int server) {
  uint64_t h = 1469598103934665603ull;
  for (const PsProtocol::Message& m : protocol.messages()) {
    if (m.server != server) continue;
    const auto* p = reinterpret_cast<const unsigned char*>(v.data() + m.offset);
    for (size_t i = 0; i < m.count * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  return h;
}

// A worker's gradient of step `step`: made up, the same for any process
// playing worker w.
void FillGrads(Gpt& model, int w, int64_t step) {
  std::vector<float>& g = model.grads();
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = 0.001f * static_cast<float>(static_cast<int64_t>(i % 7) - 3) *
           static_cast<float>(w + 1) * static_cast<float>(1 + step % 3);
  }
}

Result<PsPlacement> Placement() {
  ASSIGN_OR_RETURN(std::vector<ParamInfo> params, Gpt::Params(kConfig));
  return PsPlacement::Create(params, kServers, "all");
}

#define CHECK_OK(expr)                                                        \
  do {                                                                        \
    const Status _s = (expr);                                                 \
    if (!_s.ok()) {                                                           \
      std::printf("%s: %s: %s\n", who.c_str(), #expr, _s.ToString().c_str()); \
      std::fflush(stdout);                                                    \
      return 1;                                                               \
    }                                                                         \
  } while (0)

// Steps from model.step() + 1 to kSteps; worker 0 records the weights it
// installs for each round (staleness 1: before step s, round s - 2's).
int TrainSteps(const std::string& who, PsClient& client, Gpt& model, int w, const std::string& dir,
               bool die) {
  std::ofstream rounds;
  if (w == 0) rounds.open(dir + "/worker0.txt");
  for (int64_t step = model.step() + 1; step <= kSteps; ++step) {
    CHECK_OK(client.AwaitStale(model));
    for (int s = 0; s < kServers && w == 0 && step - 1 - kStaleness >= 1; ++s) {
      rounds << s << " " << step - 1 - kStaleness << " "
             << Hash(model.weights(), client.protocol(), s) << "\n";
      rounds.flush();
    }
    FillGrads(model, w, step);
    float norm = 0;
    CHECK_OK(client.PushAsync(model, 0.0f, &norm));
    if (die && step == kKilledAfter) {
      // Killed right after posting: its push may be partly on the wire
      // (the server's wait on it then ends through Gloo's pair watch).
      if (!g_abort) raise(SIGKILL);
      (void)client.Stop(/*failed=*/true);  // an error of its own: kAbort
      std::fflush(stdout);
      _exit(3);
    }
    // Worker 0 takes its time: the replacement joins while it trains.
    if (w == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  CHECK_OK(client.Finish(model));
  return 0;
}

int Process(int rank, int port, const std::string& dir) {
  const std::string who = "rank " + std::to_string(rank);
  RankTable table{rank, kServers + kWorkers, "127.0.0.1", port, "test"};
  auto world = CreateGlooWorld(table, kOptions);
  CHECK_OK(world.status());
  auto placement = Placement();
  CHECK_OK(placement.status());
  if (rank < kServers) {
    auto server = PsServer::Create(kConfig, *placement, **world);
    CHECK_OK(server.status());
    CHECK_OK((*server)->Init(7));
    (*server)->SetAsynchronous(/*replaceable=*/true);
    for (;;) {
      auto asked = (*server)->Next();
      if (g_abort && !asked.ok()) {
        // Not dropped as dead: the job fails, naming the worker.
        const std::string why = asked.status().ToString();
        std::printf("%s (server): %s\n", who.c_str(), why.c_str());
        return why.find("worker 1 (rank 3) stopped on an error") != std::string::npos &&
                       (*server)->dropped() == 0
                   ? 0
                   : 1;
      }
      CHECK_OK(asked.status());
      if (asked->command == PsProtocol::kStop) break;
      if (asked->command != PsProtocol::kStep) {
        std::printf("%s: unexpected command %lld\n", who.c_str(),
                    static_cast<long long>(asked->command));
        return 1;
      }
      CHECK_OK((*server)->StepAsync(asked->worker, AdamWConfig{}));
    }
    std::printf("%s (server): %lld steps, %d dropped, %d admitted\n", who.c_str(),
                static_cast<long long>((*server)->step()), (*server)->dropped(),
                (*server)->admitted());
    // Rounds: worker 0's 14, and more where the replacement, which pushes
    // steps from the round it was sent, was taken in rounds later (with
    // both replaced, fewer where both were sent rounds behind their step).
    const int64_t rounds = (*server)->step();
    const int replaced = g_both ? 2 : 1;
    return rounds >= kSteps - (g_both ? 2 * (kStaleness + 1) : 0) &&
                   rounds <= kSteps + 2 * (kStaleness + 1) && (*server)->dropped() == replaced &&
                   (*server)->admitted() == replaced
               ? 0
               : 1;
  }
  const int w = rank - kServers;
  auto model = Gpt::Create(kConfig);
  CHECK_OK(model.status());
  model->Init(7);
  auto client = PsClient::Create(*placement, **world, *model);
  CHECK_OK(client.status());
  CHECK_OK((*client)->SetAsynchronous(kStaleness, *model));
  return TrainSteps(who, **client, *model, w, dir, /*die=*/w == 1 || g_both);
}

// The process started in worker w's place: outside the world.
int Replacement(int w, int port, const std::string& dir) {
  const std::string who = "replacement of worker " + std::to_string(w);
  RankTable table{kServers + w, kServers + kWorkers, "127.0.0.1", port, "test"};
  auto placement = Placement();
  CHECK_OK(placement.status());
  auto model = Gpt::Create(kConfig);
  CHECK_OK(model.status());
  model->Init(7);
  const std::vector<float> initial = model->weights();
  auto client =
      PsClient::Rejoin(*placement, kWorkers, table, w, /*restart=*/1, *model, kStaleness, kOptions);
  CHECK_OK(client.status());
  const std::vector<int64_t>& at = (*client)->joined_at();
  std::ofstream joined(dir + "/joined" + std::to_string(w) + ".txt");
  for (int s = 0; s < kServers; ++s) {
    std::printf("%s: server %d sent round %lld\n", who.c_str(), s, static_cast<long long>(at[s]));
    joined << s << " " << at[s] << " " << Hash(model->weights(), (*client)->protocol(), s) << "\n";
    // Worker 1 had the replies to its pushes up to 4 - 1 - K when it died.
    if (at[s] < kKilledAfter - 1 - kStaleness || at[s] >= kSteps) return 1;
  }
  joined.close();
  if (model->step() != *std::max_element(at.begin(), at.end()) || model->weights() == initial) {
    std::printf("%s: step %lld, weights %s\n", who.c_str(), static_cast<long long>(model->step()),
                model->weights() == initial ? "initial" : "trained");
    return 1;
  }
  // (With both replaced, worker 0's record is its replacement's: not
  // compared.)
  return TrainSteps(who, **client, *model, w, dir, false);
}

}  // namespace

int main(int argc, char** argv) {
  g_both = argc > 1 && std::string(argv[1]) == "both";
  g_abort = argc > 1 && std::string(argv[1]) == "abort";
  std::fflush(stdout);
  char tmpl[] = "/tmp/ps_rejoin.XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const int port = testing::FreePort();
  std::vector<pid_t> pids;
  for (int r = 0; r < kServers + kWorkers; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      const int rc = Process(r, port, dir);
      std::fflush(stdout);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  // Worker 1 (with "both", each worker) dies; a launcher restarts it (alone).
  int status = 0;
  bool ok = true;
  if (g_abort) {  // the servers fail; worker 0 fails after them
    int status = 0;
    bool ok = true;
    for (int r = 0; r < kServers + kWorkers; ++r) {
      waitpid(pids[r], &status, 0);
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      std::printf("rank %d: exit %d\n", r, code);
      if (r < kServers) ok = ok && code == 0;
      if (r == kServers + 1) ok = ok && code == 3;
    }
    (void)std::system(("rm -rf " + dir).c_str());
    return ok ? 0 : 1;
  }
  for (int w = g_both ? 0 : 1; w < kWorkers; ++w) {
    waitpid(pids[kServers + w], &status, 0);
    const bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    std::printf("worker %d: %s\n", w,
                killed ? "killed after its push of step 4" : "did not die as planned");
    std::fflush(stdout);
    ok = ok && killed;
    const pid_t replacement = fork();
    if (replacement == 0) {
      const int rc = Replacement(w, port, dir);
      std::fflush(stdout);
      _exit(rc);
    }
    pids[kServers + w] = replacement;
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    waitpid(pids[i], &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    const bool replaced = i == kServers + 1 || (g_both && i == kServers);
    std::printf("%s %zu: exit %d\n", replaced ? "replacement of rank" : "rank", i, code);
    ok = ok && code == 0;
  }
  if (g_both) {
    (void)std::system(("rm -rf " + dir).c_str());
    return ok ? 0 : 1;
  }
  // The weights the replacement got from each server are those worker 0
  // installed for the same round of that server.
  std::map<std::pair<int, int64_t>, uint64_t> worker0;
  {
    std::ifstream in(dir + "/worker0.txt");
    int server;
    int64_t round;
    uint64_t hash;
    while (in >> server >> round >> hash) worker0[{server, round}] = hash;
  }
  std::ifstream in(dir + "/joined1.txt");
  int server = 0, checked = 0;
  int64_t at = -1;
  uint64_t hash = 0;
  bool same = true;
  while (in >> server >> at >> hash) {
    const bool equal = worker0.count({server, at}) > 0 && worker0[{server, at}] == hash;
    std::printf("server %d's round %lld: the replacement's weights %s worker 0's\n", server,
                static_cast<long long>(at), equal ? "equal" : "differ from");
    same = same && equal;
    ++checked;
  }
  same = same && checked == kServers;
  (void)std::system(("rm -rf " + dir).c_str());
  return ok && same ? 0 : 1;
}
