// MindSpore strategy files: the protobuf `ParallelStrategyMap`
// (formats/mindspore_strategy.proto) that set_auto_parallel_context(
// strategy_ckpt_save_file=...) writes, and the JSON form newer versions write
// for ".json" names (StrategyCheckpointInfo::to_json). The only file that
// includes the generated header is mindspore_strategy.cc.
#ifndef TESSERA_FORMATS_MINDSPORE_STRATEGY_H_
#define TESSERA_FORMATS_MINDSPORE_STRATEGY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "transform/mindspore_layout.h"

namespace tessera {

struct MindSporeParam {
  std::string name;
  MindSporeLayout layout;
  std::vector<int64_t> shape;  // global shape; only the JSON form records it
  int64_t field = 0;
};

struct MindSporeStrategyFile {
  int64_t current_stage = 0;
  std::vector<MindSporeParam> params;  // file order
};

// Reads either form (recognised by content). Errors name the file and, for
// bad entries, the parameter.
Result<MindSporeStrategyFile> ReadMindSporeStrategy(Env* env, const std::string& path);

// Writes the protobuf form atomically: one ParallelLayoutItem per parameter
// (and a ParallelStrategyItem with its split counts, as MindSpore writes).
// A dimension split by several device axes cannot be written in this form.
Status WriteMindSporeStrategy(Env* env, const std::string& path, const MindSporeStrategyFile& s);

// Whether `path` holds a MindSpore strategy (protobuf, or JSON with
// "parallel_layout_item") rather than a Tessera strategy JSON.
bool IsMindSporeStrategyFile(Env* env, const std::string& path);

}  // namespace tessera

#endif  // TESSERA_FORMATS_MINDSPORE_STRATEGY_H_
