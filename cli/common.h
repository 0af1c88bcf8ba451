// What the transforming verbs share: I/O flags, progress on a terminal,
// size parsing, and resolving the destination strategy.
#ifndef TESSERA_CLI_COMMON_H_
#define TESSERA_CLI_COMMON_H_

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include "ckpt/ops.h"
#include "core/byte_size.h"

namespace tessera::cli {

struct IoFlags {
  int threads = 0;
  std::string memory_budget = "256MiB";
  std::string compress = "none";
  std::string redundancy = "none";  // native output
  bool quiet = false;
  bool overwrite = false;
  std::string format = "native";
  std::string max_shard_size;          // safetensors
  std::string prefix = "checkpoint_";  // MindSpore rank files
  std::string save_mindspore_strategy;
};
void AddIoFlags(CLI::App* cmd, IoFlags* flags, bool output);
// --src-strategy (or another flag name): the strategy of a MindSpore
// distributed source, or a Tessera strategy the source is checked against.
void AddSourceStrategyFlag(CLI::App* cmd, std::string* value,
                           const std::string& flag = "--src-strategy");

// A progress bar on stderr while it is a terminal (and not --quiet);
// returns an empty function otherwise.
std::function<void(int64_t, int64_t)> MakeProgress(const std::string& label, bool quiet);

// OpenSource and DestinationStrategy are ckpt/ops.h's, with the CLI's flag
// names in their errors.
Result<std::unique_ptr<CheckpointReader>> OpenSource(const std::string& path,
                                                     const std::string& src_strategy,
                                                     const std::string& flag = "--src-strategy");
Result<Strategy> DestinationStrategy(const CheckpointReader& src, const std::string& strategy_file,
                                     const std::string& mesh,
                                     std::set<std::string>* unnamed = nullptr);

// Prints "note: <what>: ..." for each copy of a tensor several pipeline
// stages hold that differs from the one read (not damage: readers read the
// lowest stage's); returns the error of finding them, else 0.
int PrintDifferingCopies(const CheckpointReader& reader, const std::string& what);

// Runs the transform to `out`, prints a one-line summary unless quiet.
int RunWrite(const CheckpointReader& src, const Strategy& dst, const std::string& out,
             const IoFlags& flags, const std::string& verb,
             const std::set<std::string>& unnamed = {});

}  // namespace tessera::cli

#endif  // TESSERA_CLI_COMMON_H_
