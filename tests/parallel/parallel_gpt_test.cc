// Data parallelism and ZeRO-1 against the single-process reference: the same
// initial weights and global batches for 20 steps must give the same losses
// (1e-5 relative per step) and final parameters (1e-5 relative norm), every
// replica must end bitwise identical, and the optimizer-state layouts are
// the ones a checkpoint records.
#include "runtime/parallel_gpt.h"

#include <cmath>
#include <mutex>
#include <random>

#include <catch2/catch.hpp>

#include "runtime/comm/inprocess.h"
#include "runtime/kernels.h"

namespace tessera {
namespace {

const GptConfig kConfig{.layers = 2, .heads = 2, .embed = 16, .context = 16, .vocab = 64};
constexpr int kB = 8, kT = 16, kSteps = 20;
const AdamWConfig kAdam{.lr = 3e-3f, .weight_decay = 0.1f};
constexpr float kMaxNorm = 0.5f;  // small enough that clipping happens

struct Run {
  std::vector<float> losses, norms, weights, m, v;
};

// The batches of every step, the same for every configuration: rows that
// count up by 3 from a random start (targets: the next token), learnable.
std::vector<int32_t> Batch(int step, int which) {
  std::mt19937 rng(1000 + step);
  std::vector<int32_t> t(kB * kT);
  for (int b = 0; b < kB; ++b) {
    const int start = static_cast<int>(rng() % kConfig.vocab) + which * 3;
    for (int i = 0; i < kT; ++i) t[b * kT + i] = (start + 3 * i) % kConfig.vocab;
  }
  return t;
}

Run Reference() {
  auto g = Gpt::Create(kConfig);
  g->Init(42);
  Run run;
  for (int step = 0; step < kSteps; ++step) {
    const auto tokens = Batch(step, 0), targets = Batch(step, 1);
    run.losses.push_back(*g->Forward(tokens.data(), targets.data(), kB, kT));
    g->ZeroGrad();
    REQUIRE(g->Backward().ok());
    run.norms.push_back(g->Update(kAdam, kMaxNorm));
  }
  run.weights = g->weights();
  run.m = g->adam_m();
  run.v = g->adam_v();
  return run;
}

double RelativeNorm(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    ref += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / ref);
}

Run Parallel(const ParallelConfig& config, int ranks) {
  Run run;
  std::vector<std::vector<float>> finals(ranks);
  std::mutex mu;
  const Status s = RunInProcess(ranks, [&](Communicator& world) -> Status {
    ASSIGN_OR_RETURN(std::unique_ptr<ParallelGpt> p, ParallelGpt::Create(kConfig, config, world));
    p->Init(42);
    for (int step = 0; step < kSteps; ++step) {
      const auto tokens = Batch(step, 0), targets = Batch(step, 1);
      float norm = 0;
      ASSIGN_OR_RETURN(float loss, p->Step(tokens.data(), targets.data(), kB, kT, kAdam,
                                           kMaxNorm, &norm));
      if (world.rank() == 0) {
        run.losses.push_back(loss);
        run.norms.push_back(norm);
      }
    }
    RETURN_IF_ERROR(p->GatherOptimizerState());
    std::lock_guard<std::mutex> lock(mu);
    finals[world.rank()] = p->model().weights();
    if (world.rank() == 0) {
      run.weights = p->model().weights();
      run.m = p->model().adam_m();
      run.v = p->model().adam_v();
    }
    return Status::Ok();
  });
  REQUIRE(s.ok());
  for (int r = 1; r < ranks; ++r) CHECK(finals[r] == finals[0]);  // replicas identical
  return run;
}

void Compare(const Run& got, const Run& want) {
  REQUIRE(got.losses.size() == want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    INFO("step " << i << ": loss " << got.losses[i] << " vs " << want.losses[i]);
    CHECK(std::fabs(got.losses[i] - want.losses[i]) <= 1e-5 * std::fabs(want.losses[i]));
    CHECK(got.norms[i] == Approx(want.norms[i]).epsilon(1e-5));
  }
  CHECK(RelativeNorm(got.weights, want.weights) < 1e-5);
  CHECK(RelativeNorm(got.m, want.m) < 1e-5);
  CHECK(RelativeNorm(got.v, want.v) < 1e-4);
}

TEST_CASE("data parallel and ZeRO-1 reproduce the single-process run") {
  kernels::SetComputeThreads(1);
  const Run reference = Reference();
  CHECK(reference.losses.back() < reference.losses.front());
  for (int dp : {2, 4}) {
    for (int zero : {0, 1}) {
      for (int64_t bucket : {int64_t{4096}, int64_t{25} << 20}) {  // many buckets, one
        DYNAMIC_SECTION("dp" << dp << " zero" << zero << " bucket " << bucket) {
          Compare(Parallel({.dp = dp, .zero = zero, .bucket_bytes = bucket}, dp), reference);
        }
      }
    }
  }
}

TEST_CASE("parallel GPT: layouts are queryable, bad configurations are refused") {
  const Status s = RunInProcess(2, [&](Communicator& world) -> Status {
    ASSIGN_OR_RETURN(auto p, ParallelGpt::Create(kConfig, {.dp = 2, .zero = 1}, world));
    ASSIGN_OR_RETURN(Strategy strategy, p->strategy());
    const TensorStrategy* wte = strategy.Find("wte");
    const TensorStrategy* m = strategy.Find("optimizer.h.1.mlp.c_fc.weight.exp_avg");
    if (wte == nullptr || m == nullptr) return InternalError("tensors missing from the strategy");
    if (!wte->layout.opt_axes.empty() || m->layout.opt_axes != std::vector<std::string>{"dp"}) {
      return InternalError("unexpected layouts: " + ToString(wte->layout) + " / " +
                           ToString(m->layout));
    }
    if (strategy.mesh().ToString() != Mesh::Parse("pp=1,dp=2,tp=1")->ToString()) {
      return InternalError("mesh " + strategy.mesh().ToString());
    }
    const auto odd = p->Step(Batch(0, 0).data(), Batch(0, 1).data(), 3, kT, kAdam, 0, nullptr);
    if (odd.ok() || odd.status().message().find("multiple of dp 2") == std::string::npos) {
      return InternalError("a batch of 3 over dp 2 was not refused");
    }
    return Status::Ok();
  });
  CHECK(s.ok());
  const Status wrong = RunInProcess(2, [&](Communicator& world) -> Status {
    return ParallelGpt::Create(kConfig, {.dp = 4}, world).status();
  });
  CHECK_THAT(wrong.message(), Catch::Contains("is not the 2 ranks"));
}

}  // namespace
}  // namespace tessera
