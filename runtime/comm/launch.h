// Starting ranks. One program runs unchanged in both modes:
//  - under mpirun (`mpirun -np 4 train_gpt`): one process per rank, the MPI
//    backend; the rank and world size come from mpirun;
//  - alone (`train_gpt --ranks 4`): 4 ranks as threads of this process, the
//    in-process backend (the embedded default).
//
// A process can also learn its place from the environment: TESSERA_RANK,
// TESSERA_WORLD_SIZE and TESSERA_MASTER=host:port (the rank table). Under
// mpirun the table comes from mpirun (OMPI_COMM_WORLD_RANK/SIZE) and
// TESSERA_RANK / TESSERA_WORLD_SIZE, if also set, must agree with it. The
// table is what a launcher other than mpirun (a scheduler, a shell loop)
// uses to bootstrap NCCL: rank 0 listens on TESSERA_MASTER and hands out
// NCCL's unique id (rendezvous.h, CreateNcclCommunicatorFromTable). It
// carries bootstrap bytes only, never tensors. Multi-host MPI jobs need no
// table: mpirun --host a,b (or a hostfile) starts and numbers the ranks.
#ifndef TESSERA_RUNTIME_COMM_LAUNCH_H_
#define TESSERA_RUNTIME_COMM_LAUNCH_H_

#include <functional>
#include <string>

#include "runtime/comm/communicator.h"

namespace tessera {

enum class CommBackend { kAuto, kInProcess, kMpi };

struct LaunchOptions {
  CommBackend backend = CommBackend::kAuto;  // auto: MPI under mpirun, else in-process
  // In-process: the number of ranks (0 = 1). Under MPI: 0, or the world
  // size mpirun started (anything else is an error).
  int ranks = 0;
  CommOptions comm;
};

// Runs fn(world) on every rank of this process (one under MPI, `ranks`
// threads in-process) and returns this process's result (in-process: the
// root-cause error of any rank, annotated with the rank).
Status LaunchRanks(const LaunchOptions& options,
                   const std::function<Status(Communicator&)>& fn);

struct RankTable {
  int rank = 0;
  int world_size = 1;
  std::string master_host;  // empty when TESSERA_MASTER is not set
  int master_port = 0;
  std::string source;  // "TESSERA_*" or "mpirun"
};

// The rank table from the environment (see above). NotFound when neither
// TESSERA_RANK nor mpirun's variables are set; InvalidArgument naming the
// variable when one is malformed or they disagree.
Result<RankTable> RankTableFromEnv();

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COMM_LAUNCH_H_
