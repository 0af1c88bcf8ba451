#include "formats/codec.h"

#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

namespace tessera {

namespace {

// dst[c][r] = src[r][c] for a rows x cols byte matrix; shuffling is the
// transpose of (elements x element bytes), unshuffling its inverse.
void TransposeBytes(const unsigned char* src, size_t rows, size_t cols, unsigned char* dst) {
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
  }
}

bool Shuffled(DType dtype) { return IsFloatingPoint(dtype) && DTypeSize(dtype) > 1; }

}  // namespace

void ShuffleBytes(const void* src, size_t size, size_t es, void* dst) {
  const size_t n = size / es;
  TransposeBytes(static_cast<const unsigned char*>(src), n, es, static_cast<unsigned char*>(dst));
  std::memcpy(static_cast<char*>(dst) + n * es, static_cast<const char*>(src) + n * es,
              size - n * es);  // a trailing partial element stays in place
}

void UnshuffleBytes(const void* src, size_t size, size_t es, void* dst) {
  const size_t n = size / es;
  TransposeBytes(static_cast<const unsigned char*>(src), es, n, static_cast<unsigned char*>(dst));
  std::memcpy(static_cast<char*>(dst) + n * es, static_cast<const char*>(src) + n * es,
              size - n * es);
}

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
    return DataLossError(context +
                         ": zstd: " + (ZSTD_isError(n) ? ZSTD_getErrorName(n) : "short output"));
  }
  if (Shuffled(dtype)) UnshuffleBytes(tmp.data(), raw_size, DTypeSize(dtype), raw);
  return Status::Ok();
}

Status DecompressZstdRange(const RandomAccessFile& in, uint64_t offset, uint64_t length,
                           uint64_t limit, WritableFile& out, const std::string& where) {
  std::unique_ptr<ZSTD_DStream, size_t (*)(ZSTD_DStream*)> stream(ZSTD_createDStream(),
                                                                  ZSTD_freeDStream);
  if (!stream) return ResourceExhaustedError(where + ": cannot allocate a zstd stream");
  ZSTD_initDStream(stream.get());
  std::vector<char> src(ZSTD_DStreamInSize()), dst(ZSTD_DStreamOutSize());
  uint64_t written = 0;
  size_t last = 1;  // ZSTD_decompressStream's last result: 0 at the end of a frame
  for (uint64_t at = 0; at < length;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(src.size(), length - at));
    RETURN_IF_ERROR(in.Read(offset + at, n, src.data()));
    at += n;
    ZSTD_inBuffer input{src.data(), n, 0};
    while (input.pos < input.size) {
      ZSTD_outBuffer output{dst.data(), dst.size(), 0};
      last = ZSTD_decompressStream(stream.get(), &output, &input);
      if (ZSTD_isError(last)) {
        return DataLossError(where + ": its zstd stream is damaged (" + ZSTD_getErrorName(last) +
                             ")");
      }
      written += output.pos;
      if (written > limit) {
        return DataLossError(where + ": its zstd stream inflates past " + std::to_string(limit) +
                             " bytes");
      }
      RETURN_IF_ERROR(out.Append(dst.data(), output.pos));
    }
  }
  if (last != 0) return DataLossError(where + ": its zstd stream is cut short");
  return Status::Ok();
}

}  // namespace tessera
