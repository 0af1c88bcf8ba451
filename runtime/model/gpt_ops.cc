#include "runtime/model/gpt_ops.h"

#include <algorithm>

namespace tessera {
namespace {

constexpr GptOpSpec kSpecs[] = {
    {GptOp::kEmbedding, "embedding", "embedding", GptOpPart::kEmbedding},
    {GptOp::kLn1, "ln_1", "ln_1", GptOpPart::kAttentionHalf},
    {GptOp::kQkv, "attn.c_attn", "c_attn", GptOpPart::kAttentionHalf},
    {GptOp::kAttention, "attn.attention", "attention", GptOpPart::kAttentionHalf},
    {GptOp::kProj, "attn.c_proj", "c_proj", GptOpPart::kAttentionHalf},
    {GptOp::kAdd1, "add_1", "add_1", GptOpPart::kAttentionHalf},
    {GptOp::kLn2, "ln_2", "ln_2", GptOpPart::kMlpHalf},
    {GptOp::kFc, "mlp.c_fc", "c_fc", GptOpPart::kMlpHalf},
    {GptOp::kGelu, "mlp.gelu", "gelu", GptOpPart::kMlpHalf},
    {GptOp::kFcProj, "mlp.c_proj", "mlp.c_proj", GptOpPart::kMlpHalf},
    {GptOp::kAdd2, "add_2", "add_2", GptOpPart::kMlpHalf},
    {GptOp::kLnF, "ln_f", "ln_f", GptOpPart::kHead},
    {GptOp::kLmHead, "lm_head", "lm_head", GptOpPart::kHead},
    {GptOp::kLoss, "loss", "loss", GptOpPart::kHead},
};
static_assert(std::size(kSpecs) == kGptOpCount, "a spec for every operator");

OpSignature::Input In(std::string name, std::vector<int64_t> shape, std::string param = "",
                      std::vector<int> uneven = {}) {
  return {std::move(name), std::move(shape), std::move(param), std::move(uneven)};
}

OpStrategy S(std::vector<InputStrategy> inputs) { return OpStrategy{std::move(inputs)}; }

// A linear's input and output columns in a model of embedding C.
struct LinearShape {
  int64_t K, M;
  int groups;
};
LinearShape LinearShapeOf(GptOp op, int64_t C) {
  switch (op) {
    case GptOp::kQkv:
      return {C, 3 * C, 3};  // q | k | v, cut alike by heads
    case GptOp::kProj:
      return {C, C, 1};
    case GptOp::kFc:
      return {C, 4 * C, 1};
    default:
      return {4 * C, C, 1};  // kFcProj
  }
}

// An operator's Result as one of any kind.
template <typename T>
Result<AnyOp> Any(Result<T> r) {
  if (!r.ok()) return r.status();
  return AnyOp(std::move(*r));
}

bool IsLinear(GptOp op) {
  return op == GptOp::kQkv || op == GptOp::kProj || op == GptOp::kFc || op == GptOp::kFcProj;
}
bool IsLayerNorm(GptOp op) { return op == GptOp::kLn1 || op == GptOp::kLn2 || op == GptOp::kLnF; }

Result<AnyOp> CreateLinear(GptOp op, const std::string& name, const OpStrategy& s,
                           const GptConfig& config, int tp, int dp) {
  const LinearShape l = LinearShapeOf(op, config.embed);
  ASSIGN_OR_RETURN(LinearOp linear, LinearOp::Create(name, s, l.K, l.M, l.groups, dp));
  if (l.groups > 1 && linear.weight_split() == 1 && config.embed % tp != 0) {
    return InvalidArgumentError(
        "operator '" + name + "': input 1 (weight) dimension 1 cuts q, k and v alike; C = " +
        std::to_string(config.embed) + " is not divisible by tp " + std::to_string(tp));
  }
  return AnyOp(std::move(linear));
}

// A placement's short name in a plan's name.
const char* Code(const Placement& p) {
  return p.split == 0 ? "rows" : p.split == 1 ? "cols" : "whole";
}
// A weight cut by dimension 0 or 1, else the output's placement.
const char* WeightCode(int split, const char* zero, const char* one, const Placement& out) {
  return split == 0 ? zero : split == 1 ? one : Code(out);
}

}  // namespace

int64_t LinearFloats(const LinearOp& op, int64_t K, int64_t M, int tp) {
  const int s = tp > 1 ? op.weight_split() : -1;
  const int64_t w = s == 0 ? (K + tp - 1) / tp * M : s == 1 ? K * ((M + tp - 1) / tp) : K * M;
  return w + (s == 1 ? (M + tp - 1) / tp : M);
}

int64_t BlockParamFloats(GptOp op, const AnyOp& chosen, const GptConfig& config, int tp) {
  if (!IsLinear(op)) return 0;
  const LinearShape l = LinearShapeOf(op, config.embed);
  return LinearFloats(std::get<LinearOp>(chosen), l.K, l.M, tp);
}

int WeightSplitOf(const AnyOp& chosen) {
  if (const auto* l = std::get_if<LinearOp>(&chosen)) return l->weight_split();
  if (const auto* e = std::get_if<EmbeddingOp>(&chosen)) return e->weight_split();
  if (const auto* h = std::get_if<LmHeadOp>(&chosen)) return h->weight_split();
  return -1;
}

std::span<const GptOpSpec> GptOpSpecs() { return kSpecs; }

const GptOpSpec& SpecOf(GptOp op) { return kSpecs[Index(op)]; }

std::string OpName(GptOp op, int layer) {
  const std::string name(SpecOf(op).name);
  return InBlock(op) ? "h." + std::to_string(layer) + "." + name : name;
}

std::string OpPattern(GptOp op) {
  const std::string name(SpecOf(op).name);
  return InBlock(op) ? "h.*." + name : name;
}

const OpInfo& InfoOf(const AnyOp& op) {
  return std::visit([](const auto& o) -> const OpInfo& { return o.info(); }, op);
}

OpSignature SignatureOf(GptOp op, const GptConfig& config, int layer) {
  const int64_t C = config.embed, V = config.vocab, R = -1;
  const std::string name = OpName(op, layer);
  if (IsLinear(op)) {
    const LinearShape l = LinearShapeOf(op, C);
    return {name, "linear", {In("x", {R, l.K}), In("weight", {l.K, l.M}, name + ".weight")}};
  }
  if (IsLayerNorm(op)) return {name, "layer_norm", {In("x", {R, C})}};
  switch (op) {
    case GptOp::kEmbedding:
      return {name, "embedding", {In("wte", {V, C}, "wte", {0}), In("tokens", {R})}};
    case GptOp::kAttention:
      // Dimension 1 of the attention's input counts heads (q | k | v cut alike).
      return {name, "attention", {In("qkv [rows, heads]", {R, config.heads})}};
    case GptOp::kGelu:
      return {name, "gelu", {In("x", {R, 4 * C})}};
    case GptOp::kLmHead:
      return {name, "lm_head", {In("x", {R, C}), In("wte", {V, C}, "wte", {0})}};
    case GptOp::kLoss:
      return {name, "cross_entropy", {In("logits", {R, V}, "", {1}), In("targets", {R})}};
    default:  // the adds
      return {name, "add", {In("a", {R, C}), In("b", {R, C})}};
  }
}

Result<AnyOp> CreateOp(GptOp op, const std::string& name, const OpStrategy& s,
                       const GptConfig& config, int tp, int dp, int cp) {
  const int64_t C = config.embed, V = config.vocab;
  if (IsLinear(op)) return CreateLinear(op, name, s, config, tp, dp);
  if (IsLayerNorm(op)) return Any(LayerNormOp::Create(name, s, dp));
  switch (op) {
    case GptOp::kEmbedding:
      return Any(EmbeddingOp::Create(name, s, V, C, dp));
    case GptOp::kAttention:
      return Any(AttentionOp::Create(name, s, config.heads, C, tp, dp, cp));
    case GptOp::kGelu:
      return Any(GeluOp::Create(name, s, dp));
    case GptOp::kLmHead:
      return Any(LmHeadOp::Create(name, s, V, C, dp));
    case GptOp::kLoss:
      return Any(CrossEntropyOp::Create(name, s, V, dp));
    default:  // the adds
      return Any(AddOp::Create(name, s, dp));
  }
}

std::vector<OpStrategy> Candidates(GptOp op) {
  const DimAxes none, d{"dp"}, t{"tp"}, dt{"dp", "tp"};
  if (IsLinear(op)) {
    return {S({{d, none}, {none, none}}), S({{d, none}, {none, t}}), S({{d, t}, {t, none}}),
            S({{dt, none}, {none, none}})};
  }
  if (IsLayerNorm(op)) return {S({{d, none}}), S({{dt, none}})};
  switch (op) {
    case GptOp::kEmbedding:
      return {S({{none, none}, {d}}), S({{t, none}, {d}}), S({{none, t}, {d}}),
              S({{none, none}, {dt}})};
    case GptOp::kAttention:
    case GptOp::kGelu:
      return {S({{d, none}}), S({{d, t}}), S({{dt, none}})};
    case GptOp::kLmHead:
      return {S({{d, none}, {none, none}}), S({{d, none}, {t, none}}), S({{d, t}, {none, t}}),
              S({{dt, none}, {none, none}})};
    case GptOp::kLoss:
      return {S({{d, none}, {d}}), S({{d, t}, {d}}), S({{dt, none}, {dt}})};
    default:  // the adds
      return {S({{d, none}, {d, none}}), S({{dt, none}, {dt, none}}), S({{d, t}, {d, t}})};
  }
}

std::vector<InputStrategy> MegatronStrategy(GptOp op, bool sp) {
  const DimAxes none, dp{"dp"}, tp{"tp"}, rows = sp ? DimAxes{"dp", "tp"} : dp;
  if (IsLayerNorm(op)) return {{rows, none}};
  switch (op) {
    case GptOp::kEmbedding:
      return {{tp, none}, {dp}};
    case GptOp::kQkv:
    case GptOp::kFc:
      return {{dp, none}, {none, tp}};  // by columns (c_attn by heads)
    case GptOp::kAttention:
    case GptOp::kGelu:
      return {{dp, tp}};
    case GptOp::kProj:
    case GptOp::kFcProj:
      return {{dp, tp}, {tp, none}};  // by rows
    case GptOp::kLmHead:
      return {{dp, none}, {tp, none}};
    case GptOp::kLoss:
      return {{dp, tp}, {dp}};
    default:  // the adds
      return {{rows, none}, {rows, none}};
  }
}

namespace {

// Which of the operator's inputs have rows (the signature's -1).
std::vector<bool> RowInputs(GptOp op) {
  const OpSignature sig = SignatureOf(op, GptConfig{}, 0);
  std::vector<bool> rows;
  for (const OpSignature::Input& in : sig.inputs) {
    rows.push_back(!in.shape.empty() && in.shape[0] < 0);
  }
  return rows;
}

bool Has(const DimAxes& axes, const std::string& a) {
  return std::find(axes.begin(), axes.end(), a) != axes.end();
}

}  // namespace

std::vector<InputStrategy> WithCp(GptOp op, std::vector<InputStrategy> axes, CpAlgo algo) {
  if (op == GptOp::kAttention && algo == CpAlgo::kUlysses) {
    axes[0][1].push_back("cp");
    return axes;
  }
  const std::vector<bool> rows = RowInputs(op);
  for (size_t i = 0; i < axes.size() && i < rows.size(); ++i) {
    if (!rows[i] || axes[i].empty() || Has(axes[i][0], "cp")) continue;
    DimAxes& d = axes[i][0];
    d.insert(!d.empty() && d[0] == "dp" ? d.begin() + 1 : d.begin(), "cp");
  }
  return axes;
}

Status CheckCpRows(GptOp op, const std::string& name, const OpStrategy& s, CpAlgo algo) {
  const bool ulysses = op == GptOp::kAttention && algo == CpAlgo::kUlysses;
  const std::vector<bool> rows = RowInputs(op);
  for (size_t i = 0; i < s.inputs.size() && i < rows.size(); ++i) {
    if (!rows[i] || s.inputs[i].empty()) continue;
    const bool cut = Has(s.inputs[i][0], "cp");
    if (cut == !ulysses) continue;
    const std::string what =
        "operator '" + name + "' " + s.ToString() + ": input " + std::to_string(i) + "'s rows";
    if (ulysses) {
      return InvalidArgumentError(what +
                                  " are cut over cp, which is ring attention, but cp_algo "
                                  "is ulysses (cut the heads over cp, the rows over dp only)");
    }
    if (op == GptOp::kAttention) {
      return InvalidArgumentError(what +
                                  " are not cut over cp: with cp_algo ring the attention's "
                                  "rows are cut over [\"dp\", \"cp\"]");
    }
    return InvalidArgumentError(what +
                                " are not cut over cp: context parallelism cuts every "
                                "operator's sequence, [\"dp\", \"cp\"] (then tp)");
  }
  if (ulysses && (s.inputs[0][1].empty() || s.inputs[0][1].back() != "cp")) {
    return InvalidArgumentError("operator '" + name + "' " + s.ToString() +
                                ": with cp_algo ulysses the attention's heads are cut over cp "
                                "([\"cp\"] or [\"tp\", \"cp\"])");
  }
  return Status::Ok();
}

void ParamSplitsOf(GptOp op, const AnyOp& chosen, int layer, int tp,
                   std::map<std::string, int>* splits) {
  const std::string p = OpName(op, layer);
  if (op == GptOp::kQkv) {
    // c_attn's weight is cut in its [C, 3, C] view (by heads) when tp > 1.
    const int ws = std::get<LinearOp>(chosen).weight_split();
    (*splits)[p + ".weight"] = ws == 1 ? (tp > 1 ? 2 : 1) : ws;
    (*splits)[p + ".bias"] = ws == 1 ? (tp > 1 ? 1 : 0) : -1;
  } else if (IsLinear(op)) {
    const LinearOp& l = std::get<LinearOp>(chosen);
    (*splits)[p + ".weight"] = l.weight_split();
    (*splits)[p + ".bias"] = l.bias_split() ? 0 : -1;
  } else if (IsLayerNorm(op)) {
    (*splits)[p + ".weight"] = (*splits)[p + ".bias"] = -1;
  } else if (op == GptOp::kEmbedding) {
    const int ws = std::get<EmbeddingOp>(chosen).weight_split();
    (*splits)["wte"] = ws;
    (*splits)["wpe"] = ws == 1 ? 1 : -1;
  }
}

std::string ChoiceLabel(GptOp op, const AnyOp& chosen) {
  const OpInfo& info = InfoOf(chosen);
  if (IsLinear(op)) {
    const int ws = std::get<LinearOp>(chosen).weight_split();
    return ws == 1 ? "col" : ws == 0 ? "row" : Code(info.output);
  }
  if (IsLayerNorm(op)) return Code(info.inputs[0]);
  switch (op) {
    case GptOp::kEmbedding:
      return WeightCode(std::get<EmbeddingOp>(chosen).weight_split(), "vocab", "cols", info.output);
    case GptOp::kAttention:
      return info.inputs[0].split == 1 ? "heads" : Code(info.inputs[0]);
    case GptOp::kLmHead:
      return WeightCode(std::get<LmHeadOp>(chosen).weight_split(), "vocab", "k", info.output);
    case GptOp::kLoss:
      return info.inputs[0].split == 1 ? "vocab" : Code(info.inputs[0]);
    default:  // the adds and GELU
      return Code(info.output);
  }
}

}  // namespace tessera
