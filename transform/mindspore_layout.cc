#include "transform/mindspore_layout.h"

#include <string>

namespace tessera {
namespace {

std::string AxisName(int64_t k) { return "m" + std::to_string(k); }

// Outer "pp" axis and stage placement for multi-stage strategies.
Status AddPipeline(const PipelinePlacement& placement, MeshLayout* ml) {
  if (placement.num_stages < 1 || placement.stage < 0 || placement.stage >= placement.num_stages) {
    return InvalidArgumentError("pipeline stage " + std::to_string(placement.stage) + " of " +
                                std::to_string(placement.num_stages) + " stages");
  }
  if (placement.num_stages == 1) return Status::Ok();
  std::vector<std::string> names = ml->mesh.axis_names();
  std::vector<int64_t> sizes = ml->mesh.axis_sizes();
  names.insert(names.begin(), "pp");
  sizes.insert(sizes.begin(), placement.num_stages);
  ASSIGN_OR_RETURN(ml->mesh, Mesh::Create(std::move(names), std::move(sizes)));
  ml->layout.stage_axis = "pp";
  ml->layout.stage = placement.stage;
  ml->layout.copy_stages = placement.copy_stages;
  return ValidateLayout(ml->layout, ml->mesh);
}

}  // namespace

Result<MeshLayout> FromMindSpore(const MindSporeLayout& ms, const std::vector<int64_t>& shape,
                                 DType dtype, PipelinePlacement placement) {
  const int64_t ndev = static_cast<int64_t>(ms.dev_matrix.size());
  if (ms.tensor_map.size() != shape.size()) {
    return InvalidArgumentError("tensor_map has " + std::to_string(ms.tensor_map.size()) +
                                " entries but the tensor has " + std::to_string(shape.size()) +
                                " dimensions");
  }
  int64_t devices = 1;
  for (int64_t s : ms.dev_matrix) {
    if (s < 1) return InvalidArgumentError("dev_matrix has a size " + std::to_string(s));
    devices *= s;
  }
  // Per dimension: device axes (left-to-right indices) splitting it.
  std::vector<std::vector<int64_t>> dims(shape.size());
  std::vector<int64_t> split_count(shape.size(), 1);
  for (size_t d = 0; d < shape.size(); ++d) {
    for (int64_t k : ms.tensor_map[d]) {
      if (k == -1) continue;
      if (k < 0 || k >= ndev) {
        return InvalidArgumentError("tensor_map entry " + std::to_string(k) + " of dimension " +
                                    std::to_string(d) + " is outside dev_matrix of " +
                                    std::to_string(ndev) + " axes");
      }
      dims[d].push_back(ndev - 1 - k);
      split_count[d] *= ms.dev_matrix[ndev - 1 - k];
    }
  }

  MeshLayout ml;
  ml.layout.shape = shape;
  ml.layout.dtype = dtype;
  int64_t opt_size = ms.opt_weight_shard_size;
  const bool opt = ms.opt_weight_shard_step != 0 && opt_size != 0 && !shape.empty();
  if (!opt) {
    std::vector<std::string> names;
    for (int64_t i = 0; i < ndev; ++i) names.push_back(AxisName(ndev - 1 - i));
    ASSIGN_OR_RETURN(ml.mesh, Mesh::Create(std::move(names), ms.dev_matrix));
    ml.layout.dim_axes.resize(shape.size());
    for (size_t d = 0; d < shape.size(); ++d) {
      for (int64_t i : dims[d]) ml.layout.dim_axes[d].push_back(AxisName(ndev - 1 - i));
    }
  } else {
    // _construct_tensor_layout_for_opt_shard: the model-parallel slice index
    // is taken as rank % opt_weight_shard_step (row-major over the split
    // counts), the optimizer index as (rank / step) % opt_weight_shard_size.
    int64_t step = 1;
    for (int64_t c : split_count) step *= c;
    if (step != ms.opt_weight_shard_step) {
      return InvalidArgumentError(
          "opt_weight_shard_step " + std::to_string(ms.opt_weight_shard_step) +
          " differs from the model-parallel slice count " + std::to_string(step));
    }
    if (opt_size == -1) opt_size = devices / step;
    if (opt_size < 1 || devices % (step * opt_size) != 0) {
      return InvalidArgumentError("opt_weight_shard_size " + std::to_string(opt_size) +
                                  " does not divide the " + std::to_string(devices / step) +
                                  " replicas of each slice");
    }
    const int64_t repeat = devices / (step * opt_size);
    std::vector<std::string> names;
    std::vector<int64_t> sizes;
    if (repeat > 1) {
      names.push_back("rep");
      sizes.push_back(repeat);
    }
    names.push_back("opt");
    sizes.push_back(opt_size);
    ml.layout.dim_axes.resize(shape.size());
    for (size_t d = 0; d < shape.size(); ++d) {
      names.push_back("t" + std::to_string(d));
      sizes.push_back(split_count[d]);
      if (split_count[d] > 1) ml.layout.dim_axes[d].push_back(names.back());
    }
    ml.layout.opt_axes = {"opt"};
    ASSIGN_OR_RETURN(ml.mesh, Mesh::Create(std::move(names), std::move(sizes)));
  }
  RETURN_IF_ERROR(AddPipeline(placement, &ml));
  RETURN_IF_ERROR(ValidateLayout(ml.layout, ml.mesh));
  return ml;
}

Result<MindSporeLayout> ToMindSpore(const Mesh& mesh, const Layout& layout) {
  RETURN_IF_ERROR(ValidateLayout(layout, mesh));
  if (!layout.view.empty()) {
    return UnimplementedError("layout " + ToString(layout) +
                              ": MindSpore strategies split a tensor's own dimensions, not a view");
  }
  // dev_matrix: the mesh without the stage axis.
  std::vector<int> dev_axes;
  MindSporeLayout ms;
  for (int i = 0; i < mesh.ndim(); ++i) {
    if (mesh.axis_name(i) == layout.stage_axis) continue;
    dev_axes.push_back(i);
    ms.dev_matrix.push_back(mesh.axis_size(i));
  }
  const int64_t ndev = static_cast<int64_t>(dev_axes.size());
  auto right_index = [&](const std::string& axis) -> int64_t {
    const int mi = mesh.FindAxis(axis);
    for (int64_t j = 0; j < ndev; ++j) {
      if (dev_axes[j] == mi) return ndev - 1 - j;
    }
    return -1;
  };
  if (!layout.stage_axis.empty() && mesh.FindAxis(layout.stage_axis) != 0) {
    return InvalidArgumentError("the pipeline axis '" + layout.stage_axis +
                                "' must be the outermost mesh axis for MindSpore");
  }
  int64_t step = 1;
  std::vector<int64_t> split_count(layout.rank(), 1);
  for (int d = 0; d < layout.rank(); ++d) {
    std::vector<int64_t> entry;
    for (const std::string& a : layout.AxesOf(d)) {
      entry.push_back(right_index(a));
      split_count[d] *= mesh.axis_size(mesh.FindAxis(a));
    }
    if (entry.empty()) entry.push_back(-1);
    if (layout.shape[d] % split_count[d] != 0) {
      return InvalidArgumentError("dimension " + std::to_string(d) + " of size " +
                                  std::to_string(layout.shape[d]) + " is split " +
                                  std::to_string(split_count[d]) +
                                  " ways unevenly; MindSpore requires even splits");
    }
    step *= split_count[d];
    ms.tensor_map.push_back(std::move(entry));
  }
  if (layout.opt_axes.empty()) return ms;

  int64_t opt_size = 1;
  for (const std::string& a : layout.opt_axes) opt_size *= mesh.axis_size(mesh.FindAxis(a));
  const int64_t dim0_piece = layout.shape[0] / split_count[0];
  if (dim0_piece % opt_size != 0) {
    return InvalidArgumentError("the optimizer shard splits dimension 0 pieces of " +
                                std::to_string(dim0_piece) + " rows " + std::to_string(opt_size) +
                                " ways unevenly; MindSpore requires even splits");
  }
  ms.opt_weight_shard_step = step;
  ms.opt_weight_shard_size = opt_size;
  // MindSpore fixes the rank order of the optimizer shard (see FromMindSpore);
  // accept only layouts that place every rank's piece the same way.
  PipelinePlacement placement;
  if (!layout.stage_axis.empty()) placement = {layout.stage, mesh.axis_size(0), layout.copy_stages};
  ASSIGN_OR_RETURN(MeshLayout back, FromMindSpore(ms, layout.shape, layout.dtype, placement));
  ASSIGN_OR_RETURN(bool same, Equivalent(mesh, layout, back.mesh, back.layout));
  if (!same) {
    return InvalidArgumentError(
        "the optimizer shard over [" + layout.opt_axes[0] +
        (layout.opt_axes.size() > 1 ? ", ..." : "") +
        "] does not follow MindSpore's rank order (model-parallel slice = rank % "
        "opt_weight_shard_step, optimizer index = rank / step % opt_weight_shard_size)");
  }
  return ms;
}

}  // namespace tessera
