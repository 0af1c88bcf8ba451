// Layout: how one tensor is distributed over a Mesh.
//
// For each tensor dimension, an ordered list of mesh axes splits it; the
// first axis listed is outermost. Splitting is nested torch.chunk: the
// dimension is chunked into size(a1) pieces, each of those into size(a2)
// pieces, and so on (the same rule as a DTensor sharded twice on one
// dimension). Mesh axes used by no dimension hold replicas.
//
// A layout may split a *view* of the tensor instead of its shape: the same
// elements in the same row-major order, each dimension of `shape` cut into
// consecutive view dimensions. GPT-2's fused c_attn.weight [C, 3C] (q | k |
// v side by side) viewed as [C, 3, C] and split [-, -, tp] gives each tp
// rank the columns of its heads in q, k and v alike: its shard is the view
// box [C, 3, C/tp], dense as the rank's [C, 3C/tp] matrix (q_r | k_r | v_r),
// Megatron's layout. Boxes (ShardOf, ReplicaGroups, plans) are then in view
// coordinates.
//
// Three extras:
//  - optimizer sharding (ZeRO / MindSpore's parallel optimizer): `opt_axes`,
//    replica axes that further split dimension 0 of each model-parallel
//    piece, nested inside the dimension's own axes;
//  - pipeline stage: with `stage_axis` set, only ranks whose coordinate on
//    that axis equals `stage` hold the tensor (a sub-mesh). A tensor several
//    stages use (a word embedding tied to the output projection, which
//    MindFormers places on the first and the last stage) lists the others in
//    `copy_stages`: their ranks hold the same pieces, as further replicas.
//    `stage` is the lowest, the copy that is read.
#ifndef TESSERA_TRANSFORM_LAYOUT_H_
#define TESSERA_TRANSFORM_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "core/status.h"
#include "transform/box.h"
#include "transform/mesh.h"

namespace tessera {

struct Layout {
  std::vector<int64_t> shape;
  DType dtype = DType::kF32;
  // Empty, or the view the splits apply to (see above).
  std::vector<int64_t> view;
  // One entry per dimension of the split shape, or empty when nothing is
  // split.
  std::vector<std::vector<std::string>> dim_axes;
  std::vector<std::string> opt_axes;
  std::string stage_axis;  // empty: held on every stage
  int64_t stage = 0;
  // Further stages holding the same pieces, ascending, each above `stage`.
  std::vector<int64_t> copy_stages;

  // Whether ranks at coordinate `s` of the stage axis hold the tensor.
  bool OnStage(int64_t s) const;

  // Not split anywhere: every rank holds the whole tensor.
  static Layout Replicated(std::vector<int64_t> shape, DType dtype);

  // The shape the splits apply to (and boxes are in): the view, or shape.
  const std::vector<int64_t>& split_shape() const { return view.empty() ? shape : view; }
  int rank() const { return static_cast<int>(split_shape().size()); }
  // The axes splitting dimension d (empty if none).
  const std::vector<std::string>& AxesOf(int d) const;

  bool operator==(const Layout& o) const;
  bool operator!=(const Layout& o) const { return !(*this == o); }
};

// Checks the layout against the mesh: dims >= 0, rank <= kMaxRank, byte size
// fits in int64, a view that refines the shape (no zero sizes then), every
// axis exists, no axis used twice, stages in range (copy stages ascending,
// above `stage`).
Status ValidateLayout(const Layout& layout, const Mesh& mesh);
// Elements and bytes of the whole tensor (valid layouts only).
int64_t NumElements(const Layout& layout);
int64_t ByteSize(const Layout& layout);
// "shape [768, 3072] f32 split [-, tp] opt [dp] stage pp=1" (stages
// "pp=0,3" when copy stages hold it too); a view shows
// as "shape [768, 2304] view [768, 3, 768] f32 split [-, -, tp]".
std::string ToString(const Layout& layout);

// Whether `fine` cuts every dimension of `coarse` into consecutive
// dimensions (equal shapes included). Both without zero sizes.
bool RefinesShape(const std::vector<int64_t>& fine, const std::vector<int64_t>& coarse);
// For each dimension of `coarse`, the range [first, last) of the dimensions
// of `fine` it is cut into (trailing 1s of `fine` join the last range), or
// nothing when `fine` does not refine `coarse`.
std::optional<std::vector<std::pair<int, int>>> RefinementGroups(
    const std::vector<int64_t>& fine, const std::vector<int64_t>& coarse);

// The same placement expressed over the finer split shape `view` (which
// must refine layout.split_shape()): each dimension's axes move to the
// first of the view dimensions it is cut into. Fails, naming the
// dimension, when the pieces would not be the same (a split whose cuts fall
// inside a view dimension's blocks, e.g. [C, 3C] split in 2 over [C, 3, C]).
Result<Layout> LayoutInView(const Layout& layout, const Mesh& mesh,
                            const std::vector<int64_t>& view);

// A layout resolved against a mesh, for answering many ShardOf questions
// quickly. Each dimension is cut into an ordered list of pieces; a rank's
// shard is the product of one piece per dimension.
class ShardGrid {
 public:
  static Result<ShardGrid> Create(const Mesh& mesh, const Layout& layout);

  const Mesh& mesh() const { return mesh_; }
  const Layout& layout() const { return layout_; }

  // The box held by `rank` (may be empty: a trailing torch.chunk piece), or
  // nullopt when the rank is not on the tensor's pipeline stage.
  std::optional<Box> ShardOf(int64_t rank) const;

  // Pieces of dimension d, ordered and contiguous, covering [0, shape[d]).
  const std::vector<Interval>& pieces(int d) const { return pieces_[d]; }
  // Row-major over the per-dimension piece counts.
  int64_t num_pieces() const { return num_pieces_; }
  // The piece `rank` holds, or -1 when not on the stage.
  int64_t PieceId(int64_t rank) const;
  // PieceId of every rank, in rank order.
  std::vector<int64_t> PieceIds() const;
  Box PieceBox(int64_t piece_id) const;
  // For every piece id, the ranks holding it, ascending.
  std::vector<std::vector<int64_t>> Holders() const;

 private:
  Mesh mesh_;
  Layout layout_;
  std::vector<std::vector<int>> split_axes_;  // per dim, mesh axis indices (incl. opt)
  std::vector<std::vector<Interval>> pieces_;
  std::vector<int64_t> piece_stride_;  // row-major strides over piece counts
  int64_t num_pieces_ = 1;
  std::vector<int64_t> axis_weight_;  // per mesh axis: what a coordinate adds to a piece id
  int stage_axis_ = -1;
  std::vector<bool> on_stage_;  // per coordinate along stage_axis_
};

// Convenience over ShardGrid; errors name the rank when it is out of range.
Result<std::optional<Box>> ShardOf(const Layout& layout, const Mesh& mesh, int64_t rank);

struct ReplicaGroup {
  Box box;                     // the shard every member holds
  std::vector<int64_t> ranks;  // ascending
};
// Ranks holding the same piece, one group per piece that some rank holds,
// in piece order.
Result<std::vector<ReplicaGroup>> ReplicaGroups(const Layout& layout, const Mesh& mesh);

// True when both describe the same tensor placed identically: equal shape,
// dtype and world size, and every rank holds the same box (or none).
Result<bool> Equivalent(const Mesh& mesh_a, const Layout& a, const Mesh& mesh_b, const Layout& b);

}  // namespace tessera

#endif  // TESSERA_TRANSFORM_LAYOUT_H_
