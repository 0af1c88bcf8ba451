#include "runtime/model/gpt_search.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <unordered_map>

#include "core/byte_size.h"
#include "runtime/cost/pareto.h"
#include "runtime/model/gpt_ops.h"
#include "runtime/model/gpt_work.h"

namespace tessera {
namespace {

constexpr int kRunnersUp = 5;
constexpr double kInfinity = std::numeric_limits<double>::infinity();

// ---- What every step of one search reads.

struct MeshShape {
  int pp = 1, dp = 1, tp = 1;
  // Context parallelism: cp ranks per replica and how attention crosses
  // them (runtime/parallel/context_parallel.h).
  int cp = 1;
  CpAlgo algo = CpAlgo::kRing;
  // The ranks that average gradients and shard ZeRO-1.
  int data() const { return dp * cp; }
  // The mesh a plan's strategies are resolved on.
  Result<Mesh> ToMesh() const {
    return cp > 1 ? Mesh::Create({"pp", "dp", "cp", "tp"}, {pp, dp, cp, tp})
                  : Mesh::Create({"pp", "dp", "tp"}, {pp, dp, tp});
  }
};

struct SearchContext {
  const GptConfig& config;
  int B, T, devices;
  const MachineProfile& machine;
  MachineProfile profile;  // the machine running `devices` ranks
  const SearchOptions& options;
  bool fast = false;
  // propagate: the file whose settings bound the search and whose
  // operators are fixed (every block alike); else null.
  const OpStrategyFile* fixed = nullptr;
  std::optional<Recompute> fixed_rc;
  int64_t budget = 0;
  OffloadKinds offload;  // what every plan of this search offloads
  // Whether the file (if any) allows `v` for a setting it may fix.
  bool Allowed(const std::optional<int>& want, int v) const {
    return fixed == nullptr || !want || *want == v;
  }
};

Result<SearchContext> MakeContext(const GptConfig& config, int B, int T, int devices,
                                  const MachineProfile& machine, const SearchOptions& options) {
  RETURN_IF_ERROR(config.Validate());
  const bool fast = options.mode == SearchMode::kFast;
  const bool propagate = options.mode == SearchMode::kPropagate;
  if (propagate && options.fixed == nullptr) {
    return InvalidArgumentError("auto-parallel propagate completes a strategy file: give one");
  }
  if (devices < 1) return InvalidArgumentError("the search needs at least one device");
  if (T < 1 || T > config.context) {
    return InvalidArgumentError("a sequence of " + std::to_string(T) +
                                " does not fit the context of " + std::to_string(config.context));
  }
  SearchContext ctx{config, B, T, devices, machine, machine.ForRanks(devices), options, fast};
  ctx.budget = options.rank_memory > 0        ? options.rank_memory
               : ctx.profile.memory_bytes > 0 ? ctx.profile.memory_bytes
                                              : std::numeric_limits<int64_t>::max();
  ctx.fixed = propagate ? options.fixed.get() : nullptr;
  if (ctx.fixed != nullptr && !ctx.fixed->recompute.empty()) {
    if (ctx.fixed->recompute.size() != 1 || ctx.fixed->recompute[0].first != "h.*") {
      return InvalidArgumentError(ctx.fixed->source +
                                  ": propagate folds identical blocks: give "
                                  "recompute for \"h.*\" only");
    }
    ctx.fixed_rc = ctx.fixed->recompute[0].second;
  }
  return ctx;
}

std::vector<int> Divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i) {
    if (n % i == 0) d.push_back(i);
  }
  return d;
}

// Context-parallel sizes the search tries: powers of two up to this,
// each leaving at least kCpLeastPositions positions of a sequence a rank.
// Below that the model's per-score costs (calibrated on the unsplit
// kernel's 64-row blocks against whole sequences) flatter ring attention's
// small blocks: on this VM, T = 256 over cp 4 ran 1.56x slower than dp 4
// where the model said 5% faster; at T = 4096, cp 4 ring ran fastest of
// cp, tp and one rank, as predicted. `--why cp=` prices any.
// And cp takes ranks that data parallelism could take only for long
// sequences (at least kCpLongSequence): below that, cp is tried only where
// the batch cannot be cut over dp x cp (cp is data parallelism for every
// operator but attention, and trying it everywhere took the exact search
// on GPT-3 / 1,024 devices from 10.5 s to 46 s).
constexpr int kSearchedCp = 16;
constexpr int kCpLeastPositions = 512;
constexpr int kCpLongSequence = 8192;

// Whether the search tries cp ranks with `algo` (the file, if any, allowing
// them): T cuts into the algorithm's chunks, Ulysses' heads cut over tp x cp.
bool TriesCp(const SearchContext& ctx, int cp, CpAlgo algo, int tp) {
  const OpStrategyFile* f = ctx.fixed;
  // A propagate file's operators cut no sequence unless its mesh has cp.
  if (f != nullptr && !f->cp) return cp == 1 && algo == CpAlgo::kRing;
  if (!ctx.Allowed(f ? f->cp : std::nullopt, cp)) return false;
  if (cp == 1) return algo == CpAlgo::kRing;  // one entry for no cp
  if (f != nullptr && f->cp_algo && *f->cp_algo != algo) return false;
  const bool searched = f != nullptr || ((cp & (cp - 1)) == 0 && cp <= kSearchedCp &&
                                         ctx.T / cp >= kCpLeastPositions);
  return searched && CheckSequenceCut(algo, ctx.T, cp, "").ok() &&
         (algo == CpAlgo::kRing || ctx.config.heads % (tp * cp) == 0);
}

// Every pp x dp x cp x tp of the devices the file allows: pp at most the
// layers, dp dividing the batch, cp as TriesCp says (each with each
// algorithm).
std::vector<MeshShape> MeshShapes(const SearchContext& ctx) {
  const OpStrategyFile* f = ctx.fixed;
  std::vector<MeshShape> out;
  for (int pp : Divisors(ctx.devices)) {
    if (pp > ctx.config.layers || !ctx.Allowed(f ? f->pp : std::nullopt, pp)) continue;
    for (int cp : Divisors(ctx.devices / pp)) {
      for (int tp : Divisors(ctx.devices / pp / cp)) {
        const int dp = ctx.devices / pp / cp / tp;
        if (ctx.B % dp != 0 || !ctx.Allowed(f ? f->dp : std::nullopt, dp) ||
            !ctx.Allowed(f ? f->tp : std::nullopt, tp)) {
          continue;
        }
        if (cp > 1 && ctx.fixed == nullptr && ctx.T < kCpLongSequence && ctx.B % (dp * cp) == 0) {
          continue;  // dp x cp ranks of data parallelism instead
        }
        for (CpAlgo algo : {CpAlgo::kRing, CpAlgo::kUlysses}) {
          if (TriesCp(ctx, cp, algo, tp)) out.push_back({pp, dp, tp, cp, algo});
        }
      }
    }
  }
  return out;
}

// ---- Each operator's candidates on a mesh, and one choice of each.

// The candidate strategies of every operator on a mesh {dp, tp}, as the
// table gives them (one each when tp = 1: data parallel; the user's alone
// where propagate fixes it), each one its operator accepts and that cuts
// the operator's dimensions evenly (what resolving the plan's file
// checks). A search picks one per operator: the same for every block.
struct MeshOps {
  std::array<std::vector<AnyOp>, kGptOpCount> of;
  size_t size(GptOp op) const { return of[Index(op)].size(); }
  const AnyOp& at(GptOp op, int i) const { return of[Index(op)][i]; }
  const OpInfo& info(GptOp op, int i) const { return InfoOf(at(op, i)); }
  template <typename T>
  const T& get(GptOp op, int i) const {
    return std::get<T>(at(op, i));
  }
};

// The candidates of operator `op` (named as block 0's) on `mesh`; in
// propagate the user's strategy is the only one, and an error when the
// operator refuses it (the first such error is kept in `status`).
std::vector<AnyOp> CandidatesOn(const SearchContext& ctx, GptOp op, const MeshShape& shape,
                                const std::map<std::string, OpStrategy>* fixed, Status* status) {
  GptConfig one = ctx.config;  // blocks fold: block 0 says it all
  one.layers = 1;
  const int dp = shape.dp, tp = shape.tp, cp = shape.cp;
  const std::string name = OpName(op, 0);
  const OpSignature sig = SignatureOf(op, one, 0);
  MeshShape flat = shape;
  flat.pp = 1;
  const Mesh mesh = *flat.ToMesh();
  std::vector<OpStrategy> cands = Candidates(op);
  if (tp == 1) cands.resize(1);
  if (cp > 1) {  // every candidate with its rows cut over cp as the algorithm needs
    for (OpStrategy& st : cands) st.inputs = WithCp(op, std::move(st.inputs), shape.algo);
  }
  const bool user = fixed != nullptr && fixed->count(name) > 0;
  if (user) cands = {fixed->at(name)};
  std::vector<AnyOp> out;
  for (const OpStrategy& st : cands) {
    Status fits = CheckOpStrategy(sig, st, mesh, "auto-parallel");
    if (fits.ok() && cp > 1) fits = CheckCpRows(op, name, st, shape.algo);
    Result<AnyOp> created = fits.ok() ? CreateOp(op, name, st, one, tp, dp, cp) : fits;
    if (created.ok()) {
      out.push_back(std::move(*created));
    } else if (user && status->ok()) {
      *status = created.status();
    }
  }
  return out;
}

Result<MeshOps> MakeMeshOps(const SearchContext& ctx, const MeshShape& shape,
                            const std::map<std::string, OpStrategy>* fixed) {
  MeshOps m;
  Status status = Status::Ok();
  for (const GptOpSpec& spec : GptOpSpecs()) {
    m.of[Index(spec.op)] = CandidatesOn(ctx, spec.op, shape, fixed, &status);
  }
  RETURN_IF_ERROR(status);
  return m;
}

// Every operator has at least one strategy that runs.
bool HasEveryOperator(const MeshOps& m) {
  for (const std::vector<AnyOp>& v : m.of) {
    if (v.empty()) return false;
  }
  return true;
}

// One choice per operator: indices into MeshOps; kNone for the ends a
// stage does not have.
constexpr int kNone = -1;
struct Pick {
  std::array<int, kGptOpCount> at{};
  int& operator[](GptOp op) { return at[Index(op)]; }
  int operator[](GptOp op) const { return at[Index(op)]; }
  bool has_head() const { return (*this)[GptOp::kLnF] != kNone; }
};
// `p` without its ends (a stage that is neither first nor last).
Pick WithoutEnds(Pick p) {
  for (const GptOpSpec& spec : GptOpSpecs()) {
    if (!InBlock(spec.op)) p[spec.op] = kNone;
  }
  return p;
}

// The half `part` of a block of `p`'s operators.
GptGraph::HalfOps HalfOf(const MeshOps& o, const Pick& p, GptOpPart part) {
  std::array<const AnyOp*, kGptOpCount> chosen{};
  for (const GptOpSpec& spec : GptOpSpecs()) {
    if (spec.part == part) chosen[Index(spec.op)] = &o.at(spec.op, p[spec.op]);
  }
  return GptGraph::HalfOf(part, chosen);
}
// The residual stream's placement after a half of `p`.
Placement AfterAttention(const MeshOps& o, const Pick& p) {
  return o.info(GptOp::kAdd1, p[GptOp::kAdd1]).output;
}
Placement AfterBlock(const MeshOps& o, const Pick& p) {
  return o.info(GptOp::kAdd2, p[GptOp::kAdd2]).output;
}

// "ln_1 whole, c_attn col, ...; embedding vocab, ...": a plan's choices.
std::string CodeOf(const MeshOps& o, const Pick& p, int tp) {
  if (tp == 1) return "data parallel";
  std::string block, ends;
  for (const GptOpSpec& spec : GptOpSpecs()) {
    std::string& to = InBlock(spec.op) ? block : ends;
    to += (to.empty() ? "" : ", ") + std::string(spec.label) + " " +
          ChoiceLabel(spec.op, o.at(spec.op, p[spec.op]));
  }
  return block + "; " + ends;
}

// "pp=2,dp=1,tp=2 micro_batches=8 zero=0 recompute=none" (and
// " virtual_stages=2" after micro_batches when interleaved; ",cp=4"
// before tp and " cp_algo=ring" at the end under context parallelism).
std::string PlanName(const MeshShape& mesh, int m, int v, int zero, Recompute rc) {
  return "pp=" + std::to_string(mesh.pp) + ",dp=" + std::to_string(mesh.dp) +
         (mesh.cp > 1 ? ",cp=" + std::to_string(mesh.cp) : "") + ",tp=" + std::to_string(mesh.tp) +
         " micro_batches=" + std::to_string(m) +
         (v > 1 ? " virtual_stages=" + std::to_string(v) : "") + " zero=" + std::to_string(zero) +
         " recompute=" + std::string(RecomputeName(rc)) +
         (mesh.cp > 1 ? " cp_algo=" + std::string(CpAlgoName(mesh.algo)) : "");
}

// ---- Blocks: their halves, memoized, and the blocks worth trying.

// The halves of blocks of one mesh, micro-batch and recompute: each half's
// work for each input placement, computed once.
class BlockHalves {
 public:
  // A half's seconds (forward, backward), activations, shared buffers and
  // tp sums: what the exact search adds up for a block.
  struct Sum {
    double fw = 0, bw = 0;
    int64_t slot = 0, tp_sum = 0;
    int64_t shared[kSharedBuffers] = {};
  };

  BlockHalves(const GptConfig& config, const MeshOps& ops, int tp, int64_t N, int T, Recompute rc,
              const MachineProfile& profile, int cp = 1)
      : config_(config), ops_(ops), tp_(tp), cp_(cp), N_(N), T_(T), rc_(rc), profile_(profile) {
    AddPlacement(Placement{-1});
    for (GptOp op : {GptOp::kAdd1, GptOp::kAdd2, GptOp::kEmbedding}) {
      for (size_t i = 0; i < ops.size(op); ++i) AddPlacement(ops.info(op, i).output);
    }
  }
  // The half `part` (attention or MLP) of p, entered as `x`.
  const Sum& HalfSum(GptOpPart part, const Pick& p, const Placement& x) {
    auto& memo = part == GptOpPart::kAttentionHalf ? s1_ : s2_;
    const int64_t key = Key(part, p, x);
    auto it = memo.find(key);
    if (it == memo.end()) it = memo.emplace(key, Summarize(Half(part, p, x))).first;
    return it->second;
  }
  // What EstimateBlock gives, in seconds and bytes.
  void BlockSum(const Pick& p, double* seconds, int64_t* slot, int64_t* shared, int64_t* tp_sum) {
    const Sum& a = HalfSum(GptOpPart::kAttentionHalf, p, AfterBlock(ops_, p));
    const Sum& b = HalfSum(GptOpPart::kMlpHalf, p, AfterAttention(ops_, p));
    *seconds = a.fw + a.bw + b.fw + b.bw;
    *slot = rc_ == Recompute::kFull ? Bytes(AfterBlock(ops_, p)) : a.slot + b.slot;
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
  // The half's choices as one number (its operators' indices, mixed
  // radix in the table's order) and back.
  int64_t Count(GptOpPart part) const {
    int64_t n = 1;
    for (GptOp op : OpsOf(part)) n *= static_cast<int64_t>(ops_.size(op));
    return n;
  }
  int64_t Id(GptOpPart part, const Pick& p) const {
    int64_t id = 0;
    for (GptOp op : OpsOf(part)) id = id * static_cast<int64_t>(ops_.size(op)) + p[op];
    return id;
  }
  void Unpack(GptOpPart part, int64_t id, Pick* p) const {
    const std::vector<GptOp>& ops = OpsOf(part);
    for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
      const int64_t n = static_cast<int64_t>(ops_.size(*it));
      (*p)[*it] = static_cast<int>(id % n);
      id /= n;
    }
  }
  // A block of `p` whose stream arrives placed as `x`.
  StageWork Block(const Pick& p, const Placement& x) {
    const HalfWork& a = Half(GptOpPart::kAttentionHalf, p, x);
    const HalfWork& b = Half(GptOpPart::kMlpHalf, p, AfterAttention(ops_, p));
    return EstimateBlock(a, b, rc_, Bytes(AfterBlock(ops_, p)));
  }
  // Whether attention's rows cut over tp keep whole sequences.
  bool Runs(const Pick& p) const {
    const Placement& in = ops_.info(GptOp::kAttention, p[GptOp::kAttention]).inputs[0];
    return in.split != 0 || (N_ / T_) % tp_ == 0;
  }
  // The operators of a half, in the table's order.
  static const std::vector<GptOp>& OpsOf(GptOpPart part) {
    static const std::vector<GptOp> attention = Part(GptOpPart::kAttentionHalf),
                                    mlp = Part(GptOpPart::kMlpHalf);
    return part == GptOpPart::kAttentionHalf ? attention : mlp;
  }

 private:
  static std::vector<GptOp> Part(GptOpPart part) {
    std::vector<GptOp> ops;
    for (const GptOpSpec& spec : GptOpSpecs()) {
      if (spec.part == part) ops.push_back(spec.op);
    }
    return ops;
  }
  void AddPlacement(const Placement& p) {
    if (std::find(xs_.begin(), xs_.end(), p) == xs_.end()) xs_.push_back(p);
  }
  // Bytes of the stream placed as `p` on tp rank 0.
  int64_t Bytes(const Placement& p) const {
    const int64_t rows = p.split == 0 && tp_ > 1 ? (N_ + tp_ - 1) / tp_ : N_;
    const int64_t cols = p.split == 1 && tp_ > 1 ? (config_.embed + tp_ - 1) / tp_ : config_.embed;
    return rows * cols * 4;
  }
  int64_t Key(GptOpPart part, const Pick& p, const Placement& x) const {
    const size_t at = std::find(xs_.begin(), xs_.end(), x) - xs_.begin();
    return Id(part, p) * static_cast<int64_t>(xs_.size()) + static_cast<int64_t>(at);
  }
  Sum Summarize(const HalfWork& h) const {
    Sum s;
    s.fw = ComputeSeconds(h.forward, profile_) + GroupCommSeconds(h.forward, profile_, tp_) +
           CpCommSeconds(h.forward, profile_, cp_, tp_);
    s.bw = ComputeSeconds(h.backward, profile_) + GroupCommSeconds(h.backward, profile_, tp_) +
           CpCommSeconds(h.backward, profile_, cp_, tp_);
    s.slot = h.forward.slot_bytes;
    s.tp_sum = h.forward.tp_sum_floats + h.backward.tp_sum_floats;
    for (int i = 0; i < kSharedBuffers; ++i) {
      s.shared[i] = std::max(h.forward.shared[i], h.backward.shared[i]);
    }
    return s;
  }
  const HalfWork& Half(GptOpPart part, const Pick& p, const Placement& x) {
    auto& memo = part == GptOpPart::kAttentionHalf ? h1_ : h2_;
    const int64_t key = Key(part, p, x);
    auto it = memo.find(key);
    if (it == memo.end()) {
      const GptGraph::HalfOps h = HalfOf(ops_, p, part);
      it = memo.emplace(key, EstimateHalf(config_, tp_, h, x, N_, T_, rc_, /*shares=*/false)).first;
    }
    return it->second;
  }

  const GptConfig& config_;
  const MeshOps& ops_;
  const int tp_, cp_;
  const int64_t N_;
  const int T_;
  const Recompute rc_;
  const MachineProfile& profile_;
  std::vector<Placement> xs_;
  std::unordered_map<int64_t, HalfWork> h1_, h2_;
  std::unordered_map<int64_t, Sum> s1_, s2_;
};

// A block strategy worth trying: not dominated in time per micro-batch,
// activations, shared buffers, tp sums and parameters.
struct BlockPoint {
  Pick pick;
  double seconds = 0;
  int64_t slot = 0, shared = 0, tp_sum = 0, params = 0;
};

// Floats of the parameters a pick's choices cut, in half `part` of a block.
int64_t HalfParams(const GptConfig& c, const MeshOps& o, const Pick& p, GptOpPart part, int tp) {
  int64_t n = 0;
  for (GptOp op : BlockHalves::OpsOf(part)) n += BlockParamFloats(op, o.at(op, p[op]), c, tp);
  return n;
}

// A half kept for the block front: its id, sums and parameters.
struct KeptHalf {
  int32_t id;
  const BlockHalves::Sum* sum;
  int64_t params;
};
// What a dominated half adds to any block, another adds less of: forward
// and total seconds, activations, tp sums, parameters, every shared buffer.
bool HalfDominates(const KeptHalf& k, const KeptHalf& c) {
  const BlockHalves::Sum &x = *k.sum, &y = *c.sum;
  if (x.fw > y.fw || x.fw + x.bw > y.fw + y.bw || x.slot > y.slot || x.tp_sum > y.tp_sum ||
      k.params > c.params) {
    return false;
  }
  for (int i = 0; i < kSharedBuffers; ++i) {
    if (x.shared[i] > y.shared[i]) return false;
  }
  return true;
}

// The stream placements the halves join at (the adds' outputs).
std::vector<Placement> StreamPlacements(const MeshOps& ops) {
  std::vector<Placement> streams;
  for (GptOp add : {GptOp::kAdd1, GptOp::kAdd2}) {
    for (size_t i = 0; i < ops.size(add); ++i) {
      const Placement x = ops.info(add, i).output;
      if (std::find(streams.begin(), streams.end(), x) == streams.end()) streams.push_back(x);
    }
  }
  return streams;
}

// Every half's Pareto front per (input stream, output stream): fronts[x *
// ns + y] holds the halves of `part` entered as streams[x] and leaving as
// streams[y].
std::vector<std::vector<KeptHalf>> HalfFronts(const GptConfig& c, const MeshOps& ops,
                                              BlockHalves& halves, GptOpPart part, int tp,
                                              const std::vector<Placement>& streams) {
  const size_t ns = streams.size();
  const GptOp add = part == GptOpPart::kAttentionHalf ? GptOp::kAdd1 : GptOp::kAdd2;
  std::vector<std::vector<KeptHalf>> fronts(ns * ns);
  Pick p;
  for (size_t xi = 0; xi < ns; ++xi) {
    for (int64_t id = 0; id < halves.Count(part); ++id) {
      halves.Unpack(part, id, &p);
      if (part == GptOpPart::kAttentionHalf && !halves.Runs(p)) continue;
      const Placement out = ops.info(add, p[add]).output;
      const size_t yi = std::find(streams.begin(), streams.end(), out) - streams.begin();
      KeepUndominated(&fronts[xi * ns + yi],
                      KeptHalf{static_cast<int32_t>(id), &halves.HalfSum(part, p, streams[xi]),
                               HalfParams(c, ops, p, part, tp)},
                      HalfDominates);
    }
  }
  return fronts;
}

// Blocks whose time alone, on the critical path (`blocks` of them), reaches
// the best step so far cannot win.
struct BlockBound {
  bool active = false;
  double blocks = 0, best = 0;
  bool Prunes(double block_seconds) const { return active && blocks * block_seconds >= best; }
};

// A block assembled from two kept halves, before the front is taken.
struct BlockCandidate {
  double seconds;
  int64_t slot, shared, tp_sum, params;
  int32_t a, b;
  int32_t rank = 0;  // its place, fastest first
};

// Earlier (faster) and no larger in activations, shared buffers, tp sums
// and parameters: a later block so dominated cannot win.
bool BlockDominates(const BlockCandidate& k, const BlockCandidate& c) {
  return k.rank < c.rank && k.slot <= c.slot && k.shared <= c.shared && k.tp_sum <= c.tp_sum &&
         k.params <= c.params;
}

// The blocks whose halves meet (the attention half leaving as the MLP
// half enters, the MLP half leaving as the next block enters), unless
// their halves' time alone is pruned by `bound`).
std::vector<BlockCandidate> JoinHalves(BlockHalves& halves, size_t ns,
                                       const std::vector<std::vector<KeptHalf>>& s1,
                                       const std::vector<std::vector<KeptHalf>>& s2,
                                       const BlockBound& bound) {
  std::vector<BlockCandidate> every;
  Pick p;
  for (size_t x = 0; x < ns * ns; ++x) {
    const size_t in = x / ns, mid = x % ns;
    for (const KeptHalf& a : s1[in * ns + mid]) {
      for (const KeptHalf& b : s2[mid * ns + in]) {
        if (bound.Prunes(a.sum->fw + a.sum->bw + b.sum->fw + b.sum->bw)) continue;
        halves.Unpack(GptOpPart::kAttentionHalf, a.id, &p);
        halves.Unpack(GptOpPart::kMlpHalf, b.id, &p);
        BlockCandidate c{0, 0, 0, 0, a.params + b.params, a.id, b.id};
        halves.BlockSum(p, &c.seconds, &c.slot, &c.shared, &c.tp_sum);
        every.push_back(c);
      }
    }
  }
  return every;
}

// The exact search's blocks: each half's front, joined, fastest first
// (ties: enumeration order), the front of what remains.
std::vector<BlockPoint> BlockFront(const GptConfig& c, const MeshOps& ops, BlockHalves& halves,
                                   int tp, const BlockBound& bound) {
  const std::vector<Placement> streams = StreamPlacements(ops);
  const auto s1 = HalfFronts(c, ops, halves, GptOpPart::kAttentionHalf, tp, streams);
  const auto s2 = HalfFronts(c, ops, halves, GptOpPart::kMlpHalf, tp, streams);
  std::vector<BlockCandidate> every = JoinHalves(halves, streams.size(), s1, s2, bound);
  std::vector<std::pair<double, int32_t>> order;
  for (size_t i = 0; i < every.size(); ++i) order.emplace_back(every[i].seconds, i);
  std::sort(order.begin(), order.end());
  std::vector<BlockCandidate> sorted;
  for (const auto& [t, i] : order) {
    sorted.push_back(every[i]);
    sorted.back().rank = static_cast<int32_t>(sorted.size());
  }
  std::vector<BlockPoint> points;
  for (const BlockCandidate& k : ParetoFront(std::move(sorted), BlockDominates)) {
    BlockPoint bp{Pick(), k.seconds, k.slot, k.shared, k.tp_sum, k.params};
    halves.Unpack(GptOpPart::kAttentionHalf, k.a, &bp.pick);
    halves.Unpack(GptOpPart::kMlpHalf, k.b, &bp.pick);
    points.push_back(bp);
  }
  return points;
}

// ---- The ends of a stage: its input and its output, and the heads.

// The stage ends of one mesh, micro-batch and recompute, each computed
// once: the input by embedding (kNone: the previous stage's), the output
// by stream placement and head (none: the transfer to the next stage).
class StageEnds {
 public:
  StageEnds(const GptConfig& config, const MeshOps& ops, int tp, int64_t N,
            const MachineProfile& profile)
      : config_(config), ops_(ops), tp_(tp), N_(N), profile_(profile) {}

  double Seconds(const StageWork& w) const {
    return ComputeSeconds(w, profile_) + GroupCommSeconds(w, profile_, tp_);
  }
  const StageWork& Input(int emb) {
    auto it = inputs_.find(emb);
    if (it == inputs_.end()) {
      const EmbeddingOp* e = emb < 0 ? nullptr : &ops_.get<EmbeddingOp>(GptOp::kEmbedding, emb);
      it = inputs_.emplace(emb, EstimateInput(config_, tp_, e, N_)).first;
    }
    return it->second;
  }
  const StageWork& Output(const Placement& x, const Pick& h, bool wte_summed) {
    const int lnf = h[GptOp::kLnF], lm = h[GptOp::kLmHead], loss = h[GptOp::kLoss];
    const auto key = std::tuple(x.split, x.groups, x.partial, lnf, lm, loss, wte_summed);
    auto it = outputs_.find(key);
    if (it != outputs_.end()) return it->second;
    if (!h.has_head()) {
      return outputs_.emplace(key, EstimateOutput(config_, tp_, x, nullptr, N_, wte_summed))
          .first->second;
    }
    const GptGraph::HeadOps head{&ops_.get<LayerNormOp>(GptOp::kLnF, lnf),
                                 &ops_.get<LmHeadOp>(GptOp::kLmHead, lm),
                                 &ops_.get<CrossEntropyOp>(GptOp::kLoss, loss)};
    return outputs_.emplace(key, EstimateOutput(config_, tp_, x, &head, N_, wte_summed))
        .first->second;
  }
  // The heads (ln_f, lm_head, loss) worth trying after a stream placed as
  // `x` with wte cut as `ws`: those no other dominates in time,
  // activations, tp sums and every shared buffer (with and without the
  // embedding summing wte), as a head's cost depends on nothing else.
  const std::vector<Pick>& Heads(const Placement& x, int ws) {
    const auto key = std::tuple(x.split, x.groups, x.partial, ws);
    auto it = heads_.find(key);
    if (it != heads_.end()) return it->second;
    std::vector<HeadOption> front;
    const auto dominates = [this](const HeadOption& a, const HeadOption& b) {
      return Dominates(a, b);
    };
    for (const Pick& h : HeadPicks(ws)) {
      KeepUndominated(&front, HeadOption{h, Output(x, h, false), Output(x, h, true)}, dominates);
    }
    std::vector<Pick> kept;
    for (const HeadOption& o : front) kept.push_back(o.pick);
    return heads_.emplace(key, std::move(kept)).first->second;
  }

 private:
  struct HeadOption {
    Pick pick;
    StageWork alone, summed;  // without and with the embedding summing wte
  };
  // Every head whose lm_head cuts wte as `ws`, in enumeration order.
  std::vector<Pick> HeadPicks(int ws) const {
    std::vector<Pick> out;
    for (size_t l = 0; l < ops_.size(GptOp::kLmHead); ++l) {
      if (WeightSplitOf(ops_.at(GptOp::kLmHead, l)) != ws) continue;
      for (size_t f = 0; f < ops_.size(GptOp::kLnF); ++f) {
        for (size_t c = 0; c < ops_.size(GptOp::kLoss); ++c) {
          Pick h = WithoutEnds(Pick());
          h[GptOp::kLmHead] = static_cast<int>(l);
          h[GptOp::kLnF] = static_cast<int>(f);
          h[GptOp::kLoss] = static_cast<int>(c);
          out.push_back(h);
        }
      }
    }
    return out;
  }
  bool WorkDominates(const StageWork& a, const StageWork& b) const {
    if (Seconds(a) > Seconds(b) || a.slot_bytes > b.slot_bytes ||
        a.tp_sum_floats > b.tp_sum_floats) {
      return false;
    }
    for (int i = 0; i < kSharedBuffers; ++i) {
      if (a.shared[i] > b.shared[i]) return false;
    }
    return true;
  }
  bool Dominates(const HeadOption& a, const HeadOption& b) const {
    return WorkDominates(a.alone, b.alone) && WorkDominates(a.summed, b.summed);
  }

  const GptConfig& config_;
  const MeshOps& ops_;
  const int tp_;
  const int64_t N_;
  const MachineProfile& profile_;
  std::map<int, StageWork> inputs_;
  std::map<std::tuple<int, int, bool, int, int, int, bool>, StageWork> outputs_;
  std::map<std::tuple<int, int, bool, int>, std::vector<Pick>> heads_;
};

// The stage kinds of a pipeline: the only one, the first, a middle, the last.
enum Kind { kOnly, kFirst, kMiddle, kLast };

// What each stage kind of a pick does: its ends, its first block (entered
// from the embedding or whole) and each block after it.
struct StageKinds {
  StageWork ends[4], first[4];
  StageWork steady;
};

StageKinds KindsOf(const MeshOps& ops, const Pick& p, BlockHalves& halves, StageEnds& ends) {
  StageKinds s;
  const Placement stream = AfterBlock(ops, p);
  const int emb = p[GptOp::kEmbedding];
  const bool emb_sums = ops.info(GptOp::kEmbedding, emb).rows_over_tp;
  s.steady = halves.Block(p, stream);
  for (Kind k : {kOnly, kFirst, kMiddle, kLast}) {
    const bool has_emb = k == kOnly || k == kFirst, has_head = k == kOnly || k == kLast;
    s.ends[k] = ends.Input(has_emb ? emb : kNone);
    s.ends[k].Add(ends.Output(stream, has_head ? p : WithoutEnds(p), has_emb && emb_sums));
    s.first[k] = halves.Block(p, has_emb ? ops.info(GptOp::kEmbedding, emb).output : Placement{-1});
  }
  return s;
}

// The layers per stage (per chunk: pp x v groups, with virtual stages)
// that balance the kinds' predicted times.
std::vector<int> LayersOf(const GptConfig& config, int pp, int v, const StageKinds& s,
                          const StageEnds& ends) {
  if (pp == 1) return {};
  const double blk = ends.Seconds(s.steady);
  const double mid = ends.Seconds(s.ends[kMiddle]) + ends.Seconds(s.first[kMiddle]) - blk;
  return BalanceStages(config.layers, pp * v, blk,
                       ends.Seconds(s.ends[kFirst]) + ends.Seconds(s.first[kFirst]) - blk - mid,
                       ends.Seconds(s.ends[kLast]) + ends.Seconds(s.first[kLast]) - blk - mid);
}

// ---- The parameters of a stage, by how its pick cuts them.

class ParamMemo {
 public:
  explicit ParamMemo(const GptConfig& config) : config_(config) {}
  // The stats of stage `s` of `pp` with `n` blocks, cut as `p` cuts them;
  // null when the model cannot be cut so.
  const ParamStats* Stats(const MeshOps& ops, const Pick& p, const MeshShape& mesh, int s, int n,
                          int zero, int64_t bucket_bytes) {
    const bool first = s == 0, last = s == mesh.pp - 1;
    const int sig = Signature(ops, p);
    const auto key = std::tuple(mesh.tp, sig, first, last, n, mesh.data(), zero);
    auto it = stats_.find(key);
    if (it != stats_.end()) return &it->second;
    const auto pkey = std::tuple(mesh.tp, sig, first, last);
    auto parts = parts_.find(pkey);
    if (parts == parts_.end()) {
      // A one-layer stage of this kind, cut as this pick cuts.
      GptConfig one = config_;
      one.layers = 1;
      GptStage gs{0, 1, first, last, mesh.tp, 0, Splits(ops, p, mesh.tp)};
      Result<std::vector<ParamInfo>> params = Gpt::Params(one, gs);
      if (!params.ok()) return nullptr;
      parts = parts_.emplace(pkey, GptParamParts(*params, true)).first;
    }
    return &stats_.emplace(key, StatsOfParts(parts->second, n, mesh.data(), zero, bucket_bytes))
                .first->second;
  }

 private:
  // The parameters' cuts, as one number: each operator's weight split.
  static int Signature(const MeshOps& ops, const Pick& p) {
    int sig = 0;
    for (const GptOpSpec& spec : GptOpSpecs()) {
      if (spec.part == GptOpPart::kHead) continue;  // lm_head cuts wte as the embedding does
      sig = sig * 3 + WeightSplitOf(ops.at(spec.op, p[spec.op])) + 1;
    }
    return sig;
  }
  static std::shared_ptr<const std::map<std::string, int>> Splits(const MeshOps& ops, const Pick& p,
                                                                  int tp) {
    std::map<std::string, int> splits;
    for (const GptOpSpec& spec : GptOpSpecs()) {
      const int i = p[spec.op] == kNone ? 0 : p[spec.op];
      ParamSplitsOf(spec.op, ops.at(spec.op, i), 0, tp, &splits);
    }
    if (tp == 1) {
      for (auto& [name, dim] : splits) dim = -1;
    }
    return std::make_shared<const std::map<std::string, int>>(std::move(splits));
  }

  const GptConfig& config_;
  std::map<std::tuple<int, int, bool, bool, int, int, int>, ParamStats> stats_;
  std::map<std::tuple<int, int, bool, bool>, ParamParts> parts_;
};

// ---- The leaderboard: the best plan so far and the runners-up.

class Leaderboard {
 public:
  bool found() const { return found_; }
  double best_seconds() const { return best_.predicted.seconds; }
  // What a plan must beat to be kept: the slowest runner-up once there
  // are enough (a plan's pricing may stop at a bound above it).
  double cutoff() const {
    return found_ && best_.alternatives.size() >= kRunnersUp
               ? best_.alternatives.back().second.seconds
               : kInfinity;
  }
  void Seed(SearchResult r) {
    best_ = std::move(r);
    found_ = true;
  }
  void Costed() { ++best_.candidates; }
  // A plan over the budget: remembered when it needs the least memory yet.
  void OverBudget(const StepPrediction& pred, const std::string& name) {
    if (pred.memory.total() < least_) {
      least_ = pred.memory.total();
      least_name_ = name;
    }
  }
  // Whether a plan within the budget is faster than the best so far.
  bool IsBest(const StepPrediction& pred) const {
    return !found_ || pred.seconds < best_.predicted.seconds;
  }
  // The new best; the old one becomes the first runner-up.
  void SetBest(const std::string& name, const StepPrediction& pred, ParallelConfig plan) {
    auto& alt = best_.alternatives;
    if (found_) {
      std::erase_if(alt, [&](const auto& a) { return a.first == name || a.first == best_.name; });
      alt.insert(alt.begin(), {best_.name, best_.predicted});
      if (alt.size() > kRunnersUp) alt.pop_back();
    }
    found_ = true;
    best_.parallel = std::move(plan);
    best_.predicted = pred;
    best_.name = name;
  }
  SearchResult& result() { return best_; }
  int64_t least() const { return least_; }
  const std::string& least_name() const { return least_name_; }
  // A plan no faster than the best: kept among the fastest runners-up.
  void RunnerUp(const std::string& name, const StepPrediction& pred) {
    auto& alt = best_.alternatives;
    const bool named =
        name == best_.name ||
        std::any_of(alt.begin(), alt.end(), [&](const auto& a) { return a.first == name; });
    if (named || (alt.size() >= kRunnersUp && !(pred.seconds < alt.back().second.seconds))) return;
    auto at = std::upper_bound(alt.begin(), alt.end(), pred.seconds,
                               [](double v, const auto& a) { return v < a.second.seconds; });
    alt.insert(at, {name, pred});
    if (alt.size() > kRunnersUp) alt.pop_back();
  }

  SearchResult best_;
  bool found_ = false;
  int64_t least_ = std::numeric_limits<int64_t>::max();
  std::string least_name_;
};

// ---- One mesh, micro-batch count and recompute: costing its plans.

struct BlockSetting {
  MeshShape mesh;
  int m = 1;  // micro-batches per replica
  int v = 1;  // chunks per stage (interleaved 1F1B)
  Recompute rc = Recompute::kNone;
  int64_t N = 0;  // rows per micro-batch of a replica
};

// Blocks whose time alone, on the critical path, reaches the best step
// cannot win: at least all but each stage's first (L - pp), plus, for the
// micro-batches after the first, the slowest stage's (at least ceil(L /
// pp) - 1). With v chunks a stage, each micro-batch through the slowest
// stage's blocks but its chunks' first (at least ceil(L / pp) - v).
// Pipelined ranks that share
// devices may run at a whole device while others wait: their blocks
// count 1 / rpd.
double BlocksOnCriticalPath(const SearchContext& ctx, const BlockSetting& b) {
  const int pp = b.mesh.pp, v = b.v;
  const int64_t L = ctx.config.layers, deepest = (L + pp - 1) / pp;
  const double lent =
      pp > 1 && ctx.profile.ranks_per_device > 1 ? 1.0 / ctx.profile.ranks_per_device : 1.0;
  if (v == 1) return (static_cast<double>(L - pp) + (b.m - 1.0) * (deepest - 1)) * lent;
  return std::max<double>(0.0, b.m * static_cast<double>(deepest - v)) * lent;
}

// The plan as the strategy file train_gpt runs.
ParallelConfig PlanOf(const SearchContext& ctx, const MeshOps& ops, const Pick& p,
                      const BlockSetting& b, int zero, const std::vector<int>& layers) {
  auto file = std::make_shared<OpStrategyFile>();
  file->source = "<auto-parallel " + std::string(SearchModeName(ctx.options.mode)) + ">";
  file->pp = b.mesh.pp;
  file->dp = b.mesh.dp;
  file->tp = b.mesh.tp;
  if (b.mesh.cp > 1) {
    file->cp = b.mesh.cp;
    file->cp_algo = b.mesh.algo;
  }
  file->zero = zero;
  file->micro_batches = b.m;
  if (b.v > 1) file->virtual_stages = b.v;
  file->stage_layers = layers;
  if (b.rc != Recompute::kNone) file->recompute = {{"h.*", b.rc}};
  for (const GptOpSpec& spec : GptOpSpecs()) {
    OpStrategyFile::Entry e;
    e.pattern = OpPattern(spec.op);
    e.axes = ops.info(spec.op, p[spec.op]).strategy.inputs;
    for (const auto& in : e.axes) e.counts.emplace_back(in.size(), 1);
    file->operators.push_back(std::move(e));
  }
  ParallelConfig par;
  par.pp = b.mesh.pp;
  par.dp = b.mesh.dp;
  par.tp = b.mesh.tp;
  par.cp = b.mesh.cp;
  par.cp_algo = b.mesh.algo;
  par.zero = zero;
  par.micro_batches = b.m;
  par.virtual_stages = b.v;
  par.bucket_bytes = ctx.options.bucket_bytes;
  par.stage_layers = layers;
  if (ctx.offload.optimizer) {
    file->offload = ctx.offload;
    par.offload_optimizer = ctx.offload.optimizer;
    par.offload_params = ctx.offload.params;
    par.offload_dir = ctx.options.offload_dir;
  }
  par.op_strategy = file;
  return par;
}

// What one mesh, micro-batch count and recompute share while their plans
// are costed.
struct Costing {
  const SearchContext& ctx;
  const MeshOps& ops;
  const BlockSetting& b;
  BlockHalves& halves;
  StageEnds& ends;
  ParamMemo& params;
  Leaderboard& board;
};

// Every stage's cost of pick `p` with `zero`; empty when the model's
// parameters cannot be cut so.
std::vector<StageCost> StagesOf(Costing& c, const Pick& p, const StageKinds& kinds,
                                const std::vector<int>& layers, int zero) {
  const MeshShape& mesh = c.b.mesh;
  const int v = c.b.v, groups = mesh.pp * v;
  std::vector<StageCost> stages;
  thread_local std::vector<StageWork> chunks;
  chunks.resize(v);
  for (int s = 0; s < mesh.pp; ++s) {
    // Chunk j of stage s is group j x pp + s: the model's first, its last,
    // or a middle one.
    int n = 0;
    for (int j = 0; j < v; ++j) {
      const int g = j * mesh.pp + s;
      const Kind k = groups == 1 ? kOnly : g == 0 ? kFirst : g == groups - 1 ? kLast : kMiddle;
      const int layers_here = groups == 1 ? c.ctx.config.layers : layers[g];
      StageWork& w = chunks[j];
      w = kinds.ends[k];
      w.Add(kinds.first[k]);
      w.AddTimes(kinds.steady, layers_here - 1);
      n += layers_here;
    }
    const ParamStats* ps = c.params.Stats(c.ops, p, mesh, s, n, zero, c.ctx.options.bucket_bytes);
    if (ps == nullptr) return {};
    const StepShape shape{mesh.pp,
                          mesh.data(),
                          mesh.tp,
                          zero,
                          c.b.m,
                          1,
                          mesh.cp,
                          c.ctx.offload.optimizer,
                          c.ctx.offload.params,
                          ParallelConfig{}.offload_bucket_bytes / 4};
    stages.push_back(CostOf(std::span<const StageWork>(chunks.data(), v), *ps, shape, s,
                            c.b.N * c.ctx.config.embed * 4, c.ctx.profile));
  }
  return stages;
}

// What an interleaved plan of a pick takes at least: each micro-batch's
// compute through the whole model (its chunks' ends, first blocks and the
// rest, however the layers fall) spread evenly over the stages, in every
// micro-batch. (The compute is linear in the work, so its sum over the
// stages is the whole's; a plan that cannot beat the runner-ups is not
// costed. Ranks sharing a device compute at a whole one while others wait.)
double ChunkedComputeBound(const Costing& c, const StageKinds& kinds) {
  const int groups = c.b.mesh.pp * c.b.v;
  StageWork total = kinds.ends[kFirst];
  total.Add(kinds.first[kFirst]);
  for (int g = 1; g + 1 < groups; ++g) {
    total.Add(kinds.ends[kMiddle]);
    total.Add(kinds.first[kMiddle]);
  }
  total.Add(kinds.ends[kLast]);
  total.Add(kinds.first[kLast]);
  total.AddTimes(kinds.steady, c.ctx.config.layers - groups);
  return c.b.m * ComputeSeconds(total, c.ctx.profile) / c.b.mesh.pp /
         std::max(1, c.ctx.profile.ranks_per_device);
}

// Pick `p` with each ZeRO setting the file allows, priced and offered.
void CostPick(Costing& c, const Pick& p) {
  const MeshShape& mesh = c.b.mesh;
  const StageKinds kinds = KindsOf(c.ops, p, c.halves, c.ends);
  if (c.b.v > 1 && c.board.found() && ChunkedComputeBound(c, kinds) > c.board.cutoff()) return;
  const std::vector<int> layers = LayersOf(c.ctx.config, mesh.pp, c.b.v, kinds, c.ends);
  for (int zero : mesh.data() > 1 ? std::vector{0, 1} : std::vector{0}) {
    if (!c.ctx.Allowed(c.ctx.fixed ? c.ctx.fixed->zero : std::nullopt, zero)) continue;
    const std::vector<StageCost> stages = StagesOf(c, p, kinds, layers, zero);
    if (stages.empty()) continue;
    const StepPrediction pred =
        PriceStep(stages, c.b.m, c.ctx.profile, mesh.data() * mesh.tp, c.board.cutoff());
    c.board.Costed();
    const std::string name =
        PlanName(mesh, c.b.m, c.b.v, zero, c.b.rc) +
        (c.ctx.offload.optimizer ? " offload=" + c.ctx.offload.Name() : std::string());
    if (pred.memory.total() > c.ctx.budget) {
      c.board.OverBudget(pred, name);
      continue;
    }
    const std::string full = name + " [" + CodeOf(c.ops, p, mesh.tp) + "]";
    if (c.board.IsBest(pred)) {
      c.board.SetBest(full, pred, PlanOf(c.ctx, c.ops, p, c.b, zero, layers));
    } else {
      c.board.RunnerUp(full, pred);
    }
  }
}

// The picks to cost for block point `bp`: every embedding with every head
// that cuts wte alike (fast: the template's own).
std::vector<Pick> EndPicks(const Costing& c, const BlockPoint& bp) {
  if (c.ctx.fast) return {bp.pick};
  std::vector<Pick> picks;
  const Placement x = AfterBlock(c.ops, bp.pick);
  for (size_t e = 0; e < c.ops.size(GptOp::kEmbedding); ++e) {
    const int ws = WeightSplitOf(c.ops.at(GptOp::kEmbedding, e));
    for (const Pick& h : c.ends.Heads(x, ws)) {
      Pick p = bp.pick;
      p[GptOp::kEmbedding] = static_cast<int>(e);
      for (GptOp op : {GptOp::kLmHead, GptOp::kLnF, GptOp::kLoss}) p[op] = h[op];
      picks.push_back(p);
    }
  }
  return picks;
}

BlockBound BoundOf(const Costing& c) {
  return {c.board.found(), BlocksOnCriticalPath(c.ctx, c.b), c.board.best_seconds()};
}

// The block points to try: fast's templates, or the exact block front.
std::vector<BlockPoint> BlockPoints(Costing& c, const std::vector<Pick>& templates) {
  const int tp = c.b.mesh.tp;
  if (!c.ctx.fast) return BlockFront(c.ctx.config, c.ops, c.halves, tp, BoundOf(c));
  std::vector<BlockPoint> points;
  for (const Pick& p : templates) {
    if (!c.halves.Runs(p)) continue;
    const StageWork w = c.halves.Block(p, AfterBlock(c.ops, p));
    points.push_back({p, c.ends.Seconds(w), w.slot_bytes, w.shared_bytes(), w.tp_sum_floats,
                      HalfParams(c.ctx.config, c.ops, p, GptOpPart::kAttentionHalf, tp) +
                          HalfParams(c.ctx.config, c.ops, p, GptOpPart::kMlpHalf, tp)});
  }
  return points;
}

// Every plan of one mesh, micro-batch count and recompute, for each of
// `chunks` (virtual stages, in b.v): the blocks' halves, ends and front
// are the same for every chunk count (built once, the front under the
// weakest chunk count's bound). Points come fastest first: once their
// blocks alone reach the best step, no later point can win.
void SearchBlocks(const SearchContext& ctx, const MeshOps& ops, const std::vector<Pick>& templates,
                  BlockSetting b, const std::vector<int>& chunks, ParamMemo& params,
                  Leaderboard& board) {
  BlockHalves halves(ctx.config, ops, b.mesh.tp, b.N, ctx.T / b.mesh.cp, b.rc, ctx.profile,
                     b.mesh.cp);
  StageEnds ends(ctx.config, ops, b.mesh.tp, b.N, ctx.profile);
  b.v = chunks.back();  // the most chunks: the weakest bound
  Costing front{ctx, ops, b, halves, ends, params, board};
  const std::vector<BlockPoint> points = BlockPoints(front, templates);
  for (int v : chunks) {
    b.v = v;
    Costing c{ctx, ops, b, halves, ends, params, board};
    for (const BlockPoint& bp : points) {
      if (BoundOf(c).Prunes(bp.seconds)) break;
      for (const Pick& p : EndPicks(c, bp)) CostPick(c, p);
    }
  }
}

// ---- One mesh.

// The user's operators (propagate), resolved on this mesh, named as block
// 0's (blocks fold: h.<i>.<op> must agree for every i). Null without a
// file; an error when the file does not resolve here (the first such is
// kept as why nothing runs).
Result<std::optional<std::map<std::string, OpStrategy>>> UserOps(const SearchContext& ctx,
                                                                 const Mesh& mesh,
                                                                 std::string* why_none) {
  std::map<std::string, OpStrategy> named;
  if (ctx.fixed == nullptr) return std::optional(named);
  auto r =
      ResolveOpStrategies(*ctx.fixed, GptGraph::Signatures(ctx.config), mesh, /*named_only=*/true);
  if (!r.ok()) {
    if (why_none->empty()) *why_none = r.status().message();
    return std::optional<std::map<std::string, OpStrategy>>();
  }
  for (const auto& [name, st] : *r) {
    std::string key = name;
    if (name.starts_with("h.")) key = "h.0." + name.substr(name.find('.', 2) + 1);
    auto [it, fresh] = named.emplace(key, st);
    if (!fresh && !(it->second == st)) {
      return InvalidArgumentError(ctx.fixed->source +
                                  ": propagate folds identical blocks, but operator '" + name +
                                  "' differs from block 0's");
    }
  }
  return std::optional(named);
}

// The templates fast chooses among, as picks: data parallelism, or
// Megatron and Megatron-SP on tp.
std::vector<Pick> FastTemplates(const SearchContext& ctx, const Mesh& mesh, const MeshOps& ops,
                                const MeshShape& shape) {
  GptConfig one = ctx.config;  // blocks fold: block 0 says it all
  one.layers = 1;
  const int tp = shape.tp;
  std::vector<Pick> templates;
  if (tp == 1 && shape.cp > 1) {  // data parallelism over dp x cp: the one candidate of each
    Pick p;
    for (const GptOpSpec& spec : GptOpSpecs()) p[spec.op] = 0;
    return {p};
  }
  for (int t = 0; t < (tp == 1 ? 1 : 2); ++t) {
    const OpStrategyFile f =
        tp == 1 ? OpStrategyFile{} : GptGraph::Megatron(t == 1, shape.cp, shape.algo);
    auto r = ResolveOpStrategies(f, GptGraph::Signatures(one), mesh);
    if (!r.ok()) continue;
    Pick p;
    bool complete = true;
    for (const GptOpSpec& spec : GptOpSpecs()) {
      const OpStrategy& want = r->at(OpName(spec.op, 0));
      int found = kNone;
      for (size_t i = 0; i < ops.size(spec.op) && found == kNone; ++i) {
        if (ops.info(spec.op, i).strategy == want) found = static_cast<int>(i);
      }
      p[spec.op] = found;
      complete = complete && found != kNone;
    }
    if (complete) templates.push_back(p);
  }
  return templates;
}

// The chunks per stage to try on pp stages with m micro-batches: 1, and
// under a pipeline of at least pp micro-batches 2 where each chunk keeps a
// layer; under propagate up to the file's, if it sets one. (Each value
// costs the blocks' front again: up to 4 took exact 3x today's time on
// GPT-3 / 1,024 devices, beyond the 2x the search may grow; `--why
// virtual_stages=4` prices any.)
constexpr int kSearchedVirtualStages = 2;
std::vector<int> VirtualStagesFor(const SearchContext& ctx, int pp, int m) {
  std::vector<int> out;
  const int most = ctx.fixed != nullptr && ctx.fixed->virtual_stages ? *ctx.fixed->virtual_stages
                                                                     : kSearchedVirtualStages;
  for (int v = 1; v <= most; ++v) {
    if (v > 1 && (pp == 1 || m < pp || ctx.config.layers < pp * v)) break;
    if (ctx.Allowed(ctx.fixed ? ctx.fixed->virtual_stages : std::nullopt, v)) out.push_back(v);
  }
  return out;
}

Status SearchMesh(const SearchContext& ctx, const MeshShape& shape, ParamMemo& params,
                  Leaderboard& board, std::string* why_none) {
  const int pp = shape.pp, dp = shape.dp, tp = shape.tp;
  ASSIGN_OR_RETURN(Mesh mesh, shape.ToMesh());
  ASSIGN_OR_RETURN(auto user, UserOps(ctx, mesh, why_none));
  if (!user.has_value()) return Status::Ok();
  ASSIGN_OR_RETURN(MeshOps ops, MakeMeshOps(ctx, shape, ctx.fixed ? &*user : nullptr));
  if (!HasEveryOperator(ops)) {
    if (why_none->empty()) {
      *why_none = "on tp " + std::to_string(tp) + " some operator has no strategy that runs";
    }
    return Status::Ok();
  }
  const std::vector<Pick> templates =
      ctx.fast ? FastTemplates(ctx, mesh, ops, shape) : std::vector<Pick>();
  const int rows = ctx.B / dp;
  for (int m : Divisors(rows)) {
    if (!ctx.Allowed(ctx.fixed ? ctx.fixed->micro_batches : std::nullopt, m)) continue;
    const std::vector<int> chunks = VirtualStagesFor(ctx, pp, m);
    if (chunks.empty()) continue;
    for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      if (ctx.fixed_rc && *ctx.fixed_rc != rc) continue;
      // A rank's rows of a micro-batch: its T / cp positions of each sequence.
      const BlockSetting b{shape, m, 1, rc, static_cast<int64_t>(rows / m) * ctx.T / shape.cp};
      SearchBlocks(ctx, ops, templates, b, chunks, params, board);
    }
  }
  return Status::Ok();
}

// ---- Multi-copy.

// Copies change how much of a stage's tp communication shows, not which
// operators, stages or micro-batches pay it: the search prices the plan it
// chose with 2 copies (the full walk, PredictGptStep) and keeps them when
// faster within the budget, the plan without them then a runner-up
// (pricing copies inside the folded search would double its setup for a
// choice the finalist decides). A strategy file's micro_batch_interleave
// is applied as it says.
constexpr int kSearchedCopies = 2;
Status SearchCopies(const SearchContext& ctx, Leaderboard& board) {
  SearchResult& best = board.result();
  const std::optional<int> fixed = ctx.fixed ? ctx.fixed->micro_batch_interleave : std::nullopt;
  const int n = fixed.value_or(kSearchedCopies);
  if (n == 1 || best.parallel.micro_batch_interleave == n || (!fixed && best.parallel.tp == 1)) {
    return Status::Ok();  // (exact's seed, fast's answer, may have them already)
  }
  ParallelConfig par = best.parallel;
  par.micro_batch_interleave = n;
  Result<StepPrediction> with = PredictGptStep(ctx.config, ctx.B, ctx.T, par, ctx.machine);
  const bool fits = with.ok() && (ctx.budget <= 0 || with->memory.total() <= ctx.budget);
  if (fixed) {
    if (!with.ok()) {
      return InvalidArgumentError("the strategy file's micro_batch_interleave " +
                                  std::to_string(n) + " does not run on the plan found (" +
                                  best.name + "): " + with.status().message());
    }
  } else if (!fits) {
    return Status::Ok();
  }
  board.Costed();
  auto file = std::make_shared<OpStrategyFile>(*best.parallel.op_strategy);
  file->micro_batch_interleave = n;
  par.op_strategy = file;
  const std::string name = best.name + " micro_batch_interleave=" + std::to_string(n);
  // Against the same walk of the plan without copies (the search's folded
  // price may differ from it by rounding).
  ASSIGN_OR_RETURN(const StepPrediction without,
                   PredictGptStep(ctx.config, ctx.B, ctx.T, best.parallel, ctx.machine));
  if (fixed || with->seconds < without.seconds) {
    board.SetBest(name, *with, std::move(par));
  } else {
    board.RunnerUp(name, *with);
  }
  return Status::Ok();
}

// ---- When nothing runs.

// Whether some pp x dp x tp configuration of `n` ranks runs the model at
// all, memory aside: pp at most the layers, dp dividing the batch, every
// operator with a strategy on tp. `memo` keeps each (dp, tp)'s answer.
bool RunsOn(const SearchContext& ctx, int n, std::map<std::pair<int, int>, bool>* memo) {
  for (int pp : Divisors(n)) {
    if (pp > ctx.config.layers) continue;
    for (int tp : Divisors(n / pp)) {
      const int dp = n / pp / tp;
      if (ctx.B % dp != 0) continue;
      auto [it, fresh] = memo->emplace(std::pair{dp, tp}, false);
      if (fresh) {
        Result<MeshOps> ops = MakeMeshOps(ctx, MeshShape{1, dp, tp}, nullptr);
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

// Why no plan was found: none fits the budget (the least any needs), or
// none runs at all (why, and which device counts nearby do).
Status NoPlan(const SearchContext& ctx, const Leaderboard& board, const std::string& why_none) {
  if (!board.least_name().empty()) {
    return ResourceExhaustedError("no parallel configuration of " + std::to_string(ctx.devices) +
                                  " ranks fits " + HumanBytes(ctx.budget) +
                                  " per rank; the least memory any needs is " +
                                  HumanBytes(board.least()) + " (" + board.least_name() + ")");
  }
  std::string msg = "no parallel configuration of " + std::to_string(ctx.devices) +
                    " ranks runs a batch of " + std::to_string(ctx.B) + " x " +
                    std::to_string(ctx.T) + " on " + std::to_string(ctx.config.layers) +
                    " layers (pipeline stages at most the layers, data parallelism dividing "
                    "the batch, tensor parallelism where every operator has a strategy)";
  if (!why_none.empty()) msg += "; " + why_none;
  if (ctx.fixed == nullptr && ctx.options.name_runnable_counts) {
    // fast runs its templates only: ask it; exact, any operator's
    // strategies: a configuration with one for every operator runs.
    std::map<std::pair<int, int>, bool> memo;
    SearchOptions quiet = ctx.options;
    quiet.name_runnable_counts = false;
    quiet.rank_memory = std::numeric_limits<int64_t>::max();  // memory aside
    const std::string near = RunnableNear(ctx.devices, [&](int k) {
      return ctx.fast ? SearchGptParallel(ctx.config, ctx.B, ctx.T, k, ctx.machine, quiet).ok()
                      : RunsOn(ctx, k, &memo);
    });
    if (!near.empty()) msg += (ctx.fast ? "; in fast mode " : "; ") + near;
  }
  return InvalidArgumentError(msg);
}

}  // namespace

Result<SearchMode> ParseSearchMode(std::string_view text) {
  if (text == "fast") return SearchMode::kFast;
  if (text == "exact") return SearchMode::kExact;
  if (text == "propagate") return SearchMode::kPropagate;
  return InvalidArgumentError("auto-parallel mode '" + std::string(text) +
                              "' is not one of propagate, fast, exact");
}

std::string_view SearchModeName(SearchMode mode) {
  return mode == SearchMode::kExact       ? "exact"
         : mode == SearchMode::kPropagate ? "propagate"
                                          : "fast";
}

namespace {

// The search with `offload` applied to every plan.
Result<SearchResult> SearchWith(const GptConfig& config, int B, int T, int devices,
                                const MachineProfile& machine, const SearchOptions& options,
                                OffloadKinds offload) {
  ASSIGN_OR_RETURN(SearchContext ctx, MakeContext(config, B, T, devices, machine, options));
  ctx.offload = offload;
  Leaderboard board;
  if (!ctx.fast && ctx.fixed == nullptr) {
    // Start from fast's answer (its choices are among exact's): the
    // bounds then skip most block strategies at once.
    SearchOptions seed = options;
    seed.mode = SearchMode::kFast;
    auto r = SearchWith(config, B, T, devices, machine, seed, offload);
    if (r.ok()) board.Seed(std::move(*r));
  }
  ParamMemo params(config);
  std::string why_none;
  for (const MeshShape& mesh : MeshShapes(ctx)) {
    RETURN_IF_ERROR(SearchMesh(ctx, mesh, params, board, &why_none));
  }
  if (!board.found()) return NoPlan(ctx, board, why_none);
  RETURN_IF_ERROR(SearchCopies(ctx, board));
  return std::move(board.result());
}

}  // namespace

Result<SearchResult> SearchGptParallel(const GptConfig& config, int B, int T, int devices,
                                       const MachineProfile& machine,
                                       const SearchOptions& options) {
  Result<SearchResult> r = SearchWith(config, B, T, devices, machine, options, {});
  // Nothing fits the memory: offload the optimizer, then the weights too,
  // where the job has somewhere to put them.
  if (r.ok() || options.offload_dir.empty() ||
      r.status().code() != StatusCode::kResourceExhausted) {
    return r;
  }
  for (const OffloadKinds kinds : {OffloadKinds{true, false}, OffloadKinds{true, true}}) {
    Result<SearchResult> o = SearchWith(config, B, T, devices, machine, options, kinds);
    if (o.ok() || o.status().code() != StatusCode::kResourceExhausted) return o;
    r = std::move(o);
  }
  return Status(r.status()).Annotate("even with the optimizer and the weights offloaded");
}

}  // namespace tessera
