// Random meshes and layouts for the property tests.
#ifndef TESSERA_TESTS_TRANSFORM_RANDOM_LAYOUT_H_
#define TESSERA_TESTS_TRANSFORM_RANDOM_LAYOUT_H_

#include <algorithm>
#include <random>

#include "tests/test_util.h"
#include "transform/layout.h"
#include "transform/mesh.h"

namespace tessera::testing {

// 1 to 3 axes named from `names`, world size at most `max_world`.
inline Mesh RandomMesh(std::mt19937_64& rng, int64_t max_world,
                       std::vector<std::string> names = {"dp", "tp", "pp"}) {
  for (;;) {
    const int k = static_cast<int>(Uniform(rng, 1, 3));
    std::vector<int64_t> sizes;
    int64_t world = 1;
    for (int i = 0; i < k; ++i) {
      sizes.push_back(Uniform(rng, 1, 4));
      world *= sizes.back();
    }
    if (world > max_world) continue;
    std::shuffle(names.begin(), names.end(), rng);
    names.resize(k);
    return *Mesh::Create(names, sizes);
  }
}

// A mesh of exactly `world` ranks over 1 to 3 axes named from `names`.
inline Mesh RandomMeshOfSize(std::mt19937_64& rng, int64_t world, std::vector<std::string> names) {
  std::vector<int64_t> sizes;
  int64_t left = world;
  const int axes = static_cast<int>(Uniform(rng, 1, 3));
  for (int i = 0; i + 1 < axes; ++i) {
    std::vector<int64_t> divisors;
    for (int64_t d = 1; d <= left; ++d) {
      if (left % d == 0) divisors.push_back(d);
    }
    sizes.push_back(divisors[Uniform(rng, 0, static_cast<int64_t>(divisors.size()) - 1)]);
    left /= sizes.back();
  }
  sizes.push_back(left);
  std::shuffle(names.begin(), names.end(), rng);
  names.resize(sizes.size());
  return *Mesh::Create(names, sizes);
}

// Each mesh axis: unused, optimizer shard, pipeline stage, or one dimension's
// split (in random order). `even` keeps every split dividing its dimension.
inline Layout RandomLayout(std::mt19937_64& rng, const Mesh& mesh, std::vector<int64_t> shape,
                           DType dtype, bool allow_opt = true, bool allow_stage = true) {
  Layout l;
  l.shape = std::move(shape);
  l.dtype = dtype;
  l.dim_axes.resize(l.shape.size());
  std::vector<int> order(mesh.ndim());
  for (int i = 0; i < mesh.ndim(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  for (int i : order) {
    const int64_t choice = Uniform(rng, -3, l.rank() - 1);
    if (choice >= 0) {
      l.dim_axes[choice].push_back(mesh.axis_name(i));
    } else if (choice == -2 && allow_opt && l.rank() > 0) {
      l.opt_axes.push_back(mesh.axis_name(i));
    } else if (choice == -3 && allow_stage && l.stage_axis.empty()) {
      l.stage_axis = mesh.axis_name(i);
      l.stage = Uniform(rng, 0, mesh.axis_size(i) - 1);
    }
  }
  return l;
}

inline std::vector<int64_t> RandomShape(std::mt19937_64& rng, int max_rank, int64_t max_dim) {
  std::vector<int64_t> shape(Uniform(rng, 0, max_rank));
  for (int64_t& s : shape) s = Uniform(rng, 0, max_dim);
  return shape;
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TRANSFORM_RANDOM_LAYOUT_H_
