// make_checkpoint: writes a GPT-2-shaped checkpoint of deterministic
// synthetic values, sliced for a mesh, for demos, CLI tests and benchmarks.
//
//   make_checkpoint -o DIR [--mesh dp=2,tp=4] [--zero] [--optimizer]
//                   [--layers 12 --embed 768 --vocab 50304 --context 1024]
//                   [--size 1GiB] [--seed 1] [--compress zstd:3] [--merged]
//                   [--strategy-out FILE]   (the strategy as JSON; alone: no checkpoint)
#include <CLI/CLI.hpp>
#include <cstdio>

#include "ckpt/ops.h"
#include "core/byte_size.h"
#include "samples/gpt_strategy.h"
#include "samples/synthetic_checkpoint.h"

namespace tessera {
namespace {

int Fail(const Status& s) {
  std::fprintf(stderr, "make_checkpoint: %s\n", s.ToString().c_str());
  return 1;
}

// Adam's first and second moments beside every parameter, laid out alike.
Status AddOptimizerStates(Strategy* s) {
  Strategy out(s->mesh());
  for (const TensorStrategy& t : s->tensors()) RETURN_IF_ERROR(out.Add(t));
  for (const char* moment : {"exp_avg", "exp_avg_sq"}) {
    for (const TensorStrategy& t : s->tensors()) {
      TensorStrategy m = t;
      m.name = "optimizer." + t.name + "." + moment;
      RETURN_IF_ERROR(out.Add(std::move(m)));
    }
  }
  *s = std::move(out);
  return Status::Ok();
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  using namespace tessera;
  CLI::App app{"make_checkpoint: a synthetic GPT-2-shaped checkpoint"};
  std::string out, strategy_out, mesh_text = "dp=2,tp=4", size_text, compress = "none";
  samples::GptShape shape;
  bool zero = false, optimizer = false, merged = false;
  uint64_t seed = 1;
  int threads = 0;
  app.add_option("-o,--output", out, "output checkpoint directory");
  app.add_option("--strategy-out", strategy_out, "also write the strategy (JSON) here");
  app.add_option("--mesh", mesh_text, "mesh of the strategy (axes pp, dp, tp)");
  app.add_flag("--zero", zero, "shard every tensor over dp (ZeRO)");
  app.add_flag("--optimizer", optimizer, "add Adam moments beside every parameter");
  app.add_flag("--merged", merged, "write full tensors (one rank)");
  app.add_option("--layers", shape.layers);
  app.add_option("--embed", shape.embed);
  app.add_option("--vocab", shape.vocab);
  app.add_option("--context", shape.context);
  app.add_option("--size", size_text, "pick --layers for about this many bytes, e.g. 1GiB");
  app.add_option("--seed", seed);
  app.add_option("--compress", compress, "none or zstd[:LEVEL]");
  app.add_option("--threads", threads);
  CLI11_PARSE(app, argc, argv);

  auto mesh = Mesh::Parse(mesh_text);
  if (!mesh.ok()) return Fail(mesh.status());
  if (!size_text.empty()) {
    auto target = ParseByteSize(size_text);
    if (!target.ok()) return Fail(target.status().Annotate("--size"));
    const double per_layer = 12.0 * shape.embed * shape.embed * 4 * (optimizer ? 3 : 1);
    const double fixed = (shape.vocab + shape.context) * shape.embed * 4.0 * (optimizer ? 3 : 1);
    shape.layers = std::max<int64_t>(1, static_cast<int64_t>((*target - fixed) / per_layer + 0.5));
  }
  auto strategy = samples::GptStrategy(shape, *mesh, zero);
  if (!strategy.ok()) return Fail(strategy.status());
  if (optimizer) {
    Status s = AddOptimizerStates(&*strategy);
    if (!s.ok()) return Fail(s);
  }
  if (!strategy_out.empty()) {
    Status s = SaveStrategyFile(Env::Default(), strategy_out, *strategy);
    if (!s.ok()) return Fail(s);
    if (out.empty()) return 0;
  }
  if (out.empty()) return Fail(InvalidArgumentError("give -o DIR and/or --strategy-out FILE"));
  samples::SyntheticCheckpoint source(*strategy, seed, /*step=*/1000);
  WriteOptions o;
  o.transform.threads = threads;
  Status parsed = ParseCompression(compress, &o.native);
  if (!parsed.ok()) return Fail(parsed.Annotate("--compress"));
  const Strategy target = merged ? MergedStrategy(*strategy) : *strategy;
  auto stats = WriteTransformed(Env::Default(), source, target, out, o);
  if (!stats.ok()) return Fail(stats.status());
  std::printf("make_checkpoint: wrote %s: %lld layers, %lld tensors, %s, mesh %s\n", out.c_str(),
              static_cast<long long>(shape.layers), static_cast<long long>(stats->tensors),
              HumanBytes(stats->bytes).c_str(), merged ? "r=1" : mesh->ToString().c_str());
  return 0;
}
