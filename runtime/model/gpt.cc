#include "runtime/model/gpt.h"

#include <algorithm>
#include <cmath>

#include "core/checksum.h"
#include "core/random.h"
#include "core/strings.h"
#include "core/trace.h"
#include "runtime/kernels.h"
#include "transform/layout.h"

namespace tessera {

namespace k = kernels;

namespace {

// splitmix64 and Box-Muller: the same numbers on every platform and library.
struct Normal {
  uint64_t state;
  double Uniform() {
    const uint64_t z = SplitMix64(state);
    return (static_cast<double>(z >> 11) + 0.5) * (1.0 / 9007199254740992.0);  // (0, 1)
  }
  double Next() {
    const double u1 = Uniform(), u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

}  // namespace

void Gpt::Init(uint64_t seed) {
  InitParams(seed, -1);
  std::fill(m_.begin(), m_.end(), 0.0f);
  std::fill(v_.begin(), v_.end(), 0.0f);
  step_ = 0;
}

void Gpt::InitUnit(uint64_t seed, int unit) { InitParams(seed, unit); }

void Gpt::InitialValues(const GptConfig& config, uint64_t seed, const ParamInfo& p, int64_t begin,
                        std::span<float> out) {
  if (p.full_shape.size() < 2) {
    const bool gain = EndsWith(p.name, "ln_1.weight") || EndsWith(p.name, "ln_2.weight") ||
                      p.name == "ln_f.weight";
    std::fill(out.begin(), out.end(), gain ? 1.0f : 0.0f);
    return;
  }
  double std = 0.02;
  if (p.name == "wpe") std = 0.01;
  if (EndsWith(p.name, "c_proj.weight")) std = 0.02 / std::sqrt(2.0 * config.layers);
  Normal rng{seed ^ Xxh3(p.name.data(), p.name.size())};  // XXH3: stable everywhere
  for (int64_t i = 0; i < begin; ++i) rng.Next();         // the stream is sequential
  for (float& x : out) x = static_cast<float>(rng.Next() * std);
}

void Gpt::InitParams(uint64_t seed, int unit) {
  std::vector<float> whole;
  for (const ParamInfo& p : params_) {
    if (unit >= 0 && p.unit != unit) continue;
    if (stage_.served_embedding && p.name == "wte") continue;  // the servers hold it
    float* w = P(p.offset);
    // The whole tensor's numbers, of which this rank keeps its box.
    const int64_t n =
        p.full_shape.size() >= 2 ? NumElements(Box::FromShape(p.full_shape)) : p.numel;
    float* out = p.numel == n ? w : (whole.resize(n), whole.data());
    InitialValues(config_, seed, p, 0, {out, static_cast<size_t>(n)});
    if (out != w) {
      const std::vector<int64_t> extents = p.box.extents();
      CopyBox(out, p.split_shape(), p.box, w, extents, Box::FromShape(extents), sizeof(float));
    }
  }
}

Result<float> Gpt::Forward(const int32_t* tokens, const int32_t* targets, int B, int T) {
  if (!stage_.first || !stage_.last) {
    return FailedPreconditionError("GPT forward: this model is one pipeline stage (ForwardStage)");
  }
  return ForwardStage(0, tokens, nullptr, targets, B, T);
}

Status Gpt::Backward() {
  if (!stage_.first || !stage_.last) {
    return FailedPreconditionError(
        "GPT backward: this model is one pipeline stage (BackwardStage)");
  }
  return BackwardStage(0, nullptr, 1.0f);
}

void Gpt::SetSlots(int n) { slots_.resize(std::max(1, n)); }

const float* Gpt::StageOutput(int slot) const {
  const Activations& a = slots_[slot];
  const int64_t nc = static_cast<int64_t>(a.B) * a.T * config_.embed;
  const int nl = static_cast<int>(layers_.size());
  return nl == 0 ? a.encoded.data() : a.residual3.data() + (nl - 1) * nc;
}

Status CheckStageBatch(const GptConfig& config, const GptStage& stage, int slot, int slots,
                       const int32_t* tokens, const int32_t* targets, int B, int T) {
  if (slot < 0 || slot >= slots) {
    return InvalidArgumentError("GPT forward: slot " + std::to_string(slot) + " of " +
                                std::to_string(slots));
  }
  if (B < 1 || T < 1 || T > config.context) {
    return InvalidArgumentError("GPT forward: batch " + std::to_string(B) + " x sequence " +
                                std::to_string(T) + " (context is " +
                                std::to_string(config.context) + ")");
  }
  const int64_t N = static_cast<int64_t>(B) * T;
  const bool check_tokens = stage.first, check_targets = stage.last && targets != nullptr;
  for (int64_t i = 0; i < N; ++i) {
    if ((check_tokens && (tokens[i] < 0 || tokens[i] >= config.vocab)) ||
        (check_targets && (targets[i] < 0 || targets[i] >= config.vocab))) {
      return InvalidArgumentError("GPT forward: token at position " + std::to_string(i) +
                                  " is outside the vocabulary of " + std::to_string(config.vocab));
    }
  }
  return Status::Ok();
}

// A block's name on traces: "h.<global layer>".
std::string Gpt::LayerName(size_t local) const {
  return Trace::Current() == nullptr ? std::string()
                                     : "h." + std::to_string(stage_.first_layer + local);
}

Result<float> Gpt::ForwardStage(int slot, const int32_t* tokens, const float* x,
                                const int32_t* targets, int B, int T) {
  RETURN_IF_ERROR(CheckStageBatch(config_, stage_, slot, slots(), tokens, targets, B, T));
  const int64_t N = static_cast<int64_t>(B) * T;
  Activations& a = slots_[slot];
  if (a.B != B || a.T != T) Resize(a, B, T);
  if (stage_.first) a.tokens.assign(tokens, tokens + N);
  a.has_targets = stage_.last && targets != nullptr;
  if (a.has_targets) a.targets.assign(targets, targets + N);

  const int C = config_.embed, CL = C, NHL = config_.heads, FL = 4 * C, VL = config_.vocab;
  const int n = static_cast<int>(N);
  if (stage_.tp > 1 || stage_.chunks.size() > 1) {
    return FailedPreconditionError(
        "GPT forward: a tensor-parallel slice or a stage of several chunks runs through its "
        "operators (OpGpt)");
  }
  if (stage_.first) {
    RETURN_IF_ERROR(NeedWeights(0));
    TraceSpan span("forward", "wte+wpe");
    k::EncoderForward(a.encoded.data(), tokens, P(wte_), P(wpe_), B, T, C);  // [N,C]
  } else {
    std::copy(x, x + N * C, a.encoded.begin());  // the previous stage's output
  }
  const float* residual = a.encoded.data();
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& w = layers_[l];
    const int64_t nc = N * C;
    float* ln1 = a.ln1.data() + l * nc;                                     // [N,C]
    float* ln1_mean = a.ln1_mean.data() + l * N;                            // [N]
    float* ln1_rstd = a.ln1_rstd.data() + l * N;                            // [N]
    float* qkv = a.qkv.data() + l * 3 * N * CL;                             // [N,3CL]
    float* att = a.att.data() + static_cast<int64_t>(l) * B * NHL * T * T;  // [B,NHL,T,T]
    float* atty = a.atty.data() + l * N * CL;                               // [N,CL]
    float* attproj = a.attproj.data() + l * nc;                             // [N,C]
    float* residual2 = a.residual2.data() + l * nc;                         // [N,C]
    float* ln2 = a.ln2.data() + l * nc;                                     // [N,C]
    float* ln2_mean = a.ln2_mean.data() + l * N;                            // [N]
    float* ln2_rstd = a.ln2_rstd.data() + l * N;                            // [N]
    float* fch = a.fch.data() + l * N * FL;                                 // [N,FL]
    float* fch_gelu = a.fch_gelu.data() + l * N * FL;                       // [N,FL]
    float* fcproj = a.fcproj.data() + l * nc;                               // [N,C]
    float* residual3 = a.residual3.data() + l * nc;                         // [N,C]

    RETURN_IF_ERROR(NeedWeights(static_cast<int>(l) + 1));
    // The whole runner records a block per span (the operator runner, OpGpt,
    // one per operator).
    TraceSpan span("forward", LayerName(l));
    k::LayerNormForward(ln1, ln1_mean, ln1_rstd, residual, P(w.ln1w), P(w.ln1b), n, C);
    k::MatmulForward(qkv, ln1, P(w.qkvw), P(w.qkvb), n, C, 3 * CL);
    k::AttentionForward(atty, att, qkv, B, T, CL, NHL);
    k::MatmulForward(attproj, atty, P(w.attprojw), P(w.attprojb), n, CL, C);
    k::ResidualForward(residual2, residual, attproj, nc);
    k::LayerNormForward(ln2, ln2_mean, ln2_rstd, residual2, P(w.ln2w), P(w.ln2b), n, C);
    k::MatmulForward(fch, ln2, P(w.fcw), P(w.fcb), n, C, FL);
    k::GeluForward(fch_gelu, fch, N * FL);
    k::MatmulForward(fcproj, fch_gelu, P(w.fcprojw), P(w.fcprojb), n, FL, C);
    k::ResidualForward(residual3, residual2, fcproj, nc);
    residual = residual3;
  }
  if (!stage_.last) return 0.0f;
  RETURN_IF_ERROR(NeedWeights(0));
  TraceSpan span("forward", "ln_f+lm_head+loss");
  k::LayerNormForward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), residual, P(lnfw_),
                      P(lnfb_), n, C);                                            // [N,C]
  k::MatmulTransposedForward(a.logits.data(), a.lnf.data(), P(head_), n, C, VL);  // [N,VL]
  if (!a.has_targets) return 0.0f;
  return k::SoftmaxCrossEntropyForward(a.probs.data(), a.logits.data(), targets, n, VL);
}

Status Gpt::BackwardStage(int slot, const float* dy, float dloss) {
  if (slot < 0 || slot >= slots()) {
    return InvalidArgumentError("GPT backward: slot " + std::to_string(slot) + " of " +
                                std::to_string(slots()));
  }
  Activations& a = slots_[slot];
  if (a.B == 0 || (stage_.last && !a.has_targets)) {
    return FailedPreconditionError("GPT backward needs a forward with targets first");
  }
  a.has_targets = false;  // the probabilities become the logits' gradient below
  const int B = a.B, T = a.T;
  const int64_t N = static_cast<int64_t>(B) * T;
  const int n = static_cast<int>(N);
  const int C = config_.embed, CL = C, NHL = config_.heads, FL = 4 * C, VL = config_.vocab;
  const int L = static_cast<int>(layers_.size());
  if (grad_acts_.B != B || grad_acts_.T != T) Resize(grad_acts_, B, T);
  Gradients& d = grad_acts_;
  const int64_t nc = N * C, ncl = N * CL, nfl = N * FL;

  // The residual stream's gradient accumulates in d.residual from the top:
  // each layernorm adds its input gradient, and every residual add passes
  // it unchanged to both of its inputs (so the branch outputs read it as is).
  if (stage_.last) {
    RETURN_IF_ERROR(NeedWeights(0));
    TraceSpan span("backward", "ln_f+lm_head+loss");
    float* dlogits = a.probs.data();
    k::SoftmaxCrossEntropyBackward(dlogits, a.probs.data(), a.targets.data(), dloss, n, VL);
    k::MatmulTransposedBackward(d.lnf.data(), G(head_), dlogits, a.lnf.data(), P(head_), n, C, VL);
    std::fill(d.residual.begin(), d.residual.end(), 0.0f);
    const float* last = L > 0 ? a.residual3.data() + (L - 1) * nc : a.encoded.data();
    k::LayerNormBackward(d.residual.data(), G(lnfw_), G(lnfb_), d.lnf.data(), last, P(lnfw_),
                         a.lnf_mean.data(), a.lnf_rstd.data(), n, C);
  } else {
    std::copy(dy, dy + nc, d.residual.begin());
  }
  float* dres = d.residual.data();
  for (int l = L - 1; l >= 0; --l) {
    const Layer& w = layers_[l];
    const float* residual = l == 0 ? a.encoded.data() : a.residual3.data() + (l - 1) * nc;
    const float* att = a.att.data() + static_cast<int64_t>(l) * B * NHL * T * T;
    RETURN_IF_ERROR(NeedWeights(l + 1));
    TraceSpan span("backward", LayerName(l));
    // residual3 = residual2 + fcproj: dfcproj = dres
    k::MatmulBackward(d.fch_gelu.data(), G(w.fcprojw), G(w.fcprojb), dres,
                      a.fch_gelu.data() + l * nfl, P(w.fcprojw), n, FL, C);
    k::GeluBackward(d.fch.data(), a.fch.data() + l * nfl, d.fch_gelu.data(), nfl);
    k::MatmulBackward(d.ln2.data(), G(w.fcw), G(w.fcb), d.fch.data(), a.ln2.data() + l * nc,
                      P(w.fcw), n, C, FL);
    k::LayerNormBackward(dres, G(w.ln2w), G(w.ln2b), d.ln2.data(), a.residual2.data() + l * nc,
                         P(w.ln2w), a.ln2_mean.data() + l * N, a.ln2_rstd.data() + l * N, n, C);
    // residual2 = residual + attproj: dattproj = dres
    k::MatmulBackward(d.atty.data(), G(w.attprojw), G(w.attprojb), dres, a.atty.data() + l * ncl,
                      P(w.attprojw), n, CL, C);
    k::AttentionBackward(d.qkv.data(), d.atty.data(), a.qkv.data() + l * 3 * ncl, att, B, T, CL,
                         NHL);
    k::MatmulBackward(d.ln1.data(), G(w.qkvw), G(w.qkvb), d.qkv.data(), a.ln1.data() + l * nc,
                      P(w.qkvw), n, C, 3 * CL);
    k::LayerNormBackward(dres, G(w.ln1w), G(w.ln1b), d.ln1.data(), residual, P(w.ln1w),
                         a.ln1_mean.data() + l * N, a.ln1_rstd.data() + l * N, n, C);
  }
  if (stage_.first) {
    RETURN_IF_ERROR(NeedWeights(0));
    TraceSpan span("backward", "wte+wpe");
    k::EncoderBackward(G(wte_), G(wpe_), dres, a.tokens.data(), B, T, C);
  }
  return Status::Ok();
}

void Gpt::ZeroGrad() {
  if (keep_end_ <= keep_begin_) {
    std::fill(grads_.begin(), grads_.end(), 0.0f);
    return;
  }
  std::fill(grads_.begin(), grads_.begin() + keep_begin_, 0.0f);
  std::fill(grads_.begin() + keep_end_, grads_.end(), 0.0f);
}

float Gpt::Update(const AdamWConfig& config, float max_norm) {
  const double norm = std::sqrt(GradSquaredNorm());
  ApplyUpdate(config, max_norm > 0 ? ClipFactor(norm, max_norm) : 1.0f);
  return static_cast<float>(norm);
}

double Gpt::GradSquaredNorm() const {
  double sum = 0;
  for (const ParamInfo& p : params_) {
    if (!p.tied_copy && (p.tp_dim >= 0 || stage_.tp_rank == 0)) {
      sum += SquaredNorm(grads_.data() + p.offset, p.numel);
    }
  }
  return sum;
}

void Gpt::ApplyUpdate(const AdamWConfig& config, float clip) {
  if (clip != 1.0f) Scale(grads_.data(), num_params(), clip);
  ++step_;
  for (const ParamInfo& p : params_) {
    AdamWUpdate(P(p.offset), G(p.offset), m_.data() + p.offset, v_.data() + p.offset, p.numel,
                step_, config, p.decay);
  }
}

}  // namespace tessera
