// MindSpore .ckpt files (formats/mindspore_checkpoint.proto), read and
// written at the protobuf wire level so that tensor bytes are addressed in
// place: scanning a file reads its framing, never its tensor contents.
//
// What MindSpore writes (mindspore/train/serialization.py, _exec_save):
// one `Checkpoint { Value { tag, TensorProto { dims..., tensor_type,
// tensor_content } } }` per record, fields in number order, dims unpacked;
// a scalar has no dims (older versions wrote [0]: read as a scalar too
// when its content is one element); a tensor of more than 512 MiB is cut
// into records of 512 MiB of bytes with the same tag and the full dims;
// optionally the
// trailer "crc_num" + 10-byte big-endian CRC-32 of everything before.
// A string of save_checkpoint's `append_dict` is a record of type "str",
// dims [0], whose content is numpy's '<U' form of the string: UTF-32LE code
// points, at least one (an empty string is one NUL), trailing NULs dropped
// on load.
#ifndef TESSERA_FORMATS_MINDSPORE_CKPT_H_
#define TESSERA_FORMATS_MINDSPORE_CKPT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/env.h"
#include "core/status.h"

namespace tessera {

inline constexpr uint64_t kMindSporeChunkBytes = uint64_t{512} << 20;

// "Float32" <-> kF32, "BFloat16", "Int64", "UInt8", "Bool", ... (MindSpore
// 1.x's "Uint8" spellings are read too; "Int4", packed qint4x2, is not).
std::string_view MindSporeDTypeName(DType dtype);
Result<DType> ParseMindSporeDType(std::string_view name);

// A MapParameter (mindspore/train/serialization.py, _write_mapparameter)
// is a record whose Value holds a MapTensorProto of three TensorProtos,
// keys [n], values [n, ...] and status [n], typed by numpy names ("int64",
// "float32"); a large map is exported in several such records with the
// same tag, concatenated along dimension 0 on load.
inline constexpr size_t kMindSporeMapParts = 3;

// One record of a file.
struct MindSporeRecord {
  std::string tag;
  std::vector<int64_t> dims;
  std::string type;
  uint64_t content_offset = 0;  // in the file
  uint64_t content_size = 0;
  // A map tensor's keys, values and status (the fields above unused).
  std::vector<MindSporeRecord> map;
};

struct MindSporeFile {
  std::vector<MindSporeRecord> records;  // file order
  bool has_crc = false;
};

// Parses the framing of a .ckpt file. Every length is checked against the
// file before it is used; strings (tag, type) are capped at 64 KiB; a map
// tensor must have its three parts; encrypted files are refused by name. With a CRC trailer the
// CRC is verified (reading the file once).
Result<MindSporeFile> ScanMindSporeCkpt(const RandomAccessFile& file, const std::string& path);

// Whether the first bytes look like a .ckpt record (field 1, a Value with a
// tag first).
bool LooksLikeMindSporeCkpt(const RandomAccessFile& file);

// The bytes of one record up to its tensor content, which must follow
// immediately (`content_size` bytes).
std::string MindSporeRecordHeader(std::string_view tag, const std::vector<int64_t>& dims,
                                  std::string_view type, uint64_t content_size);

// "float32" <-> kF32, ...: the numpy names of map tensor parts.
std::string_view MindSporeNumpyDTypeName(DType dtype);
Result<DType> ParseMindSporeNumpyDType(std::string_view name);
// Whether MindSpore's loader decodes a map part of this type (its
// np_type_convert: int32, float32, float16, float64; others it misreads).
bool MindSporeLoadsMapPart(DType dtype);

struct MindSporeMapPart {
  std::vector<int64_t> dims;
  std::string type;  // a numpy name
  uint64_t content_size = 0;
};

// The bytes of a map tensor record around its parts' contents: headers[i]
// comes just before part i's content (headers[0] opens the record).
std::vector<std::string> MindSporeMapRecordHeaders(std::string_view tag,
                                                   const std::vector<MindSporeMapPart>& parts);

inline constexpr std::string_view kMindSporeStringType = "str";
// Strings longer than this are refused (a hostile record never causes a
// huge allocation).
inline constexpr uint64_t kMindSporeMaxStringBytes = uint64_t{16} << 20;

// The UTF-8 text of a "str" record's content. Fails (saying why) on a size
// that is not a multiple of 4 or a code point that is not a Unicode scalar.
Result<std::string> MindSporeStringValue(std::string_view content);

// The whole record MindSpore writes for string `utf8` under `tag`. Fails
// when `utf8` is not valid UTF-8 (core/utf8.h's IsUtf8 says beforehand).
Result<std::string> MindSporeStringRecord(std::string_view tag, std::string_view utf8);

}  // namespace tessera

#endif  // TESSERA_FORMATS_MINDSPORE_CKPT_H_
