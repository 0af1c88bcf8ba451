// ckpt reshard: layout A on N ranks -> layout B on M ranks.
#include "cli/common.h"
#include "cli/verbs.h"

namespace tessera::cli {

CLI::App* AddReshardVerb(CLI::App& app, std::function<int()>* run) {
  struct Args {
    std::string src, out, src_strategy, strategy, mesh;
    IoFlags io;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd =
      app.add_subcommand("reshard", "Re-slice a checkpoint for another strategy or mesh");
  cmd->add_option("src", a->src, "source checkpoint")->required();
  cmd->add_option("-o,--output", a->out, "output checkpoint directory")->required();
  cmd->add_option("--strategy,--dst-strategy", a->strategy, "destination strategy (JSON)");
  cmd->add_option("--mesh", a->mesh, "the source's split axes on this mesh, e.g. dp=2,tp=4");
  AddSourceStrategyFlag(cmd, &a->src_strategy);
  AddIoFlags(cmd, &a->io, true);
  cmd->callback([a, run] {
    *run = [a] {
      auto src = OpenSource(a->src, a->src_strategy);
      if (!src.ok()) return Report(src.status());
      std::set<std::string> unnamed;
      auto dst = DestinationStrategy(**src, a->strategy, a->mesh, &unnamed);
      if (!dst.ok()) return Report(dst.status());
      return RunWrite(**src, *dst, a->out, a->io, "reshard", unnamed);
    };
  });
  return cmd;
}

}  // namespace tessera::cli
