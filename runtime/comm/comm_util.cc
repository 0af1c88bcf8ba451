#include "runtime/comm/comm_util.h"

#include <numeric>

#include "core/checksum.h"

namespace tessera {

std::string_view KindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kBarrier:
      return "barrier";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kAllReduce:
      return "allreduce";
    case CollectiveKind::kAllGather:
      return "allgather";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kGather:
      return "gather";
    case CollectiveKind::kScatter:
      return "scatter";
    case CollectiveKind::kAllToAll:
      return "alltoall";
    case CollectiveKind::kSplit:
      return "split";
  }
  return "?";
}

std::string DescribeArgs(const CollectiveArgs& a) {
  std::string out(KindName(a.kind));
  switch (a.kind) {
    case CollectiveKind::kBarrier:
    case CollectiveKind::kSplit:
      return out;
    default:
      break;
  }
  out += " of " + std::to_string(a.count) + " " + std::string(DTypeName(a.dtype));
  if (a.kind == CollectiveKind::kAllReduce || a.kind == CollectiveKind::kReduceScatter) {
    out += " " + std::string(ReduceOpName(a.op));
  }
  if (a.kind == CollectiveKind::kBroadcast || a.kind == CollectiveKind::kGather ||
      a.kind == CollectiveKind::kScatter) {
    out += " root " + std::to_string(a.root);
  }
  return out;
}

CollectiveArgs VArgs(CollectiveKind kind, std::span<const int64_t> counts, DType dtype, int root) {
  CollectiveArgs a{kind, std::accumulate(counts.begin(), counts.end(), int64_t{0}), dtype,
                   ReduceOp::kSum, root};
  a.counts_hash = Xxh3(counts.data(), counts.size_bytes());
  return a;
}

Status CheckCount(const CollectiveArgs& args, std::string_view comm_name) {
  if (args.count >= 0) return Status::Ok();
  return InvalidArgumentError(std::string(KindName(args.kind)) + " on '" + std::string(comm_name) +
                              "': negative count " + std::to_string(args.count));
}

Status CheckAgreement(std::span<const CollectiveArgs> by_rank, std::string_view comm_name) {
  const int n = static_cast<int>(by_rank.size());
  bool same = true;
  for (const CollectiveArgs& a : by_rank) {
    const CollectiveArgs& b = by_rank[0];
    same = same && a.kind == b.kind && a.count == b.count && a.dtype == b.dtype && a.op == b.op &&
           a.root == b.root && a.counts_hash == b.counts_hash;
  }
  if (same) {
    if (by_rank[0].root < 0 || by_rank[0].root >= n) {
      return InvalidArgumentError(
          std::string(KindName(by_rank[0].kind)) + " on '" + std::string(comm_name) + "': root " +
          std::to_string(by_rank[0].root) + " is not a rank of " + std::to_string(n));
    }
    return Status::Ok();
  }
  std::string msg = "ranks of '" + std::string(comm_name) + "' called different collectives:";
  for (int r = 0; r < n; ++r) {
    msg += (r ? "; " : " ") + std::string("rank ") + std::to_string(r) + ": " +
           DescribeArgs(by_rank[r]);
    if (by_rank[r].counts_hash != by_rank[0].counts_hash) msg += " (different per-rank counts)";
  }
  return InvalidArgumentError(msg);
}

Status CheckCounts(std::string_view what, std::span<const int64_t> counts, int size, int rank,
                   int64_t count) {
  if (static_cast<int>(counts.size()) != size) {
    return InvalidArgumentError(std::string(what) + ": " + std::to_string(counts.size()) +
                                " counts for " + std::to_string(size) + " ranks");
  }
  for (int r = 0; r < size; ++r) {
    if (counts[r] < 0) {
      return InvalidArgumentError(std::string(what) + ": negative count for rank " +
                                  std::to_string(r));
    }
  }
  if (rank >= 0 && counts[rank] != count) {
    return InvalidArgumentError(std::string(what) + ": rank " + std::to_string(rank) + " passes " +
                                std::to_string(count) + " elements but counts[" +
                                std::to_string(rank) + "] is " + std::to_string(counts[rank]));
  }
  return Status::Ok();
}

Status CheckAllToAllCounts(std::span<const std::vector<int64_t>> send_counts,
                           std::span<const std::vector<int64_t>> recv_counts) {
  const int n = static_cast<int>(send_counts.size());
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (send_counts[i][j] != recv_counts[j][i]) {
        return InvalidArgumentError("alltoall: rank " + std::to_string(i) + " sends " +
                                    std::to_string(send_counts[i][j]) + " elements to rank " +
                                    std::to_string(j) + " but rank " + std::to_string(j) +
                                    " expects " + std::to_string(recv_counts[j][i]));
      }
    }
  }
  return Status::Ok();
}

std::string FormatDuration(std::chrono::milliseconds d) {
  if (d.count() % 1000 == 0) return std::to_string(d.count() / 1000) + " s";
  return std::to_string(d.count()) + " ms";
}

}  // namespace tessera
