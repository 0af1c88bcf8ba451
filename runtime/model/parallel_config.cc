// ParallelConfig and the parts of ParallelGpt that plan without running:
// the stages' layers, the operators' graph of a stage, the strategy file
// and the layouts a checkpoint records. They link no kernels, so the cost
// model, the search and `ckpt auto-parallel` use them; parallel_gpt.cc
// runs the configuration.
#include <algorithm>
#include <tuple>

#include "runtime/model/parallel_gpt.h"

namespace tessera {

Result<Mesh> ParallelConfig::MakeMesh() const {
  if (cp > 1) return Mesh::Create({"pp", "dp", "cp", "tp"}, {pp, dp, cp, tp});
  return Mesh::Create({"pp", "dp", "tp"}, {pp, dp, tp});
}

// Parameter servers serve data-parallel workers only.
Status ParallelConfig::ValidateServers() const {
  if (ps_servers < 0) return InvalidArgumentError("--ps-servers must be >= 0");
  if (ps_servers > 0) {
    std::string other;
    if (tp > 1)
      other = "tp " + std::to_string(tp);
    else if (pp > 1)
      other = "pp " + std::to_string(pp);
    else if (cp > 1)
      other = "cp " + std::to_string(cp);
    else if (zero != 0)
      other = "zero " + std::to_string(zero);
    else if (offload_optimizer)
      other = "offload";
    if (!other.empty()) {
      return InvalidArgumentError("--ps-servers " + std::to_string(ps_servers) + " with " + other +
                                  ": parameter servers serve data-parallel workers (tp, pp, cp 1, "
                                  "zero 0, no offload)");
    }
    if (ps_staleness >= 0 && ps_params != "all") {
      return InvalidArgumentError("--ps-staleness " + std::to_string(ps_staleness) +
                                  " with --ps-params '" + ps_params +
                                  "': asynchronous workers keep no parameter of their own (they "
                                  "would drift apart); use --ps-params all");
    }
  } else if (!ps_params.empty() && ps_params != "all") {
    return InvalidArgumentError("--ps-params '" + ps_params +
                                "' without parameter servers: give --ps-servers S (or "
                                "TESSERA_PS_SERVERS)");
  } else if (ps_staleness >= 0) {
    return InvalidArgumentError("--ps-staleness " + std::to_string(ps_staleness) +
                                " without parameter servers: give --ps-servers S (or "
                                "TESSERA_PS_SERVERS)");
  }
  return Status::Ok();
}

Status ParallelConfig::Validate(int world_size) const {
  if (dp < 1 || tp < 1 || pp < 1 || cp < 1)
    return InvalidArgumentError("dp, cp, tp and pp must be >= 1");
  RETURN_IF_ERROR(ValidateServers());
  if (static_cast<int64_t>(dp) * cp * tp * pp != world_size) {
    return InvalidArgumentError("dp " + std::to_string(dp) + " x " +
                                (cp > 1 ? "cp " + std::to_string(cp) + " x " : std::string()) +
                                "tp " + std::to_string(tp) + " x pp " + std::to_string(pp) +
                                " is not the " + std::to_string(world_size) + " ranks started");
  }
  if (offload_optimizer && offload_bucket_bytes < 4) {
    return InvalidArgumentError("the offload bucket size must be >= 4 bytes");
  }
  if (offload_optimizer && offload_dir.empty()) {
    return InvalidArgumentError("optimizer offload needs a directory for its files (offload_dir)");
  }
  if (offload_params) {
    if (!offload_optimizer) {
      return InvalidArgumentError(
          "parameter offload needs optimizer offload too (offload optimizer,params): the update "
          "streams the weights with Adam's moments");
    }
    if (virtual_stages > 1) {
      return InvalidArgumentError("parameter offload with virtual_stages " +
                                  std::to_string(virtual_stages) +
                                  ": an interleaved stage's chunks are not offloaded (use one)");
    }
    if (micro_batch_interleave > 1) {
      return InvalidArgumentError("parameter offload with micro_batch_interleave " +
                                  std::to_string(micro_batch_interleave) +
                                  ": multi-copy's copies would take turns on the units (use one)");
    }
  }
  if (cp > 1 && micro_batch_interleave > 1) {
    return InvalidArgumentError("micro_batch_interleave " + std::to_string(micro_batch_interleave) +
                                " with cp " + std::to_string(cp) +
                                ": multi-copy does not compose with context parallelism "
                                "(its copies would take turns on the cp exchanges); use one");
  }
  if (zero != 0 && zero != 1) return InvalidArgumentError("zero must be 0 or 1");
  if (micro_batches < 0) return InvalidArgumentError("micro_batches must be >= 0");
  if (bucket_bytes < 4) return InvalidArgumentError("the bucket size must be >= 4 bytes");
  if (virtual_stages < 1) return InvalidArgumentError("virtual_stages must be >= 1");
  if (virtual_stages > 1 && pp < 2) {
    return InvalidArgumentError("virtual_stages " + std::to_string(virtual_stages) +
                                " interleaves pipeline stages: it needs pp > 1");
  }
  if (micro_batch_interleave < 1)
    return InvalidArgumentError("micro_batch_interleave must be >= 1");
  if (micro_batch_interleave > 1 && tp < 2) {
    return InvalidArgumentError("micro_batch_interleave " + std::to_string(micro_batch_interleave) +
                                ": copies hide tensor-parallel collectives; with tp 1 there are "
                                "none (use tp > 1, or micro_batch_interleave 1)");
  }
  const int groups = pp * virtual_stages;
  if (!stage_layers.empty() && static_cast<int>(stage_layers.size()) != groups) {
    return InvalidArgumentError(
        "stage_layers gives " + std::to_string(stage_layers.size()) + " stages; " +
        (virtual_stages == 1
             ? "pp is " + std::to_string(pp)
             : "pp " + std::to_string(pp) + " x virtual_stages " + std::to_string(virtual_stages) +
                   " needs " + std::to_string(groups) + " (one per chunk, in running order)"));
  }
  if (virtual_stages > 1 && micro_batches > 0 && micro_batches < pp) {
    return InvalidArgumentError(
        "interleaved pipeline (virtual_stages " + std::to_string(virtual_stages) + "): " +
        std::to_string(micro_batches) + " micro-batches are fewer than the " + std::to_string(pp) +
        " stages; use at least " + std::to_string(pp) + " micro-batches, or virtual_stages 1");
  }
  for (int n : stage_layers) {
    if (n < 1) return InvalidArgumentError("every pipeline stage needs at least one layer");
  }
  if (op_strategy != nullptr) {
    const OpStrategyFile& f = *op_strategy;
    for (auto [name, want, have] :
         {std::tuple{"pp", f.pp, pp}, {"dp", f.dp, dp}, {"cp", f.cp, cp}, {"tp", f.tp, tp}}) {
      if (want.has_value() && *want != have) {
        return InvalidArgumentError(f.source + ": the file's mesh has " + name + " " +
                                    std::to_string(*want) + " but the job runs " + name + " " +
                                    std::to_string(have));
      }
    }
    if (f.cp_algo.has_value() && cp > 1 && *f.cp_algo != cp_algo) {
      return InvalidArgumentError(f.source + ": the file's cp_algo is " +
                                  std::string(CpAlgoName(*f.cp_algo)) + " but the job runs " +
                                  std::string(CpAlgoName(cp_algo)));
    }
    if (f.dataset_seq_count > 0 && f.dataset_seq_count != cp) {
      return InvalidArgumentError(f.source + ": dataset_strategy cuts the sequence " +
                                  std::to_string(f.dataset_seq_count) + " ways, but cp is " +
                                  std::to_string(cp));
    }
    if (f.dataset_count > 0 && f.dataset_count != dp) {
      return InvalidArgumentError(f.source + ": dataset_strategy cuts the batch " +
                                  std::to_string(f.dataset_count) + " ways, but dp is " +
                                  std::to_string(dp) + " (the batch is cut over dp only)");
    }
  }
  return Status::Ok();
}

Status ParallelConfig::ValidateLayers(const GptConfig& config) const {
  if (config.untied && ps_servers > 0 && ps_staleness >= 0) {
    return InvalidArgumentError(
        "--ps-staleness with --untied-head: the embedding served by rows "
        "is synchronous only (drop one)");
  }
  if (config.untied && !ParallelGpt::RunsWhole(*this)) {
    return InvalidArgumentError(
        "an untied output projection (lm_head.weight) runs whole stages: no tp, operator "
        "strategy file, recompute or virtual stages");
  }
  if (cp > 1 && cp_algo == CpAlgo::kUlysses && op_strategy == nullptr &&
      config.heads % (tp * cp) != 0) {
    return InvalidArgumentError(
        "operator 'h.*.attn.attention': cp_algo ulysses cuts the " + std::to_string(config.heads) +
        " heads over tp " + std::to_string(tp) + " x cp " + std::to_string(cp) + " = " +
        std::to_string(tp * cp) + " ranks, which does not divide them; use a cp that divides the " +
        std::to_string(config.heads / tp) + " heads of a tp rank, or cp_algo ring");
  }
  const int v = virtual_stages, groups = pp * v;
  if (config.layers < groups) {
    return InvalidArgumentError(
        v == 1 ? "pp " + std::to_string(pp) + " stages need at least " + std::to_string(pp) +
                     " layers; the model has " + std::to_string(config.layers)
               : "pp " + std::to_string(pp) + " x virtual_stages " + std::to_string(v) +
                     " chunks need at least " + std::to_string(groups) + " layers; the model has " +
                     std::to_string(config.layers) +
                     (config.layers >= 2 * pp ? ": use virtual_stages " +
                                                    std::to_string(config.layers / pp) + " or fewer"
                                              : ": use virtual_stages 1"));
  }
  if (!stage_layers.empty()) {
    int64_t sum = 0;
    for (int n : stage_layers) sum += n;
    if (sum != config.layers) {
      return InvalidArgumentError("stage_layers add up to " + std::to_string(sum) +
                                  " layers; the model has " + std::to_string(config.layers));
    }
  } else if (v > 1 && config.layers % groups != 0) {
    std::string fits;
    for (int w = 1; w <= config.layers / pp; ++w) {
      if (config.layers % (pp * w) == 0) fits += (fits.empty() ? "" : ", ") + std::to_string(w);
    }
    return InvalidArgumentError(
        std::to_string(config.layers) + " layers do not cut into pp " + std::to_string(pp) +
        " x virtual_stages " + std::to_string(v) + " = " + std::to_string(groups) +
        " equal chunks: use virtual_stages " + fits + ", or give stage_layers (" +
        std::to_string(groups) + " layer counts, one per chunk)");
  }
  return Status::Ok();
}

bool ParallelGpt::RunsWhole(const ParallelConfig& parallel) {
  return parallel.tp == 1 && parallel.cp == 1 && parallel.op_strategy == nullptr &&
         parallel.recompute == Recompute::kNone && parallel.virtual_stages == 1;
}

Result<GptGraph> ParallelGpt::StageGraph(const GptConfig& config, const ParallelConfig& parallel,
                                         const Mesh& mesh, const GptStage& gs) {
  const OpStrategyFile file = StrategyFileOf(parallel);
  ASSIGN_OR_RETURN(auto strategies, ResolveOpStrategies(file, GptGraph::Signatures(config), mesh));
  ASSIGN_OR_RETURN(GptGraph graph, GptGraph::Create(config, strategies, gs, parallel.dp,
                                                    parallel.cp, parallel.cp_algo));
  graph.SetRecompute(-1, parallel.recompute);
  // The file's blocks: patterns first, then exact names.
  for (const bool exact : {false, true}) {
    for (const auto& [pattern, mode] : file.recompute) {
      if ((pattern.find('*') == std::string::npos) != exact) continue;
      bool matched = false;
      for (int i = 0; i < config.layers; ++i) {
        if (!MatchesOpPattern(pattern, "h." + std::to_string(i))) continue;
        matched = true;
        graph.SetRecompute(i, mode);
      }
      if (!matched) {
        return InvalidArgumentError(file.source + ": recompute names '" + pattern +
                                    "', which is no block of the model (h.0 to h." +
                                    std::to_string(config.layers - 1) + ")");
      }
    }
  }
  return graph;
}

OpStrategyFile ParallelGpt::StrategyFileOf(const ParallelConfig& parallel) {
  return parallel.op_strategy != nullptr
             ? *parallel.op_strategy
             : GptGraph::Megatron(parallel.sequence_parallel, parallel.cp, parallel.cp_algo);
}

std::vector<std::pair<int, int>> ParallelGpt::LayerGroups(const GptConfig& config,
                                                          const ParallelConfig& parallel) {
  const int groups = parallel.pp * std::max(1, parallel.virtual_stages);
  const int64_t L = config.layers;
  std::vector<std::pair<int, int>> out;
  int first = 0;
  for (int g = 0; g < groups; ++g) {
    const int last = parallel.stage_layers.size() == static_cast<size_t>(groups)
                         ? first + parallel.stage_layers[g]
                         : static_cast<int>((g + 1) * L / groups);
    out.emplace_back(first, last);
    first = last;
  }
  return out;
}

GptStage ParallelGpt::StageOf(const GptConfig& config, const ParallelConfig& parallel, int s,
                              int tp_rank) {
  const int pp = parallel.pp, v = std::max(1, parallel.virtual_stages);
  const std::vector<std::pair<int, int>> groups = LayerGroups(config, parallel);
  GptStage stage{groups[s].first, groups[s].second, s == 0,  s == pp - 1,
                 parallel.tp,     tp_rank,          nullptr, {}};
  if (v > 1) {
    for (int c = 0; c < v; ++c) stage.chunks.push_back(groups[c * pp + s]);
  }
  return stage;
}

GptStage ParallelGpt::ChunkOf(const GptConfig& config, const ParallelConfig& parallel, int s, int c,
                              int tp_rank) {
  const int pp = parallel.pp, v = std::max(1, parallel.virtual_stages);
  const std::pair<int, int> group = LayerGroups(config, parallel)[c * pp + s];
  const int vs = c * pp + s;
  return {group.first, group.second, vs == 0, vs == pp * v - 1, parallel.tp, tp_rank, nullptr, {}};
}

Layout ParallelGpt::LayoutOf(const ParallelConfig& parallel, const ParamInfo& p, int stage,
                             bool optimizer) {
  Layout layout = Layout::Replicated(p.full_shape, DType::kF32);
  layout.view = p.view;
  if (p.tp_dim >= 0) {
    layout.dim_axes.assign(p.split_shape().size(), {});
    layout.dim_axes[p.tp_dim] = {"tp"};
  }
  if (optimizer && parallel.zero == 1) {
    layout.opt_axes =
        parallel.cp > 1 ? std::vector<std::string>{"dp", "cp"} : std::vector<std::string>{"dp"};
  }
  if (parallel.pp > 1) {
    layout.stage_axis = "pp";
    layout.stage = stage;
  }
  return layout;
}

Result<Strategy> ParallelGpt::StrategyOf(const GptConfig& config, const ParallelConfig& parallel) {
  ASSIGN_OR_RETURN(Mesh mesh, parallel.MakeMesh());
  // The parameters' cuts: what the operators make of them (the same on
  // every stage).
  GptStage first = ChunkOf(config, parallel, 0, 0);
  std::shared_ptr<const std::map<std::string, int>> dims;
  if (!RunsWhole(parallel)) {
    ASSIGN_OR_RETURN(const GptGraph graph, StageGraph(config, parallel, mesh, first));
    dims = std::make_shared<const std::map<std::string, int>>(graph.param_splits);
  }
  // Every stage's parameters (the tied copy is not a tensor of its own),
  // each on its stage of the pp axis when there are several.
  const int pp = parallel.pp;
  std::vector<std::pair<ParamInfo, int>> all;
  for (int s = 0; s < pp; ++s) {
    GptStage stage = StageOf(config, parallel, s);
    stage.tp_dims = dims;
    ASSIGN_OR_RETURN(std::vector<ParamInfo> params, Gpt::Params(config, stage));
    for (ParamInfo& p : params) {
      if (!p.tied_copy) all.emplace_back(std::move(p), s);
    }
  }
  Strategy strategy(mesh);
  for (const auto& [p, s] : all)
    RETURN_IF_ERROR(strategy.Add({p.name, LayoutOf(parallel, p, s, false)}));
  for (const auto& [p, s] : all) {
    const Layout layout = LayoutOf(parallel, p, s, true);
    RETURN_IF_ERROR(strategy.Add({"optimizer." + p.name + ".exp_avg", layout}));
    RETURN_IF_ERROR(strategy.Add({"optimizer." + p.name + ".exp_avg_sq", layout}));
  }
  return strategy;
}

}  // namespace tessera
