// One pipeline stage of the GPT as a graph of operators with shard
// strategies (runtime/parallel/operators.h), built from a strategy file's
// resolved strategies: what OpGpt executes, what Describe prints and what
// the cost model prices (gpt_work.h). It holds no parameters and computes
// nothing, so the search and `ckpt auto-parallel` build it without the
// kernels.
//
// Per block (pre-LayerNorm):
//   x --ln_1--> h1 --attn.c_attn--> qkv --attn.attention--> y --attn.c_proj--> a
//   x, a --add_1--> x1 --ln_2--> h2 --mlp.c_fc--> f --mlp.gelu--> g --mlp.c_proj--> m
//   x1, m --add_2--> x2
// and around the blocks: tokens --embedding (wte, wpe)--> x0 on the first
// stage; x_L --ln_f--> --lm_head (wte)--> logits --loss--> on the last.
// Operator names are gpt_ops.h's ("embedding", "h.<i>.ln_1", ...,
// "ln_f", "lm_head", "loss"). Between stages the residual stream travels
// whole (replicated over tp). Where one operator's output placement
// differs from what the next one's strategy needs, the edge between them
// is a redistribution, and backward runs its dual.
#ifndef TESSERA_RUNTIME_MODEL_GPT_GRAPH_H_
#define TESSERA_RUNTIME_MODEL_GPT_GRAPH_H_

#include <array>
#include <map>
#include <string>
#include <vector>

#include "runtime/model/gpt.h"
#include "runtime/model/gpt_ops.h"
#include "runtime/parallel/op_strategy.h"
#include "runtime/parallel/operators.h"

namespace tessera {

struct GptGraph {
  // One half of a block (x --ln--> --in--> --attn or gelu--> --out--> add(x,
  // .)), from its operators.
  struct HalfOps {
    const LayerNormOp* ln;
    const LinearOp* in;
    const AttentionOp* attn;  // the attention half, or
    const GeluOp* gelu;       // the MLP half
    const LinearOp* out;
    const AddOp* add;
  };
  // The ends of a stage after its blocks: ln_f, the output projection and
  // the loss on the last stage.
  struct HeadOps {
    const LayerNormOp* lnf;
    const LmHeadOp* lm_head;
    const CrossEntropyOp* loss;
  };
  // A redistribution between a producer and a consumer's input: forward
  // from -> to, backward the consumer's input gradient `grad` -> from
  // (resolved). What runs (ForwardStage, BackwardStage), what Describe
  // prints and what the cost model prices (gpt_work.h) are these edges.
  struct Edge {
    std::string label;  // "h.0.ln_1 -> h.0.attn.c_attn" (empty when only priced)
    Placement from, to;
    Placement grad;
    int64_t cols = 0;
  };
  // A half's edges, the residual stream arriving placed as `x`, in this
  // order: x -> ln, ln -> in, in -> attn or gelu, attn or gelu -> out,
  // x -> add input 0, out -> add input 1. Labelled when `x_name` (x's
  // producer) is given.
  static std::array<Edge, 6> HalfEdges(const HalfOps& h, Placement x, int64_t C,
                                       const std::string* x_name = nullptr);
  // The edges after the last block: x -> ln_f, ln_f -> lm_head, lm_head ->
  // loss with a head; x -> the next stage (whole) without.
  static std::array<Edge, 3> HeadEdges(const HeadOps* head, Placement x, int64_t C, int64_t V,
                                       const std::string* x_name = nullptr);
  // Whether an edge gathers rows (its result is not kept but gathered
  // again in backward: Megatron's sequence parallelism).
  static bool Regathers(const Edge& e);

  struct Block {
    int layer = 0;
    Recompute recompute = Recompute::kNone;
    LayerNormOp ln1, ln2;
    LinearOp qkv, proj, fc, fcproj;
    AttentionOp attn;
    AddOp add1, add2;
    GeluOp gelu;
    // Edges: the attention half's (HalfEdges: x->ln1, h1->qkv, qkv->attn,
    // y->proj, x->add1.a, a->add1.b), then the MLP half's (x1->ln2, h2->fc,
    // f->gelu, g->fcproj, x1->add2.a, m->add2.b).
    Edge e[12];
    HalfOps attention() const { return {&ln1, &qkv, &attn, nullptr, &proj, &add1}; }
    HalfOps mlp() const { return {&ln2, &fc, nullptr, &gelu, &fcproj, &add2}; }
  };
  GptConfig config;
  GptStage stage;
  int dp = 1;
  // Context parallelism: cp ranks cut every sequence, attention crossing
  // them by `cp_algo`.
  int cp = 1;
  CpAlgo cp_algo = CpAlgo::kRing;
  // For each parameter, the dimension of its split shape cut over tp (-1:
  // none): what GptStage::tp_dims takes. The same for every stage.
  std::map<std::string, int> param_splits;
  std::vector<Block> blocks;  // this stage's
  EmbeddingOp embedding;
  LayerNormOp lnf;
  LmHeadOp lm_head;
  CrossEntropyOp loss;
  Edge lnf_e, lm_e, ce_e;  // x_L -> ln_f, hf -> lm_head, logits -> loss (the last stage)
  Edge out_e;              // x_L -> the next stage (the others)
  // The placement of the stage's input stream (the embedding's output on
  // the first stage, whole elsewhere).
  Placement stream_in;

  HeadOps head() const { return {&lnf, &lm_head, &loss}; }
  // The half `part` (attention or MLP) of a block whose operators are
  // `ops` (by GptOp; each of its kind): what a search assembles.
  static HalfOps HalfOf(GptOpPart part, const std::array<const AnyOp*, kGptOpCount>& ops);

  // Every operator of the whole model, for checking a strategy file.
  static std::vector<OpSignature> Signatures(const GptConfig& config);
  // Megatron-LM's tensor parallelism as a strategy (vocabulary-parallel
  // embedding and loss, c_attn and c_fc by columns, the c_proj by rows),
  // with sequence parallelism (layer norms, residual adds and GELU-free
  // regions cut by rows over tp) when `sequence_parallel`.
  // With cp > 1, every operator's rows also cut over cp (WithCp).
  static OpStrategyFile Megatron(bool sequence_parallel, int cp = 1,
                                 CpAlgo cp_algo = CpAlgo::kRing);
  // The stage's graph from resolved strategies (ResolveOpStrategies over
  // Signatures). Checks every operator of the model, not only the stage's,
  // so every rank refuses a bad strategy alike. With cp > 1 every
  // operator's rows must be cut over cp as `cp_algo` needs (CheckCpRows).
  static Result<GptGraph> Create(const GptConfig& config,
                                 const std::map<std::string, OpStrategy>& strategies,
                                 const GptStage& stage, int dp, int cp = 1,
                                 CpAlgo cp_algo = CpAlgo::kRing);
  // Block `layer` of this stage (every block when layer < 0) recomputes.
  void SetRecompute(int layer, Recompute mode);
  // Every operator of this stage with its strategy and placements, and
  // every redistribution inserted between them (forward and backward), its
  // collective and bytes per rank for a batch of `rows` = B x T rows.
  std::string Describe(int64_t rows) const;

 private:
  // Keeps `o`, operator `op`: in block `b`, or as one of the ends.
  void Take(GptOp op, AnyOp o, Block* b);
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_GPT_GRAPH_H_
