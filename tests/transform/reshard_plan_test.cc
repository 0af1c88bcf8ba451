#include "transform/reshard_plan.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <map>

#include "tests/transform/random_layout.h"

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

  auto sgrid = ShardGrid::Create(sm, src);
  REQUIRE(sgrid.ok());
  std::map<int64_t, std::vector<uint8_t>> src_shards;
  for (int64_t r = 0; r < sm.world_size(); ++r) {
    if (auto box = sgrid->ShardOf(r)) src_shards[r] = Slice(full, src.shape, *box, esize);
  }
  std::vector<int64_t> load;
  auto plan = PlanTensorReshard("t", sm, src, dm, dst, options, &load);
  REQUIRE(plan.ok());

  std::map<int64_t, std::vector<uint8_t>> out;
  ExecuteTensorPlan(
      *plan, *sgrid, [&](int64_t r) { return static_cast<const void*>(src_shards.at(r).data()); },
      [&](const ShardPlan& sp) {
        auto& buf = out[sp.dst_rank];
        buf.assign(NumElements(sp.shard) * esize, 0);
        return static_cast<void*>(buf.data());
      });

  auto dgrid = ShardGrid::Create(dm, dst);
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
    REQUIRE(out[sp.dst_rank] == Slice(full, src.shape, sp.shard, esize));
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
}

}  // namespace
}  // namespace tessera
