// Distributed tensors: a rank's local shard plus the Layout that says which
// box of the global tensor it is, on a Mesh over the ranks of a
// Communicator. Redistribute moves a tensor from one layout to another with
// the planner the offline reshard uses (transform/PlanReshard, local pieces
// preferred): every rank computes the same plan, copies what it keeps
// locally, and exchanges the rest in one AllToAllV. Any pair of layouts
// works: split <-> replicated (an all-gather), replicated -> split (local
// slicing, no traffic), split on one dimension -> split on another (an
// all-to-all), ZeRO shards, pipeline stages, views (the fused qkv split by
// heads), meshes of other shapes over the same ranks.
#ifndef TESSERA_RUNTIME_PARALLEL_DTENSOR_H_
#define TESSERA_RUNTIME_PARALLEL_DTENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/comm/communicator.h"
#include "transform/layout.h"
#include "transform/mesh.h"

namespace tessera {

class DTensor {
 public:
  // The shard of `full` (the whole tensor, row-major, layout.dtype) that
  // `rank` holds: for tests and for loading from a whole tensor.
  static Result<DTensor> FromFull(const Mesh& mesh, Layout layout, const void* full, int64_t rank);
  // Adopts `local` as `rank`'s shard (its size must match the layout).
  static Result<DTensor> FromLocal(const Mesh& mesh, Layout layout, int64_t rank,
                                   std::vector<char> local);

  const Mesh& mesh() const { return mesh_; }
  const Layout& layout() const { return layout_; }
  int64_t rank() const { return rank_; }
  // The box of the global tensor (in the layout's split shape) held here,
  // empty when this rank holds nothing (another pipeline stage, or a
  // trailing empty torch.chunk piece).
  const Box& box() const { return box_; }
  bool holds() const { return holds_; }
  // The shard, dense row-major over box().extents().
  const std::vector<char>& local() const { return local_; }
  std::vector<char>& local() { return local_; }

  // Re-describes this tensor as `rank`'s shard under `layout` and sizes
  // local() for it, keeping its storage (no new allocation when it fits).
  Status Reset(const Mesh& mesh, Layout layout, int64_t rank);

 private:
  Mesh mesh_;
  Layout layout_;
  int64_t rank_ = 0;
  Box box_;
  bool holds_ = false;
  std::vector<char> local_;
};

struct RedistributeStats {
  int64_t sent_bytes = 0, received_bytes = 0, local_bytes = 0;
};

// One redistribution planned once for one rank: what it sends to whom,
// receives from whom and copies locally. A training loop runs the same
// redistribution every step, in every block, forward and backward: it
// plans once and runs the plan (the seeds' "communication subgraph
// extraction and reuse" in an eager runtime).
class RedistributionPlan {
 public:
  // `from` on `mesh` to `target` on `target_mesh` (the same number of
  // ranks) for `rank`.
  static Result<RedistributionPlan> Create(const Mesh& mesh, const Layout& from,
                                           const Mesh& target_mesh, const Layout& target,
                                           int64_t rank);
  // Bytes of this rank's source and target shards.
  int64_t src_bytes() const { return src_bytes_; }
  int64_t dst_bytes() const { return dst_bytes_; }
  // Collective over `comm` (rank r is mesh rank r): `src`, this rank's
  // source shard, into `dst`, its target shard (dense, row-major). `send`
  // and `recv` stage the exchange and are kept by the caller between calls.
  Status Run(const void* src, void* dst, Communicator& comm, std::vector<char>* send,
             std::vector<char>* recv, RedistributeStats* stats = nullptr) const;

 private:
  struct Piece {
    int64_t peer = 0;  // destination (sends) or source (receives; this rank: local)
    Box src_box, dst_box;
    int64_t bytes = 0;
  };
  int64_t rank_ = 0, es_ = 1, src_bytes_ = 0, dst_bytes_ = 0;
  std::string what_;  // "redistribute FROM -> TO", for errors
  // FSDP's unshard (row blocks in rank order -> replicated): one AllGatherV.
  std::vector<int64_t> gather_counts_;
  std::vector<Piece> sends_, receives_;  // in plan order
  std::vector<int64_t> src_ext_, dst_ext_, send_counts_, recv_counts_;
};

// Collective over `comm`, whose ranks are the mesh's (same size; rank r is
// mesh rank r). `target` is a layout of the same tensor, on `target_mesh`
// (the same number of ranks). Errors name the layouts.
Result<DTensor> Redistribute(const DTensor& t, const Mesh& target_mesh, const Layout& target,
                             Communicator& comm, RedistributeStats* stats = nullptr);
// The same into `*out` (not `t`), reusing its storage: in a training loop
// the same redistribution runs every step, and fresh buffers cost a page
// fault per page. The exchange buffers are kept per thread for the same
// reason.
Status RedistributeInto(const DTensor& t, const Mesh& target_mesh, const Layout& target,
                        Communicator& comm, DTensor* out, RedistributeStats* stats = nullptr);
inline Result<DTensor> Redistribute(const DTensor& t, const Layout& target, Communicator& comm,
                                    RedistributeStats* stats = nullptr) {
  return Redistribute(t, t.mesh(), target, comm, stats);
}

}  // namespace tessera

#endif  // TESSERA_RUNTIME_PARALLEL_DTENSOR_H_
