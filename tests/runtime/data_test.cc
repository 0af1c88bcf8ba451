#include "runtime/data.h"

#include <numeric>
#include <set>

#include <catch2/catch.hpp>

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
    a->NextBatch(in.data(), tg.data());
    for (int b = 0; b < 2; ++b) {
      starts.insert(in[b * 10]);
      first_epoch.push_back(in[b * 10]);
      for (int t = 0; t < 10; ++t) REQUIRE(tg[b * 10 + t] == in[b * 10 + t] + 1);
    }
  }
  CHECK(starts.size() == 10);  // each window exactly once
  CHECK(first_epoch != std::vector<int32_t>({0, 10, 20, 30, 40, 50, 60, 70, 80, 90}));
  // Restoring a position continues exactly as the original does.
  a->NextBatch(in.data(), tg.data());  // rolls into epoch 1
  CHECK(a->position().ToString() == "1:2");
  auto b = TokenLoader::Create(tokens, 2, 10, 7);
  REQUIRE(b->Restore(*DataPosition::Parse("1:2")).ok());
  std::vector<int32_t> in2(20), tg2(20);
  for (int i = 0; i < 7; ++i) {
    a->NextBatch(in.data(), tg.data());
    b->NextBatch(in2.data(), tg2.data());
    REQUIRE(in == in2);
  }
  CHECK_FALSE(DataPosition::Parse("1-2").ok());
  CHECK_FALSE(b->Restore({0, 11}).ok());
  CHECK_FALSE(TokenLoader::Create(std::vector<int32_t>(15), 2, 10, 1).ok());
}

}  // namespace
}  // namespace tessera
