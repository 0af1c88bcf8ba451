#include "runtime/model/op_gpt.h"

#include <algorithm>
#include <cstring>

#include "core/byte_size.h"
#include "runtime/kernels.h"

namespace tessera {
namespace {

std::string BlockPrefix(int i) { return "h." + std::to_string(i) + "."; }

}  // namespace

Status OpGpt::Bind(Gpt* model, Communicator* tp) {
  if (tp != nullptr && (tp->size() != graph_.stage.tp || tp->rank() != graph_.stage.tp_rank)) {
    return InvalidArgumentError("GPT operators: the tp communicator must have " +
                                std::to_string(graph_.stage.tp) + " ranks with this one as rank " +
                                std::to_string(graph_.stage.tp_rank));
  }
  if (tp == nullptr && graph_.stage.tp != 1)
    return InvalidArgumentError("GPT operators: tp > 1 needs a communicator");
  model_ = model;
  ctx_ = OpContext(tp);
  auto offset = [&](const std::string& name) -> Result<int64_t> {
    const ParamInfo* p = model->FindParam(name);
    if (p == nullptr)
      return InternalError("GPT operators: the model has no parameter '" + name + "'");
    auto it = graph_.param_splits.find(name);
    if (it == graph_.param_splits.end() || it->second != p->tp_dim) {
      return InternalError("GPT operators: parameter '" + name +
                           "' is not cut as the strategy says");
    }
    return p->offset;
  };
  tp_sums_.clear();
  auto sum = [&](int64_t off, const std::string& name) {
    tp_sums_.emplace_back(off, model->FindParam(name)->numel);
  };
  const int first = graph_.stage.first_layer;
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
  if (graph_.stage.first) {
    ASSIGN_OR_RETURN(wte_, offset("wte"));
    ASSIGN_OR_RETURN(wpe_, offset("wpe"));
    if (graph_.embedding.info().rows_over_tp && ctx_.tp() > 1) {
      wte_tp_sum_ = true;
      sum(wpe_, "wpe");
    }
  }
  if (graph_.stage.last) {
    ASSIGN_OR_RETURN(wte_, offset("wte"));
    ASSIGN_OR_RETURN(lnfw_, offset("ln_f.weight"));
    ASSIGN_OR_RETURN(lnfb_, offset("ln_f.bias"));
    if (graph_.lnf.info().rows_over_tp && ctx_.tp() > 1) {
      sum(lnfw_, "ln_f.weight");
      sum(lnfb_, "ln_f.bias");
    }
    if (graph_.lm_head.info().rows_over_tp && ctx_.tp() > 1) wte_tp_sum_ = true;
  }
  if (wte_tp_sum_) sum(wte_, "wte");
  const ParamInfo* wte = model->FindParam("wte");
  wte_numel_ = wte != nullptr ? wte->numel : 0;
  return Status::Ok();
}

void OpGpt::SetSlots(int n) { slots_.resize(std::max(1, n)); }

Result<std::unique_ptr<OpGpt>> OpGpt::Create(const GptConfig& config,
                                             const std::map<std::string, OpStrategy>& strategies,
                                             const GptStage& stage, int dp) {
  ASSIGN_OR_RETURN(GptGraph graph, GptGraph::Create(config, strategies, stage, dp));
  return FromGraph(std::move(graph));
}

std::unique_ptr<OpGpt> OpGpt::FromGraph(GptGraph graph) {
  std::unique_ptr<OpGpt> g(new OpGpt());
  g->graph_ = std::move(graph);
  for (const GptGraph::Block& b : g->graph_.blocks) {
    g->blocks_.emplace_back();
    static_cast<GptGraph::Block&>(g->blocks_.back()) = b;
  }
  return g;
}

void OpGpt::SetRecompute(int layer, Recompute mode) {
  graph_.SetRecompute(layer, mode);
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
  return static_cast<int64_t>(sum_buf_.capacity() * sizeof(float)) + ctx_.CpBufferBytes();
}

Act OpGpt::New(Buf* b, int64_t rows, int64_t cols, Placement p) {
  b->act = Act{nullptr, rows, cols, p};
  b->data.resize(ctx_.LocalSize(b->act));
  b->act.data = b->data.data();
  return b->act;
}

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
  const int64_t N = x.rows, C = graph_.config.embed;
  BlockActs& s = *acts;
  ASSIGN_OR_RETURN(Act ln_in, Conv(x, b.e[0], &s.ln1_in));
  Act h1 = New(&s.h1, N, C, b.ln1.info().output);
  s.ln1_mean.resize(ctx_.LocalRows(h1));
  s.ln1_rstd.resize(ctx_.LocalRows(h1));
  b.ln1.Forward(ctx_, ln_in, P(b.ln1w), P(b.ln1b), &h1, s.ln1_mean.data(), s.ln1_rstd.data());
  // A linear's input that a conversion gathers is not kept: backward
  // gathers it again from the shard (Megatron's sequence parallelism).
  ASSIGN_OR_RETURN(Act qkv_in, Conv(h1, b.e[1], Regathers(b.e[1]) ? &gather_ : &s.qkv_in));
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
  ASSIGN_OR_RETURN(Act fc_in, Conv(h2, b.e[7], Regathers(b.e[7]) ? &gather_ : &s.fc_in));
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
  RETURN_IF_ERROR(
      CheckStageBatch(graph_.config, graph_.stage, slot, slots(), tokens, targets, B, T));
  const int64_t N = static_cast<int64_t>(B) * T, C = graph_.config.embed, V = graph_.config.vocab;
  const bool check_targets = graph_.stage.last && targets != nullptr;
  Slot& a = slots_[slot];
  a.B = B;
  a.T = T;
  a.blocks.resize(blocks_.size());
  if (graph_.stage.first) a.tokens.assign(tokens, tokens + N);
  a.has_targets = check_targets;
  if (a.has_targets) a.targets.assign(targets, targets + N);

  Act x = New(&a.x0, N, C, graph_.stream_in);
  if (graph_.stage.first) {
    RETURN_IF_ERROR(model_->NeedWeights(0));
    graph_.embedding.Forward(ctx_, a.tokens.data(), T, P(wte_), P(wpe_), &x);
  } else {
    std::copy(x_in, x_in + N * C, x.data);
  }
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const OpGpt::Block& b = blocks_[l];
    BlockActs& s = a.blocks[l];
    RETURN_IF_ERROR(model_->NeedWeights(static_cast<int>(l) + 1));
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
  if (!graph_.stage.last) {
    RETURN_IF_ERROR(Conv(x, graph_.out_e, &a.out).status());
    return 0.0f;
  }
  RETURN_IF_ERROR(model_->NeedWeights(0));
  ASSIGN_OR_RETURN(Act lnf_in, Conv(x, graph_.lnf_e, &a.lnf_in));
  Act hf = New(&a.hf, N, C, graph_.lnf.info().output);
  a.lnf_mean.resize(ctx_.LocalRows(hf));
  a.lnf_rstd.resize(ctx_.LocalRows(hf));
  graph_.lnf.Forward(ctx_, lnf_in, P(lnfw_), P(lnfb_), &hf, a.lnf_mean.data(), a.lnf_rstd.data());
  ASSIGN_OR_RETURN(Act lm_in, Conv(hf, graph_.lm_e, Regathers(graph_.lm_e) ? &gather_ : &a.lm_in));
  Act logits = New(&a.logits, N, V, graph_.lm_head.info().output);
  graph_.lm_head.Forward(ctx_, lm_in, P(wte_), &logits);
  if (!a.has_targets) return 0.0f;
  ASSIGN_OR_RETURN(Act ce_in, Conv(logits, graph_.ce_e, &a.ce_in));
  a.probs.resize(ctx_.LocalSize(ce_in));
  ASSIGN_OR_RETURN(const double loss, graph_.loss.Forward(ctx_, ce_in, a.targets.data(),
                                                          a.probs.data(), &a.max, &a.sums));
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
  if (!Regathers(e)) return kept.act;
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
  if (a.B == 0 || (graph_.stage.last && !a.has_targets)) {
    return FailedPreconditionError("GPT backward needs a forward with targets first");
  }
  a.has_targets = false;  // the probabilities become the logits' gradient below
  const int T = a.T;
  const int64_t N = static_cast<int64_t>(a.B) * T, C = graph_.config.embed, V = graph_.config.vocab;
  if (graph_.stage.last) {
    RETURN_IF_ERROR(model_->NeedWeights(0));
    Act ce_in = a.ce_in.act;
    graph_.loss.Backward(ctx_, ce_in, a.probs.data(), a.targets.data(), dloss, a.probs.data());
    Act dl{a.probs.data(), N, V, graph_.ce_e.to};
    ASSIGN_OR_RETURN(Act dlog, ConvGrad(dl, graph_.ce_e, &d_.dlogits));
    Act dh_in = New(&d_.dlnf, N, C, graph_.lm_head.InputGradient());
    ASSIGN_OR_RETURN(Act lm_in, LinearInput(graph_.lm_e, a.lm_in, a.hf));
    graph_.lm_head.Backward(
        ctx_, lm_in, P(wte_), dlog, &dh_in,
        ParamGrad(wte_, wte_numel_, wte_tp_sum_, graph_.lm_head.info().rows_over_tp));
    ASSIGN_OR_RETURN(Act dh, ConvGrad(dh_in, graph_.lm_e, &d_.dh));
    Act dx = New(&d_.dx_lnf, N, C, graph_.lnf.info().inputs[0]);
    graph_.lnf.Backward(ctx_, a.lnf_in.act, P(lnfw_), a.lnf_mean.data(), a.lnf_rstd.data(), dh, &dx,
                        G(lnfw_), G(lnfb_));
    ASSIGN_OR_RETURN(Act r, ConvGrad(dx, graph_.lnf_e, &d_.dres2));
    Keep(r, {&d_.dres2, &d_.dx_lnf});
  } else {
    Act in = New(&d_.tmp, N, C, Placement{-1});
    std::copy(dy, dy + N * C, in.data);
    ASSIGN_OR_RETURN(Act r, ConvGrad(in, graph_.out_e, &d_.dres2));
    Keep(r, {&d_.dres2, &d_.tmp});
  }
  for (size_t l = blocks_.size(); l-- > 0;) {
    const OpGpt::Block& b = blocks_[l];
    BlockActs* acts = &a.blocks[l];
    const float* att = acts->att.data.data();
    RETURN_IF_ERROR(model_->NeedWeights(static_cast<int>(l) + 1));
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
    RETURN_IF_ERROR(b.attn.Backward(ctx_, s.attn_in.act, att, T, dyv, &dqkv_in));
    ASSIGN_OR_RETURN(Act dqkv, ConvGrad(dqkv_in, b.e[2], &d_.dqkv));
    Act dh1_in = New(&d_.dh_in, N, C, b.qkv.InputGradient());
    ASSIGN_OR_RETURN(Act qkv_in, LinearInput(b.e[1], s.qkv_in, s.h1));
    b.qkv.Backward(ctx_, qkv_in, P(b.qkvw), dqkv, &dh1_in, G(b.qkvw), G(b.qkvb));
    ASSIGN_OR_RETURN(Act dh1, ConvGrad(dh1_in, b.e[1], &d_.dh));
    RETURN_IF_ERROR(LayerNormBackward(b.ln1, s.ln1_in.act, s.ln1_mean, s.ln1_rstd, b.ln1w, b.ln1b,
                                      dh1, b.e[0], b.e[4]));
  }
  if (graph_.stage.first) {
    RETURN_IF_ERROR(model_->NeedWeights(0));
    graph_.embedding.Backward(
        ctx_, a.tokens.data(), T, dres_,
        ParamGrad(wte_, wte_numel_, wte_tp_sum_, graph_.embedding.info().rows_over_tp), G(wpe_));
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

}  // namespace tessera
