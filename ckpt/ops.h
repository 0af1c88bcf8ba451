// File-to-file operations the CLI and trainers call: open any checkpoint in
// any format, and write one under a new strategy in any format, with an
// atomic commit.
#ifndef TESSERA_CKPT_OPS_H_
#define TESSERA_CKPT_OPS_H_

#include <memory>
#include <set>
#include <string>

#include "ckpt/checkpoint.h"
#include "ckpt/mindspore.h"
#include "ckpt/native.h"
#include "ckpt/transform.h"

namespace tessera {

// kMindSporeSafetensors: MindSpore's format="safetensors" (2.3 and later):
// rank_<r>/<prefix><r>.safetensors beside the same strategy files; merged,
// the unified_safetensors layout (part<i>.safetensors + param_name_map.json)
// or, at a path ending in ".safetensors", one file.
enum class Format { kNative, kSafetensors, kMindSpore, kMindSporeSafetensors, kHdf5, kTorch, kDcp };

// "native", "safetensors", "mindspore", "mindspore-safetensors", "hdf5".
Result<Format> ParseFormat(const std::string& name);
std::string_view FormatName(Format format);

struct OpenOptions {
  // A MindSpore strategy file or directory of stage files, for a MindSpore
  // distributed checkpoint directory.
  std::string mindspore_strategy;
  // How the caller names that option ("--src-strategy"), for the error
  // when it is missing.
  std::string strategy_hint;
};

// Opens a checkpoint, recognising its format from its content (a native
// directory, a safetensors file/index/directory, a MindSpore .ckpt or
// rank_<r>/ directory, an HDF5 file), never from its name.
Result<std::unique_ptr<CheckpointReader>> OpenCheckpoint(Env* env, const std::string& path,
                                                         const OpenOptions& options = {});

// Opens SRC (any format, recognised by content). `src_strategy`, when
// given, is either the strategy of a MindSpore distributed checkpoint (a
// MindSpore strategy file or directory of stage files), or a Tessera
// strategy file the checkpoint's recorded layouts are checked against.
// `flag` names that argument in errors ("--src-strategy", "strategy=").
Result<std::unique_ptr<CheckpointReader>> OpenSource(Env* env, const std::string& path,
                                                     const std::string& src_strategy,
                                                     const std::string& flag);

// How the caller names the two ways of giving a destination (for errors).
struct DestinationFlags {
  std::string strategy = "--strategy";
  std::string mesh = "--mesh";
};
// The destination of a transform: a strategy file (Tessera's, or a
// MindSpore strategy file or stage directory: the tensors it does not name
// go to `unnamed`, which MindSpore writes last), or the source's split axes
// on a new mesh ("dp=2,tp=4"). Exactly one of `strategy_file` and `mesh`.
Result<Strategy> DestinationStrategy(Env* env, const CheckpointReader& src,
                                     const std::string& strategy_file, const std::string& mesh,
                                     std::set<std::string>* unnamed = nullptr,
                                     const DestinationFlags& flags = {});

struct WriteOptions {
  Format format = Format::kNative;
  NativeWriteOptions native;        // codec (native only) and overwrite (all)
  int64_t max_shard_size = 0;       // safetensors: shard the output
  MindSporeWriteOptions mindspore;  // prefix, record size
  TransformOptions transform;
};

// Writes every tensor of `src` under `dst` (completed with CompleteStrategy:
// tensors `dst` leaves out stay whole) to `out_path` in `options.format`,
// committed atomically; on any failure nothing is left at `out_path` and
// the temporary output is removed. safetensors and HDF5 store whole tensors
// and record `dst` as metadata; MindSpore writes one file per rank of `dst`
// (or one file when `out_path` ends in ".ckpt").
Result<TransformStats> WriteTransformed(Env* env, const CheckpointReader& src, const Strategy& dst,
                                        const std::string& out_path, const WriteOptions& options);

}  // namespace tessera

#endif  // TESSERA_CKPT_OPS_H_
