// PyTorch's torch.save files behind the checkpoint reader
// (formats/torch_save.h has the format): one file (`.pt`, `.bin`, zip or
// legacy), or a Hugging Face directory of shards named by
// `pytorch_model.bin.index.json` ({"weight_map": {tensor: file}}), read as
// one checkpoint. Tensors are whole on a one-rank mesh, named by their path
// in the pickled object; other leaves (hyper-parameters, an
// argparse.Namespace's fields, a loss scaler's state) are the metadata
// ("torch.<path>" -> their text), and the step is the top-level
// "iteration", "global_steps" or "step" where one is an integer.
//
// Reads verify the zip records' CRC-32 (once per storage, the first time a
// reader touches it); legacy files carry no checksums. Views are read as
// views: an offset into a shared storage, transposes and other strides.
#ifndef TESSERA_CKPT_TORCH_CKPT_H_
#define TESSERA_CKPT_TORCH_CKPT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "ckpt/checkpoint.h"

namespace tessera {

inline constexpr char kTorchIndexName[] = "pytorch_model.bin.index.json";

Result<std::unique_ptr<CheckpointReader>> OpenTorchCheckpoint(Env* env, const std::string& path);

// PyTorch Distributed Checkpoint directories (formats/dcp.h; torch 1.13's
// and 2.x's), format "dcp": each tensor whole on a one-rank mesh, read
// from its chunks (each a torch.save item of a .distcp file, verified by
// its CRC-32s like a torch.save file); bytes items are listed in the
// metadata as "dcp.<name>".
Result<std::unique_ptr<CheckpointReader>> OpenDcpCheckpoint(Env* env, const std::string& path);
bool IsDcpCheckpoint(Env* env, const std::string& path);

struct TorchWriteOptions {
  // 0: one torch.save file at the path. Otherwise the path is a directory
  // of shards of at most this many tensor bytes each (a larger tensor gets
  // a shard of its own), pytorch_model-0000i-of-0000n.bin with
  // pytorch_model.bin.index.json, as Hugging Face shards; a single shard is
  // pytorch_model.bin without an index.
  int64_t max_shard_size = 0;
  bool overwrite = false;
};

// A writer of `strategy`'s tensors as torch.save files of a flat state dict
// (an OrderedDict of contiguous tensors; formats/torch_save.h), stored
// whole: torch.load reads them (also with weights_only=True). Every record
// carries its CRC-32, computed from the written bytes at commit.
Result<std::unique_ptr<CheckpointWriter>> CreateTorchCheckpoint(Env* env, const std::string& path,
                                                                const Strategy& strategy,
                                                                const TorchWriteOptions& options);

// A writer of a PyTorch DCP directory as torch 1.13's FileSystemWriter
// writes one with single_file_per_rank: each distinct piece of `strategy`
// (a replicated one once) a chunk stored as a torch.save item in
// __<r>_0.distcp of the first rank r holding it, and the `.metadata`
// (formats/dcp.h) naming them, so that DCP's load_state_dict loads it onto
// any sharding. The step and metadata have no place there.
Result<std::unique_ptr<CheckpointWriter>> CreateDcpCheckpoint(Env* env, const std::string& path,
                                                              const Strategy& strategy,
                                                              bool overwrite);

// Whether `path` is a torch.save file (by content) or a directory holding
// pytorch_model.bin.index.json or pytorch_model.bin.
bool IsTorchCheckpoint(Env* env, const std::string& path);

}  // namespace tessera

#endif  // TESSERA_CKPT_TORCH_CKPT_H_
