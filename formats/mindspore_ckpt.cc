#include "formats/mindspore_ckpt.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "core/checksum.h"
#include "core/utf8.h"

namespace tessera {
namespace {

constexpr DTypeNaming kNames[] = {
    {DType::kF32, "Float32"}, {DType::kF16, "Float16"}, {DType::kBF16, "BFloat16"},
    {DType::kF64, "Float64"}, {DType::kI8, "Int8"},     {DType::kU8, "UInt8"},
    {DType::kI16, "Int16"},   {DType::kU16, "UInt16"},  {DType::kI32, "Int32"},
    {DType::kU32, "UInt32"},  {DType::kI64, "Int64"},   {DType::kU64, "UInt64"},
    {DType::kBool, "Bool"},
};

// MindSpore 1.x spelled the unsigned types so; still read.
constexpr DTypeNaming kLegacyNames[] = {
    {DType::kU8, "Uint8"},
    {DType::kU16, "Uint16"},
    {DType::kU32, "Uint32"},
    {DType::kU64, "Uint64"},
};

// The numpy names MapParameter components are recorded with.
constexpr DTypeNaming kNumpyNames[] = {
    {DType::kF32, "float32"}, {DType::kF16, "float16"}, {DType::kF64, "float64"},
    {DType::kI8, "int8"},     {DType::kU8, "uint8"},    {DType::kI16, "int16"},
    {DType::kU16, "uint16"},  {DType::kI32, "int32"},   {DType::kU32, "uint32"},
    {DType::kI64, "int64"},   {DType::kU64, "uint64"},  {DType::kBool, "bool"},
};

constexpr uint64_t kMaxString = 64 << 10;
constexpr char kCrcMagic[] = "crc_num";
constexpr uint64_t kCrcTrailer = 17;

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// Reads a file front to back through a small window; lengths are checked
// against `end` before anything is skipped or read.
class Cursor {
 public:
  Cursor(const RandomAccessFile& file, const std::string& path, uint64_t end)
      : file_(file), path_(path), end_(end) {}

  uint64_t pos() const { return pos_; }
  bool done() const { return pos_ >= end_; }

  Status Bad(const std::string& what) const {
    return DataLossError("MindSpore checkpoint '" + path_ + "': " + what + " (at byte " +
                         std::to_string(pos_) + ")");
  }

  Result<uint64_t> Varint(uint64_t limit) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= limit) return Bad("a number runs past the end of its record");
      ASSIGN_OR_RETURN(uint8_t b, Byte());
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
    return Bad("a number longer than 10 bytes");
  }

  // A length-delimited field's length, checked against `limit`.
  Result<uint64_t> Length(uint64_t limit) {
    ASSIGN_OR_RETURN(uint64_t n, Varint(limit));
    if (n > limit - pos_) {
      return Bad("a field of " + std::to_string(n) + " bytes runs past the end of its record (" +
                 std::to_string(limit - pos_) + " bytes left)");
    }
    return n;
  }

  Result<std::string> String(uint64_t limit, const char* what) {
    ASSIGN_OR_RETURN(uint64_t n, Length(limit));
    if (n > kMaxString) return Bad(std::string(what) + " of " + std::to_string(n) + " bytes");
    std::string s(n, '\0');
    for (uint64_t i = 0; i < n; ++i) {
      ASSIGN_OR_RETURN(uint8_t b, Byte());
      s[i] = static_cast<char>(b);
    }
    return s;
  }

  void Skip(uint64_t n) { pos_ += n; }

  // Skips a field of wire type `wt` that we do not use.
  Status SkipField(int wt, uint64_t limit) {
    switch (wt) {
      case 0:
        return Varint(limit).status();
      case 1:
      case 5: {
        const uint64_t n = wt == 1 ? 8 : 4;
        if (n > limit - pos_) return Bad("a fixed-size field runs past its record");
        pos_ += n;
        return Status::Ok();
      }
      case 2: {
        ASSIGN_OR_RETURN(uint64_t n, Length(limit));
        pos_ += n;
        return Status::Ok();
      }
      default:
        return Bad("wire type " + std::to_string(wt) + " is not valid here");
    }
  }

 private:
  Result<uint8_t> Byte() {
    if (pos_ < win_begin_ || pos_ >= win_begin_ + win_.size()) {
      const uint64_t n = std::min<uint64_t>(kWindow, end_ - pos_);
      if (n == 0) return Bad("unexpected end of file");
      win_.resize(n);
      RETURN_IF_ERROR(file_.Read(pos_, n, win_.data()));
      win_begin_ = pos_;
    }
    return static_cast<uint8_t>(win_[pos_++ - win_begin_]);
  }

  static constexpr uint64_t kWindow = 64 << 10;
  const RandomAccessFile& file_;
  const std::string& path_;
  uint64_t end_;
  uint64_t pos_ = 0;
  uint64_t win_begin_ = 0;
  std::string win_;
};

Status ParseTensor(Cursor& c, uint64_t end, MindSporeRecord* r) {
  bool has_type = false, has_content = false;
  while (c.pos() < end) {
    ASSIGN_OR_RETURN(uint64_t key, c.Varint(end));
    const int field = static_cast<int>(key >> 3), wt = static_cast<int>(key & 7);
    if (field == 1 && wt == 0) {
      ASSIGN_OR_RETURN(uint64_t d, c.Varint(end));
      r->dims.push_back(static_cast<int64_t>(d));
    } else if (field == 1 && wt == 2) {  // packed dims
      ASSIGN_OR_RETURN(uint64_t n, c.Length(end));
      const uint64_t stop = c.pos() + n;
      while (c.pos() < stop) {
        ASSIGN_OR_RETURN(uint64_t d, c.Varint(stop));
        r->dims.push_back(static_cast<int64_t>(d));
      }
    } else if (field == 2 && wt == 2) {
      ASSIGN_OR_RETURN(r->type, c.String(end, "a tensor type"));
      has_type = true;
    } else if (field == 3 && wt == 2) {
      ASSIGN_OR_RETURN(uint64_t n, c.Length(end));
      r->content_offset = c.pos();
      r->content_size = n;
      c.Skip(n);
      has_content = true;
    } else {
      RETURN_IF_ERROR(c.SkipField(wt, end));
    }
    if (r->dims.size() > 64) return c.Bad("tensor '" + r->tag + "' has more than 64 dims");
  }
  if (!has_type || !has_content) {
    return c.Bad("tensor '" + r->tag + "' lacks its " + (has_type ? "content" : "type"));
  }
  for (int64_t d : r->dims) {
    if (d < 0) return c.Bad("tensor '" + r->tag + "' has a negative dimension");
  }
  return Status::Ok();
}

Status ParseValue(Cursor& c, uint64_t end, MindSporeRecord* r) {
  bool has_tag = false, has_tensor = false;
  while (c.pos() < end) {
    ASSIGN_OR_RETURN(uint64_t key, c.Varint(end));
    const int field = static_cast<int>(key >> 3), wt = static_cast<int>(key & 7);
    if (field == 1 && wt == 2) {
      ASSIGN_OR_RETURN(r->tag, c.String(end, "a tag"));
      has_tag = true;
    } else if (field == 2 && wt == 2) {
      ASSIGN_OR_RETURN(uint64_t n, c.Length(end));
      RETURN_IF_ERROR(ParseTensor(c, c.pos() + n, r));
      has_tensor = true;
    } else if (field == 3 && wt == 2) {  // MapTensorProto: keys, values, status
      ASSIGN_OR_RETURN(uint64_t n, c.Length(end));
      const uint64_t stop = c.pos() + n;
      while (c.pos() < stop) {
        ASSIGN_OR_RETURN(uint64_t key, c.Varint(stop));
        if (key != ((1 << 3) | 2)) {
          RETURN_IF_ERROR(c.SkipField(static_cast<int>(key & 7), stop));
          continue;
        }
        if (r->map.size() == kMindSporeMapParts) {
          return c.Bad("map tensor '" + r->tag + "' has more than " +
                       std::to_string(kMindSporeMapParts) + " parts");
        }
        ASSIGN_OR_RETURN(uint64_t len, c.Length(stop));
        MindSporeRecord part;
        part.tag = r->tag;
        RETURN_IF_ERROR(ParseTensor(c, c.pos() + len, &part));
        r->map.push_back(std::move(part));
      }
      if (r->map.size() != kMindSporeMapParts) {
        return c.Bad("map tensor '" + r->tag + "' has " + std::to_string(r->map.size()) +
                     " parts (keys, values and status expected)");
      }
      has_tensor = true;
    } else {
      RETURN_IF_ERROR(c.SkipField(wt, end));
    }
  }
  if (!has_tag || !has_tensor)
    return c.Bad(has_tag ? "'" + r->tag + "' has no tensor" : "a record has no tag");
  return Status::Ok();
}

}  // namespace

std::string_view MindSporeDTypeName(DType dtype) { return DTypeNameIn(kNames, dtype); }

Result<DType> ParseMindSporeDType(std::string_view name) {
  if (auto dtype = DTypeNamedIn(kNames, name)) return *dtype;
  if (auto dtype = DTypeNamedIn(kLegacyNames, name)) return *dtype;
  return InvalidArgumentError("unsupported MindSpore tensor type '" + std::string(name) + "'");
}

Result<MindSporeFile> ScanMindSporeCkpt(const RandomAccessFile& file, const std::string& path) {
  ASSIGN_OR_RETURN(uint64_t size, file.Size());
  MindSporeFile out;
  uint64_t end = size;
  if (size >= kCrcTrailer) {
    char tail[kCrcTrailer];
    RETURN_IF_ERROR(file.Read(size - kCrcTrailer, kCrcTrailer, tail));
    if (std::memcmp(tail, kCrcMagic, 7) == 0) {
      uint64_t stored = 0;
      for (int i = 7; i < 17; ++i) stored = (stored << 8) | static_cast<unsigned char>(tail[i]);
      end = size - kCrcTrailer;
      uint32_t crc = 0;
      std::unique_ptr<char[]> buf(new char[1 << 20]);
      for (uint64_t pos = 0; pos < end; pos += 1 << 20) {
        const uint64_t n = std::min<uint64_t>(1 << 20, end - pos);
        RETURN_IF_ERROR(file.Read(pos, n, buf.get()));
        crc = Crc32(buf.get(), n, crc);
      }
      if (crc != stored) {
        return DataLossError("MindSpore checkpoint '" + path + "': CRC-32 " + std::to_string(crc) +
                             " of its contents differs from the recorded " +
                             std::to_string(stored) + " (the file is corrupt)");
      }
      out.has_crc = true;
    }
  }
  Cursor c(file, path, end);
  while (!c.done()) {
    ASSIGN_OR_RETURN(uint64_t key, c.Varint(end));
    if (key != ((1 << 3) | 2)) {
      return c.Bad("expected a Checkpoint.value record, found field " + std::to_string(key >> 3) +
                   " (an encrypted file, or not a .ckpt)");
    }
    ASSIGN_OR_RETURN(uint64_t n, c.Length(end));
    MindSporeRecord r;
    RETURN_IF_ERROR(ParseValue(c, c.pos() + n, &r));
    out.records.push_back(std::move(r));
  }
  return out;
}

bool LooksLikeMindSporeCkpt(const RandomAccessFile& file) {
  auto size = file.Size();
  if (!size.ok() || *size < 4) return false;
  unsigned char head[16] = {};
  const uint64_t n = std::min<uint64_t>(16, *size);
  if (!file.Read(0, n, head).ok()) return false;
  if (head[0] != 0x0a) return false;
  size_t i = 1;
  while (i < n && (head[i] & 0x80)) ++i;    // the record length
  return i + 1 < n && head[i + 1] == 0x0a;  // the Value starts with its tag
}

namespace {

// A TensorProto's fields up to its content's bytes, and the message's
// whole size.
std::string TensorPrefix(const std::vector<int64_t>& dims, std::string_view type,
                         uint64_t content_size, uint64_t* message_size) {
  std::string out;
  for (int64_t d : dims) {
    out.push_back(0x08);  // TensorProto.dims
    PutVarint(&out, static_cast<uint64_t>(d));
  }
  out.push_back(0x12);  // TensorProto.tensor_type
  PutVarint(&out, type.size());
  out.append(type);
  out.push_back(0x1a);  // TensorProto.tensor_content
  PutVarint(&out, content_size);
  *message_size = out.size() + content_size;
  return out;
}

// The bytes opening a record: Checkpoint.value, its tag, and the key and
// length of its `field` (a tensor or a map tensor) of `size` bytes.
std::string ValueOpening(std::string_view tag, char field, uint64_t size) {
  const uint64_t value = 1 + VarintSize(tag.size()) + tag.size() + 1 + VarintSize(size) + size;
  std::string out;
  out.push_back(0x0a);  // Checkpoint.value
  PutVarint(&out, value);
  out.push_back(0x0a);  // Value.tag
  PutVarint(&out, tag.size());
  out.append(tag);
  out.push_back(field);
  PutVarint(&out, size);
  return out;
}

}  // namespace

std::string_view MindSporeNumpyDTypeName(DType dtype) { return DTypeNameIn(kNumpyNames, dtype); }

bool MindSporeLoadsMapPart(DType dtype) {
  return dtype == DType::kI32 || dtype == DType::kF32 || dtype == DType::kF16 ||
         dtype == DType::kF64;
}

Result<DType> ParseMindSporeNumpyDType(std::string_view name) {
  if (auto dtype = DTypeNamedIn(kNumpyNames, name)) return *dtype;
  return InvalidArgumentError("unsupported numpy dtype '" + std::string(name) + "'");
}

std::vector<std::string> MindSporeMapRecordHeaders(std::string_view tag,
                                                   const std::vector<MindSporeMapPart>& parts) {
  std::vector<std::string> prefixes;
  uint64_t map = 0;
  for (const MindSporeMapPart& p : parts) {
    uint64_t size = 0;
    std::string prefix = TensorPrefix(p.dims, p.type, p.content_size, &size);
    std::string framed;
    framed.push_back(0x0a);  // MapTensorProto.tensor
    PutVarint(&framed, size);
    map += framed.size() + size;
    prefixes.push_back(framed + prefix);
  }
  if (prefixes.empty()) prefixes.emplace_back();
  prefixes.front() = ValueOpening(tag, 0x1a /* Value.maptensor */, map) + prefixes.front();
  return prefixes;
}

std::string MindSporeRecordHeader(std::string_view tag, const std::vector<int64_t>& dims,
                                  std::string_view type, uint64_t content_size) {
  uint64_t tensor = 0;
  const std::string prefix = TensorPrefix(dims, type, content_size, &tensor);
  return ValueOpening(tag, 0x12 /* Value.tensor */, tensor) + prefix;
}

Result<std::string> MindSporeStringValue(std::string_view content) {
  if (content.size() % 4 != 0) {
    return InvalidArgumentError("a string of " + std::to_string(content.size()) +
                                " bytes, not whole UTF-32 code points");
  }
  std::u32string points(content.size() / 4, U'\0');
  for (size_t i = 0; i < points.size(); ++i) {
    const auto* b = reinterpret_cast<const unsigned char*>(content.data() + 4 * i);
    points[i] = b[0] | (char32_t{b[1]} << 8) | (char32_t{b[2]} << 16) | (char32_t{b[3]} << 24);
  }
  while (!points.empty() && points.back() == 0) points.pop_back();  // as numpy does
  return EncodeUtf8(points);
}

Result<std::string> MindSporeStringRecord(std::string_view tag, std::string_view utf8) {
  ASSIGN_OR_RETURN(std::u32string points, DecodeUtf8(utf8));
  if (points.empty()) points.push_back(0);  // numpy's '<U1' for ""
  std::string content;
  for (char32_t c : points) {
    for (int k = 0; k < 4; ++k) content.push_back(static_cast<char>((c >> (8 * k)) & 0xff));
  }
  std::string out = MindSporeRecordHeader(tag, {0}, kMindSporeStringType, content.size());
  out += content;
  return out;
}

}  // namespace tessera
