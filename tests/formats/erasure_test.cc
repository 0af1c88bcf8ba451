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
        const uint64_t len = testing::Uniform(rng, 1, std::min<uint64_t>(files[i].size - at, 70000));
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

}  // namespace
}  // namespace tessera
