// Automatic parallelism for the GPT (MindSpore's AUTO_PARALLEL): a cost
// model that predicts a parallel configuration's step time and per-rank
// memory on a machine (runtime/cost/machine_profile.h), and a search over the
// configurations a job of N ranks can run.
//
// The prediction walks the same operators, placements, redistributions
// and buffers that run (GptGraph, priced by
// gpt_work.h's EstimateStage): compute from the matrix
// products' flops and the element-wise kernels' bytes, collectives over
// tp per micro-batch, the 1F1B pipeline (sum of the stages plus
// (micro-batches - 1) x the slowest; an interleaved one's schedule
// simulated chunk by chunk, or for long ones Megatron's bubble, the
// others' chunks once divided by the chunks), the data-parallel gradient sums in
// buckets (ZeRO-1: reduce-scatter + all-gather), the tied embedding's sum
// between the end stages, the tp sums of partial parameter gradients and
// AdamW's memory traffic. Memory is ParallelGpt::Memory()'s accounting:
// parameters, gradients, Adam moments (sharded over dp under ZeRO-1),
// activations of the micro-batches in flight plus shared buffers, and
// communication buffers.
//
// The search chooses the mesh factorisation (pp x dp x cp x tp; cp a power
// of two up to 16 leaving each rank at least 512 positions of a sequence,
// with ring attention or Ulysses, where the batch cannot take those ranks
// over dp or the sequence is at least 8,192), micro-batches,
// virtual stages (1 or 2 chunks per stage: interleaved 1F1B; more under
// propagate when the file says), ZeRO, recompute, every operator's
// strategy and the pipeline's layers (balanced by cost per stage, or per
// chunk: the last one's ln_f, output projection and loss counted) under a
// per-rank memory budget, and then multi-copy (2 copies of each
// micro-batch, priced on the plan found by the full walk, kept when
// faster), in one of three modes:
// - fast: the operators among data parallelism, Megatron and Megatron-SP;
// - exact: every operator's own choice among its candidates (columns,
//   rows, batch, whole; for attention heads or whole sequences), the
//   blocks folded into one decision. A block is two halves that meet in
//   their stream placements; each half's options dominated by another of
//   the same input and output placements (time, activations, every shared
//   buffer, tp sums, parameters) are dropped, the blocks' Pareto front kept,
//   the heads likewise, and a lower bound on the step (its blocks' time)
//   against the best so far skips the rest. Under the cost model this is
//   the optimum of the folded space (tests/runtime/model/gpt_search_test.cc
//   checks it against brute force);
// - propagate: exact, keeping what a strategy file fixes (operators,
//   mesh, zero, micro-batches, recompute).
// Ties go to the first in a fixed enumeration order, so the result depends
// on nothing but the inputs (not on a file's order).
#ifndef TESSERA_RUNTIME_MODEL_GPT_SEARCH_H_
#define TESSERA_RUNTIME_MODEL_GPT_SEARCH_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/cost/machine_profile.h"
#include "runtime/model/gpt.h"
#include "runtime/model/gpt_predict.h"
#include "runtime/model/parallel_gpt.h"

namespace tessera {

// fast: the operator strategies among data parallelism, Megatron and
// Megatron-SP; exact: every operator's own choice (identical blocks folded
// into one decision); propagate: exact, with what a strategy file sets
// (operators, mesh, zero, micro-batches, recompute) kept.
enum class SearchMode { kFast, kExact, kPropagate };
Result<SearchMode> ParseSearchMode(std::string_view text);  // fast, exact, propagate
std::string_view SearchModeName(SearchMode mode);

struct SearchOptions {
  SearchMode mode = SearchMode::kFast;  // propagate completes `fixed`
  std::shared_ptr<const OpStrategyFile> fixed;
  int64_t rank_memory = 0;  // bytes per rank; 0: the profile's device memory (or no limit)
  int64_t bucket_bytes = int64_t{25} << 20;
  // Where offload would put its files. Given, when no configuration fits
  // the memory in memory, the search takes the fastest that fits with the
  // optimizer offloaded, else with the weights offloaded too (the plan
  // and its name say so); empty: offload is never chosen.
  std::string offload_dir;
  // When no configuration of the device count runs at all, the error names
  // the nearest counts (up to 3 each side) that do in this mode.
  bool name_runnable_counts = true;
};

struct SearchResult {
  ParallelConfig parallel;  // op_strategy set: the file to run
  StepPrediction predicted;
  std::string name;        // "pp=2,dp=2,tp=2 megatron_sp zero=1 mb=4 recompute=selective"
  int64_t candidates = 0;  // configurations costed
  // The runners-up (best first), for the report.
  std::vector<std::pair<std::string, StepPrediction>> alternatives;
};

// The fastest configuration of `devices` ranks under the budget. When none
// fits, the error says the smallest memory any configuration needs and
// which one; when none runs at all, why, and which device counts nearby do.
Result<SearchResult> SearchGptParallel(const GptConfig& config, int B, int T, int devices,
                                       const MachineProfile& profile, const SearchOptions& options);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_GPT_SEARCH_H_
