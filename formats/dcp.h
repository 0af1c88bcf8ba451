// PyTorch Distributed Checkpoint (DCP) directories: the `.metadata` pickle
// (read with formats/pickle.h, nothing run) and where each item lies.
// Both generations of names are read: torch 1.13's
// torch.distributed._shard.checkpoint and torch >= 2.0's
// torch.distributed.checkpoint (Metadata, TensorStorageMetadata,
// ChunkStorageMetadata, BytesStorageMetadata, MetadataIndex, _StorageInfo;
// the records are matched by class name, whatever the module).
//
// A tensor is its global size, dtype and chunks (offsets and sizes in the
// global tensor); each chunk is an item stored in a `.distcp` file at
// (offset, length), a standalone torch.save archive. Bytes items are
// listed with their place. Of the storage transforms of torch >= 2.8
// (transform_descriptors), "stream.zstd" is undone (formats/codec.h's DecompressZstdRange);
// any other is refused by name.
#ifndef TESSERA_FORMATS_DCP_H_
#define TESSERA_FORMATS_DCP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace tessera {

inline constexpr char kDcpMetadataName[] = ".metadata";

struct DcpItem {
  std::string file;  // relative to the checkpoint directory
  uint64_t offset = 0;
  uint64_t length = 0;
  // Stored through torch >= 2.8's "stream.zstd" transform: the bytes are a
  // zstd stream of the item (DecompressZstdRange).
  bool zstd = false;
};

struct DcpChunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  DcpItem item;
};

struct DcpTensor {
  std::string name;  // the fqn, or planner_data's path joined with '.'
  DType dtype = DType::kF32;
  std::vector<int64_t> size;
  std::vector<DcpChunk> chunks;
};

struct DcpBytes {
  std::string name;
  DcpItem item;
};

struct DcpMetadata {
  std::vector<DcpTensor> tensors;
  std::vector<DcpBytes> bytes;
};

// Parses a `.metadata` file's bytes; `where` names it in errors.
Result<DcpMetadata> ParseDcpMetadata(std::string_view data, const std::string& where);

// The `.metadata` of `tensors` (chunks placed), as torch 1.13's
// FileSystemWriter pickles it (torch.distributed._shard.checkpoint names,
// planner_data None): what its load_state_dict reads. Unsigned 16/32/64-bit
// tensors have no torch dtype and are refused by name.
Result<std::string> DcpMetadataPickle(const std::vector<DcpTensor>& tensors);

// Whether `bytes` (the start of a file) is a pickle of DCP's Metadata.
bool LooksLikeDcpMetadata(std::string_view head);

}  // namespace tessera

#endif  // TESSERA_FORMATS_DCP_H_
