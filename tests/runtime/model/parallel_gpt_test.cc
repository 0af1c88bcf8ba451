// Data, tensor, pipeline and optimizer parallelism against the single-process
// reference: the same initial weights and global batches for 20 steps must
// give the same losses (1e-5 relative per step) and final parameters (1e-5
// relative norm), every replica of a tensor (and the last stage's copy of
// the tied embedding) must end bitwise identical, and the layouts are the
// ones a checkpoint records. Tensor-parallel slices are put together by
// the boxes their ParamInfo gives.
#include "runtime/model/parallel_gpt.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <mutex>
#include <random>

#include "ckpt/mindspore.h"
#include "runtime/comm/inprocess.h"
#include "runtime/kernels.h"

namespace tessera {
namespace {

const GptConfig kConfig{.layers = 4, .heads = 4, .embed = 16, .context = 16, .vocab = 64};
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

// A tensor's final values on every rank that holds it, by name, with the
// box of the whole tensor they are; the last stage's tied copy of wte
// under "wte (tied copy)".
struct Held {
  Box box;
  std::vector<float> w, m, v;
};

Run Parallel(const ParallelConfig& config, int ranks, MemoryUse* memory = nullptr) {
  Run run;
  std::multimap<std::string, Held> held;
  std::mutex mu;
  const Status s = RunInProcess(ranks, [&](Communicator& world) -> Status {
    ASSIGN_OR_RETURN(std::unique_ptr<ParallelGpt> p, ParallelGpt::Create(kConfig, config, world));
    RETURN_IF_ERROR(p->Init(42));
    for (int step = 0; step < kSteps; ++step) {
      const auto tokens = Batch(step, 0), targets = Batch(step, 1);
      float norm = 0;
      ASSIGN_OR_RETURN(float loss,
                       p->Step(tokens.data(), targets.data(), kB, kT, kAdam, kMaxNorm, &norm));
      if (world.rank() == 0) {
        run.losses.push_back(loss);
        run.norms.push_back(norm);
      }
    }
    if (memory != nullptr && world.rank() == 0) *memory = p->Memory();
    RETURN_IF_ERROR(p->GatherOptimizerState());
    const Gpt& g = p->model();
    std::lock_guard<std::mutex> lock(mu);
    for (const ParamInfo& info : g.params()) {
      auto cut = [&](const std::vector<float>& v) {
        return std::vector<float>(v.begin() + info.offset, v.begin() + info.offset + info.numel);
      };
      held.emplace(info.tied_copy ? info.name + " (tied copy)" : info.name,
                   Held{info.box, cut(g.weights()), cut(g.adam_m()), cut(g.adam_v())});
    }
    return Status::Ok();
  });
  INFO(s.ToString());
  REQUIRE(s.ok());
  // Every parameter, assembled in the single-process order from its
  // slices; every copy of a slice (dp replicas, the tied copy) identical.
  auto whole = Gpt::Create(kConfig);
  for (const ParamInfo& info : whole->params()) {
    INFO(info.name);
    auto [begin, end] = held.equal_range(info.name);
    REQUIRE(begin != end);
    const std::vector<int64_t> shape =
        info.full_shape.size() == 2 && info.name.ends_with("c_attn.weight")
            ? std::vector<int64_t>{info.full_shape[0], 3, info.full_shape[1] / 3}
        : info.name.ends_with("c_attn.bias") ? std::vector<int64_t>{3, info.full_shape[0] / 3}
                                             : info.full_shape;
    std::vector<float> w(info.numel), m(info.numel), v(info.numel);
    std::vector<const Held*> firsts;  // one per distinct box
    int64_t covered = 0;
    for (auto it = begin; it != end; ++it) {
      const Held& h = it->second;
      // A slice over the plain shape (tp = 1) is re-read over the view.
      const Box box =
          h.box.rank() == static_cast<int>(shape.size()) ? h.box : Box::FromShape(shape);
      const Held* first = nullptr;
      for (const Held* f : firsts) {
        if (f->box == h.box) first = f;
      }
      if (first != nullptr) {  // a replica
        CHECK(h.w == first->w);
        CHECK(h.m == first->m);
        continue;
      }
      firsts.push_back(&h);
      covered += NumElements(box);
      const std::vector<int64_t> extents = box.extents();
      for (auto [from, into] : {std::pair{&h.w, &w}, {&h.m, &m}, {&h.v, &v}}) {
        CopyBox(from->data(), extents, Box::FromShape(extents), into->data(), shape, box,
                sizeof(float));
      }
    }
    CHECK(covered == info.numel);
    if (config.pp > 1 && info.name == "wte") {
      auto copy = held.equal_range("wte (tied copy)");
      REQUIRE(copy.first != copy.second);
      for (auto it = copy.first; it != copy.second; ++it) {
        for (const Held* f : firsts) {
          if (f->box == it->second.box) CHECK(it->second.w == f->w);
        }
      }
    }
    run.weights.insert(run.weights.end(), w.begin(), w.end());
    run.m.insert(run.m.end(), m.begin(), m.end());
    run.v.insert(run.v.end(), v.begin(), v.end());
  }
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
  CHECK(RelativeNorm(got.v, want.v) < 1e-5);
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

TEST_CASE("pipeline parallel (1F1B), with dp and ZeRO-1, reproduces the single-process run") {
  kernels::SetComputeThreads(1);
  const Run reference = Reference();
  struct Config {
    int pp, dp, zero, micro;
  };
  // micro 0: as many micro-batches as stages; 8 / dp: one row each.
  for (const Config c : {Config{2, 1, 0, 0}, Config{2, 1, 1, 0}, Config{2, 1, 0, 8},
                         Config{4, 1, 0, 0}, Config{4, 1, 0, 2}, Config{2, 2, 0, 0},
                         Config{2, 2, 1, 4}, Config{4, 2, 1, 0}, Config{4, 1, 1, 0}}) {
    DYNAMIC_SECTION("pp" << c.pp << " dp" << c.dp << " zero" << c.zero << " micro-batches "
                         << c.micro) {
      Compare(Parallel({.dp = c.dp,
                        .pp = c.pp,
                        .zero = c.zero,
                        .micro_batches = c.micro,
                        .bucket_bytes = 4096},
                       c.pp * c.dp),
              reference);
    }
  }
}

TEST_CASE("tensor parallel (Megatron), with dp, pp and ZeRO-1, reproduces the single-process run") {
  kernels::SetComputeThreads(1);
  const Run reference = Reference();
  struct Config {
    int tp, dp, pp, zero;
  };
  // Every configuration of the issue's list with and without ZeRO-1 (over
  // dp = 1 it runs the sharded update on whole tensors).
  for (const Config c :
       {Config{2, 1, 1, 0}, Config{2, 1, 1, 1}, Config{4, 1, 1, 0}, Config{4, 1, 1, 1},
        Config{2, 2, 1, 0}, Config{2, 2, 1, 1}, Config{4, 2, 1, 1}, Config{2, 1, 2, 0},
        Config{2, 1, 2, 1}, Config{2, 2, 2, 0}, Config{2, 2, 2, 1}, Config{4, 1, 2, 0}}) {
    DYNAMIC_SECTION("tp" << c.tp << " dp" << c.dp << " pp" << c.pp << " zero" << c.zero) {
      Compare(Parallel({.dp = c.dp, .tp = c.tp, .pp = c.pp, .zero = c.zero, .bucket_bytes = 4096},
                       c.tp * c.dp * c.pp),
              reference);
    }
  }
}

TEST_CASE("interleaved pipeline (virtual stages), with tp, SP, dp and ZeRO-1, reproduces the run") {
  kernels::SetComputeThreads(1);
  const Run reference = Reference();
  struct Config {
    int pp, v, tp, dp, zero, micro;
    bool sp;
  };
  // 4 layers: pp2 x 2 chunks of one layer (stage 0 holds h.0 and h.2).
  for (const Config c : {Config{2, 2, 1, 1, 0, 2, false}, Config{2, 2, 1, 1, 0, 4, false},
                         Config{2, 2, 1, 1, 0, 8, false}, Config{2, 2, 2, 1, 0, 4, false},
                         Config{2, 2, 2, 1, 1, 2, true}, Config{2, 2, 1, 2, 1, 2, false},
                         Config{2, 2, 1, 2, 1, 4, false}, Config{2, 2, 2, 2, 1, 4, true}}) {
    DYNAMIC_SECTION("pp" << c.pp << " V" << c.v << " tp" << c.tp << (c.sp ? "+SP" : "") << " dp"
                         << c.dp << " zero" << c.zero << " micro-batches " << c.micro) {
      Compare(Parallel({.dp = c.dp,
                        .tp = c.tp,
                        .pp = c.pp,
                        .zero = c.zero,
                        .micro_batches = c.micro,
                        .bucket_bytes = 4096,
                        .virtual_stages = c.v,
                        .sequence_parallel = c.sp},
                       c.pp * c.tp * c.dp),
              reference);
    }
  }
  // Each parameter's gradient sums its micro-batches in the same order
  // with and without chunks (each chunk runs its backwards in micro-batch
  // order), and the same operators run: bit for bit the same step.
  SECTION("every parameter's layout records the stage that holds its chunk") {
    const Status s = RunInProcess(2, [&](Communicator& world) -> Status {
      ASSIGN_OR_RETURN(auto p, ParallelGpt::Create(kConfig, {.pp = 2, .virtual_stages = 2}, world));
      ASSIGN_OR_RETURN(Strategy strategy, p->strategy());
      for (const auto& [name, stage] :
           std::vector<std::pair<std::string, int>>{{"wte", 0},
                                                    {"h.0.ln_1.weight", 0},
                                                    {"h.1.ln_1.weight", 1},
                                                    {"h.2.mlp.c_fc.weight", 0},
                                                    {"optimizer.h.2.ln_2.bias.exp_avg", 0},
                                                    {"h.3.attn.c_proj.bias", 1},
                                                    {"ln_f.weight", 1}}) {
        const TensorStrategy* t = strategy.Find(name);
        if (t == nullptr || t->layout.stage != stage)
          return InternalError(name + " not on stage " + std::to_string(stage));
      }
      // Stage 1 holds h.1 and h.3, ln_f and the tied copy of wte.
      std::string names;
      for (const ParamInfo& info : p->model().params()) names += info.name.substr(0, 4) + " ";
      if (world.rank() == 1 && (p->model().FindParam("h.3.ln_1.weight") == nullptr ||
                                p->model().FindParam("h.2.ln_1.weight") != nullptr ||
                                !p->model().params().back().tied_copy)) {
        return InternalError("stage 1 holds " + names);
      }
      if (world.rank() == 0 && (p->model().FindParam("h.2.ln_1.weight") == nullptr ||
                                p->model().FindParam("h.1.ln_1.weight") != nullptr ||
                                p->model().FindParam("ln_f.weight") != nullptr)) {
        return InternalError("stage 0 holds " + names);
      }
      return Status::Ok();
    });
    INFO(s.ToString());
    CHECK(s.ok());
  }
  SECTION("bad interleavings are refused, saying what would work") {
    auto refused = [](const GptConfig& config, ParallelConfig par, int ranks) {
      std::string message;
      std::mutex mu;
      const Status s = RunInProcess(ranks, [&](Communicator& world) -> Status {
        auto p = ParallelGpt::Create(config, par, world);
        if (p.ok()) return InternalError("accepted");
        std::lock_guard<std::mutex> lock(mu);
        message = p.status().message();
        return Status::Ok();
      });
      INFO(s.ToString());
      CHECK(s.ok());
      return message;
    };
    GptConfig six = kConfig;
    six.layers = 6;
    CHECK_THAT(refused(six, {.pp = 2, .virtual_stages = 2}, 2),
               Catch::Contains("6 layers do not cut into pp 2 x virtual_stages 2 = 4 equal "
                               "chunks: use virtual_stages 1, 3, or give stage_layers"));
    CHECK_THAT(refused(kConfig, {.pp = 2, .micro_batches = 1, .virtual_stages = 2}, 2),
               Catch::Contains("1 micro-batches are fewer than the 2 stages; use at least 2"));
    CHECK_THAT(refused(kConfig, {.pp = 2, .virtual_stages = 3}, 2),
               Catch::Contains("chunks need at least 6 layers; the model has 4: use "
                               "virtual_stages 2 or fewer"));
    CHECK_THAT(refused(kConfig, {.virtual_stages = 2}, 1), Catch::Contains("it needs pp > 1"));
    CHECK_THAT(refused(kConfig, {.pp = 2, .virtual_stages = 2, .stage_layers = {3, 1}}, 2),
               Catch::Contains("pp 2 x virtual_stages 2 needs 4 (one per chunk"));
    // Per chunk, stage_layers places the layers as it says.
    const Status s = RunInProcess(2, [&](Communicator& world) -> Status {
      ASSIGN_OR_RETURN(
          auto p, ParallelGpt::Create(
                      six, {.pp = 2, .virtual_stages = 2, .stage_layers = {1, 2, 2, 1}}, world));
      const bool holds = p->model().FindParam(world.rank() == 0 ? "h.4.ln_1.weight"
                                                                : "h.2.ln_1.weight") != nullptr;
      return holds ? Status::Ok() : InternalError("stage_layers per chunk not followed");
    });
    CHECK(s.ok());
  }
  SECTION("bitwise the non-interleaved run where the operators are the same") {
    const ParallelConfig one{.tp = 2, .pp = 2, .micro_batches = 4, .bucket_bytes = 4096};
    ParallelConfig two = one;
    two.virtual_stages = 2;
    const Run a = Parallel(one, 4), b = Parallel(two, 4);
    CHECK(a.losses == b.losses);
    CHECK(a.norms == b.norms);
    CHECK(a.weights == b.weights);
    CHECK(a.m == b.m);
    CHECK(a.v == b.v);
  }
}

TEST_CASE(
    "multi-copy (micro_batch_interleave), with SP, dp, ZeRO-1 and pipelines, reproduces "
    "the run") {
  kernels::SetComputeThreads(1);
  const Run reference = Reference();
  struct Config {
    int tp, dp, pp, v, zero, micro;
    bool sp;
  };
  for (const Config c : {Config{2, 1, 1, 1, 0, 1, false}, Config{2, 1, 1, 1, 0, 1, true},
                         Config{2, 2, 1, 1, 1, 1, false}, Config{2, 1, 2, 1, 0, 2, false},
                         Config{2, 1, 2, 2, 0, 2, true}}) {
    DYNAMIC_SECTION("N2 tp" << c.tp << (c.sp ? "+SP" : "") << " dp" << c.dp << " pp" << c.pp << " V"
                            << c.v << " zero" << c.zero << " micro-batches " << c.micro) {
      Compare(Parallel({.dp = c.dp,
                        .tp = c.tp,
                        .pp = c.pp,
                        .zero = c.zero,
                        .micro_batches = c.micro,
                        .bucket_bytes = 4096,
                        .virtual_stages = c.v,
                        .micro_batch_interleave = 2,
                        .sequence_parallel = c.sp},
                       c.pp * c.tp * c.dp),
              reference);
    }
  }
  // Two copies of a micro-batch run the arithmetic of two micro-batches of
  // its rows (each parameter's gradient sums copy 0, then copy 1): bit for
  // bit the same step as twice the micro-batches without copies, where each
  // parameter is used once per stage. (Without a pipeline the tied wte is
  // used twice on one stage, by the head and by the embedding: copies add
  // head, head, embedding, embedding where micro-batches add head,
  // embedding, head, embedding, equal within rounding only.)
  SECTION("bitwise twice the micro-batches without copies, with a pipeline") {
    for (int v : {1, 2}) {
      const ParallelConfig copies{.tp = 2,
                                  .pp = 2,
                                  .micro_batches = 2,
                                  .bucket_bytes = 4096,
                                  .virtual_stages = v,
                                  .micro_batch_interleave = 2,
                                  .sequence_parallel = true};
      ParallelConfig plain = copies;
      plain.micro_batch_interleave = 1;
      plain.micro_batches = 4;
      const Run a = Parallel(copies, 4), b = Parallel(plain, 4);
      CHECK(a.norms == b.norms);
      CHECK(a.weights == b.weights);
      CHECK(a.m == b.m);
      CHECK(a.v == b.v);
      for (size_t i = 0; i < a.losses.size(); ++i) {
        CHECK(a.losses[i] == Approx(b.losses[i]).epsilon(1e-6));
      }
    }
  }
  SECTION("copies without tp, and micro-batches that do not cut into copies, are refused") {
    std::string message;
    std::mutex mu;
    Status s = RunInProcess(2, [&](Communicator& world) -> Status {
      auto p = ParallelGpt::Create(kConfig, {.dp = 2, .micro_batch_interleave = 2}, world);
      if (p.ok()) return InternalError("accepted");
      std::lock_guard<std::mutex> lock(mu);
      message = p.status().message();
      return Status::Ok();
    });
    CHECK(s.ok());
    CHECK_THAT(message, Catch::Contains("with tp 1 there are none"));
    s = RunInProcess(2, [&](Communicator& world) -> Status {
      ASSIGN_OR_RETURN(auto p,
                       ParallelGpt::Create(kConfig, {.tp = 2, .micro_batch_interleave = 3}, world));
      RETURN_IF_ERROR(p->Init(42));
      const auto tokens = Batch(0, 0), targets = Batch(0, 1);
      auto loss = p->Step(tokens.data(), targets.data(), kB, kT, kAdam, kMaxNorm, nullptr);
      if (loss.ok()) return InternalError("accepted");
      std::lock_guard<std::mutex> lock(mu);
      message = loss.status().message();
      return Status::Ok();
    });
    CHECK(s.ok());
    CHECK_THAT(message, Catch::Contains("a micro-batch of 8 sequences per dp rank does not cut "
                                        "into 3 copies of whole sequences; use a batch of a "
                                        "multiple of 3 sequences"));
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
  // Under pp every tensor lives on its stage of the pp axis: the stages'
  // parameter lists together are the model's, wte once (the last stage's
  // tied copy is not a tensor of its own).
  const Status staged = RunInProcess(4, [&](Communicator& world) -> Status {
    ASSIGN_OR_RETURN(auto p, ParallelGpt::Create(kConfig, {.dp = 2, .pp = 2, .zero = 1}, world));
    ASSIGN_OR_RETURN(Strategy strategy, p->strategy());
    auto expect = [&](const std::string& name, int stage) -> Status {
      const TensorStrategy* t = strategy.Find(name);
      if (t == nullptr) return InternalError(name + " missing");
      if (t->layout.stage_axis != "pp" || t->layout.stage != stage) {
        return InternalError(name + ": " + ToString(t->layout));
      }
      return Status::Ok();
    };
    RETURN_IF_ERROR(expect("wte", 0));
    RETURN_IF_ERROR(expect("h.1.mlp.c_fc.weight", 0));
    RETURN_IF_ERROR(expect("h.2.ln_1.weight", 1));
    RETURN_IF_ERROR(expect("ln_f.bias", 1));
    RETURN_IF_ERROR(expect("optimizer.h.3.attn.c_attn.weight.exp_avg_sq", 1));
    auto whole = Gpt::Create(kConfig);
    if (strategy.tensors().size() != 3 * whole->params().size()) {
      return InternalError(std::to_string(strategy.tensors().size()) + " tensors");
    }
    const int stage = p->stage();
    const bool has_copy = p->model().params().back().tied_copy;
    if (stage != world.rank() / 2 || has_copy != (stage == 1)) {
      return InternalError("rank " + std::to_string(world.rank()) + " on stage " +
                           std::to_string(stage));
    }
    return Status::Ok();
  });
  INFO(staged.ToString());
  CHECK(staged.ok());
  // Under tp the strategy is Megatron's layout, and it says exactly which
  // box of every tensor each rank holds.
  const Status sliced = RunInProcess(8, [&](Communicator& world) -> Status {
    ASSIGN_OR_RETURN(auto p,
                     ParallelGpt::Create(kConfig, {.dp = 2, .tp = 2, .pp = 2, .zero = 1}, world));
    ASSIGN_OR_RETURN(Strategy strategy, p->strategy());
    auto expect = [&](const std::string& name, const std::string& layout) -> Status {
      const TensorStrategy* t = strategy.Find(name);
      if (t == nullptr) return InternalError(name + " missing");
      if (ToString(t->layout) != layout) return InternalError(name + ": " + ToString(t->layout));
      return Status::Ok();
    };
    RETURN_IF_ERROR(expect("wte", "shape [64, 16] f32 split [tp, -] stage pp=0"));
    RETURN_IF_ERROR(expect("h.0.attn.c_attn.weight",
                           "shape [16, 48] view [16, 3, 16] f32 split [-, -, tp] stage pp=0"));
    RETURN_IF_ERROR(
        expect("h.3.attn.c_attn.bias", "shape [48] view [3, 16] f32 split [-, tp] stage pp=1"));
    RETURN_IF_ERROR(
        expect("h.3.attn.c_proj.weight", "shape [16, 16] f32 split [tp, -] stage pp=1"));
    RETURN_IF_ERROR(expect("h.3.attn.c_proj.bias", "shape [16] f32 stage pp=1"));
    RETURN_IF_ERROR(expect("optimizer.h.1.mlp.c_fc.weight.exp_avg",
                           "shape [16, 64] f32 split [-, tp] opt [dp] stage pp=0"));
    for (const ParamInfo& info : p->model().params()) {
      if (info.tied_copy) continue;
      const TensorStrategy* t = strategy.Find(info.name);
      if (t == nullptr) return InternalError(info.name + " missing");
      ASSIGN_OR_RETURN(std::optional<Box> box, ShardOf(t->layout, strategy.mesh(), world.rank()));
      if (!box.has_value() || *box != info.box) {
        return InternalError(info.name + " on rank " + std::to_string(world.rank()) + ": holds " +
                             ToString(info.box) + ", the strategy says " +
                             (box ? ToString(*box) : std::string("nothing")));
      }
    }
    return Status::Ok();
  });
  INFO(sliced.ToString());
  CHECK(sliced.ok());
  const Status wrong = RunInProcess(2, [&](Communicator& world) -> Status {
    return ParallelGpt::Create(kConfig, {.dp = 4}, world).status();
  });
  CHECK_THAT(wrong.message(), Catch::Contains("is not the 2 ranks"));
  const Status heads = RunInProcess(3, [&](Communicator& world) -> Status {
    return ParallelGpt::Create(kConfig, {.tp = 3}, world).status();
  });
  CHECK_THAT(heads.message(), Catch::Contains("operator 'h.0.attn.attention'"));
  CHECK_THAT(heads.message(), Catch::Contains("of size 4 is not divisible by tp = 3"));
}

std::shared_ptr<const OpStrategyFile> StrategyFile(const std::string& json) {
  auto f = OpStrategyFile::Parse(json, "test.json");
  REQUIRE(f.ok());
  return std::make_shared<const OpStrategyFile>(*f);
}

TEST_CASE("sequence parallelism (Megatron-SP) reproduces the single-process run") {
  kernels::SetComputeThreads(1);
  const Run reference = Reference();
  struct Config {
    int tp, dp, pp, zero;
  };
  for (const Config c : {Config{2, 1, 1, 0}, Config{4, 1, 1, 0}, Config{2, 2, 1, 1},
                         Config{2, 1, 2, 0}, Config{2, 2, 2, 1}}) {
    DYNAMIC_SECTION("tp" << c.tp << " dp" << c.dp << " pp" << c.pp << " zero" << c.zero) {
      Compare(Parallel({.dp = c.dp,
                        .tp = c.tp,
                        .pp = c.pp,
                        .zero = c.zero,
                        .bucket_bytes = 4096,
                        .sequence_parallel = true},
                       c.tp * c.dp * c.pp),
              reference);
    }
  }
}

// The MLP the other way round (c_fc by rows, c_proj by columns), the
// embedding by columns, the output projection contracted over tp.
constexpr const char* kOtherOrientation = R"({"format": "tessera.op_strategy",
    "operators": {
      "embedding": [[null, "tp"], ["dp"]],
      "h.*.mlp.c_fc": [["dp", "tp"], ["tp", null]],
      "h.*.mlp.gelu": [["dp", null]],
      "h.*.mlp.c_proj": [["dp", null], [null, "tp"]],
      "h.*.attn.c_attn": [["dp", null], [null, "tp"]],
      "h.*.attn.attention": [[["dp", "tp"], null]],
      "h.1.attn.c_proj": [[2, 1], [1, 1]],
      "lm_head": [["dp", "tp"], [null, "tp"]],
      "loss": [["dp", "tp"], ["dp"]]}})";

// Strategies that are not Megatron's: redistributions get inserted between
// operators whose placements differ, and their duals run in backward.
TEST_CASE("hand-written operator strategies reproduce the single-process run") {
  kernels::SetComputeThreads(1);
  const Run reference = Reference();
  const char* mlp_batch_split = R"({"format": "tessera.op_strategy",
    "operators": {
      "embedding": [["tp", null], ["dp"]],
      "h.*.attn.c_attn": [["dp", null], [null, "tp"]],
      "h.*.attn.attention": [["dp", "tp"]],
      "h.*.attn.c_proj": [["dp", "tp"], ["tp", null]],
      "h.*.ln_1": [["dp", null]], "h.*.add_1": [["dp", null], ["dp", null]],
      "h.*.ln_2": [["dp", null]], "h.*.add_2": [["dp", null], ["dp", null]],
      "h.*.mlp.c_fc": [[["dp", "tp"], null], [null, null]],
      "h.*.mlp.gelu": [[["dp", "tp"], null]],
      "h.*.mlp.c_proj": [[["dp", "tp"], null], [null, null]],
      "lm_head": [["dp", null], ["tp", null]], "loss": [["dp", "tp"], ["dp"]]}})";
  // No operator named: everything data parallel over dp x tp.
  const char* data_parallel = R"({"format": "tessera.op_strategy", "operators": {}})";
  // The embedding's rows cut over tp (data parallel) but the output
  // projection's not: wte's gradient is partial from one and whole from
  // the other, and must be summed once.
  const char* wte_mixed = R"({"format": "tessera.op_strategy",
    "operators": {"lm_head": [["dp", null], [null, null]], "loss": [["dp", null], ["dp"]]}})";
  struct Config {
    const char* name;
    const char* json;
    int tp, dp, pp, zero;
  };
  for (const Config c : {Config{"mlp batch split", mlp_batch_split, 2, 1, 1, 0},
                         Config{"mlp batch split", mlp_batch_split, 2, 2, 1, 1},
                         Config{"other orientation", kOtherOrientation, 2, 1, 1, 0},
                         Config{"other orientation", kOtherOrientation, 2, 1, 2, 1},
                         Config{"data parallel", data_parallel, 2, 1, 1, 0},
                         Config{"data parallel", data_parallel, 2, 2, 2, 0},
                         Config{"wte rows mixed", wte_mixed, 2, 1, 1, 0},
                         Config{"wte rows mixed", wte_mixed, 2, 1, 2, 0}}) {
    DYNAMIC_SECTION(c.name << " tp" << c.tp << " dp" << c.dp << " pp" << c.pp << " zero"
                           << c.zero) {
      Compare(Parallel({.dp = c.dp,
                        .tp = c.tp,
                        .pp = c.pp,
                        .zero = c.zero,
                        .bucket_bytes = 4096,
                        .op_strategy = StrategyFile(c.json)},
                       c.tp * c.dp * c.pp),
              reference);
    }
  }
}

// Each distinct redistribution (an edge's placements and shape) is
// planned once, in the first step, and reused by every block, direction
// and later step (the seeds' communication subgraph reuse).
TEST_CASE("redistribution plans are built once, in the first step") {
  kernels::SetComputeThreads(1);
  std::mutex mu;
  std::vector<int64_t> first(2), later(2);
  const Status s = RunInProcess(2, [&](Communicator& world) -> Status {
    ASSIGN_OR_RETURN(
        auto p, ParallelGpt::Create(
                    kConfig, {.tp = 2, .op_strategy = StrategyFile(kOtherOrientation)}, world));
    RETURN_IF_ERROR(p->Init(42));
    int64_t after_first = 0;
    for (int step = 0; step < 3; ++step) {
      const auto tokens = Batch(step, 0), targets = Batch(step, 1);
      RETURN_IF_ERROR(
          p->Step(tokens.data(), targets.data(), kB, kT, kAdam, kMaxNorm, nullptr).status());
      if (step == 0) after_first = p->plans_built();
    }
    std::lock_guard<std::mutex> lock(mu);
    first[world.rank()] = after_first;
    later[world.rank()] = p->plans_built() - after_first;
    return Status::Ok();
  });
  INFO(s.ToString());
  REQUIRE(s.ok());
  for (int r = 0; r < 2; ++r) {
    // 4 blocks each run the same Redistribute edges forward and backward:
    // the plans are per distinct edge (a handful), not per block and call.
    CHECK(first[r] > 0);
    CHECK(first[r] <= 8);
    CHECK(later[r] == 0);
  }
}

TEST_CASE("recompute (full, selective) keeps every configuration's losses, bit for bit") {
  kernels::SetComputeThreads(1);
  const Run reference = Reference();
  struct Config {
    int tp, dp, pp, zero;
    bool sp;
  };
  for (const Config c :
       {Config{2, 1, 1, 0, false}, Config{4, 1, 1, 0, false}, Config{2, 1, 1, 0, true},
        Config{2, 2, 1, 1, true}, Config{2, 1, 2, 0, true}}) {
    const ParallelConfig base{.dp = c.dp,
                              .tp = c.tp,
                              .pp = c.pp,
                              .zero = c.zero,
                              .bucket_bytes = 4096,
                              .sequence_parallel = c.sp};
    const Run plain = Parallel(base, c.tp * c.dp * c.pp);
    for (const char* mode : {"full", "selective"}) {
      DYNAMIC_SECTION("tp" << c.tp << " dp" << c.dp << " pp" << c.pp << " zero" << c.zero
                           << (c.sp ? " sp" : "") << " recompute " << mode) {
        ParallelConfig config = base;
        config.recompute = *ParseRecompute(mode);
        const Run run = Parallel(config, c.tp * c.dp * c.pp);
        Compare(run, reference);
        CHECK(run.losses == plain.losses);
        CHECK(run.weights == plain.weights);
      }
    }
  }
  // Per block, from a strategy file: selective everywhere but one full block.
  const Run mixed =
      Parallel({.tp = 2,
                .bucket_bytes = 4096,
                .op_strategy = StrategyFile(R"({"format": "tessera.op_strategy", "operators": {},
           "recompute": {"h.*": "selective", "h.2": "full"}})")},
               2);
  Compare(mixed, reference);
  // Without tp, recompute runs through the operators too.
  Compare(Parallel({.dp = 2, .bucket_bytes = 4096, .recompute = Recompute::kFull}, 2), reference);
}

TEST_CASE("memory accounting: recompute and sequence parallelism hold fewer activation bytes") {
  kernels::SetComputeThreads(1);
  auto activations = [](ParallelConfig config, int ranks) {
    MemoryUse m;
    config.bucket_bytes = 4096;
    Parallel(config, ranks, &m);
    CHECK(m.parameters > 0);
    CHECK(m.gradients == m.parameters);
    CHECK(m.optimizer == 2 * m.parameters);
    return m.activations;
  };
  const int64_t none = activations({.tp = 2}, 2);
  const int64_t selective = activations({.tp = 2, .recompute = Recompute::kSelective}, 2);
  const int64_t full = activations({.tp = 2, .recompute = Recompute::kFull}, 2);
  CHECK(full < selective);
  CHECK(selective < none);
  CHECK(activations({.tp = 4, .sequence_parallel = true}, 4) < activations({.tp = 4}, 4));
}

TEST_CASE("a plan's checkpoint layouts convert to MindSpore's strategy form and back") {
  const GptConfig c{.layers = 2, .heads = 4, .embed = 32, .context = 16, .vocab = 96};
  // Megatron's c_attn is cut by heads, in its [C, 3, C] view: MindSpore
  // cannot say that, and the error names the tensor.
  ParallelConfig megatron;
  megatron.dp = 2;
  megatron.tp = 2;
  auto m = ParallelGpt::StrategyOf(c, megatron);
  REQUIRE(m.ok());
  auto refused = StrategyToMindSpore(*m);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().message().find("h.0.attn.c_attn.weight") != std::string::npos);
  // Data parallel with ZeRO-1 (optimizer states sharded over dp): MindSpore's
  // opt_weight_shard.
  ParallelConfig par;
  par.dp = 4;
  par.zero = 1;
  auto layouts = ParallelGpt::StrategyOf(c, par);
  INFO(layouts.status().ToString());
  REQUIRE(layouts.ok());
  auto ms = StrategyToMindSpore(*layouts);
  INFO(ms.status().ToString());
  REQUIRE(ms.ok());
  auto back = MindSporeToStrategy({*ms}, *layouts);
  INFO(back.status().ToString());
  REQUIRE(back.ok());
  // Every rank holds the same box of every parameter under both.
  REQUIRE(back->tensors().size() == layouts->tensors().size());
  for (size_t i = 0; i < layouts->tensors().size(); ++i) {
    const TensorStrategy &a = layouts->tensors()[i], &b = back->tensors()[i];
    INFO(a.name);
    CHECK(a.name == b.name);
    if (a.name.starts_with("optimizer.")) continue;  // parameters: what the file records
    for (int64_t r = 0; r < 4; ++r) {
      auto x = ShardOf(a.layout, layouts->mesh(), r);
      auto y = ShardOf(b.layout, back->mesh(), r);
      REQUIRE(x.ok());
      REQUIRE(y.ok());
      CHECK(*x == *y);
    }
  }
}

}  // namespace
}  // namespace tessera
