#include "core/utf8.h"

#include <catch2/catch.hpp>
#include <random>
#include <string>

#include "tests/test_util.h"

namespace tessera {
namespace {

TEST_CASE("UTF-8: every length round-trips, malformed bytes are named") {
  const std::u32string points = {U'a', 0xe9, 0x7ff, 0x800, 0xffff, 0x10000, 0x1d11e, 0x10ffff, 0};
  auto utf8 = EncodeUtf8(points);
  REQUIRE(utf8.ok());
  CHECK(utf8->size() == 1 + 2 + 2 + 3 + 3 + 4 + 4 + 4 + 1);
  auto back = DecodeUtf8(*utf8);
  REQUIRE(back.ok());
  CHECK(*back == points);
  CHECK(IsUtf8(""));

  for (const auto& [bytes, at] : {std::pair<std::string, int>{"ab\xc3", 2},  // truncated
                                  {"\xc0\xaf", 0},                           // overlong '/'
                                  {"x\xe0\x80\xaf", 1},                      // overlong, 3 bytes
                                  {"\xed\xa0\x80", 0},                       // a surrogate
                                  {"\xf4\x90\x80\x80", 0},                   // past U+10FFFF
                                  {"\x80", 0},                               // a lone continuation
                                  {"a\xe2\x28\xa1", 1},                      // a bad continuation
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

TEST_CASE("PrintableText escapes what is not printable UTF-8, idempotently") {
  CHECK(PrintableText("h.0.attn.c_attn.bias") == "h.0.attn.c_attn.bias");
  CHECK(PrintableText("caf\xc3\xa9 \xe6\x97\xa5") ==
        "caf\xc3\xa9 \xe6\x97\xa5");  // printable UTF-8 kept
  CHECK(PrintableText(std::string("a\x01"
                                  "b\x1b[31m\x7f",
                                  9)) == "a\\x01b\\x1b[31m\\x7f");
  CHECK(PrintableText("line\nfeed\ttab\rret") == "line\\nfeed\\ttab\\rret");
  CHECK(PrintableText("bad \xff\xfe end \xc3") == "bad \\xff\\xfe end \\xc3");
  CHECK(PrintableText("\xc2\x85 C1") == "\\u{85} C1");                            // NEL
  CHECK(PrintableText("rtl \xe2\x80\xae override") == "rtl \\u{202e} override");  // bidi
  CHECK(PrintableText("\xed\xa0\x80") == "\\xed\\xa0\\x80");                      // a surrogate
  std::mt19937_64 rng(testing::TestSeed() + 91);
  for (int i = 0; i < 2000; ++i) {
    std::string s(rng() % 24, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    const std::string p = PrintableText(s);
    REQUIRE(IsUtf8(p));
    for (unsigned char c : p) REQUIRE((c >= 0x20 && c != 0x7f));
    REQUIRE(PrintableText(p) == p);
  }
}

TEST_CASE("Status messages are kept printable") {
  Status s = DataLossError(std::string("tensor 'h.0.\x01\xff' is bad"));
  CHECK(s.message() == "tensor 'h.0.\\x01\\xff' is bad");
  CHECK(s.Annotate("file '\x1b'").message() == "file '\\x1b': tensor 'h.0.\\x01\\xff' is bad");
}

}  // namespace
}  // namespace tessera
