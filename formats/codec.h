// Piece codecs: raw, or zstd after a byte-plane shuffle of floating-point
// elements. codec.cc is the only file that includes zstd.h.
#ifndef TESSERA_FORMATS_CODEC_H_
#define TESSERA_FORMATS_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/env.h"
#include "core/status.h"
#include "formats/manifest.h"

namespace tessera {

// The bytes to store for `raw` (size bytes of `dtype` elements).
Result<std::string> EncodePiece(const void* raw, size_t size, DType dtype, Codec codec, int level);
// Decodes `stored` into exactly `raw_size` bytes at `raw`. Errors are
// DataLoss; `context` names the piece.
Status DecodePiece(const void* stored, size_t stored_size, Codec codec, DType dtype, void* raw,
                   size_t raw_size, const std::string& context);

// Writes the zstd stream at [offset, offset + length) of `in`, decompressed,
// to `out`, a few MiB at a time; more than `limit` bytes out is a
// DataLossError naming `where` (a decompression bomb), as is a damaged or
// cut-short stream. (DCP's "stream.zstd" items, formats/dcp.h.)
Status DecompressZstdRange(const RandomAccessFile& in, uint64_t offset, uint64_t length,
                           uint64_t limit, WritableFile& out, const std::string& where);

// Byte-plane shuffle: element bytes [e0b0 e0b1 .. e1b0 e1b1 ..] become
// [e0b0 e1b0 .. e0b1 e1b1 ..]. Unshuffle is the inverse.
void ShuffleBytes(const void* src, size_t size, size_t element_size, void* dst);
void UnshuffleBytes(const void* src, size_t size, size_t element_size, void* dst);

}  // namespace tessera

#endif  // TESSERA_FORMATS_CODEC_H_
