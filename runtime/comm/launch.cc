#include "runtime/comm/launch.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/comm/gloo.h"
#include "runtime/comm/inprocess.h"
#include "runtime/comm/mpi.h"

namespace tessera {
Result<int64_t> EnvInt(const char* name, int64_t min, int64_t max) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return int64_t{-1};
  int64_t out = 0;
  const char* end = v + std::char_traits<char>::length(v);
  auto [p, ec] = std::from_chars(v, end, out);
  if (ec != std::errc() || p != end || out < min) {
    return InvalidArgumentError(std::string(name) + "='" + v +
                                "' is not an integer >= " + std::to_string(min));
  }
  if (out > max) {
    return InvalidArgumentError(std::string(name) + "='" + v + "' is above " + std::to_string(max));
  }
  return out;
}

Result<CommBackend> ParseCommBackend(std::string_view name) {
  if (name == "auto") return CommBackend::kAuto;
  if (name == "inprocess") return CommBackend::kInProcess;
  if (name == "mpi") return CommBackend::kMpi;
  if (name == "gloo") return CommBackend::kGloo;
  return InvalidArgumentError("backend '" + std::string(name) +
                              "': use auto, inprocess, mpi or gloo");
}

Status LaunchRanks(const LaunchOptions& options, const std::function<Status(Communicator&)>& fn) {
  CommBackend backend = options.backend;
  if (backend == CommBackend::kAuto) {
    backend = LaunchedByMpirun()                             ? CommBackend::kMpi
              : std::getenv(kEnvRank) || std::getenv("RANK") ? CommBackend::kGloo
                                                             : CommBackend::kInProcess;
  }
  if (backend == CommBackend::kInProcess) {
    return RunInProcess(options.ranks > 0 ? options.ranks : 1, fn, options.comm);
  }
  std::unique_ptr<Communicator> world;
  if (backend == CommBackend::kMpi) {
    ASSIGN_OR_RETURN(world, CreateMpiWorld(options.comm));
  } else {
    Result<RankTable> table = RankTableFromEnv();
    if (!table.ok()) return table.status().Annotate("the gloo backend");
    ASSIGN_OR_RETURN(world, CreateGlooWorld(*table, options.comm));
  }
  if (options.ranks > 0 && options.ranks != world->size()) {
    return InvalidArgumentError("asked for " + std::to_string(options.ranks) + " ranks but " +
                                std::to_string(world->size()) + " processes were started");
  }
  Status s = fn(*world);
  return s.ok() ? s : s.Annotate("rank " + std::to_string(world->rank()));
}

std::vector<std::string> WorkerEnvironment(const WorkerSlot& w) {
  const std::string master = w.master_host + ":" + std::to_string(w.master_port);
  std::vector<std::string> env = {
      std::string(kEnvRank) + "=" + std::to_string(w.rank),
      std::string(kEnvWorldSize) + "=" + std::to_string(w.world_size),
      std::string(kEnvMaster) + "=" + master,
      "RANK=" + std::to_string(w.rank),
      "WORLD_SIZE=" + std::to_string(w.world_size),
      "LOCAL_RANK=" + std::to_string(w.local_rank),
      "LOCAL_WORLD_SIZE=" + std::to_string(w.local_world_size),
      "MASTER_ADDR=" + w.master_host,
      "MASTER_PORT=" + std::to_string(w.master_port),
      RestartEnvironment(w.restart),
  };
  if (!w.heartbeat_file.empty()) {
    env.push_back(std::string(kEnvHeartbeatFile) + "=" + w.heartbeat_file);
  }
  return env;
}

std::string RestartEnvironment(int restart) {
  return std::string(kEnvRestartCount) + "=" + std::to_string(restart);
}

void ExportRankTable(int rank, int world_size, const std::string& master) {
  if (rank >= 0) setenv(kEnvRank, std::to_string(rank).c_str(), 1);
  if (world_size >= 0) setenv(kEnvWorldSize, std::to_string(world_size).c_str(), 1);
  if (!master.empty()) setenv(kEnvMaster, master.c_str(), 1);
}

int RestartCount() {
  const char* n = std::getenv(kEnvRestartCount);
  return n != nullptr ? std::atoi(n) : 0;
}

Result<RankTable> RankTableFromEnv() {
  RankTable t;
  ASSIGN_OR_RETURN(int64_t rank, EnvInt(kEnvRank));
  ASSIGN_OR_RETURN(int64_t size, EnvInt(kEnvWorldSize));
  ASSIGN_OR_RETURN(int64_t torch_rank, EnvInt("RANK"));
  ASSIGN_OR_RETURN(int64_t torch_size, EnvInt("WORLD_SIZE"));
  ASSIGN_OR_RETURN(int64_t local_rank, EnvInt("LOCAL_RANK"));
  ASSIGN_OR_RETURN(int64_t mpi_rank, EnvInt("OMPI_COMM_WORLD_RANK"));
  ASSIGN_OR_RETURN(int64_t mpi_size, EnvInt("OMPI_COMM_WORLD_SIZE"));
  if ((rank < 0) != (size < 0)) {
    return InvalidArgumentError("TESSERA_RANK and TESSERA_WORLD_SIZE must be set together");
  }
  if ((torch_rank < 0) != (torch_size < 0)) {
    return InvalidArgumentError("RANK and WORLD_SIZE must be set together");
  }
  if (rank >= 0 && torch_rank >= 0 && (rank != torch_rank || size != torch_size)) {
    return InvalidArgumentError("TESSERA_RANK=" + std::to_string(rank) +
                                " TESSERA_WORLD_SIZE=" + std::to_string(size) +
                                " disagree with RANK=" + std::to_string(torch_rank) +
                                " WORLD_SIZE=" + std::to_string(torch_size));
  }
  t.source = "TESSERA_*";
  if (rank < 0 && torch_rank >= 0) {
    rank = torch_rank;
    size = torch_size;
    t.source = "torchrun";
  }
  if (rank >= 0 && mpi_rank >= 0 && (rank != mpi_rank || size != mpi_size)) {
    return InvalidArgumentError("rank " + std::to_string(rank) + " of " + std::to_string(size) +
                                " (" + t.source + ") disagree with mpirun's rank " +
                                std::to_string(mpi_rank) + " of " + std::to_string(mpi_size));
  }
  if (rank < 0 && mpi_rank >= 0) {
    rank = mpi_rank;
    size = mpi_size;
    t.source = "mpirun";
  }
  if (rank < 0) {
    return NotFoundError(
        "no rank table: set TESSERA_RANK, TESSERA_WORLD_SIZE and TESSERA_MASTER "
        "(or torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), start "
        "under tessera-run, or under mpirun");
  }
  if (size < 1 || rank >= size) {
    return InvalidArgumentError("rank " + std::to_string(rank) + " is outside world size " +
                                std::to_string(size));
  }
  t.rank = static_cast<int>(rank);
  t.world_size = static_cast<int>(size);
  t.local_rank = static_cast<int>(local_rank);
  if (const char* master = std::getenv(kEnvMaster)) {
    const std::string m = master;
    const size_t colon = m.rfind(':');
    int port = 0;
    if (colon == std::string::npos || colon == 0 ||
        std::from_chars(m.data() + colon + 1, m.data() + m.size(), port).ec != std::errc() ||
        port <= 0 || port > 65535) {
      return InvalidArgumentError("TESSERA_MASTER='" + m + "' is not host:port");
    }
    t.master_host = m.substr(0, colon);
    t.master_port = port;
  } else if (const char* addr = std::getenv("MASTER_ADDR")) {
    ASSIGN_OR_RETURN(int64_t port, EnvInt("MASTER_PORT"));
    if (port <= 0 || port > 65535) {
      return InvalidArgumentError("MASTER_ADDR is set but MASTER_PORT is not a port");
    }
    t.master_host = addr;
    t.master_port = static_cast<int>(port);
  }
  return t;
}

Heartbeat Heartbeat::FromEnv() {
  Heartbeat h;
  if (const char* p = std::getenv(kEnvHeartbeatFile)) h.path_ = p;
  return h;
}

Heartbeat::~Heartbeat() {
  if (fd_ >= 0) close(fd_);
}

Status Heartbeat::Beat(int64_t progress) {
  if (path_.empty()) return Status::Ok();
  if (fd_ < 0) {
    fd_ = open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) return IOError("heartbeat file '" + path_ + "': " + std::strerror(errno));
  }
  // Fixed width, so that a shorter number never leaves digits behind.
  char text[24];
  const int n = std::snprintf(text, sizeof(text), "%020lld\n", static_cast<long long>(progress));
  if (pwrite(fd_, text, static_cast<size_t>(n), 0) != n) {
    return IOError("heartbeat file '" + path_ + "': " + std::strerror(errno));
  }
  return Status::Ok();
}

int64_t Heartbeat::ReadProgress(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char text[24] = {};
  const ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
  close(fd);
  if (n <= 0) return -1;
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  return end == text ? -1 : static_cast<int64_t>(v);
}

}  // namespace tessera
