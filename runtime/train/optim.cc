#include "runtime/train/optim.h"

#include <cmath>

#include "runtime/kernels.h"

namespace tessera {

namespace {

struct AdamWConstants {
  float beta1, beta2, one_minus_b1, one_minus_b2, bc2_sqrt, eps, keep, neg_step_size;
};

// AdamW over n elements. The four arrays never overlap and the constants
// are values, so the loop vectorizes (it stayed scalar when it read the
// configuration through a reference its stores might alias, and called
// sqrtf for errno; this file is built with -fno-math-errno and
// -ffp-contract=off): the same IEEE operations in the same order per
// element, so the same bits on every clone. Compiled for AVX-512, AVX2
// and plain x86-64, picked at load time.
__attribute__((target_clones("avx512f", "avx2", "default"))) void AdamWChunk(
    float* __restrict param, const float* __restrict grad, float* __restrict m, float* __restrict v,
    int64_t n, AdamWConstants k) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float mi = m[i] * k.beta1 + g * k.one_minus_b1;
    const float vi = v[i] * k.beta2 + k.one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / k.bc2_sqrt + k.eps;
    param[i] = param[i] * k.keep + k.neg_step_size * mi / denom;
  }
}

}  // namespace

void AdamWUpdate(float* param, const float* grad, float* m, float* v, int64_t n, int64_t step,
                 const AdamWConfig& c, bool decay) {
  kernels::AddUnits(Kernel::kAdamW, static_cast<double>(n));
  // As torch.optim.AdamW's single-tensor path: the bias corrections in
  // double, then per element in f32: decay, m = m*b1 + g*(1-b1),
  // v = v*b2 + g*g*(1-b2), p += -step_size * m / (sqrt(v) / sqrt(bc2) + eps).
  const double bc1 = 1.0 - std::pow(static_cast<double>(c.beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(c.beta2), static_cast<double>(step));
  const float neg_step_size = static_cast<float>(-(c.lr / bc1));
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float keep =
      decay ? static_cast<float>(1.0 - static_cast<double>(c.lr) * c.weight_decay) : 1.0f;
  const float one_minus_b1 = static_cast<float>(1.0 - c.beta1);
  const float one_minus_b2 = static_cast<float>(1.0 - c.beta2);
  const AdamWConstants k{c.beta1,  c.beta2, one_minus_b1, one_minus_b2,
                         bc2_sqrt, c.eps,   keep,         neg_step_size};
  kernels::ParallelChunks(n, 1 << 15, [&](int64_t begin, int64_t end) {
    AdamWChunk(param + begin, grad + begin, m + begin, v + begin, end - begin, k);
  });
}

double SquaredNorm(const float* grad, int64_t n) {
  kernels::AddUnits(Kernel::kSquaredNorm, static_cast<double>(n));
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(grad[i]) * grad[i];
  return s;
}

float ClipFactor(double norm, float max_norm) {
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

void Scale(float* grad, int64_t n, float factor) {
  if (factor == 1.0f) return;
  for (int64_t i = 0; i < n; ++i) grad[i] *= factor;
}

}  // namespace tessera
