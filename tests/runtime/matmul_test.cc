// The matrix products of every GEMM library (runtime/matmul.h): values
// against a double reference for each transpose and leading dimension,
// the same bits on 1 and 2 threads where the library promises it, and
// OpenBLAS keeping the CBLAS names although BLIS exports them too.
#include "runtime/matmul.h"

#include <dlfcn.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "runtime/kernels.h"

namespace tessera::kernels {
namespace {

using Vec = std::vector<float>;

Vec Random(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Vec v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

struct Product {
  Transpose ta, tb;
  int M, N, K;
  int pad = 0;  // added to every leading dimension
};

// C (M x N, leading dimension ldc) = alpha op(A) op(B) + beta C, in
// double.
std::vector<double> Reference(const Product& p, float alpha, const Vec& A, int lda, const Vec& B,
                              int ldb, float beta, const Vec& C, int ldc) {
  std::vector<double> out(C.begin(), C.end());
  for (int i = 0; i < p.M; ++i) {
    for (int j = 0; j < p.N; ++j) {
      double s = 0;
      for (int k = 0; k < p.K; ++k) {
        const double a =
            p.ta ? A[static_cast<size_t>(k) * lda + i] : A[static_cast<size_t>(i) * lda + k];
        const double b =
            p.tb ? B[static_cast<size_t>(j) * ldb + k] : B[static_cast<size_t>(k) * ldb + j];
        s += a * b;
      }
      out[static_cast<size_t>(i) * ldc + j] =
          alpha * s + beta * C[static_cast<size_t>(i) * ldc + j];
    }
  }
  return out;
}

// op(A), op(B) and C of `p`, random, with their leading dimensions.
struct Operands {
  int lda, ldb, ldc;
  Vec A, B, C;
  Operands(const Product& p, std::mt19937& rng)
      : lda((p.ta ? p.M : p.K) + p.pad),
        ldb((p.tb ? p.K : p.N) + p.pad),
        ldc(p.N + p.pad),
        A(Random(static_cast<size_t>(p.ta ? p.K : p.M) * lda, rng)),
        B(Random(static_cast<size_t>(p.tb ? p.N : p.K) * ldb, rng)),
        C(Random(static_cast<size_t>(p.M) * ldc, rng)) {}
  Vec Run(const Product& p, float alpha, float beta) const {
    Vec out = C;
    Sgemm(p.ta, p.tb, p.M, p.N, p.K, alpha, A.data(), lda, B.data(), ldb, beta, out.data(), ldc);
    return out;
  }
};

struct LibraryScope {
  explicit LibraryScope(MatmulLibrary library) { SetMatmulLibrary(library); }
  ~LibraryScope() {
    SetMatmulLibrary(MatmulLibrary::kOpenBlas);
    SetComputeThreads(1);
  }
};

TEST_CASE("every library's products match a double reference, transposed and strided") {
  std::mt19937 rng(3);
  for (MatmulLibrary library : kMatmulLibraries) {
    LibraryScope scope(library);
    for (int threads : {1, 2}) {
      SetComputeThreads(threads);
      for (Transpose ta : {kNoTrans, kTrans}) {
        for (Transpose tb : {kNoTrans, kTrans}) {
          const Product p{ta, tb, 37, 53, 71, /*pad=*/5};
          const Operands o(p, rng);
          const Vec got = o.Run(p, 0.5f, 1.0f);
          const std::vector<double> want =
              Reference(p, 0.5f, o.A, o.lda, o.B, o.ldb, 1.0f, o.C, o.ldc);
          double worst = 0;
          for (size_t i = 0; i < got.size(); ++i)
            worst = std::max(worst, std::fabs(got[i] - want[i]));
          INFO(MatmulLibraryName(library)
               << " " << threads << " thread(s), " << (ta ? "T" : "N") << (tb ? "T" : "N"));
          CHECK(worst < 1e-4);
        }
      }
    }
  }
}

// The same bits on 1 and 2 threads. oneDNN and BLIS: at the GPT's linears'
// shapes (forward, input and weight gradients) and at small outputs with
// long inner dimensions (a narrow layer's weight gradient) alike. OpenBLAS:
// at the linears' shapes only; it splits the inner dimension among threads
// when the output is small (runtime/matmul.h).
TEST_CASE("the matrix products' bits do not depend on the thread count") {
  const std::vector<Product> linears = {
      {kNoTrans, kNoTrans, 512, 768, 256}, {kNoTrans, kTrans, 512, 256, 768},
      {kTrans, kNoTrans, 256, 768, 512},   {kNoTrans, kNoTrans, 256, 1024, 256},
      {kTrans, kNoTrans, 1024, 256, 512},  {kNoTrans, kTrans, 64, 200, 64, 128}};
  const std::vector<Product> small_outputs = {{kTrans, kNoTrans, 48, 48, 3000},
                                              {kTrans, kNoTrans, 16, 96, 6000},
                                              {kNoTrans, kNoTrans, 32, 48, 1000}};
  std::mt19937 rng(5);
  for (MatmulLibrary library : kMatmulLibraries) {
    LibraryScope scope(library);
    std::vector<Product> products = linears;
    if (library != MatmulLibrary::kOpenBlas) {
      products.insert(products.end(), small_outputs.begin(), small_outputs.end());
    }
    for (const Product& p : products) {
      const Operands o(p, rng);
      SetComputeThreads(2);
      const Vec two = o.Run(p, 1.0f, 1.0f);
      SetComputeThreads(1);
      const Vec one = o.Run(p, 1.0f, 1.0f);
      INFO(MatmulLibraryName(library) << " " << p.M << "x" << p.N << "x" << p.K);
      CHECK(one == two);
    }
  }
}

TEST_CASE("the CBLAS names stay OpenBLAS's beside BLIS, and each library says its version") {
  void* sgemm = dlsym(RTLD_DEFAULT, "cblas_sgemm");
  REQUIRE(sgemm != nullptr);
  Dl_info info{};
  REQUIRE(dladdr(sgemm, &info) != 0);
  CHECK(std::string(info.dli_fname).find("openblas") != std::string::npos);
  CHECK(DescribeMatmulLibrary(MatmulLibrary::kOpenBlas).rfind("OpenBLAS 0.", 0) == 0);
  CHECK(DescribeMatmulLibrary(MatmulLibrary::kOneDnn).rfind("oneDNN ", 0) == 0);
  CHECK(DescribeMatmulLibrary(MatmulLibrary::kBlis).rfind("BLIS ", 0) == 0);
  for (MatmulLibrary library : kMatmulLibraries) {
    CHECK(ParseMatmulLibrary(MatmulLibraryName(library)).value() == library);
  }
  CHECK(!ParseMatmulLibrary("mkl").ok());
}

}  // namespace
}  // namespace tessera::kernels
