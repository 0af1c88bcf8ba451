// Inspect (ckpt/inspect.h): a checkpoint's contents as text and as JSON.
#include "ckpt/inspect.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "ckpt/ops.h"
#include "tests/ckpt/ckpt_test_util.h"
#include "tests/ckpt/memory_checkpoint.h"
#include "tests/test_util.h"

namespace tessera {
namespace {

using testing::MemoryCheckpoint;
using testing::Open;
using testing::Options;
using testing::RandomModel;

TEST_CASE("inspect shows every tensor, as text and as JSON") {
  std::mt19937_64 rng(testing::TestSeed() + 37);
  auto env = NewMemEnv();
  MemoryCheckpoint model = RandomModel(rng, 5);
  model.mutable_meta().metadata["run"] = "gpt-small \xe2\x9c\x93";
  model.mutable_meta().metadata["blob"] = "\xff\xfe";
  Strategy s(*Mesh::Parse("dp=2,tp=2"));
  for (const TensorStrategy& t : model.strategy().tensors()) {
    Layout l = t.layout;
    if (l.rank() > 0) {
      l.dim_axes.assign(l.rank(), {});
      l.dim_axes.back() = {"tp"};
      l.opt_axes = {"dp"};
    }
    REQUIRE(s.Add({t.name, l, {}}).ok());
  }
  REQUIRE(WriteTransformed(env.get(), model, s, "/a", Options(Codec::kRaw)).ok());
  auto a = Open(env.get(), "/a");
  const std::string text = InspectText(*a);
  CHECK_THAT(text, Catch::Contains("step        42") && Catch::Contains("[dp=2, tp=2]"));
  for (const TensorStrategy& t : model.strategy().tensors())
    CHECK_THAT(text, Catch::Contains(t.name));
  auto j = nlohmann::json::parse(InspectJson(*a));
  CHECK(j["tensors"].size() == 5);
  CHECK(j["mesh"]["tp"] == 2);
  CHECK(j["step"] == 42);
  // Short text values are shown; binary ones by size.
  CHECK_THAT(text,
             Catch::Contains("run=\"gpt-small \xe2\x9c\x93\"") && Catch::Contains("config (16 B)"));
  // JSON has every UTF-8 value (escaped), and the size of any other.
  CHECK(j["metadata"][0]["key"] == "blob");
  CHECK_FALSE(j["metadata"][0].contains("text"));
  CHECK(j["metadata"][1]["text"] == model.meta().metadata.at("config"));
  CHECK(j["metadata"][2]["key"] == "run");
  CHECK(j["metadata"][2]["text"] == "gpt-small \xe2\x9c\x93");
  CHECK(PlacementString(s.tensors()[0].layout).find("opt [dp]") != std::string::npos);
}

}  // namespace
}  // namespace tessera
