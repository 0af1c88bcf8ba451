// The GPT of gpt.h composed from operators with shard strategies
// (runtime/parallel/operators.h): one pipeline stage's forward and backward
// on one rank, whatever the strategy. Megatron tensor parallelism, its
// sequence parallelism, batch-split layers and mixtures of them are
// strategy files, not code: where one operator's output placement differs
// from what the next one's strategy needs, the redistribution is inserted
// (an edge of the graph below), and backward runs each edge's dual.
//
// Per block (pre-LayerNorm):
//   x --ln_1--> h1 --attn.c_attn--> qkv --attn.attention--> y --attn.c_proj--> a
//   x, a --add_1--> x1 --ln_2--> h2 --mlp.c_fc--> f --mlp.gelu--> g --mlp.c_proj--> m
//   x1, m --add_2--> x2
// and around the blocks: tokens --embedding (wte, wpe)--> x0 on the first
// stage; x_L --ln_f--> --lm_head (wte)--> logits --loss--> on the last.
// Operator names are "embedding", "h.<i>.ln_1", "h.<i>.attn.c_attn",
// "h.<i>.attn.attention", "h.<i>.attn.c_proj", "h.<i>.add_1", "h.<i>.ln_2",
// "h.<i>.mlp.c_fc", "h.<i>.mlp.gelu", "h.<i>.mlp.c_proj", "h.<i>.add_2",
// "ln_f", "lm_head", "loss". Between stages the residual stream travels
// whole (replicated over tp).
//
// The parameters stay in the Gpt (its flat vectors, ParamInfo boxes): each
// one is cut over tp as its operator's strategy says (param_splits()), so
// a checkpoint's layouts follow from the strategy.
#ifndef TESSERA_RUNTIME_MODEL_OP_GPT_H_
#define TESSERA_RUNTIME_MODEL_OP_GPT_H_

#include <array>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cost/machine_profile.h"
#include "runtime/model/gpt.h"
#include "runtime/model/gpt_graph.h"
#include "runtime/model/gpt_ops.h"
#include "runtime/model/stage_runner.h"
#include "runtime/parallel/op_strategy.h"
#include "runtime/parallel/operators.h"

namespace tessera {

class OpGpt : public StageRunner {
 public:
  // GptGraph's (the graph is what a strategy file is checked against).
  static std::vector<OpSignature> Signatures(const GptConfig& config) {
    return GptGraph::Signatures(config);
  }
  static OpStrategyFile Megatron(bool sequence_parallel) {
    return GptGraph::Megatron(sequence_parallel);
  }

  // The stage's operators from resolved strategies (GptGraph::Create), or
  // from a graph built already.
  static Result<std::unique_ptr<OpGpt>> Create(const GptConfig& config,
                                               const std::map<std::string, OpStrategy>& strategies,
                                               const GptStage& stage, int dp);
  static std::unique_ptr<OpGpt> FromGraph(GptGraph graph);
  // For each parameter, the dimension of its split shape cut over tp (-1:
  // none): what GptStage::tp_dims takes. The same for every stage.
  const std::map<std::string, int>& param_splits() const { return graph_.param_splits; }

  // Binds the operators to the stage's parameters (a Gpt created with
  // param_splits()) and to the tp group (null when tp = 1); both must
  // outlive this.
  Status Bind(Gpt* model, Communicator* tp);
  // After Bind: the cp group (null when cp = 1), which must outlive this.
  // Tokens and targets then hold this rank's positions of each sequence
  // (OpContext::Split) and T counts them.
  void SetContextParallel(Communicator* cp, CpAlgo algo) { ctx_.SetContextParallel(cp, algo); }

  void SetSlots(int n) override;
  // Block `layer` of this stage (every block when layer < 0) recomputes.
  void SetRecompute(int layer, Recompute mode);
  // Bytes this rank holds in activations (every slot's, the recompute
  // scratch, backward's gradients): the peak of a step, kept between steps
  // for the next one. And in the buffers of the parameter-gradient sums.
  int64_t ActivationBytes() const override;
  int64_t CommBufferBytes() const override;
  int slots() const override { return static_cast<int>(slots_.size()); }
  // As Gpt::ForwardStage / BackwardStage (tokens and targets are the
  // replica's [B, T]; x the previous stage's whole output). The loss is the
  // replica's mean, the same on every tp rank.
  Result<float> ForwardStage(int slot, const int32_t* tokens, const float* x,
                             const int32_t* targets, int B, int T) override;
  const float* StageOutput(int slot) const override;
  Status BackwardStage(int slot, const float* dy, float dloss) override;
  const float* InputGradient() const override { return input_grad_.data(); }
  // After the last backward of a step: sums over tp the gradients of the
  // parameters whose operators cut the rows over tp.
  Status ReduceParamGradients() override;
  double comm_seconds() const override { return ctx_.comm_seconds(); }
  int64_t plans_built() const override { return ctx_.plans_built(); }
  // Multi-copy (multi_copy.h): this copy's collectives take turns with the
  // other copies' compute while `turns` is set (null: blocking).
  void SetTurns(CopyTurns* turns, int copy) { ctx_.SetTurns(turns, copy); }

  // Every operator of this stage with its strategy and placements, and
  // every redistribution inserted between them (forward and backward), its
  // collective and bytes per rank for a batch of `rows` = B x T rows.
  std::string Describe(int64_t rows) const { return graph_.Describe(rows); }

  using HalfOps = GptGraph::HalfOps;
  using HeadOps = GptGraph::HeadOps;
  using Edge = GptGraph::Edge;
  static std::array<Edge, 6> HalfEdges(const HalfOps& h, Placement x, int64_t C,
                                       const std::string* x_name = nullptr) {
    return GptGraph::HalfEdges(h, x, C, x_name);
  }
  static bool Regathers(const Edge& e) { return GptGraph::Regathers(e); }
  // The graph this executes.
  const GptGraph& graph() const { return graph_; }

 private:
  // One activation buffer and the Act it holds (or the Act it reuses).
  struct Buf {
    std::vector<float> data;
    Act act;
  };
  struct BlockActs {
    Buf ln1_in, h1, qkv_in, qkv, attn_in, att, y, proj_in, add1_a, x1, ln2_in, h2, fc_in, f,
        gelu_in, g, fcproj_in, add2_a, x2;
    std::vector<float> ln1_mean, ln1_rstd, ln2_mean, ln2_rstd;
    Act input;  // kFull: the block's input as its forward left it
  };
  struct Slot {
    int B = 0, T = 0;
    std::vector<int32_t> tokens, targets;
    bool has_targets = false;
    Buf x0, out;
    std::vector<BlockActs> blocks;
    Buf lnf_in, hf, lm_in, logits, ce_in;
    std::vector<float> lnf_mean, lnf_rstd, probs, max;
    std::vector<double> sums;
  };

  // A block of the graph with where its parameters lie in the Gpt.
  struct Block : GptGraph::Block {
    int64_t ln1w = 0, ln1b = 0, qkvw = 0, qkvb = 0, projw = 0, projb = 0, ln2w = 0, ln2b = 0,
            fcw = 0, fcb = 0, fcprojw = 0, fcprojb = 0;
  };

  OpGpt() = default;
  // One block's forward on `x` into `acts`, the attention weights and output
  // into `att` and `y` (the block's own, or scratch when recomputed).
  Status BlockForward(const Block& b, Act& x, int T, BlockActs* acts, Buf* att, Buf* y);
  // x + branch through `add` into `out`: x converted by edge a_e (or taken
  // as the layer norm took it, `ln_in`, when ln_e wants the same), the
  // branch by b_e into a transient buffer.
  Result<Act> Residual(const AddOp& add, Act& x, const Act& ln_in, const Edge& ln_e,
                       const Edge& a_e, Act& branch, const Edge& b_e, Buf* a_buf, Buf* out);
  // Backward's pieces. Keep: a result becomes dres_ (the residual stream's
  // gradient, always held in d_.dres: the buffer it lies in is swapped in).
  void Keep(const Act& r, std::initializer_list<Buf*> from);
  // A linear's input for its backward: as kept, or gathered again from the
  // shard it came from (Regather).
  Result<Act> LinearInput(const Edge& e, const Buf& kept, const Buf& source);
  // A block's layer norm backward, its input gradient added to dres_ (the
  // add's gradient of the same stream) in the stream's placement.
  Status LayerNormBackward(const LayerNormOp& ln, const Act& in, const std::vector<float>& mean,
                           const std::vector<float>& rstd, int64_t w, int64_t bias, const Act& dy,
                           const Edge& ln_edge, const Edge& add_edge);
  Result<Act> Conv(Act& a, const Edge& e, Buf* buf);
  Result<Act> ConvGrad(Act& g, const Edge& e, Buf* buf);
  Act New(Buf* b, int64_t rows, int64_t cols, Placement p);
  float* P(int64_t offset) { return model_->weights().data() + offset; }
  float* G(int64_t offset) { return model_->grads().data() + offset; }
  // Where a parameter's gradient of an operator accumulates: its own, or a
  // scratch buffer on tp ranks > 0 when another operator of the stage
  // makes the gradient partial and this one computed it whole.
  float* ParamGrad(int64_t offset, int64_t n, bool tp_sum, bool rows_over_tp);

  GptGraph graph_;
  std::vector<Block> blocks_;  // the graph's, with their parameters
  int64_t wte_ = -1, wpe_ = -1, lnfw_ = 0, lnfb_ = 0;
  // Parameters whose gradient is summed over tp: offset, count.
  std::vector<std::pair<int64_t, int64_t>> tp_sums_;
  bool wte_tp_sum_ = false;
  int64_t wte_numel_ = 0;  // of this stage's wte (or its tied copy)
  std::vector<float> scratch_grad_, sum_buf_;

  Gpt* model_ = nullptr;
  OpContext ctx_{1, 0};
  std::vector<Slot> slots_ = std::vector<Slot>(1);
  // Recompute's activations: one block's worth, shared by every block and slot.
  BlockActs scratch_;
  Buf scratch_att_, scratch_y_;
  // Transient: a gathered linear input (rebuilt in backward), a row-parallel
  // output and its converted copy (consumed by the add at once).
  Buf gather_, out_tmp_, conv_tmp_;
  // Backward: one block's gradients, reused block after block.
  struct Grads {
    Buf dres, dres2, tmp, d_ln_in, d_add, dm, dg_in, dg, df_in, df, dh_in, dh, dy, dqkv_in, dqkv,
        dattn_y, dlogits, dlnf, dx_lnf;
  } d_;
  Act dres_;
  std::vector<float> input_grad_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_OP_GPT_H_
