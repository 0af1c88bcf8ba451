// The parallel strategy of a GPT-2-style model (Hugging Face GPT-2 names and
// Conv1D [in, out] weight shapes), Megatron-style: qkv and fc split on their
// output columns by tp, attention and MLP projections on their input rows,
// the embedding on the vocabulary; blocks spread over pp stages; optional
// ZeRO sharding of every tensor over dp.
#ifndef TESSERA_SAMPLES_GPT_STRATEGY_H_
#define TESSERA_SAMPLES_GPT_STRATEGY_H_

#include <cstdint>

#include "transform/strategy.h"

namespace tessera::samples {

struct GptShape {
  int64_t layers = 12;
  int64_t embed = 768;
  int64_t vocab = 50304;
  int64_t context = 1024;
};

// `mesh` may have any of the axes "pp", "dp", "tp"; missing ones are size 1.
Result<Strategy> GptStrategy(const GptShape& shape, const Mesh& mesh, bool zero);

}  // namespace tessera::samples

#endif  // TESSERA_SAMPLES_GPT_STRATEGY_H_
