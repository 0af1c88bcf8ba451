// OpenBLAS sgemm throughput on this CPU (the ceiling the GPT step is
// measured against): square products, best of several runs.
//   sgemm_peak THREADS
#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  openblas_set_num_threads(threads);
  for (int n : {512, 1024, 2048}) {
    std::vector<float> a(size_t(n) * n, 1.0f), b(size_t(n) * n, 0.5f), c(size_t(n) * n);
    double best = 1e30;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(),
                  n, 0.0f, c.data(), n);
      best = std::min(best,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("sgemm %dx%dx%d, %d thread(s): %.1f GFLOP/s (core %s)\n", n, n, n, threads,
                2.0 * n * n * n / best / 1e9, openblas_get_corename());
  }
  return 0;
}
