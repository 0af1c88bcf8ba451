// MindSpore checkpoints behind the checkpoint interfaces: a single .ckpt
// file (merged: whole tensors), or a distributed checkpoint directory
// `rank_<r>/<prefix><r>.ckpt` whose slices follow a MindSpore strategy file
// (one file, or a directory of per-stage files for pipeline parallelism,
// merged as merge_pipeline_strategys does).
//
// Layouts come from transform/mindspore_layout.h. A tensor the strategy
// does not name is whole on every rank, except an optimizer state
// "<prefix>.<param>" (adam_m.w, adam_v.w, accu_grads.w, ...) of a named
// parameter with the same local shapes, which follows that parameter.
#ifndef TESSERA_CKPT_MINDSPORE_H_
#define TESSERA_CKPT_MINDSPORE_H_

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "formats/mindspore_ckpt.h"
#include "formats/mindspore_strategy.h"

namespace tessera {

// Reads a strategy file, or every file of a directory (pipeline stages,
// each file's current_stage is its stage).
Result<std::vector<MindSporeStrategyFile>> ReadMindSporeStrategies(Env* env,
                                                                   const std::string& path);

// The layouts of `tensors` (names, shapes and dtypes, in their order) under
// MindSpore strategy files. The indices of the tensors the files do not
// name (global_step and the like, or optimizer states that follow their
// parameter) go to `unnamed` when given.
Result<Strategy> MindSporeToStrategy(const std::vector<MindSporeStrategyFile>& files,
                                     const Strategy& tensors,
                                     std::vector<size_t>* unnamed = nullptr);

// The MindSpore form of a strategy (one stage file; pipeline stages are not
// written in this form). Fails naming a tensor MindSpore cannot express.
Result<MindSporeStrategyFile> StrategyToMindSpore(const Strategy& strategy);

// Opens a .ckpt file or a distributed directory (of a rank directory
// holding several .ckpt files, the last in lexicographic order, as
// transform_checkpoints takes it). A map tensor (MapParameter) of a single
// file is three tensors "<name>.__map_keys__", ".__map_values__" and
// ".__map_status__"; in a directory of several ranks it is refused. Its
// strings (append_dict) are the
// metadata (of the lowest rank holding each); "tessera.*" strings are
// decoded as written below. `strategy` (a strategy file or directory) is
// required for a directory of several ranks; the error without it ends
// with `(strategy_hint)` when one is given (how the caller names that
// option).
Result<std::unique_ptr<CheckpointReader>> OpenMindSporeCheckpoint(
    Env* env, const std::string& path, const std::string& strategy,
    const std::string& strategy_hint = "");

// What MindSpore's transform_checkpoints (2.3.1 and later) orders each
// output rank file's records by: it loads the source ranks a destination
// rank needs in descending order, so a tensor comes where it first appears
// in the highest source rank's file holding it (a pipeline source's last
// stage first); tensors that the source or destination strategy does not
// name follow the others, in that order too.
struct MindSporeRecordOrder {
  std::vector<std::vector<std::string>> rank_files;  // per source rank: names, stored order
  std::set<std::string> unnamed;
};

struct MindSporeWriteOptions {
  std::string prefix = "checkpoint_";
  uint64_t chunk_bytes = kMindSporeChunkBytes;  // bytes per record of a large tensor
  bool overwrite = false;
  // Rank files, and a single .ckpt as rank 0's: records in this order;
  // without source files, in strategy order (unnamed tensors last).
  MindSporeRecordOrder order;
  // Safetensors instead of .ckpt (MindSpore 2.3+'s format="safetensors"):
  // rank files rank_<r>/<prefix><r>.safetensors, or one file at a path
  // ending in ".safetensors", laid out as the safetensors library writes
  // them (PackAsSafetensorsLibrary; no __metadata__ in rank files, as
  // transform_checkpoints writes them; a single file holds the step and
  // metadata as "tessera.*" attributes when there are any).
  bool safetensors = false;
};

// A path ending in ".ckpt" is one file of whole tensors (the strategy must
// hold every tensor whole), followed by `meta` as append_dict strings: each
// metadata key under its own name (or "tessera.meta.<key>" when that is a
// tensor's name or starts with "tessera.", "tessera.meta_hex.<key>" in hex
// when the value is not UTF-8 or ends in NUL) and a step other than 0 as
// "tessera.step". Three tensors that form a map tensor (the names above,
// keys [n], values [n, ...], status [n], in int32, float32, float16 or
// float64, the types MindSpore's map loader decodes) are written
// as one map record.
// Any other path is a directory with rank_<r>/<prefix><r>.ckpt for every
// rank of the strategy, each holding that rank's slice of every tensor it
// holds, in strategy order, as transform_checkpoints writes: tensors only
// (transform_checkpoints writes no strings, and fails on reading one; map
// tensors are refused).
Result<std::unique_ptr<CheckpointWriter>> CreateMindSporeCheckpoint(
    Env* env, const std::string& path, const Strategy& strategy, const CheckpointMeta& meta,
    const MindSporeWriteOptions& options);

// By content: a .ckpt file, or a directory with rank_0/ holding one.
bool IsMindSporeCheckpoint(Env* env, const std::string& path);

}  // namespace tessera

#endif  // TESSERA_CKPT_MINDSPORE_H_
