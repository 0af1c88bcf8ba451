// Bytes one rank holds, by what they are for: what the runtime accounts
// (ParallelGpt::Memory) and what the cost model predicts, in one type so
// that the two are compared figure for figure.
#ifndef TESSERA_RUNTIME_COST_MEMORY_USE_H_
#define TESSERA_RUNTIME_COST_MEMORY_USE_H_

#include <cstdint>

namespace tessera {

struct MemoryUse {
  int64_t parameters = 0, gradients = 0, optimizer = 0;
  int64_t activations = 0;    // every slot's saved activations and backward's buffers
  int64_t communication = 0;  // ZeRO's, the pipeline's and the tp sums' buffers
  int64_t total() const { return parameters + gradients + optimizer + activations + communication; }
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COST_MEMORY_USE_H_
