// Redistribute against the definition: for random meshes and layouts of
// random tensors (splits, ZeRO shards, pipeline stages, uneven chunks,
// empty dimensions), every rank's redistributed shard equals the same box
// cut out of the whole tensor; the layouts that need no traffic move none.
#include "runtime/parallel/dtensor.h"

#include <catch2/catch.hpp>
#include <map>
#include <mutex>
#include <random>

#include "runtime/comm/inprocess.h"
#include "tests/runtime/parallel/dtensor_check.h"

namespace tessera {
namespace {

using testing::Uniform;

// Runs Redistribute on `world` in-process ranks and checks every shard.
void Check(const Mesh& sm, const Layout& from, const Mesh& dm, const Layout& to,
           const std::vector<char>& full, std::vector<RedistributeStats>* stats = nullptr) {
  INFO(sm.ToString() << " " << ToString(from) << " -> " << dm.ToString() << " " << ToString(to));
  const int world = static_cast<int>(sm.world_size());
  std::mutex mu;
  std::vector<RedistributeStats> got(world);
  const Status s = RunInProcess(world, [&](Communicator& comm) -> Status {
    RedistributeStats st;
    RETURN_IF_ERROR(testing::CheckRedistribute(comm, sm, from, dm, to, full, &st));
    std::lock_guard<std::mutex> lock(mu);
    got[comm.rank()] = st;
    return Status::Ok();
  });
  INFO(s.ToString());
  REQUIRE(s.ok());
  if (stats != nullptr) *stats = got;
}

TEST_CASE("Redistribute: random layouts on random meshes reproduce the definition") {
  std::mt19937_64 rng(testing::TestSeed() + 70);
  for (int iter = 0; iter < 60; ++iter) {
    const int64_t world = std::vector<int64_t>{1, 2, 3, 4, 6, 8}[Uniform(rng, 0, 5)];
    const testing::RedistributeCase c = testing::RandomRedistributeCase(rng, world);
    INFO("iteration " << iter);
    Check(c.src_mesh, c.from, c.dst_mesh, c.to, c.full);
  }
}

TEST_CASE("Redistribute: traffic is what the layouts need") {
  auto mesh = Mesh::Parse("dp=2,tp=2");
  REQUIRE(mesh.ok());
  const std::vector<int64_t> shape = {8, 12};
  std::vector<char> full(8 * 12 * 4);
  for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<char>(i * 7);
  Layout whole = Layout::Replicated(shape, DType::kF32);
  Layout cols = whole;
  cols.dim_axes = {{}, {"tp"}};
  Layout rows = whole;
  rows.dim_axes = {{"tp"}, {}};
  std::vector<RedistributeStats> st;
  SECTION("replicated -> split: local slicing, nothing sent") {
    Check(*mesh, whole, *mesh, cols, full, &st);
    for (const auto& s : st) CHECK((s.sent_bytes == 0 && s.local_bytes == 8 * 6 * 4));
  }
  SECTION("split -> replicated: an all-gather over tp") {
    Check(*mesh, cols, *mesh, whole, full, &st);
    for (const auto& s : st) CHECK((s.sent_bytes == 8 * 6 * 4 && s.received_bytes == 8 * 6 * 4));
  }
  SECTION("rows in rank order -> replicated: one AllGatherV (FSDP's unshard)") {
    auto four = Mesh::Parse("a=2,b=2");
    Layout blocks = whole;
    blocks.dim_axes = {{"a", "b"}, {}};  // rank r holds rows [2r, 2r + 2)
    Check(*four, blocks, *four, whole, full, &st);
    for (const auto& s : st) CHECK((s.sent_bytes == 3 * 2 * 12 * 4 && s.local_bytes == 2 * 12 * 4));
    Layout uneven = Layout::Replicated({7, 12}, DType::kF32);  // chunks of 2, 2, 2, 1
    uneven.dim_axes = {{"a", "b"}, {}};
    Check(*four, uneven, *four, Layout::Replicated({7, 12}, DType::kF32),
          std::vector<char>(full.begin(), full.begin() + 7 * 12 * 4), &st);
    CHECK(st[3].local_bytes == 12 * 4);
    // Replicas (rows over tp only, dp holding copies) take the general path.
    Check(*mesh, rows, *mesh, whole, full, &st);
    for (const auto& s : st) CHECK(s.local_bytes == 4 * 12 * 4);
  }
  SECTION("columns -> rows: an all-to-all, half of each shard kept") {
    Check(*mesh, cols, *mesh, rows, full, &st);
    for (const auto& s : st) CHECK((s.local_bytes == 4 * 6 * 4 && s.sent_bytes == 4 * 6 * 4));
  }
  SECTION("the fused qkv: merged -> split by heads -> split by rows") {
    Layout heads = Layout::Replicated({4, 12}, DType::kF32);
    heads.view = {4, 3, 4};
    heads.dim_axes = {{}, {}, {"tp"}};
    std::vector<char> qkv(4 * 12 * 4);
    for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<char>(i);
    Check(*mesh, Layout::Replicated({4, 12}, DType::kF32), *mesh, heads, qkv, &st);
    Layout qkv_rows = Layout::Replicated({4, 12}, DType::kF32);
    qkv_rows.dim_axes = {{"dp"}, {}};
    Check(*mesh, heads, *mesh, qkv_rows, qkv, &st);
  }
}

TEST_CASE("Redistribute: mismatches are named") {
  auto four = Mesh::Parse("tp=4");
  auto two = Mesh::Parse("tp=2");
  std::vector<char> full(16 * 4);
  const Status s = RunInProcess(4, [&](Communicator& comm) -> Status {
    ASSIGN_OR_RETURN(DTensor t, DTensor::FromFull(*four, Layout::Replicated({16}, DType::kF32),
                                                  full.data(), comm.rank()));
    auto bad = Redistribute(t, *two, Layout::Replicated({16}, DType::kF32), comm);
    if (bad.ok() || bad.status().message().find("tp=2") == std::string::npos) {
      return InternalError("a 2-rank target on 4 ranks was not refused: " +
                           bad.status().ToString());
    }
    auto shape = Redistribute(t, Layout::Replicated({8}, DType::kF32), comm);
    if (shape.ok() || shape.status().message().find("shape") == std::string::npos) {
      return InternalError("another shape was not refused");
    }
    return Status::Ok();
  });
  CHECK(s.ok());
  auto size =
      DTensor::FromLocal(*four, Layout::Replicated({16}, DType::kF32), 0, std::vector<char>(3));
  REQUIRE_FALSE(size.ok());
  CHECK_THAT(size.status().message(), Catch::Contains("64 bytes, given 3"));
}

}  // namespace
}  // namespace tessera
