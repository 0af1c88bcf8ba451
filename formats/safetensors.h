// safetensors files (https://github.com/huggingface/safetensors, format
// section): an 8-byte little-endian header length N, N bytes of JSON
// ({"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]},
// "__metadata__": {"key": "value"}}), then the packed tensor bytes, offsets
// relative to the end of the header. Tensors are little-endian, row-major.
//
// Reading a file that may be hostile: the header length is capped (100 MB,
// as the reference implementation) and checked against the file size
// before anything is allocated; every tensor's offsets must lie in the data
// section, match its dtype and shape, and not overlap another's.
#ifndef TESSERA_FORMATS_SAFETENSORS_H_
#define TESSERA_FORMATS_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/env.h"
#include "core/status.h"

namespace tessera {

inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets in the data section
};

// "F32" <-> DType::kF32, ... ("BOOL", "BF16", "U16", ...).
std::string_view SafetensorsDTypeName(DType dtype);
Result<DType> ParseSafetensorsDType(std::string_view name);

// An open file: its entries (in file order) and metadata; reads any byte
// range of a tensor.
class SafetensorsFile {
 public:
  static Result<SafetensorsFile> Open(Env* env, const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* Find(const std::string& name) const;
  // Where the data section starts in the file (tensor offsets are relative
  // to it).
  uint64_t data_offset() const { return data_start_; }
  // `size` bytes at `offset` within the tensor's bytes.
  Status Read(const SafetensorsEntry& e, uint64_t offset, uint64_t size, void* dst) const;

 private:
  std::string path_;
  std::shared_ptr<RandomAccessFile> file_;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// The bytes before the data section: the 8-byte length and the JSON header
// (padded with spaces so that the data starts 8-byte aligned, as the
// reference writer does), for entries whose offsets are already assigned.
// Names must be unique and not "__metadata__".
Result<std::string> SafetensorsHeader(const std::vector<SafetensorsEntry>& entries,
                                      const std::map<std::string, std::string>& metadata);

// Orders `entries` as the safetensors library writes them (huggingface/
// safetensors, tensor.rs `prepare`, the same from v0.4.4 to 0.5): by dtype,
// descending in its enum order (U64, I64, F64, F32, U32, I32, BF16, F16,
// U16, I16, I8, U8, BOOL), then by name, bytewise; and gives them
// contiguous offsets from 0 (each dtype size x shape elements). MindSpore
// writes every safetensors file through that library.
void PackAsSafetensorsLibrary(std::vector<SafetensorsEntry>* entries);

// One tensor to write: its bytes are `data` (dtype size x shape elements).
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Writes a whole file at `path` with WriteFileAtomically (temporary name,
// synced, renamed into place, directory synced). Tensors are stored in the
// given order.
Status WriteSafetensors(Env* env, const std::string& path,
                        const std::vector<SafetensorsTensor>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace tessera

#endif  // TESSERA_FORMATS_SAFETENSORS_H_
