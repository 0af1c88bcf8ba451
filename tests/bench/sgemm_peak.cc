// Each GEMM library's sgemm throughput on this CPU (the ceiling the GPT
// step is measured against), through the kernels' own dispatch
// (runtime/matmul.h): square products of 512, 1024 and 2048, best of
// five runs each, the best size per library.
//   sgemm_peak THREADS [--model L,C,T,B,V]... [LIBRARY...]   (default: every library)
//
// With --model L,C,T,B,V (repeatable) it then times the products of one training step
// of that GPT (the calls runtime/kernels.cc's MatmulForward and
// MatmulBackward and the tied head make: forward, input gradient and
// weight gradient of qkv, attention projection, MLP and head; attention's
// own products are not the library's) and prints their GFLOP/s and its
// share of the square peak: the ceiling the library puts on a step's
// model work at those shapes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/kernels.h"
#include "runtime/matmul.h"

using namespace tessera;

namespace {

struct Product {
  kernels::Transpose ta, tb;
  int m, n, k;
  float beta;  // 1: accumulates (a bias first, or a gradient)
};

// The library products of one GPT block of width c over n = B * T
// tokens (kind 0: forward, 1: input gradient, 2: weight gradient), or of
// the tied head over a vocabulary of v (kind 3), as kernels.cc calls them.
std::vector<Product> StepProducts(int kind, int c, int n, int v) {
  using kernels::kNoTrans;
  using kernels::kTrans;
  std::vector<Product> out;
  if (kind == 3) {
    out.push_back({kNoTrans, kTrans, n, v, c, 0});    // forward
    out.push_back({kNoTrans, kNoTrans, n, c, v, 0});  // input gradient
    out.push_back({kTrans, kNoTrans, v, c, n, 1});    // weight gradient
    return out;
  }
  for (auto [in, oc] : {std::pair{c, 3 * c}, {c, c}, {c, 4 * c}, {4 * c, c}}) {
    if (kind == 0) out.push_back({kNoTrans, kNoTrans, n, oc, in, 1});
    if (kind == 1) out.push_back({kNoTrans, kTrans, n, in, oc, 0});
    if (kind == 2) out.push_back({kTrans, kNoTrans, in, oc, n, 1});
  }
  return out;
}

// Seconds of the best of `passes` passes over `products` (after one
// warm-up).
double TimeProducts(const std::vector<Product>& products, int passes = 3) {
  size_t most = 0;
  for (const Product& p : products) {
    most = std::max({most, size_t(p.m) * p.k, size_t(p.k) * p.n, size_t(p.m) * p.n});
  }
  std::vector<float> a(most, 0.25f), b(most, 0.5f), c(most, 0.0f);
  double best = 1e30;
  for (int r = 0; r <= passes; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const Product& p : products) {
      const int lda = p.ta == kernels::kNoTrans ? p.k : p.m;
      const int ldb = p.tb == kernels::kNoTrans ? p.n : p.k;
      kernels::Sgemm(p.ta, p.tb, p.m, p.n, p.k, 1.0f, a.data(), lda, b.data(), ldb, p.beta,
                     c.data(), p.n);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::min(best, s);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  std::vector<MatmulLibrary> libraries;
  std::vector<std::vector<int>> models;  // each L, C, T, B, V
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
      std::string spec = argv[++i];
      std::vector<int>& model = models.emplace_back();
      for (size_t at = 0; at <= spec.size();) {
        const size_t comma = std::min(spec.find(',', at), spec.size());
        model.push_back(std::atoi(spec.substr(at, comma - at).c_str()));
        at = comma + 1;
      }
      if (model.size() != 5) {
        std::fprintf(stderr, "sgemm_peak: --model takes L,C,T,B,V\n");
        return 2;
      }
      continue;
    }
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
      const double best = TimeProducts({{kernels::kNoTrans, kernels::kNoTrans, n, n, n, 0}}, 5);
      if (2.0 * n * n * n / best > peak) peak = 2.0 * n * n * n / best, at = n;
    }
    std::printf("sgemm peak %-8s %d thread(s): %6.1f GFLOP/s (%dx%dx%d; %s)\n",
                std::string(MatmulLibraryName(library)).c_str(), threads, peak / 1e9, at, at, at,
                kernels::DescribeMatmulLibrary(library).c_str());
    for (const std::vector<int>& model : models) {
      // Every block's products are the same: one block's timed, times L.
      const char* kinds[] = {"forward", "input gradient", "weight gradient", "head"};
      double flops[4], seconds[4], all_flops = 0, all_seconds = 0;
      for (int kind = 0; kind < 4; ++kind) {
        const std::vector<Product> some =
            StepProducts(kind, model[1], model[2] * model[3], model[4]);
        const double times = kind == 3 ? 1 : model[0];
        flops[kind] = 0;
        for (const Product& p : some) flops[kind] += times * 2.0 * p.m * p.n * p.k;
        seconds[kind] = times * TimeProducts(some);
        all_flops += flops[kind];
        all_seconds += seconds[kind];
      }
      const double rate = all_flops / all_seconds;
      std::printf(
          "  products of a step of L%d C%d T%d B%d V%d %-8s %d thread(s): %6.1f GFLOP/s = "
          "%.0f%% of its peak (",
          model[0], model[1], model[2], model[3], model[4],
          std::string(MatmulLibraryName(library)).c_str(), threads, rate / 1e9, 100 * rate / peak);
      for (int kind = 0; kind < 4; ++kind) {
        std::printf("%s%s %.1f, %.0f%% of the flops", kind == 0 ? "" : "; ", kinds[kind],
                    flops[kind] / seconds[kind] / 1e9, 100 * flops[kind] / all_flops);
      }
      std::printf(")\n");
    }
  }
  return 0;
}
