// AdamW (decoupled weight decay, bias-corrected moments), in PyTorch's
// arithmetic order so the two agree to float rounding, and global gradient
// norm clipping (torch.nn.utils.clip_grad_norm_).
#ifndef TESSERA_RUNTIME_TRAIN_OPTIM_H_
#define TESSERA_RUNTIME_TRAIN_OPTIM_H_

#include <cstdint>

namespace tessera {

struct AdamWConfig {
  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// One step over n parameters: param, grad, m, v: [n]. `step` counts from 1.
// weight_decay is applied when `decay` is true (GPT practice: matrices and
// embeddings decay, biases and layernorm gains do not).
void AdamWUpdate(float* param, const float* grad, float* m, float* v, int64_t n, int64_t step,
                 const AdamWConfig& config, bool decay);

// The L2 norm of a gradient vector, accumulated in double.
double SquaredNorm(const float* grad, int64_t n);

// Scales grads by max_norm / (norm + 1e-6) when norm > max_norm; returns
// the factor applied (1 when not clipped).
float ClipFactor(double norm, float max_norm);
void Scale(float* grad, int64_t n, float factor);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_TRAIN_OPTIM_H_
