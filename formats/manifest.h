// The native checkpoint manifest as plain C++ values, and its encoding.
// manifest.cc is the only file that includes the generated protobuf header.
#ifndef TESSERA_FORMATS_MANIFEST_H_
#define TESSERA_FORMATS_MANIFEST_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "transform/box.h"
#include "transform/layout.h"
#include "transform/mesh.h"

namespace tessera {

inline constexpr uint32_t kNativeFormatVersion = 1;
inline constexpr uint64_t kPieceAlignment = 4096;
// Raw pieces longer than this carry one checksum per block of this size.
inline constexpr uint64_t kChecksumBlock = 1 << 20;

enum class Codec : uint8_t { kRaw = 0, kZstd = 1 };

struct PieceInfo {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  Box box;
  Codec codec = Codec::kRaw;
  uint64_t raw_length = 0;
  uint64_t checksum = 0;
  // XXH3 of each kChecksumBlock of the stored bytes (raw pieces longer than
  // one block; empty otherwise).
  std::vector<uint64_t> block_checksums;
};

struct TensorEntry {
  std::string name;
  Layout layout;
  std::optional<Mesh> mesh;
  std::vector<PieceInfo> pieces;
  // Redundant copies of pieces (same box, codec, stored bytes and checksum
  // as one of `pieces`) in other files; readers fall back on them.
  std::vector<PieceInfo> copies;
};

struct FileInfo {
  std::string name;
  uint64_t size = 0;
  uint64_t checksum = 0;  // XXH3 of the whole file (parity files); 0: none
};

// `parity` (a file index) holds the XOR of the `members` files, each padded
// with zeros to the longest: any one member is rebuilt from the others.
struct ParityGroup {
  std::vector<uint32_t> members;
  uint32_t parity = 0;
};

struct Manifest {
  uint32_t format_version = kNativeFormatVersion;
  int64_t step = 0;
  Mesh mesh;
  std::vector<FileInfo> files;
  std::vector<TensorEntry> tensors;
  std::map<std::string, std::string> metadata;
  std::string created_by;
  std::vector<ParityGroup> parity_groups;
};

std::string SerializeManifest(const Manifest& manifest);
// Checks everything a reader relies on: version, layouts valid on their
// meshes, pieces inside their tensors and files, file indices in range.
// `path` only names the file in errors.
Result<Manifest> ParseManifest(std::string_view bytes, const std::string& path);

}  // namespace tessera

#endif  // TESSERA_FORMATS_MANIFEST_H_
