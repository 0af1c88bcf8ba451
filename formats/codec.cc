#include "formats/codec.h"

#include <zstd.h>

#include <cstring>
#include <vector>

namespace tessera {

void ShuffleBytes(const void* src, size_t size, size_t es, void* dst) {
  const auto* s = static_cast<const unsigned char*>(src);
  auto* d = static_cast<unsigned char*>(dst);
  const size_t n = size / es;
  for (size_t b = 0; b < es; ++b) {
    for (size_t i = 0; i < n; ++i) d[b * n + i] = s[i * es + b];
  }
  std::memcpy(d + n * es, s + n * es, size - n * es);  // no partial element in practice
}

void UnshuffleBytes(const void* src, size_t size, size_t es, void* dst) {
  const auto* s = static_cast<const unsigned char*>(src);
  auto* d = static_cast<unsigned char*>(dst);
  const size_t n = size / es;
  for (size_t b = 0; b < es; ++b) {
    for (size_t i = 0; i < n; ++i) d[i * es + b] = s[b * n + i];
  }
  std::memcpy(d + n * es, s + n * es, size - n * es);
}

namespace {
bool Shuffled(DType dtype) { return IsFloatingPoint(dtype) && DTypeSize(dtype) > 1; }
}  // namespace

Result<std::string> EncodePiece(const void* raw, size_t size, DType dtype, Codec codec, int level) {
  if (codec == Codec::kRaw) return std::string(static_cast<const char*>(raw), size);
  std::vector<char> shuffled;
  const void* input = raw;
  if (Shuffled(dtype)) {
    shuffled.resize(size);
    ShuffleBytes(raw, size, DTypeSize(dtype), shuffled.data());
    input = shuffled.data();
  }
  std::string out(ZSTD_compressBound(size), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), input, size, level);
  if (ZSTD_isError(n)) return InternalError(std::string("zstd: ") + ZSTD_getErrorName(n));
  out.resize(n);
  return out;
}

Status DecodePiece(const void* stored, size_t stored_size, Codec codec, DType dtype, void* raw,
                   size_t raw_size, const std::string& context) {
  if (codec == Codec::kRaw) {
    if (stored_size != raw_size) {
      return DataLossError(context + ": raw piece of " + std::to_string(stored_size) +
                           " bytes, expected " + std::to_string(raw_size));
    }
    std::memcpy(raw, stored, raw_size);
    return Status::Ok();
  }
  const unsigned long long content = ZSTD_getFrameContentSize(stored, stored_size);
  if (content != raw_size) {
    return DataLossError(context + ": zstd frame is corrupt or holds the wrong size");
  }
  std::vector<char> tmp;
  void* target = raw;
  if (Shuffled(dtype)) {
    tmp.resize(raw_size);
    target = tmp.data();
  }
  const size_t n = ZSTD_decompress(target, raw_size, stored, stored_size);
  if (ZSTD_isError(n) || n != raw_size) {
    return DataLossError(context + ": zstd: " +
                         (ZSTD_isError(n) ? ZSTD_getErrorName(n) : "short output"));
  }
  if (Shuffled(dtype)) UnshuffleBytes(tmp.data(), raw_size, DTypeSize(dtype), raw);
  return Status::Ok();
}

}  // namespace tessera
