#include "runtime/model/parallel_gpt.h"

#include <algorithm>
#include <cmath>

#include "core/timer.h"
#include "core/trace.h"
#include "runtime/model/gpt_checkpoint.h"
#include "runtime/model/multi_copy.h"
#include "runtime/train/optim.h"

namespace tessera {

Result<std::unique_ptr<ParallelGpt>> ParallelGpt::Create(const GptConfig& config,
                                                         const ParallelConfig& parallel,
                                                         Communicator& world) {
  RETURN_IF_ERROR(parallel.Validate(world.size()));
  RETURN_IF_ERROR(parallel.ValidateLayers(config));
  const int v = parallel.virtual_stages;
  ASSIGN_OR_RETURN(Mesh mesh, parallel.MakeMesh());
  // Every rank checks the whole strategy before any communicator is made,
  // so a bad file stops every rank alike with nothing run.
  // Per chunk, one OpGpt per copy (multi-copy) or one.
  std::vector<std::vector<std::unique_ptr<OpGpt>>> ops;
  const int copies = parallel.micro_batch_interleave;
  const int stage = static_cast<int>(mesh.Coordinate(world.rank(), mesh.FindAxis("pp")));
  const int tp_rank = static_cast<int>(mesh.Coordinate(world.rank(), mesh.FindAxis("tp")));
  GptStage gs = StageOf(config, parallel, stage, tp_rank);
  for (int c = 0; !RunsWhole(parallel) && c < v; ++c) {
    // The chunk's graph resolved once; each copy runs its own operators of it.
    ASSIGN_OR_RETURN(
        const GptGraph graph,
        StageGraph(config, parallel, mesh, ChunkOf(config, parallel, stage, c, tp_rank)));
    std::vector<std::unique_ptr<OpGpt>>& copy_ops = ops.emplace_back();
    for (int k = 0; k < copies; ++k) copy_ops.push_back(OpGpt::FromGraph(graph));
  }
  if (!ops.empty()) {
    gs.tp_dims = std::make_shared<const std::map<std::string, int>>(ops[0][0]->param_splits());
  } else if (parallel.sequence_parallel) {
    return InvalidArgumentError("sequence parallelism cuts the sequence over tp: it needs tp > 1");
  }
  ASSIGN_OR_RETURN(MeshCommunicators comms, MeshCommunicators::Create(world, mesh));
  std::unique_ptr<PsPlacement> placement;
  if (parallel.ps_servers > 0) {
    ASSIGN_OR_RETURN(const std::vector<ParamInfo> all, Gpt::Params(config));
    ASSIGN_OR_RETURN(PsPlacement pl,
                     PsPlacement::Create(all, parallel.ps_servers, parallel.ps_params));
    placement = std::make_unique<PsPlacement>(std::move(pl));
    // wte on the servers with an untied head: served by rows, never held
    // whole here.
    for (const PsPiece& piece : placement->pieces()) {
      gs.served_embedding |= config.untied && piece.name == "wte";
    }
  }
  // Moments a ZeRO shard or the offload file holds are never allocated
  // whole (they would set the peak resident set).
  ASSIGN_OR_RETURN(Gpt model,
                   parallel.zero == 1 || parallel.offload_optimizer || parallel.ps_servers > 0
                       ? Gpt::CreateWithoutMoments(config, gs, parallel.offload_params)
                       : Gpt::Create(config, gs));
  std::unique_ptr<ParallelGpt> p(new ParallelGpt(std::move(model), parallel, std::move(comms)));
  p->tp_dims_ = gs.tp_dims;
  p->ps_placement_ = std::move(placement);
  for (std::vector<std::unique_ptr<OpGpt>>& chunk : ops) {
    for (const auto& o : chunk) p->ops_.push_back(o.get());
    if (chunk.size() > 1) {
      p->runners_.push_back(std::make_unique<MultiCopyRunner>(std::move(chunk)));
    } else {
      p->runners_.push_back(std::move(chunk[0]));
    }
  }
  if (p->runners_.empty()) p->runners_.push_back(std::make_unique<WholeGptRunner>(&p->model_));
  RETURN_IF_ERROR(p->Build());
  return p;
}

double ParallelGpt::comm_seconds() const {
  double t = comm_seconds_;
  for (const auto& r : runners_) t += r->comm_seconds();
  return t;
}

int64_t ParallelGpt::plans_built() const {
  int64_t n = 0;
  for (const auto& r : runners_) n += r->plans_built();
  return n;
}

MemoryUse ParallelGpt::Memory() const {
  auto bytes = [](const std::vector<float>& v) {
    return static_cast<int64_t>(v.capacity() * sizeof(float));
  };
  MemoryUse m;
  m.parameters = offload_weights_ != nullptr
                     ? offload_weights_->peak_resident_bytes() + offload_weights_->buffer_bytes()
                     : bytes(model_.weights());
  m.gradients = bytes(model_.grads());
  m.optimizer = bytes(model_.adam_m()) + bytes(model_.adam_v()) + bytes(shard_m_) + bytes(shard_v_);
  if (offload_ != nullptr) {
    m.optimizer += offload_->resident_bytes();  // its buckets
    m.offloaded_optimizer = 2 * offload_->floats() * static_cast<int64_t>(sizeof(float));
  }
  if (offload_weights_ != nullptr) {
    m.offloaded_parameters = model_.num_params() * static_cast<int64_t>(sizeof(float));
  }
  m.communication = bytes(send_) + bytes(recv_) + bytes(recv_x_) + bytes(recv_dy_);
  for (const auto& r : runners_) {
    m.activations += r->ActivationBytes();
    m.communication += r->CommBufferBytes();
  }
  for (const std::vector<float>& v : send_dx_) m.communication += bytes(v);
  if (ps_ != nullptr) {
    m.optimizer += ps_->moment_bytes();
    m.communication += ps_->async_bytes();  // pushes in flight and their replies
    // The served table is not held: the rows of a step (in the table and
    // the transfer buffers) at their most.
    m.parameters -= ps_->served_bytes();
    m.gradients -= ps_->served_bytes();
    m.communication += ps_->rows_peak_bytes();
  }
  return m;
}

Result<std::string> ParallelGpt::DescribeOps(int B, int T) const {
  if (ops_.empty()) return std::string();
  const GptConfig& config = model_.config();
  const OpStrategyFile file = StrategyFileOf(parallel_);
  ASSIGN_OR_RETURN(auto strategies,
                   ResolveOpStrategies(file, GptGraph::Signatures(config), comms_.mesh()));
  const int64_t rows = static_cast<int64_t>(B) / parallel_.dp / micro_batches_ * T / parallel_.cp;
  std::string out = "operator strategy " + file.source + " on mesh " + comms_.mesh().ToString() +
                    ", " + std::to_string(rows) + " rows (batch x sequence) per replica and " +
                    "micro-batch; placements over tp:\n";
  for (int s = 0; s < parallel_.pp; ++s) {
    for (int c = 0; c < parallel_.virtual_stages; ++c) {
      const GptStage stage = ChunkOf(config, parallel_, s, c);
      ASSIGN_OR_RETURN(const GptGraph graph,
                       GptGraph::Create(config, strategies, stage, parallel_.dp, parallel_.cp,
                                        parallel_.cp_algo));
      if (parallel_.pp > 1) {
        out += "stage " + std::to_string(s) +
               (parallel_.virtual_stages > 1 ? " chunk " + std::to_string(c) : "") + " (layers " +
               std::to_string(stage.first_layer) + " to " + std::to_string(stage.last_layer - 1) +
               "):\n";
      }
      out += graph.Describe(rows);
    }
  }
  ASSIGN_OR_RETURN(Strategy layouts, strategy());
  out += "parameter layouts (what a checkpoint records):\n";
  for (const TensorStrategy& t : layouts.tensors()) {
    if (!t.name.starts_with("optimizer.")) out += "  " + t.name + ": " + ToString(t.layout) + "\n";
  }
  return out;
}

GptStage ParallelGpt::Stage(int s, int t) const {
  GptStage g = StageOf(model_.config(), parallel_, s, t);
  g.tp_dims = tp_dims_;
  return g;
}

Status ParallelGpt::Build() {
  const int cp = parallel_.cp;
  ASSIGN_OR_RETURN(dp_, comms_.Along("dp"));
  ASSIGN_OR_RETURN(pp_, comms_.Along("pp"));
  ASSIGN_OR_RETURN(tp_, comms_.Along("tp"));
  ASSIGN_OR_RETURN(tp_pp_, comms_.Along(std::vector<std::string>{"pp", "tp"}));
  if (cp > 1) {
    ASSIGN_OR_RETURN(cp_, comms_.Along("cp"));
    ASSIGN_OR_RETURN(data_, comms_.Along(std::vector<std::string>{"dp", "cp"}));
    cp_rank_ = cp_->rank();
  } else {
    data_ = dp_;
  }
  data_rank_ = data_->rank();
  for (OpGpt* ops : ops_) {
    RETURN_IF_ERROR(ops->Bind(&model_, parallel_.tp > 1 ? tp_ : nullptr));
    ops->SetContextParallel(cp_, parallel_.cp_algo);
  }
  dp_rank_ = dp_->rank();
  stage_ = pp_->rank();
  const int pp = parallel_.pp;
  micro_batches_ = parallel_.micro_batches > 0 ? parallel_.micro_batches : pp;
  // Each chunk holds the activations of the micro-batches the schedule
  // keeps in flight on it (1F1B: at most pp - stage).
  schedule_ = PipelineSchedule(pp, stage_, micro_batches_, parallel_.virtual_stages);
  for (int c = 0; c < schedule_.chunks(); ++c) runners_[c]->SetSlots(schedule_.in_flight(c));
  if (ops_.empty()) model_.SetSlots(schedule_.slots());
  if (pp > 1 && !model_.config().untied) {  // an untied head shares nothing
    const bool ends = stage_ == 0 || stage_ == pp - 1;
    const int64_t dp_tp =
        (comms_.coordinate("dp") * cp + (cp > 1 ? comms_.coordinate("cp") : 0)) * parallel_.tp +
        comms_.coordinate("tp");
    ASSIGN_OR_RETURN(tied_, comms_.world().Split(ends ? static_cast<int>(dp_tp) : -1, stage_));
  }
  const int dp = parallel_.dp * cp;  // the ranks of data_
  const std::vector<ParamInfo>& params = model_.params();
  // ZeRO shards: dimension 0 of every parameter's tp slice cut over dp (x
  // cp), as the optimizer state's layout says (ShardGrid: the checkpoint's
  // own rule).
  if (parallel_.zero == 1) {
    int64_t offset = 0;
    std::vector<int64_t> coords = comms_.coordinates();
    const int dp_axis = comms_.mesh().FindAxis("dp");
    const int cp_axis = cp > 1 ? comms_.mesh().FindAxis("cp") : -1;
    for (const ParamInfo& p : params) {
      ASSIGN_OR_RETURN(ShardGrid grid,
                       ShardGrid::Create(comms_.mesh(), LayoutOf(parallel_, p, stage_, true)));
      const int64_t row = p.box[0].size() > 0 ? p.numel / p.box[0].size() : 0;
      Shard s{&p, 0, {}, {}, offset};
      for (int r = 0; r < dp; ++r) {  // data_'s rank r: (dp r / cp, cp r % cp)
        coords[dp_axis] = r / cp;
        if (cp_axis >= 0) coords[cp_axis] = r % cp;
        const std::optional<Box> box = grid.ShardOf(comms_.mesh().RankOf(coords));
        if (!box.has_value()) return InternalError("no ZeRO shard of " + p.name);
        s.starts.push_back(((*box)[0].begin - p.box[0].begin) * row);
        s.counts.push_back(NumElements(*box));
      }
      s.begin = s.starts[data_rank_];
      offset += s.counts[data_rank_];
      shards_.push_back(std::move(s));
    }
    shard_m_.assign(offset, 0.0f);
    shard_v_.assign(offset, 0.0f);
    Free({&model_.adam_m(), &model_.adam_v()});
  }
  // Buckets of consecutive parameters, from the last (whose gradients the
  // backward pass finishes first) to the first. Parameters on servers are
  // in none (and end the bucket before them).
  const int64_t bucket_floats = std::max<int64_t>(1, parallel_.bucket_bytes / 4);
  bool gap = false;
  for (size_t i = params.size(); i-- > 0;) {
    if (ps_placement_ != nullptr && ps_placement_->OnServers(i)) {
      gap = true;
      continue;
    }
    if (buckets_.empty() || gap || buckets_.back().end - buckets_.back().begin >= bucket_floats) {
      gap = false;
      buckets_.emplace_back();
      buckets_.back().end = params[i].offset + params[i].numel;
    }
    Bucket& b = buckets_.back();
    b.params.insert(b.params.begin(), i);
    b.begin = params[i].offset;
  }
  int64_t largest = 0;
  for (Bucket& b : buckets_) {
    b.counts.assign(dp, 0);
    if (parallel_.zero == 1) {
      for (size_t i : b.params) {
        for (int r = 0; r < dp; ++r) b.counts[r] += shards_[i].counts[r];
      }
    }
    b.max_count = *std::max_element(b.counts.begin(), b.counts.end());
    largest = std::max(largest, b.max_count);
  }
  if (parallel_.zero == 1) {
    send_.assign(largest * dp, 0.0f);
    recv_.assign(largest * dp, 0.0f);
  }
  if (parallel_.offload_optimizer) {
    // The moments (this rank's shard under ZeRO-1) to a file; none in memory.
    const int64_t floats =
        parallel_.zero == 1 ? static_cast<int64_t>(shard_m_.size()) : model_.num_params();
    ASSIGN_OR_RETURN(offload_, OffloadedMoments::Create(
                                   parallel_.offload_dir, comms_.world().rank(), floats,
                                   std::max<int64_t>(1, parallel_.offload_bucket_bytes / 4)));
    Free({&model_.adam_m(), &model_.adam_v(), &shard_m_, &shard_v_});
    // The moments' segments in the file's order: a parameter each, or its
    // ZeRO shard, and where its weights and gradients lie.
    if (parallel_.zero == 1) {
      for (const Shard& s : shards_) {
        offload_segments_.push_back({s.offset, s.counts[data_rank_], s.param->offset + s.begin,
                                     s.param->decay, s.param->unit});
      }
    } else {
      for (const ParamInfo& p : model_.params()) {
        offload_segments_.push_back({p.offset, p.numel, p.offset, p.decay, p.unit});
      }
    }
  }
  if (parallel_.offload_params) {
    // The weights' units: each one's parameters, adjacent ones as one range.
    std::vector<std::vector<OffloadedWeights::Range>> units;
    for (size_t i = 0; i < params.size(); ++i) {
      const ParamInfo& p = params[i];
      if (p.unit >= static_cast<int>(units.size())) {
        units.resize(p.unit + 1);
        unit_params_.resize(p.unit + 1);
      }
      std::vector<OffloadedWeights::Range>& ranges = units[p.unit];
      if (!ranges.empty() && ranges.back().begin + ranges.back().n == p.offset) {
        ranges.back().n += p.numel;
      } else {
        ranges.push_back({p.offset, p.numel});
      }
      unit_params_[p.unit].push_back(i);
    }
    ASSIGN_OR_RETURN(
        offload_weights_,
        OffloadedWeights::Create(parallel_.offload_dir, comms_.world().rank(),
                                 model_.weights().data(), model_.num_params(), std::move(units)));
    model_.set_weight_units(offload_weights_.get());
  }
  return Status::Ok();
}

void ParallelGpt::Free(std::initializer_list<std::vector<float>*> vectors) {
  for (std::vector<float>* v : vectors) {
    v->clear();
    v->shrink_to_fit();
  }
}

Status ParallelGpt::Init(uint64_t seed) {
  RETURN_IF_ERROR(ServersConnected("Init"));
  if (offload_weights_ != nullptr) {
    // Unit by unit, each written out before the next is made.
    model_.set_step(0);
    for (int u = 0; u < offload_weights_->units(); ++u) {
      RETURN_IF_ERROR(offload_weights_->Need(u, /*write=*/true));
      model_.InitUnit(seed, u);
    }
    // Every unit written and out, nothing in flight: a checkpoint loaded
    // next may write the weights whole (ShardOptimizerState stores them).
    RETURN_IF_ERROR(offload_weights_->Evict());
  } else {
    model_.Init(seed);
  }
  if (ps_ != nullptr) {
    ps_->ZeroMoments();
    ps_->ReleaseRows(model_);  // the servers hold the served table
  }
  if (parallel_.zero == 1) {
    std::fill(shard_m_.begin(), shard_m_.end(), 0.0f);
    std::fill(shard_v_.begin(), shard_v_.end(), 0.0f);
    model_.adam_m().clear();
    model_.adam_v().clear();
  }
  if (offload_ != nullptr) {
    ReleaseOptimizerState();
    moments_zero_ = true;  // the next update starts them from zero
  }
  return Status::Ok();
}

Status ParallelGpt::OffloadedUpdate(const AdamWConfig& adam, float clip) {
  float* weights = model_.weights().data();
  float* grads = model_.grads().data();
  model_.set_step(model_.step() + 1);
  // Each bucket updates the parts of the segments it holds, element by
  // element as the in-memory update does (the same arithmetic).
  const std::vector<OffloadSegment>& segments = offload_segments_;
  size_t first = 0;
  const int64_t step = model_.step();
  Status units;  // the weights' units, when offloaded too
  const Status s = offload_->Stream(
      [&](int64_t begin, int64_t n, float* m, float* v) {
        while (first < segments.size() && segments[first].at + segments[first].n <= begin) ++first;
        for (size_t k = first; k < segments.size() && segments[k].at < begin + n; ++k) {
          const OffloadSegment& g = segments[k];
          const int64_t lo = std::max(begin, g.at), hi = std::min(begin + n, g.at + g.n);
          if (hi <= lo || !units.ok()) continue;
          units = model_.NeedWeights(g.unit, /*write=*/true);
          if (!units.ok()) continue;
          float* gr = grads + g.weight + (lo - g.at);
          if (clip != 1.0f) Scale(gr, hi - lo, clip);
          AdamWUpdate(weights + g.weight + (lo - g.at), gr, m + (lo - begin), v + (lo - begin),
                      hi - lo, step, adam, g.decay);
        }
      },
      moments_zero_);
  moments_zero_ = false;
  RETURN_IF_ERROR(s);
  return units;
}

Status ParallelGpt::MaterializeOptimizerState() {
  // A served embedding's whole table, for an export (the next step gives
  // its pages back).
  if (ps_ != nullptr && ps_->protocol().served() >= 0) return ps_->PullAll(model_);
  // Asynchronous: the newest weights the servers sent.
  if (ps_ != nullptr && ps_->asynchronous()) return ps_->Drain(model_);
  if (offload_weights_ != nullptr) RETURN_IF_ERROR(offload_weights_->NeedAll());
  if (offload_ == nullptr || materialized_) return Status::Ok();
  auto [m, v] = Moments();
  m.assign(offload_->floats(), 0.0f);
  v.assign(offload_->floats(), 0.0f);
  if (!moments_zero_) RETURN_IF_ERROR(offload_->Read(0, offload_->floats(), m.data(), v.data()));
  materialized_ = true;
  return Status::Ok();
}

void ParallelGpt::ReleaseOptimizerState() {
  if (!materialized_) return;
  Free({&model_.adam_m(), &model_.adam_v(), &shard_m_, &shard_v_});
  materialized_ = false;
}

Status ParallelGpt::ConnectServers(Communicator& world) {
  if (ps_placement_ == nullptr) return FailedPreconditionError("ConnectServers without ps_servers");
  if (world.size() != parallel_.ps_servers + data_->size() ||
      world.rank() != parallel_.ps_servers + data_->rank()) {
    return InvalidArgumentError("world rank " + std::to_string(world.rank()) + " of " +
                                std::to_string(world.size()) + ": expected " +
                                std::to_string(parallel_.ps_servers) + " servers then the " +
                                std::to_string(data_->size()) + " workers in order");
  }
  ASSIGN_OR_RETURN(ps_, PsClient::Create(*ps_placement_, world, model_));
  if (ps_->protocol().served() >= 0) {
    // The served table's gradients are kept zero by ReleaseRows.
    const ParamInfo& p = model_.params()[ps_->protocol().served()];
    model_.SkipZeroing(p.offset, p.offset + p.numel);
  }
  if (parallel_.ps_staleness >= 0)
    RETURN_IF_ERROR(ps_->SetAsynchronous(parallel_.ps_staleness, model_));
  return Status::Ok();
}

Result<bool> ParallelGpt::RejoinServers(const RankTable& table, int workers, int worker,
                                        int restart, const CommOptions& options) {
  if (ps_placement_ == nullptr) return FailedPreconditionError("RejoinServers without ps_servers");
  if (parallel_.ps_staleness < 0 || data_->size() != 1) {
    return InvalidArgumentError(
        "a replacement worker joins asynchronous servers (ps_staleness >= 0) as one rank (dp 1)");
  }
  ASSIGN_OR_RETURN(ps_, PsClient::Rejoin(*ps_placement_, workers, table, worker, restart, model_,
                                         parallel_.ps_staleness, options));
  return ps_ != nullptr;
}

Status ParallelGpt::ServersConnected(const char* what) const {
  if (ps_placement_ == nullptr || ps_ != nullptr) return Status::Ok();
  return FailedPreconditionError("ps_servers " + std::to_string(parallel_.ps_servers) + ": " +
                                 what + " needs the servers (ConnectServers first)");
}

Status ParallelGpt::StopServers(bool failed) {
  if (ps_ == nullptr) return Status::Ok();
  return failed ? ps_->Stop(/*failed=*/true) : ps_->Finish(model_);
}

Status ParallelGpt::RequestServerSave(const std::map<std::string, std::string>& metadata) {
  if (ps_ == nullptr) return Status::Ok();
  if (ps_->asynchronous()) RETURN_IF_ERROR(ps_->Drain(model_));
  return ps_->RequestSave(model_.step(), metadata);
}

Status ParallelGpt::ReduceGradients() {
  AddElapsed timed(&comm_seconds_);
  float* grads = model_.grads().data();
  const int dp = parallel_.dp * parallel_.cp;  // the ranks of data_
  for (const Bucket& b : buckets_) {
    if (parallel_.zero == 0) {
      RETURN_IF_ERROR(data_->AllReduce(grads + b.begin, grads + b.begin, b.end - b.begin,
                                       DType::kF32, ReduceOp::kAvg));
      continue;
    }
    // Rank r's block of the send buffer: its rows of every tensor of the
    // bucket, padded to the largest block. It comes back averaged.
    for (int r = 0; r < dp; ++r) {
      float* out = send_.data() + r * b.max_count;
      for (size_t i : b.params) {
        const Shard& s = shards_[i];
        const float* g = grads + s.param->offset + s.starts[r];
        out = std::copy(g, g + s.counts[r], out);
      }
      std::fill(out, send_.data() + (r + 1) * b.max_count, 0.0f);
    }
    RETURN_IF_ERROR(
        data_->ReduceScatter(send_.data(), recv_.data(), b.max_count, DType::kF32, ReduceOp::kAvg));
    const float* in = recv_.data();
    for (size_t i : b.params) {
      const Shard& s = shards_[i];
      std::copy(in, in + s.counts[data_rank_], grads + s.param->offset + s.begin);
      in += s.counts[data_rank_];
    }
  }
  return Status::Ok();
}

Result<double> ParallelGpt::ShardedSquaredNorm() {
  double sum = 0;
  const bool lead = comms_.coordinate("tp") == 0;
  for (const Shard& s : shards_) {
    if (s.param->tied_copy) continue;            // counted on the first stage
    if (s.param->tp_dim < 0 && !lead) continue;  // counted on tp rank 0
    sum += SquaredNorm(model_.grads().data() + s.param->offset + s.begin, s.counts[data_rank_]);
  }
  AddElapsed timed(&comm_seconds_);
  RETURN_IF_ERROR(data_->AllReduce(&sum, &sum, 1, DType::kF64, ReduceOp::kSum));
  return sum;
}

Status ParallelGpt::ShardedUpdate(const AdamWConfig& adam, float clip) {
  float* weights = model_.weights().data();
  float* grads = model_.grads().data();
  model_.set_step(model_.step() + 1);
  for (const Shard& s : shards_) {
    const int64_t n = s.counts[data_rank_];
    float* g = grads + s.param->offset + s.begin;
    if (clip != 1.0f) Scale(g, n, clip);
    AdamWUpdate(weights + s.param->offset + s.begin, g, shard_m_.data() + s.offset,
                shard_v_.data() + s.offset, n, model_.step(), adam, s.param->decay);
  }
  return GatherShardWeights();
}

Status ParallelGpt::GatherShardWeights() {
  // Everyone's new rows to everyone, bucket by bucket.
  float* weights = model_.weights().data();
  AddElapsed timed(&comm_seconds_);
  const int dp = parallel_.dp * parallel_.cp;  // the ranks of data_
  for (const Bucket& b : buckets_) {
    float* out = send_.data();
    for (size_t i : b.params) {
      const Shard& s = shards_[i];
      const float* w = weights + s.param->offset + s.begin;
      out = std::copy(w, w + s.counts[data_rank_], out);
    }
    RETURN_IF_ERROR(data_->AllGather(send_.data(), b.max_count, recv_.data(), DType::kF32));
    for (int r = 0; r < dp; ++r) {
      const float* in = recv_.data() + r * b.max_count;
      for (size_t i : b.params) {
        const Shard& s = shards_[i];
        std::copy(in, in + s.counts[r], weights + s.param->offset + s.starts[r]);
        in += s.counts[r];
      }
    }
  }
  return Status::Ok();
}

Status ParallelGpt::GatherUnitWeights() {
  // Each rank's shards of a unit's parameters, in order, as one stream of
  // floats; the streams go round in rounds of the gather buffers' block.
  float* weights = model_.weights().data();
  const int dp = parallel_.dp * parallel_.cp;  // the ranks of data_
  const int64_t block = static_cast<int64_t>(send_.size()) / dp;
  // Copies floats [from, from + n) of rank r's stream of `unit` to (`out`)
  // or from the buffer `buf`.
  auto copy = [&](int unit, int r, int64_t from, int64_t n, float* buf, bool out) {
    for (size_t i : unit_params_[unit]) {
      if (n == 0) return;
      const Shard& s = shards_[i];
      if (from >= s.counts[r]) {
        from -= s.counts[r];
        continue;
      }
      const int64_t k = std::min(n, s.counts[r] - from);
      float* w = weights + s.param->offset + s.starts[r] + from;
      if (out) {
        std::copy(w, w + k, buf);
      } else {
        std::copy(buf, buf + k, w);
      }
      buf += k;
      n -= k;
      from = 0;
    }
  };
  for (int u = 0; u < offload_weights_->units(); ++u) {
    RETURN_IF_ERROR(offload_weights_->Need(u, /*write=*/true));
    std::vector<int64_t> total(dp, 0);
    for (size_t i : unit_params_[u]) {
      for (int r = 0; r < dp; ++r) total[r] += shards_[i].counts[r];
    }
    const int64_t longest = *std::max_element(total.begin(), total.end());
    AddElapsed timed(&comm_seconds_);
    for (int64_t at = 0; at < longest; at += block) {
      const int64_t mine = std::clamp<int64_t>(total[data_rank_] - at, 0, block);
      copy(u, data_rank_, at, mine, send_.data(), true);
      RETURN_IF_ERROR(data_->AllGather(send_.data(), block, recv_.data(), DType::kF32));
      for (int r = 0; r < dp; ++r) {
        copy(u, r, at, std::clamp<int64_t>(total[r] - at, 0, block), recv_.data() + r * block,
             false);
      }
    }
  }
  return Status::Ok();
}

Result<double> ParallelGpt::RunPipeline(const int32_t* tokens, const int32_t* targets, int rows,
                                        int T) {
  const PipelineSchedule& schedule = schedule_;
  const int M = micro_batches_, V = schedule.chunks();
  const int mb = rows / M;
  const int64_t n = static_cast<int64_t>(mb) * T * model_.config().embed;
  const int prev = schedule.PrevStage(), next = schedule.NextStage();
  const float dloss = 1.0f / static_cast<float>(M);
  if (schedule.Receives()) recv_x_.resize(n);
  if (schedule.Sends()) recv_dy_.resize(n);
  const int dx_buffers = schedule.Receives() ? DxSendBuffers(M * V) : 0;
  send_dx_.resize(dx_buffers);  // kept between steps: sizes change only with the batch shape
  for (std::vector<float>& b : send_dx_) b.resize(n);
  std::vector<Request> slot_send(schedule.slots()), dx_send(dx_buffers);
  int dx_sent = 0;
  double loss = 0;
  // Tags (PipelineSchedule::Tag) name the micro-batch, the chunk that
  // receives and the direction. The last stage's chunk c feeds the first
  // stage's chunk c + 1, whose gradient goes back the same way.
  auto forward = [&](int i, int c) -> Status {
    StageRunner& runner = *runners_[c];
    const int slot = schedule.SlotOf(i, c), local = schedule.LocalSlot(i, c);
    const int64_t at = static_cast<int64_t>(i) * mb * T;
    if (schedule.HasPrev(c)) {
      AddElapsed timed(&comm_seconds_);
      RETURN_IF_ERROR(
          pp_->Recv(recv_x_.data(), n, DType::kF32, prev, PipelineSchedule::Tag(i, c, V, false)));
    }
    if (slot_send[slot].pending()) {  // the slot's last output has left
      AddElapsed timed(&comm_seconds_);
      RETURN_IF_ERROR(slot_send[slot].Wait());
    }
    ASSIGN_OR_RETURN(float l,
                     runner.ForwardStage(local, tokens + at, recv_x_.data(), targets + at, mb, T));
    loss += l;
    if (schedule.HasNext(c)) {
      ASSIGN_OR_RETURN(slot_send[slot],
                       pp_->ISend(runner.StageOutput(local), n, DType::kF32, next,
                                  PipelineSchedule::Tag(i, schedule.NextChunk(c), V, false)));
    }
    return Status::Ok();
  };
  auto backward = [&](int j, int c) -> Status {
    StageRunner& runner = *runners_[c];
    if (schedule.HasNext(c)) {
      AddElapsed timed(&comm_seconds_);
      RETURN_IF_ERROR(
          pp_->Recv(recv_dy_.data(), n, DType::kF32, next, PipelineSchedule::Tag(j, c, V, true)));
    }
    RETURN_IF_ERROR(runner.BackwardStage(schedule.LocalSlot(j, c), recv_dy_.data(), dloss));
    if (schedule.HasPrev(c)) {
      const int b = dx_sent++ % dx_buffers;
      if (dx_send[b].pending()) {  // the gradient sent from it before has left
        AddElapsed timed(&comm_seconds_);
        RETURN_IF_ERROR(dx_send[b].Wait());
      }
      const float* dx = runner.InputGradient();
      std::copy(dx, dx + n, send_dx_[b].begin());
      ASSIGN_OR_RETURN(dx_send[b],
                       pp_->ISend(send_dx_[b].data(), n, DType::kF32, prev,
                                  PipelineSchedule::Tag(j, schedule.PrevChunk(c), V, true)));
    }
    return Status::Ok();
  };
  Status status;
  for (const PipeTask& t : schedule.tasks()) {
    status = t.backward ? backward(t.micro_batch, t.chunk) : forward(t.micro_batch, t.chunk);
    if (!status.ok()) break;
  }
  AddElapsed timed(&comm_seconds_);
  const Status sends = WaitAll(slot_send);
  const Status dxs = WaitAll(dx_send);
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(sends);
  RETURN_IF_ERROR(dxs);
  return loss;
}

Status ParallelGpt::ReduceTiedEmbedding() {
  if (tied_ == nullptr) return Status::Ok();
  const ParamInfo* wte = model_.FindParam("wte");
  if (wte == nullptr) return InternalError("a first or last pipeline stage without wte");
  AddElapsed timed(&comm_seconds_);
  float* g = model_.grads().data() + wte->offset;
  return tied_->AllReduce(g, g, wte->numel, DType::kF32, ReduceOp::kSum);
}

Result<float> ParallelGpt::Step(const int32_t* tokens, const int32_t* targets, int B, int T,
                                const AdamWConfig& adam, float max_norm, float* norm) {
  const int dp = parallel_.dp;
  if (B % dp != 0) {
    return InvalidArgumentError("batch " + std::to_string(B) + " is not a multiple of dp " +
                                std::to_string(dp));
  }
  const int64_t first = static_cast<int64_t>(dp_rank_) * (B / dp) * T;
  return StepRows(tokens + first, targets + first, B, T, adam, max_norm, norm);
}

Result<float> ParallelGpt::StepRows(const int32_t* tokens, const int32_t* targets, int B, int T,
                                    const AdamWConfig& adam, float max_norm, float* norm) {
  if (parallel_.cp == 1) return StepLocal(tokens, targets, B, T, adam, max_norm, norm);
  // This rank's positions of each of its rows (StepLocal checks B and T;
  // the cut stays inside the rows either way).
  const SequenceSplit split = sequence_split(T);
  const int64_t rows = B / parallel_.dp, Tl = split.local();
  local_tokens_.resize(rows * Tl);
  local_targets_.resize(rows * Tl);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t at = r * Tl;
    for (const auto& [pos, n] : split.Runs()) {
      const int64_t from = r * T + pos;
      std::copy(tokens + from, tokens + from + n, local_tokens_.begin() + at);
      std::copy(targets + from, targets + from + n, local_targets_.begin() + at);
      at += n;
    }
  }
  return StepLocal(local_tokens_.data(), local_targets_.data(), B, T, adam, max_norm, norm);
}

Result<float> ParallelGpt::StepLocal(const int32_t* tokens, const int32_t* targets, int B, int T,
                                     const AdamWConfig& adam, float max_norm, float* norm) {
  const int dp = parallel_.dp;
  if (B % dp != 0) {
    return InvalidArgumentError("batch " + std::to_string(B) + " is not a multiple of dp " +
                                std::to_string(dp));
  }
  const int local = B / dp;
  if (local % micro_batches_ != 0) {
    return InvalidArgumentError("the " + std::to_string(local) + " rows of a dp rank are not a " +
                                "multiple of the " + std::to_string(micro_batches_) +
                                " micro-batches");
  }
  const int copies = parallel_.micro_batch_interleave;
  if (local / micro_batches_ % copies != 0) {
    return InvalidArgumentError(
        "micro_batch_interleave " + std::to_string(copies) + ": a micro-batch of " +
        std::to_string(local / micro_batches_) + " sequences per dp rank does not cut into " +
        std::to_string(copies) + " copies of whole sequences; use a batch of a multiple of " +
        std::to_string(dp * micro_batches_ * copies) + " sequences");
  }
  RETURN_IF_ERROR(CheckSequenceCut(parallel_.cp_algo, T, parallel_.cp, "h.0.attn.attention"));
  RETURN_IF_ERROR(ServersConnected("a step"));
  ReleaseOptimizerState();  // a save's copy of offloaded moments
  model_.ZeroGrad();
  // With parameter servers: the step begins there (the served embedding's
  // rows of these tokens fetched).
  const bool async = ps_ != nullptr && ps_->asynchronous();
  if (async) {
    RETURN_IF_ERROR(ps_->AwaitStale(model_));  // the weights K pushes old
  } else if (ps_ != nullptr) {
    RETURN_IF_ERROR(ps_->Begin(model_, tokens, static_cast<int64_t>(local) * T));
  }
  // The first step records the order the weights' units are needed in;
  // later steps read each one ahead in that order.
  const bool record = offload_weights_ != nullptr && !order_learned_;
  if (record) offload_weights_->BeginOrder();
  // Each rank runs its T / cp positions of every row.
  ASSIGN_OR_RETURN(double loss, RunPipeline(tokens, targets, local, T / parallel_.cp));
  loss /= micro_batches_;  // the mean over this rank's rows (last stage; 0 elsewhere)
  for (const auto& r : runners_) RETURN_IF_ERROR(r->ReduceParamGradients());
  RETURN_IF_ERROR(ReduceTiedEmbedding());
  RETURN_IF_ERROR(ReduceGradients());
  if (async) {
    // Its own loss and gradient: no collective among the workers.
    AddElapsed timed(&comm_seconds_);
    RETURN_IF_ERROR(ps_->PushAsync(model_, max_norm, norm));
    return static_cast<float>(loss);
  }
  if (ps_ != nullptr) {
    // The servers' parameters: pushed, clipped by the norm over everything,
    // updated there and pulled back; the rest updated here.
    {
      AddElapsed timed(&comm_seconds_);
      RETURN_IF_ERROR(data_->AllReduce(&loss, &loss, 1, DType::kF64, ReduceOp::kAvg));
    }
    AddElapsed timed(&comm_seconds_);
    return ps_->Exchange(model_, loss, adam, max_norm, norm);
  }
  double squared = 0;
  if (parallel_.zero == 1) {
    ASSIGN_OR_RETURN(squared, ShardedSquaredNorm());
  } else {
    squared = model_.GradSquaredNorm();  // the same on every dp replica
  }
  {
    AddElapsed timed(&comm_seconds_);
    RETURN_IF_ERROR(data_->AllReduce(&loss, &loss, 1, DType::kF64, ReduceOp::kAvg));
    if (parallel_.pp > 1 || parallel_.tp > 1) {
      // Only the last stage has a loss, the same on every tp rank; each
      // tp rank and stage holds its part of the squared norm.
      double both[2] = {comms_.coordinate("tp") == 0 ? loss : 0.0, squared};
      RETURN_IF_ERROR(tp_pp_->AllReduce(both, both, 2, DType::kF64, ReduceOp::kSum));
      loss = both[0];
      squared = both[1];
    }
  }
  const double total = std::sqrt(squared);
  if (norm != nullptr) *norm = static_cast<float>(total);
  const float clip = max_norm > 0 ? ClipFactor(total, max_norm) : 1.0f;
  TraceSpan span("optimizer", std::string(parallel_.zero == 0 ? "AdamW" : "AdamW (ZeRO-1 shard)") +
                                  (offload_ != nullptr ? ", offloaded" : ""));
  if (offload_ != nullptr) {
    RETURN_IF_ERROR(OffloadedUpdate(adam, clip));
    if (parallel_.zero == 1) {
      RETURN_IF_ERROR(offload_weights_ != nullptr ? GatherUnitWeights() : GatherShardWeights());
    }
  } else if (parallel_.zero == 0) {
    model_.ApplyUpdate(adam, clip);
  } else {
    RETURN_IF_ERROR(ShardedUpdate(adam, clip));
  }
  if (record) {
    offload_weights_->EndOrder();
    order_learned_ = true;
  }
  return static_cast<float>(loss);
}

Result<Strategy> ParallelGpt::strategy() const {
  if (ps_ != nullptr) {
    const PsProtocol& ps = ps_->protocol();
    return PsStrategy(model_.params(), ps.placement(), ps.servers() + ps.workers());
  }
  return StrategyOf(model_.config(), parallel_);
}

Status ParallelGpt::GatherOptimizerState() {
  RETURN_IF_ERROR(MaterializeOptimizerState());
  if (parallel_.zero == 0) return Status::Ok();
  const int64_t n = model_.num_params();
  model_.adam_m().assign(n, 0.0f);
  model_.adam_v().assign(n, 0.0f);
  for (const Shard& s : shards_) {
    float* m = model_.adam_m().data() + s.param->offset;
    float* v = model_.adam_v().data() + s.param->offset;
    RETURN_IF_ERROR(data_->AllGatherV(shard_m_.data() + s.offset, s.counts[data_rank_], m, s.counts,
                                      DType::kF32));
    RETURN_IF_ERROR(data_->AllGatherV(shard_v_.data() + s.offset, s.counts[data_rank_], v, s.counts,
                                      DType::kF32));
  }
  return Status::Ok();
}

Status ParallelGpt::GatherModel(Gpt* full) {
  Communicator& world = comms_.world();
  const int pp = parallel_.pp, tp = parallel_.tp;
  // The dp-rank-0 (and cp-rank-0) replica of every (stage, tp rank) sends
  // its slices; world rank 0 (stage 0, tp rank 0) places them into the
  // whole model.
  const bool representative = comms_.coordinate("dp") == 0 && cp_rank_ == 0;
  const int64_t n = model_.num_params();
  if (world.rank() != 0) {
    if (!representative) return Status::Ok();
    for (const std::vector<float>* v : {&model_.weights(), &model_.adam_m(), &model_.adam_v()}) {
      RETURN_IF_ERROR(world.Send(v->data(), n, DType::kF32, 0, 0));
    }
    return Status::Ok();
  }
  ASSIGN_OR_RETURN(*full, Gpt::Create(model_.config()));
  full->set_step(model_.step());
  std::vector<int64_t> coords(comms_.mesh().ndim(), 0);  // dp (and cp) 0
  const int pp_axis = comms_.mesh().FindAxis("pp"), tp_axis = comms_.mesh().FindAxis("tp");
  for (int s = 0; s < pp; ++s) {
    for (int t = 0; t < tp; ++t) {
      ASSIGN_OR_RETURN(std::vector<ParamInfo> params, Gpt::Params(model_.config(), Stage(s, t)));
      int64_t count = 0;
      for (const ParamInfo& p : params) count += p.numel;
      std::vector<float> w, m, v;
      if (s == 0 && t == 0) {
        w = model_.weights();
        m = model_.adam_m();
        v = model_.adam_v();
      } else {
        coords[pp_axis] = s;
        coords[tp_axis] = t;
        const int from = static_cast<int>(comms_.mesh().RankOf(coords));
        for (std::vector<float>* x : {&w, &m, &v}) {
          x->resize(count);
          RETURN_IF_ERROR(world.Recv(x->data(), count, DType::kF32, from, 0));
        }
      }
      if (m.size() != static_cast<size_t>(count) || v.size() != static_cast<size_t>(count)) {
        return FailedPreconditionError("GatherModel needs GatherOptimizerState first");
      }
      for (const ParamInfo& p : params) {
        if (p.tied_copy) continue;
        const ParamInfo* to = full->FindParam(p.name);
        if (to == nullptr)
          return InternalError("stage parameter '" + p.name + "' not in the model");
        const std::vector<int64_t> extents = p.box.extents();
        for (auto [from, into] :
             {std::pair{&w, &full->weights()}, {&m, &full->adam_m()}, {&v, &full->adam_v()}}) {
          CopyBox(from->data() + p.offset, extents, Box::FromShape(extents),
                  into->data() + to->offset, p.split_shape(), p.box, sizeof(float));
        }
      }
    }
  }
  return Status::Ok();
}

Status ParallelGpt::WriteSliced(SlicedCheckpointWriter& writer, const Strategy& strategy) {
  if (ps_ != nullptr) return ps_->WriteSliced(writer, strategy, model_);
  if (offload_ == nullptr || materialized_) {
    RETURN_IF_ERROR(MaterializeOptimizerState());
    ASSIGN_OR_RETURN(std::vector<LocalPiece> pieces, SlicedPieces(strategy, writer.Pieces()));
    for (const LocalPiece& p : pieces) RETURN_IF_ERROR(writer.WritePiece(p.tensor, p.box, p.data));
    return Status::Ok();
  }
  // From the offload tier, within its memory: each weight piece while its
  // unit is in memory, each moment piece streamed from the offload file.
  for (const PieceToWrite& piece : writer.Pieces()) {
    ASSIGN_OR_RETURN(const PieceSource src, Locate(strategy, piece));
    if (src.which == 0) {
      RETURN_IF_ERROR(model_.NeedWeights(src.param->unit));
      RETURN_IF_ERROR(
          writer.WritePiece(piece.tensor, piece.box, model_.weights().data() + src.begin));
      continue;
    }
    RETURN_IF_ERROR(writer.WritePieceFrom(
        piece.tensor, piece.box, [&](uint64_t offset, size_t n, void* out) -> Status {
          float* to = static_cast<float*>(out);
          if (moments_zero_) {  // not written yet: zero
            std::fill(to, to + n / sizeof(float), 0.0f);
            return Status::Ok();
          }
          return offload_->ReadOne(src.which - 1,
                                   src.begin + static_cast<int64_t>(offset / sizeof(float)),
                                   static_cast<int64_t>(n / sizeof(float)), to);
        }));
  }
  return Status::Ok();
}

Result<ParallelGpt::PieceSource> ParallelGpt::Locate(const Strategy& strategy,
                                                     const PieceToWrite& piece) const {
  const std::string& tensor = strategy.tensors()[piece.tensor].name;
  std::string name = tensor;
  int which = 0;  // 0 weights, 1 exp_avg, 2 exp_avg_sq
  if (name.starts_with("optimizer.")) {
    for (auto [suffix, w] : {std::pair{".exp_avg_sq", 2}, {".exp_avg", 1}}) {
      const std::string_view sv(suffix);
      if (which == 0 && name.ends_with(sv)) {
        which = w;
        name = name.substr(10, name.size() - 10 - sv.size());
      }
    }
  }
  const ParamInfo* p = model_.FindParam(name);
  if (p == nullptr || p->tied_copy) {
    return InternalError("sliced save: rank " + std::to_string(comms_.world().rank()) +
                         " holds no '" + tensor + "'");
  }
  PieceSource src{p, which, p->offset, p->numel};
  if (which == 0 || parallel_.zero == 0) {
    if (piece.box != p->box) src.count = -1;
  } else {
    const Shard& s = shards_[p - model_.params().data()];
    src.begin = s.offset;
    src.count = s.counts[data_rank_];
  }
  if (src.count != NumElements(piece.box)) {
    return InternalError("sliced save: '" + tensor + "' " + ToString(piece.box) +
                         " is not what rank " + std::to_string(comms_.world().rank()) + " holds");
  }
  return src;
}

Result<std::vector<LocalPiece>> ParallelGpt::SlicedPieces(
    const Strategy& strategy, const std::vector<PieceToWrite>& pieces) const {
  std::vector<LocalPiece> out;
  for (const PieceToWrite& piece : pieces) {
    ASSIGN_OR_RETURN(const PieceSource src, Locate(strategy, piece));
    // The moments: the model's, or this rank's ZeRO shard.
    const std::vector<float>& v = src.which == 0 ? model_.weights()
                                  : src.which == 1
                                      ? (parallel_.zero == 1 ? shard_m_ : model_.adam_m())
                                      : (parallel_.zero == 1 ? shard_v_ : model_.adam_v());
    out.push_back({piece.tensor, piece.box, v.data() + src.begin,
                   src.count * static_cast<int64_t>(sizeof(float))});
  }
  return out;
}

Status ParallelGpt::Load(const CheckpointReader& reader) {
  if (ps_ != nullptr) {
    // Every weight (the servers' are pulled each step, so the worker holds
    // them too), the moments of the workers' own.
    const int64_t served = ps_->protocol().served();
    for (size_t i = 0; i < model_.params().size(); ++i) {
      if (static_cast<int64_t>(i) == served) continue;  // fetched by rows each step
      const ParamInfo& p = model_.params()[i];
      RETURN_IF_ERROR(ReadGptRegion(reader, p.name, p, p.box, model_.weights().data() + p.offset));
    }
    model_.set_step(HasOptimizerState(reader) ? reader.meta().step : 0);
    return ps_->LoadMoments(reader, model_);
  }
  if (offload_ == nullptr) {
    RETURN_IF_ERROR(LoadGpt(reader, &model_));
    return ShardOptimizerState();
  }
  ReleaseOptimizerState();
  const std::vector<ParamInfo>& params = model_.params();
  // The weights, unit by unit (all at once when they are in memory).
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params[i];
    RETURN_IF_ERROR(model_.NeedWeights(p.unit, /*write=*/true));
    RETURN_IF_ERROR(ReadGptRegion(reader, p.name, p, p.box, model_.weights().data() + p.offset));
  }
  if (offload_weights_ != nullptr) RETURN_IF_ERROR(offload_weights_->Evict());
  const bool moments = HasOptimizerState(reader);
  model_.set_step(moments ? reader.meta().step : 0);
  moments_zero_ = !moments;  // an export: Adam starts afresh
  if (!moments) return Status::Ok();
  // The moments of this rank's rows (its ZeRO shard's), a block of rows at
  // a time into the file.
  constexpr int64_t kBlockBytes = int64_t{16} << 20;
  std::vector<float> rows;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params[i];
    const int64_t row = p.box[0].size() > 0 ? p.numel / p.box[0].size() : p.numel;
    int64_t first = 0, count = p.numel, at = p.offset;  // elements of the slice; file offset
    if (parallel_.zero == 1) {
      first = shards_[i].begin;
      count = shards_[i].counts[data_rank_];
      at = shards_[i].offset;
    }
    const int64_t block_rows = std::max<int64_t>(1, kBlockBytes / 4 / std::max<int64_t>(row, 1));
    for (int64_t r = first / row; r * row < first + count; r += block_rows) {
      Box region = p.box;
      const int64_t n_rows = std::min(block_rows, (first + count) / row - r);
      region[0] = {p.box[0].begin + r, p.box[0].begin + r + n_rows};
      rows.resize(n_rows * row);
      for (int which = 1; which <= 2; ++which) {
        const std::string name = "optimizer." + p.name + (which == 1 ? ".exp_avg" : ".exp_avg_sq");
        RETURN_IF_ERROR(ReadGptRegion(reader, name, p, region, rows.data()));
        RETURN_IF_ERROR(
            offload_->WriteOne(which - 1, at + (r * row - first), n_rows * row, rows.data()));
      }
    }
  }
  return Status::Ok();
}

Status ParallelGpt::ShardOptimizerState() {
  materialized_ = false;
  if (offload_weights_ != nullptr) RETURN_IF_ERROR(offload_weights_->StoreAll());
  if (parallel_.zero == 1) {
    shard_m_.resize(offload_ != nullptr ? offload_->floats() : shard_m_.size());
    shard_v_.resize(shard_m_.size());
    for (const Shard& s : shards_) {
      const int64_t n = s.counts[data_rank_];
      const float* m = model_.adam_m().data() + s.param->offset + s.begin;
      const float* v = model_.adam_v().data() + s.param->offset + s.begin;
      std::copy(m, m + n, shard_m_.data() + s.offset);
      std::copy(v, v + n, shard_v_.data() + s.offset);
    }
    Free({&model_.adam_m(), &model_.adam_v()});
  }
  if (offload_ == nullptr) return Status::Ok();
  // Offloaded: the loaded moments to the file, none kept.
  auto [m, v] = Moments();
  if (static_cast<int64_t>(m.size()) != offload_->floats() ||
      static_cast<int64_t>(v.size()) != offload_->floats()) {
    return FailedPreconditionError("optimizer offload: the loaded moments are " +
                                   std::to_string(m.size()) + " floats, the offload file holds " +
                                   std::to_string(offload_->floats()));
  }
  RETURN_IF_ERROR(offload_->Write(0, offload_->floats(), m.data(), v.data()));
  moments_zero_ = false;
  Free({&m, &v});
  return Status::Ok();
}

}  // namespace tessera
