// The transform loop (ckpt/transform.h): SplitBox's slabs, and split, reshard
// and merge through it returning the same tensors.
#include "ckpt/transform.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "ckpt/ops.h"
#include "ckpt/verify.h"
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
using testing::Uniform;

TEST_CASE("SplitBox tiles a box with slabs under the limit, in order") {
  std::mt19937_64 rng(testing::TestSeed() + 30);
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<int64_t> shape = testing::RandomShape(rng, 4, 20);
    Box box = Box::FromShape(shape);
    for (int d = 0; d < box.rank(); ++d)
      box[d].begin = std::min<int64_t>(box[d].end, Uniform(rng, 0, 3));
    if (IsEmpty(box)) continue;
    const int64_t es = Uniform(rng, 1, 8), limit = Uniform(rng, es, 400);
    const std::vector<Box> slabs = SplitBox(box, es, limit);
    int64_t total = 0;
    for (size_t i = 0; i < slabs.size(); ++i) {
      REQUIRE(Contains(box, slabs[i]));
      REQUIRE((NumElements(slabs[i]) * es <= limit || NumElements(slabs[i]) == 1));
      for (size_t j = i + 1; j < slabs.size(); ++j) REQUIRE(IsEmpty(Intersect(slabs[i], slabs[j])));
      total += NumElements(slabs[i]);
    }
    REQUIRE(total == NumElements(box));
  }
}

TEST_CASE("split -> reshard -> reshard -> merge is the identity, raw and zstd") {
  std::mt19937_64 rng(testing::TestSeed() + 31);
  auto env = NewMemEnv();
  const int iterations = testing::TestIterations(12);
  for (int iter = 0; iter < iterations; ++iter) {
    const Codec codec = iter % 2 ? Codec::kZstd : Codec::kRaw;
    // A small budget in some iterations forces tensors into several slabs.
    const int64_t budget = iter % 3 == 0 ? (int64_t{400} << 10) : kDefaultMemoryBudget;
    MemoryCheckpoint model = RandomModel(rng, static_cast<int>(Uniform(rng, 5, 25)), iter % 4 == 0);
    const std::string base = "/ck" + std::to_string(iter);
    INFO("iteration " << iter << " seed " << testing::TestSeed());
    const Strategy a = RandomStrategy(rng, model, 8);
    REQUIRE(WriteTransformed(env.get(), model, a, base + "/a", Options(codec, budget)).ok());
    auto ra = Open(env.get(), base + "/a");
    RequireSameContents(*ra, model);
    const Strategy b = RandomStrategy(rng, model, 8);
    REQUIRE(WriteTransformed(env.get(), *ra, b, base + "/b", Options(codec, budget, 3)).ok());
    auto rb = Open(env.get(), base + "/b");
    const Strategy c = RandomStrategy(rng, model, 6);
    REQUIRE(WriteTransformed(env.get(), *rb, c, base + "/c", Options(Codec::kRaw, budget, 1)).ok());
    auto rc = Open(env.get(), base + "/c");
    REQUIRE(WriteTransformed(env.get(), *rc, MergedStrategy(rc->strategy()), base + "/m",
                             Options(codec, budget))
                .ok());
    auto rm = Open(env.get(), base + "/m");
    RequireSameContents(*rm, model);
    // Layouts are recorded: b's reader reports b's layouts, the merge is whole.
    for (size_t i = 0; i < b.tensors().size(); ++i) {
      REQUIRE(rb->strategy().tensors()[i].layout == b.tensors()[i].layout);
      REQUIRE(rm->strategy().tensors()[i].layout.dim_axes.empty());
    }
    REQUIRE(rm->meta().step == 42);
    REQUIRE(rm->meta().metadata == model.meta().metadata);
    auto report = VerifyNativeCheckpoint(env.get(), base + "/b", {});
    REQUIRE(report.ok());
    REQUIRE(report->ok());
    REQUIRE_FALSE(env->FileExists(base + "/b.tmp-" + std::to_string(getpid())));
  }
}

}  // namespace
}  // namespace tessera
