#include "runtime/cost/stage_cost.h"

#include <algorithm>

#include "runtime/parallel/pipeline.h"

namespace tessera {
namespace {

// Elements of `p`'s ZeRO-1 shard on a rank: ceil(rows / dp) of its rows.
int64_t ShardOf(const ParamShape& p, int dp) {
  const int64_t row = p.rows > 0 ? p.numel / p.rows : 0;
  return (p.rows + dp - 1) / dp * row;
}

// The buckets as they fill, parameter by parameter.
class BucketCounter {
 public:
  BucketCounter(ParamStats* s, int dp, int zero, int64_t bucket_bytes)
      : s_(s), dp_(dp), zero_(zero), bucket_floats_(std::max<int64_t>(1, bucket_bytes / 4)) {}
  void Visit(const ParamShape& p) {
    const int64_t sh = ShardOf(p, dp_);
    s_->floats += p.numel;
    s_->zero_shard += sh;
    if (s_->buckets == 0 || size_ >= bucket_floats_) {
      ++s_->buckets;
      size_ = count_ = 0;
    }
    size_ += p.numel;
    count_ += zero_ == 1 ? sh : p.numel;
    s_->largest_bucket = std::max(s_->largest_bucket, count_);
  }
  void VisitBackwards(const std::vector<ParamShape>& params) {
    for (auto it = params.rbegin(); it != params.rend(); ++it) Visit(*it);
  }

 private:
  ParamStats* s_;
  const int dp_, zero_;
  const int64_t bucket_floats_;
  int64_t size_ = 0, count_ = 0;
};

// The gradients' sums once a step: over dp bucket by bucket, the partial
// gradients over tp, the tied parameter between the end stages.
double GradientSumSeconds(std::span<const StageWork> chunks, const ParamStats& ps,
                          const StepShape& shape, int s, const MachineProfile& prof) {
  const int pp = shape.pp, dp = shape.dp, tp = shape.tp;
  const bool dp_inter = prof.CrossesHosts(tp, dp);
  const double grad_bytes = 4.0 * ps.floats,
               per_bucket = grad_bytes / std::max<int64_t>(1, ps.buckets);
  double t;
  if (shape.zero == 1) {
    t = ps.buckets *
        (prof.CollectiveSeconds(CollectiveKind::kReduceScatter, per_bucket, dp, dp_inter) +
         prof.CollectiveSeconds(CollectiveKind::kAllGather, per_bucket, dp, dp_inter));
  } else {
    t = ps.buckets * prof.CollectiveSeconds(CollectiveKind::kAllReduce, per_bucket, dp, dp_inter);
  }
  // The partial gradients' sum over tp: packed into one buffer, summed in
  // place, unpacked (OpGpt::ReduceParamGradients: each float read and
  // written twice).
  // (Each chunk's operators sum their own.)
  for (const StageWork& w : chunks) {
    if (tp > 1 && w.tp_sum_floats > 0) {
      t += prof.CollectiveSeconds(CollectiveKind::kAllReduce, 4.0 * w.tp_sum_floats, tp,
                                  prof.CrossesHosts(1, tp)) +
           prof.ComputeSeconds(0, 16.0 * static_cast<double>(w.tp_sum_floats));
    }
  }
  if (pp > 1 && (s == 0 || s == pp - 1)) {
    t += prof.CollectiveSeconds(CollectiveKind::kAllReduce, 4.0 * ps.tied, 2,
                                prof.CrossesHosts(static_cast<int64_t>(pp - 1) * dp * tp, 2));
  }
  return t;
}

// AdamW reads parameters, gradients and both moments and writes three;
// the gradients' squared norm reads them once more. Under ZeRO-1 the
// buckets are packed and unpacked around both collectives (read + write of
// every gradient into the send buffer and of the rank's averaged rows
// back; of the rank's new rows out and everyone's back in). The gradients
// are zeroed once a step.
//
// Offloaded, the moments stream through the update from the disk (each
// read and written once): the pass takes the longer of the arithmetic and
// the disk's time for them. The weights' units are read in the forward,
// the backward and the update and written after it (under ZeRO-1 read and
// written once more for the gather): priced whole, as not hidden, for on
// this runtime's CPUs the I/O threads' copies and page refills compete
// with the compute they would hide under.
double UpdateSeconds(const ParamStats& ps, const StepShape& shape, const MachineProfile& prof) {
  const int zero = shape.zero;
  const OptimizerUnits units = OptimizerUnitsOf(ps, zero);
  const double packing = zero == 1 ? 16.0 * static_cast<double>(ps.floats) + 16.0 * units.adamw : 0;
  double t = prof.KernelSeconds(Kernel::kAdamW, units.adamw) +
             prof.KernelSeconds(Kernel::kSquaredNorm, units.norm) +
             prof.ComputeSeconds(0, packing + 4.0 * static_cast<double>(ps.floats));
  if (shape.offload_optimizer) {
    const double moments = 8.0 * units.adamw;
    t = std::max(t, prof.DiskSeconds(moments, moments));
  }
  if (shape.offload_params) {
    const double w = 4.0 * static_cast<double>(ps.floats);
    t += prof.DiskSeconds((zero == 1 ? 4 : 3) * w, (zero == 1 ? 2 : 1) * w);
  }
  return t;
}

MemoryUse StageMemory(std::span<const StageWork> chunks, const ParamStats& ps,
                      const StepShape& shape, int s, int64_t act_bytes) {
  const int pp = shape.pp, m = shape.micro_batches, v = static_cast<int>(chunks.size());
  MemoryUse mem;
  mem.parameters = mem.gradients = 4 * ps.floats;
  const int64_t held = shape.zero == 1 ? ps.zero_shard : ps.floats;
  mem.optimizer = 8 * held;
  if (shape.offload_optimizer) {  // OffloadedMoments: up to three buckets of m and v
    const int64_t bucket = OffloadBucketFloats(held, shape.offload_bucket_floats);
    mem.optimizer = std::clamp<int64_t>((held + bucket - 1) / bucket, 1, 3) * 8 * bucket;
    mem.offloaded_optimizer = 8 * held;
  }
  if (shape.offload_params) {  // OffloadedWeights: three units and two transfer buffers
    mem.parameters = 4 * ps.offload_resident + 2 * OffloadBufferBytes(ps.floats);
    mem.offloaded_parameters = 4 * ps.floats;
  }
  if (v == 1) {  // 1F1B: pp - s in flight (the search's hot path looks up no schedule)
    mem.activations = std::min(m, pp - s) * chunks[0].slot_bytes + chunks[0].shared_bytes();
  } else {
    const PipelineSchedule& schedule = PipelineSchedules(pp, m, v)[s];
    for (int c = 0; c < v; ++c) {
      mem.activations += schedule.in_flight(c) * chunks[c].slot_bytes + chunks[c].shared_bytes();
    }
  }
  if (shape.tp > 1) {
    for (const StageWork& w : chunks) mem.communication += 4 * w.tp_sum_floats;
  }
  if (shape.zero == 1) mem.communication += 2 * 4 * ps.largest_bucket * shape.dp;
  for (const StageWork& w : chunks) mem.communication += w.cp_buffer_bytes;
  if (PipelineSchedule::Receives(s, v)) {
    mem.communication += act_bytes * (1 + DxSendBuffers(m * v));
  }
  if (PipelineSchedule::Sends(pp, s, v)) mem.communication += act_bytes;
  return mem;
}

}  // namespace

int64_t OffloadBucketFloats(int64_t held, int64_t bucket_floats) {
  constexpr int64_t kBlock = 1024;  // floats of a 4 KiB direct-I/O block
  const int64_t b = std::min(std::max<int64_t>(bucket_floats, 1), std::max<int64_t>(held, 1));
  return (b + kBlock - 1) / kBlock * kBlock;
}

int64_t OffloadBufferBytes(int64_t floats) {
  constexpr int64_t kChunk = int64_t{4} << 20, kAlign = 4096;
  const int64_t bytes =
      std::min(kChunk, std::max((4 * floats + kAlign - 1) / kAlign * kAlign, kAlign));
  return bytes;
}

ParamStats StatsOfParts(const ParamParts& parts, int blocks, int dp, int zero,
                        int64_t bucket_bytes) {
  ParamStats s;
  s.tied = parts.tied;
  BucketCounter buckets(&s, dp, zero, bucket_bytes);
  buckets.VisitBackwards(parts.after);
  for (int i = 0; i < blocks; ++i) buckets.VisitBackwards(parts.block);
  buckets.VisitBackwards(parts.before);
  // The clipping norm skips the tied copy (counted on the first stage).
  s.norm_skip = zero == 1 ? ShardOf(parts.tied_copy, dp) : parts.tied_copy.numel;
  std::vector<int64_t> units = parts.unit_floats;
  if (units.empty()) {
    auto sum = [](const std::vector<ParamShape>& v) {
      int64_t n = 0;
      for (const ParamShape& p : v) n += p.numel;
      return n;
    };
    if (const int64_t ends = sum(parts.before) + sum(parts.after); ends > 0) units.push_back(ends);
    units.insert(units.end(), std::min(blocks, 3), sum(parts.block));
  }
  std::sort(units.begin(), units.end(), std::greater<>());
  for (size_t i = 0; i < std::min<size_t>(3, units.size()); ++i) s.offload_resident += units[i];
  return s;
}

OptimizerUnits OptimizerUnitsOf(const ParamStats& ps, int zero) {
  const double held = static_cast<double>(zero == 1 ? ps.zero_shard : ps.floats);
  return {held, held - static_cast<double>(ps.norm_skip)};
}

double ExposedTpComm(double compute, double comm, int copies) {
  if (copies <= 1) return comm;
  return comm - std::min(compute, comm) * (copies - 1) / copies;
}

StageCost CostOf(const StageWork& w, const ParamStats& ps, const StepShape& shape, int s,
                 int64_t act_bytes, const MachineProfile& prof) {
  return CostOf(std::span<const StageWork>(&w, 1), ps, shape, s, act_bytes, prof);
}

StageCost CostOf(std::span<const StageWork> chunks, const ParamStats& ps, const StepShape& shape,
                 int s, int64_t act_bytes, const MachineProfile& prof) {
  StageCost c;
  const int pp = shape.pp, v = static_cast<int>(chunks.size());
  const bool pp_inter = prof.CrossesHosts(static_cast<int64_t>(shape.dp) * shape.tp, 2);
  const double transfer = prof.CollectiveSeconds(CollectiveKind::kSendRecv, act_bytes, 2, pp_inter);
  for (int k = 0; k < v; ++k) {
    const double compute = ComputeSeconds(chunks[k], prof);
    double tp_comm =
        ExposedTpComm(compute, GroupCommSeconds(chunks[k], prof, shape.tp), shape.copies);
    if (shape.copies > 1) {  // each copy's collective: its turn handed on and taken back
      for (int n : chunks[k].comm_count) tp_comm += n * prof.copy_turn_s;
    }
    const double cp_comm = CpCommSeconds(chunks[k], prof, shape.cp, shape.tp);
    tp_comm += cp_comm;
    c.cp_comm += cp_comm;
    const int vs = k * pp + s;  // a transfer each way per neighbour virtual stage
    double pp_comm = 0;
    if (vs < pp * v - 1) pp_comm += transfer;
    if (vs > 0) pp_comm += transfer;
    c.compute += compute;
    c.tp_comm += tp_comm;
    c.pp_comm += pp_comm;
    if (v > 1) {  // one chunk: the stage's own figures (the search's hot path allocates none)
      c.chunk_compute.push_back(compute);
      c.chunk_comm.push_back(tp_comm + pp_comm);
    }
  }
  c.micro = c.compute + c.tp_comm + c.pp_comm;
  c.dp_comm = GradientSumSeconds(chunks, ps, shape, s, prof);
  c.optimizer = UpdateSeconds(ps, shape, prof);
  c.after = c.dp_comm + c.optimizer;
  c.memory = StageMemory(chunks, ps, shape, s, act_bytes);
  return c;
}

}  // namespace tessera
