// What a stage of the GPT's operators does (runtime/model/gpt_work.h): the
// per-operator shares add up to the stage's work.
#include "runtime/model/gpt_work.h"

#include <catch2/catch.hpp>

#include "runtime/model/parallel_gpt.h"

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
    const GptStage gs = ParallelGpt::StageOf(c, par, 0);
    auto ops = ParallelGpt::StageGraph(c, par, *mesh, gs);
    REQUIRE(ops.ok());
    std::vector<StageWork> per_block;
    const StageWork whole = EstimateStage(*ops, 128, 16, &per_block);
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
    for (const auto& [name, w] : EstimateOps(*ops, 128, 16)) {
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
