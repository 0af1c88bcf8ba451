// WriteTransformed (ckpt/ops.h): bad strategies and interrupted writes leave
// no output.
#include "ckpt/ops.h"

#include <catch2/catch.hpp>
#include <random>
#include <string>

#include "core/env.h"
#include "tests/ckpt/ckpt_test_util.h"
#include "tests/ckpt/memory_checkpoint.h"
#include "tests/test_util.h"

namespace tessera {
namespace {

using testing::MemoryCheckpoint;
using testing::Open;
using testing::Options;
using testing::RandomModel;
using testing::RandomStrategy;
using testing::RequireSameContents;

TEST_CASE("bad strategies are named errors and leave no output") {
  std::mt19937_64 rng(testing::TestSeed() + 34);
  auto env = NewMemEnv();
  MemoryCheckpoint model = RandomModel(rng, 4);
  REQUIRE(env->CreateDirs("/out").ok());
  SECTION("unknown tensor") {
    Strategy s(*Mesh::Parse("tp=2"));
    REQUIRE(s.Add({"no.such.tensor", Layout::Replicated({4}, DType::kF32), {}}).ok());
    auto r = WriteTransformed(env.get(), model, s, "/out/x", Options(Codec::kRaw));
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("no.such.tensor"));
  }
  SECTION("shape mismatch") {
    Strategy s(*Mesh::Parse("tp=2"));
    const Layout& l = model.strategy().tensors()[1].layout;
    std::vector<int64_t> shape = l.shape;
    shape.push_back(3);
    REQUIRE(s.Add({"model.t1", Layout::Replicated(shape, l.dtype), {}}).ok());
    auto r = WriteTransformed(env.get(), model, s, "/out/x", Options(Codec::kRaw));
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("model.t1"));
  }
  auto children = env->GetChildren("/out");
  REQUIRE(children.ok());
  CHECK(children->empty());
}

TEST_CASE("an interrupted transform never leaves a complete-looking output") {
  std::mt19937_64 rng(testing::TestSeed() + 35);
  auto base = NewMemEnv();
  MemoryCheckpoint model = RandomModel(rng, 8);
  const Strategy s = RandomStrategy(rng, model, 4);
  // Count the writes of a full run, then fail at each point in turn (with
  // and without a crash afterwards).
  FaultInjectionEnv probe(base.get());
  REQUIRE(
      WriteTransformed(&probe, model, s, "/probe", Options(Codec::kRaw, kDefaultMemoryBudget, 1))
          .ok());
  const int64_t writes = probe.writes_seen();
  REQUIRE(writes > 5);
  for (int64_t n = 1; n <= writes; ++n) {
    INFO("failing write " << n << " of " << writes);
    FaultInjectionEnv env(base.get());
    const std::string out = "/out" + std::to_string(n);
    env.FailNthWrite(n, /*sticky=*/true);
    auto r = WriteTransformed(&env, model, s, out, Options(Codec::kRaw, kDefaultMemoryBudget, 1));
    REQUIRE_FALSE(r.ok());
    REQUIRE(env.SimulateCrash().ok());
    REQUIRE_FALSE(base->FileExists(out));
    auto opened = OpenCheckpoint(base.get(), out);
    REQUIRE_FALSE(opened.ok());
  }
  // A crash at any moment after the last write: either no output, or a
  // complete one.
  FaultInjectionEnv env(base.get());
  REQUIRE(WriteTransformed(&env, model, s, "/done", Options(Codec::kRaw)).ok());
  REQUIRE(env.SimulateCrash().ok());
  RequireSameContents(*Open(base.get(), "/done"), model);
}

}  // namespace
}  // namespace tessera
