#include "runtime/model/gpt_search.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <tuple>

#include "core/byte_size.h"

namespace tessera {
namespace {

constexpr CollectiveKind kKinds[4] = {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter,
                                      CollectiveKind::kAllGather, CollectiveKind::kAllToAll};

// Seconds of a stage's collectives over tp (tp neighbours in the rank order).
double TpSeconds(const StageWork& w, const MachineProfile& p, int tp) {
  const bool inter = p.CrossesHosts(1, tp);
  double t = 0;
  for (int k = 0; k < 4; ++k) {
    const int n = w.comm_count[k];
    if (n > 0) t += n * p.CollectiveSeconds(kKinds[k], w.comm_bytes[k] / n, tp, inter);
  }
  return t;
}

// What the parameters of one stage (tp rank 0) take: floats, the rank's
// ZeRO-1 shard, and the largest gradient bucket's per-rank count.
struct ParamStats {
  int64_t floats = 0, zero_shard = 0, largest_bucket = 0, buckets = 0, wte = 0;
};

ParamStats StatsOf(const std::vector<ParamInfo>& params, int dp, int zero, int64_t bucket_bytes) {
  ParamStats s;
  std::vector<int64_t> shard(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params[i];
    s.floats += p.numel;
    const int64_t d0 = p.shape.empty() ? 1 : p.shape[0];
    const int64_t row = d0 > 0 ? p.numel / d0 : 0;
    shard[i] = (d0 + dp - 1) / dp * row;  // torch.chunk: rank 0's is the largest
    s.zero_shard += shard[i];
    if (p.name == "wte") s.wte = p.numel;
  }
  // Buckets as ParallelGpt makes them: from the last parameter back.
  const int64_t bucket_floats = std::max<int64_t>(1, bucket_bytes / 4);
  int64_t size = 0, count = 0;
  for (size_t i = params.size(); i-- > 0;) {
    if (s.buckets == 0 || size >= bucket_floats) {
      ++s.buckets;
      size = count = 0;
    }
    size += params[i].numel;
    count += zero == 1 ? shard[i] : params[i].numel;
    s.largest_bucket = std::max(s.largest_bucket, count);
  }
  return s;
}

// One stage's costs on one rank.
struct StageCost {
  double micro = 0;  // per micro-batch: compute + tp collectives + transfers
  double compute = 0, tp_comm = 0, pp_comm = 0;
  double after = 0, dp_comm = 0, optimizer = 0;  // once per step
  MemoryUse memory;
};

StageCost CostOf(const StageWork& w, const ParamStats& ps, const ParallelConfig& par, int s, int m,
                 int64_t act_bytes, const MachineProfile& prof) {
  StageCost c;
  const int pp = par.pp, dp = par.dp, tp = par.tp;
  c.compute = prof.ComputeSeconds(w.flops, w.bytes);
  c.tp_comm = TpSeconds(w, prof, tp);
  const bool pp_inter = prof.CrossesHosts(static_cast<int64_t>(dp) * tp, 2);
  if (s < pp - 1) c.pp_comm += prof.CollectiveSeconds(CollectiveKind::kSendRecv, act_bytes, 2, pp_inter);
  if (s > 0) c.pp_comm += prof.CollectiveSeconds(CollectiveKind::kSendRecv, act_bytes, 2, pp_inter);
  c.micro = c.compute + c.tp_comm + c.pp_comm;
  // Gradients over dp, bucket by bucket.
  const bool dp_inter = prof.CrossesHosts(tp, dp);
  const double grad_bytes = 4.0 * ps.floats, per_bucket = grad_bytes / std::max<int64_t>(1, ps.buckets);
  if (par.zero == 1) {
    c.dp_comm = ps.buckets * (prof.CollectiveSeconds(CollectiveKind::kReduceScatter, per_bucket, dp, dp_inter) +
                              prof.CollectiveSeconds(CollectiveKind::kAllGather, per_bucket, dp, dp_inter));
  } else {
    c.dp_comm = ps.buckets * prof.CollectiveSeconds(CollectiveKind::kAllReduce, per_bucket, dp, dp_inter);
  }
  c.dp_comm += prof.CollectiveSeconds(CollectiveKind::kAllReduce, 4.0 * w.tp_sum_floats, tp,
                                      prof.CrossesHosts(1, tp));
  if (pp > 1 && (s == 0 || s == pp - 1)) {
    c.dp_comm += prof.CollectiveSeconds(CollectiveKind::kAllReduce, 4.0 * ps.wte, 2,
                                        prof.CrossesHosts(static_cast<int64_t>(pp - 1) * dp * tp, 2));
  }
  // AdamW reads parameters, gradients and both moments and writes three.
  c.optimizer = prof.ComputeSeconds(0, 28.0 * (par.zero == 1 ? ps.zero_shard : ps.floats));
  c.after = c.dp_comm + c.optimizer;
  MemoryUse& mem = c.memory;
  mem.parameters = mem.gradients = 4 * ps.floats;
  mem.optimizer = 8 * (par.zero == 1 ? ps.zero_shard : ps.floats);
  mem.activations = std::min(m, pp - s) * w.slot_bytes + w.shared_bytes();
  mem.communication = (par.zero == 1 ? 2 * 4 * ps.largest_bucket * dp : 0) +
                      (tp > 1 ? 4 * w.tp_sum_floats : 0);
  if (s > 0) mem.communication += act_bytes * (1 + m);
  if (s < pp - 1) mem.communication += act_bytes;
  return c;
}

// The step from its stages' costs.
StepPrediction Combine(const std::vector<StageCost>& stages, int m) {
  StepPrediction p;
  double sum = 0, slowest = 0, after = 0;
  int slow = 0;
  for (size_t s = 0; s < stages.size(); ++s) {
    sum += stages[s].micro;
    if (stages[s].micro > slowest) slowest = stages[s].micro, slow = static_cast<int>(s);
    if (stages[s].after > after) {
      after = stages[s].after;
      p.dp_comm = stages[s].dp_comm;
      p.optimizer = stages[s].optimizer;
    }
    p.stage_seconds.push_back(stages[s].micro);
    p.stage_memory.push_back(stages[s].memory);
    if (stages[s].memory.total() > p.memory.total()) {
      p.memory = stages[s].memory;
      p.memory_stage = static_cast<int>(s);
    }
  }
  p.pipeline = sum + (m - 1) * slowest;
  p.compute = m * stages[slow].compute;
  p.tp_comm = m * stages[slow].tp_comm;
  p.pp_comm = m * stages[slow].pp_comm;
  p.bubble = p.pipeline - m * slowest;
  p.seconds = p.pipeline + after;
  return p;
}

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 1 ? "%.2f ms" : "%.3f s", s < 1 ? s * 1e3 : s);
  return buf;
}

}  // namespace

std::string StepPrediction::ToString() const {
  std::string out = "step " + Seconds(seconds) + " (compute " + Seconds(compute) + ", tp collectives " +
                    Seconds(tp_comm) + ", pipeline transfers " + Seconds(pp_comm) + ", bubble " +
                    Seconds(bubble) + ", gradient sums " + Seconds(dp_comm) + ", update " +
                    Seconds(optimizer) + "); largest rank (stage " + std::to_string(memory_stage) +
                    "): " + HumanBytes(memory.total()) + " (parameters " +
                    HumanBytes(memory.parameters) + ", gradients " + HumanBytes(memory.gradients) +
                    ", optimizer " + HumanBytes(memory.optimizer) + ", activations " +
                    HumanBytes(memory.activations) + ", communication " +
                    HumanBytes(memory.communication) + ")";
  return out;
}

Result<StepPrediction> PredictGptStep(const GptConfig& config, int B, int T,
                                      const ParallelConfig& parallel, const MachineProfile& machine) {
  const int world = parallel.dp * parallel.tp * parallel.pp;
  const MachineProfile profile = machine.ForRanks(world);
  RETURN_IF_ERROR(parallel.Validate(world));
  const int m = parallel.micro_batches > 0 ? parallel.micro_batches : parallel.pp;
  if (B % parallel.dp != 0 || (B / parallel.dp) % m != 0) {
    return InvalidArgumentError("a batch of " + std::to_string(B) + " does not cut into dp " +
                                std::to_string(parallel.dp) + " x " + std::to_string(m) +
                                " micro-batches");
  }
  ASSIGN_OR_RETURN(Mesh mesh, parallel.MakeMesh());
  // The operator path always: without a file, every operator data parallel.
  ParallelConfig par = parallel;
  if (par.op_strategy == nullptr && par.tp == 1) {
    auto file = std::make_shared<OpStrategyFile>();
    file->source = "<data parallel>";
    par.op_strategy = file;
  }
  const int64_t N = static_cast<int64_t>(B) / par.dp / m * T;
  const int64_t act_bytes = N * config.embed * 4;
  std::vector<StageCost> stages;
  for (int s = 0; s < par.pp; ++s) {
    GptStage gs = ParallelGpt::StageOf(config, par.pp, s, par.tp, 0, par.stage_layers);
    ASSIGN_OR_RETURN(std::unique_ptr<OpGpt> ops, ParallelGpt::StageOps(config, par, mesh, gs));
    gs.tp_dims = std::make_shared<const std::map<std::string, int>>(ops->param_splits());
    ASSIGN_OR_RETURN(std::vector<ParamInfo> params, Gpt::Params(config, gs));
    const ParamStats ps = StatsOf(params, par.dp, par.zero, par.bucket_bytes);
    stages.push_back(CostOf(ops->Estimate(N, T), ps, par, s, m, act_bytes, profile));
  }
  return Combine(stages, m);
}

std::vector<int> BalanceStages(int layers, int pp, double block, double first, double last) {
  // best[s][l]: the least largest stage time of l layers in stages [0, s).
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(pp + 1, std::vector<double>(layers + 1, inf));
  std::vector<std::vector<int>> take(pp + 1, std::vector<int>(layers + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= pp; ++s) {
    const double extra = (s == 1 ? first : 0) + (s == pp ? last : 0);
    for (int l = s; l <= layers - (pp - s); ++l) {
      for (int n = 1; n <= l - (s - 1); ++n) {
        const double t = std::max(best[s - 1][l - n], n * block + extra);
        // Strictly better, or as good and more even (fewer layers here).
        if (t < best[s][l] - 1e-15) {
          best[s][l] = t;
          take[s][l] = n;
        }
      }
    }
  }
  std::vector<int> out(pp);
  for (int s = pp, l = layers; s > 0; --s) {
    out[s - 1] = take[s][l];
    l -= take[s][l];
  }
  return out;
}

namespace {

// The operator strategies the fast search chooses among.
enum class Template { kDataParallel, kMegatron, kMegatronSp };
const char* TemplateName(Template t) {
  return t == Template::kDataParallel ? "data_parallel" : t == Template::kMegatron ? "megatron"
                                                                                  : "megatron_sp";
}

OpStrategyFile TemplateFile(Template t) {
  if (t == Template::kDataParallel) {
    OpStrategyFile f;
    f.source = "<auto-parallel: data_parallel>";
    return f;
  }
  OpStrategyFile f = OpGpt::Megatron(t == Template::kMegatronSp);
  f.source = std::string("<auto-parallel: ") + TemplateName(t) + ">";
  return f;
}

// A stage's work from templates: the ends and one block (its first) from
// a one-layer model, the blocks after it from the difference with a
// two-layer one, so a stage of any depth costs one addition.
struct StageTemplate {
  StageWork one, block;
};

class Searcher {
 public:
  Searcher(const GptConfig& config, int B, int T, const MachineProfile& profile,
           const SearchOptions& options)
      : config_(config), B_(B), T_(T), profile_(profile), options_(options) {}

  Result<StageTemplate> Stage(int tp, int dp, Template t, Recompute rc, int64_t N, bool first,
                              bool last) {
    const auto key = std::tuple(tp, dp, static_cast<int>(t), static_cast<int>(rc), N, first, last);
    auto it = stages_.find(key);
    if (it != stages_.end()) return it->second;
    StageTemplate st;
    StageWork two;
    for (int layers : {1, 2}) {
      GptConfig c = config_;
      c.layers = layers;
      ASSIGN_OR_RETURN(Mesh mesh, Mesh::Create({"dp", "tp"}, {dp, tp}));
      const OpStrategyFile file = TemplateFile(t);
      ASSIGN_OR_RETURN(auto strategies, ResolveOpStrategies(file, OpGpt::Signatures(c), mesh));
      GptStage gs{0, layers, first, last, tp, 0, nullptr};
      ASSIGN_OR_RETURN(std::unique_ptr<OpGpt> ops, OpGpt::Create(c, strategies, gs, dp));
      ops->SetRecompute(-1, rc);
      (layers == 1 ? st.one : two) = ops->Estimate(N, T_);
    }
    // The second block alone: two minus one (sums), its buffers as one's.
    st.block = two;
    st.block.flops -= st.one.flops;
    st.block.bytes -= st.one.bytes;
    for (int k = 0; k < 4; ++k) {
      st.block.comm_count[k] -= st.one.comm_count[k];
      st.block.comm_bytes[k] -= st.one.comm_bytes[k];
    }
    st.block.slot_bytes -= st.one.slot_bytes;
    st.block.tp_sum_floats -= st.one.tp_sum_floats;
    stages_.emplace(key, st);
    return st;
  }

  // A stage of `n` layers' parameters (ZeRO shards and buckets included).
  Result<ParamStats> Params(int pp, int s, const std::vector<int>& stage_layers, int tp,
                            Template t, int dp, int zero) {
    const auto key = std::tuple(pp, s, stage_layers, tp, static_cast<int>(t), dp, zero);
    auto it = params_.find(key);
    if (it != params_.end()) return it->second;
    const GptConfig& c = config_;
    ASSIGN_OR_RETURN(auto strategies, Strategies(t, dp, tp));
    GptStage gs = ParallelGpt::StageOf(c, pp, s, tp, 0, stage_layers);
    ASSIGN_OR_RETURN(std::unique_ptr<OpGpt> ops, OpGpt::Create(c, *strategies, gs, dp));
    gs.tp_dims = std::make_shared<const std::map<std::string, int>>(ops->param_splits());
    ASSIGN_OR_RETURN(std::vector<ParamInfo> params, Gpt::Params(c, gs));
    const ParamStats ps = StatsOf(params, dp, zero, options_.bucket_bytes);
    params_.emplace(key, ps);
    return ps;
  }

  Result<const std::map<std::string, OpStrategy>*> Strategies(Template t, int dp, int tp) {
    const auto key = std::tuple(static_cast<int>(t), dp, tp);
    auto it = strategies_.find(key);
    if (it == strategies_.end()) {
      ASSIGN_OR_RETURN(Mesh mesh, Mesh::Create({"dp", "tp"}, {dp, tp}));
      ASSIGN_OR_RETURN(auto s, ResolveOpStrategies(TemplateFile(t), OpGpt::Signatures(config_), mesh));
      it = strategies_.emplace(key, std::move(s)).first;
    }
    return &it->second;
  }

  const GptConfig& config() const { return config_; }

 private:
  GptConfig config_;
  int B_, T_;
  const MachineProfile& profile_;
  const SearchOptions& options_;
  std::map<std::tuple<int, int, int, int, int64_t, bool, bool>, StageTemplate> stages_;
  std::map<std::tuple<int, int, std::vector<int>, int, int, int, int>, ParamStats> params_;
  std::map<std::tuple<int, int, int>, std::map<std::string, OpStrategy>> strategies_;
};

std::vector<int> Divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i) {
    if (n % i == 0) d.push_back(i);
  }
  return d;
}

}  // namespace

Result<SearchResult> SearchGptParallel(const GptConfig& config, int B, int T, int devices,
                                       const MachineProfile& machine, const SearchOptions& options) {
  const MachineProfile profile = machine.ForRanks(devices);
  RETURN_IF_ERROR(config.Validate());
  if (options.mode != "fast") {
    return UnimplementedError("auto-parallel mode '" + options.mode +
                              "': this build searches with 'fast' only");
  }
  if (devices < 1) return InvalidArgumentError("the search needs at least one device");
  const int64_t budget = options.rank_memory > 0 ? options.rank_memory
                         : profile.memory_bytes > 0 ? profile.memory_bytes
                                                    : std::numeric_limits<int64_t>::max();
  Searcher search(config, B, T, profile, options);
  SearchResult best;
  bool found = false;
  std::string least_name, why_none;
  int64_t least = std::numeric_limits<int64_t>::max();
  std::vector<std::pair<double, std::pair<std::string, StepPrediction>>> all;
  for (int pp : Divisors(devices)) {
    if (pp > config.layers) continue;
    for (int tp : Divisors(devices / pp)) {
      const int dp = devices / pp / tp;
      if (B % dp != 0) continue;
      const int rows = B / dp;
      std::vector<Template> templates = tp == 1 ? std::vector{Template::kDataParallel}
                                                : std::vector{Template::kMegatron, Template::kMegatronSp};
      for (Template t : templates) {
        for (int m : Divisors(rows)) {
          const int64_t N = static_cast<int64_t>(rows / m) * T;
          for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
            // The stage templates: every stage kind this pp has.
            StageTemplate first, last, middle, only;
            bool ok = true;
            auto get = [&](bool f, bool l, StageTemplate* st) {
              auto r = search.Stage(tp, dp, t, rc, N, f, l);
              if (!r.ok()) {
                ok = false;
                if (why_none.empty()) why_none = r.status().message();
                return;
              }
              *st = *r;
            };
            if (pp == 1) {
              get(true, true, &only);
            } else {
              get(true, false, &first);
              get(false, true, &last);
              get(false, false, &middle);
            }
            if (!ok) continue;
            // Layers balanced by the stages' predicted times.
            auto seconds = [&](const StageWork& w) {
              return profile.ComputeSeconds(w.flops, w.bytes) + TpSeconds(w, profile, tp);
            };
            std::vector<int> layers_of;
            if (pp > 1) {
              const double blk = seconds(middle.block);
              const double mid_end = seconds(middle.one) - blk;
              layers_of = BalanceStages(config.layers, pp, blk, seconds(first.one) - blk - mid_end,
                                        seconds(last.one) - blk - mid_end);
            }
            for (int zero : dp > 1 ? std::vector{0, 1} : std::vector{0}) {
              ParallelConfig par;
              par.pp = pp;
              par.dp = dp;
              par.tp = tp;
              par.zero = zero;
              par.micro_batches = m;
              par.bucket_bytes = options.bucket_bytes;
              par.stage_layers = layers_of;
              std::vector<StageCost> stages;
              for (int s = 0; s < pp && ok; ++s) {
                const StageTemplate& st = pp == 1 ? only : s == 0 ? first : s == pp - 1 ? last : middle;
                const int n = pp == 1 ? config.layers : layers_of[s];
                StageWork w = st.one;
                w.AddTimes(st.block, n - 1);
                auto ps = search.Params(pp, s, layers_of, tp, t, dp, zero);
                if (!ps.ok()) {
                  ok = false;
                  break;
                }
                stages.push_back(CostOf(w, *ps, par, s, m, N * config.embed * 4, profile));
              }
              if (!ok) continue;
              const StepPrediction pred = Combine(stages, m);
              ++best.candidates;
              std::string name = "pp=" + std::to_string(pp) + ",dp=" + std::to_string(dp) +
                                 ",tp=" + std::to_string(tp) + " " + TemplateName(t) +
                                 " zero=" + std::to_string(zero) + " micro_batches=" +
                                 std::to_string(m) + " recompute=" +
                                 std::string(RecomputeName(rc));
              if (pred.memory.total() < least) {
                least = pred.memory.total();
                least_name = name;
              }
              if (pred.memory.total() > budget) continue;
              all.push_back({pred.seconds, {name, pred}});
              if (!found || pred.seconds < best.predicted.seconds) {
                found = true;
                best.predicted = pred;
                best.name = name;
                auto file = std::make_shared<OpStrategyFile>(TemplateFile(t));
                file->pp = pp;
                file->dp = dp;
                file->tp = tp;
                file->zero = zero;
                file->micro_batches = m;
                file->stage_layers = layers_of;
                if (rc != Recompute::kNone) file->recompute = {{"h.*", std::string(RecomputeName(rc))}};
                par.op_strategy = file;
                best.parallel = par;
              }
            }
          }
        }
      }
    }
  }
  if (!found) {
    if (least_name.empty()) {
      return InvalidArgumentError("no parallel configuration of " + std::to_string(devices) +
                                  " ranks runs a batch of " + std::to_string(B) + " x " +
                                  std::to_string(T) + (why_none.empty() ? "" : ": " + why_none));
    }
    return ResourceExhaustedError("no parallel configuration of " + std::to_string(devices) +
                                  " ranks fits " + HumanBytes(budget) + " per rank; the least " +
                                  "memory any needs is " + HumanBytes(least) + " (" + least_name + ")");
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < all.size() && i <= 5; ++i) best.alternatives.push_back(all[i].second);
  return best;
}

}  // namespace tessera
