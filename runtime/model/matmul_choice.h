// Calibration's choice of the GEMM library (runtime/matmul.h): a training
// step of small GPTs timed on each library. Here, beside the model, because
// the cost layer (runtime/cost/calibration.h) knows no model;
// train_gpt --calibrate runs it before CalibrateMachine.
#ifndef TESSERA_RUNTIME_MODEL_MATMUL_CHOICE_H_
#define TESSERA_RUNTIME_MODEL_MATMUL_CHOICE_H_

#include <utility>
#include <vector>

#include "core/status.h"
#include "runtime/comm/communicator.h"
#include "runtime/matmul_library.h"

namespace tessera {

// Which GEMM library (runtime/matmul.h) trains fastest here: rank 0
// times a training step (forward and backward) of two one-layer GPTs, one
// 256 wide on 2 sequences of 256 tokens (a small model's products) and one
// 768 wide on 1 (GPT-2 small's), in FLOP/s of model work (6 per parameter
// and token plus the attention's), their geometric mean; five rounds
// interleaving the libraries after one that warms them up, the median
// round each. A whole step rather than products alone: on a Xeon,
// oneDNN's sgemm led OpenBLAS's alone and trailed it in the model (its
// products' scratch memory, the attention's small products). Every rank
// then uses the fastest (kernels::SetMatmulLibrary) and returns every
// library with its figure, fastest first (MachineProfile::
// matmul_libraries). Collective.
Result<std::vector<std::pair<MatmulLibrary, double>>> ChooseMatmulLibrary(Communicator& world);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_MATMUL_CHOICE_H_
