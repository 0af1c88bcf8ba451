#include "core/byte_size.h"

#include <cctype>
#include <cstdio>

namespace tessera {

Result<int64_t> ParseByteSize(const std::string& text) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (...) {
    return InvalidArgumentError("'" + text + "' is not a size (e.g. 256MiB)");
  }
  std::string unit = text.substr(pos);
  for (char& c : unit) c = static_cast<char>(std::tolower(c));
  int shift = -1;
  if (unit.empty() || unit == "b") shift = 0;
  if (unit == "k" || unit == "kb" || unit == "kib") shift = 10;
  if (unit == "m" || unit == "mb" || unit == "mib") shift = 20;
  if (unit == "g" || unit == "gb" || unit == "gib") shift = 30;
  if (unit == "t" || unit == "tb" || unit == "tib") shift = 40;
  if (shift < 0 || value <= 0)
    return InvalidArgumentError("'" + text + "' is not a size (e.g. 256MiB)");
  return static_cast<int64_t>(value * static_cast<double>(int64_t{1} << shift));
}

std::string HumanBytes(int64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", v, kUnits[u]);
  return buf;
}

}  // namespace tessera
