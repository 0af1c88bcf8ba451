// ParallelMatMul: every strategy on a dp2 x tp2 mesh of in-process ranks,
// with x and dy arriving in the strategy's layouts and in others (a
// redistribution is inserted), against the definition; the layouts it
// derives are the GPT's tensor-parallel ones; bad strategies are named.
#include "runtime/parallel/parallel_ops.h"

#include <catch2/catch.hpp>

#include "runtime/comm/inprocess.h"
#include "runtime/model/parallel_gpt.h"
#include "tests/runtime/parallel/matmul_check.h"

namespace tessera {
namespace {

Status OnMesh(int ranks, const std::string& mesh_text,
              const std::function<Status(const MeshCommunicators&)>& fn) {
  return RunInProcess(ranks, [&](Communicator& world) -> Status {
    ASSIGN_OR_RETURN(Mesh mesh, Mesh::Parse(mesh_text));
    ASSIGN_OR_RETURN(MeshCommunicators comms, MeshCommunicators::Create(world, mesh));
    return fn(comms);
  });
}

TEST_CASE("ParallelMatMul: every strategy and input layout gives the definition's blocks") {
  // Uneven everywhere: 6 rows over dp then tp, 7 columns over tp.
  for (auto [M, K, N] : {std::tuple{6, 10, 7}, std::tuple{8, 4, 12}}) {
    const testing::MatMulData d = testing::MakeMatMulData(M, K, N, 7 + M);
    for (const std::string mesh : {"dp=2,tp=2", "tp=2,dp=2", "dp=1,tp=4"}) {
      DYNAMIC_SECTION(mesh << " M" << M << " K" << K << " N" << N) {
        const int ranks = 4;
        const Status s = OnMesh(ranks, mesh, [&](const MeshCommunicators& comms) {
          return testing::CheckAllMatMuls(comms, d);
        });
        INFO(s.ToString());
        CHECK(s.ok());
      }
    }
  }
}

TEST_CASE("ParallelMatMul: the derived layouts and the communication they need") {
  const Status s = OnMesh(4, "dp=2,tp=2", [&](const MeshCommunicators& comms) -> Status {
    auto op = [&](const std::string& text) -> Result<ParallelMatMul> {
      ASSIGN_OR_RETURN(MatMulStrategy st, MatMulStrategy::Parse(text));
      return ParallelMatMul::Create(comms, st, 8, 16, 64);
    };
    auto expect = [](const Layout& l, const std::string& want) -> Status {
      if (ToString(l) != want) return InternalError(ToString(l) + ", expected " + want);
      return Status::Ok();
    };
    ASSIGN_OR_RETURN(ParallelMatMul column, op("((dp,1),(1,tp))"));
    RETURN_IF_ERROR(expect(column.y_layout(), "shape [8, 64] f32 split [dp, tp]"));
    RETURN_IF_ERROR(expect(column.w_layout(), "shape [16, 64] f32 split [-, tp]"));
    ASSIGN_OR_RETURN(ParallelMatMul row, op("((dp,tp),(tp,1))"));
    RETURN_IF_ERROR(expect(row.y_layout(), "shape [8, 64] f32 split [dp, -]"));
    ASSIGN_OR_RETURN(ParallelMatMul seq, op("((dp,tp),(tp,-)):rs"));
    RETURN_IF_ERROR(expect(seq.y_layout(), "shape [8, 64] f32 split [dp*tp, -]"));
    // No strategy: data parallel.
    ASSIGN_OR_RETURN(
        ParallelMatMul dp,
        ParallelMatMul::Create(comms, MatMulStrategy::DataParallel(comms.mesh()), 8, 16, 64));
    RETURN_IF_ERROR(expect(dp.x_layout(), "shape [8, 16] f32 split [dp, -]"));
    RETURN_IF_ERROR(expect(dp.w_layout(), "shape [16, 64] f32"));
    return Status::Ok();
  });
  INFO(s.ToString());
  CHECK(s.ok());
}

TEST_CASE("ParallelMatMul: the GPT's tensor-parallel layers are these strategies") {
  const GptConfig config{.layers = 2, .heads = 4, .embed = 16, .context = 8, .vocab = 64};
  const int64_t C = config.embed;
  const Status s = RunInProcess(4, [&](Communicator& world) -> Status {
    ASSIGN_OR_RETURN(auto gpt, ParallelGpt::Create(config, {.dp = 2, .tp = 2}, world));
    ASSIGN_OR_RETURN(Strategy strategy, gpt->strategy());
    ASSIGN_OR_RETURN(MeshCommunicators comms, MeshCommunicators::Create(world, strategy.mesh()));
    struct Layer {
      std::string name, strategy;
      int64_t K, N;
    };
    for (const Layer& l : {Layer{"h.0.mlp.c_fc.weight", "((dp,-),(-,tp))", C, 4 * C},
                           Layer{"h.0.mlp.c_proj.weight", "((dp,tp),(tp,-))", 4 * C, C},
                           Layer{"h.1.attn.c_proj.weight", "((dp,tp),(tp,-))", C, C}}) {
      ASSIGN_OR_RETURN(MatMulStrategy st, MatMulStrategy::Parse(l.strategy));
      ASSIGN_OR_RETURN(ParallelMatMul op, ParallelMatMul::Create(comms, st, 8, l.K, l.N));
      const TensorStrategy* t = strategy.Find(l.name);
      if (t == nullptr || t->layout != op.w_layout()) {
        return InternalError(l.name + ": " + (t ? ToString(t->layout) : "missing") + " vs " +
                             ToString(op.w_layout()));
      }
    }
    return Status::Ok();
  });
  INFO(s.ToString());
  CHECK(s.ok());
}

TEST_CASE("ParallelMatMul: bad strategies are named") {
  CHECK_THAT(MatMulStrategy::Parse("((dp,tp),(-,-))").status().message(),
             Catch::Contains("x's columns are cut over 'tp' but w's rows over '-'"));
  CHECK_THAT(MatMulStrategy::Parse("(dp,tp),(tp)").status().message(),
             Catch::Contains("expected ((x rows, x columns), (w rows, w columns))"));
  CHECK_THAT(MatMulStrategy::Parse("((dp,-),(-,tp)):rs").status().message(),
             Catch::Contains("needs partial sums"));
  const Status s = OnMesh(2, "dp=2", [&](const MeshCommunicators& comms) -> Status {
    auto unknown =
        ParallelMatMul::Create(comms, *MatMulStrategy::Parse("((dp,tp),(tp,-))"), 4, 4, 4);
    auto twice = ParallelMatMul::Create(comms, *MatMulStrategy::Parse("((dp,-),(-,dp))"), 4, 4, 4);
    if (unknown.ok() || unknown.status().message().find("no axis 'tp'") == std::string::npos) {
      return InternalError("unknown axis: " + unknown.status().ToString());
    }
    if (twice.ok() ||
        twice.status().message().find("'dp' cuts two dimensions") == std::string::npos) {
      return InternalError("axis twice: " + twice.status().ToString());
    }
    return Status::Ok();
  });
  INFO(s.ToString());
  CHECK(s.ok());
}

}  // namespace
}  // namespace tessera
