// The search's answer as text, for the programs that print it (ckpt
// auto-parallel, train_gpt --auto-parallel; library code never prints):
// the chosen plan's prediction and its runners-up, where one micro-batch's
// time goes operator by operator, every operator's placements, and "why
// not" another configuration.
#ifndef TESSERA_RUNTIME_MODEL_SEARCH_REPORT_H_
#define TESSERA_RUNTIME_MODEL_SEARCH_REPORT_H_

#include <cstdint>
#include <string>

#include "core/status.h"
#include "runtime/model/gpt_search.h"

namespace tessera {

// The chosen plan's predicted step and memory, the budget (when > 0), its
// stages and the runners-up, one indented line each, under the caller's
// heading that names the plan.
std::string SearchReport(const SearchResult& r, int64_t budget);

// Where one micro-batch's time goes on each stage (the first, the last; a
// middle stage is like the others), operator by operator: compute and tp
// collectives.
Result<std::string> BreakdownReport(const GptConfig& config, int B, int T,
                                    const ParallelConfig& parallel, const MachineProfile& profile);

// Every operator of each stage with its placements and the redistributions
// inserted between them (OpGpt::Describe), for a global batch of B x T.
Result<std::string> DescribePlan(const GptConfig& config, int B, int T,
                                 const ParallelConfig& parallel);

// "pp=2,dp=2,tp=2,zero=1,micro_batches=4,recompute=selective,
// strategy=megatron|megatron_sp|data_parallel|FILE": a configuration to
// compare with the search's.
Result<ParallelConfig> ParseParallelConfig(const std::string& text);

// "why not `label`": the prediction of `alternative` (or why it cannot
// run) against the chosen plan's, and where the time goes in both.
std::string WhyNotReport(const std::string& label, const Result<StepPrediction>& alternative,
                         const StepPrediction& chosen, int64_t budget);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_SEARCH_REPORT_H_
