#include "runtime/model/gpt_graph.h"

#include <algorithm>

#include "core/byte_size.h"

namespace tessera {

std::vector<OpSignature> GptGraph::Signatures(const GptConfig& config) {
  std::vector<OpSignature> ops;
  for (const GptOpSpec& spec : GptOpSpecs()) {
    if (spec.part == GptOpPart::kEmbedding) ops.push_back(SignatureOf(spec.op, config, 0));
  }
  for (int i = 0; i < config.layers; ++i) {
    for (const GptOpSpec& spec : GptOpSpecs()) {
      if (InBlock(spec.op)) ops.push_back(SignatureOf(spec.op, config, i));
    }
  }
  for (const GptOpSpec& spec : GptOpSpecs()) {
    if (spec.part == GptOpPart::kHead) ops.push_back(SignatureOf(spec.op, config, 0));
  }
  return ops;
}

OpStrategyFile GptGraph::Megatron(bool sequence_parallel, int cp, CpAlgo cp_algo) {
  OpStrategyFile f;
  f.source = sequence_parallel ? "<megatron-sp>" : "<megatron>";
  if (cp > 1) {
    f.source.insert(f.source.size() - 1, std::string(" cp ") + std::string(CpAlgoName(cp_algo)));
    f.cp_algo = cp_algo;
  }
  for (const GptOpSpec& spec : GptOpSpecs()) {
    OpStrategyFile::Entry e;
    e.pattern = OpPattern(spec.op);
    e.axes = MegatronStrategy(spec.op, sequence_parallel);
    if (cp > 1) e.axes = WithCp(spec.op, std::move(e.axes), cp_algo);
    for (const auto& in : e.axes) e.counts.emplace_back(in.size(), 1);
    f.operators.push_back(std::move(e));
  }
  return f;
}

void GptGraph::Take(GptOp op, AnyOp o, Block* b) {
  switch (op) {
    case GptOp::kEmbedding:
      embedding = std::get<EmbeddingOp>(std::move(o));
      break;
    case GptOp::kLn1:
      b->ln1 = std::get<LayerNormOp>(std::move(o));
      break;
    case GptOp::kQkv:
      b->qkv = std::get<LinearOp>(std::move(o));
      break;
    case GptOp::kAttention:
      b->attn = std::get<AttentionOp>(std::move(o));
      break;
    case GptOp::kProj:
      b->proj = std::get<LinearOp>(std::move(o));
      break;
    case GptOp::kAdd1:
      b->add1 = std::get<AddOp>(std::move(o));
      break;
    case GptOp::kLn2:
      b->ln2 = std::get<LayerNormOp>(std::move(o));
      break;
    case GptOp::kFc:
      b->fc = std::get<LinearOp>(std::move(o));
      break;
    case GptOp::kGelu:
      b->gelu = std::get<GeluOp>(std::move(o));
      break;
    case GptOp::kFcProj:
      b->fcproj = std::get<LinearOp>(std::move(o));
      break;
    case GptOp::kAdd2:
      b->add2 = std::get<AddOp>(std::move(o));
      break;
    case GptOp::kLnF:
      lnf = std::get<LayerNormOp>(std::move(o));
      break;
    case GptOp::kLmHead:
      lm_head = std::get<LmHeadOp>(std::move(o));
      break;
    case GptOp::kLoss:
      loss = std::get<CrossEntropyOp>(std::move(o));
      break;
  }
}

namespace {

// The edge into `to`'s input `input` from `from` (named `from_name`).
GptGraph::Edge EdgeInto(const std::string* from_name, const OpInfo& to, int input, Placement from,
                        Placement grad, int64_t cols) {
  std::string label;
  if (from_name != nullptr) {
    label = *from_name + " -> " + to.name +
            (to.inputs.size() > 1 ? " input " + std::to_string(input) : "");
  }
  return {std::move(label), from, to.inputs[input], grad, cols};
}

}  // namespace

std::array<GptGraph::Edge, 6> GptGraph::HalfEdges(const HalfOps& h, Placement x, int64_t C,
                                                  const std::string* x_name) {
  const bool attention = h.attn != nullptr;
  const OpInfo& mid = attention ? h.attn->info() : h.gelu->info();
  const OpInfo &ln = h.ln->info(), &in = h.in->info(), &out = h.out->info(), &add = h.add->info();
  const int64_t mid_cols = attention ? 3 * C : 4 * C;  // the first linear's output
  const int64_t out_cols = attention ? C : 4 * C;      // the second linear's input
  auto name = [&](const OpInfo& i) { return x_name != nullptr ? &i.name : nullptr; };
  return {EdgeInto(x_name, ln, 0, x, ln.inputs[0], C),
          EdgeInto(name(ln), in, 0, ln.output, h.in->InputGradient(), C),
          EdgeInto(name(in), mid, 0, in.output, mid.inputs[0], mid_cols),
          EdgeInto(name(mid), out, 0, mid.output, h.out->InputGradient(), out_cols),
          EdgeInto(x_name, add, 0, x, add.inputs[0], C),
          EdgeInto(name(out), add, 1, out.output, add.inputs[1], C)};
}

std::array<GptGraph::Edge, 3> GptGraph::HeadEdges(const HeadOps* head, Placement x, int64_t C,
                                                  int64_t V, const std::string* x_name) {
  if (head == nullptr) {
    const Placement whole{-1};
    return {Edge{x_name != nullptr ? *x_name + " -> the next stage" : "", x, whole, whole, C}};
  }
  const OpInfo &lnf = head->lnf->info(), &lm = head->lm_head->info(), &loss = head->loss->info();
  auto name = [&](const OpInfo& i) { return x_name != nullptr ? &i.name : nullptr; };
  return {EdgeInto(x_name, lnf, 0, x, lnf.inputs[0], C),
          EdgeInto(name(lnf), lm, 0, lnf.output, head->lm_head->InputGradient(), C),
          EdgeInto(name(lm), loss, 0, lm.output, loss.inputs[0], V)};
}

bool GptGraph::Regathers(const Edge& e) {
  return e.from.split == 0 && !e.from.partial && e.to.split == -1;
}

Result<GptGraph> GptGraph::Create(const GptConfig& config,
                                  const std::map<std::string, OpStrategy>& strategies,
                                  const GptStage& stage, int dp, int cp, CpAlgo cp_algo) {
  RETURN_IF_ERROR(config.Validate());
  GptGraph graph;
  GptGraph* g = &graph;
  g->config = config;
  g->stage = stage;
  g->dp = dp;
  g->cp = cp;
  g->cp_algo = cp_algo;
  const int64_t C = config.embed, V = config.vocab;
  const int tp = stage.tp;
  auto strategy = [&](const std::string& name) -> Result<const OpStrategy*> {
    auto it = strategies.find(name);
    if (it == strategies.end()) return InternalError("no strategy for operator '" + name + "'");
    return &it->second;
  };
  std::map<std::string, int>& splits = g->param_splits;
  // Operator `op` of block `layer` (of the ends for ends) into `b`.
  auto take = [&](GptOp op, int layer, Block* b) -> Status {
    const std::string name = OpName(op, layer);
    ASSIGN_OR_RETURN(const OpStrategy* s, strategy(name));
    if (cp > 1) RETURN_IF_ERROR(CheckCpRows(op, name, *s, cp_algo));
    ASSIGN_OR_RETURN(AnyOp o, CreateOp(op, name, *s, config, tp, dp, cp));
    ParamSplitsOf(op, o, layer, tp, &splits);
    g->Take(op, std::move(o), b);
    return Status::Ok();
  };
  RETURN_IF_ERROR(take(GptOp::kEmbedding, 0, nullptr));
  const int last_layer = stage.last_layer < 0 ? config.layers : stage.last_layer;
  // Every block is checked; the stage keeps its own.
  for (int i = 0; i < config.layers; ++i) {
    Block b;
    for (const GptOpSpec& spec : GptOpSpecs()) {
      if (InBlock(spec.op)) RETURN_IF_ERROR(take(spec.op, i, &b));
    }
    b.layer = i;
    if (i >= stage.first_layer && i < last_layer) g->blocks.push_back(std::move(b));
  }
  for (const GptOpSpec& spec : GptOpSpecs()) {
    if (spec.part == GptOpPart::kHead) RETURN_IF_ERROR(take(spec.op, 0, nullptr));
  }
  if (tp == 1) {  // a cut over one rank is no cut
    for (auto& [name, dim] : splits) dim = -1;
  }
  if (g->lm_head.weight_split() != g->embedding.weight_split()) {
    return InternalError("wte is cut differently by embedding and lm_head");
  }

  // The graph's edges, with the residual stream's placement threaded through.
  Placement x = stage.first ? g->embedding.info().output : Placement{-1};
  g->stream_in = x;
  std::string xname = stage.first ? "embedding" : "the previous stage";
  for (Block& b : g->blocks) {
    const std::array<Edge, 6> attention = HalfEdges(b.attention(), x, C, &xname);
    const std::array<Edge, 6> mlp =
        HalfEdges(b.mlp(), b.add1.info().output, C, &b.add1.info().name);
    std::copy(attention.begin(), attention.end(), b.e);
    std::copy(mlp.begin(), mlp.end(), b.e + 6);
    x = b.add2.info().output;
    xname = b.add2.info().name;
  }
  const HeadOps head = g->head();
  const std::array<Edge, 3> ends = HeadEdges(stage.last ? &head : nullptr, x, C, V, &xname);
  if (stage.last) {
    g->lnf_e = ends[0];
    g->lm_e = ends[1];
    g->ce_e = ends[2];
  } else {
    g->out_e = ends[0];
  }
  return graph;
}

GptGraph::HalfOps GptGraph::HalfOf(GptOpPart part,
                                   const std::array<const AnyOp*, kGptOpCount>& ops) {
  auto get = [&](GptOp op) { return ops[Index(op)]; };
  if (part == GptOpPart::kAttentionHalf) {
    return {&std::get<LayerNormOp>(*get(GptOp::kLn1)),       &std::get<LinearOp>(*get(GptOp::kQkv)),
            &std::get<AttentionOp>(*get(GptOp::kAttention)), nullptr,
            &std::get<LinearOp>(*get(GptOp::kProj)),         &std::get<AddOp>(*get(GptOp::kAdd1))};
  }
  return {&std::get<LayerNormOp>(*get(GptOp::kLn2)),
          &std::get<LinearOp>(*get(GptOp::kFc)),
          nullptr,
          &std::get<GeluOp>(*get(GptOp::kGelu)),
          &std::get<LinearOp>(*get(GptOp::kFcProj)),
          &std::get<AddOp>(*get(GptOp::kAdd2))};
}

void GptGraph::SetRecompute(int layer, Recompute mode) {
  for (Block& b : blocks) {
    if (layer < 0 || b.layer == layer) b.recompute = mode;
  }
}

std::string GptGraph::Describe(int64_t rows) const {
  const OpContext ctx(stage.tp, 0);  // planning: collectives and sizes only
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
  if (stage.first) op(embedding.info());
  for (const Block& b : blocks) {
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
  if (stage.last) {
    edge(lnf_e);
    op(lnf.info());
    edge(lm_e);
    op(lm_head.info());
    edge(ce_e);
    op(loss.info());
  } else {
    edge(out_e);
  }
  return out;
}

}  // namespace tessera
