// Mutation test of torch.save files written by PyTorch 1.13
// (tests/data/torch, make_fixtures.py): thousands of damaged copies (a bit
// flipped, a byte set, a range zeroed, the file cut short), opened and read
// whole. Whatever the damage: no crash (scripts/test runs this under ASan +
// UBSan too), every error names the file and is printable, and in the zip
// format, whose records carry CRC-32s, a read either fails or returns the
// bytes PyTorch wrote under the names it wrote. The legacy format has no
// checksums: there only the absence of crashes and the errors are checked.
// The synthesized DeepSpeed and Megatron directories (tests/data/deepspeed,
// tests/data/megatron) and a DCP directory written by PyTorch 1.13
// (tests/data/dcp) are damaged one file at a time the same ways.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "ckpt/inspect.h"
#include "ckpt/ops.h"
#include "core/utf8.h"
#include "tests/test_util.h"

namespace tessera {
namespace {

std::string FromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  }
  return out;
}

// Printable UTF-8, lines allowed: what a terminal may be shown.
bool Printable(const std::string& s) {
  if (!IsUtf8(s)) return false;
  for (unsigned char c : s) {
    if ((c < 0x20 && c != '\n') || c == 0x7f) return false;
  }
  return true;
}

// The values PyTorch wrote, by name.
// The bytes a fixture's writer wrote, by tensor name (a values .json).
std::map<std::string, std::string> Expected(const std::string& json = TESSERA_TEST_DATA
                                            "/torch/small.json") {
  auto text = ReadFileToString(Env::Default(), json);
  REQUIRE(text.ok());
  std::map<std::string, std::string> out;
  const nlohmann::json values = nlohmann::json::parse(*text);
  for (auto& [name, v] : values.items()) {
    out[name] = FromHex(v["hex"].get<std::string>());
  }
  return out;
}

void CheckFixtureReads(const std::string& path, const std::map<std::string, std::string>& want,
                       int64_t step = 42) {
  auto reader = OpenCheckpoint(Env::Default(), path);
  REQUIRE(reader.ok());
  REQUIRE((*reader)->strategy().tensors().size() == want.size());
  CHECK((*reader)->meta().step == step);
  for (const auto& [name, bytes] : want) {
    auto index = FindTensor(**reader, name);
    REQUIRE(index.ok());
    std::string got(bytes.size(), '\0');
    REQUIRE(ReadTensor(**reader, *index, got.data()).ok());
    CHECK(got == bytes);
  }
}

TEST_CASE("the torch.save fixtures read as PyTorch wrote them") {
  const auto want = Expected();
  CheckFixtureReads(TESSERA_TEST_DATA "/torch/small.pt", want);
  CheckFixtureReads(TESSERA_TEST_DATA "/torch/small-legacy.pt", want);
}

std::string Mutate(const std::string& good, std::mt19937_64& rng) {
  std::string bad = good;
  const int kind = static_cast<int>(testing::Uniform(rng, 0, 8));
  const size_t at = testing::Uniform(rng, 0, good.size() - 1);
  if (kind <= 4) {
    bad[at] ^= static_cast<char>(1 << testing::Uniform(rng, 0, 7));
  } else if (kind <= 6) {
    bad[at] = static_cast<char>(rng());
  } else if (kind == 7) {
    std::memset(bad.data() + at, 0,
                std::min<size_t>(good.size() - at, testing::Uniform(rng, 1, 64)));
  } else {
    bad.resize(at);
  }
  return bad;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");  // no fsync: thousands of mutants
  REQUIRE(f);
  REQUIRE(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
  REQUIRE(std::fclose(f) == 0);
}

struct MutantCounts {
  int opened = 0;
  int refused = 0;
  int failed_reads = 0;
};

// Opens the damaged checkpoint at `path` and reads every tensor whole: no
// crash, errors printable and naming a file under `dir`, and, given
// `want`, every read that succeeds returns the bytes written under its
// name.
void CheckMutant(const std::string& path, const std::string& dir,
                 const std::map<std::string, std::string>* want, MutantCounts* n) {
  auto reader = OpenCheckpoint(Env::Default(), path);
  if (!reader.ok()) {
    ++n->refused;
    CHECK(Printable(reader.status().message()));
    CHECK(reader.status().message().find(dir) != std::string::npos);
    return;
  }
  ++n->opened;
  CHECK(Printable(InspectText(**reader)));
  for (size_t i = 0; i < (*reader)->strategy().tensors().size(); ++i) {
    const TensorStrategy& t = (*reader)->strategy().tensors()[i];
    std::string got(ByteSize(t.layout), '\0');
    Status s = ReadTensor(**reader, i, got.data());
    if (!s.ok()) {
      ++n->failed_reads;
      CHECK(Printable(s.message()));
      CHECK(s.message().find(dir) != std::string::npos);
    } else if (want) {
      auto w = want->find(t.name);
      REQUIRE(w != want->end());
      CHECK(got == w->second);
    }
  }
}

TEST_CASE("mutated torch.save files never crash, and zip files never read other values") {
  const auto want = Expected();
  Env* env = Env::Default();
  testing::TempDir tmp;
  std::mt19937_64 rng(testing::TestSeed() + 39);
  const int mutants = testing::TestIterations(2000);
  for (const char* fixture : {"small.pt", "small-legacy.pt"}) {
    const bool zip = std::string(fixture) == "small.pt";
    auto good = ReadFileToString(env, std::string(TESSERA_TEST_DATA "/torch/") + fixture);
    REQUIRE(good.ok());
    const std::string path = JoinPath(tmp.path, fixture);
    MutantCounts n;
    for (int it = 0; it < mutants; ++it) {
      INFO(fixture << " mutant " << it);
      WriteFile(path, Mutate(*good, rng));
      CheckMutant(path, tmp.path, zip ? &want : nullptr, &n);
    }
    CHECK(n.opened > 0);
    CHECK(n.refused > 0);
    if (zip) CHECK(n.failed_reads > 0);
  }
}

// Every tensor's bytes of a DeepSpeed fixture (values.json).
std::map<std::string, std::string> DeepSpeedExpected(const std::string& fixture) {
  auto text = ReadFileToString(Env::Default(), TESSERA_TEST_DATA "/deepspeed/values.json");
  REQUIRE(text.ok());
  std::map<std::string, std::string> out;
  const nlohmann::json all = nlohmann::json::parse(*text);
  for (auto& [name, v] : all.at(fixture).items()) {
    out[name] = FromHex(v["hex"].get<std::string>());
  }
  return out;
}

TEST_CASE("the DeepSpeed fixtures read as zero_to_fp32 reassembles them") {
  for (const char* fixture : {"zero2", "zero3"}) {
    INFO(fixture);
    CheckFixtureReads(std::string(TESSERA_TEST_DATA "/deepspeed/") + fixture,
                      DeepSpeedExpected(fixture), 7);
  }
}

// Damages the checkpoint directory `src` (its files `names`) one file at a
// time, a copy under `tmp`, checking every mutant (CheckMutant).
void MutateDirectory(const std::string& src, const std::vector<std::string>& names,
                     const std::map<std::string, std::string>& want, const std::string& tmp,
                     std::mt19937_64& rng) {
  Env* env = Env::Default();
  const std::string dir = JoinPath(tmp, "ck");
  std::map<std::string, std::string> good;
  for (const std::string& n : names) {
    auto bytes = ReadFileToString(env, JoinPath(src, n));
    REQUIRE(bytes.ok());
    good[n] = *bytes;
    REQUIRE(env->CreateDirs(JoinPath(dir, n.substr(0, n.find_last_of('/') + 1))).ok());
    WriteFile(JoinPath(dir, n), *bytes);
  }
  MutantCounts count;
  for (int it = 0; it < testing::TestIterations(1000); ++it) {
    const std::string& victim = names[testing::Uniform(rng, 0, names.size() - 1)];
    INFO(src << " mutant " << it << " of " << victim);
    WriteFile(JoinPath(dir, victim), Mutate(good[victim], rng));
    CheckMutant(dir, tmp, &want, &count);
    WriteFile(JoinPath(dir, victim), good[victim]);
  }
  CHECK(count.opened > 0);
  CHECK(count.refused > 0);
  CHECK(count.failed_reads > 0);
}

TEST_CASE("mutated DeepSpeed files never crash, and never read other values") {
  testing::TempDir tmp;
  std::mt19937_64 rng(testing::TestSeed() + 3939);
  for (const char* fixture : {"zero2", "zero3"}) {
    const std::string src = std::string(TESSERA_TEST_DATA "/deepspeed/") + fixture;
    auto files = Env::Default()->GetChildren(JoinPath(src, "global_step7"));
    REQUIRE(files.ok());
    std::vector<std::string> names = {"latest"};
    for (const std::string& f : *files) names.push_back(JoinPath("global_step7", f));
    MutateDirectory(src, names, DeepSpeedExpected(fixture), tmp.path, rng);
  }
}

TEST_CASE(
    "the DCP fixture (torch 1.13, two gloo processes) reads as written, and mutants "
    "never crash or read other values") {
  const std::string src = TESSERA_TEST_DATA "/dcp/small";
  const auto want = Expected(TESSERA_TEST_DATA "/dcp/values.json");
  CheckFixtureReads(src, want, 0);
  testing::TempDir tmp;
  std::mt19937_64 rng(testing::TestSeed() + 4039);
  MutateDirectory(src, {".metadata", "__0_0.distcp", "__1_0.distcp"}, want, tmp.path, rng);
}

TEST_CASE(
    "the Megatron fixture merges into the unsharded model, and mutants never crash or "
    "read other values") {
  const std::string src = TESSERA_TEST_DATA "/megatron/tp2pp2";
  const auto want = Expected(TESSERA_TEST_DATA "/megatron/values.json");
  CheckFixtureReads(src, want, 100);
  std::vector<std::string> names = {"latest_checkpointed_iteration.txt"};
  for (const char* rank :
       {"mp_rank_00_000", "mp_rank_01_000", "mp_rank_00_001", "mp_rank_01_001"}) {
    names.push_back(std::string("iter_0000100/") + rank + "/model_optim_rng.pt");
  }
  testing::TempDir tmp;
  std::mt19937_64 rng(testing::TestSeed() + 4539);
  MutateDirectory(src, names, want, tmp.path, rng);
}

}  // namespace
}  // namespace tessera
