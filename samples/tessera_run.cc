// tessera-run: starts a job's processes and keeps the job going, in the
// spirit of torchrun and MindSpore's msrun. Three ways to start a job:
//
//   tessera-run --nproc-per-node 4 -- train_gpt --tp 2 --save ck --resume ...
//       4 local worker processes over Gloo (no MPI anywhere): each gets its
//       rank table (TESSERA_RANK / TESSERA_WORLD_SIZE / TESSERA_MASTER, and
//       torchrun's RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT).
//   tessera-run --nnodes 2 --node-rank K --master HOST:PORT --nproc-per-node 4 -- ...
//       the same on several hosts: run it once per host; node 0 (on HOST)
//       keeps the launchers' store on PORT and its rank 0 worker serves the
//       workers' rendezvous on PORT + 1 + attempt (or, when something else
//       holds that port on HOST, the next free one, which node 0 announces
//       in its store).
//   tessera-run --np 4 [--hostfile H] -- train_gpt ...     under mpirun
//   tessera-run --ranks 4 -- train_gpt --ranks {ranks} ... one process of
//       in-process ranks
//
// Workers (--nproc-per-node): every output line is printed with its rank
// ("[rank 3] step 10 ...") and kept in LOG_DIR/rank-<r>.log; SIGINT and
// SIGTERM are forwarded to every worker. A worker that dies, or that stops
// touching its heartbeat file (TESSERA_HEARTBEAT_FILE, which train_gpt
// touches every step) for --heartbeat-timeout seconds, ends the attempt on
// every node (heartbeat files are in LOG_DIR, else /tmp, where a launcher
// removes those that launchers killed outright left behind): all workers
// are stopped and the job starts again, up to
// --max-restarts times, from its newest complete checkpoint (the job
// resumes itself: train_gpt --resume). Elastic: a node whose launcher does
// not come back within --join-timeout is left out and the job restarts on
// the nodes that did (at least --min-nodes), resharding its checkpoint on
// load. With --np, a --hostfile is read again before every attempt
// (run_resilient's job: a scheduler removes a dead host from it).
//
// Parameter servers (--ps-servers S): the first S ranks of the job serve
// parameters, the rest are workers; every process gets TESSERA_PS_SERVERS
// (through mpirun's -x under --np). With --ps-replace-workers (Gloo
// workers, asynchronous servers) every process also gets
// TESSERA_PS_REPLACEABLE=1, and a worker rank killed by a signal is
// started again alone with TESSERA_PS_REJOIN=n (its n-th replacement this
// attempt) while the others go on: it rejoins the servers through rank
// 0's rendezvous. A server's death, or a worker's non-zero exit (an error
// of its own), still ends the attempt.
//
// In COMMAND, {ranks} becomes the job's number of ranks in each attempt.
// Every process gets TESSERA_RESTART_COUNT (0 in the first attempt).
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/env.h"
#include "formats/native_files.h"
#include "runtime/comm/kv_store.h"
#include "runtime/comm/launch.h"
#include "runtime/comm/tcp.h"

using namespace tessera;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

volatile sig_atomic_t g_signal = 0;
void OnSignal(int sig) { g_signal = sig; }

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string Describe(int status) {
  if (WIFSIGNALED(status)) {
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

// Slots a hostfile lists ("host slots=N", or one per host line); -1 when it
// cannot be read.
int Slots(const std::string& path) {
  std::ifstream in(path);
  if (!in) return -1;
  int slots = 0;
  std::string line;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string host, word;
    if (!(words >> host)) continue;
    int n = 1;
    while (words >> word) {
      if (word.rfind("slots=", 0) == 0) n = std::atoi(word.c_str() + 6);
    }
    slots += n;
  }
  return slots;
}

// The value of `--flag VALUE` or `--flag=VALUE` in the job's command.
std::string FlagValue(const std::vector<std::string>& args, const std::string& flag) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == flag && i + 1 < args.size()) return args[i + 1];
    if (args[i].rfind(flag + "=", 0) == 0) return args[i].substr(flag.size() + 1);
  }
  return "";
}

std::vector<std::string> Substitute(const std::vector<std::string>& command, int ranks) {
  std::vector<std::string> out;
  for (std::string a : command) {
    for (size_t at; (at = a.find("{ranks}")) != std::string::npos;) {
      a.replace(at, 7, std::to_string(ranks));
    }
    out.push_back(a);
  }
  return out;
}

std::string Join(const std::vector<std::string>& v, const char* sep = " ") {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

// Starts `args` in a process group of its own with `env` added; its stdout
// and stderr go to `out_fd` (-1: inherited).
pid_t Spawn(const std::vector<std::string>& args, const std::vector<std::string>& env, int out_fd) {
  // Everything the child needs is built before fork: after it, only
  // async-signal-safe calls (node 0's launcher has store threads).
  std::vector<char*> cargs;
  for (const std::string& a : args) cargs.push_back(const_cast<char*>(a.c_str()));
  cargs.push_back(nullptr);
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) envs.push_back(*e);
  for (const std::string& e : env) envs.push_back(e);
  std::vector<char*> cenv;
  for (const std::string& e : envs) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  const std::string cannot = "tessera-run: cannot run '" + args[0] + "'\n";
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid != 0) {
    if (pid > 0) setpgid(pid, pid);
    return pid;
  }
  setpgid(0, 0);
  // A worker dies with its launcher (a killed node takes its workers along,
  // as a dead host would) instead of running on unsupervised.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);  // the launcher died before the line above
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  if (out_fd >= 0) {
    dup2(out_fd, STDOUT_FILENO);
    dup2(out_fd, STDERR_FILENO);
    close(out_fd);
  }
  execvpe(cargs[0], cargs.data(), cenv.data());
  (void)!write(STDERR_FILENO, cannot.data(), cannot.size());
  _exit(127);
}

// A port a listener can take now (bind and listen as the workers'
// rendezvous does): `from` itself or the next free one above it (up to 64
// on), or the kernel's pick when `from` is 0; -1 when none.
int FreePort(int from) {
  if (from == 0) {
    Result<tcp::Socket> s = tcp::Listen(0, "probe");
    Result<int> bound = s.ok() ? tcp::BoundPort(*s) : Result<int>(s.status());
    return bound.ok() ? *bound : -1;
  }
  for (int p = from; p < from + 64 && p < 65536; ++p) {
    if (tcp::Listen(p, "probe").ok()) return p;
  }
  return -1;
}

// Where the job would resume from, for the attempt's line.
std::string ResumesFrom(const std::string& save) {
  if (save.empty()) return "from scratch (or its own --resume)";
  const auto latest = ResumeCheckpoint(Env::Default(), save);
  return latest.ok() ? "from " + save + "/" + *latest : "from scratch (no checkpoint yet)";
}

// ---- one child (mpirun or in-process ranks): run_resilient's job ---------

int RunSingle(const std::vector<std::string>& args, int attempt) {
  const pid_t child = Spawn(args, {RestartEnvironment(attempt)}, -1);
  if (child < 0) return -1;
  int status = 0;
  bool forwarded = false;
  Clock::time_point since;
  while (true) {
    const pid_t r = waitpid(child, &status, WNOHANG);
    if (r == child) break;
    if (g_signal != 0 && !forwarded) {
      kill(-child, g_signal);  // once; then SIGKILL if it does not end
      forwarded = true;
      since = Clock::now();
    } else if (forwarded && Since(since) > 10) {
      kill(-child, SIGKILL);
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
  return status;
}

// ---- workers ---------------------------------------------------------------

struct Worker {
  int rank = 0, local = 0;
  pid_t pid = -1;
  int out = -1;         // read end of its output pipe
  std::string partial;  // an unfinished line
  FILE* log = nullptr;
  std::string heartbeat;
  int replaced = 0;  // replacements started this attempt
  bool exited = false;
  Clock::time_point exited_at;
  int status = 0;
};

struct WorkerOptions {
  int nproc = 1;
  double heartbeat_timeout = 0;  // seconds; 0: off
  std::string log_dir;
  bool quiet = false;
  // --ps-replace-workers: a worker rank >= ps_servers killed by a signal is
  // started again alone, up to `replacements` times per rank an attempt.
  int ps_servers = 0;
  bool replace = false;
  int replacements = 0;
};

// Prints and logs every complete line in `w`'s buffer (all of it at the end).
void Flush(Worker& w, bool all, bool quiet) {
  size_t at;
  while ((at = w.partial.find('\n')) != std::string::npos || (all && !w.partial.empty())) {
    const std::string line = at == std::string::npos ? w.partial : w.partial.substr(0, at);
    w.partial.erase(0, at == std::string::npos ? w.partial.size() : at + 1);
    if (!quiet) std::printf("[rank %d] %s\n", w.rank, line.c_str());
    if (w.log != nullptr) std::fprintf(w.log, "%s\n", line.c_str());
  }
  if (!quiet) std::fflush(stdout);
  if (w.log != nullptr) std::fflush(w.log);
}

// Whatever `w` (stopped) left in its pipe, read, the pipe closed, and all
// of it printed and logged.
void FinishOutput(Worker& w, bool quiet) {
  if (w.out >= 0) {
    char buf[65536];
    ssize_t n;
    while ((n = read(w.out, buf, sizeof(buf))) > 0) w.partial.append(buf, static_cast<size_t>(n));
    close(w.out);
    w.out = -1;
  }
  Flush(w, true, quiet);
}

// Stops every worker still running: SIGTERM, then SIGKILL after 5 s.
void StopAll(std::vector<Worker>& workers, int sig = SIGTERM) {
  for (Worker& w : workers) {
    if (!w.exited && w.pid > 0) kill(-w.pid, sig);
  }
  const auto t0 = Clock::now();
  for (Worker& w : workers) {
    while (!w.exited) {
      const pid_t r = waitpid(w.pid, &w.status, WNOHANG);
      if (r == w.pid || (r < 0 && errno == ECHILD)) {
        w.exited = true;
        break;
      }
      if (Since(t0) > 5) kill(-w.pid, SIGKILL);
      std::this_thread::sleep_for(milliseconds(20));
    }
  }
}

// The nodes' shared state for one attempt, in the launchers' store.
struct Membership {
  std::vector<int> nodes;  // node ranks taking part, ascending
  int index = 0;           // this node's position among them
  int worker_port = 0;     // where rank 0 serves the workers' rendezvous
};

class Launcher {
 public:
  Launcher(int nnodes, int node_rank, std::string master_host, int master_port, int min_nodes,
           double join_timeout)
      : nnodes_(nnodes),
        node_rank_(node_rank),
        host_(std::move(master_host)),
        port_(master_port),
        min_nodes_(min_nodes),
        join_timeout_(join_timeout) {}

  Status Connect() {
    if (node_rank_ == 0) {
      ASSIGN_OR_RETURN(server_, KvServer::Start(port_));
      port_ = server_->port();
    }
    const std::string host = node_rank_ == 0 ? "127.0.0.1" : host_;
    ASSIGN_OR_RETURN(
        kv_,
        KvClient::Connect(host, port_, milliseconds(static_cast<int64_t>(join_timeout_ * 1000))));
    return Status::Ok();
  }
  int port() const { return port_; }

  // Joins attempt `a`: node 0 waits for the previous attempt's nodes (all
  // nnodes at first) for --join-timeout, then names the members and the
  // workers' rendezvous port: `worker_port` when it is free on node 0 (else
  // the next free one above; another process may hold it, e.g. a
  // connection's ephemeral port), or any free port when it is 0.
  Result<Membership> JoinAttempt(int a, int worker_port) {
    const std::string k = "attempt/" + std::to_string(a);
    RETURN_IF_ERROR(kv_->Set(k + "/node/" + std::to_string(node_rank_), "1"));
    if (node_rank_ == 0) {
      const auto deadline = Clock::now() + milliseconds(static_cast<int64_t>(join_timeout_ * 1000));
      std::vector<int> present;
      while (true) {
        present.clear();
        for (int n : expected_) {
          ASSIGN_OR_RETURN(bool has, kv_->Has(k + "/node/" + std::to_string(n)));
          if (has) present.push_back(n);
        }
        if (present.size() == expected_.size() || Clock::now() >= deadline) break;
        std::this_thread::sleep_for(milliseconds(50));
      }
      // The members, or "!" and why the attempt cannot start.
      std::string list;
      for (int n : present) list += (list.empty() ? "" : ",") + std::to_string(n);
      const int port = FreePort(worker_port);
      if (static_cast<int>(present.size()) < min_nodes_) {
        list = "!fewer than --min-nodes " + std::to_string(min_nodes_) +
               " node(s) joined attempt " + std::to_string(a + 1);
      } else if (port < 0) {
        list = "!no free port on node 0 for the workers' rendezvous, from " +
               std::to_string(worker_port) + " to " + std::to_string(worker_port + 63);
      }
      RETURN_IF_ERROR(kv_->Set(k + "/port", std::to_string(port)));
      RETURN_IF_ERROR(kv_->Set(k + "/members", list));
    }
    ASSIGN_OR_RETURN(
        std::string list,
        kv_->Get(k + "/members", milliseconds(static_cast<int64_t>(join_timeout_ * 2000 + 10000))));
    if (!list.empty() && list[0] == '!') return FailedPreconditionError(list.substr(1));
    Membership m;
    ASSIGN_OR_RETURN(std::string port, kv_->Get(k + "/port", milliseconds(10000)));
    m.worker_port = std::stoi(port);
    std::stringstream ss(list);
    std::string item;
    while (std::getline(ss, item, ',')) m.nodes.push_back(std::stoi(item));
    auto it = std::find(m.nodes.begin(), m.nodes.end(), node_rank_);
    if (it == m.nodes.end()) {
      return FailedPreconditionError("node " + std::to_string(node_rank_) + " joined attempt " +
                                     std::to_string(a + 1) + " too late");
    }
    m.index = static_cast<int>(it - m.nodes.begin());
    expected_ = m.nodes;
    return m;
  }

  // The first node to fail names the cause (later failures are its
  // consequences).
  void Fail(int a, const std::string& why) {
    const std::string k = "attempt/" + std::to_string(a) + "/failed";
    Result<int64_t> first = kv_->Add(k + "/claim", 1);
    if (first.ok() && *first == 1)
      (void)kv_->Set(k, "node " + std::to_string(node_rank_) + ": " + why);
  }
  // Another node's verdict on attempt `a`, or "". A store that is gone is
  // no verdict: node 0 may have finished; a broken job fails its workers.
  std::string Failed(int a) {
    const std::string k = "attempt/" + std::to_string(a) + "/failed";
    Result<bool> has = kv_->Has(k);
    if (!has.ok() || !*has) return "";
    Result<std::string> why = kv_->Get(k, milliseconds(1000));
    return why.ok() ? *why : "failed";
  }
  // This node's workers all finished; node 0 keeps the store up until every
  // member's did (or the attempt failed), at most `grace`.
  void Done(int a, const Membership& m, double grace) {
    const std::string k = "attempt/" + std::to_string(a);
    (void)kv_->Set(k + "/done/" + std::to_string(node_rank_), "1");
    if (node_rank_ != 0) return;
    const auto until = Clock::now() + milliseconds(static_cast<int64_t>(grace * 1000));
    while (Clock::now() < until) {
      bool all = true;
      for (int n : m.nodes) {
        Result<bool> has = kv_->Has(k + "/done/" + std::to_string(n));
        all = all && has.ok() && *has;
      }
      Result<bool> failed = kv_->Has(k + "/failed");
      if (all || (failed.ok() && *failed)) return;
      std::this_thread::sleep_for(milliseconds(100));
    }
  }
  void SetExpected(int nnodes) {
    expected_.clear();
    for (int n = 0; n < nnodes; ++n) expected_.push_back(n);
  }

 private:
  int nnodes_, node_rank_;
  std::string host_;
  int port_, min_nodes_;
  double join_timeout_;
  std::unique_ptr<KvServer> server_;
  std::unique_ptr<KvClient> kv_;
  std::vector<int> expected_;
};

// Whether this node holds parameter servers (ranks below `servers`) and
// every one of them has exited 0: the job's end as the servers see it.
bool ServersFinished(const std::vector<Worker>& workers, int servers) {
  bool any = false;
  for (const Worker& w : workers) {
    if (w.rank >= servers) continue;
    if (!w.exited || !WIFEXITED(w.status) || WEXITSTATUS(w.status) != 0) return false;
    any = true;
  }
  return any;
}

// Runs one attempt of this node's workers. Returns "" when every worker
// exited 0, else why the attempt failed.
std::string RunWorkers(const std::vector<std::string>& args, const WorkerOptions& o,
                       const Membership& m, int attempt, const std::string& master_host,
                       int worker_port, Launcher& launcher) {
  const int world = static_cast<int>(m.nodes.size()) * o.nproc;
  std::vector<Worker> workers(o.nproc);
  // Starts w's process (`rejoin` > 0: its replacement number); "" or why not.
  auto start = [&](Worker& w, int rejoin) -> std::string {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      w.exited = true;  // nothing started: nothing to wait for or stop
      w.pid = -1;
      return std::string("pipe: ") + std::strerror(errno);
    }
    unlink(w.heartbeat.c_str());
    std::vector<std::string> env = WorkerEnvironment(
        {w.rank, world, w.local, o.nproc, master_host, worker_port, w.heartbeat, attempt});
    if (o.replace) env.push_back(std::string(kEnvPsReplaceable) + "=1");
    if (rejoin > 0) env.push_back(std::string(kEnvPsRejoin) + "=" + std::to_string(rejoin));
    w.pid = Spawn(args, env, fds[1]);
    close(fds[1]);
    w.out = fds[0];
    fcntl(w.out, F_SETFL, O_NONBLOCK);
    if (w.pid >= 0) return "";
    close(w.out);
    w.out = -1;
    w.exited = true;
    w.pid = -1;
    return std::string("fork: ") + std::strerror(errno);
  };
  for (int l = 0; l < o.nproc; ++l) {
    Worker& w = workers[l];
    w.local = l;
    w.rank = m.index * o.nproc + l;
    if (!o.log_dir.empty()) {
      const std::string path = o.log_dir + "/rank-" + std::to_string(w.rank) + ".log";
      w.log = std::fopen(path.c_str(), "ae");
      if (w.log != nullptr) std::fprintf(w.log, "== attempt %d\n", attempt + 1);
      w.heartbeat = o.log_dir + "/heartbeat-" + std::to_string(w.rank);
    } else {
      w.heartbeat =
          "/tmp/tessera-run-" + std::to_string(getpid()) + "-heartbeat-" + std::to_string(w.rank);
    }
    if (const std::string why = start(w, 0); !why.empty()) {
      if (w.log != nullptr) std::fclose(w.log);
      workers.resize(l);  // the ones started
      StopAll(workers, SIGKILL);
      for (Worker& x : workers) {
        if (x.out >= 0) close(x.out);
        if (x.log != nullptr) std::fclose(x.log);
      }
      return why;
    }
  }
  std::string failure;
  auto last_poll = Clock::now();
  auto servers_finished_at = Clock::now();
  std::string late;  // a replacement's failure, judged when the servers end
  Clock::time_point late_at;
  while (true) {
    std::vector<pollfd> fds;
    for (Worker& w : workers) {
      if (w.out >= 0) fds.push_back({w.out, POLLIN, 0});
    }
    if (!fds.empty())
      poll(fds.data(), fds.size(), 100);
    else
      std::this_thread::sleep_for(milliseconds(100));
    for (Worker& w : workers) {
      if (w.out < 0) continue;
      char buf[65536];
      while (true) {
        const ssize_t n = read(w.out, buf, sizeof(buf));
        if (n > 0) {
          w.partial.append(buf, static_cast<size_t>(n));
          continue;
        }
        if (n == 0) {  // the worker closed its output (exited)
          close(w.out);
          w.out = -1;
        }
        break;
      }
      Flush(w, w.out < 0, o.quiet);
    }
    bool all_done = true;
    // Replaceable workers: once every server of this node has finished (0),
    // the workers still running are replacements that came too late (or
    // workers dying after the end): given 10 s, then stopped, neither
    // replaced nor a failure.
    const bool served = o.replace && ServersFinished(workers, o.ps_servers);
    if (served && Since(servers_finished_at) > 10) {
      for (Worker& w : workers) {
        if (!w.exited && w.rank >= o.ps_servers && w.replaced > 0) kill(-w.pid, SIGKILL);
      }
    } else if (!served) {
      servers_finished_at = Clock::now();
    }
    for (Worker& w : workers) {
      if (!w.exited && waitpid(w.pid, &w.status, WNOHANG) == w.pid) {
        w.exited = true;
        w.exited_at = Clock::now();
        kill(-w.pid, SIGKILL);  // whatever it left behind in its group
        const bool ok = WIFEXITED(w.status) && WEXITSTATUS(w.status) == 0;
        const bool worker = o.replace && w.rank >= o.ps_servers;
        if (worker && !ok && (WIFSIGNALED(w.status) || w.replaced > 0) &&
            ServersFinished(workers, o.ps_servers)) {
          std::printf(
              "tessera-run: rank %d %s after the parameter servers finished: not replaced\n",
              w.rank, Describe(w.status).c_str());
          std::fflush(stdout);
        } else if (worker && !ok && w.replaced > 0 && late.empty()) {
          // A replacement that failed as the servers were ending (its
          // rendezvous gone): judged when they have exited, or in 10 s.
          late = "rank " + std::to_string(w.rank) + " " + Describe(w.status);
          late_at = Clock::now();
        } else if (worker && WIFSIGNALED(w.status) && w.replaced < o.replacements &&
                   failure.empty() && g_signal == 0) {
          // A dead asynchronous worker: started again alone, the others
          // going on (its output so far printed first).
          FinishOutput(w, o.quiet);
          ++w.replaced;
          std::printf(
              "tessera-run: rank %d %s: starting its replacement %d (the other ranks go "
              "on)\n",
              w.rank, Describe(w.status).c_str(), w.replaced);
          std::fflush(stdout);
          if (w.log != nullptr) std::fprintf(w.log, "== replacement %d\n", w.replaced);
          w.exited = false;
          w.partial.clear();
          if (const std::string why = start(w, w.replaced); !why.empty()) failure = why;
        } else if (!ok && failure.empty()) {
          failure = "rank " + std::to_string(w.rank) + " " + Describe(w.status);
        }
      }
      // A process outside its group may still hold the pipe: a second after
      // the worker exited, stop waiting for the end of its output.
      if (w.exited && w.out >= 0 && Since(w.exited_at) > 1.0) {
        close(w.out);
        w.out = -1;
        Flush(w, true, o.quiet);
      }
      all_done = all_done && w.exited && w.out < 0;
    }
    if (!late.empty() && (ServersFinished(workers, o.ps_servers) || all_done)) {
      if (ServersFinished(workers, o.ps_servers)) {
        std::printf("tessera-run: %s as the parameter servers finished: not replaced\n",
                    late.c_str());
        std::fflush(stdout);
      } else if (failure.empty()) {
        failure = late;
      }
      late.clear();
    } else if (!late.empty() && Since(late_at) > 10 && failure.empty()) {
      failure = late;
    }
    if (g_signal != 0 && failure.empty()) failure = "signal " + std::to_string(g_signal);
    if (failure.empty() && o.heartbeat_timeout > 0) {
      // Every silent worker, the one that got least far first (then the
      // longest silent): the one that hung, its peers waiting for it in a
      // collective having beaten once more.
      struct Silent {
        int64_t progress;
        double idle;
        const Worker* w;
      };
      std::vector<Silent> silent;
      for (const Worker& w : workers) {
        if (w.exited) continue;
        // Counted from the first beat: start-up (the rendezvous, loading a
        // checkpoint) may take longer than a step.
        struct stat st {};
        if (stat(w.heartbeat.c_str(), &st) != 0) continue;
        const double idle =
            std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                .count() -
            (st.st_mtim.tv_sec + st.st_mtim.tv_nsec * 1e-9);
        if (idle > o.heartbeat_timeout) {
          silent.push_back({Heartbeat::ReadProgress(w.heartbeat), idle, &w});
        }
      }
      std::sort(silent.begin(), silent.end(), [](const Silent& a, const Silent& b) {
        return a.progress != b.progress ? a.progress < b.progress : a.idle > b.idle;
      });
      for (size_t i = 0; i < silent.size(); ++i) {
        char text[200];
        std::snprintf(text, sizeof(text), "%srank %d (pid %d) no heartbeat for %.1f s",
                      i == 0 ? "hung: " : ", ", silent[i].w->rank,
                      static_cast<int>(silent[i].w->pid), silent[i].idle);
        failure += text;
        if (silent[i].progress >= 0) failure += " (at " + std::to_string(silent[i].progress) + ")";
      }
    }
    if (failure.empty() && Since(last_poll) > 0.2) {
      last_poll = Clock::now();
      failure = launcher.Failed(attempt);
    } else if (!failure.empty()) {
      launcher.Fail(attempt, failure);
    }
    if (!failure.empty()) {
      StopAll(workers, g_signal != 0 ? g_signal : SIGTERM);
      for (Worker& w : workers) FinishOutput(w, o.quiet);
      break;
    }
    if (all_done) break;
  }
  for (Worker& w : workers) {
    if (w.log != nullptr) std::fclose(w.log);
    unlink(w.heartbeat.c_str());
  }
  return failure;
}

}  // namespace

// Heartbeat files that launchers killed outright (SIGKILL: no chance to
// clean up) left in /tmp: those named for a process that no longer runs.
static void RemoveStaleHeartbeats() {
  DIR* dir = opendir("/tmp");
  if (dir == nullptr) return;
  while (const dirent* e = readdir(dir)) {
    int pid = 0, rank = 0, used = 0;
    if (std::sscanf(e->d_name, "tessera-run-%d-heartbeat-%d%n", &pid, &rank, &used) != 2 ||
        e->d_name[used] != '\0' || pid <= 0) {
      continue;
    }
    if (kill(pid, 0) != 0 && errno == ESRCH) unlink((std::string("/tmp/") + e->d_name).c_str());
  }
  closedir(dir);
}

int main(int argc, char** argv) {
  CLI::App app{
      "Start a job's processes (Gloo workers, mpirun or in-process ranks) and restart "
      "it from its newest checkpoint when a process dies or hangs"};
  int nproc = 0, nnodes = 1, node_rank = 0, np = 0, ranks = 0, min_nodes = 1, min_ranks = 1,
      max_restarts = 3, ps_servers = 0;
  double heartbeat_timeout = 0, join_timeout = 30;
  std::string master, hostfile, mpirun = "mpirun", log_dir;
  bool quiet = false;
  std::vector<std::string> command;
  app.add_option("--nproc-per-node", nproc, "worker processes on this node (the Gloo backend)")
      ->check(CLI::PositiveNumber);
  app.add_option("--nnodes", nnodes, "nodes of a multi-node job (one tessera-run on each)")
      ->check(CLI::PositiveNumber);
  app.add_option("--node-rank", node_rank, "this node's index, 0 .. nnodes - 1 (0: the master)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--master", master,
                 "HOST:PORT of node 0 (its launcher's store on PORT, the workers' rendezvous on "
                 "PORT + 1 + attempt, or the next free one); default 127.0.0.1 and a free port "
                 "on one node");
  app.add_option("--min-nodes", min_nodes, "restart on fewer nodes, down to this many")
      ->check(CLI::PositiveNumber);
  app.add_option("--join-timeout", join_timeout,
                 "seconds node 0 waits for the other nodes at each (re)start");
  app.add_option("--heartbeat-timeout", heartbeat_timeout,
                 "seconds without a heartbeat, once a worker has beaten, after which it counts "
                 "as hung (0: off)");
  app.add_option("--log-dir", log_dir, "keep each worker's output in LOG_DIR/rank-<r>.log");
  app.add_flag("--quiet,-q", quiet, "do not print the workers' output (only log it)");
  app.add_option("--np", np, "run COMMAND under mpirun with this many processes")
      ->check(CLI::PositiveNumber);
  app.add_option("--hostfile", hostfile,
                 "with --np: read before every attempt, the ranks are the slots it lists");
  app.add_option("--min-ranks", min_ranks, "with --np: fewer slots than this ends the run")
      ->check(CLI::PositiveNumber);
  app.add_option("--ranks", ranks, "run COMMAND as one process with {ranks} in-process ranks")
      ->check(CLI::PositiveNumber);
  app.add_option("--mpirun", mpirun, "the mpirun to use");
  app.add_option("--max-restarts", max_restarts, "restarts before giving up")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--ps-servers", ps_servers,
                 "the job's first S ranks are parameter servers (TESSERA_PS_SERVERS for every "
                 "process)")
      ->check(CLI::NonNegativeNumber);
  bool ps_replace_workers = false;
  app.add_flag("--ps-replace-workers", ps_replace_workers,
               "with --ps-servers and --nproc-per-node, for asynchronous servers (train_gpt "
               "--ps-staleness): a worker killed by a signal is started again alone (up to "
               "--max-restarts times per rank an attempt) and rejoins the servers while the "
               "others go on; a server's death still restarts the job");
  app.add_option("command", command, "the job (after --)")->required();
  app.positionals_at_end();
  CLI11_PARSE(app, argc, argv);
  RemoveStaleHeartbeats();
  if ((nproc > 0) + (np > 0) + (ranks > 0) != 1) {
    std::fprintf(stderr,
                 "tessera-run: give one of --nproc-per-node (Gloo workers), --np "
                 "(mpirun) or --ranks (in-process ranks)\n");
    return 2;
  }
  if (ps_replace_workers && (ps_servers == 0 || nproc == 0)) {
    std::fprintf(stderr,
                 "tessera-run: --ps-replace-workers needs --ps-servers S and --nproc-per-node "
                 "(a replacement joins over Gloo)\n");
    return 2;
  }
  if (node_rank >= nnodes) {
    std::fprintf(stderr, "tessera-run: --node-rank %d is not below --nnodes %d\n", node_rank,
                 nnodes);
    return 2;
  }
  std::string master_host = "127.0.0.1";
  int master_port = 0;
  if (!master.empty()) {
    const size_t colon = master.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      std::fprintf(stderr, "tessera-run: --master '%s' is not HOST:PORT\n", master.c_str());
      return 2;
    }
    master_host = master.substr(0, colon);
    master_port = std::atoi(master.c_str() + colon + 1);
  } else if (nnodes > 1) {
    std::fprintf(stderr, "tessera-run: a multi-node job needs --master HOST:PORT\n");
    return 2;
  }
  if (!log_dir.empty()) (void)Env::Default()->CreateDirs(log_dir);
  if (ps_servers > 0) setenv(kEnvPsServers, std::to_string(ps_servers).c_str(), 1);
  const std::string save = FlagValue(command, "--save");
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  signal(SIGPIPE, SIG_IGN);

  std::unique_ptr<Launcher> launcher;
  if (nproc > 0) {
    launcher = std::make_unique<Launcher>(nnodes, node_rank, master_host, master_port, min_nodes,
                                          join_timeout);
    if (Status s = launcher->Connect(); !s.ok()) {
      std::fprintf(stderr, "tessera-run: %s\n", s.ToString().c_str());
      return 1;
    }
    launcher->SetExpected(nnodes);
  }
  for (int attempt = 0;; ++attempt) {
    const auto t0 = Clock::now();
    std::string failure;
    if (nproc > 0) {
      // One node and no --master: any free port; else PORT + 1 + attempt (or
      // the next free one above it), which node 0 announces.
      const int wanted = master.empty() ? 0 : launcher->port() + 1 + attempt;
      Result<Membership> m = launcher->JoinAttempt(attempt, wanted);
      if (!m.ok()) {
        std::fprintf(stderr, "tessera-run: %s\n", m.status().message().c_str());
        return 1;
      }
      if (wanted != 0 && m->worker_port != wanted) {
        std::printf("tessera-run: the workers' rendezvous is on port %d (%d was taken on node 0)\n",
                    m->worker_port, wanted);
      }
      const int world = static_cast<int>(m->nodes.size()) * nproc;
      const std::vector<std::string> args = Substitute(command, world);
      std::printf("tessera-run: attempt %d: node %d of %zu, ranks %d-%d of %d, %s\n  $ %s\n",
                  attempt + 1, m->index, m->nodes.size(), m->index * nproc,
                  m->index * nproc + nproc - 1, world, ResumesFrom(save).c_str(),
                  Join(args).c_str());
      std::fflush(stdout);
      failure = RunWorkers(
          args,
          {nproc, heartbeat_timeout, log_dir, quiet, ps_servers, ps_replace_workers, max_restarts},
          *m, attempt, master_host, m->worker_port, *launcher);
      if (failure.empty()) launcher->Done(attempt, *m, /*grace=*/60);
    } else {
      int n = np > 0 ? np : ranks;
      if (np > 0 && !hostfile.empty()) {
        const int slots = Slots(hostfile);
        if (slots < 0) {
          std::fprintf(stderr, "tessera-run: cannot read hostfile '%s'\n", hostfile.c_str());
          return 1;
        }
        n = std::min(n, slots);
      }
      if (n < min_ranks) {
        std::fprintf(stderr,
                     "tessera-run: %d rank(s) available, fewer than --min-ranks %d: "
                     "giving up\n",
                     n, min_ranks);
        return 1;
      }
      std::vector<std::string> args;
      if (np > 0) {
        args = {mpirun, "-np", std::to_string(n)};
        if (!hostfile.empty()) args.insert(args.end(), {"--hostfile", hostfile});
        if (ps_servers > 0) args.insert(args.end(), {"-x", kEnvPsServers});
      }
      for (const std::string& a : Substitute(command, n)) args.push_back(a);
      std::printf("tessera-run: attempt %d on %d rank(s), %s\n  $ %s\n", attempt + 1, n,
                  ResumesFrom(save).c_str(), Join(args).c_str());
      std::fflush(stdout);
      const int status = RunSingle(args, attempt);
      if (status < 0) {
        std::perror("tessera-run: fork");
        return 1;
      }
      if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        failure = "the job " + Describe(status);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 127) return 1;  // nothing to restart
      }
    }
    if (failure.empty()) {
      std::printf("tessera-run: the job finished after %d restart(s)\n", attempt);
      return 0;
    }
    std::printf("tessera-run: attempt %d failed after %.1f s: %s\n", attempt + 1, Since(t0),
                failure.c_str());
    std::fflush(stdout);
    if (g_signal != 0) return 128 + g_signal;
    if (attempt >= max_restarts) {
      std::fprintf(stderr, "tessera-run: giving up after %d restart(s) (--max-restarts)\n",
                   attempt);
      return 1;
    }
  }
}
