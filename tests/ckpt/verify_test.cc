// Verify (ckpt/verify.h): damage to a native checkpoint on disk reported by
// file and tensor.
#include "ckpt/verify.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ckpt/ops.h"
#include "ckpt/repair.h"
#include "formats/native_files.h"
#include "tests/ckpt/ckpt_test_util.h"
#include "tests/ckpt/memory_checkpoint.h"
#include "tests/test_util.h"

namespace tessera {
namespace {

using testing::MemoryCheckpoint;
using testing::Open;
using testing::Options;
using testing::RandomModel;

// A checkpoint on the real file system, for damage tests.
struct Fixture {
  std::string root;
  std::unique_ptr<Env> unused;
  MemoryCheckpoint model;
  Fixture() {
    char tmpl[] = "/tmp/tessera-ckpt-XXXXXX";
    root = mkdtemp(tmpl);
    std::mt19937_64 rng(testing::TestSeed() + 33);
    model = RandomModel(rng, 10, true);
    // Layouts over dp and tp so that there are several data files.
    Strategy even(*Mesh::Parse("dp=2,tp=2"));
    for (const TensorStrategy& t : model.strategy().tensors()) {
      Layout l = t.layout;
      if (l.rank() > 0) {
        l.dim_axes.assign(l.rank(), {});
        l.dim_axes[0] = {"tp"};
      }
      REQUIRE(even.Add({t.name, l, {}}).ok());
    }
    REQUIRE(WriteTransformed(Env::Default(), model, even, Dir(), Options(Codec::kRaw)).ok());
  }
  ~Fixture() { (void)DeleteRecursively(Env::Default(), root); }
  std::string Dir() const { return root + "/ck"; }
};

TEST_CASE("verify reports flipped bytes, truncation and missing files by file and tensor") {
  Fixture f;
  Env* env = Env::Default();
  auto clean = VerifyNativeCheckpoint(env, f.Dir(), {});
  REQUIRE(clean.ok());
  REQUIRE(clean->ok());
  REQUIRE(clean->files == 2);
  auto m = ReadManifest(env, f.Dir());
  REQUIRE(m.ok());
  const std::string f0 = JoinPath(f.Dir(), m->files[0].name);
  const std::string f1 = JoinPath(f.Dir(), m->files[1].name);

  SECTION("flipped byte") {
    const PieceInfo& p = m->tensors[0].pieces[0];
    auto bytes = ReadFileToString(env, JoinPath(f.Dir(), m->files[p.file].name));
    (*bytes)[p.offset + p.length / 2] ^= 1;
    REQUIRE(WriteFileAtomically(env, JoinPath(f.Dir(), m->files[p.file].name), *bytes).ok());
    auto r = VerifyNativeCheckpoint(env, f.Dir(), {});
    REQUIRE(r.ok());
    REQUIRE(r->problems.size() == 2);  // the whole file, and the piece in it
    const std::string damaged = JoinPath(f.Dir(), m->files[p.file].name);
    bool whole = false, piece = false;
    for (const auto& q : r->problems) {
      CHECK(q.file == damaged);
      whole |= q.tensor.empty() && q.what.find("whole-file checksum mismatch") != std::string::npos;
      piece |= q.tensor == "model.t0" && q.what.find("checksum mismatch") != std::string::npos;
    }
    CHECK(whole);
    CHECK(piece);
    // Reading it through the library fails the same way.
    auto reader = Open(env, f.Dir());
    std::vector<uint8_t> buf(f.model.data(0).size());
    Status s = ReadTensor(*reader, 0, buf.data());
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK_THAT(s.message(), Catch::Contains("model.t0"));
  }
  SECTION(
      "a flipped padding byte: named by the whole-file checksum, rebuilt from the file itself") {
    const PieceInfo& p = m->tensors[0].pieces[0];
    REQUIRE(p.length % kSmallPieceAlignment != 0);  // padding follows it, whatever comes next
    const std::string path = JoinPath(f.Dir(), m->files[p.file].name);
    auto bytes = ReadFileToString(env, path);
    const std::string pristine = *bytes;
    (*bytes)[p.offset + p.length] ^= 0x20;  // the first byte of its padding
    REQUIRE(WriteFileAtomically(env, path, *bytes).ok());
    auto r = VerifyNativeCheckpoint(env, f.Dir(), {});
    REQUIRE(r.ok());
    REQUIRE(r->problems.size() == 1);
    CHECK(r->problems[0].file == path);
    CHECK_THAT(r->problems[0].what, Catch::Contains("whole-file checksum mismatch"));
    auto reader = Open(env, f.Dir());  // the values are intact
    std::vector<uint8_t> buf(f.model.data(0).size());
    REQUIRE(ReadTensor(*reader, 0, buf.data()).ok());
    CHECK(std::memcmp(buf.data(), f.model.data(0).data(), buf.size()) == 0);
    auto fixed = RepairNativeCheckpoint(env, f.Dir(), {});
    REQUIRE(fixed.ok());
    CHECK(fixed->ok());
    REQUIRE(fixed->rebuilt.size() == 1);
    CHECK(*ReadFileToString(env, path) == pristine);
  }
  SECTION("truncated data file") {
    auto bytes = ReadFileToString(env, f1);
    bytes->resize(bytes->size() - 5000);
    REQUIRE(WriteFileAtomically(env, f1, *bytes).ok());
    auto r = VerifyNativeCheckpoint(env, f.Dir(), {});
    REQUIRE(r.ok());
    REQUIRE_FALSE(r->ok());
    CHECK(r->problems[0].file == f1);
    auto reader = Open(env, f.Dir());
    std::vector<uint8_t> buf(f.model.data(0).size());
    Status s = ReadTensor(*reader, 0, buf.data());
    CHECK_THAT(s.message(), Catch::Contains(f1) && Catch::Contains("truncated"));
  }
  SECTION("missing data file") {
    REQUIRE(env->DeleteFile(f0).ok());
    auto r = VerifyNativeCheckpoint(env, f.Dir(), {});
    REQUIRE(r.ok());
    REQUIRE_FALSE(r->ok());
    CHECK(r->problems[0].file == f0);
    CHECK_THAT(r->problems[0].what, Catch::Contains("missing"));
    bool named_tensor = false;
    for (const auto& p : r->problems) named_tensor |= p.tensor == "model.t0";
    CHECK(named_tensor);
  }
  SECTION("manifest without one piece") {
    Manifest copy = *m;
    copy.tensors[0].pieces.pop_back();
    REQUIRE(CommitManifest(env, f.Dir(), copy).ok());
    auto r = VerifyNativeCheckpoint(env, f.Dir(), {});
    REQUIRE(r.ok());
    REQUIRE(r->problems.size() == 1);
    CHECK_THAT(r->problems[0].what, Catch::Contains("a piece is missing"));
    auto reader = Open(env, f.Dir());
    std::vector<uint8_t> buf(f.model.data(0).size());
    CHECK_THAT(ReadTensor(*reader, 0, buf.data()).message(), Catch::Contains("a piece is missing"));
  }
  SECTION("a manifest of a future version is refused, naming it") {
    Manifest copy = *m;
    copy.format_version = kNativeFormatVersion + 1;
    REQUIRE(CommitManifest(env, f.Dir(), copy).ok());
    auto r = VerifyNativeCheckpoint(env, f.Dir(), {});
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(),
               Catch::Contains("manifest.pb") &&
                   Catch::Contains("version " + std::to_string(kNativeFormatVersion + 1)));
  }
}

}  // namespace
}  // namespace tessera
