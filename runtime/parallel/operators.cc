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

Status OpContext::AllReduce(void* data, int64_t n, DType dtype, ReduceOp op) {
  if (tp_size_ == 1) return Status::Ok();
  AddElapsed t(&comm_seconds_);
  return comm_->AllReduce(data, data, n, dtype, op);
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

Result<Act> OpContext::Convert(Act& a, const Placement& to, std::vector<float>* storage,
                               const std::string& op, const std::string& what) {
  if (to.partial)
    return InternalError("operator '" + op + "': " + what + " asked for a partial input");
  if (tp_size_ == 1 || a.place == to) {
    a.place.partial = false;
    return a;
  }
  Act out{nullptr, a.rows, a.cols, to};
  // This rank's shard of `to` cut out of the whole tensor `whole` (with
  // std::copy, not memcpy: an empty shard's storage has no pointer).
  auto slice = [&](const float* whole) {
    storage->resize(LocalSize(out));
    out.data = storage->data();
    const int64_t r0 = FirstRow(out), n = LocalRows(out), cl = LocalCols(out);
    if (to.split != 1) {
      std::copy(whole + r0 * a.cols, whole + (r0 + n) * a.cols, out.data);
      return out;
    }
    const int64_t g = to.groups, width = a.cols / g;
    const Interval c = ChunkOf({0, width}, tp_size_, tp_rank_);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t j = 0; j < g; ++j) {
        const float* from = whole + r * a.cols + j * width + c.begin;
        std::copy(from, from + c.size(), out.data + r * cl + j * c.size());
      }
    }
    return out;
  };
  for (RedistStep s : PlanSteps(a.place, to, a.rows, tp_size_)) {
    AddElapsed timer(&comm_seconds_);
    switch (s) {
      case RedistStep::kAllReduce: {
        const int64_t n = LocalSize(a);
        RETURN_IF_ERROR(comm_->AllReduce(a.data, a.data, n, DType::kF32, ReduceOp::kSum));
        a.place.partial = false;
        if (a.place == to) return a;
        break;
      }
      case RedistStep::kReduceScatter: {
        storage->resize(LocalSize(out));
        RETURN_IF_ERROR(comm_->ReduceScatter(a.data, storage->data(), LocalSize(out), DType::kF32,
                                             ReduceOp::kSum));
        out.data = storage->data();
        return out;
      }
      case RedistStep::kAllGather: {
        storage->resize(LocalSize(out));
        RETURN_IF_ERROR(comm_->AllGather(a.data, LocalSize(a), storage->data(), DType::kF32));
        out.data = storage->data();
        return out;
      }
      case RedistStep::kSlice:
        return slice(a.data);
      case RedistStep::kRedistribute: {
        const int64_t bytes = LocalSize(a) * 4;
        std::vector<char> local(bytes);
        if (bytes > 0) std::memcpy(local.data(), a.data, bytes);  // an empty shard: no pointers
        auto t =
            DTensor::FromLocal(mesh_, a.place.ToLayout(a.rows, a.cols), tp_rank_, std::move(local));
        if (!t.ok()) {
          return Status(t.status().code(),
                        "operator '" + op + "' " + what + ": " + t.status().message());
        }
        // Columns cut in different groups (by columns <-> by heads): a
        // shard of one is not a box of the other's view, which the planner
        // moves, unless the cuts fall on the groups' edges. Such a tensor
        // goes through the whole, then is sliced.
        const bool regroup = a.place.split == 1 && to.split == 1 && a.place.groups != to.groups;
        const Placement via = regroup ? Placement{-1} : to;
        DTensor moved;
        const Status st = RedistributeInto(*t, mesh_, via.ToLayout(a.rows, a.cols), *comm_, &moved);
        if (!st.ok())
          return Status(st.code(), "operator '" + op + "' " + what + ": " + st.message());
        if (regroup) return slice(reinterpret_cast<const float*>(moved.local().data()));
        storage->resize(LocalSize(out));
        if (!storage->empty()) {
          std::memcpy(storage->data(), moved.local().data(), storage->size() * sizeof(float));
        }
        out.data = storage->data();
        return out;
      }
    }
  }
  return a;
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
  if (i == rows.size()) return false;
  if (i + 1 == rows.size() && rows[i] == "tp") return true;
  return InvalidArgumentError("operator '" + op + "': " + what +
                              " (the rows) may be cut over dp, "
                              "then tp; not " +
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

void LinearOp::Forward(const OpContext& ctx, const Act& x, const float* w, const float* b,
                       Act* y) const {
  const int n = static_cast<int>(ctx.LocalRows(x));
  if (n == 0) return;
  // A partial output gets the bias once, on tp rank 0.
  const float* bias = info_.output.partial && ctx.tp_rank() != 0 ? nullptr : b;
  k::MatmulForward(y->data, x.data, w, bias, n, static_cast<int>(ctx.LocalCols(x)),
                   static_cast<int>(ctx.LocalCols(*y)));
}

void LinearOp::Backward(const OpContext& ctx, const Act& x, const float* w, const Act& dy, Act* dx,
                        float* dw, float* db) const {
  const int n = static_cast<int>(ctx.LocalRows(x));
  if (n == 0) return;
  k::MatmulBackward(dx == nullptr ? nullptr : dx->data, dw, db, dy.data, x.data, w, n,
                    static_cast<int>(ctx.LocalCols(x)), static_cast<int>(ctx.LocalCols(dy)));
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

void LayerNormOp::Forward(const OpContext& ctx, const Act& x, const float* w, const float* b,
                          Act* y, float* mean, float* rstd) const {
  const int n = static_cast<int>(ctx.LocalRows(x));
  if (n > 0) k::LayerNormForward(y->data, mean, rstd, x.data, w, b, n, static_cast<int>(x.cols));
}

void LayerNormOp::Backward(const OpContext& ctx, const Act& x, const float* w, const float* mean,
                           const float* rstd, const Act& dy, Act* dx, float* dw, float* db,
                           bool accumulate) const {
  const int64_t n = ctx.LocalRows(x);
  if (!accumulate) std::fill(dx->data, dx->data + n * x.cols, 0.0f);
  if (n > 0) {
    k::LayerNormBackward(dx->data, dw, db, dy.data, x.data, w, mean, rstd, static_cast<int>(n),
                         static_cast<int>(x.cols));
  }
}

// ---- Attention ----

Result<AttentionOp> AttentionOp::Create(std::string name, const OpStrategy& s, int heads, int64_t C,
                                        int tp, int dp) {
  RETURN_IF_ERROR(Shape(s, name, {2}));
  AttentionOp op;
  op.info_ = {name, "attention", s, {}, {}, false};
  op.heads_ = heads;
  op.C_ = C;
  ASSIGN_OR_RETURN(const bool rows, RowsOverTp(s.inputs[0][0], dp, name, Input(0, "qkv", 0)));
  ASSIGN_OR_RETURN(const bool h, DimOverTp(s.inputs[0][1], name, Input(0, "qkv", 1) + " (heads)"));
  RETURN_IF_ERROR(TpOnce(rows + h, name, "both the rows and the heads"));
  if (h && heads % tp != 0) {
    return InvalidArgumentError("operator '" + name + "': " + Input(0, "qkv", 1) +
                                " (heads): " + std::to_string(heads) +
                                " heads are not divisible by tp " + std::to_string(tp));
  }
  op.info_.rows_over_tp = rows;
  op.info_.inputs = {rows ? Placement{0} : h ? Placement{1, 3} : Placement{-1}};
  op.info_.output = rows ? Placement{0} : h ? Placement{1, 1} : Placement{-1};
  return op;
}

int64_t AttentionOp::AttSize(const OpContext& ctx, int64_t rows, int T) const {
  const Act a{nullptr, rows, 3 * C_, info_.inputs[0]};
  const int64_t heads = info_.inputs[0].split == 1 ? heads_ / ctx.tp() : heads_;
  return ctx.LocalRows(a) / T * heads * T * T;
}

Status AttentionOp::Forward(const OpContext& ctx, const Act& qkv, int T, float* att, Act* y) const {
  const int64_t n = ctx.LocalRows(qkv), r0 = ctx.FirstRow(qkv);
  if (n % T != 0 || r0 % T != 0) {
    return InvalidArgumentError("operator '" + info_.name + "': tp rank " +
                                std::to_string(ctx.tp_rank()) + " holds rows [" +
                                std::to_string(r0) + ", " + std::to_string(r0 + n) +
                                "), not whole sequences of " + std::to_string(T) +
                                " (cut the rows over tp only when each rank gets whole sequences)");
  }
  if (n == 0) return Status::Ok();
  const bool h = info_.inputs[0].split == 1;
  const int cl = static_cast<int>(h ? C_ / ctx.tp() : C_), nh = h ? heads_ / ctx.tp() : heads_;
  k::AttentionForward(y->data, att, qkv.data, static_cast<int>(n / T), T, cl, nh);
  return Status::Ok();
}

void AttentionOp::Backward(const OpContext& ctx, const Act& qkv, const float* att, int T,
                           const Act& dy, Act* dqkv) const {
  const int64_t n = ctx.LocalRows(qkv);
  if (n == 0) return;
  const bool h = info_.inputs[0].split == 1;
  const int cl = static_cast<int>(h ? C_ / ctx.tp() : C_), nh = h ? heads_ / ctx.tp() : heads_;
  k::AttentionBackward(dqkv->data, dy.data, qkv.data, att, static_cast<int>(n / T), T, cl, nh);
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

void GeluOp::Forward(const OpContext& ctx, const Act& x, Act* y) const {
  k::GeluForward(y->data, x.data, ctx.LocalSize(x));
}

void GeluOp::Backward(const OpContext& ctx, const Act& x, const Act& dy, Act* dx) const {
  k::GeluBackward(dx->data, x.data, dy.data, ctx.LocalSize(x));
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

void AddOp::Forward(const OpContext& ctx, const Act& a, const Act& b, Act* y) const {
  k::ResidualForward(y->data, a.data, b.data, ctx.LocalSize(a));
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

void EmbeddingOp::Forward(const OpContext& ctx, const int32_t* tokens, int T, const float* wte,
                          const float* wpe, Act* y) const {
  const int64_t r0 = ctx.FirstRow(*y), n = ctx.LocalRows(*y), cl = ctx.LocalCols(*y);
  int64_t v0 = 0, vl = -1;
  if (weight_split_ == 0) {
    const Interval v = ChunkOf({0, V_}, ctx.tp(), ctx.tp_rank());
    v0 = v.begin;
    vl = v.size();
  }
  if (info_.output.partial && ctx.tp_rank() != 0) wpe = nullptr;  // added once
  // Row by row of whole or partial sequences: position = row % T.
  for (int64_t i = r0; i < r0 + n;) {
    const int64_t t = i % T, len = std::min<int64_t>(T - t, r0 + n - i);
    k::EncoderForward(y->data + (i - r0) * cl, tokens + i, wte, wpe ? wpe + t * cl : nullptr, 1,
                      static_cast<int>(len), static_cast<int>(cl), v0, vl);
    i += len;
  }
}

void EmbeddingOp::Backward(const OpContext& ctx, const int32_t* tokens, int T, const Act& dy,
                           float* dwte, float* dwpe) const {
  const int64_t r0 = ctx.FirstRow(dy), n = ctx.LocalRows(dy), cl = ctx.LocalCols(dy);
  int64_t v0 = 0, vl = -1;
  if (weight_split_ == 0) {
    const Interval v = ChunkOf({0, V_}, ctx.tp(), ctx.tp_rank());
    v0 = v.begin;
    vl = v.size();
  }
  for (int64_t i = r0; i < r0 + n;) {
    const int64_t t = i % T, len = std::min<int64_t>(T - t, r0 + n - i);
    k::EncoderBackward(dwte, dwpe ? dwpe + t * cl : nullptr, dy.data + (i - r0) * cl, tokens + i, 1,
                       static_cast<int>(len), static_cast<int>(cl), v0, vl);
    i += len;
  }
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

void LmHeadOp::Forward(const OpContext& ctx, const Act& x, const float* wte, Act* logits) const {
  const int n = static_cast<int>(ctx.LocalRows(x));
  if (n == 0) return;
  k::MatmulTransposedForward(logits->data, x.data, wte, n, static_cast<int>(ctx.LocalCols(x)),
                             static_cast<int>(ctx.LocalCols(*logits)));
}

void LmHeadOp::Backward(const OpContext& ctx, const Act& x, const float* wte, const Act& dlogits,
                        Act* dx, float* dwte) const {
  const int n = static_cast<int>(ctx.LocalRows(x));
  if (n == 0) return;
  k::MatmulTransposedBackward(dx->data, dwte, dlogits.data, x.data, wte, n,
                              static_cast<int>(ctx.LocalCols(x)),
                              static_cast<int>(ctx.LocalCols(dlogits)));
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

Result<double> CrossEntropyOp::Forward(OpContext& ctx, const Act& logits, const int32_t* targets,
                                       float* probs, std::vector<float>* max,
                                       std::vector<double>* sums) const {
  const int64_t n = ctx.LocalRows(logits), r0 = ctx.FirstRow(logits);
  const int vl = static_cast<int>(ctx.LocalCols(logits));
  if (logits.place.split == 1 && ctx.tp() > 1) {  // vocabulary-parallel
    const int64_t v0 = ChunkOf({0, V_}, ctx.tp(), ctx.tp_rank()).begin;
    max->resize(n);
    sums->resize(2 * n);
    k::RowMax(max->data(), logits.data, static_cast<int>(n), vl);
    RETURN_IF_ERROR(ctx.AllReduce(max->data(), n, DType::kF32, ReduceOp::kMax));
    k::ShardedExp(probs, sums->data(), logits.data, max->data(), targets, static_cast<int>(n), vl,
                  v0);
    RETURN_IF_ERROR(ctx.AllReduce(sums->data(), 2 * n, DType::kF64, ReduceOp::kSum));
    return k::ShardedNormalize(probs, sums->data(), max->data(), static_cast<int>(n), vl);
  }
  double loss = n > 0 ? k::SoftmaxCrossEntropyForward(probs, logits.data, targets + r0,
                                                      static_cast<int>(n), vl)
                      : 0.0;
  if (logits.place.split == 0 && ctx.tp() > 1) {  // each rank its rows: the mean of all
    loss *= static_cast<double>(n);
    RETURN_IF_ERROR(ctx.AllReduce(&loss, 1, DType::kF64, ReduceOp::kSum));
    loss /= static_cast<double>(logits.rows);
  }
  return loss;
}

void CrossEntropyOp::Backward(const OpContext& ctx, const Act& logits, const float* probs,
                              const int32_t* targets, float dloss, float* dlogits) const {
  const int64_t n = ctx.LocalRows(logits), r0 = ctx.FirstRow(logits);
  if (n == 0) return;
  const int64_t v0 = logits.place.split == 1 ? ChunkOf({0, V_}, ctx.tp(), ctx.tp_rank()).begin : 0;
  // The kernel divides by its rows; the loss is the mean over all of them.
  const float scale = dloss * static_cast<float>(n) / static_cast<float>(logits.rows);
  k::SoftmaxCrossEntropyBackward(dlogits, probs, targets + r0, scale, static_cast<int>(n),
                                 static_cast<int>(ctx.LocalCols(logits)), v0);
}

}  // namespace tessera
