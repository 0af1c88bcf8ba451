#include "runtime/model/gpt_predict.h"

#include <algorithm>
#include <memory>

#include "runtime/model/gpt_work.h"
#include "runtime/model/ps_placement.h"

namespace tessera {
namespace {

// What predicting a job needs from its configuration: the machine as the
// job runs on it, the configuration on the operator path (without a file,
// every operator data parallel), its mesh, micro-batches and rows per
// micro-batch of a replica.
struct Job {
  MachineProfile profile;
  ParallelConfig par;
  Mesh mesh;
  int micro_batches = 1;
  int64_t rows = 0;
  int T = 0;  // positions of a sequence on a rank (T / cp)
};

Result<Job> PrepareJob(int B, int T, const ParallelConfig& parallel,
                       const MachineProfile& machine) {
  const int world = parallel.dp * parallel.cp * parallel.tp * parallel.pp;
  RETURN_IF_ERROR(parallel.Validate(world));
  Job job;
  // Parameter servers are ranks of the job too (on its hosts' cores).
  job.profile = machine.ForRanks(world + parallel.ps_servers);
  const int m = parallel.micro_batches > 0 ? parallel.micro_batches : parallel.pp;
  if (B % parallel.dp != 0 || (B / parallel.dp) % m != 0) {
    return InvalidArgumentError("a batch of " + std::to_string(B) + " does not cut into dp " +
                                std::to_string(parallel.dp) + " x " + std::to_string(m) +
                                " micro-batches");
  }
  const int copies = parallel.micro_batch_interleave;
  if ((B / parallel.dp / m) % copies != 0) {
    return InvalidArgumentError("micro_batch_interleave " + std::to_string(copies) +
                                ": a micro-batch of " + std::to_string(B / parallel.dp / m) +
                                " sequences per replica does not cut into " +
                                std::to_string(copies) + " copies");
  }
  ASSIGN_OR_RETURN(job.mesh, parallel.MakeMesh());
  job.par = parallel;
  if (job.par.op_strategy == nullptr && job.par.tp == 1 && job.par.cp == 1) {
    auto file = std::make_shared<OpStrategyFile>();
    file->source = "<data parallel>";
    job.par.op_strategy = file;
  }
  RETURN_IF_ERROR(CheckSequenceCut(parallel.cp_algo, T, parallel.cp, "h.*.attn.attention"));
  job.micro_batches = m;
  // A rank's rows: its T / cp positions of each sequence.
  job.rows = static_cast<int64_t>(B) / parallel.dp / m * T / parallel.cp;
  job.T = T / parallel.cp;
  return job;
}

// Parameter servers (runtime/model/param_server.h): the workers all-reduce
// only their own parameters; every served byte goes to its server and
// back, W times through the server's link (where a ring all-reduce moves
// 2 P (W - 1) / W per rank), so the busiest server bounds the exchange;
// servers fold, clip and update their pieces while the workers update
// their own. A worker holds no moments for served parameters; the server
// holding the most is priced apart.
// With an untied head and wte on the servers, the table is served by rows:
// a worker fetches at most its `tokens` distinct rows (or all V) a step
// and holds no table, only those rows and their buffers.
// Asynchronous servers (ps_staleness K >= 0; every parameter served): a
// round is the busiest server's link (the same bytes as a synchronous
// step) and W AdamW updates of its pieces, one per push; a worker clips
// by its own norm and holds no moments, but K + 1 pushes in flight, each
// a gradient and a reply buffer of the model. With K = 0 a step waits for
// its round; with K >= 1 the round runs under the next step's compute,
// so only what exceeds the compute shows.
Status PriceAsync(const ParallelConfig& par, const MachineProfile& prof, const PsPlacement& pl,
                  double busiest, int64_t most, StageCost* stage, MemoryUse* server) {
  const int W = par.dp;
  int64_t total = 0;
  for (const PsPiece& p : pl.pieces()) total += p.count;
  const double updates = W * prof.KernelSeconds(Kernel::kAdamW, static_cast<double>(most));
  const double round = busiest + updates;
  stage->dp_comm = busiest;
  stage->optimizer = updates;
  stage->after = prof.KernelSeconds(Kernel::kSquaredNorm, static_cast<double>(total)) +
                 (par.ps_staleness == 0 ? round : std::max(0.0, round - stage->micro));
  stage->memory.optimizer = 0;
  stage->memory.communication += 8 * (static_cast<int64_t>(par.ps_staleness) + 1) * total;
  server->communication = 0;  // a push lands in the server's gradient buffer
  return Status::Ok();
}

Status PriceServers(const GptConfig& config, const ParallelConfig& par, int64_t tokens,
                    const MachineProfile& prof, StageCost* stage, MemoryUse* server) {
  ASSIGN_OR_RETURN(const std::vector<ParamInfo> params, Gpt::Params(config));
  ASSIGN_OR_RETURN(const PsPlacement pl,
                   PsPlacement::Create(params, par.ps_servers, par.ps_params));
  const int W = par.dp, S = par.ps_servers;
  const double local = static_cast<double>(pl.LocalFloats());
  double comm = W > 1 && local > 0 ? prof.CollectiveSeconds(CollectiveKind::kAllReduce, 4 * local,
                                                            W, prof.CrossesHosts(1, W))
                                   : 0.0;
  const bool inter = prof.CrossesHosts(1, S + W);
  double busiest = 0;
  int64_t most = 0, largest_piece = 0;
  // The served table's rows a step: each worker's distinct ids.
  int64_t table = 0, rows = 0;
  if (config.untied) {
    for (const PsPiece& p : pl.pieces()) {
      if (p.name == "wte") table += p.count;
    }
    if (table > 0) rows = std::min<int64_t>(tokens, config.vocab) * config.embed;
  }
  for (int s = 0; s < S; ++s) {
    double sent = static_cast<double>(pl.ServerFloats(s));
    for (const PsPiece& p : pl.pieces()) {
      if (p.server == s && p.name == "wte" && table > 0) {
        sent -= static_cast<double>(p.count) - static_cast<double>(rows) * p.count / table;
      }
    }
    busiest = std::max(
        busiest, 2.0 * W * prof.CollectiveSeconds(CollectiveKind::kSendRecv, 4.0 * sent, 2, inter));
    most = std::max(most, pl.ServerFloats(s));
  }
  for (const PsPiece& p : pl.pieces()) largest_piece = std::max(largest_piece, p.count);
  server->parameters = server->gradients = 4 * most;
  server->optimizer = 8 * most;
  server->communication =
      4 * static_cast<int64_t>(W - 1) * std::min(PsMessageFloats(pl), largest_piece);
  if (par.ps_staleness >= 0) return PriceAsync(par, prof, pl, busiest, most, stage, server);
  stage->dp_comm = comm + busiest;
  const double m = static_cast<double>(most);
  const double on_server = prof.KernelSeconds(Kernel::kAdamW, m) +
                           prof.KernelSeconds(Kernel::kSquaredNorm, m) +
                           prof.ComputeSeconds(0, 12.0 * (W - 1) * m);
  const double on_worker =
      prof.KernelSeconds(Kernel::kAdamW, local) + prof.KernelSeconds(Kernel::kSquaredNorm, local);
  stage->optimizer = std::max(on_server, on_worker);
  stage->after = stage->dp_comm + stage->optimizer;
  stage->memory.optimizer = 8 * pl.LocalFloats();
  stage->memory.parameters -= 4 * table;
  stage->memory.gradients -= 4 * table;
  stage->memory.communication += 2 * 4 * rows;  // in the table, and their buffers
  return Status::Ok();
}

}  // namespace

ParamParts GptParamParts(const std::vector<ParamInfo>& params, bool fold_blocks) {
  ParamParts parts;
  bool seen_block = false;
  for (const ParamInfo& q : params) {
    const bool block = fold_blocks && q.name.starts_with("h.");
    seen_block = seen_block || block;
    std::vector<ParamShape>& to = block ? parts.block : seen_block ? parts.after : parts.before;
    to.push_back({q.numel, q.shape.empty() ? 1 : q.shape[0]});
    if (q.name == "wte") parts.tied = q.numel;
    if (q.name == "lm_head.weight") parts.tied = 0;  // untied: the stages share nothing
    if (q.tied_copy) parts.tied_copy = to.back();
    if (!fold_blocks) {
      if (q.unit >= static_cast<int>(parts.unit_floats.size()))
        parts.unit_floats.resize(q.unit + 1);
      parts.unit_floats[q.unit] += q.numel;
    }
  }
  return parts;
}

StepShape ShapeOf(const ParallelConfig& par, int micro_batches) {
  // Gradients average (and ZeRO-1 shards) over dp x cp.
  return {par.pp,
          par.dp * par.cp,
          par.tp,
          par.zero,
          micro_batches,
          par.micro_batch_interleave,
          par.cp,
          par.offload_optimizer,
          par.offload_params,
          std::max<int64_t>(1, par.offload_bucket_bytes / 4)};
}

Result<StepPrediction> PredictGptStep(const GptConfig& config, int B, int T,
                                      const ParallelConfig& parallel,
                                      const MachineProfile& machine) {
  RETURN_IF_ERROR(parallel.ValidateLayers(config));
  ASSIGN_OR_RETURN(const Job job, PrepareJob(B, T, parallel, machine));
  const ParallelConfig& par = job.par;
  const int64_t act_bytes = job.rows * config.embed * 4;
  std::vector<StageCost> stages;
  std::vector<std::array<double, kKernelCount>> kernel_units;
  // Without operators to run (tp = 1, no strategy file, no recompute), the
  // runtime runs each stage's Gpt whole; the model prices the data-parallel
  // operators' work, which is the same, and the Gpt's own buffers.
  const bool whole = ParallelGpt::RunsWhole(parallel);
  for (int s = 0; s < par.pp; ++s) {
    // Each chunk's operators (one chunk without virtual stages), over the
    // stage's parameters.
    std::vector<StageWork> chunks;
    GptStage gs = ParallelGpt::StageOf(config, par, s);
    std::array<double, kKernelCount>& units = kernel_units.emplace_back();
    for (int c = 0; c < par.virtual_stages; ++c) {
      ASSIGN_OR_RETURN(
          const GptGraph graph,
          ParallelGpt::StageGraph(config, par, job.mesh, ParallelGpt::ChunkOf(config, par, s, c)));
      gs.tp_dims = std::make_shared<const std::map<std::string, int>>(graph.param_splits);
      const int n = par.micro_batch_interleave;
      const StageWork& w =
          chunks.emplace_back(n == 1 ? EstimateStage(graph, job.rows, job.T)
                                     : CopiesWork(EstimateStage(graph, job.rows / n, job.T), n,
                                                  act_bytes, graph.stage.first, graph.stage.last));
      for (int k = 0; k < kKernelCount; ++k) units[k] += w.kernel[k] * job.micro_batches;
    }
    ASSIGN_OR_RETURN(std::vector<ParamInfo> params, Gpt::Params(config, gs));
    const ParamStats ps =
        StatsOfParts(GptParamParts(params, false), 0, par.dp * par.cp, par.zero, par.bucket_bytes);
    const OptimizerUnits optimizer = OptimizerUnitsOf(ps, par.zero);
    units[static_cast<int>(Kernel::kAdamW)] = optimizer.adamw;
    units[static_cast<int>(Kernel::kSquaredNorm)] = optimizer.norm;
    stages.push_back(
        CostOf(chunks, ps, ShapeOf(par, job.micro_batches), s, act_bytes, job.profile));
    if (whole) {
      // The runtime runs this stage's Gpt whole (no operators): its own
      // buffers. The kernels are the operators' (tested unit for unit).
      ASSIGN_OR_RETURN(
          stages.back().memory.activations,
          Gpt::ActivationBytesOf(config, gs, static_cast<int>(job.rows / T), T,
                                 PipelineSchedule(par.pp, s, job.micro_batches).slots()));
    }
  }
  MemoryUse server;
  if (par.ps_servers > 0)
    // (A worker fetches the rows of all its micro-batches' tokens at once.)
    RETURN_IF_ERROR(
        PriceServers(config, par, job.rows * job.micro_batches, job.profile, &stages[0], &server));
  StepPrediction out = PriceStep(stages, job.micro_batches, job.profile, par.dp * par.cp * par.tp);
  out.server_memory = server;
  out.stage_kernel_units = std::move(kernel_units);
  return out;
}

Result<std::vector<std::vector<OpCost>>> BreakdownGptStep(const GptConfig& config, int B, int T,
                                                          const ParallelConfig& parallel,
                                                          const MachineProfile& machine) {
  ASSIGN_OR_RETURN(const Job job, PrepareJob(B, T, parallel, machine));
  const ParallelConfig& par = job.par;
  std::vector<std::vector<OpCost>> out;
  for (int s = 0; s < par.pp; ++s) {
    // (Under virtual stages, the stage's first chunk.)
    const GptStage gs = ParallelGpt::ChunkOf(config, par, s, 0);
    ASSIGN_OR_RETURN(const GptGraph graph, ParallelGpt::StageGraph(config, par, job.mesh, gs));
    std::vector<OpCost> stage;
    for (const auto& [name, w] : EstimateOps(graph, job.rows, job.T)) {
      stage.push_back({name, ComputeSeconds(w, job.profile),
                       GroupCommSeconds(w, job.profile, par.tp) +
                           CpCommSeconds(w, job.profile, par.cp, par.tp)});
    }
    out.push_back(std::move(stage));
  }
  return out;
}

}  // namespace tessera
