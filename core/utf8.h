// UTF-8 text <-> Unicode code points, validating both ways: formats that
// store strings as code points (MindSpore's numpy '<U' strings) or require
// UTF-8 (JSON, protobuf strings) use these to refuse bytes they cannot hold.
#ifndef TESSERA_CORE_UTF8_H_
#define TESSERA_CORE_UTF8_H_

#include <string>
#include <string_view>

#include "core/status.h"

namespace tessera {

// The code points of `utf8`; fails naming the first byte that is not valid
// UTF-8 (truncated, overlong, a surrogate, past U+10FFFF).
Result<std::u32string> DecodeUtf8(std::string_view utf8);

// Whether `s` is valid UTF-8.
bool IsUtf8(std::string_view s);

// `points` as UTF-8; fails naming a code point that is not a Unicode
// scalar value (a surrogate, or past U+10FFFF).
Result<std::string> EncodeUtf8(std::u32string_view points);

// `s` safe to show on a terminal: printable UTF-8 as it is; every byte
// that is not valid UTF-8 as \xNN, control characters (C0, DEL, C1) as
// \n, \t, \r or \xNN / \u{NN}, and the invisible characters that reorder
// or break lines (bidi controls, U+2028/U+2029) as \u{NNNN}. Idempotent:
// its output is returned unchanged. Status messages and inspect output
// pass through it, so bytes from a damaged file never reach a terminal raw.
std::string PrintableText(std::string_view s);

}  // namespace tessera

#endif  // TESSERA_CORE_UTF8_H_
