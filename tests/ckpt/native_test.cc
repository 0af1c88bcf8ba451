// The native format's reader and writer (ckpt/native.h): reads of any region,
// pieces lent by the file, many pieces and files, read-ahead, damage named.
#include "ckpt/native.h"

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ckpt/ops.h"
#include "ckpt/verify.h"
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
using testing::RequireSameContents;
using testing::Uniform;

// Flips a bit of row 29, column 70 of the fourth piece (rows 24:32) of
// tensor 0, [64, 96] f32 by rows on 8 ranks; returns its file's path.
std::string DamageRow29(Env* env, const std::string& ck) {
  auto m = ReadManifest(env, ck);
  REQUIRE(m.ok());
  const PieceInfo& p = m->tensors[0].pieces[3];
  REQUIRE(p.box[0].begin == 24);
  const std::string file = JoinPath(ck, m->files[p.file].name);
  auto data = ReadFileToString(env, file);
  REQUIRE(data.ok());
  (*data)[p.offset + 5 * 384 + 70 * 4] ^= 0x10;
  REQUIRE(WriteFileAtomically(env, file, *data).ok());
  return file;
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

TEST_CASE("a rank reading columns of row pieces verifies only the tiles it reads (format 3)") {
  // [1024, 4096] f32 saved by rows on 2 ranks: pieces of 512 rows of 16 KiB,
  // checksummed in tiles of 256 rows by 512 columns (formats/native.md). A
  // rank loading column halves (the reshard on load of tests/bench/dcp_bench)
  // reads, and verifies, only the tiles of its half: a flipped byte in the
  // other half does not stop it, one in its own half does, naming the tile,
  // and verify finds it either way.
  std::mt19937_64 rng(testing::TestSeed() + 35);
  testing::TempDir tmp;
  MemoryCheckpoint model;
  const std::vector<int64_t> shape = {1024, 4096};
  std::vector<uint8_t> bytes(shape[0] * shape[1] * 4);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  model.Add("w", DType::kF32, shape, bytes);
  Strategy rows(*Mesh::Parse("tp=2"));
  Layout l = model.strategy().tensors()[0].layout;
  l.dim_axes = {{"tp"}, {}};
  REQUIRE(rows.Add({"w", l, {}}).ok());
  for (Env* env : {Env::Default(), static_cast<Env*>(nullptr)}) {
    std::unique_ptr<Env> mem;
    if (env == nullptr) env = (mem = NewMemEnv()).get();
    const std::string ck = (mem ? std::string("") : tmp.path) + "/tiles";
    INFO((mem ? "in memory" : "on disk"));
    REQUIRE(WriteTransformed(env, model, rows, ck, Options(Codec::kRaw)).ok());
    auto m = ReadManifest(env, ck);
    REQUIRE(m.ok());
    CHECK(m->format_version == 3);
    for (const PieceInfo& p : m->tensors[0].pieces) {
      CHECK(p.tile_rows == 256);
      CHECK(p.tile_columns == 512);
      CHECK(p.block_checksums.size() == 2 * 8);
    }
    const Box left{{0, 1024}, {0, 2048}}, right{{0, 1024}, {2048, 4096}};
    auto read = [&](const Box& half, std::vector<uint8_t>* out) {
      out->assign(NumElements(half) * 4, 0);
      return Open(env, ck)->ReadRegion(0, half, out->data(), half.extents(),
                                       Box::FromShape(half.extents()));
    };
    std::vector<uint8_t> got, want(NumElements(left) * 4);
    for (const Box& half : {left, right}) {
      REQUIRE(read(half, &got).ok());
      CopyBox(bytes.data(), shape, half, want.data(), half.extents(),
              Box::FromShape(half.extents()), 4);
      CHECK((got == want));
    }
    // Row 300 of the first piece (its second band of tile rows), column
    // 3000 (tile column 5, in the right half).
    const PieceInfo& p = m->tensors[0].pieces[0];
    const std::string file = JoinPath(ck, m->files[p.file].name);
    auto data = ReadFileToString(env, file);
    REQUIRE(data.ok());
    (*data)[p.offset + 300 * 16384 + 3000 * 4] ^= 0x08;
    REQUIRE(WriteFileAtomically(env, file, *data).ok());
    CHECK(read(left, &got).ok());
    Status bad = read(right, &got);
    CHECK(bad.code() == StatusCode::kDataLoss);
    CHECK_THAT(bad.message(), Catch::Contains(file) && Catch::Contains("'w'") &&
                                  Catch::Contains("tile (rows 256:512, columns 2560:3072"));
    auto report = VerifyNativeCheckpoint(env, ck, {});
    REQUIRE(report.ok());
    REQUIRE(report->problems.size() >= 1);
    std::string problems;
    for (const VerifyProblem& q : report->problems) problems += q.what + "\n";
    CHECK_THAT(problems, Catch::Contains("tile (rows 256:512, columns 2560:3072"));
  }
}

TEST_CASE(
    "parts of small pieces read one after another are right, and a damaged one fails each time") {
  // [64, 96] f32 by rows on 8 ranks: pieces of 3 KiB, one checksum each. A
  // reader taking each piece's column halves in turn (a reshard's
  // neighbouring ranks, tp doubled) gets the second half from the bytes it
  // verified for the first; a damaged piece fails both halves, naming it,
  // while the others still read.
  std::mt19937_64 rng(testing::TestSeed() + 36);
  testing::TempDir tmp;
  MemoryCheckpoint model;
  const std::vector<int64_t> shape = {64, 96};
  std::vector<uint8_t> bytes(shape[0] * shape[1] * 4);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  model.Add("w", DType::kF32, shape, bytes);
  Strategy rows(*Mesh::Parse("tp=8"));
  Layout l = model.strategy().tensors()[0].layout;
  l.dim_axes = {{"tp"}, {}};
  REQUIRE(rows.Add({"w", l, {}}).ok());
  Env* env = Env::Default();
  const std::string ck = tmp.path + "/small";
  REQUIRE(WriteTransformed(env, model, rows, ck, Options(Codec::kRaw)).ok());
  auto read_halves = [&](const CheckpointReader& reader, int64_t piece,
                         std::vector<Status>* statuses) {
    bool right = true;
    for (int64_t c0 : {0, 48}) {
      const Box half{{piece * 8, piece * 8 + 8}, {c0, c0 + 48}};
      std::vector<uint8_t> got(NumElements(half) * 4), want(got.size());
      Status s =
          reader.ReadRegion(0, half, got.data(), half.extents(), Box::FromShape(half.extents()));
      CopyBox(bytes.data(), shape, half, want.data(), half.extents(),
              Box::FromShape(half.extents()), 4);
      right = right && (!s.ok() || got == want);
      statuses->push_back(s);
    }
    return right;
  };
  {
    auto reader = Open(env, ck);
    for (int64_t piece = 0; piece < 8; ++piece) {
      std::vector<Status> statuses;
      CHECK(read_halves(*reader, piece, &statuses));
      for (const Status& s : statuses) CHECK(s.ok());
    }
  }
  const std::string file = DamageRow29(env, ck);  // the piece's right half
  auto reader = Open(env, ck);
  for (int64_t piece = 0; piece < 8; ++piece) {
    std::vector<Status> statuses;
    CHECK(read_halves(*reader, piece, &statuses));
    for (const Status& s : statuses) {
      if (piece != 3) {
        CHECK(s.ok());
        continue;
      }
      CHECK(s.code() == StatusCode::kDataLoss);
      CHECK_THAT(s.message(), Catch::Contains(file) && Catch::Contains("'w'") &&
                                  Catch::Contains("[24:32, 0:96]"));
    }
  }
}

TEST_CASE(
    "a batch of regions gives ReadRegion's bytes reading each piece once and reads around or names "
    "damage") {
  // "w" [64, 96] f32 by rows on 8 ranks: pieces of 3 KiB, one checksum
  // each, of which the batch takes column halves (a reshard's neighbouring
  // ranks), a span of several and a whole one; "big" [1024, 1100] f32 on
  // one rank: a piece of 4.3 MiB with block checksums, read in parts; "u"
  // [100, 40] by rows on tp 8 and columns on dp 2: a grid, uneven by rows
  // (cells of 13 rows and a last of 9). The same batch from a zstd
  // checkpoint: pieces read whole.
  std::mt19937_64 rng(testing::TestSeed() + 37);
  testing::TempDir tmp;
  MemoryCheckpoint model;
  const std::vector<std::vector<int64_t>> shapes = {{64, 96}, {1024, 1100}, {100, 40}};
  std::vector<std::vector<uint8_t>> values;
  for (const auto& shape : shapes) {
    values.emplace_back(static_cast<size_t>(shape[0] * shape[1] * 4));
    for (uint8_t& b : values.back()) b = static_cast<uint8_t>(rng());
  }
  model.Add("w", DType::kF32, shapes[0], values[0]);
  model.Add("big", DType::kF32, shapes[1], values[1]);
  model.Add("u", DType::kF32, shapes[2], values[2]);
  Strategy rows(*Mesh::Parse("dp=2,tp=8"));
  for (size_t i : {0, 2}) {
    Layout l = model.strategy().tensors()[i].layout;
    l.dim_axes = {{"tp"}, {}};
    if (i == 2) l.dim_axes = {{"tp"}, {"dp"}};  // 16 pieces: indexed as a grid
    REQUIRE(rows.Add({model.strategy().tensors()[i].name, l, {}}).ok());
    if (i == 0) REQUIRE(rows.Add(model.strategy().tensors()[1]).ok());
  }
  Env* env = Env::Default();
  const std::string plain = tmp.path + "/plain", rs = tmp.path + "/rs", zstd = tmp.path + "/zstd";
  REQUIRE(WriteTransformed(env, model, rows, plain, Options(Codec::kRaw)).ok());
  WriteOptions with_rs = Options(Codec::kRaw);
  REQUIRE(ParseRedundancy("rs:4+2", &with_rs.native).ok());
  REQUIRE(WriteTransformed(env, model, rows, rs, with_rs).ok());
  REQUIRE(WriteTransformed(env, model, rows, zstd, Options(Codec::kZstd)).ok());

  std::vector<CheckpointReader::RegionRead> batch;
  for (int64_t piece = 0; piece < 8; ++piece) {
    for (int64_t c0 : {0, 48}) batch.push_back({0, Box{{piece * 8, piece * 8 + 8}, {c0, c0 + 48}}});
  }
  batch.push_back({0, Box{{5, 29}, {10, 90}}});  // parts of four pieces
  batch.push_back({0, Box{{16, 24}, {0, 96}}});  // a whole piece
  batch.push_back({1, Box{{100, 700}, {200, 500}}});
  batch.push_back({1, Box{{0, 1024}, {0, 50}}});
  batch.push_back({1, Box{{1000, 1024}, {1099, 1100}}});
  for (int64_t r0 : {0, 12, 13, 26, 90, 91}) {  // at, before and after the uneven cuts
    for (int64_t c0 : {0, 20})
      batch.push_back({2, Box{{r0, std::min<int64_t>(r0 + 9, 100)}, {c0, c0 + 20}}});
  }
  batch.push_back({2, Box{{0, 100}, {5, 35}}});
  std::shuffle(batch.begin(), batch.end(), rng);
  // Reads the batch into fresh buffers; true when every region's bytes
  // are the model's.
  auto read_batch = [&](const CheckpointReader& reader, Status* s) {
    std::vector<std::vector<uint8_t>> got(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      got[i].assign(static_cast<size_t>(NumElements(batch[i].region) * 4), 0xee);
      batch[i].dst = got[i].data();
    }
    *s = reader.ReadRegions(batch);
    bool right = true;
    for (size_t i = 0; i < batch.size(); ++i) {
      const Box& r = batch[i].region;
      std::vector<uint8_t> want(got[i].size());
      CopyBox(values[batch[i].index].data(), shapes[batch[i].index], r, want.data(), r.extents(),
              Box::FromShape(r.extents()), 4);
      right = right && got[i] == want;
    }
    return right;
  };
  for (const std::string& ck : {plain, rs, zstd}) {
    Status s;
    CHECK(read_batch(*Open(env, ck), &s));
    CHECK(s.ok());
  }
  // A byte of w's piece 3 (rows 24:32) damaged in both: the plain
  // checkpoint's batch fails naming it, the one with parity reads it
  // rebuilt and says so.
  for (const std::string& ck : {plain, rs}) {
    const std::string file = DamageRow29(env, ck);
    auto reader = Open(env, ck);
    Status s;
    const bool right = read_batch(*reader, &s);
    if (ck == plain) {
      CHECK(s.code() == StatusCode::kDataLoss);
      CHECK_THAT(s.message(), Catch::Contains(file) && Catch::Contains("'w'") &&
                                  Catch::Contains("[24:32, 0:96]"));
    } else {
      CHECK(s.ok());
      CHECK(right);
      REQUIRE(reader->Recoveries().size() == 1);
      CHECK_THAT(reader->Recoveries()[0],
                 Catch::Contains(file.substr(file.rfind('/') + 1)) && Catch::Contains("rebuilt"));
    }
  }
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

TEST_CASE("a batch of pieces writes the files WritePiece one at a time writes, stage copies too") {
  // Pieces of four ranks (pp=2, tp=2), shuffled: a tp-split matrix, a
  // tensor of stage 0 copied to stage 1 (a tied embedding) and one of stage
  // 1 alone. One writer takes them one at a time, the other in batches of
  // 1 to 7: every file and the manifest come out byte for byte the same.
  std::mt19937_64 rng(testing::TestSeed() + 77);
  auto env = NewMemEnv();
  Strategy strategy(*Mesh::Parse("pp=2,tp=2"));
  Layout split = Layout::Replicated({8, 6}, DType::kF32);
  split.dim_axes = {{}, {"tp"}};
  Layout tied = Layout::Replicated({4, 6}, DType::kF32);
  tied.dim_axes = {{"tp"}, {}};
  tied.stage_axis = "pp";
  tied.stage = 0;
  tied.copy_stages = {1};
  Layout last = Layout::Replicated({5}, DType::kF32);
  last.stage_axis = "pp";
  last.stage = 1;
  REQUIRE(strategy.Add({"w", split}).ok());
  REQUIRE(strategy.Add({"wte", tied}).ok());
  REQUIRE(strategy.Add({"ln", last}).ok());
  std::vector<CheckpointWriter::PieceWrite> pieces;
  std::vector<std::vector<float>> data;
  auto add = [&](size_t index, int64_t rank, Box box) {
    std::vector<float> v(static_cast<size_t>(NumElements(box)));
    for (float& x : v) x = static_cast<float>(rng() % 1000) * 0.25f;
    data.push_back(std::move(v));
    pieces.push_back({index, rank, std::move(box), nullptr});
  };
  for (int64_t tp = 0; tp < 2; ++tp) {  // rank = pp * 2 + tp; w once, by stage 0's ranks
    for (auto [lo, hi] : {std::pair{0, 3}, {3, 5}, {5, 8}}) {  // in three row bands
      add(0, tp, Box({{lo, hi}, {3 * tp, 3 * tp + 3}}));
    }
  }
  add(1, 0, Box({{0, 2}, {0, 6}}));  // stage 0's ranks; copies go to ranks 2, 3
  add(1, 1, Box({{2, 4}, {0, 6}}));
  add(2, 2, Box({{0, 5}}));
  for (size_t k = 0; k < pieces.size(); ++k) pieces[k].data = data[k].data();
  std::vector<CheckpointWriter::PieceWrite> in_order = pieces;
  std::shuffle(in_order.begin(), in_order.end(), rng);
  auto one = CreateNativeCheckpoint(env.get(), "/one", strategy, {3, {}, "test"}, {});
  auto batched = CreateNativeCheckpoint(env.get(), "/batched", strategy, {3, {}, "test"}, {});
  REQUIRE(one.ok());
  REQUIRE(batched.ok());
  for (const auto& p : in_order) {
    REQUIRE((*one)->WritePiece(p.index, p.shard_rank, p.box, p.data).ok());
  }
  for (size_t k = 0; k < in_order.size();) {
    const size_t n = std::min<size_t>(in_order.size() - k, 1 + rng() % 7);
    std::vector<CheckpointWriter::PieceWrite> batch(in_order.begin() + k, in_order.begin() + k + n);
    REQUIRE((*batched)->WritePieces(batch).ok());
    k += n;
  }
  REQUIRE((*one)->Commit().ok());
  REQUIRE((*batched)->Commit().ok());
  auto names = env->GetChildren("/one");
  REQUIRE(names.ok());
  auto other = env->GetChildren("/batched");
  REQUIRE(other.ok());
  std::sort(names->begin(), names->end());
  std::sort(other->begin(), other->end());
  CHECK(*names == *other);
  CHECK(names->size() >= 5);  // four data files and the manifest
  for (const std::string& name : *names) {
    auto a = ReadFileToString(env.get(), JoinPath("/one", name));
    auto b = ReadFileToString(env.get(), JoinPath("/batched", name));
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(*a == *b);
  }
  // The copy stage's piece is where the strategy puts it, and reads back.
  auto reader = Open(env.get(), "/batched");
  std::vector<float> wte(24);
  REQUIRE(ReadTensor(*reader, 1, wte.data()).ok());
  for (size_t k = 0; k < pieces.size(); ++k) {
    if (pieces[k].index != 1) continue;
    const int64_t row = pieces[k].box[0].begin;
    CHECK(std::equal(data[k].begin(), data[k].end(), wte.begin() + row * 6));
  }
  auto m = ReadManifest(env.get(), "/batched");
  REQUIRE(m.ok());
  REQUIRE(m->tensors[1].copies.size() == 2);
  for (const PieceInfo& c : m->tensors[1].copies) {
    CHECK(c.stage == 1);
    // The copy of rows [0:2] (tp 0) is rank 2's file, of [2:4] rank 3's.
    CHECK(m->files[c.file].name == (c.box[0].begin == 0 ? "data-00002.tsr" : "data-00003.tsr"));
  }
  // A piece outside its tensor fails the batch, naming it.
  auto bad = CreateNativeCheckpoint(env.get(), "/bad", strategy, {3, {}, "test"}, {});
  REQUIRE(bad.ok());
  std::vector<CheckpointWriter::PieceWrite> wrong = {in_order[0],
                                                     {2, 2, Box({{3, 7}}), data[0].data()}};
  const Status s = (*bad)->WritePieces(wrong);
  CHECK(!s.ok());
  CHECK(s.message().find("'ln'") != std::string::npos);
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

TEST_CASE("small pieces read in file order come from a window read ahead, others do not") {
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
