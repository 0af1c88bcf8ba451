#include "core/utf8.h"

#include <catch2/catch.hpp>

namespace tessera {
namespace {

TEST_CASE("UTF-8: every length round-trips; malformed bytes are named") {
  const std::u32string points = {U'a', 0xe9, 0x7ff, 0x800, 0xffff, 0x10000, 0x1d11e, 0x10ffff, 0};
  auto utf8 = EncodeUtf8(points);
  REQUIRE(utf8.ok());
  CHECK(utf8->size() == 1 + 2 + 2 + 3 + 3 + 4 + 4 + 4 + 1);
  auto back = DecodeUtf8(*utf8);
  REQUIRE(back.ok());
  CHECK(*back == points);
  CHECK(IsUtf8(""));

  for (const auto& [bytes, at] : {std::pair<std::string, int>{"ab\xc3", 2},      // truncated
                                  {"\xc0\xaf", 0},                                 // overlong '/'
                                  {"x\xe0\x80\xaf", 1},                            // overlong, 3 bytes
                                  {"\xed\xa0\x80", 0},                             // a surrogate
                                  {"\xf4\x90\x80\x80", 0},                         // past U+10FFFF
                                  {"\x80", 0},                                     // a lone continuation
                                  {"a\xe2\x28\xa1", 1},                            // a bad continuation
                                  {"\xff", 0}}) {
    INFO(bytes);
    auto r = DecodeUtf8(bytes);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("byte " + std::to_string(at)));
    CHECK_FALSE(IsUtf8(bytes));
  }
  for (char32_t c : {char32_t{0xd800}, char32_t{0xdfff}, char32_t{0x110000}}) {
    auto r = EncodeUtf8(std::u32string(1, c));
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains(std::to_string(static_cast<uint32_t>(c))));
  }
}

}  // namespace
}  // namespace tessera
