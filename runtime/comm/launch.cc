#include "runtime/comm/launch.h"

#include <charconv>
#include <cstdlib>

#include "runtime/comm/inprocess.h"
#include "runtime/comm/mpi.h"

namespace tessera {
namespace {

// The integer in environment variable `name`, or -1 when it is unset.
Result<int64_t> EnvInt(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return int64_t{-1};
  int64_t out = 0;
  const char* end = v + std::char_traits<char>::length(v);
  auto [p, ec] = std::from_chars(v, end, out);
  if (ec != std::errc() || p != end || out < 0) {
    return InvalidArgumentError(std::string(name) + "='" + v + "' is not a non-negative integer");
  }
  return out;
}

}  // namespace

Status LaunchRanks(const LaunchOptions& options,
                   const std::function<Status(Communicator&)>& fn) {
  const bool mpi = options.backend == CommBackend::kMpi ||
                   (options.backend == CommBackend::kAuto && LaunchedByMpirun());
  if (!mpi) return RunInProcess(options.ranks > 0 ? options.ranks : 1, fn, options.comm);
  ASSIGN_OR_RETURN(std::unique_ptr<Communicator> world, CreateMpiWorld(options.comm));
  if (options.ranks > 0 && options.ranks != world->size()) {
    return InvalidArgumentError("asked for " + std::to_string(options.ranks) +
                                " ranks but mpirun started " + std::to_string(world->size()) +
                                " processes");
  }
  Status s = fn(*world);
  return s.ok() ? s : s.Annotate("rank " + std::to_string(world->rank()));
}

Result<RankTable> RankTableFromEnv() {
  RankTable t;
  ASSIGN_OR_RETURN(int64_t rank, EnvInt("TESSERA_RANK"));
  ASSIGN_OR_RETURN(int64_t size, EnvInt("TESSERA_WORLD_SIZE"));
  ASSIGN_OR_RETURN(int64_t mpi_rank, EnvInt("OMPI_COMM_WORLD_RANK"));
  ASSIGN_OR_RETURN(int64_t mpi_size, EnvInt("OMPI_COMM_WORLD_SIZE"));
  if ((rank < 0) != (size < 0)) {
    return InvalidArgumentError("TESSERA_RANK and TESSERA_WORLD_SIZE must be set together");
  }
  if (rank >= 0 && mpi_rank >= 0 && (rank != mpi_rank || size != mpi_size)) {
    return InvalidArgumentError("TESSERA_RANK=" + std::to_string(rank) + " TESSERA_WORLD_SIZE=" +
                                std::to_string(size) + " disagree with mpirun's rank " +
                                std::to_string(mpi_rank) + " of " + std::to_string(mpi_size));
  }
  if (rank >= 0) {
    t.source = "TESSERA_*";
  } else if (mpi_rank >= 0) {
    rank = mpi_rank;
    size = mpi_size;
    t.source = "mpirun";
  } else {
    return NotFoundError("no rank table: set TESSERA_RANK and TESSERA_WORLD_SIZE, or start "
                         "under mpirun");
  }
  if (size < 1 || rank >= size) {
    return InvalidArgumentError("rank " + std::to_string(rank) + " is outside world size " +
                                std::to_string(size));
  }
  t.rank = static_cast<int>(rank);
  t.world_size = static_cast<int>(size);
  if (const char* master = std::getenv("TESSERA_MASTER")) {
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
  }
  return t;
}

}  // namespace tessera
