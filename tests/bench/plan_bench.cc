// Micro-benchmark: planning a reshard of a 1,000-tensor GPT-like model from
// 64 ranks [pp=4, dp=2, tp=8] with ZeRO over dp to 48 ranks [pp=3, dp=4,
// tp=4]. Prints the median planning time over several runs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "transform/reshard_plan.h"

namespace tessera {
namespace {

// ~1,000 tensors: 83 blocks x 12 parameters + embeddings and final norm.
Strategy GptStrategy(const Mesh& mesh, int64_t stages, bool zero) {
  Strategy s(mesh);
  const int64_t c = 1024, v = 50304, layers = 83;
  auto add = [&](const std::string& name, std::vector<int64_t> shape,
                 std::vector<std::vector<std::string>> split, int64_t stage) {
    Layout l;
    l.shape = std::move(shape);
    l.dtype = DType::kF32;
    l.dim_axes = std::move(split);
    l.stage_axis = "pp";
    l.stage = stage;
    if (zero) l.opt_axes = {"dp"};
    (void)s.Add({name, l, std::nullopt});
  };
  add("wte", {v, c}, {{"tp"}, {}}, 0);
  add("wpe", {2048, c}, {{}, {}}, 0);
  for (int64_t i = 0; i < layers; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    const int64_t st = i * stages / layers;
    add(p + "ln_1.weight", {c}, {{}}, st);
    add(p + "ln_1.bias", {c}, {{}}, st);
    add(p + "attn.c_attn.weight", {c, 3 * c}, {{}, {"tp"}}, st);
    add(p + "attn.c_attn.bias", {3 * c}, {{"tp"}}, st);
    add(p + "attn.c_proj.weight", {c, c}, {{"tp"}, {}}, st);
    add(p + "attn.c_proj.bias", {c}, {{}}, st);
    add(p + "ln_2.weight", {c}, {{}}, st);
    add(p + "ln_2.bias", {c}, {{}}, st);
    add(p + "mlp.c_fc.weight", {c, 4 * c}, {{}, {"tp"}}, st);
    add(p + "mlp.c_fc.bias", {4 * c}, {{"tp"}}, st);
    add(p + "mlp.c_proj.weight", {4 * c, c}, {{"tp"}, {}}, st);
    add(p + "mlp.c_proj.bias", {c}, {{}}, st);
  }
  add("ln_f.weight", {c}, {{}}, stages - 1);
  add("ln_f.bias", {c}, {{}}, stages - 1);
  return s;
}

int Main() {
  const Strategy src = GptStrategy(*Mesh::Create({"pp", "dp", "tp"}, {4, 2, 8}), 4, true);
  const Strategy dst = GptStrategy(*Mesh::Create({"pp", "dp", "tp"}, {3, 4, 4}), 3, false);
  std::vector<double> ms;
  size_t copies = 0;
  int64_t bytes = 0;
  for (int run = 0; run < 7; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    auto plan = PlanReshard(src, dst);
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
              src.tensors().size(), copies, bytes / double(1 << 30));
  std::printf("plan_reshard: median %.1f ms (min %.1f, max %.1f) over %zu runs; target < 100 ms\n",
              ms[ms.size() / 2], ms.front(), ms.back(), ms.size());
  return 0;
}

}  // namespace
}  // namespace tessera

int main() { return tessera::Main(); }
