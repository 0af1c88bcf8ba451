// What one pipeline stage costs one rank over a training step, from its
// work (stage_work.h) and its parameters: per micro-batch its compute, its
// collectives over tp and its transfers to the neighbour stages; once a
// step the gradients' sums (over dp in buckets, ZeRO-1's reduce-scatter
// and all-gather, the tp sums of partial gradients, the tied parameter
// between the end stages) and the update; and the memory it holds.
// Model-agnostic: the model says what its parameters and stages are.
#ifndef TESSERA_RUNTIME_COST_STAGE_COST_H_
#define TESSERA_RUNTIME_COST_STAGE_COST_H_

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/cost/machine_profile.h"
#include "runtime/cost/memory_use.h"
#include "runtime/cost/stage_work.h"

namespace tessera {

// A parameter as a step's pricing sees it: its elements, and the rows of
// its dimension 0 (which ZeRO-1 cuts over dp, as torch.chunk does).
struct ParamShape {
  int64_t numel = 0, rows = 1;
};

// A stage's parameters in parts, so that any depth is assembled from one
// block: the ends before the blocks, one block, the ends after. `tied` is
// the numel of the parameter the first and last stages share (its
// gradient summed between them); `tied_copy` the last stage's copy of it,
// which the clipping norm skips (it counts the first stage's).
struct ParamParts {
  std::vector<ParamShape> before, block, after;
  // Floats of each unit of parameter offload (ParamInfo::unit) where the
  // blocks are not folded; empty: the ends, then each block.
  std::vector<int64_t> unit_floats;
  int64_t tied = 0;
  ParamShape tied_copy{0, 0};
};

// What a stage's parameters take on one rank: floats, the rank's ZeRO-1
// shard, the gradient buckets (from the last parameter back, as the
// runtime makes them) and the largest bucket's per-rank count.
struct ParamStats {
  int64_t floats = 0, zero_shard = 0, largest_bucket = 0, buckets = 0, tied = 0;
  int64_t norm_skip = 0;  // held floats the clipping norm does not read
  // Parameter offload: the three largest units' floats (in use, read
  // ahead, written back: the most it holds at once).
  int64_t offload_resident = 0;
};
// `blocks` copies of parts.block between the ends.
ParamStats StatsOfParts(const ParamParts& parts, int blocks, int dp, int zero,
                        int64_t bucket_bytes);

// The shape of a job's step: its mesh, ZeRO and micro-batches per replica.
struct StepShape {
  // dp: the ranks that average gradients (and shard ZeRO-1): dp x cp under
  // context parallelism, whose cp ranks are the `cp` innermost of them.
  int pp = 1, dp = 1, tp = 1, zero = 0, micro_batches = 1;
  // Multi-copy: copies of each micro-batch taking turns, a copy's tp
  // collectives in flight while the next computes.
  int copies = 1;
  int cp = 1;  // context-parallel ranks (their exchanges: CpCommSeconds)
  // Offload (runtime/train/offload.h): the moments streamed from disk in
  // buckets of offload_bucket_floats, and the weights a unit at a time.
  bool offload_optimizer = false, offload_params = false;
  int64_t offload_bucket_floats = int64_t{1} << 20;
};

// Offload's buffers as the runtime sizes them (runtime/train/offload.cc):
// a moments bucket (floats, whole 4 KiB blocks) for `held` moments asked
// in buckets of `bucket_floats`, and one of the weights' two transfer
// buffers for `floats` weights.
int64_t OffloadBucketFloats(int64_t held, int64_t bucket_floats);
int64_t OffloadBufferBytes(int64_t floats);

// The optimizer's kernels' units a step: AdamW over the parameters a rank
// updates (its ZeRO-1 shard, else all its stage's), the clipping norm over
// those less the tied copy.
struct OptimizerUnits {
  double adamw, norm;
};
OptimizerUnits OptimizerUnitsOf(const ParamStats& ps, int zero);

// One stage's costs on one rank.
struct StageCost {
  // per micro-batch: compute + tp collectives + transfers. Under multi-copy
  // tp_comm is the collectives' exposed part (ExposedTpComm) plus each
  // collective's turn (MachineProfile::copy_turn_s).
  double micro = 0;
  double compute = 0, tp_comm = 0, pp_comm = 0;
  double cp_comm = 0;  // context parallelism's exchanges not hidden (CpCommSeconds)
  // The same per chunk under virtual stages (empty for one chunk): its
  // compute, and its tp collectives + transfers, per micro-batch.
  std::vector<double> chunk_compute, chunk_comm;
  double after = 0, dp_comm = 0, optimizer = 0;  // once per step
  MemoryUse memory;
};
// Multi-copy's exposed share of `comm` seconds of tp collectives among
// `compute` seconds of compute, all `copies` copies': while one copy's
// collective is in flight the next copy computes, so of min(compute,
// comm) all but one copy's share hides (the first copy's compute and the
// last one's collective cannot): comm - min(compute, comm) (copies - 1) /
// copies. With one copy, comm. An even spread: where the compute between
// collectives is uneven (sequence parallelism's layer norms between an
// all-gather and a reduce-scatter) less hides.
double ExposedTpComm(double compute, double comm, int copies);

// Stage `stage` of `shape`, whose micro-batches do `w` and send
// `act_bytes` to the next stage (and their gradients back).
StageCost CostOf(const StageWork& w, const ParamStats& ps, const StepShape& shape, int stage,
                 int64_t act_bytes, const MachineProfile& prof);
// Stage `stage` of an interleaved pipeline: `chunks[c]` is the work of its
// chunk c (virtual stage c x pp + stage), each with its own activation
// slots and shared buffers (its own operators), each sending and
// receiving where it has a neighbour virtual stage.
StageCost CostOf(std::span<const StageWork> chunks, const ParamStats& ps, const StepShape& shape,
                 int stage, int64_t act_bytes, const MachineProfile& prof);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COST_STAGE_COST_H_
