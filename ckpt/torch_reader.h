// Internal to ckpt/: the checkpoint reader over torch.save archives that
// torch.save files, DCP directories and DeepSpeed directories share
// (ckpt/torch_ckpt.cc has it). A checkpoint's tensor is assembled from
// pieces of the archives' tensors: a box of it held whole by a stored
// tensor (a shard of a torch.save checkpoint, a DCP chunk), or a run of its
// elements in row-major order held by a run of a contiguous stored tensor
// (a DeepSpeed flat partition).
#ifndef TESSERA_CKPT_TORCH_READER_H_
#define TESSERA_CKPT_TORCH_READER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"
#include "formats/torch_save.h"

namespace tessera {

// One torch.save archive (a file, or an item of a DCP file): its contents
// and which of its storages were verified.
struct TorchSource {
  std::string path;
  std::shared_ptr<RandomAccessFile> file;
  TorchSaveFile contents;
  std::unique_ptr<std::atomic<bool>[]> verified;
};

struct TorchPiece {
  size_t source = 0;
  size_t tensor = 0;  // index into the source's contents.tensors
  // A box piece: the box of the checkpoint's tensor the stored tensor holds
  // (shaped as the box).
  Box box;
  // A flat piece: `count` elements of the checkpoint's tensor from element
  // `flat_begin` in row-major order, stored at element `src_begin` of the
  // (contiguous) stored tensor.
  bool flat = false;
  int64_t flat_begin = 0;
  int64_t src_begin = 0;
  int64_t count = 0;
};

struct TorchEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<TorchPiece> pieces;  // all box pieces or all flat pieces
};

// Opens the torch.save file at `path`; its pickle is kept when
// `keep_pickle` (a caller that walks the object), dropped otherwise.
Result<std::unique_ptr<TorchSource>> OpenTorchSource(Env* env, const std::string& path,
                                                     bool keep_pickle = false);

// The reader of `entries` over `sources`, format `format` ("torch", "dcp",
// "deepspeed"); each entry's pieces must be disjoint and cover it, else a
// DataLossError naming the tensor. `values` become the metadata ("step"
// from a key ending in ".iteration", ".global_steps" or ".step" where one is
// an integer).
Result<std::unique_ptr<CheckpointReader>> MakeTorchReader(
    const std::string& path, const std::string& format,
    std::vector<std::unique_ptr<TorchSource>> sources, std::vector<TorchEntry> entries,
    const std::vector<std::pair<std::string, std::string>>& values);

}  // namespace tessera

#endif  // TESSERA_CKPT_TORCH_READER_H_
