#include "core/utf8.h"

namespace tessera {
namespace {

bool IsScalar(char32_t c) { return c <= 0x10ffff && (c < 0xd800 || c > 0xdfff); }

}  // namespace

Result<std::u32string> DecodeUtf8(std::string_view utf8) {
  std::u32string out;
  const auto* s = reinterpret_cast<const unsigned char*>(utf8.data());
  for (size_t i = 0; i < utf8.size();) {
    const unsigned char b = s[i];
    const int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    auto bad = [&] { return InvalidArgumentError("not UTF-8 (byte " + std::to_string(i) + ")"); };
    if (n == 0 || i + n > utf8.size()) return bad();
    char32_t c = n == 1 ? b : b & (0x7f >> n);
    for (int k = 1; k < n; ++k) {
      if ((s[i + k] & 0xc0) != 0x80) return bad();
      c = (c << 6) | (s[i + k] & 0x3f);
    }
    constexpr char32_t kLeast[] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < kLeast[n] || !IsScalar(c)) return bad();
    out.push_back(c);
    i += n;
  }
  return out;
}

bool IsUtf8(std::string_view s) { return DecodeUtf8(s).ok(); }

Result<std::string> EncodeUtf8(std::u32string_view points) {
  std::string out;
  for (char32_t c : points) {
    if (!IsScalar(c)) {
      return InvalidArgumentError("code point " + std::to_string(static_cast<uint32_t>(c)) +
                                  " is not a Unicode scalar value");
    }
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
      out.push_back(static_cast<char>(0xc0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
    } else if (c < 0x10000) {
      out.push_back(static_cast<char>(0xe0 | (c >> 12)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
    } else {
      out.push_back(static_cast<char>(0xf0 | (c >> 18)));
      out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
    }
  }
  return out;
}

}  // namespace tessera
