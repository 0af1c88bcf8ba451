// Calibration of the runtime's kernels for the cost model (gpt_search.h).

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/timer.h"
#include "runtime/kernels.h"
#include "runtime/model/gpt_search.h"
#include "runtime/train/optim.h"

namespace tessera {
namespace {

// The median of `runs` timings of fn(), after one that warms it up.
template <typename F>
double Median(int runs, F&& fn) {
  return MedianSeconds(runs, fn, /*warm_up=*/true);
}

// Seconds per score and per flop of products minimizing the relative
// squared error of a * scores + b * products against the times, neither
// negative.
std::pair<double, double> FitTwo(const std::vector<double>& scores,
                                 const std::vector<double>& products,
                                 const std::vector<double>& seconds) {
  double ss = 0, sp = 0, pp = 0, st = 0, pt = 0;
  for (size_t i = 0; i < seconds.size(); ++i) {
    const double s = scores[i] / seconds[i],
                 p = products[i] / seconds[i];  // each row over its time
    ss += s * s, sp += s * p, pp += p * p, st += s, pt += p;
  }
  const double det = ss * pp - sp * sp;
  double a = det > 0 ? (st * pp - pt * sp) / det : 0;
  double b = det > 0 ? (pt * ss - st * sp) / det : 0;
  if (a <= 0) a = 0, b = pt / pp;
  if (b <= 0) b = 0, a = st / ss;
  return {a, b};
}

}  // namespace

void MeasureKernels(MachineProfile* profile) {
  auto set = [&](Kernel k, double seconds, double units) {
    profile->kernel_seconds[static_cast<int>(k)] = seconds / units;
  };
  constexpr int kRuns = 7;
  // Element-wise kernels over 512 Ki floats (2 MiB an array): activations
  // of a small GPT's micro-batch, beyond a core's private caches.
  {
    const int N = 2048, C = 256;
    const int64_t n = int64_t{N} * C;
    std::vector<float> x(n, 0.5f), y(n), dy(n, 0.01f), dx(n), w(C, 1.0f), b(C, 0.0f), dw(C), db(C),
        mean(N), rstd(N);
    set(Kernel::kLayerNormForward,
        Median(kRuns,
               [&] {
                 kernels::LayerNormForward(y.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                           b.data(), N, C);
               }),
        static_cast<double>(n));
    set(Kernel::kLayerNormBackward,
        Median(kRuns,
               [&] {
                 kernels::LayerNormBackward(dx.data(), dw.data(), db.data(), dy.data(), x.data(),
                                            w.data(), mean.data(), rstd.data(), N, C);
               }),
        static_cast<double>(n));
    set(Kernel::kGeluForward, Median(kRuns, [&] { kernels::GeluForward(y.data(), x.data(), n); }),
        static_cast<double>(n));
    set(Kernel::kGeluBackward,
        Median(kRuns, [&] { kernels::GeluBackward(dx.data(), x.data(), dy.data(), n); }),
        static_cast<double>(n));
    set(Kernel::kResidualAdd,
        Median(kRuns, [&] { kernels::ResidualForward(y.data(), x.data(), dy.data(), n); }),
        static_cast<double>(n));
    // The embedding: 8 sequences of 256 tokens, C 256, a vocabulary of 1024.
    const int B = 8, T = 256, V = 1024;
    std::vector<int32_t> tokens(B * T);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i * 7919 % V);
    std::vector<float> wte(int64_t{V} * C, 0.1f), wpe(int64_t{T} * C, 0.1f), dwte(wte.size()),
        dwpe(wpe.size());
    set(Kernel::kEmbeddingForward,
        Median(kRuns,
               [&] {
                 kernels::EncoderForward(y.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
               }),
        static_cast<double>(n));
    set(Kernel::kEmbeddingBackward,
        Median(kRuns,
               [&] {
                 kernels::EncoderBackward(dwte.data(), dwpe.data(), dy.data(), tokens.data(), B, T,
                                          C);
               }),
        static_cast<double>(n));
    // The loss over 1024 rows of 512 logits.
    const int R = 1024, L = 512;
    std::vector<float> logits(int64_t{R} * L, 0.1f), probs(logits.size());
    std::vector<int32_t> targets(R);
    for (int i = 0; i < R; ++i) targets[i] = i * 31 % L;
    set(Kernel::kCrossEntropyForward,
        Median(kRuns,
               [&] {
                 kernels::SoftmaxCrossEntropyForward(probs.data(), logits.data(), targets.data(), R,
                                                     L);
               }),
        static_cast<double>(logits.size()));
    set(Kernel::kCrossEntropyBackward,
        Median(kRuns,
               [&] {
                 kernels::SoftmaxCrossEntropyBackward(probs.data(), probs.data(), targets.data(),
                                                      1.0f, R, L);
               }),
        static_cast<double>(logits.size()));
  }
  // The attention core of 512 tokens (sequences of 128 and 256), 4 heads
  // of 32 and 128: its cost per score computed (the softmax, the causal
  // blocks' bookkeeping) and per flop of its products.
  {
    const int NH = 4;
    std::vector<double> scores, fw_products, bw_products, fw, bw;
    for (auto [T, hs] : {std::pair{128, 32}, {128, 128}, {256, 32}, {256, 128}}) {
      const int B = 512 / T, C = NH * hs;
      std::vector<float> qkv(int64_t{B} * T * 3 * C, 0.01f), out(int64_t{B} * T * C),
          att(int64_t{B} * NH * T * T), dout(out.size(), 0.01f), dqkv(qkv.size());
      const double s = static_cast<double>(B) * NH * kernels::AttentionScores(T);
      scores.push_back(s);
      fw_products.push_back(2.0 * s * hs);
      bw_products.push_back(4.0 * s * hs);
      fw.push_back(Median(kRuns, [&] {
        kernels::AttentionForward(out.data(), att.data(), qkv.data(), B, T, C, NH);
      }));
      bw.push_back(Median(kRuns, [&] {
        kernels::AttentionBackward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
      }));
    }
    auto [fa, fb] = FitTwo(scores, fw_products, fw);
    auto [ba, bb] = FitTwo(scores, bw_products, bw);
    // Each unit a positive figure (a profile refuses 0): a term the fit
    // drops costs a tenth of a percent of the kernel.
    auto floor = [](double x, double at) { return std::max(x, at * 1e-3); };
    profile->kernel_seconds[static_cast<int>(Kernel::kAttentionForwardScores)] =
        floor(fa, fw[0] / scores[0]);
    profile->kernel_seconds[static_cast<int>(Kernel::kAttentionForwardProducts)] =
        floor(fb, fw[0] / fw_products[0]);
    profile->kernel_seconds[static_cast<int>(Kernel::kAttentionBackwardScores)] =
        floor(ba, bw[0] / scores[0]);
    profile->kernel_seconds[static_cast<int>(Kernel::kAttentionBackwardProducts)] =
        floor(bb, bw[0] / bw_products[0]);
  }
  // The update and the clipping norm over 1 Mi parameters.
  {
    const int64_t n = int64_t{1} << 20;
    std::vector<float> p(n, 0.1f), g(n, 0.01f), m(n), v(n);
    AdamWConfig config;
    int64_t step = 0;
    set(Kernel::kAdamW,
        Median(
            kRuns,
            [&] { AdamWUpdate(p.data(), g.data(), m.data(), v.data(), n, ++step, config, true); }),
        static_cast<double>(n));
    double sink = 0;
    set(Kernel::kSquaredNorm, Median(kRuns, [&] { sink += SquaredNorm(g.data(), n); }),
        static_cast<double>(n));
    asm volatile("" : : "r"(&sink) : "memory");
  }
}

Result<MachineProfile> CalibrateMachine(Communicator& world) {
  ASSIGN_OR_RETURN(MachineProfile profile, Calibrate(world));
  RETURN_IF_ERROR(world.Barrier());
  if (world.rank() == 0) MeasureKernels(&profile);
  RETURN_IF_ERROR(world.Broadcast(profile.kernel_seconds, kKernelCount, DType::kF64, 0));
  return profile;
}

}  // namespace tessera
