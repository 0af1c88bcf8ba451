// The native checkpoint manifest as plain C++ values, and its encoding.
// manifest.cc is the only file that includes the generated protobuf header.
#ifndef TESSERA_FORMATS_MANIFEST_H_
#define TESSERA_FORMATS_MANIFEST_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/byte_size.h"
#include "core/status.h"
#include "transform/box.h"
#include "transform/layout.h"
#include "transform/mesh.h"

namespace tessera {

// Format 2 frames manifest.pb with a checksum (kManifestHeader below),
// keeps a second copy of it, and records tensors held by several pipeline
// stages, data-file hosts, whole-file checksums and erasure-code groups.
// Format 3 lets a matrix piece's block checksums cover 2-D tiles (TileGrid).
inline constexpr uint32_t kNativeFormatVersion = 3;
// Pieces of at least kPackedPieceLimit stored bytes start at a multiple of
// kPieceAlignment (a page: one can be mapped, or read directly, from a page
// boundary; its last page may hold small pieces packed after it); smaller
// ones are packed at multiples of kSmallPieceAlignment (readers take every
// offset from the manifest and require neither, so packing needs no new
// format version). A 4,096-rank checkpoint has half a million pieces of
// 0.03-5 KiB: page-aligned, they would take 1.9 GB on disk for 0.9 GB of
// tensors.
inline constexpr uint64_t kPieceAlignment = 4096;
inline constexpr uint64_t kSmallPieceAlignment = 64;
inline constexpr uint64_t kPackedPieceLimit = 64 << 10;
// Where a piece of `stored` bytes goes in a data file whose bytes end at `end`.
inline uint64_t PieceStart(uint64_t end, uint64_t stored) {
  return RoundUp(end, stored < kPackedPieceLimit ? kSmallPieceAlignment : kPieceAlignment);
}
// Raw pieces longer than this carry one checksum per block of this size.
inline constexpr uint64_t kChecksumBlock = 1 << 20;

enum class Codec : uint8_t { kRaw = 0, kZstd = 1 };

// A piece's block checksums in one pointer (a vector would take 24 bytes of
// every piece, and most pieces have none): the count, then the checksums,
// in one heap array; none allocates nothing.
class BlockChecksums {
 public:
  BlockChecksums() = default;
  explicit BlockChecksums(size_t n) {
    if (n == 0) return;
    data_.reset(new uint64_t[n + 1]());
    data_[0] = n;
  }
  BlockChecksums(const uint64_t* begin, const uint64_t* end)
      : BlockChecksums(static_cast<size_t>(end - begin)) {
    std::copy(begin, end, this->begin());
  }
  BlockChecksums(const BlockChecksums& o) : BlockChecksums(o.begin(), o.end()) {}
  BlockChecksums(BlockChecksums&&) noexcept = default;
  BlockChecksums& operator=(const BlockChecksums& o) {
    if (this != &o) *this = BlockChecksums(o);
    return *this;
  }
  BlockChecksums& operator=(BlockChecksums&&) noexcept = default;

  size_t size() const { return data_ ? static_cast<size_t>(data_[0]) : 0; }
  bool empty() const { return size() == 0; }
  uint64_t& operator[](size_t i) { return data_[i + 1]; }
  uint64_t operator[](size_t i) const { return data_[i + 1]; }
  uint64_t* begin() { return data_ ? data_.get() + 1 : nullptr; }
  uint64_t* end() { return begin() + size(); }
  const uint64_t* begin() const { return data_ ? data_.get() + 1 : nullptr; }
  const uint64_t* end() const { return begin() + size(); }
  bool operator==(const BlockChecksums& o) const {
    return size() == o.size() && std::equal(begin(), end(), o.begin());
  }
  bool operator!=(const BlockChecksums& o) const { return !(*this == o); }

 private:
  std::unique_ptr<uint64_t[]> data_;
};

// One per stored piece: a 16,384-rank checkpoint has 1.7 million, which a
// reshard holds twice (the source's and the output's), so the record is
// kept small: 88 bytes (it was 160 with a Box and a vector).
struct PieceInfo {
  uint32_t file = 0;
  // Of a copy: the pipeline stage whose copy it is (a tensor several stages
  // hold), its bytes possibly not the piece's; 0 for a redundancy copy.
  int32_t stage = 0;
  Codec codec = Codec::kRaw;
  // Format 3: block_checksums are those of tiles of tile_rows rows by
  // tile_columns elements (TileGrid); both 0: of 1 MiB blocks. In what
  // would be padding before `offset`.
  uint16_t tile_rows = 0;
  uint32_t tile_columns = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t raw_length = 0;
  uint64_t checksum = 0;
  CompactBox box;
  // XXH3 of each kChecksumBlock of the stored bytes, or of each tile
  // (raw pieces longer than one block; empty otherwise).
  BlockChecksums block_checksums;
  bool tiled() const { return tile_rows != 0; }
};

// A tiled piece's grid (formats/native.md, "Tile checksums"), in bytes:
// rows of `row_bytes` (its last dimension), tiles of `tile_rows` rows by
// `tile_bytes` of each row. Tile (i, j)'s checksum is block_checksums[i *
// column_tiles() + j].
struct TileGrid {
  uint64_t rows = 0;
  uint64_t row_bytes = 0;
  uint64_t tile_rows = 0;
  uint64_t tile_bytes = 0;
  uint64_t row_tiles() const { return CeilDiv(rows, tile_rows); }
  uint64_t column_tiles() const { return CeilDiv(row_bytes, tile_bytes); }
  uint64_t band_bytes() const { return tile_rows * row_bytes; }  // a band of tile rows
  bool empty() const { return tile_rows == 0; }
};
// The grid of a tiled raw piece (its element size from raw_length and box).
TileGrid GridOf(const PieceInfo& piece);
// The tiles a writer gives a raw piece of `size` bytes holding `box`
// (empty: 1 MiB blocks, or one checksum at or below 1 MiB).
TileGrid ChooseTiles(const Box& box, uint64_t size);

struct TensorEntry {
  std::string name;
  Layout layout;
  std::optional<Mesh> mesh;
  std::vector<PieceInfo> pieces;
  // Redundant copies of pieces (same box, codec, stored bytes and checksum
  // as one of `pieces`) in other files; readers fall back on them. Also the
  // copies of a tensor's copy stages (stage != 0): same box, their own
  // checksum, used in place of a piece only when equal to it.
  std::vector<PieceInfo> copies;
};

struct FileInfo {
  std::string name;
  uint64_t size = 0;
  uint64_t checksum = 0;  // XXH3 of every byte of the file; 0: not recorded
  std::string host;       // the host that wrote it; "": not recorded
};

// `parity` (a file index) holds the XOR of the `members` files, each padded
// with zeros to the longest: any one member is rebuilt from the others.
struct ParityGroup {
  std::vector<uint32_t> members;
  uint32_t parity = 0;
};

// `parity` files hold a `code` ("rs-cauchy", ...) of the `members`, each
// padded with zeros to the longest: any parity.size() of the files are
// rebuilt from the others.
struct ErasureGroup {
  std::string code;
  std::vector<uint32_t> members;
  std::vector<uint32_t> parity;
};

struct Manifest {
  uint32_t format_version = kNativeFormatVersion;
  int64_t step = 0;
  Mesh mesh;
  std::vector<FileInfo> files;
  std::vector<TensorEntry> tensors;
  std::map<std::string, std::string> metadata;
  std::string created_by;
  std::vector<ParityGroup> parity_groups;
  std::vector<ErasureGroup> erasure_groups;
};

// The copies of copy stages whose stored bytes differ from their piece's
// (by checksum and length), with that piece.
struct DifferingCopy {
  const TensorEntry* tensor;
  const PieceInfo* copy;
  const PieceInfo* piece;
};
std::vector<DifferingCopy> DifferingStageCopies(const Manifest& manifest);

// manifest.pb of format 2 and later: a 32-byte header, then the protobuf.
//   0  8  magic "TSRMNFST"
//   8  4  format version, little-endian u32
//  12  4  header size, little-endian u32 (32)
//  16  8  protobuf length, little-endian u64
//  24  8  XXH3-64 of bytes 0..24 and the protobuf
// Format 1 manifests are the bare protobuf.
inline constexpr uint32_t kManifestHeader = 32;

// The framed manifest (format 2).
std::string SerializeManifest(const Manifest& manifest);
// Threads a manifest of many pieces is parsed, serialized, indexed or
// committed on: one per core, at most 8 (each holds a tensor's records
// being converted; more would add memory, not speed).
int ManifestThreads();
// Calls fn(lo, hi) over [0, n) in contiguous ranges: on a pool of
// ManifestThreads() (four ranges a thread) when `parallel`, else once, on
// this thread. Returns the first failing range's status, in range order
// (so the first failure by index when fn stops at its first).
Status ForEachRange(size_t n, bool parallel, const std::function<Status(size_t, size_t)>& fn);
// Checks the frame's checksum (a manifest that fails is DataLoss naming
// `path` as corrupt) and everything a reader relies on: version, layouts
// valid on their meshes, pieces inside their tensors and files, file
// indices in range. A bare protobuf is read only as format 1, and only
// when `bare_ok` (a checkpoint with a manifest copy is format 2 or later,
// so a bare manifest.pb there is a damaged frame). `path` only names the
// file in errors.
Result<Manifest> ParseManifest(std::string_view bytes, const std::string& path,
                               bool bare_ok = true);

}  // namespace tessera

#endif  // TESSERA_FORMATS_MANIFEST_H_
