// The ckpt program's verbs. Each verb file registers its sub-command and
// returns the process exit code from its callback; logic lives in the
// libraries, the CLI only parses, calls and reports.
#ifndef TESSERA_CLI_VERBS_H_
#define TESSERA_CLI_VERBS_H_

#include <CLI/CLI.hpp>
#include <functional>
#include <iostream>

#include "core/status.h"

namespace tessera::cli {

// Exit codes: 0 success, 1 the operation failed (bad input, I/O error),
// 2 bad usage (CLI11's own).
inline int Report(const Status& status) {
  if (status.ok()) return 0;
  std::cerr << "ckpt: " << status.ToString() << "\n";
  return 1;
}

// Each returns the sub-command; `run` is set to the verb's action.
CLI::App* AddPlanVerb(CLI::App& app, std::function<int()>* run);
CLI::App* AddAutoParallelVerb(CLI::App& app, std::function<int()>* run);
CLI::App* AddMergeVerb(CLI::App& app, std::function<int()>* run);
CLI::App* AddSplitVerb(CLI::App& app, std::function<int()>* run);
CLI::App* AddReshardVerb(CLI::App& app, std::function<int()>* run);
CLI::App* AddConvertVerb(CLI::App& app, std::function<int()>* run);
CLI::App* AddInspectVerb(CLI::App& app, std::function<int()>* run);
CLI::App* AddVerifyVerb(CLI::App& app, std::function<int()>* run);
CLI::App* AddDiffVerb(CLI::App& app, std::function<int()>* run);

}  // namespace tessera::cli

#endif  // TESSERA_CLI_VERBS_H_
