#include "transform/strategy.h"

#include <catch2/catch.hpp>

#include "tests/transform/random_layout.h"

namespace tessera {
namespace {

constexpr char kExample[] = R"({
  "format": "tessera.strategy",
  "version": 1,
  "mesh": {"axes": ["pp", "dp", "tp"], "shape": [2, 2, 2]},
  "tensors": {
    "wte": {"dtype": "f32", "shape": [50304, 768], "split": ["tp", null]},
    "h.0.attn.c_attn.weight": {"dtype": "bf16", "shape": [768, 2304],
                               "split": [null, "tp"], "opt_shard": "dp",
                               "stage": {"axis": "pp", "index": 0}},
    "h.0.ln_1.weight": {"shape": [768], "split": [["dp", "tp"]]},
    "step": {"dtype": "i64", "shape": []}
  }
})";

TEST_CASE("the documented example parses, keeps file order, and round-trips") {
  auto s = ParseStrategyJson(kExample);
  REQUIRE(s.ok());
  REQUIRE(s->tensors().size() == 4);
  CHECK(s->tensors()[0].name == "wte");
  CHECK(s->tensors()[3].name == "step");
  const TensorStrategy* qkv = s->Find("h.0.attn.c_attn.weight");
  REQUIRE(qkv != nullptr);
  CHECK(qkv->layout.dtype == DType::kBF16);
  CHECK(qkv->layout.opt_axes == std::vector<std::string>{"dp"});
  CHECK(qkv->layout.stage_axis == "pp");
  CHECK(s->Find("h.0.ln_1.weight")->layout.AxesOf(0) == std::vector<std::string>{"dp", "tp"});
  auto again = ParseStrategyJson(StrategyToJson(*s));
  REQUIRE(again.ok());
  CHECK(StrategyToJson(*again) == StrategyToJson(*s));
}

TEST_CASE("a stage list places a tensor on several stages, and round-trips") {
  auto s = ParseStrategyJson(R"({"format": "tessera.strategy", "version": 1,
    "mesh": {"axes": ["pp", "tp"], "shape": [4, 2]},
    "tensors": {"wte": {"shape": [64, 16], "split": ["tp", null],
                        "stage": {"axis": "pp", "index": [3, 0]}}}})");
  REQUIRE(s.ok());
  const Layout& l = s->tensors()[0].layout;
  CHECK(l.stage == 0);
  CHECK(l.copy_stages == std::vector<int64_t>{3});
  const std::string json = StrategyToJson(*s);
  CHECK(json.find("\"index\": [\n") != std::string::npos);
  auto again = ParseStrategyJson(json);
  REQUIRE(again.ok());
  CHECK(again->tensors()[0].layout == l);
  auto dup = ParseStrategyJson(R"({"format": "tessera.strategy", "version": 1,
    "mesh": {"axes": ["pp"], "shape": [2]},
    "tensors": {"wte": {"shape": [4], "stage": {"axis": "pp", "index": [1, 1]}}}})");
  CHECK_FALSE(dup.ok());
}

TEST_CASE("random strategies round-trip through JSON and files") {
  std::mt19937_64 rng(testing::TestSeed() + 4);
  auto env = NewMemEnv();
  for (int iter = 0; iter < 50; ++iter) {
    Strategy s(testing::RandomMesh(rng, 16));
    for (int t = 0; t < 5; ++t) {
      const DType dt = static_cast<DType>(testing::Uniform(rng, 0, kNumDTypes - 1));
      TensorStrategy ts{"t" + std::to_string(t),
                        testing::RandomLayout(rng, s.mesh(), testing::RandomShape(rng, 3, 9), dt),
                        std::nullopt};
      if (t == 4) {
        ts.mesh = testing::RandomMesh(rng, 8, {"a", "b", "c"});
        ts.layout = testing::RandomLayout(rng, *ts.mesh, ts.layout.shape, dt);
      }
      REQUIRE(s.Add(ts).ok());
    }
    REQUIRE(SaveStrategyFile(env.get(), "/s.json", s).ok());
    auto back = LoadStrategyFile(env.get(), "/s.json");
    REQUIRE(back.ok());
    REQUIRE(back->tensors().size() == s.tensors().size());
    for (size_t i = 0; i < s.tensors().size(); ++i) {
      CHECK(back->tensors()[i].layout == s.tensors()[i].layout);
      CHECK(back->MeshOf(back->tensors()[i]) == s.MeshOf(s.tensors()[i]));
    }
  }
}

TEST_CASE("bad strategy files give errors naming the file and tensor") {
  auto env = NewMemEnv();
  auto load = [&](const std::string& text) {
    REQUIRE(WriteFileAtomically(env.get(), "/bad.json", text).ok());
    return LoadStrategyFile(env.get(), "/bad.json");
  };
  auto r = load(R"({"mesh": {"axes": ["dp"], "shape": [2]},
                    "tensors": {"h.3.mlp.fc.weight": {"shape": [8], "split": ["ep"]}}})");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() ==
        "strategy file '/bad.json': tensor 'h.3.mlp.fc.weight': axis 'ep' (split of dimension 0) "
        "is not in mesh [dp=2]");
  r = load("{not json");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("'/bad.json': not valid JSON") != std::string::npos);
  r = load(R"({"tensors": {"w": {"shape": "big"}}})");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("malformed") != std::string::npos);
  r = load(R"({"version": 9})");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("version 9 is newer") != std::string::npos);
  r = load(R"({"tensors": {"w": {"shape": [4], "dtype": "f7"}}})");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("tensor 'w': unknown dtype 'f7'") != std::string::npos);
  auto missing = LoadStrategyFile(env.get(), "/nope.json");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message().find("/nope.json") != std::string::npos);
}

TEST_CASE("WithMesh keeps the axes and changes the degrees") {
  auto s = ParseStrategyJson(kExample);
  REQUIRE(s.ok());
  auto resized = WithMesh(*s, *Mesh::Parse("pp=1,dp=4,tp=4"));
  REQUIRE(resized.ok());
  CHECK(resized->mesh().world_size() == 16);
  CHECK(resized->Find("wte")->layout.AxesOf(0) == std::vector<std::string>{"tp"});
  auto lost = WithMesh(*s, *Mesh::Parse("dp=4,tp=4"));
  REQUIRE_FALSE(lost.ok());
  CHECK(lost.status().message().find("tensor 'h.0.attn.c_attn.weight'") != std::string::npos);
}

}  // namespace
}  // namespace tessera
