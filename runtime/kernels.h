// CPU kernels of a GPT-2 style transformer, each with an explicit forward
// and backward (llm.c style): plain functions over contiguous f32 buffers,
// the shape of every buffer in a comment. Backward functions WRITE the
// gradient of their input activation (=: nothing needs zeroing between
// steps) and ACCUMULATE into parameter gradients (+=, so a step zeroes them
// once and layers sharing a weight, the tied embedding, simply add up).
// LayerNormBackward is the exception: its input gradient also accumulates,
// because in a pre-LayerNorm transformer that input is the residual stream,
// whose gradient is the sum of the branch and the skip connection.
//
// Matrices follow GPT-2's Conv1D layout: a linear layer's weight is
// [in, out] and y = x @ W + b, so Hugging Face GPT-2 tensors map directly.
// Matrix products go to the GEMM library runtime/matmul.h names (OpenBLAS
// unless a machine profile or the caller chose another).
#ifndef TESSERA_RUNTIME_KERNELS_H_
#define TESSERA_RUNTIME_KERNELS_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <string>

namespace tessera {

// The kernels below and the optimizer's (runtime/train/optim.h), each by
// the unit the cost model prices it in (runtime/cost/machine_profile.h:
// MachineProfile::KernelSeconds).
enum class Kernel {
  kLayerNormForward,           // per element of its input
  kLayerNormBackward,          // per element
  kGeluForward,                // per element
  kGeluBackward,               // per element
  kResidualAdd,                // per element of the sum
  kEmbeddingForward,           // per element of its output [rows, C]
  kEmbeddingBackward,          // per element of its output gradient
  kCrossEntropyForward,        // per logit (softmax and loss)
  kCrossEntropyBackward,       // per logit
  kAttentionForwardScores,     // per score computed (kernels::AttentionScores a head and sequence)
  kAttentionForwardProducts,   // per flop of its products (2 x head size a score)
  kAttentionBackwardScores,    // per score
  kAttentionBackwardProducts,  // per flop (twice the forward's)
  kAdamW,                      // per parameter updated
  kSquaredNorm,                // per gradient float of the clipping norm
  kCount
};
inline constexpr int kKernelCount = static_cast<int>(Kernel::kCount);

}  // namespace tessera

namespace tessera::kernels {

// A per-thread tally of the units each kernel below processed, kept while
// counting is on for the calling thread: what ties the cost model's counts
// to the calls the runtime makes (tests/runtime/model/gpt_search_test.cc). The
// vocabulary-parallel loss counts its logits once, in ShardedExp; the
// optimizer's kernels (runtime/train/optim.h) tally through AddUnits.
// CountUnits(true) zeroes the tally and starts it, CountUnits(false) stops
// it; off, a kernel pays one test of a thread-local flag.
void CountUnits(bool on);
bool CountingUnits();  // the calling thread's
std::array<double, kKernelCount> CountedUnits();
void AddUnits(Kernel kernel, double units);

// The threads the kernels use: the matrix products' library's
// (runtime/matmul.h) and a pool for the element-wise kernels (<= 0: all
// cores). Results do not depend on the count except through the library's
// own blocking (matmul.h says where). Call it at start-up, never while
// kernels run.
void SetComputeThreads(int threads);

// OpenBLAS 0.3.21 predates AMD Zen 4/5 and runs its Haswell (AVX2)
// kernels there although the CPU has AVX-512; its SkylakeX kernels measured
// 1.8x faster sgemm on the development machine (Zen 5). The core type is
// read from OPENBLAS_CORETYPE when the library loads, so a program can only
// switch by restarting itself: this returns the core to set ("SkylakeX"),
// or "" when OpenBLAS already uses the best it has or the user chose one.
std::string BetterBlasCore();
std::string BlasCoreName();
// A warning when OPENBLAS_CORETYPE forces AVX2 kernels on an AVX-512 CPU
// (measured 1.8x slower sgemm there), else "".
std::string BlasCoreAdvice();

// Runs fn(begin, end) over [0, n) in chunks of `grain` on the compute pool.
// Chunk boundaries depend on n and grain only, never on the thread count.
void ParallelChunks(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
// out: [B,T,C], inp: [B,T], wte: [V,C], wpe: [maxT,C]
//
// Vocabulary-parallel (tensor parallelism): wte holds rows [v0, v0 + V) of
// the embedding only (V >= 0 given); a token outside them contributes 0,
// and wpe may be null (added by one rank only), so the sum of every rank's
// output is the whole embedding, bit for bit (one of the terms is nonzero).
void EncoderForward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                    int T, int C, int64_t v0 = 0, int64_t V = -1);
// dwte: [V,C] (+=), dwpe: [maxT,C] (+=, may be null), dout: [B,T,C]; a
// token outside [v0, v0 + V) adds nothing to dwte.
void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T,
                     int C, int64_t v0 = 0, int64_t V = -1);

// out = (inp - mean) * rstd * weight + bias over the last dimension, eps 1e-5.
// out, inp: [N,C]; mean, rstd: [N] (saved for backward); weight, bias: [C]
void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C);
// dinp: [N,C] (+=), dweight, dbias: [C] (+=)
void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int N, int C);

// out[N,OC] = inp[N,C] @ weight[C,OC] + bias[OC] (bias may be null)
void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                   int C, int OC);
// dinp[N,C] = dout @ weight^T; dweight[C,OC] += inp^T @ dout; dbias[OC] += sum over N
// (dinp or dbias may be null)
void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int N, int C, int OC);

// The tied output projection: out[N,OC] = inp[N,C] @ weight[OC,C]^T (the
// token embedding used as the output layer).
void MatmulTransposedForward(float* out, const float* inp, const float* weight, int N, int C,
                             int OC);
// dinp[N,C] = dout @ weight; dweight[OC,C] += dout^T @ inp
void MatmulTransposedBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                              const float* weight, int N, int C, int OC);

// Causal multi-head self-attention. qkv: [B,T,3C] (q, k, v side by side),
// out: [B,T,C], att: [B,NH,T,T] softmax weights (saved for backward; entries
// above the diagonal are 0). Scale 1/sqrt(C/NH). The products skip the
// masked triangle in blocks of 64 query rows, and heads run side by side on
// the compute pool (each with single-threaded OpenBLAS).
void AttentionForward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
// The scores the causal products compute for one head of one sequence of
// T tokens (blocks of 64 query rows skip the keys after the block):
// T x T up to 64 tokens, T (T + 64) / 2 for multiples of 64. The cost
// model's unit for the attention core. Inline: the cost model counts with
// it without linking the kernels.
inline constexpr int kAttentionBlock = 64;
inline int64_t AttentionScores(int T) {
  int64_t n = 0;
  for (int i0 = 0; i0 < T; i0 += kAttentionBlock) {
    const int64_t i1 = std::min(T, i0 + kAttentionBlock);
    n += (i1 - i0) * i1;
  }
  return n;
}
// dqkv: [B,T,3C] (=)
void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                       int T, int C, int NH);

// Blockwise attention with an online softmax: ring attention's step
// (Liu et al.; FlashAttention's recurrence). Rows of B sequences are
// views: row i of sequence b at data + (b * seq + i) * ld; head h's
// columns start at h * hs. Per (sequence, head, query row) statistics
// (m, l, lse, D) are [B, NH, ld] arrays, element (b, h, i) at
// p[(b * NH + h) * ld + i]: ld is Tq where no `ld` is given, and a block of
// a longer sequence's rows passes its first row's statistics and the
// sequence's ld.
template <typename T>
struct SeqRows {
  T* data = nullptr;
  int64_t ld = 0, seq = 0;
  T* at(int64_t b, int64_t i) const { return data + (b * seq + i) * ld; }
  SeqRows<T> Offset(int64_t rows, int64_t cols = 0) const {
    return {data + rows * ld + cols, ld, seq};
  }
};
// Every sequence's Tq query rows q against Tk key and value rows k, v
// (`causal`: key j is seen by query i only when j <= i, a block on the
// diagonal of the same positions): updates the running row maxima m (start
// at -inf), sums l (start at 0) and the unnormalized output o (start at 0).
void AttentionBlockForward(SeqRows<float> o, float* m, float* l, int64_t ld, SeqRows<const float> q,
                           SeqRows<const float> k, SeqRows<const float> v, int B, int Tq, int Tk,
                           int hs, int NH, bool causal);
// After the last block: o /= l, and lse = m + log(l) for backward.
void AttentionBlockFinish(SeqRows<float> o, const float* m, const float* l, float* lse, int B,
                          int Tq, int hs, int NH);
// D = rowsum(dout * out) per head: backward's correction term.
void AttentionBlockDelta(float* D, SeqRows<const float> dout, SeqRows<const float> out, int B,
                         int Tq, int hs, int NH);
// One block's backward from the forward's lse and D: dq, dk, dv accumulate
// (+=) the block's contributions.
void AttentionBlockBackward(SeqRows<float> dq, SeqRows<float> dk, SeqRows<float> dv,
                            SeqRows<const float> dout, SeqRows<const float> q,
                            SeqRows<const float> k, SeqRows<const float> v, const float* lse,
                            const float* D, int64_t ld, int B, int Tq, int Tk, int hs, int NH,
                            bool causal);

// GELU, tanh approximation (GPT-2's). out, inp: [N]
void GeluForward(float* out, const float* inp, int64_t N);
// dinp[N] = gelu'(inp) * dout
void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t N);

// out = a + b. [N] Its backward is no kernel: both inputs' gradient is
// dout, which the model passes on without copying.
void ResidualForward(float* out, const float* a, const float* b, int64_t N);

// Softmax over V of logits [N,V] into probs [N,V], and the mean over N of
// -log probs[n, targets[n]]. Returns that mean loss.
float SoftmaxCrossEntropyForward(float* probs, const float* logits, const int32_t* targets, int N,
                                 int V);
// dlogits[N,V] = (probs - onehot(targets)) * dloss / N; dlogits may be probs.
// Under a vocabulary split, probs and dlogits hold columns [v0, v0 + V).
void SoftmaxCrossEntropyBackward(float* dlogits, const float* probs, const int32_t* targets,
                                 float dloss, int N, int V, int64_t v0 = 0);

// The cross-entropy of logits split over ranks by vocabulary (Megatron's
// vocab-parallel loss) in three steps with a reduction between each:
//   1. RowMax: each rank's row maxima of its columns -> all-reduce (max);
//   2. ShardedExp: probs = exp(logits - max) and, per row, the sum of them
//      (sums[n]) and the target's logit where this rank holds the target
//      column (sums[N + n], else 0) -> all-reduce (sum) of sums [2N];
//   3. ShardedNormalize: probs /= sum; returns the mean loss over N,
//      mean(log(sum) + max - target logit), the same on every rank.
// logits, probs: [N,V] (columns [v0, v0 + V)); max: [N]; sums: [2N].
void RowMax(float* max, const float* logits, int N, int V);
void ShardedExp(float* probs, double* sums, const float* logits, const float* max,
                const int32_t* targets, int N, int V, int64_t v0);
float ShardedNormalize(float* probs, const double* sums, const float* max, int N, int V);

}  // namespace tessera::kernels

#endif  // TESSERA_RUNTIME_KERNELS_H_
