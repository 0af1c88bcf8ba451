// The Open MPI backend: one process per rank, started by `mpirun -np N`
// (as root add --allow-run-as-root; with more ranks than cores add
// --oversubscribe), on one host or many. Collectives map one to one onto
// MPI's (MPI_Allreduce, MPI_Reduce_scatter_block, ...), so the backend adds
// no copies; f16/bf16 reductions use our own MPI_Op (accumulating in f32).
//
// Timeouts: MPI cannot cancel a collective, so a watchdog thread watches
// every call; one that runs past CommOptions::timeout calls
// CommOptions::on_timeout with an error naming the rank, communicator and
// collective, then MPI_Abort()s the job (mpirun then names the rank too).
// A peer that dies is reported by mpirun, which ends the job.
#ifndef TESSERA_RUNTIME_COMM_MPI_H_
#define TESSERA_RUNTIME_COMM_MPI_H_

#include <memory>

#include "runtime/comm/communicator.h"

namespace tessera {

enum class MpiThreadLevel { kSingle, kFunneled, kSerialized, kMultiple };

// Initializes MPI on first use, requesting `level` explicitly; fails if the
// MPI library provides less (or was initialized by someone else with
// less). MPI is finalized at exit. Returns a communicator over all ranks
// (a duplicate of MPI_COMM_WORLD, errors returned rather than fatal).
Result<std::unique_ptr<Communicator>> CreateMpiWorld(
    const CommOptions& options = {}, MpiThreadLevel level = MpiThreadLevel::kMultiple);

// True when this process was started by mpirun (Open MPI or a PMI launcher).
bool LaunchedByMpirun();

// Ends every process of the MPI job (MPI_Abort on MPI_COMM_WORLD) with
// `code`. For mains whose rank failed: returning instead would leave the
// peers waiting in their next collective until the timeout.
[[noreturn]] void AbortMpiJob(int code);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COMM_MPI_H_
