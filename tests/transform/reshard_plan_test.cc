#include "transform/reshard_plan.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <tuple>

#include "tests/test_util.h"
#include "tests/transform/random_layout.h"
#include "transform/mindspore_layout.h"
#include "transform/strategy.h"

namespace tessera {
namespace {

using testing::RandomLayout;
using testing::RandomMesh;
using testing::RandomShape;
using testing::Uniform;

// The shard `box` cut out of a full row-major tensor.
std::vector<uint8_t> Slice(const std::vector<uint8_t>& full, const std::vector<int64_t>& shape,
                           const Box& box, int64_t esize) {
  std::vector<uint8_t> out(NumElements(box) * esize);
  Box dst = box;
  for (int d = 0; d < box.rank(); ++d) dst[d] = {0, box[d].size()};
  CopyBox(full.data(), shape, box, out.data(), box.extents(), dst, esize);
  return out;
}

// Plans src -> dst for one tensor, executes it in memory on random bytes and
// checks every destination shard bit for bit, and that copies tile shards.
void CheckRoundTrip(std::mt19937_64& rng, const Mesh& sm, const Layout& src, const Mesh& dm,
                    const Layout& dst, const PlanOptions& options) {
  INFO("source " << sm.ToString() << " " << ToString(src) << "\ndestination " << dm.ToString()
                 << " " << ToString(dst));
  const int64_t esize = DTypeSize(src.dtype);
  std::vector<uint8_t> full(NumElements(src) * esize);
  for (uint8_t& b : full) b = static_cast<uint8_t>(rng());

  std::vector<int64_t> load;
  auto plan = PlanTensorReshard("t", sm, src, dm, dst, options, &load);
  REQUIRE(plan.ok());
  {  // Without choosing sources: the same shards and boxes, no source rank.
    PlanOptions unpicked = options;
    unpicked.pick_sources = false;
    auto boxes_only = PlanTensorReshard("t", sm, src, dm, dst, unpicked, nullptr);
    REQUIRE(boxes_only.ok());
    REQUIRE(boxes_only->shards.size() == plan->shards.size());
    for (size_t i = 0; i < plan->shards.size(); ++i) {
      const ShardPlan& a = plan->shards[i];
      const ShardPlan& b = boxes_only->shards[i];
      REQUIRE((a.dst_rank == b.dst_rank && a.shard == b.shard));
      REQUIRE(a.copies.size() == b.copies.size());
      for (size_t k = 0; k < a.copies.size(); ++k) {
        REQUIRE((b.copies[k].src_rank == -1 && a.copies[k].src_box == b.copies[k].src_box &&
                 a.copies[k].dst_box == b.copies[k].dst_box));
      }
    }
  }
  // The plan's boxes are over its layouts' split shape (a view, when the
  // source or destination has one); shards hold the same bytes either way.
  const std::vector<int64_t>& coords = plan->src_layout.split_shape();
  REQUIRE(plan->dst_layout.split_shape() == coords);
  auto sgrid = ShardGrid::Create(sm, plan->src_layout);
  REQUIRE(sgrid.ok());
  std::map<int64_t, std::vector<uint8_t>> src_shards;
  for (int64_t r = 0; r < sm.world_size(); ++r) {
    if (auto box = sgrid->ShardOf(r)) src_shards[r] = Slice(full, coords, *box, esize);
  }
  // Re-expressed layouts place every rank's bytes exactly as the originals.
  for (const auto& [mesh, original, planned] :
       {std::tuple{&sm, &src, &plan->src_layout}, {&dm, &dst, &plan->dst_layout}}) {
    auto a = ShardGrid::Create(*mesh, *original);
    auto b = ShardGrid::Create(*mesh, *planned);
    REQUIRE((a.ok() && b.ok()));
    for (int64_t r = 0; r < mesh->world_size(); ++r) {
      REQUIRE(a->ShardOf(r).has_value() == b->ShardOf(r).has_value());
      if (!a->ShardOf(r)) continue;
      REQUIRE(Slice(full, original->split_shape(), *a->ShardOf(r), esize) ==
              Slice(full, coords, *b->ShardOf(r), esize));
    }
  }

  std::map<int64_t, std::vector<uint8_t>> out;
  ExecuteTensorPlan(
      *plan, *sgrid, [&](int64_t r) { return static_cast<const void*>(src_shards.at(r).data()); },
      [&](const ShardPlan& sp) {
        auto& buf = out[sp.dst_rank];
        buf.assign(NumElements(sp.shard) * esize, 0);
        return static_cast<void*>(buf.data());
      });

  auto dgrid = ShardGrid::Create(dm, plan->dst_layout);
  REQUIRE(dgrid.ok());
  std::vector<bool> planned_piece(dgrid->num_pieces(), false);
  for (const ShardPlan& sp : plan->shards) {
    REQUIRE(dgrid->ShardOf(sp.dst_rank) == sp.shard);
    // Copies are disjoint, inside the shard, and cover it exactly.
    int64_t covered = 0;
    for (size_t i = 0; i < sp.copies.size(); ++i) {
      const PieceCopy& c = sp.copies[i];
      REQUIRE(Contains(Box::FromShape(sp.shard.extents()), c.dst_box));
      REQUIRE(Contains(Box::FromShape(sgrid->ShardOf(c.src_rank)->extents()), c.src_box));
      REQUIRE(c.src_box.extents() == c.dst_box.extents());
      covered += NumElements(c.dst_box);
      for (size_t j = 0; j < i; ++j) REQUIRE(IsEmpty(Intersect(c.dst_box, sp.copies[j].dst_box)));
    }
    REQUIRE(covered == NumElements(sp.shard));
    REQUIRE(out[sp.dst_rank] == Slice(full, coords, sp.shard, esize));
    planned_piece[dgrid->PieceId(sp.dst_rank)] = true;
  }
  // Every rank holding a non-empty destination shard got a plan (or, with
  // one_per_replica_group, one member of its group did).
  for (int64_t r = 0; r < dm.world_size(); ++r) {
    auto box = dgrid->ShardOf(r);
    if (!box || IsEmpty(*box)) continue;
    if (options.one_per_replica_group) {
      REQUIRE(planned_piece[dgrid->PieceId(r)]);
    } else {
      REQUIRE(out.count(r) == 1);
    }
  }
}

TEST_CASE("property: random source and destination layouts reshard bit for bit") {
  const uint64_t seed = testing::TestSeed();
  const int iterations = testing::TestIterations(400);
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < iterations; ++iter) {
    INFO("seed " << seed << " iteration " << iter << " (replay with TESSERA_TEST_SEED)");
    const Mesh sm = RandomMesh(rng, 16);
    const Mesh dm = RandomMesh(rng, 16, {"x", "y", "dp"});
    const std::vector<int64_t> shape = RandomShape(rng, 3, 9);
    const DType dtype = static_cast<DType>(Uniform(rng, 0, kNumDTypes - 1));
    const Layout src = RandomLayout(rng, sm, shape, dtype);
    const Layout dst = RandomLayout(rng, dm, shape, dtype);
    PlanOptions options;
    options.prefer_local = Uniform(rng, 0, 1);
    options.one_per_replica_group = Uniform(rng, 0, 1);
    CheckRoundTrip(rng, sm, src, dm, dst, options);
  }
}

TEST_CASE("split -> reshard -> reshard -> merge is the identity") {
  std::mt19937_64 rng(testing::TestSeed() + 1);
  const int iterations = testing::TestIterations(200);
  for (int iter = 0; iter < iterations; ++iter) {
    INFO("iteration " << iter);
    const std::vector<int64_t> shape = RandomShape(rng, 3, 7);
    const Mesh one;
    const Layout full = Layout::Replicated(shape, DType::kF32);
    const Mesh a = RandomMesh(rng, 8), b = RandomMesh(rng, 12, {"u", "v", "w"});
    const Layout la = RandomLayout(rng, a, shape, DType::kF32);
    const Layout lb = RandomLayout(rng, b, shape, DType::kF32);
    // Each hop's output is checked against the original data, so a chain of
    // hops composes to the identity.
    CheckRoundTrip(rng, one, full, a, la, {});
    CheckRoundTrip(rng, a, la, b, lb, {});
    CheckRoundTrip(rng, b, lb, one, full, {});
  }
}

TEST_CASE("replica choice balances bytes read across sources") {
  // 64 tensors replicated on 4 ranks, read by 4 ranks that each need a
  // quarter: every source should serve the same amount.
  Strategy src(*Mesh::Create({"dp"}, {4}));
  Strategy dst(*Mesh::Create({"tp"}, {4}));
  for (int i = 0; i < 64; ++i) {
    const std::string name = "w" + std::to_string(i);
    REQUIRE(src.Add({name, Layout::Replicated({64, 64}, DType::kF32), std::nullopt}).ok());
    Layout split = Layout::Replicated({64, 64}, DType::kF32);
    split.dim_axes = {{"tp"}, {}};
    REQUIRE(dst.Add({name, split, std::nullopt}).ok());
  }
  auto plan = PlanReshard(src, dst);
  REQUIRE(plan.ok());
  REQUIRE(plan->src_bytes.size() == 4);
  CHECK(plan->total_bytes == 64 * 64 * 64 * 4);
  for (int64_t b : plan->src_bytes) CHECK(b == plan->total_bytes / 4);

  PlanOptions local;
  local.prefer_local = true;
  auto lp = PlanReshard(src, dst, local);
  REQUIRE(lp.ok());
  for (const ShardPlan& sp : lp->tensors[0].shards) {
    for (const PieceCopy& c : sp.copies) CHECK(c.src_rank == sp.dst_rank);
  }
  CHECK(DescribePlan(*plan, false).find("64 tensors, 256 destination shards") == 0);
}

TEST_CASE("PlanReshard refuses mismatches with named errors") {
  Strategy src(*Mesh::Create({"dp"}, {2}));
  Strategy dst(*Mesh::Create({"dp"}, {2}));
  REQUIRE(src.Add({"wte", Layout::Replicated({8, 4}, DType::kF32), std::nullopt}).ok());
  REQUIRE(dst.Add({"wte", Layout::Replicated({8, 4}, DType::kBF16), std::nullopt}).ok());
  auto p = PlanReshard(src, dst);
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().message().find("tensor 'wte': dtype f32 in the source but bf16") !=
        std::string::npos);

  Strategy dst2(*Mesh::Create({"dp"}, {2}));
  REQUIRE(dst2.Add({"wte", Layout::Replicated({8, 5}, DType::kF32), std::nullopt}).ok());
  p = PlanReshard(src, dst2);
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().message().find("shape [8, 4] in the source but [8, 5]") != std::string::npos);

  Strategy dst3(*Mesh::Create({"dp"}, {2}));
  REQUIRE(dst3.Add({"wpe", Layout::Replicated({8, 4}, DType::kF32), std::nullopt}).ok());
  p = PlanReshard(src, dst3);
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().code() == StatusCode::kNotFound);
  CHECK(p.status().message().find("'wpe'") != std::string::npos);

  // A whole plan is for executing: it has its sources.
  PlanOptions unpicked;
  unpicked.pick_sources = false;
  p = PlanReshard(src, src, unpicked);
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().message().find("pick_sources") != std::string::npos);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// GPT-2's fused c_attn.weight [C, 3C] (q | k | v) over the view [C, 3, C].
Layout FusedQkv(int64_t C, std::vector<std::vector<std::string>> split) {
  Layout l = Layout::Replicated({C, 3 * C}, DType::kF32);
  l.view = {C, 3, C};
  l.dim_axes = std::move(split);
  return l;
}

TEST_CASE("views: the fused qkv split by heads is Megatron's local layout") {
  const int64_t C = 8;
  auto mesh = Mesh::Parse("tp=2");
  REQUIRE(mesh.ok());
  const Layout heads = FusedQkv(C, {{}, {}, {"tp"}});
  REQUIRE(ValidateLayout(heads, *mesh).ok());
  CHECK(ToString(heads) == "shape [8, 24] view [8, 3, 8] f32 split [-, -, tp]");
  auto grid = ShardGrid::Create(*mesh, heads);
  REQUIRE(grid.ok());
  CHECK(grid->ShardOf(1) == Box({{0, 8}, {0, 3}, {4, 8}}));
  // Merged on one rank -> split by heads: rank r's dense [C, 3C/2] buffer
  // holds, row by row, q, k and v columns [r C/2, (r+1) C/2).
  auto one = Mesh::Parse("tp=1");
  std::vector<float> full(C * 3 * C);
  for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i);
  std::vector<int64_t> load;
  auto plan = PlanTensorReshard("qkv", *one, Layout::Replicated({C, 3 * C}, DType::kF32), *mesh,
                                heads, {}, &load);
  REQUIRE(plan.ok());
  auto src_grid = ShardGrid::Create(*one, plan->src_layout);
  std::map<int64_t, std::vector<float>> local;
  ExecuteTensorPlan(
      *plan, *src_grid, [&](int64_t) { return static_cast<const void*>(full.data()); },
      [&](const ShardPlan& sp) {
        local[sp.dst_rank].assign(NumElements(sp.shard), -1.0f);
        return static_cast<void*>(local[sp.dst_rank].data());
      });
  for (int64_t r = 0; r < 2; ++r) {
    std::vector<float> want;
    for (int64_t row = 0; row < C; ++row) {
      for (int64_t b = 0; b < 3; ++b) {
        for (int64_t c = r * C / 2; c < (r + 1) * C / 2; ++c)
          want.push_back(full[row * 3 * C + b * C + c]);
      }
    }
    CHECK(local[r] == want);
  }
}

TEST_CASE("views: layouts are re-expressed over the finer view, or refused by name") {
  auto tp2 = Mesh::Parse("tp=2");
  auto tp3 = Mesh::Parse("tp=3");
  const Layout plain = Layout::Replicated({4, 12}, DType::kF32);
  const std::vector<int64_t> view = {4, 3, 4};
  auto rows = plain;
  rows.dim_axes = {{"tp"}, {}};
  auto in_view = LayoutInView(rows, *tp2, view);
  REQUIRE(in_view.ok());
  CHECK(in_view->dim_axes == std::vector<std::vector<std::string>>{{"tp"}, {}, {}});
  auto cols3 = plain;
  cols3.dim_axes = {{}, {"tp"}};
  auto blocks = LayoutInView(cols3, *tp3, view);  // cuts at 4 and 8: whole blocks
  REQUIRE(blocks.ok());
  CHECK(blocks->dim_axes == std::vector<std::vector<std::string>>{{}, {"tp"}, {}});
  auto cols2 = LayoutInView(cols3, *tp2, view);  // cuts at 6: inside block 1
  REQUIRE_FALSE(cols2.ok());
  CHECK_THAT(cols2.status().message(),
             Catch::Contains("dimension 1") && Catch::Contains("blocks of 4"));
  auto zero = plain;  // ZeRO's opt_axes cut dimension 0 of the view too
  zero.opt_axes = {"tp"};
  auto zero_view = LayoutInView(zero, *tp2, view);
  REQUIRE(zero_view.ok());
  CHECK(zero_view->opt_axes == std::vector<std::string>{"tp"});

  Layout bad = plain;
  bad.view = {12, 4};  // the same elements, not a refinement
  CHECK_THAT(ValidateLayout(bad, *tp2).message(), Catch::Contains("does not cut the dimensions"));
  bad.view = {4, 3, 5};
  CHECK_FALSE(ValidateLayout(bad, *tp2).ok());

  std::vector<int64_t> load;
  Layout other = plain;
  other.view = {2, 2, 12};  // refines [4, 12], but not [4, 3, 4], nor the reverse
  auto plan = PlanTensorReshard("h.0.attn.c_attn.weight", *tp2, FusedQkv(4, {{}, {}, {"tp"}}), *tp2,
                                other, {}, &load);
  REQUIRE_FALSE(plan.ok());
  CHECK_THAT(plan.status().message(), Catch::Contains("h.0.attn.c_attn.weight") &&
                                          Catch::Contains("neither view refines the other"));
  auto cut = PlanTensorReshard("qkv", *tp2, FusedQkv(4, {{}, {}, {"tp"}}), *tp2, cols3 /* tp=2 */,
                               {}, &load);
  REQUIRE_FALSE(cut.ok());
  CHECK_THAT(cut.status().message(), Catch::Contains("qkv") && Catch::Contains("blocks of 4"));
}

TEST_CASE("views: heads-split qkv reshards bit for bit to and from every other layout") {
  std::mt19937_64 rng(testing::TestSeed() + 90);
  const int64_t C = 12;
  auto tp2 = Mesh::Parse("dp=2,tp=2");
  auto tp4 = Mesh::Parse("pp=1,tp=4");
  auto one = Mesh::Parse("r=1");
  auto tp3 = Mesh::Parse("tp=3");
  const Layout heads2 = FusedQkv(C, {{}, {}, {"tp"}});
  Layout heads4 = FusedQkv(C, {{}, {}, {"tp"}});
  Layout heads_zero = FusedQkv(C, {{}, {}, {"tp"}});
  heads_zero.opt_axes = {"dp"};
  Layout rows = Layout::Replicated({C, 3 * C}, DType::kF32);
  rows.dim_axes = {{"tp"}, {}};
  Layout blocks3 = Layout::Replicated({C, 3 * C}, DType::kF32);
  blocks3.dim_axes = {{}, {"tp"}};  // q | k | v, one per rank
  const Layout merged = Layout::Replicated({C, 3 * C}, DType::kF32);
  const std::vector<std::pair<const Mesh*, Layout>> all = {{&*tp2, heads2},     {&*tp4, heads4},
                                                           {&*tp2, heads_zero}, {&*tp2, rows},
                                                           {&*tp3, blocks3},    {&*one, merged}};
  for (const auto& [sm, src] : all) {
    for (const auto& [dm, dst] : all) {
      if (src.view.empty() && dst.view.empty()) continue;
      for (bool one_per_group : {false, true}) {
        CheckRoundTrip(rng, *sm, src, *dm, dst, {.one_per_replica_group = one_per_group});
      }
    }
  }
}

TEST_CASE("views: checkpoint formats and MindSpore refuse them by name for now") {
  auto tp2 = Mesh::Parse("tp=2");
  auto ms = ToMindSpore(*tp2, FusedQkv(4, {{}, {}, {"tp"}}));
  REQUIRE_FALSE(ms.ok());
  CHECK_THAT(ms.status().message(), Catch::Contains("not a view"));
  Strategy s(*tp2);
  REQUIRE(s.Add({"h.0.attn.c_attn.weight", FusedQkv(4, {{}, {}, {"tp"}})}).ok());
  auto json = ParseStrategyJson(StrategyToJson(s));
  REQUIRE(json.ok());
  CHECK(json->tensors()[0].layout == s.tensors()[0].layout);
  CHECK(json->tensors()[0].layout.view == std::vector<int64_t>{4, 3, 4});
}

}  // namespace
}  // namespace tessera
