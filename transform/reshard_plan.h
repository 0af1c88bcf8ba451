// PlanReshard: from tensors laid out one way (source strategy) to another
// (destination strategy), possibly on meshes of different sizes and axes.
// The plan is plain data: for each destination shard, the list of copies
// from source shards. ckpt/ executes it over files, runtime/ over
// collectives.
#ifndef TESSERA_TRANSFORM_RESHARD_PLAN_H_
#define TESSERA_TRANSFORM_RESHARD_PLAN_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "transform/box.h"
#include "transform/layout.h"
#include "transform/strategy.h"

namespace tessera {

// One region of a destination shard and where it comes from. The region's
// global coordinates are dst_box shifted by the destination shard's origin.
struct PieceCopy {
  int64_t src_rank = 0;  // -1 when planned without PlanOptions::pick_sources
  Box src_box;           // relative to the source rank's shard
  Box dst_box;           // relative to the destination rank's shard
};

struct ShardPlan {
  int64_t dst_rank = 0;
  Box shard;                      // the destination shard, global coordinates
  std::vector<PieceCopy> copies;  // disjoint, together exactly cover `shard`
};

struct TensorPlan {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  // The layouts as planned: when source and destination split different
  // views of the tensor (Layout::view), both expressed over the finer one,
  // whose coordinates every box of the plan is in.
  Layout src_layout, dst_layout;
  std::vector<ShardPlan> shards;  // ascending dst_rank; empty shards omitted
};

struct ReshardPlan {
  std::vector<TensorPlan> tensors;
  // Bytes each source rank is asked to provide, indexed by source rank.
  std::vector<int64_t> src_bytes;
  int64_t total_bytes = 0;
};

struct PlanOptions {
  // Take a piece from the source rank with the destination's own rank number
  // when that rank holds it (in-training redistribution: a local copy).
  bool prefer_local = false;
  // Plan only the lowest rank of each destination replica group (a file
  // writer needs each distinct shard once).
  bool one_per_replica_group = false;
  // Choose the source rank of each copy (balancing replicas over
  // src_load). Off, every copy's src_rank is -1: for a reader that finds
  // the piece holding a box itself (a checkpoint's), which then saves
  // going over every source rank of every tensor.
  bool pick_sources = true;
};

// Plans one tensor. Layouts over different views are planned over the
// finer view when one refines the other and both can be expressed over it
// (LayoutInView); otherwise the error names the tensor and both views.
// `src_load` (indexed by source rank, grown as needed) carries the bytes
// already assigned to each source, so that choices among replicas balance
// over many tensors; without pick_sources it is unused and may be
// null. Shapes must match, and so must dtypes:
// a dtype change is an explicit cast step, never part of a reshard.
Result<TensorPlan> PlanTensorReshard(const std::string& name, const Mesh& src_mesh,
                                     const Layout& src, const Mesh& dst_mesh, const Layout& dst,
                                     const PlanOptions& options, std::vector<int64_t>* src_load);

// Executes one tensor's plan between dense row-major buffers in memory:
// `src_data(rank)` is the source rank's shard, `dst_data(plan shard)` the
// destination shard's buffer. `src_grid` is plan.src_layout on the source
// mesh (a shard's bytes are the same whichever view describes it). The
// plan must have its sources (PlanOptions::pick_sources).
void ExecuteTensorPlan(const TensorPlan& plan, const ShardGrid& src_grid,
                       const std::function<const void*(int64_t src_rank)>& src_data,
                       const std::function<void*(const ShardPlan& shard)>& dst_data);

// A short human-readable account: tensors, shards, copies, bytes, and the
// bytes each source provides (balance). `verbose` lists every copy.
std::string DescribePlan(const ReshardPlan& plan, bool verbose);

// Plans every tensor of `dst` (in its order); each must exist in `src`.
// Source tensors absent from `dst` are not planned. Such a plan is for
// describing and executing, so its sources are always picked: options
// without pick_sources are refused.
Result<ReshardPlan> PlanReshard(const Strategy& src, const Strategy& dst,
                                const PlanOptions& options = {});

}  // namespace tessera

#endif  // TESSERA_TRANSFORM_RESHARD_PLAN_H_
