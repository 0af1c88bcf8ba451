// Starting ranks. One program runs unchanged in three modes:
//  - under mpirun (`mpirun -np 4 train_gpt`): one process per rank, the MPI
//    backend; the rank and world size come from mpirun;
//  - from a rank table in the environment (the tessera-run launcher,
//    torchrun, a scheduler, a shell loop): one process per rank, the Gloo
//    backend, no MPI needed anywhere;
//  - alone (`train_gpt --ranks 4`): 4 ranks as threads of this process, the
//    in-process backend (the embedded default).
//
// The rank table: TESSERA_RANK, TESSERA_WORLD_SIZE and
// TESSERA_MASTER=host:port, or torchrun's RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT (and LOCAL_RANK); where both are set they must agree. Under
// mpirun the table comes from mpirun (OMPI_COMM_WORLD_RANK/SIZE) and the
// variables, if also set, must agree with it. Rank 0 serves the rendezvous
// on the master port (Gloo's addresses, NCCL's unique id: rendezvous.h,
// CreateNcclCommunicatorFromTable); it carries bootstrap bytes only, never
// tensors. Multi-host MPI jobs need no table: mpirun --host a,b (or a
// hostfile) starts and numbers the ranks.
#ifndef TESSERA_RUNTIME_COMM_LAUNCH_H_
#define TESSERA_RUNTIME_COMM_LAUNCH_H_

#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/comm/communicator.h"

namespace tessera {

enum class CommBackend { kAuto, kInProcess, kMpi, kGloo };
// "auto", "inprocess", "mpi", "gloo".
Result<CommBackend> ParseCommBackend(std::string_view name);

struct LaunchOptions {
  // auto: MPI under mpirun, Gloo where the environment holds a rank table
  // (TESSERA_RANK or torchrun's RANK), else in-process.
  CommBackend backend = CommBackend::kAuto;
  // In-process: the number of ranks (0 = 1). Under MPI or Gloo: 0, or the
  // world size started (anything else is an error).
  int ranks = 0;
  CommOptions comm;
};

// Runs fn(world) on every rank of this process (one under MPI, `ranks`
// threads in-process) and returns this process's result (in-process: the
// root-cause error of any rank, annotated with the rank).
Status LaunchRanks(const LaunchOptions& options, const std::function<Status(Communicator&)>& fn);

// The environment a launcher gives each worker process: tessera-run writes
// it (WorkerEnvironment), workers read it (RankTableFromEnv,
// Heartbeat::FromEnv, RestartCount). The names live here only.
inline constexpr char kEnvRank[] = "TESSERA_RANK";
inline constexpr char kEnvWorldSize[] = "TESSERA_WORLD_SIZE";
inline constexpr char kEnvMaster[] = "TESSERA_MASTER";  // host:port of rank 0's rendezvous
inline constexpr char kEnvHeartbeatFile[] = "TESSERA_HEARTBEAT_FILE";
inline constexpr char kEnvRestartCount[] = "TESSERA_RESTART_COUNT";  // 0 in the first attempt
// Parameter servers: ranks [0, S) of TESSERA_WORLD_SIZE serve (train_gpt).
inline constexpr char kEnvPsServers[] = "TESSERA_PS_SERVERS";
// Asynchronous parameter servers whose dead workers are replaced one by one
// ("1": tessera-run --ps-replace-workers), and on a replacement process its
// number among its rank's replacements (1, 2, ...) in this attempt.
inline constexpr char kEnvPsReplaceable[] = "TESSERA_PS_REPLACEABLE";
inline constexpr char kEnvPsRejoin[] = "TESSERA_PS_REJOIN";

// The integer in environment variable `name`: -1 when it is unset or empty,
// InvalidArgument naming the variable when it is not an integer in
// [min, max].
Result<int64_t> EnvInt(const char* name, int64_t min = 0,
                       int64_t max = std::numeric_limits<int64_t>::max());

// One worker of a launched job.
struct WorkerSlot {
  int rank = 0, world_size = 1;
  int local_rank = 0, local_world_size = 1;  // among this node's workers
  std::string master_host;
  int master_port = 0;
  std::string heartbeat_file;  // empty: none
  int restart = 0;             // the attempt it belongs to
};
// Its environment as NAME=value: the rank table in Tessera's and torchrun's
// forms (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT), the heartbeat file and the restart count.
std::vector<std::string> WorkerEnvironment(const WorkerSlot& slot);
// The restart count alone (a job supervised without a rank table).
std::string RestartEnvironment(int restart);
// Sets this process's rank table, as a launcher would (a program's --rank,
// --world-size and --master flags); a negative or empty value is left unset.
void ExportRankTable(int rank, int world_size, const std::string& master);
// The attempt this process belongs to under a launcher (0 in the first,
// and when not launched).
int RestartCount();

struct RankTable {
  int rank = 0;
  int world_size = 1;
  std::string master_host;  // empty when no master is set
  int master_port = 0;
  std::string source;   // "TESSERA_*", "torchrun" or "mpirun"
  int local_rank = -1;  // LOCAL_RANK (torchrun, tessera-run), -1 when not set
};

// The rank table from the environment (see above). NotFound when neither
// TESSERA_RANK, RANK nor mpirun's variables are set; InvalidArgument naming
// the variable when one is malformed or they disagree.
Result<RankTable> RankTableFromEnv();

// Tells a launcher this process is alive: tessera-run sets
// TESSERA_HEARTBEAT_FILE for each worker and takes a worker whose file
// goes stale for longer than its --heartbeat-timeout for hung. Beat(n)
// writes the worker's progress `n` (train_gpt: the step it starts) into
// the file, which also touches it: one positional write on a file kept
// open, so every step can beat. A no-op without the variable. When several
// workers fall silent (a hung one's peers wait for it in a collective),
// the launcher names the one that got least far first: the times alone
// cannot tell (the file system's clock ticks every few milliseconds, about
// a step of a small model).
class Heartbeat {
 public:
  static Heartbeat FromEnv();
  Heartbeat() = default;
  Heartbeat(Heartbeat&& o) noexcept : path_(std::move(o.path_)), fd_(o.fd_) { o.fd_ = -1; }
  Heartbeat& operator=(Heartbeat&&) = delete;
  ~Heartbeat();
  bool enabled() const { return !path_.empty(); }
  Status Beat(int64_t progress);
  // The progress a heartbeat file records; -1 when it holds none.
  static int64_t ReadProgress(const std::string& path);

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COMM_LAUNCH_H_
