// Native checkpoint files: data files of 4 KiB-aligned pieces, and the
// manifest / `latest` commit protocol (formats/native.md).
#ifndef TESSERA_FORMATS_NATIVE_FILES_H_
#define TESSERA_FORMATS_NATIVE_FILES_H_

#include <memory>
#include <string>

#include "core/env.h"
#include "core/status.h"
#include "formats/manifest.h"

namespace tessera {

inline constexpr char kManifestName[] = "manifest.pb";
inline constexpr char kLatestName[] = "latest";

// Appends pieces to one data file. Not thread-safe.
class DataFileWriter {
 public:
  // Creates `path` and writes its header; `file_index` is the file's index
  // in Manifest::files, recorded in every piece.
  static Result<std::unique_ptr<DataFileWriter>> Create(Env* env, const std::string& path,
                                                        uint32_t file_index);
  // Encodes, pads to the next 4 KiB boundary, writes and checksums one
  // piece holding `box` of a `dtype` tensor.
  Result<PieceInfo> Append(const void* raw, size_t size, const Box& box, DType dtype, Codec codec,
                           int level);
  // Syncs and closes; the file's final size.
  Result<uint64_t> Finish();

 private:
  DataFileWriter(std::string path, std::unique_ptr<WritableFile> file, uint32_t index)
      : path_(std::move(path)), file_(std::move(file)), index_(index) {}
  std::string path_;
  std::unique_ptr<WritableFile> file_;
  uint32_t index_;
  uint64_t size_ = 0;
};

// Checks the magic and version of an open data file.
Status CheckDataFileHeader(const RandomAccessFile& file, const std::string& path);

// Reads one piece, verifies its checksum and decodes it into `raw`
// (piece.raw_length bytes). Errors name the file, tensor and box.
Status ReadPiece(const RandomAccessFile& file, const std::string& path, const std::string& tensor,
                 const PieceInfo& piece, DType dtype, void* raw);

// Step 2 of the commit: manifest.pb written atomically into `dir`.
Status CommitManifest(Env* env, const std::string& dir, const Manifest& manifest);
// Reads `dir`/manifest.pb; a directory without one is an incomplete
// checkpoint (FailedPrecondition naming it).
Result<Manifest> ReadManifest(Env* env, const std::string& dir);
// Step 3: `root`/latest names checkpoint `name` (a directory in `root`).
Status SetLatest(Env* env, const std::string& root, const std::string& name);
Result<std::string> ReadLatest(Env* env, const std::string& root);

}  // namespace tessera

#endif  // TESSERA_FORMATS_NATIVE_FILES_H_
