#include "runtime/matmul.h"

// OpenBLAS's cblas.h first: BLIS's include directory has a cblas.h too.
#include <cblas.h>
// clang-format off
#include <blis.h>
// clang-format on
#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "runtime/comm/communicator.h"

namespace tessera::kernels {

namespace {

std::atomic<MatmulLibrary> current{MatmulLibrary::kOpenBlas};
// OpenBLAS starts on every core; so do the others until told.
std::atomic<int> threads{static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))};

// oneDNN (Debian's, built on OpenMP) reads the calling thread's OpenMP
// thread count, which each thread keeps for itself: set it on the thread
// that calls, when it changed.
void OneDnnThreads(int n) {
  thread_local int set = 0;
  if (set != n) {
    omp_set_num_threads(n);
    set = n;
  }
}

}  // namespace

std::string DescribeMatmulLibrary(MatmulLibrary library) {
  switch (library) {
    case MatmulLibrary::kOpenBlas: {
      // "OpenBLAS 0.3.21 DYNAMIC_ARCH ...": its name and version.
      std::string config = openblas_get_config();
      size_t end = config.find(' ');
      if (end != std::string::npos) end = config.find(' ', end + 1);
      return config.substr(0, end) + " (core " + openblas_get_corename() + ")";
    }
    case MatmulLibrary::kOneDnn: {
      const dnnl_version_t* v = dnnl_version();
      return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
             std::to_string(v->patch);
    }
    case MatmulLibrary::kBlis:
      return std::string("BLIS ") + bli_info_get_version_str();
  }
  return "?";
}

void SetMatmulLibrary(MatmulLibrary library) { current = library; }

MatmulLibrary CurrentMatmulLibrary() { return current; }

void SetMatmulThreads(int n) {
  n = std::max(1, n);
  threads = n;
  openblas_set_num_threads(n);
}

void Sgemm(Transpose ta, Transpose tb, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc) {
  switch (current.load(std::memory_order_relaxed)) {
    case MatmulLibrary::kOpenBlas:
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M,
                  N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      return;
    case MatmulLibrary::kOneDnn:
      OneDnnThreads(threads.load(std::memory_order_relaxed));
      (void)dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C,
                       ldc);
      return;
    case MatmulLibrary::kBlis: {
      // Row-major: a row stride of ld and a column stride of 1. The
      // thread count goes with the call (a runtime object), not globally.
      rntm_t rntm = BLIS_RNTM_INITIALIZER;
      bli_rntm_set_num_threads(threads.load(std::memory_order_relaxed), &rntm);
      bli_sgemm_ex(ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE,
                   M, N, K, &alpha, const_cast<float*>(A), lda, 1, const_cast<float*>(B), ldb, 1,
                   &beta, C, ldc, 1, nullptr, &rntm);
      return;
    }
  }
}

Status SameMatmulLibrary(Communicator& world) {
  const int32_t mine = static_cast<int32_t>(current.load());
  std::vector<int32_t> all(world.size());
  RETURN_IF_ERROR(world.AllGather(&mine, 1, all.data(), DType::kI32));
  for (int r = 1; r < world.size(); ++r) {
    if (all[r] == all[0]) continue;
    auto name = [&](int rank) {
      return std::string(MatmulLibraryName(static_cast<MatmulLibrary>(all[rank])));
    };
    return FailedPreconditionError(
        "rank " + std::to_string(r) + " does its matrix products with " + name(r) +
        " and rank 0 with " + name(0) +
        ": every rank of a job must use the same library (its machine profile's matmul_library "
        "or --matmul-library), or the ranks round differently and runs are not reproducible");
  }
  return Status::Ok();
}

}  // namespace tessera::kernels
