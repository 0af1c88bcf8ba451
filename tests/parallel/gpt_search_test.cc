// The automatic-parallelism cost model and search: machine profiles, the
// predicted per-rank memory against the runtime's own accounting
// (ParallelGpt::Memory after real steps), balanced pipeline stages, and
// what the search chooses (rankings and rediscovery, which do not depend
// on this machine's speed).
#include "runtime/model/gpt_search.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>

#include <catch2/catch.hpp>

#include "runtime/comm/inprocess.h"

namespace tessera {
namespace {

// A machine for tests: 8 devices a host, figures of the order of a GPU's.
MachineProfile TestProfile() {
  auto p = MachineProfile::Parse(R"({
    "format": "tessera.machine_profile", "version": 1, "name": "test",
    "devices_per_host": 8,
    "device": {"matmul_flops": 1e14, "memory_bandwidth": 1e12, "memory_bytes": 8e10},
    "intra_host": {"latency_s": 5e-6, "bandwidth": 1e11},
    "inter_host": {"latency_s": 1e-5, "bandwidth": 1e10}})", "<test>");
  REQUIRE(p.ok());
  return *p;
}

TEST_CASE("machine profiles parse, round-trip and name what is wrong") {
  const MachineProfile p = TestProfile();
  CHECK(p.devices_per_host == 8);
  CHECK(p.inter_host.bandwidth == 1e10);
  auto again = MachineProfile::Parse(p.ToJson(), "<again>");
  REQUIRE(again.ok());
  CHECK(again->ToJson() == p.ToJson());
  auto bad = MachineProfile::Parse(R"({"format": "tessera.machine_profile", "version": 1,
    "device": {"matmul_flops": 1e12, "memory_bandwidth": 0}, "intra_host": {"bandwidth": 1}})",
                                   "prof.json");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("prof.json") != std::string::npos);
  CHECK(bad.status().message().find("device.memory_bandwidth") != std::string::npos);
  auto other = MachineProfile::Parse(R"({"format": "tessera.op_strategy"})", "x.json");
  REQUIRE_FALSE(other.ok());
  CHECK(other.status().message().find("not a machine profile") != std::string::npos);
  // A ring AllReduce: 2(n-1) latencies and 2(n-1)/n of the bytes.
  CHECK(p.CollectiveSeconds(CollectiveKind::kAllReduce, 8e9, 8, false) ==
        Approx(14 * 5e-6 + 2 * 7.0 / 8 * 8e9 / 1e11));
  CHECK(p.CollectiveSeconds(CollectiveKind::kAllReduce, 8e9, 1, false) == 0);
  CHECK_FALSE(p.CrossesHosts(1, 8));
  CHECK(p.CrossesHosts(8, 2));
}

const GptConfig kConfig{.layers = 4, .heads = 4, .embed = 32, .context = 16, .vocab = 96};
constexpr int kB = 8, kT = 16;

std::vector<int32_t> Tokens(int seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(kB * kT);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % kConfig.vocab);
  return t;
}

// Every rank's memory after two steps, by world rank.
std::vector<MemoryUse> Measured(const ParallelConfig& par, int ranks) {
  std::vector<MemoryUse> out(ranks);
  std::mutex mu;
  const Status s = RunInProcess(ranks, [&](Communicator& world) -> Status {
    ASSIGN_OR_RETURN(std::unique_ptr<ParallelGpt> p, ParallelGpt::Create(kConfig, par, world));
    p->Init(1);
    const auto tokens = Tokens(1), targets = Tokens(2);
    for (int step = 0; step < 2; ++step) {
      RETURN_IF_ERROR(p->Step(tokens.data(), targets.data(), kB, kT, AdamWConfig{}, 1.0f, nullptr)
                          .status());
    }
    std::lock_guard<std::mutex> lock(mu);
    out[world.rank()] = p->Memory();
    return Status::Ok();
  });
  INFO(s.ToString());
  REQUIRE(s.ok());
  return out;
}

std::shared_ptr<const OpStrategyFile> File(const std::string& name) {
  auto f = OpStrategyFile::Load(std::string(TESSERA_SOURCE_DIR) + "/samples/gpt/strategies/" + name);
  REQUIRE(f.ok());
  return std::make_shared<OpStrategyFile>(*f);
}

TEST_CASE("predicted per-rank memory matches the runtime's accounting") {
  struct Case {
    const char* name;
    ParallelConfig par;
  };
  std::vector<Case> cases;
  auto add = [&](const char* name, int pp, int dp, int tp, int zero, int mb, bool sp,
                 const char* recompute, std::shared_ptr<const OpStrategyFile> file = nullptr) {
    ParallelConfig p;
    p.pp = pp;
    p.dp = dp;
    p.tp = tp;
    p.zero = zero;
    p.micro_batches = mb;
    p.sequence_parallel = sp;
    p.recompute = recompute;
    p.op_strategy = std::move(file);
    p.bucket_bytes = 16 << 10;  // several buckets
    cases.push_back({name, p});
  };
  add("dp4 zero1", 1, 4, 1, 1, 0, false, "none", std::make_shared<OpStrategyFile>());
  add("dp2 tp2 megatron", 1, 2, 2, 0, 0, false, "none");
  add("tp4 megatron-sp selective", 1, 1, 4, 0, 0, true, "selective");
  add("pp2 tp2 full recompute, 4 micro-batches", 2, 1, 2, 0, 4, false, "full");
  add("pp2 dp2 zero1, 2 micro-batches", 2, 2, 1, 1, 2, false, "none",
      std::make_shared<OpStrategyFile>());
  add("dp2 tp2 mlp_batch_split.json", 1, 2, 2, 1, 0, false, "none", File("mlp_batch_split.json"));
  const MachineProfile prof = TestProfile();
  for (const Case& c : cases) {
    INFO(c.name);
    auto pred = PredictGptStep(kConfig, kB, kT, c.par, prof);
    INFO(pred.status().ToString());
    REQUIRE(pred.ok());
    const std::vector<MemoryUse> got = Measured(c.par, 4);
    for (int r = 0; r < 4; ++r) {
      if (r % c.par.tp != 0) continue;  // tp rank 0: the predicted shard
      const int stage = r / (c.par.dp * c.par.tp);
      const MemoryUse& want = pred->stage_memory[stage];
      INFO("rank " << r << " stage " << stage);
      CHECK(want.parameters == got[r].parameters);
      CHECK(want.gradients == got[r].gradients);
      CHECK(want.optimizer == Approx(got[r].optimizer).epsilon(0.02));
      CHECK(want.activations == Approx(got[r].activations).epsilon(0.02));
      CHECK(want.communication == Approx(got[r].communication).epsilon(0.02));
      CHECK(want.total() == Approx(got[r].total()).epsilon(0.05));
    }
  }
}

TEST_CASE("pipeline stages are balanced by cost: the last stage's head takes layers away") {
  CHECK(BalanceStages(8, 2, 1.0, 0.0, 0.0) == std::vector<int>{4, 4});
  // The head costs 1.3 blocks: the last stage gets fewer layers.
  CHECK(BalanceStages(8, 2, 1.0, 0.1, 1.3) == std::vector<int>{5, 3});
  // Three blocks and the head (2) on the last stage would be 5: it gets one.
  const std::vector<int> four = BalanceStages(12, 4, 1.0, 0.0, 2.0);
  CHECK(four.back() == 1);
  CHECK(*std::max_element(four.begin(), four.end()) == 4);
  const std::vector<int> s = BalanceStages(96, 8, 1.0, 0.2, 1.3);
  int sum = 0;
  for (int n : s) {
    sum += n;
    CHECK(n >= 1);
  }
  CHECK(sum == 96);
  CHECK(s.back() < s.front());
}

SearchResult Search(const GptConfig& c, int B, int T, int devices, int64_t budget) {
  SearchOptions o;
  o.rank_memory = budget;
  auto r = SearchGptParallel(c, B, T, devices, TestProfile(), o);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return *r;
}

TEST_CASE("the search rediscovers data parallelism when the batch dwarfs the model") {
  // A small model, a large batch: every rank a replica.
  const GptConfig small{.layers = 4, .heads = 4, .embed = 64, .context = 256, .vocab = 512};
  const SearchResult r = Search(small, 256, 256, 8, 0);
  INFO(r.name);
  CHECK(r.parallel.dp == 8);
  CHECK(r.parallel.tp == 1);
  CHECK(r.parallel.pp == 1);
  CHECK(r.predicted.seconds > 0);
}

TEST_CASE("the search cuts the weights (Megatron's column/row linears) when they do not fit") {
  // Weights of about 3.2 GB (12 bytes a parameter with Adam: 38 GB for one
  // replica) on 8 devices of 16 GB: data parallelism cannot hold them.
  const GptConfig big{.layers = 8, .heads = 32, .embed = 4096, .context = 512, .vocab = 32768};
  const int64_t budget = int64_t{16} << 30;
  const SearchResult r = Search(big, 8, 512, 8, budget);
  INFO(r.name << ": " << r.predicted.ToString());
  CHECK(r.predicted.memory.total() <= budget);
  CHECK(r.parallel.tp * r.parallel.pp > 1);
  if (r.parallel.tp > 1) {
    // Megatron's pattern: c_fc by columns, mlp.c_proj by rows.
    REQUIRE(r.parallel.op_strategy != nullptr);
    auto s = ResolveOpStrategies(*r.parallel.op_strategy, OpGpt::Signatures(big),
                                 *Mesh::Create({"pp", "dp", "tp"},
                                               {r.parallel.pp, r.parallel.dp, r.parallel.tp}));
    REQUIRE(s.ok());
    CHECK(s->at("h.0.mlp.c_fc").ToString() == "((dp, -), (-, tp))");
    CHECK(s->at("h.0.mlp.c_proj").ToString() == "((dp, tp), (tp, -))");
  }
}

TEST_CASE("the search is deterministic, keeps the budget, and says what would fit") {
  const GptConfig c{.layers = 4, .heads = 8, .embed = 512, .context = 256, .vocab = 8192};
  const SearchResult a = Search(c, 16, 256, 8, int64_t{1} << 30);
  const SearchResult b = Search(c, 16, 256, 8, int64_t{1} << 30);
  CHECK(a.name == b.name);
  CHECK(a.predicted.seconds == b.predicted.seconds);
  CHECK(a.predicted.memory.total() <= (int64_t{1} << 30));
  CHECK(a.candidates > 50);
  // Its prediction is the one PredictGptStep makes of the chosen
  // configuration (the search's folded blocks equal the full walk).
  auto full = PredictGptStep(c, 16, 256, a.parallel, TestProfile());
  REQUIRE(full.ok());
  CHECK(full->seconds == Approx(a.predicted.seconds).epsilon(1e-9));
  CHECK(full->memory.total() == a.predicted.memory.total());
  // A budget nothing fits: the error names the least any needs.
  SearchOptions o;
  o.rank_memory = 1 << 20;
  auto none = SearchGptParallel(c, 16, 256, 8, TestProfile(), o);
  REQUIRE_FALSE(none.ok());
  INFO(none.status().message());
  CHECK(none.status().message().find("fits 1.0 MiB per rank") != std::string::npos);
  CHECK(none.status().message().find("the least memory any needs is") != std::string::npos);
  // A device count no configuration can use with this batch.
  auto odd = SearchGptParallel(c, 3, 256, 5, TestProfile(), SearchOptions{});
  REQUIRE_FALSE(odd.ok());
  CHECK(odd.status().message().find("5 ranks") != std::string::npos);
}

}  // namespace
}  // namespace tessera
