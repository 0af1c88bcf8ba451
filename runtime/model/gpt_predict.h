// The cost model applied to one configuration of the GPT: the predicted
// step time and per-rank memory of any configuration ParallelGpt runs (a
// strategy file, Megatron's preset, recompute, pipeline stages), walked
// over the operators, placements and buffers that run (gpt_work.h) and
// priced on a machine profile (runtime/cost/). The search (gpt_search.h)
// folds the same arithmetic over identical blocks.
#ifndef TESSERA_RUNTIME_MODEL_GPT_PREDICT_H_
#define TESSERA_RUNTIME_MODEL_GPT_PREDICT_H_

#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/cost/pipeline_cost.h"
#include "runtime/cost/stage_cost.h"
#include "runtime/model/gpt.h"
#include "runtime/model/parallel_gpt.h"

namespace tessera {

// The predicted step of `parallel` (any configuration ParallelGpt runs:
// a strategy file, Megatron's preset, recompute) for a global batch of
// B x T tokens. Errors name what does not fit (a batch not divisible by
// dp x micro-batches, a bad strategy).
Result<StepPrediction> PredictGptStep(const GptConfig& config, int B, int T,
                                      const ParallelConfig& parallel,
                                      const MachineProfile& profile);

// Where one micro-batch's time goes on each stage, operator by operator
// (its first block's operators stand for each block of the stage; their
// conversions and duals included): seconds of compute and of collectives
// over tp.
struct OpCost {
  std::string name;
  double compute = 0, comm = 0;
};
Result<std::vector<std::vector<OpCost>>> BreakdownGptStep(const GptConfig& config, int B, int T,
                                                          const ParallelConfig& parallel,
                                                          const MachineProfile& profile);

// A stage's parameters (Gpt::Params) as the step's pricing takes them:
// every one as an end (`fold_blocks` false: the stage as it is), or split
// into the ends before the blocks, one block and the ends after (a
// one-layer stage's, with `fold_blocks`: any depth is assembled from them).
// wte is the parameter the end stages share.
ParamParts GptParamParts(const std::vector<ParamInfo>& params, bool fold_blocks);
// The shape of `par`'s step with `micro_batches`.
StepShape ShapeOf(const ParallelConfig& par, int micro_batches);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_GPT_PREDICT_H_
