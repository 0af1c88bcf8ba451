#include "formats/native_files.h"

#include <cstring>

#include "core/checksum.h"
#include "formats/codec.h"

namespace tessera {
namespace {

constexpr char kMagic[8] = {'T', 'S', 'R', 'D', 'A', 'T', 'A', '\0'};
constexpr uint32_t kDataFileVersion = 1;
constexpr uint32_t kHeaderSize = 4096;

void PutU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

}  // namespace

Result<std::unique_ptr<DataFileWriter>> DataFileWriter::Create(Env* env, const std::string& path,
                                                               uint32_t file_index) {
  ASSIGN_OR_RETURN(auto file, env->NewWritableFile(path));
  std::string header(kHeaderSize, '\0');
  std::memcpy(header.data(), kMagic, sizeof(kMagic));
  PutU32(header.data() + 8, kDataFileVersion);
  PutU32(header.data() + 12, kHeaderSize);
  RETURN_IF_ERROR(file->Append(header.data(), header.size()));
  std::unique_ptr<DataFileWriter> w(new DataFileWriter(path, std::move(file), file_index));
  w->size_ = kHeaderSize;
  return w;
}

Result<PieceInfo> DataFileWriter::Append(const void* raw, size_t size, const Box& box, DType dtype,
                                         Codec codec, int level) {
  ASSIGN_OR_RETURN(std::string stored, EncodePiece(raw, size, dtype, codec, level));
  PieceInfo p;
  p.file = index_;
  p.offset = size_;
  p.length = stored.size();
  p.box = box;
  p.codec = codec;
  p.raw_length = size;
  p.checksum = Xxh3(stored.data(), stored.size());
  const uint64_t padded = (stored.size() + kPieceAlignment - 1) / kPieceAlignment * kPieceAlignment;
  stored.resize(padded, '\0');
  RETURN_IF_ERROR(file_->Append(stored.data(), stored.size()));
  size_ += padded;
  return p;
}

Result<uint64_t> DataFileWriter::Finish() {
  RETURN_IF_ERROR(file_->Sync());
  RETURN_IF_ERROR(file_->Close());
  return size_;
}

Status CheckDataFileHeader(const RandomAccessFile& file, const std::string& path) {
  char header[16];
  Status s = file.Read(0, sizeof(header), header);
  if (!s.ok()) return DataLossError("data file '" + path + "': too short for its header");
  if (std::memcmp(header, kMagic, sizeof(kMagic)) != 0) {
    return DataLossError("data file '" + path + "': bad magic (not a Tessera data file)");
  }
  const uint32_t version = GetU32(header + 8);
  if (version == 0 || version > kDataFileVersion) {
    return FailedPreconditionError("data file '" + path + "': version " + std::to_string(version) +
                                   " is not readable by this Tessera");
  }
  return Status::Ok();
}

namespace {

// Reads the stored bytes of `piece` into `dst` and checks their checksum.
Status ReadStored(const RandomAccessFile& file, const PieceInfo& piece, void* dst,
                  const std::string& ctx) {
  Status s = file.Read(piece.offset, piece.length, dst);
  if (!s.ok()) return DataLossError(ctx + ": " + s.message());
  if (Xxh3(dst, piece.length) != piece.checksum) {
    return DataLossError(ctx + ": checksum mismatch (corrupt data)");
  }
  return Status::Ok();
}

}  // namespace

Status ReadPiece(const RandomAccessFile& file, const std::string& path, const std::string& tensor,
                 const PieceInfo& piece, DType dtype, void* raw) {
  const std::string ctx =
      "file '" + path + "': tensor '" + tensor + "' piece " + ToString(piece.box);
  // Raw pieces land directly in the caller's buffer; encoded ones are staged.
  if (piece.codec == Codec::kRaw) return ReadStored(file, piece, raw, ctx);
  std::string stored(piece.length, '\0');
  RETURN_IF_ERROR(ReadStored(file, piece, stored.data(), ctx));
  return DecodePiece(stored.data(), stored.size(), piece.codec, dtype, raw, piece.raw_length, ctx);
}

Status CommitManifest(Env* env, const std::string& dir, const Manifest& manifest) {
  return WriteFileAtomically(env, JoinPath(dir, kManifestName), SerializeManifest(manifest));
}

Result<Manifest> ReadManifest(Env* env, const std::string& dir) {
  const std::string path = JoinPath(dir, kManifestName);
  if (!env->FileExists(path)) {
    if (!env->IsDirectory(dir)) return NotFoundError("checkpoint '" + dir + "' does not exist");
    return FailedPreconditionError("checkpoint '" + dir +
                                   "' is incomplete (no manifest.pb): it was never committed");
  }
  ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(env, path));
  return ParseManifest(bytes, path);
}

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

}  // namespace tessera
