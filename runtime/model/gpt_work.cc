#include "runtime/model/gpt_work.h"

#include <algorithm>

#include "runtime/kernels.h"

namespace tessera {
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
      switch (s) {
        case RedistStep::kAllReduce:
          w->AddCollective(CollectiveKind::kAllReduce, from.split == -1 ? whole : whole / tp);
          break;
        case RedistStep::kReduceScatter:
          w->AddCollective(CollectiveKind::kReduceScatter, whole);
          break;
        case RedistStep::kAllGather:
          w->AddCollective(CollectiveKind::kAllGather, whole);
          break;
        case RedistStep::kRedistribute:
          // An all-to-all, with the shard copied into a DTensor, packed,
          // unpacked and copied out (OpContext::Convert): each read and
          // written twice on either side.
          w->bytes += 4.0 * (Local(from, rows, cols) + Local(to, rows, cols));
          w->AddCollective(CollectiveKind::kAllToAll, whole / tp);
          break;
        case RedistStep::kSlice:
          w->bytes += 2.0 * Local(to, rows, cols);
          break;
      }
    }
  }
  // An edge's forward conversion.
  void Forward(const GptGraph::Edge& e, int64_t rows, StageWork* w) const {
    Comm(e.from, e.to, rows, e.cols, w);
  }
  // Its backward: the consumer's input gradient back to the producer's
  // placement.
  void Backward(const GptGraph::Edge& e, int64_t rows, StageWork* w) const {
    Comm(e.grad, e.from.Resolved(), rows, e.cols, w);
  }
  // A linear's forward flops: rows x its input's columns x its output's.
  double LinearFlops(const OpInfo& op, int64_t rows, int64_t k, int64_t m) const {
    return 2.0 * Rows(op.output, rows) * Cols(op.inputs[0], k) * Cols(op.output, m);
  }
};

constexpr int K(Kernel k) { return static_cast<int>(k); }

// Floats of a vocabulary-sized [V, C] weight cut as `split` on tp rank 0.
int64_t VocabFloats(int split, int64_t V, int64_t C, int tp) {
  return split == 0 ? (V + tp - 1) / tp * C : split == 1 ? V * ((C + tp - 1) / tp) : V * C;
}

// One half of a block, edge by edge as BlockForward and BackwardStage run
// it (GptGraph::HalfEdges' order).
class HalfEstimator {
 public:
  HalfEstimator(const GptConfig& config, int tp, const GptGraph::HalfOps& h, Placement x, int64_t N,
                int T, Recompute rc, bool shares)
      : config_(config),
        h_(h),
        z_{tp},
        x_(x),
        N_(N),
        T_(T),
        C_(config.embed),
        rc_(rc),
        shares_(shares),
        attention_(h.attn != nullptr),
        e_(GptGraph::HalfEdges(h, x, config.embed)) {}

  HalfWork Run() {
    IntoNorm();
    IntoFirstLinear();
    IntoMiddle();
    IntoSecondLinear();
    IntoAdd();
    Backward();
    return r_;
  }

 private:
  enum { kNorm, kFirst, kMiddle, kSecond, kAdd };  // the half's edges and operators, in order
  enum { kAddStream = 4, kAddBranch = 5 };
  StageWork& fw() { return r_.forward; }   // its activations are the slot's (or the scratch's)
  StageWork& bw() { return r_.backward; }  // and what recompute does again

  // Each operator's share (with the conversions into it and their duals):
  // what the forward and the backward gained since the last mark.
  void Mark(int op) {
    if (!shares_) return;
    StageWork both = fw();
    both.Add(bw());
    r_.ops[op].Add(Since(both, seen_));
    r_.forward_ops[op].Add(Since(fw(), seen_fw_));
    seen_ = both;
    seen_fw_ = fw();
  }
  void Linear(const LinearOp& op, int64_t K, int64_t M) {
    const double f = z_.LinearFlops(op.info(), N_, K, M);
    fw().flops += f;
    bw().flops += 2 * f;
    if (op.info().rows_over_tp && z_.tp > 1) bw().tp_sum_floats += LinearFloats(op, K, M, z_.tp);
  }
  // An edge's backward conversion into shared buffer `id`.
  void Grad(const GptGraph::Edge& e, int id) {
    Grow(&bw(), id, z_.Storage(e.grad, e.from.Resolved(), N_, e.cols));
    z_.Backward(e, N_, &bw());
  }

  void IntoNorm() {
    const GptGraph::Edge& e = e_[kNorm];
    const OpInfo& ln = h_.ln->info();
    fw().slot_bytes += z_.Storage(e.from, e.to, N_, C_);
    z_.Forward(e, N_, &fw());
    fw().slot_bytes += z_.Local(ln.output, N_, C_) + 2 * 4 * z_.Rows(ln.output, N_);
    fw().kernel[K(Kernel::kLayerNormForward)] += z_.Elements(e.to, N_, C_);
    bw().kernel[K(Kernel::kLayerNormBackward)] += z_.Elements(e.to, N_, C_);
    if (ln.rows_over_tp && z_.tp > 1) bw().tp_sum_floats += 2 * C_;
    Mark(kNorm);
  }
  void IntoFirstLinear() {
    const GptGraph::Edge& e = e_[kFirst];
    z_.Forward(e, N_, &fw());
    if (GptGraph::Regathers(e)) {
      Grow(&fw(), kGather, z_.Local(e.to, N_, C_));
      z_.Forward(e, N_, &bw());
    } else {
      fw().slot_bytes += z_.Storage(e.from, e.to, N_, C_);
    }
    Linear(*h_.in, C_, e_[kMiddle].cols);
    fw().slot_bytes += z_.Local(h_.in->info().output, N_, e_[kMiddle].cols);
    Mark(kFirst);
  }
  void IntoMiddle() {
    const GptGraph::Edge& e = e_[kMiddle];
    fw().slot_bytes += z_.Storage(e.from, e.to, N_, e.cols);
    z_.Forward(e, N_, &fw());
    if (attention_) {
      AttentionCore();
    } else {
      const Placement out = h_.gelu->info().output;
      fw().slot_bytes += z_.Local(out, N_, 4 * C_);
      fw().kernel[K(Kernel::kGeluForward)] += z_.Elements(out, N_, 4 * C_);
      bw().kernel[K(Kernel::kGeluBackward)] += z_.Elements(out, N_, 4 * C_);
      z_.Forward(e_[kSecond], N_, &fw());
    }
    Mark(kMiddle);
  }
  // The attention core: what selective recompute runs again, with the
  // conversion of its output for c_proj.
  void AttentionCore() {
    if (h_.attn->cp_mode() != AttentionOp::Cp::kNone) return ContextAttentionCore();
    StageWork core;
    const Placement qkv = e_[kMiddle].to;
    const int64_t seqs = z_.Rows(qkv, N_) / T_;
    const int64_t heads = qkv.split == 1 && z_.tp > 1 ? config_.heads / z_.tp : config_.heads;
    const int64_t hs = C_ / config_.heads;
    const double scores = static_cast<double>(seqs) * heads * kernels::AttentionScores(T_);
    FinishCore(&core, scores, hs, seqs * heads * T_ * T_ * 4);
  }
  // The core's scores (forward and backward), what it keeps (`keep`
  // bytes, and its output) in the slot or, recomputed, in the scratch, the
  // conversion of its output for c_proj; selective recompute runs it all
  // again in backward.
  void FinishCore(StageWork* core, double scores, int64_t hs, int64_t keep) {
    core->kernel[K(Kernel::kAttentionForwardScores)] += scores;
    core->kernel[K(Kernel::kAttentionForwardProducts)] += 2.0 * scores * hs;
    const int64_t y = z_.Local(h_.attn->info().output, N_, C_);
    if (rc_ == Recompute::kNone) {
      core->slot_bytes += keep + y;
    } else {
      Grow(core, kScratchAtt, keep);
      Grow(core, kScratchY, y);
    }
    z_.Forward(e_[kSecond], N_, core);
    bw().kernel[K(Kernel::kAttentionBackwardScores)] += scores;
    bw().kernel[K(Kernel::kAttentionBackwardProducts)] += 4.0 * scores * hs;
    fw().Add(*core);
    if (rc_ == Recompute::kSelective) {
      core->slot_bytes = 0;
      bw().Add(*core);
    }
  }
  // Under context parallelism (AttentionOp::RingForward, UlyssesForward):
  // the scores each rank computes, what it keeps, its exchanges over cp
  // and their buffers (OpContext::CpBuffer, by index).
  void ContextAttentionCore() {
    StageWork core;
    const Placement qkv = e_[kMiddle].to;
    const int64_t n = z_.Rows(qkv, N_), seqs = n / T_, cp = h_.attn->cp();
    const int64_t heads = qkv.split == 1 && z_.tp > 1 ? config_.heads / z_.tp : config_.heads;
    const int64_t hs = C_ / config_.heads, cl = heads * hs, Tw = T_ * cp;
    constexpr int kA2a = static_cast<int>(CollectiveKind::kAllToAll);
    constexpr int kP2p = static_cast<int>(CollectiveKind::kSendRecv);
    auto exchange = [](StageWork* w, int kind, int64_t count, double floats) {
      w->cp_count[kind] += static_cast<int>(count);
      w->cp_bytes[kind] += floats * 4 * count;
    };
    double scores = 0;
    int64_t keep = 0;
    if (h_.attn->cp_mode() == AttentionOp::Cp::kUlysses) {
      // Whole sequences of heads / cp: their weights and gathered q|k|v;
      // q|k|v in and y out, dy in and dq|dk|dv out.
      const int64_t hc = heads / cp;
      scores = static_cast<double>(seqs) * hc * kernels::AttentionScores(static_cast<int>(Tw));
      keep = (seqs * hc * Tw * Tw + seqs * Tw * 3 * (cl / cp)) * 4;
      exchange(&core, kA2a, 1, static_cast<double>(n) * 3 * cl);
      exchange(&core, kA2a, 1, static_cast<double>(n) * cl);
      exchange(&bw(), kA2a, 1, static_cast<double>(n) * cl);
      exchange(&bw(), kA2a, 1, static_cast<double>(n) * 3 * cl);
      core.cp_buffer_bytes = (3 + 3 + 1 + 3) * n * cl * 4;
      // Packing for and unpacking from each all-to-all (read and written).
      core.bytes += 16.0 * n * cl * 4;
      bw().bytes += 16.0 * n * cl * 4;
    } else {
      // The zigzag: per sequence and head two diagonal blocks and 2 cp - 1
      // whole ones of c = T / 2 positions (a diagonal block's products run
      // whole, masked after); the output and a log-sum-exp per row and
      // head kept. Forward sends its key/value block on in cp - 1 steps,
      // each under a step's compute; backward the blocks again and cp
      // gradient blocks, every step's compute under one.
      const double c = T_ / 2;
      scores = static_cast<double>(seqs) * heads * (2.0 * cp + 1) * c * c;
      keep = (n * cl + n * heads) * 4;
      exchange(&core, kP2p, cp - 1, static_cast<double>(n) * 2 * cl);
      exchange(&bw(), kP2p, 2 * cp - 1, static_cast<double>(n) * 2 * cl);
      core.cp_hiding[K(Kernel::kAttentionForwardScores)] += scores * (cp - 1) / cp;
      core.cp_hiding[K(Kernel::kAttentionForwardProducts)] += 2.0 * scores * hs * (cp - 1) / cp;
      bw().cp_hiding[K(Kernel::kAttentionBackwardScores)] += scores;
      bw().cp_hiding[K(Kernel::kAttentionBackwardProducts)] += 4.0 * scores * hs;
      core.cp_buffer_bytes = (10 * n * cl + 2 * n * heads) * 4;
      // Copies: forward packs the keys and values, clears and keeps the
      // output; backward packs again, clears dq and each step's gradient
      // block, adds the arriving one, and copies its own out.
      core.bytes += 7.0 * n * cl * 4;
      bw().bytes += (11.0 + 2.0 * cp + 6.0 * (cp - 1)) * n * cl * 4;
    }
    FinishCore(&core, scores, hs, keep);
  }
  // The second linear, its output transient.
  void IntoSecondLinear() {
    const GptGraph::Edge& e = e_[kSecond];
    fw().slot_bytes += z_.Storage(e.from, e.to, N_, e.cols);
    Linear(*h_.out, e.cols, C_);
    Grow(&fw(), kOutTmp, z_.Local(h_.out->info().output, N_, C_));
    Mark(kSecond);
  }
  // add(x, out): x converted unless the layer norm's conversion serves.
  void IntoAdd() {
    const GptGraph::Edge &stream = e_[kAddStream], &branch = e_[kAddBranch];
    if (stream.to != e_[kNorm].to) {
      fw().slot_bytes += z_.Storage(stream.from, stream.to, N_, C_);
      z_.Forward(stream, N_, &fw());
    }
    Grow(&fw(), kConvTmp, z_.Storage(branch.from, branch.to, N_, C_));
    z_.Forward(branch, N_, &fw());
    const Placement out = h_.add->info().output;
    fw().slot_bytes += z_.Local(out, N_, C_);
    fw().kernel[K(Kernel::kResidualAdd)] += z_.Elements(out, N_, C_);
    Mark(kAdd);
  }
  // Each edge's dual, into the shared gradient buffers.
  void Backward() {
    Grow(&bw(), kDres, z_.Local(x_.Resolved(), N_, C_));
    Grad(e_[kAddBranch], kDm);
    Mark(kAdd);
    const GptGraph::Edge &second = e_[kSecond], &middle = e_[kMiddle], &first = e_[kFirst];
    Grow(&bw(), attention_ ? kDy : kDgIn, z_.Local(second.grad, N_, second.cols));
    Grad(second, attention_ ? kDattnY : kDg);
    Mark(kSecond);
    Grow(&bw(), attention_ ? kDqkvIn : kDfIn, z_.Local(middle.to, N_, middle.cols));
    Grad(middle, attention_ ? kDqkv : kDf);
    Mark(kMiddle);
    Grow(&bw(), kDhIn, z_.Local(first.grad, N_, C_));
    Grad(first, kDh);
    Mark(kFirst);
    NormAndAddBackward();
    Mark(kNorm);
  }
  // The layer norm's and the add's gradients of the stream
  // (GptGraph::LayerNormBackward): fused when both take the stream as it is;
  // else the layer norm's gradient into a zeroed buffer, summed with the
  // add's by a residual add (before or after the conversions).
  void NormAndAddBackward() {
    const GptGraph::Edge &norm = e_[kNorm], &stream = e_[kAddStream];
    if (norm.to == stream.to && norm.from == norm.to) return;
    Grow(&bw(), kDLnIn, z_.Local(norm.to, N_, C_));
    bw().bytes += z_.Local(norm.to, N_, C_);
    if (norm.to == stream.to) {
      bw().kernel[K(Kernel::kResidualAdd)] += z_.Elements(norm.to, N_, C_);
      Grad(norm, kDres2);
    } else {
      Grad(stream, kTmp);
      Grad(norm, kDAdd);
      Grow(&bw(), kDres2, z_.Local(x_.Resolved(), N_, C_));
      bw().kernel[K(Kernel::kResidualAdd)] += z_.Elements(x_.Resolved(), N_, C_);
    }
  }

  const GptConfig& config_;
  const GptGraph::HalfOps& h_;
  const Sizer z_;
  const Placement x_;
  const int64_t N_;
  const int T_;
  const int64_t C_;
  const Recompute rc_;
  const bool shares_;
  const bool attention_;
  const std::array<GptGraph::Edge, 6> e_;
  HalfWork r_;
  StageWork seen_, seen_fw_;
};

// The transfer of a stage's output to the next stage (whole), and of its
// gradient back.
StageWork ToNextStage(const Sizer& z, const GptGraph::Edge& e, int64_t N, int64_t C) {
  StageWork w;
  w.slot_bytes += z.Storage(e.from, e.to, N, C);
  z.Forward(e, N, &w);
  z.Backward(e, N, &w);
  Grow(&w, kTmp, N * C * 4);
  w.bytes += 2.0 * N * C * 4;  // the next stage's gradient copied in
  Grow(&w, kDres2, z.Storage(e.to, e.from.Resolved(), N, C));
  return w;
}

// A block of `ops` entered from a stream placed as `x`.
StageWork BlockWork(const GptGraph& ops, const GptGraph::Block& b, Placement x, int64_t N, int T) {
  const int tp = ops.stage.tp;
  const HalfWork h1 = EstimateHalf(ops.config, tp, b.attention(), x, N, T, b.recompute);
  const HalfWork h2 =
      EstimateHalf(ops.config, tp, b.mlp(), b.add1.info().output, N, T, b.recompute);
  return EstimateBlock(h1, h2, b.recompute,
                       Sizer{tp}.Local(b.add2.info().output, N, ops.config.embed));
}

// Each operator of block `b`'s share (EstimateOps), entered from `x`.
void BlockShares(const GptGraph& ops, const GptGraph::Block& b, Placement x, int64_t N, int T,
                 std::vector<std::pair<std::string, StageWork>>* out) {
  const int tp = ops.stage.tp;
  const HalfWork h1 = EstimateHalf(ops.config, tp, b.attention(), x, N, T, b.recompute);
  const HalfWork h2 =
      EstimateHalf(ops.config, tp, b.mlp(), b.add1.info().output, N, T, b.recompute);
  const char* names[10] = {"ln_1", "attn.c_attn", "attn.attention", "attn.c_proj", "add_1",
                           "ln_2", "mlp.c_fc",    "mlp.gelu",       "mlp.c_proj",  "add_2"};
  const std::string prefix = "h." + std::to_string(b.layer) + ".";
  for (int i = 0; i < 10; ++i) {
    StageWork share = i < 5 ? h1.ops[i] : h2.ops[i - 5];
    // Full recompute runs each operator's forward again in backward (and
    // copies the block's output out of the scratch: add_2's share).
    if (b.recompute == Recompute::kFull) {
      share.Add(i < 5 ? h1.forward_ops[i] : h2.forward_ops[i - 5]);
      if (i == 9) {
        share.bytes += 2.0 * Sizer{tp}.Local(b.add2.info().output, N, ops.config.embed);
      }
    }
    out->emplace_back(prefix + names[i], share);
  }
}

}  // namespace

HalfWork EstimateHalf(const GptConfig& config, int tp, const GptGraph::HalfOps& h, Placement x,
                      int64_t N, int T, Recompute rc, bool shares) {
  return HalfEstimator(config, tp, h, x, N, T, rc, shares).Run();
}

StageWork EstimateBlock(const HalfWork& attention, const HalfWork& mlp, Recompute rc,
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
    Grow(&r, kScratchBlock, block);
  }
  r.Add(attention.backward);
  r.Add(mlp.backward);
  return r;
}

StageWork EstimateInput(const GptConfig& config, int tp, const EmbeddingOp* embedding, int64_t N) {
  const Sizer z{tp};
  const int64_t C = config.embed, V = config.vocab;
  StageWork e;
  if (embedding == nullptr) {  // the previous stage's output, whole
    e.slot_bytes += N * C * 4;
    Grow(&e, kInputGrad, N * C * 4);
    e.bytes += 2.0 * 2 * N * C * 4;  // copied in, and its gradient out
    return e;
  }
  const Placement x = embedding->info().output;
  e.slot_bytes += z.Local(x, N, C) + N * 4;  // x0, tokens
  e.kernel[K(Kernel::kEmbeddingForward)] += z.Elements(x, N, C);
  e.kernel[K(Kernel::kEmbeddingBackward)] += z.Elements(x, N, C);
  if (embedding->info().rows_over_tp && tp > 1) {
    e.tp_sum_floats += config.context * C +  // wpe, and wte
                       VocabFloats(embedding->weight_split(), V, C, tp);
  }
  return e;
}

StageWork EstimateOutput(const GptConfig& config, int tp, Placement x,
                         const GptGraph::HeadOps* head, int64_t N, bool wte_summed,
                         StageWork* parts) {
  const Sizer z{tp};
  const int64_t C = config.embed, V = config.vocab;
  const std::array<GptGraph::Edge, 3> edges = GptGraph::HeadEdges(head, x, C, V);
  if (head == nullptr) return ToNextStage(z, edges[0], N, C);
  const GptGraph::Edge &into_lnf = edges[0], &into_lm = edges[1], &into_loss = edges[2];
  const OpInfo &lnf = head->lnf->info(), &lm = head->lm_head->info();
  StageWork e;
  e.slot_bytes += N * 4;  // targets
  e.slot_bytes += z.Storage(into_lnf.from, into_lnf.to, N, C);
  z.Forward(into_lnf, N, &e);
  z.Backward(into_lnf, N, &e);
  e.slot_bytes += z.Local(lnf.output, N, C) + 2 * 4 * z.Rows(lnf.output, N);
  e.kernel[K(Kernel::kLayerNormForward)] += z.Elements(into_lnf.to, N, C);
  e.kernel[K(Kernel::kLayerNormBackward)] += z.Elements(into_lnf.to, N, C);
  e.bytes += z.Local(into_lnf.to, N, C);  // its input gradient zeroed first
  if (lnf.rows_over_tp && tp > 1) e.tp_sum_floats += 2 * C;
  StageWork seen;
  auto mark = [&](int op) {
    if (parts != nullptr) parts[op] = Since(e, seen);
    seen = e;
  };
  mark(0);
  z.Forward(into_lm, N, &e);
  z.Backward(into_lm, N, &e);
  if (GptGraph::Regathers(into_lm)) {
    Grow(&e, kGather, z.Local(into_lm.to, N, C));
    z.Forward(into_lm, N, &e);
  } else {
    e.slot_bytes += z.Storage(into_lm.from, into_lm.to, N, C);
  }
  e.flops += 3 * z.LinearFlops(lm, N, C, V);
  mark(1);
  const Placement ce = into_loss.to;
  e.slot_bytes += z.Local(lm.output, N, V) + z.Storage(lm.output, ce, N, V);
  e.slot_bytes += z.Local(ce, N, V);         // probabilities
  e.slot_bytes += z.Rows(ce, N) * (4 + 16);  // the loss's max and sums
  z.Forward(into_loss, N, &e);
  z.Backward(into_loss, N, &e);
  e.kernel[K(Kernel::kCrossEntropyForward)] += z.Elements(ce, N, V);
  e.kernel[K(Kernel::kCrossEntropyBackward)] += z.Elements(ce, N, V);
  mark(2);
  Grow(&e, kDlogits, z.Storage(ce, lm.output.Resolved(), N, V));
  Grow(&e, kDlnf, z.Local(into_lm.grad, N, C));
  Grow(&e, kDh, z.Storage(into_lm.grad, lnf.output.Resolved(), N, C));
  Grow(&e, kDxLnf, z.Local(into_lnf.to, N, C));
  Grow(&e, kDres2, z.Storage(into_lnf.to, x.Resolved(), N, C));
  if (lm.rows_over_tp && tp > 1 && !wte_summed) {
    e.tp_sum_floats += VocabFloats(head->lm_head->weight_split(), V, C, tp);
  }
  return e;
}

StageWork EstimateStage(const GptGraph& ops, int64_t N, int T, std::vector<StageWork>* per_block,
                        StageWork* ends) {
  const GptStage& stage = ops.stage;
  const int tp = stage.tp;
  StageWork e = EstimateInput(ops.config, tp, stage.first ? &ops.embedding : nullptr, N);
  Placement x = ops.stream_in;
  StageWork total;
  if (per_block != nullptr) per_block->clear();
  for (const GptGraph::Block& b : ops.blocks) {
    const StageWork bw = BlockWork(ops, b, x, N, T);
    if (per_block != nullptr) per_block->push_back(bw);
    total.Add(bw);
    x = b.add2.info().output;
  }
  const GptGraph::HeadOps head = ops.head();
  e.Add(EstimateOutput(ops.config, tp, x, stage.last ? &head : nullptr, N,
                       stage.first && ops.embedding.info().rows_over_tp));
  if (ends != nullptr) *ends = e;
  total.Add(e);
  return total;
}

StageWork CopiesWork(const StageWork& one, int copies, int64_t act_bytes, bool first, bool last) {
  StageWork w;
  w.AddTimes(one, copies);
  w.tp_sum_floats = one.tp_sum_floats;
  for (int i = 0; i < kSharedBuffers; ++i) w.shared[i] = one.shared[i] * copies;
  if (!last) w.slot_bytes += act_bytes;
  if (!first) Grow(&w, kCopiesInputGrad, act_bytes);
  return w;
}

std::vector<std::pair<std::string, StageWork>> EstimateOps(const GptGraph& ops, int64_t N, int T) {
  std::vector<std::pair<std::string, StageWork>> out;
  const GptStage& stage = ops.stage;
  const int tp = stage.tp;
  if (stage.first) out.emplace_back("embedding", EstimateInput(ops.config, tp, &ops.embedding, N));
  Placement x = ops.stream_in;
  const std::vector<GptGraph::Block>& blocks = ops.blocks;
  if (!blocks.empty()) {
    // A block entered from another (the second, when the stage has two).
    if (blocks.size() > 1) x = blocks[0].add2.info().output;
    BlockShares(ops, blocks.size() > 1 ? blocks[1] : blocks[0], x, N, T, &out);
    x = blocks.back().add2.info().output;
  }
  if (stage.last) {
    StageWork parts[3];
    const GptGraph::HeadOps head = ops.head();
    EstimateOutput(ops.config, tp, x, &head, N, stage.first && ops.embedding.info().rows_over_tp,
                   parts);
    out.emplace_back("ln_f", parts[0]);
    out.emplace_back("lm_head", parts[1]);
    out.emplace_back("loss", parts[2]);
  } else {
    out.emplace_back("to the next stage", EstimateOutput(ops.config, tp, x, nullptr, N, false));
  }
  return out;
}

}  // namespace tessera
