#include "runtime/kernels.h"

#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <vector>

#include "core/thread_pool.h"
#include "runtime/matmul.h"

namespace tessera::kernels {

namespace {

std::unique_ptr<ThreadPool> pool;  // null: run on the caller's thread

// exp for the softmaxes and GELU: x = n ln2 + r with |r| <= ln2/2 (Cody-Waite
// split of ln2), e^r by Cephes' degree-6 polynomial, 2^n through the
// exponent bits. Relative error below 2e-7; below -87.3 it returns ~1e-38,
// above 88.7 +inf. Branch-free, so the loops below vectorize; they are
// compiled for AVX-512, AVX2 and plain x86-64 and picked at load time.
inline float ExpApprox(float x) {
  x = std::min(std::max(x, -87.3f), 88.7f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  return y * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

#define TESSERA_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

// Sums side by side in the reductions below (element i into lane i % kLanes,
// the lanes then added in order): a single running sum is a chain of
// dependent adds, one add's latency per element, which the compiler may
// not reorder; kLanes of them vectorize (two AVX-512 registers of
// doubles). The order is fixed, so the bits do not depend on threads.
constexpr int kLanes = 16;

// The sum of f(i) for i in [0, n) in lanes of T (float, or double for
// float terms summed exactly enough to round once).
template <typename T, typename F>
inline T LaneSum(int64_t n, F f) {
  T lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lane[l] += f(i + l);
  }
  for (int l = 0; i < n; ++i, ++l) lane[l] += f(i);
  T sum = 0;
  for (T x : lane) sum += x;
  return sum;
}

// out[i] = exp(in[i] - shift); returns the sum of out in double.
TESSERA_CLONES double ExpShifted(const float* in, float* out, int64_t n, float shift) {
  for (int64_t i = 0; i < n; ++i) out[i] = ExpApprox(in[i] - shift);
  return LaneSum<double>(n, [&](int64_t i) { return out[i]; });
}

// max(init, x[0], ..., x[n - 1]) in lanes: the same value in any order for
// numbers (where +0 and -0 tie, either may come back; a shift by either
// gives the same exps).
inline float MaxOf(const float* x, int64_t n, float init) {
  float lane[kLanes];
  std::fill(lane, lane + kLanes, init);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lane[l] = std::max(lane[l], x[i + l]);
  }
  for (int l = 0; i < n; ++i, ++l) lane[l] = std::max(lane[l], x[i]);
  float m = init;
  for (float x : lane) m = std::max(m, x);
  return m;
}

bool HasAvx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512cd");
}
bool Avx2Core(const std::string& core) { return core == "Haswell" || core == "Zen"; }

}  // namespace

namespace {

struct Tally {
  bool on = false;
  std::array<double, kKernelCount> units{};
};
thread_local Tally tally;

inline void Count(Kernel k, double units) {
  if (tally.on) tally.units[static_cast<int>(k)] += units;
}

}  // namespace

void CountUnits(bool on) {
  if (on) tally.units.fill(0);
  tally.on = on;
}

bool CountingUnits() { return tally.on; }

std::array<double, kKernelCount> CountedUnits() { return tally.units; }

void AddUnits(Kernel kernel, double units) { Count(kernel, units); }

void SetComputeThreads(int threads) {
  const int n = threads > 0 ? threads : openblas_get_num_procs();
  SetMatmulThreads(n);
  pool = n > 1 ? std::make_unique<ThreadPool>(n) : nullptr;
}

std::string BlasCoreName() { return openblas_get_corename(); }

std::string BetterBlasCore() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return "";
  return HasAvx512() && Avx2Core(BlasCoreName()) ? "SkylakeX" : "";
}

std::string BlasCoreAdvice() {
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (forced == nullptr || !HasAvx512() || !Avx2Core(BlasCoreName())) return "";
  return std::string("note: OPENBLAS_CORETYPE=") + forced +
         " forces AVX2 kernels on this AVX-512 CPU; matrix products run about 1.8x faster "
         "without it (or with OPENBLAS_CORETYPE=SkylakeX)";
}

void ParallelChunks(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t chunks = (n + grain - 1) / grain;
  if (chunks <= 1 || pool == nullptr) {
    for (int64_t c = 0; c < chunks; ++c) fn(c * grain, std::min(n, (c + 1) * grain));
    return;
  }
  (void)pool->ParallelFor(chunks, [&](int64_t c) {
    fn(c * grain, std::min(n, (c + 1) * grain));
    return Status::Ok();
  });
}

void EncoderForward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                    int T, int C, int64_t v0, int64_t V) {
  Count(Kernel::kEmbeddingForward, static_cast<double>(B) * T * C);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      float* o = out + (static_cast<int64_t>(b) * T + t) * C;
      const int64_t row = inp[b * T + t] - v0;
      const bool held = V < 0 || (row >= 0 && row < V);
      const float* e = wte + row * C;
      const float* p = wpe + static_cast<int64_t>(t) * C;
      if (held && wpe != nullptr) {
        for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
      } else if (held) {
        std::copy(e, e + C, o);
      } else if (wpe != nullptr) {
        std::copy(p, p + C, o);
      } else {
        std::fill(o, o + C, 0.0f);
      }
    }
  }
}

void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T,
                     int C, int64_t v0, int64_t V) {
  Count(Kernel::kEmbeddingBackward, static_cast<double>(B) * T * C);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const float* d = dout + (static_cast<int64_t>(b) * T + t) * C;
      const int64_t row = inp[b * T + t] - v0;
      if (V < 0 || (row >= 0 && row < V)) {
        float* de = dwte + row * C;
        for (int c = 0; c < C; ++c) de[c] += d[c];
      }
      if (dwpe != nullptr) {
        float* dp = dwpe + static_cast<int64_t>(t) * C;
        for (int c = 0; c < C; ++c) dp[c] += d[c];
      }
    }
  }
}

namespace {
constexpr int64_t kNormRows = 64;  // rows per chunk of the layernorm kernels
}  // namespace

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C) {
  Count(Kernel::kLayerNormForward, static_cast<double>(N) * C);
  constexpr float kEps = 1e-5f;
  ParallelChunks(N, kNormRows, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float* x = inp + n * C;
      const float m = LaneSum<float>(C, [&](int64_t c) { return x[c]; }) / C;
      const float v = LaneSum<float>(C, [&](int64_t c) { return (x[c] - m) * (x[c] - m); }) / C;
      const float s = 1.0f / std::sqrt(v + kEps);
      float* o = out + n * C;
      for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
      mean[n] = m;
      rstd[n] = s;
    }
  });
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int N, int C) {
  Count(Kernel::kLayerNormBackward, static_cast<double>(N) * C);
  // Each chunk of rows sums its own dweight/dbias; the chunks are then
  // added in order, so the bits do not depend on the thread count.
  const int64_t chunks = (N + kNormRows - 1) / kNormRows;
  std::vector<float> partial(static_cast<size_t>(chunks) * 2 * C, 0.0f);
  ParallelChunks(N, kNormRows, [&](int64_t begin, int64_t end) {
    float* pw = partial.data() + begin / kNormRows * 2 * C;
    float* pb = pw + C;
    for (int64_t n = begin; n < end; ++n) {
      const float* d = dout + n * C;
      const float* x = inp + n * C;
      float* dx = dinp + n * C;
      const float m = mean[n], s = rstd[n];
      // dnorm = dout * weight; dx = s * (dnorm - mean(dnorm) - norm * mean(dnorm * norm))
      const float dnorm_mean = LaneSum<float>(C, [&](int64_t c) { return weight[c] * d[c]; }) / C;
      const float dnorm_norm_mean =
          LaneSum<float>(C, [&](int64_t c) { return weight[c] * d[c] * ((x[c] - m) * s); }) / C;
      for (int c = 0; c < C; ++c) {
        const float norm = (x[c] - m) * s;
        const float dnorm = weight[c] * d[c];
        pb[c] += d[c];
        pw[c] += norm * d[c];
        dx[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
      }
    }
  });
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const float* pw = partial.data() + chunk * 2 * C;
    for (int c = 0; c < C; ++c) {
      dweight[c] += pw[c];
      dbias[c] += pw[C + c];
    }
  }
}

void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                   int C, int OC) {
  if (bias != nullptr) {
    for (int n = 0; n < N; ++n) std::copy(bias, bias + OC, out + static_cast<int64_t>(n) * OC);
  }
  Sgemm(kNoTrans, kNoTrans, N, OC, C, 1.0f, inp, C, weight, OC, bias != nullptr ? 1.0f : 0.0f, out,
        OC);
}

void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int N, int C, int OC) {
  if (dinp != nullptr) {  // [N,C] = [N,OC] @ [C,OC]^T
    Sgemm(kNoTrans, kTrans, N, C, OC, 1.0f, dout, OC, weight, OC, 0.0f, dinp, C);
  }
  // [C,OC] += [N,C]^T @ [N,OC]
  Sgemm(kTrans, kNoTrans, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dweight, OC);
  if (dbias != nullptr) {
    for (int n = 0; n < N; ++n) {
      const float* d = dout + static_cast<int64_t>(n) * OC;
      for (int o = 0; o < OC; ++o) dbias[o] += d[o];
    }
  }
}

void MatmulTransposedForward(float* out, const float* inp, const float* weight, int N, int C,
                             int OC) {
  Sgemm(kNoTrans, kTrans, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
}

void MatmulTransposedBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                              const float* weight, int N, int C, int OC) {
  Sgemm(kNoTrans, kNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
  Sgemm(kTrans, kNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
}

namespace {

// Runs fn(i) for i in [0, n) on the compute pool with each matrix product
// limited to the calling thread, for many small independent products (one per
// attention head) that parallelise better side by side than one by one.
void ParallelSmallProducts(int64_t n, const std::function<void(int64_t)>& fn) {
  if (pool == nullptr) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  SetMatmulThreads(1);
  ParallelChunks(n, 1, [&](int64_t begin, int64_t) { fn(begin); });
  SetMatmulThreads(static_cast<int>(pool->size()));
}

// Causal attention skips the masked upper triangle in blocks of query rows:
// rows [i0, i1) only see keys [0, i1).

}  // namespace

void AttentionForward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  if (tally.on) {
    const double scores = static_cast<double>(AttentionScores(T)) * B * NH;
    Count(Kernel::kAttentionForwardScores, scores);
    Count(Kernel::kAttentionForwardProducts, 2.0 * scores * (C / NH));
  }
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t row = 3 * static_cast<int64_t>(C);
  ParallelSmallProducts(static_cast<int64_t>(B) * NH, [&](int64_t bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const float* q = qkv + b * T * row + h * hs;  // [T,hs], leading dim 3C
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* a = att + bh * T * T;          // [T,T]
    float* o = out + b * T * C + h * hs;  // [T,hs], leading dim C
    for (int i0 = 0; i0 < T; i0 += kAttentionBlock) {
      const int i1 = std::min(T, i0 + kAttentionBlock), rows = i1 - i0;
      float* ab = a + static_cast<int64_t>(i0) * T;
      // scores[i0:i1, 0:i1] = scale * q[i0:i1] @ k[0:i1]^T
      Sgemm(kNoTrans, kTrans, rows, i1, hs, scale, q + i0 * row, row, k, row, 0.0f, ab, T);
      // causal softmax per row: positions > t get weight 0
      for (int t = i0; t < i1; ++t) {
        float* r = a + static_cast<int64_t>(t) * T;
        const float maxv = MaxOf(r + 1, t, r[0]);
        const float sum = static_cast<float>(ExpShifted(r, r, t + 1, maxv));
        const float inv = 1.0f / sum;
        for (int u = 0; u <= t; ++u) r[u] *= inv;
        std::fill(r + t + 1, r + T, 0.0f);
      }
      // out[i0:i1] = att[i0:i1, 0:i1] @ v[0:i1]
      Sgemm(kNoTrans, kNoTrans, rows, hs, i1, 1.0f, ab, T, v, row, 0.0f,
            o + static_cast<int64_t>(i0) * C, C);
    }
  });
}

void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                       int T, int C, int NH) {
  if (tally.on) {
    const double scores = static_cast<double>(AttentionScores(T)) * B * NH;
    Count(Kernel::kAttentionBackwardScores, scores);
    Count(Kernel::kAttentionBackwardProducts, 4.0 * scores * (C / NH));
  }
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t row = 3 * static_cast<int64_t>(C);
  ParallelSmallProducts(static_cast<int64_t>(B) * NH, [&](int64_t bh) {
    // One block of query rows' score gradients at a time: [64, T], not
    // [T, T] (64 MiB a thread at T = 4096).
    thread_local std::vector<float> scratch;
    scratch.resize(static_cast<size_t>(std::min(T, kAttentionBlock)) * T);
    float* db = scratch.data();
    const int64_t b = bh / NH, h = bh % NH;
    const float* q = qkv + b * T * row + h * hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* dq = dqkv + b * T * row + h * hs;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* a = att + bh * T * T;
    const float* d = dout + b * T * C + h * hs;  // [T,hs], ld C
    for (int t = 0; t < T; ++t) std::fill(dk + t * row, dk + t * row + hs, 0.0f);
    for (int i0 = 0; i0 < T; i0 += kAttentionBlock) {
      const int i1 = std::min(T, i0 + kAttentionBlock), rows = i1 - i0;
      // datt[i0:i1, 0:i1] = dout[i0:i1] @ v[0:i1]^T
      Sgemm(kNoTrans, kTrans, rows, i1, hs, 1.0f, d + static_cast<int64_t>(i0) * C, C, v, row, 0.0f,
            db, T);
      // softmax backward in place: dpre = att * (datt - sum(att * datt)) * scale
      for (int t = i0; t < i1; ++t) {
        const float* ar = a + static_cast<int64_t>(t) * T;
        float* dr = db + static_cast<int64_t>(t - i0) * T;
        float dot = 0;
        for (int u = 0; u <= t; ++u) dot += ar[u] * dr[u];
        for (int u = 0; u <= t; ++u) dr[u] = ar[u] * (dr[u] - dot) * scale;
        std::fill(dr + t + 1, dr + i1, 0.0f);
      }
      // dq[i0:i1] = dpre[i0:i1, 0:i1] @ k[0:i1]
      Sgemm(kNoTrans, kNoTrans, rows, hs, i1, 1.0f, db, T, k, row, 0.0f, dq + i0 * row, row);
      // dk[0:i1] += dpre[i0:i1, 0:i1]^T @ q[i0:i1]
      Sgemm(kTrans, kNoTrans, i1, hs, rows, 1.0f, db, T, q + i0 * row, row, 1.0f, dk, row);
    }
    // Key block j gets contributions from query rows t >= j0 only.
    for (int j0 = 0; j0 < T; j0 += kAttentionBlock) {
      const int j1 = std::min(T, j0 + kAttentionBlock), keys = j1 - j0, below = T - j0;
      // dv[j0:j1] = att[j0:T, j0:j1]^T @ dout[j0:T]
      Sgemm(kTrans, kNoTrans, keys, hs, below, 1.0f, a + static_cast<int64_t>(j0) * T + j0, T,
            d + static_cast<int64_t>(j0) * C, C, 0.0f, dv + j0 * row, row);
    }
  });
}

namespace {
// Scores of one (sequence, head) block: s[Tq, Tk] = scale * q k^T, keys
// after a query masked to -inf when causal.
void BlockScores(float* s, const float* q, int64_t ldq, const float* k, int64_t ldk, int Tq, int Tk,
                 int hs, float scale, bool causal) {
  Sgemm(kNoTrans, kTrans, Tq, Tk, hs, scale, q, ldq, k, ldk, 0.0f, s, Tk);
  if (!causal) return;
  for (int i = 0; i < Tq; ++i) {
    std::fill(s + static_cast<int64_t>(i) * Tk + std::min(i + 1, Tk),
              s + static_cast<int64_t>(i + 1) * Tk, -std::numeric_limits<float>::infinity());
  }
}

// The scores a block computes: all Tq x Tk (the products run whole; a
// causal block masks after them).
double BlockScoreCount(int Tq, int Tk) { return static_cast<double>(Tq) * Tk; }
}  // namespace

void AttentionBlockForward(SeqRows<float> o, float* m, float* l, int64_t ld, SeqRows<const float> q,
                           SeqRows<const float> k, SeqRows<const float> v, int B, int Tq, int Tk,
                           int hs, int NH, bool causal) {
  if (tally.on) {
    const double scores = BlockScoreCount(Tq, Tk) * B * NH;
    Count(Kernel::kAttentionForwardScores, scores);
    Count(Kernel::kAttentionForwardProducts, 2.0 * scores * hs);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  ParallelSmallProducts(static_cast<int64_t>(B) * NH, [&](int64_t bh) {
    thread_local std::vector<float> scratch;
    scratch.resize(static_cast<size_t>(Tq) * Tk);
    float* s = scratch.data();
    const int64_t b = bh / NH, h = bh % NH;
    BlockScores(s, q.at(b, 0) + h * hs, q.ld, k.at(b, 0) + h * hs, k.ld, Tq, Tk, hs, scale, causal);
    float* mr = m + bh * ld;
    float* lr = l + bh * ld;
    float* ob = o.at(b, 0) + h * hs;
    for (int i = 0; i < Tq; ++i) {
      float* r = s + static_cast<int64_t>(i) * Tk;
      const int n = causal ? std::min(i + 1, Tk) : Tk;
      const float mx = MaxOf(r, n, mr[i]);
      const float sum = static_cast<float>(ExpShifted(r, r, n, mx));
      std::fill(r + n, r + Tk, 0.0f);
      const float corr = std::isinf(mr[i]) ? 0.0f : ExpApprox(mr[i] - mx);
      lr[i] = lr[i] * corr + sum;
      mr[i] = mx;
      float* orow = ob + static_cast<int64_t>(i) * o.ld;
      for (int d = 0; d < hs; ++d) orow[d] *= corr;
    }
    // o += p @ v
    Sgemm(kNoTrans, kNoTrans, Tq, hs, Tk, 1.0f, s, Tk, v.at(b, 0) + h * hs, v.ld, 1.0f, ob, o.ld);
  });
}

void AttentionBlockFinish(SeqRows<float> o, const float* m, const float* l, float* lse, int B,
                          int Tq, int hs, int NH) {
  for (int64_t bh = 0; bh < static_cast<int64_t>(B) * NH; ++bh) {
    const int64_t b = bh / NH, h = bh % NH;
    for (int i = 0; i < Tq; ++i) {
      const int64_t at = bh * Tq + i;
      const float inv = 1.0f / l[at];
      float* orow = o.at(b, i) + h * hs;
      for (int d = 0; d < hs; ++d) orow[d] *= inv;
      lse[at] = m[at] + std::log(l[at]);
    }
  }
}

void AttentionBlockDelta(float* D, SeqRows<const float> dout, SeqRows<const float> out, int B,
                         int Tq, int hs, int NH) {
  for (int64_t bh = 0; bh < static_cast<int64_t>(B) * NH; ++bh) {
    const int64_t b = bh / NH, h = bh % NH;
    for (int i = 0; i < Tq; ++i) {
      const float* d = dout.at(b, i) + h * hs;
      const float* y = out.at(b, i) + h * hs;
      float dot = 0;
      for (int x = 0; x < hs; ++x) dot += d[x] * y[x];
      D[bh * Tq + i] = dot;
    }
  }
}

void AttentionBlockBackward(SeqRows<float> dq, SeqRows<float> dk, SeqRows<float> dv,
                            SeqRows<const float> dout, SeqRows<const float> q,
                            SeqRows<const float> k, SeqRows<const float> v, const float* lse,
                            const float* D, int64_t ld, int B, int Tq, int Tk, int hs, int NH,
                            bool causal) {
  if (tally.on) {
    const double scores = BlockScoreCount(Tq, Tk) * B * NH;
    Count(Kernel::kAttentionBackwardScores, scores);
    Count(Kernel::kAttentionBackwardProducts, 4.0 * scores * hs);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  ParallelSmallProducts(static_cast<int64_t>(B) * NH, [&](int64_t bh) {
    thread_local std::vector<float> scratch;
    scratch.resize(2 * static_cast<size_t>(Tq) * Tk);
    float* p = scratch.data();
    float* dp = p + static_cast<int64_t>(Tq) * Tk;
    const int64_t b = bh / NH, h = bh % NH;
    const float* qb = q.at(b, 0) + h * hs;
    const float* kb = k.at(b, 0) + h * hs;
    const float* vb = v.at(b, 0) + h * hs;
    const float* db = dout.at(b, 0) + h * hs;
    BlockScores(p, qb, q.ld, kb, k.ld, Tq, Tk, hs, scale, causal);
    for (int i = 0; i < Tq; ++i) {
      float* r = p + static_cast<int64_t>(i) * Tk;
      const int n = causal ? std::min(i + 1, Tk) : Tk;
      ExpShifted(r, r, n, lse[bh * ld + i]);
      std::fill(r + n, r + Tk, 0.0f);
    }
    // dv += p^T dout; dp = dout v^T
    Sgemm(kTrans, kNoTrans, Tk, hs, Tq, 1.0f, p, Tk, db, dout.ld, 1.0f, dv.at(b, 0) + h * hs,
          dv.ld);
    Sgemm(kNoTrans, kTrans, Tq, Tk, hs, 1.0f, db, dout.ld, vb, v.ld, 0.0f, dp, Tk);
    // ds = p * (dp - D) * scale, into dp
    for (int i = 0; i < Tq; ++i) {
      const float* pr = p + static_cast<int64_t>(i) * Tk;
      float* dr = dp + static_cast<int64_t>(i) * Tk;
      const float Di = D[bh * ld + i];
      for (int j = 0; j < Tk; ++j) dr[j] = pr[j] * (dr[j] - Di) * scale;
    }
    // dq += ds k; dk += ds^T q
    Sgemm(kNoTrans, kNoTrans, Tq, hs, Tk, 1.0f, dp, Tk, kb, k.ld, 1.0f, dq.at(b, 0) + h * hs,
          dq.ld);
    Sgemm(kTrans, kNoTrans, Tk, hs, Tq, 1.0f, dp, Tk, qb, q.ld, 1.0f, dk.at(b, 0) + h * hs, dk.ld);
  });
}

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

// tanh through one exp (glibc's tanhf costs several times expf); absolute
// error ~1e-7, saturating cleanly to +-1.
inline float FastTanh(float u) { return 1.0f - 2.0f / (ExpApprox(2.0f * u) + 1.0f); }

TESSERA_CLONES void GeluForwardRange(float* out, const float* inp, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + FastTanh(kGeluScale * (x + 0.044715f * x * x * x)));
  }
}

TESSERA_CLONES void GeluBackwardRange(float* dinp, const float* inp, const float* dout,
                                      int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const float x = inp[i];
    const float u = kGeluScale * (x + 0.044715f * x * x * x);
    const float th = FastTanh(u);
    const float sech2 = 1.0f - th * th;
    const float grad =
        0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = grad * dout[i];
  }
}
}  // namespace

void GeluForward(float* out, const float* inp, int64_t N) {
  Count(Kernel::kGeluForward, static_cast<double>(N));
  ParallelChunks(N, 1 << 14,
                 [&](int64_t begin, int64_t end) { GeluForwardRange(out, inp, begin, end); });
}

void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t N) {
  Count(Kernel::kGeluBackward, static_cast<double>(N));
  ParallelChunks(N, 1 << 14, [&](int64_t begin, int64_t end) {
    GeluBackwardRange(dinp, inp, dout, begin, end);
  });
}

void ResidualForward(float* out, const float* a, const float* b, int64_t N) {
  Count(Kernel::kResidualAdd, static_cast<double>(N));
  for (int64_t i = 0; i < N; ++i) out[i] = a[i] + b[i];
}

float SoftmaxCrossEntropyForward(float* probs, const float* logits, const int32_t* targets, int N,
                                 int V) {
  Count(Kernel::kCrossEntropyForward, static_cast<double>(N) * V);
  // Per-row losses, summed in row order afterwards: the same bits whatever
  // the thread count.
  std::vector<double> row_loss(N);
  ParallelChunks(N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float* l = logits + n * V;
      float* p = probs + n * V;
      const float maxv = MaxOf(l + 1, V - 1, l[0]);
      const double sum = ExpShifted(l, p, V, maxv);
      const float inv = static_cast<float>(1.0 / sum);
      for (int v = 0; v < V; ++v) p[v] *= inv;
      // -log softmax computed from the logits, exact even where probs underflow
      row_loss[n] = std::log(sum) + maxv - l[targets[n]];
    }
  });
  double total = 0;
  for (double x : row_loss) total += x;
  return static_cast<float>(total / N);
}

void SoftmaxCrossEntropyBackward(float* dlogits, const float* probs, const int32_t* targets,
                                 float dloss, int N, int V, int64_t v0) {
  Count(Kernel::kCrossEntropyBackward, static_cast<double>(N) * V);
  const float g = dloss / N;
  ParallelChunks(N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      float* d = dlogits + n * V;
      const float* p = probs + n * V;
      const int64_t target = targets[n] - v0;
      for (int v = 0; v < V; ++v) d[v] = p[v] * g;  // may be in place (dlogits == probs)
      if (target >= 0 && target < V) d[target] -= g;
    }
  });
}

void RowMax(float* max, const float* logits, int N, int V) {
  ParallelChunks(N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float* l = logits + n * V;
      max[n] = MaxOf(l, V, -std::numeric_limits<float>::infinity());
    }
  });
}

void ShardedExp(float* probs, double* sums, const float* logits, const float* max,
                const int32_t* targets, int N, int V, int64_t v0) {
  Count(Kernel::kCrossEntropyForward, static_cast<double>(N) * V);
  ParallelChunks(N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float* l = logits + n * V;
      sums[n] = ExpShifted(l, probs + n * V, V, max[n]);
      const int64_t target = targets[n] - v0;
      sums[N + n] = target >= 0 && target < V ? l[target] : 0.0;
    }
  });
}

float ShardedNormalize(float* probs, const double* sums, const float* max, int N, int V) {
  std::vector<double> row_loss(N);
  ParallelChunks(N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      float* p = probs + n * V;
      const float inv = static_cast<float>(1.0 / sums[n]);
      for (int v = 0; v < V; ++v) p[v] *= inv;
      row_loss[n] = std::log(sums[n]) + max[n] - sums[N + n];
    }
  });
  double total = 0;
  for (double x : row_loss) total += x;
  return static_cast<float>(total / N);
}

}  // namespace tessera::kernels
