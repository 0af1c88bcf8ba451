// MindSpore checkpoints (ckpt/mindspore.h): metadata as append_dict strings.
#include "ckpt/mindspore.h"

#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/ops.h"
#include "formats/mindspore_ckpt.h"
#include "tests/ckpt/ckpt_test_util.h"
#include "tests/ckpt/memory_checkpoint.h"
#include "tests/test_util.h"

namespace tessera {
namespace {

using testing::MemoryCheckpoint;
using testing::Open;
using testing::Options;
using testing::RandomModel;
using testing::RequireSameContents;

// The string records of a MindSpore file, tag -> content, in file order.
std::vector<std::pair<std::string, std::string>> MindSporeStrings(Env* env,
                                                                  const std::string& path) {
  auto file = env->NewRandomAccessFile(path);
  REQUIRE(file.ok());
  auto scanned = ScanMindSporeCkpt(**file, path);
  REQUIRE(scanned.ok());
  std::vector<std::pair<std::string, std::string>> out;
  for (const MindSporeRecord& r : scanned->records) {
    if (r.type != kMindSporeStringType) continue;
    CHECK(r.dims == std::vector<int64_t>{0});
    std::string content(r.content_size, '\0');
    REQUIRE((*file)->Read(r.content_offset, r.content_size, content.data()).ok());
    out.push_back({r.tag, content});
  }
  return out;
}

TEST_CASE("MindSpore append_dict strings are the metadata, in whole-tensor files") {
  std::mt19937_64 rng(testing::TestSeed() + 43);
  auto env = NewMemEnv();
  MemoryCheckpoint model = RandomModel(rng, 3);
  model.Add("global_step", DType::kI64, {}, {7, 0, 0, 0, 0, 0, 0, 0});
  auto& md = model.mutable_meta().metadata;
  md["note"] = "h\xc3\xa9llo \xf0\x9d\x84\x9e";  // 2- and 4-byte UTF-8
  md["empty"] = "";
  md["bin"] = std::string("\xff\x00\x01", 3);  // not UTF-8
  md["trailing"] = std::string("ab\0", 3);     // numpy would drop the NUL
  md["tessera.own"] = "a key in Tessera's namespace";
  md["model.t0"] = "a key that is also a tensor";
  const Strategy whole = MergedStrategy(model.strategy());
  WriteOptions o = Options(Codec::kRaw);
  o.format = Format::kMindSpore;
  REQUIRE(WriteTransformed(env.get(), model, whole, "/m.ckpt", o).ok());

  // As numpy's '<U' strings after the tensors; text under its own key.
  const auto strings = MindSporeStrings(env.get(), "/m.ckpt");
  std::map<std::string, std::string> tags(strings.begin(), strings.end());
  CHECK(tags.size() == 8);
  CHECK(tags.at("note") ==
        std::string("h\0\0\0\xe9\0\0\0l\0\0\0l\0\0\0o\0\0\0 \0\0\0\x1e\xd1\x01\0", 28));
  CHECK(tags.at("empty") == std::string(4, '\0'));
  CHECK(tags.at("config").size() == 4 * md["config"].size());
  CHECK(tags.count("tessera.meta_hex.bin") == 1);
  CHECK(tags.count("tessera.meta_hex.trailing") == 1);
  CHECK(tags.count("tessera.meta.tessera.own") == 1);
  CHECK(tags.count("tessera.meta.model.t0") == 1);
  CHECK(MindSporeStringValue(tags.at("tessera.step")).value() == "42");

  {  // A scalar has no dims, as MindSpore 2.x writes it; the older [0] reads the same.
    auto file = env->NewRandomAccessFile("/m.ckpt");
    REQUIRE(file.ok());
    auto scanned = ScanMindSporeCkpt(**file, "/m.ckpt");
    REQUIRE(scanned.ok());
    CHECK(scanned->records[3].tag == "global_step");
    CHECK(scanned->records[3].dims.empty());
    // ... and MindSpore 1.x's "Uint16" spelling reads as u16.
    const std::string old = MindSporeRecordHeader("global_step", {0}, "Int64", 8) +
                            std::string("\x07\0\0\0\0\0\0\0", 8) +
                            MindSporeRecordHeader("mask", {2}, "Uint16", 4) +
                            std::string(4, '\x01');
    REQUIRE(WriteFileAtomically(env.get(), "/old.ckpt", old).ok());
    auto r = Open(env.get(), "/old.ckpt");
    CHECK(r->strategy().tensors()[0].layout.shape.empty());
    int64_t step = 0;
    REQUIRE(r->ReadRegion(0, Box::FromShape({}), &step, {}, Box::FromShape({})).ok());
    CHECK(step == 7);
    CHECK(r->strategy().tensors()[1].layout.dtype == DType::kU16);
    CHECK(r->strategy().tensors()[1].layout.shape == std::vector<int64_t>{2});
  }

  // Read back: the same metadata and step, in every format it moves to.
  auto m = Open(env.get(), "/m.ckpt");
  CHECK(m->meta().metadata == md);
  CHECK(m->meta().step == 42);
  RequireSameContents(*m, model);
  o.format = Format::kSafetensors;
  REQUIRE(WriteTransformed(env.get(), *m, whole, "/m.safetensors", o).ok());
  CHECK(Open(env.get(), "/m.safetensors")->meta().metadata == md);

  // transform_checkpoints' form holds tensors only.
  Strategy tp(*Mesh::Parse("tp=2"));
  for (const TensorStrategy& t : model.strategy().tensors()) {
    Layout l = t.layout;
    if (l.rank() > 0 && l.shape[0] % 2 == 0) {
      l.dim_axes.assign(l.rank(), {});
      l.dim_axes[0] = {"tp"};
    }
    REQUIRE(tp.Add({t.name, l, {}}).ok());
  }
  o.format = Format::kMindSpore;
  REQUIRE(WriteTransformed(env.get(), model, tp, "/dist", o).ok());
  CHECK(MindSporeStrings(env.get(), "/dist/rank_1/checkpoint_1.ckpt").empty());

  // Strings MindSpore cannot have written are named errors.
  for (const auto& [content, why] :
       {std::pair<std::string, std::string>{"abcde", "not whole UTF-32"},
        {std::string("\x00\xd8\x00\x00", 4), "not a Unicode scalar"},
        {std::string("\x00\x00\x11\x00", 4), "not a Unicode scalar"}}) {
    std::string bytes = MindSporeRecordHeader("w", {0}, "Float32", 4) + std::string(4, '\0');
    bytes += MindSporeRecordHeader("odd", {0}, kMindSporeStringType, content.size()) + content;
    REQUIRE(WriteFileAtomically(env.get(), "/bad.ckpt", bytes).ok());
    auto r = OpenCheckpoint(env.get(), "/bad.ckpt");
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(),
               Catch::Contains("/bad.ckpt") && Catch::Contains("'odd'") && Catch::Contains(why));
  }
}

}  // namespace
}  // namespace tessera
