// Internal to runtime/comm: what a collective was called with, and the
// checks that every rank called the same one.
#ifndef TESSERA_RUNTIME_COMM_COMM_UTIL_H_
#define TESSERA_RUNTIME_COMM_COMM_UTIL_H_

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "runtime/comm/communicator.h"

namespace tessera {

enum class CollectiveKind : uint8_t {
  kBarrier,
  kBroadcast,
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kGather,
  kScatter,
  kAllToAll,
  kSplit,
};
std::string_view KindName(CollectiveKind kind);

// The arguments every rank must agree on. For the "V" variants `count` is
// the total and `counts_hash` a hash of the per-rank counts.
struct CollectiveArgs {
  CollectiveKind kind = CollectiveKind::kBarrier;
  int64_t count = 0;
  DType dtype = DType::kU8;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  uint64_t counts_hash = 0;
};
std::string DescribeArgs(const CollectiveArgs& args);
// A negative element count is refused before anything moves (every rank
// checks its own call, so this needs no agreement round).
Status CheckCount(const CollectiveArgs& args, std::string_view comm_name);

// Builds the args of a V-collective from its per-rank counts.
CollectiveArgs VArgs(CollectiveKind kind, std::span<const int64_t> counts, DType dtype,
                     int root = 0);

// OK when every rank passed the same arguments, else InvalidArgument listing
// what each rank passed. Also checks roots are in range.
Status CheckAgreement(std::span<const CollectiveArgs> by_rank, std::string_view comm_name);

// counts has one non-negative entry per rank, and counts[rank] == count
// (rank < 0: skip that check).
Status CheckCounts(std::string_view what, std::span<const int64_t> counts, int size, int rank,
                   int64_t count);

// `send_counts[i]` of every rank i against `recv_counts[j]` of every rank j:
// rank i sends to j exactly what j expects from i.
Status CheckAllToAllCounts(std::span<const std::vector<int64_t>> send_counts,
                           std::span<const std::vector<int64_t>> recv_counts);

// "2 s", "150 ms".
std::string FormatDuration(std::chrono::milliseconds d);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COMM_COMM_UTIL_H_
