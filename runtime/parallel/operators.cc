#include "runtime/parallel/operators.h"

#include <algorithm>
#include <cstring>

#include "core/timer.h"
#include "runtime/kernels.h"
#include "runtime/parallel/dtensor.h"

namespace tessera {

namespace k = kernels;

namespace {

std::string Input(int i, const std::string& name, int d) {
  return "input " + std::to_string(i) + " (" + name + ") dimension " + std::to_string(d);
}

// Whether a dimension other than the rows is cut over tp.
Result<bool> DimOverTp(const DimAxes& axes, const std::string& op, const std::string& what) {
  if (axes.empty()) return false;
  if (axes.size() == 1 && axes[0] == "tp") return true;
  return InvalidArgumentError("operator '" + op + "': " + what + " is cut over " +
                              OpStrategy{{{axes}}}.ToString() +
                              "; parameters and columns are cut over tp only (dp is the "
                              "data-parallel axis; optimizer states are sharded by zero)");
}

// A strategy with the expected number of inputs and dimensions (resolved
// strategies have them; hand-made ones are checked here too).
Status Shape(const OpStrategy& s, const std::string& op, std::vector<size_t> dims) {
  bool ok = s.inputs.size() == dims.size();
  for (size_t i = 0; ok && i < dims.size(); ++i) ok = s.inputs[i].size() == dims[i];
  if (ok) return Status::Ok();
  return InvalidArgumentError("operator '" + op + "': strategy " + s.ToString() +
                              " does not have the operator's inputs and dimensions");
}

Status TpOnce(int uses, const std::string& op, const std::string& what) {
  if (uses <= 1) return Status::Ok();
  return InvalidArgumentError("operator '" + op + "': tp cuts " + what +
                              "; the output would be cut twice over one axis");
}

}  // namespace

// The steps that turn `from` into `to` (resolved) over tp ranks.
std::vector<RedistStep> PlanSteps(Placement from, const Placement& to, int64_t rows, int tp) {
  std::vector<RedistStep> steps;
  if (from.partial) {
    if (to.split == 0 && from.split == -1 && rows % tp == 0) return {RedistStep::kReduceScatter};
    steps.push_back(RedistStep::kAllReduce);
    from.partial = false;
  }
  if (from == to) return steps;
  if (from.split == -1) {
    steps.push_back(RedistStep::kSlice);
  } else if (from.split == 0 && to.split == -1 && rows % tp == 0) {
    steps.push_back(RedistStep::kAllGather);
  } else {
    steps.push_back(RedistStep::kRedistribute);
  }
  return steps;
}

Layout Placement::ToLayout(int64_t rows, int64_t cols) const {
  Layout l = Layout::Replicated({rows, cols}, DType::kF32);
  if (split == 0) l.dim_axes = {{"tp"}, {}};
  if (split == 1 && groups == 1) l.dim_axes = {{}, {"tp"}};
  if (split == 1 && groups > 1) {
    l.view = {rows, groups, cols / groups};
    l.dim_axes = {{}, {}, {"tp"}};
  }
  return l;
}

std::string Placement::ToString() const {
  std::string s = split == 0   ? "rows/tp"
                  : split == 1 ? (groups > 1 ? "heads/tp" : "cols/tp")
                               : "replicated";
  return partial ? s + " partial" : s;
}

OpContext::OpContext(Communicator* tp) : comm_(tp) {
  if (tp != nullptr) {
    tp_size_ = tp->size();
    tp_rank_ = tp->rank();
  }
  mesh_ = *Mesh::Create({"tp"}, {tp_size_});
}

OpContext::OpContext(int tp, int tp_rank) : tp_size_(tp), tp_rank_(tp_rank) {
  mesh_ = *Mesh::Create({"tp"}, {tp_size_});
}

int64_t OpContext::LocalRows(const Act& a) const {
  return a.place.split == 0 ? ChunkOf({0, a.rows}, tp_size_, tp_rank_).size() : a.rows;
}

int64_t OpContext::LocalCols(const Act& a) const {
  if (a.place.split != 1) return a.cols;
  const int64_t g = a.place.groups;
  return g * ChunkOf({0, a.cols / g}, tp_size_, tp_rank_).size();
}

int64_t OpContext::FirstRow(const Act& a) const {
  return a.place.split == 0 ? ChunkOf({0, a.rows}, tp_size_, tp_rank_).begin : 0;
}

OpContext::Redistribution OpContext::Plan(const Placement& from, const Placement& to, int64_t rows,
                                          int64_t cols) const {
  Redistribution r;
  if (tp_size_ == 1) return r;
  const int64_t whole = rows * cols * 4;
  for (RedistStep s : PlanSteps(from, to, rows, tp_size_)) {
    const char* names[] = {"AllReduce", "ReduceScatter", "AllGather", "Split (local slice)",
                           "Redistribute (AllToAllV)"};
    r.collective += (r.collective.empty() ? "" : " + ") + std::string(names[static_cast<int>(s)]);
    // The bytes this rank contributes.
    if (s == RedistStep::kAllReduce) r.bytes += from.split == -1 ? whole : whole / tp_size_;
    if (s == RedistStep::kReduceScatter) r.bytes += whole;
    if (s == RedistStep::kAllGather || s == RedistStep::kRedistribute) r.bytes += whole / tp_size_;
  }
  return r;
}

Result<bool> RowsOverTp(const DimAxes& rows, int dp, const std::string& op,
                        const std::string& what) {
  size_t i = 0;
  if (!rows.empty() && rows[0] == "dp") {
    i = 1;
  } else if (dp > 1) {
    return InvalidArgumentError("operator '" + op + "': " + what +
                                " (the rows) must be cut over dp "
                                "first: each data-parallel replica reads its own rows");
  }
  if (i < rows.size() && rows[i] == "cp") ++i;  // the sequence (context_parallel.h)
  if (i == rows.size()) return false;
  if (i + 1 == rows.size() && rows[i] == "tp") return true;
  return InvalidArgumentError("operator '" + op + "': " + what +
                              " (the rows) may be cut over dp, "
                              "then cp, then tp; not " +
                              OpStrategy{{{rows}}}.ToString());
}

namespace {

// A product's cuts over tp: x's rows, the contracted dimension (cut alike
// in x and in the weight, `w_dim`), the output columns (`n`, in `groups`).
// At most one of them; a contracted cut leaves the output partial.
Status MatMulCuts(bool rows, bool kx, bool kw, bool n, int groups, const std::string& w_dim,
                  const std::string& n_name, OpInfo* info) {
  const std::string& name = info->name;
  if (kx != kw) {
    return InvalidArgumentError("operator '" + name + "': the contracted dimension is cut " +
                                (kx ? "over tp" : "nowhere") + " in " + Input(0, "x", 1) + " but " +
                                (kw ? "over tp" : "nowhere") + " in " + w_dim +
                                "; it must be cut alike in both");
  }
  RETURN_IF_ERROR(TpOnce(rows + kx + n, name,
                         "more than one of x's rows, the contracted "
                         "dimension and " +
                             n_name));
  info->rows_over_tp = rows;
  info->inputs = {Placement{rows ? 0 : kx ? 1 : -1}};
  info->output = rows ? Placement{0} : n ? Placement{1, groups} : Placement{-1};
  info->output.partial = kx;
  return Status::Ok();
}

}  // namespace

// ---- Linear ----

Result<LinearOp> LinearOp::Create(std::string name, const OpStrategy& s, int64_t K, int64_t M,
                                  int groups, int dp) {
  RETURN_IF_ERROR(Shape(s, name, {2, 2}));
  LinearOp op;
  op.info_ = {name, "linear", s, {}, {}, false};
  op.K_ = K;
  op.M_ = M;
  op.groups_ = groups;
  ASSIGN_OR_RETURN(const bool rows, RowsOverTp(s.inputs[0][0], dp, name, Input(0, "x", 0)));
  ASSIGN_OR_RETURN(const bool kx, DimOverTp(s.inputs[0][1], name, Input(0, "x", 1)));
  ASSIGN_OR_RETURN(const bool kw, DimOverTp(s.inputs[1][0], name, Input(1, "weight", 0)));
  ASSIGN_OR_RETURN(const bool m, DimOverTp(s.inputs[1][1], name, Input(1, "weight", 1)));
  RETURN_IF_ERROR(MatMulCuts(rows, kx, kw, m, groups, Input(1, "weight", 0), "the weight's columns",
                             &op.info_));
  op.weight_split_ = kx ? 0 : m ? 1 : -1;
  return op;
}

Placement LinearOp::InputGradient() const {
  Placement p = info_.inputs[0];
  p.partial = weight_split_ == 1;
  return p;
}

// ---- LayerNorm ----

Result<LayerNormOp> LayerNormOp::Create(std::string name, const OpStrategy& s, int dp) {
  RETURN_IF_ERROR(Shape(s, name, {2}));
  LayerNormOp op;
  op.info_ = {name, "layer_norm", s, {}, {}, false};
  ASSIGN_OR_RETURN(const bool rows, RowsOverTp(s.inputs[0][0], dp, name, Input(0, "x", 0)));
  if (!s.inputs[0][1].empty()) {
    return InvalidArgumentError("operator '" + name + "': " + Input(0, "x", 1) +
                                " is what a layer norm normalizes over; it cannot be cut");
  }
  op.info_.rows_over_tp = rows;
  op.info_.inputs = {Placement{rows ? 0 : -1}};
  op.info_.output = op.info_.inputs[0];
  return op;
}

// ---- Attention ----

Result<AttentionOp> AttentionOp::Create(std::string name, const OpStrategy& s, int heads, int64_t C,
                                        int tp, int dp, int cp) {
  RETURN_IF_ERROR(Shape(s, name, {2}));
  AttentionOp op;
  op.info_ = {name, "attention", s, {}, {}, false};
  op.heads_ = heads;
  op.C_ = C;
  op.cp_ = cp;
  const DimAxes& row_axes = s.inputs[0][0];
  DimAxes head_axes = s.inputs[0][1];
  const bool rows_cp = std::find(row_axes.begin(), row_axes.end(), "cp") != row_axes.end();
  const bool heads_cp = !head_axes.empty() && head_axes.back() == "cp";
  if (heads_cp) head_axes.pop_back();  // Ulysses: the heads of a tp rank cut again over cp
  ASSIGN_OR_RETURN(const bool rows, RowsOverTp(row_axes, dp, name, Input(0, "qkv", 0)));
  ASSIGN_OR_RETURN(const bool h, DimOverTp(head_axes, name, Input(0, "qkv", 1) + " (heads)"));
  RETURN_IF_ERROR(TpOnce(rows + h, name, "both the rows and the heads"));
  if (h && heads % tp != 0) {
    return InvalidArgumentError("operator '" + name + "': " + Input(0, "qkv", 1) +
                                " (heads): " + std::to_string(heads) +
                                " heads are not divisible by tp " + std::to_string(tp));
  }
  if (rows_cp && heads_cp) {
    return InvalidArgumentError("operator '" + name + "': cp cuts both the rows (ring attention) " +
                                "and the heads (Ulysses) of " + s.ToString() + "; choose one");
  }
  if (heads_cp) {
    const int by = (h ? tp : 1) * cp;
    if (heads % by != 0) {
      return InvalidArgumentError("operator '" + name + "': Ulysses cuts the " +
                                  std::to_string(heads) + " heads over " +
                                  (h ? "tp " + std::to_string(tp) + " x " : std::string()) + "cp " +
                                  std::to_string(cp) + " = " + std::to_string(by) +
                                  " ranks, which does not divide them; use a cp that divides " +
                                  std::to_string(h ? heads / tp : heads) + ", or cp_algo ring");
    }
    if (rows) {
      return InvalidArgumentError("operator '" + name + "': Ulysses (the heads over cp) takes " +
                                  "whole sequences; it cannot also cut the rows over tp");
    }
    op.cp_mode_ = Cp::kUlysses;
  } else if (rows_cp) {
    if (rows) {
      return InvalidArgumentError("operator '" + name + "': ring attention (the rows over cp) " +
                                  "cannot also cut the rows over tp; cut the heads over tp");
    }
    op.cp_mode_ = Cp::kRing;
  }
  op.info_.rows_over_tp = rows;
  op.info_.inputs = {rows ? Placement{0} : h ? Placement{1, 3} : Placement{-1}};
  op.info_.output = rows ? Placement{0} : h ? Placement{1, 1} : Placement{-1};
  return op;
}

int AttentionOp::LocalHeads(const OpContext& ctx) const {
  return info_.inputs[0].split == 1 ? heads_ / ctx.tp() : heads_;
}

int64_t AttentionOp::AttSize(const OpContext& ctx, int64_t rows, int T) const {
  const Act a{nullptr, rows, 3 * C_, info_.inputs[0]};
  const int64_t heads = LocalHeads(ctx), local_rows = ctx.LocalRows(a);
  const int64_t cols = info_.inputs[0].split == 1 ? C_ / ctx.tp() : C_;
  switch (cp_mode_) {
    case Cp::kUlysses: {  // whole sequences of heads / cp: weights and the gathered q|k|v
      const int64_t whole = static_cast<int64_t>(T) * ctx.cp();
      return local_rows / T * (heads / ctx.cp() * whole * whole + whole * 3 * cols / ctx.cp());
    }
    case Cp::kRing:  // the output and one log-sum-exp per row and head
      return local_rows * cols + local_rows * heads;
    case Cp::kNone:
      break;
  }
  return local_rows / T * heads * T * T;
}

// ---- element-wise ----

namespace {

Result<Placement> Elementwise(const InputStrategy& in, int dp, const std::string& op, bool* rows) {
  ASSIGN_OR_RETURN(*rows, RowsOverTp(in[0], dp, op, Input(0, "x", 0)));
  ASSIGN_OR_RETURN(const bool c, DimOverTp(in[1], op, Input(0, "x", 1)));
  RETURN_IF_ERROR(TpOnce(*rows + c, op, "both the rows and the columns"));
  return *rows ? Placement{0} : c ? Placement{1} : Placement{-1};
}

}  // namespace

Result<GeluOp> GeluOp::Create(std::string name, const OpStrategy& s, int dp) {
  RETURN_IF_ERROR(Shape(s, name, {2}));
  GeluOp op;
  op.info_ = {name, "gelu", s, {}, {}, false};
  ASSIGN_OR_RETURN(Placement p, Elementwise(s.inputs[0], dp, name, &op.info_.rows_over_tp));
  op.info_.inputs = {p};
  op.info_.output = p;
  return op;
}

Result<AddOp> AddOp::Create(std::string name, const OpStrategy& s, int dp) {
  RETURN_IF_ERROR(Shape(s, name, {2, 2}));
  AddOp op;
  op.info_ = {name, "add", s, {}, {}, false};
  if (s.inputs[0] != s.inputs[1]) {
    return InvalidArgumentError("operator '" + name + "': its inputs are cut " + s.ToString() +
                                "; both inputs of an add must be cut alike");
  }
  ASSIGN_OR_RETURN(Placement p, Elementwise(s.inputs[0], dp, name, &op.info_.rows_over_tp));
  op.info_.inputs = {p, p};
  op.info_.output = p;
  return op;
}

// ---- Embedding ----

Result<EmbeddingOp> EmbeddingOp::Create(std::string name, const OpStrategy& s, int64_t V, int64_t C,
                                        int dp) {
  RETURN_IF_ERROR(Shape(s, name, {2, 1}));
  EmbeddingOp op;
  op.info_ = {name, "embedding", s, {}, {}, false};
  op.V_ = V;
  op.C_ = C;
  ASSIGN_OR_RETURN(const bool v,
                   DimOverTp(s.inputs[0][0], name, Input(0, "wte", 0) + " (vocabulary)"));
  ASSIGN_OR_RETURN(const bool c, DimOverTp(s.inputs[0][1], name, Input(0, "wte", 1)));
  ASSIGN_OR_RETURN(const bool rows, RowsOverTp(s.inputs[1][0], dp, name, Input(1, "tokens", 0)));
  RETURN_IF_ERROR(
      TpOnce(v + c + rows, name, "more than one of the vocabulary, the columns and the rows"));
  op.info_.rows_over_tp = rows;
  op.info_.output = rows ? Placement{0} : c ? Placement{1} : Placement{-1};
  op.info_.output.partial = v;
  op.weight_split_ = v ? 0 : c ? 1 : -1;
  return op;
}

// ---- LmHead ----

Result<LmHeadOp> LmHeadOp::Create(std::string name, const OpStrategy& s, int64_t V, int64_t C,
                                  int dp) {
  RETURN_IF_ERROR(Shape(s, name, {2, 2}));
  LmHeadOp op;
  op.info_ = {name, "lm_head", s, {}, {}, false};
  op.V_ = V;
  op.C_ = C;
  ASSIGN_OR_RETURN(const bool rows, RowsOverTp(s.inputs[0][0], dp, name, Input(0, "x", 0)));
  ASSIGN_OR_RETURN(const bool kx, DimOverTp(s.inputs[0][1], name, Input(0, "x", 1)));
  ASSIGN_OR_RETURN(const bool v,
                   DimOverTp(s.inputs[1][0], name, Input(1, "wte", 0) + " (vocabulary)"));
  ASSIGN_OR_RETURN(const bool kw, DimOverTp(s.inputs[1][1], name, Input(1, "wte", 1)));
  RETURN_IF_ERROR(MatMulCuts(rows, kx, kw, v, 1, Input(1, "wte", 1), "the vocabulary", &op.info_));
  op.weight_split_ = v ? 0 : kx ? 1 : -1;
  return op;
}

Placement LmHeadOp::InputGradient() const {
  Placement p = info_.inputs[0];
  p.partial = weight_split_ == 0;
  return p;
}

// ---- CrossEntropy ----

Result<CrossEntropyOp> CrossEntropyOp::Create(std::string name, const OpStrategy& s, int64_t V,
                                              int dp) {
  RETURN_IF_ERROR(Shape(s, name, {2, 1}));
  CrossEntropyOp op;
  op.info_ = {name, "cross_entropy", s, {}, {}, false};
  op.V_ = V;
  ASSIGN_OR_RETURN(const bool rows, RowsOverTp(s.inputs[0][0], dp, name, Input(0, "logits", 0)));
  ASSIGN_OR_RETURN(const bool v,
                   DimOverTp(s.inputs[0][1], name, Input(0, "logits", 1) + " (vocabulary)"));
  RETURN_IF_ERROR(TpOnce(rows + v, name, "both the rows and the vocabulary"));
  if (s.inputs[1][0] != s.inputs[0][0]) {
    return InvalidArgumentError("operator '" + name + "': " + Input(1, "targets", 0) +
                                " must be cut like the logits' rows");
  }
  op.info_.rows_over_tp = rows;
  op.info_.inputs = {rows ? Placement{0} : v ? Placement{1} : Placement{-1}};
  op.info_.output = op.info_.inputs[0];
  return op;
}

}  // namespace tessera
