#include "formats/parity.h"

#include <algorithm>
#include <cstring>

#include "core/checksum.h"

namespace tessera {
namespace {

constexpr uint64_t kChunk = 4 << 20;

// dst ^= src, n bytes.
void XorInto(char* dst, const char* src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t a, b;
    std::memcpy(&a, dst + i, 8);
    std::memcpy(&b, src + i, 8);
    a ^= b;
    std::memcpy(dst + i, &a, 8);
  }
  for (; i < n; ++i) dst[i] ^= src[i];
}

// XORs [offset, offset + n) of `file` (`size` bytes long; zeros past it)
// into dst, using `scratch` (n bytes).
Status XorRange(const RandomAccessFile& file, uint64_t size, uint64_t offset, size_t n, char* dst,
                char* scratch) {
  if (offset >= size) return Status::Ok();
  const size_t have = static_cast<size_t>(std::min<uint64_t>(n, size - offset));
  RETURN_IF_ERROR(file.Read(offset, have, scratch));
  XorInto(dst, scratch, have);
  return Status::Ok();
}

}  // namespace

Result<std::vector<std::unique_ptr<RandomAccessFile>>> OpenParityMembers(
    Env* env, const std::vector<ParityMember>& members) {
  std::vector<std::unique_ptr<RandomAccessFile>> files;
  for (const ParityMember& m : members) {
    if (!env->FileExists(m.path)) return NotFoundError("file '" + m.path + "' is missing");
    ASSIGN_OR_RETURN(auto f, env->NewRandomAccessFile(m.path));
    ASSIGN_OR_RETURN(uint64_t size, f->Size());
    if (size != m.size) {
      return DataLossError("file '" + m.path + "' has " + std::to_string(size) +
                           " bytes, the manifest records " + std::to_string(m.size));
    }
    files.push_back(std::move(f));
  }
  return files;
}

namespace {

class ParityRebuild : public RandomAccessFile {
 public:
  ParityRebuild(std::vector<std::unique_ptr<RandomAccessFile>> files, std::vector<uint64_t> sizes,
                uint64_t lost_size)
      : files_(std::move(files)), sizes_(std::move(sizes)), lost_size_(lost_size) {}

  Status Read(uint64_t offset, size_t size, void* dst) const override {
    if (offset + size > lost_size_ || offset + size < offset) {
      return DataLossError("rebuilt file: range [" + std::to_string(offset) + ", " +
                           std::to_string(offset + size) + ") is past its end " +
                           std::to_string(lost_size_));
    }
    char* out = static_cast<char*>(dst);
    std::memset(out, 0, size);
    std::vector<char> scratch(std::min<uint64_t>(size, kChunk));
    for (uint64_t done = 0; done < size; done += kChunk) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, size - done));
      for (size_t i = 0; i < files_.size(); ++i) {
        RETURN_IF_ERROR(
            XorRange(*files_[i], sizes_[i], offset + done, n, out + done, scratch.data()));
      }
    }
    return Status::Ok();
  }
  Result<uint64_t> Size() const override { return lost_size_; }

 private:
  std::vector<std::unique_ptr<RandomAccessFile>> files_;  // the other members, then the parity
  std::vector<uint64_t> sizes_;
  uint64_t lost_size_;
};

}  // namespace

Result<uint64_t> AppendParity(Env* env, const std::vector<ParityMember>& members, WritableFile& out,
                              const std::string& path, uint64_t* checksum) {
  ASSIGN_OR_RETURN(auto files, OpenParityMembers(env, members));
  uint64_t size = 0;
  for (const ParityMember& m : members) size = std::max(size, m.size);
  std::vector<char> buf(kChunk), scratch(kChunk);
  Xxh3Hasher hash;
  for (uint64_t offset = 0; offset < size; offset += kChunk) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, size - offset));
    std::memset(buf.data(), 0, n);
    for (size_t i = 0; i < files.size(); ++i) {
      RETURN_IF_ERROR(XorRange(*files[i], members[i].size, offset, n, buf.data(), scratch.data())
                          .Annotate("parity file '" + path + "'"));
    }
    hash.Update(buf.data(), n);
    RETURN_IF_ERROR(out.Append(buf.data(), n).Annotate("parity file '" + path + "'"));
  }
  if (checksum != nullptr) *checksum = hash.Digest();
  return size;
}

Result<uint64_t> WriteParityFile(Env* env, const std::vector<ParityMember>& members,
                                 const std::string& path, uint64_t* checksum) {
  ASSIGN_OR_RETURN(auto out, env->NewWritableFile(path));
  ASSIGN_OR_RETURN(uint64_t size, AppendParity(env, members, *out, path, checksum));
  RETURN_IF_ERROR(out->Sync());
  RETURN_IF_ERROR(out->Close());
  return size;
}

Result<uint64_t> FileChecksum(Env* env, const std::string& path) {
  ASSIGN_OR_RETURN(auto file, env->NewRandomAccessFile(path));
  ASSIGN_OR_RETURN(uint64_t size, file->Size());
  std::vector<char> buf(std::min<uint64_t>(size, kChunk));
  Xxh3Hasher hash;
  for (uint64_t offset = 0; offset < size; offset += kChunk) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, size - offset));
    RETURN_IF_ERROR(file->Read(offset, n, buf.data()));
    hash.Update(buf.data(), n);
  }
  return hash.Digest();
}

Result<std::unique_ptr<RandomAccessFile>> OpenParityRebuild(Env* env,
                                                            const std::vector<ParityMember>& others,
                                                            const ParityMember& parity,
                                                            uint64_t lost_size) {
  std::vector<ParityMember> all = others;
  all.push_back(parity);
  ASSIGN_OR_RETURN(auto files, OpenParityMembers(env, all));
  if (lost_size > parity.size) {
    return DataLossError("parity file '" + parity.path + "' is shorter than the file to rebuild");
  }
  std::vector<uint64_t> sizes;
  for (const ParityMember& m : all) sizes.push_back(m.size);
  return std::unique_ptr<RandomAccessFile>(
      new ParityRebuild(std::move(files), std::move(sizes), lost_size));
}

}  // namespace tessera
