// reshard_demo: the layout algebra end to end, in memory.
//
// Builds the strategy of a GPT-2-style model on a source mesh and on a
// destination mesh, writes both as strategy files, plans the reshard, cuts
// a random model into the source ranks' shards, executes the plan, and
// checks every destination shard against the model bit for bit.
//
//   reshard_demo OUT_DIR [--src pp=1,dp=2,tp=4] [--dst dp=2,tp=2] [--src-zero]
//                [--dst-zero] [--layers 6] [--embed 384]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>

#include "core/env.h"
#include "samples/gpt_strategy.h"
#include "transform/reshard_plan.h"

namespace tessera {
namespace {

struct Args {
  std::string out_dir;
  std::string src = "dp=2,tp=4", dst = "pp=2,dp=1,tp=2";
  bool src_zero = true, dst_zero = false;
  samples::GptShape shape{6, 384, 8192, 512};
};

std::vector<uint8_t> Cut(const std::vector<uint8_t>& full, const Layout& l, const Box& box) {
  const int64_t es = DTypeSize(l.dtype);
  std::vector<uint8_t> out(NumElements(box) * es);
  CopyBox(full.data(), l.shape, box, out.data(), box.extents(), Box::FromShape(box.extents()), es);
  return out;
}

int Run(const Args& a) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "reshard_demo: %s\n", s.ToString().c_str());
    return 1;
  };
  auto src_mesh = Mesh::Parse(a.src);
  if (!src_mesh.ok()) return fail(src_mesh.status());
  auto dst_mesh = Mesh::Parse(a.dst);
  if (!dst_mesh.ok()) return fail(dst_mesh.status());
  auto src = samples::GptStrategy(a.shape, *src_mesh, a.src_zero);
  if (!src.ok()) return fail(src.status());
  auto dst = samples::GptStrategy(a.shape, *dst_mesh, a.dst_zero);
  if (!dst.ok()) return fail(dst.status());
  Env* env = Env::Default();
  if (Status s = env->CreateDirs(a.out_dir); !s.ok()) return fail(s);
  const std::string src_file = JoinPath(a.out_dir, "src_strategy.json");
  const std::string dst_file = JoinPath(a.out_dir, "dst_strategy.json");
  if (Status s = SaveStrategyFile(env, src_file, *src); !s.ok()) return fail(s);
  if (Status s = SaveStrategyFile(env, dst_file, *dst); !s.ok()) return fail(s);
  std::printf("wrote %s (%s%s) and %s (%s%s)\n", src_file.c_str(), src_mesh->ToString().c_str(),
              a.src_zero ? " + ZeRO over dp" : "", dst_file.c_str(), dst_mesh->ToString().c_str(),
              a.dst_zero ? " + ZeRO over dp" : "");

  const auto t0 = std::chrono::steady_clock::now();
  auto plan = PlanReshard(*src, *dst);
  const auto t1 = std::chrono::steady_clock::now();
  if (!plan.ok()) return fail(plan.status());
  std::printf("planned in %.1f ms: %s", std::chrono::duration<double, std::milli>(t1 - t0).count(),
              DescribePlan(*plan, false).c_str());

  std::mt19937_64 rng(42);
  int64_t checked = 0, bytes = 0;
  for (const TensorPlan& tp : plan->tensors) {
    const TensorStrategy& ts = *src->Find(tp.name);
    std::vector<uint8_t> full(ByteSize(ts.layout));
    for (uint8_t& b : full) b = static_cast<uint8_t>(rng());
    auto grid = ShardGrid::Create(src->MeshOf(ts), ts.layout);
    if (!grid.ok()) return fail(grid.status());
    std::map<int64_t, std::vector<uint8_t>> shards;
    for (int64_t r = 0; r < grid->mesh().world_size(); ++r) {
      if (auto box = grid->ShardOf(r)) shards[r] = Cut(full, ts.layout, *box);
    }
    std::map<int64_t, std::vector<uint8_t>> out;
    ExecuteTensorPlan(
        tp, *grid, [&](int64_t r) { return static_cast<const void*>(shards.at(r).data()); },
        [&](const ShardPlan& sp) {
          out[sp.dst_rank].resize(NumElements(sp.shard) * DTypeSize(tp.dtype));
          return static_cast<void*>(out[sp.dst_rank].data());
        });
    for (const ShardPlan& sp : tp.shards) {
      if (out[sp.dst_rank] != Cut(full, ts.layout, sp.shard)) {
        std::fprintf(stderr, "reshard_demo: tensor '%s' rank %lld %s differs\n", tp.name.c_str(),
                     static_cast<long long>(sp.dst_rank), ToString(sp.shard).c_str());
        return 1;
      }
      ++checked;
      bytes += static_cast<int64_t>(out[sp.dst_rank].size());
    }
  }
  std::printf(
      "executed in memory: %lld destination shards (%.1f MiB) equal the model bit for bit\n",
      static_cast<long long>(checked), bytes / 1048576.0);
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::Args a;
  for (int i = 1; i < argc; ++i) {
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (!std::strcmp(argv[i], "--src"))
      a.src = next();
    else if (!std::strcmp(argv[i], "--dst"))
      a.dst = next();
    else if (!std::strcmp(argv[i], "--src-zero"))
      a.src_zero = true;
    else if (!std::strcmp(argv[i], "--no-src-zero"))
      a.src_zero = false;
    else if (!std::strcmp(argv[i], "--dst-zero"))
      a.dst_zero = true;
    else if (!std::strcmp(argv[i], "--layers"))
      a.shape.layers = std::atoll(next().c_str());
    else if (!std::strcmp(argv[i], "--embed"))
      a.shape.embed = std::atoll(next().c_str());
    else if (argv[i][0] != '-' && a.out_dir.empty())
      a.out_dir = argv[i];
    else {
      std::fprintf(stderr,
                   "usage: reshard_demo OUT_DIR [--src MESH] [--dst MESH] "
                   "[--src-zero|--no-src-zero] [--dst-zero] [--layers N] [--embed N]\n");
      return 2;
    }
  }
  if (a.out_dir.empty()) {
    std::fprintf(stderr, "usage: reshard_demo OUT_DIR [options]\n");
    return 2;
  }
  return tessera::Run(a);
}
