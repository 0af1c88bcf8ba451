// Native checkpoints with Reed-Solomon groups (--redundancy rs:K+M): for
// rs:4+2 and rs:8+3, every subset of at most M lost or corrupted files of a
// group (data or parity files) still reads bit for bit and is rebuilt bit
// for bit by verify --repair; M + 1 losses are refused, naming the files.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <random>

#include "ckpt/native.h"
#include "ckpt/ops.h"
#include "ckpt/repair.h"
#include "formats/native_files.h"
#include "tests/test_util.h"

namespace tessera {
namespace {

TEST_CASE("rs:K+M checkpoints read and repair any M lost or corrupt files of a group") {
  const std::string spec = GENERATE(std::string("rs:4+2"), std::string("rs:8+3"));
  Env* env = Env::Default();
  testing::TempDir tmp;
  std::mt19937_64 rng(testing::TestSeed() + 211);
  // Eight data files (tp = 8), tensors of uneven sizes so files differ.
  Strategy whole(*Mesh::Create({"r"}, {1}));
  Strategy sliced(*Mesh::Create({"tp"}, {8}));
  std::vector<std::vector<char>> values;
  for (int i = 0; i < 6; ++i) {
    const std::vector<int64_t> shape{8 * (3 + 5 * i), 7 + i};
    Layout l = Layout::Replicated(shape, DType::kF32);
    REQUIRE(whole.Add({"t" + std::to_string(i), l, {}}).ok());
    l.dim_axes = {{"tp"}, {}};
    if (i == 5) l.dim_axes = {};  // replicated: one rank writes it
    REQUIRE(sliced.Add({"t" + std::to_string(i), l, {}}).ok());
    values.emplace_back(static_cast<size_t>(ByteSize(l)));
    for (char& c : values.back()) c = static_cast<char>(rng());
  }
  const std::string full = JoinPath(tmp.path, "full"), dir = JoinPath(tmp.path, "rs");
  {
    auto w = CreateNativeCheckpoint(env, full, whole, {}, {});
    REQUIRE(w.ok());
    for (size_t i = 0; i < values.size(); ++i) {
      REQUIRE(
          (*w)->WritePiece(i, 0, Box::FromShape(whole.tensors()[i].layout.shape), values[i].data())
              .ok());
    }
    REQUIRE((*w)->Commit().ok());
    auto src = OpenCheckpoint(env, full);
    REQUIRE(src.ok());
    WriteOptions o;
    REQUIRE(ParseRedundancy(spec, &o.native).ok());
    REQUIRE(WriteTransformed(env, **src, sliced, dir, o).ok());
  }
  auto m = ReadManifest(env, dir);
  REQUIRE(m.ok());
  REQUIRE_FALSE(m->erasure_groups.empty());
  const ErasureGroup& g = m->erasure_groups[0];
  const ErasureCode code = *ErasureCode::Parse(spec);
  REQUIRE(g.members.size() == static_cast<size_t>(code.k));
  REQUIRE(g.parity.size() == static_cast<size_t>(code.m));
  std::vector<uint32_t> group = g.members;
  group.insert(group.end(), g.parity.begin(), g.parity.end());
  std::map<uint32_t, std::string> pristine;
  for (uint32_t f : group) {
    pristine[f] = *ReadFileToString(env, JoinPath(dir, m->files[f].name));
  }

  auto read_all = [&]() -> Status {
    ASSIGN_OR_RETURN(auto reader, OpenCheckpoint(env, dir));
    for (size_t i = 0; i < values.size(); ++i) {
      std::vector<char> buf(values[i].size());
      RETURN_IF_ERROR(ReadTensor(*reader, i, buf.data()));
      if (std::memcmp(buf.data(), values[i].data(), buf.size()) != 0) {
        return DataLossError("tensor " + std::to_string(i) + " read wrong");
      }
    }
    return Status::Ok();
  };
  const size_t n = group.size();
  int subsets = 0;
  for (uint32_t mask = 1; mask < (1u << n); ++mask) {
    const int lost = __builtin_popcount(mask);
    if (lost > code.m + 1) continue;
    // Lose some files, corrupt the others (one byte, inside a piece or
    // padding alike: the whole-file checksum finds it).
    std::string damaged;
    for (size_t i = 0; i < n; ++i) {
      if (!(mask & (1u << i))) continue;
      const std::string path = JoinPath(dir, m->files[group[i]].name);
      damaged += " " + m->files[group[i]].name;
      // M + 1 are all deleted: a corrupt file whose damage lies outside its
      // pieces is rebuilt from its own pieces, so it would not count.
      if ((i + mask) % 2 == 0 || lost > code.m) {
        REQUIRE(env->DeleteFile(path).ok());
      } else {
        std::string bad = pristine[group[i]];
        bad[testing::Uniform(rng, 0, bad.size() - 1)] ^= 0x5a;
        REQUIRE(WriteFileAtomically(env, path, bad).ok());
      }
    }
    INFO(spec << ": damaged" << damaged);
    auto fixed = RepairNativeCheckpoint(env, dir, {});
    REQUIRE(fixed.ok());
    if (lost <= code.m) {
      ++subsets;
      REQUIRE(fixed->ok());
      for (uint32_t f : group) {
        REQUIRE(*ReadFileToString(env, JoinPath(dir, m->files[f].name)) == pristine[f]);
      }
    } else {
      CHECK_FALSE(fixed->ok());  // M + 1: refused, naming what cannot be rebuilt
      REQUIRE_FALSE(fixed->failed.empty());
      CHECK(fixed->failed[0].find("cannot be rebuilt") != std::string::npos);
      for (uint32_t f : group) {  // put it back for the next subset
        REQUIRE(WriteFileAtomically(env, JoinPath(dir, m->files[f].name), pristine[f]).ok());
      }
    }
  }
  CHECK(subsets == (code.m == 2 ? 21 : 231));
  // Reads go through the group without any repair.
  for (uint32_t mask : {0x3u, 0x5u, (1u << (n - 1)) | 1u}) {
    for (size_t i = 0; i < n; ++i) {
      if (mask & (1u << i)) REQUIRE(env->DeleteFile(JoinPath(dir, m->files[group[i]].name)).ok());
    }
    INFO(spec << ": reading with lost files, mask " << mask);
    CHECK(read_all().ok());
    for (uint32_t f : group) {
      REQUIRE(WriteFileAtomically(env, JoinPath(dir, m->files[f].name), pristine[f]).ok());
    }
  }
}

}  // namespace
}  // namespace tessera
