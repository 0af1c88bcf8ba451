// Operator strategy files: parsing, patterns, MindSpore split counts, and
// every kind of bad file refused with the file, the operator and the
// dimension named, on every rank alike, before anything runs.
#include "runtime/parallel/op_strategy.h"

#include <catch2/catch.hpp>

#include "runtime/comm/inprocess.h"
#include "runtime/model/op_gpt.h"
#include "runtime/model/parallel_gpt.h"
#include "runtime/model/search_report.h"
#include "transform/strategy.h"

namespace tessera {
namespace {

const GptConfig kConfig{.layers = 2, .heads = 4, .embed = 16, .context = 16, .vocab = 64};

Result<std::map<std::string, OpStrategy>> Resolve(const std::string& json, const Mesh& mesh) {
  ASSIGN_OR_RETURN(OpStrategyFile f, OpStrategyFile::Parse(json, "bad.json"));
  return ResolveOpStrategies(f, OpGpt::Signatures(kConfig), mesh);
}

Mesh MeshOf(int dp, int tp) { return *Mesh::Create({"pp", "dp", "tp"}, {1, dp, tp}); }

std::string Error(const std::string& json, int dp = 1, int tp = 2) {
  auto r = Resolve(json, MeshOf(dp, tp));
  REQUIRE_FALSE(r.ok());
  return r.status().message();
}

std::string File(const std::string& operators) {
  return R"({"format": "tessera.op_strategy", "operators": {)" + operators + "}}";
}

TEST_CASE("operator strategy files: patterns, counts, defaults") {
  CHECK(MatchesOpPattern("h.*.mlp.c_fc", "h.12.mlp.c_fc"));
  CHECK_FALSE(MatchesOpPattern("h.*.mlp.c_fc", "h.1.2.mlp.c_fc"));  // '*' stops at a dot
  CHECK_FALSE(MatchesOpPattern("h.*.mlp.c_fc", "h..mlp.c_fc"));     // one character at least
  CHECK(MatchesOpPattern("h.*.*", "h.0.add_1"));

  // An exact name beats a pattern; MindSpore counts map to the one set of
  // axes with that product; unnamed operators run data parallel.
  auto r = Resolve(File(R"("h.*.mlp.c_fc": [["dp", null], [null, "tp"]],
                           "h.1.mlp.c_fc": [[8, 1], [1, 1]],
                           "h.*.mlp.c_proj": [[2, 4], [4, 1]])"),
                   MeshOf(2, 4));
  REQUIRE(r.ok());
  CHECK(r->at("h.0.mlp.c_fc").ToString() == "((dp, -), (-, tp))");
  CHECK(r->at("h.1.mlp.c_fc").ToString() == "((dp*tp, -), (-, -))");
  CHECK(r->at("h.0.mlp.c_proj").ToString() == "((dp, tp), (tp, -))");
  CHECK(r->at("h.0.ln_1").ToString() == "((dp*tp, -),)");
  CHECK(r->at("embedding").ToString() == "((-, -), (dp*tp,))");
  CHECK(r->at("h.1.add_2").ToString() == "((dp*tp, -), (dp*tp, -))");

  // The shipped files parse and resolve on any dp x tp the model allows.
  for (const char* name : {"megatron", "megatron_sp", "mlp_batch_split"}) {
    auto f = OpStrategyFile::Load(std::string(TESSERA_SOURCE_DIR) + "/samples/gpt/strategies/" +
                                  name + ".json");
    INFO(name << ": " << f.status().ToString());
    REQUIRE(f.ok());
    CHECK(ResolveOpStrategies(*f, OpGpt::Signatures(kConfig), MeshOf(2, 2)).ok());
  }
  // The Megatron preset is the shipped file.
  auto shipped = OpStrategyFile::Load(std::string(TESSERA_SOURCE_DIR) +
                                      "/samples/gpt/strategies/megatron_sp.json");
  REQUIRE(shipped.ok());
  CHECK(*ResolveOpStrategies(*shipped, OpGpt::Signatures(kConfig), MeshOf(2, 2)) ==
        *ResolveOpStrategies(OpGpt::Megatron(true), OpGpt::Signatures(kConfig), MeshOf(2, 2)));
}

TEST_CASE("bad operator strategy files name the file, the operator and the dimension") {
  // Not this kind of file, or not JSON.
  CHECK_THAT(OpStrategyFile::Parse(R"({"format": "tessera.strategy", "tensors": {}})", "l.json")
                 .status()
                 .message(),
             Catch::Contains("l.json: this is a layout strategy file"));
  CHECK_THAT(OpStrategyFile::Parse(R"({"operators": {}})", "x.json").status().message(),
             Catch::Contains("x.json: no \"format\" key"));
  CHECK_THAT(OpStrategyFile::Parse("{", "x.json").status().message(), Catch::Contains("not JSON"));
  CHECK_THAT(
      OpStrategyFile::Parse(File(R"("ln_f": [[{"a": 1}, null]])"), "x.json").status().message(),
      Catch::Contains("operator 'ln_f' input 0 dimension 0"));
  CHECK_THAT(OpStrategyFile::Load("/nonexistent/s.json").status().message(),
             Catch::Contains("/nonexistent/s.json"));
  // ... and the layout strategy parser refuses an operator strategy by name.
  CHECK_THAT(ParseStrategyJson(File("")).status().message(),
             Catch::Contains("operator strategy file"));

  // An unknown operator.
  CHECK_THAT(Error(File(R"("h.*.mlp.c_fx": [["dp", null], [null, "tp"]])")),
             Catch::Contains("bad.json: 'h.*.mlp.c_fx' names no operator"));
  // An axis that does not divide the dimension (the weight's 64 columns over 3).
  CHECK_THAT(Error(File(R"("h.*.mlp.c_fc": [["dp", null], [null, "tp"]])"), 1, 3),
             Catch::Contains("bad.json: operator 'h.0.mlp.c_fc': input 1 (weight) dimension 1 of "
                             "size 64 is not divisible by tp = 3"));
  // Conflicting strategies of one parameter name both operators.
  const std::string conflict = Error(File(R"("embedding": [["tp", null], ["dp"]],
                                             "lm_head": [["dp", "tp"], [null, "tp"]])"));
  CHECK_THAT(conflict,
             Catch::Contains("parameter 'wte' is cut ((tp, -),) by operator 'embedding'"));
  CHECK_THAT(conflict, Catch::Contains("((-, tp),) by operator 'lm_head'"));
  // Axes the mesh lacks, used twice, or the pipeline's.
  CHECK_THAT(
      Error(File(R"("ln_f": [["mp", null]])")),
      Catch::Contains("operator 'ln_f': input 0 (x) dimension 0: the mesh [pp=1, dp=1, tp=2] "
                      "has no axis 'mp'"));
  CHECK_THAT(Error(File(R"("h.0.mlp.c_fc": [["tp", "tp"], [null, null]])")),
             Catch::Contains("axis 'tp' cuts two dimensions of one input"));
  CHECK_THAT(Error(File(R"("ln_f": [["pp", null]])")),
             Catch::Contains("'pp' is the pipeline's axis"));
  // A count two sets of axes multiply to.
  CHECK_THAT(Error(File(R"("h.0.mlp.c_fc": [[2, 1], [1, 1]])"), 2, 2),
             Catch::Contains("input 0 (x) dimension 0: split count 2 is ambiguous on mesh "
                             "[pp=1, dp=2, tp=2] (dp or tp)"));
  CHECK_THAT(Error(File(R"("h.0.mlp.c_fc": [[3, 1], [1, 1]])"), 2, 2),
             Catch::Contains("split count 3 is no product"));
  // Wrong arity; patterns that disagree.
  CHECK_THAT(Error(File(R"("ln_f": [["dp", null], ["dp", null]])")),
             Catch::Contains("operator 'ln_f': a layer_norm has 1 inputs; the strategy gives 2"));
  CHECK_THAT(Error(File(R"("ln_f": [["dp"]])")),
             Catch::Contains("input 0 (x) has 2 dimensions; the strategy gives 1"));
  CHECK_THAT(Error(File(R"("h.*.ln_1": [["dp", null]], "h.0.*": [["tp", null]])")),
             Catch::Contains("operator 'h.0.ln_1': patterns 'h.*.ln_1' and 'h.0.*' give it "
                             "different strategies"));
}

// What the operators refuse once the file is resolved: every rank says the
// same, before any communicator or step.
TEST_CASE("strategies the operators cannot run are refused on every rank, nothing run") {
  auto refuse = [](const std::string& json, ParallelConfig parallel, const std::string& want) {
    auto f = OpStrategyFile::Parse(json, "bad.json");
    REQUIRE(f.ok());
    parallel.op_strategy = std::make_shared<const OpStrategyFile>(*f);
    const int ranks = parallel.dp * parallel.tp * parallel.pp;
    std::vector<std::string> messages(ranks);
    const Status s = RunInProcess(ranks, [&](Communicator& world) -> Status {
      const auto p = ParallelGpt::Create(kConfig, parallel, world);
      messages[world.rank()] = p.status().message();
      return Status::Ok();
    });
    REQUIRE(s.ok());
    for (const std::string& m : messages) {
      INFO(m);
      CHECK_THAT(m, Catch::Contains(want));
      CHECK(m == messages[0]);
    }
  };
  refuse(File(R"("h.1.ln_2": [["dp", "tp"]])"), {.tp = 2},
         "operator 'h.1.ln_2': input 0 (x) dimension 1 is what a layer norm normalizes over");
  refuse(File(R"("h.0.mlp.c_fc": [["tp", null], [null, null]])"), {.dp = 2, .tp = 2},
         "operator 'h.0.mlp.c_fc': input 0 (x) dimension 0 (the rows) must be cut over dp first");
  refuse(File(R"("h.0.mlp.c_fc": [["dp", "tp"], [null, null]])"), {.dp = 2, .tp = 2},
         "operator 'h.0.mlp.c_fc': the contracted dimension is cut over tp in input 0 (x) "
         "dimension 1 but nowhere in input 1 (weight) dimension 0");
  refuse(File(R"("h.0.mlp.c_fc": [["dp", null], ["dp", null]])"), {.dp = 2, .tp = 2},
         "operator 'h.0.mlp.c_fc': input 1 (weight) dimension 0 is cut over ((dp,),)");
  refuse(File(R"("h.0.mlp.c_fc": [[["dp", "tp"], null], [null, "tp"]])"), {.dp = 2, .tp = 2},
         "operator 'h.0.mlp.c_fc': tp cuts more than one of x's rows");
  refuse(File(R"("h.0.add_1": [["dp", null], [["dp", "tp"], null]])"), {.tp = 2},
         "operator 'h.0.add_1': its inputs are cut ((dp, -), (dp*tp, -)); both inputs of an add");
  // The file's mesh against the job's.
  refuse(R"({"format": "tessera.op_strategy", "mesh": {"tp": 4}, "operators": {}})", {.tp = 2},
         "bad.json: the file's mesh has tp 4 but the job runs tp 2");
}

TEST_CASE("operator strategy files round-trip through ToJson") {
  OpStrategyFile f = OpGpt::Megatron(true);
  f.pp = 2;
  f.dp = 2;
  f.tp = 2;
  f.zero = 1;
  f.micro_batches = 4;
  f.virtual_stages = 2;
  f.stage_layers = {1, 1, 1, 1};
  f.recompute = {{"h.*", Recompute::kSelective}};
  f.ps_servers = 1;
  f.ps_params = "all";
  f.ps_staleness = 2;
  auto back = OpStrategyFile::Parse(f.ToJson(), "<json>");
  INFO(f.ToJson());
  REQUIRE(back.ok());
  CHECK(back->ToJson() == f.ToJson());
  CHECK(back->stage_layers == f.stage_layers);
  CHECK(back->virtual_stages == 2);
  CHECK(back->ps_staleness == 2);
  // A staleness below 0 (or not a number) is refused by name.
  const std::string json = f.ToJson(), key = "\"ps_staleness\": 2";
  REQUIRE(json.find(key) != std::string::npos);
  for (const char* bad : {"-1", "\"two\""}) {
    std::string text = json;
    text.replace(text.find(key), key.size(), "\"ps_staleness\": " + std::string(bad));
    const auto refused = OpStrategyFile::Parse(text, "ps.json");
    REQUIRE_FALSE(refused.ok());
    CHECK_THAT(refused.status().message(), Catch::Contains("ps.json"));
    CHECK_THAT(refused.status().message(), Catch::Contains("ps_staleness"));
  }
  REQUIRE(back->operators.size() == f.operators.size());
  for (size_t i = 0; i < f.operators.size(); ++i)
    CHECK(back->operators[i].axes == f.operators[i].axes);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

OpStrategyFile Parsed(const std::string& json) {
  auto f = OpStrategyFile::Parse(json, "cp.json");
  INFO(f.status().ToString());
  REQUIRE(f.ok());
  return *f;
}

TEST_CASE("context parallelism in strategy files: mesh cp, cp_algo, dataset_strategy forms") {
  const std::string head = R"({"format": "tessera.op_strategy", )";
  OpStrategyFile f = Parsed(head + R"("mesh": {"dp": 2, "cp": 4}, "cp_algo": "ulysses"})");
  CHECK(f.cp == 4);
  CHECK(f.cp_algo == CpAlgo::kUlysses);
  // Round trip.
  const OpStrategyFile back = Parsed(f.ToJson());
  CHECK(back.cp == 4);
  CHECK(back.cp_algo == CpAlgo::kUlysses);
  auto bad = OpStrategyFile::Parse(head + R"("cp_algo": "zigzag"})", "cp.json");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("cp.json") && Catch::Contains("zigzag"));
  // The model-parallel import, named or as MindSpore's counts; the plain
  // data-parallel layouts stay data_parallel.
  CHECK(Parsed(head + R"("dataset_strategy": "sequence"})").dataset_strategy == "sequence");
  f = Parsed(head + R"("dataset_strategy": [["dp", "cp"], ["dp", "cp"]]})");
  CHECK(f.dataset_strategy == "sequence");
  f = Parsed(head + R"("dataset_strategy": [[2, 4], [2, 4]]})");
  CHECK(f.dataset_strategy == "sequence");
  CHECK(f.dataset_count == 2);
  CHECK(f.dataset_seq_count == 4);
  CHECK(Parsed(head + R"("dataset_strategy": [["dp", 1], ["dp", 1]]})").dataset_strategy ==
        "data_parallel");
  auto mixed =
      OpStrategyFile::Parse(head + R"("dataset_strategy": [["dp", "cp"], ["dp", 1]]})", "cp.json");
  REQUIRE_FALSE(mixed.ok());
  CHECK_THAT(mixed.status().message(), Catch::Contains("cut alike"));
  // The counts are checked against the job's mesh.
  ParallelConfig par;
  par.dp = 2;
  par.cp = 2;
  par.op_strategy = std::make_shared<OpStrategyFile>(f);  // [[2, 4], [2, 4]]
  const Status s = par.Validate(4);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("cuts the sequence 4 ways, but cp is 2"));
}

TEST_CASE("a configuration to compare (--why) takes cp= and cp_algo=") {
  auto p = ParseParallelConfig("pp=1,dp=2,cp=4,tp=1,cp_algo=ulysses");
  REQUIRE(p.ok());
  CHECK(p->cp == 4);
  CHECK(p->cp_algo == CpAlgo::kUlysses);
  auto bad = ParseParallelConfig("cp=2,cp_algo=blocks");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("blocks"));
}

}  // namespace
}  // namespace tessera
