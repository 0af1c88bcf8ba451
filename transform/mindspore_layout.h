// MindSpore's form of a tensor layout, both ways.
//
// MindSpore describes a parameter's distribution with a device matrix
// (`dev_matrix`, row-major, last axis fastest) and a `tensor_map`: for each
// tensor dimension, the index of the device axis splitting it counted from
// the *right* of dev_matrix, -1 when not split; newer versions allow a tuple
// of axes for one dimension. The parallel optimizer adds
// `opt_weight_shard_step` (the model-parallel slice count) and
// `opt_weight_shard_size` (how many ranks share one slice's optimizer
// state; -1 = all of them).
#ifndef TESSERA_TRANSFORM_MINDSPORE_LAYOUT_H_
#define TESSERA_TRANSFORM_MINDSPORE_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "transform/layout.h"
#include "transform/mesh.h"

namespace tessera {

struct MindSporeLayout {
  std::vector<int64_t> dev_matrix;
  // Per tensor dimension: empty or {-1} = not split; {k} = split by device
  // axis k from the right; {k1, k2} = split by several, k1 outermost.
  std::vector<std::vector<int64_t>> tensor_map;
  int64_t opt_weight_shard_step = 0;
  int64_t opt_weight_shard_size = 0;

  bool operator==(const MindSporeLayout& o) const {
    return dev_matrix == o.dev_matrix && tensor_map == o.tensor_map &&
           opt_weight_shard_step == o.opt_weight_shard_step &&
           opt_weight_shard_size == o.opt_weight_shard_size;
  }
};

struct MeshLayout {
  Mesh mesh;
  Layout layout;
};

// Pipeline placement of a strategy file: MindSpore writes one dev_matrix per
// stage; rank = stage * devices_per_stage + rank within the stage.
// A parameter several stages hold (MindFormers' word embedding on the
// first and the last stage) has its further stages in `copy_stages`.
struct PipelinePlacement {
  int64_t stage = 0;
  int64_t num_stages = 1;
  std::vector<int64_t> copy_stages;  // ascending, above `stage`
};

// Device axis k (from the right) becomes mesh axis "m<k>". With optimizer
// sharding the mesh is rebuilt as MindSpore's
// _construct_tensor_layout_for_opt_shard does (mindspore/parallel/_tensor.py):
// [repeat (if > 1), opt_weight_shard_size, split count of each dimension],
// named "rep", "opt", "t0", "t1", ...; dimension 0 is split by "t0" and then
// by "opt". With several stages an outer axis "pp" is added and the layout
// is placed on `placement.stage` (and its copy stages).
Result<MeshLayout> FromMindSpore(const MindSporeLayout& ms, const std::vector<int64_t>& shape,
                                 DType dtype, PipelinePlacement placement = {});

// The inverse: the mesh's axes become dev_matrix (without the stage axis),
// each dimension's axes their right-counted indices. Fails, naming the
// reason, when MindSpore cannot express the layout: uneven splits (MindSpore
// requires every split to divide its dimension) or an optimizer shard that
// does not follow MindSpore's rank order.
Result<MindSporeLayout> ToMindSpore(const Mesh& mesh, const Layout& layout);

}  // namespace tessera

#endif  // TESSERA_TRANSFORM_MINDSPORE_LAYOUT_H_
