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

#include <chrono>
#include <memory>
#include <string>

#include "runtime/comm/communicator.h"
#include "runtime/comm/launch.h"

namespace tessera {

// Collective over the table's world: rendezvous at table.master_host:port
// (rank 0 serves it on that port), then a full mesh of TCP pairs. A world
// of one needs no master. A process whose SIGPIPE is at its default gets
// it ignored, so a peer that dies mid-write is an error, not this rank's end.
Result<std::unique_ptr<Communicator>> CreateGlooWorld(const RankTable& table,
                                                      const CommOptions& options = {});

// A communicator of `size` ranks formed by name over a Gloo world's
// rendezvous (rank 0's key-value store), outside the world's collectives:
// it may include a process that is not in the world, such as one started
// in place of a rank that died (whose pairs in the world are gone for
// good: Gloo cannot reconnect them). The world's members call
// ConnectGlooGroup with their world; a process outside it JoinGlooGroup
// with the world's rank table (its master address; `table.rank` only
// names it in errors). Every member names the same `group` and its own
// `rank` in it, and the call returns when all `size` have connected, or
// fails after the timeout (DeadlineExceeded) naming the group. A name
// forms one group: the next one needs a new name. Rank 0 of the world
// (its store) must be up until the group has connected. `connect` (0: the
// world's timeout) bounds the pairs' connection where the other members
// are known to be waiting (GlooGroupMemberWaiting): one that died
// meanwhile then fails the call soon, not after the timeout.
Result<std::unique_ptr<Communicator>> ConnectGlooGroup(
    Communicator& world, const std::string& group, int rank, int size,
    std::chrono::milliseconds connect = std::chrono::milliseconds(0));
Result<std::unique_ptr<Communicator>> JoinGlooGroup(const RankTable& table,
                                                    const std::string& group, int rank, int size,
                                                    const CommOptions& options = {});
// Whether member `rank` of `group` is waiting for the others now (it has
// registered through the world's rendezvous), without waiting: a world
// member checks before ConnectGlooGroup, which would block until then.
Result<bool> GlooGroupMemberWaiting(Communicator& world, const std::string& group, int rank);
// A key of the world's rendezvous store, for a small agreement outside any
// communicator's messages: set by a member of the world or of a group
// formed over it (`comm` is either), asked without waiting, read (waiting
// up to `timeout` for it to be set), or added to atomically (returns the
// sum; an unset key counts as 0: the first to add 1 gets 1).
Status SetGlooKey(Communicator& comm, const std::string& key, const std::string& value);
Result<bool> HasGlooKey(Communicator& comm, const std::string& key);
Result<std::string> GetGlooKey(Communicator& comm, const std::string& key,
                               std::chrono::milliseconds timeout);
Result<int64_t> AddGlooKey(Communicator& comm, const std::string& key, int64_t delta);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COMM_GLOO_H_
