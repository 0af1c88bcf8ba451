// The operators' arithmetic and their conversions between placements
// (operators.h): what runs. operators.cc holds what plans (the strategies'
// checks and the placements they give), which the cost model reads
// without linking the kernels.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>

#include "core/timer.h"
#include "core/trace.h"
#include "runtime/kernels.h"
#include "runtime/parallel/dtensor.h"
#include "runtime/parallel/operators.h"

namespace tessera {

namespace k = kernels;

Status OpContext::Collective(const std::function<Result<Request>()>& issue,
                             const std::function<Status()>& block) {
  if (turns_ == nullptr) {
    AddElapsed t(&comm_seconds_);
    return block();
  }
  ASSIGN_OR_RETURN(Request r, issue());
  turns_->Pass(copy_);
  Status s = r.Wait();
  const auto done = std::chrono::steady_clock::now();
  turns_->Acquire(copy_);
  // Exposed: from the turn's return (nothing else left to compute) to the
  // collective's completion; none when it completed first.
  const auto arrived = turns_->Arrived(copy_);
  if (done > arrived) comm_seconds_ += std::chrono::duration<double>(done - arrived).count();
  return s;
}

Status OpContext::AllReduce(void* data, int64_t n, DType dtype, ReduceOp op) {
  if (tp_size_ == 1) return Status::Ok();
  return Collective([&] { return comm_->IAllReduce(data, data, n, dtype, op); },
                    [&] { return comm_->AllReduce(data, data, n, dtype, op); });
}

// A Redistribute step's plan with its staging buffers.
struct OpContext::Planned {
  RedistributionPlan plan;
  std::vector<char> send, recv;
  std::vector<float> whole;  // a regrouped tensor, whole
};
struct OpContext::PlanCache {
  std::map<std::tuple<int, int, int, int, int64_t, int64_t>, std::unique_ptr<Planned>> by_key;
};

Result<OpContext::Planned*> OpContext::PlanFor(const Placement& from, const Placement& to,
                                               int64_t rows, int64_t cols) {
  if (plans_ == nullptr) plans_ = std::make_shared<PlanCache>();
  auto& slot = plans_->by_key[{from.split, from.groups, to.split, to.groups, rows, cols}];
  if (slot == nullptr) {
    ASSIGN_OR_RETURN(RedistributionPlan plan,
                     RedistributionPlan::Create(mesh_, from.ToLayout(rows, cols), mesh_,
                                                to.ToLayout(rows, cols), tp_rank_));
    slot = std::make_unique<Planned>(Planned{std::move(plan), {}, {}, {}});
    ++plans_built_;
  }
  return slot.get();
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
    switch (s) {
      case RedistStep::kAllReduce: {
        const int64_t n = LocalSize(a);
        RETURN_IF_ERROR(Collective(
            [&] { return comm_->IAllReduce(a.data, a.data, n, DType::kF32, ReduceOp::kSum); },
            [&] { return comm_->AllReduce(a.data, a.data, n, DType::kF32, ReduceOp::kSum); }));
        a.place.partial = false;
        if (a.place == to) return a;
        break;
      }
      case RedistStep::kReduceScatter: {
        storage->resize(LocalSize(out));
        const int64_t n = LocalSize(out);
        RETURN_IF_ERROR(Collective(
            [&] {
              return comm_->IReduceScatter(a.data, storage->data(), n, DType::kF32, ReduceOp::kSum);
            },
            [&] {
              return comm_->ReduceScatter(a.data, storage->data(), n, DType::kF32, ReduceOp::kSum);
            }));
        out.data = storage->data();
        return out;
      }
      case RedistStep::kAllGather: {
        storage->resize(LocalSize(out));
        const int64_t n = LocalSize(a);
        RETURN_IF_ERROR(
            Collective([&] { return comm_->IAllGather(a.data, n, storage->data(), DType::kF32); },
                       [&] { return comm_->AllGather(a.data, n, storage->data(), DType::kF32); }));
        out.data = storage->data();
        return out;
      }
      case RedistStep::kSlice:
        return slice(a.data);
      case RedistStep::kRedistribute: {
        AddElapsed timer(&comm_seconds_);
        // Columns cut in different groups (by columns <-> by heads): a
        // shard of one is not a box of the other's view, which the planner
        // moves, unless the cuts fall on the groups' edges. Such a tensor
        // goes through the whole, then is sliced.
        const bool regroup = a.place.split == 1 && to.split == 1 && a.place.groups != to.groups;
        const Placement via = regroup ? Placement{-1} : to;
        auto plan = PlanFor(a.place.Resolved(), via, a.rows, a.cols);
        if (!plan.ok()) {
          return Status(plan.status().code(),
                        "operator '" + op + "' " + what + ": " + plan.status().message());
        }
        Planned& r = **plan;
        float* dst;
        if (regroup) {
          r.whole.resize(r.plan.dst_bytes() / sizeof(float));
          dst = r.whole.data();
        } else {
          storage->resize(LocalSize(out));
          dst = storage->data();
        }
        const Status st = r.plan.Run(a.data, dst, *comm_, &r.send, &r.recv);
        if (!st.ok())
          return Status(st.code(), "operator '" + op + "' " + what + ": " + st.message());
        if (regroup) return slice(r.whole.data());
        out.data = storage->data();
        return out;
      }
    }
  }
  return a;
}

void LinearOp::Forward(const OpContext& ctx, const Act& x, const float* w, const float* b,
                       Act* y) const {
  TraceSpan span("forward", info_.name);
  const int n = static_cast<int>(ctx.LocalRows(x));
  if (n == 0) return;
  // A partial output gets the bias once, on tp rank 0.
  const float* bias = info_.output.partial && ctx.tp_rank() != 0 ? nullptr : b;
  k::MatmulForward(y->data, x.data, w, bias, n, static_cast<int>(ctx.LocalCols(x)),
                   static_cast<int>(ctx.LocalCols(*y)));
}

void LinearOp::Backward(const OpContext& ctx, const Act& x, const float* w, const Act& dy, Act* dx,
                        float* dw, float* db) const {
  TraceSpan span("backward", info_.name);
  const int n = static_cast<int>(ctx.LocalRows(x));
  if (n == 0) return;
  k::MatmulBackward(dx == nullptr ? nullptr : dx->data, dw, db, dy.data, x.data, w, n,
                    static_cast<int>(ctx.LocalCols(x)), static_cast<int>(ctx.LocalCols(dy)));
}

void LayerNormOp::Forward(const OpContext& ctx, const Act& x, const float* w, const float* b,
                          Act* y, float* mean, float* rstd) const {
  TraceSpan span("forward", info_.name);
  const int n = static_cast<int>(ctx.LocalRows(x));
  if (n > 0) k::LayerNormForward(y->data, mean, rstd, x.data, w, b, n, static_cast<int>(x.cols));
}

void LayerNormOp::Backward(const OpContext& ctx, const Act& x, const float* w, const float* mean,
                           const float* rstd, const Act& dy, Act* dx, float* dw, float* db,
                           bool accumulate) const {
  TraceSpan span("backward", info_.name);
  const int64_t n = ctx.LocalRows(x);
  if (!accumulate) std::fill(dx->data, dx->data + n * x.cols, 0.0f);
  if (n > 0) {
    k::LayerNormBackward(dx->data, dw, db, dy.data, x.data, w, mean, rstd, static_cast<int>(n),
                         static_cast<int>(x.cols));
  }
}

Status AttentionOp::Forward(const OpContext& ctx, const Act& qkv, int T, float* att, Act* y) const {
  TraceSpan span("forward", info_.name);
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
  TraceSpan span("backward", info_.name);
  const int64_t n = ctx.LocalRows(qkv);
  if (n == 0) return;
  const bool h = info_.inputs[0].split == 1;
  const int cl = static_cast<int>(h ? C_ / ctx.tp() : C_), nh = h ? heads_ / ctx.tp() : heads_;
  k::AttentionBackward(dqkv->data, dy.data, qkv.data, att, static_cast<int>(n / T), T, cl, nh);
}

void GeluOp::Forward(const OpContext& ctx, const Act& x, Act* y) const {
  TraceSpan span("forward", info_.name);
  k::GeluForward(y->data, x.data, ctx.LocalSize(x));
}

void GeluOp::Backward(const OpContext& ctx, const Act& x, const Act& dy, Act* dx) const {
  TraceSpan span("backward", info_.name);
  k::GeluBackward(dx->data, x.data, dy.data, ctx.LocalSize(x));
}

void AddOp::Forward(const OpContext& ctx, const Act& a, const Act& b, Act* y) const {
  TraceSpan span("forward", info_.name);
  k::ResidualForward(y->data, a.data, b.data, ctx.LocalSize(a));
}

void EmbeddingOp::Forward(const OpContext& ctx, const int32_t* tokens, int T, const float* wte,
                          const float* wpe, Act* y) const {
  TraceSpan span("forward", info_.name);
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
  TraceSpan span("backward", info_.name);
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

void LmHeadOp::Forward(const OpContext& ctx, const Act& x, const float* wte, Act* logits) const {
  TraceSpan span("forward", info_.name);
  const int n = static_cast<int>(ctx.LocalRows(x));
  if (n == 0) return;
  k::MatmulTransposedForward(logits->data, x.data, wte, n, static_cast<int>(ctx.LocalCols(x)),
                             static_cast<int>(ctx.LocalCols(*logits)));
}

void LmHeadOp::Backward(const OpContext& ctx, const Act& x, const float* wte, const Act& dlogits,
                        Act* dx, float* dwte) const {
  TraceSpan span("backward", info_.name);
  const int n = static_cast<int>(ctx.LocalRows(x));
  if (n == 0) return;
  k::MatmulTransposedBackward(dx->data, dwte, dlogits.data, x.data, wte, n,
                              static_cast<int>(ctx.LocalCols(x)),
                              static_cast<int>(ctx.LocalCols(dlogits)));
}

Result<double> CrossEntropyOp::Forward(OpContext& ctx, const Act& logits, const int32_t* targets,
                                       float* probs, std::vector<float>* max,
                                       std::vector<double>* sums) const {
  TraceSpan span("forward", info_.name);
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
  TraceSpan span("backward", info_.name);
  const int64_t n = ctx.LocalRows(logits), r0 = ctx.FirstRow(logits);
  if (n == 0) return;
  const int64_t v0 = logits.place.split == 1 ? ChunkOf({0, V_}, ctx.tp(), ctx.tp_rank()).begin : 0;
  // The kernel divides by its rows; the loss is the mean over all of them.
  const float scale = dloss * static_cast<float>(n) / static_cast<float>(logits.rows);
  k::SoftmaxCrossEntropyBackward(dlogits, probs, targets + r0, scale, static_cast<int>(n),
                                 static_cast<int>(ctx.LocalCols(logits)), v0);
}

}  // namespace tessera
