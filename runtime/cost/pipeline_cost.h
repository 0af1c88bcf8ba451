// How a training step is priced from its stages' costs (stage_cost.h):
// the pipeline's critical path under 1F1B (the runtime's schedule,
// runtime/parallel/pipeline.h), simulated where ranks share devices, the
// gradient sums and the update after it; and the layers per stage that
// balance the stages. Model-agnostic.
#ifndef TESSERA_RUNTIME_COST_PIPELINE_COST_H_
#define TESSERA_RUNTIME_COST_PIPELINE_COST_H_

#include <array>
#include <limits>
#include <string>
#include <vector>

#include "runtime/cost/machine_profile.h"
#include "runtime/cost/memory_use.h"
#include "runtime/cost/stage_cost.h"

namespace tessera {

struct StepPrediction {
  double seconds = 0;  // one training step
  // Its parts on the critical path: the pipeline (compute and tp
  // collectives of every micro-batch, the transfers between stages), of
  // which `bubble` is idle, then the gradient sums and the update.
  double pipeline = 0, compute = 0, tp_comm = 0, pp_comm = 0, bubble = 0;
  double dp_comm = 0, optimizer = 0;
  MemoryUse memory;  // the rank that holds the most
  // With parameter servers: `memory` is a worker's, this the server that
  // holds the most (runtime/model/param_server.h).
  MemoryUse server_memory;
  int memory_stage = 0;                 // its stage
  std::vector<double> stage_seconds;    // per micro-batch, forward + backward
  std::vector<MemoryUse> stage_memory;  // each stage's (its tp rank 0's)
  // Each stage's (its tp rank 0's) units of each kernel over a step.
  std::vector<std::array<double, kKernelCount>> stage_kernel_units;
  std::string ToString() const;
};

// The step from its stages' costs: 1F1B's critical path, the stages' sum
// plus micro-batches - 1 times the slowest; stages priced per chunk
// (StageCost::chunk_compute, interleaved 1F1B) have their schedule
// simulated instead. Ranks sharing a device (more
// ranks than cores) are charged the device's share (their compute is
// priced at it); in a pipeline the waiting ranks lend their share to the
// working ones (simulated).
// A step that could not come under `cutoff` may stop early: its seconds
// are then a lower bound, itself at least `cutoff` (the search passes the
// slowest plan it still keeps).
StepPrediction PriceStep(const std::vector<StageCost>& stages, int m, const MachineProfile& prof,
                         int group, double cutoff = std::numeric_limits<double>::infinity());

// The layers per stage that balance the stages' predicted times (the first
// stage also embeds, the last also runs ln_f, the output projection and the
// loss): `block` seconds per block, `first` and `last` the ends' extra.
std::vector<int> BalanceStages(int layers, int pp, double block, double first, double last);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COST_PIPELINE_COST_H_
