#include "runtime/parallel/parallel_ops.h"

#include <algorithm>

#include "runtime/kernels.h"

namespace tessera {
namespace {

float* F32(std::vector<char>& v) { return reinterpret_cast<float*>(v.data()); }
const float* F32(const std::vector<char>& v) { return reinterpret_cast<const float*>(v.data()); }

// [rows, cols] f32 cut (row axes, col axes); nothing cut: no dim_axes.
Layout Matrix(int64_t rows, int64_t cols, std::vector<std::string> row_axes,
              std::vector<std::string> col_axes) {
  Layout layout = Layout::Replicated({rows, cols}, DType::kF32);
  if (!row_axes.empty() || !col_axes.empty()) layout.dim_axes = {row_axes, col_axes};
  return layout;
}

std::vector<std::string> Axes(const std::string& axis) {
  return axis.empty() ? std::vector<std::string>{} : std::vector<std::string>{axis};
}

}  // namespace

Result<MatMulStrategy> MatMulStrategy::Parse(std::string_view text) {
  MatMulStrategy s;
  std::string body(text);
  if (body.size() >= 3 && body.compare(body.size() - 3, 3, ":rs") == 0) {
    s.reduce_scatter = true;
    body.resize(body.size() - 3);
  }
  std::vector<std::string> names(1);
  int depth = 0, groups = 0;
  for (char c : body) {
    if (c == ' ') continue;
    if (c == '(') {
      ++depth;
    } else if (c == ')') {
      if (--depth == 1) ++groups;
    } else if (c == ',') {
      names.emplace_back();
    } else {
      names.back() += c;
    }
    if (depth < 0 || depth > 2) break;
  }
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("MatMul strategy '" + std::string(text) + "': " + why);
  };
  if (depth != 0 || groups != 2 || names.size() != 4) {
    return bad("expected ((x rows, x columns), (w rows, w columns)), e.g. ((dp,-),(-,tp))");
  }
  for (std::string& n : names) {
    if (n == "-" || n == "1") n.clear();
  }
  if (names[1] != names[2]) {
    return bad("x's columns are cut over '" + (names[1].empty() ? "-" : names[1]) +
               "' but w's rows over '" + (names[2].empty() ? "-" : names[2]) +
               "': they must be the same");
  }
  s.x_rows = names[0];
  s.x_cols = names[1];
  s.w_cols = names[3];
  if (s.reduce_scatter && s.x_cols.empty()) {
    return bad("a reduce-scatter needs partial sums: the inner dimension must be cut");
  }
  return s;
}

MatMulStrategy MatMulStrategy::DataParallel(const Mesh& mesh, const std::string& axis) {
  MatMulStrategy s;
  if (mesh.FindAxis(axis) >= 0) s.x_rows = axis;
  return s;
}

std::string MatMulStrategy::ToString() const {
  auto n = [](const std::string& a) { return a.empty() ? std::string("-") : a; };
  return "((" + n(x_rows) + "," + n(x_cols) + "),(" + n(x_cols) + "," + n(w_cols) + "))" +
         (reduce_scatter ? ":rs" : "");
}

Result<ParallelMatMul> ParallelMatMul::Create(const MeshCommunicators& comms,
                                              const MatMulStrategy& strategy, int64_t M, int64_t K,
                                              int64_t N) {
  const Mesh& mesh = comms.mesh();
  const std::string where = "MatMul " + strategy.ToString() + " on mesh " + mesh.ToString();
  std::vector<std::string> used;
  for (const std::string* axis : {&strategy.x_rows, &strategy.x_cols, &strategy.w_cols}) {
    if (axis->empty()) continue;
    if (mesh.FindAxis(*axis) < 0) return InvalidArgumentError(where + ": no axis '" + *axis + "'");
    if (std::find(used.begin(), used.end(), *axis) != used.end()) {
      return InvalidArgumentError(where + ": axis '" + *axis + "' cuts two dimensions");
    }
    used.push_back(*axis);
  }
  if (strategy.reduce_scatter && strategy.x_cols.empty()) {
    return InvalidArgumentError(where + ": a reduce-scatter needs the inner dimension cut");
  }
  if (M < 0 || K < 0 || N < 0) return InvalidArgumentError(where + ": negative dimensions");
  ParallelMatMul op;
  op.comms_ = &comms;
  op.strategy_ = strategy;
  op.M_ = M;
  op.K_ = K;
  op.N_ = N;
  op.x_layout_ = Matrix(M, K, Axes(strategy.x_rows), Axes(strategy.x_cols));
  op.w_layout_ = Matrix(K, N, Axes(strategy.x_cols), Axes(strategy.w_cols));
  std::vector<std::string> y_rows = Axes(strategy.x_rows);
  if (strategy.reduce_scatter) y_rows.push_back(strategy.x_cols);
  op.y_layout_ = Matrix(M, N, y_rows, Axes(strategy.w_cols));
  const int64_t rank = comms.world().rank();
  for (auto [layout, box] : {std::pair{&op.x_layout_, &op.x_box_},
                             {&op.w_layout_, &op.w_box_},
                             {&op.y_layout_, &op.y_box_}}) {
    ASSIGN_OR_RETURN(std::optional<Box> b, ShardOf(*layout, mesh, rank));
    if (!b.has_value())
      return InternalError(where + ": rank " + std::to_string(rank) + " holds nothing");
    *box = *b;
  }
  op.rows_ = op.x_box_[0].size();
  if (strategy.reduce_scatter) {
    const int64_t parts = mesh.axis_size(mesh.FindAxis(strategy.x_cols));
    for (int64_t j = 0; j < parts; ++j) {
      op.chunk_rows_.push_back(ChunkOf({0, op.rows_}, parts, j).size());
    }
  }
  return op;
}

Result<const DTensor*> ParallelMatMul::In(const DTensor& t, const Layout& layout,
                                          DTensor* scratch) {
  const Mesh& mesh = comms_->mesh();
  ASSIGN_OR_RETURN(bool same, Equivalent(t.mesh(), t.layout(), mesh, layout));
  if (same) return &t;
  RedistributeStats stats;
  RETURN_IF_ERROR(RedistributeInto(t, mesh, layout, comms_->world(), scratch, &stats));
  stats_.redistributed_bytes += stats.sent_bytes;
  return scratch;
}

Status ParallelMatMul::SumOver(const std::string& axis, float* data, int64_t n) {
  if (axis.empty()) return Status::Ok();
  ASSIGN_OR_RETURN(Communicator * comm, comms_->Along(axis));
  stats_.reduced_bytes += n * static_cast<int64_t>(sizeof(float));
  return comm->AllReduce(data, data, n, DType::kF32, ReduceOp::kSum);
}

Status ParallelMatMul::Forward(const DTensor& x, const float* w, DTensor* y) {
  ASSIGN_OR_RETURN(const DTensor* in, In(x, x_layout_, &x_in_));
  x_redistributed_ = in != &x;
  forwarded_ = true;
  const int64_t kl = x_box_[1].size(), nl = w_box_[1].size();
  partial_.assign(rows_ * nl, 0.0f);
  if (rows_ > 0 && kl > 0 && nl > 0) {  // OpenBLAS refuses zero leading dimensions
    kernels::MatmulForward(partial_.data(), F32(in->local()), w, nullptr, static_cast<int>(rows_),
                           static_cast<int>(kl), static_cast<int>(nl));
  }
  RETURN_IF_ERROR(y->Reset(comms_->mesh(), y_layout_, comms_->world().rank()));
  if (!strategy_.reduce_scatter) {
    RETURN_IF_ERROR(SumOver(strategy_.x_cols, partial_.data(), rows_ * nl));
    std::copy(partial_.begin(), partial_.end(), F32(y->local()));
    return Status::Ok();
  }
  // Each rank of x_cols receives the sum of its chunk of the rows; chunks
  // are padded to the largest for the collective.
  ASSIGN_OR_RETURN(Communicator * comm, comms_->Along(strategy_.x_cols));
  const int64_t parts = static_cast<int64_t>(chunk_rows_.size());
  const int64_t most = *std::max_element(chunk_rows_.begin(), chunk_rows_.end()) * nl;
  send_.assign(parts * most + most, 0.0f);  // the blocks, then the received one
  int64_t row = 0;
  for (int64_t j = 0; j < parts; ++j) {
    std::copy(partial_.begin() + row * nl, partial_.begin() + (row + chunk_rows_[j]) * nl,
              send_.begin() + j * most);
    row += chunk_rows_[j];
  }
  float* mine = send_.data() + parts * most;
  stats_.reduced_bytes += parts * most * static_cast<int64_t>(sizeof(float));
  RETURN_IF_ERROR(comm->ReduceScatter(send_.data(), mine, most, DType::kF32, ReduceOp::kSum));
  std::copy(mine, mine + y->local().size() / sizeof(float), F32(y->local()));
  return Status::Ok();
}

Status ParallelMatMul::Backward(const DTensor& x, const float* w, const DTensor& dy, DTensor* dx,
                                float* dw) {
  const Mesh& mesh = comms_->mesh();
  const int64_t rank = comms_->world().rank();
  const bool as_is = !x_redistributed_;
  const DTensor& in = as_is ? x : x_in_;  // the x Forward multiplied
  if (!forwarded_ || static_cast<int64_t>(in.local().size()) != rows_ * x_box_[1].size() * 4) {
    return FailedPreconditionError("MatMul " + strategy_.ToString() + ": Backward before Forward");
  }
  ASSIGN_OR_RETURN(const DTensor* grad, In(dy, y_layout_, &dy_in_));
  const int64_t kl = x_box_[1].size(), nl = w_box_[1].size();
  const float* dyl = F32(grad->local());
  if (strategy_.reduce_scatter) {  // the dual of the reduce-scatter: gather the rows
    ASSIGN_OR_RETURN(Communicator * comm, comms_->Along(strategy_.x_cols));
    std::vector<int64_t> counts;
    for (int64_t r : chunk_rows_) counts.push_back(r * nl);
    dy_rows_.assign(rows_ * nl, 0.0f);
    stats_.reduced_bytes += rows_ * nl * static_cast<int64_t>(sizeof(float));
    RETURN_IF_ERROR(
        comm->AllGatherV(dyl, counts[comm->rank()], dy_rows_.data(), counts, DType::kF32));
    dyl = dy_rows_.data();
  }
  // dx in x's own layout: as_is, that places every rank's box as
  // x_layout_ does.
  DTensor* out = as_is ? dx : &dx_out_;
  RETURN_IF_ERROR(as_is ? out->Reset(x.mesh(), x.layout(), rank)
                        : out->Reset(mesh, x_layout_, rank));
  std::fill(out->local().begin(), out->local().end(), char{0});
  dw_.assign(kl * nl, 0.0f);
  if (rows_ > 0 && kl > 0 && nl > 0) {
    kernels::MatmulBackward(F32(out->local()), dw_.data(), nullptr, dyl, F32(in.local()), w,
                            static_cast<int>(rows_), static_cast<int>(kl), static_cast<int>(nl));
  }
  // x fed every column block of w: its gradient sums over them; w's shard
  // met every row block of x: its gradient sums over those.
  RETURN_IF_ERROR(SumOver(strategy_.w_cols, F32(out->local()), rows_ * kl));
  RETURN_IF_ERROR(SumOver(strategy_.x_rows, dw_.data(), kl * nl));
  for (int64_t i = 0; i < kl * nl; ++i) dw[i] += dw_[i];
  if (as_is) return Status::Ok();
  RedistributeStats stats;
  RETURN_IF_ERROR(RedistributeInto(dx_out_, x.mesh(), x.layout(), comms_->world(), dx, &stats));
  stats_.redistributed_bytes += stats.sent_bytes;
  return Status::Ok();
}

}  // namespace tessera
