// Mutation test of a whole native checkpoint: its manifest, the manifest's
// copy, the data files' headers, pieces and padding are damaged thousands
// of ways (a bit flipped, a byte set, a range zeroed, the file cut short
// or deleted), one file at a time. Whatever the damage:
//  - nothing ever loads with names, shapes, dtypes or values other than
//    those written; a read either returns the written bytes or fails with
//    an error naming the checkpoint's file;
//  - verify notices every change of any byte;
//  - every message and every inspect output is printable UTF-8.
// TESSERA_TEST_ITERATIONS bounds the mutants; scripts/test runs it under
// ASan + UBSan as well.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <random>

#include "ckpt/inspect.h"
#include "ckpt/native.h"
#include "ckpt/ops.h"
#include "ckpt/verify.h"
#include "core/utf8.h"
#include "formats/native_files.h"
#include "tests/test_util.h"

namespace tessera {
namespace {

// Printable UTF-8, lines allowed: what a terminal may be shown.
bool Printable(const std::string& s) {
  if (!IsUtf8(s)) return false;
  for (unsigned char c : s) {
    if ((c < 0x20 && c != '\n') || c == 0x7f) return false;
  }
  return PrintableText(s.substr(0, s.find('\n'))) == s.substr(0, s.find('\n'));
}

// A small checkpoint with everything a manifest records: tensors split over
// tp, ZeRO-sharded over dp, on pipeline stages, one held by both stages
// (copy stages), a scalar, bf16 and int32 tensors, and metadata.
Strategy MakeStrategy() {
  Strategy s(*Mesh::Create({"pp", "dp", "tp"}, {2, 2, 2}));
  auto add = [&](std::string name, std::vector<int64_t> shape, DType dtype,
                 std::vector<std::vector<std::string>> split, std::vector<std::string> opt,
                 int64_t stage, std::vector<int64_t> copy_stages) {
    Layout l = Layout::Replicated(std::move(shape), dtype);
    l.dim_axes = std::move(split);
    l.opt_axes = std::move(opt);
    if (stage >= 0) {
      l.stage_axis = "pp";
      l.stage = stage;
      l.copy_stages = std::move(copy_stages);
    }
    REQUIRE(s.Add({std::move(name), l, {}}).ok());
  };
  add("wte", {64, 16}, DType::kF32, {{"tp"}, {}}, {}, 0, {1});
  add("h.0.attn.c_attn.weight", {16, 48}, DType::kF32, {{}, {"tp"}}, {"dp"}, 0, {});
  add("h.1.mlp.c_proj.bias", {16}, DType::kBF16, {}, {"dp"}, 1, {});
  add("ln_f.weight", {16}, DType::kF32, {}, {}, 1, {});
  add("step_counter", {}, DType::kI32, {}, {}, -1, {});
  return s;
}

std::vector<char> Values(const TensorStrategy& t, uint64_t seed) {
  std::vector<char> v(static_cast<size_t>(ByteSize(t.layout)));
  std::mt19937_64 rng(seed);
  for (char& c : v) c = static_cast<char>(rng());
  return v;
}

TEST_CASE("mutated native checkpoints never load other names, shapes or values") {
  Env* env = Env::Default();
  testing::TempDir tmp;
  const std::string dir = JoinPath(tmp.path, "ck");
  const Strategy strategy = MakeStrategy();
  std::vector<std::vector<char>> values;
  for (const TensorStrategy& t : strategy.tensors()) {
    values.push_back(Values(t, values.size() + 7));
  }
  const Codec codec = GENERATE(Codec::kRaw, Codec::kZstd);
  {
    // The whole tensors, through the same path a reshard takes.
    Strategy whole(*Mesh::Create({"r"}, {1}));
    for (const TensorStrategy& t : strategy.tensors()) {
      REQUIRE(whole.Add({t.name, Layout::Replicated(t.layout.shape, t.layout.dtype), {}}).ok());
    }
    const std::string full = JoinPath(tmp.path, "full");
    CheckpointMeta meta;
    meta.step = 42;
    meta.metadata["config"] = "{\"layers\": 2}";
    NativeWriteOptions o;
    auto w = CreateNativeCheckpoint(env, full, whole, meta, o);
    REQUIRE(w.ok());
    for (size_t i = 0; i < values.size(); ++i) {
      const Box box = Box::FromShape(whole.tensors()[i].layout.shape);
      REQUIRE((*w)->WritePiece(i, 0, box, values[i].data()).ok());
    }
    REQUIRE((*w)->Commit().ok());
    auto src = OpenCheckpoint(env, full);
    REQUIRE(src.ok());
    WriteOptions wo;
    wo.native.codec = codec;
    REQUIRE(WriteTransformed(env, **src, strategy, dir, wo).ok());
  }
  auto clean = VerifyNativeCheckpoint(env, dir, {});
  REQUIRE(clean.ok());
  REQUIRE(clean->ok());
  auto children = env->GetChildren(dir);
  REQUIRE(children.ok());
  std::vector<std::string> files = *children;
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 6);  // both manifests and several data files
  std::map<std::string, std::string> pristine;
  for (const std::string& f : files) pristine[f] = *ReadFileToString(env, JoinPath(dir, f));
  // The copy stage's copies are in the manifest.
  {
    auto m = ReadManifest(env, dir);
    REQUIRE(m.ok());
    bool stage_copy = false;
    for (const PieceInfo& c : m->tensors[0].copies) stage_copy |= c.stage == 1;
    REQUIRE(stage_copy);
  }

  std::mt19937_64 rng(testing::TestSeed() + 77 + static_cast<int>(codec));
  const int mutants = testing::TestIterations(1500);
  int opened = 0, refused = 0, failed_reads = 0;
  for (int it = 0; it < mutants; ++it) {
    // Half the mutants damage a manifest: it is small, and every byte of it
    // matters.
    const std::string name =
        testing::Uniform(rng, 0, 1) == 0
            ? (testing::Uniform(rng, 0, 3) == 0 ? kManifestCopyName : kManifestName)
            : files[testing::Uniform(rng, 0, files.size() - 1)];
    const std::string path = JoinPath(dir, name);
    const std::string& good = pristine[name];
    std::string bad = good;
    const int kind = static_cast<int>(testing::Uniform(rng, 0, 9));
    const size_t at = good.empty() ? 0 : testing::Uniform(rng, 0, good.size() - 1);
    if (kind <= 4) {
      bad[at] ^= static_cast<char>(1 << testing::Uniform(rng, 0, 7));
    } else if (kind <= 6) {
      bad[at] = static_cast<char>(rng());
      if (bad == good) bad[at] ^= 1;
    } else if (kind == 7) {
      const size_t n = std::min<size_t>(good.size() - at, testing::Uniform(rng, 1, 64));
      std::memset(bad.data() + at, 0, n);
    } else if (kind == 8) {
      bad.resize(at);
    }
    const bool deleted = kind == 9;
    // One manifest mutant in five damages both copies the same way.
    const bool both =
        name != kManifestCopyName && name == kManifestName && testing::Uniform(rng, 0, 4) == 0;
    INFO("mutant " << it << ": " << name << (both ? " and its copy" : "") << " kind " << kind
                   << " at " << at);
    for (const std::string& p :
         both ? std::vector<std::string>{path, JoinPath(dir, kManifestCopyName)}
              : std::vector<std::string>{path}) {
      if (deleted) {
        REQUIRE(env->DeleteFile(p).ok());
      } else {
        REQUIRE(WriteFileAtomically(env, p, bad).ok());
      }
    }
    const bool changed = deleted || bad != good;

    auto reader = OpenCheckpoint(env, dir);
    if (!reader.ok()) {
      ++refused;
      CHECK(Printable(reader.status().message()));
      CHECK(reader.status().message().find(tmp.path) != std::string::npos);
    } else {
      ++opened;
      const auto& got = (*reader)->strategy().tensors();
      REQUIRE(got.size() == strategy.tensors().size());
      for (size_t i = 0; i < got.size(); ++i) {
        REQUIRE(got[i].name == strategy.tensors()[i].name);
        REQUIRE(got[i].layout == strategy.tensors()[i].layout);
        std::vector<char> buf(values[i].size());
        Status s = ReadTensor(**reader, i, buf.data());
        if (s.ok()) {
          REQUIRE(std::memcmp(buf.data(), values[i].data(), buf.size()) == 0);
        } else {
          ++failed_reads;
          CHECK(Printable(s.message()));
          CHECK(s.message().find(tmp.path) != std::string::npos);
        }
      }
      CHECK((*reader)->meta().step == 42);
      CHECK(Printable(InspectText(**reader)));
      CHECK(Printable(InspectJson(**reader)));
    }
    auto v = VerifyNativeCheckpoint(env, dir, {});
    if (v.ok()) {
      if (changed) CHECK_FALSE(v->ok());  // every changed byte is noticed
      for (const VerifyProblem& p : v->problems) CHECK(Printable(p.file + p.tensor + p.what));
    } else {
      CHECK(Printable(v.status().message()));
    }
    REQUIRE(WriteFileAtomically(env, path, good).ok());
    if (both) REQUIRE(WriteFileAtomically(env, JoinPath(dir, kManifestCopyName), good).ok());
  }
  // Every outcome happens: the test is not vacuous either way.
  CHECK(opened > mutants / 10);
  CHECK(refused > 0);       // both manifests damaged
  CHECK(failed_reads > 0);  // a damaged piece without a copy
}

}  // namespace
}  // namespace tessera
