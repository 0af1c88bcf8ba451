#include "runtime/kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace tessera::kernels {

void SetComputeThreads(int threads) {
  openblas_set_num_threads(threads > 0 ? threads : openblas_get_num_procs());
}

void EncoderForward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                    int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      float* o = out + (static_cast<int64_t>(b) * T + t) * C;
      const float* e = wte + static_cast<int64_t>(inp[b * T + t]) * C;
      const float* p = wpe + static_cast<int64_t>(t) * C;
      for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
    }
  }
}

void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T,
                     int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const float* d = dout + (static_cast<int64_t>(b) * T + t) * C;
      float* de = dwte + static_cast<int64_t>(inp[b * T + t]) * C;
      float* dp = dwpe + static_cast<int64_t>(t) * C;
      for (int c = 0; c < C; ++c) {
        de[c] += d[c];
        dp[c] += d[c];
      }
    }
  }
}

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C) {
  constexpr float kEps = 1e-5f;
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<int64_t>(n) * C;
    float m = 0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    float v = 0;
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= C;
    const float s = 1.0f / std::sqrt(v + kEps);
    float* o = out + static_cast<int64_t>(n) * C;
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* d = dout + static_cast<int64_t>(n) * C;
    const float* x = inp + static_cast<int64_t>(n) * C;
    float* dx = dinp + static_cast<int64_t>(n) * C;
    const float m = mean[n], s = rstd[n];
    // dnorm = dout * weight; dx = s * (dnorm - mean(dnorm) - norm * mean(dnorm * norm))
    float dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int c = 0; c < C; ++c) {
      const float norm = (x[c] - m) * s;
      const float dnorm = weight[c] * d[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int c = 0; c < C; ++c) {
      const float norm = (x[c] - m) * s;
      const float dnorm = weight[c] * d[c];
      dbias[c] += d[c];
      dweight[c] += norm * d[c];
      dx[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}

void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                   int C, int OC) {
  if (bias != nullptr) {
    for (int n = 0; n < N; ++n) std::copy(bias, bias + OC, out + static_cast<int64_t>(n) * OC);
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, OC, C, 1.0f, inp, C, weight, OC,
              bias != nullptr ? 1.0f : 0.0f, out, OC);
}

void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int N, int C, int OC) {
  if (dinp != nullptr) {  // [N,C] += [N,OC] @ [C,OC]^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, C, OC, 1.0f, dout, OC, weight, OC,
                1.0f, dinp, C);
  }
  // [C,OC] += [N,C]^T @ [N,OC]
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f,
              dweight, OC);
  if (dbias != nullptr) {
    for (int n = 0; n < N; ++n) {
      const float* d = dout + static_cast<int64_t>(n) * OC;
      for (int o = 0; o < OC; ++o) dbias[o] += d[o];
    }
  }
}

void MatmulTransposedForward(float* out, const float* inp, const float* weight, int N, int C,
                             int OC) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, 0.0f,
              out, OC);
}

void MatmulTransposedBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                              const float* weight, int N, int C, int OC) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C,
              1.0f, dinp, C);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
              dweight, C);
}

void AttentionForward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t row = 3 * static_cast<int64_t>(C);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* q = qkv + b * T * row + h * hs;  // [T,hs], leading dim 3C
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* a = att + (static_cast<int64_t>(b) * NH + h) * T * T;  // [T,T]
      // scores = scale * q @ k^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, row, k, row, 0.0f,
                  a, T);
      // causal softmax per row: positions > t get weight 0
      for (int t = 0; t < T; ++t) {
        float* r = a + static_cast<int64_t>(t) * T;
        float maxv = r[0];
        for (int u = 1; u <= t; ++u) maxv = std::max(maxv, r[u]);
        float sum = 0;
        for (int u = 0; u <= t; ++u) {
          r[u] = std::exp(r[u] - maxv);
          sum += r[u];
        }
        const float inv = 1.0f / sum;
        for (int u = 0; u <= t; ++u) r[u] *= inv;
        for (int u = t + 1; u < T; ++u) r[u] = 0.0f;
      }
      // out[:, h] = att @ v
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v, row, 0.0f,
                  out + static_cast<int64_t>(b) * T * C + h * hs, C);
    }
  }
}

void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* att,
                       float* scratch, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t row = 3 * static_cast<int64_t>(C);
  float* datt = scratch;  // [T,T]
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* q = qkv + b * T * row + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv + b * T * row + h * hs;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* a = att + (static_cast<int64_t>(b) * NH + h) * T * T;
      const float* d = dout + static_cast<int64_t>(b) * T * C + h * hs;  // [T,hs], ld C
      // datt = dout @ v^T ; dv += att^T @ dout
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, d, C, v, row, 0.0f,
                  datt, T);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, d, C, 1.0f, dv,
                  row);
      // softmax backward in place: dpre = att * (datt - sum(att * datt)) * scale
      for (int t = 0; t < T; ++t) {
        const float* ar = a + static_cast<int64_t>(t) * T;
        float* dr = datt + static_cast<int64_t>(t) * T;
        float dot = 0;
        for (int u = 0; u <= t; ++u) dot += ar[u] * dr[u];
        for (int u = 0; u <= t; ++u) dr[u] = ar[u] * (dr[u] - dot) * scale;
        for (int u = t + 1; u < T; ++u) dr[u] = 0.0f;
      }
      // dq += dpre @ k ; dk += dpre^T @ q
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, datt, T, k, row, 1.0f,
                  dq, row);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, datt, T, q, row, 1.0f,
                  dk, row);
    }
  }
}

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
}

void GeluForward(float* out, const float* inp, int64_t N) {
  for (int64_t i = 0; i < N; ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(kGeluScale * (x + 0.044715f * x * x * x)));
  }
}

void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t N) {
  for (int64_t i = 0; i < N; ++i) {
    const float x = inp[i];
    const float u = kGeluScale * (x + 0.044715f * x * x * x);
    const float th = std::tanh(u);
    const float sech2 = 1.0f - th * th;
    const float grad = 0.5f * (1.0f + th) +
                       0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += grad * dout[i];
  }
}

void ResidualForward(float* out, const float* a, const float* b, int64_t N) {
  for (int64_t i = 0; i < N; ++i) out[i] = a[i] + b[i];
}

void ResidualBackward(float* da, float* db, const float* dout, int64_t N) {
  for (int64_t i = 0; i < N; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

float SoftmaxCrossEntropyForward(float* probs, const float* logits, const int32_t* targets, int N,
                                 int V) {
  double total = 0;
  for (int n = 0; n < N; ++n) {
    const float* l = logits + static_cast<int64_t>(n) * V;
    float* p = probs + static_cast<int64_t>(n) * V;
    float maxv = l[0];
    for (int v = 1; v < V; ++v) maxv = std::max(maxv, l[v]);
    double sum = 0;
    for (int v = 0; v < V; ++v) {
      p[v] = std::exp(l[v] - maxv);
      sum += p[v];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int v = 0; v < V; ++v) p[v] *= inv;
    // -log softmax computed from the logits, exact even where probs underflow
    total += std::log(sum) + maxv - l[targets[n]];
  }
  return static_cast<float>(total / N);
}

void SoftmaxCrossEntropyBackward(float* dlogits, const float* probs, const int32_t* targets,
                                 float dloss, int N, int V) {
  const float g = dloss / N;
  for (int n = 0; n < N; ++n) {
    float* d = dlogits + static_cast<int64_t>(n) * V;
    const float* p = probs + static_cast<int64_t>(n) * V;
    for (int v = 0; v < V; ++v) d[v] += (p[v] - (v == targets[n] ? 1.0f : 0.0f)) * g;
  }
}

}  // namespace tessera::kernels
