// In-process ranks: N ranks as threads of one process, sharing memory. The
// embedded default (`--ranks 4` without mpirun) and the backend of the fast
// parallel tests. A collective posts its arguments, meets the other ranks,
// and each rank then reads its peers' buffers directly: an allreduce costs
// one read of every input and one write of every output, with no copies
// through the library. Arguments are always checked across ranks, and the
// reduction order is the rank-order left fold (see communicator.h).
//
// When a rank leaves with an error, or a wait passes the timeout, the world
// is aborted: every pending and later operation of every rank fails with
// that error instead of hanging.
#ifndef TESSERA_RUNTIME_COMM_INPROCESS_H_
#define TESSERA_RUNTIME_COMM_INPROCESS_H_

#include <functional>
#include <memory>
#include <vector>

#include "runtime/comm/communicator.h"

namespace tessera {

// `size` communicators of one world; element r is rank r. Hand each to its
// own thread.
Result<std::vector<std::unique_ptr<Communicator>>> CreateInProcessWorld(
    int size, const CommOptions& options = {});

// Runs fn(comm) for each of `size` ranks on its own thread and waits for all.
// A rank that returns an error aborts the world (its peers' pending
// operations fail at once). Returns OK, or the root-cause error annotated
// with its rank ("rank 2: ...").
Status RunInProcess(int size, const std::function<Status(Communicator&)>& fn,
                    const CommOptions& options = {});

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COMM_INPROCESS_H_
