#include "transform/layout.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <functional>
#include <map>
#include <numeric>

namespace tessera {
namespace {

// The definition, written directly: dimension d of rank r's shard is the
// nested torch.chunk of [0, shape[d]) by each of its axes in order.
std::optional<Box> ExpectedShard(const Mesh& mesh, const Layout& l, int64_t r) {
  if (!l.stage_axis.empty() && mesh.Coordinate(r, mesh.FindAxis(l.stage_axis)) != l.stage) {
    return std::nullopt;
  }
  Box b(l.rank());
  for (int d = 0; d < l.rank(); ++d) {
    std::vector<std::string> axes = l.AxesOf(d);
    if (d == 0) axes.insert(axes.end(), l.opt_axes.begin(), l.opt_axes.end());
    Interval iv{0, l.shape[d]};
    for (const std::string& a : axes) {
      const int ai = mesh.FindAxis(a);
      iv = ChunkOf(iv, mesh.axis_size(ai), mesh.Coordinate(r, ai));
    }
    b[d] = iv;
  }
  return b;
}

// Calls fn for every layout of a tensor of `rank` dimensions on `mesh`: each
// axis unused, used for the optimizer shard, or splitting one dimension, in
// every order; on meshes of 3 axes, also with an unused axis as the stage.
void ForEachLayout(const Mesh& mesh, int rank, const std::function<void(const Layout&)>& fn) {
  const int k = mesh.ndim();
  const int choices = rank + 2;  // 0 = unused, 1 = opt, 2.. = dim
  int total = 1;
  for (int i = 0; i < k; ++i) total *= choices;
  for (int code = 0; code < total; ++code) {
    std::vector<int> assign(k);
    for (int i = 0, c = code; i < k; ++i, c /= choices) assign[i] = c % choices;
    std::vector<int> order(k);
    std::iota(order.begin(), order.end(), 0);
    do {
      Layout l;
      l.dim_axes.resize(rank);
      std::vector<int> unused;
      for (int i : order) {
        if (assign[i] == 0)
          unused.push_back(i);
        else if (assign[i] == 1)
          l.opt_axes.push_back(mesh.axis_name(i));
        else
          l.dim_axes[assign[i] - 2].push_back(mesh.axis_name(i));
      }
      if (!l.opt_axes.empty() && rank == 0) continue;
      fn(l);
      if (k == 3 && !unused.empty()) {
        l.stage_axis = mesh.axis_name(unused[0]);
        for (int64_t s = 0; s < mesh.axis_size(unused[0]); ++s) {
          l.stage = s;
          fn(l);
        }
      }
    } while (std::next_permutation(order.begin(), order.end()));
  }
}

void CheckLayout(const Mesh& mesh, const Layout& l) {
  INFO("mesh " << mesh.ToString() << " layout " << ToString(l));
  auto grid = ShardGrid::Create(mesh, l);
  REQUIRE(grid.ok());
  const int64_t world = mesh.world_size();
  std::map<int64_t, Box> piece_box;
  const std::vector<int64_t> ids = grid->PieceIds();  // counted, not divided out
  REQUIRE(static_cast<int64_t>(ids.size()) == world);
  for (int64_t r = 0; r < world; ++r) {
    auto got = grid->ShardOf(r);
    auto want = ExpectedShard(mesh, l, r);
    REQUIRE(got == want);
    REQUIRE(ids[r] == grid->PieceId(r));
    REQUIRE((ids[r] >= 0) == got.has_value());
    if (got) {
      auto [it, inserted] = piece_box.emplace(grid->PieceId(r), *got);
      REQUIRE(it->second == *got);  // same piece id => same box (replicas)
    }
  }
  // One rank per replica group: disjoint pieces covering the tensor once.
  const int64_t n = NumElements(l);
  std::vector<int> cover(n, 0);
  for (const auto& [id, box] : piece_box) {
    if (IsEmpty(box)) continue;
    std::vector<int64_t> idx(l.rank(), 0);
    for (;;) {
      int64_t flat = 0;
      for (int d = 0; d < l.rank(); ++d) flat = flat * l.shape[d] + box[d].begin + idx[d];
      cover[flat]++;
      int d = l.rank() - 1;
      for (; d >= 0; --d) {
        if (++idx[d] < box[d].size()) break;
        idx[d] = 0;
      }
      if (d < 0) break;
    }
  }
  for (int64_t e = 0; e < n; ++e) REQUIRE(cover[e] == 1);
  // ReplicaGroups agrees.
  auto groups = ReplicaGroups(l, mesh);
  REQUIRE(groups.ok());
  std::vector<int64_t> seen;
  for (const ReplicaGroup& g : *groups) {
    REQUIRE(std::is_sorted(g.ranks.begin(), g.ranks.end()));
    for (int64_t r : g.ranks) {
      REQUIRE(*grid->ShardOf(r) == g.box);
      seen.push_back(r);
    }
  }
  std::sort(seen.begin(), seen.end());
  std::vector<int64_t> held;
  for (int64_t r = 0; r < world; ++r) {
    if (grid->ShardOf(r)) held.push_back(r);
  }
  REQUIRE(seen == held);
}

TEST_CASE("every layout on meshes up to 8 ranks, tensors of 1 to 3 dimensions") {
  const std::vector<std::vector<int64_t>> meshes = {
      {1}, {2}, {3}, {4}, {5}, {7}, {8}, {2, 2}, {2, 3}, {3, 2}, {2, 4}, {4, 2}, {2, 2, 2}};
  const std::vector<std::vector<int64_t>> dim_sizes = {{0, 1, 3, 4, 5, 8}, {1, 3, 4, 6}, {2, 3, 5}};
  int64_t layouts = 0;
  for (const auto& sizes : meshes) {
    std::vector<std::string> names = {"a", "b", "c"};
    names.resize(sizes.size());
    auto mesh = Mesh::Create(names, sizes);
    REQUIRE(mesh.ok());
    for (int rank = 1; rank <= 3; ++rank) {
      const auto& ds = dim_sizes[rank - 1];
      int64_t shapes = 1;
      for (int d = 0; d < rank; ++d) shapes *= static_cast<int64_t>(ds.size());
      for (int64_t code = 0; code < shapes; ++code) {
        std::vector<int64_t> shape(rank);
        for (int d = 0, c = static_cast<int>(code); d < rank; ++d, c /= ds.size()) {
          shape[d] = ds[c % ds.size()];
        }
        ForEachLayout(*mesh, rank, [&](Layout l) {
          l.shape = shape;
          l.dtype = DType::kF32;
          CheckLayout(*mesh, l);
          ++layouts;
        });
      }
    }
  }
  CHECK(layouts > 10000);
}

TEST_CASE("Megatron-style splits give the expected boxes") {
  auto mesh = Mesh::Create({"dp", "tp"}, {2, 4});
  REQUIRE(mesh.ok());
  Layout col;
  col.shape = {768, 2304};
  col.dim_axes = {{}, {"tp"}};
  auto s = ShardOf(col, *mesh, 6);  // dp=1, tp=2
  REQUIRE(s.ok());
  CHECK(**s == Box{{0, 768}, {1152, 1728}});
  Layout zero = col;
  zero.opt_axes = {"dp"};
  CHECK(**ShardOf(zero, *mesh, 6) == Box{{384, 768}, {1152, 1728}});
  // Uneven: 10 rows over 4 ranks -> 3, 3, 3, 1.
  Layout uneven = Layout::Replicated({10}, DType::kBF16);
  uneven.dim_axes = {{"tp"}};
  CHECK(**ShardOf(uneven, *mesh, 3) == Box{{9, 10}});
  auto groups = ReplicaGroups(col, *mesh);
  REQUIRE(groups.ok());
  REQUIRE(groups->size() == 4);
  CHECK((*groups)[1].ranks == std::vector<int64_t>{1, 5});
  auto out = ShardOf(col, *mesh, 8);
  REQUIRE_FALSE(out.ok());
  CHECK(out.status().message().find("rank 8") != std::string::npos);
}

TEST_CASE("invalid layouts give named errors") {
  auto mesh = Mesh::Create({"dp", "tp"}, {2, 4});
  REQUIRE(mesh.ok());
  auto msg = [&](const Layout& l) { return ValidateLayout(l, *mesh).message(); };
  Layout l = Layout::Replicated({8, 8}, DType::kF32);
  CHECK(ValidateLayout(l, *mesh).ok());

  Layout bad_axis = l;
  bad_axis.dim_axes = {{"ep"}, {}};
  CHECK(msg(bad_axis) == "axis 'ep' (split of dimension 0) is not in mesh [dp=2, tp=4]");

  Layout twice = l;
  twice.dim_axes = {{"tp"}, {"tp"}};
  CHECK(msg(twice).find("axis 'tp' is used twice") != std::string::npos);
  Layout opt_twice = l;
  opt_twice.dim_axes = {{"dp"}, {}};
  opt_twice.opt_axes = {"dp"};
  CHECK(msg(opt_twice).find("used twice (split of dimension 0 and optimizer shard)") !=
        std::string::npos);

  Layout negative = Layout::Replicated({4, -1}, DType::kF32);
  CHECK(msg(negative).find("negative dimension 1") != std::string::npos);

  Layout overflow = Layout::Replicated({int64_t{1} << 40, int64_t{1} << 30}, DType::kF32);
  CHECK(msg(overflow).find("overflows") != std::string::npos);
  Layout bytes_overflow = Layout::Replicated({int64_t{1} << 31, int64_t{1} << 31}, DType::kF64);
  CHECK(msg(bytes_overflow).find("overflows a 64-bit byte count") != std::string::npos);

  Layout dims = l;
  dims.dim_axes = {{"tp"}};
  CHECK(msg(dims).find("split lists 1 dimensions") != std::string::npos);

  Layout stage = l;
  stage.stage_axis = "dp";
  stage.stage = 2;
  CHECK(msg(stage).find("stage 2 is outside axis 'dp'") != std::string::npos);

  Layout scalar = Layout::Replicated({}, DType::kF32);
  scalar.opt_axes = {"dp"};
  CHECK(msg(scalar).find("scalar") != std::string::npos);
  Layout deep = Layout::Replicated(std::vector<int64_t>(9, 1), DType::kF32);
  CHECK(msg(deep).find("rank 9") != std::string::npos);
}

TEST_CASE(
    "a tensor held by several pipeline stages: every copy stage's ranks hold the same pieces") {
  const Mesh mesh = *Mesh::Create({"pp", "dp", "tp"}, {4, 2, 2});
  Layout l = Layout::Replicated({64, 16}, DType::kF32);
  l.dim_axes = {{"tp"}, {}};
  l.stage_axis = "pp";
  l.stage = 0;
  l.copy_stages = {3};
  REQUIRE(ValidateLayout(l, mesh).ok());
  CHECK(ToString(l) == "shape [64, 16] f32 split [tp, -] stage pp=0,3");
  for (int64_t r = 0; r < mesh.world_size(); ++r) {
    const int64_t stage = mesh.Coordinate(r, 0);
    auto box = ShardOf(l, mesh, r);
    REQUIRE(box.ok());
    CHECK(box->has_value() == (stage == 0 || stage == 3));
    if (box->has_value()) {
      const int64_t tp = mesh.Coordinate(r, 2);
      CHECK(**box == Box({{32 * tp, 32 * tp + 32}, {0, 16}}));
    }
  }
  auto groups = ReplicaGroups(l, mesh);
  REQUIRE(groups.ok());
  REQUIRE(groups->size() == 2);
  // Each tp piece: dp replicas on stage 0, then the same on stage 3.
  CHECK((*groups)[0].ranks == std::vector<int64_t>{0, 2, 12, 14});
  Layout other = l;
  other.copy_stages = {2};
  CHECK(other != l);
  Layout bad = l;
  bad.copy_stages = {0};
  CHECK(ValidateLayout(bad, mesh).message().find("not above stage 0") != std::string::npos);
  bad.copy_stages = {4};
  CHECK(ValidateLayout(bad, mesh).message().find("copy stage 4") != std::string::npos);
  bad.copy_stages = {3, 2};
  CHECK_FALSE(ValidateLayout(bad, mesh).ok());
}

TEST_CASE("Equivalent compares placements, not spellings") {
  auto m1 = Mesh::Create({"dp", "tp"}, {2, 2});
  auto m2 = Mesh::Create({"x", "y"}, {2, 2});
  Layout a = Layout::Replicated({4, 4}, DType::kF32);
  a.dim_axes = {{"tp"}, {}};
  Layout b = Layout::Replicated({4, 4}, DType::kF32);
  b.dim_axes = {{"y"}, {}};
  CHECK(*Equivalent(*m1, a, *m2, b));
  b.dim_axes = {{"x"}, {}};
  CHECK_FALSE(*Equivalent(*m1, a, *m2, b));
}

}  // namespace
}  // namespace tessera
