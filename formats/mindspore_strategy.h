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
  std::string name;  // without the "<stage>-" prefix of a merged pipeline file
  MindSporeLayout layout;
  std::vector<int64_t> shape;  // global shape; only the JSON form records it
  int64_t field = 0;
  // Pipeline stage: the "<stage>-" name prefix of a file merged by
  // merge_pipeline_strategys, else the file's stage (below).
  int64_t stage = 0;
};

struct MindSporeStrategyFile {
  int64_t current_stage = 0;
  // The stage merge_pipeline_strategys takes for the file: that of its first
  // parallel_strategy_item; current_stage when it has none.
  int64_t stage = 0;
  // Whether the parameters carry "<stage>-" prefixes (a merged pipeline
  // strategy, written with current_stage 1).
  bool merged_pipeline = false;
  std::vector<MindSporeParam> params;  // file order
};

// Reads either form (recognised by content). Errors name the file and, for
// bad entries, the parameter.
Result<MindSporeStrategyFile> ReadMindSporeStrategy(Env* env, const std::string& path);

// Writes the protobuf form atomically: one ParallelLayoutItem per parameter
// and one ParallelStrategyItem (node name = parameter, its stage and split
// counts: merge_pipeline_strategys reads the stage of the first). With
// `merged_pipeline`, names get their "<stage>-" prefix, as in the file
// merge_pipeline_strategys writes. A dimension split by several device axes
// cannot be written in this form.
Status WriteMindSporeStrategy(Env* env, const std::string& path, const MindSporeStrategyFile& s);

// Whether `path` holds a MindSpore strategy (protobuf, or JSON with
// "parallel_layout_item") rather than a Tessera strategy JSON.
bool IsMindSporeStrategyFile(Env* env, const std::string& path);

}  // namespace tessera

#endif  // TESSERA_FORMATS_MINDSPORE_STRATEGY_H_
