// A GPT-2 style model on the CPU kernels: learned position embeddings,
// pre-LayerNorm blocks (attention, 4x MLP with tanh GELU), a final
// LayerNorm, and the token embedding tied as the output layer. It reads top
// to bottom (forward, then backward in reverse), llm.c style.
//
// Parameter names and shapes are stable checkpoint keys, the same as GPT-2's
// (Conv1D weights [in, out]): wte [V,C], wpe [maxT,C], h.<i>.ln_1.weight,
// h.<i>.ln_1.bias, h.<i>.attn.c_attn.weight [C,3C], .bias [3C],
// h.<i>.attn.c_proj.weight [C,C], .bias, h.<i>.ln_2.*, h.<i>.mlp.c_fc.weight
// [C,4C], .bias [4C], h.<i>.mlp.c_proj.weight [4C,C], .bias, ln_f.weight,
// ln_f.bias. A Hugging Face GPT-2 checkpoint maps on by dropping its
// "transformer." prefix ("wte.weight" -> "wte").
#ifndef TESSERA_RUNTIME_MODEL_GPT_H_
#define TESSERA_RUNTIME_MODEL_GPT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/comm/communicator.h"
#include "runtime/train/offload.h"
#include "runtime/train/optim.h"
#include "transform/box.h"

namespace tessera {

struct GptConfig {
  int layers = 4;
  int heads = 4;
  int embed = 256;    // C
  int context = 256;  // the longest sequence (wpe rows)
  int vocab = 4096;   // V
  // The output projection a parameter of its own ("lm_head.weight",
  // [V, C], on the last stage) instead of wte's transpose (GPT-2's tie).
  // Whole stages only (no operator strategy, tp or recompute). What lets
  // parameter servers serve the embedding by rows: a worker then needs
  // only its batch's rows of wte.
  bool untied = false;
  Status Validate() const;
};

// The part of the model one rank holds.
//
// Its pipeline stage: the blocks [first_layer, last_layer), the embeddings
// (wte, wpe) on the first stage, and ln_f with the output projection on the
// last. The output projection is tied to wte, so a last stage that is not
// also the first holds a copy of wte (ParamInfo::tied_copy) which the
// pipeline keeps equal to the first stage's by summing their gradients.
//
// Its tensor-parallel slice (tp > 1): which dimension of each parameter is
// cut over tp is the operator strategies' choice (OpGpt::param_splits, in
// `tp_dims`); this rank holds chunk tp_rank of it. Such a slice holds
// parameters only: OpGpt runs it (runtime/model/op_gpt.h). The fused
// c_attn is cut in its [C, 3, C] view so that q, k and v are cut alike.
//
// Under an interleaved pipeline a rank holds several chunks of layers that
// are not adjacent (`chunks`: their layer ranges in order); its Gpt then
// only holds their parameters (the embeddings before the first chunk's
// blocks, ln_f and the tied copy after the last's), and each chunk runs
// through its own operators (OpGpt, created for the chunk's stage).
struct GptStage {
  int first_layer = 0;
  int last_layer = -1;  // exclusive; -1: every layer
  bool first = true;    // holds the embeddings, reads tokens
  bool last = true;     // holds ln_f, computes the logits and the loss
  int tp = 1;           // tensor-parallel ranks
  int tp_rank = 0;
  // Each parameter's dimension (of its split shape) cut over tp; absent or
  // -1: whole. Null: nothing is cut.
  std::shared_ptr<const std::map<std::string, int>> tp_dims;
  // Several chunks: each one's layers [begin, end), in order (first_layer
  // and last_layer are then unused). Empty: one chunk, the range above.
  std::vector<std::pair<int, int>> chunks;
  // wte's rows come from parameter servers a step at a time (an untied
  // head): its pages are given back as soon as allocated, Init leaves it
  // alone, ZeroGrad skips its gradients (its owner keeps them zero).
  bool served_embedding = false;
};

struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;  // what this rank holds (its tp slice)
  int64_t offset = 0;          // into the flat parameter vector, in floats
  int64_t numel = 0;
  bool decay = false;  // matrices and embeddings take weight decay
  // The last stage's copy of wte. Not recorded as a copy stage
  // (Layout::copy_stages) in checkpoints: it is bitwise equal to the first
  // stage's by construction (their gradients are summed and both take the
  // same AdamW step), loading fills it from the first stage's pieces, and a
  // second stored copy would add 3 x V x C floats to every save (463 MB for
  // GPT-2 124M with its Adam moments). --redundancy stores copies on
  // request; exporting to a MindSpore strategy that places the embedding on
  // both stages writes it into both stages' rank files.
  bool tied_copy = false;
  // The whole tensor, and where this rank's slice lies in it: `box` over
  // split_shape() (`view` when the slice is a box of a view, c_attn's
  // [C, 3, C], else full_shape), dimension tp_dim cut over tp (-1: not
  // cut, every tp rank holds it all). Exactly the checkpoint's layout.
  std::vector<int64_t> full_shape;
  std::vector<int64_t> view;
  int tp_dim = -1;
  Box box;
  // Its unit of weights (parameter offload, runtime/train/offload.h): 0
  // for the stage's parameters outside its blocks (wte, wpe, ln_f, the
  // tied copy), 1 + l for those of the stage's l-th block.
  int unit = 0;
  const std::vector<int64_t>& split_shape() const { return view.empty() ? full_shape : view; }
};

// The checks a stage's forward makes of its batch: a slot it has, B >= 1,
// 1 <= T <= context, tokens (first stage) and targets (last stage, when
// given) inside the vocabulary. Errors say the position at fault.
Status CheckStageBatch(const GptConfig& config, const GptStage& stage, int slot, int slots,
                       const int32_t* tokens, const int32_t* targets, int B, int T);

class Gpt {
 public:
  static Result<Gpt> Create(const GptConfig& config, const GptStage& stage = {});
  // Weights and gradients only: Adam's moments (adam_m, adam_v) left empty,
  // for their owner to hold elsewhere (a ZeRO shard, an offload file).
  // `offload_weights`: the weights' pages given back as soon as allocated
  // (they read zero), for an OffloadedWeights to fill unit by unit.
  static Result<Gpt> CreateWithoutMoments(const GptConfig& config, const GptStage& stage,
                                          bool offload_weights = false);
  // The parameters a stage holds, in order, without allocating them.
  static Result<std::vector<ParamInfo>> Params(const GptConfig& config, const GptStage& stage = {});

  const GptConfig& config() const { return config_; }
  const std::vector<ParamInfo>& params() const { return params_; }
  const ParamInfo* FindParam(const std::string& name) const;
  int64_t num_params() const { return static_cast<int64_t>(weights_.size()); }

  // All parameters, gradients and Adam moments as flat f32 vectors laid out
  // as params() says.
  std::vector<float>& weights() { return weights_; }
  const std::vector<float>& weights() const { return weights_; }
  std::vector<float>& grads() { return grads_; }
  const std::vector<float>& grads() const { return grads_; }
  std::vector<float>& adam_m() { return m_; }
  std::vector<float>& adam_v() { return v_; }
  const std::vector<float>& adam_m() const { return m_; }
  const std::vector<float>& adam_v() const { return v_; }
  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }

  // GPT-2 initialisation from a seed: weights N(0, 0.02), the residual
  // projections (attn.c_proj, mlp.c_proj) N(0, 0.02 / sqrt(2 * layers)),
  // position embeddings N(0, 0.01), biases 0, LayerNorm gains 1. A tensor's
  // numbers depend on its name only, so a tp slice or a stage holds exactly
  // its part of the whole model's initialisation.
  void Init(uint64_t seed);
  // The same for the parameters of one unit (ParamInfo::unit) only.
  void InitUnit(uint64_t seed, int unit);
  // Elements [begin, begin + out.size()) of whole parameter `p`'s
  // initialisation (row-major over p.full_shape), the numbers Init gives
  // it: what a parameter server holding a piece of it starts from.
  static void InitialValues(const GptConfig& config, uint64_t seed, const ParamInfo& p,
                            int64_t begin, std::span<float> out);

  // Weights held in units that are not all in memory (parameter offload):
  // the forward and backward ask `units` for each unit before they read
  // it. Null (the default): every weight is in memory.
  void set_weight_units(WeightUnits* units) { units_ = units; }
  Status NeedWeights(int unit, bool write = false) {
    return units_ == nullptr ? Status::Ok() : units_->Need(unit, write);
  }

  const GptStage& stage() const { return stage_; }

  // tokens, targets: [B,T] (targets may be null: logits only). Returns the
  // mean cross-entropy (0 without targets). T <= context. Whole model only.
  Result<float> Forward(const int32_t* tokens, const int32_t* targets, int B, int T);
  // Gradients of the last Forward's loss, accumulated into grads() (call
  // ZeroGrad() first). Once per Forward: it reuses the forward's
  // probabilities as its own buffer.
  Status Backward();
  void ZeroGrad();
  // ZeroGrad skips gradients [begin, end) from now on: the caller keeps
  // them zero (parameter servers give the served embedding's pages back
  // after each step instead of writing every row).
  void SkipZeroing(int64_t begin, int64_t end) {
    keep_begin_ = begin;
    keep_end_ = end;
  }
  // Clips the global gradient norm to max_norm (<= 0: no clipping) and
  // applies AdamW. Returns the norm before clipping. One rank holding the
  // whole model only: a tp slice or stage sums GradSquaredNorm with its
  // peers and calls ApplyUpdate (ParallelGpt does).
  float Update(const AdamWConfig& config, float max_norm);
  // Scales the gradients by `clip` and applies AdamW (the norm computed by
  // the caller, e.g. over every stage).
  void ApplyUpdate(const AdamWConfig& config, float clip);
  // The squared gradient norm of the parameters this model owns (a tied
  // copy is counted where its original lives, a tensor every tp rank holds
  // on tp rank 0 only), accumulated in double: summed over the tp ranks
  // (and stages) it is the whole model's.
  double GradSquaredNorm() const;

  // Pipeline stages run several micro-batches at once, each in its own
  // activation slot (slot 0 is the one Forward uses).
  void SetSlots(int n);
  int slots() const { return static_cast<int>(slots_.size()); }
  // The forward of one micro-batch in `slot`: the first stage reads
  // `tokens` [B,T], the others `x` [B,T,C] (the previous stage's output).
  // The last stage returns the mean cross-entropy against `targets` (0
  // without targets); the others leave their output in StageOutput(slot).
  Result<float> ForwardStage(int slot, const int32_t* tokens, const float* x,
                             const int32_t* targets, int B, int T);
  const float* StageOutput(int slot) const;
  // The backward of slot's forward, accumulated into grads(): the last
  // stage starts from its loss scaled by `dloss` (1/M for M micro-batches),
  // the others from `dy` [B,T,C], the gradient of their output. A stage
  // that is not first leaves the gradient of its input in InputGradient().
  Status BackwardStage(int slot, const float* dy, float dloss);
  const float* InputGradient() const { return grad_acts_.residual.data(); }

  // Bytes held in activations (every slot's) and backward's buffers.
  int64_t ActivationBytes() const;
  // What ActivationBytes() comes to for `stage` after micro-batches of
  // [B,T] in `slots` slots, nothing allocated (the cost model's figure for a
  // stage that runs its Gpt whole).
  static Result<int64_t> ActivationBytesOf(const GptConfig& config, const GptStage& stage, int B,
                                           int T, int slots);
  // The last Forward's logits [B,T,V].
  const std::vector<float>& logits() const { return slots_[0].logits; }

 private:
  std::string LayerName(size_t local) const;
  struct Activations {
    int B = 0, T = 0;
    std::vector<int32_t> tokens, targets;
    bool has_targets = false;
    std::vector<float> encoded, ln1, ln1_mean, ln1_rstd, qkv, att, atty, attproj, residual2, ln2,
        ln2_mean, ln2_rstd, fch, fch_gelu, fcproj, residual3, lnf, lnf_mean, lnf_rstd, logits,
        probs;
  };
  // The backward pass's activation gradients: the residual stream's, and
  // one layer's worth of the rest, reused layer after layer (each is
  // written before it is read, so nothing is zeroed between steps).
  struct Gradients {
    int B = 0, T = 0;
    std::vector<float> residual, lnf, ln1, qkv, atty, ln2, fch, fch_gelu;
  };
  // Every activation buffer with its size for [B,T].
  template <typename F>
  void ForEachBuffer(Activations& a, int B, int T, F f) const;
  // Every buffer of backward's with its size for [B,T].
  template <typename F>
  void ForEachGradient(Gradients& d, int B, int T, F f) const;
  void Resize(Activations& a, int B, int T) const;
  void Resize(Gradients& d, int B, int T) const;
  static Result<Gpt> Create(const GptConfig& config, const GptStage& stage, bool allocate,
                            bool moments = true, bool offload_weights = false);
  void InitParams(uint64_t seed, int unit);  // unit -1: every parameter
  float* P(int64_t offset) { return weights_.data() + offset; }
  float* G(int64_t offset) { return grads_.data() + offset; }

  GptConfig config_;
  GptStage stage_;
  std::vector<ParamInfo> params_;
  // Offsets of each of this stage's layers' 12 tensors, and of wte, wpe,
  // ln_f (where held).
  struct Layer {
    int64_t ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
  };
  std::vector<Layer> layers_;
  int64_t wte_ = 0, wpe_ = 0, lnfw_ = 0, lnfb_ = 0;
  int64_t head_ = 0;  // the output projection: wte (tied) or lm_head.weight
  // A range of the gradients ZeroGrad leaves alone: its owner keeps it
  // zero (parameter servers' served embedding rows).
  int64_t keep_begin_ = 0, keep_end_ = 0;
  std::vector<float> weights_, grads_, m_, v_;
  WeightUnits* units_ = nullptr;
  int64_t step_ = 0;
  std::vector<Activations> slots_ = std::vector<Activations>(1);
  Gradients grad_acts_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_GPT_H_
