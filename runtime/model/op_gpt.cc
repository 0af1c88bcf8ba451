#include "runtime/model/op_gpt.h"

#include <algorithm>
#include <cstring>

#include "core/byte_size.h"
#include "runtime/kernels.h"

namespace tessera {
namespace {

std::string BlockPrefix(int i) { return "h." + std::to_string(i) + "."; }

// Whether a linear's input conversion gathers rows: its result is not kept
// but gathered again in backward (Megatron's sequence parallelism).
bool Regathers(const Placement& from, const Placement& to) {
  return from.split == 0 && !from.partial && to.split == -1;
}

OpSignature::Input In(std::string name, std::vector<int64_t> shape, std::string param = "",
                      std::vector<int> uneven = {}) {
  return {std::move(name), std::move(shape), std::move(param), std::move(uneven)};
}

}  // namespace

std::vector<OpSignature> OpGpt::Signatures(const GptConfig& config) {
  const int64_t C = config.embed, V = config.vocab, R = -1;
  std::vector<OpSignature> ops;
  ops.push_back({"embedding", "embedding", {In("wte", {V, C}, "wte", {0}), In("tokens", {R})}});
  for (int i = 0; i < config.layers; ++i) {
    const std::string p = BlockPrefix(i);
    auto linear = [&](const std::string& name, int64_t k, int64_t m) {
      ops.push_back(
          {p + name, "linear", {In("x", {R, k}), In("weight", {k, m}, p + name + ".weight")}});
    };
    ops.push_back({p + "ln_1", "layer_norm", {In("x", {R, C})}});
    linear("attn.c_attn", C, 3 * C);
    // Dimension 1 of the attention's input counts heads (q | k | v cut alike).
    ops.push_back(
        {p + "attn.attention", "attention", {In("qkv [rows, heads]", {R, config.heads})}});
    linear("attn.c_proj", C, C);
    ops.push_back({p + "add_1", "add", {In("a", {R, C}), In("b", {R, C})}});
    ops.push_back({p + "ln_2", "layer_norm", {In("x", {R, C})}});
    linear("mlp.c_fc", C, 4 * C);
    ops.push_back({p + "mlp.gelu", "gelu", {In("x", {R, 4 * C})}});
    linear("mlp.c_proj", 4 * C, C);
    ops.push_back({p + "add_2", "add", {In("a", {R, C}), In("b", {R, C})}});
  }
  ops.push_back({"ln_f", "layer_norm", {In("x", {R, C})}});
  ops.push_back({"lm_head", "lm_head", {In("x", {R, C}), In("wte", {V, C}, "wte", {0})}});
  ops.push_back({"loss", "cross_entropy", {In("logits", {R, V}, "", {1}), In("targets", {R})}});
  return ops;
}

OpStrategyFile OpGpt::Megatron(bool sequence_parallel) {
  OpStrategyFile f;
  f.source = sequence_parallel ? "<megatron-sp>" : "<megatron>";
  const DimAxes none, dp{"dp"}, tp{"tp"}, rows = sequence_parallel ? DimAxes{"dp", "tp"} : dp;
  auto add = [&](std::string pattern, std::vector<std::vector<DimAxes>> axes) {
    OpStrategyFile::Entry e;
    e.pattern = std::move(pattern);
    for (const auto& in : axes) e.counts.emplace_back(in.size(), 1);
    e.axes = std::move(axes);
    f.operators.push_back(std::move(e));
  };
  add("embedding", {{tp, none}, {dp}});
  add("h.*.ln_1", {{rows, none}});
  add("h.*.attn.c_attn", {{dp, none}, {none, tp}});
  add("h.*.attn.attention", {{dp, tp}});
  add("h.*.attn.c_proj", {{dp, tp}, {tp, none}});
  add("h.*.add_1", {{rows, none}, {rows, none}});
  add("h.*.ln_2", {{rows, none}});
  add("h.*.mlp.c_fc", {{dp, none}, {none, tp}});
  add("h.*.mlp.gelu", {{dp, tp}});
  add("h.*.mlp.c_proj", {{dp, tp}, {tp, none}});
  add("h.*.add_2", {{rows, none}, {rows, none}});
  add("ln_f", {{rows, none}});
  add("lm_head", {{dp, none}, {tp, none}});
  add("loss", {{dp, tp}, {dp}});
  return f;
}

void OpGpt::BlockParamSplits(int layer, int tp, const LinearOp& qkv_op, const LinearOp& proj,
                             const LinearOp& fc, const LinearOp& fcproj,
                             std::map<std::string, int>* splits) {
  const std::string p = BlockPrefix(layer);
  // c_attn's weight is cut in its [C, 3, C] view (by heads) when tp > 1.
  const int qkv = qkv_op.weight_split();
  (*splits)[p + "attn.c_attn.weight"] = qkv == 1 ? (tp > 1 ? 2 : 1) : qkv;
  (*splits)[p + "attn.c_attn.bias"] = qkv == 1 ? (tp > 1 ? 1 : 0) : -1;
  for (const auto& [name, op] :
       {std::pair{"attn.c_proj", &proj}, {"mlp.c_fc", &fc}, {"mlp.c_proj", &fcproj}}) {
    (*splits)[p + name + ".weight"] = op->weight_split();
    (*splits)[p + name + ".bias"] = op->bias_split() ? 0 : -1;
  }
  for (const char* ln : {"ln_1", "ln_2"}) {
    (*splits)[p + ln + ".weight"] = -1;
    (*splits)[p + ln + ".bias"] = -1;
  }
}

void OpGpt::EndParamSplits(const EmbeddingOp& embedding, std::map<std::string, int>* splits) {
  (*splits)["wte"] = embedding.weight_split();
  (*splits)["wpe"] = embedding.weight_split() == 1 ? 1 : -1;
  (*splits)["ln_f.weight"] = (*splits)["ln_f.bias"] = -1;
}

Result<std::unique_ptr<OpGpt>> OpGpt::Create(const GptConfig& config,
                                             const std::map<std::string, OpStrategy>& strategies,
                                             const GptStage& stage, int dp) {
  RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<OpGpt> g(new OpGpt());
  g->config_ = config;
  g->stage_ = stage;
  g->dp_ = dp;
  const int64_t C = config.embed, V = config.vocab;
  const int tp = stage.tp;
  auto strategy = [&](const std::string& name) -> Result<const OpStrategy*> {
    auto it = strategies.find(name);
    if (it == strategies.end()) return InternalError("no strategy for operator '" + name + "'");
    return &it->second;
  };
  std::map<std::string, int>& splits = g->param_splits_;
  ASSIGN_OR_RETURN(const OpStrategy* s, strategy("embedding"));
  ASSIGN_OR_RETURN(g->embedding_, EmbeddingOp::Create("embedding", *s, V, C, dp));
  EndParamSplits(g->embedding_, &splits);
  const int last_layer = stage.last_layer < 0 ? config.layers : stage.last_layer;
  // Every block is checked; the stage keeps its own.
  for (int i = 0; i < config.layers; ++i) {
    const std::string p = BlockPrefix(i);
    OpGpt::Block b;
    ASSIGN_OR_RETURN(s, strategy(p + "ln_1"));
    ASSIGN_OR_RETURN(b.ln1, LayerNormOp::Create(p + "ln_1", *s, dp));
    ASSIGN_OR_RETURN(s, strategy(p + "attn.c_attn"));
    ASSIGN_OR_RETURN(b.qkv, LinearOp::Create(p + "attn.c_attn", *s, C, 3 * C, 3, dp));
    if (b.qkv.weight_split() == 1 && C % tp != 0) {
      return InvalidArgumentError("operator '" + p +
                                  "attn.c_attn': input 1 (weight) dimension 1 "
                                  "cuts q, k and v alike; C = " +
                                  std::to_string(C) + " is not divisible by tp " +
                                  std::to_string(tp));
    }
    ASSIGN_OR_RETURN(s, strategy(p + "attn.attention"));
    ASSIGN_OR_RETURN(b.attn,
                     AttentionOp::Create(p + "attn.attention", *s, config.heads, C, tp, dp));
    ASSIGN_OR_RETURN(s, strategy(p + "attn.c_proj"));
    ASSIGN_OR_RETURN(b.proj, LinearOp::Create(p + "attn.c_proj", *s, C, C, 1, dp));
    ASSIGN_OR_RETURN(s, strategy(p + "add_1"));
    ASSIGN_OR_RETURN(b.add1, AddOp::Create(p + "add_1", *s, dp));
    ASSIGN_OR_RETURN(s, strategy(p + "ln_2"));
    ASSIGN_OR_RETURN(b.ln2, LayerNormOp::Create(p + "ln_2", *s, dp));
    ASSIGN_OR_RETURN(s, strategy(p + "mlp.c_fc"));
    ASSIGN_OR_RETURN(b.fc, LinearOp::Create(p + "mlp.c_fc", *s, C, 4 * C, 1, dp));
    ASSIGN_OR_RETURN(s, strategy(p + "mlp.gelu"));
    ASSIGN_OR_RETURN(b.gelu, GeluOp::Create(p + "mlp.gelu", *s, dp));
    ASSIGN_OR_RETURN(s, strategy(p + "mlp.c_proj"));
    ASSIGN_OR_RETURN(b.fcproj, LinearOp::Create(p + "mlp.c_proj", *s, 4 * C, C, 1, dp));
    ASSIGN_OR_RETURN(s, strategy(p + "add_2"));
    ASSIGN_OR_RETURN(b.add2, AddOp::Create(p + "add_2", *s, dp));
    BlockParamSplits(i, tp, b.qkv, b.proj, b.fc, b.fcproj, &splits);
    b.layer = i;
    if (i >= stage.first_layer && i < last_layer) g->blocks_.push_back(std::move(b));
  }
  ASSIGN_OR_RETURN(s, strategy("ln_f"));
  ASSIGN_OR_RETURN(g->lnf_, LayerNormOp::Create("ln_f", *s, dp));
  ASSIGN_OR_RETURN(s, strategy("lm_head"));
  ASSIGN_OR_RETURN(g->lm_head_, LmHeadOp::Create("lm_head", *s, V, C, dp));
  ASSIGN_OR_RETURN(s, strategy("loss"));
  ASSIGN_OR_RETURN(g->loss_, CrossEntropyOp::Create("loss", *s, V, dp));
  if (tp == 1) {  // a cut over one rank is no cut
    for (auto& [name, dim] : splits) dim = -1;
  }
  if (g->lm_head_.weight_split() != g->embedding_.weight_split()) {
    return InternalError("wte is cut differently by embedding and lm_head");
  }

  // The graph's edges, with the residual stream's placement threaded through.
  Placement x = stage.first ? g->embedding_.info().output : Placement{-1};
  g->stream_in_ = x;
  std::string xname = stage.first ? "embedding" : "the previous stage";
  auto edge = [](std::string from, const OpInfo& to, int input, Placement p, Placement grad,
                 int64_t cols) {
    return Edge{
        from + " -> " + to.name + (to.inputs.size() > 1 ? " input " + std::to_string(input) : ""),
        p, to.inputs[input], grad, cols};
  };
  for (OpGpt::Block& b : g->blocks_) {
    b.e[0] = edge(xname, b.ln1.info(), 0, x, b.ln1.info().inputs[0], C);
    b.e[1] =
        edge(b.ln1.info().name, b.qkv.info(), 0, b.ln1.info().output, b.qkv.InputGradient(), C);
    b.e[2] = edge(b.qkv.info().name, b.attn.info(), 0, b.qkv.info().output, b.attn.info().inputs[0],
                  3 * C);
    b.e[3] =
        edge(b.attn.info().name, b.proj.info(), 0, b.attn.info().output, b.proj.InputGradient(), C);
    b.e[4] = edge(xname, b.add1.info(), 0, x, b.add1.info().inputs[0], C);
    b.e[5] = edge(b.proj.info().name, b.add1.info(), 1, b.proj.info().output,
                  b.add1.info().inputs[1], C);
    const Placement x1 = b.add1.info().output;
    b.e[6] = edge(b.add1.info().name, b.ln2.info(), 0, x1, b.ln2.info().inputs[0], C);
    b.e[7] = edge(b.ln2.info().name, b.fc.info(), 0, b.ln2.info().output, b.fc.InputGradient(), C);
    b.e[8] = edge(b.fc.info().name, b.gelu.info(), 0, b.fc.info().output, b.gelu.info().inputs[0],
                  4 * C);
    b.e[9] = edge(b.gelu.info().name, b.fcproj.info(), 0, b.gelu.info().output,
                  b.fcproj.InputGradient(), 4 * C);
    b.e[10] = edge(b.add1.info().name, b.add2.info(), 0, x1, b.add2.info().inputs[0], C);
    b.e[11] = edge(b.fcproj.info().name, b.add2.info(), 1, b.fcproj.info().output,
                   b.add2.info().inputs[1], C);
    x = b.add2.info().output;
    xname = b.add2.info().name;
  }
  if (stage.last) {
    g->lnf_e_ = edge(xname, g->lnf_.info(), 0, x, g->lnf_.info().inputs[0], C);
    g->lm_e_ =
        edge("ln_f", g->lm_head_.info(), 0, g->lnf_.info().output, g->lm_head_.InputGradient(), C);
    g->ce_e_ = edge("lm_head", g->loss_.info(), 0, g->lm_head_.info().output,
                    g->loss_.info().inputs[0], V);
  } else {
    g->out_e_ = {xname + " -> the next stage", x, Placement{-1}, Placement{-1}, C};
  }
  return g;
}

Status OpGpt::Bind(Gpt* model, Communicator* tp) {
  if (tp != nullptr && (tp->size() != stage_.tp || tp->rank() != stage_.tp_rank)) {
    return InvalidArgumentError("GPT operators: the tp communicator must have " +
                                std::to_string(stage_.tp) + " ranks with this one as rank " +
                                std::to_string(stage_.tp_rank));
  }
  if (tp == nullptr && stage_.tp != 1)
    return InvalidArgumentError("GPT operators: tp > 1 needs a communicator");
  model_ = model;
  ctx_ = OpContext(tp);
  auto offset = [&](const std::string& name) -> Result<int64_t> {
    const ParamInfo* p = model->FindParam(name);
    if (p == nullptr)
      return InternalError("GPT operators: the model has no parameter '" + name + "'");
    auto it = param_splits_.find(name);
    if (it == param_splits_.end() || it->second != p->tp_dim) {
      return InternalError("GPT operators: parameter '" + name +
                           "' is not cut as the strategy says");
    }
    return p->offset;
  };
  tp_sums_.clear();
  auto sum = [&](int64_t off, const std::string& name) {
    tp_sums_.emplace_back(off, model->FindParam(name)->numel);
  };
  const int first = stage_.first_layer;
  for (size_t l = 0; l < blocks_.size(); ++l) {
    OpGpt::Block& b = blocks_[l];
    const std::string p = BlockPrefix(first + static_cast<int>(l));
    struct {
      int64_t* at;
      const char* name;
      bool rows;
    } params[] = {{&b.ln1w, "ln_1.weight", b.ln1.info().rows_over_tp},
                  {&b.ln1b, "ln_1.bias", b.ln1.info().rows_over_tp},
                  {&b.qkvw, "attn.c_attn.weight", b.qkv.info().rows_over_tp},
                  {&b.qkvb, "attn.c_attn.bias", b.qkv.info().rows_over_tp},
                  {&b.projw, "attn.c_proj.weight", b.proj.info().rows_over_tp},
                  {&b.projb, "attn.c_proj.bias", b.proj.info().rows_over_tp},
                  {&b.ln2w, "ln_2.weight", b.ln2.info().rows_over_tp},
                  {&b.ln2b, "ln_2.bias", b.ln2.info().rows_over_tp},
                  {&b.fcw, "mlp.c_fc.weight", b.fc.info().rows_over_tp},
                  {&b.fcb, "mlp.c_fc.bias", b.fc.info().rows_over_tp},
                  {&b.fcprojw, "mlp.c_proj.weight", b.fcproj.info().rows_over_tp},
                  {&b.fcprojb, "mlp.c_proj.bias", b.fcproj.info().rows_over_tp}};
    for (auto& q : params) {
      ASSIGN_OR_RETURN(*q.at, offset(p + q.name));
      if (q.rows && ctx_.tp() > 1) sum(*q.at, p + q.name);
    }
  }
  wte_tp_sum_ = false;
  if (stage_.first) {
    ASSIGN_OR_RETURN(wte_, offset("wte"));
    ASSIGN_OR_RETURN(wpe_, offset("wpe"));
    if (embedding_.info().rows_over_tp && ctx_.tp() > 1) {
      wte_tp_sum_ = true;
      sum(wpe_, "wpe");
    }
  }
  if (stage_.last) {
    ASSIGN_OR_RETURN(wte_, offset("wte"));
    ASSIGN_OR_RETURN(lnfw_, offset("ln_f.weight"));
    ASSIGN_OR_RETURN(lnfb_, offset("ln_f.bias"));
    if (lnf_.info().rows_over_tp && ctx_.tp() > 1) {
      sum(lnfw_, "ln_f.weight");
      sum(lnfb_, "ln_f.bias");
    }
    if (lm_head_.info().rows_over_tp && ctx_.tp() > 1) wte_tp_sum_ = true;
  }
  if (wte_tp_sum_) sum(wte_, "wte");
  const ParamInfo* wte = model->FindParam("wte");
  wte_numel_ = wte != nullptr ? wte->numel : 0;
  return Status::Ok();
}

void OpGpt::SetSlots(int n) { slots_.resize(std::max(1, n)); }

Result<Recompute> ParseRecompute(std::string_view text) {
  if (text == "none") return Recompute::kNone;
  if (text == "full") return Recompute::kFull;
  if (text == "selective") return Recompute::kSelective;
  return InvalidArgumentError("recompute '" + std::string(text) +
                              "' is not one of none, full, selective");
}

std::string_view RecomputeName(Recompute r) {
  return r == Recompute::kFull ? "full" : r == Recompute::kSelective ? "selective" : "none";
}

void OpGpt::SetRecompute(int layer, Recompute mode) {
  for (OpGpt::Block& b : blocks_) {
    if (layer < 0 || b.layer == layer) b.recompute = mode;
  }
}

int64_t OpGpt::ActivationBytes() const {
  int64_t n = 0;
  auto add = [&](const auto& v) { n += static_cast<int64_t>(v.capacity() * sizeof(v[0])); };
  auto acts = [&](const BlockActs& s) {
    for (const Buf* b : {&s.ln1_in, &s.h1, &s.qkv_in, &s.qkv, &s.attn_in, &s.att, &s.y, &s.proj_in,
                         &s.add1_a, &s.x1, &s.ln2_in, &s.h2, &s.fc_in, &s.f, &s.gelu_in, &s.g,
                         &s.fcproj_in, &s.add2_a, &s.x2}) {
      add(b->data);
    }
    for (const auto* v : {&s.ln1_mean, &s.ln1_rstd, &s.ln2_mean, &s.ln2_rstd}) add(*v);
  };
  for (const Slot& a : slots_) {
    add(a.tokens);
    add(a.targets);
    for (const Buf* b : {&a.x0, &a.out, &a.lnf_in, &a.hf, &a.lm_in, &a.logits, &a.ce_in})
      add(b->data);
    for (const auto* v : {&a.lnf_mean, &a.lnf_rstd, &a.probs, &a.max}) add(*v);
    add(a.sums);
    for (const BlockActs& s : a.blocks) acts(s);
  }
  acts(scratch_);
  for (const Buf* b : {&scratch_att_, &scratch_y_, &gather_, &out_tmp_, &conv_tmp_}) add(b->data);
  for (const Buf* b : {&d_.dres, &d_.dres2, &d_.tmp, &d_.d_ln_in, &d_.d_add, &d_.dm, &d_.dg_in,
                       &d_.dg, &d_.df_in, &d_.df, &d_.dh_in, &d_.dh, &d_.dy, &d_.dqkv_in, &d_.dqkv,
                       &d_.dattn_y, &d_.dlogits, &d_.dlnf, &d_.dx_lnf}) {
    add(b->data);
  }
  add(input_grad_);
  add(scratch_grad_);
  return n;
}

int64_t OpGpt::CommBufferBytes() const {
  return static_cast<int64_t>(sum_buf_.capacity() * sizeof(float));
}

Act OpGpt::New(Buf* b, int64_t rows, int64_t cols, Placement p) {
  b->act = Act{nullptr, rows, cols, p};
  b->data.resize(ctx_.LocalSize(b->act));
  b->act.data = b->data.data();
  return b->act;
}

bool OpGpt::Regather(const Edge& e) { return Regathers(e.from, e.to); }

Result<Act> OpGpt::Conv(Act& a, const Edge& e, Buf* buf) {
  ASSIGN_OR_RETURN(buf->act, ctx_.Convert(a, e.to, &buf->data, e.label, "forward"));
  return buf->act;
}

Result<Act> OpGpt::ConvGrad(Act& g, const Edge& e, Buf* buf) {
  g.place = e.grad;
  ASSIGN_OR_RETURN(buf->act, ctx_.Convert(g, e.from.Resolved(), &buf->data, e.label, "backward"));
  return buf->act;
}

float* OpGpt::ParamGrad(int64_t offset, int64_t n, bool tp_sum, bool rows_over_tp) {
  if (!tp_sum || rows_over_tp || ctx_.tp_rank() == 0) return G(offset);
  if (scratch_grad_.size() < static_cast<size_t>(n)) scratch_grad_.assign(n, 0.0f);
  return scratch_grad_.data();
}

Result<Act> OpGpt::Residual(const AddOp& add, Act& x, const Act& ln_in, const Edge& ln_e,
                            const Edge& a_e, Act& branch, const Edge& b_e, Buf* a_buf, Buf* out) {
  // The residual stream feeds the layer norm and the add: one conversion
  // when both want the same placement.
  if (a_e.to == ln_e.to) {
    a_buf->act = ln_in;
  } else {
    RETURN_IF_ERROR(Conv(x, a_e, a_buf).status());
  }
  ASSIGN_OR_RETURN(Act b, Conv(branch, b_e, &conv_tmp_));
  Act y = New(out, x.rows, x.cols, add.info().output);
  add.Forward(ctx_, a_buf->act, b, &y);
  return y;
}

Status OpGpt::BlockForward(const Block& b, Act& x, int T, BlockActs* acts, Buf* att, Buf* y_buf) {
  const int64_t N = x.rows, C = config_.embed;
  BlockActs& s = *acts;
  ASSIGN_OR_RETURN(Act ln_in, Conv(x, b.e[0], &s.ln1_in));
  Act h1 = New(&s.h1, N, C, b.ln1.info().output);
  s.ln1_mean.resize(ctx_.LocalRows(h1));
  s.ln1_rstd.resize(ctx_.LocalRows(h1));
  b.ln1.Forward(ctx_, ln_in, P(b.ln1w), P(b.ln1b), &h1, s.ln1_mean.data(), s.ln1_rstd.data());
  // A linear's input that a conversion gathers is not kept: backward
  // gathers it again from the shard (Megatron's sequence parallelism).
  ASSIGN_OR_RETURN(Act qkv_in, Conv(h1, b.e[1], Regather(b.e[1]) ? &gather_ : &s.qkv_in));
  Act qkv = New(&s.qkv, N, 3 * C, b.qkv.info().output);
  b.qkv.Forward(ctx_, qkv_in, P(b.qkvw), P(b.qkvb), &qkv);
  ASSIGN_OR_RETURN(Act attn_in, Conv(qkv, b.e[2], &s.attn_in));
  att->data.resize(b.attn.AttSize(ctx_, N, T));
  Act y = New(y_buf, N, C, b.attn.info().output);
  RETURN_IF_ERROR(b.attn.Forward(ctx_, attn_in, T, att->data.data(), &y));
  ASSIGN_OR_RETURN(Act proj_in, Conv(y, b.e[3], &s.proj_in));
  // The row-parallel outputs and their converted copies only feed the
  // adds: transient buffers, shared by every block.
  Act av = New(&out_tmp_, N, C, b.proj.info().output);
  b.proj.Forward(ctx_, proj_in, P(b.projw), P(b.projb), &av);
  ASSIGN_OR_RETURN(Act x1,
                   Residual(b.add1, x, ln_in, b.e[0], b.e[4], av, b.e[5], &s.add1_a, &s.x1));

  ASSIGN_OR_RETURN(Act ln2_in, Conv(x1, b.e[6], &s.ln2_in));
  Act h2 = New(&s.h2, N, C, b.ln2.info().output);
  s.ln2_mean.resize(ctx_.LocalRows(h2));
  s.ln2_rstd.resize(ctx_.LocalRows(h2));
  b.ln2.Forward(ctx_, ln2_in, P(b.ln2w), P(b.ln2b), &h2, s.ln2_mean.data(), s.ln2_rstd.data());
  ASSIGN_OR_RETURN(Act fc_in, Conv(h2, b.e[7], Regather(b.e[7]) ? &gather_ : &s.fc_in));
  Act f = New(&s.f, N, 4 * C, b.fc.info().output);
  b.fc.Forward(ctx_, fc_in, P(b.fcw), P(b.fcb), &f);
  ASSIGN_OR_RETURN(Act gelu_in, Conv(f, b.e[8], &s.gelu_in));
  Act g = New(&s.g, N, 4 * C, b.gelu.info().output);
  b.gelu.Forward(ctx_, gelu_in, &g);
  ASSIGN_OR_RETURN(Act fcproj_in, Conv(g, b.e[9], &s.fcproj_in));
  Act m = New(&out_tmp_, N, C, b.fcproj.info().output);
  b.fcproj.Forward(ctx_, fcproj_in, P(b.fcprojw), P(b.fcprojb), &m);
  return Residual(b.add2, x1, ln2_in, b.e[6], b.e[10], m, b.e[11], &s.add2_a, &s.x2).status();
}

Result<float> OpGpt::ForwardStage(int slot, const int32_t* tokens, const float* x_in,
                                  const int32_t* targets, int B, int T) {
  if (model_ == nullptr) return FailedPreconditionError("GPT operators: Bind first");
  RETURN_IF_ERROR(CheckStageBatch(config_, stage_, slot, slots(), tokens, targets, B, T));
  const int64_t N = static_cast<int64_t>(B) * T, C = config_.embed, V = config_.vocab;
  const bool check_targets = stage_.last && targets != nullptr;
  Slot& a = slots_[slot];
  a.B = B;
  a.T = T;
  a.blocks.resize(blocks_.size());
  if (stage_.first) a.tokens.assign(tokens, tokens + N);
  a.has_targets = check_targets;
  if (a.has_targets) a.targets.assign(targets, targets + N);

  Act x = New(&a.x0, N, C, stream_in_);
  if (stage_.first) {
    embedding_.Forward(ctx_, a.tokens.data(), T, P(wte_), P(wpe_), &x);
  } else {
    std::copy(x_in, x_in + N * C, x.data);
  }
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const OpGpt::Block& b = blocks_[l];
    BlockActs& s = a.blocks[l];
    if (b.recompute == Recompute::kFull) {
      // Only the block's input (as its conversions left it) and output stay.
      RETURN_IF_ERROR(BlockForward(b, x, T, &scratch_, &scratch_att_, &scratch_y_));
      s.input = x;
      Act x2 = New(&s.x2, N, C, scratch_.x2.act.place);
      std::copy(scratch_.x2.act.data, scratch_.x2.act.data + ctx_.LocalSize(x2), x2.data);
      x = x2;
    } else if (b.recompute == Recompute::kSelective) {
      RETURN_IF_ERROR(BlockForward(b, x, T, &s, &scratch_att_, &scratch_y_));
      x = s.x2.act;
    } else {
      RETURN_IF_ERROR(BlockForward(b, x, T, &s, &s.att, &s.y));
      x = s.x2.act;
    }
  }
  if (!stage_.last) {
    RETURN_IF_ERROR(Conv(x, out_e_, &a.out).status());
    return 0.0f;
  }
  ASSIGN_OR_RETURN(Act lnf_in, Conv(x, lnf_e_, &a.lnf_in));
  Act hf = New(&a.hf, N, C, lnf_.info().output);
  a.lnf_mean.resize(ctx_.LocalRows(hf));
  a.lnf_rstd.resize(ctx_.LocalRows(hf));
  lnf_.Forward(ctx_, lnf_in, P(lnfw_), P(lnfb_), &hf, a.lnf_mean.data(), a.lnf_rstd.data());
  ASSIGN_OR_RETURN(Act lm_in, Conv(hf, lm_e_, Regather(lm_e_) ? &gather_ : &a.lm_in));
  Act logits = New(&a.logits, N, V, lm_head_.info().output);
  lm_head_.Forward(ctx_, lm_in, P(wte_), &logits);
  if (!a.has_targets) return 0.0f;
  ASSIGN_OR_RETURN(Act ce_in, Conv(logits, ce_e_, &a.ce_in));
  a.probs.resize(ctx_.LocalSize(ce_in));
  ASSIGN_OR_RETURN(const double loss,
                   loss_.Forward(ctx_, ce_in, a.targets.data(), a.probs.data(), &a.max, &a.sums));
  return static_cast<float>(loss);
}

const float* OpGpt::StageOutput(int slot) const { return slots_[slot].out.act.data; }

void OpGpt::Keep(const Act& r, std::initializer_list<Buf*> from) {
  for (Buf* b : from) {
    if (!b->data.empty() && r.data == b->data.data() && b != &d_.dres)
      std::swap(b->data, d_.dres.data);
  }
  dres_ = r;
  dres_.data = d_.dres.data.data();
  d_.dres.act = dres_;
}

Result<Act> OpGpt::LinearInput(const Edge& e, const Buf& kept, const Buf& source) {
  if (!Regather(e)) return kept.act;
  Act from = source.act;
  return Conv(from, e, &gather_);
}

Status OpGpt::LayerNormBackward(const LayerNormOp& ln, const Act& in,
                                const std::vector<float>& mean, const std::vector<float>& rstd,
                                int64_t w, int64_t bias, const Act& dy, const Edge& ln_edge,
                                const Edge& add_edge) {
  // The layer norm and the add take the residual stream as it is: the input
  // gradient accumulates straight into dres_ (llm.c's fusion: no
  // conversion, no second pass).
  if (ln_edge.to == add_edge.to && ln_edge.from == ln_edge.to) {
    ln.Backward(ctx_, in, P(w), mean.data(), rstd.data(), dy, &dres_, G(w), G(bias),
                /*accumulate=*/true);
    return Status::Ok();
  }
  Act dln = New(&d_.d_ln_in, in.rows, in.cols, ln.info().inputs[0]);
  ln.Backward(ctx_, in, P(w), mean.data(), rstd.data(), dy, &dln, G(w), G(bias));
  if (ln_edge.to == add_edge.to) {  // one conversion served both consumers
    kernels::ResidualForward(dln.data, dln.data, dres_.data, ctx_.LocalSize(dln));
    ASSIGN_OR_RETURN(Act r, ConvGrad(dln, ln_edge, &d_.dres2));
    Keep(r, {&d_.dres2, &d_.d_ln_in});
    return Status::Ok();
  }
  // Each consumer's gradient back to the stream's placement, then summed.
  ASSIGN_OR_RETURN(Act from_add, ConvGrad(dres_, add_edge, &d_.tmp));
  ASSIGN_OR_RETURN(Act from_ln, ConvGrad(dln, ln_edge, &d_.d_add));
  Act sum = New(&d_.dres2, from_ln.rows, from_ln.cols, from_ln.place);
  kernels::ResidualForward(sum.data, from_ln.data, from_add.data, ctx_.LocalSize(sum));
  Keep(sum, {&d_.dres2});
  return Status::Ok();
}

Status OpGpt::BackwardStage(int slot, const float* dy, float dloss) {
  if (slot < 0 || slot >= slots()) {
    return InvalidArgumentError("GPT backward: slot " + std::to_string(slot) + " of " +
                                std::to_string(slots()));
  }
  Slot& a = slots_[slot];
  if (a.B == 0 || (stage_.last && !a.has_targets)) {
    return FailedPreconditionError("GPT backward needs a forward with targets first");
  }
  a.has_targets = false;  // the probabilities become the logits' gradient below
  const int T = a.T;
  const int64_t N = static_cast<int64_t>(a.B) * T, C = config_.embed, V = config_.vocab;
  if (stage_.last) {
    Act ce_in = a.ce_in.act;
    loss_.Backward(ctx_, ce_in, a.probs.data(), a.targets.data(), dloss, a.probs.data());
    Act dl{a.probs.data(), N, V, ce_e_.to};
    ASSIGN_OR_RETURN(Act dlog, ConvGrad(dl, ce_e_, &d_.dlogits));
    Act dh_in = New(&d_.dlnf, N, C, lm_head_.InputGradient());
    ASSIGN_OR_RETURN(Act lm_in, LinearInput(lm_e_, a.lm_in, a.hf));
    lm_head_.Backward(ctx_, lm_in, P(wte_), dlog, &dh_in,
                      ParamGrad(wte_, wte_numel_, wte_tp_sum_, lm_head_.info().rows_over_tp));
    ASSIGN_OR_RETURN(Act dh, ConvGrad(dh_in, lm_e_, &d_.dh));
    Act dx = New(&d_.dx_lnf, N, C, lnf_.info().inputs[0]);
    lnf_.Backward(ctx_, a.lnf_in.act, P(lnfw_), a.lnf_mean.data(), a.lnf_rstd.data(), dh, &dx,
                  G(lnfw_), G(lnfb_));
    ASSIGN_OR_RETURN(Act r, ConvGrad(dx, lnf_e_, &d_.dres2));
    Keep(r, {&d_.dres2, &d_.dx_lnf});
  } else {
    Act in = New(&d_.tmp, N, C, Placement{-1});
    std::copy(dy, dy + N * C, in.data);
    ASSIGN_OR_RETURN(Act r, ConvGrad(in, out_e_, &d_.dres2));
    Keep(r, {&d_.dres2, &d_.tmp});
  }
  for (size_t l = blocks_.size(); l-- > 0;) {
    const OpGpt::Block& b = blocks_[l];
    BlockActs* acts = &a.blocks[l];
    const float* att = acts->att.data.data();
    if (b.recompute == Recompute::kFull) {
      // The block again from its input, into the scratch activations.
      Act in = acts->input;
      RETURN_IF_ERROR(BlockForward(b, in, T, &scratch_, &scratch_att_, &scratch_y_));
      acts = &scratch_;
      att = scratch_att_.data.data();
    } else if (b.recompute == Recompute::kSelective) {
      // The attention core again (scores, softmax, weighted sum) and
      // c_proj's input from it.
      scratch_att_.data.resize(b.attn.AttSize(ctx_, N, T));
      Act y = New(&scratch_y_, N, C, b.attn.info().output);
      RETURN_IF_ERROR(b.attn.Forward(ctx_, acts->attn_in.act, T, scratch_att_.data.data(), &y));
      RETURN_IF_ERROR(Conv(y, b.e[3], &acts->proj_in).status());
      att = scratch_att_.data.data();
    }
    BlockActs& s = *acts;
    // add_2: both inputs' gradient is dres.
    Act dm_in = dres_;
    ASSIGN_OR_RETURN(Act dm, ConvGrad(dm_in, b.e[11], &d_.dm));
    Act dg_in = New(&d_.dg_in, N, 4 * C, b.fcproj.InputGradient());
    b.fcproj.Backward(ctx_, s.fcproj_in.act, P(b.fcprojw), dm, &dg_in, G(b.fcprojw), G(b.fcprojb));
    ASSIGN_OR_RETURN(Act dg, ConvGrad(dg_in, b.e[9], &d_.dg));
    Act df_in = New(&d_.df_in, N, 4 * C, b.gelu.info().inputs[0]);
    b.gelu.Backward(ctx_, s.gelu_in.act, dg, &df_in);
    ASSIGN_OR_RETURN(Act df, ConvGrad(df_in, b.e[8], &d_.df));
    Act dh_in = New(&d_.dh_in, N, C, b.fc.InputGradient());
    ASSIGN_OR_RETURN(Act fc_in, LinearInput(b.e[7], s.fc_in, s.h2));
    b.fc.Backward(ctx_, fc_in, P(b.fcw), df, &dh_in, G(b.fcw), G(b.fcb));
    ASSIGN_OR_RETURN(Act dh, ConvGrad(dh_in, b.e[7], &d_.dh));
    RETURN_IF_ERROR(LayerNormBackward(b.ln2, s.ln2_in.act, s.ln2_mean, s.ln2_rstd, b.ln2w, b.ln2b,
                                      dh, b.e[6], b.e[10]));
    // add_1, then the attention half.
    Act da_in = dres_;
    ASSIGN_OR_RETURN(Act da, ConvGrad(da_in, b.e[5], &d_.dm));
    Act dy_in = New(&d_.dy, N, C, b.proj.InputGradient());
    b.proj.Backward(ctx_, s.proj_in.act, P(b.projw), da, &dy_in, G(b.projw), G(b.projb));
    ASSIGN_OR_RETURN(Act dyv, ConvGrad(dy_in, b.e[3], &d_.dattn_y));
    Act dqkv_in = New(&d_.dqkv_in, N, 3 * C, b.attn.info().inputs[0]);
    b.attn.Backward(ctx_, s.attn_in.act, att, T, dyv, &dqkv_in);
    ASSIGN_OR_RETURN(Act dqkv, ConvGrad(dqkv_in, b.e[2], &d_.dqkv));
    Act dh1_in = New(&d_.dh_in, N, C, b.qkv.InputGradient());
    ASSIGN_OR_RETURN(Act qkv_in, LinearInput(b.e[1], s.qkv_in, s.h1));
    b.qkv.Backward(ctx_, qkv_in, P(b.qkvw), dqkv, &dh1_in, G(b.qkvw), G(b.qkvb));
    ASSIGN_OR_RETURN(Act dh1, ConvGrad(dh1_in, b.e[1], &d_.dh));
    RETURN_IF_ERROR(LayerNormBackward(b.ln1, s.ln1_in.act, s.ln1_mean, s.ln1_rstd, b.ln1w, b.ln1b,
                                      dh1, b.e[0], b.e[4]));
  }
  if (stage_.first) {
    embedding_.Backward(ctx_, a.tokens.data(), T, dres_,
                        ParamGrad(wte_, wte_numel_, wte_tp_sum_, embedding_.info().rows_over_tp),
                        G(wpe_));
  } else {
    input_grad_.assign(dres_.data, dres_.data + N * C);  // placed whole: the stage input's
  }
  return Status::Ok();
}

Status OpGpt::ReduceParamGradients() {
  if (tp_sums_.empty()) return Status::Ok();
  int64_t n = 0;
  for (const auto& [off, count] : tp_sums_) n += count;
  sum_buf_.resize(n);
  float* out = sum_buf_.data();
  for (const auto& [off, count] : tp_sums_) out = std::copy(G(off), G(off) + count, out);
  RETURN_IF_ERROR(ctx_.AllReduce(sum_buf_.data(), n, DType::kF32, ReduceOp::kSum));
  const float* in = sum_buf_.data();
  for (const auto& [off, count] : tp_sums_) {
    std::copy(in, in + count, G(off));
    in += count;
  }
  return Status::Ok();
}

std::string OpGpt::Describe(int64_t rows) const {
  const OpContext ctx(stage_.tp, 0);  // planning: collectives and sizes only
  std::string out;
  auto op = [&](const OpInfo& i) {
    std::string ins;
    for (const Placement& p : i.inputs) ins += (ins.empty() ? "" : ", ") + p.ToString();
    out += "  " + i.name + " [" + i.kind + "] " + i.strategy.ToString() +
           "  in: " + (ins.empty() ? "tokens" : ins) + "  out: " + i.output.ToString() + "\n";
  };
  auto edge = [&](const Edge& e) {
    const OpContext::Redistribution f = ctx.Plan(e.from, e.to, rows, e.cols);
    const OpContext::Redistribution b = ctx.Plan(e.grad, e.from.Resolved(), rows, e.cols);
    if (!f.collective.empty()) {
      out += "    forward  " + e.label + ": " + f.collective + ", " + HumanBytes(f.bytes) + " (" +
             e.from.ToString() + " -> " + e.to.ToString() + ")\n";
    }
    if (!b.collective.empty()) {
      out += "    backward " + e.label + ": " + b.collective + ", " + HumanBytes(b.bytes) + " (" +
             e.grad.ToString() + " -> " + e.from.Resolved().ToString() + ")\n";
    }
  };
  if (stage_.first) op(embedding_.info());
  for (const OpGpt::Block& b : blocks_) {
    const OpInfo* ops[] = {&b.ln1.info(),    &b.qkv.info(), &b.attn.info(), &b.proj.info(),
                           &b.add1.info(),   &b.ln2.info(), &b.fc.info(),   &b.gelu.info(),
                           &b.fcproj.info(), &b.add2.info()};
    // Each operator, then the edges into it.
    const int into[10][2] = {{0, -1}, {1, -1}, {2, -1}, {3, -1}, {4, 5},
                             {6, -1}, {7, -1}, {8, -1}, {9, -1}, {10, 11}};
    if (b.recompute != Recompute::kNone) {
      out += "  h." + std::to_string(b.layer) + ": recompute " +
             std::string(RecomputeName(b.recompute)) + "\n";
    }
    for (int i = 0; i < 10; ++i) {
      for (int e : into[i]) {
        if (e < 0) continue;
        if ((e == 4 && b.e[4].to == b.e[0].to) || (e == 10 && b.e[10].to == b.e[6].to)) continue;
        edge(b.e[e]);
      }
      op(*ops[i]);
    }
  }
  if (stage_.last) {
    edge(lnf_e_);
    op(lnf_.info());
    edge(lm_e_);
    op(lm_head_.info());
    edge(ce_e_);
    op(loss_.info());
  } else {
    edge(out_e_);
  }
  return out;
}

}  // namespace tessera

namespace tessera {

int64_t StageWork::shared_bytes() const {
  int64_t n = 0;
  for (int64_t b : shared) n += b;
  return n;
}

void StageWork::Add(const StageWork& o) { AddTimes(o, 1); }

void StageWork::AddTimes(const StageWork& o, int64_t n) {
  if (n <= 0) return;
  flops += o.flops * n;
  bytes += o.bytes * n;
  for (int k = 0; k < kKernelCount; ++k) kernel[k] += o.kernel[k] * n;
  for (int k = 0; k < 4; ++k) {
    comm_count[k] += o.comm_count[k] * static_cast<int>(n);
    comm_bytes[k] += o.comm_bytes[k] * n;
  }
  slot_bytes += o.slot_bytes * n;
  for (int i = 0; i < kSharedCount; ++i) shared[i] = std::max(shared[i], o.shared[i]);
  tp_sum_floats += o.tp_sum_floats * n;
}

namespace {

// Sizes and collectives of placements on tp rank 0 (the largest shard).
struct Sizer {
  int tp = 1;
  int64_t Rows(const Placement& p, int64_t rows) const {
    return p.split == 0 && tp > 1 ? (rows + tp - 1) / tp : rows;
  }
  int64_t Cols(const Placement& p, int64_t cols) const {
    if (p.split != 1 || tp == 1) return cols;
    const int64_t g = p.groups;
    return g * ((cols / g + tp - 1) / tp);
  }
  // Bytes of a shard.
  int64_t Local(const Placement& p, int64_t rows, int64_t cols) const {
    return Rows(p, rows) * Cols(p, cols) * 4;
  }
  // Its elements (a kernel's units).
  double Elements(const Placement& p, int64_t rows, int64_t cols) const {
    return static_cast<double>(Rows(p, rows)) * Cols(p, cols);
  }
  // What Convert allocates for from -> to: a new shard unless `from`
  // already is `to` (a lone AllReduce resolves in place).
  int64_t Storage(const Placement& from, const Placement& to, int64_t rows, int64_t cols) const {
    return tp > 1 && from.Resolved() != to ? Local(to, rows, cols) : 0;
  }
  // The collectives of from -> to, counted into `w`.
  void Comm(const Placement& from, const Placement& to, int64_t rows, int64_t cols,
            StageWork* w) const {
    if (tp == 1) return;
    const double whole = static_cast<double>(rows) * cols * 4;
    for (RedistStep s : PlanSteps(from, to, rows, tp)) {
      int k = -1;
      double b = 0;
      switch (s) {
        case RedistStep::kAllReduce:
          k = 0;
          b = from.split == -1 ? whole : whole / tp;
          break;
        case RedistStep::kReduceScatter:
          k = 1;
          b = whole;
          break;
        case RedistStep::kAllGather:
          k = 2;
          b = whole;
          break;
        case RedistStep::kRedistribute:
          // An all-to-all, with the shard copied into a DTensor, packed,
          // unpacked and copied out (OpContext::Convert): each read and
          // written twice on either side.
          k = 3;
          b = whole / tp;
          w->bytes += 4.0 * (Local(from, rows, cols) + Local(to, rows, cols));
          break;
        case RedistStep::kSlice:
          w->bytes += 2.0 * Local(to, rows, cols);
          break;
      }
      if (k >= 0) {
        ++w->comm_count[k];
        w->comm_bytes[k] += b;
      }
    }
  }
  // Forward and backward of an edge (the backward converts the consumer's
  // input gradient `grad` back to the producer's placement).
  void Edge(const Placement& from, const Placement& to, const Placement& grad, int64_t rows,
            int64_t cols, StageWork* w, bool forward = true, bool backward = true) const {
    if (forward) Comm(from, to, rows, cols, w);
    if (backward) Comm(grad, from.Resolved(), rows, cols, w);
  }
  // A linear's forward flops: rows x its input's columns x its output's.
  double LinearFlops(const OpInfo& op, int64_t rows, int64_t k, int64_t m) const {
    return 2.0 * Rows(op.output, rows) * Cols(op.inputs[0], k) * Cols(op.output, m);
  }
};

constexpr int K(Kernel k) { return static_cast<int>(k); }

void Grow(StageWork* w, StageWork::Shared id, int64_t bytes) {
  w->shared[id] = std::max(w->shared[id], bytes);
}

// The work `now` holds beyond `before`: flops, bytes and collectives (what
// an operator adds to a half, for the per-operator breakdown).
StageWork Since(const StageWork& now, const StageWork& before) {
  StageWork d;
  d.flops = now.flops - before.flops;
  d.bytes = now.bytes - before.bytes;
  for (int k = 0; k < kKernelCount; ++k) d.kernel[k] = now.kernel[k] - before.kernel[k];
  for (int k = 0; k < 4; ++k) {
    d.comm_count[k] = now.comm_count[k] - before.comm_count[k];
    d.comm_bytes[k] = now.comm_bytes[k] - before.comm_bytes[k];
  }
  return d;
}

// Floats of a linear's weight and bias held on one rank.
int64_t LinearParams(const LinearOp& op, int64_t K, int64_t M, int tp) {
  const int s = tp > 1 ? op.weight_split() : -1;
  const int64_t w = s == 0 ? (K + tp - 1) / tp * M : s == 1 ? K * ((M + tp - 1) / tp) : K * M;
  return w + (s == 1 ? (M + tp - 1) / tp : M);
}

}  // namespace

OpGpt::HalfWork OpGpt::EstimateHalf(const GptConfig& config, int tp, const HalfOps& h, Placement x,
                                    int64_t N, int T, Recompute rc, bool shares) {
  const Sizer z{tp};
  const int64_t C = config.embed;
  const bool attention = h.attn != nullptr;
  const int64_t mid = attention ? 3 * C : 4 * C;  // the first linear's output columns
  const int64_t k2 = attention ? C : 4 * C;       // the second linear's input columns
  const OpInfo& mid_info = attention ? h.attn->info() : h.gelu->info();
  const OpInfo &ln = h.ln->info(), &in = h.in->info(), &out = h.out->info(), &add = h.add->info();
  HalfWork r;
  StageWork& fw = r.forward;  // its activations are the slot's (or the scratch's)
  StageWork& w = r.backward;  // and what recompute does again
  // Each operator's share (with the conversions into it and their duals):
  // what fw and w gained since the last mark.
  StageWork seen, seen_fw;
  auto mark = [&](int op) {
    if (!shares) return;
    StageWork both = fw;
    both.Add(w);
    r.ops[op].Add(Since(both, seen));  // Since fills flops, bytes and collectives only
    r.forward_ops[op].Add(Since(fw, seen_fw));
    seen = both;
    seen_fw = fw;
  };
  auto linear = [&](const LinearOp& op, int64_t K, int64_t M) {
    const double f = z.LinearFlops(op.info(), N, K, M);
    fw.flops += f;
    w.flops += 2 * f;
    if (op.info().rows_over_tp && tp > 1) w.tp_sum_floats += LinearParams(op, K, M, tp);
  };
  // x -> ln
  fw.slot_bytes += z.Storage(x, ln.inputs[0], N, C);
  z.Comm(x, ln.inputs[0], N, C, &fw);
  fw.slot_bytes += z.Local(ln.output, N, C) + 2 * 4 * z.Rows(ln.output, N);
  fw.kernel[K(Kernel::kLayerNormForward)] += z.Elements(ln.inputs[0], N, C);
  w.kernel[K(Kernel::kLayerNormBackward)] += z.Elements(ln.inputs[0], N, C);
  if (ln.rows_over_tp && tp > 1) w.tp_sum_floats += 2 * C;
  mark(0);
  // ln -> the first linear
  z.Comm(ln.output, in.inputs[0], N, C, &fw);
  if (Regathers(ln.output, in.inputs[0])) {
    Grow(&fw, StageWork::kGather, z.Local(in.inputs[0], N, C));
    z.Comm(ln.output, in.inputs[0], N, C, &w);
  } else {
    fw.slot_bytes += z.Storage(ln.output, in.inputs[0], N, C);
  }
  linear(*h.in, C, mid);
  fw.slot_bytes += z.Local(in.output, N, mid);
  mark(1);
  // -> the middle operator
  fw.slot_bytes += z.Storage(in.output, mid_info.inputs[0], N, mid);
  z.Comm(in.output, mid_info.inputs[0], N, mid, &fw);
  if (attention) {
    // The attention core: what selective recompute runs again, with the
    // conversion of its output for c_proj.
    StageWork core;
    const Placement qkv = mid_info.inputs[0];
    const int64_t seqs = z.Rows(qkv, N) / T;
    const int64_t heads = qkv.split == 1 && tp > 1 ? config.heads / tp : config.heads;
    const int64_t hs = C / config.heads;
    const double scores = static_cast<double>(seqs) * heads * kernels::AttentionScores(T);
    core.kernel[K(Kernel::kAttentionForwardScores)] += scores;
    core.kernel[K(Kernel::kAttentionForwardProducts)] += 2.0 * scores * hs;
    const int64_t att = seqs * heads * T * T * 4, y = z.Local(mid_info.output, N, C);
    if (rc == Recompute::kNone) {
      core.slot_bytes += att + y;
    } else {
      Grow(&core, StageWork::kScratchAtt, att);
      Grow(&core, StageWork::kScratchY, y);
    }
    z.Comm(mid_info.output, out.inputs[0], N, C, &core);
    w.kernel[K(Kernel::kAttentionBackwardScores)] += scores;
    w.kernel[K(Kernel::kAttentionBackwardProducts)] += 4.0 * scores * hs;
    fw.Add(core);
    if (rc == Recompute::kSelective) {
      core.slot_bytes = 0;
      w.Add(core);
    }
  } else {
    fw.slot_bytes += z.Local(mid_info.output, N, 4 * C);
    fw.kernel[K(Kernel::kGeluForward)] += z.Elements(mid_info.output, N, 4 * C);
    w.kernel[K(Kernel::kGeluBackward)] += z.Elements(mid_info.output, N, 4 * C);
    z.Comm(mid_info.output, out.inputs[0], N, k2, &fw);
  }
  mark(2);
  // -> the second linear, its output transient
  fw.slot_bytes += z.Storage(mid_info.output, out.inputs[0], N, k2);
  linear(*h.out, k2, C);
  Grow(&fw, StageWork::kOutTmp, z.Local(out.output, N, C));
  mark(3);
  // add(x, out): x converted unless the layer norm's conversion serves
  if (add.inputs[0] != ln.inputs[0]) {
    fw.slot_bytes += z.Storage(x, add.inputs[0], N, C);
    z.Comm(x, add.inputs[0], N, C, &fw);
  }
  Grow(&fw, StageWork::kConvTmp, z.Storage(out.output, add.inputs[1], N, C));
  z.Comm(out.output, add.inputs[1], N, C, &fw);
  fw.slot_bytes += z.Local(add.output, N, C);
  fw.kernel[K(Kernel::kResidualAdd)] += z.Elements(add.output, N, C);
  mark(4);

  // Backward: each edge's dual, into the shared gradient buffers.
  auto grad = [&](const Placement& from, const Placement& g, int64_t cols, StageWork::Shared id) {
    Grow(&w, id, z.Storage(g, from.Resolved(), N, cols));
    z.Comm(g, from.Resolved(), N, cols, &w);
  };
  Grow(&w, StageWork::kDres, z.Local(x.Resolved(), N, C));
  grad(out.output, add.inputs[1], C, StageWork::kDm);
  mark(4);
  Grow(&w, attention ? StageWork::kDy : StageWork::kDgIn, z.Local(h.out->InputGradient(), N, k2));
  grad(mid_info.output, h.out->InputGradient(), k2,
       attention ? StageWork::kDattnY : StageWork::kDg);
  mark(3);
  Grow(&w, attention ? StageWork::kDqkvIn : StageWork::kDfIn, z.Local(mid_info.inputs[0], N, mid));
  grad(in.output, mid_info.inputs[0], mid, attention ? StageWork::kDqkv : StageWork::kDf);
  mark(2);
  Grow(&w, StageWork::kDhIn, z.Local(h.in->InputGradient(), N, C));
  grad(ln.output, h.in->InputGradient(), C, StageWork::kDh);
  mark(1);
  // The layer norm's and the add's gradients of the stream (LayerNormBackward).
  if (!(ln.inputs[0] == add.inputs[0] && x == ln.inputs[0])) {
    // Not fused: the layer norm's gradient into a zeroed buffer, summed
    // with the add's by a residual add (before or after the conversions).
    Grow(&w, StageWork::kDLnIn, z.Local(ln.inputs[0], N, C));
    w.bytes += z.Local(ln.inputs[0], N, C);
    if (ln.inputs[0] == add.inputs[0]) {
      w.kernel[K(Kernel::kResidualAdd)] += z.Elements(ln.inputs[0], N, C);
      grad(x, ln.inputs[0], C, StageWork::kDres2);
    } else {
      grad(x, add.inputs[0], C, StageWork::kTmp);
      grad(x, ln.inputs[0], C, StageWork::kDAdd);
      Grow(&w, StageWork::kDres2, z.Local(x.Resolved(), N, C));
      w.kernel[K(Kernel::kResidualAdd)] += z.Elements(x.Resolved(), N, C);
    }
  }
  mark(0);
  return r;
}

StageWork OpGpt::EstimateBlock(const HalfWork& attention, const HalfWork& mlp, Recompute rc,
                               int64_t out_bytes) {
  StageWork r;
  r.Add(attention.forward);
  r.Add(mlp.forward);
  if (rc == Recompute::kFull) {
    // The forward's activations live in the shared scratch block; the slot
    // keeps the block's output. The forward runs again in backward.
    const int64_t block = r.slot_bytes;
    r.Add(attention.forward);
    r.Add(mlp.forward);
    r.slot_bytes = out_bytes;
    r.bytes += 2.0 * static_cast<double>(out_bytes);  // the output copied out of the scratch
    Grow(&r, StageWork::kScratchBlock, block);
  }
  r.Add(attention.backward);
  r.Add(mlp.backward);
  return r;
}

StageWork OpGpt::BlockWork(const Block& b, Placement x, int64_t N, int T) const {
  const HalfWork h1 =
      EstimateHalf(config_, stage_.tp, {&b.ln1, &b.qkv, &b.attn, nullptr, &b.proj, &b.add1}, x, N,
                   T, b.recompute);
  const HalfWork h2 =
      EstimateHalf(config_, stage_.tp, {&b.ln2, &b.fc, nullptr, &b.gelu, &b.fcproj, &b.add2},
                   b.add1.info().output, N, T, b.recompute);
  return EstimateBlock(h1, h2, b.recompute,
                       Sizer{stage_.tp}.Local(b.add2.info().output, N, config_.embed));
}

StageWork OpGpt::EstimateInput(const GptConfig& config, int tp, const EmbeddingOp* embedding,
                               int64_t N) {
  const Sizer z{tp};
  const int64_t C = config.embed, V = config.vocab;
  StageWork e;
  if (embedding == nullptr) {  // the previous stage's output, whole
    e.slot_bytes += N * C * 4;
    Grow(&e, StageWork::kInputGrad, N * C * 4);
    e.bytes += 2.0 * 2 * N * C * 4;  // copied in, and its gradient out
    return e;
  }
  const Placement x = embedding->info().output;
  e.slot_bytes += z.Local(x, N, C) + N * 4;  // x0, tokens
  e.kernel[K(Kernel::kEmbeddingForward)] += z.Elements(x, N, C);
  e.kernel[K(Kernel::kEmbeddingBackward)] += z.Elements(x, N, C);
  if (embedding->info().rows_over_tp && tp > 1) {
    const int s = embedding->weight_split();
    e.tp_sum_floats += config.context * C +  // wpe, and wte
                       (s == 0   ? (V + tp - 1) / tp * C
                        : s == 1 ? V * ((C + tp - 1) / tp)
                                 : V * C);
  }
  return e;
}

StageWork OpGpt::EstimateOutput(const GptConfig& config, int tp, Placement x, const HeadOps* head,
                                int64_t N, bool wte_summed, StageWork* parts) {
  const Sizer z{tp};
  const int64_t C = config.embed, V = config.vocab;
  StageWork e;
  const Placement whole{-1};
  if (head == nullptr) {  // to the next stage, whole
    e.slot_bytes += z.Storage(x, whole, N, C);
    z.Edge(x, whole, whole, N, C, &e);
    Grow(&e, StageWork::kTmp, N * C * 4);
    e.bytes += 2.0 * N * C * 4;  // the next stage's gradient copied in
    Grow(&e, StageWork::kDres2, z.Storage(whole, x.Resolved(), N, C));
    return e;
  }
  const OpInfo &lnf = head->lnf->info(), &lm = head->lm_head->info(), &loss = head->loss->info();
  e.slot_bytes += N * 4;  // targets
  e.slot_bytes += z.Storage(x, lnf.inputs[0], N, C);
  z.Edge(x, lnf.inputs[0], lnf.inputs[0], N, C, &e);
  e.slot_bytes += z.Local(lnf.output, N, C) + 2 * 4 * z.Rows(lnf.output, N);
  e.kernel[K(Kernel::kLayerNormForward)] += z.Elements(lnf.inputs[0], N, C);
  e.kernel[K(Kernel::kLayerNormBackward)] += z.Elements(lnf.inputs[0], N, C);
  e.bytes += z.Local(lnf.inputs[0], N, C);  // its input gradient zeroed first
  if (lnf.rows_over_tp && tp > 1) e.tp_sum_floats += 2 * C;
  StageWork seen;
  auto mark = [&](int op) {
    if (parts != nullptr) parts[op] = Since(e, seen);
    seen = e;
  };
  mark(0);
  const Placement lm_grad = head->lm_head->InputGradient();
  z.Edge(lnf.output, lm.inputs[0], lm_grad, N, C, &e);
  if (Regathers(lnf.output, lm.inputs[0])) {
    Grow(&e, StageWork::kGather, z.Local(lm.inputs[0], N, C));
    z.Comm(lnf.output, lm.inputs[0], N, C, &e);
  } else {
    e.slot_bytes += z.Storage(lnf.output, lm.inputs[0], N, C);
  }
  e.flops += 3 * z.LinearFlops(lm, N, C, V);
  mark(1);
  const Placement ce = loss.inputs[0];
  e.slot_bytes += z.Local(lm.output, N, V) + z.Storage(lm.output, ce, N, V);
  e.slot_bytes += z.Local(ce, N, V);         // probabilities
  e.slot_bytes += z.Rows(ce, N) * (4 + 16);  // the loss's max and sums
  z.Edge(lm.output, ce, ce, N, V, &e);
  e.kernel[K(Kernel::kCrossEntropyForward)] += z.Elements(ce, N, V);
  e.kernel[K(Kernel::kCrossEntropyBackward)] += z.Elements(ce, N, V);
  mark(2);
  Grow(&e, StageWork::kDlogits, z.Storage(ce, lm.output.Resolved(), N, V));
  Grow(&e, StageWork::kDlnf, z.Local(lm_grad, N, C));
  Grow(&e, StageWork::kDh, z.Storage(lm_grad, lnf.output.Resolved(), N, C));
  Grow(&e, StageWork::kDxLnf, z.Local(lnf.inputs[0], N, C));
  Grow(&e, StageWork::kDres2, z.Storage(lnf.inputs[0], x.Resolved(), N, C));
  if (lm.rows_over_tp && tp > 1 && !wte_summed) {
    const int s = head->lm_head->weight_split();
    e.tp_sum_floats += s == 0 ? (V + tp - 1) / tp * C : s == 1 ? V * ((C + tp - 1) / tp) : V * C;
  }
  return e;
}

std::vector<std::pair<std::string, StageWork>> OpGpt::EstimateOps(int64_t N, int T) const {
  std::vector<std::pair<std::string, StageWork>> out;
  const int tp = stage_.tp;
  if (stage_.first) out.emplace_back("embedding", EstimateInput(config_, tp, &embedding_, N));
  Placement x = stream_in_;
  if (!blocks_.empty()) {
    // A block entered from another (the second, when the stage has two).
    const Block& b = blocks_.size() > 1 ? blocks_[1] : blocks_[0];
    if (blocks_.size() > 1) x = blocks_[0].add2.info().output;
    const HalfWork h1 = EstimateHalf(
        config_, tp, {&b.ln1, &b.qkv, &b.attn, nullptr, &b.proj, &b.add1}, x, N, T, b.recompute);
    const HalfWork h2 =
        EstimateHalf(config_, tp, {&b.ln2, &b.fc, nullptr, &b.gelu, &b.fcproj, &b.add2},
                     b.add1.info().output, N, T, b.recompute);
    const char* names[10] = {"ln_1", "attn.c_attn", "attn.attention", "attn.c_proj", "add_1",
                             "ln_2", "mlp.c_fc",    "mlp.gelu",       "mlp.c_proj",  "add_2"};
    const std::string p = BlockPrefix(b.layer);
    for (int i = 0; i < 10; ++i) {
      StageWork share = i < 5 ? h1.ops[i] : h2.ops[i - 5];
      // Full recompute runs each operator's forward again in backward (and
      // copies the block's output out of the scratch: add_2's share).
      if (b.recompute == Recompute::kFull) {
        share.Add(i < 5 ? h1.forward_ops[i] : h2.forward_ops[i - 5]);
        if (i == 9) share.bytes += 2.0 * Sizer{tp}.Local(b.add2.info().output, N, config_.embed);
      }
      out.emplace_back(p + names[i], share);
    }
    x = blocks_.back().add2.info().output;
  }
  if (stage_.last) {
    StageWork parts[3];
    const HeadOps head{&lnf_, &lm_head_, &loss_};
    EstimateOutput(config_, tp, x, &head, N, stage_.first && embedding_.info().rows_over_tp, parts);
    out.emplace_back("ln_f", parts[0]);
    out.emplace_back("lm_head", parts[1]);
    out.emplace_back("loss", parts[2]);
  } else {
    out.emplace_back("to the next stage", EstimateOutput(config_, tp, x, nullptr, N, false));
  }
  return out;
}

StageWork OpGpt::Estimate(int64_t N, int T, std::vector<StageWork>* per_block,
                          StageWork* ends) const {
  const int tp = stage_.tp;
  StageWork e = EstimateInput(config_, tp, stage_.first ? &embedding_ : nullptr, N);
  Placement x = stream_in_;
  StageWork total;
  if (per_block != nullptr) per_block->clear();
  for (const Block& b : blocks_) {
    const StageWork bw = BlockWork(b, x, N, T);
    if (per_block != nullptr) per_block->push_back(bw);
    total.Add(bw);
    x = b.add2.info().output;
  }
  const HeadOps head{&lnf_, &lm_head_, &loss_};
  e.Add(EstimateOutput(config_, tp, x, stage_.last ? &head : nullptr, N,
                       stage_.first && embedding_.info().rows_over_tp));
  if (ends != nullptr) *ends = e;
  total.Add(e);
  return total;
}

}  // namespace tessera
