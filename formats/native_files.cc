#include "formats/native_files.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "core/buffer.h"
#include "core/checksum.h"
#include "core/endian.h"
#include "formats/codec.h"

namespace tessera {
namespace {

constexpr char kMagic[8] = {'T', 'S', 'R', 'D', 'A', 'T', 'A', '\0'};
constexpr uint32_t kDataFileVersion = 1;
constexpr uint32_t kHeaderSize = 4096;

}  // namespace

std::string DataFileHeader() {
  std::string header(kHeaderSize, '\0');
  std::memcpy(header.data(), kMagic, sizeof(kMagic));
  PutLittleEndian<uint32_t>(header.data() + 8, kDataFileVersion);
  PutLittleEndian<uint32_t>(header.data() + 12, kHeaderSize);
  return header;
}

namespace {

// Hashes a tiled piece's tiles (TileGrid) from its stored bytes handed
// over in order, in chunks of any size: one streaming state per column
// tile, each row's segments fed to their tiles' states, the states
// finished at the end of each band of tile rows, so the piece is read
// once, row-major, whatever its tiles.
class TileHasher {
 public:
  TileHasher(const TileGrid& grid, uint64_t* out)
      : grid_(grid), out_(out), states_(new Xxh3Hasher[grid.column_tiles()]) {}
  void Update(const char* data, uint64_t n) {
    while (n > 0) {
      const uint64_t j = in_row_ / grid_.tile_bytes;
      const uint64_t take =
          std::min(n, std::min((j + 1) * grid_.tile_bytes, grid_.row_bytes) - in_row_);
      states_[j].Update(data, take);
      data += take;
      n -= take;
      in_row_ += take;
      if (in_row_ < grid_.row_bytes) continue;
      in_row_ = 0;
      ++row_;
      if (row_ % grid_.tile_rows != 0 && row_ != grid_.rows) continue;
      const uint64_t band = (row_ - 1) / grid_.tile_rows, columns = grid_.column_tiles();
      for (uint64_t c = 0; c < columns; ++c) {
        out_[band * columns + c] = states_[c].Digest();
        states_[c].Reset();
      }
    }
  }

 private:
  TileGrid grid_;
  uint64_t* out_;
  std::unique_ptr<Xxh3Hasher[]> states_;
  uint64_t row_ = 0;     // rows done
  uint64_t in_row_ = 0;  // bytes of the current row done
};

// Gives `p` (a raw piece of `size` bytes) the checksums its tiles or
// blocks need, and the hashing that fills them from its bytes in order.
class BlockHasher {
 public:
  BlockHasher(PieceInfo& p, size_t size) {
    const TileGrid grid = ChooseTiles(p.box, size);
    if (!grid.empty()) {
      const int n = p.box.rank();
      const uint64_t es = grid.row_bytes / static_cast<uint64_t>(p.box[n - 1].size());
      p.tile_rows = static_cast<uint16_t>(grid.tile_rows);
      p.tile_columns = static_cast<uint32_t>(grid.tile_bytes / es);
      p.block_checksums = BlockChecksums(grid.row_tiles() * grid.column_tiles());
      tiles_.emplace(grid, p.block_checksums.begin());
    } else if (size > kChecksumBlock) {
      p.block_checksums = BlockChecksums(CeilDiv(size, kChecksumBlock));
      blocks_ = p.block_checksums.begin();
    }
  }
  // Bytes [off, off + n) of the piece, in order; row blocks come whole.
  void Update(const char* data, uint64_t n, uint64_t off) {
    if (tiles_) tiles_->Update(data, n);
    if (blocks_ != nullptr) blocks_[off / kChecksumBlock] = Xxh3(data, n);
  }

 private:
  std::optional<TileHasher> tiles_;
  uint64_t* blocks_ = nullptr;
};

// A raw piece's record (at `offset` of file `file_index`), its bytes handed
// to `write` (bytes, count, offset in the piece) a checksum block at a
// time: the block's (or its tiles') checksums, the piece's (streamed) and
// the write all read the block while it is in cache, instead of three
// passes over the piece from memory. The records are those
// EncodeStoredPiece gives.
//
// `block(off, n)` gives the bytes of [off, off + n) of the piece: the
// caller's memory, or a buffer a PieceReader refilled (StreamedBlocks).
template <typename Block, typename Write>
Result<PieceInfo> WriteRawBlocks(const std::string& path, Block&& block, size_t size,
                                 const Box& box, uint32_t file_index, uint64_t offset,
                                 Write&& write) {
  PieceInfo p;
  p.box = box;
  p.codec = Codec::kRaw;
  p.raw_length = size;
  p.file = file_index;
  p.offset = offset;
  p.length = size;
  Xxh3Hasher piece;
  BlockHasher blocks(p, size);
  for (uint64_t off = 0; off < size; off += kChecksumBlock) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kChecksumBlock, size - off));
    ASSIGN_OR_RETURN(const char* data, block(off, n));
    blocks.Update(data, n, off);
    piece.Update(data, n);
    Status s = write(data, n, off);
    if (!s.ok()) return s.Annotate("data file '" + path + "'");
  }
  p.checksum = piece.Digest();
  return p;
}

// A piece's bytes from memory.
auto MemoryBlocks(const void* raw) {
  return [data = static_cast<const char*>(raw)](uint64_t off, size_t) -> Result<const char*> {
    return data + off;
  };
}

// A piece's bytes through `read`, a buffer of up to kStreamBytes at a time.
class StreamedBlocks {
 public:
  StreamedBlocks(const PieceReader& read, size_t size)
      : read_(read), size_(size), buffer_(std::min(size, kStreamBytes)) {}
  Result<const char*> operator()(uint64_t off, size_t n) {
    if (off < begin_ || off + n > begin_ + filled_) {
      begin_ = off;
      filled_ = static_cast<size_t>(std::min<uint64_t>(buffer_.size(), size_ - off));
      RETURN_IF_ERROR(read_(off, filled_, buffer_.data()));
    }
    return buffer_.data() + (off - begin_);
  }

 private:
  const PieceReader& read_;
  size_t size_;
  std::vector<char> buffer_;
  uint64_t begin_ = 0;
  size_t filled_ = 0;
};

}  // namespace

Result<std::unique_ptr<DataFileWriter>> DataFileWriter::Create(Env* env, const std::string& path,
                                                               uint32_t file_index) {
  ASSIGN_OR_RETURN(auto file, env->NewWritableFile(path));
  std::unique_ptr<DataFileWriter> w(new DataFileWriter(env, path, std::move(file), file_index));
  const std::string header = DataFileHeader();
  RETURN_IF_ERROR(w->Write(header.data(), header.size()));
  w->size_ = kHeaderSize;
  return w;
}

Status DataFileWriter::Write(const void* data, size_t size) {
  whole_.Update(data, size);
  if (stage_limit_ > 0) {
    if (staged_.size() + size > stage_limit_) RETURN_IF_ERROR(WriteStaged());
    if (size < stage_limit_) {
      staged_.append(static_cast<const char*>(data), size);
      return Status::Ok();
    }
  }
  return Put(data, size);
}

Status DataFileWriter::Reopen() {
  if (file_) return Status::Ok();
  Result<std::unique_ptr<WritableFile>> file = env_->OpenWritableFile(path_);
  if (!file.ok()) return file.status().Annotate("reopening data file '" + path_ + "'");
  file_ = std::move(*file);
  reopened_ = true;
  return Status::Ok();
}

Status DataFileWriter::Put(const void* data, size_t size) {
  RETURN_IF_ERROR(Reopen());
  // A reopened file's own position is its start: written at its end.
  Status s = reopened_ ? file_->WriteAt(in_file_, data, size) : file_->Append(data, size);
  if (s.ok()) in_file_ += size;
  return s;
}

Status DataFileWriter::WriteStaged() {
  if (staged_.empty()) return Status::Ok();
  Status s = Put(staged_.data(), staged_.size());
  staged_.clear();
  return s;
}

Status DataFileWriter::Park() {
  if (!file_) return Status::Ok();
  if (staging()) RETURN_IF_ERROR(Unstage().status());
  Status s = file_->Close();
  file_.reset();
  if (!s.ok()) return s.Annotate("data file '" + path_ + "'");
  return Status::Ok();
}

void DataFileWriter::Stage(std::string buffer, size_t limit) {
  staged_ = std::move(buffer);
  staged_.clear();
  staged_.reserve(limit);
  stage_limit_ = limit;
}

Result<std::string> DataFileWriter::Unstage() {
  Status s = WriteStaged();
  if (!s.ok()) return s.Annotate("data file '" + path_ + "'");
  stage_limit_ = 0;
  return std::move(staged_);
}

Result<StoredPiece> EncodeStoredPiece(const void* raw, size_t size, const Box& box, DType dtype,
                                      Codec codec, int level) {
  StoredPiece p;
  if (codec == Codec::kRaw) {
    p.data = static_cast<const char*>(raw);
    p.size = size;
  } else {
    ASSIGN_OR_RETURN(p.owned, EncodePiece(raw, size, dtype, codec, level));
    p.data = p.owned.data();
    p.size = p.owned.size();
  }
  PieceInfo& info = p.info;
  info.box = box;
  info.codec = codec;
  info.raw_length = size;
  info.checksum = Xxh3(p.data, p.size);
  if (codec == Codec::kRaw && p.size > kChecksumBlock) {
    BlockHasher blocks(info, p.size);
    for (uint64_t off = 0; off < p.size; off += kChecksumBlock) {
      blocks.Update(p.data + off, std::min<uint64_t>(kChecksumBlock, p.size - off), off);
    }
  }
  return p;
}

Result<PieceInfo> DataFileWriter::Append(const void* raw, size_t size, const Box& box, DType dtype,
                                         Codec codec, int level) {
  if (codec != Codec::kRaw || size <= kChecksumBlock) {
    ASSIGN_OR_RETURN(StoredPiece stored, EncodeStoredPiece(raw, size, box, dtype, codec, level));
    return Append(stored);
  }
  // A large raw piece in one pass (WriteRawBlocks); Write adds the file's
  // whole-file checksum while the block is in cache.
  RETURN_IF_ERROR(PadTo(PieceStart(size_, size)));
  ASSIGN_OR_RETURN(PieceInfo p, WriteRawBlocks(path_, MemoryBlocks(raw), size, box, index_, size_,
                                               [&](const char* data, size_t n, uint64_t) {
                                                 return Write(data, n);
                                               }));
  size_ += size;
  return p;
}

Result<PieceInfo> DataFileWriter::AppendFrom(const PieceReader& read, size_t size, const Box& box,
                                             DType dtype) {
  if (size <= kChecksumBlock) {  // one block: whole, as Append encodes it
    std::vector<char> whole(size);
    RETURN_IF_ERROR(read(0, size, whole.data()));
    return Append(whole.data(), size, box, dtype, Codec::kRaw, 0);
  }
  RETURN_IF_ERROR(PadTo(PieceStart(size_, size)));
  ASSIGN_OR_RETURN(PieceInfo p, WriteRawBlocks(path_, StreamedBlocks(read, size), size, box, index_,
                                               size_, [&](const char* data, size_t n, uint64_t) {
                                                 return Write(data, n);
                                               }));
  size_ += size;
  return p;
}

Result<PieceInfo> DataFileWriter::Append(const StoredPiece& stored) {
  RETURN_IF_ERROR(PadTo(PieceStart(size_, stored.size)));
  PieceInfo p = stored.info;
  p.file = index_;
  p.offset = size_;
  p.length = stored.size;
  Status s = Write(stored.data, stored.size);
  if (!s.ok()) return s.Annotate("data file '" + path_ + "'");
  size_ += stored.size;
  return p;
}

Status DataFileWriter::PadTo(uint64_t offset) {
  static const char kZeros[kPieceAlignment] = {};
  while (size_ < offset) {
    const uint64_t n = std::min<uint64_t>(offset - size_, sizeof(kZeros));
    Status s = Write(kZeros, n);
    if (!s.ok()) return s.Annotate("data file '" + path_ + "'");
    size_ += n;
  }
  return Status::Ok();
}

Status DataFileWriter::EndPieces() { return PadTo(RoundUp(size_, kPieceAlignment)); }

Result<uint64_t> DataFileWriter::Finish() {
  RETURN_IF_ERROR(EndPieces());
  if (staging()) RETURN_IF_ERROR(Unstage().status());
  RETURN_IF_ERROR(Reopen());  // when parked: to be synced
  RETURN_IF_ERROR(file_->Sync());
  RETURN_IF_ERROR(file_->Close());
  return size_;
}

std::pair<std::vector<uint64_t>, uint64_t> PlacedDataFile::Place(
    const std::vector<uint64_t>& bytes) {
  std::vector<uint64_t> offsets;
  offsets.reserve(bytes.size());
  uint64_t at = kHeaderSize;
  for (uint64_t b : bytes) {
    offsets.push_back(at);
    at += RoundUp(b, kPieceAlignment);
  }
  return {std::move(offsets), at};
}

Result<std::unique_ptr<PlacedDataFile>> PlacedDataFile::Create(Env* env, const std::string& path,
                                                               uint32_t file_index, uint64_t size) {
  if (size < kHeaderSize) {
    return InvalidArgumentError("data file '" + path + "': " + std::to_string(size) +
                                " bytes cannot hold its header");
  }
  ASSIGN_OR_RETURN(auto file, env->NewWritableFile(path));
  const std::string header = DataFileHeader();
  RETURN_IF_ERROR(file->WriteAt(0, header.data(), header.size()));
  // The final size now, its blocks allocated at once (several writers
  // filling holes would have the file system allocate them piecemeal).
  RETURN_IF_ERROR(file->Preallocate(size));
  return std::unique_ptr<PlacedDataFile>(new PlacedDataFile(path, std::move(file), file_index));
}

Result<std::unique_ptr<PlacedDataFile>> PlacedDataFile::Open(Env* env, const std::string& path,
                                                             uint32_t file_index) {
  ASSIGN_OR_RETURN(auto file, env->OpenWritableFile(path));
  return std::unique_ptr<PlacedDataFile>(new PlacedDataFile(path, std::move(file), file_index));
}

Status PlacedDataFile::CheckPieceOffset(uint64_t offset) const {
  if (offset < kHeaderSize || offset % kPieceAlignment != 0) {
    return InvalidArgumentError("data file '" + path_ + "': offset " + std::to_string(offset) +
                                " is not a piece's");
  }
  return Status::Ok();
}

Result<PieceInfo> PlacedDataFile::WriteRaw(uint64_t offset, const void* raw, size_t size,
                                           const Box& box) {
  RETURN_IF_ERROR(CheckPieceOffset(offset));
  WritableFile& file = *file_;
  return WriteRawBlocks(path_, MemoryBlocks(raw), size, box, index_, offset,
                        [&](const char* data, size_t n, uint64_t off) {
                          return file.WriteAt(offset + off, data, n);
                        });
}

Result<PieceInfo> PlacedDataFile::WriteRawFrom(uint64_t offset, const PieceReader& read,
                                               size_t size, const Box& box) {
  RETURN_IF_ERROR(CheckPieceOffset(offset));
  WritableFile& file = *file_;
  return WriteRawBlocks(path_, StreamedBlocks(read, size), size, box, index_, offset,
                        [&](const char* data, size_t n, uint64_t off) {
                          return file.WriteAt(offset + off, data, n);
                        });
}

Status PlacedDataFile::Finish() {
  RETURN_IF_ERROR(file_->Sync());
  return file_->Close();
}

Status CheckDataFileHeader(const RandomAccessFile& file, const std::string& path) {
  char header[16];
  Status s = file.Read(0, sizeof(header), header);
  if (!s.ok()) return DataLossError("data file '" + path + "': too short for its header");
  if (std::memcmp(header, kMagic, sizeof(kMagic)) != 0) {
    return DataLossError("data file '" + path + "': bad magic (not a Tessera data file)");
  }
  const uint32_t version = GetLittleEndian<uint32_t>(header + 8);
  if (version == 0 || version > kDataFileVersion) {
    return FailedPreconditionError("data file '" + path + "': version " + std::to_string(version) +
                                   " is not readable by this Tessera");
  }
  return Status::Ok();
}

namespace {

// Errors about one piece start with its name ("file 'x': tensor 'y' piece
// [0:4, 0:8]"), spelled out only when an error needs it: a reshard of a
// 4,096-rank checkpoint reads half a million pieces.
struct PieceName {
  const std::string& path;
  const std::string& tensor;
  const PieceInfo& piece;
  std::string str() const {
    return "file '" + path + "': tensor '" + tensor + "' piece " + ToString(piece.box);
  }
};
std::string operator+(const PieceName& name, std::string_view more) {
  return name.str().append(more);
}

// Reads the stored bytes of `piece` into `dst` and checks their checksum.
// Checks a piece's stored bytes against its one checksum.
Status CheckStored(const PieceInfo& piece, const void* stored, const PieceName& ctx) {
  if (Xxh3(stored, piece.length) != piece.checksum) {
    return DataLossError(ctx + ": checksum mismatch (corrupt data)");
  }
  return Status::Ok();
}

Status ReadStored(const RandomAccessFile& file, const PieceInfo& piece, void* dst,
                  const PieceName& ctx) {
  Status s = file.Read(piece.offset, piece.length, dst);
  if (!s.ok()) return DataLossError(ctx + ": " + s.message());
  return CheckStored(piece, dst, ctx);
}

}  // namespace

Status ReadPiece(const RandomAccessFile& file, const std::string& path, const std::string& tensor,
                 const PieceInfo& piece, DType dtype, void* raw) {
  const PieceName ctx{path, tensor, piece};
  // Raw pieces land directly in the caller's buffer; encoded ones are staged.
  if (piece.codec == Codec::kRaw) return ReadStored(file, piece, raw, ctx);
  ASSIGN_OR_RETURN(auto stored, AllocateBytesFor(piece.length, [&] { return ctx.str(); }));
  RETURN_IF_ERROR(ReadStored(file, piece, stored.get(), ctx));
  return DecodePiece(stored.get(), piece.length, piece.codec, dtype, raw, piece.raw_length,
                     ctx.str());
}

namespace {

constexpr uint64_t kReadWindowBlocks = 4;  // a partial read stages at most 4 MiB

// The stored byte range [begin, end) of blocks [first, last) of a piece.
std::pair<uint64_t, uint64_t> BlockRange(const PieceInfo& piece, uint64_t first, uint64_t last) {
  return {first * kChecksumBlock, std::min(last * kChecksumBlock, piece.length)};
}

// Checks blocks [first, last) of a raw piece, whose bytes start at `bytes`.
Status CheckBlocks(const PieceInfo& piece, uint64_t first, uint64_t last, const char* bytes,
                   const PieceName& ctx) {
  const auto [begin, end] = BlockRange(piece, first, last);
  for (uint64_t b = first; b < last; ++b) {
    const uint64_t off = b * kChecksumBlock - begin;
    const uint64_t n = std::min<uint64_t>(kChecksumBlock, end - begin - off);
    if (Xxh3(bytes + off, n) != piece.block_checksums[b]) {
      return DataLossError(ctx + ": checksum mismatch in block " + std::to_string(b) +
                           " (corrupt data)");
    }
  }
  return Status::Ok();
}

// Reads blocks [first, last) of a raw piece into `buf` and checks each one.
Status ReadBlocks(const RandomAccessFile& file, const PieceInfo& piece, uint64_t first,
                  uint64_t last, char* buf, const PieceName& ctx) {
  const auto [begin, end] = BlockRange(piece, first, last);
  Status s = file.Read(piece.offset + begin, end - begin, buf);
  if (!s.ok()) return DataLossError(ctx + ": " + s.message());
  return CheckBlocks(piece, first, last, buf, ctx);
}

// Blocks [first, last) of a raw piece lent from the file (mapped) and
// verified; null when the file lends no bytes.
Result<std::unique_ptr<FileView>> ViewBlocks(const RandomAccessFile& file, const PieceInfo& piece,
                                             uint64_t first, uint64_t last, const PieceName& ctx) {
  const auto [begin, end] = BlockRange(piece, first, last);
  Result<std::unique_ptr<FileView>> view = file.View(piece.offset + begin, end - begin);
  if (!view.ok()) return DataLossError(ctx + ": " + view.status().message());
  if (*view != nullptr) RETURN_IF_ERROR(CheckBlocks(piece, first, last, (*view)->data(), ctx));
  return view;
}

// Verifies column tiles [col_first, col_last) of a tiled raw piece, a
// band of tile rows at a time: each row of the band handed to Row in
// order (its segments fed to their tiles' states, TileHasher's order),
// then EndBand compares the digests.
class TileChecker {
 public:
  TileChecker(const PieceInfo& piece, const TileGrid& g, uint64_t col_first, uint64_t col_last,
              const PieceName& ctx)
      : piece_(piece),
        g_(g),
        col_first_(col_first),
        col_last_(col_last),
        ctx_(ctx),
        h_(new Xxh3Hasher[col_last - col_first]) {}
  void Row(const char* row) {
    for (uint64_t c = col_first_; c < col_last_; ++c) {
      const uint64_t from = c * g_.tile_bytes;
      h_[c - col_first_].Update(row + from, std::min(g_.tile_bytes, g_.row_bytes - from));
    }
  }
  Status EndBand(uint64_t band) {
    const uint64_t columns = g_.column_tiles();
    for (uint64_t c = col_first_; c < col_last_; ++c) {
      Xxh3Hasher& h = h_[c - col_first_];
      if (h.Digest() != piece_.block_checksums[band * columns + c]) {
        const uint64_t es = piece_.raw_length / static_cast<uint64_t>(NumElements(piece_.box));
        return DataLossError(ctx_ + ": checksum mismatch in tile (rows " +
                             std::to_string(band * g_.tile_rows) + ":" +
                             std::to_string(std::min(g_.rows, (band + 1) * g_.tile_rows)) +
                             ", columns " + std::to_string(c * g_.tile_bytes / es) + ":" +
                             std::to_string(std::min(g_.row_bytes, (c + 1) * g_.tile_bytes) / es) +
                             " of the piece) (corrupt data)");
      }
      h.Reset();
    }
    return Status::Ok();
  }

 private:
  const PieceInfo& piece_;
  const TileGrid& g_;
  uint64_t col_first_, col_last_;
  const PieceName& ctx_;
  std::unique_ptr<Xxh3Hasher[]> h_;
};

// Checks tiles [band_first, band_last) x [col_first, col_last) of a tiled
// raw piece, whose bytes from band `band_first` on start at `bytes`.
Status CheckTiles(const PieceInfo& piece, const TileGrid& g, uint64_t band_first,
                  uint64_t band_last, uint64_t col_first, uint64_t col_last, const char* bytes,
                  const PieceName& ctx) {
  TileChecker check(piece, g, col_first, col_last, ctx);
  for (uint64_t band = band_first; band < band_last; ++band) {
    const uint64_t row_end = std::min(g.rows, (band + 1) * g.tile_rows);
    for (uint64_t r = band * g.tile_rows; r < row_end; ++r) {
      check.Row(bytes + (r - band_first * g.tile_rows) * g.row_bytes);
    }
    RETURN_IF_ERROR(check.EndBand(band));
  }
  return Status::Ok();
}

// The stored byte range of bands [first, last) of a tiled piece.
std::pair<uint64_t, uint64_t> BandRange(const TileGrid& g, uint64_t first, uint64_t last) {
  return {first * g.band_bytes(), std::min(last * g.tile_rows, g.rows) * g.row_bytes};
}

// Bands [first, last) of a tiled raw piece lent by the file into `view`
// when `lend` and it can, else read into `buf` (when given); not verified.
// The bytes, or null when neither.
Result<const char*> FetchBands(const RandomAccessFile& file, const PieceInfo& piece,
                               const TileGrid& g, uint64_t first, uint64_t last, bool lend,
                               std::unique_ptr<FileView>* view, char* buf, const PieceName& ctx) {
  const auto [begin, end] = BandRange(g, first, last);
  const char* bytes = nullptr;
  if (lend) {
    Result<std::unique_ptr<FileView>> v = file.View(piece.offset + begin, end - begin);
    if (!v.ok()) return DataLossError(ctx + ": " + v.status().message());
    *view = std::move(*v);
    if (*view != nullptr) bytes = (*view)->data();
  }
  if (bytes == nullptr) {
    if (buf == nullptr) return static_cast<const char*>(nullptr);
    Status s = file.Read(piece.offset + begin, end - begin, buf);
    if (!s.ok()) return DataLossError(ctx + ": " + s.message());
    bytes = buf;
  }
  return bytes;
}

// FetchBands, and the column tiles [col_first, col_last) of the bands
// verified.
Result<const char*> GetBands(const RandomAccessFile& file, const PieceInfo& piece,
                             const TileGrid& g, uint64_t first, uint64_t last, uint64_t col_first,
                             uint64_t col_last, bool lend, std::unique_ptr<FileView>* view,
                             char* buf, const PieceName& ctx) {
  ASSIGN_OR_RETURN(const char* bytes,
                   FetchBands(file, piece, g, first, last, lend, view, buf, ctx));
  if (bytes != nullptr) {
    RETURN_IF_ERROR(CheckTiles(piece, g, first, last, col_first, col_last, bytes, ctx));
  }
  return bytes;
}

// The column tiles a run of bytes [src, src + len) of a tiled piece
// touches: all of them unless it lies within one row.
std::pair<uint64_t, uint64_t> ColumnTiles(const TileGrid& g, uint64_t src, uint64_t len) {
  if (src / g.row_bytes != (src + len - 1) / g.row_bytes) return {0, g.column_tiles()};
  return {(src % g.row_bytes) / g.tile_bytes, ((src + len - 1) % g.row_bytes) / g.tile_bytes + 1};
}

// Rows a whole band read straight into the destination is read (and
// hashed) a few at a time by: bytes a cache keeps.
constexpr uint64_t kReadHashRows = 256 << 10;

// ReadPieceRegion of a tiled raw piece: a band of tile rows at a time,
// only the bands the runs touch and of them only the column tiles the
// region's columns touch verified. A band that lies inside one run is
// read straight into the destination and verified there.
Status ReadTiledRegion(const RandomAccessFile& file, const PieceInfo& piece, const Box& rel,
                       const std::vector<ByteRun>& runs, char* out, const PieceName& ctx) {
  const TileGrid g = GridOf(piece);
  const int64_t es = static_cast<int64_t>(g.row_bytes) / piece.box[piece.box.rank() - 1].size();
  const Interval cols = rel[rel.rank() - 1];
  const uint64_t col_first = static_cast<uint64_t>(cols.begin * es) / g.tile_bytes;
  const uint64_t col_last = static_cast<uint64_t>(cols.end * es - 1) / g.tile_bytes + 1;
  std::unique_ptr<char[]> window;  // a band, allocated on first use
  std::unique_ptr<FileView> view;
  bool lends = true;
  TileChecker check(piece, g, col_first, col_last, ctx);
  TileChecker all(piece, g, 0, g.column_tiles(), ctx);  // for whole bands
  size_t next = 0;                                      // first run not yet copied whole
  uint64_t band = 0;
  while (next < runs.size()) {
    band = std::max(band, runs[next].src / g.band_bytes());
    const auto [begin, end] = BandRange(g, band, band + 1);
    const ByteRun& r = runs[next];
    if (r.src <= begin && r.src + r.len >= end) {  // the whole band, contiguous in `out`
      // Read a few rows at a time and hashed while the kernel's copy has
      // left them in cache.
      char* at = out + r.dst + (begin - r.src);
      const uint64_t step = std::max<uint64_t>(1, kReadHashRows / g.row_bytes) * g.row_bytes;
      for (uint64_t off = 0; off < end - begin; off += step) {
        const uint64_t n = std::min(step, end - begin - off);
        Status s = file.Read(piece.offset + begin + off, n, at + off);
        if (!s.ok()) return DataLossError(ctx + ": " + s.message());
        for (uint64_t row = off; row < off + n; row += g.row_bytes) all.Row(at + row);
      }
      RETURN_IF_ERROR(all.EndBand(band));
      if (r.src + r.len == end) ++next;
      ++band;
      continue;
    }
    view.reset();
    const char* bytes = nullptr;
    if (lends) {
      ASSIGN_OR_RETURN(bytes,
                       FetchBands(file, piece, g, band, band + 1, true, &view, nullptr, ctx));
      lends = bytes != nullptr;
    }
    if (bytes == nullptr) {
      // A band is at most the piece (a manifest's tile_rows may exceed its rows).
      if (!window) window.reset(new char[std::min(g.band_bytes(), piece.length)]);
      ASSIGN_OR_RETURN(
          bytes, FetchBands(file, piece, g, band, band + 1, false, nullptr, window.get(), ctx));
    }
    // A row at a time: its tiles' segments hashed, then what of the runs
    // lies in it copied while it is in cache; the band's tiles compared at
    // its end (a failure leaves the destination partly written, as any
    // failed read may).
    for (uint64_t row = begin; row < end; row += g.row_bytes) {
      check.Row(bytes + (row - begin));
      const uint64_t row_end = row + g.row_bytes;
      for (size_t i = next; i < runs.size() && runs[i].src < row_end; ++i) {
        const uint64_t from = std::max(runs[i].src, row);
        const uint64_t to = std::min(runs[i].src + runs[i].len, row_end);
        if (from < to) {
          std::memcpy(out + runs[i].dst + (from - runs[i].src), bytes + (from - begin), to - from);
        }
        if (to == runs[i].src + runs[i].len) next = i + 1;
      }
    }
    RETURN_IF_ERROR(check.EndBand(band));
    ++band;
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<FileView>> ViewPieceRegion(const RandomAccessFile& file,
                                                  const std::string& path,
                                                  const std::string& tensor, const PieceInfo& piece,
                                                  DType dtype, const Box& region) {
  if (piece.codec != Codec::kRaw) return std::unique_ptr<FileView>();
  const int64_t es = DTypeSize(dtype);
  const std::vector<ByteRun> runs =
      ByteRuns(piece.box.extents(), RelativeTo(region, piece.box), region.extents(),
               Box::FromShape(region.extents()), es);
  if (runs.size() != 1) return std::unique_ptr<FileView>();  // not one contiguous run
  const ByteRun& r = runs[0];
  const PieceName ctx{path, tensor, piece};
  if (piece.block_checksums.empty() && piece.length < kViewAtLeast) {
    // A small piece is read, not lent: a mapping and its unmapping per
    // piece cost more than copying it, and unmapping from several threads
    // serializes on the process's memory map and interrupts every core to
    // flush its TLB (a 4,096-rank checkpoint has half a million pieces of
    // a few KiB).
    return std::unique_ptr<FileView>();
  }
  if (piece.tiled()) {
    const TileGrid g = GridOf(piece);
    const uint64_t first = r.src / g.band_bytes(), last = (r.src + r.len - 1) / g.band_bytes() + 1;
    const auto [col_first, col_last] = ColumnTiles(g, r.src, r.len);
    std::unique_ptr<FileView> bands;
    ASSIGN_OR_RETURN(const char* lent, GetBands(file, piece, g, first, last, col_first, col_last,
                                                true, &bands, nullptr, ctx));
    if (lent == nullptr) return std::unique_ptr<FileView>();
    return std::unique_ptr<FileView>(
        new SubView(std::move(bands), static_cast<size_t>(r.src - BandRange(g, first, last).first),
                    static_cast<size_t>(r.len)));
  }
  if (piece.block_checksums.empty()) {  // one checksum, over all of it
    Result<std::unique_ptr<FileView>> whole = file.View(piece.offset, piece.length);
    if (!whole.ok()) return DataLossError(ctx + ": " + whole.status().message());
    if (*whole == nullptr) return whole;
    RETURN_IF_ERROR(CheckStored(piece, (*whole)->data(), ctx));
    return std::unique_ptr<FileView>(
        new SubView(std::move(*whole), static_cast<size_t>(r.src), static_cast<size_t>(r.len)));
  }
  const uint64_t first = r.src / kChecksumBlock;
  const uint64_t last = (r.src + r.len - 1) / kChecksumBlock + 1;
  ASSIGN_OR_RETURN(std::unique_ptr<FileView> blocks, ViewBlocks(file, piece, first, last, ctx));
  if (blocks == nullptr) return blocks;
  return std::unique_ptr<FileView>(new SubView(std::move(blocks),
                                               static_cast<size_t>(r.src - first * kChecksumBlock),
                                               static_cast<size_t>(r.len)));
}

Status ReadPieceRegion(const RandomAccessFile& file, const std::string& path,
                       const std::string& tensor, const PieceInfo& piece, DType dtype,
                       const Box& region, void* dst, const std::vector<int64_t>& dst_extents,
                       const Box& dst_box) {
  const int64_t es = DTypeSize(dtype);
  const std::vector<int64_t> piece_ext = piece.box.extents();
  const Box rel = RelativeTo(region, piece.box);
  const bool whole_dst = region == piece.box && dst_box == Box::FromShape(dst_extents);
  if (whole_dst) return ReadPiece(file, path, tensor, piece, dtype, dst);
  if (piece.codec != Codec::kRaw || piece.block_checksums.empty()) {
    // Encoded or small: the whole piece, then the region out of it.
    const PieceName name{path, tensor, piece};
    ASSIGN_OR_RETURN(auto raw, AllocateBytesFor(piece.raw_length, [&] { return name.str(); }));
    RETURN_IF_ERROR(ReadPiece(file, path, tensor, piece, dtype, raw.get()));
    CopyBox(raw.get(), piece_ext, rel, dst, dst_extents, dst_box, es);
    return Status::Ok();
  }
  // Raw with block checksums: read only the blocks the region touches, a
  // window of consecutive touched blocks at a time.
  const PieceName ctx{path, tensor, piece};
  const std::vector<ByteRun> runs = ByteRuns(piece_ext, rel, dst_extents, dst_box, es);
  if (piece.tiled()) return ReadTiledRegion(file, piece, rel, runs, static_cast<char*>(dst), ctx);
  // Runs ascend in the piece, so the touched blocks come out sorted.
  std::vector<uint64_t> touched;
  for (const ByteRun& r : runs) {
    for (uint64_t blk = r.src / kChecksumBlock; blk <= (r.src + r.len - 1) / kChecksumBlock;
         ++blk) {
      if (touched.empty() || touched.back() < blk) touched.push_back(blk);
    }
  }
  std::unique_ptr<char[]> window;  // staged blocks, allocated on first use
  std::unique_ptr<FileView> view;  // or the same blocks lent by the file
  bool lends = true;               // until the file says it cannot
  const char* staged = nullptr;    // blocks [win_first, win_last)
  char* out = static_cast<char*>(dst);
  const uint64_t nblocks = piece.block_checksums.size();
  uint64_t win_first = 0, win_last = 0;  // blocks [win_first, win_last) are in `window`
  size_t next = 0;                       // first entry of `touched` not yet read
  for (const ByteRun& r : runs) {
    uint64_t pos = r.src;
    const uint64_t end = r.src + r.len;
    while (pos < end) {
      const uint64_t blk = pos / kChecksumBlock;
      if (pos % kChecksumBlock == 0 && blk >= win_last) {
        // Whole blocks inside the run go straight to the destination and are
        // checked there: no staging copy for contiguous regions.
        uint64_t last = blk;
        while (last < nblocks && std::min((last + 1) * kChecksumBlock, piece.length) <= end) ++last;
        if (last > blk) {
          RETURN_IF_ERROR(ReadBlocks(file, piece, blk, last, out + r.dst + (pos - r.src), ctx));
          while (next < touched.size() && touched[next] < last) ++next;
          pos = std::min(last * kChecksumBlock, piece.length);
          continue;
        }
      }
      if (blk >= win_last) {
        // The next window: consecutive touched blocks, at most a few; lent
        // by the file when it can (no staging copy), else read.
        win_first = touched[next];
        win_last = win_first + 1;
        while (++next < touched.size() && touched[next] == win_last &&
               win_last - win_first < kReadWindowBlocks) {
          ++win_last;
        }
        view.reset();
        if (lends) {
          ASSIGN_OR_RETURN(view, ViewBlocks(file, piece, win_first, win_last, ctx));
          lends = view != nullptr;
        }
        if (view) {
          staged = view->data();
        } else {
          if (!window) window.reset(new char[kReadWindowBlocks * kChecksumBlock]);
          RETURN_IF_ERROR(ReadBlocks(file, piece, win_first, win_last, window.get(), ctx));
          staged = window.get();
        }
      }
      const uint64_t win_end = std::min(win_last * kChecksumBlock, piece.length);
      const uint64_t n = std::min(end, win_end) - pos;
      std::memcpy(out + r.dst + (pos - r.src), staged + (pos - win_first * kChecksumBlock), n);
      pos += n;
    }
  }
  return Status::Ok();
}

Status VerifyPiece(const RandomAccessFile& file, const std::string& path, const std::string& tensor,
                   const PieceInfo& piece, DType dtype) {
  const PieceName ctx{path, tensor, piece};
  if (piece.codec != Codec::kRaw || piece.block_checksums.empty()) {
    ASSIGN_OR_RETURN(auto raw, AllocateBytesFor(piece.raw_length, [&] { return ctx.str(); }));
    return ReadPiece(file, path, tensor, piece, dtype, raw.get());
  }
  Xxh3Hasher whole;
  if (piece.tiled()) {  // a band of tile rows at a time
    const TileGrid g = GridOf(piece);
    std::unique_ptr<char[]> band(new char[std::min(g.band_bytes(), piece.length)]);
    for (uint64_t b = 0; b < g.row_tiles(); ++b) {
      ASSIGN_OR_RETURN(const char* bytes, GetBands(file, piece, g, b, b + 1, 0, g.column_tiles(),
                                                   false, nullptr, band.get(), ctx));
      const auto [begin, end] = BandRange(g, b, b + 1);
      whole.Update(bytes, end - begin);
    }
    if (whole.Digest() != piece.checksum)
      return DataLossError(ctx + ": checksum mismatch (corrupt data)");
    return Status::Ok();
  }
  std::unique_ptr<char[]> window(new char[kReadWindowBlocks * kChecksumBlock]);
  const uint64_t nblocks = piece.block_checksums.size();
  for (uint64_t b = 0; b < nblocks; b += kReadWindowBlocks) {
    const uint64_t last = std::min(b + kReadWindowBlocks, nblocks);
    RETURN_IF_ERROR(ReadBlocks(file, piece, b, last, window.get(), ctx));
    whole.Update(window.get(), std::min(last * kChecksumBlock, piece.length) - b * kChecksumBlock);
  }
  if (whole.Digest() != piece.checksum)
    return DataLossError(ctx + ": checksum mismatch (corrupt data)");
  return Status::Ok();
}

Status CommitManifest(Env* env, const std::string& dir, const Manifest& manifest) {
  const std::string bytes = SerializeManifest(manifest);
  RETURN_IF_ERROR(WriteFileAtomically(env, JoinPath(dir, kManifestName), bytes));
  if (manifest.format_version < 2) return Status::Ok();
  return WriteFileAtomically(env, JoinPath(dir, kManifestCopyName), bytes);
}

bool HasManifest(Env* env, const std::string& dir) {
  return env->FileExists(JoinPath(dir, kManifestName)) ||
         env->FileExists(JoinPath(dir, kManifestCopyName));
}

Result<Manifest> ReadManifest(Env* env, const std::string& dir, std::string* note) {
  const std::string path = JoinPath(dir, kManifestName);
  const std::string copy = JoinPath(dir, kManifestCopyName);
  const bool has_copy = env->FileExists(copy);
  if (!env->FileExists(path) && !has_copy) {
    if (!env->IsDirectory(dir)) return NotFoundError("checkpoint '" + dir + "' does not exist");
    return FailedPreconditionError("checkpoint '" + dir +
                                   "' is incomplete (no manifest.pb): it was never committed");
  }
  // A checkpoint with a copy is format 2 or later: a bare manifest.pb there
  // is a damaged frame, never format 1.
  Status first = NotFoundError("manifest '" + path + "' is missing");
  if (env->FileExists(path)) {
    Result<std::string> bytes = ReadFileToString(env, path);
    Result<Manifest> m = bytes.ok() ? ParseManifest(*bytes, path, !has_copy) : bytes.status();
    if (m.ok() || !has_copy || m.status().code() == StatusCode::kFailedPrecondition) return m;
    first = m.status();
  }
  Result<std::string> bytes = ReadFileToString(env, copy);
  Result<Manifest> m = bytes.ok() ? ParseManifest(*bytes, copy, false) : bytes.status();
  if (!m.ok()) {
    return Status(first.code(), first.message() + "; its copy failed too: " + m.status().message());
  }
  if (note != nullptr) {
    *note =
        std::string(kManifestName) + " (" + first.message() + "): read from " + kManifestCopyName;
  }
  return m;
}

namespace {
// N of a checkpoint named "step-<N>", else -1.
int64_t StepOf(const std::string& name) {
  if (name.size() < 6 || name.size() > 5 + 18 || name.compare(0, 5, "step-") != 0) return -1;
  if (!std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return -1;
  }
  return std::stoll(name.substr(5));
}
}  // namespace

Status SetLatest(Env* env, const std::string& root, const std::string& name) {
  return WriteFileAtomically(env, JoinPath(root, kLatestName), name + "\n");
}

Result<std::string> ReadLatest(Env* env, const std::string& root) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, JoinPath(root, kLatestName)));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (text.empty() || text.find('/') != std::string::npos) {
    return DataLossError("'" + JoinPath(root, kLatestName) + "' does not name a checkpoint");
  }
  return text;
}

Result<std::vector<std::pair<int64_t, std::string>>> CommittedSteps(Env* env,
                                                                    const std::string& root) {
  ASSIGN_OR_RETURN(std::vector<std::string> children, env->GetChildren(root));
  std::vector<std::pair<int64_t, std::string>> steps;
  for (const std::string& name : children) {
    const int64_t step = StepOf(name);
    if (step < 0) continue;
    const std::string dir = JoinPath(root, name);
    if (!env->IsDirectory(dir) || !HasManifest(env, dir)) continue;
    steps.emplace_back(step, name);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

Result<std::string> ResumeCheckpoint(Env* env, const std::string& root) {
  int64_t before = std::numeric_limits<int64_t>::max();
  if (env->FileExists(JoinPath(root, kLatestName))) {
    Result<std::string> named = ReadLatest(env, root);
    if (named.ok()) {
      if (HasManifest(env, JoinPath(root, *named))) return *named;
      if (StepOf(*named) >= 0) before = StepOf(*named);
    }
  }
  ASSIGN_OR_RETURN(const auto steps, CommittedSteps(env, root));
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (it->first < before) return it->second;
  }
  return NotFoundError("'" + root + "' holds no committed checkpoint to resume from");
}

Result<std::string> ResolveCheckpointDir(Env* env, const std::string& path) {
  if (HasManifest(env, path)) return path;
  if (env->IsDirectory(path)) {
    Result<std::string> name = ResumeCheckpoint(env, path);
    if (name.ok()) return JoinPath(path, *name);
  }
  return path;
}

Status PruneCheckpoints(Env* env, const std::string& root, int keep,
                        std::vector<std::string>* removed) {
  if (keep < 1)
    return InvalidArgumentError("keep at least 1 checkpoint, not " + std::to_string(keep));
  std::string latest;
  if (env->FileExists(JoinPath(root, kLatestName))) {
    ASSIGN_OR_RETURN(latest, ReadLatest(env, root));
  }
  ASSIGN_OR_RETURN(const auto steps, CommittedSteps(env, root));
  const int64_t drop = static_cast<int64_t>(steps.size()) - keep;
  for (int64_t i = 0; i < drop; ++i) {
    const std::string& name = steps[i].second;
    if (name == latest) continue;
    RETURN_IF_ERROR(DeleteRecursively(env, JoinPath(root, name)));
    if (removed != nullptr) removed->push_back(name);
  }
  return Status::Ok();
}

}  // namespace tessera
