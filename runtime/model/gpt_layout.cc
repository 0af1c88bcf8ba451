// The GPT's layout without its arithmetic: the configuration's checks, the
// parameters a stage holds (names, shapes, tp cuts, offsets) and the
// activation buffers a step allocates. What the cost model and the search
// read (they link no kernels); gpt.cc computes.
#include <algorithm>

#include "core/pages.h"
#include "runtime/model/gpt.h"
#include "transform/layout.h"

namespace tessera {

Status GptConfig::Validate() const {
  if (layers < 1 || heads < 1 || embed < 1 || context < 1 || vocab < 1) {
    return InvalidArgumentError("GPT config: layers, heads, embed, context and vocab must be >= 1");
  }
  if (embed % heads != 0) {
    return InvalidArgumentError("GPT config: embed " + std::to_string(embed) +
                                " is not a multiple of heads " + std::to_string(heads));
  }
  return Status::Ok();
}

Result<std::vector<ParamInfo>> Gpt::Params(const GptConfig& config, const GptStage& stage) {
  ASSIGN_OR_RETURN(Gpt g, Create(config, stage, /*allocate=*/false));
  return std::move(g.params_);
}

Result<Gpt> Gpt::Create(const GptConfig& config, const GptStage& stage) {
  return Create(config, stage, /*allocate=*/true);
}

Result<Gpt> Gpt::CreateWithoutMoments(const GptConfig& config, const GptStage& stage,
                                      bool offload_weights) {
  return Create(config, stage, /*allocate=*/true, /*moments=*/false, offload_weights);
}

Result<Gpt> Gpt::Create(const GptConfig& config, const GptStage& stage, bool allocate, bool moments,
                        bool offload_weights) {
  RETURN_IF_ERROR(config.Validate());
  Gpt g;
  g.config_ = config;
  g.stage_ = stage;
  if (g.stage_.last_layer < 0) g.stage_.last_layer = config.layers;
  std::vector<std::pair<int, int>> ranges = stage.chunks;
  if (ranges.empty()) ranges.emplace_back(g.stage_.first_layer, g.stage_.last_layer);
  for (const auto& [begin, end] : ranges) {
    if (begin < 0 || begin > end || end > config.layers) {
      return InvalidArgumentError("GPT stage: layers [" + std::to_string(begin) + ", " +
                                  std::to_string(end) + ") are not inside the " +
                                  std::to_string(config.layers) + " layers");
    }
  }
  const int tp = stage.tp, r = stage.tp_rank;
  if (tp < 1 || r < 0 || r >= tp) {
    return InvalidArgumentError("GPT: tensor-parallel rank " + std::to_string(r) + " of " +
                                std::to_string(tp));
  }
  const int64_t C = config.embed, V = config.vocab;
  int64_t offset = 0;
  int unit = 0;  // ParamInfo::unit
  // `full`: the whole tensor; `view` (or {}): the finer shape a tp cut
  // applies to (c_attn's [C, 3, C], so q, k and v are cut alike). The cut
  // dimension comes from stage.tp_dims (operator strategies decide it).
  auto add = [&](std::string name, std::vector<int64_t> full, std::vector<int64_t> view = {}) {
    ParamInfo p;
    p.name = std::move(name);
    p.full_shape = std::move(full);
    if (tp > 1) p.view = std::move(view);  // one rank: the plain shape says it all
    int dim = -1;
    if (stage.tp_dims != nullptr) {
      auto it = stage.tp_dims->find(p.name);
      if (it != stage.tp_dims->end()) dim = it->second;
    }
    p.tp_dim = tp > 1 ? dim : -1;
    p.box = Box::FromShape(p.split_shape());
    if (p.tp_dim >= 0) p.box[p.tp_dim] = ChunkOf(p.box[p.tp_dim], tp, r);
    // The slice's shape as the kernels see it: a view's extents folded back
    // into the tensor's own dimensions.
    const std::vector<int64_t> e = p.box.extents();
    if (p.view.empty()) {
      p.shape = e;
    } else {
      const auto groups = RefinementGroups(p.view, p.full_shape);  // views here always refine
      for (const auto& [a, b] : *groups) {
        int64_t n = 1;
        for (int d = a; d < b; ++d) n *= e[d];
        p.shape.push_back(n);
      }
    }
    p.numel = NumElements(p.box);
    p.offset = offset;
    p.decay = p.full_shape.size() >= 2;
    p.unit = unit;
    offset += p.numel;
    g.params_.push_back(std::move(p));
    return g.params_.back().offset;
  };
  if (stage.first) {
    g.wte_ = add("wte", {V, C});
    g.wpe_ = add("wpe", {config.context, C});
  }
  for (const auto& [begin, end] : ranges) {
    for (int i = begin; i < end; ++i) {
      const std::string p = "h." + std::to_string(i) + ".";
      unit = static_cast<int>(g.layers_.size()) + 1;
      Layer l;
      l.ln1w = add(p + "ln_1.weight", {C});
      l.ln1b = add(p + "ln_1.bias", {C});
      // q | k | v side by side, each cut by heads: a box of [C, 3, C].
      l.qkvw = add(p + "attn.c_attn.weight", {C, 3 * C}, {C, 3, C});
      l.qkvb = add(p + "attn.c_attn.bias", {3 * C}, {3, C});
      l.attprojw = add(p + "attn.c_proj.weight", {C, C});
      l.attprojb = add(p + "attn.c_proj.bias", {C});
      l.ln2w = add(p + "ln_2.weight", {C});
      l.ln2b = add(p + "ln_2.bias", {C});
      l.fcw = add(p + "mlp.c_fc.weight", {C, 4 * C});
      l.fcb = add(p + "mlp.c_fc.bias", {4 * C});
      l.fcprojw = add(p + "mlp.c_proj.weight", {4 * C, C});
      l.fcprojb = add(p + "mlp.c_proj.bias", {C});
      g.layers_.push_back(l);
    }
  }
  unit = 0;
  if (stage.last) {
    g.lnfw_ = add("ln_f.weight", {C});
    g.lnfb_ = add("ln_f.bias", {C});
    if (config.untied) {
      g.head_ = add("lm_head.weight", {V, C});
    } else if (!stage.first) {
      g.wte_ = add("wte", {V, C});
      g.params_.back().tied_copy = true;
    }
    if (!config.untied) g.head_ = g.wte_;
  }
  if (allocate) {
    g.weights_.assign(offset, 0.0f);
    // Given back before the gradients are allocated, so the two never sit
    // in memory together.
    if (offload_weights) {
      RETURN_IF_ERROR(ReturnPages(g.weights_.data(), offset * static_cast<int64_t>(sizeof(float))));
    }
    // A served embedding's table: never held whole (its rows come and go).
    const bool served = stage.served_embedding && stage.first;
    const int64_t table = static_cast<int64_t>(V) * C * static_cast<int64_t>(sizeof(float));
    if (served) RETURN_IF_ERROR(ReturnPages(g.weights_.data() + g.wte_, table));
    g.grads_.assign(offset, 0.0f);
    if (served) {
      RETURN_IF_ERROR(ReturnPages(g.grads_.data() + g.wte_, table));
      g.SkipZeroing(g.wte_, g.wte_ + static_cast<int64_t>(V) * C);
    }
    if (moments) {
      g.m_.assign(offset, 0.0f);
      g.v_.assign(offset, 0.0f);
    }
  }
  return g;
}

const ParamInfo* Gpt::FindParam(const std::string& name) const {
  for (const ParamInfo& p : params_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

template <typename F>
void Gpt::ForEachBuffer(Activations& a, int B, int T, F f) const {
  const int64_t N = static_cast<int64_t>(B) * T, C = config_.embed;
  const int64_t L = static_cast<int64_t>(layers_.size());
  const int64_t head = stage_.last ? 1 : 0;  // the final LayerNorm and logits
  const int64_t CL = C, NHL = config_.heads, FL = 4 * C, VL = config_.vocab;
  f(a.encoded, N * C);
  f(a.ln1, L * N * C);
  f(a.qkv, L * N * 3 * CL);
  f(a.atty, L * N * CL);
  f(a.attproj, L * N * C);
  f(a.residual2, L * N * C);
  f(a.ln2, L * N * C);
  f(a.fch, L * N * FL);
  f(a.fch_gelu, L * N * FL);
  f(a.fcproj, L * N * C);
  f(a.residual3, L * N * C);
  f(a.lnf, head * N * C);
  f(a.logits, head * N * VL);
  f(a.ln1_mean, L * N);
  f(a.ln1_rstd, L * N);
  f(a.att, L * B * NHL * T * T);
  f(a.ln2_mean, L * N);
  f(a.ln2_rstd, L * N);
  f(a.lnf_mean, head * N);
  f(a.lnf_rstd, head * N);
  f(a.probs, head * N * VL);
}

template <typename F>
void Gpt::ForEachGradient(Gradients& d, int B, int T, F f) const {
  const int64_t nc = static_cast<int64_t>(B) * T * config_.embed;
  f(d.residual, nc);
  f(d.lnf, nc);
  f(d.ln1, nc);
  f(d.qkv, 3 * nc);
  f(d.atty, nc);
  f(d.ln2, nc);
  f(d.fch, 4 * nc);
  f(d.fch_gelu, 4 * nc);
}

int64_t Gpt::ActivationBytes() const {
  int64_t n = 0;
  for (const Activations& a : slots_) {
    ForEachBuffer(const_cast<Activations&>(a), a.B, a.T, [&](std::vector<float>& v, int64_t) {
      n += static_cast<int64_t>(v.capacity() * sizeof(float));
    });
    n += static_cast<int64_t>((a.tokens.capacity() + a.targets.capacity()) * sizeof(int32_t));
  }
  ForEachGradient(const_cast<Gradients&>(grad_acts_), grad_acts_.B, grad_acts_.T,
                  [&](std::vector<float>& v, int64_t) {
                    n += static_cast<int64_t>(v.capacity() * sizeof(float));
                  });
  return n;
}

Result<int64_t> Gpt::ActivationBytesOf(const GptConfig& config, const GptStage& stage, int B, int T,
                                       int slots) {
  ASSIGN_OR_RETURN(const Gpt g, Create(config, stage, /*allocate=*/false));
  int64_t floats = 0;
  Activations a;
  g.ForEachBuffer(a, B, T, [&](std::vector<float>&, int64_t n) { floats += n; });
  // The tokens (first stage) and targets (last) each slot keeps.
  const int64_t ints = (g.stage_.first ? 1 : 0) + (g.stage_.last ? 1 : 0);
  int64_t n = std::max(1, slots) * (floats * 4 + ints * B * T * 4);
  Gradients d;
  g.ForEachGradient(d, B, T, [&](std::vector<float>&, int64_t m) { n += m * 4; });
  return n;
}

void Gpt::Resize(Activations& a, int B, int T) const {
  a.B = B;
  a.T = T;
  ForEachBuffer(a, B, T, [](std::vector<float>& v, int64_t n) { v.assign(n, 0.0f); });
}

void Gpt::Resize(Gradients& d, int B, int T) const {
  d.B = B;
  d.T = T;
  ForEachGradient(d, B, T, [](std::vector<float>& v, int64_t n) { v.assign(n, 0.0f); });
}

}  // namespace tessera
