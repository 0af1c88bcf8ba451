// Native checkpoint files: data files of pieces (from 64 KiB on a page, smaller
// ones packed at 64 bytes), and the
// manifest / `latest` commit protocol (formats/native.md).
#ifndef TESSERA_FORMATS_NATIVE_FILES_H_
#define TESSERA_FORMATS_NATIVE_FILES_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/checksum.h"
#include "core/env.h"
#include "core/status.h"
#include "formats/manifest.h"

namespace tessera {

inline constexpr char kManifestName[] = "manifest.pb";
// Format 2: the second copy of the manifest, written after manifest.pb.
inline constexpr char kManifestCopyName[] = "manifest-copy.pb";
inline constexpr char kLatestName[] = "latest";

// One piece ready to append: encoded, checksummed, not yet placed in a file.
// Built by EncodeStoredPiece on any thread; for raw pieces `data` points at
// the caller's bytes (which must outlive the append), otherwise at `owned`.
struct StoredPiece {
  std::string owned;
  const char* data = nullptr;
  size_t size = 0;
  // Everything but the file, offset and length, which Append fills in.
  PieceInfo info;
};
Result<StoredPiece> EncodeStoredPiece(const void* raw, size_t size, const Box& box, DType dtype,
                                      Codec codec, int level);

// Where a raw piece's bytes come from when they are not in memory whole
// (a checkpoint streamed from the offload tier): fills bytes [offset,
// offset + n) of the piece into `out`. Offsets and counts are whole
// checksum blocks but for the last.
using PieceReader = std::function<Status(uint64_t offset, size_t n, void* out)>;
// Bytes a streamed piece holds in memory at once (whole checksum blocks).
inline constexpr size_t kStreamBytes = size_t{16} << 20;

// Appends pieces to one data file. Not thread-safe.
class DataFileWriter {
 public:
  // Creates `path` and writes its header; `file_index` is the file's index
  // in Manifest::files, recorded in every piece.
  static Result<std::unique_ptr<DataFileWriter>> Create(Env* env, const std::string& path,
                                                        uint32_t file_index);
  // Encodes, writes and checksums one piece holding `box` of a `dtype`
  // tensor, at PieceStart (zeros before it: a piece of 64 KiB or more
  // starts at a 4 KiB boundary, a smaller one at the next 64 bytes).
  Result<PieceInfo> Append(const void* raw, size_t size, const Box& box, DType dtype, Codec codec,
                           int level);
  // Writes an encoded piece at PieceStart.
  Result<PieceInfo> Append(const StoredPiece& piece);
  // A raw piece of `size` bytes read through `read` a buffer of at most
  // kStreamBytes at a time, hashed as it streams: the same record and
  // bytes as Append of the whole.
  Result<PieceInfo> AppendFrom(const PieceReader& read, size_t size, const Box& box, DType dtype);
  // Zeros to the next 4 KiB boundary, where the file ends: after it, size()
  // and checksum() are the file's final ones (Finish does it too).
  Status EndPieces();
  const std::string& path() const { return path_; }
  // Gathers small writes in memory from now on: pieces and padding shorter
  // than `limit` bytes are staged in `buffer` (its capacity reused) and
  // reach the file in writes of up to `limit` bytes, at the latest on
  // Unstage or Finish. A checkpoint of 4,096 ranks has half a million
  // pieces of a few KiB: one write each (and one for its padding) would be
  // most of a reshard's time.
  void Stage(std::string buffer, size_t limit);
  bool staging() const { return stage_limit_ > 0; }
  // Writes what is staged and stops staging; returns the buffer, empty
  // with its capacity kept, for another file.
  Result<std::string> Unstage();
  // Hands what was written to the disk without waiting (a later Finish
  // then waits less); staged bytes are not written by it.
  void StartWriteback() {
    if (file_) file_->StartWriteback();
  }
  // Closes the file for now, staged bytes written first (and staging
  // stopped): a writer of more data files than the process may hold open
  // parks those it is done with for a while. The next write or Finish
  // reopens it (Env::OpenWritableFile) and writes on at its end.
  Status Park();
  bool parked() const { return !file_; }
  // Syncs and closes; the file's final size.
  Result<uint64_t> Finish();
  // Bytes written so far (up to the end of the last piece until EndPieces).
  // Unless staging, every write goes straight to the file, so other
  // readers see them before Finish makes them durable.
  uint64_t size() const { return size_; }
  // XXH3-64 of every byte written so far (header and padding included): the
  // whole-file checksum FileInfo records.
  uint64_t checksum() const { return whole_.Digest(); }

 private:
  DataFileWriter(Env* env, std::string path, std::unique_ptr<WritableFile> file, uint32_t index)
      : env_(env), path_(std::move(path)), file_(std::move(file)), index_(index) {}
  Status Write(const void* data, size_t size);
  Status WriteStaged();
  // Writes `size` bytes at the file's end, reopening it when parked.
  Status Put(const void* data, size_t size);
  Status Reopen();  // when parked
  Env* env_;
  // Zeros up to `offset`, and the size moved there.
  Status PadTo(uint64_t offset);
  std::string path_;
  std::unique_ptr<WritableFile> file_;
  uint32_t index_;
  uint64_t size_ = 0;
  uint64_t in_file_ = 0;   // bytes the file holds (size_ less what is staged)
  bool reopened_ = false;  // written at in_file_ (WriteAt) since a Park
  Xxh3Hasher whole_;
  std::string staged_;
  size_t stage_limit_ = 0;  // 0: not staging
};

// A data file whose pieces are placed before they are written, so that
// several writers fill it at once: the ranks of a merged save, each in its
// own process, every one writing its pieces at the offsets all of them
// planned alike (Place). One writer creates the file (its header written,
// the file at its final size), the others open it; each writes its pieces
// with WriteRaw and makes them durable with Finish. Raw pieces only (an
// encoded piece's size is not known before it is encoded); the padding
// between pieces reads as zeros. Thread-safe.
class PlacedDataFile {
 public:
  // The offsets of pieces of `bytes` each, in order, each at a 4 KiB
  // boundary after the header; and the file's size (after the last one's
  // padding).
  static std::pair<std::vector<uint64_t>, uint64_t> Place(const std::vector<uint64_t>& bytes);
  static Result<std::unique_ptr<PlacedDataFile>> Create(Env* env, const std::string& path,
                                                        uint32_t file_index, uint64_t size);
  static Result<std::unique_ptr<PlacedDataFile>> Open(Env* env, const std::string& path,
                                                      uint32_t file_index);
  // Writes and checksums one raw piece holding `box`, `size` bytes, at
  // `offset` (one of Place's).
  Result<PieceInfo> WriteRaw(uint64_t offset, const void* raw, size_t size, const Box& box);
  // The same read through `read` (DataFileWriter::AppendFrom).
  Result<PieceInfo> WriteRawFrom(uint64_t offset, const PieceReader& read, size_t size,
                                 const Box& box);
  // Makes this writer's pieces durable and closes it.
  Status Finish();
  const std::string& path() const { return path_; }

 private:
  PlacedDataFile(std::string path, std::unique_ptr<WritableFile> file, uint32_t index)
      : path_(std::move(path)), file_(std::move(file)), index_(index) {}
  Status CheckPieceOffset(uint64_t offset) const;
  std::string path_;
  std::unique_ptr<WritableFile> file_;
  uint32_t index_;
};

// The 4 KiB a data file starts with (magic, version, header size).
std::string DataFileHeader();

// Checks the magic and version of an open data file.
Status CheckDataFileHeader(const RandomAccessFile& file, const std::string& path);

// Reads one piece, verifies its checksum and decodes it into `raw`
// (piece.raw_length bytes). Errors name the file, tensor and box.
Status ReadPiece(const RandomAccessFile& file, const std::string& path, const std::string& tensor,
                 const PieceInfo& piece, DType dtype, void* raw);

// Reads `region` (global coordinates, inside piece.box) of a piece into the
// dense row-major buffer `dst` of shape `dst_extents`, at `dst_box` (same
// extents as `region`). Raw pieces are read by byte ranges: only the
// checksum blocks the region touches are read and verified; encoded pieces
// are read whole. Errors name the file, tensor and box.
Status ReadPieceRegion(const RandomAccessFile& file, const std::string& path,
                       const std::string& tensor, const PieceInfo& piece, DType dtype,
                       const Box& region, void* dst, const std::vector<int64_t>& dst_extents,
                       const Box& dst_box);

// `region` (inside piece.box) of a raw piece lent by the file without a
// copy, when its bytes are one contiguous run of a piece of at least 64 KiB
// and the file can lend them (RandomAccessFile::View); the checksum blocks
// it touches (or the whole piece, when it has one checksum) are verified.
// Null otherwise (smaller pieces are cheaper copied than mapped): read it
// with ReadPieceRegion.
Result<std::unique_ptr<FileView>> ViewPieceRegion(const RandomAccessFile& file,
                                                  const std::string& path,
                                                  const std::string& tensor, const PieceInfo& piece,
                                                  DType dtype, const Box& region);

// Verifies a piece's stored bytes (checksums, and that encoded pieces
// decode to their raw length), staging at most 4 MiB at a time for raw ones.
Status VerifyPiece(const RandomAccessFile& file, const std::string& path, const std::string& tensor,
                   const PieceInfo& piece, DType dtype);

// Step 2 of the commit: manifest.pb written atomically into `dir` (the
// commit point), then its copy manifest-copy.pb (format 2 and later).
Status CommitManifest(Env* env, const std::string& dir, const Manifest& manifest);
// Whether `dir` holds a manifest or its copy: a committed checkpoint.
bool HasManifest(Env* env, const std::string& dir);
// Reads `dir`'s manifest: manifest.pb, or its copy when manifest.pb is
// missing or corrupt (then `note`, when given, says so: "manifest.pb
// (corrupt: ...): read from manifest-copy.pb"). A directory with neither is
// an incomplete checkpoint (FailedPrecondition naming it); when both fail,
// the error names both.
Result<Manifest> ReadManifest(Env* env, const std::string& dir, std::string* note = nullptr);
// Step 3: `root`/latest names checkpoint `name` (a directory in `root`).
Status SetLatest(Env* env, const std::string& root, const std::string& name);
Result<std::string> ReadLatest(Env* env, const std::string& root);
// Keeps the newest `keep` (>= 1) committed checkpoints of a training run
// in `root`, directories named "step-<N>" holding a manifest, by N, and
// deletes the older ones; never the one `latest` names, nor anything else
// in `root` (incomplete directories, other names). The names removed, oldest
// first, go to `removed` when given.
Status PruneCheckpoints(Env* env, const std::string& root, int keep,
                        std::vector<std::string>* removed = nullptr);
// The committed checkpoints of a training run in `root`: directories named
// "step-<N>" holding a manifest, sorted by N.
Result<std::vector<std::pair<int64_t, std::string>>> CommittedSteps(Env* env,
                                                                    const std::string& root);
// The checkpoint to resume from in `root`, by name: the one `latest` names
// when it is committed (`latest` is the authority: a committed "step-<N>"
// newer than it is an abandoned one, left by a writer killed between its
// commit and the update of `latest`, or by a rollback of `latest`); else,
// when `latest` is missing or names no committed checkpoint, the newest
// committed "step-<N>" older than the one it names. NotFound when there is
// none.
Result<std::string> ResumeCheckpoint(Env* env, const std::string& root);
// `path` itself when it holds a manifest, else the checkpoint a resume in
// it takes (ResumeCheckpoint), else `path` (ReadManifest then says what is
// wrong).
Result<std::string> ResolveCheckpointDir(Env* env, const std::string& path);

}  // namespace tessera

#endif  // TESSERA_FORMATS_NATIVE_FILES_H_
