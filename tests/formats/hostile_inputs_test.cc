// Mutation fuzzing of the parsers that read untrusted bytes: a valid
// safetensors file, MindSpore .ckpt and MindSpore strategy file are damaged
// thousands of ways (bytes flipped or set to extremes, ranges zeroed,
// truncated, lengths rewritten) and each parser must answer with a value or
// an error, never crash, hang or read out of bounds. scripts/test runs this
// under ASan + UBSan, where an out-of-bounds read or a signed overflow
// fails the run. What an accepted mutant holds is checked too: every
// tensor's byte range lies inside the file.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <random>

#include "formats/mindspore_ckpt.h"
#include "formats/mindspore_strategy.h"
#include "formats/safetensors.h"
#include "tests/test_util.h"

namespace tessera {
namespace {

constexpr int kMutants = 3000;

// Whatever the process writes to stderr while alive (library code never
// prints: libprotobuf's and libhdf5's own logging must stay off).
class StderrCapture {
 public:
  StderrCapture() : file_(std::tmpfile()), saved_(dup(2)) {
    std::fflush(stderr);
    dup2(fileno(file_), 2);
  }
  ~StderrCapture() {
    Restore();
    std::fclose(file_);
  }
  std::string Restore() {
    std::fflush(stderr);
    if (saved_ >= 0) {
      dup2(saved_, 2);
      close(saved_);
      saved_ = -1;
    }
    std::string text;
    std::rewind(file_);
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, file_)) > 0;) text.append(buf, n);
    return text;
  }

 private:
  FILE* file_;
  int saved_;
};

std::string ReadAll(Env* env, const std::string& path) {
  auto s = ReadFileToString(env, path);
  REQUIRE(s.ok());
  return *s;
}

void Put(Env* env, const std::string& path, const std::string& bytes) {
  REQUIRE(WriteFileAtomically(env, path, bytes).ok());
}

// One random damage; the first `hot` bytes (the framing) are hit most.
std::string Mutate(std::string s, std::mt19937_64& rng, size_t hot) {
  auto pick = [&](size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng() % n); };
  const int damages = 1 + static_cast<int>(rng() % 3);
  for (int k = 0; k < damages; ++k) {
    if (s.empty()) break;
    const size_t focus = std::min(hot, s.size());  // s may have shrunk
    const size_t at = (rng() % 4 != 0) ? pick(focus) : pick(s.size());
    switch (rng() % 6) {
      case 0:  // a flipped bit
        s[at] = static_cast<char>(s[at] ^ (1 << (rng() % 8)));
        break;
      case 1:  // an extreme byte (varint continuation, sign bits)
        s[at] = static_cast<char>((rng() % 2) ? 0xff : 0x80);
        break;
      case 2:  // a zeroed range
        std::fill(s.begin() + at, s.begin() + std::min(s.size(), at + 1 + pick(16)), '\0');
        break;
      case 3:  // truncated
        s.resize(at);
        break;
      case 4:  // random bytes
        for (size_t i = at; i < std::min(s.size(), at + 1 + pick(8)); ++i) {
          s[i] = static_cast<char>(rng());
        }
        break;
      default:  // a duplicated range (lengths now disagree with contents)
        s.insert(at, s.substr(at, 1 + pick(32)));
        break;
    }
  }
  return s;
}

TEST_CASE("hostile inputs: mutated safetensors headers are refused or bounded") {
  auto env = NewMemEnv();
  std::vector<float> a(24, 1.5f);
  std::vector<int64_t> b = {1, -2, 3};
  REQUIRE(WriteSafetensors(env.get(), "ok.safetensors",
                           {{"a", DType::kF32, {4, 6}, a.data()},
                            {"b", DType::kI64, {3}, b.data()},
                            {"empty", DType::kF16, {0, 2}, nullptr}},
                           {{"format", "pt"}, {"tessera.step", "7"}})
              .ok());
  const std::string good = ReadAll(env.get(), "ok.safetensors");
  REQUIRE(SafetensorsFile::Open(env.get(), "ok.safetensors").ok());
  const uint64_t header_end =
      8 + (static_cast<uint8_t>(good[0]) | static_cast<uint8_t>(good[1]) << 8);
  std::mt19937_64 rng(testing::TestSeed() + 40);
  int accepted = 0;
  for (int i = 0; i < kMutants; ++i) {
    std::string bad = Mutate(good, rng, header_end);
    if (i % 10 == 0 && bad.size() >= 8) {  // a rewritten length field
      const uint64_t len = (rng() % 2) ? rng() : rng() % (bad.size() + 64);
      for (int k = 0; k < 8; ++k) bad[k] = static_cast<char>(len >> (8 * k));
    }
    Put(env.get(), "m.safetensors", bad);
    auto f = SafetensorsFile::Open(env.get(), "m.safetensors");
    if (!f.ok()) {
      CHECK_THAT(f.status().message(), Catch::Contains("m.safetensors"));
      continue;
    }
    ++accepted;
    for (const SafetensorsEntry& e : f->entries()) {
      INFO("mutant " << i << " tensor " << e.name);
      const uint64_t n = e.end - e.begin;
      CHECK(f->data_offset() + e.end <= bad.size());
      std::vector<char> buf(n);
      CHECK(f->Read(e, 0, n, buf.data()).ok());
    }
  }
  INFO(accepted << " of " << kMutants << " mutants accepted");
  CHECK(accepted < kMutants);
}

TEST_CASE("hostile inputs: mutated MindSpore .ckpt framing is refused or bounded") {
  auto env = NewMemEnv();
  std::vector<float> w(12, 0.25f);
  std::string good;
  for (const auto& [tag, dims] : {std::pair<std::string, std::vector<int64_t>>{"w", {3, 4}},
                                  {"net.bias", {12}},
                                  {"global_step", {}}}) {
    good += MindSporeRecordHeader(tag, dims, "Float32", 48);
    good.append(reinterpret_cast<const char*>(w.data()), 48);
  }
  auto note = MindSporeStringRecord("note", "h\xc3\xa9llo \xf0\x9d\x84\x9e");  // append_dict's
  REQUIRE(note.ok());
  good += *note;
  {  // a MapParameter: keys i64 [2], values f32 [2, 3], status i32 [2]
    const std::vector<MindSporeMapPart> parts = {
        {{2}, "int64", 16}, {{2, 3}, "float32", 24}, {{2}, "int32", 8}};
    const auto headers = MindSporeMapRecordHeaders("emb", parts);
    REQUIRE(headers.size() == 3);
    for (size_t k = 0; k < 3; ++k) good += headers[k] + std::string(parts[k].content_size, '\x11');
  }
  Put(env.get(), "ok.ckpt", good);
  {
    auto file = env->NewRandomAccessFile("ok.ckpt");
    REQUIRE(file.ok());
    auto scanned = ScanMindSporeCkpt(**file, "ok.ckpt");
    REQUIRE(scanned.ok());
    REQUIRE(scanned->records.size() == 5);
    const MindSporeRecord& map = scanned->records[4];
    REQUIRE(map.tag == "emb");
    REQUIRE(map.map.size() == 3);
    CHECK(map.map[1].dims == std::vector<int64_t>{2, 3});
    CHECK(map.map[1].type == "float32");
    CHECK(good.substr(map.map[2].content_offset, map.map[2].content_size) ==
          std::string(8, '\x11'));
    CHECK(map.map[2].content_offset + 8 == good.size());
    // A map record without its status is a named error.
    const std::vector<MindSporeMapPart> two = {{{1}, "int64", 8}, {{1}, "float32", 4}};
    const auto headers = MindSporeMapRecordHeaders("half", two);
    Put(env.get(), "half.ckpt",
        headers[0] + std::string(8, '\0') + headers[1] + std::string(4, '\0'));
    auto half_file = env->NewRandomAccessFile("half.ckpt");
    REQUIRE(half_file.ok());
    auto half = ScanMindSporeCkpt(**half_file, "half.ckpt");
    REQUIRE_FALSE(half.ok());
    CHECK_THAT(half.status().message(),
               Catch::Contains("half.ckpt") && Catch::Contains("'half' has 2 parts"));
    const MindSporeRecord& r = scanned->records[3];
    REQUIRE(r.type == kMindSporeStringType);
    auto text = MindSporeStringValue(good.substr(r.content_offset, r.content_size));
    REQUIRE(text.ok());
    REQUIRE(*text == "h\xc3\xa9llo \xf0\x9d\x84\x9e");
  }
  std::mt19937_64 rng(testing::TestSeed() + 41);
  int accepted = 0;
  for (int i = 0; i < kMutants; ++i) {
    const std::string bad = Mutate(good, rng, good.size());
    Put(env.get(), "m.ckpt", bad);
    auto file = env->NewRandomAccessFile("m.ckpt");
    REQUIRE(file.ok());
    (void)LooksLikeMindSporeCkpt(**file);
    auto scanned = ScanMindSporeCkpt(**file, "m.ckpt");
    if (!scanned.ok()) {
      CHECK_THAT(scanned.status().message(), Catch::Contains("m.ckpt"));
      continue;
    }
    ++accepted;
    for (const MindSporeRecord& r : scanned->records) {
      INFO("mutant " << i << " record " << r.tag);
      CHECK(r.content_offset + r.content_size <= bad.size());
      CHECK(r.tag.size() <= (64u << 10));
      for (const MindSporeRecord& part : r.map) {
        CHECK(part.content_offset + part.content_size <= bad.size());
      }
      CHECK((r.map.empty() || r.map.size() == kMindSporeMapParts));
      if (r.type == kMindSporeStringType && r.content_offset + r.content_size <= bad.size()) {
        auto text =
            MindSporeStringValue(std::string_view(bad).substr(r.content_offset, r.content_size));
        if (text.ok()) CHECK(text->size() <= 4 * r.content_size);
      }
    }
  }
  INFO(accepted << " of " << kMutants << " mutants accepted");
  CHECK(accepted < kMutants);
}

TEST_CASE("hostile inputs: mutated MindSpore strategy files are refused or read") {
  auto env = NewMemEnv();
  MindSporeStrategyFile s;
  s.current_stage = 0;
  s.params.push_back({"w", {{2, 4}, {{1}, {0}}, 0, 0}, {}, 0});
  s.params.push_back({"net.bias", {{8}, {{0}}, 1, 2}, {}, 0});
  REQUIRE(WriteMindSporeStrategy(env.get(), "ok.strategy", s).ok());
  REQUIRE(ReadMindSporeStrategy(env.get(), "ok.strategy").ok());
  const std::string good = ReadAll(env.get(), "ok.strategy");
  std::mt19937_64 rng(testing::TestSeed() + 42);
  int accepted = 0, unnamed = 0;
  StderrCapture capture;
  for (int i = 0; i < kMutants; ++i) {
    Put(env.get(), "m.strategy", Mutate(good, rng, good.size()));
    (void)IsMindSporeStrategyFile(env.get(), "m.strategy");
    auto read = ReadMindSporeStrategy(env.get(), "m.strategy");
    if (!read.ok()) {
      if (read.status().message().find("m.strategy") == std::string::npos) ++unnamed;
      continue;
    }
    ++accepted;
  }
  const std::string printed = capture.Restore();
  CHECK(printed == "");  // the parse failures were not logged
  CHECK(unnamed == 0);
  INFO(accepted << " of " << kMutants << " mutants accepted");
  CHECK(accepted < kMutants);
}

}  // namespace
}  // namespace tessera
