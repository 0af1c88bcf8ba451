// Checkpoints whose files hold tensors, or slices of them, as dense
// row-major bytes at offsets known from a header: safetensors files and
// MindSpore .ckpt files. Each format parses (or plans) its files into a
// table of blocks; reading any box and writing pieces in any order are
// shared here.
#ifndef TESSERA_CKPT_DENSE_H_
#define TESSERA_CKPT_DENSE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/output.h"

namespace tessera {

// A byte range of a file.
struct DenseSegment {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
};

// `box` (global coordinates) of a tensor, stored dense at `offset` of file
// `file`; or, when `segments` is not empty, its dense bytes are those
// segments one after the other (MindSpore cuts a large tensor's bytes into
// 512 MiB chunks, each in its own record).
struct DenseBlock {
  uint32_t file = 0;
  uint64_t offset = 0;
  Box box;
  std::vector<DenseSegment> segments;
};

struct DenseCheckpoint {
  std::string path;    // what the user named
  std::string format;  // "safetensors", "mindspore"
  Strategy strategy;
  CheckpointMeta meta;
  std::vector<std::string> files;  // paths
  // Per tensor of `strategy`: its blocks. Blocks with equal boxes are
  // replicas (MindSpore writes a replicated slice into every rank's file);
  // distinct boxes must be disjoint and cover the tensor.
  std::vector<std::vector<DenseBlock>> blocks;
  // A directory of rank files: what each stores in which order.
  StoredOrder order;
  // What the files were checked against (CheckpointReader::Checksums).
  std::string checksums;
};

// Checks the table (blocks inside their tensors, disjoint, covering; the
// format checked that they lie inside their files) and returns a reader over it. Files are opened
// on first use.
Result<std::unique_ptr<CheckpointReader>> OpenDenseCheckpoint(Env* env, DenseCheckpoint ckpt);

// A file of a planned output: its name relative to the output root ("" when
// the output is this single file), its final size, and the bytes known
// before any tensor data (headers), by offset.
struct DenseFilePlan {
  std::string name;
  uint64_t size = 0;
  std::vector<std::pair<uint64_t, std::string>> fixed;
};

struct DensePlan {
  bool directory = false;  // the output is a directory of files
  std::vector<DenseFilePlan> files;
  std::vector<std::vector<DenseBlock>> blocks;  // per tensor; replicas get every copy
  // Called at Commit for each file once every block is written, before it
  // is synced: it may read the file (`path`, the temporary one) and patch
  // it in place (`out`), e.g. checksums of what was written.
  std::function<Status(size_t file, const std::string& path, WritableFile& out)> finalize;
};

// A writer for a planned output: the files are created under a temporary
// name with their fixed bytes; WritePiece copies a piece into every block
// it overlaps; Commit checks that every block was covered, syncs and
// renames the output into place.
Result<std::unique_ptr<CheckpointWriter>> CreateDenseCheckpoint(Env* env, const std::string& path,
                                                                Strategy strategy, DensePlan plan,
                                                                bool overwrite);

}  // namespace tessera

#endif  // TESSERA_CKPT_DENSE_H_
