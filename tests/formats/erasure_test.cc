// Reed-Solomon groups (formats/erasure.h): for rs:4+2 and rs:8+3, every
// subset of at most M lost files of a group (members of different sizes,
// and parity files) is rebuilt bit for bit from the others, whole and by
// random byte ranges; M + 1 losses are refused, naming the file.
#include "formats/erasure.h"

#include <catch2/catch.hpp>
#include <random>

#include "core/checksum.h"
#include "tests/test_util.h"

namespace tessera {
namespace {

TEST_CASE("rs:K+M parses and refuses what GF(2^8) cannot hold") {
  auto c = ErasureCode::Parse("rs:8+3");
  REQUIRE(c.ok());
  CHECK(c->k == 8);
  CHECK(c->m == 3);
  CHECK(c->ToString() == "rs:8+3");
  for (const char* bad : {"rs:0+2", "rs:4+0", "rs:250+6", "rs:4", "rs:4+2x", "parity:4", "rs:+2"}) {
    INFO(bad);
    CHECK_FALSE(ErasureCode::Parse(bad).ok());
  }
}

TEST_CASE("Reed-Solomon groups rebuild any M lost files bit for bit") {
  const std::string spec = GENERATE(std::string("rs:4+2"), std::string("rs:8+3"));
  const ErasureCode code = *ErasureCode::Parse(spec);
  std::mt19937_64 rng(testing::TestSeed() + 101 + code.k);
  auto env = NewMemEnv();
  REQUIRE(env->CreateDirs("/g").ok());
  const size_t n = static_cast<size_t>(code.k + code.m);
  std::vector<std::string> bytes(n);
  std::vector<ParityMember> files(n);
  uint64_t longest = 0;
  for (int i = 0; i < code.k; ++i) {
    // Different sizes, one empty, some over a 1 MiB step.
    const uint64_t size = i == 1 ? 0 : testing::Uniform(rng, 1, (3 << 20) + 5);
    bytes[i].resize(size);
    for (char& c : bytes[i]) c = static_cast<char>(rng());
    files[i] = {"/g/member-" + std::to_string(i), size};
    REQUIRE(WriteFileAtomically(env.get(), files[i].path, bytes[i]).ok());
    longest = std::max(longest, size);
  }
  std::vector<std::string> parity_paths;
  for (int j = 0; j < code.m; ++j) parity_paths.push_back("/g/parity-" + std::to_string(j));
  std::vector<uint64_t> checksums;
  std::vector<ParityMember> members(files.begin(), files.begin() + code.k);
  REQUIRE(WriteErasureParity(env.get(), code, members, parity_paths, &checksums).ok());
  REQUIRE(checksums.size() == static_cast<size_t>(code.m));
  for (int j = 0; j < code.m; ++j) {
    auto s = ReadFileToString(env.get(), parity_paths[j]);
    REQUIRE(s.ok());
    CHECK(s->size() == longest);
    CHECK(Xxh3(s->data(), s->size()) == checksums[j]);
    bytes[code.k + j] = *s;
    files[code.k + j] = {parity_paths[j], longest};
  }

  int subsets = 0;
  for (uint32_t mask = 1; mask < (1u << n); ++mask) {
    const int lost = __builtin_popcount(mask);
    if (lost > code.m) continue;
    ++subsets;
    std::vector<bool> good(n);
    for (size_t i = 0; i < n; ++i) good[i] = !(mask & (1u << i));
    for (size_t i = 0; i < n; ++i) {
      if (good[i]) continue;
      INFO(spec << ": lost mask " << mask << ", rebuilding file " << i);
      auto rebuilt = OpenErasureRebuild(env.get(), code, files, good, i);
      REQUIRE(rebuilt.ok());
      REQUIRE(*(*rebuilt)->Size() == files[i].size);
      // Whole (for a few subsets; each rebuild reads K files) and by ranges.
      if (subsets % 7 == 1) {
        std::string whole(files[i].size, '\0');
        REQUIRE((*rebuilt)->Read(0, whole.size(), whole.data()).ok());
        REQUIRE(whole == bytes[i]);
      }
      for (int r = 0; r < 3 && files[i].size > 0; ++r) {
        const uint64_t at = testing::Uniform(rng, 0, files[i].size - 1);
        const uint64_t len =
            testing::Uniform(rng, 1, std::min<uint64_t>(files[i].size - at, 70000));
        std::string part(len, '\0');
        REQUIRE((*rebuilt)->Read(at, len, part.data()).ok());
        REQUIRE(part == bytes[i].substr(at, len));
      }
    }
  }
  CHECK(subsets > 0);
  // M + 1 lost: refused, naming the file.
  std::vector<bool> good(n, true);
  for (int i = 0; i <= code.m; ++i) good[i] = false;
  auto refused = OpenErasureRebuild(env.get(), code, files, good, 0);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().message().find("/g/member-0") != std::string::npos);
  CHECK(refused.status().message().find(spec) != std::string::npos);
}

TEST_CASE("parity from members on disk (read in place, window by window) equals the buffered one") {
  // On disk the members are mapped 8 MiB at a time; in memory they are
  // read through buffers: the same parity files, the one row each rank
  // writes included.
  const ErasureCode code = *ErasureCode::Parse("rs:3+2");
  std::mt19937_64 rng(testing::TestSeed() + 7);
  testing::TempDir dir;
  auto mem = NewMemEnv();
  REQUIRE(mem->CreateDirs("/g").ok());
  std::vector<ParityMember> on_disk, in_memory;
  for (int i = 0; i < code.k; ++i) {
    // Past two windows and a step, not a multiple of either; one short.
    const uint64_t size = i == 2 ? 5000 : (17 << 20) + testing::Uniform(rng, 1, 99999);
    std::string bytes(size, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    const std::string name = "/member-" + std::to_string(i);
    REQUIRE(WriteFileAtomically(Env::Default(), dir.path + name, bytes).ok());
    REQUIRE(WriteFileAtomically(mem.get(), "/g" + name, bytes).ok());
    on_disk.push_back({dir.path + name, size});
    in_memory.push_back({"/g" + name, size});
  }
  std::vector<uint64_t> disk_sums, mem_sums, row_sums;
  REQUIRE(WriteErasureParity(Env::Default(), code, on_disk, {dir.path + "/p0", dir.path + "/p1"},
                             &disk_sums)
              .ok());
  REQUIRE(WriteErasureParity(mem.get(), code, in_memory, {"/g/p0", "/g/p1"}, &mem_sums).ok());
  CHECK(disk_sums == mem_sums);
  for (int j = 0; j < 2; ++j) {
    const std::string p = "/p" + std::to_string(j);
    CHECK(*ReadFileToString(Env::Default(), dir.path + p) ==
          *ReadFileToString(mem.get(), "/g" + p));
  }
  // Row 1 alone, as the rank that writes only parity file 1.
  REQUIRE(
      WriteErasureParityRows(Env::Default(), code, on_disk, {1}, {dir.path + "/row1"}, &row_sums)
          .ok());
  REQUIRE(row_sums.size() == 1);
  CHECK(row_sums[0] == disk_sums[1]);
  CHECK_FALSE(
      WriteErasureParityRows(Env::Default(), code, on_disk, {2}, {dir.path + "/x"}, &row_sums)
          .ok());
}

}  // namespace
}  // namespace tessera
