// Runs a training job and restarts it when a rank dies, from the newest
// complete checkpoint (the job resumes itself: train_gpt --resume), up to
// a bounded number of times, optionally on fewer ranks:
//
//   run_resilient --np 4 [--hostfile H --min-ranks 2] [--max-restarts 3]
//       -- train_gpt --tp 2 --save ck --save-every 5 --save-mode sliced --resume ...
//   run_resilient --ranks 4 -- train_gpt --ranks {ranks} --tp 2 ... --resume
//
// With --np the job runs under `mpirun -np N` (a rank is a process; when
// one dies, kill -9 included, mpirun ends the others and fails). With
// --ranks the job is one process of in-process ranks; its death is the
// death of them all. In COMMAND, {ranks} becomes the number of ranks of
// each attempt.
//
// Ranks on restart: with --hostfile (mpirun's format, "host slots=N"), the
// file is read again before every attempt and the job gets the slots it
// lists (at most --np / --ranks): a scheduler, or a person, removes a dead
// host from it and the job goes on on fewer ranks, resharding its
// checkpoint on load. Fewer than --min-ranks available ends the run.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "formats/native_files.h"

namespace {

pid_t child = -1;

void Forward(int sig) {
  if (child > 0) kill(-child, sig);  // the job's whole process group
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

std::string Describe(int status) {
  if (WIFSIGNALED(status)) {
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Run a training job; restart it from its newest checkpoint when a rank dies"};
  int np = 0, ranks = 0, min_ranks = 1, max_restarts = 3;
  std::string hostfile, mpirun = "mpirun";
  std::vector<std::string> command;
  app.add_option("--np", np, "run COMMAND under mpirun with this many processes")
      ->check(CLI::PositiveNumber);
  app.add_option("--ranks", ranks, "run COMMAND directly, with {ranks} this many in-process ranks")
      ->check(CLI::PositiveNumber);
  app.add_option("--hostfile", hostfile,
                 "read before every attempt: the ranks are the slots it lists (at most --np)");
  app.add_option("--min-ranks", min_ranks, "fewer ranks available than this ends the run")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-restarts", max_restarts, "restarts before giving up")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--mpirun", mpirun, "the mpirun to use");
  app.add_option("command", command, "the job (after --)")->required();
  app.positionals_at_end();
  CLI11_PARSE(app, argc, argv);
  if ((np > 0) == (ranks > 0)) {
    std::fprintf(stderr, "run_resilient: give exactly one of --np (mpirun) or --ranks (in-process)\n");
    return 2;
  }
  const int wanted = np > 0 ? np : ranks;
  const std::string save = FlagValue(command, "--save");
  signal(SIGINT, Forward);
  signal(SIGTERM, Forward);

  for (int attempt = 0;; ++attempt) {
    int n = wanted;
    if (!hostfile.empty()) {
      const int slots = Slots(hostfile);
      if (slots < 0) {
        std::fprintf(stderr, "run_resilient: cannot read hostfile '%s'\n", hostfile.c_str());
        return 1;
      }
      n = std::min(n, slots);
    }
    if (n < min_ranks) {
      std::fprintf(stderr, "run_resilient: %d rank(s) available, fewer than --min-ranks %d: "
                   "giving up\n", n, min_ranks);
      return 1;
    }
    std::vector<std::string> args;
    if (np > 0) {
      args = {mpirun, "-np", std::to_string(n)};
      if (!hostfile.empty()) args.insert(args.end(), {"--hostfile", hostfile});
    }
    for (std::string a : command) {
      for (size_t at; (at = a.find("{ranks}")) != std::string::npos;) {
        a.replace(at, 7, std::to_string(n));
      }
      args.push_back(a);
    }
    std::string from = "from scratch (or its own --resume)";
    if (!save.empty()) {
      const auto latest = tessera::ResumeCheckpoint(tessera::Env::Default(), save);
      if (latest.ok()) from = "from " + save + "/" + *latest;
    }
    std::string line;
    for (const std::string& a : args) line += (line.empty() ? "" : " ") + a;
    std::printf("run_resilient: attempt %d on %d rank(s), %s\n  $ %s\n", attempt + 1, n,
                from.c_str(), line.c_str());
    std::fflush(stdout);
    const auto t0 = std::chrono::steady_clock::now();
    child = fork();
    if (child < 0) {
      std::perror("run_resilient: fork");
      return 1;
    }
    if (child == 0) {
      setpgid(0, 0);  // its own group, so a signal reaches every rank
      std::vector<char*> cargs;
      for (std::string& a : args) cargs.push_back(a.data());
      cargs.push_back(nullptr);
      execvp(cargs[0], cargs.data());
      std::fprintf(stderr, "run_resilient: cannot run '%s': %s\n", cargs[0], std::strerror(errno));
      _exit(127);
    }
    setpgid(child, child);
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    child = -1;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      std::printf("run_resilient: the job finished after %d restart(s)\n", attempt);
      return 0;
    }
    std::printf("run_resilient: the job %s after %.1f s\n", Describe(status).c_str(), seconds);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127) return 1;  // nothing to restart
    if (attempt >= max_restarts) {
      std::fprintf(stderr, "run_resilient: giving up after %d restart(s) (--max-restarts)\n",
                   attempt);
      return 1;
    }
    std::fflush(stdout);
  }
}
