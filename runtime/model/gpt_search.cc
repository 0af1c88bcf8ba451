#include "runtime/model/gpt_search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <unordered_map>

#include "core/byte_size.h"
#include "runtime/model/gpt_work.h"

namespace tessera {
namespace {

// The candidate strategies of every operator kind on a mesh {dp, tp} (one
// each when tp = 1: data parallel; the user's alone where propagate fixes
// it). A search picks one per kind: the same for every block (identical
// blocks fold into one decision).
struct MeshOps {
  std::vector<LayerNormOp> ln1, ln2, lnf;
  std::vector<LinearOp> qkv, proj, fc, fcproj;
  std::vector<AttentionOp> attn;
  std::vector<GeluOp> gelu;
  std::vector<AddOp> add1, add2;
  std::vector<EmbeddingOp> emb;
  std::vector<LmHeadOp> lm;
  std::vector<CrossEntropyOp> loss;
};

// One choice per operator kind: indices into MeshOps (ln_f from `ln`).
struct Pick {
  int ln1 = 0, qkv = 0, attn = 0, proj = 0, add1 = 0, ln2 = 0, fc = 0, gelu = 0, fcproj = 0,
      add2 = 0, emb = 0, lnf = 0, lm = 0, loss = 0;
  Pick() = default;
  // No head (a stage that is not last).
  explicit Pick(int none) : emb(none), lnf(none), lm(none), loss(none) {}
  Pick(int a, int b, int c, int d, int e, int f, int g, int h, int i, int j, int k, int l, int m,
       int n)
      : ln1(a),
        qkv(b),
        attn(c),
        proj(d),
        add1(e),
        ln2(f),
        fc(g),
        gelu(h),
        fcproj(i),
        add2(j),
        emb(k),
        lnf(l),
        lm(m),
        loss(n) {}
};

OpStrategy S(std::vector<InputStrategy> inputs) { return OpStrategy{std::move(inputs)}; }

// The operator kinds in a fixed order, with their block/end names (for a
// file and for matching a user's file in propagate).
const char* const kBlockOps[] = {"ln_1", "attn.c_attn", "attn.attention", "attn.c_proj", "add_1",
                                 "ln_2", "mlp.c_fc",    "mlp.gelu",       "mlp.c_proj",  "add_2"};

Result<MeshOps> MakeMeshOps(const GptConfig& c, int dp, int tp,
                            const std::map<std::string, OpStrategy>* fixed) {
  const DimAxes none, d{"dp"}, t{"tp"}, dt{"dp", "tp"};
  const int64_t C = c.embed, V = c.vocab;
  MeshOps m;
  // Each candidate its operator accepts and that cuts the operator's
  // dimensions evenly (what resolving the plan's file checks); in
  // propagate the user's strategy is the only one, and an error when the
  // operator refuses it.
  std::map<std::string, OpSignature> signatures;
  {
    GptConfig one = c;  // blocks fold: block 0 says it all
    one.layers = 1;
    for (OpSignature& sig : OpGpt::Signatures(one)) signatures.emplace(sig.name, std::move(sig));
  }
  ASSIGN_OR_RETURN(const Mesh mesh, Mesh::Create({"pp", "dp", "tp"}, {1, dp, tp}));
  Status status = Status::Ok();
  auto each = [&](const std::string& name, std::vector<OpStrategy> cands, auto create, auto* out) {
    if (tp == 1) cands.resize(1);
    const bool user = fixed != nullptr && fixed->count(name) > 0;
    if (user) cands = {fixed->at(name)};
    const auto sig = signatures.find(name);
    for (const OpStrategy& st : cands) {
      if (sig != signatures.end()) {
        if (Status fits = CheckOpStrategy(sig->second, st, mesh, "auto-parallel"); !fits.ok()) {
          if (user && status.ok()) status = fits;
          continue;
        }
      }
      auto op = create(st);
      if (op.ok()) {
        out->push_back(*op);
      } else if (user && status.ok()) {
        status = op.status();
      }
    }
  };
  auto linear = [&](const std::string& name, int64_t K, int64_t M, int groups,
                    std::vector<LinearOp>* out) {
    each(
        name,
        {S({{d, none}, {none, none}}), S({{d, none}, {none, t}}), S({{d, t}, {t, none}}),
         S({{dt, none}, {none, none}})},
        [&](const OpStrategy& st) -> Result<LinearOp> {
          ASSIGN_OR_RETURN(LinearOp op, LinearOp::Create(name, st, K, M, groups, dp));
          if (groups > 1 && op.weight_split() == 1 && C % tp != 0) {
            return InvalidArgumentError(
                "operator '" + name + "': cutting q, k and v by heads needs C = " +
                std::to_string(C) + " divisible by tp " + std::to_string(tp));
          }
          return op;
        },
        out);
  };
  const std::vector<OpStrategy> rows = {S({{d, none}}), S({{dt, none}})};
  for (const auto& [name, out] :
       {std::pair{"h.0.ln_1", &m.ln1}, {"h.0.ln_2", &m.ln2}, {"ln_f", &m.lnf}}) {
    each(
        name, rows, [&](const OpStrategy& st) { return LayerNormOp::Create(name, st, dp); }, out);
  }
  linear("h.0.attn.c_attn", C, 3 * C, 3, &m.qkv);
  each(
      "h.0.attn.attention", {S({{d, none}}), S({{d, t}}), S({{dt, none}})},
      [&](const OpStrategy& st) {
        return AttentionOp::Create("h.0.attn.attention", st, c.heads, C, tp, dp);
      },
      &m.attn);
  linear("h.0.attn.c_proj", C, C, 1, &m.proj);
  for (const auto& [name, out] : {std::pair{"h.0.add_1", &m.add1}, {"h.0.add_2", &m.add2}}) {
    each(
        name, {S({{d, none}, {d, none}}), S({{dt, none}, {dt, none}}), S({{d, t}, {d, t}})},
        [&](const OpStrategy& st) { return AddOp::Create(name, st, dp); }, out);
  }
  linear("h.0.mlp.c_fc", C, 4 * C, 1, &m.fc);
  each(
      "h.0.mlp.gelu", {S({{d, none}}), S({{d, t}}), S({{dt, none}})},
      [&](const OpStrategy& st) { return GeluOp::Create("h.0.mlp.gelu", st, dp); }, &m.gelu);
  linear("h.0.mlp.c_proj", 4 * C, C, 1, &m.fcproj);
  each(
      "embedding",
      {S({{none, none}, {d}}), S({{t, none}, {d}}), S({{none, t}, {d}}), S({{none, none}, {dt}})},
      [&](const OpStrategy& st) { return EmbeddingOp::Create("embedding", st, V, C, dp); }, &m.emb);
  each(
      "lm_head",
      {S({{d, none}, {none, none}}), S({{d, none}, {t, none}}), S({{d, t}, {none, t}}),
       S({{dt, none}, {none, none}})},
      [&](const OpStrategy& st) { return LmHeadOp::Create("lm_head", st, V, C, dp); }, &m.lm);
  each(
      "loss", {S({{d, none}, {d}}), S({{d, t}, {d}}), S({{dt, none}, {dt}})},
      [&](const OpStrategy& st) { return CrossEntropyOp::Create("loss", st, V, dp); }, &m.loss);
  RETURN_IF_ERROR(status);
  return m;
}

std::vector<int> Divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i) {
    if (n % i == 0) d.push_back(i);
  }
  return d;
}

// Every operator has at least one strategy that runs.
bool HasEveryOperator(const MeshOps& m) {
  return !(m.ln1.empty() || m.ln2.empty() || m.lnf.empty() || m.qkv.empty() || m.attn.empty() ||
           m.proj.empty() || m.add1.empty() || m.add2.empty() || m.fc.empty() || m.gelu.empty() ||
           m.fcproj.empty() || m.emb.empty() || m.lm.empty() || m.loss.empty());
}

// Whether some pp x dp x tp configuration of `n` ranks runs the model at
// all, memory aside: pp at most the layers, dp dividing the batch, every
// operator with a strategy on tp. `memo` keeps each (dp, tp)'s answer.
bool RunsOn(const GptConfig& c, int B, int n, std::map<std::pair<int, int>, bool>* memo) {
  for (int pp : Divisors(n)) {
    if (pp > c.layers) continue;
    for (int tp : Divisors(n / pp)) {
      const int dp = n / pp / tp;
      if (B % dp != 0) continue;
      auto [it, fresh] = memo->emplace(std::pair{dp, tp}, false);
      if (fresh) {
        Result<MeshOps> ops = MakeMeshOps(c, dp, tp, nullptr);
        it->second = ops.ok() && HasEveryOperator(*ops);
      }
      if (it->second) return true;
    }
  }
  return false;
}

// "4 or 8 ranks can": the nearest device counts below and above `n` (up
// to 3 each side, within 32) for which `runs` holds.
std::string RunnableNear(int n, const std::function<bool(int)>& runs) {
  std::vector<int> below, above;
  for (int k = n - 1; k >= std::max(1, n - 32) && below.size() < 3; --k) {
    if (runs(k)) below.insert(below.begin(), k);
  }
  for (int k = n + 1; k <= n + 32 && above.size() < 3; ++k) {
    if (runs(k)) above.push_back(k);
  }
  std::vector<int> all = below;
  all.insert(all.end(), above.begin(), above.end());
  if (all.empty()) return "";
  std::string out;
  for (size_t i = 0; i < all.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == all.size() ? " or " : ", ") + std::to_string(all[i]);
  }
  return out + " ranks can";
}

// Short names of an operator's choice, for a plan's name.
const char* Code(const Placement& p) {
  return p.split == 0 ? "rows" : p.split == 1 ? "cols" : "whole";
}
std::string CodeOf(const MeshOps& o, const Pick& p, int tp) {
  if (tp == 1) return "data parallel";
  auto lin = [](const LinearOp& l) {
    return l.weight_split() == 1 ? "col" : l.weight_split() == 0 ? "row" : Code(l.info().output);
  };
  auto w = [](int split, const char* zero, const char* one, const Placement& out) {
    return split == 0 ? zero : split == 1 ? one : Code(out);
  };
  const Placement& attn = o.attn[p.attn].info().inputs[0];
  return std::string("ln_1 ") + Code(o.ln1[p.ln1].info().inputs[0]) + ", c_attn " +
         lin(o.qkv[p.qkv]) + ", attention " + (attn.split == 1 ? "heads" : Code(attn)) +
         ", c_proj " + lin(o.proj[p.proj]) + ", add_1 " + Code(o.add1[p.add1].info().output) +
         ", ln_2 " + Code(o.ln2[p.ln2].info().inputs[0]) + ", c_fc " + lin(o.fc[p.fc]) + ", gelu " +
         Code(o.gelu[p.gelu].info().output) + ", mlp.c_proj " + lin(o.fcproj[p.fcproj]) +
         ", add_2 " + Code(o.add2[p.add2].info().output) + "; embedding " +
         w(o.emb[p.emb].weight_split(), "vocab", "cols", o.emb[p.emb].info().output) + ", ln_f " +
         Code(o.lnf[p.lnf].info().inputs[0]) + ", lm_head " +
         w(o.lm[p.lm].weight_split(), "vocab", "k", o.lm[p.lm].info().output) + ", loss " +
         (o.loss[p.loss].info().inputs[0].split == 1 ? "vocab"
                                                     : Code(o.loss[p.loss].info().inputs[0]));
}

// The stage kinds of a pipeline: the only one, the first, a middle, the last.
enum Kind { kOnly, kFirst, kMiddle, kLast };

// The halves of blocks of one mesh, micro-batch and recompute: each half's
// work for each input placement, computed once.
class Halves {
 public:
  Halves(const GptConfig& config, const MeshOps& ops, int tp, int64_t N, int T, Recompute rc,
         const MachineProfile& profile)
      : config_(config), ops_(ops), tp_(tp), N_(N), T_(T), rc_(rc), profile_(profile) {
    auto add = [&](const Placement& p) {
      if (std::find(xs_.begin(), xs_.end(), p) == xs_.end()) xs_.push_back(p);
    };
    add(Placement{-1});
    for (const AddOp& a : ops.add1) add(a.info().output);
    for (const AddOp& a : ops.add2) add(a.info().output);
    for (const EmbeddingOp& e : ops.emb) add(e.info().output);
    n1_ = static_cast<int64_t>(ops.ln1.size()) * ops.qkv.size() * ops.attn.size() *
          ops.proj.size() * ops.add1.size();
    n2_ = static_cast<int64_t>(ops.ln2.size()) * ops.fc.size() * ops.gelu.size() *
          ops.fcproj.size() * ops.add2.size();
  }
  // A half's seconds (forward, backward), activations, shared buffers and
  // tp sums: what the exact search adds up for a block.
  struct Sum {
    double fw = 0, bw = 0;
    int64_t slot = 0, tp_sum = 0;
    int64_t shared[kSharedBuffers] = {};
  };
  const Sum& Sum1(const Pick& p, const Placement& x) {
    const int64_t key = Id1(p) * static_cast<int64_t>(xs_.size()) + X(x);
    auto it = s1_.find(key);
    if (it == s1_.end()) it = s1_.emplace(key, Summarize(Half1(p, x))).first;
    return it->second;
  }
  const Sum& Sum2(const Pick& p, const Placement& x) {
    const int64_t key = Id2(p) * static_cast<int64_t>(xs_.size()) + X(x);
    auto it = s2_.find(key);
    if (it == s2_.end()) it = s2_.emplace(key, Summarize(Half2(p, x))).first;
    return it->second;
  }
  // What EstimateBlock gives, in seconds and bytes.
  void BlockSum(const Pick& p, double* seconds, int64_t* slot, int64_t* shared, int64_t* tp_sum) {
    const Sum& a = Sum1(p, ops_.add2[p.add2].info().output);
    const Sum& b = Sum2(p, ops_.add1[p.add1].info().output);
    *seconds = a.fw + a.bw + b.fw + b.bw;
    *slot = rc_ == Recompute::kFull ? Sizer(ops_.add2[p.add2].info().output) : a.slot + b.slot;
    if (rc_ == Recompute::kFull) {  // the forward again, its output copied out of the scratch
      *seconds += a.fw + b.fw + profile_.ComputeSeconds(0, 2.0 * static_cast<double>(*slot));
    }
    int64_t sh = 0;
    for (int i = 0; i < kSharedBuffers; ++i) {
      int64_t v = std::max(a.shared[i], b.shared[i]);
      if (i == kScratchBlock && rc_ == Recompute::kFull) v = std::max(v, a.slot + b.slot);
      sh += v;
    }
    *shared = sh;
    *tp_sum = a.tp_sum + b.tp_sum;
  }
  int64_t n1() const { return n1_; }
  int64_t n2() const { return n2_; }
  int64_t Id1(const Pick& p) const {
    return (((static_cast<int64_t>(p.ln1) * ops_.qkv.size() + p.qkv) * ops_.attn.size() + p.attn) *
                ops_.proj.size() +
            p.proj) *
               ops_.add1.size() +
           p.add1;
  }
  int64_t Id2(const Pick& p) const {
    return (((static_cast<int64_t>(p.ln2) * ops_.fc.size() + p.fc) * ops_.gelu.size() + p.gelu) *
                ops_.fcproj.size() +
            p.fcproj) *
               ops_.add2.size() +
           p.add2;
  }
  void Unpack1(int64_t id, Pick* p) const {
    p->add1 = static_cast<int>(id % ops_.add1.size()), id /= ops_.add1.size();
    p->proj = static_cast<int>(id % ops_.proj.size()), id /= ops_.proj.size();
    p->attn = static_cast<int>(id % ops_.attn.size()), id /= ops_.attn.size();
    p->qkv = static_cast<int>(id % ops_.qkv.size()), id /= ops_.qkv.size();
    p->ln1 = static_cast<int>(id);
  }
  void Unpack2(int64_t id, Pick* p) const {
    p->add2 = static_cast<int>(id % ops_.add2.size()), id /= ops_.add2.size();
    p->fcproj = static_cast<int>(id % ops_.fcproj.size()), id /= ops_.fcproj.size();
    p->gelu = static_cast<int>(id % ops_.gelu.size()), id /= ops_.gelu.size();
    p->fc = static_cast<int>(id % ops_.fc.size()), id /= ops_.fc.size();
    p->ln2 = static_cast<int>(id);
  }
  // A block of `p` whose stream arrives placed as `x`.
  StageWork Block(const Pick& p, const Placement& x) {
    const HalfWork& a = Half1(p, x);
    const HalfWork& b = Half2(p, ops_.add1[p.add1].info().output);
    return EstimateBlock(a, b, rc_, Sizer(ops_.add2[p.add2].info().output));
  }
  // Whether attention's rows cut over tp keep whole sequences.
  bool Runs(const Pick& p) const {
    const Placement& in = ops_.attn[p.attn].info().inputs[0];
    return in.split != 0 || (N_ / T_) % tp_ == 0;
  }

 private:
  int64_t Sizer(const Placement& p) const {
    const int64_t rows = p.split == 0 && tp_ > 1 ? (N_ + tp_ - 1) / tp_ : N_;
    const int64_t cols = p.split == 1 && tp_ > 1 ? (config_.embed + tp_ - 1) / tp_ : config_.embed;
    return rows * cols * 4;
  }
  size_t X(const Placement& x) const { return std::find(xs_.begin(), xs_.end(), x) - xs_.begin(); }
  Sum Summarize(const HalfWork& h) const {
    Sum s;
    s.fw = ComputeSeconds(h.forward, profile_) + GroupCommSeconds(h.forward, profile_, tp_);
    s.bw = ComputeSeconds(h.backward, profile_) + GroupCommSeconds(h.backward, profile_, tp_);
    s.slot = h.forward.slot_bytes;
    s.tp_sum = h.forward.tp_sum_floats + h.backward.tp_sum_floats;
    for (int i = 0; i < kSharedBuffers; ++i) {
      s.shared[i] = std::max(h.forward.shared[i], h.backward.shared[i]);
    }
    return s;
  }
  const HalfWork& Half1(const Pick& p, const Placement& x) {
    const int64_t key = Id1(p) * static_cast<int64_t>(xs_.size()) + X(x);
    auto it = h1_.find(key);
    if (it == h1_.end()) {
      it = h1_.emplace(key, EstimateHalf(config_, tp_,
                                         {&ops_.ln1[p.ln1], &ops_.qkv[p.qkv], &ops_.attn[p.attn],
                                          nullptr, &ops_.proj[p.proj], &ops_.add1[p.add1]},
                                         x, N_, T_, rc_, /*shares=*/false))
               .first;
    }
    return it->second;
  }
  const HalfWork& Half2(const Pick& p, const Placement& x) {
    const int64_t key = Id2(p) * static_cast<int64_t>(xs_.size()) + X(x);
    auto it = h2_.find(key);
    if (it == h2_.end()) {
      it = h2_.emplace(key,
                       EstimateHalf(config_, tp_,
                                    {&ops_.ln2[p.ln2], &ops_.fc[p.fc], nullptr, &ops_.gelu[p.gelu],
                                     &ops_.fcproj[p.fcproj], &ops_.add2[p.add2]},
                                    x, N_, T_, rc_, /*shares=*/false))
               .first;
    }
    return it->second;
  }

  const GptConfig& config_;
  const MeshOps& ops_;
  int tp_;
  int64_t N_;
  int T_;
  Recompute rc_;
  std::vector<Placement> xs_;
  int64_t n1_ = 0, n2_ = 0;
  const MachineProfile& profile_;
  std::unordered_map<int64_t, HalfWork> h1_, h2_;
  std::unordered_map<int64_t, Sum> s1_, s2_;
};

// A block strategy the exact search keeps: not dominated in time per
// micro-batch, activations, shared buffers, tp sums and parameters.
struct BlockPoint {
  Pick pick;
  double seconds = 0;
  int64_t slot = 0, shared = 0, tp_sum = 0, params = 0;
};

}  // namespace

Result<SearchResult> SearchGptParallel(const GptConfig& config, int B, int T, int devices,
                                       const MachineProfile& machine,
                                       const SearchOptions& options) {
  RETURN_IF_ERROR(config.Validate());
  const MachineProfile profile = machine.ForRanks(devices);
  const bool fast = options.mode == "fast", propagate = options.mode == "propagate";
  if (!fast && !propagate && options.mode != "exact") {
    return InvalidArgumentError("auto-parallel mode '" + options.mode +
                                "' is not one of propagate, fast, exact");
  }
  if (propagate && options.fixed == nullptr) {
    return InvalidArgumentError("auto-parallel propagate completes a strategy file: give one");
  }
  if (devices < 1) return InvalidArgumentError("the search needs at least one device");
  if (T < 1 || T > config.context) {
    return InvalidArgumentError("a sequence of " + std::to_string(T) +
                                " does not fit the context of " + std::to_string(config.context));
  }
  const int64_t budget = options.rank_memory > 0    ? options.rank_memory
                         : profile.memory_bytes > 0 ? profile.memory_bytes
                                                    : std::numeric_limits<int64_t>::max();
  const OpStrategyFile* fixed = propagate ? options.fixed.get() : nullptr;
  // propagate: the file's settings bound the search; its operators are
  // fixed (every block alike: a pattern or the same strategy for each).
  auto allowed = [&](const std::optional<int>& want, int v) {
    return !fixed || !want || *want == v;
  };
  std::optional<Recompute> fixed_rc;
  if (fixed != nullptr && !fixed->recompute.empty()) {
    if (fixed->recompute.size() != 1 || fixed->recompute[0].first != "h.*") {
      return InvalidArgumentError(fixed->source +
                                  ": propagate folds identical blocks: give "
                                  "recompute for \"h.*\" only");
    }
    ASSIGN_OR_RETURN(fixed_rc, ParseRecompute(fixed->recompute[0].second));
  }

  SearchResult best;
  bool found = false;
  if (!fast && fixed == nullptr) {
    // Start from fast's answer (its choices are among exact's): the
    // bound below then skips most block strategies at once.
    SearchOptions seed = options;
    seed.mode = "fast";
    auto r = SearchGptParallel(config, B, T, devices, machine, seed);
    if (r.ok()) {
      best = std::move(*r);
      found = true;
    }
  }
  std::string least_name, why_none;
  int64_t least = std::numeric_limits<int64_t>::max();
  std::map<std::tuple<int, int, bool, bool, int, int, int>, ParamStats> param_memo;
  std::map<std::tuple<int, int, bool, bool>, ParamParts> parts_memo;

  for (int pp : Divisors(devices)) {
    if (pp > config.layers || !allowed(fixed ? fixed->pp : std::nullopt, pp)) continue;
    for (int tp : Divisors(devices / pp)) {
      const int dp = devices / pp / tp;
      if (B % dp != 0 || !allowed(fixed ? fixed->dp : std::nullopt, dp) ||
          !allowed(fixed ? fixed->tp : std::nullopt, tp)) {
        continue;
      }
      ASSIGN_OR_RETURN(Mesh mesh, Mesh::Create({"pp", "dp", "tp"}, {pp, dp, tp}));
      // The user's operators (propagate), resolved on this mesh.
      std::map<std::string, OpStrategy> user;
      if (fixed != nullptr) {
        auto r = ResolveOpStrategies(*fixed, OpGpt::Signatures(config), mesh, /*named_only=*/true);
        if (!r.ok()) {
          if (why_none.empty()) why_none = r.status().message();
          continue;
        }
        std::map<std::string, OpStrategy> named;
        for (const auto& [name, st] : *r) {
          // Blocks fold: h.<i>.<op> must agree for every i.
          std::string key = name;
          if (name.starts_with("h.")) key = "h.0." + name.substr(name.find('.', 2) + 1);
          auto [it, fresh] = named.emplace(key, st);
          if (!fresh && !(it->second == st)) {
            return InvalidArgumentError(fixed->source +
                                        ": propagate folds identical blocks, but "
                                        "operator '" +
                                        name + "' differs from block 0's");
          }
        }
        user = std::move(named);
      }
      ASSIGN_OR_RETURN(MeshOps ops, MakeMeshOps(config, dp, tp, fixed ? &user : nullptr));
      if (!HasEveryOperator(ops)) {
        if (why_none.empty()) {
          why_none = "on tp " + std::to_string(tp) + " some operator has no strategy that runs";
        }
        continue;
      }
      // The templates fast chooses among, as picks.
      std::vector<Pick> templates;
      if (fast) {
        for (int t = 0; t < (tp == 1 ? 1 : 2); ++t) {
          OpStrategyFile f = tp == 1 ? OpStrategyFile{} : OpGpt::Megatron(t == 1);
          GptConfig one = config;  // blocks fold: block 0 says it all
          one.layers = 1;
          auto r = ResolveOpStrategies(f, OpGpt::Signatures(one), mesh);
          if (!r.ok()) continue;
          auto find = [&](const auto& v, const std::string& name) {
            for (size_t i = 0; i < v.size(); ++i) {
              if (v[i].info().strategy == r->at(name)) return static_cast<int>(i);
            }
            return -1;
          };
          Pick p{find(ops.ln1, "h.0.ln_1"),
                 find(ops.qkv, "h.0.attn.c_attn"),
                 find(ops.attn, "h.0.attn.attention"),
                 find(ops.proj, "h.0.attn.c_proj"),
                 find(ops.add1, "h.0.add_1"),
                 find(ops.ln2, "h.0.ln_2"),
                 find(ops.fc, "h.0.mlp.c_fc"),
                 find(ops.gelu, "h.0.mlp.gelu"),
                 find(ops.fcproj, "h.0.mlp.c_proj"),
                 find(ops.add2, "h.0.add_2"),
                 find(ops.emb, "embedding"),
                 find(ops.lnf, "ln_f"),
                 find(ops.lm, "lm_head"),
                 find(ops.loss, "loss")};
          const int* f0 = &p.ln1;
          if (std::all_of(f0, f0 + 14, [](int i) { return i >= 0; })) templates.push_back(p);
        }
      }
      const int rows = B / dp;
      for (int m : Divisors(rows)) {
        if (!allowed(fixed ? fixed->micro_batches : std::nullopt, m)) continue;
        const int64_t N = static_cast<int64_t>(rows / m) * T;
        const double lent =
            pp > 1 && profile.ranks_per_device > 1 ? 1.0 / profile.ranks_per_device : 1.0;
        for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
          if (fixed_rc && *fixed_rc != rc) continue;
          Halves halves(config, ops, tp, N, T, rc, profile);
          // The stage ends, each computed once: the input by embedding
          // (-1: the previous stage's), the output by stream placement and
          // head (Pick.lnf < 0: the transfer to the next stage).
          std::map<int, StageWork> inputs;
          std::map<std::tuple<int, int, bool, int, int, int, bool>, StageWork> outputs;
          auto Input = [&](int emb) -> const StageWork& {
            auto it = inputs.find(emb);
            if (it == inputs.end()) {
              it =
                  inputs
                      .emplace(emb, EstimateInput(config, tp, emb < 0 ? nullptr : &ops.emb[emb], N))
                      .first;
            }
            return it->second;
          };
          auto Output = [&](const Placement& x, const Pick& h,
                            bool wte_summed) -> const StageWork& {
            const auto key =
                std::tuple(x.split, x.groups, x.partial, h.lnf, h.lm, h.loss, wte_summed);
            auto it = outputs.find(key);
            if (it == outputs.end()) {
              const OpGpt::HeadOps head{h.lnf < 0 ? nullptr : &ops.lnf[h.lnf],
                                        h.lnf < 0 ? nullptr : &ops.lm[h.lm],
                                        h.lnf < 0 ? nullptr : &ops.loss[h.loss]};
              it = outputs
                       .emplace(key, EstimateOutput(config, tp, x, h.lnf < 0 ? nullptr : &head, N,
                                                    wte_summed))
                       .first;
            }
            return it->second;
          };
          auto seconds = [&](const StageWork& w) {
            return ComputeSeconds(w, profile) + GroupCommSeconds(w, profile, tp);
          };
          // The heads (ln_f, lm_head, loss) worth trying after a stream
          // placed as `x` with wte cut as `ws`: those no other dominates
          // in time, activations, tp sums and every shared buffer (with
          // and without the embedding summing wte), as a head's cost
          // depends on nothing else.
          std::map<std::tuple<int, int, bool, int>, std::vector<Pick>> heads;
          auto Heads = [&](const Placement& x, int ws) -> const std::vector<Pick>& {
            const auto key = std::tuple(x.split, x.groups, x.partial, ws);
            auto it = heads.find(key);
            if (it != heads.end()) return it->second;
            struct Option {
              Pick pick;
              StageWork work[2];
            };
            std::vector<Option> options;
            for (size_t l = 0; l < ops.lm.size(); ++l) {
              if (ops.lm[l].weight_split() != ws) continue;
              for (size_t f = 0; f < ops.lnf.size(); ++f) {
                for (size_t c = 0; c < ops.loss.size(); ++c) {
                  Pick h(-1);
                  h.lm = static_cast<int>(l);
                  h.lnf = static_cast<int>(f);
                  h.loss = static_cast<int>(c);
                  options.push_back({h, {Output(x, h, false), Output(x, h, true)}});
                }
              }
            }
            auto dominates = [&](const StageWork& a, const StageWork& b) {
              if (seconds(a) > seconds(b) || a.slot_bytes > b.slot_bytes ||
                  a.tp_sum_floats > b.tp_sum_floats) {
                return false;
              }
              for (int i = 0; i < kSharedBuffers; ++i) {
                if (a.shared[i] > b.shared[i]) return false;
              }
              return true;
            };
            std::vector<Pick> kept;
            for (size_t i = 0; i < options.size(); ++i) {
              bool dominated = false;
              for (size_t j = 0; j < options.size() && !dominated; ++j) {
                if (j == i) continue;
                const bool both = dominates(options[j].work[0], options[i].work[0]) &&
                                  dominates(options[j].work[1], options[i].work[1]);
                // Of two equal options, the first stays.
                const bool equal = both && dominates(options[i].work[0], options[j].work[0]) &&
                                   dominates(options[i].work[1], options[j].work[1]);
                dominated = both && (!equal || j < i);
              }
              if (!dominated) kept.push_back(options[i].pick);
            }
            return heads.emplace(key, std::move(kept)).first->second;
          };
          // The block strategies to try: the templates, or every pick's
          // Pareto-optimal ones (exact, propagate).
          std::vector<BlockPoint> points;
          auto point = [&](const Pick& p) {
            const StageWork w = halves.Block(p, ops.add2[p.add2].info().output);
            BlockPoint b{
                p,
                seconds(w),
                w.slot_bytes,
                w.shared_bytes(),
                w.tp_sum_floats,
                LinearFloats(ops.qkv[p.qkv], config.embed, 3 * config.embed, tp) +
                    LinearFloats(ops.proj[p.proj], config.embed, config.embed, tp) +
                    LinearFloats(ops.fc[p.fc], config.embed, 4 * config.embed, tp) +
                    LinearFloats(ops.fcproj[p.fcproj], 4 * config.embed, config.embed, tp)};
            return b;
          };
          if (fast) {
            for (const Pick& p : templates) {
              if (halves.Runs(p)) points.push_back(point(p));
            }
          } else {
            // Every block: its halves' sums (no StageWork is built).
            std::vector<int64_t> lin(4 * 4, 0);  // floats per linear kind and choice
            auto floats = [&](const std::vector<LinearOp>& v, int kind, int64_t K, int64_t M) {
              for (size_t i = 0; i < v.size(); ++i)
                lin[kind * 4 + i] = LinearFloats(v[i], K, M, tp);
            };
            const int64_t C = config.embed;
            floats(ops.qkv, 0, C, 3 * C);
            floats(ops.proj, 1, C, C);
            floats(ops.fc, 2, C, 4 * C);
            floats(ops.fcproj, 3, 4 * C, C);
            struct Cost {
              int64_t slot, shared, tp_sum, params;
              int32_t a, b;
            };
            std::vector<Cost> every;
            std::vector<std::pair<double, int32_t>> order;  // seconds, index: fastest first
            // Each half's choices that no other of the same input and
            // output placements dominates (forward and total seconds,
            // activations, tp sums, parameters, every shared buffer): what
            // a dominated half adds to any block, another adds less of.
            std::vector<Placement> streams;
            for (const auto* adds : {&ops.add1, &ops.add2}) {
              for (const AddOp& a : *adds) {
                if (std::find(streams.begin(), streams.end(), a.info().output) == streams.end()) {
                  streams.push_back(a.info().output);
                }
              }
            }
            const size_t ns = streams.size();
            auto index = [&](const Placement& x) {
              return static_cast<size_t>(std::find(streams.begin(), streams.end(), x) -
                                         streams.begin());
            };
            struct Kept {
              int32_t id;
              const Halves::Sum* sum;
              int64_t params;
            };
            auto dominates = [](const Kept& k, const Kept& c) {
              const Halves::Sum &x = *k.sum, &y = *c.sum;
              if (x.fw > y.fw || x.fw + x.bw > y.fw + y.bw || x.slot > y.slot ||
                  x.tp_sum > y.tp_sum || k.params > c.params) {
                return false;
              }
              for (int i = 0; i < kSharedBuffers; ++i) {
                if (x.shared[i] > y.shared[i]) return false;
              }
              return true;
            };
            auto keep = [&](std::vector<Kept>* group, const Kept& c) {
              for (const Kept& k : *group) {
                if (dominates(k, c)) return;
              }
              std::erase_if(*group, [&](const Kept& k) { return dominates(c, k); });
              group->push_back(c);
            };
            // s1[x][x1]: attention halves entered as x leaving x1; s2[x1][x2].
            std::vector<std::vector<Kept>> s1(ns * ns), s2(ns * ns);
            Pick p;
            for (size_t xi = 0; xi < ns; ++xi) {
              for (int64_t a = 0; a < halves.n1(); ++a) {
                halves.Unpack1(a, &p);
                if (!halves.Runs(p)) continue;
                const size_t out = index(ops.add1[p.add1].info().output);
                keep(&s1[xi * ns + out], {static_cast<int32_t>(a), &halves.Sum1(p, streams[xi]),
                                          lin[p.qkv] + lin[4 + p.proj]});
              }
              for (int64_t b = 0; b < halves.n2(); ++b) {
                halves.Unpack2(b, &p);
                const size_t out = index(ops.add2[p.add2].info().output);
                keep(&s2[xi * ns + out], {static_cast<int32_t>(b), &halves.Sum2(p, streams[xi]),
                                          lin[8 + p.fc] + lin[12 + p.fcproj]});
              }
            }
            // A block no faster than the bound below allows cannot win.
            // (Pipelined ranks that share devices may run at a whole
            // device while others wait: their blocks count 1 / rpd.)
            const int64_t L = config.layers, deepest = (L + pp - 1) / pp;
            const double blocks = (static_cast<double>(L - pp) + (m - 1.0) * (deepest - 1)) * lent;
            for (size_t x = 0; x < ns; ++x) {
              for (size_t x1 = 0; x1 < ns; ++x1) {
                for (const Kept& a : s1[x * ns + x1]) {
                  for (const Kept& b : s2[x1 * ns + x]) {
                    const double lower = a.sum->fw + a.sum->bw + b.sum->fw + b.sum->bw;
                    if (found && blocks * lower >= best.predicted.seconds) continue;
                    halves.Unpack1(a.id, &p);
                    halves.Unpack2(b.id, &p);
                    double t;
                    Cost c{0, 0, 0, a.params + b.params, a.id, b.id};
                    halves.BlockSum(p, &t, &c.slot, &c.shared, &c.tp_sum);
                    order.emplace_back(t, static_cast<int32_t>(every.size()));
                    every.push_back(c);
                  }
                }
              }
            }
            // Fastest first (ties: enumeration order), then keep what no
            // earlier point dominates in activations, shared buffers, tp
            // sums and parameters.
            std::sort(order.begin(), order.end());
            for (const auto& [t, i] : order) {
              const Cost& c = every[i];
              bool dominated = false;
              for (const BlockPoint& k : points) {
                if (k.slot <= c.slot && k.shared <= c.shared && k.tp_sum <= c.tp_sum &&
                    k.params <= c.params) {
                  dominated = true;
                  break;
                }
              }
              if (dominated) continue;
              BlockPoint bp{Pick(), t, c.slot, c.shared, c.tp_sum, c.params};
              halves.Unpack1(c.a, &bp.pick);
              halves.Unpack2(c.b, &bp.pick);
              points.push_back(bp);
            }
          }
          // Points come fastest first. A step takes at least its blocks'
          // time (all but each stage's first: L - pp of them, plus, for the
          // micro-batches after the first, the slowest stage's, at least
          // ceil(L / pp) - 1): once that reaches the best, no later point
          // can win.
          const int64_t layers = config.layers, deepest = (layers + pp - 1) / pp;
          for (const BlockPoint& bp : points) {
            if (found && (static_cast<double>(layers - pp) + (m - 1.0) * (deepest - 1)) * lent *
                                 bp.seconds >=
                             best.predicted.seconds) {
              break;
            }
            // The ends: every embedding with every head that cuts wte alike
            // (fast: the template's own).
            std::vector<Pick> picks;
            if (fast) {
              picks.push_back(bp.pick);
            } else {
              const Placement x = ops.add2[bp.pick.add2].info().output;
              for (size_t e = 0; e < ops.emb.size(); ++e) {
                for (const Pick& h : Heads(x, ops.emb[e].weight_split())) {
                  Pick p = bp.pick;
                  p.emb = static_cast<int>(e);
                  p.lm = h.lm;
                  p.lnf = h.lnf;
                  p.loss = h.loss;
                  picks.push_back(p);
                }
              }
            }
            const Placement stream = ops.add2[bp.pick.add2].info().output;
            for (const Pick& p : picks) {
              const bool emb_sums = ops.emb[p.emb].info().rows_over_tp;
              // Each stage kind: its ends, its first block (entered from
              // the embedding or whole) and the blocks after it.
              StageWork ends[4], first[4];
              const StageWork steady = halves.Block(p, stream);
              for (Kind k : {kOnly, kFirst, kMiddle, kLast}) {
                const bool has_emb = k == kOnly || k == kFirst, has_head = k == kOnly || k == kLast;
                ends[k] = Input(has_emb ? p.emb : -1);
                ends[k].Add(Output(stream, has_head ? p : Pick{-1}, has_emb && emb_sums));
                first[k] = halves.Block(p, has_emb ? ops.emb[p.emb].info().output : Placement{-1});
              }
              std::vector<int> layers_of;
              if (pp > 1) {
                const double blk = seconds(steady);
                const double mid = seconds(ends[kMiddle]) + seconds(first[kMiddle]) - blk;
                layers_of =
                    BalanceStages(config.layers, pp, blk,
                                  seconds(ends[kFirst]) + seconds(first[kFirst]) - blk - mid,
                                  seconds(ends[kLast]) + seconds(first[kLast]) - blk - mid);
              }
              // The parameters' cuts (for their memory), by the linears'
              // and the embedding's weight splits.
              const int sig = ((((ops.qkv[p.qkv].weight_split() + 1) * 3 +
                                 ops.proj[p.proj].weight_split() + 1) *
                                    3 +
                                ops.fc[p.fc].weight_split() + 1) *
                                   3 +
                               ops.fcproj[p.fcproj].weight_split() + 1) *
                                  3 +
                              ops.emb[p.emb].weight_split() + 1;
              auto dims = [&] {
                std::map<std::string, int> splits;
                ParamSplitsOf(GptOp::kQkv, ops.qkv[p.qkv], 0, tp, &splits);
                ParamSplitsOf(GptOp::kProj, ops.proj[p.proj], 0, tp, &splits);
                ParamSplitsOf(GptOp::kFc, ops.fc[p.fc], 0, tp, &splits);
                ParamSplitsOf(GptOp::kFcProj, ops.fcproj[p.fcproj], 0, tp, &splits);
                ParamSplitsOf(GptOp::kLn1, ops.ln1[0], 0, tp, &splits);
                ParamSplitsOf(GptOp::kLn2, ops.ln2[0], 0, tp, &splits);
                ParamSplitsOf(GptOp::kEmbedding, ops.emb[p.emb], 0, tp, &splits);
                ParamSplitsOf(GptOp::kLnF, ops.lnf[0], 0, tp, &splits);
                if (tp == 1) {
                  for (auto& [name, dim] : splits) dim = -1;
                }
                return std::make_shared<const std::map<std::string, int>>(std::move(splits));
              };
              for (int zero : dp > 1 ? std::vector{0, 1} : std::vector{0}) {
                if (!allowed(fixed ? fixed->zero : std::nullopt, zero)) continue;
                ParallelConfig par;
                par.pp = pp;
                par.dp = dp;
                par.tp = tp;
                par.zero = zero;
                par.micro_batches = m;
                par.bucket_bytes = options.bucket_bytes;
                par.stage_layers = layers_of;
                std::vector<StageCost> stages;
                bool ok = true;
                for (int s = 0; s < pp && ok; ++s) {
                  const Kind k = pp == 1 ? kOnly : s == 0 ? kFirst : s == pp - 1 ? kLast : kMiddle;
                  const int n = pp == 1 ? config.layers : layers_of[s];
                  StageWork w = ends[k];
                  w.Add(first[k]);
                  w.AddTimes(steady, n - 1);
                  const bool is_first = s == 0, is_last = s == pp - 1;
                  const auto key = std::tuple(tp, sig, is_first, is_last, n, dp, zero);
                  auto it = param_memo.find(key);
                  if (it == param_memo.end()) {
                    const auto pkey = std::tuple(tp, sig, is_first, is_last);
                    auto parts = parts_memo.find(pkey);
                    if (parts == parts_memo.end()) {
                      // A one-layer stage of this kind, cut as this pick cuts.
                      GptConfig one = config;
                      one.layers = 1;
                      GptStage gs{0, 1, is_first, is_last, tp, 0, dims()};
                      auto params = Gpt::Params(one, gs);
                      if (!params.ok()) {
                        ok = false;
                        break;
                      }
                      parts = parts_memo.emplace(pkey, GptParamParts(*params, true)).first;
                    }
                    it = param_memo
                             .emplace(key, StatsOfParts(parts->second, n, dp, zero,
                                                        options.bucket_bytes))
                             .first;
                  }
                  stages.push_back(
                      CostOf(w, it->second, ShapeOf(par, m), s, N * config.embed * 4, profile));
                }
                if (!ok) continue;
                // Only a plan faster than the best, or than the fifth
                // runner-up, is kept: PriceStep may stop at a bound above it.
                const StepPrediction pred =
                    PriceStep(stages, m, profile, dp * tp,
                              found && best.alternatives.size() >= 5
                                  ? best.alternatives.back().second.seconds
                                  : std::numeric_limits<double>::infinity());
                ++best.candidates;
                if (pred.memory.total() > budget) {
                  if (pred.memory.total() < least) {
                    least = pred.memory.total();
                    least_name = "pp=" + std::to_string(pp) + ",dp=" + std::to_string(dp) +
                                 ",tp=" + std::to_string(tp) +
                                 " micro_batches=" + std::to_string(m) +
                                 " zero=" + std::to_string(zero) +
                                 " recompute=" + std::string(RecomputeName(rc));
                  }
                  continue;
                }
                const std::string name = "pp=" + std::to_string(pp) + ",dp=" + std::to_string(dp) +
                                         ",tp=" + std::to_string(tp) +
                                         " micro_batches=" + std::to_string(m) +
                                         " zero=" + std::to_string(zero) +
                                         " recompute=" + std::string(RecomputeName(rc)) + " [" +
                                         CodeOf(ops, p, tp) + "]";
                if (found && !(pred.seconds < best.predicted.seconds)) {
                  // A runner-up: kept among the five fastest.
                  auto& alt = best.alternatives;
                  const bool named = name == best.name ||
                                     std::any_of(alt.begin(), alt.end(),
                                                 [&](const auto& a) { return a.first == name; });
                  if (!named && (alt.size() < 5 || pred.seconds < alt.back().second.seconds)) {
                    auto at = std::upper_bound(
                        alt.begin(), alt.end(), pred.seconds,
                        [](double v, const auto& a) { return v < a.second.seconds; });
                    alt.insert(at, {name, pred});
                    if (alt.size() > 5) alt.pop_back();
                  }
                  continue;
                }
                // The plan as a strategy file.
                auto file = std::make_shared<OpStrategyFile>();
                file->source = "<auto-parallel " + options.mode + ">";
                file->pp = pp;
                file->dp = dp;
                file->tp = tp;
                file->zero = zero;
                file->micro_batches = m;
                file->stage_layers = layers_of;
                if (rc != Recompute::kNone)
                  file->recompute = {{"h.*", std::string(RecomputeName(rc))}};
                auto entry = [&](const std::string& pattern, const OpStrategy& st) {
                  OpStrategyFile::Entry e;
                  e.pattern = pattern;
                  e.axes = st.inputs;
                  for (const auto& in : st.inputs) e.counts.emplace_back(in.size(), 1);
                  file->operators.push_back(std::move(e));
                };
                entry("embedding", ops.emb[p.emb].info().strategy);
                const OpInfo* block[] = {&ops.ln1[p.ln1].info(),       &ops.qkv[p.qkv].info(),
                                         &ops.attn[p.attn].info(),     &ops.proj[p.proj].info(),
                                         &ops.add1[p.add1].info(),     &ops.ln2[p.ln2].info(),
                                         &ops.fc[p.fc].info(),         &ops.gelu[p.gelu].info(),
                                         &ops.fcproj[p.fcproj].info(), &ops.add2[p.add2].info()};
                for (int i = 0; i < 10; ++i)
                  entry(std::string("h.*.") + kBlockOps[i], block[i]->strategy);
                entry("ln_f", ops.lnf[p.lnf].info().strategy);
                entry("lm_head", ops.lm[p.lm].info().strategy);
                entry("loss", ops.loss[p.loss].info().strategy);
                par.op_strategy = file;
                if (found) {
                  std::erase_if(best.alternatives, [&](const auto& a) {
                    return a.first == name || a.first == best.name;
                  });
                  best.alternatives.insert(best.alternatives.begin(), {best.name, best.predicted});
                  if (best.alternatives.size() > 5) best.alternatives.pop_back();
                }
                found = true;
                best.parallel = par;
                best.predicted = pred;
                best.name = name;
              }
            }
          }
        }
      }
    }
  }
  if (!found) {
    if (least_name.empty()) {
      // Nothing runs at all: say what would.
      std::string msg = "no parallel configuration of " + std::to_string(devices) +
                        " ranks runs a batch of " + std::to_string(B) + " x " + std::to_string(T) +
                        " on " + std::to_string(config.layers) +
                        " layers (pipeline stages at most the layers, data parallelism dividing "
                        "the batch, tensor parallelism where every operator has a strategy)";
      if (!why_none.empty()) msg += "; " + why_none;
      if (fixed == nullptr && options.name_runnable_counts) {
        // fast runs its templates only: ask it; exact, any operator's
        // strategies: a configuration with one for every operator runs.
        std::map<std::pair<int, int>, bool> memo;
        SearchOptions quiet = options;
        quiet.name_runnable_counts = false;
        quiet.rank_memory = std::numeric_limits<int64_t>::max();  // memory aside
        const std::string near = RunnableNear(devices, [&](int k) {
          return fast ? SearchGptParallel(config, B, T, k, machine, quiet).ok()
                      : RunsOn(config, B, k, &memo);
        });
        if (!near.empty()) msg += (fast ? "; in fast mode " : "; ") + near;
      }
      return InvalidArgumentError(msg);
    }
    return ResourceExhaustedError("no parallel configuration of " + std::to_string(devices) +
                                  " ranks fits " + HumanBytes(budget) + " per rank; the least " +
                                  "memory any needs is " + HumanBytes(least) + " (" + least_name +
                                  ")");
  }
  return best;
}

}  // namespace tessera
