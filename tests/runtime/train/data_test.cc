#include "runtime/train/data.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>
#include <set>

namespace tessera {
namespace {

TEST_CASE("TokenLoader: shuffled windows, every window once per epoch, restorable") {
  std::vector<int32_t> tokens(101);
  std::iota(tokens.begin(), tokens.end(), 0);
  auto a = TokenLoader::Create(tokens, 2, 10, 7);
  REQUIRE(a.ok());
  CHECK(a->windows() == 10);
  std::vector<int32_t> in(20), tg(20);
  std::set<int32_t> starts;
  std::vector<int32_t> first_epoch;
  for (int i = 0; i < 5; ++i) {
    REQUIRE(a->NextBatch(in.data(), tg.data()).ok());
    for (int b = 0; b < 2; ++b) {
      starts.insert(in[b * 10]);
      first_epoch.push_back(in[b * 10]);
      for (int t = 0; t < 10; ++t) REQUIRE(tg[b * 10 + t] == in[b * 10 + t] + 1);
    }
  }
  CHECK(starts.size() == 10);  // each window exactly once
  CHECK(first_epoch != std::vector<int32_t>({0, 10, 20, 30, 40, 50, 60, 70, 80, 90}));
  // Restoring a position continues exactly as the original does.
  REQUIRE(a->NextBatch(in.data(), tg.data()).ok());  // rolls into epoch 1
  CHECK(a->position().ToString() == "1:2");
  auto b = TokenLoader::Create(tokens, 2, 10, 7);
  REQUIRE(b->Restore(*DataPosition::Parse("1:2")).ok());
  std::vector<int32_t> in2(20), tg2(20);
  for (int i = 0; i < 7; ++i) {
    REQUIRE(a->NextBatch(in.data(), tg.data()).ok());
    REQUIRE(b->NextBatch(in2.data(), tg2.data()).ok());
    REQUIRE(in == in2);
  }
  CHECK_FALSE(DataPosition::Parse("1-2").ok());
  CHECK_FALSE(b->Restore({0, 11}).ok());
  CHECK_FALSE(TokenLoader::Create(std::vector<int32_t>(15), 2, 10, 1).ok());
}

TEST_CASE("TokenLoader: a replica's rows of each batch, read alone, across epochs") {
  std::vector<int32_t> tokens(101);
  for (int i = 0; i < 101; ++i) tokens[i] = i;
  auto whole = TokenLoader::Create(tokens, 4, 5, 3);  // 20 windows: 5 batches an epoch
  REQUIRE(whole.ok());
  std::vector<TokenLoader> replicas;
  for (int r = 0; r < 2; ++r) replicas.push_back(*TokenLoader::Create(tokens, 4, 5, 3));
  for (int step = 0; step < 12; ++step) {
    std::vector<int32_t> in(20), target(20);
    REQUIRE(whole->NextBatch(in.data(), target.data()).ok());
    for (int r = 0; r < 2; ++r) {
      std::vector<int32_t> rin(10), rtarget(10);
      REQUIRE(replicas[r].NextBatchRows(2 * r, 2, rin.data(), rtarget.data()).ok());
      CHECK(rin == std::vector<int32_t>(in.begin() + 10 * r, in.begin() + 10 * (r + 1)));
      CHECK(rtarget ==
            std::vector<int32_t>(target.begin() + 10 * r, target.begin() + 10 * (r + 1)));
      CHECK(replicas[r].position().ToString() == whole->position().ToString());
    }
  }
  std::vector<int32_t> x(20);
  CHECK_THAT(replicas[0].NextBatchRows(3, 2, x.data(), x.data()).message(),
             Catch::Contains("rows [3, 5) are not inside a batch of 4"));
}

TEST_CASE("token files: uint16 and uint32, read on demand, same batches as in memory") {
  std::unique_ptr<Env> env = NewMemEnv();
  for (int32_t top : {50256, 128255}) {  // GPT-2's and Llama 3's last token
    std::vector<int32_t> tokens(1001);
    for (size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = static_cast<int32_t>(i * 7919 % (top + 1));
    tokens[500] = top;
    const std::string path = "/tok-" + std::to_string(top) + ".bin";
    REQUIRE(WriteTokenFile(env.get(), path, tokens).ok());
    const int width = top < 65536 ? 2 : 4;
    CHECK(*env->GetFileSize(path) == static_cast<uint64_t>(kTokenFileHeaderBytes + 1001 * width));
    auto source = OpenTokens(env.get(), path);  // recognised by content
    REQUIRE(source.ok());
    CHECK((*source)->size() == 1001);
    CHECK_THAT((*source)->Describe(), Catch::Contains(width == 2 ? "uint16" : "uint32"));
    auto from_file = TokenLoader::Create(std::move(*source), 4, 16, 3);
    auto from_memory = TokenLoader::Create(tokens, 4, 16, 3);
    REQUIRE(from_file.ok());
    std::vector<int32_t> a(64), at(64), b(64), bt(64);
    for (int i = 0; i < 40; ++i) {  // past an epoch of 62 windows
      REQUIRE(from_file->NextBatch(a.data(), at.data()).ok());
      REQUIRE(from_memory->NextBatch(b.data(), bt.data()).ok());
      REQUIRE(a == b);
      REQUIRE(at == bt);
    }
  }
  // Text stays text: one token per byte.
  REQUIRE(WriteFileAtomically(env.get(), "/text.txt", std::string_view("hello")).ok());
  auto text = OpenTokens(env.get(), "/text.txt");
  REQUIRE(text.ok());
  std::vector<int32_t> t(5);
  REQUIRE((*text)->Read(0, 5, t.data()).ok());
  CHECK(t == std::vector<int32_t>({'h', 'e', 'l', 'l', 'o'}));
  CHECK((*text)->Read(3, 3, t.data()).code() == StatusCode::kOutOfRange);
  CHECK_FALSE(WriteTokenFile(env.get(), "/neg.bin", std::vector<int32_t>{1, -2}).ok());
}

TEST_CASE("token files: damaged headers and sizes are named") {
  std::unique_ptr<Env> env = NewMemEnv();
  REQUIRE(WriteTokenFile(env.get(), "/good.bin", std::vector<int32_t>(100, 5)).ok());
  auto good = *ReadFileToString(env.get(), "/good.bin");
  auto expect = [&](const std::string& bytes, const char* what) {
    REQUIRE(WriteFileAtomically(env.get(), "/bad.bin", bytes).ok());
    auto r = OpenTokens(env.get(), "/bad.bin");
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("/bad.bin") && Catch::Contains(what));
  };
  expect(good.substr(0, good.size() - 1), "has 1223 bytes");  // truncated
  expect(good + "xx", "has 1226 bytes");                      // trailing bytes
  std::string version = good;
  int32_t v = 7;
  std::memcpy(version.data() + 4, &v, 4);
  expect(version, "unknown version 7");
  std::string count = good;
  int32_t huge = 2000000000;
  std::memcpy(count.data() + 8, &huge, 4);
  expect(count, "2000000000 tokens");
  std::string negative = good;
  int32_t minus = -1;
  std::memcpy(negative.data() + 8, &minus, 4);
  expect(negative, "-1 tokens");
  // uint32 tokens beyond int32 are refused when read.
  std::string wide(kTokenFileHeaderBytes + 8, '\0');
  const int32_t header[3] = {kTokenFileMagic, 2, 2};
  std::memcpy(wide.data(), header, sizeof(header));
  const uint32_t tokens[2] = {3, 0xFFFFFFF0u};
  std::memcpy(wide.data() + kTokenFileHeaderBytes, tokens, sizeof(tokens));
  REQUIRE(WriteFileAtomically(env.get(), "/wide.bin", wide).ok());
  auto source = OpenTokenFile(env.get(), "/wide.bin");
  REQUIRE(source.ok());
  std::vector<int32_t> out(2);
  const Status s = (*source)->Read(0, 2, out.data());
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK_THAT(s.message(), Catch::Contains("token 1") && Catch::Contains("4294967280"));
  CHECK_FALSE(OpenTokenFile(env.get(), "/good.bin.missing").ok());
  REQUIRE(WriteFileAtomically(env.get(), "/short.bin", std::string_view("abc")).ok());
  CHECK_THAT(OpenTokenFile(env.get(), "/short.bin").status().message(),
             Catch::Contains("shorter than the 1024-byte header"));
}

}  // namespace
}  // namespace tessera
