// What a stage of the GPT's operators (gpt_graph.h) does on one rank (tp rank
// 0, the largest shard) for one micro-batch, for the cost model: the
// arithmetic, the redistributions over tp and the buffers. It walks the
// graph that runs: the same operators and the same edges (GptGraph::Edge,
// from GptGraph::HalfEdges and HeadEdges, which OpGpt's ForwardStage and
// BackwardStage and GptGraph::Describe also follow), buffer by buffer as ForwardStage and
// BackwardStage allocate them. A change to the graph's edges is made once;
// a change to which buffer the executor keeps an edge's result in must be
// made here too, and the memory and kernel-unit checks in
// tests/runtime/model/gpt_work_test.cc fail until it is.
#ifndef TESSERA_RUNTIME_MODEL_GPT_WORK_H_
#define TESSERA_RUNTIME_MODEL_GPT_WORK_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/cost/stage_work.h"
#include "runtime/model/gpt_graph.h"

namespace tessera {

// The GPT executor's shared buffers (StageWork::shared): the recompute
// scratch, transient conversions and backward's gradients, each reused by
// every block and micro-batch of a stage.
enum GptBuffer {
  kGather,
  kOutTmp,
  kConvTmp,
  kScratchBlock,
  kScratchAtt,
  kScratchY,
  kDres,
  kDres2,
  kTmp,
  kDLnIn,
  kDAdd,
  kDm,
  kDgIn,
  kDg,
  kDfIn,
  kDf,
  kDhIn,
  kDh,
  kDy,
  kDqkvIn,
  kDqkv,
  kDattnY,
  kDlogits,
  kDlnf,
  kDxLnf,
  kInputGrad,
  kCopiesInputGrad,  // multi-copy: the copies' input gradients put together
  kGptBufferCount
};
static_assert(kGptBufferCount <= kSharedBuffers, "StageWork holds every GPT buffer");

// A half of a block with its input stream placed as `x`: the forward
// (whose slot_bytes are its activations) and the backward (with what
// selective recompute runs again).
struct HalfWork {
  StageWork forward, backward;
  // Each operator's share of the flops, bytes and collectives (with the
  // conversions into it and their duals): the layer norm, the first
  // linear, attention or GELU, the second linear, the add.
  StageWork ops[5];
  // The forward part of each share: what full recompute runs again.
  StageWork forward_ops[5];
};

// One half of a block on `tp` ranks for N rows of sequences of T.
// `shares`: fill ops and forward_ops (the per-operator breakdown; the
// search, which needs only the totals, skips them).
HalfWork EstimateHalf(const GptConfig& config, int tp, const GptGraph::HalfOps& h, Placement x,
                      int64_t N, int T, Recompute rc, bool shares = true);
// A block from its halves (full recompute: the forward twice, the slot
// keeping only the output, `out_bytes`).
StageWork EstimateBlock(const HalfWork& attention, const HalfWork& mlp, Recompute rc,
                        int64_t out_bytes);
// The ends of a stage: its input (the embedding's output on the first
// stage, else the previous stage's output, when `embedding` is null) and
// its output (ln_f, the output projection and the loss on the last, else
// the transfer to the next stage, when `head` is null), the stream
// arriving placed as `x`. `wte_summed`: the embedding of the same stage
// already sums wte's partial gradient. `parts` (3, when given): ln_f's,
// lm_head's and the loss's shares.
StageWork EstimateInput(const GptConfig& config, int tp, const EmbeddingOp* embedding, int64_t N);
StageWork EstimateOutput(const GptConfig& config, int tp, Placement x,
                         const GptGraph::HeadOps* head, int64_t N, bool wte_summed,
                         StageWork* parts = nullptr);

// The stage's work on one rank for micro-batches of `rows` = b x T rows of
// a replica. With `per_block`, also each block's own (the ends in `ends`).
StageWork EstimateStage(const GptGraph& graph, int64_t rows, int T,
                        std::vector<StageWork>* per_block = nullptr, StageWork* ends = nullptr);
// Multi-copy (multi_copy.h): the work of `copies` copies of a micro-batch,
// `one` being a copy's (its rows / copies): `copies` times its arithmetic,
// collectives and activations, each copy its own shared buffers, the tp
// sums once; and the runner's whole micro-batch, `act_bytes`: its output
// per slot (but on the last stage) and its input gradient (but on the
// first).
StageWork CopiesWork(const StageWork& one, int copies, int64_t act_bytes, bool first, bool last);
// Every operator's share of one micro-batch's work on the stage: its first
// block's operators (each block costs the same but the first's entry) and
// the stage's ends, in order, named as strategy files name them. Full
// recompute's second forward is not in the shares.
std::vector<std::pair<std::string, StageWork>> EstimateOps(const GptGraph& graph, int64_t rows,
                                                           int T);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_GPT_WORK_H_
