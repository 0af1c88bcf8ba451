// Each GEMM library's sgemm throughput on this CPU (the ceiling the GPT
// step is measured against), through the kernels' own dispatch
// (runtime/matmul.h): square products of 512, 1024 and 2048, best of
// five runs each, the best size per library.
//   sgemm_peak THREADS [LIBRARY...]   (default: every library)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "runtime/kernels.h"
#include "runtime/matmul.h"

using namespace tessera;

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  std::vector<MatmulLibrary> libraries;
  for (int i = 2; i < argc; ++i) {
    Result<MatmulLibrary> library = ParseMatmulLibrary(argv[i]);
    if (!library.ok()) {
      std::fprintf(stderr, "%s\n", library.status().ToString().c_str());
      return 2;
    }
    libraries.push_back(*library);
  }
  if (libraries.empty()) libraries.assign(std::begin(kMatmulLibraries), std::end(kMatmulLibraries));
  kernels::SetComputeThreads(threads);
  for (MatmulLibrary library : libraries) {
    kernels::SetMatmulLibrary(library);
    double peak = 0;
    int at = 0;
    for (int n : {512, 1024, 2048}) {
      std::vector<float> a(size_t(n) * n, 1.0f), b(size_t(n) * n, 0.5f), c(size_t(n) * n);
      double best = 1e30;
      for (int r = 0; r < 6; ++r) {  // the first warms up
        const auto t0 = std::chrono::steady_clock::now();
        kernels::Sgemm(kernels::kNoTrans, kernels::kNoTrans, n, n, n, 1.0f, a.data(), n, b.data(),
                       n, 0.0f, c.data(), n);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r > 0) best = std::min(best, s);
      }
      if (2.0 * n * n * n / best > peak) peak = 2.0 * n * n * n / best, at = n;
    }
    std::printf("sgemm peak %-8s %d thread(s): %6.1f GFLOP/s (%dx%dx%d; %s)\n",
                std::string(MatmulLibraryName(library)).c_str(), threads, peak / 1e9, at, at, at,
                kernels::DescribeMatmulLibrary(library).c_str());
  }
  return 0;
}
