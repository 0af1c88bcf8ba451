// TCP rendezvous for bootstrap data only: NCCL's unique id, host names.
// Never tensors: collectives go through MPI, NCCL or in-process ranks.
//
// Rank 0 of the rank table listens on TESSERA_MASTER's port; every other
// rank connects (retrying until the timeout) and sends its blob; when all
// have arrived rank 0 answers each with every blob in rank order.
#ifndef TESSERA_RUNTIME_COMM_RENDEZVOUS_H_
#define TESSERA_RUNTIME_COMM_RENDEZVOUS_H_

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/comm/launch.h"

namespace tessera {

// Every rank's blob (at most 64 KiB each), indexed by rank. Fails naming the
// ranks that did not arrive within `timeout`, a duplicate or out-of-range
// rank, or a world size that differs between ranks.
Result<std::vector<std::string>> RendezvousAllGather(const RankTable& table, std::string_view blob,
                                                     std::chrono::milliseconds timeout);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COMM_RENDEZVOUS_H_
