#include "formats/native_files.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <random>

#include "core/checksum.h"
#include "formats/codec.h"
#include "formats/erasure.h"
#include "formats/native.pb.h"
#include "tests/transform/random_layout.h"

namespace tessera {
namespace {

using testing::Uniform;

struct Written {
  Manifest manifest;
  std::vector<std::vector<uint8_t>> full;  // per tensor
};

// Writes `count` random tensors, each cut into the distinct pieces of a
// random layout on an 8-rank mesh, pieces spread over two data files.
Written WriteCheckpoint(Env* env, const std::string& dir, std::mt19937_64& rng, int count,
                        Codec codec) {
  Written w;
  REQUIRE(env->CreateDirs(dir).ok());
  w.manifest.mesh = *Mesh::Parse("dp=2,tp=4");
  w.manifest.step = 100;
  w.manifest.created_by = "native_files_test";
  w.manifest.metadata["config"] = std::string("{\"layers\": 2}\0binary", 20);
  std::vector<std::unique_ptr<DataFileWriter>> writers;
  for (uint32_t f = 0; f < 2; ++f) {
    const std::string name = "data-0000" + std::to_string(f) + ".tsr";
    auto writer = DataFileWriter::Create(env, JoinPath(dir, name), f);
    REQUIRE(writer.ok());
    writers.push_back(std::move(*writer));
    w.manifest.files.push_back({name, 0});
  }
  uint64_t ends[2] = {4096, 4096};  // of each file's last piece (the header first)
  for (int t = 0; t < count; ++t) {
    TensorEntry e;
    e.name = "t" + std::to_string(t);
    const DType dtype = static_cast<DType>(Uniform(rng, 0, kNumDTypes - 1));
    std::vector<int64_t> shape = testing::RandomShape(rng, 3, 40);
    e.layout = testing::RandomLayout(rng, w.manifest.mesh, shape, dtype, true, false);
    std::vector<uint8_t> full(ByteSize(e.layout));
    // Low-entropy values so compression has something to find.
    for (uint8_t& b : full) b = static_cast<uint8_t>(Uniform(rng, 0, 3));
    auto groups = ReplicaGroups(e.layout, w.manifest.mesh);
    REQUIRE(groups.ok());
    for (const ReplicaGroup& g : *groups) {
      if (IsEmpty(g.box)) continue;
      std::vector<uint8_t> piece(NumElements(g.box) * DTypeSize(dtype));
      CopyBox(full.data(), shape, g.box, piece.data(), g.box.extents(),
              Box::FromShape(g.box.extents()), DTypeSize(dtype));
      auto info =
          writers[g.ranks[0] % 2]->Append(piece.data(), piece.size(), g.box, dtype, codec, 3);
      REQUIRE(info.ok());
      // A piece of 64 KiB or more starts on the first page after the
      // previous piece of its file; a smaller one is packed right after it,
      // at the next multiple of 64 bytes.
      const uint64_t align =
          info->length < kPackedPieceLimit ? kSmallPieceAlignment : kPieceAlignment;
      uint64_t& end = ends[g.ranks[0] % 2];
      CHECK(info->offset % align == 0);
      CHECK(info->offset >= end);
      CHECK(info->offset - end < align);
      end = info->offset + info->length;
      e.pieces.push_back(*info);
    }
    w.manifest.tensors.push_back(std::move(e));
    w.full.push_back(std::move(full));
  }
  for (uint32_t f = 0; f < 2; ++f) {
    auto size = writers[f]->Finish();
    REQUIRE(size.ok());
    w.manifest.files[f].size = *size;
  }
  REQUIRE(CommitManifest(env, dir, w.manifest).ok());
  return w;
}

// Reads every tensor back through the manifest and compares bit for bit.
Status ReadBack(Env* env, const std::string& dir, const Written& w) {
  ASSIGN_OR_RETURN(Manifest m, ReadManifest(env, dir));
  if (m.step != 100 || m.metadata != w.manifest.metadata || m.created_by != "native_files_test") {
    return InternalError("manifest fields differ");
  }
  for (size_t t = 0; t < m.tensors.size(); ++t) {
    const TensorEntry& e = m.tensors[t];
    const int64_t es = DTypeSize(e.layout.dtype);
    std::vector<uint8_t> full(ByteSize(e.layout), 0xAB);
    for (const PieceInfo& p : e.pieces) {
      const std::string path = JoinPath(dir, m.files[p.file].name);
      ASSIGN_OR_RETURN(auto file, env->NewRandomAccessFile(path));
      RETURN_IF_ERROR(CheckDataFileHeader(*file, path));
      std::vector<uint8_t> raw(p.raw_length);
      RETURN_IF_ERROR(ReadPiece(*file, path, e.name, p, e.layout.dtype, raw.data()));
      CopyBox(raw.data(), p.box.extents(), Box::FromShape(p.box.extents()), full.data(),
              e.layout.shape, p.box, es);
    }
    if (full != w.full[t]) return InternalError("tensor '" + e.name + "' differs");
  }
  return Status::Ok();
}

TEST_CASE("native files: random checkpoints round-trip bit for bit, raw and zstd") {
  std::mt19937_64 rng(testing::TestSeed() + 10);
  auto env = NewMemEnv();
  for (Codec codec : {Codec::kRaw, Codec::kZstd}) {
    for (int iter = 0; iter < 10; ++iter) {
      const std::string dir =
          "/ck/" + std::to_string(static_cast<int>(codec)) + "-" + std::to_string(iter);
      Written w = WriteCheckpoint(env.get(), dir, rng, 12, codec);
      INFO("iteration " << iter);
      Status s = ReadBack(env.get(), dir, w);
      REQUIRE(s.ok());
    }
  }
}

TEST_CASE("a manifest, written tensor by tensor, is the whole message's deterministic bytes") {
  std::mt19937_64 rng(testing::TestSeed() + 11);
  auto env = NewMemEnv();
  Written w = WriteCheckpoint(env.get(), "/ck", rng, 9, Codec::kRaw);
  Manifest m = w.manifest;
  m.metadata["rng"] = "state";
  m.files.push_back({"parity-0.tsr", 4096, 77, "host-1"});
  m.erasure_groups.push_back({kRsCauchy, {0}, {2}});
  m.tensors[1].copies.push_back(m.tensors[1].pieces[0]);
  m.tensors[1].copies.back().file = 1;
  const std::string framed = SerializeManifest(m);
  REQUIRE(framed.size() > kManifestHeader);
  const std::string payload = framed.substr(kManifestHeader);
  native::Manifest whole;
  REQUIRE(whole.ParseFromString(payload));
  CHECK(whole.tensors_size() == 9);
  CHECK(whole.tensors(1).copies_size() == 1);
  CHECK(whole.metadata().size() == 2);
  std::string again;
  {
    google::protobuf::io::StringOutputStream stream(&again);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    whole.SerializeToCodedStream(&coded);
  }
  CHECK(again == payload);
  // And it reads back, tensor by tensor, to the same manifest.
  auto back = ParseManifest(framed, "/ck/manifest.pb", false);
  REQUIRE(back.ok());
  CHECK(SerializeManifest(*back) == framed);
  // Cut short inside a tensor's message: a named error, no crash.
  const size_t at = payload.find(m.tensors[4].name);
  REQUIRE(at != std::string::npos);
  auto bad = ParseManifest(payload.substr(0, at + 2), "/ck/manifest.pb", true);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("/ck/manifest.pb") != std::string::npos);
}

TEST_CASE("a manifest of 160,000 pieces parses on a pool, errors reported in tensor order") {
  // Past the size at which tensors are parsed in parallel ranges.
  Manifest m;
  m.mesh = *Mesh::Parse("r=1");
  m.files.push_back({"data-00000.tsr", uint64_t{1} << 40});
  const int tensors = 40, pieces = 4000;
  for (int t = 0; t < tensors; ++t) {
    TensorEntry e;
    e.name = "t" + std::to_string(t);
    e.layout = Layout::Replicated({pieces}, DType::kF32);
    for (int i = 0; i < pieces; ++i) {
      PieceInfo p;
      p.offset = (uint64_t{1} << 12) * (static_cast<uint64_t>(t) * pieces + i + 1);
      p.length = p.raw_length = 4;
      p.box = Box({{i, i + 1}});
      p.checksum = static_cast<uint64_t>(t * pieces + i);
      e.pieces.push_back(p);
    }
    m.tensors.push_back(std::move(e));
  }
  const std::string framed = SerializeManifest(m);
  REQUIRE(framed.size() > (size_t{4} << 20));
  auto back = ParseManifest(framed, "/big/manifest.pb", false);
  REQUIRE(back.ok());
  REQUIRE(back->tensors.size() == static_cast<size_t>(tensors));
  CHECK(back->tensors[37].name == "t37");
  CHECK(back->tensors[37].pieces[123].checksum == 37 * pieces + 123);
  CHECK(SerializeManifest(*back) == framed);
  SECTION("the first bad tensor is the one named, whichever range fails first") {
    Manifest bad = m;
    bad.tensors[31].pieces[9].box = Box({{pieces, pieces + 1}});  // outside its shape
    bad.tensors[3].pieces[5].raw_length = 8;                      // does not match its box
    auto r = ParseManifest(SerializeManifest(bad), "/big/manifest.pb", false);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().find("tensor 't3'") != std::string::npos);
  }
  SECTION("a name repeated in another range") {
    Manifest bad = m;
    bad.tensors[39].name = "t1";
    auto r = ParseManifest(SerializeManifest(bad), "/big/manifest.pb", false);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().find("tensor 't1' appears twice") != std::string::npos);
  }
}

TEST_CASE("region reads of a multi-block raw piece: staged and direct paths agree") {
  // A 9.5 MiB piece (rows of 3 KiB, not a divisor of the 1 MiB checksum
  // block): regions whose rows run over whole blocks are read straight into
  // the destination, the rest through the staging window. Every region is
  // compared with the same region cut out of the whole piece.
  auto env = NewMemEnv();
  REQUIRE(env->CreateDirs("/r").ok());
  const std::vector<int64_t> shape = {3242, 768};  // f32
  const Box whole = Box::FromShape({3300, 768});
  Box pbox = whole;
  pbox[0] = {40, 40 + shape[0]};
  std::vector<float> data(NumElements(pbox));
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i) * 0.5f;
  auto writer = DataFileWriter::Create(env.get(), "/r/d.tsr", 0);
  REQUIRE(writer.ok());
  auto info = (*writer)->Append(data.data(), data.size() * 4, pbox, DType::kF32, Codec::kRaw, 0);
  REQUIRE(info.ok());
  REQUIRE(info->block_checksums.size() == 10);
  // Written in one pass a block at a time: the records are those of the
  // piece encoded whole.
  auto encoded = EncodeStoredPiece(data.data(), data.size() * 4, pbox, DType::kF32, Codec::kRaw, 0);
  REQUIRE(encoded.ok());
  CHECK(info->checksum == Xxh3(data.data(), data.size() * 4));
  CHECK(info->checksum == encoded->info.checksum);
  CHECK(info->block_checksums == encoded->info.block_checksums);
  const char* bytes = reinterpret_cast<const char*>(data.data());
  for (size_t b = 0; b < info->block_checksums.size(); ++b) {
    const uint64_t off = b * kChecksumBlock;
    CHECK(info->block_checksums[b] ==
          Xxh3(bytes + off, std::min<uint64_t>(kChecksumBlock, data.size() * 4 - off)));
  }
  BlockChecksums copy = info->block_checksums;  // deep: changing it leaves the piece's
  copy[9] ^= 1;
  CHECK(copy != info->block_checksums);
  CHECK(BlockChecksums().empty());
  CHECK(BlockChecksums() == BlockChecksums(0));
  REQUIRE((*writer)->Finish().ok());
  CHECK((*writer)->checksum() ==
        Xxh3(ReadFileToString(env.get(), "/r/d.tsr")->data(), (*writer)->size()));
  {
    // Streamed through a reader (the offload tier's saves): the same record
    // and the same file, with at most kStreamBytes asked for at once.
    auto streamed = DataFileWriter::Create(env.get(), "/r/s.tsr", 0);
    REQUIRE(streamed.ok());
    size_t most = 0;
    const PieceReader read = [&](uint64_t offset, size_t n, void* out) {
      most = std::max(most, n);
      std::memcpy(out, reinterpret_cast<const char*>(data.data()) + offset, n);
      return Status::Ok();
    };
    auto got = (*streamed)->AppendFrom(read, data.size() * 4, pbox, DType::kF32);
    REQUIRE(got.ok());
    CHECK(got->checksum == info->checksum);
    CHECK(got->block_checksums == info->block_checksums);
    CHECK(got->offset == info->offset);
    CHECK(most <= kStreamBytes);
    REQUIRE((*streamed)->Finish().ok());
    CHECK(*ReadFileToString(env.get(), "/r/s.tsr") == *ReadFileToString(env.get(), "/r/d.tsr"));
    // A reader's error names itself through the append.
    auto failing = DataFileWriter::Create(env.get(), "/r/f.tsr", 0);
    REQUIRE(failing.ok());
    const PieceReader broken = [](uint64_t, size_t, void*) {
      return IOError("offload file 'adam.rank0.bin': cannot read");
    };
    auto bad = (*failing)->AppendFrom(broken, data.size() * 4, pbox, DType::kF32);
    REQUIRE_FALSE(bad.ok());
    CHECK_THAT(std::string(bad.status().message()), Catch::Contains("adam.rank0.bin"));
  }
  auto file = env->NewRandomAccessFile("/r/d.tsr");
  REQUIRE(file.ok());
  struct Case {
    Box region;
    const char* what;
  };
  const std::vector<Case> cases = {
      {Box({{40, 3282}, {0, 768}}), "the whole piece"},
      {Box({{100, 3000}, {0, 768}}),
       "full rows: partial first and last blocks, whole blocks between"},
      {Box({{2000, 3282}, {0, 768}}), "full rows to the piece's end (its short last block)"},
      {Box({{381, 382}, {0, 768}}), "one row inside a block"},
      {Box({{50, 3100}, {100, 600}}), "a column band: every row a separate run"},
  };
  for (const Case& c : cases) {
    for (bool padded : {false, true}) {
      INFO(c.what << (padded ? ", into a padded destination" : ", into an exact destination"));
      // Exact: the region's own extents (rows contiguous in the destination,
      // so whole blocks can land there directly). Padded: one row and 8
      // columns more, the region at an offset (every row a separate run).
      const int64_t pr = padded ? 1 : 0, pc = padded ? 8 : 0;
      const std::vector<int64_t> ext = {c.region[0].size() + pr, c.region[1].size() + pc};
      const Box at({{pr, pr + c.region[0].size()}, {pc, pc + c.region[1].size()}});
      std::vector<float> got(ext[0] * ext[1], -1.0f), want(ext[0] * ext[1], -1.0f);
      REQUIRE(ReadPieceRegion(**file, "/r/d.tsr", "w", *info, DType::kF32, c.region, got.data(),
                              ext, at)
                  .ok());
      CopyBox(data.data(), pbox.extents(), RelativeTo(c.region, pbox), want.data(), ext, at, 4);
      const bool same = got == want;  // not CHECK(got == want): Catch would print 2M floats
      CHECK(same);
    }
  }
  SECTION("a corrupt block read straight into the destination is caught") {
    std::string bytes = *ReadFileToString(env.get(), "/r/d.tsr");
    bytes[info->offset + 5 * kChecksumBlock + 17] ^= 0x01;  // block 5: inside every full-row case
    REQUIRE(WriteFileAtomically(env.get(), "/r/d.tsr", bytes).ok());
    auto bad = env->NewRandomAccessFile("/r/d.tsr");
    REQUIRE(bad.ok());
    std::vector<float> got(NumElements(pbox));
    Status s =
        ReadPieceRegion(**bad, "/r/d.tsr", "w", *info, DType::kF32, Box({{100, 3000}, {0, 768}}),
                        got.data(), {2900, 768}, Box::FromShape({2900, 768}));
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(s.message().find("checksum mismatch in block 5") != std::string::npos);
    CHECK(s.message().find("'w'") != std::string::npos);
  }
}

// XXH3 of tile (i, j) of a row-major piece of `rows` rows of `row_bytes`,
// tiles of `tile_rows` by `tile_bytes`: gathered into one buffer, hashed
// at once (the spec's definition; the library streams).
uint64_t TileDigest(const char* bytes, uint64_t rows, uint64_t row_bytes, uint64_t tile_rows,
                    uint64_t tile_bytes, uint64_t i, uint64_t j) {
  std::string tile;
  for (uint64_t r = i * tile_rows; r < std::min(rows, (i + 1) * tile_rows); ++r) {
    const uint64_t from = j * tile_bytes;
    tile.append(bytes + r * row_bytes + from, std::min(tile_bytes, row_bytes - from));
  }
  return Xxh3(tile.data(), tile.size());
}

TEST_CASE(
    "tile checksums (format 3): written in one pass, and a region read verifies only its tiles") {
  struct Shape {
    std::vector<int64_t> extents;
    DType dtype;
    uint64_t tile_rows, tile_columns;  // as formats/native.md chooses them
  };
  // 12,000-byte rows: 4 tiles of 750 columns (3,000 bytes; 8 would be under
  // 2 KiB), 349 rows to a ~4 MiB band. 8,008-byte rows of 1,001 f64: 2
  // tiles, 501 and 500 columns. A 3-D bf16 piece: rows are its slices' rows.
  const std::vector<Shape> shapes = {{{600, 3000}, DType::kF32, 349, 750},
                                     {{700, 1001}, DType::kF64, 523, 501},
                                     {{3, 300, 2100}, DType::kBF16, 998, 1050}};
  std::mt19937_64 rng(testing::TestSeed() + 40);
  testing::TempDir tmp;
  auto mem = NewMemEnv();
  REQUIRE(mem->CreateDirs(tmp.path).ok());
  for (const Shape& sh : shapes) {
    for (Env* env : {Env::Default(), mem.get()}) {  // lends its bytes (mapped), or not
      INFO("piece " << ToString(Box::FromShape(sh.extents))
                    << (env == mem.get() ? ", in memory" : ", on disk"));
      const int n = static_cast<int>(sh.extents.size());
      const int64_t es = DTypeSize(sh.dtype);
      Box pbox = Box::FromShape(sh.extents);
      pbox[0] = {5, 5 + sh.extents[0]};  // not at the origin
      const uint64_t size = static_cast<uint64_t>(NumElements(pbox) * es);
      std::string data(size, '\0');
      for (char& c : data) c = static_cast<char>(rng());
      const std::string path = JoinPath(tmp.path, "tiles.tsr");
      auto writer = DataFileWriter::Create(env, path, 0);
      REQUIRE(writer.ok());
      auto info = (*writer)->Append(data.data(), size, pbox, sh.dtype, Codec::kRaw, 0);
      REQUIRE(info.ok());
      REQUIRE((*writer)->Finish().ok());
      CHECK(info->tile_rows == sh.tile_rows);
      CHECK(info->tile_columns == sh.tile_columns);
      const uint64_t last = static_cast<uint64_t>(sh.extents[n - 1]);
      const uint64_t row_bytes = last * es, rows = size / row_bytes;
      const uint64_t tile_bytes = sh.tile_columns * es;
      const uint64_t nr = (rows + sh.tile_rows - 1) / sh.tile_rows;
      const uint64_t nc = (last + sh.tile_columns - 1) / sh.tile_columns;
      REQUIRE(info->block_checksums.size() == nr * nc);
      for (uint64_t i = 0; i < nr; ++i) {
        for (uint64_t j = 0; j < nc; ++j) {
          CHECK(info->block_checksums[i * nc + j] ==
                TileDigest(data.data(), rows, row_bytes, sh.tile_rows, tile_bytes, i, j));
        }
      }
      CHECK(info->checksum == Xxh3(data.data(), size));
      // The same record encoded whole, streamed, and through the manifest.
      auto encoded = EncodeStoredPiece(data.data(), size, pbox, sh.dtype, Codec::kRaw, 0);
      REQUIRE(encoded.ok());
      CHECK(encoded->info.block_checksums == info->block_checksums);
      CHECK(encoded->info.tile_columns == info->tile_columns);
      auto streamed = DataFileWriter::Create(env, path + ".s", 0);
      REQUIRE(streamed.ok());
      auto got = (*streamed)->AppendFrom(
          [&](uint64_t off, size_t k, void* out) {
            std::memcpy(out, data.data() + off, k);
            return Status::Ok();
          },
          size, pbox, sh.dtype);
      REQUIRE(got.ok());
      CHECK(got->block_checksums == info->block_checksums);
      CHECK(got->tile_rows == info->tile_rows);
      auto file = env->NewRandomAccessFile(path);
      REQUIRE(file.ok());
      REQUIRE(VerifyPiece(**file, path, "w", *info, sh.dtype).ok());

      // Regions: column bands on tile edges and across them, single rows,
      // full rows (bands read straight into the destination), the corner.
      std::vector<Box> regions;
      for (int k = 0; k < 12; ++k) {
        Box r = pbox;
        for (int d = 0; d < n; ++d) {
          const int64_t a = pbox[d].begin + testing::Uniform(rng, 0, pbox[d].size() - 1);
          const int64_t b = testing::Uniform(rng, a + 1, pbox[d].end);
          if (k % 3 != 0 || d == n - 1) r[d] = {a, b};
        }
        regions.push_back(r);
      }
      Box half = pbox;
      half[n - 1] = {0, static_cast<int64_t>(sh.tile_columns)};
      regions.push_back(half);
      Box one = pbox;
      one[0] = {6, 7};
      regions.push_back(one);
      Box full_rows = pbox;  // full rows across bands: contiguous in an exact destination
      full_rows[0] = {pbox[0].begin + 1, pbox[0].end - 1};
      regions.push_back(full_rows);
      for (const Box& region : regions) {
        INFO("region " << ToString(region));
        for (int64_t pad : {0, 1}) {  // exact (bands straight in) or padded (copied)
          std::vector<int64_t> ext = region.extents();
          Box at = Box::FromShape(ext);
          for (int d = 0; d < n; ++d) {
            ext[d] += 2 * pad;
            at[d] = {pad, pad + region[d].size()};
          }
          std::string out(NumElements(Box::FromShape(ext)) * es, '\x55'), want(out);
          REQUIRE(ReadPieceRegion(**file, path, "w", *info, sh.dtype, region, out.data(), ext, at)
                      .ok());
          CopyBox(data.data(), pbox.extents(), RelativeTo(region, pbox), want.data(), ext, at, es);
          CHECK((out == want));
        }
        std::string want(NumElements(region) * es, '\0');
        CopyBox(data.data(), pbox.extents(), RelativeTo(region, pbox), want.data(),
                region.extents(), Box::FromShape(region.extents()), es);
        auto view = ViewPieceRegion(**file, path, "w", *info, sh.dtype, region);
        REQUIRE(view.ok());
        if (*view != nullptr) CHECK(std::string((*view)->data(), (*view)->size()) == want);
      }

      // A flipped byte in tile (nr - 1, nc - 1): a read of the first column
      // tile does not touch it (and succeeds); one that does is refused,
      // naming the tile; verify finds it.
      std::string bytes = *ReadFileToString(env, path);
      const uint64_t flip = info->offset + (rows - 1) * row_bytes + row_bytes - 1;
      bytes[flip] ^= 0x10;
      REQUIRE(WriteFileAtomically(env, path, bytes).ok());
      auto bad = env->NewRandomAccessFile(path);
      REQUIRE(bad.ok());
      Box first = pbox;
      first[n - 1] = {0, static_cast<int64_t>(sh.tile_columns)};
      std::string out(NumElements(first) * es, '\0');
      CHECK(ReadPieceRegion(**bad, path, "w", *info, sh.dtype, first, out.data(), first.extents(),
                            Box::FromShape(first.extents()))
                .ok());
      Box corner = pbox;
      corner[n - 1] = {static_cast<int64_t>(last) - 1, static_cast<int64_t>(last)};
      out.assign(NumElements(corner) * es, '\0');
      Status s = ReadPieceRegion(**bad, path, "w", *info, sh.dtype, corner, out.data(),
                                 corner.extents(), Box::FromShape(corner.extents()));
      CHECK(s.code() == StatusCode::kDataLoss);
      const std::string tile =
          "checksum mismatch in tile (rows " + std::to_string((nr - 1) * sh.tile_rows) + ":" +
          std::to_string(rows) + ", columns " + std::to_string((nc - 1) * sh.tile_columns) + ":" +
          std::to_string(last);
      CHECK_THAT(std::string(s.message()), Catch::Contains(tile));
      Box tail = corner;  // the last element: one run, lent where the file lends
      for (int d = 0; d + 1 < n; ++d) tail[d] = {pbox[d].end - 1, pbox[d].end};
      auto lent = ViewPieceRegion(**bad, path, "w", *info, sh.dtype, tail);
      if (env == Env::Default()) {
        CHECK(lent.status().code() == StatusCode::kDataLoss);
        CHECK_THAT(std::string(lent.status().message()), Catch::Contains(tile));
      }
      s = VerifyPiece(**bad, path, "w", *info, sh.dtype);
      CHECK_THAT(std::string(s.message()), Catch::Contains(tile));
    }
  }
}

TEST_CASE("a manifest's tiles must fit their piece") {
  Manifest m;
  m.mesh = *Mesh::Parse("tp=1");
  m.files.push_back({"data-00000.tsr", 4096 + (8 << 20), 0, ""});
  TensorEntry t;
  t.name = "w";
  t.layout = Layout::Replicated({1024, 2048}, DType::kF32);
  PieceInfo p;
  p.box = Box::FromShape({1024, 2048});
  p.offset = 4096;
  p.length = p.raw_length = 8 << 20;
  p.tile_rows = 512;
  p.tile_columns = 512;
  p.block_checksums = BlockChecksums(2 * 4);
  t.pieces.push_back(p);
  m.tensors.push_back(t);
  REQUIRE(ParseManifest(SerializeManifest(m), "/x/manifest.pb", false).ok());
  auto refused = [&](const Manifest& bad, const std::string& what) {
    auto r = ParseManifest(SerializeManifest(bad), "/x/manifest.pb", false);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(std::string(r.status().message()), Catch::Contains(what));
    CHECK_THAT(std::string(r.status().message()), Catch::Contains("'w'"));
  };
  Manifest bad = m;
  bad.tensors[0].pieces[0].block_checksums = BlockChecksums(9);
  refused(bad, "9 block checksums for 8 tiles");
  bad = m;
  bad.tensors[0].pieces[0].tile_columns = 4096;
  refused(bad, "tiles of 512 rows by 4096 columns");
  bad = m;
  bad.tensors[0].pieces[0].tile_rows = 0;
  refused(bad, "tiles of 0 rows by 512 columns");

  // Tiles of more rows than the piece has are the manifest's right (one
  // band): a reader allocates no more than the piece for a band, and a
  // checksum that does not match is reported, not a crash.
  auto env = NewMemEnv();
  REQUIRE(env->CreateDirs("/x").ok());
  auto writer = DataFileWriter::Create(env.get(), "/x/d.tsr", 0);
  REQUIRE(writer.ok());
  const Box two_rows = Box::FromShape({2, 262144});  // rows of 1 MiB
  std::vector<float> data(2 * 262144, 1.5f);
  auto info =
      (*writer)->Append(data.data(), data.size() * 4, two_rows, DType::kF32, Codec::kRaw, 0);
  REQUIRE(info.ok());
  REQUIRE((*writer)->Finish().ok());
  PieceInfo tall = *info;
  tall.tile_rows = UINT16_MAX;  // 65,535 MiB a band, were it not for the piece's 2 MiB
  tall.tile_columns = 131072;
  tall.block_checksums = BlockChecksums(2);
  auto file = env->NewRandomAccessFile("/x/d.tsr");
  REQUIRE(file.ok());
  Status s = VerifyPiece(**file, "/x/d.tsr", "w", tall, DType::kF32);
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK_THAT(std::string(s.message()), Catch::Contains("tile (rows 0:2, columns 0:131072"));
  std::vector<float> out(262144);
  s = ReadPieceRegion(**file, "/x/d.tsr", "w", tall, DType::kF32, Box({{0, 2}, {0, 131072}}),
                      out.data(), {2, 131072}, Box::FromShape({2, 131072}));
  CHECK(s.code() == StatusCode::kDataLoss);
}

TEST_CASE("a parked data file reopens where it ended: the same bytes as one never parked") {
  // Pieces small and large, staged and not, with the file parked (closed)
  // between them and before Finish, on the POSIX Env (whose reopened file
  // starts at offset 0) and in memory: byte for byte the file an unparked
  // writer makes.
  std::mt19937_64 rng(testing::TestSeed() + 19);
  testing::TempDir tmp;
  const std::string dir = tmp.path;
  auto mem = NewMemEnv();
  REQUIRE(mem->CreateDirs(dir).ok());
  for (Env* env : {Env::Default(), mem.get()}) {
    auto plain = DataFileWriter::Create(env, JoinPath(dir, "plain.tsr"), 0);
    auto parked = DataFileWriter::Create(env, JoinPath(dir, "parked.tsr"), 0);
    REQUIRE(plain.ok());
    REQUIRE(parked.ok());
    for (int k = 0; k < 12; ++k) {
      const int64_t n = k % 4 == 3 ? 40000 : Uniform(rng, 1, 900);  // 160 KB or a few KiB
      std::vector<float> v(n);
      for (float& x : v) x = static_cast<float>(Uniform(rng, -1000, 1000)) * 0.25f;
      const Box box = Box::FromShape({n});
      if (k == 4) {
        (*plain)->Stage(std::string(), 1 << 16);
        (*parked)->Stage(std::string(), 1 << 16);
      }
      auto a = (*plain)->Append(v.data(), n * 4, box, DType::kF32, Codec::kRaw, 0);
      auto b = (*parked)->Append(v.data(), n * 4, box, DType::kF32, Codec::kRaw, 0);
      REQUIRE(a.ok());
      REQUIRE(b.ok());
      CHECK(a->offset == b->offset);
      if (k % 3 == 1) {
        REQUIRE((*parked)->Park().ok());
        CHECK((*parked)->parked());
        CHECK_FALSE((*parked)->staging());  // staged bytes written first
      }
    }
    REQUIRE((*parked)->Park().ok());
    auto size_a = (*plain)->Finish();
    auto size_b = (*parked)->Finish();
    REQUIRE(size_a.ok());
    REQUIRE(size_b.ok());
    CHECK(*size_a == *size_b);
    CHECK((*plain)->checksum() == (*parked)->checksum());
    auto bytes_a = ReadFileToString(env, JoinPath(dir, "plain.tsr"));
    auto bytes_b = ReadFileToString(env, JoinPath(dir, "parked.tsr"));
    REQUIRE(bytes_a.ok());
    REQUIRE(bytes_b.ok());
    CHECK(bytes_a->size() == *size_a);
    CHECK(*bytes_a == *bytes_b);
  }
}

TEST_CASE("byte-plane shuffle is invertible and helps zstd on floats") {
  std::mt19937_64 rng(3);
  std::vector<float> v(1 << 14);
  float x = 1.0f;
  for (float& f : v) f = (x += std::normal_distribution<float>(0, 1e-3f)(rng));  // a random walk
  std::vector<char> sh(v.size() * 4), back(v.size() * 4);
  ShuffleBytes(v.data(), sh.size(), 4, sh.data());
  UnshuffleBytes(sh.data(), sh.size(), 4, back.data());
  CHECK(std::memcmp(back.data(), v.data(), back.size()) == 0);
  auto shuffled = EncodePiece(v.data(), v.size() * 4, DType::kF32, Codec::kZstd, 3);
  auto plain = EncodePiece(v.data(), v.size() * 4, DType::kI32, Codec::kZstd, 3);  // not shuffled
  REQUIRE(shuffled.ok());
  REQUIRE(plain.ok());
  CHECK(shuffled->size() < plain->size());
  std::vector<float> out(v.size());
  REQUIRE(DecodePiece(shuffled->data(), shuffled->size(), Codec::kZstd, DType::kF32, out.data(),
                      out.size() * 4, "t")
              .ok());
  CHECK(out == v);
}

TEST_CASE("corrupt, truncated and future inputs give named errors") {
  std::mt19937_64 rng(testing::TestSeed() + 11);
  auto env = NewMemEnv();
  Written w = WriteCheckpoint(env.get(), "/ck", rng, 6, Codec::kRaw);
  REQUIRE(ReadBack(env.get(), "/ck", w).ok());
  // Find a piece to damage.
  const TensorEntry* victim = nullptr;
  for (const TensorEntry& e : w.manifest.tensors) {
    if (!e.pieces.empty()) victim = &e;
  }
  REQUIRE(victim != nullptr);
  const PieceInfo& p = victim->pieces[0];
  const std::string path = JoinPath("/ck", w.manifest.files[p.file].name);
  std::string bytes = *ReadFileToString(env.get(), path);

  SECTION("a flipped byte") {
    bytes[p.offset] ^= 0x10;
    REQUIRE(WriteFileAtomically(env.get(), path, bytes).ok());
    Status s = ReadBack(env.get(), "/ck", w);
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(s.message().find("checksum mismatch") != std::string::npos);
    CHECK(s.message().find(path) != std::string::npos);
    CHECK(s.message().find("'" + victim->name + "'") != std::string::npos);
  }
  SECTION("a truncated data file") {
    bytes.resize(p.offset + p.length / 2);
    REQUIRE(WriteFileAtomically(env.get(), path, bytes).ok());
    Status s = ReadBack(env.get(), "/ck", w);
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(s.message().find(path) != std::string::npos);
  }
  SECTION("a bad magic") {
    bytes[0] = 'X';
    REQUIRE(WriteFileAtomically(env.get(), path, bytes).ok());
    Status s = ReadBack(env.get(), "/ck", w);
    CHECK(s.message().find("bad magic") != std::string::npos);
  }
  SECTION("a manifest of a future version") {
    Manifest future = w.manifest;
    future.format_version = 7;
    REQUIRE(CommitManifest(env.get(), "/ck", future).ok());
    auto m = ReadManifest(env.get(), "/ck");
    REQUIRE_FALSE(m.ok());
    CHECK(m.status().code() == StatusCode::kFailedPrecondition);
    CHECK(m.status().message().find("format version 7") != std::string::npos);
    CHECK(m.status().message().find("/ck/manifest.pb") != std::string::npos);
  }
  SECTION("a garbled manifest is read from its copy; both garbled are named") {
    REQUIRE(WriteFileAtomically(env.get(), "/ck/manifest.pb", "\xff\xff\xff garbage").ok());
    std::string note;
    auto m = ReadManifest(env.get(), "/ck", &note);
    REQUIRE(m.ok());
    CHECK(m->tensors.size() == w.manifest.tensors.size());
    CHECK(note.find("read from manifest-copy.pb") != std::string::npos);
    REQUIRE(WriteFileAtomically(env.get(), "/ck/manifest-copy.pb", "garbage").ok());
    m = ReadManifest(env.get(), "/ck");
    REQUIRE_FALSE(m.ok());
    CHECK(m.status().code() == StatusCode::kDataLoss);
    CHECK(m.status().message().find("/ck/manifest.pb") != std::string::npos);
    CHECK(m.status().message().find("its copy failed too") != std::string::npos);
  }
  SECTION("a manifest that lost its frame is not taken for format 1") {
    const std::string framed = SerializeManifest(w.manifest);
    REQUIRE(WriteFileAtomically(env.get(), "/ck/manifest.pb", framed.substr(kManifestHeader)).ok());
    auto m = ReadManifest(env.get(), "/ck");  // read from the copy
    REQUIRE(m.ok());
    REQUIRE(env->DeleteFile("/ck/manifest-copy.pb").ok());
    m = ReadManifest(env.get(), "/ck");
    REQUIRE_FALSE(m.ok());
    CHECK(m.status().message().find("without the frame") != std::string::npos);
  }
  SECTION("format 1 manifests (the bare protobuf) still open") {
    Manifest v1 = w.manifest;
    v1.format_version = 1;
    REQUIRE(env->DeleteFile("/ck/manifest-copy.pb").ok());
    REQUIRE(WriteFileAtomically(env.get(), "/ck/manifest.pb", SerializeManifest(v1)).ok());
    auto m = ReadManifest(env.get(), "/ck");
    REQUIRE(m.ok());
    CHECK(m->format_version == 1);
    CHECK(m->tensors.size() == w.manifest.tensors.size());
  }
  SECTION("a piece pointing past its file") {
    Manifest bad = w.manifest;
    bad.files[0].size = 10;
    REQUIRE(CommitManifest(env.get(), "/ck", bad).ok());
    auto m = ReadManifest(env.get(), "/ck");
    REQUIRE_FALSE(m.ok());
    CHECK(m.status().message().find("past the end of file") != std::string::npos);
  }
  SECTION("a compressed piece claiming more than zstd can expand to") {
    // A hostile manifest: 100 stored bytes that would decode to 4 GiB. It
    // is refused before anything is allocated.
    Manifest bad = w.manifest;
    TensorEntry huge;
    huge.name = "huge";
    huge.layout = Layout::Replicated({int64_t{1} << 20, 1024}, DType::kF32);
    PieceInfo p;
    p.box = Box::FromShape(huge.layout.shape);
    p.offset = 4096;
    p.length = 100;
    p.codec = Codec::kZstd;
    p.raw_length = uint64_t{4} << 30;
    huge.pieces.push_back(p);
    bad.tensors.push_back(huge);
    REQUIRE(CommitManifest(env.get(), "/ck", bad).ok());
    auto m = ReadManifest(env.get(), "/ck");
    REQUIRE_FALSE(m.ok());
    CHECK(m.status().message().find("tensor 'huge'") != std::string::npos);
    CHECK(m.status().message().find("more than zstd can expand") != std::string::npos);
  }
}

TEST_CASE(
    "commit protocol: a crash before the manifest or before latest's sync keeps the old state") {
  std::mt19937_64 rng(testing::TestSeed() + 12);
  auto mem = NewMemEnv();
  FaultInjectionEnv env(mem.get());
  REQUIRE(env.CreateDirs("/run").ok());
  Written first = WriteCheckpoint(&env, "/run/step-1", rng, 4, Codec::kZstd);
  REQUIRE(env.SyncDir("/run").ok());
  REQUIRE(SetLatest(&env, "/run", "step-1").ok());

  // The second checkpoint's data is written but its manifest never committed.
  REQUIRE(env.CreateDirs("/run/step-2").ok());
  auto writer = DataFileWriter::Create(&env, "/run/step-2/data-00000.tsr", 0);
  REQUIRE(writer.ok());
  std::vector<uint8_t> piece(64, 1);
  REQUIRE((*writer)
              ->Append(piece.data(), piece.size(), Box{{0, 16}}, DType::kF32, Codec::kRaw, 0)
              .ok());
  REQUIRE(env.SimulateCrash().ok());
  auto incomplete = ReadManifest(&env, "/run/step-2");
  if (env.IsDirectory("/run/step-2")) {
    REQUIRE_FALSE(incomplete.ok());
    CHECK(incomplete.status().message().find("incomplete (no manifest.pb)") != std::string::npos);
  }
  CHECK(*ReadLatest(&env, "/run") == "step-1");
  REQUIRE(ReadBack(&env, "/run/" + *ReadLatest(&env, "/run"), first).ok());

  // A rename of latest that never reached the disk is undone by the crash.
  REQUIRE(WriteFileAtomically(&env, "/run/latest.tmp", "step-2\n").ok());  // synced temp file
  REQUIRE(env.RenameFile("/run/latest.tmp", "/run/latest").ok());
  REQUIRE(env.SimulateCrash().ok());
  CHECK(*ReadLatest(&env, "/run") == "step-1");
}

TEST_CASE("PruneCheckpoints keeps the newest committed steps and the one latest names") {
  std::mt19937_64 rng(testing::TestSeed() + 13);
  auto env = NewMemEnv();
  REQUIRE(env->CreateDirs("/run").ok());
  for (int step : {2, 10, 4, 8})
    WriteCheckpoint(env.get(), "/run/step-" + std::to_string(step), rng, 1, Codec::kRaw);
  REQUIRE(env->CreateDirs("/run/step-12").ok());  // incomplete: no manifest
  REQUIRE(env->CreateDirs("/run/export").ok());
  REQUIRE(SetLatest(env.get(), "/run", "step-4").ok());  // e.g. a newer save failed
  std::vector<std::string> removed;
  REQUIRE(PruneCheckpoints(env.get(), "/run", 2, &removed).ok());
  CHECK(removed == std::vector<std::string>{"step-2"});  // step-4 is latest: kept
  for (const char* kept :
       {"/run/step-4", "/run/step-8", "/run/step-10", "/run/step-12", "/run/export"}) {
    INFO(kept);
    CHECK(env->IsDirectory(kept));
  }
  REQUIRE(SetLatest(env.get(), "/run", "step-10").ok());
  removed.clear();
  REQUIRE(PruneCheckpoints(env.get(), "/run", 1, &removed).ok());
  CHECK(removed == std::vector<std::string>{"step-4", "step-8"});
  CHECK(env->IsDirectory("/run/step-10"));
  CHECK_THAT(PruneCheckpoints(env.get(), "/run", 0).message(), Catch::Contains("keep at least 1"));
}

TEST_CASE("ResumeCheckpoint: latest is the authority, else the newest complete one before it") {
  std::mt19937_64 rng(testing::TestSeed() + 14);
  auto env = NewMemEnv();
  REQUIRE(env->CreateDirs("/run").ok());
  CHECK(ResumeCheckpoint(env.get(), "/run").status().code() == StatusCode::kNotFound);
  for (int step : {5, 10, 15})
    WriteCheckpoint(env.get(), "/run/step-" + std::to_string(step), rng, 1, Codec::kRaw);
  REQUIRE(env->CreateDirs("/run/step-20").ok());  // incomplete: no manifest
  // No latest (killed before the first update of it): the newest complete.
  CHECK(*ResumeCheckpoint(env.get(), "/run") == "step-15");
  // Killed between step-15's commit and latest, or rolled back: latest wins.
  REQUIRE(SetLatest(env.get(), "/run", "step-10").ok());
  CHECK(*ResumeCheckpoint(env.get(), "/run") == "step-10");
  CHECK(*ResolveCheckpointDir(env.get(), "/run") == "/run/step-10");
  // latest names one that is gone or incomplete: the newest complete one before it.
  REQUIRE(SetLatest(env.get(), "/run", "step-12").ok());
  CHECK(*ResumeCheckpoint(env.get(), "/run") == "step-10");
  REQUIRE(SetLatest(env.get(), "/run", "step-20").ok());
  CHECK(*ResumeCheckpoint(env.get(), "/run") == "step-15");
  REQUIRE(SetLatest(env.get(), "/run", "step-3").ok());
  CHECK(ResumeCheckpoint(env.get(), "/run").status().code() == StatusCode::kNotFound);
  // A name of the user's choosing is taken when it is complete.
  WriteCheckpoint(env.get(), "/run/final", rng, 1, Codec::kRaw);
  REQUIRE(SetLatest(env.get(), "/run", "final").ok());
  CHECK(*ResumeCheckpoint(env.get(), "/run") == "final");
  CHECK(*CommittedSteps(env.get(), "/run") == std::vector<std::pair<int64_t, std::string>>{
                                                  {5, "step-5"}, {10, "step-10"}, {15, "step-15"}});
}

}  // namespace
}  // namespace tessera
