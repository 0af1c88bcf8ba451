// ckpt merge: any sliced checkpoint -> full tensors in one data file.
#include "cli/common.h"
#include "cli/verbs.h"

namespace tessera::cli {

CLI::App* AddMergeVerb(CLI::App& app, std::function<int()>* run) {
  struct Args {
    std::string src, out, src_strategy;
    IoFlags io;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("merge", "Merge a sliced checkpoint into full tensors");
  cmd->add_option("src", a->src, "source checkpoint")->required();
  cmd->add_option("-o,--output", a->out, "output checkpoint directory")->required();
  AddSourceStrategyFlag(cmd, &a->src_strategy);
  AddIoFlags(cmd, &a->io, true);
  cmd->callback([a, run] {
    *run = [a] {
      auto src = OpenSource(a->src, a->src_strategy);
      if (!src.ok()) return Report(src.status());
      return RunWrite(**src, MergedStrategy((*src)->strategy()), a->out, a->io, "merge");
    };
  });
  return cmd;
}

}  // namespace tessera::cli
