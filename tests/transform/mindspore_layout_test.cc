#include "transform/mindspore_layout.h"

#include <catch2/catch.hpp>

#include "tests/transform/random_layout.h"

namespace tessera {
namespace {

using testing::Uniform;

// An independent transcription of MindSpore's slice lookup
// (mindspore/parallel/_tensor.py): _get_tensor_strategy,
// _rank_to_coordinate, _convert_to_new_device_coordinate,
// _coordinate_to_rank, then _chunk_tensor_by_strategy's row-major order of
// equal np.split pieces. Tuple entries combine their axes row-major.
Box MindSporeSlice(const MindSporeLayout& ms, const std::vector<int64_t>& shape, int64_t rank) {
  const int64_t n = static_cast<int64_t>(ms.dev_matrix.size());
  std::vector<int64_t> coord(n);
  for (int64_t i = n - 1, r = rank; i >= 0; --i) {
    coord[i] = r % ms.dev_matrix[i];
    r /= ms.dev_matrix[i];
  }
  Box b(static_cast<int>(shape.size()));
  for (size_t d = 0; d < shape.size(); ++d) {
    int64_t strategy = 1, index = 0;
    for (int64_t k : ms.tensor_map[d]) {
      if (k == -1) continue;
      strategy *= ms.dev_matrix[n - 1 - k];
      index = index * ms.dev_matrix[n - 1 - k] + coord[n - 1 - k];
    }
    const int64_t piece = shape[d] / strategy;
    b[d] = {index * piece, (index + 1) * piece};
  }
  return b;
}

TEST_CASE("FromMindSpore reproduces MindSpore's rank -> slice mapping") {
  // The docstring example of _load_tensor: dev_mat [2, 4], tensor_map [1, -1].
  MindSporeLayout doc{{2, 4}, {{1}, {-1}}};
  auto ml = FromMindSpore(doc, {32, 32}, DType::kF32);
  REQUIRE(ml.ok());
  CHECK(**ShardOf(ml->layout, ml->mesh, 5) == Box{{16, 32}, {0, 32}});  // rank 5 -> coord (1, 1)
  CHECK(**ShardOf(ml->layout, ml->mesh, 3) == Box{{0, 16}, {0, 32}});

  std::mt19937_64 rng(testing::TestSeed() + 2);
  for (int iter = 0; iter < testing::TestIterations(300); ++iter) {
    INFO("iteration " << iter);
    MindSporeLayout ms;
    const int64_t ndev = Uniform(rng, 1, 4);
    for (int64_t i = 0; i < ndev; ++i) ms.dev_matrix.push_back(Uniform(rng, 1, 3));
    const int rank = static_cast<int>(Uniform(rng, 1, 3));
    std::vector<int64_t> shape(rank);
    std::vector<bool> used(ndev, false);
    ms.tensor_map.resize(rank);
    for (int d = 0; d < rank; ++d) {
      int64_t factor = 1;
      const int64_t parts = Uniform(rng, 0, 2);  // 0: -1, 1: one axis, 2: a tuple
      for (int64_t p = 0; p < parts; ++p) {
        const int64_t k = Uniform(rng, 0, ndev - 1);
        if (used[k]) continue;
        used[k] = true;
        ms.tensor_map[d].push_back(k);
        factor *= ms.dev_matrix[ndev - 1 - k];
      }
      if (ms.tensor_map[d].empty()) ms.tensor_map[d].push_back(-1);
      shape[d] = factor * Uniform(rng, 1, 3);
    }
    auto got = FromMindSpore(ms, shape, DType::kF16);
    REQUIRE(got.ok());
    for (int64_t r = 0; r < got->mesh.world_size(); ++r) {
      REQUIRE(**ShardOf(got->layout, got->mesh, r) == MindSporeSlice(ms, shape, r));
    }
    // And back: the same dev_matrix and tensor_map.
    auto back = ToMindSpore(got->mesh, got->layout);
    REQUIRE(back.ok());
    CHECK(back->dev_matrix == ms.dev_matrix);
    CHECK(back->tensor_map == ms.tensor_map);
  }
}

TEST_CASE("optimizer sharding follows _construct_tensor_layout_for_opt_shard") {
  // dev_matrix [4, 2] (dp=4 outer, mp=2 inner), weight [16, 6] split on
  // dimension 1 by mp; opt shard of 2: model-parallel slice = rank % 2,
  // optimizer index = rank / 2 % 2, rows of dimension 0 split in halves.
  MindSporeLayout ms{{4, 2}, {{-1}, {0}}, 2, 2};
  auto ml = FromMindSpore(ms, {16, 6}, DType::kF32);
  REQUIRE(ml.ok());
  for (int64_t r = 0; r < 8; ++r) {
    const int64_t mp = r % 2, opt = (r / 2) % 2;
    CHECK(**ShardOf(ml->layout, ml->mesh, r) == Box{{opt * 8, opt * 8 + 8}, {mp * 3, mp * 3 + 3}});
  }
  // opt_weight_shard_size -1 means every replica.
  MindSporeLayout all{{4, 2}, {{-1}, {0}}, 2, -1};
  auto ma = FromMindSpore(all, {16, 6}, DType::kF32);
  REQUIRE(ma.ok());
  CHECK(**ShardOf(ma->layout, ma->mesh, 7) == Box{{12, 16}, {3, 6}});
  // Dimension 0 split by model parallelism, then by the optimizer.
  MindSporeLayout row{{2, 2}, {{0}, {-1}}, 2, 2};
  auto mr = FromMindSpore(row, {8, 2}, DType::kF32);
  REQUIRE(mr.ok());
  CHECK(**ShardOf(mr->layout, mr->mesh, 3) == Box{{6, 8}, {0, 2}});  // mp 1, opt 1
  auto back = ToMindSpore(mr->mesh, mr->layout);
  REQUIRE(back.ok());
  CHECK(back->opt_weight_shard_step == 2);
  CHECK(back->opt_weight_shard_size == 2);

  CHECK_FALSE(FromMindSpore({{4, 2}, {{-1}, {0}}, 3, 2}, {16, 6}, DType::kF32).ok());  // bad step
  CHECK_FALSE(FromMindSpore({{4, 2}, {{-1}, {0}}, 2, 3}, {16, 6}, DType::kF32).ok());  // 3 ∤ 4
}

TEST_CASE("pipeline stages add an outer pp axis") {
  MindSporeLayout ms{{2, 2}, {{1}, {-1}}};
  auto ml = FromMindSpore(ms, {4, 4}, DType::kF32, {1, 2});
  REQUIRE(ml.ok());
  CHECK(ml->mesh.ToString() == "[pp=2, m1=2, m0=2]");
  CHECK_FALSE(ShardOf(ml->layout, ml->mesh, 3)->has_value());        // stage 0
  CHECK(**ShardOf(ml->layout, ml->mesh, 6) == Box{{2, 4}, {0, 4}});  // stage 1, local rank 2
  auto back = ToMindSpore(ml->mesh, ml->layout);
  REQUIRE(back.ok());
  CHECK(back->dev_matrix == std::vector<int64_t>{2, 2});
}

TEST_CASE("our layouts round-trip through MindSpore's form where it can express them") {
  std::mt19937_64 rng(testing::TestSeed() + 3);
  int converted = 0, refused = 0;
  for (int iter = 0; iter < testing::TestIterations(300); ++iter) {
    INFO("iteration " << iter);
    const Mesh mesh = testing::RandomMesh(rng, 16);
    std::vector<int64_t> shape(Uniform(rng, 1, 3));
    for (int64_t& s : shape) s = 12 * Uniform(rng, 1, 2);  // divisible by 1..4 and 6
    Layout l = testing::RandomLayout(rng, mesh, shape, DType::kF32, true, false);
    auto ms = ToMindSpore(mesh, l);
    if (!ms.ok()) {
      ++refused;
      CHECK_FALSE(ms.status().message().empty());
      continue;
    }
    ++converted;
    auto back = FromMindSpore(*ms, shape, DType::kF32);
    REQUIRE(back.ok());
    CHECK(*Equivalent(mesh, l, back->mesh, back->layout));
  }
  CHECK(converted > refused);
}

TEST_CASE("MindSpore conversion errors name the problem") {
  auto bad = FromMindSpore({{2, 2}, {{3}}}, {4}, DType::kF32);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("tensor_map entry 3") != std::string::npos);
  CHECK_FALSE(FromMindSpore({{2, 2}, {{0}, {1}}}, {4}, DType::kF32).ok());
  auto mesh = Mesh::Create({"tp"}, {4});
  Layout uneven = Layout::Replicated({10}, DType::kF32);
  uneven.dim_axes = {{"tp"}};
  auto u = ToMindSpore(*mesh, uneven);
  REQUIRE_FALSE(u.ok());
  CHECK(u.status().message().find("unevenly") != std::string::npos);
}

}  // namespace
}  // namespace tessera
