// safetensors behind the checkpoint interfaces (formats/safetensors.h has
// the file format). A safetensors checkpoint is one file, or a directory of
// shards `model-00001-of-0000N.safetensors` with `model.safetensors.index.json`
// (Hugging Face's layout: {"metadata": {"total_size": N}, "weight_map":
// {tensor: file}}). Tensors are stored whole.
//
// What a Tessera checkpoint records besides tensors rides in `__metadata__`
// of every file: "tessera.strategy" (the strategy JSON of transform/
// strategy.md: the layouts the tensors were trained with), "tessera.step",
// "tessera.created_by", and user metadata as "tessera.meta.<key>" (text) or
// "tessera.meta_hex.<key>" (bytes that are not printable ASCII). "format" is
// "pt", which Hugging Face loaders expect.
#ifndef TESSERA_CKPT_SAFETENSORS_CKPT_H_
#define TESSERA_CKPT_SAFETENSORS_CKPT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"

namespace tessera {

inline constexpr char kSafetensorsIndexName[] = "model.safetensors.index.json";

// Opens a .safetensors file, an index file, or a directory holding an index
// (or a single model.safetensors). With "tessera.strategy" in the metadata
// the reader reports those layouts; otherwise every tensor is whole on a
// one-rank mesh, in file order.
Result<std::unique_ptr<CheckpointReader>> OpenSafetensorsCheckpoint(Env* env,
                                                                    const std::string& path);

struct SafetensorsWriteOptions {
  // 0: one file at the path. Otherwise the path is a directory of shards of
  // at most this many tensor bytes each (a larger tensor gets a shard of its
  // own), plus the index; a single shard is written as model.safetensors
  // without an index, as Hugging Face does.
  int64_t max_shard_size = 0;
  bool overwrite = false;
  // MindSpore's unified_safetensors layout instead: the path is a directory
  // of part0.safetensors, part1.safetensors, ... (names in sorted order, at
  // most max_shard_size bytes each, 3 GiB when 0, as MindSpore's ~3 GiB
  // parts; each file in the safetensors library's order, no __metadata__)
  // and param_name_map.json ({"name": "part<i>.safetensors"}, as
  // json.dumps(indent=4) writes it). It holds tensors only: the step and
  // metadata have no place there.
  bool mindspore_unified = false;
};

// A writer of `strategy`'s tensors, stored whole; `strategy`'s layouts are
// recorded in the metadata. Pieces may come in any order and any boxes.
Result<std::unique_ptr<CheckpointWriter>> CreateSafetensorsCheckpoint(
    Env* env, const std::string& path, const Strategy& strategy, const CheckpointMeta& meta,
    const SafetensorsWriteOptions& options);

// The shard files an index names, with the file of each tensor.
struct WeightMapIndex {
  std::vector<std::string> files;          // in first-mention order
  std::map<std::string, std::string> map;  // tensor -> file name
};

// Hugging Face's index ({"weight_map": {tensor: file}}; safetensors' and
// pytorch_model.bin's) or, with `flat`, MindSpore's param_name_map.json
// ({tensor: file}). Every file must be a plain name beside the index.
Result<WeightMapIndex> ReadWeightMapIndex(Env* env, const std::string& path, bool flat);

// Whether `path` looks like a safetensors checkpoint (by content: the
// header length and '{', or an index in the directory).
bool IsSafetensorsCheckpoint(Env* env, const std::string& path);

}  // namespace tessera

#endif  // TESSERA_CKPT_SAFETENSORS_CKPT_H_
