// Every kernel's backward against central finite differences of its
// forward (in double, through a random linear functional of the output),
// plus forward values checked directly where they have a closed form.
#include "runtime/kernels.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "runtime/train/optim.h"

namespace tessera::kernels {
namespace {

using Vec = std::vector<float>;

Vec Random(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  Vec v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

double Dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Compares analytic[i] with (loss(x+h) - loss(x-h)) / 2h for every
// `stride`-th element of `param`.
void CheckGradient(const char* what, Vec& param, const Vec& analytic,
                   const std::function<double()>& loss, double tol = 2e-2, size_t stride = 1) {
  REQUIRE(param.size() == analytic.size());
  double max_err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < param.size(); i += stride) {
    const float saved = param[i];
    const float h = 1e-2f * std::max(1.0f, std::fabs(saved));
    param[i] = saved + h;
    const double up = loss();
    param[i] = saved - h;
    const double down = loss();
    param[i] = saved;
    const double numeric = (up - down) / (2.0 * h);
    const double err = std::fabs(numeric - analytic[i]) / std::max(1.0, std::fabs(numeric));
    if (err > max_err) {
      max_err = err;
      worst = i;
    }
  }
  INFO(what << ": worst element " << worst << " analytic " << analytic[worst]);
  CHECK(max_err < tol);
}

TEST_CASE("matmul forward equals the naive product, backward matches finite differences") {
  std::mt19937 rng(1);
  const int N = 5, C = 7, OC = 3;
  Vec x = Random(N * C, rng), w = Random(C * OC, rng), b = Random(OC, rng), r = Random(N * OC, rng);
  Vec out(N * OC);
  MatmulForward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
  for (int n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) {
      double s = b[o];
      for (int c = 0; c < C; ++c) s += static_cast<double>(x[n * C + c]) * w[c * OC + o];
      REQUIRE(out[n * OC + o] == Approx(s).epsilon(1e-5));
    }
  }
  auto loss = [&] {
    Vec o(N * OC);
    MatmulForward(o.data(), x.data(), w.data(), b.data(), N, C, OC);
    return Dot(o, r);
  };
  // Input gradients are written (the sentinel must vanish); parameter
  // gradients accumulate (checked from zero here, on top of 1 below).
  Vec dx(N * C, 123.0f), dw(C * OC, 0.0f), db(OC, 0.0f);
  MatmulBackward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), N, C, OC);
  CheckGradient("dinp", x, dx, loss);
  CheckGradient("dweight", w, dw, loss);
  CheckGradient("dbias", b, db, loss);
  Vec dw1(C * OC, 1.0f), db1(OC, 1.0f);
  MatmulBackward(nullptr, dw1.data(), db1.data(), r.data(), x.data(), w.data(), N, C, OC);
  for (size_t i = 0; i < dw.size(); ++i) CHECK(dw1[i] == Approx(1.0f + dw[i]));
  for (size_t i = 0; i < db.size(); ++i) CHECK(db1[i] == Approx(1.0f + db[i]));
}

TEST_CASE("the tied (transposed) product and its gradients") {
  std::mt19937 rng(6);
  const int N = 4, C = 6, OC = 5;
  Vec x = Random(N * C, rng), w = Random(OC * C, rng), r = Random(N * OC, rng);
  auto loss = [&] {
    Vec o(N * OC);
    MatmulTransposedForward(o.data(), x.data(), w.data(), N, C, OC);
    return Dot(o, r);
  };
  Vec o(N * OC);
  MatmulTransposedForward(o.data(), x.data(), w.data(), N, C, OC);
  double s = 0;
  for (int c = 0; c < C; ++c) s += static_cast<double>(x[1 * C + c]) * w[2 * C + c];
  CHECK(o[1 * OC + 2] == Approx(s).epsilon(1e-5));
  Vec dx(N * C, 123.0f), dw(OC * C, 0.0f);
  MatmulTransposedBackward(dx.data(), dw.data(), r.data(), x.data(), w.data(), N, C, OC);
  CheckGradient("dinp", x, dx, loss);
  CheckGradient("dweight", w, dw, loss);
}

TEST_CASE("layernorm normalises each row, backward matches finite differences") {
  std::mt19937 rng(2);
  const int N = 4, C = 8;
  Vec x = Random(N * C, rng, 2.0f), w = Random(C, rng), b = Random(C, rng), r = Random(N * C, rng);
  Vec out(N * C), mean(N), rstd(N);
  Vec ones(C, 1.0f), zeros(C, 0.0f);
  LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), ones.data(), zeros.data(), N, C);
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += out[n * C + c];
    for (int c = 0; c < C; ++c) v += out[n * C + c] * out[n * C + c];
    CHECK(m / C == Approx(0).margin(1e-6));
    CHECK(v / C == Approx(1).epsilon(1e-4));
  }
  auto loss = [&] {
    Vec o(N * C), m(N), s(N);
    LayerNormForward(o.data(), m.data(), s.data(), x.data(), w.data(), b.data(), N, C);
    return Dot(o, r);
  };
  LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  // The input gradient accumulates too (the residual stream's).
  Vec dx(N * C, 0.5f), dw(C, 0.0f), db(C, 0.0f);
  LayerNormBackward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(),
                    rstd.data(), N, C);
  for (float& g : dx) g -= 0.5f;
  CheckGradient("dinp", x, dx, loss);
  CheckGradient("dweight", w, dw, loss);
  CheckGradient("dbias", b, db, loss);
}

TEST_CASE("causal attention: rows sum to one, no weight on the future, exact gradients") {
  std::mt19937 rng(3);
  const int B = 2, T = 5, C = 8, NH = 2;
  Vec qkv = Random(B * T * 3 * C, rng), r = Random(B * T * C, rng);
  Vec out(B * T * C), att(B * NH * T * T);
  AttentionForward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int bh = 0; bh < B * NH; ++bh) {
    for (int t = 0; t < T; ++t) {
      double s = 0;
      for (int u = 0; u < T; ++u) {
        const float a = att[(bh * T + t) * T + u];
        if (u > t) REQUIRE(a == 0.0f);
        s += a;
      }
      REQUIRE(s == Approx(1.0).epsilon(1e-5));
    }
  }
  // The first position attends only to itself: its output is its own v.
  for (int h = 0; h < NH; ++h) {
    for (int i = 0; i < C / NH; ++i) {
      CHECK(out[h * (C / NH) + i] == Approx(qkv[2 * C + h * (C / NH) + i]));
    }
  }
  auto loss = [&] {
    Vec o(B * T * C), a(B * NH * T * T);
    AttentionForward(o.data(), a.data(), qkv.data(), B, T, C, NH);
    return Dot(o, r);
  };
  Vec dqkv(qkv.size(), 123.0f);
  AttentionBackward(dqkv.data(), r.data(), qkv.data(), att.data(), B, T, C, NH);
  CheckGradient("dqkv", qkv, dqkv, loss);
}

TEST_CASE("blocked causal attention: several blocks, the same bits on 1 and 2 threads") {
  std::mt19937 rng(7);
  const int B = 2, T = 150, C = 16, NH = 2;  // blocks of 64 rows: 64, 64, 22
  Vec qkv = Random(B * T * 3 * C, rng), r = Random(B * T * C, rng);
  auto run = [&](int threads, Vec& out, Vec& att, Vec& dqkv) {
    SetComputeThreads(threads);
    out.assign(B * T * C, 0.0f);
    att.assign(B * NH * T * T, 7.0f);  // must be overwritten, zeros included
    dqkv.assign(qkv.size(), 123.0f);
    AttentionForward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    AttentionBackward(dqkv.data(), r.data(), qkv.data(), att.data(), B, T, C, NH);
  };
  Vec out1, att1, dqkv1, out2, att2, dqkv2;
  run(2, out2, att2, dqkv2);
  run(1, out1, att1, dqkv1);
  CHECK(out1 == out2);
  CHECK(att1 == att2);
  CHECK(dqkv1 == dqkv2);
  // The last row of the last head: naive softmax(q k^T) v in double.
  const int hs = C / NH, b = 1, h = 1, t = T - 1;
  const float* q = qkv.data() + (b * T + t) * 3 * C + h * hs;
  std::vector<double> w(T);
  double maxv = -1e300, sum = 0;
  for (int u = 0; u < T; ++u) {
    const float* k = qkv.data() + (b * T + u) * 3 * C + C + h * hs;
    double dot = 0;
    for (int i = 0; i < hs; ++i) dot += static_cast<double>(q[i]) * k[i];
    w[u] = dot / std::sqrt(static_cast<double>(hs));
    maxv = std::max(maxv, w[u]);
  }
  for (double& x : w) sum += (x = std::exp(x - maxv));
  for (int i = 0; i < hs; ++i) {
    double o = 0;
    for (int u = 0; u < T; ++u) o += w[u] / sum * qkv[(b * T + u) * 3 * C + 2 * C + h * hs + i];
    CHECK(out1[(b * T + t) * C + h * hs + i] == Approx(o).epsilon(1e-4));
  }
  auto loss = [&] {
    Vec o(B * T * C), a(B * NH * T * T);
    AttentionForward(o.data(), a.data(), qkv.data(), B, T, C, NH);
    return Dot(o, r);
  };
  CheckGradient("dqkv", qkv, dqkv1, loss, 2e-2, 61);
}

TEST_CASE("gelu, residual and encoder: values and gradients") {
  std::mt19937 rng(4);
  Vec x = Random(50, rng, 2.0f), r = Random(50, rng);
  Vec out(50);
  GeluForward(out.data(), x.data(), 50);
  for (int i = 0; i < 50; ++i) {  // close to the exact erf GELU
    CHECK(out[i] == Approx(0.5 * x[i] * (1 + std::erf(x[i] / std::sqrt(2.0)))).margin(2e-3));
  }
  auto gelu_loss = [&] {
    Vec o(50);
    GeluForward(o.data(), x.data(), 50);
    return Dot(o, r);
  };
  Vec dx(50, 123.0f);
  GeluBackward(dx.data(), x.data(), r.data(), 50);
  CheckGradient("gelu", x, dx, gelu_loss);

  Vec a = Random(10, rng), b = Random(10, rng), sum(10);
  ResidualForward(sum.data(), a.data(), b.data(), 10);
  for (int i = 0; i < 10; ++i) CHECK(sum[i] == a[i] + b[i]);

  const int B = 2, T = 3, C = 4, V = 5;
  const std::vector<int32_t> tokens = {1, 4, 1, 0, 2, 4};
  Vec wte = Random(V * C, rng), wpe = Random(T * C, rng), ro = Random(B * T * C, rng);
  auto enc_loss = [&] {
    Vec o(B * T * C);
    EncoderForward(o.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return Dot(o, ro);
  };
  Vec dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
  EncoderBackward(dwte.data(), dwpe.data(), ro.data(), tokens.data(), B, T, C);
  CheckGradient("dwte", wte, dwte, enc_loss, 1e-3);
  CheckGradient("dwpe", wpe, dwpe, enc_loss, 1e-3);
  for (int c = 0; c < C; ++c) CHECK(dwte[3 * C + c] == 0.0f);  // token 3 never appears
}

TEST_CASE("softmax cross-entropy: the loss of uniform logits is log V, exact gradients") {
  std::mt19937 rng(5);
  const int N = 3, V = 7;
  const std::vector<int32_t> targets = {0, 6, 3};
  Vec zeros(N * V, 0.0f), probs(N * V);
  CHECK(SoftmaxCrossEntropyForward(probs.data(), zeros.data(), targets.data(), N, V) ==
        Approx(std::log(7.0)));
  // Huge logits do not overflow: the loss stays finite and exact.
  Vec big(N * V, 0.0f);
  big[0] = 1000.0f;      // row 0, target 0: loss ~0
  big[V + 0] = 1000.0f;  // row 1, target 6: loss ~1000
  const float l = SoftmaxCrossEntropyForward(probs.data(), big.data(), targets.data(), N, V);
  CHECK(l == Approx((0.0 + 1000.0 + std::log(7.0)) / 3).epsilon(1e-4));

  Vec logits = Random(N * V, rng, 2.0f);
  auto loss = [&] {
    Vec p(N * V);
    return static_cast<double>(
        SoftmaxCrossEntropyForward(p.data(), logits.data(), targets.data(), N, V));
  };
  SoftmaxCrossEntropyForward(probs.data(), logits.data(), targets.data(), N, V);
  Vec dlogits(N * V, 123.0f);
  SoftmaxCrossEntropyBackward(dlogits.data(), probs.data(), targets.data(), 1.0f, N, V);
  CheckGradient("dlogits", logits, dlogits, loss);
  // In place over the probabilities (as the model does it): the same values.
  SoftmaxCrossEntropyBackward(probs.data(), probs.data(), targets.data(), 1.0f, N, V);
  for (size_t i = 0; i < probs.size(); ++i) CHECK(probs[i] == dlogits[i]);
}

TEST_CASE("row reductions in lanes: layer norm and softmax at widths around the lane count") {
  // The kernels sum and take maxima in 16 lanes with a tail: widths below,
  // at and past multiples of 16 against double-precision references, the
  // row maximum anywhere in the row (the lanes' and the tail's).
  std::mt19937 rng(11);
  for (int C : {1, 7, 15, 16, 17, 31, 32, 33, 100, 257}) {
    CAPTURE(C);
    const int N = 3;
    Vec x = Random(N * C, rng, 3.0f), w = Random(C, rng), b = Random(C, rng);
    for (float& v : x) v += 5.0f;  // an offset the mean must remove
    Vec out(N * C), mean(N), rstd(N);
    LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    for (int n = 0; n < N; ++n) {
      double m = 0, v = 0;
      for (int c = 0; c < C; ++c) m += x[n * C + c];
      m /= C;
      for (int c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
      v /= C;
      CHECK(mean[n] == Approx(m).epsilon(1e-6));
      CHECK(rstd[n] == Approx(1.0 / std::sqrt(v + 1e-5)).epsilon(1e-5));
    }
    // Backward against the same formula in double, on 1 and 2 threads
    // (the same bits: each row's sums are the row's own).
    Vec d = Random(N * C, rng);
    Vec dx1, dw1, db1;
    for (int threads : {1, 2}) {
      SetComputeThreads(threads);
      Vec dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
      LayerNormBackward(dx.data(), dw.data(), db.data(), d.data(), x.data(), w.data(), mean.data(),
                        rstd.data(), N, C);
      if (threads == 1) {
        dx1 = dx, dw1 = dw, db1 = db;
      } else {
        CHECK((dx == dx1 && dw == dw1 && db == db1));
      }
    }
    SetComputeThreads(1);
    for (int n = 0; n < N; ++n) {
      double a = 0, bsum = 0;  // mean(dnorm), mean(dnorm * norm)
      for (int c = 0; c < C; ++c) {
        const double norm = (x[n * C + c] - double{mean[n]}) * rstd[n];
        a += double{w[c]} * d[n * C + c];
        bsum += double{w[c]} * d[n * C + c] * norm;
      }
      a /= C;
      bsum /= C;
      for (int c = 0; c < C; ++c) {
        const double norm = (x[n * C + c] - double{mean[n]}) * rstd[n];
        const double want = (double{w[c]} * d[n * C + c] - a - norm * bsum) * rstd[n];
        CHECK(dx1[n * C + c] == Approx(want).epsilon(1e-4).margin(1e-5));
      }
    }
    Vec logits = Random(N * C, rng, 4.0f);
    // The largest last (in the tail) or mid-row, far enough above the rest that
    // a shift by anything but the true maximum overflows exp.
    logits[1 * C + (C - 1)] = 120.0f;
    logits[2 * C + C / 2] = 120.0f;
    std::vector<int32_t> targets = {0, C - 1, C / 2};
    Vec probs(N * C);
    const float loss =
        SoftmaxCrossEntropyForward(probs.data(), logits.data(), targets.data(), N, C);
    double want = 0;
    for (int n = 0; n < N; ++n) {
      double mx = -1e30, sum = 0;
      for (int v = 0; v < C; ++v) mx = std::max(mx, static_cast<double>(logits[n * C + v]));
      for (int v = 0; v < C; ++v) sum += std::exp(logits[n * C + v] - mx);
      want += std::log(sum) + mx - logits[n * C + targets[n]];
      double total = 0;
      for (int v = 0; v < C; ++v) total += probs[n * C + v];
      CHECK(total == Approx(1.0).epsilon(1e-5));
    }
    CHECK(loss == Approx(want / N).epsilon(1e-5).margin(1e-6));
  }
}

TEST_CASE("AdamW (vectorized) gives a plain scalar loop's bits, on 1 and 2 threads") {
  // The update of torch.optim.AdamW's single-tensor path written out
  // element by element, the constants computed as AdamWUpdate does.
  auto reference = [](Vec& p, const Vec& g, Vec& m, Vec& v, int64_t step, const AdamWConfig& c,
                      bool decay) {
    const double bc1 = 1.0 - std::pow(static_cast<double>(c.beta1), static_cast<double>(step));
    const double bc2 = 1.0 - std::pow(static_cast<double>(c.beta2), static_cast<double>(step));
    const float neg_step_size = static_cast<float>(-(c.lr / bc1));
    const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    const float keep =
        decay ? static_cast<float>(1.0 - static_cast<double>(c.lr) * c.weight_decay) : 1.0f;
    const float b1 = static_cast<float>(1.0 - c.beta1), b2 = static_cast<float>(1.0 - c.beta2);
    for (size_t i = 0; i < p.size(); ++i) {
      volatile float mi = m[i] * c.beta1;  // volatile: no contraction, no vectors
      mi = mi + g[i] * b1;
      volatile float vi = v[i] * c.beta2;
      vi = vi + b2 * g[i] * g[i];
      m[i] = mi;
      v[i] = vi;
      volatile float denom = std::sqrt(static_cast<float>(vi)) / bc2_sqrt;
      denom = denom + c.eps;
      volatile float upd = neg_step_size * m[i];
      upd = upd / denom;
      volatile float kept = p[i] * keep;
      p[i] = kept + upd;
    }
  };
  std::mt19937 rng(7);
  AdamWConfig c;
  c.lr = 3e-3f;
  c.weight_decay = 0.1f;
  // Lengths around the vector widths and past one chunk of the pool.
  for (int64_t n : {1, 7, 16, 17, 33, 100, 40000, 70001}) {
    for (int threads : {1, 2}) {
      SetComputeThreads(threads);
      Vec p = Random(n, rng), m = Random(n, rng, 0.1f), v = Random(n, rng, 0.01f);
      for (float& x : v) x = std::fabs(x);
      Vec p2 = p, m2 = m, v2 = v;
      for (int64_t step = 1; step <= 3; ++step) {
        const Vec g = Random(n, rng);
        const bool decay = step != 2;
        AdamWUpdate(p.data(), g.data(), m.data(), v.data(), n, step, c, decay);
        reference(p2, g, m2, v2, step, c, decay);
      }
      INFO("n " << n << ", " << threads << " thread(s)");
      CHECK(std::memcmp(p.data(), p2.data(), n * sizeof(float)) == 0);
      CHECK(std::memcmp(m.data(), m2.data(), n * sizeof(float)) == 0);
      CHECK(std::memcmp(v.data(), v2.data(), n * sizeof(float)) == 0);
    }
  }
  SetComputeThreads(1);
}

}  // namespace
}  // namespace tessera::kernels
