// Micro-benchmark: planning a reshard of a 1,000-tensor GPT-like model from
// 64 ranks [pp=4, dp=2, tp=8] with ZeRO over dp to 48 ranks [pp=3, dp=4,
// tp=4]. Prints the median planning time over several runs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "samples/gpt_strategy.h"
#include "transform/reshard_plan.h"

namespace tessera {
namespace {

int Main() {
  // 83 blocks x 12 parameters + embeddings and final norm = 1,000 tensors.
  const samples::GptShape shape{83, 1024, 50304, 2048};
  auto src = samples::GptStrategy(shape, *Mesh::Parse("pp=4,dp=2,tp=8"), /*zero=*/true);
  auto dst = samples::GptStrategy(shape, *Mesh::Parse("pp=3,dp=4,tp=4"), /*zero=*/false);
  if (!src.ok() || !dst.ok()) return 1;
  std::vector<double> ms;
  size_t copies = 0;
  int64_t bytes = 0;
  for (int run = 0; run < 7; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    auto plan = PlanReshard(*src, *dst);
    const auto t1 = std::chrono::steady_clock::now();
    if (!plan.ok()) {
      std::fprintf(stderr, "plan failed: %s\n", plan.status().ToString().c_str());
      return 1;
    }
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    copies = 0;
    for (const auto& t : plan->tensors) {
      for (const auto& s : t.shards) copies += s.copies.size();
    }
    bytes = plan->total_bytes;
  }
  std::sort(ms.begin(), ms.end());
  std::printf("plan_reshard: %zu tensors, 64 -> 48 ranks, %zu copies, %.2f GiB moved\n",
              src->tensors().size(), copies, bytes / double(1 << 30));
  std::printf("plan_reshard: median %.1f ms (min %.1f, max %.1f) over %zu runs; target < 100 ms\n",
              ms[ms.size() / 2], ms.front(), ms.back(), ms.size());
  return 0;
}

}  // namespace
}  // namespace tessera

int main() { return tessera::Main(); }
