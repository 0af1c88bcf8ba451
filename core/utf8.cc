#include "core/utf8.h"

#include <cstdio>

namespace tessera {
namespace {

bool IsScalar(char32_t c) { return c <= 0x10ffff && (c < 0xd800 || c > 0xdfff); }

// The code point starting at s[i] into `c`, and its length in bytes; 0 when
// the bytes there are not valid UTF-8.
int NextCodePoint(std::string_view text, size_t i, char32_t* c) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const unsigned char b = s[i];
  const int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + n > text.size()) return 0;
  char32_t v = n == 1 ? b : b & (0x7f >> n);
  for (int k = 1; k < n; ++k) {
    if ((s[i + k] & 0xc0) != 0x80) return 0;
    v = (v << 6) | (s[i + k] & 0x3f);
  }
  constexpr char32_t kLeast[] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < kLeast[n] || !IsScalar(v)) return 0;
  *c = v;
  return n;
}

// Characters that must not reach a terminal as they are.
bool Unprintable(char32_t c) {
  return c < 0x20 || c == 0x7f || (c >= 0x80 && c < 0xa0) || c == 0x200e || c == 0x200f ||
         (c >= 0x2028 && c <= 0x202e) || (c >= 0x2066 && c <= 0x2069);
}

}  // namespace

Result<std::u32string> DecodeUtf8(std::string_view utf8) {
  std::u32string out;
  for (size_t i = 0; i < utf8.size();) {
    char32_t c = 0;
    const int n = NextCodePoint(utf8, i, &c);
    if (n == 0) return InvalidArgumentError("not UTF-8 (byte " + std::to_string(i) + ")");
    out.push_back(c);
    i += n;
  }
  return out;
}

std::string PrintableText(std::string_view s) {
  size_t clean = 0;  // the common case: printable ASCII, returned as it is
  while (clean < s.size() && s[clean] >= 0x20 && s[clean] < 0x7f) ++clean;
  if (clean == s.size()) return std::string(s);
  std::string out(s.substr(0, clean));
  char buf[16];
  for (size_t i = clean; i < s.size();) {
    char32_t c = 0;
    const int n = NextCodePoint(s, i, &c);
    if (n == 0) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned char>(s[i]));
      out += buf;
      ++i;
      continue;
    }
    if (!Unprintable(c)) {
      out.append(s.substr(i, n));
    } else if (c == '\n' || c == '\t' || c == '\r') {
      out += c == '\n' ? "\\n" : c == '\t' ? "\\t" : "\\r";
    } else if (c < 0x80) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else {
      std::snprintf(buf, sizeof(buf), "\\u{%x}", static_cast<unsigned>(c));
      out += buf;
    }
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
