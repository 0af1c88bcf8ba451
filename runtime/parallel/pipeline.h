// The pipeline schedule a stage runs, as data: what ParallelGpt executes
// (runtime/model/parallel_gpt.cc: RunPipeline) and what the cost model
// simulates (runtime/cost/pipeline_cost.cc) are the same tasks in the same
// order.
#ifndef TESSERA_RUNTIME_PARALLEL_PIPELINE_H_
#define TESSERA_RUNTIME_PARALLEL_PIPELINE_H_

#include <algorithm>

namespace tessera {

// 1F1B (PipeDream-Flush; Megatron's non-interleaved schedule) on stage
// `stage` of `pp` over `micro_batches`: 2 x micro_batches tasks, each the
// forward or the backward of the next micro-batch in order. First
// min(pp - stage - 1, micro_batches) warm-up forwards, then one forward and
// one backward alternately, then the remaining backwards. A stage holds
// the activations of at most pp - stage micro-batches at once.
struct OneFOneB {
  int pp = 1, stage = 0, micro_batches = 1;

  int tasks() const { return 2 * micro_batches; }
  int warm_up() const { return std::min(pp - stage - 1, micro_batches); }
  // Whether task k (0 <= k < tasks()) is a backward.
  bool IsBackward(int k) const {
    const int warm = warm_up();
    return k >= warm && (k - warm >= 2 * (micro_batches - warm) || (k - warm) % 2 == 1);
  }
  // Micro-batches whose activations the stage holds at once.
  int in_flight() const { return std::min(micro_batches, pp - stage); }
};

// Buffers a pipeline stage sends its input gradients from, reused in turn:
// the gradient of micro-batch j waits for that of j - 2 to have left. One
// per micro-batch would hold M activations' worth: 100 GiB a rank for the
// 512 micro-batches of the SC'21 Megatron paper's 1T-parameter run.
inline int DxSendBuffers(int micro_batches) { return micro_batches < 2 ? micro_batches : 2; }

}  // namespace tessera

#endif  // TESSERA_RUNTIME_PARALLEL_PIPELINE_H_
