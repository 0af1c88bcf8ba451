// Parameter servers (runtime/model/ps_placement.h, param_server.h): the
// placement's rules and errors, and a synchronous job of in-process
// servers and workers against the single-process reference (losses 1e-5
// relative, weights and both Adam moments 1e-5 relative norm) and against
// data parallelism over the same workers (bitwise, where the fold order is
// the same: two workers).
#include "runtime/model/param_server.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <mutex>
#include <random>

#include "runtime/comm/inprocess.h"
#include "runtime/comm/launch.h"
#include "runtime/model/parallel_gpt.h"

namespace tessera {
namespace {

const GptConfig kConfig{.layers = 2, .heads = 2, .embed = 16, .context = 16, .vocab = 96};
constexpr int kB = 4, kT = 16, kSteps = 12;
const AdamWConfig kAdam{.lr = 3e-3f, .weight_decay = 0.1f};
constexpr float kMaxNorm = 0.5f;  // small enough that clipping happens

std::vector<ParamInfo> Params() { return *Gpt::Params(kConfig); }

TEST_CASE("the placement balances whole parameters by bytes and cuts the large ones by rows") {
  const std::vector<ParamInfo> params = Params();
  int64_t total = 0;
  for (const ParamInfo& p : params) total += p.numel;
  SECTION("one server holds everything, whole") {
    auto pl = PsPlacement::Create(params, 1, "all");
    REQUIRE(pl.ok());
    CHECK(pl->pieces().size() == params.size());
    CHECK(pl->ServerFloats(0) == total);
    CHECK(pl->local().empty());
    for (const PsPiece& p : pl->pieces()) CHECK(p.whole);
  }
  SECTION("three servers: LPT within 4/3 of the even share, every parameter once") {
    auto pl = PsPlacement::Create(params, 3, "all");
    REQUIRE(pl.ok());
    int64_t held = 0, most = 0;
    for (int s = 0; s < 3; ++s) {
      held += pl->ServerFloats(s);
      most = std::max(most, pl->ServerFloats(s));
    }
    CHECK(held == total);
    CHECK(most * 3 <= total * 4 / 3 + 1);
    std::vector<int64_t> covered(params.size(), 0);
    for (const PsPiece& p : pl->pieces()) covered[p.param] += p.count;
    for (size_t i = 0; i < params.size(); ++i) CHECK(covered[i] == params[i].numel);
  }
  SECTION("a parameter above the fair share is cut by rows, torch.chunk's cut") {
    auto pl = PsPlacement::Create(params, 2, "wte,wpe");
    REQUIRE(pl.ok());
    // wte (96 x 16) is above half of wte + wpe: rows [0, 48) and [48, 96).
    std::vector<PsPiece> wte;
    for (const PsPiece& p : pl->pieces()) {
      if (p.name == "wte") wte.push_back(p);
    }
    REQUIRE(wte.size() == 2);
    CHECK(wte[0].row_begin == 0);
    CHECK(wte[0].row_end == 48);
    CHECK(wte[0].server == 0);
    CHECK(wte[1].row_begin == 48);
    CHECK(wte[1].server == 1);
    CHECK(wte[1].offset == wte[0].offset + 48 * 16);
    CHECK(!wte[0].whole);
    CHECK(pl->local().size() == params.size() - 2);
  }
  SECTION("patterns: '*' is one dot-free part") {
    auto pl = PsPlacement::Create(params, 1, "h.*.mlp.c_fc.*");
    REQUIRE(pl.ok());
    REQUIRE(pl->pieces().size() == 4);  // weight and bias of 2 layers
    for (const PsPiece& p : pl->pieces()) CHECK(p.name.find(".mlp.c_fc.") != std::string::npos);
  }
  SECTION("errors name what is wrong") {
    auto none = PsPlacement::Create(params, 1, "wte,h.*.nothing");
    REQUIRE(!none.ok());
    CHECK(none.status().message().find("'h.*.nothing'") != std::string::npos);
    auto empty = PsPlacement::Create(params, 2, "h.0.ln_1.bias");
    REQUIRE(!empty.ok());
    CHECK(empty.status().message().find("--ps-servers 2: server 1 would hold nothing") !=
          std::string::npos);
    CHECK(!PsPlacement::Create(params, 0, "all").ok());
  }
}

std::vector<int32_t> Batch(int step, int which) {
  std::mt19937 rng(1000 + step);
  std::vector<int32_t> t(kB * kT);
  for (int b = 0; b < kB; ++b) {
    const int start = static_cast<int>(rng() % kConfig.vocab) + which * 3;
    for (int i = 0; i < kT; ++i) t[b * kT + i] = (start + 3 * i) % kConfig.vocab;
  }
  return t;
}

struct Run {
  std::vector<float> losses, weights, m, v;
};

Run Reference(const GptConfig& config = kConfig) {
  auto g = Gpt::Create(config);
  g->Init(42);
  Run run;
  for (int step = 0; step < kSteps; ++step) {
    const auto tokens = Batch(step, 0), targets = Batch(step, 1);
    run.losses.push_back(*g->Forward(tokens.data(), targets.data(), kB, kT));
    g->ZeroGrad();
    REQUIRE(g->Backward().ok());
    g->Update(kAdam, kMaxNorm);
  }
  run.weights = g->weights();
  run.m = g->adam_m();
  run.v = g->adam_v();
  return run;
}

// S servers and 2 workers (S = 0: plain data parallelism over 2 ranks).
// The servers' pieces and the workers' own moments are put together into
// whole vectors.
Run WithServers(int servers, const std::string& patterns, const GptConfig& config = kConfig,
                MemoryUse* worker_memory = nullptr) {
  const int workers = 2;
  const int64_t n = Gpt::Create(config)->num_params();
  Run run;
  run.weights.assign(n, 0.0f);
  run.m.assign(n, 0.0f);
  run.v.assign(n, 0.0f);
  std::mutex mu;
  LaunchOptions launch;
  launch.ranks = servers + workers;
  const Status s = LaunchRanks(launch, [&](Communicator& world) -> Status {
    ParallelConfig par;
    par.dp = workers;
    par.ps_servers = servers;
    par.ps_params = patterns;
    const bool server = world.rank() < servers;
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> group, world.Split(server ? 0 : 1, 0));
    if (server) {
      ASSIGN_OR_RETURN(PsPlacement pl,
                       PsPlacement::Create(*Gpt::Params(config), servers, patterns));
      ASSIGN_OR_RETURN(std::unique_ptr<PsServer> ps, PsServer::Create(config, pl, world));
      RETURN_IF_ERROR(ps->Init(42));
      while (true) {
        ASSIGN_OR_RETURN(const PsServer::Asked asked, ps->Next());
        if (asked.command == PsProtocol::kStop) break;
        RETURN_IF_ERROR(ps->Step(kAdam, kMaxNorm));
      }
      std::lock_guard<std::mutex> lock(mu);
      for (size_t i : ps->pieces()) {
        const PsPiece& piece = ps->protocol().placement().pieces()[i];
        for (int which = 0; which < 3; ++which) {
          std::vector<float>& out = which == 0 ? run.weights : which == 1 ? run.m : run.v;
          const std::span<const float> d = ps->PieceData(i, which);
          std::copy(d.begin(), d.end(), out.begin() + piece.offset);
        }
      }
      return Status::Ok();
    }
    ASSIGN_OR_RETURN(std::unique_ptr<ParallelGpt> p, ParallelGpt::Create(config, par, *group));
    if (servers > 0) RETURN_IF_ERROR(p->ConnectServers(world));
    RETURN_IF_ERROR(p->Init(42));
    std::vector<float> losses;
    for (int step = 0; step < kSteps; ++step) {
      const auto tokens = Batch(step, 0), targets = Batch(step, 1);
      ASSIGN_OR_RETURN(const float loss,
                       p->Step(tokens.data(), targets.data(), kB, kT, kAdam, kMaxNorm, nullptr));
      losses.push_back(loss);
    }
    RETURN_IF_ERROR(p->StopServers(false));
    if (group->rank() != 0) return Status::Ok();
    std::lock_guard<std::mutex> lock(mu);
    run.losses = losses;
    if (worker_memory != nullptr) *worker_memory = p->Memory();
    const Gpt& g = p->model();
    const PsPlacement* pl = servers > 0 ? &p->ps()->protocol().placement() : nullptr;
    for (size_t i = 0; i < g.params().size(); ++i) {
      const ParamInfo& info = g.params()[i];
      if (pl != nullptr && pl->OnServers(i)) continue;
      std::copy_n(g.weights().data() + info.offset, info.numel, run.weights.begin() + info.offset);
    }
    if (servers == 0) {
      run.m = g.adam_m();
      run.v = g.adam_v();
    } else {
      const std::vector<float> m = p->ps()->LocalMoments(1), v = p->ps()->LocalMoments(2);
      int64_t at = 0;
      for (size_t i : pl->local()) {
        const ParamInfo& info = g.params()[i];
        std::copy_n(m.data() + at, info.numel, run.m.begin() + info.offset);
        std::copy_n(v.data() + at, info.numel, run.v.begin() + info.offset);
        at += info.numel;
      }
    }
    return Status::Ok();
  });
  REQUIRE(s.ok());
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

// `ps` against the single-process reference (1e-5) and, `bitwise`, bit for
// bit against data parallelism over the same workers.
void CheckRun(const Run& ps, const Run& ref, const Run& dp, bool bitwise) {
  REQUIRE(ps.losses.size() == ref.losses.size());
  for (size_t i = 0; i < ps.losses.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(std::abs(ps.losses[i] - ref.losses[i]) <= 1e-5 * std::abs(ref.losses[i]));
  }
  CHECK(RelativeNorm(ps.weights, ref.weights) < 1e-5);
  CHECK(RelativeNorm(ps.m, ref.m) < 1e-5);
  CHECK(RelativeNorm(ps.v, ref.v) < 1e-5);
  if (!bitwise) return;
  CHECK(ps.losses == dp.losses);
  CHECK(ps.weights == dp.weights);
  CHECK(ps.m == dp.m);
  CHECK(ps.v == dp.v);
}

TEST_CASE("synchronous parameter servers train as data parallelism does") {
  const Run ref = Reference();
  const Run dp = WithServers(0, "all");
  for (auto [servers, patterns] : {std::pair<int, const char*>{1, "all"},
                                   {2, "all"},
                                   {1, "wte"},
                                   {2, "wte,wpe"},
                                   {3, "all"}}) {
    INFO(servers << " server(s), --ps-params " << patterns);
    // Two workers fold as the all-reduce does (a + b); only a parameter
    // cut over servers sums its squared norm in two parts.
    CheckRun(WithServers(servers, patterns), ref, dp, std::string(patterns) != "wte,wpe");
  }
}

TEST_CASE("the embedding served by rows (untied head): data parallelism's numbers") {
  GptConfig untied = kConfig;
  untied.untied = true;
  const Run ref = Reference(untied);
  const Run dp = WithServers(0, "all", untied);
  const int64_t table = int64_t{kConfig.vocab} * kConfig.embed * 4;
  for (auto [servers, patterns] :
       {std::pair<int, const char*>{1, "all"}, {2, "wte"}, {1, "wte"}, {3, "all"}}) {
    INFO(servers << " server(s), --ps-params " << patterns);
    MemoryUse memory;
    // The rows a batch does not use still decay (dense AdamW): the same
    // bits, where wte is not cut over servers (its norm in two parts).
    CheckRun(WithServers(servers, patterns, untied, &memory), ref, dp,
             std::string(patterns) != "wte" || servers == 1);
    // A worker accounts no table, only the rows of a step.
    const int64_t n = Gpt::Create(untied)->num_params() * 4;
    CHECK(memory.parameters == n - table);
    CHECK(memory.gradients == n - table);
    CHECK(memory.communication > 0);
    CHECK(memory.communication <= 2 * kB * kT * kConfig.embed * 4);
  }
}

TEST_CASE("a worker's model with ps_servers refuses to run before ConnectServers") {
  ParallelConfig par;
  par.dp = 1;
  par.ps_servers = 1;
  auto world = CreateInProcessWorld(1);
  REQUIRE(world.ok());
  Result<std::unique_ptr<ParallelGpt>> p = ParallelGpt::Create(kConfig, par, *(*world)[0]);
  REQUIRE(p.ok());
  const Status init = (*p)->Init(42);
  CHECK(init.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(init.message(), Catch::Contains("ConnectServers"));
  const auto tokens = Batch(0, 0), targets = Batch(0, 1);
  const Result<float> step =
      (*p)->Step(tokens.data(), targets.data(), kB, kT, kAdam, kMaxNorm, nullptr);
  CHECK(step.status().code() == StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tessera
