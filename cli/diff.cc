// ckpt diff: compare two checkpoints tensor by tensor.
#include "ckpt/diff.h"

#include <cstdio>

#include "cli/common.h"
#include "cli/verbs.h"
#include "core/utf8.h"

namespace tessera::cli {

CLI::App* AddDiffVerb(CLI::App& app, std::function<int()>* run) {
  struct Args {
    std::string a, b, a_strategy, b_strategy;
    DiffOptions o;
    IoFlags io;
    bool all = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("diff", "Compare the tensors of two checkpoints");
  cmd->add_option("a", a->a, "first checkpoint")->required();
  cmd->add_option("b", a->b, "second checkpoint")->required();
  cmd->add_option("--atol", a->o.atol, "absolute tolerance (default 0: bit-identical)");
  cmd->add_option("--rtol", a->o.rtol, "relative tolerance");
  cmd->add_flag("--all", a->all, "list equal tensors too");
  AddSourceStrategyFlag(cmd, &a->a_strategy, "--a-strategy");
  AddSourceStrategyFlag(cmd, &a->b_strategy, "--b-strategy");
  AddIoFlags(cmd, &a->io, false);
  cmd->callback([a, run] {
    *run = [a] {
      auto ra = OpenSource(a->a, a->a_strategy, "--a-strategy");
      if (!ra.ok()) return Report(ra.status());
      auto rb = OpenSource(a->b, a->b_strategy, "--b-strategy");
      if (!rb.ok()) return Report(rb.status());
      a->o.threads = a->io.threads;
      auto budget = ParseByteSize(a->io.memory_budget);
      if (!budget.ok()) return Report(budget.status());
      a->o.memory_budget = *budget;
      auto r = DiffCheckpoints(**ra, **rb, a->o);
      if (!r.ok()) return Report(r.status());
      if (int rc = PrintDifferingCopies(**ra, a->a); rc != 0) return rc;
      if (int rc = PrintDifferingCopies(**rb, a->b); rc != 0) return rc;
      int64_t bad = 0;
      for (const TensorDiff& t : r->tensors) {
        bad += t.ok() ? 0 : 1;
        if (t.ok() && !a->all) continue;
        if (!t.problem.empty()) {
          std::printf("%s: %s\n", PrintableText(t.name).c_str(), PrintableText(t.problem).c_str());
        } else {
          std::printf("%s: %lld of %lld elements differ, max abs %.6g, max rel %.6g\n",
                      PrintableText(t.name).c_str(), static_cast<long long>(t.differing),
                      static_cast<long long>(t.elements), t.max_abs, t.max_rel);
        }
      }
      if (!a->io.quiet) {
        std::printf("%zu tensors compared, %lld differ\n", r->tensors.size(),
                    static_cast<long long>(bad));
      }
      return r->ok() ? 0 : 1;
    };
  });
  return cmd;
}

}  // namespace tessera::cli
