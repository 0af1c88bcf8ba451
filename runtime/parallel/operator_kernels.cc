// The operators' arithmetic and their conversions between placements
// (operators.h): what runs. operators.cc holds what plans (the strategies'
// checks and the placements they give), which the cost model reads
// without linking the kernels.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
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

void OpContext::SetContextParallel(Communicator* cp, CpAlgo algo) {
  cp_comm_ = cp;
  cp_size_ = cp != nullptr ? cp->size() : 1;
  cp_rank_ = cp != nullptr ? cp->rank() : 0;
  cp_algo_ = algo;
}

int64_t OpContext::CpBufferBytes() const {
  int64_t n = 0;
  for (const std::vector<float>& b : cp_buf_) n += static_cast<int64_t>(b.capacity());
  return n * static_cast<int64_t>(sizeof(float));
}

Status AttentionOp::Forward(OpContext& ctx, const Act& qkv, int T, float* att, Act* y) const {
  TraceSpan span("forward", info_.name);
  const int64_t n = ctx.LocalRows(qkv), r0 = ctx.FirstRow(qkv);
  if (n % T != 0 || r0 % T != 0) {
    return InvalidArgumentError("operator '" + info_.name + "': tp rank " +
                                std::to_string(ctx.tp_rank()) + " holds rows [" +
                                std::to_string(r0) + ", " + std::to_string(r0 + n) +
                                "), not whole sequences of " + std::to_string(T) +
                                " (cut the rows over tp only when each rank gets whole sequences)");
  }
  if ((cp_mode_ != Cp::kNone) != (ctx.cp() > 1) ||
      (cp_mode_ == Cp::kRing && ctx.cp_algo() != CpAlgo::kRing) ||
      (cp_mode_ == Cp::kUlysses && ctx.cp_algo() != CpAlgo::kUlysses)) {
    return InternalError("operator '" + info_.name + "': its strategy " +
                         info_.strategy.ToString() + " does not match cp " +
                         std::to_string(ctx.cp()) + " with cp_algo " +
                         std::string(CpAlgoName(ctx.cp_algo())));
  }
  if (cp_mode_ == Cp::kUlysses) return UlyssesForward(ctx, qkv, T, att, y);
  if (cp_mode_ == Cp::kRing) return RingForward(ctx, qkv, T, att, y);
  if (n == 0) return Status::Ok();
  const bool h = info_.inputs[0].split == 1;
  const int cl = static_cast<int>(h ? C_ / ctx.tp() : C_), nh = h ? heads_ / ctx.tp() : heads_;
  k::AttentionForward(y->data, att, qkv.data, static_cast<int>(n / T), T, cl, nh);
  return Status::Ok();
}

Status AttentionOp::Backward(OpContext& ctx, const Act& qkv, const float* att, int T, const Act& dy,
                             Act* dqkv) const {
  TraceSpan span("backward", info_.name);
  if (cp_mode_ == Cp::kUlysses) return UlyssesBackward(ctx, att, T, dy, dqkv);
  if (cp_mode_ == Cp::kRing) return RingBackward(ctx, qkv, att, T, dy, dqkv);
  const int64_t n = ctx.LocalRows(qkv);
  if (n == 0) return Status::Ok();
  const bool h = info_.inputs[0].split == 1;
  const int cl = static_cast<int>(h ? C_ / ctx.tp() : C_), nh = h ? heads_ / ctx.tp() : heads_;
  k::AttentionBackward(dqkv->data, dy.data, qkv.data, att, static_cast<int>(n / T), T, cl, nh);
  return Status::Ok();
}

namespace {

// Waits for `r`, the time counted as communication of `ctx`.
Status WaitCp(OpContext& ctx, Request& r) {
  if (!r.pending()) return Status::Ok();
  return ctx.TimedComm([&] { return r.Wait(); });
}

// An all-to-all over cp, timed as communication.
Status CpAllToAll(OpContext& ctx, const float* send, float* recv, int64_t count) {
  return ctx.TimedComm([&] { return ctx.cp_comm()->AllToAll(send, recv, count, DType::kF32); });
}

// Ulysses' reshuffles. Columns: a rank's n rows hold `g` groups of cl
// columns (q | k | v: 3; an output: 1), each cut into cp slices of wc =
// cl / cp; block j (to or from rank j) holds slice j of every group of
// every row, [n, g, wc]. Sequences: block j holds positions [j T, (j + 1)
// T) of every sequence, [B, T, w]; whole sequences are [B, cp T, w].
void ColumnsToRanks(const float* rows, int64_t n, int g, int64_t cl, int cp, float* blocks) {
  const int64_t wc = cl / cp;
  for (int j = 0; j < cp; ++j) {
    float* out = blocks + j * n * g * wc;
    for (int64_t i = 0; i < n; ++i) {
      for (int h = 0; h < g; ++h) {
        const float* from = rows + (i * g + h) * cl + j * wc;
        out = std::copy(from, from + wc, out);
      }
    }
  }
}

void RanksToColumns(const float* blocks, int64_t n, int g, int64_t cl, int cp, float* rows) {
  const int64_t wc = cl / cp;
  for (int j = 0; j < cp; ++j) {
    const float* in = blocks + j * n * g * wc;
    for (int64_t i = 0; i < n; ++i) {
      for (int h = 0; h < g; ++h, in += wc)
        std::copy(in, in + wc, rows + (i * g + h) * cl + j * wc);
    }
  }
}

void RanksToSequences(const float* blocks, int64_t B, int64_t T, int64_t w, int cp, float* whole) {
  for (int j = 0; j < cp; ++j) {
    for (int64_t b = 0; b < B; ++b) {
      const float* from = blocks + (j * B + b) * T * w;
      std::copy(from, from + T * w, whole + (b * cp + j) * T * w);
    }
  }
}

void SequencesToRanks(const float* whole, int64_t B, int64_t T, int64_t w, int cp, float* blocks) {
  for (int j = 0; j < cp; ++j) {
    for (int64_t b = 0; b < B; ++b) {
      const float* from = whole + (b * cp + j) * T * w;
      std::copy(from, from + T * w, blocks + (j * B + b) * T * w);
    }
  }
}

}  // namespace

// Ulysses: rank r holds positions [r T, (r + 1) T) of every sequence (T
// local) and cols = 3 x C' columns of q | k | v (C' this tp rank's). It
// sends rank j the j-th cp-th of each of q, k, v (heads j hc .. (j+1) hc of
// its own), receives every rank's positions of its own heads, attends over
// whole sequences, and sends each rank back its positions' outputs.
Status AttentionOp::UlyssesForward(OpContext& ctx, const Act& qkv, int T, float* att,
                                   Act* y) const {
  const int cp = ctx.cp();
  const int64_t n = ctx.LocalRows(qkv), B = n / T, Tw = static_cast<int64_t>(T) * cp;
  const int64_t cl = LocalHeads(ctx) * (C_ / heads_), wc = cl / cp;
  const int hc = LocalHeads(ctx) / cp;
  std::vector<float>& send = ctx.CpBuffer(0);
  std::vector<float>& recv = ctx.CpBuffer(1);
  send.resize(n * 3 * cl);
  recv.resize(n * 3 * cl);
  ColumnsToRanks(qkv.data, n, 3, cl, cp, send.data());
  RETURN_IF_ERROR(CpAllToAll(ctx, send.data(), recv.data(), n * 3 * wc));
  // Whole sequences of this rank's heads: [B, Tw, 3 wc], kept after the
  // weights for backward.
  float* whole = att + B * hc * Tw * Tw;
  RanksToSequences(recv.data(), B, T, 3 * wc, cp, whole);
  std::vector<float>& yw = ctx.CpBuffer(2);
  yw.resize(B * Tw * wc);
  k::AttentionForward(yw.data(), att, whole, static_cast<int>(B), static_cast<int>(Tw),
                      static_cast<int>(wc), hc);
  // Back: rank j gets its positions of these heads.
  SequencesToRanks(yw.data(), B, T, wc, cp, send.data());
  RETURN_IF_ERROR(CpAllToAll(ctx, send.data(), recv.data(), n * wc));
  RanksToColumns(recv.data(), n, 1, cl, cp, y->data);
  return Status::Ok();
}

Status AttentionOp::UlyssesBackward(OpContext& ctx, const float* att, int T, const Act& dy,
                                    Act* dqkv) const {
  const int cp = ctx.cp();
  const int64_t n = ctx.LocalRows(dy), B = n / T, Tw = static_cast<int64_t>(T) * cp;
  const int64_t cl = LocalHeads(ctx) * (C_ / heads_), wc = cl / cp;
  const int hc = LocalHeads(ctx) / cp;
  std::vector<float>& send = ctx.CpBuffer(0);
  std::vector<float>& recv = ctx.CpBuffer(1);
  send.resize(n * 3 * cl);
  recv.resize(n * 3 * cl);
  // The output gradient of this rank's heads, whole sequences.
  ColumnsToRanks(dy.data, n, 1, cl, cp, send.data());
  RETURN_IF_ERROR(CpAllToAll(ctx, send.data(), recv.data(), n * wc));
  std::vector<float>& dyw = ctx.CpBuffer(2);
  std::vector<float>& dw = ctx.CpBuffer(3);
  dyw.resize(B * Tw * wc);
  dw.resize(B * Tw * 3 * wc);
  RanksToSequences(recv.data(), B, T, wc, cp, dyw.data());
  const float* whole = att + B * hc * Tw * Tw;
  k::AttentionBackward(dw.data(), dyw.data(), whole, att, static_cast<int>(B), static_cast<int>(Tw),
                       static_cast<int>(wc), hc);
  // Each rank's positions of dq | dk | dv of these heads back to it.
  SequencesToRanks(dw.data(), B, T, 3 * wc, cp, send.data());
  RETURN_IF_ERROR(CpAllToAll(ctx, send.data(), recv.data(), n * 3 * wc));
  RanksToColumns(recv.data(), n, 3, cl, cp, dqkv->data);
  return Status::Ok();
}

namespace {

// Tags of the ring's messages: forward's key/value blocks, backward's
// key/value blocks and their gradients.
constexpr int kRingKv = 0x52000, kRingGrad = 0x52001;

// The key/value rows of `qkv` ([n, 3 cl]) packed as [n, 2 cl].
void PackKv(const float* qkv, int64_t n, int64_t cl, float* kv) {
  for (int64_t i = 0; i < n; ++i) {
    std::copy(qkv + i * 3 * cl + cl, qkv + (i + 1) * 3 * cl, kv + i * 2 * cl);
  }
}

// Which of the held block's chunks the local query chunk `qc` sees: the
// whole chunk (earlier positions), its causal diagonal (the same) or none.
enum class Sees { kNone, kAll, kDiagonal };
Sees Visibility(int q_chunk, int k_chunk) {
  return k_chunk < q_chunk ? Sees::kAll : k_chunk == q_chunk ? Sees::kDiagonal : Sees::kNone;
}

}  // namespace

// Ring attention: at step s rank r holds the keys and values of rank
// (r - s) mod cp, receiving the next block from r - 1 and sending the one in
// hand to r + 1 while it computes. att keeps [n, cl] outputs then [B, nh,
// T] log-sum-exps.
Status AttentionOp::RingForward(OpContext& ctx, const Act& qkv, int T, float* att, Act* y) const {
  const int cp = ctx.cp(), r = ctx.cp_rank(), nh = LocalHeads(ctx);
  const int64_t n = ctx.LocalRows(qkv), B = n / T, cl = nh * (C_ / heads_), hs = C_ / heads_;
  Communicator& comm = *ctx.cp_comm();
  const int next = (r + 1) % cp, prev = (r + cp - 1) % cp;
  std::vector<float>& cur = ctx.CpBuffer(0);
  std::vector<float>& nxt = ctx.CpBuffer(1);
  std::vector<float>& ml = ctx.CpBuffer(2);
  cur.resize(n * 2 * cl);
  nxt.resize(n * 2 * cl);
  ml.resize(2 * n * nh);
  float* m = ml.data();
  float* l = m + n * nh;
  std::fill(m, m + n * nh, -std::numeric_limits<float>::infinity());
  std::fill(l, l + n * nh, 0.0f);
  std::fill(y->data, y->data + n * cl, 0.0f);
  PackKv(qkv.data, n, cl, cur.data());
  const SequenceSplit split = ctx.Split(T);
  const int64_t c = split.chunk_size();
  const k::SeqRows<const float> q{qkv.data, 3 * cl, T};
  const k::SeqRows<float> o{y->data, cl, T};
  for (int s = 0; s < cp; ++s) {
    Request send, recv;
    if (s + 1 < cp) {
      ASSIGN_OR_RETURN(recv, comm.IRecv(nxt.data(), n * 2 * cl, DType::kF32, prev, kRingKv));
      ASSIGN_OR_RETURN(send, comm.ISend(cur.data(), n * 2 * cl, DType::kF32, next, kRingKv));
    }
    const SequenceSplit held = SequenceSplit::Of(CpAlgo::kRing, split.T, cp, (r - s + cp) % cp);
    const k::SeqRows<const float> kv{cur.data(), 2 * cl, T};
    for (int qc = 0; qc < 2; ++qc) {
      for (int kc = 0; kc < 2; ++kc) {
        const Sees sees = Visibility(split.ChunkIndex(qc), held.ChunkIndex(kc));
        if (sees == Sees::kNone) continue;
        // m and l of query chunk qc: rows qc c .. of [B, nh, T].
        k::AttentionBlockForward(o.Offset(qc * c), m + qc * c, l + qc * c, T, q.Offset(qc * c),
                                 kv.Offset(kc * c), kv.Offset(kc * c, cl), static_cast<int>(B),
                                 static_cast<int>(c), static_cast<int>(c), static_cast<int>(hs), nh,
                                 sees == Sees::kDiagonal);
      }
    }
    RETURN_IF_ERROR(WaitCp(ctx, send));
    RETURN_IF_ERROR(WaitCp(ctx, recv));
    std::swap(cur, nxt);
  }
  float* lse = att + n * cl;
  k::AttentionBlockFinish(o, m, l, lse, static_cast<int>(B), T, static_cast<int>(hs), nh);
  std::copy(y->data, y->data + n * cl, att);
  return Status::Ok();
}

// Backward: the key/value blocks go round again, each with the gradient
// of its keys and values, which every rank adds its share to before
// passing it on; after cp steps each rank holds its own blocks' whole
// gradient.
Status AttentionOp::RingBackward(OpContext& ctx, const Act& qkv, const float* att, int T,
                                 const Act& dy, Act* dqkv) const {
  const int cp = ctx.cp(), r = ctx.cp_rank(), nh = LocalHeads(ctx);
  const int64_t n = ctx.LocalRows(qkv), B = n / T, cl = nh * (C_ / heads_), hs = C_ / heads_;
  Communicator& comm = *ctx.cp_comm();
  const int next = (r + 1) % cp, prev = (r + cp - 1) % cp;
  std::vector<float>& cur = ctx.CpBuffer(0);
  std::vector<float>& nxt = ctx.CpBuffer(1);
  std::vector<float>& delta = ctx.CpBuffer(2);
  // The gradients travelling with the blocks: the one being added to,
  // the one being sent, the one arriving.
  std::vector<float>* grad[3] = {&ctx.CpBuffer(3), &ctx.CpBuffer(4), &ctx.CpBuffer(5)};
  for (std::vector<float>* g : grad) g->resize(n * 2 * cl);
  cur.resize(n * 2 * cl);
  nxt.resize(n * 2 * cl);
  delta.resize(n * nh);
  const float* out = att;
  const float* lse = att + n * cl;
  const SequenceSplit split = ctx.Split(T);
  const int64_t c = split.chunk_size();
  k::AttentionBlockDelta(delta.data(), {dy.data, cl, T}, {out, cl, T}, static_cast<int>(B), T,
                         static_cast<int>(hs), nh);
  PackKv(qkv.data, n, cl, cur.data());
  // dq accumulates in place; dk, dv of the held block in grad[0].
  for (int64_t i = 0; i < n; ++i)
    std::fill(dqkv->data + i * 3 * cl, dqkv->data + (i + 1) * 3 * cl, 0.0f);
  const k::SeqRows<const float> q{qkv.data, 3 * cl, T}, dout{dy.data, cl, T};
  const k::SeqRows<float> dq{dqkv->data, 3 * cl, T};
  Request grad_send, grad_recv;
  for (int s = 0; s < cp; ++s) {
    Request send, recv;
    if (s + 1 < cp) {
      ASSIGN_OR_RETURN(recv, comm.IRecv(nxt.data(), n * 2 * cl, DType::kF32, prev, kRingKv));
      ASSIGN_OR_RETURN(send, comm.ISend(cur.data(), n * 2 * cl, DType::kF32, next, kRingKv));
    }
    std::vector<float>& mine = *grad[0];
    std::fill(mine.begin(), mine.end(), 0.0f);
    const SequenceSplit held = SequenceSplit::Of(CpAlgo::kRing, split.T, cp, (r - s + cp) % cp);
    const k::SeqRows<const float> kv{cur.data(), 2 * cl, T};
    const k::SeqRows<float> dkv{mine.data(), 2 * cl, T};
    for (int qc = 0; qc < 2; ++qc) {
      for (int kc = 0; kc < 2; ++kc) {
        const Sees sees = Visibility(split.ChunkIndex(qc), held.ChunkIndex(kc));
        if (sees == Sees::kNone) continue;
        k::AttentionBlockBackward(dq.Offset(qc * c), dkv.Offset(kc * c), dkv.Offset(kc * c, cl),
                                  dout.Offset(qc * c), q.Offset(qc * c), kv.Offset(kc * c),
                                  kv.Offset(kc * c, cl), lse + qc * c, delta.data() + qc * c, T,
                                  static_cast<int>(B), static_cast<int>(c), static_cast<int>(c),
                                  static_cast<int>(hs), nh, sees == Sees::kDiagonal);
      }
    }
    // Add what the earlier ranks added to this block, and pass it on.
    if (s > 0) {
      RETURN_IF_ERROR(WaitCp(ctx, grad_recv));
      const std::vector<float>& in = *grad[2];
      for (size_t i = 0; i < mine.size(); ++i) mine[i] += in[i];
    }
    RETURN_IF_ERROR(WaitCp(ctx, grad_send));  // the buffer sent before is free
    std::swap(grad[0], grad[1]);              // mine becomes the one being sent
    ASSIGN_OR_RETURN(grad_send,
                     comm.ISend(grad[1]->data(), n * 2 * cl, DType::kF32, next, kRingGrad));
    ASSIGN_OR_RETURN(grad_recv,
                     comm.IRecv(grad[2]->data(), n * 2 * cl, DType::kF32, prev, kRingGrad));
    RETURN_IF_ERROR(WaitCp(ctx, send));
    RETURN_IF_ERROR(WaitCp(ctx, recv));
    std::swap(cur, nxt);
  }
  RETURN_IF_ERROR(WaitCp(ctx, grad_recv));
  RETURN_IF_ERROR(WaitCp(ctx, grad_send));
  // This rank's own keys' and values' gradient, whole.
  const std::vector<float>& own = *grad[2];
  for (int64_t i = 0; i < n; ++i) {
    std::copy(own.data() + i * 2 * cl, own.data() + (i + 1) * 2 * cl, dqkv->data + i * 3 * cl + cl);
  }
  return Status::Ok();
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
  // Runs of consecutive positions: row % T, or under context parallelism
  // this rank's positions (its chunks of every sequence).
  const SequenceSplit split = ctx.Split(T);
  for (int64_t i = r0; i < r0 + n;) {
    const int64_t t = i % T, len = std::min<int64_t>(split.RunEnd(t) - t, r0 + n - i);
    const int64_t pos = split.Position(t);
    k::EncoderForward(y->data + (i - r0) * cl, tokens + i, wte, wpe ? wpe + pos * cl : nullptr, 1,
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
  const SequenceSplit split = ctx.Split(T);
  for (int64_t i = r0; i < r0 + n;) {
    const int64_t t = i % T, len = std::min<int64_t>(split.RunEnd(t) - t, r0 + n - i);
    const int64_t pos = split.Position(t);
    k::EncoderBackward(dwte, dwpe ? dwpe + pos * cl : nullptr, dy.data + (i - r0) * cl, tokens + i,
                       1, static_cast<int>(len), static_cast<int>(cl), v0, vl);
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
