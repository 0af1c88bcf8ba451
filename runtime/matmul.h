// The matrix products of the kernels (runtime/kernels.h), from one of
// Debian's three f32 GEMM libraries: OpenBLAS (the default), oneDNN and
// BLIS. Which is fastest depends on the CPU; `train_gpt --calibrate`
// measures them and records the fastest in the machine profile
// (ChooseMatmulLibrary, runtime/model/matmul_choice.h), and a job takes it
// from its profile or --matmul-library. Each library rounds differently,
// so every rank of a job must use the same one (SameMatmulLibrary).
//
// Thread counts: the same bits on any number of threads for oneDNN and
// BLIS (tests/runtime/matmul_test.cc); OpenBLAS splits the inner
// dimension among threads when the output is small (below about 100 x 100
// with thousands of inner terms, e.g. 48 x 48 x 3000), so there its bits
// depend on the thread count.
#ifndef TESSERA_RUNTIME_MATMUL_H_
#define TESSERA_RUNTIME_MATMUL_H_

#include <string>
#include <string_view>

#include "core/status.h"
#include "runtime/matmul_library.h"

namespace tessera {
class Communicator;
}

namespace tessera::kernels {

// The library with its version, e.g. "oneDNN 2.6.3" or "OpenBLAS 0.3.21
// (core SkylakeX)": what the training log shows.
std::string DescribeMatmulLibrary(MatmulLibrary library);

// The library the kernels use from now on, and the one they use (at first
// OpenBLAS). Call it at start-up or between runs, never while kernels run.
void SetMatmulLibrary(MatmulLibrary library);
MatmulLibrary CurrentMatmulLibrary();

// The threads each product may use (>= 1), for every library alike;
// kernels.cc's SetComputeThreads and ParallelSmallProducts set it.
void SetMatmulThreads(int threads);

enum Transpose : bool { kNoTrans = false, kTrans = true };
// Row-major C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C (cblas_sgemm's
// contract with CblasRowMajor) through the current library.
void Sgemm(Transpose ta, Transpose tb, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc);

// Collective: OK when every rank of `world` uses the same library, else
// on every rank an error naming a rank that differs from rank 0 and both
// libraries.
Status SameMatmulLibrary(Communicator& world);

}  // namespace tessera::kernels

#endif  // TESSERA_RUNTIME_MATMUL_H_
