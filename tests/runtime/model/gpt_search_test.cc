// The automatic-parallelism search (runtime/model/gpt_search.h): what it
// chooses (rankings and rediscovery, which do not depend on this
// machine's speed), against brute force on a small graph, its budget and
// its errors.
#include "runtime/model/gpt_search.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>

#include "tests/runtime/cost/test_profiles.h"

namespace tessera {
namespace {

using testing::Dgx;
using testing::TestProfile;

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

TEST_CASE("nothing fits in memory: the search offloads the optimizer, then the weights too") {
  // Weights and moments dwarf the activations (one short sequence).
  const GptConfig c{.layers = 4, .heads = 8, .embed = 512, .context = 32, .vocab = 8192};
  ParallelConfig par;
  par.offload_dir = "/nonexistent";  // a plan is priced, nothing written
  auto need = [&](bool optimizer, bool params) {
    par.offload_optimizer = optimizer;
    par.offload_params = params;
    auto p = PredictGptStep(c, 1, 32, par, TestProfile());
    REQUIRE(p.ok());
    return p->memory.total();
  };
  const int64_t in_memory = need(false, false), opt = need(true, false), both = need(true, true);
  REQUIRE(in_memory > opt);
  REQUIRE(opt > both);
  SearchOptions o;
  o.mode = SearchMode::kExact;  // (fast has no one-rank template)
  o.offload_dir = "/scratch";
  // Between the optimizer offloaded and everything in memory.
  o.rank_memory = (in_memory + opt) / 2;
  auto r = SearchGptParallel(c, 1, 32, 1, TestProfile(), o);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(r->parallel.offload_optimizer);
  CHECK_FALSE(r->parallel.offload_params);
  CHECK(r->parallel.offload_dir == "/scratch");
  CHECK(r->name.find("offload=optimizer") != std::string::npos);
  CHECK(r->predicted.memory.total() <= o.rank_memory);
  CHECK(r->predicted.memory.offloaded_optimizer > 0);
  // Offloading costs time: the update waits for the disk.
  SearchOptions roomy;
  roomy.mode = SearchMode::kExact;
  auto mem = SearchGptParallel(c, 1, 32, 1, TestProfile(), roomy);
  REQUIRE(mem.ok());
  CHECK(mem->predicted.optimizer < r->predicted.optimizer);
  // Below that: the weights too.
  o.rank_memory = both + (1 << 20);
  r = SearchGptParallel(c, 1, 32, 1, TestProfile(), o);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(r->parallel.offload_params);
  CHECK(r->name.find("offload=optimizer,params") != std::string::npos);
  // Without a directory offload is never chosen; below everything, the
  // error says offload was tried.
  o.offload_dir.clear();
  CHECK(SearchGptParallel(c, 1, 32, 1, TestProfile(), o).status().code() ==
        StatusCode::kResourceExhausted);
  o.offload_dir = "/scratch";
  o.rank_memory = 1 << 20;
  auto none = SearchGptParallel(c, 1, 32, 1, TestProfile(), o);
  REQUIRE_FALSE(none.ok());
  CHECK_THAT(std::string(none.status().message()),
             Catch::Contains("even with the optimizer and the weights offloaded"));
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

TEST_CASE("long sequences: the search finds context parallelism (a rediscovery)") {
  // One sequence of 4,096 tokens (batch 1: no data parallelism) through 4
  // layers of 8 heads x 16 on 4 ranks of this VM's profile, 128 MiB a rank:
  // the attention's T^2 dominates. Expected: the sequence cut over cp 4
  // with ring attention (no T^2 kept, its transfers under the blocks'
  // compute), faster than anything without cp.
  const GptConfig c{.layers = 4, .heads = 8, .embed = 128, .context = 4096, .vocab = 256};
  auto vm = MachineProfile::Load(std::string(TESSERA_SOURCE_DIR) +
                                 "/samples/gpt/profiles/debian-vm-2core.json");
  REQUIRE(vm.ok());
  SearchOptions o;
  o.mode = SearchMode::kExact;
  o.rank_memory = int64_t{128} << 20;
  auto r = SearchGptParallel(c, 1, 4096, 4, *vm, o);
  INFO((r.ok() ? r->name : r.status().message()));
  REQUIRE(r.ok());
  CHECK(r->parallel.cp == 4);
  CHECK(r->parallel.cp_algo == CpAlgo::kRing);
  CHECK(r->name.find("cp=4") != std::string::npos);
  CHECK(r->name.find("cp_algo=ring") != std::string::npos);
  CHECK(r->predicted.memory.total() <= o.rank_memory);
  REQUIRE(r->parallel.op_strategy != nullptr);
  CHECK(r->parallel.op_strategy->cp == 4);
  // Its plan runs as predicted: the full walk prices it alike.
  auto walked = PredictGptStep(c, 1, 4096, r->parallel, *vm);
  REQUIRE(walked.ok());
  CHECK(walked->seconds == Approx(r->predicted.seconds).epsilon(0.02));
  // Without cp (a propagate file fixing nothing but leaving no cp axis),
  // the best plan is slower.
  o.mode = SearchMode::kPropagate;
  o.fixed = std::make_shared<OpStrategyFile>();
  auto without = SearchGptParallel(c, 1, 4096, 4, *vm, o);
  INFO((without.ok() ? without->name : without.status().message()));
  if (without.ok()) {
    CHECK(without->parallel.cp == 1);
    CHECK(without->predicted.seconds > r->predicted.seconds);
  }
  // Ulysses keeps whole sequences of heads / cp: its activations per rank
  // are within 1.3x of a quarter of one rank's running the sequence alone.
  ParallelConfig u = r->parallel;
  u.op_strategy = nullptr;
  u.cp_algo = CpAlgo::kUlysses;
  u.zero = 0;
  auto pu = PredictGptStep(c, 1, 4096, u, *vm), p1 = PredictGptStep(c, 1, 4096, {}, *vm);
  REQUIRE(pu.ok());
  REQUIRE(p1.ok());
  const double att1 = 8.0 * 4096 * 4096 * 4 * c.layers;  // the weights, every layer
  CHECK(p1->memory.activations > att1);
  CHECK(pu->memory.activations < p1->memory.activations / 4 * 1.3);
  CHECK(walked->memory.activations < p1->memory.activations / 4);  // ring: no T^2
  // Short sequences: no cp.
  o.mode = SearchMode::kExact;
  o.fixed = nullptr;
  o.rank_memory = 0;
  auto s = SearchGptParallel(c, 16, 256, 4, *vm, o);
  REQUIRE(s.ok());
  CHECK(s->parallel.cp == 1);
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

TEST_CASE("interleaved pipelines: the search prices virtual stages as the full walk does") {
  // Eight layers on pp 2 with as few micro-batches as stages: 1F1B idles
  // a third of the step, two chunks per stage halve that for twice the
  // transfers (cheap on NVLink).
  const GptConfig c{.layers = 8, .heads = 8, .embed = 512, .context = 256, .vocab = 8192};
  OpStrategyFile f = Settings("<pp2>", 1);
  f.pp = 2;
  f.micro_batches = 2;
  f.recompute = {{"h.*", Recompute::kNone}};
  auto r = Propagate(c, 8, 256, 2, f);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  INFO(r->name);
  CHECK(r->parallel.virtual_stages == 2);
  CHECK(r->name.find(" virtual_stages=2 ") != std::string::npos);
  REQUIRE(r->parallel.stage_layers.size() == 4);  // balanced per chunk
  CHECK(r->parallel.op_strategy->virtual_stages == 2);
  // The folded prediction is the full walk's of the plan, chunk by chunk.
  auto full = PredictGptStep(c, 8, 256, r->parallel, Dgx());
  REQUIRE(full.ok());
  CHECK(full->seconds == Approx(r->predicted.seconds).epsilon(1e-9));
  CHECK(full->memory.total() == r->predicted.memory.total());
  // Against the same plan without chunks: less bubble, more transfers and
  // activations in flight.
  ParallelConfig one = r->parallel;
  one.virtual_stages = 1;
  one.stage_layers = {4, 4};
  auto plain = PredictGptStep(c, 8, 256, one, Dgx());
  REQUIRE(plain.ok());
  CHECK(full->bubble < plain->bubble);
  CHECK(full->pp_comm > plain->pp_comm);
  CHECK(full->memory.activations > plain->memory.activations);
  CHECK(full->seconds < plain->seconds);
  // A file that fixes one chunk per stage keeps it.
  f.virtual_stages = 1;
  auto kept = Propagate(c, 8, 256, 2, f);
  REQUIRE(kept.ok());
  CHECK(kept->parallel.virtual_stages == 1);
  CHECK(kept->predicted.seconds > r->predicted.seconds);
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

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

TEST_CASE("multi-copy: exposed tp communication, and the search takes copies where they pay") {
  // Of min(compute, comm) all but one copy's share hides.
  CHECK(ExposedTpComm(4.0, 2.0, 1) == 2.0);
  CHECK(ExposedTpComm(4.0, 2.0, 2) == Approx(1.0));
  CHECK(ExposedTpComm(1.0, 3.0, 2) == Approx(2.5));
  CHECK(ExposedTpComm(4.0, 2.0, 4) == Approx(0.5));
  // A model whose weights force tp on 8 devices: the search prices its plan
  // with 2 copies and keeps them exactly when the full walk says faster.
  const GptConfig big{.layers = 8, .heads = 32, .embed = 4096, .context = 512, .vocab = 32768};
  const int64_t budget = int64_t{16} << 30;
  int priced = 0;
  for (int B : {8, 64}) {
    INFO("batch " << B);
    SearchOptions o;
    o.rank_memory = budget;
    auto r = SearchGptParallel(big, B, 512, 8, TestProfile(), o);
    REQUIRE(r.ok());
    INFO(r->name);
    REQUIRE(r->parallel.tp > 1);
    ParallelConfig one = r->parallel, two = r->parallel;
    one.micro_batch_interleave = 1;
    two.micro_batch_interleave = 2;
    auto p1 = PredictGptStep(big, B, 512, one, TestProfile());
    auto p2 = PredictGptStep(big, B, 512, two, TestProfile());
    REQUIRE(p1.ok());
    const bool copies = r->parallel.micro_batch_interleave == 2;
    CHECK((r->name.find("micro_batch_interleave=2") != std::string::npos) == copies);
    if (!p2.ok()) {  // micro-batches of one sequence
      CHECK(!copies);
    } else {
      ++priced;
      CHECK(p2->tp_comm < p1->tp_comm);  // copies hide some
      CHECK(copies == (p2->seconds < p1->seconds && p2->memory.total() <= budget));
    }
    if (copies) {
      REQUIRE(r->parallel.op_strategy != nullptr);
      CHECK(r->parallel.op_strategy->micro_batch_interleave == 2);
    }
    // propagate keeps a file's micro_batch_interleave 1.
    auto fixed = std::make_shared<OpStrategyFile>(*r->parallel.op_strategy);
    fixed->micro_batch_interleave = 1;
    o.mode = SearchMode::kPropagate;
    o.fixed = fixed;
    auto kept = SearchGptParallel(big, B, 512, 8, TestProfile(), o);
    REQUIRE(kept.ok());
    CHECK(kept->parallel.micro_batch_interleave == 1);
  }
  CHECK(priced > 0);
}

}  // namespace
}  // namespace tessera
