// ckpt auto-parallel: search a GPT's parallel configuration on a machine
// profile without training; print the plan, its predicted step and memory,
// where the time goes, and answer "why not X"; write the operator strategy
// file train_gpt runs, the checkpoint layouts (tessera and MindSpore
// forms).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "ckpt/mindspore.h"
#include "cli/verbs.h"
#include "core/byte_size.h"
#include "core/env.h"
#include "formats/mindspore_strategy.h"
#include "runtime/model/search_report.h"
#include "transform/strategy.h"

namespace tessera::cli {
namespace {

struct AutoArgs {
  GptConfig config{.layers = 12, .heads = 12, .embed = 768, .context = 1024, .vocab = 50257};
  int batch = 8, seq = 0, devices = 8;
  std::string mode = "exact", profile, rank_memory, fixed, why, offload_dir;
  std::string write_ops, write_strategy, write_mindspore;
  double bucket_mib = 25;
  bool describe = false;
};

// Writes what --write-op-strategy, --write-strategy and --write-mindspore
// ask for.
Status WritePlan(const AutoArgs& a, const ParallelConfig& par, std::ostream& out) {
  Env* env = Env::Default();
  if (!a.write_ops.empty()) {
    RETURN_IF_ERROR(WriteFileAtomically(env, a.write_ops, par.op_strategy->ToJson()));
    out << "wrote the operator strategy to " << a.write_ops << " (train_gpt --op-strategy)\n";
  }
  if (!a.write_strategy.empty() || !a.write_mindspore.empty()) {
    ASSIGN_OR_RETURN(Strategy layouts, ParallelGpt::StrategyOf(a.config, par));
    if (!a.write_strategy.empty()) {
      RETURN_IF_ERROR(SaveStrategyFile(env, a.write_strategy, layouts));
      out << "wrote the checkpoint layouts to " << a.write_strategy << "\n";
    }
    if (!a.write_mindspore.empty()) {
      ASSIGN_OR_RETURN(MindSporeStrategyFile ms, StrategyToMindSpore(layouts));
      RETURN_IF_ERROR(WriteMindSporeStrategy(env, a.write_mindspore, ms));
      out << "wrote the MindSpore strategy checkpoint to " << a.write_mindspore << "\n";
    }
  }
  return Status::Ok();
}

Status RunAuto(const AutoArgs& a, std::ostream& out) {
  if (a.profile.empty()) return InvalidArgumentError("give the machine: --profile FILE");
  ASSIGN_OR_RETURN(MachineProfile profile, MachineProfile::Load(a.profile));
  const int T = a.seq > 0 ? a.seq : a.config.context;
  SearchOptions options;
  ASSIGN_OR_RETURN(options.mode, ParseSearchMode(a.mode));
  options.bucket_bytes = static_cast<int64_t>(a.bucket_mib * (1 << 20));
  options.offload_dir = a.offload_dir;
  if (!a.rank_memory.empty()) {
    ASSIGN_OR_RETURN(options.rank_memory, ParseByteSize(a.rank_memory));
  }
  if (!a.fixed.empty()) {
    ASSIGN_OR_RETURN(OpStrategyFile f, OpStrategyFile::Load(a.fixed));
    options.fixed = std::make_shared<OpStrategyFile>(std::move(f));
  }
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(SearchResult r,
                   SearchGptParallel(a.config, a.batch, T, a.devices, profile, options));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t budget = options.rank_memory > 0 ? options.rank_memory : profile.memory_bytes;
  char ms[32];
  std::snprintf(ms, sizeof ms, "%.3f ms", took * 1e3);
  out << "search: " << a.mode << " over " << a.devices << " devices of " << profile.name << ", "
      << r.candidates << " configurations costed in " << ms << "\n";
  out << "chosen: " << r.name << "\n" << SearchReport(r, budget);
  ASSIGN_OR_RETURN(const std::string breakdown,
                   BreakdownReport(a.config, a.batch, T, r.parallel, profile));
  out << breakdown;
  if (a.describe) {
    ASSIGN_OR_RETURN(const std::string plan, DescribePlan(a.config, a.batch, T, r.parallel));
    out << plan;
  }
  if (!a.why.empty()) {
    ASSIGN_OR_RETURN(ParallelConfig alt, ParseParallelConfig(a.why));
    alt.bucket_bytes = options.bucket_bytes;
    if (alt.offload_optimizer) alt.offload_dir = a.offload_dir.empty() ? "." : a.offload_dir;
    out << WhyNotReport(a.why, PredictGptStep(a.config, a.batch, T, alt, profile), r.predicted,
                        budget);
  }
  return WritePlan(a, r.parallel, out);
}

}  // namespace

CLI::App* AddAutoParallelVerb(CLI::App& app, std::function<int()>* run) {
  auto a = std::make_shared<AutoArgs>();
  CLI::App* cmd = app.add_subcommand(
      "auto-parallel", "Search a GPT's parallel configuration on a machine profile (no training)");
  cmd->add_option("--profile", a->profile,
                  "machine profile (JSON; train_gpt --calibrate writes one)")
      ->required();
  cmd->add_option("--devices", a->devices, "ranks of the job")->check(CLI::PositiveNumber);
  cmd->add_option("--mode", a->mode, "propagate, fast or exact")
      ->check(CLI::IsMember({"propagate", "fast", "exact"}));
  cmd->add_option("--rank-memory", a->rank_memory,
                  "memory per rank the plan must fit (default: the profile's device memory)");
  cmd->add_option("--offload-dir", a->offload_dir,
                  "where the job can offload: when no plan fits the memory, the search takes "
                  "the fastest with the optimizer offloaded, else with the weights too");
  cmd->add_option("--op-strategy", a->fixed, "propagate: the operators (and settings) to keep");
  cmd->add_option("--layers", a->config.layers)->check(CLI::PositiveNumber);
  cmd->add_option("--heads", a->config.heads)->check(CLI::PositiveNumber);
  cmd->add_option("--embed", a->config.embed)->check(CLI::PositiveNumber);
  cmd->add_option("--context", a->config.context)->check(CLI::PositiveNumber);
  cmd->add_option("--vocab", a->config.vocab)->check(CLI::PositiveNumber);
  cmd->add_option("--batch", a->batch, "global batch")->check(CLI::PositiveNumber);
  cmd->add_option("--seq", a->seq, "sequence length (default: the context)");
  cmd->add_option("--bucket-mib", a->bucket_mib, "gradient bucket size")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--describe", a->describe,
                "print every operator's placements and the redistributions between them");
  cmd->add_option(
      "--why", a->why,
      "compare with another configuration: pp=,dp=,cp=,tp=,zero=,micro_batches=,"
      "virtual_stages=,micro_batch_interleave=,recompute=,cp_algo=ring|ulysses,"
      "offload=none|optimizer|optimizer+params,ps_servers= (dp= the workers),ps_staleness=,"
      "strategy=megatron|megatron_sp|data_parallel|FILE");
  cmd->add_option("--write-op-strategy", a->write_ops,
                  "write the plan as an operator strategy file");
  cmd->add_option("--write-strategy", a->write_strategy,
                  "write the plan's checkpoint layouts (a tessera strategy file)");
  cmd->add_option("--write-mindspore", a->write_mindspore,
                  "write the layouts as a MindSpore strategy checkpoint (one stage)");
  cmd->callback([a, run] { *run = [a] { return Report(RunAuto(*a, std::cout)); }; });
  return cmd;
}

}  // namespace tessera::cli
