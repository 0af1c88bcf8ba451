// Reading the records of a zip archive in place: the central directory
// (Zip64 included) and each record's data offset, so that stored
// (uncompressed) records are read, mapped or verified (CRC-32) where they
// lie. PyTorch's torch.save files and DCP items are such archives, with
// every record stored and its data 64-byte aligned.
//
// The archive may be a window of a larger file (a DCP item at an offset
// of a .distcp file): offsets are relative to the window. Every offset and
// length is checked against the window before it is used.
#ifndef TESSERA_FORMATS_ZIP_H_
#define TESSERA_FORMATS_ZIP_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/env.h"
#include "core/status.h"

namespace tessera {

struct ZipRecord {
  std::string name;
  uint16_t method = 0;  // 0: stored; 8: deflated
  uint16_t flags = 0;
  uint32_t crc32 = 0;
  uint64_t compressed_size = 0;
  uint64_t size = 0;
  uint64_t data_offset = 0;  // in the window, from the record's local header
};

class ZipArchive {
 public:
  // Reads the central directory of the archive occupying [base, base +
  // size) of `file`; `where` names it in errors.
  static Result<ZipArchive> Open(const RandomAccessFile& file, uint64_t base, uint64_t size,
                                 const std::string& where);

  const std::vector<ZipRecord>& records() const { return records_; }
  // The record named `name`, or null.
  const ZipRecord* Find(std::string_view name) const;
  // The stored bytes of `record` lie at this offset of the file.
  uint64_t FileOffset(const ZipRecord& record) const { return base_ + record.data_offset; }
  // Checks that `record` is stored uncompressed and unencrypted (so its
  // bytes are read in place), naming it.
  Status CheckStored(const ZipRecord& record) const;
  // Reads a stored record whole (small records: a pickle, a version),
  // refusing one over `max_bytes`.
  Result<std::string> ReadRecord(const RandomAccessFile& file, const ZipRecord& record,
                                 uint64_t max_bytes) const;
  // The CRC-32 of a stored record's bytes, read a few MiB at a time,
  // against the directory's; a DataLoss error naming the record when
  // they differ.
  Status VerifyRecord(const RandomAccessFile& file, const ZipRecord& record) const;
  const std::string& where() const { return where_; }

 private:
  uint64_t base_ = 0;
  std::string where_;
  std::vector<ZipRecord> records_;
  std::unordered_map<std::string, size_t> by_name_;  // the first record of each name
};

// Writing: the layout of an archive of stored records, each record's data
// aligned (PyTorch aligns to 64 bytes, so that readers map tensors in
// place), Zip64 fields where a size, an offset or the count overflows.
// The writer puts `headers[i]` at `header_offsets[i]`, the record's bytes at
// `data_offsets[i]` and `directory` at `directory_offset`. A record whose
// CRC-32 is only known once its bytes are written is planned with crc32 0
// and patched at `LocalCrcOffset` and `CentralCrcOffset` (4 bytes, little
// endian) afterwards.
struct ZipRecordPlan {
  std::string name;
  uint64_t size = 0;
  uint32_t crc32 = 0;
};

struct ZipLayout {
  std::vector<uint64_t> header_offsets;
  std::vector<std::string> headers;
  std::vector<uint64_t> data_offsets;
  std::vector<uint64_t> central_offsets;  // of each record's central header
  uint64_t directory_offset = 0;
  std::string directory;  // central directory, Zip64 records if needed, end record
  uint64_t size = 0;      // of the whole archive
  uint64_t LocalCrcOffset(size_t i) const { return header_offsets[i] + 14; }
  uint64_t CentralCrcOffset(size_t i) const { return central_offsets[i] + 16; }
};

ZipLayout PlanStoredZip(const std::vector<ZipRecordPlan>& records, uint64_t align);

// The CRC-32 of `size` bytes at `offset` of `file`: hashed where the file
// lends (maps) its bytes, without a copy, else read a few MiB at a time.
Result<uint32_t> Crc32OfRange(const RandomAccessFile& file, uint64_t offset, uint64_t size);

// Whether the window starts with a zip local file header ("PK\3\4").
bool LooksLikeZip(const RandomAccessFile& file, uint64_t base = 0);

}  // namespace tessera

#endif  // TESSERA_FORMATS_ZIP_H_
