// ckpt split: full (or any) tensors -> the slices of a strategy.
#include "cli/common.h"
#include "cli/verbs.h"

namespace tessera::cli {

CLI::App* AddSplitVerb(CLI::App& app, std::function<int()>* run) {
  struct Args {
    std::string src, out, strategy, src_strategy;
    IoFlags io;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("split", "Slice a checkpoint by a strategy");
  cmd->add_option("src", a->src, "source checkpoint")->required();
  AddSourceStrategyFlag(cmd, &a->src_strategy);
  cmd->add_option("-o,--output", a->out, "output checkpoint directory")->required();
  cmd->add_option("--strategy,--dst-strategy", a->strategy, "destination strategy (JSON)")
      ->required();
  AddIoFlags(cmd, &a->io, true);
  cmd->callback([a, run] {
    *run = [a] {
      auto src = OpenSource(a->src, a->src_strategy);
      if (!src.ok()) return Report(src.status());
      std::set<std::string> unnamed;
      auto dst = DestinationStrategy(**src, a->strategy, "", &unnamed);
      if (!dst.ok()) return Report(dst.status());
      return RunWrite(**src, *dst, a->out, a->io, "split", unnamed);
    };
  });
  return cmd;
}

}  // namespace tessera::cli
