// The automatic-parallelism cost model and search: machine profiles, the
// predicted per-rank memory against the runtime's own accounting
// (ParallelGpt::Memory after real steps), balanced pipeline stages, and
// what the search chooses (rankings and rediscovery, which do not depend
// on this machine's speed).
#include "runtime/model/gpt_search.h"

#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <mutex>
#include <random>

#include "runtime/comm/inprocess.h"
#include "runtime/cost/calibration.h"
#include "runtime/kernels.h"
#include "runtime/model/gpt_work.h"

namespace tessera {
namespace {

// A machine for tests: 8 devices a host, figures of the order of a GPU's.
MachineProfile TestProfile() {
  auto p = MachineProfile::Parse(R"({
    "format": "tessera.machine_profile", "version": 1, "name": "test",
    "devices_per_host": 8,
    "device": {"matmul_flops": 1e14, "memory_bandwidth": 1e12, "memory_bytes": 8e10},
    "intra_host": {"latency_s": 5e-6, "bandwidth": 1e11},
    "inter_host": {"latency_s": 1e-5, "bandwidth": 1e10}})",
                                 "<test>");
  REQUIRE(p.ok());
  return *p;
}

// A minimal profile with `key` set to `value` (JSON), parsed as `source`.
Result<MachineProfile> ParseWith(const char* key, const std::string& value, const char* source) {
  return MachineProfile::Parse(std::string(R"({"format": "tessera.machine_profile", "version": 1,
    "device": {"matmul_flops": 1, "memory_bandwidth": 1}, "intra_host": {"bandwidth": 1}, ")") +
                                   key + "\": " + value + "}",
                               source);
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
  CHECK(p.CrossesHosts(1, 6));  // groups of 6 straddle hosts of 8
  CHECK_FALSE(p.CrossesHosts(2, 4));
}

TEST_CASE("measured collective tables price their kind and group, the line the rest") {
  MachineProfile p = TestProfile();
  auto with = MachineProfile::Parse(R"({
    "format": "tessera.machine_profile", "version": 1, "name": "test",
    "devices_per_host": 8,
    "device": {"matmul_flops": 1e14, "memory_bandwidth": 1e12},
    "intra_host": {"latency_s": 5e-6, "bandwidth": 1e11},
    "inter_host": {"latency_s": 1e-5, "bandwidth": 1e10},
    "collectives": [
      {"kind": "AllReduce", "group": 2, "bytes": [1000, 100000], "seconds": [1e-3, 4e-3]},
      {"kind": "AllGather", "group": 4, "bytes": [1000], "seconds": [2e-3]},
      {"kind": "ReduceScatter", "group": 8, "bytes": [1000], "seconds": [1e-9]},
      {"kind": "SendRecv", "group": 2, "bytes": [1000, 100000], "seconds": [1e-3, 2e-3]}]})",
                                    "<tables>");
  INFO(with.status().ToString());
  REQUIRE(with.ok());
  REQUIRE(with->collectives.size() == 4);
  auto again = MachineProfile::Parse(with->ToJson(), "<again>");
  REQUIRE(again.ok());
  CHECK(again->ToJson() == with->ToJson());
  const auto ar = CollectiveKind::kAllReduce;
  // Inside the table: log-log between its sizes; below it: its smallest.
  CHECK(with->CollectiveSeconds(ar, 1000, 2, false) == Approx(1e-3));
  CHECK(with->CollectiveSeconds(ar, 10000, 2, false) == Approx(2e-3));  // halfway, in logs
  CHECK(with->CollectiveSeconds(ar, 10, 2, false) == Approx(1e-3));
  // Beyond it: the largest's time and the line's bandwidth for the rest.
  CHECK(with->CollectiveSeconds(ar, 1e9, 2, false) == Approx(4e-3 + (1e9 - 1e5) / 1e11));
  // Never below the line (the back-to-back figure): a table faster than
  // the line's latencies gives way to it.
  const auto rs = CollectiveKind::kReduceScatter;
  CHECK(with->CollectiveSeconds(rs, 1e6, 8, false) ==
        Approx(p.CollectiveSeconds(rs, 1e6, 8, false)));
  CHECK(with->CollectiveSeconds(rs, 1e6, 8, false) == Approx(7 * 5e-6 + 7.0 / 8 * 1e6 / 1e11));
  // Another group size, another host, a kind without a table: the line.
  CHECK(with->CollectiveSeconds(ar, 1e5, 4, false) == p.CollectiveSeconds(ar, 1e5, 4, false));
  CHECK(with->CollectiveSeconds(ar, 1e5, 2, true) == p.CollectiveSeconds(ar, 1e5, 2, true));
  // A pipeline's transfer: its own table.
  CHECK(with->CollectiveSeconds(CollectiveKind::kSendRecv, 1e4, 2, false) ==
        Approx(std::sqrt(2) * 1e-3));
  CHECK(with->CollectiveSeconds(CollectiveKind::kSendRecv, 1e4, 2, true) ==
        p.CollectiveSeconds(CollectiveKind::kSendRecv, 1e4, 2, true));
  CHECK(with->CollectiveSeconds(CollectiveKind::kAllGather, 500, 4, false) == Approx(2e-3));
  CHECK(with->CollectiveSeconds(CollectiveKind::kReduceScatter, 5e6, 4, false) ==
        p.CollectiveSeconds(CollectiveKind::kReduceScatter, 5e6, 4, false));
  for (const char* bad :
       {R"([{"kind": "AllToAll", "group": 2, "bytes": [1], "seconds": [1]}])",
        R"([{"kind": "AllReduce", "group": 2, "bytes": [2, 1], "seconds": [1, 1]}])",
        R"([{"kind": "AllReduce", "group": 1, "bytes": [1], "seconds": [1]}])",
        R"([{"kind": "AllReduce", "group": 2, "bytes": [1], "seconds": [0]}])"}) {
    INFO(bad);
    auto r = ParseWith("collectives", bad, "m.json");
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().find("m.json: collectives[0]") != std::string::npos);
  }
}

TEST_CASE("measured kernels price their units, the roofline the rest, and bad names are named") {
  const MachineProfile p = TestProfile();
  auto with = MachineProfile::Parse(R"({
    "format": "tessera.machine_profile", "version": 1, "name": "test",
    "device": {"matmul_flops": 1e14, "memory_bandwidth": 1e12},
    "intra_host": {"latency_s": 5e-6, "bandwidth": 1e11},
    "kernels": {"layer_norm_forward": 2e-9, "attention_forward_products": 1e-12}})",
                                    "<kernels>");
  INFO(with.status().ToString());
  REQUIRE(with.ok());
  auto again = MachineProfile::Parse(with->ToJson(), "<again>");
  REQUIRE(again.ok());
  CHECK(again->ToJson() == with->ToJson());
  CHECK(with->ToJson().find("\"layer_norm_forward\": 2e-09") != std::string::npos);
  CHECK(p.ToJson().find("kernels") == std::string::npos);  // none measured, none written
  CHECK(with->KernelSeconds(Kernel::kLayerNormForward, 1e6) == Approx(2e-3));
  CHECK(with->KernelSeconds(Kernel::kAttentionForwardProducts, 1e9) == Approx(1e-3));
  // Unmeasured: the roofline (a layer norm's backward reads x and dy and
  // writes dx; the attention's products run at the matrix-product rate).
  CHECK(with->KernelSeconds(Kernel::kLayerNormBackward, 1e6) == Approx(12e6 / 1e12));
  CHECK(with->KernelSeconds(Kernel::kAttentionBackwardProducts, 1e9) == Approx(1e9 / 1e14));
  CHECK(p.KernelSeconds(Kernel::kAdamW, 1e6) == Approx(28e6 / 1e12));
  // Ranks sharing a device share its throughput, measured or not.
  const MachineProfile shared = [&] {
    MachineProfile q = *with;
    q.hosts = 1;
    return q.ForRanks(2);
  }();
  CHECK(shared.KernelSeconds(Kernel::kLayerNormForward, 1e6) == Approx(4e-3));
  CHECK(shared.KernelSeconds(Kernel::kLayerNormBackward, 1e6) == Approx(2 * 12e6 / 1e12));
  for (auto [kernels, says] : std::vector<std::pair<const char*, const char*>>{
           {R"({"layer_norm_fwd": 1e-9})",
            "unknown kernel \"layer_norm_fwd\" (known: layer_norm_forward"},
           {R"({"adamw": 0})", "\"adamw\" must be a positive number"},
           {R"({"adamw": "fast"})", "\"adamw\" must be a positive number"},
           {R"([1])", "\"kernels\" must be an object"}}) {
    INFO(kernels);
    auto r = ParseWith("kernels", kernels, "k.json");
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().find("k.json") != std::string::npos);
    CHECK(r.status().message().find(says) != std::string::npos);
  }
}

TEST_CASE("calibration measures every kernel, rank 0's figures on every rank") {
  std::vector<MachineProfile> by_rank(2);
  std::mutex mu;
  const Status s = RunInProcess(2, [&](Communicator& world) -> Status {
    ASSIGN_OR_RETURN(MachineProfile p, CalibrateMachine(world));
    std::lock_guard<std::mutex> lock(mu);
    by_rank[world.rank()] = p;
    return Status::Ok();
  });
  INFO(s.ToString());
  REQUIRE(s.ok());
  for (int k = 0; k < kKernelCount; ++k) {
    INFO(KernelName(static_cast<Kernel>(k)));
    CHECK(std::isfinite(by_rank[0].kernel_seconds[k]));
    CHECK(by_rank[0].kernel_seconds[k] > 0);
    CHECK(by_rank[1].kernel_seconds[k] == by_rank[0].kernel_seconds[k]);
  }
  CHECK(by_rank[1].ToJson() == by_rank[0].ToJson());
  auto parsed = MachineProfile::Parse(by_rank[0].ToJson(), "<calibrated>");
  REQUIRE(parsed.ok());
  CHECK(parsed->ToJson() == by_rank[0].ToJson());
}

TEST_CASE("Ascending: the least-squares ascending fit, an outlier pooled with its neighbours") {
  CHECK(Ascending({1, 2, 3}) == std::vector<double>{1, 2, 3});
  CHECK(Ascending({1, 3, 2, 4}) == std::vector<double>{1, 2.5, 2.5, 4});
  // One slow early outlier is averaged in, not carried to every later size.
  CHECK(Ascending({1, 9, 2, 3, 20}) == std::vector<double>{1, 14.0 / 3, 14.0 / 3, 14.0 / 3, 20});
  CHECK(Ascending({3, 2, 1}) == std::vector<double>{2, 2, 2});
  CHECK(Ascending({}).empty());
}

TEST_CASE("calibration times collectives at every size and group size, never less for more bytes") {
  // 3: rank 2 sits out the ping-pong; 4: groups of 2 (two at once) and 4.
  for (int n : {2, 3, 4}) {
    INFO(n << " ranks");
    std::vector<std::vector<CollectiveTable>> by_rank(n);
    std::mutex mu;
    const Status s = RunInProcess(n, [&](Communicator& world) -> Status {
      ASSIGN_OR_RETURN(std::vector<CollectiveTable> t, MeasureCollectives(world, int64_t{1} << 20));
      std::lock_guard<std::mutex> lock(mu);
      by_rank[world.rank()] = t;
      return Status::Ok();
    });
    INFO(s.ToString());
    REQUIRE(s.ok());
    const std::vector<CollectiveTable>& tables = by_rank[1];
    const std::vector<int> groups = n == 4 ? std::vector<int>{2, 4} : std::vector<int>{n};
    REQUIRE(tables.size() == 3 * groups.size() + 1);
    for (int r = 0; r < n; ++r) {
      REQUIRE(by_rank[r].size() == tables.size());
      for (size_t k = 0; k < tables.size(); ++k)
        CHECK(by_rank[r][k].seconds == tables[k].seconds);  // rank 0's
    }
    for (size_t i = 0; i < groups.size(); ++i) {
      CHECK(tables[3 * i].kind == CollectiveKind::kAllReduce);
      CHECK(tables[3 * i + 1].kind == CollectiveKind::kAllGather);
      CHECK(tables[3 * i + 2].kind == CollectiveKind::kReduceScatter);
      for (int k = 0; k < 3; ++k) CHECK(tables[3 * i + k].group == groups[i]);
    }
    CHECK(tables.back().kind == CollectiveKind::kSendRecv);  // a ping-pong of ranks 0 and 1
    CHECK(tables.back().group == 2);
    CHECK(tables.back().bytes == std::vector<double>{4096, 16384, 65536, 262144, 1048576});
    for (const CollectiveTable& t : tables) {
      REQUIRE(t.bytes.size() == 5);
      // A whole block per rank: 4 KiB rounded down to a multiple of the group's floats.
      CHECK(t.bytes.front() == 4 * (1024 / t.group * t.group));
      REQUIRE(t.seconds.size() == t.bytes.size());
      CHECK(t.seconds.front() > 0);
      CHECK(std::is_sorted(t.seconds.begin(), t.seconds.end()));
    }
    // The profile prices each group's collectives from its own table.
    const MachineProfile line = TestProfile();
    MachineProfile p = line;
    p.collectives = tables;
    for (const CollectiveTable& t : tables) {
      CHECK(p.CollectiveSeconds(t.kind, t.bytes[2], t.group, false) ==
            Approx(std::max(t.seconds[2],
                            line.CollectiveSeconds(t.kind, t.bytes[2], t.group, false))));
    }
  }
}

TEST_CASE("the shipped machine profiles load, each for its backend") {
  const std::string dir = std::string(TESSERA_SOURCE_DIR) + "/samples/gpt/profiles/";
  for (const auto& [file, backend] :
       std::vector<std::pair<std::string, std::string>>{{"debian-vm-2core.json", "inprocess"},
                                                        {"debian-vm-2core-mpi.json", "mpi"},
                                                        {"debian-vm-2core-gloo.json", "gloo"}}) {
    INFO(file);
    auto p = MachineProfile::Load(dir + file);
    REQUIRE(p.ok());
    CHECK(p->backend == backend);
    CHECK(p->devices_per_host == 2);
    CHECK(p->intra_host.latency_s > 0);
    CHECK(p->intra_host.bandwidth > 0);
    // Calibrated with the collectives' tables, every kind at 2 ranks.
    REQUIRE(p->collectives.size() == 4);
    for (const CollectiveTable& t : p->collectives) {
      CHECK(t.group == 2);
      CHECK(t.bytes.size() == 7);
      CHECK(std::is_sorted(t.seconds.begin(), t.seconds.end()));
    }
    // And every kernel measured.
    for (int k = 0; k < kKernelCount; ++k) {
      INFO(KernelName(static_cast<Kernel>(k)));
      CHECK(p->kernel_seconds[k] > 0);
    }
  }
}

const GptConfig kConfig{.layers = 4, .heads = 4, .embed = 32, .context = 16, .vocab = 96};
constexpr int kB = 8, kT = 16;

std::vector<int32_t> Tokens(int seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(kB * kT);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % kConfig.vocab);
  return t;
}

// Every rank's memory after two steps and the units its kernels processed
// in the second, by world rank.
struct RankRun {
  MemoryUse memory;
  std::array<double, kKernelCount> units{};
};
std::vector<RankRun> Measured(const ParallelConfig& par, int ranks) {
  std::vector<RankRun> out(ranks);
  std::mutex mu;
  const Status s = RunInProcess(ranks, [&](Communicator& world) -> Status {
    ASSIGN_OR_RETURN(std::unique_ptr<ParallelGpt> p, ParallelGpt::Create(kConfig, par, world));
    p->Init(1);
    const auto tokens = Tokens(1), targets = Tokens(2);
    for (int step = 0; step < 2; ++step) {
      kernels::CountUnits(step == 1);
      RETURN_IF_ERROR(
          p->Step(tokens.data(), targets.data(), kB, kT, AdamWConfig{}, 1.0f, nullptr).status());
    }
    kernels::CountUnits(false);
    std::lock_guard<std::mutex> lock(mu);
    out[world.rank()] = {p->Memory(), kernels::CountedUnits()};
    return Status::Ok();
  });
  INFO(s.ToString());
  REQUIRE(s.ok());
  return out;
}

std::shared_ptr<const OpStrategyFile> File(const std::string& name) {
  auto f =
      OpStrategyFile::Load(std::string(TESSERA_SOURCE_DIR) + "/samples/gpt/strategies/" + name);
  REQUIRE(f.ok());
  return std::make_shared<OpStrategyFile>(*f);
}

struct Case {
  const char* name;
  ParallelConfig par;
};

// Configurations of 4 ranks that the predictions are checked against.
std::vector<Case> Cases() {
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
    p.recompute = *ParseRecompute(recompute);
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
  // No strategy file, tp = 1, no recompute: the runtime runs its Gpt whole,
  // whose buffers are laid out apart from the operators' (7% more activation
  // bytes here).
  add("dp4, no strategy file (the whole Gpt runs)", 1, 4, 1, 0, 0, false, "none");
  add("pp2 dp2, no strategy file, 4 micro-batches", 2, 2, 1, 0, 4, false, "none");
  add("tp2 dp2 megatron-sp, full recompute, 2 micro-batches", 1, 2, 2, 0, 2, true, "full");
  add("pp4, 8 micro-batches", 4, 1, 1, 0, 8, false, "none", std::make_shared<OpStrategyFile>());
  return cases;
}

TEST_CASE("predicted per-rank memory and kernel work match the runtime's") {
  const std::vector<Case> cases = Cases();
  const MachineProfile prof = TestProfile();
  for (const Case& c : cases) {
    INFO(c.name);
    auto pred = PredictGptStep(kConfig, kB, kT, c.par, prof);
    INFO(pred.status().ToString());
    REQUIRE(pred.ok());
    const std::vector<RankRun> runs = Measured(c.par, 4);
    for (int r = 0; r < 4; ++r) {
      if (r % c.par.tp != 0) continue;  // tp rank 0: the predicted shard
      const int stage = r / (c.par.dp * c.par.tp);
      const MemoryUse& want = pred->stage_memory[stage];
      const MemoryUse& got = runs[r].memory;
      INFO("rank " << r << " stage " << stage);
      CHECK(want.parameters == got.parameters);
      CHECK(want.gradients == got.gradients);
      CHECK(want.optimizer == Approx(got.optimizer).epsilon(0.02));
      CHECK(want.activations == Approx(got.activations).epsilon(0.02));
      CHECK(want.communication == Approx(got.communication).epsilon(0.02));
      CHECK(want.total() == Approx(got.total()).epsilon(0.05));
      // The kernels the model prices are the kernels that run, unit for
      // unit (a copy or a kernel the runtime adds and the model misses
      // fails here).
      for (int k = 0; k < kKernelCount; ++k) {
        INFO(KernelName(static_cast<Kernel>(k)));
        // Under ZeRO-1 the optimizer's units are a rank's shard: the model
        // takes ceil(rows / dp) of each parameter's tp slice (the largest
        // shard; the cases here have dp = 2 or 4, where the shards are all
        // but equal), ShardGrid cuts the whole tensor's rows, which can give
        // a rank one row more or less (0.14% in mlp_batch_split.json's case).
        const bool shard = c.par.zero == 1 && k >= static_cast<int>(Kernel::kAdamW);
        CHECK(runs[r].units[k] ==
              Approx(pred->stage_kernel_units[stage][k]).epsilon(shard ? 0.005 : 1e-9));
      }
    }
  }
}

TEST_CASE("a pipeline stage's send buffers do not grow with the micro-batches") {
  // pp2, 8 micro-batches of one sequence: stage 1 receives one micro-batch's
  // activations and sends input gradients from two buffers in turn (one per
  // micro-batch, as before, was 100 GiB a rank of the SC'21 1T-parameter
  // run); stage 0 receives one micro-batch's output gradient.
  ParallelConfig par;
  par.pp = 2;
  par.micro_batches = kB;
  par.op_strategy = std::make_shared<OpStrategyFile>();
  const std::vector<RankRun> got = Measured(par, 2);
  const int64_t micro = int64_t{kT} * kConfig.embed * 4;  // one sequence's [T, C] floats
  CHECK(got[0].memory.communication == micro);
  CHECK(got[1].memory.communication == 3 * micro);
  auto pred = PredictGptStep(kConfig, kB, kT, par, TestProfile());
  REQUIRE(pred.ok());
  CHECK(pred->stage_memory[1].communication == 3 * micro);
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

TEST_CASE("ranks sharing devices: a pipeline's waiting stages lend their share") {
  // 4 ranks on one host of 2 CPU-like devices (two ranks a device) against
  // the same job with a device each.
  MachineProfile own = TestProfile();
  own.matmul_flops = 1e9;
  own.memory_bandwidth = 1e10;
  MachineProfile shared = own;
  shared.devices_per_host = 2;
  shared.hosts = 1;
  const GptConfig c{.layers = 4, .heads = 4, .embed = 64, .context = 32, .vocab = 128};
  ParallelConfig pp4;
  pp4.pp = 4;
  pp4.micro_batches = 4;
  auto a = PredictGptStep(c, 8, 32, pp4, shared), b = PredictGptStep(c, 8, 32, pp4, own);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  // Charged the shared device throughout, the pipeline would take twice its
  // own-device time; with waits lending, less, but more than with a device
  // each and no less than all stages' work on 2 devices.
  double work = 0;
  for (double s : b->stage_seconds) work += 4 * s;
  CHECK(a->pipeline > b->pipeline);
  CHECK(a->pipeline < 2 * b->pipeline * 0.9);
  CHECK(a->pipeline >= work / 2);
  // One micro-batch: one stage works at a time, at a whole device (the
  // others sleep), as fast as with a device each.
  pp4.micro_batches = 1;
  auto one = PredictGptStep(c, 8, 32, pp4, shared), mine = PredictGptStep(c, 8, 32, pp4, own);
  REQUIRE(one.ok());
  REQUIRE(mine.ok());
  CHECK(one->pipeline == Approx(mine->pipeline).epsilon(1e-9));
  // Without a pipeline nobody waits: the shared device's price, twice the
  // compute (collectives, which the test profile's links make small, apart).
  ParallelConfig dp4;
  dp4.dp = 4;
  auto d = PredictGptStep(c, 8, 32, dp4, shared), e = PredictGptStep(c, 8, 32, dp4, own);
  REQUIRE(d.ok());
  REQUIRE(e.ok());
  CHECK(d->compute == Approx(2 * e->compute).epsilon(1e-9));
  // The search's bounds allow for lending: on the shared machine its plan is
  // no slower than any of these pipelines priced one by one.
  SearchOptions o;
  o.mode = SearchMode::kExact;
  auto r = SearchGptParallel(c, 8, 32, 4, shared, o);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  for (const auto& [p, d_, t, m] : std::vector<std::tuple<int, int, int, int>>{
           {4, 1, 1, 4}, {4, 1, 1, 8}, {2, 2, 1, 2}, {2, 1, 2, 4}, {2, 1, 2, 8}}) {
    ParallelConfig x;
    x.pp = p;
    x.dp = d_;
    x.tp = t;
    x.micro_batches = m;
    auto q = PredictGptStep(c, 8, 32, x, shared);
    INFO(p << " " << d_ << " " << t << " " << m);
    REQUIRE(q.ok());
    CHECK(r->predicted.seconds <= q->seconds * (1 + 1e-12));
  }
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
    auto s = ResolveOpStrategies(
        *r.parallel.op_strategy, OpGpt::Signatures(big),
        *Mesh::Create({"pp", "dp", "tp"}, {r.parallel.pp, r.parallel.dp, r.parallel.tp}));
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
  // It says why, and which device counts nearby can.
  auto odd = SearchGptParallel(c, 3, 256, 5, TestProfile(), SearchOptions{});
  REQUIRE_FALSE(odd.ok());
  INFO(odd.status().message());
  CHECK(odd.status().message().find("no parallel configuration of 5 ranks runs a batch of 3 x 256 "
                                    "on 4 layers (pipeline stages at most the layers") !=
        std::string::npos);
  CHECK(odd.status().message().find("; in fast mode 2, 3, 4, 6, 8 or 9 ranks can") !=
        std::string::npos);
  // Each of those does run.
  for (int n : {2, 3, 4, 6, 8, 9}) {
    INFO(n << " ranks");
    CHECK(SearchGptParallel(c, 3, 256, n, TestProfile(), SearchOptions{}).ok());
  }
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

const MachineProfile& Dgx() {
  static const MachineProfile p = [] {
    auto r = MachineProfile::Load(std::string(TESSERA_SOURCE_DIR) +
                                  "/samples/gpt/profiles/dgx-a100-80gb.json");
    REQUIRE(r.ok());
    return *r;
  }();
  return p;
}

OpStrategyFile::Entry Entry(const std::string& pattern, std::vector<InputStrategy> inputs) {
  OpStrategyFile::Entry e;
  e.pattern = pattern;
  for (const auto& in : inputs) e.counts.emplace_back(in.size(), 1);
  e.axes = std::move(inputs);
  return e;
}

// A file that fixes the mesh and the settings (and no operator yet).
OpStrategyFile Settings(const std::string& source, int tp) {
  OpStrategyFile f;
  f.source = source;
  f.pp = 1;
  f.dp = 1;
  f.tp = tp;
  f.zero = 0;
  f.micro_batches = 1;
  return f;
}

// The search's choice for every operator of block 0 and the ends.
std::map<std::string, std::string> Chosen(const GptConfig& c, const SearchResult& r) {
  auto mesh = Mesh::Create({"pp", "dp", "tp"}, {r.parallel.pp, r.parallel.dp, r.parallel.tp});
  REQUIRE(mesh.ok());
  REQUIRE(r.parallel.op_strategy != nullptr);
  auto s = ResolveOpStrategies(*r.parallel.op_strategy, OpGpt::Signatures(c), *mesh);
  REQUIRE(s.ok());
  std::map<std::string, std::string> out;
  for (const auto& [name, st] : *s) {
    if (!name.starts_with("h.") || name.starts_with("h.0.")) out[name] = st.ToString();
  }
  return out;
}

Result<SearchResult> Propagate(const GptConfig& c, int B, int T, int devices,
                               const OpStrategyFile& f, int64_t budget = 0) {
  SearchOptions o;
  o.mode = SearchMode::kPropagate;
  o.fixed = std::make_shared<OpStrategyFile>(f);
  o.rank_memory = budget;
  return SearchGptParallel(c, B, T, devices, Dgx(), o);
}

TEST_CASE(
    "exact keeps to strategies that cut every dimension evenly (7 devices, nothing divisible)") {
  // 7 divides no weight dimension here: only the (uneven) rows may be cut.
  const GptConfig c{.layers = 2, .heads = 2, .embed = 32, .context = 32, .vocab = 256};
  SearchOptions o;
  o.mode = SearchMode::kExact;
  // This VM's profile: where the search once chose c_fc cut by columns,
  // which resolving the plan's file then refused.
  auto vm = MachineProfile::Load(std::string(TESSERA_SOURCE_DIR) +
                                 "/samples/gpt/profiles/debian-vm-2core.json");
  REQUIRE(vm.ok());
  auto r = SearchGptParallel(c, 8, 32, 7, *vm, o);
  INFO((r.ok() ? r->name : r.status().message()));
  REQUIRE(r.ok());
  CHECK(r->parallel.tp == 7);  // the only factorization: pp 7 > 2 layers, dp 7 does not divide 8
  CHECK(Chosen(c, *r).size() == 14);  // every operator's strategy resolves (REQUIREd inside)
}

TEST_CASE("the exact search equals brute force on a small graph, with and without a budget") {
  // One block on tp = 2: eight operators fixed, six free (c_attn,
  // attention, c_proj, c_fc, mlp.c_proj, lm_head): 1,536 assignments, each
  // predicted by the full walk (PredictGptStep), against the search's sums
  // of halves with its dominance pruning and bounds.
  const GptConfig c{.layers = 1, .heads = 4, .embed = 32, .context = 16, .vocab = 96};
  const int B = 8, T = 16;
  const DimAxes none, d{"dp"}, t{"tp"}, dt{"dp", "tp"};
  OpStrategyFile fixed = Settings("<fixed>", 2);
  fixed.recompute = {{"h.*", Recompute::kNone}};
  fixed.operators = {Entry("h.*.ln_1", {{dt, none}}),
                     Entry("h.*.ln_2", {{dt, none}}),
                     Entry("ln_f", {{dt, none}}),
                     Entry("h.*.add_1", {{dt, none}, {dt, none}}),
                     Entry("h.*.add_2", {{dt, none}, {dt, none}}),
                     Entry("h.*.mlp.gelu", {{d, t}}),
                     Entry("embedding", {{none, none}, {dt}}),
                     Entry("loss", {{d, t}, {d}})};
  const std::vector<InputStrategy> linear[] = {{{d, none}, {none, none}},
                                               {{d, none}, {none, t}},
                                               {{d, t}, {t, none}},
                                               {{dt, none}, {none, none}}};
  const std::vector<InputStrategy> attention[] = {{{d, none}}, {{d, t}}, {{dt, none}}};
  const std::vector<InputStrategy> head[] = {{{d, none}, {none, none}}, {{dt, none}, {none, none}}};
  struct Best {
    double seconds = 1e300;
    int64_t memory = 0;
    std::map<std::string, std::string> ops;
  };
  auto brute = [&](int64_t budget) {
    Best best;
    int64_t runs = 0;
    for (const auto& qkv : linear)
      for (const auto& attn : attention)
        for (const auto& proj : linear)
          for (const auto& fc : linear)
            for (const auto& fcproj : linear)
              for (const auto& lm : head) {
                OpStrategyFile f = fixed;
                f.operators.push_back(Entry("h.*.attn.c_attn", qkv));
                f.operators.push_back(Entry("h.*.attn.attention", attn));
                f.operators.push_back(Entry("h.*.attn.c_proj", proj));
                f.operators.push_back(Entry("h.*.mlp.c_fc", fc));
                f.operators.push_back(Entry("h.*.mlp.c_proj", fcproj));
                f.operators.push_back(Entry("lm_head", lm));
                ParallelConfig par;
                par.tp = 2;
                par.micro_batches = 1;
                par.op_strategy = std::make_shared<OpStrategyFile>(f);
                auto p = PredictGptStep(c, B, T, par, Dgx());
                if (!p.ok()) continue;  // a strategy that cannot run here
                ++runs;
                if (p->memory.total() > budget || !(p->seconds < best.seconds)) continue;
                SearchResult as{par, *p};
                best = {p->seconds, p->memory.total(), Chosen(c, as)};
              }
    CHECK(runs > 1000);
    return best;
  };
  const Best free = brute(std::numeric_limits<int64_t>::max());
  auto r = Propagate(c, B, T, 2, fixed);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(r->predicted.seconds == Approx(free.seconds).epsilon(1e-12));
  CHECK(Chosen(c, *r) == free.ops);
  // Under a budget below that optimum's memory, another optimum.
  const Best tight = brute(free.memory - 1);
  REQUIRE(tight.seconds < 1e300);
  CHECK(tight.seconds > free.seconds);
  auto rt = Propagate(c, B, T, 2, fixed, free.memory - 1);
  INFO(rt.status().ToString());
  REQUIRE(rt.ok());
  CHECK(rt->predicted.seconds == Approx(tight.seconds).epsilon(1e-12));
  CHECK(Chosen(c, *rt) == tight.ops);
}

TEST_CASE("exact rediscovers Megatron's column/row alternation when weights dominate") {
  // Model: 2 blocks, C = 4096, 32 heads, vocabulary 32768; batch 4 x 128
  // tokens; mesh tp = 8 (the file fixes only the mesh and the settings);
  // no budget. Expected: c_attn and c_fc by columns, c_proj and mlp.c_proj
  // by rows, attention by heads, vocabulary-parallel embedding and loss.
  const GptConfig c{.layers = 2, .heads = 32, .embed = 4096, .context = 128, .vocab = 32768};
  const OpStrategyFile mesh = Settings("<tp8>", 8);
  auto r = Propagate(c, 4, 128, 8, mesh);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  INFO(r->name);
  const auto ops = Chosen(c, *r);
  CHECK(ops.at("h.0.attn.c_attn") == "((dp, -), (-, tp))");
  CHECK(ops.at("h.0.attn.attention") == "((dp, tp),)");
  CHECK(ops.at("h.0.attn.c_proj") == "((dp, tp), (tp, -))");
  CHECK(ops.at("h.0.mlp.c_fc") == "((dp, -), (-, tp))");
  CHECK(ops.at("h.0.mlp.c_proj") == "((dp, tp), (tp, -))");
  CHECK(ops.at("embedding") == "((tp, -), (dp,))");
  CHECK(ops.at("loss") == "((dp, tp), (dp,))");
  // Short sequences: the layer norms stay whole (no sequence parallelism).
  CHECK(ops.at("h.0.ln_1") == "((dp, -),)");
  // Long ones (2048 tokens): activations dominate, and the layer norms and
  // residual adds are cut by rows over tp (Megatron's sequence
  // parallelism) while the MLP stays Megatron's.
  GptConfig longer = c;
  longer.context = 2048;
  longer.vocab = 8192;
  auto l = Propagate(longer, 4, 2048, 8, mesh);
  REQUIRE(l.ok());
  INFO(l->name);
  const auto lops = Chosen(longer, *l);
  for (const char* op : {"h.0.ln_1", "h.0.ln_2"}) CHECK(lops.at(op) == "((dp*tp, -),)");
  for (const char* op : {"h.0.add_1", "h.0.add_2"})
    CHECK(lops.at(op) == "((dp*tp, -), (dp*tp, -))");
  CHECK(lops.at("h.0.mlp.c_fc") == "((dp, -), (-, tp))");
  CHECK(lops.at("h.0.mlp.c_proj") == "((dp, tp), (tp, -))");
}

TEST_CASE("a layer norm measured slow tips the search to sequence parallelism") {
  // The short-sequence job above keeps its layer norms whole on the DGX's
  // roofline. Measured 40 times slower than that (a CPU's layer norm,
  // whose per-row reductions this VM runs at 3x its roofline, and a GPU's
  // unfused one are both far off it), they are worth cutting by rows over
  // tp, with the residual adds between them.
  const GptConfig c{.layers = 2, .heads = 32, .embed = 4096, .context = 128, .vocab = 32768};
  SearchOptions o;
  o.mode = SearchMode::kPropagate;
  o.fixed = std::make_shared<OpStrategyFile>(Settings("<tp8>", 8));
  MachineProfile slow = Dgx();
  slow.kernel_seconds[static_cast<int>(Kernel::kLayerNormForward)] = 40 * 8 / slow.memory_bandwidth;
  slow.kernel_seconds[static_cast<int>(Kernel::kLayerNormBackward)] =
      40 * 12 / slow.memory_bandwidth;
  auto fast = SearchGptParallel(c, 4, 128, 8, Dgx(), o);
  auto r = SearchGptParallel(c, 4, 128, 8, slow, o);
  INFO(r.status().ToString());
  REQUIRE(fast.ok());
  REQUIRE(r.ok());
  INFO(r->name);
  CHECK(Chosen(c, *fast).at("h.0.ln_1") == "((dp, -),)");
  const auto ops = Chosen(c, *r);
  for (const char* op : {"h.0.ln_1", "h.0.ln_2"}) CHECK(ops.at(op) == "((dp*tp, -),)");
  CHECK(ops.at("h.0.mlp.c_fc") == "((dp, -), (-, tp))");
  CHECK(r->predicted.seconds > fast->predicted.seconds);
  // The roofline's own figures, measured, change nothing.
  MachineProfile roofline = Dgx();
  roofline.kernel_seconds[static_cast<int>(Kernel::kLayerNormForward)] =
      8 / roofline.memory_bandwidth;
  roofline.kernel_seconds[static_cast<int>(Kernel::kLayerNormBackward)] =
      12 / roofline.memory_bandwidth;
  auto same = SearchGptParallel(c, 4, 128, 8, roofline, o);
  REQUIRE(same.ok());
  CHECK(same->name == fast->name);
  CHECK(same->predicted.seconds == Approx(fast->predicted.seconds).epsilon(1e-9));
}

TEST_CASE("exact chooses pure data parallelism when the batch dwarfs the hidden size") {
  // MindSpore's own test: a MatMul on 16 devices whose batch dwarfs its
  // weights gets [[16, 1], [1, 1]]. Model: 2 blocks, C = 64; batch 512 x 64.
  const GptConfig c{.layers = 2, .heads = 4, .embed = 64, .context = 64, .vocab = 512};
  SearchOptions o;
  o.mode = SearchMode::kExact;
  auto r = SearchGptParallel(c, 512, 64, 16, Dgx(), o);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  INFO(r->name);
  // Every rank a replica: the rows cut over all 16 devices (over dp, or
  // over dp and then tp, where the cost model sums the gradients over tp
  // inside a host first), the weights whole.
  CHECK(r->parallel.pp == 1);
  CHECK(r->parallel.dp * r->parallel.tp == 16);
  const auto ops = Chosen(c, *r);
  for (const char* op : {"h.0.attn.c_attn", "h.0.attn.c_proj", "h.0.mlp.c_fc", "h.0.mlp.c_proj"}) {
    CHECK(ops.at(op) == (r->parallel.tp == 1 ? "((dp, -), (-, -))" : "((dp*tp, -), (-, -))"));
  }
}

TEST_CASE("exact is never slower than fast, and its answer does not depend on the file's order") {
  const GptConfig c{.layers = 4, .heads = 8, .embed = 256, .context = 256, .vocab = 4096};
  SearchOptions o;
  o.mode = SearchMode::kFast;
  auto f = SearchGptParallel(c, 16, 256, 8, Dgx(), o);
  o.mode = SearchMode::kExact;
  auto e = SearchGptParallel(c, 16, 256, 8, Dgx(), o);
  REQUIRE(f.ok());
  REQUIRE(e.ok());
  CHECK(e->predicted.seconds <= f->predicted.seconds);
  // propagate from a file, its operators listed in two orders.
  const DimAxes none, d{"dp"}, t{"tp"};
  OpStrategyFile a;
  a.source = "<a>";
  a.tp = 4;
  a.operators = {Entry("h.*.mlp.c_fc", {{d, none}, {none, t}}),
                 Entry("h.*.attn.c_attn", {{d, none}, {none, t}}),
                 Entry("embedding", {{t, none}, {d}})};
  OpStrategyFile b = a;
  std::reverse(b.operators.begin(), b.operators.end());
  auto ra = Propagate(c, 16, 256, 8, a), rb = Propagate(c, 16, 256, 8, b);
  INFO(ra.status().ToString());
  REQUIRE(ra.ok());
  REQUIRE(rb.ok());
  CHECK(ra->name == rb->name);
  CHECK(ra->parallel.op_strategy->ToJson() == rb->parallel.op_strategy->ToJson());
  // The file's choices are kept.
  const auto ops = Chosen(c, *ra);
  CHECK(ops.at("h.0.mlp.c_fc") == "((dp, -), (-, tp))");
  CHECK(ra->parallel.tp == 4);
  // A strategy the operator refuses is named.
  OpStrategyFile bad = a;
  bad.operators.push_back(Entry("h.*.ln_1", {{t, none}}));
  auto rbad = Propagate(c, 16, 256, 8, bad);
  REQUIRE_FALSE(rbad.ok());
  CHECK(rbad.status().message().find("ln_1") != std::string::npos);
}

TEST_CASE("operator strategy files round-trip through ToJson") {
  OpStrategyFile f = OpGpt::Megatron(true);
  f.pp = 2;
  f.dp = 2;
  f.tp = 2;
  f.zero = 1;
  f.micro_batches = 4;
  f.stage_layers = {3, 1};
  f.recompute = {{"h.*", Recompute::kSelective}};
  auto back = OpStrategyFile::Parse(f.ToJson(), "<json>");
  INFO(f.ToJson());
  REQUIRE(back.ok());
  CHECK(back->ToJson() == f.ToJson());
  CHECK(back->stage_layers == f.stage_layers);
  REQUIRE(back->operators.size() == f.operators.size());
  for (size_t i = 0; i < f.operators.size(); ++i)
    CHECK(back->operators[i].axes == f.operators[i].axes);
}

}  // namespace
}  // namespace tessera

#include "ckpt/mindspore.h"

namespace tessera {
namespace {

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

namespace tessera {
namespace {

TEST_CASE("the per-operator shares add up to the stage's work") {
  const GptConfig c{.layers = 3, .heads = 4, .embed = 32, .context = 16, .vocab = 96};
  for (auto [sp, rc] : {std::pair<bool, const char*>{false, "none"},
                        {true, "none"},
                        {false, "full"},
                        {true, "selective"}}) {
    INFO("sequence parallel " << sp << ", recompute " << rc);
    ParallelConfig par;
    par.tp = 2;
    par.sequence_parallel = sp;
    par.recompute = *ParseRecompute(rc);
    auto mesh = par.MakeMesh();
    REQUIRE(mesh.ok());
    const GptStage gs = ParallelGpt::StageOf(c, 1, 0, 2, 0);
    auto ops = ParallelGpt::StageOps(c, par, *mesh, gs);
    REQUIRE(ops.ok());
    std::vector<StageWork> per_block;
    const StageWork whole = EstimateStage(**ops, 128, 16, &per_block);
    // The shares are of a block entered from another (the second); the
    // first, entered from the embedding, differs by its conversions.
    REQUIRE(per_block.size() == 3);
    StageWork expected = whole;
    expected.flops += per_block[1].flops - per_block[0].flops;
    expected.bytes += per_block[1].bytes - per_block[0].bytes;
    for (int k = 0; k < kKernelCount; ++k)
      expected.kernel[k] += per_block[1].kernel[k] - per_block[0].kernel[k];
    for (int k = 0; k < 4; ++k)
      expected.comm_bytes[k] += per_block[1].comm_bytes[k] - per_block[0].comm_bytes[k];
    double flops = 0, bytes = 0, comm = 0, kernel[kKernelCount] = {};
    for (const auto& [name, w] : EstimateOps(**ops, 128, 16)) {
      const double n = name.starts_with("h.") ? c.layers : 1;  // each block alike
      flops += n * w.flops;
      bytes += n * w.bytes;
      for (int k = 0; k < kKernelCount; ++k) kernel[k] += n * w.kernel[k];
      for (double b : w.comm_bytes) comm += n * b;
    }
    double whole_comm = 0;
    for (double b : expected.comm_bytes) whole_comm += b;
    CHECK(flops == Approx(expected.flops));
    CHECK(bytes == Approx(expected.bytes));
    for (int k = 0; k < kKernelCount; ++k) {
      INFO(KernelName(static_cast<Kernel>(k)));
      CHECK(kernel[k] == Approx(expected.kernel[k]));
      if (k != static_cast<int>(Kernel::kSquaredNorm) && k != static_cast<int>(Kernel::kAdamW)) {
        CHECK(whole.kernel[k] > 0);  // every kernel of a stage with both ends is counted
      }
    }
    CHECK(comm == Approx(whole_comm));
  }
}

}  // namespace
}  // namespace tessera
