// The Gloo backend (Debian's libgloo, its TCP transport): one process per
// rank, started by anything that sets a rank table — the tessera-run
// launcher, torchrun-style variables, a scheduler, a shell loop — with no
// MPI installed or configured anywhere. Rank 0 serves the rendezvous (a
// KvServer on the master port; Gloo's Debian build has no TCP store), every
// rank connects to it and then to every other rank directly.
//
// Collectives map onto Gloo's (allreduce, allgatherv, broadcast, alltoallv,
// barrier). AllReduce goes through Gloo's algorithms and reduce.h's
// pairwise step (f16/bf16 rounded at each step, not once); with
// CommOptions::deterministic it is an alltoallv, a fold in rank order and
// an allgatherv instead (bitwise equal to the in-process backend, f16/bf16
// rounded once). ReduceScatter is always that alltoallv and fold (Gloo
// 2022 has no untyped reduce-scatter). gather(v)/scatter(v) and
// tagged point-to-point use Gloo's unbound buffers. Every call takes at most
// CommOptions::timeout and then fails with DeadlineExceeded naming this
// rank, the communicator and the call; a peer that died fails its peers'
// calls with Aborted.
#ifndef TESSERA_RUNTIME_COMM_GLOO_H_
#define TESSERA_RUNTIME_COMM_GLOO_H_

#include <memory>

#include "runtime/comm/communicator.h"
#include "runtime/comm/launch.h"

namespace tessera {

// Collective over the table's world: rendezvous at table.master_host:port
// (rank 0 serves it on that port), then a full mesh of TCP pairs. A world
// of one needs no master. A process whose SIGPIPE is at its default gets
// it ignored, so a peer that dies mid-write is an error, not this rank's end.
Result<std::unique_ptr<Communicator>> CreateGlooWorld(const RankTable& table,
                                                      const CommOptions& options = {});

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COMM_GLOO_H_
