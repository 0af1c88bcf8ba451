// The ckpt library end to end over real (in-memory and POSIX) files.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "ckpt/diff.h"
#include "ckpt/inspect.h"
#include "ckpt/ops.h"
#include "ckpt/repair.h"
#include "ckpt/verify.h"
#include "formats/mindspore_ckpt.h"
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

TEST_CASE("distributed reads: any sub-box of a sliced tensor, only verified bytes") {
  std::mt19937_64 rng(testing::TestSeed() + 32);
  // In memory the blocks are staged by reads; on disk they are lent by
  // mappings of the file (RandomAccessFile::View).
  testing::TempDir tmp;
  std::unique_ptr<Env> mem = NewMemEnv();
  Env* env = mem.get();
  std::string root = "";
  SECTION("memory") {}
  SECTION("posix") {
    env = Env::Default();
    root = tmp.path;
  }
  const std::string ck = root + "/ck";
  MemoryCheckpoint model = RandomModel(rng, 1, /*big=*/true);  // [611, 1097] f32, 2.6 MiB
  Strategy s(*Mesh::Parse("tp=2"));
  Layout l = model.strategy().tensors()[0].layout;
  l.dim_axes = {{}, {"tp"}};  // column halves: row runs in each piece
  REQUIRE(s.Add({"model.t0", l, {}}).ok());
  REQUIRE(WriteTransformed(env, model, s, ck, Options(Codec::kRaw)).ok());
  auto r = Open(env, ck);
  const std::vector<int64_t> shape = l.shape;
  for (int iter = 0; iter < 50; ++iter) {
    Box region(2);
    for (int d = 0; d < 2; ++d) {
      const int64_t a = Uniform(rng, 0, shape[d] - 1), b = Uniform(rng, a + 1, shape[d]);
      region[d] = {a, b};
    }
    // Into the middle of a larger buffer, as a rank's shard would be.
    std::vector<int64_t> ext = {region[0].size() + 2, region[1].size() + 3};
    Box at{{1, 1 + region[0].size()}, {2, 2 + region[1].size()}};
    std::vector<uint8_t> got(ext[0] * ext[1] * 4, 0), want(got.size(), 0);
    REQUIRE(r->ReadRegion(0, region, got.data(), ext, at).ok());
    CopyBox(model.data(0).data(), shape, region, want.data(), ext, at, 4);
    REQUIRE(got == want);
  }
  // Corrupt one byte near the end of the second file: reads of the first
  // rows still succeed (their blocks verify), reads of the last rows fail
  // naming the file and tensor.
  auto m = ReadManifest(env, ck);
  REQUIRE(m.ok());
  const PieceInfo& p = m->tensors[0].pieces.back();
  REQUIRE(p.block_checksums.size() > 1);
  const std::string file = JoinPath(ck, m->files[p.file].name);
  auto bytes = ReadFileToString(env, file);
  REQUIRE(bytes.ok());
  (*bytes)[p.offset + p.length - 10] ^= 0x40;
  REQUIRE(WriteFileAtomically(env, file, *bytes).ok());
  auto r2 = Open(env, ck);
  Box top{{0, 10}, {0, shape[1]}}, bottom{{shape[0] - 10, shape[0]}, {0, shape[1]}};
  std::vector<uint8_t> buf(10 * shape[1] * 4);
  REQUIRE(r2->ReadRegion(0, top, buf.data(), top.extents(), Box::FromShape(top.extents())).ok());
  Status bad =
      r2->ReadRegion(0, bottom, buf.data(), bottom.extents(), Box::FromShape(bottom.extents()));
  REQUIRE(bad.code() == StatusCode::kDataLoss);
  CHECK_THAT(bad.message(),
             Catch::Contains(file) && Catch::Contains("model.t0") && Catch::Contains("checksum"));
}

TEST_CASE("copies of contiguous pieces are lent by the file, verified, and still fail on damage") {
  std::mt19937_64 rng(testing::TestSeed() + 34);
  testing::TempDir tmp;
  Env* env = Env::Default();
  MemoryCheckpoint model = RandomModel(rng, 1, /*big=*/true);  // [611, 1097] f32, 2.6 MiB
  Strategy rows(*Mesh::Parse("tp=4"));
  Layout l = model.strategy().tensors()[0].layout;
  l.dim_axes = {{"tp"}, {}};  // row quarters: each piece one contiguous run
  REQUIRE(rows.Add({"model.t0", l, {}}).ok());
  const std::string ck = tmp.path + "/ck";
  REQUIRE(WriteTransformed(env, model, rows, ck, Options(Codec::kRaw)).ok());
  auto r = Open(env, ck);
  const std::vector<int64_t> shape = l.shape;
  auto want = [&](const Box& region) {
    std::vector<uint8_t> out(NumElements(region) * 4);
    CopyBox(model.data(0).data(), shape, region, out.data(), region.extents(),
            Box::FromShape(region.extents()), 4);
    return out;
  };
  // Rows inside one piece: lent, and equal to the data.
  const Box inside{{5, 100}, {0, shape[1]}};
  auto view = r->ViewRegion(0, inside);
  REQUIRE(view.ok());
  REQUIRE(*view != nullptr);
  const std::vector<uint8_t> expect = want(inside);
  REQUIRE((*view)->size() == expect.size());
  CHECK(std::memcmp((*view)->data(), expect.data(), expect.size()) == 0);
  // Across two pieces, or part of each row: not one run, so not lent.
  CHECK(*r->ViewRegion(0, Box{{100, 200}, {0, shape[1]}}) == nullptr);
  CHECK(*r->ViewRegion(0, Box{{5, 100}, {1, shape[1]}}) == nullptr);
  // In memory nothing is lent.
  auto mem = NewMemEnv();
  REQUIRE(WriteTransformed(mem.get(), model, rows, "/ck", Options(Codec::kRaw)).ok());
  CHECK(*Open(mem.get(), "/ck")->ViewRegion(0, inside) == nullptr);

  // The merge copies the pieces through the mappings, into every format.
  for (const Format format : {Format::kNative, Format::kSafetensors}) {
    WriteOptions o = Options(Codec::kRaw);
    o.format = format;
    const std::string out = tmp.path + (format == Format::kNative ? "/m" : "/m.safetensors");
    REQUIRE(WriteTransformed(env, *r, MergedStrategy(r->strategy()), out, o).ok());
    RequireSameContents(*Open(env, out), model);
  }
  // A flipped byte in the third piece fails the merge, naming the file and
  // tensor, and leaves no output.
  auto m = ReadManifest(env, ck);
  REQUIRE(m.ok());
  const PieceInfo& p = m->tensors[0].pieces[2];
  const std::string file = JoinPath(ck, m->files[p.file].name);
  auto bytes = ReadFileToString(env, file);
  REQUIRE(bytes.ok());
  (*bytes)[p.offset + p.length / 2] ^= 0x10;
  REQUIRE(WriteFileAtomically(env, file, *bytes).ok());
  auto damaged = Open(env, ck);
  WriteOptions o = Options(Codec::kRaw);
  o.format = Format::kSafetensors;
  auto merged = WriteTransformed(env, *damaged, MergedStrategy(damaged->strategy()),
                                 tmp.path + "/bad.safetensors", o);
  REQUIRE_FALSE(merged.ok());
  CHECK(merged.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(merged.status().message(), Catch::Contains(file) && Catch::Contains("model.t0") &&
                                            Catch::Contains("checksum mismatch"));
  CHECK_FALSE(env->FileExists(tmp.path + "/bad.safetensors"));
  const Box in_bad{{p.box[0].begin + 1, p.box[0].end}, {0, shape[1]}};
  // Damaged bytes are not lent: ReadRegion then reads around them or names them.
  auto bad_view = damaged->ViewRegion(0, in_bad);
  REQUIRE(bad_view.ok());
  CHECK(*bad_view == nullptr);
}

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

namespace tessera {
namespace {

// Row-major linear index of `idx` in `shape`.
int64_t Linear(const std::vector<int64_t>& shape, const std::vector<int64_t>& idx) {
  int64_t at = 0;
  for (size_t d = 0; d < shape.size(); ++d) at = at * shape[d] + idx[d];
  return at;
}

// Calls fn(index) for every index of `box`, row-major.
void ForEachIndex(const Box& box, const std::function<void(const std::vector<int64_t>&)>& fn) {
  std::vector<int64_t> idx(box.rank());
  for (int d = 0; d < box.rank(); ++d) idx[d] = box[d].begin;
  if (IsEmpty(box)) return;
  for (;;) {
    fn(idx);
    int d = box.rank() - 1;
    while (d >= 0 && ++idx[d] == box[d].end) {
      idx[d] = box[d].begin;
      --d;
    }
    if (d < 0) return;
  }
}

TEST_CASE("ForEachCoarsePart: a box over a view is exactly its coarse parts") {
  // Elements are their row-major index, the same in every shape of the
  // tensor: each part's bytes, cut at `at` from the box's dense buffer,
  // must be the coarse box's elements, and the parts must cover the box once.
  std::mt19937_64 rng(testing::TestSeed() + 80);
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> shapes = {
      {{4, 3, 4}, {4, 12}},   {{2, 3, 2, 5}, {6, 10}}, {{3, 1, 4, 1}, {12}},
      {{2, 2, 3}, {2, 2, 3}}, {{1, 6, 2}, {12}},       {{5, 2, 2, 2}, {5, 8}}};
  for (const auto& [fine, coarse] : shapes) {
    for (int iter = 0; iter < 40; ++iter) {
      Box box(static_cast<int>(fine.size()));
      for (size_t d = 0; d < fine.size(); ++d) {
        const int64_t a = testing::Uniform(rng, 0, fine[d] - 1);
        box[d] = {a, testing::Uniform(rng, a + 1, fine[d])};
      }
      INFO(ShapeToString(fine) << " over " << ShapeToString(coarse) << ": " << ToString(box));
      std::vector<int64_t> dense;  // the box's dense buffer
      ForEachIndex(box, [&](const std::vector<int64_t>& i) { dense.push_back(Linear(fine, i)); });
      int64_t covered = 0;
      bool exact = true;
      const Status s = ForEachCoarsePart(
          box, fine, coarse,
          [&](const Box& part, const std::vector<int64_t>& extents, const Box& at) -> Status {
            if (NumElements(Box::FromShape(extents)) != static_cast<int64_t>(dense.size())) {
              return InternalError("extents " + ShapeToString(extents));
            }
            std::vector<int64_t> got(NumElements(part)), want;
            CopyBox(dense.data(), extents, at, got.data(), part.extents(),
                    Box::FromShape(part.extents()), 8);
            ForEachIndex(part,
                         [&](const std::vector<int64_t>& i) { want.push_back(Linear(coarse, i)); });
            exact = exact && got == want;
            covered += NumElements(part);
            return Status::Ok();
          });
      REQUIRE(s.ok());
      CHECK(exact);
      CHECK(covered == NumElements(box));
    }
  }
  CHECK_FALSE(ForEachCoarsePart(Box({{0, 1}, {0, 1}}), {12, 4}, {4, 12}, [](auto&, auto&, auto&) {
                return Status::Ok();
              }).ok());
}

TEST_CASE("native reads of tensors stored in many pieces (indexed) match the whole tensor") {
  // A 2-D tensor tiled by ~100 pieces of uneven sizes, in column bands cut
  // at different rows (not a grid), and by a grid: random regions read
  // through the piece index equal the same regions cut from the tensor.
  std::mt19937_64 rng(testing::TestSeed() + 2024);
  const int64_t rows = 331, cols = 97;
  for (bool grid : {false, true}) {
    INFO((grid ? "grid" : "bands cut at different rows"));
    auto env = NewMemEnv();
    Strategy strategy(*Mesh::Parse("r=1"));
    REQUIRE(strategy.Add({"w", Layout::Replicated({rows, cols}, DType::kF32)}).ok());
    std::vector<float> full(rows * cols);
    for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i) * 0.25f;
    auto cuts = [&](int64_t n, int pieces) {
      std::vector<int64_t> at = {0, n};
      while (static_cast<int>(at.size()) < pieces + 1)
        at.push_back(testing::Uniform(rng, 1, n - 1));
      std::sort(at.begin(), at.end());
      at.erase(std::unique(at.begin(), at.end()), at.end());
      return at;
    };
    std::vector<Box> boxes;
    const std::vector<int64_t> col_cuts = cuts(cols, grid ? 9 : 4);
    const std::vector<int64_t> grid_rows = cuts(rows, 11);
    for (size_t b = 0; b + 1 < col_cuts.size(); ++b) {
      const std::vector<int64_t> row_cuts = grid ? grid_rows : cuts(rows, 25);
      for (size_t a = 0; a + 1 < row_cuts.size(); ++a) {
        boxes.push_back(Box({{row_cuts[a], row_cuts[a + 1]}, {col_cuts[b], col_cuts[b + 1]}}));
      }
    }
    REQUIRE(boxes.size() >= 40);
    auto writer = CreateNativeCheckpoint(env.get(), "/c", strategy, {1, {}, "test"}, {});
    REQUIRE(writer.ok());
    std::shuffle(boxes.begin(), boxes.end(), rng);
    for (size_t k = 0; k < boxes.size(); ++k) {
      const Box& b = boxes[k];
      std::vector<float> piece(NumElements(b));
      CopyBox(full.data(), {rows, cols}, b, piece.data(), b.extents(), Box::FromShape(b.extents()),
              sizeof(float));
      // Three data files: ranks 1 and 2 lie outside the strategy's one-rank
      // mesh, so the writer finds their files by its map, not by rank.
      REQUIRE((*writer)->WritePiece(0, static_cast<int64_t>(k % 3), b, piece.data()).ok());
    }
    REQUIRE((*writer)->Commit().ok());
    auto reader = OpenNativeCheckpoint(env.get(), "/c");
    REQUIRE(reader.ok());
    REQUIRE((*reader)->Files().size() == 3);
    for (int trial = 0; trial < 300; ++trial) {
      const int64_t r0 = testing::Uniform(rng, 0, rows - 1),
                    c0 = testing::Uniform(rng, 0, cols - 1);
      const Box region(
          {{r0, testing::Uniform(rng, r0 + 1, rows)}, {c0, testing::Uniform(rng, c0 + 1, cols)}});
      const std::vector<int64_t> ext = region.extents();
      std::vector<float> got(NumElements(region), -1.0f), want(NumElements(region));
      CopyBox(full.data(), {rows, cols}, region, want.data(), ext, Box::FromShape(ext),
              sizeof(float));
      const Status read = (*reader)->ReadRegion(0, region, got.data(), ext, Box::FromShape(ext));
      INFO(ToString(region) << ": " << read.ToString());
      REQUIRE(read.ok());
      REQUIRE(got == want);
    }
  }
}

TEST_CASE("a writer of more files than staging buffers: small pieces gathered, big ones between") {
  // 80 data files, each written in three small pieces interleaved with every
  // other file's (more files than the writer gathers at once: the rest
  // write through), some flushed halfway, and a piece larger than a staging
  // buffer landing in a file with small pieces staged before it.
  std::mt19937_64 rng(testing::TestSeed() + 2025);
  auto env = NewMemEnv();
  const int64_t ranks = 80, rows = 7, cols = 5, big = 300000;
  Strategy strategy(*Mesh::Parse("r=80"));
  Layout rows_split = Layout::Replicated({ranks * rows, cols}, DType::kF32);
  rows_split.dim_axes = {{"r"}, {}};
  REQUIRE(strategy.Add({"a", rows_split}).ok());
  REQUIRE(strategy.Add({"big", Layout::Replicated({2, big}, DType::kF32)}).ok());
  std::vector<float> a(ranks * rows * cols), b(2 * big);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) + 0.5f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i) * 0.125f;
  struct Write {
    int64_t rank;
    Box box;
  };
  std::vector<Write> writes;
  for (int64_t r = 0; r < ranks; ++r) {
    for (auto [lo, hi] : {std::pair{0, 2}, {2, 5}, {5, 7}}) {
      writes.push_back({r, Box({{r * rows + lo, r * rows + hi}, {0, cols}})});
    }
  }
  std::shuffle(writes.begin(), writes.end(), rng);
  auto writer = CreateNativeCheckpoint(env.get(), "/c", strategy, {1, {}, "test"}, {});
  REQUIRE(writer.ok());
  for (size_t k = 0; k < writes.size(); ++k) {
    const Write& w = writes[k];
    std::vector<float> piece(NumElements(w.box));
    CopyBox(a.data(), {ranks * rows, cols}, w.box, piece.data(), w.box.extents(),
            Box::FromShape(w.box.extents()), sizeof(float));
    REQUIRE((*writer)->WritePiece(0, w.rank, w.box, piece.data()).ok());
    if (k % 7 == 3) REQUIRE((*writer)->Flush(w.rank).ok());
    if (k == writes.size() / 2) {
      REQUIRE((*writer)->WritePiece(1, writes[0].rank, Box::FromShape({2, big}), b.data()).ok());
    }
  }
  REQUIRE((*writer)->Flush(ranks + 5).ok());  // a rank never written: nothing to do
  REQUIRE((*writer)->Commit().ok());
  auto reader = Open(env.get(), "/c");
  std::vector<float> got_a(a.size()), got_b(b.size());
  REQUIRE(ReadTensor(*reader, 0, got_a.data()).ok());
  REQUIRE(ReadTensor(*reader, 1, got_b.data()).ok());
  CHECK(got_a == a);
  CHECK(got_b == b);
  CHECK(reader->Files().size() == static_cast<size_t>(ranks));
  // Every byte of every file where the manifest says, whole-file
  // checksums included.
  auto report = VerifyNativeCheckpoint(env.get(), "/c", {});
  REQUIRE(report.ok());
  CHECK(report->problems.empty());
  CHECK(report->pieces == 3 * ranks + 1);
}

// Counts the reads of the files it opens; everything else is `base`'s.
class ReadCountingEnv : public EnvWrapper {
 public:
  explicit ReadCountingEnv(Env* base) : EnvWrapper(base) {}
  int64_t reads() const { return reads_; }

  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override {
    class Counted : public RandomAccessFile {
     public:
      Counted(std::unique_ptr<RandomAccessFile> f, std::atomic<int64_t>* n)
          : f_(std::move(f)), n_(n) {}
      Status Read(uint64_t offset, size_t size, void* dst) const override {
        ++*n_;
        return f_->Read(offset, size, dst);
      }
      Result<uint64_t> Size() const override { return f_->Size(); }

     private:
      std::unique_ptr<RandomAccessFile> f_;
      std::atomic<int64_t>* n_;
    };
    ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> f, base_->NewRandomAccessFile(path));
    return std::unique_ptr<RandomAccessFile>(new Counted(std::move(f), &reads_));
  }

 private:
  std::atomic<int64_t> reads_{0};
};

TEST_CASE("small pieces read in file order come from a window read ahead; others do not") {
  // One data file of 400 packed pieces of 1 KiB (rows of a row-split
  // tensor): read in file order they cost a few reads of the file, not
  // one each; shuffled, one each (no read-ahead wasted on scattered
  // reads); the bytes are the tensor's either way, and a damaged piece
  // inside a window is still found and named.
  std::mt19937_64 rng(testing::TestSeed() + 2026);
  auto mem = NewMemEnv();
  ReadCountingEnv env(mem.get());
  const int64_t pieces = 400, rows = 2, cols = 128;
  Strategy strategy(*Mesh::Parse("r=1"));
  REQUIRE(strategy.Add({"w", Layout::Replicated({pieces * rows, cols}, DType::kF32)}).ok());
  std::vector<float> full(pieces * rows * cols);
  for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i) - 7.5f;
  {
    auto writer = CreateNativeCheckpoint(&env, "/c", strategy, {1, {}, "test"}, {});
    REQUIRE(writer.ok());
    for (int64_t p = 0; p < pieces; ++p) {
      const Box b({{p * rows, (p + 1) * rows}, {0, cols}});
      REQUIRE((*writer)->WritePiece(0, 0, b, full.data() + p * rows * cols).ok());
    }
    REQUIRE((*writer)->Commit().ok());
  }
  std::vector<int64_t> order(pieces);
  std::iota(order.begin(), order.end(), 0);
  auto read_all = [&](const CheckpointReader& reader) -> Status {
    for (int64_t p : order) {
      // Half a piece, as a reshard that splits each piece in two reads it:
      // the whole piece is read to check its checksum.
      const Box region({{p * rows, (p + 1) * rows}, {cols / 2, cols}});
      const std::vector<int64_t> ext = region.extents();
      std::vector<float> got(NumElements(region)), want(NumElements(region));
      RETURN_IF_ERROR(reader.ReadRegion(0, region, got.data(), ext, Box::FromShape(ext)));
      CopyBox(full.data(), {pieces * rows, cols}, region, want.data(), ext, Box::FromShape(ext),
              sizeof(float));
      if (got != want) return DataLossError("wrong bytes read for " + ToString(region));
    }
    return Status::Ok();
  };
  {
    auto reader = Open(&env, "/c");
    const int64_t before = env.reads();
    REQUIRE(read_all(*reader).ok());
    const int64_t in_order = env.reads() - before;
    INFO(in_order << " reads for " << pieces << " pieces in file order");
    CHECK(in_order <= pieces / 10);
  }
  {
    std::shuffle(order.begin(), order.end(), rng);
    auto reader = Open(&env, "/c");
    const int64_t before = env.reads();
    REQUIRE(read_all(*reader).ok());
    const int64_t shuffled = env.reads() - before;
    INFO(shuffled << " reads for " << pieces << " pieces shuffled");
    CHECK(shuffled >= pieces * 9 / 10);  // shuffled neighbours may still meet
    CHECK(shuffled <= pieces + 8);       // the data file's header checks
  }
  // A flipped byte in piece 250, which an in-order read takes from a window.
  auto m = ReadManifest(&env, "/c");
  REQUIRE(m.ok());
  REQUIRE(m->files.size() == 1);
  const std::string data = JoinPath("/c", m->files[0].name);
  uint64_t at = 0;
  for (const PieceInfo& p : m->tensors[0].pieces) {
    if (p.box[0].begin == 250 * rows) at = p.offset + p.length / 2;
  }
  REQUIRE(at > 0);
  auto bytes = ReadFileToString(&env, data);
  REQUIRE(bytes.ok());
  (*bytes)[at] ^= 1;
  REQUIRE(WriteFileAtomically(&env, data, *bytes).ok());
  std::iota(order.begin(), order.end(), 0);
  auto damaged = Open(&env, "/c");
  const Status s = read_all(*damaged);
  INFO(s.ToString());
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK_THAT(s.message(), Catch::Contains("'w'") && Catch::Contains("checksum") &&
                              Catch::Contains(m->files[0].name));
}

}  // namespace
}  // namespace tessera
