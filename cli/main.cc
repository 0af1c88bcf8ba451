// ckpt: strategy-aware checkpoint tools. Also answers to ckpt-<verb> names
// (argv[0] dispatch), so `ckpt-plan A B` is `ckpt plan A B`.
#include <cstring>
#include <string>
#include <vector>

#include "cli/verbs.h"
#include "core/env.h"

int main(int argc, char** argv) {
  // A reshard to thousands of ranks writes a data file per destination
  // rank at once (the reader of its source keeps at most a quarter of the
  // limit open). Where even the hard limit is too low, the open that fails
  // names its file ("Too many open files").
  tessera::RaiseOpenFileLimit();
  std::vector<std::string> args(argv, argv + argc);
  const std::string self = args[0].substr(args[0].rfind('/') + 1);
  if (self.rfind("ckpt-", 0) == 0) args.insert(args.begin() + 1, self.substr(5));

  CLI::App app{"ckpt: strategy-aware checkpoint tools (Tessera)"};
  app.require_subcommand(1);
  std::function<int()> run;
  namespace cli = tessera::cli;
  for (auto add : {cli::AddMergeVerb, cli::AddSplitVerb, cli::AddReshardVerb, cli::AddConvertVerb,
                   cli::AddInspectVerb, cli::AddVerifyVerb, cli::AddDiffVerb, cli::AddPlanVerb,
                   cli::AddAutoParallelVerb}) {
    add(app, &run);
  }

  std::vector<const char*> cargv;
  for (const std::string& a : args) cargv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(cargv.size()), cargv.data());
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  return run();
}
