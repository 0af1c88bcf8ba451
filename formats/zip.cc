#include "formats/zip.h"

#include <algorithm>
#include <memory>

#include "core/checksum.h"
#include "core/endian.h"
#include "core/utf8.h"

namespace tessera {
namespace {

constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEnd = 0x06054b50;
constexpr uint32_t kZip64End = 0x06064b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr size_t kEndSize = 22;
constexpr size_t kMaxComment = 0xffff;

uint16_t U16(const char* p) { return GetLittleEndian<uint16_t>(p); }
uint32_t U32(const char* p) { return GetLittleEndian<uint32_t>(p); }
uint64_t U64(const char* p) { return GetLittleEndian<uint64_t>(p); }

struct Directory {
  uint64_t entries = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
};

// Replaces the fields of a central header that are 0xffffffff by the Zip64
// extra field's (id 1: size, compressed size, local header offset, in
// that order, each present only when its field overflowed).
Status ApplyZip64(std::string_view extra, ZipRecord* r, uint64_t* local, bool size_of,
                  bool csize_of, bool offset_of) {
  for (size_t p = 0; p + 4 <= extra.size();) {
    uint16_t id = U16(extra.data() + p), n = U16(extra.data() + p + 2);
    if (p + 4 + n > extra.size()) break;
    if (id == 1) {
      std::string_view f = extra.substr(p + 4, n);
      size_t at = 0;
      for (auto [use, out] :
           {std::pair{size_of, &r->size}, std::pair{csize_of, &r->compressed_size},
            std::pair{offset_of, local}}) {
        if (!use) continue;
        if (at + 8 > f.size()) return DataLossError("a Zip64 extra field cut short");
        *out = U64(f.data() + at);
        at += 8;
      }
      return Status::Ok();
    }
    p += 4 + n;
  }
  if (size_of || csize_of || offset_of)
    return DataLossError("a Zip64 field without its extra data");
  return Status::Ok();
}

template <typename T>
void Put(std::string* s, T v) {
  char b[sizeof(T)];
  PutLittleEndian<T>(b, v);
  s->append(b, sizeof(T));
}

constexpr uint32_t kMax32 = 0xffffffff;
constexpr uint16_t kDosDate = (0 << 9) | (1 << 5) | 1;  // 1980-01-01

// A local header whose extra field pads the data to `align` (id "FB", as
// PyTorch pads), with a Zip64 field when the size overflows.
std::string LocalHeader(const ZipRecordPlan& r, uint64_t at, uint64_t align) {
  const bool big = r.size >= kMax32;
  std::string h;
  Put<uint32_t>(&h, kLocalHeader);
  Put<uint16_t>(&h, big ? 45 : 20);
  Put<uint16_t>(&h, 0);  // flags
  Put<uint16_t>(&h, 0);  // stored
  Put<uint16_t>(&h, 0);  // time
  Put<uint16_t>(&h, kDosDate);
  Put<uint32_t>(&h, r.crc32);
  Put<uint32_t>(&h, big ? kMax32 : static_cast<uint32_t>(r.size));
  Put<uint32_t>(&h, big ? kMax32 : static_cast<uint32_t>(r.size));
  Put<uint16_t>(&h, static_cast<uint16_t>(r.name.size()));
  std::string extra;
  if (big) {
    Put<uint16_t>(&extra, 1);
    Put<uint16_t>(&extra, 16);
    Put<uint64_t>(&extra, r.size);
    Put<uint64_t>(&extra, r.size);
  }
  uint64_t end = at + 30 + r.name.size() + extra.size() + 4;
  const uint64_t pad = (align - end % align) % align;
  Put<uint16_t>(&extra, 0x4246);
  Put<uint16_t>(&extra, static_cast<uint16_t>(pad));
  extra.append(pad, 'Z');
  Put<uint16_t>(&h, static_cast<uint16_t>(extra.size()));
  return h + r.name + extra;
}

std::string CentralHeader(const ZipRecordPlan& r, uint64_t local) {
  std::string extra;
  const bool big_size = r.size >= kMax32, big_offset = local >= kMax32;
  if (big_size || big_offset) {
    Put<uint16_t>(&extra, 1);
    Put<uint16_t>(&extra, static_cast<uint16_t>((big_size ? 16 : 0) + (big_offset ? 8 : 0)));
    if (big_size) {
      Put<uint64_t>(&extra, r.size);
      Put<uint64_t>(&extra, r.size);
    }
    if (big_offset) Put<uint64_t>(&extra, local);
  }
  std::string h;
  Put<uint32_t>(&h, kCentralHeader);
  Put<uint16_t>(&h, extra.empty() ? 20 : 45);  // made by
  Put<uint16_t>(&h, extra.empty() ? 20 : 45);  // needed
  Put<uint16_t>(&h, 0);
  Put<uint16_t>(&h, 0);
  Put<uint16_t>(&h, 0);
  Put<uint16_t>(&h, kDosDate);
  Put<uint32_t>(&h, r.crc32);
  Put<uint32_t>(&h, big_size ? kMax32 : static_cast<uint32_t>(r.size));
  Put<uint32_t>(&h, big_size ? kMax32 : static_cast<uint32_t>(r.size));
  Put<uint16_t>(&h, static_cast<uint16_t>(r.name.size()));
  Put<uint16_t>(&h, static_cast<uint16_t>(extra.size()));
  Put<uint16_t>(&h, 0);  // comment
  Put<uint16_t>(&h, 0);  // disk
  Put<uint16_t>(&h, 0);  // internal attributes
  Put<uint32_t>(&h, 0);  // external attributes
  Put<uint32_t>(&h, big_offset ? kMax32 : static_cast<uint32_t>(local));
  return h + r.name + extra;
}

// Zip64 end record and locator (when needed), then the end record.
std::string EndRecords(uint64_t count, uint64_t cd_offset, uint64_t cd_size) {
  std::string e;
  const bool big = count >= 0xffff || cd_offset >= kMax32 || cd_size >= kMax32;
  if (big) {
    const uint64_t at = cd_offset + cd_size;
    Put<uint32_t>(&e, kZip64End);
    Put<uint64_t>(&e, 44);
    Put<uint16_t>(&e, 45);
    Put<uint16_t>(&e, 45);
    Put<uint32_t>(&e, 0);
    Put<uint32_t>(&e, 0);
    Put<uint64_t>(&e, count);
    Put<uint64_t>(&e, count);
    Put<uint64_t>(&e, cd_size);
    Put<uint64_t>(&e, cd_offset);
    Put<uint32_t>(&e, kZip64Locator);
    Put<uint32_t>(&e, 0);
    Put<uint64_t>(&e, at);
    Put<uint32_t>(&e, 1);
  }
  Put<uint32_t>(&e, kEnd);
  Put<uint16_t>(&e, 0);
  Put<uint16_t>(&e, 0);
  Put<uint16_t>(&e, static_cast<uint16_t>(big ? 0xffff : count));
  Put<uint16_t>(&e, static_cast<uint16_t>(big ? 0xffff : count));
  Put<uint32_t>(&e, big ? kMax32 : static_cast<uint32_t>(cd_size));
  Put<uint32_t>(&e, big ? kMax32 : static_cast<uint32_t>(cd_offset));
  Put<uint16_t>(&e, 0);
  return e;
}

}  // namespace

ZipLayout PlanStoredZip(const std::vector<ZipRecordPlan>& records, uint64_t align) {
  ZipLayout z;
  uint64_t at = 0;
  for (const ZipRecordPlan& r : records) {
    z.header_offsets.push_back(at);
    z.headers.push_back(LocalHeader(r, at, align));
    at += z.headers.back().size();
    z.data_offsets.push_back(at);
    at += r.size;
  }
  z.directory_offset = at;
  for (size_t i = 0; i < records.size(); ++i) {
    z.central_offsets.push_back(at + z.directory.size());
    z.directory += CentralHeader(records[i], z.header_offsets[i]);
  }
  const uint64_t cd_size = z.directory.size();
  z.directory += EndRecords(records.size(), z.directory_offset, cd_size);
  z.size = z.directory_offset + z.directory.size();
  return z;
}

bool LooksLikeZip(const RandomAccessFile& file, uint64_t base) {
  char magic[4];
  return file.Read(base, 4, magic).ok() && U32(magic) == kLocalHeader;
}

Result<ZipArchive> ZipArchive::Open(const RandomAccessFile& file, uint64_t base, uint64_t size,
                                    const std::string& where) {
  auto bad = [&](const std::string& what) { return DataLossError(where + ": " + what); };
  if (size < kEndSize) return bad("too short for a zip archive");
  const uint64_t tail_size = std::min<uint64_t>(size, kEndSize + kMaxComment + 20 + 56);
  std::string tail(tail_size, '\0');
  RETURN_IF_ERROR(file.Read(base + size - tail_size, tail_size, tail.data()));
  size_t end = std::string::npos;
  for (size_t p = tail_size - kEndSize + 1; p-- > 0;) {
    if (U32(tail.data() + p) == kEnd && p + kEndSize + U16(tail.data() + p + 20) == tail_size) {
      end = p;
      break;
    }
  }
  if (end == std::string::npos)
    return bad("no end-of-central-directory record (not a zip archive)");
  const char* e = tail.data() + end;
  Directory dir{U16(e + 10), U32(e + 16), U32(e + 12)};
  if (U16(e + 4) != 0 || U16(e + 6) != 0) return bad("a multi-disk archive");
  if (end >= 20 && U32(e - 20) == kZip64Locator) {
    const uint64_t at = U64(e - 20 + 8);
    if (size < 56 || at > size - 56) return bad("the Zip64 end record lies outside the archive");
    char z[56];
    RETURN_IF_ERROR(file.Read(base + at, 56, z));
    if (U32(z) != kZip64End) return bad("the Zip64 locator points at no Zip64 end record");
    dir = {U64(z + 32), U64(z + 48), U64(z + 40)};
  }
  if (dir.offset > size || dir.size > size - dir.offset || dir.entries > dir.size / 46) {
    return bad("the central directory (" + std::to_string(dir.entries) + " records, " +
               std::to_string(dir.size) + " bytes at " + std::to_string(dir.offset) +
               ") does not fit the archive of " + std::to_string(size) + " bytes");
  }
  constexpr uint64_t kMaxDirectory = uint64_t{1} << 30;
  if (dir.size > kMaxDirectory) {
    return ResourceExhaustedError(where + ": a central directory of " + std::to_string(dir.size) +
                                  " bytes, more than this reader takes");
  }
  std::string cd(dir.size, '\0');
  RETURN_IF_ERROR(file.Read(base + dir.offset, dir.size, cd.data()));
  ZipArchive zip;
  zip.base_ = base;
  zip.where_ = where;
  size_t p = 0;
  for (uint64_t i = 0; i < dir.entries; ++i) {
    if (p + 46 > cd.size() || U32(cd.data() + p) != kCentralHeader) {
      return bad("central directory record " + std::to_string(i) + " is damaged");
    }
    const char* h = cd.data() + p;
    const size_t name_len = U16(h + 28), extra_len = U16(h + 30), comment_len = U16(h + 32);
    if (p + 46 + name_len + extra_len + comment_len > cd.size()) {
      return bad("central directory record " + std::to_string(i) + " runs past the directory");
    }
    ZipRecord r;
    r.flags = U16(h + 8);
    r.method = U16(h + 10);
    r.crc32 = U32(h + 16);
    r.compressed_size = U32(h + 20);
    r.size = U32(h + 24);
    r.name.assign(h + 46, name_len);
    uint64_t local = U32(h + 42);
    Status z =
        ApplyZip64(std::string_view(h + 46 + name_len, extra_len), &r, &local, r.size == 0xffffffff,
                   r.compressed_size == 0xffffffff, local == 0xffffffff);
    if (!z.ok()) return bad("record '" + PrintableText(r.name) + "': " + z.message());
    char lh[30];
    if (local > size - std::min<uint64_t>(size, 30)) {
      return bad("record '" + PrintableText(r.name) +
                 "': its local header lies outside the archive");
    }
    RETURN_IF_ERROR(file.Read(base + local, 30, lh));
    if (U32(lh) != kLocalHeader)
      return bad("record '" + PrintableText(r.name) + "': no local header at its offset");
    r.data_offset = local + 30 + U16(lh + 26) + U16(lh + 28);
    if (r.data_offset > size || r.compressed_size > size - r.data_offset) {
      return bad("record '" + PrintableText(r.name) + "' (" + std::to_string(r.compressed_size) +
                 " bytes) runs past the end of the archive");
    }
    if (!zip.by_name_.emplace(r.name, zip.records_.size()).second) {
      // Readers disagree on which copy counts (Python's zipfile takes the last).
      return bad("record '" + PrintableText(r.name) + "' appears twice");
    }
    zip.records_.push_back(std::move(r));
    p += 46 + name_len + extra_len + comment_len;
  }
  return zip;
}

const ZipRecord* ZipArchive::Find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &records_[it->second];
}

Status ZipArchive::CheckStored(const ZipRecord& record) const {
  if (record.flags & 1)
    return DataLossError(where_ + ": record '" + PrintableText(record.name) + "' is encrypted");
  if (record.method != 0 || record.compressed_size != record.size) {
    return UnimplementedError(where_ + ": record '" + PrintableText(record.name) +
                              "' is compressed (method " + std::to_string(record.method) +
                              "); only stored records are read in place, as PyTorch writes them");
  }
  return Status::Ok();
}

Result<std::string> ZipArchive::ReadRecord(const RandomAccessFile& file, const ZipRecord& record,
                                           uint64_t max_bytes) const {
  RETURN_IF_ERROR(CheckStored(record));
  if (record.size > max_bytes) {
    return ResourceExhaustedError(where_ + ": record '" + PrintableText(record.name) + "' has " +
                                  std::to_string(record.size) + " bytes, more than the " +
                                  std::to_string(max_bytes) + " this reader takes");
  }
  std::string bytes(record.size, '\0');
  RETURN_IF_ERROR(file.Read(FileOffset(record), record.size, bytes.data()));
  if (Crc32(bytes.data(), bytes.size()) != record.crc32) {
    return DataLossError(where_ + ": record '" + PrintableText(record.name) + "' fails its CRC-32");
  }
  return bytes;
}

Result<uint32_t> Crc32OfRange(const RandomAccessFile& file, uint64_t offset, uint64_t size) {
  constexpr uint64_t kChunk = uint64_t{64} << 20;
  std::unique_ptr<char[]> buf;
  uint32_t crc = 0;
  for (uint64_t at = 0; at < size; at += kChunk) {
    const uint64_t n = std::min(kChunk, size - at);
    ASSIGN_OR_RETURN(auto view, n >= kViewAtLeast ? file.View(offset + at, n)
                                                  : Result<std::unique_ptr<FileView>>(nullptr));
    if (view) {
      crc = Crc32(view->data(), n, crc);
      continue;
    }
    if (!buf) buf.reset(new char[std::min(size, kChunk)]);
    RETURN_IF_ERROR(file.Read(offset + at, n, buf.get()));
    crc = Crc32(buf.get(), n, crc);
  }
  return crc;
}

Status ZipArchive::VerifyRecord(const RandomAccessFile& file, const ZipRecord& record) const {
  RETURN_IF_ERROR(CheckStored(record));
  ASSIGN_OR_RETURN(uint32_t crc, Crc32OfRange(file, FileOffset(record), record.size));
  if (crc != record.crc32) {
    return DataLossError(where_ + ": record '" + PrintableText(record.name) +
                         "' fails its CRC-32 (stored " + std::to_string(record.crc32) +
                         ", computed " + std::to_string(crc) + ")");
  }
  return Status::Ok();
}

}  // namespace tessera
