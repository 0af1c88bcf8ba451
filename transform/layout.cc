#include "transform/layout.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>

namespace tessera {
namespace {

const std::vector<std::string> kNoAxes;

// Nested torch.chunk of [0, size): `counts` pieces per level, outermost
// first.
std::vector<Interval> NestedPieces(int64_t size, const std::vector<int64_t>& counts) {
  std::vector<Interval> pieces = {{0, size}};
  for (int64_t n : counts) {
    std::vector<Interval> next;
    next.reserve(pieces.size() * n);
    for (const Interval& p : pieces) {
      for (int64_t i = 0; i < n; ++i) next.push_back(ChunkOf(p, n, i));
    }
    pieces = std::move(next);
  }
  return pieces;
}

std::string JoinAxes(const std::vector<std::string>& axes) {
  if (axes.empty()) return "-";
  std::string s;
  for (size_t i = 0; i < axes.size(); ++i) s += (i ? "*" : "") + axes[i];
  return s;
}

}  // namespace

Layout Layout::Replicated(std::vector<int64_t> shape, DType dtype) {
  Layout l;
  l.shape = std::move(shape);
  l.dtype = dtype;
  return l;
}

const std::vector<std::string>& Layout::AxesOf(int d) const {
  return d < static_cast<int>(dim_axes.size()) ? dim_axes[d] : kNoAxes;
}

bool Layout::OnStage(int64_t s) const {
  return s == stage || std::binary_search(copy_stages.begin(), copy_stages.end(), s);
}

bool Layout::operator==(const Layout& o) const {
  if (shape != o.shape || split_shape() != o.split_shape() || dtype != o.dtype ||
      opt_axes != o.opt_axes || stage_axis != o.stage_axis ||
      (!stage_axis.empty() && (stage != o.stage || copy_stages != o.copy_stages))) {
    return false;
  }
  for (int d = 0; d < rank(); ++d) {
    if (AxesOf(d) != o.AxesOf(d)) return false;
  }
  return true;
}

Status ValidateLayout(const Layout& layout, const Mesh& mesh) {
  if (layout.rank() > kMaxRank) {
    return InvalidArgumentError("rank " + std::to_string(layout.rank()) +
                                " exceeds the supported " + std::to_string(kMaxRank));
  }
  RETURN_IF_ERROR(ShapeElements(layout.shape, layout.dtype).status());
  if (!layout.view.empty()) {
    RETURN_IF_ERROR(ShapeElements(layout.view, layout.dtype).status());
    bool zero = layout.shape.empty();
    for (int64_t d : layout.shape) zero = zero || d == 0;
    if (zero || !RefinesShape(layout.view, layout.shape)) {
      return InvalidArgumentError(
          "view " + ShapeToString(layout.view) + " does not cut the dimensions of shape " +
          ShapeToString(layout.shape) + " into consecutive dimensions (no zero sizes, no scalars)");
    }
  }
  if (!layout.dim_axes.empty() && static_cast<int>(layout.dim_axes.size()) != layout.rank()) {
    return InvalidArgumentError("split lists " + std::to_string(layout.dim_axes.size()) +
                                " dimensions but " + (layout.view.empty() ? "shape " : "view ") +
                                ShapeToString(layout.split_shape()) + " has " +
                                std::to_string(layout.rank()));
  }
  std::map<std::string, std::string> used;  // axis -> where it was used
  auto use = [&](const std::string& axis, const std::string& where) -> Status {
    if (mesh.FindAxis(axis) < 0) {
      return InvalidArgumentError("axis '" + axis + "' (" + where + ") is not in mesh " +
                                  mesh.ToString());
    }
    auto [it, inserted] = used.emplace(axis, where);
    if (!inserted) {
      return InvalidArgumentError("axis '" + axis + "' is used twice (" + it->second + " and " +
                                  where + ")");
    }
    return Status::Ok();
  };
  for (int d = 0; d < layout.rank(); ++d) {
    for (const std::string& a : layout.AxesOf(d)) {
      RETURN_IF_ERROR(use(a, "split of dimension " + std::to_string(d)));
    }
  }
  if (!layout.opt_axes.empty() && layout.rank() == 0) {
    return InvalidArgumentError(
        "optimizer sharding needs a dimension 0, but the tensor is a scalar");
  }
  for (const std::string& a : layout.opt_axes) RETURN_IF_ERROR(use(a, "optimizer shard"));
  if (!layout.stage_axis.empty()) {
    RETURN_IF_ERROR(use(layout.stage_axis, "pipeline stage"));
    const int64_t stages = mesh.axis_size(mesh.FindAxis(layout.stage_axis));
    if (layout.stage < 0 || layout.stage >= stages) {
      return InvalidArgumentError("stage " + std::to_string(layout.stage) + " is outside axis '" +
                                  layout.stage_axis + "' of size " + std::to_string(stages));
    }
    int64_t below = layout.stage;
    for (int64_t s : layout.copy_stages) {
      if (s <= below || s >= stages) {
        return InvalidArgumentError("copy stage " + std::to_string(s) + " of axis '" +
                                    layout.stage_axis + "' (size " + std::to_string(stages) +
                                    ") is out of range or not above stage " +
                                    std::to_string(below));
      }
      below = s;
    }
  } else if (!layout.copy_stages.empty()) {
    return InvalidArgumentError("copy stages without a pipeline stage axis");
  }
  return Status::Ok();
}

int64_t NumElements(const Layout& layout) {
  int64_t n = 1;
  for (int64_t s : layout.shape) n *= s;
  return n;
}

int64_t ByteSize(const Layout& layout) { return NumElements(layout) * DTypeSize(layout.dtype); }

std::string ToString(const Layout& layout) {
  std::string s = "shape " + ShapeToString(layout.shape);
  if (!layout.view.empty()) s += " view " + ShapeToString(layout.view);
  s += " " + std::string(DTypeName(layout.dtype));
  bool split = false;
  for (int d = 0; d < layout.rank(); ++d) split |= !layout.AxesOf(d).empty();
  if (split) {
    s += " split [";
    for (int d = 0; d < layout.rank(); ++d) s += (d ? ", " : "") + JoinAxes(layout.AxesOf(d));
    s += "]";
  }
  if (!layout.opt_axes.empty()) s += " opt [" + JoinAxes(layout.opt_axes) + "]";
  if (!layout.stage_axis.empty()) {
    s += " stage " + layout.stage_axis + "=" + std::to_string(layout.stage);
    for (int64_t c : layout.copy_stages) s += "," + std::to_string(c);
  }
  return s;
}

std::optional<std::vector<std::pair<int, int>>> RefinementGroups(
    const std::vector<int64_t>& fine, const std::vector<int64_t>& coarse) {
  std::vector<std::pair<int, int>> groups;
  const int n = static_cast<int>(fine.size());
  int k = 0;
  for (int64_t c : coarse) {
    const int first = k;
    int64_t prod = 1;
    do {
      if (k == n || fine[k] <= 0) return std::nullopt;
      prod *= fine[k++];
    } while (prod < c);
    if (prod != c) return std::nullopt;
    groups.emplace_back(first, k);
  }
  for (; k < n; ++k) {
    if (fine[k] != 1 || groups.empty()) return std::nullopt;
    groups.back().second = k + 1;
  }
  return groups;
}

bool RefinesShape(const std::vector<int64_t>& fine, const std::vector<int64_t>& coarse) {
  return RefinementGroups(fine, coarse).has_value();
}

Result<Layout> LayoutInView(const Layout& layout, const Mesh& mesh,
                            const std::vector<int64_t>& view) {
  RETURN_IF_ERROR(ValidateLayout(layout, mesh));
  const std::vector<int64_t>& coarse = layout.split_shape();
  const auto groups = RefinementGroups(view, coarse);
  if (!groups || layout.shape.empty()) {
    return InvalidArgumentError("view " + ShapeToString(view) + " does not refine " +
                                ShapeToString(coarse));
  }
  Layout out = layout;
  out.view = view == layout.shape ? std::vector<int64_t>{} : view;
  out.dim_axes.assign(view.size(), {});
  for (int d = 0; d < static_cast<int>(coarse.size()); ++d) {
    const auto [first, last] = (*groups)[d];
    out.dim_axes[first] = layout.AxesOf(d);
    std::vector<std::string> axes = layout.AxesOf(d);
    if (d == 0) axes.insert(axes.end(), layout.opt_axes.begin(), layout.opt_axes.end());
    if (axes.empty()) continue;
    std::vector<int64_t> counts;
    for (const std::string& a : axes) counts.push_back(mesh.axis_size(mesh.FindAxis(a)));
    int64_t inner = 1;
    for (int k = first + 1; k < last; ++k) inner *= view[k];
    const std::vector<Interval> want = NestedPieces(coarse[d], counts);
    const std::vector<Interval> got = NestedPieces(view[first], counts);
    for (size_t i = 0; i < want.size(); ++i) {
      if (got[i].begin * inner != want[i].begin || got[i].end * inner != want[i].end) {
        return InvalidArgumentError(
            "layout " + ToString(layout) + " cannot be expressed over view " + ShapeToString(view) +
            ": the pieces of dimension " + std::to_string(d) +
            " are cut inside the view's blocks of " + std::to_string(inner));
      }
    }
  }
  bool split = false;
  for (const auto& a : out.dim_axes) split = split || !a.empty();
  if (!split) out.dim_axes.clear();
  RETURN_IF_ERROR(ValidateLayout(out, mesh));
  return out;
}

// ---------------------------------------------------------------------------
// ShardGrid

Result<ShardGrid> ShardGrid::Create(const Mesh& mesh, const Layout& layout) {
  RETURN_IF_ERROR(ValidateLayout(layout, mesh));
  ShardGrid g;
  g.mesh_ = mesh;
  g.layout_ = layout;
  const int rank = layout.rank();
  g.split_axes_.resize(rank);
  g.pieces_.resize(rank);
  g.piece_stride_.assign(rank, 1);
  for (int d = 0; d < rank; ++d) {
    for (const std::string& a : layout.AxesOf(d)) g.split_axes_[d].push_back(mesh.FindAxis(a));
    if (d == 0) {
      for (const std::string& a : layout.opt_axes) g.split_axes_[d].push_back(mesh.FindAxis(a));
    }
    std::vector<int64_t> counts;
    for (int axis : g.split_axes_[d]) counts.push_back(mesh.axis_size(axis));
    g.pieces_[d] = NestedPieces(layout.split_shape()[d], counts);
  }
  for (int d = rank - 1; d >= 0; --d) {
    if (d + 1 < rank) {
      g.piece_stride_[d] = g.piece_stride_[d + 1] * static_cast<int64_t>(g.pieces_[d + 1].size());
    }
  }
  for (int d = 0; d < rank; ++d) g.num_pieces_ *= static_cast<int64_t>(g.pieces_[d].size());
  // A piece id is linear in the mesh coordinates: each split axis adds its
  // coordinate times the piece stride of its dimension times the sizes of
  // the axes after it in that dimension.
  g.axis_weight_.assign(mesh.ndim(), 0);
  for (int d = 0; d < rank; ++d) {
    int64_t w = g.piece_stride_[d];
    for (auto it = g.split_axes_[d].rbegin(); it != g.split_axes_[d].rend(); ++it) {
      g.axis_weight_[*it] = w;
      w *= mesh.axis_size(*it);
    }
  }
  g.stage_axis_ = layout.stage_axis.empty() ? -1 : mesh.FindAxis(layout.stage_axis);
  if (g.stage_axis_ >= 0) {
    for (int64_t s = 0; s < mesh.axis_size(g.stage_axis_); ++s) {
      g.on_stage_.push_back(layout.OnStage(s));
    }
  }
  return g;
}

int64_t ShardGrid::PieceId(int64_t rank) const {
  if (stage_axis_ >= 0 && !on_stage_[mesh_.Coordinate(rank, stage_axis_)]) return -1;
  int64_t id = 0;
  for (int axis = 0; axis < mesh_.ndim(); ++axis) {
    if (axis_weight_[axis] != 0) id += mesh_.Coordinate(rank, axis) * axis_weight_[axis];
  }
  return id;
}

std::vector<int64_t> ShardGrid::PieceIds() const {
  // The ranks in order, their coordinates counted up like an odometer (the
  // last axis fastest): no division per rank, which a 4,096-rank reshard
  // of 3,468 tensors would pay 21 million times.
  const int n = mesh_.ndim();
  std::vector<int64_t> ids(static_cast<size_t>(mesh_.world_size()));
  std::vector<int64_t> at(n, 0);
  int64_t id = 0;
  for (int64_t& out : ids) {
    out = stage_axis_ >= 0 && !on_stage_[at[stage_axis_]] ? -1 : id;
    for (int axis = n - 1; axis >= 0; --axis) {
      id += axis_weight_[axis];
      if (++at[axis] < mesh_.axis_size(axis)) break;
      id -= axis_weight_[axis] * at[axis];
      at[axis] = 0;
    }
  }
  return ids;
}

Box ShardGrid::PieceBox(int64_t piece_id) const {
  Box b(layout_.rank());
  for (int d = 0; d < layout_.rank(); ++d) {
    const int64_t n = static_cast<int64_t>(pieces_[d].size());
    b[d] = pieces_[d][(piece_id / piece_stride_[d]) % n];
  }
  return b;
}

std::optional<Box> ShardGrid::ShardOf(int64_t rank) const {
  const int64_t id = PieceId(rank);
  if (id < 0) return std::nullopt;
  return PieceBox(id);
}

std::vector<std::vector<int64_t>> ShardGrid::Holders() const {
  std::vector<std::vector<int64_t>> holders(num_pieces_);
  const std::vector<int64_t> ids = PieceIds();
  for (int64_t r = 0; r < mesh_.world_size(); ++r) {
    if (ids[r] >= 0) holders[ids[r]].push_back(r);
  }
  return holders;
}

Result<std::optional<Box>> ShardOf(const Layout& layout, const Mesh& mesh, int64_t rank) {
  if (rank < 0 || rank >= mesh.world_size()) {
    return OutOfRangeError("rank " + std::to_string(rank) + " is outside mesh " + mesh.ToString() +
                           " of " + std::to_string(mesh.world_size()) + " ranks");
  }
  ASSIGN_OR_RETURN(ShardGrid grid, ShardGrid::Create(mesh, layout));
  return grid.ShardOf(rank);
}

Result<std::vector<ReplicaGroup>> ReplicaGroups(const Layout& layout, const Mesh& mesh) {
  ASSIGN_OR_RETURN(ShardGrid grid, ShardGrid::Create(mesh, layout));
  std::vector<ReplicaGroup> groups;
  auto holders = grid.Holders();
  for (int64_t id = 0; id < grid.num_pieces(); ++id) {
    if (holders[id].empty()) continue;
    groups.push_back({grid.PieceBox(id), std::move(holders[id])});
  }
  return groups;
}

Result<bool> Equivalent(const Mesh& mesh_a, const Layout& a, const Mesh& mesh_b, const Layout& b) {
  if (a.shape != b.shape || a.dtype != b.dtype || mesh_a.world_size() != mesh_b.world_size()) {
    return false;
  }
  ASSIGN_OR_RETURN(ShardGrid ga, ShardGrid::Create(mesh_a, a));
  ASSIGN_OR_RETURN(ShardGrid gb, ShardGrid::Create(mesh_b, b));
  for (int64_t r = 0; r < mesh_a.world_size(); ++r) {
    if (ga.ShardOf(r) != gb.ShardOf(r)) return false;
  }
  return true;
}

}  // namespace tessera
