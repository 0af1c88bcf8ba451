#include "formats/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/endian.h"

namespace tessera {
namespace {

constexpr DTypeNaming kNames[] = {
    {DType::kF32, "F32"},   {DType::kF16, "F16"}, {DType::kBF16, "BF16"}, {DType::kF64, "F64"},
    {DType::kI8, "I8"},     {DType::kU8, "U8"},   {DType::kI16, "I16"},   {DType::kU16, "U16"},
    {DType::kI32, "I32"},   {DType::kU32, "U32"}, {DType::kI64, "I64"},   {DType::kU64, "U64"},
    {DType::kBool, "BOOL"},
};

Status Bad(const std::string& path, const std::string& what) {
  return DataLossError("safetensors file '" + path + "': " + what);
}

}  // namespace

std::string_view SafetensorsDTypeName(DType dtype) { return DTypeNameIn(kNames, dtype); }

Result<DType> ParseSafetensorsDType(std::string_view name) {
  if (auto dtype = DTypeNamedIn(kNames, name)) return *dtype;
  return InvalidArgumentError("unsupported safetensors dtype '" + std::string(name) + "'");
}

Result<SafetensorsFile> SafetensorsFile::Open(Env* env, const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, env->NewRandomAccessFile(path));
  ASSIGN_OR_RETURN(uint64_t size, file->Size());
  if (size < 8) return Bad(path, "shorter than its 8-byte header length");
  char len_bytes[8];
  RETURN_IF_ERROR(file->Read(0, 8, len_bytes));
  const uint64_t header_len = GetLittleEndian<uint64_t>(len_bytes);
  if (header_len > kSafetensorsMaxHeader) {
    return Bad(path, "header length " + std::to_string(header_len) + " exceeds the limit of " +
                         std::to_string(kSafetensorsMaxHeader));
  }
  if (header_len > size - 8) {
    return Bad(path, "header length " + std::to_string(header_len) + " exceeds the file size " +
                         std::to_string(size));
  }
  std::string text(header_len, '\0');
  RETURN_IF_ERROR(file->Read(8, header_len, text.data()));
  f.data_start_ = 8 + header_len;
  const uint64_t data_size = size - f.data_start_;
  nlohmann::json header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) return Bad(path, "header is not a JSON object");
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return Bad(path, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          return Bad(path, "__metadata__ value '" + m.key() + "' is not a string");
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!v.is_object() || !v.contains("dtype") || !v["dtype"].is_string() || !v.contains("shape") ||
        !v["shape"].is_array() || !v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2) {
      return Bad(path, where + ": needs dtype, shape and data_offsets [begin, end]");
    }
    SafetensorsEntry e;
    e.name = name;
    auto dtype = ParseSafetensorsDType(v["dtype"].get<std::string>());
    if (!dtype.ok()) return Bad(path, where + ": " + dtype.status().message());
    e.dtype = *dtype;
    uint64_t elements = 1;
    for (const nlohmann::json& d : v["shape"]) {
      if (!d.is_number_unsigned()) return Bad(path, where + ": shape is not non-negative integers");
      const uint64_t n = d.get<uint64_t>();
      if (n != 0 && elements > (uint64_t{1} << 62) / n)
        return Bad(path, where + ": shape overflows");
      elements *= n;
      e.shape.push_back(static_cast<int64_t>(n));
    }
    for (const nlohmann::json& o : v["data_offsets"]) {
      if (!o.is_number_unsigned()) return Bad(path, where + ": data_offsets are not integers");
    }
    e.begin = v["data_offsets"][0].get<uint64_t>();
    e.end = v["data_offsets"][1].get<uint64_t>();
    if (e.begin > e.end || e.end > data_size) {
      return Bad(path, where + ": data_offsets [" + std::to_string(e.begin) + ", " +
                           std::to_string(e.end) + "] outside the " + std::to_string(data_size) +
                           " data bytes");
    }
    if (e.end - e.begin != elements * DTypeSize(e.dtype)) {
      return Bad(path, where + ": " + std::to_string(e.end - e.begin) + " bytes for " +
                           std::to_string(elements) + " " + std::string(DTypeName(e.dtype)) +
                           " elements");
    }
    f.entries_.push_back(std::move(e));
  }
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : f.entries_) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      return Bad(path, "tensors '" + by_offset[i - 1]->name + "' and '" + by_offset[i]->name +
                           "' overlap");
    }
  }
  std::sort(f.entries_.begin(), f.entries_.end(),
            [](const auto& a, const auto& b) { return a.begin < b.begin; });
  f.file_ = std::move(file);
  return f;
}

const SafetensorsEntry* SafetensorsFile::Find(const std::string& name) const {
  for (const auto& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

Status SafetensorsFile::Read(const SafetensorsEntry& e, uint64_t offset, uint64_t size,
                             void* dst) const {
  if (offset > e.end - e.begin || size > e.end - e.begin - offset) {
    return OutOfRangeError("safetensors file '" + path_ + "': tensor '" + e.name + "': bytes [" +
                           std::to_string(offset) + ", +" + std::to_string(size) +
                           ") outside the tensor");
  }
  return file_->Read(data_start_ + e.begin + offset, size, dst);
}

void PackAsSafetensorsLibrary(std::vector<SafetensorsEntry>* entries) {
  // The library's Dtype enum order (BOOL < U8 < I8 < ... < U64).
  auto rank = [](DType d) {
    switch (d) {
      case DType::kBool:
        return 0;
      case DType::kU8:
        return 1;
      case DType::kI8:
        return 2;
      case DType::kI16:
        return 5;
      case DType::kU16:
        return 6;
      case DType::kF16:
        return 7;
      case DType::kBF16:
        return 8;
      case DType::kI32:
        return 9;
      case DType::kU32:
        return 10;
      case DType::kF32:
        return 11;
      case DType::kF64:
        return 12;
      case DType::kI64:
        return 13;
      case DType::kU64:
        return 14;
    }
    return 0;
  };
  std::sort(entries->begin(), entries->end(),
            [&](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              if (rank(a.dtype) != rank(b.dtype)) return rank(a.dtype) > rank(b.dtype);
              return a.name < b.name;
            });
  uint64_t at = 0;
  for (SafetensorsEntry& e : *entries) {
    uint64_t n = static_cast<uint64_t>(DTypeSize(e.dtype));
    for (int64_t d : e.shape) n *= static_cast<uint64_t>(d);
    e.begin = at;
    e.end = at += n;
  }
}

Result<std::string> SafetensorsHeader(const std::vector<SafetensorsEntry>& entries,
                                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const SafetensorsEntry& e : entries) {
    if (e.name == "__metadata__" || header.contains(e.name)) {
      return InvalidArgumentError("safetensors: tensor name '" + e.name +
                                  "' is reserved or repeated");
    }
    header[e.name] = {{"dtype", SafetensorsDTypeName(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {e.begin, e.end}}};
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(std::string("safetensors: header: ") + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string out(8, '\0');
  PutLittleEndian<uint64_t>(out.data(), static_cast<uint64_t>(text.size()));
  return out + text;
}

Status WriteSafetensors(Env* env, const std::string& path,
                        const std::vector<SafetensorsTensor>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsEntry> entries;
  uint64_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    uint64_t n = static_cast<uint64_t>(DTypeSize(t.dtype));
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    entries.push_back({t.name, t.dtype, t.shape, offset, offset + n});
    offset += n;
  }
  auto header = SafetensorsHeader(entries, metadata);
  if (!header.ok()) return header.status().Annotate("safetensors file '" + path + "'");
  std::vector<std::string_view> parts = {*header};
  for (size_t i = 0; i < tensors.size(); ++i) {
    parts.emplace_back(static_cast<const char*>(tensors[i].data),
                       entries[i].end - entries[i].begin);
  }
  return WriteFileAtomically(env, path, parts);
}

}  // namespace tessera
