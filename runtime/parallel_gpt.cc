#include "runtime/parallel_gpt.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "runtime/optim.h"

namespace tessera {
namespace {

// Adds the seconds of its lifetime to a counter.
class Timed {
 public:
  explicit Timed(double* total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~Timed() {
    *total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  double* total_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

Result<Mesh> ParallelConfig::MakeMesh() const {
  return Mesh::Create({"pp", "dp", "tp"}, {pp, dp, tp});
}

Status ParallelConfig::Validate(int world_size) const {
  if (dp < 1 || tp < 1 || pp < 1) return InvalidArgumentError("dp, tp and pp must be >= 1");
  if (static_cast<int64_t>(dp) * tp * pp != world_size) {
    return InvalidArgumentError("dp " + std::to_string(dp) + " x tp " + std::to_string(tp) +
                                " x pp " + std::to_string(pp) + " is not the " +
                                std::to_string(world_size) + " ranks started");
  }
  if (tp > 1 || pp > 1) {
    return UnimplementedError("tensor and pipeline parallelism (tp, pp > 1) are not built yet");
  }
  if (zero != 0 && zero != 1) return InvalidArgumentError("zero must be 0 or 1");
  if (bucket_bytes < 4) return InvalidArgumentError("the bucket size must be >= 4 bytes");
  return Status::Ok();
}

Result<std::unique_ptr<ParallelGpt>> ParallelGpt::Create(const GptConfig& config,
                                                         const ParallelConfig& parallel,
                                                         Communicator& world) {
  RETURN_IF_ERROR(parallel.Validate(world.size()));
  ASSIGN_OR_RETURN(Gpt model, Gpt::Create(config));
  ASSIGN_OR_RETURN(Mesh mesh, parallel.MakeMesh());
  ASSIGN_OR_RETURN(MeshCommunicators comms, MeshCommunicators::Create(world, mesh));
  std::unique_ptr<ParallelGpt> p(new ParallelGpt(std::move(model), parallel, std::move(comms)));
  RETURN_IF_ERROR(p->Build());
  return p;
}

Status ParallelGpt::Build() {
  ASSIGN_OR_RETURN(dp_, comms_.Along("dp"));
  dp_rank_ = dp_->rank();
  const int dp = parallel_.dp;
  const std::vector<ParamInfo>& params = model_.params();
  // ZeRO shards: dimension 0 of every parameter cut over dp as the
  // optimizer-state layout says (ShardGrid: the checkpoint's own rule).
  if (parallel_.zero == 1) {
    int64_t offset = 0;
    for (const ParamInfo& p : params) {
      Layout layout = Layout::Replicated(p.shape, DType::kF32);
      layout.opt_axes = {"dp"};
      ASSIGN_OR_RETURN(ShardGrid grid, ShardGrid::Create(comms_.mesh(), layout));
      const int64_t row = p.numel / std::max<int64_t>(1, p.shape[0]);
      Shard s{&p, grid.pieces(0)[dp_rank_].begin * row, {}, {}, offset};
      for (int r = 0; r < dp; ++r) {
        s.starts.push_back(grid.pieces(0)[r].begin * row);
        s.counts.push_back(grid.pieces(0)[r].size() * row);
      }
      offset += s.counts[dp_rank_];
      shards_.push_back(std::move(s));
    }
    shard_m_.assign(offset, 0.0f);
    shard_v_.assign(offset, 0.0f);
    model_.adam_m().clear();
    model_.adam_m().shrink_to_fit();
    model_.adam_v().clear();
    model_.adam_v().shrink_to_fit();
  }
  // Buckets of consecutive parameters, from the last (whose gradients the
  // backward pass finishes first) to the first.
  const int64_t bucket_floats = std::max<int64_t>(1, parallel_.bucket_bytes / 4);
  for (size_t i = params.size(); i-- > 0;) {
    if (buckets_.empty() || buckets_.back().end - buckets_.back().begin >= bucket_floats) {
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
  return Status::Ok();
}

void ParallelGpt::Init(uint64_t seed) {
  model_.Init(seed);
  if (parallel_.zero == 1) {
    std::fill(shard_m_.begin(), shard_m_.end(), 0.0f);
    std::fill(shard_v_.begin(), shard_v_.end(), 0.0f);
    model_.adam_m().clear();
    model_.adam_v().clear();
  }
}

Status ParallelGpt::ReduceGradients() {
  Timed timed(&comm_seconds_);
  float* grads = model_.grads().data();
  const int dp = parallel_.dp;
  for (const Bucket& b : buckets_) {
    if (parallel_.zero == 0) {
      RETURN_IF_ERROR(dp_->AllReduce(grads + b.begin, grads + b.begin, b.end - b.begin,
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
    RETURN_IF_ERROR(dp_->ReduceScatter(send_.data(), recv_.data(), b.max_count, DType::kF32,
                                       ReduceOp::kAvg));
    const float* in = recv_.data();
    for (size_t i : b.params) {
      const Shard& s = shards_[i];
      std::copy(in, in + s.counts[dp_rank_], grads + s.param->offset + s.begin);
      in += s.counts[dp_rank_];
    }
  }
  return Status::Ok();
}

Result<double> ParallelGpt::ShardedSquaredNorm() {
  double sum = 0;
  for (const Shard& s : shards_) {
    sum += SquaredNorm(model_.grads().data() + s.param->offset + s.begin, s.counts[dp_rank_]);
  }
  Timed timed(&comm_seconds_);
  RETURN_IF_ERROR(dp_->AllReduce(&sum, &sum, 1, DType::kF64, ReduceOp::kSum));
  return sum;
}

Status ParallelGpt::ShardedUpdate(const AdamWConfig& adam, float clip) {
  float* weights = model_.weights().data();
  float* grads = model_.grads().data();
  model_.set_step(model_.step() + 1);
  for (const Shard& s : shards_) {
    const int64_t n = s.counts[dp_rank_];
    float* g = grads + s.param->offset + s.begin;
    if (clip != 1.0f) Scale(g, n, clip);
    AdamWUpdate(weights + s.param->offset + s.begin, g, shard_m_.data() + s.offset,
                shard_v_.data() + s.offset, n, model_.step(), adam, s.param->decay);
  }
  // Everyone's new rows to everyone, bucket by bucket.
  Timed timed(&comm_seconds_);
  const int dp = parallel_.dp;
  for (const Bucket& b : buckets_) {
    float* out = send_.data();
    for (size_t i : b.params) {
      const Shard& s = shards_[i];
      const float* w = weights + s.param->offset + s.begin;
      out = std::copy(w, w + s.counts[dp_rank_], out);
    }
    RETURN_IF_ERROR(dp_->AllGather(send_.data(), b.max_count, recv_.data(), DType::kF32));
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

Result<float> ParallelGpt::Step(const int32_t* tokens, const int32_t* targets, int B, int T,
                                const AdamWConfig& adam, float max_norm, float* norm) {
  const int dp = parallel_.dp;
  if (B % dp != 0) {
    return InvalidArgumentError("batch " + std::to_string(B) + " is not a multiple of dp " +
                                std::to_string(dp));
  }
  const int local = B / dp;
  const int64_t first = static_cast<int64_t>(dp_rank_) * local * T;
  ASSIGN_OR_RETURN(float local_loss, model_.Forward(tokens + first, targets + first, local, T));
  model_.ZeroGrad();
  RETURN_IF_ERROR(model_.Backward());
  RETURN_IF_ERROR(ReduceGradients());
  double loss = local_loss;
  {
    Timed timed(&comm_seconds_);
    RETURN_IF_ERROR(dp_->AllReduce(&loss, &loss, 1, DType::kF64, ReduceOp::kAvg));
  }
  if (parallel_.zero == 0) {
    const float n = model_.Update(adam, max_norm);
    if (norm != nullptr) *norm = n;
    return static_cast<float>(loss);
  }
  ASSIGN_OR_RETURN(double squared, ShardedSquaredNorm());
  const double total = std::sqrt(squared);
  if (norm != nullptr) *norm = static_cast<float>(total);
  RETURN_IF_ERROR(ShardedUpdate(adam, max_norm > 0 ? ClipFactor(total, max_norm) : 1.0f));
  return static_cast<float>(loss);
}

Result<Strategy> ParallelGpt::strategy() const {
  Strategy strategy(comms_.mesh());
  for (const ParamInfo& p : model_.params()) {
    RETURN_IF_ERROR(strategy.Add({p.name, Layout::Replicated(p.shape, DType::kF32)}));
  }
  for (const ParamInfo& p : model_.params()) {
    Layout layout = Layout::Replicated(p.shape, DType::kF32);
    if (parallel_.zero == 1) layout.opt_axes = {"dp"};
    RETURN_IF_ERROR(strategy.Add({"optimizer." + p.name + ".exp_avg", layout}));
    RETURN_IF_ERROR(strategy.Add({"optimizer." + p.name + ".exp_avg_sq", layout}));
  }
  return strategy;
}

Status ParallelGpt::GatherOptimizerState() {
  if (parallel_.zero == 0) return Status::Ok();
  const int64_t n = model_.num_params();
  model_.adam_m().assign(n, 0.0f);
  model_.adam_v().assign(n, 0.0f);
  for (const Shard& s : shards_) {
    float* m = model_.adam_m().data() + s.param->offset;
    float* v = model_.adam_v().data() + s.param->offset;
    RETURN_IF_ERROR(dp_->AllGatherV(shard_m_.data() + s.offset, s.counts[dp_rank_], m, s.counts,
                                    DType::kF32));
    RETURN_IF_ERROR(dp_->AllGatherV(shard_v_.data() + s.offset, s.counts[dp_rank_], v, s.counts,
                                    DType::kF32));
  }
  return Status::Ok();
}

void ParallelGpt::ShardOptimizerState() {
  if (parallel_.zero == 0) return;
  for (const Shard& s : shards_) {
    const int64_t n = s.counts[dp_rank_];
    const float* m = model_.adam_m().data() + s.param->offset + s.begin;
    const float* v = model_.adam_v().data() + s.param->offset + s.begin;
    std::copy(m, m + n, shard_m_.data() + s.offset);
    std::copy(v, v + n, shard_v_.data() + s.offset);
  }
  model_.adam_m().clear();
  model_.adam_m().shrink_to_fit();
  model_.adam_v().clear();
  model_.adam_v().shrink_to_fit();
}

}  // namespace tessera
