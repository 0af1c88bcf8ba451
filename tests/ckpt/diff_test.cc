// Diff (ckpt/diff.h): checkpoints compared tensor by tensor, with tolerances.
#include "ckpt/diff.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <vector>

#include "ckpt/ops.h"
#include "tests/ckpt/ckpt_test_util.h"
#include "tests/ckpt/memory_checkpoint.h"
#include "tests/test_util.h"

namespace tessera {
namespace {

using testing::MemoryCheckpoint;
using testing::Open;
using testing::Options;
using testing::RandomStrategy;

TEST_CASE("diff: equal across layouts, differences counted with tolerances") {
  std::mt19937_64 rng(testing::TestSeed() + 36);
  auto env = NewMemEnv();
  MemoryCheckpoint model;
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.5f;
  std::vector<uint8_t> bytes(v.size() * 4);
  std::memcpy(bytes.data(), v.data(), bytes.size());
  model.Add("w", DType::kF32, {10, 100}, bytes);
  model.Add("b", DType::kBF16, {3}, {0, 0x3f, 0, 0x40, 0x80, 0x3f});
  const Strategy s = RandomStrategy(rng, model, 8);
  REQUIRE(WriteTransformed(env.get(), model, s, "/a", Options(Codec::kZstd)).ok());
  auto a = Open(env.get(), "/a");
  auto same = DiffCheckpoints(*a, model, {});
  REQUIRE(same.ok());
  CHECK(same->ok());
  // One element off by 0.25 (relative 0.25/100).
  MemoryCheckpoint changed = model;
  float x = v[200] + 0.25f;
  std::memcpy(changed.mutable_data(0).data() + 800, &x, 4);
  auto d = DiffCheckpoints(*a, changed, {});
  REQUIRE(d.ok());
  REQUIRE_FALSE(d->ok());
  CHECK(d->tensors[0].differing == 1);
  CHECK(d->tensors[0].max_abs == Approx(0.25));
  CHECK(d->tensors[0].max_rel == Approx(0.25 / 100.25));
  CHECK(d->tensors[1].ok());
  DiffOptions loose;
  loose.atol = 0.3;
  CHECK(DiffCheckpoints(*a, changed, loose)->ok());
  // A tensor only on one side.
  MemoryCheckpoint fewer;
  fewer.Add("w", DType::kF32, {10, 100}, bytes);
  auto missing = DiffCheckpoints(*a, fewer, {});
  REQUIRE(missing.ok());
  CHECK(missing->tensors[1].problem == "missing in B");
}

}  // namespace
}  // namespace tessera
