// Bytes one rank holds, by what they are for: what the runtime accounts
// (ParallelGpt::Memory) and what the cost model predicts, in one type so
// that the two are compared figure for figure.
#ifndef TESSERA_RUNTIME_COST_MEMORY_USE_H_
#define TESSERA_RUNTIME_COST_MEMORY_USE_H_

#include <cstdint>
#include <string>

#include "core/byte_size.h"

namespace tessera {

struct MemoryUse {
  int64_t parameters = 0, gradients = 0, optimizer = 0;
  int64_t activations = 0;    // every slot's saved activations and backward's buffers
  int64_t communication = 0;  // ZeRO's, the pipeline's and the tp sums' buffers
  // Bytes on disk, not in memory (offload): not counted in total().
  int64_t offloaded_parameters = 0, offloaded_optimizer = 0;
  int64_t total() const { return parameters + gradients + optimizer + activations + communication; }
  // "412 MiB (parameters 97 MiB, ..., communication 0 B; on disk:
  // parameters 97 MiB, optimizer 194 MiB)".
  std::string ToString() const {
    std::string out = HumanBytes(total()) + " (parameters " + HumanBytes(parameters) +
                      ", gradients " + HumanBytes(gradients) + ", optimizer " +
                      HumanBytes(optimizer) + ", activations " + HumanBytes(activations) +
                      ", communication " + HumanBytes(communication);
    if (offloaded_parameters > 0 || offloaded_optimizer > 0) {
      out += "; on disk: parameters " + HumanBytes(offloaded_parameters) + ", optimizer " +
             HumanBytes(offloaded_optimizer);
    }
    return out + ")";
  }
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COST_MEMORY_USE_H_
