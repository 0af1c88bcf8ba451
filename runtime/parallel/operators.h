// The GPT's operators with shard strategies (semi-automatic parallelism):
// embedding (vocabulary-parallel or by columns), layer norm, linear
// (MatMul + bias), causal attention (by heads), GELU, residual add, the
// tied output projection and cross-entropy (vocabulary-parallel). Each is
// built from its OpStrategy (op_strategy.h); it checks the strategy,
// derives the placement it needs of each input and the placement of its
// output, and runs forward and backward on this rank's shards with the CPU
// kernels.
//
// Activations are 2-D, [rows, cols] with rows = batch x sequence (what
// MindFormers reshapes to before every MatMul). The batch's cut over dp is
// always the outermost one (each data-parallel replica reads its rows), so
// no redistribution crosses dp: an activation is placed over the tp ranks
// of one replica and one pipeline stage. Its placement is a transform/
// Layout over the mesh {tp} (rows cut, columns cut, or columns cut within
// each of `groups` equal groups: the fused q|k|v by heads, the view
// [rows, 3, C]) plus one state of the runtime only: *partial*, a pending sum
// over tp (a MatMul contracted over a cut dimension, a vocabulary-parallel
// embedding).
//
// Convert moves an activation between placements, inserting the
// redistribution the consumer needs: a partial resolves by an AllReduce,
// or by a ReduceScatter when the consumer wants the rows cut (sequence
// parallelism); cut rows gather with an AllGather; a replicated tensor is
// cut by slicing locally; anything else goes through Redistribute
// (dtensor.h, the offline reshard's planner), columns cut in other groups
// (by columns <-> by heads) through the whole tensor, whose slice is kept:
// a shard of one is no box of the other's view. Backward runs the same
// Convert on gradients, which gives each step its dual: an AllReduce's
// gradient passes unchanged, a ReduceScatter's is all-gathered, an
// AllGather's is reduce-scattered (the consumer's input gradient is
// partial) or sliced (it is not), a slice's is all-gathered.
//
// Context parallelism (context_parallel.h) cuts every activation's
// sequence over the cp axis outside all of this: an activation's rows are
// this cp rank's positions of each sequence, and only attention (and the
// embedding's positions) knows. A strategy says so by cutting the rows
// over ["dp", "cp"] (then optionally tp), or, for Ulysses, the attention's
// heads over ["cp"] or ["tp", "cp"] with its rows whole.
//
// Parameters are cut over tp only (dp is the data-parallel axis; optimizer
// sharding is ZeRO's). A parameter used where the rows are cut over tp
// gets a partial gradient, which the model sums over tp after backward.
#ifndef TESSERA_RUNTIME_PARALLEL_OPERATORS_H_
#define TESSERA_RUNTIME_PARALLEL_OPERATORS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/timer.h"
#include "runtime/comm/communicator.h"
#include "runtime/parallel/context_parallel.h"
#include "runtime/parallel/copy_turns.h"
#include "runtime/parallel/op_strategy.h"
#include "transform/layout.h"

namespace tessera {

// Where an activation's shards lie over the tp ranks.
struct Placement {
  int split = -1;  // -1: replicated; 0: rows cut; 1: columns cut
  int groups = 1;  // columns cut within each of `groups` equal groups
  bool partial = false;
  bool operator==(const Placement& o) const {
    return split == o.split && (split != 1 || groups == o.groups) && partial == o.partial;
  }
  bool operator!=(const Placement& o) const { return !(*this == o); }
  Placement Resolved() const { return {split, groups, false}; }
  // The transform/ Layout of a [rows, cols] tensor placed so on {tp}.
  Layout ToLayout(int64_t rows, int64_t cols) const;
  // "rows/tp", "cols/tp", "heads/tp", "replicated", "+ partial".
  std::string ToString() const;
};

// The steps Convert takes from `from` to `to` (not partial) over `tp`
// ranks for `rows` rows: a partial resolves by an AllReduce, or by a
// ReduceScatter when `to` cuts the rows; then cut rows gather, a
// replicated tensor is sliced, anything else is redistributed.
enum class RedistStep { kAllReduce, kReduceScatter, kAllGather, kSlice, kRedistribute };
std::vector<RedistStep> PlanSteps(Placement from, const Placement& to, int64_t rows, int tp);

// One activation: this rank's shard (dense, row-major over its box) of a
// [rows, cols] tensor of one replica.
struct Act {
  float* data = nullptr;
  int64_t rows = 0, cols = 0;
  Placement place;
};

// What an operator shares with the others on one rank.
class OpContext {
 public:
  // `tp` (null when tp = 1) must outlive the context.
  explicit OpContext(Communicator* tp);
  // For planning only (Plan, LocalRows ...): tp ranks, no communicator.
  OpContext(int tp, int tp_rank);
  int tp() const { return tp_size_; }
  int tp_rank() const { return tp_rank_; }
  Communicator* comm() const { return comm_; }

  // Context parallelism: the cp group (null when cp = 1; it must outlive
  // the context) and how attention crosses it.
  void SetContextParallel(Communicator* cp, CpAlgo algo);
  int cp() const { return cp_size_; }
  int cp_rank() const { return cp_rank_; }
  CpAlgo cp_algo() const { return cp_algo_; }
  Communicator* cp_comm() const { return cp_comm_; }
  // The split of sequences of which this rank holds `local` positions.
  SequenceSplit Split(int64_t local) const {
    return SequenceSplit::Of(cp_algo_, local * cp_size_, cp_size_, cp_rank_);
  }
  // Transient buffers of attention's exchanges over cp, reused by every
  // block (kCpBuffers of them).
  static constexpr int kCpBuffers = 6;
  std::vector<float>& CpBuffer(int i) { return cp_buf_[i]; }
  int64_t CpBufferBytes() const;
  // Runs `fn` (a cp exchange or a wait for one), its time counted as
  // communication.
  Status TimedComm(const std::function<Status()>& fn) {
    AddElapsed timed(&comm_seconds_);
    return fn();
  }

  // The local extent of a placement's rows and columns on this rank.
  int64_t LocalRows(const Act& a) const;
  int64_t LocalCols(const Act& a) const;
  int64_t LocalSize(const Act& a) const { return LocalRows(a) * LocalCols(a); }
  // The first global row / column of this rank's shard.
  int64_t FirstRow(const Act& a) const;

  // `a` placed as `to` (not partial): `a` itself when it already is (a
  // partial `a` is all-reduced in place for that), else a new shard in
  // `*storage`. Errors name the operator `op` and its input `what`.
  Result<Act> Convert(Act& a, const Placement& to, std::vector<float>* storage,
                      const std::string& op, const std::string& what);
  // The collective Convert runs and the bytes this rank sends for it.
  struct Redistribution {
    std::string collective;  // "" when none
    int64_t bytes = 0;
  };
  Redistribution Plan(const Placement& from, const Placement& to, int64_t rows, int64_t cols) const;

  // Reduces `n` elements over tp in place (a parameter's partial
  // gradient, the loss's sums), counted as communication.
  Status AllReduce(void* data, int64_t n, DType dtype, ReduceOp op);
  // Seconds in collectives; under multi-copy only what no copy's compute
  // hid (from the turn's return to the collective's completion).
  double comm_seconds() const { return comm_seconds_; }

  // Redistributions planned so far (Convert's Redistribute steps): each
  // distinct one is planned once, with its staging buffers, and reused by
  // every later call (every block, forward and backward, every step).
  int64_t plans_built() const { return plans_built_; }

  // Multi-copy (copy_turns.h): while set, this context's AllReduce,
  // ReduceScatter and AllGather are issued non-blocking and the turn goes
  // to the next copy until they complete (a Redistribute stays blocking,
  // in turn). Null: blocking calls.
  void SetTurns(CopyTurns* turns, int copy) {
    turns_ = turns;
    copy_ = copy;
  }

 private:
  // `issue` (non-blocking) handing the turn on while it is in flight under
  // multi-copy, else `block`.
  Status Collective(const std::function<Result<Request>()>& issue,
                    const std::function<Status()>& block);

  Communicator* comm_ = nullptr;
  // The Redistribute steps' plans and buffers by (from, to, rows, cols)
  // (operator_kernels.cc; shared_ptr: the planning layer links no kernels).
  struct Planned;
  struct PlanCache;
  Result<Planned*> PlanFor(const Placement& from, const Placement& to, int64_t rows, int64_t cols);
  std::shared_ptr<PlanCache> plans_;
  int64_t plans_built_ = 0;
  CopyTurns* turns_ = nullptr;
  int copy_ = 0;
  int tp_size_ = 1, tp_rank_ = 0;
  Communicator* cp_comm_ = nullptr;
  int cp_size_ = 1, cp_rank_ = 0;
  CpAlgo cp_algo_ = CpAlgo::kRing;
  std::vector<float> cp_buf_[kCpBuffers];
  Mesh mesh_;  // {tp}
  double comm_seconds_ = 0;
};

// What every operator knows of itself.
struct OpInfo {
  std::string name, kind;
  OpStrategy strategy;
  std::vector<Placement> inputs;  // the placement each activation input needs
  Placement output;
  bool rows_over_tp = false;  // its parameters' gradients are partial over tp
};

// Checks the rows of an input against the rule above: cut over dp first
// (when dp > 1), then cp (context parallelism), then optionally over tp.
// Returns whether tp cuts them.
Result<bool> RowsOverTp(const DimAxes& rows, int dp, const std::string& op,
                        const std::string& what);

// y[N, M] = x[N, K] @ w[K, M] + b. Strategy ((rows, k), (k, m)). With
// `groups` > 1 (the fused qkv) a cut of M cuts each group alike.
class LinearOp {
 public:
  static Result<LinearOp> Create(std::string name, const OpStrategy& s, int64_t K, int64_t M,
                                 int groups, int dp);
  const OpInfo& info() const { return info_; }
  // The weight's dimension cut over tp (0: K, 1: M), -1 when replicated.
  int weight_split() const { return weight_split_; }
  bool bias_split() const { return weight_split_ == 1; }
  // x in info().inputs[0]; w, b this rank's shards; y is sized by the caller.
  void Forward(const OpContext& ctx, const Act& x, const float* w, const float* b, Act* y) const;
  // dy in info().output (resolved); dx (placement inputs[0], partial when M
  // is cut) is sized by the caller; dw, db accumulate.
  void Backward(const OpContext& ctx, const Act& x, const float* w, const Act& dy, Act* dx,
                float* dw, float* db) const;
  Placement InputGradient() const;

 private:
  OpInfo info_;
  int64_t K_ = 0, M_ = 0;
  int groups_ = 1, weight_split_ = -1;
};

// x[N, C] -> LayerNorm over C. Strategy ((rows, -),): C cannot be cut.
class LayerNormOp {
 public:
  static Result<LayerNormOp> Create(std::string name, const OpStrategy& s, int dp);
  const OpInfo& info() const { return info_; }
  void Forward(const OpContext& ctx, const Act& x, const float* w, const float* b, Act* y,
               float* mean, float* rstd) const;
  // dx in inputs[0] (+= when `accumulate`, else =); dw, db accumulate.
  void Backward(const OpContext& ctx, const Act& x, const float* w, const float* mean,
                const float* rstd, const Act& dy, Act* dx, float* dw, float* db,
                bool accumulate = false) const;

 private:
  OpInfo info_;
};

// Causal self-attention of qkv[N, 3C] (q | k | v) into y[N, C]. Strategy
// ((rows, heads),): heads cut over an axis; rows cut only into whole
// sequences. Under context parallelism (cp > 1) the rows are this rank's
// positions; rows cut over cp, ((dp, cp), heads), run ring attention; the
// heads cut over cp, ((dp), (cp) or (tp, cp)), run Ulysses.
class AttentionOp {
 public:
  enum class Cp { kNone, kUlysses, kRing };
  static Result<AttentionOp> Create(std::string name, const OpStrategy& s, int heads, int64_t C,
                                    int tp, int dp, int cp = 1);
  const OpInfo& info() const { return info_; }
  Cp cp_mode() const { return cp_mode_; }
  int cp() const { return cp_; }  // the cp ranks it was created for
  // What this rank keeps for backward (T: its positions of a sequence):
  // the attention weights [B_local, heads_local, T, T]; under Ulysses those
  // of whole sequences of its heads and their gathered q|k|v; under ring
  // attention the output and each row's log-sum-exp, nothing of T^2.
  int64_t AttSize(const OpContext& ctx, int64_t rows, int T) const;
  Status Forward(OpContext& ctx, const Act& qkv, int T, float* att, Act* y) const;
  Status Backward(OpContext& ctx, const Act& qkv, const float* att, int T, const Act& dy,
                  Act* dqkv) const;

 private:
  Status UlyssesForward(OpContext& ctx, const Act& qkv, int T, float* att, Act* y) const;
  Status UlyssesBackward(OpContext& ctx, const float* att, int T, const Act& dy, Act* dqkv) const;
  Status RingForward(OpContext& ctx, const Act& qkv, int T, float* att, Act* y) const;
  Status RingBackward(OpContext& ctx, const Act& qkv, const float* att, int T, const Act& dy,
                      Act* dqkv) const;
  // This rank's heads (after tp) and their columns.
  int LocalHeads(const OpContext& ctx) const;

  OpInfo info_;
  int heads_ = 1;
  int64_t C_ = 0;
  Cp cp_mode_ = Cp::kNone;
  int cp_ = 1;
};

// GELU (tanh) and the residual add: element-wise, any placement.
class GeluOp {
 public:
  static Result<GeluOp> Create(std::string name, const OpStrategy& s, int dp);
  const OpInfo& info() const { return info_; }
  void Forward(const OpContext& ctx, const Act& x, Act* y) const;
  void Backward(const OpContext& ctx, const Act& x, const Act& dy, Act* dx) const;

 private:
  OpInfo info_;
};

class AddOp {
 public:
  static Result<AddOp> Create(std::string name, const OpStrategy& s, int dp);
  const OpInfo& info() const { return info_; }
  void Forward(const OpContext& ctx, const Act& a, const Act& b, Act* y) const;

 private:
  OpInfo info_;
};

// wte[V, C] looked up by tokens (plus wpe[T, C] by position). Strategy
// ((vocab, cols), (rows,)): a vocabulary cut makes the output partial (wpe
// is then added by tp rank 0 only); a column cut cuts wpe alike.
class EmbeddingOp {
 public:
  static Result<EmbeddingOp> Create(std::string name, const OpStrategy& s, int64_t V, int64_t C,
                                    int dp);
  const OpInfo& info() const { return info_; }
  int weight_split() const { return weight_split_; }  // of wte (wpe: 1 when 1)
  // tokens: the replica's [N] (all of them; the op takes its rows).
  void Forward(const OpContext& ctx, const int32_t* tokens, int T, const float* wte,
               const float* wpe, Act* y) const;
  void Backward(const OpContext& ctx, const int32_t* tokens, int T, const Act& dy, float* dwte,
                float* dwpe) const;

 private:
  OpInfo info_;
  int64_t V_ = 0, C_ = 0;
  int weight_split_ = -1;
};

// logits[N, V] = x[N, C] @ wte[V, C]^T (the tied output projection).
// Strategy ((rows, k), (vocab, k)).
class LmHeadOp {
 public:
  static Result<LmHeadOp> Create(std::string name, const OpStrategy& s, int64_t V, int64_t C,
                                 int dp);
  const OpInfo& info() const { return info_; }
  int weight_split() const { return weight_split_; }
  void Forward(const OpContext& ctx, const Act& x, const float* wte, Act* logits) const;
  // dx (=) in inputs[0], partial when the vocabulary is cut; dwte accumulates.
  void Backward(const OpContext& ctx, const Act& x, const float* wte, const Act& dlogits, Act* dx,
                float* dwte) const;
  Placement InputGradient() const;

 private:
  OpInfo info_;
  int64_t V_ = 0, C_ = 0;
  int weight_split_ = -1;
};

// The mean cross-entropy of logits[N, V] against targets[N]. Strategy
// ((rows, vocab), (rows,)): a vocabulary cut runs Megatron's
// vocabulary-parallel loss (two reductions over tp).
class CrossEntropyOp {
 public:
  static Result<CrossEntropyOp> Create(std::string name, const OpStrategy& s, int64_t V, int dp);
  const OpInfo& info() const { return info_; }
  // Returns the mean over all N rows of the replica, the same on every tp
  // rank. probs (this rank's [rows, cols] shard) is kept for backward;
  // `scratch` holds the reductions' buffers.
  Result<double> Forward(OpContext& ctx, const Act& logits, const int32_t* targets, float* probs,
                         std::vector<float>* max, std::vector<double>* sums) const;
  // dlogits may be probs.
  void Backward(const OpContext& ctx, const Act& logits, const float* probs, const int32_t* targets,
                float dloss, float* dlogits) const;

 private:
  OpInfo info_;
  int64_t V_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_PARALLEL_OPERATORS_H_
