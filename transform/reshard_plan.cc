#include "transform/reshard_plan.h"

#include <algorithm>

namespace tessera {
namespace {

// Indices of the pieces of `pieces` (ordered, contiguous) overlapping `iv`.
std::pair<int64_t, int64_t> OverlappingPieces(const std::vector<Interval>& pieces,
                                              const Interval& iv) {
  auto first = std::upper_bound(pieces.begin(), pieces.end(), iv.begin,
                                [](int64_t v, const Interval& p) { return v < p.end; });
  auto last = std::lower_bound(pieces.begin(), pieces.end(), iv.end,
                               [](const Interval& p, int64_t v) { return p.begin < v; });
  return {first - pieces.begin(), last - pieces.begin()};
}

}  // namespace

Result<TensorPlan> PlanTensorReshard(const std::string& name, const Mesh& src_mesh,
                                     const Layout& src, const Mesh& dst_mesh, const Layout& dst,
                                     const PlanOptions& options, std::vector<int64_t>* src_load) {
  const std::string context = "tensor '" + name + "'";
  if (src.shape != dst.shape) {
    return InvalidArgumentError(context + ": shape " + ShapeToString(src.shape) +
                                " in the source but " + ShapeToString(dst.shape) +
                                " in the destination");
  }
  if (src.dtype != dst.dtype) {
    return InvalidArgumentError(context + ": dtype " + std::string(DTypeName(src.dtype)) +
                                " in the source but " + std::string(DTypeName(dst.dtype)) +
                                " in the destination (a reshard never casts; convert the "
                                "dtype explicitly)");
  }
  Layout src_l = src, dst_l = dst;
  if (src.split_shape() != dst.split_shape()) {
    Result<Layout> moved = InvalidArgumentError(
        "the source splits " + ShapeToString(src.split_shape()) + " and the destination " +
        ShapeToString(dst.split_shape()) + ", and neither view refines the other");
    const bool to_dst = RefinesShape(dst.split_shape(), src.split_shape());
    if (to_dst) {
      moved = LayoutInView(src, src_mesh, dst.split_shape());
    } else if (RefinesShape(src.split_shape(), dst.split_shape())) {
      moved = LayoutInView(dst, dst_mesh, src.split_shape());
    }
    if (!moved.ok()) return moved.status().Annotate(context);
    (to_dst ? src_l : dst_l) = std::move(moved).value();
  }
  auto src_grid_or = ShardGrid::Create(src_mesh, src_l);
  if (!src_grid_or.ok()) return src_grid_or.status().Annotate(context + " (source)");
  auto dst_grid_or = ShardGrid::Create(dst_mesh, dst_l);
  if (!dst_grid_or.ok()) return dst_grid_or.status().Annotate(context + " (destination)");
  const ShardGrid& sg = *src_grid_or;
  const ShardGrid& dg = *dst_grid_or;

  std::vector<std::vector<int64_t>> holders;
  if (options.pick_sources) {
    holders = sg.Holders();
    for (int64_t id = 0; id < sg.num_pieces(); ++id) {
      if (holders[id].empty() && !IsEmpty(sg.PieceBox(id))) {
        return InternalError(context + ": source piece " + ToString(sg.PieceBox(id)) +
                             " is held by no rank");
      }
    }
    if (static_cast<int64_t>(src_load->size()) < src_mesh.world_size()) {
      src_load->resize(src_mesh.world_size(), 0);
    }
  }

  TensorPlan plan;
  plan.name = name;
  plan.dtype = src.dtype;
  plan.shape = src.shape;
  plan.src_layout = src_l;
  plan.dst_layout = dst_l;
  const int rank = src_l.rank();
  const int64_t esize = DTypeSize(src.dtype);
  std::vector<bool> planned_piece(options.one_per_replica_group ? dg.num_pieces() : 0, false);

  // Per dimension: the source pieces overlapping the destination shard.
  std::vector<std::pair<int64_t, int64_t>> ranges(rank);
  std::vector<int64_t> idx(rank);
  const std::vector<int64_t> dst_pieces = dg.PieceIds();
  plan.shards.reserve(
      static_cast<size_t>(options.one_per_replica_group ? dg.num_pieces() : dst_mesh.world_size()));
  for (int64_t r = 0; r < dst_mesh.world_size(); ++r) {
    const int64_t dst_piece = dst_pieces[r];
    if (dst_piece < 0) continue;
    if (options.one_per_replica_group) {
      if (planned_piece[dst_piece]) continue;
      planned_piece[dst_piece] = true;
    }
    const Box shard = dg.PieceBox(dst_piece);
    if (IsEmpty(shard)) continue;
    ShardPlan sp;
    sp.dst_rank = r;
    sp.shard = shard;
    size_t overlapping = 1;
    for (int d = 0; d < rank; ++d) {
      ranges[d] = OverlappingPieces(sg.pieces(d), shard[d]);
      idx[d] = ranges[d].first;
      overlapping *= static_cast<size_t>(std::max<int64_t>(0, ranges[d].second - ranges[d].first));
    }
    sp.copies.reserve(overlapping);  // at most one copy each
    // Walk the product of overlapping pieces (rank 0: exactly one piece).
    for (;;) {
      int64_t src_piece = 0;
      int64_t stride = 1;
      Box region(rank);
      Box in_src(rank);  // region relative to the source piece (sg.PieceBox(src_piece))
      for (int d = rank - 1; d >= 0; --d) {
        src_piece += idx[d] * stride;
        stride *= static_cast<int64_t>(sg.pieces(d).size());
        const Interval& piece = sg.pieces(d)[idx[d]];
        region[d] = Intersect(piece, shard[d]);
        in_src[d] = {region[d].begin - piece.begin, region[d].end - piece.begin};
      }
      if (!IsEmpty(region)) {
        int64_t pick = -1;
        if (options.pick_sources) {
          const std::vector<int64_t>& cands = holders[src_piece];
          if (options.prefer_local && std::binary_search(cands.begin(), cands.end(), r)) pick = r;
          if (pick < 0) {
            pick = cands.front();
            for (int64_t c : cands) {
              if ((*src_load)[c] < (*src_load)[pick]) pick = c;
            }
          }
          (*src_load)[pick] += NumElements(region) * esize;
        }
        sp.copies.push_back({pick, std::move(in_src), RelativeTo(region, shard)});
      }
      int d = rank - 1;
      for (; d >= 0; --d) {
        if (++idx[d] < ranges[d].second) break;
        idx[d] = ranges[d].first;
      }
      if (d < 0) break;
    }
    plan.shards.push_back(std::move(sp));
  }
  return plan;
}

Result<ReshardPlan> PlanReshard(const Strategy& src, const Strategy& dst,
                                const PlanOptions& options) {
  if (!options.pick_sources) {
    return InvalidArgumentError(
        "a whole reshard plan picks its sources (pick_sources is for "
        "PlanTensorReshard callers that find them themselves)");
  }
  ReshardPlan plan;
  plan.tensors.reserve(dst.tensors().size());
  for (const TensorStrategy& d : dst.tensors()) {
    const TensorStrategy* s = src.Find(d.name);
    if (s == nullptr) {
      return NotFoundError("tensor '" + d.name +
                           "' of the destination strategy is not in the source");
    }
    ASSIGN_OR_RETURN(TensorPlan tp,
                     PlanTensorReshard(d.name, src.MeshOf(*s), s->layout, dst.MeshOf(d), d.layout,
                                       options, &plan.src_bytes));
    plan.tensors.push_back(std::move(tp));
  }
  for (int64_t b : plan.src_bytes) plan.total_bytes += b;
  return plan;
}

void ExecuteTensorPlan(const TensorPlan& plan, const ShardGrid& src_grid,
                       const std::function<const void*(int64_t src_rank)>& src_data,
                       const std::function<void*(const ShardPlan& shard)>& dst_data) {
  const int64_t esize = DTypeSize(plan.dtype);
  for (const ShardPlan& sp : plan.shards) {
    void* dst = dst_data(sp);
    const std::vector<int64_t> dst_extents = sp.shard.extents();
    for (const PieceCopy& c : sp.copies) {
      const std::vector<int64_t> src_extents = src_grid.ShardOf(c.src_rank)->extents();
      CopyBox(src_data(c.src_rank), src_extents, c.src_box, dst, dst_extents, c.dst_box, esize);
    }
  }
}

std::string DescribePlan(const ReshardPlan& plan, bool verbose) {
  int64_t shards = 0, copies = 0;
  for (const TensorPlan& t : plan.tensors) {
    shards += static_cast<int64_t>(t.shards.size());
    for (const ShardPlan& s : t.shards) copies += static_cast<int64_t>(s.copies.size());
  }
  std::string out = std::to_string(plan.tensors.size()) + " tensors, " + std::to_string(shards) +
                    " destination shards, " + std::to_string(copies) + " copies, " +
                    std::to_string(plan.total_bytes) + " bytes\n";
  int64_t lo = -1, hi = 0;
  for (int64_t b : plan.src_bytes) {
    lo = lo < 0 ? b : std::min(lo, b);
    hi = std::max(hi, b);
  }
  out += "bytes read per source rank: min " + std::to_string(std::max<int64_t>(lo, 0)) + ", max " +
         std::to_string(hi) + "\n";
  for (size_t r = 0; r < plan.src_bytes.size(); ++r) {
    out += "  source rank " + std::to_string(r) + ": " + std::to_string(plan.src_bytes[r]) + "\n";
  }
  if (!verbose) return out;
  for (const TensorPlan& t : plan.tensors) {
    out += t.name + " " + std::string(DTypeName(t.dtype)) + " " + ShapeToString(t.shape) + "\n";
    for (const ShardPlan& s : t.shards) {
      out += "  rank " + std::to_string(s.dst_rank) + " " + ToString(s.shard) + " <-";
      for (const PieceCopy& c : s.copies) {
        out += " r" + std::to_string(c.src_rank) + ToString(c.src_box) + "->" + ToString(c.dst_box);
      }
      out += "\n";
    }
  }
  return out;
}

}  // namespace tessera
