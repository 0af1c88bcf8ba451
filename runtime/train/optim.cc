#include "runtime/train/optim.h"

#include <cmath>

#include "runtime/kernels.h"

namespace tessera {

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
  kernels::ParallelChunks(n, 1 << 15, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float g = grad[i];
      m[i] = m[i] * c.beta1 + g * one_minus_b1;
      v[i] = v[i] * c.beta2 + one_minus_b2 * g * g;
      const float denom = std::sqrt(v[i]) / bc2_sqrt + c.eps;
      param[i] = param[i] * keep + neg_step_size * m[i] / denom;
    }
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
