// The two interfaces every checkpoint format implements: a reader that
// answers "give me this box of this tensor" by reading only the bytes it
// needs, and a writer that stores boxes of tensors and commits atomically.
// Merge, split, reshard and convert are one loop between them (transform.h).
#ifndef TESSERA_CKPT_CHECKPOINT_H_
#define TESSERA_CKPT_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "transform/box.h"
#include "transform/strategy.h"

namespace tessera {

// What a checkpoint records besides tensors.
struct CheckpointMeta {
  int64_t step = 0;
  std::map<std::string, std::string> metadata;  // user key -> bytes
  std::string created_by;
};

// The order a checkpoint of one file per rank (a MindSpore rank directory)
// stores its tensors in, which MindSpore's transform output follows.
struct StoredOrder {
  // Per rank file (index = rank): tensor indices in stored order.
  std::vector<std::vector<size_t>> files;
  // Tensors the checkpoint's strategy does not place (MindSpore's
  // global_step and the like), by index.
  std::vector<size_t> unplaced;
};

// How one tensor is stored (for inspect).
struct TensorStorage {
  int64_t pieces = 0;
  int64_t stored_bytes = 0;
};

// A file of a checkpoint and its part in the redundancy (for inspect).
struct StoredFile {
  std::string name;
  uint64_t bytes = 0;
  std::string host;     // the host that wrote it; "" when not recorded
  std::string group;    // "rs:4+2 group 0", "parity group 1", or "" when in none
  bool parity = false;  // a parity file of `group` (else a data file)
};

class CheckpointReader {
 public:
  virtual ~CheckpointReader() = default;
  virtual const std::string& path() const = 0;
  virtual std::string_view format() const = 0;
  // Every tensor with the layout it was saved with, in checkpoint order.
  virtual const Strategy& strategy() const = 0;
  virtual const CheckpointMeta& meta() const = 0;
  virtual TensorStorage Storage(size_t index) const = 0;
  // Reads `region` (global coordinates) of tensor `index` into the dense
  // row-major buffer `dst` of shape `dst_extents`, at `dst_box`. Reads only
  // the byte ranges it needs and verifies what it reads. Thread-safe.
  virtual Status ReadRegion(size_t index, const Box& region, void* dst,
                            const std::vector<int64_t>& dst_extents, const Box& dst_box) const = 0;
  // One region of a batch (ReadRegions): `region` of tensor `index` into
  // the dense row-major buffer `dst` of the region's extents.
  struct RegionRead {
    size_t index = 0;
    Box region;
    void* dst = nullptr;
  };
  // Reads every region of `reads`, as ReadRegion would each into a dense
  // buffer of its extents (the buffers disjoint). A format of many small
  // pieces reads each piece the batch meets once, in file order, however
  // many of the regions take a part of it (neighbouring ranks of a
  // reshard). Thread-safe. By default, ReadRegion one region after another.
  virtual Status ReadRegions(const std::vector<RegionRead>& reads) const;
  // `region` of tensor `index` lent without a copy, verified, as dense
  // row-major bytes, when the format stores it so (one contiguous raw run of
  // one file) and its file can lend them; null otherwise (then ReadRegion
  // it). Lets a copy between checkpoints skip a staging buffer.
  virtual Result<std::unique_ptr<FileView>> ViewRegion(size_t /*index*/,
                                                       const Box& /*region*/) const {
    return std::unique_ptr<FileView>();
  }
  // What reads check the stored bytes against, for people ("the CRC-32 of
  // every zip record"); empty where the format keeps no checksums (then
  // only its structure and sizes are checked).
  virtual std::string Checksums() const { return {}; }
  // What reads so far had to work around: a missing or corrupt stored
  // piece read instead from a redundant copy or rebuilt from parity, one
  // line per lost file and source ("data-00003.tsr: tensor 'w' ...").
  // Empty when nothing was lost (always, for formats without redundancy).
  virtual std::vector<std::string> Recoveries() const { return {}; }
  // For a checkpoint of one file per rank, what each file stores in which
  // order; empty for the others.
  virtual StoredOrder Order() const { return {}; }
  // The files a native checkpoint stores, in manifest order; empty for
  // the other formats.
  virtual std::vector<StoredFile> Files() const { return {}; }
  // The copies of tensors several pipeline stages hold (Layout::copy_stages)
  // that differ from the copy that is read, one line each ("tensor 'w':
  // [0:8, 0:4] in 'rank_5/...' differs from 'rank_1/...'"). Reads what it
  // compares where the format records no checksum to compare.
  virtual Result<std::vector<std::string>> DifferingCopies() const {
    return std::vector<std::string>();
  }
};

class CheckpointWriter {
 public:
  virtual ~CheckpointWriter() = default;
  // Stores `box` (global coordinates) of tensor `index` of the strategy the
  // writer was created with; `data` is the box's dense row-major bytes.
  // `shard_rank` is the rank that holds the box, which picks the data file.
  // Thread-safe; the boxes of one tensor must be disjoint.
  virtual Status WritePiece(size_t index, int64_t shard_rank, const Box& box, const void* data) = 0;
  // One piece of a batch (WritePieces): as WritePiece's arguments.
  struct PieceWrite {
    size_t index = 0;
    int64_t shard_rank = 0;
    Box box;
    const void* data = nullptr;
  };
  // Writes every piece of `pieces` as WritePiece would, one after another:
  // each data file gets its pieces in the batch's order. A format of many
  // small pieces takes each file's lock once per batch (a reshard of
  // thousands of ranks writes a million and a half pieces). By default,
  // WritePiece one piece after another.
  virtual Status WritePieces(const std::vector<PieceWrite>& pieces);
  // A hint: the pieces of `shard_rank` written so far will not be followed
  // by more soon. Writers that gather small pieces in memory write that
  // rank's out now and free the memory for another; a writer holding more
  // files open than the process may may close that rank's until needed.
  // Never required.
  virtual Status Flush(int64_t shard_rank) {
    (void)shard_rank;
    return Status::Ok();
  }
  // Checks that every tensor is covered, makes everything durable and moves
  // the output into place. Nothing is visible at the final path before.
  virtual Status Commit() = 0;
  // Removes whatever was written (also done on destruction without Commit).
  virtual void Abort() = 0;
};

// The checks every format makes on its arguments, with errors that start
// with `where` ("checkpoint 'x'", "output 'y'"): a region to read must lie
// inside the tensor; a piece to write must name a tensor and be a non-empty
// box inside it (then its tensor is returned).
// `kind` and `path` make `where` ("checkpoint" and "/x": "checkpoint
// '/x'"), spelled out only for an error: readers check every region.
Status CheckReadRegion(const TensorStrategy& t, std::string_view kind, std::string_view path,
                       const Box& region);
Result<const TensorStrategy*> CheckWritePiece(const Strategy& strategy, std::string_view kind,
                                              std::string_view path, size_t index, const Box& box);

// Layouts over a view (Layout::view, the tensor-parallel fused-qkv layout)
// are stored by the native format only; the other formats' writers refuse
// them, naming the tensor.
Status CheckNoViews(const Strategy& strategy, const std::string& where);

// A box over `fine` (a shape refining `coarse`: the same elements in the
// same order, each coarse dimension cut into consecutive fine ones) is a set
// of boxes over `coarse`. Calls fn(coarse_box, extents, at) for each: the
// part lies at box `at` of the box's dense buffer seen with `extents` (its
// extents with each group of fine dimensions multiplied together, so a
// buffer of coarse rank). Adjacent parts are merged.
Status ForEachCoarsePart(
    const Box& box, const std::vector<int64_t>& fine, const std::vector<int64_t>& coarse,
    const std::function<Status(const Box& part, const std::vector<int64_t>& extents,
                               const Box& at)>& fn);

// Reads `region`, a box over `coords`, of tensor `index` into the dense
// buffer `dst` (region's extents). `coords` is the reader's split shape or
// a view refining it (a plan over a finer view than the checkpoint's); a
// whole-tensor region may be over any shape of the tensor.
Status ReadRegionOver(const CheckpointReader& reader, size_t index,
                      const std::vector<int64_t>& coords, const Box& region, void* dst);
// Writes a piece given over `coords` (the layout's split shape or a view
// refining it) of a tensor laid out `layout` in the writer: over a finer
// view, as the coarse boxes it consists of.
Status WritePieceOver(CheckpointWriter& writer, const Layout& layout, size_t index,
                      int64_t shard_rank, const std::vector<int64_t>& coords, const Box& box,
                      const void* data);

// Reads a whole tensor into `dst` (ByteSize of its layout).
Status ReadTensor(const CheckpointReader& reader, size_t index, void* dst);
// The index of tensor `name`, or NotFound naming it and the checkpoint.
Result<size_t> FindTensor(const CheckpointReader& reader, std::string_view name);

}  // namespace tessera

#endif  // TESSERA_CKPT_CHECKPOINT_H_
