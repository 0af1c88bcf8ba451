// The GPT's operators as a table: one entry per operator of a block and of
// the ends, in graph order. Everything that lists the operators reads it:
// the signatures a strategy file is checked against, Megatron's preset,
// the executor's construction (OpGpt::Create), the parameters' cuts, the
// candidates the search chooses among, a plan's strategy file and its
// name. Adding an operator: docs/DESIGN.md, "How to add an operator".
#ifndef TESSERA_RUNTIME_MODEL_GPT_OPS_H_
#define TESSERA_RUNTIME_MODEL_GPT_OPS_H_

#include <array>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/status.h"
#include "runtime/model/gpt.h"
#include "runtime/parallel/op_strategy.h"
#include "runtime/parallel/operators.h"

namespace tessera {

// In graph order: the embedding, a block's ten, the head's three.
enum class GptOp {
  kEmbedding,
  kLn1,
  kQkv,
  kAttention,
  kProj,
  kAdd1,
  kLn2,
  kFc,
  kGelu,
  kFcProj,
  kAdd2,
  kLnF,
  kLmHead,
  kLoss,
};
inline constexpr int kGptOpCount = 14;

// Where an operator sits: before the blocks, in a block's attention half
// (x --ln_1--> --c_attn--> --attention--> --c_proj--> add_1(x, .)) or its
// MLP half (the same with ln_2, c_fc, GELU, mlp.c_proj, add_2), or after
// the blocks.
enum class GptOpPart { kEmbedding, kAttentionHalf, kMlpHalf, kHead };

struct GptOpSpec {
  GptOp op;
  std::string_view name;   // in a block "h.<i>." + name
  std::string_view label;  // in a plan's name ("c_attn col, ...")
  GptOpPart part;
};
// Every operator, in graph order.
std::span<const GptOpSpec> GptOpSpecs();
const GptOpSpec& SpecOf(GptOp op);
inline int Index(GptOp op) { return static_cast<int>(op); }
inline bool InBlock(GptOp op) {
  const GptOpPart p = SpecOf(op).part;
  return p == GptOpPart::kAttentionHalf || p == GptOpPart::kMlpHalf;
}
// The operator's name in block `layer` ("h.3.attn.c_attn"), or at the ends
// ("embedding"); a strategy file's pattern for every block ("h.*.ln_1").
std::string OpName(GptOp op, int layer = 0);
std::string OpPattern(GptOp op);

// One operator of any kind, with its strategy.
using AnyOp = std::variant<EmbeddingOp, LayerNormOp, LinearOp, AttentionOp, AddOp, GeluOp, LmHeadOp,
                           CrossEntropyOp>;
const OpInfo& InfoOf(const AnyOp& op);

// Its signature in block `layer` of `config` (for checking a strategy).
OpSignature SignatureOf(GptOp op, const GptConfig& config, int layer);
// The operator `name` of kind `op` from its strategy, on `tp` ranks of a
// tensor-parallel group and `dp` replicas. Errors name the operator.
Result<AnyOp> CreateOp(GptOp op, const std::string& name, const OpStrategy& s,
                       const GptConfig& config, int tp, int dp, int cp = 1);
// The strategies the search tries on a mesh {dp, tp}, in a fixed order;
// the first runs data parallel (the only one when tp = 1).
std::vector<OpStrategy> Candidates(GptOp op);
// Megatron-LM's strategy for it, with sequence parallelism when `sp`.
std::vector<InputStrategy> MegatronStrategy(GptOp op, bool sp);
// A strategy of a mesh without cp given the cp axis (context_parallel.h):
// every input's rows cut over cp after dp, except the attention's under
// Ulysses, whose heads are cut over cp instead.
std::vector<InputStrategy> WithCp(GptOp op, std::vector<InputStrategy> axes, CpAlgo algo);
// Whether the rows of the operator's inputs (those of `s`) are cut over
// cp as `algo` needs: the error names the operator and the input.
Status CheckCpRows(GptOp op, const std::string& name, const OpStrategy& s, CpAlgo algo);
// For each of its parameters, the dimension cut over tp (-1: none), into
// `splits` (GptStage::tp_dims' form; tp = 1 cuts nothing, which the caller
// applies).
void ParamSplitsOf(GptOp op, const AnyOp& chosen, int layer, int tp,
                   std::map<std::string, int>* splits);
// How a plan's name shows the choice: "col", "row", "rows", "heads",
// "vocab", "whole" ...
std::string ChoiceLabel(GptOp op, const AnyOp& chosen);

// Floats of a linear's weight and bias held on tp rank 0 (K inputs, M
// outputs).
int64_t LinearFloats(const LinearOp& op, int64_t K, int64_t M, int tp);
// Floats of the parameters whose cut the choice decides, on tp rank 0: a
// linear's (a layer norm's are whole whatever its choice; the embedding's
// are the ends'); 0 for the others.
int64_t BlockParamFloats(GptOp op, const AnyOp& chosen, const GptConfig& config, int tp);
// The dimension of its weight cut over tp (-1: none, or no weight).
int WeightSplitOf(const AnyOp& chosen);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_GPT_OPS_H_
