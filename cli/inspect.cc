// ckpt inspect: what a checkpoint holds.
#include "ckpt/inspect.h"

#include <iostream>

#include "cli/common.h"
#include "cli/verbs.h"

namespace tessera::cli {

CLI::App* AddInspectVerb(CLI::App& app, std::function<int()>* run) {
  struct Args {
    std::string src, src_strategy;
    bool json = false, files = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("inspect", "List a checkpoint's tensors and layouts");
  cmd->add_option("src", a->src, "checkpoint")->required();
  AddSourceStrategyFlag(cmd, &a->src_strategy);
  cmd->add_flag("--json", a->json, "machine-readable output (lists the files too)");
  cmd->add_flag("--files", a->files,
                "also list a native checkpoint's files: bytes, host, redundancy group, role");
  cmd->callback([a, run] {
    *run = [a] {
      auto src = OpenSource(a->src, a->src_strategy);
      if (!src.ok()) return Report(src.status());
      std::cout << (a->json ? InspectJson(**src) : InspectText(**src, a->files));
      return 0;
    };
  });
  return cmd;
}

}  // namespace tessera::cli
