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
#include "runtime/model/gpt_search.h"
#include "transform/strategy.h"

namespace tessera::cli {
namespace {

struct AutoArgs {
  GptConfig config{.layers = 12, .heads = 12, .embed = 768, .context = 1024, .vocab = 50257};
  int batch = 8, seq = 0, devices = 8;
  std::string mode = "exact", profile, rank_memory, fixed, why;
  std::string write_ops, write_strategy, write_mindspore;
  double bucket_mib = 25;
  bool describe = false;
};

std::string Ms(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f ms", s * 1e3);
  return buf;
}

// "pp=2,dp=2,tp=2,zero=1,micro_batches=4,recompute=selective,
// strategy=megatron|megatron_sp|data_parallel|FILE": a configuration to
// compare with the search's.
Result<ParallelConfig> ParseAlternative(const std::string& text) {
  ParallelConfig p;
  std::string strategy;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      return InvalidArgumentError("--why '" + text + "': '" + item + "' is not key=value");
    }
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    auto number = [&](int* out) -> Status {
      try {
        *out = std::stoi(value);
      } catch (...) {
        return InvalidArgumentError("--why: " + key + " '" + value + "' is not a number");
      }
      return Status::Ok();
    };
    if (key == "pp") {
      RETURN_IF_ERROR(number(&p.pp));
    } else if (key == "dp") {
      RETURN_IF_ERROR(number(&p.dp));
    } else if (key == "tp") {
      RETURN_IF_ERROR(number(&p.tp));
    } else if (key == "zero") {
      RETURN_IF_ERROR(number(&p.zero));
    } else if (key == "micro_batches") {
      RETURN_IF_ERROR(number(&p.micro_batches));
    } else if (key == "recompute") {
      ASSIGN_OR_RETURN(p.recompute, ParseRecompute(value));
    } else if (key == "strategy") {
      strategy = value;
    } else {
      return InvalidArgumentError("--why: unknown key '" + key +
                                  "' (pp, dp, tp, zero, micro_batches, recompute, strategy)");
    }
  }
  if (strategy == "megatron_sp") {
    p.sequence_parallel = true;
  } else if (strategy == "data_parallel") {
    p.op_strategy = std::make_shared<OpStrategyFile>();
  } else if (!strategy.empty() && strategy != "megatron") {
    ASSIGN_OR_RETURN(OpStrategyFile f, OpStrategyFile::Load(strategy));
    p.op_strategy = std::make_shared<OpStrategyFile>(std::move(f));
  }
  return p;
}

Status RunAuto(const AutoArgs& a, std::ostream& out) {
  if (a.profile.empty()) return InvalidArgumentError("give the machine: --profile FILE");
  ASSIGN_OR_RETURN(MachineProfile profile, MachineProfile::Load(a.profile));
  const int T = a.seq > 0 ? a.seq : a.config.context;
  SearchOptions options;
  ASSIGN_OR_RETURN(options.mode, ParseSearchMode(a.mode));
  options.bucket_bytes = static_cast<int64_t>(a.bucket_mib * (1 << 20));
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
  out << "search: " << a.mode << " over " << a.devices << " devices of " << profile.name << ", "
      << r.candidates << " configurations costed in " << Ms(took) << "\n";
  out << "chosen: " << r.name << "\n  predicted " << r.predicted.ToString() << "\n";
  if (budget > 0) out << "  budget " << HumanBytes(budget) << " per rank\n";
  const ParallelConfig& par = r.parallel;
  if (par.pp > 1) {
    out << "  stages (layers, seconds per micro-batch, memory):";
    for (int s = 0; s < par.pp; ++s) {
      out << (s ? "; " : " ") << par.stage_layers[s] << " layers "
          << Ms(r.predicted.stage_seconds[s]) << " "
          << HumanBytes(r.predicted.stage_memory[s].total());
    }
    out << "\n";
  }
  for (const auto& [name, p] : r.alternatives) {
    char pct[32];
    std::snprintf(pct, sizeof pct, "%+.1f%%", 100 * (p.seconds / r.predicted.seconds - 1));
    out << "  runner-up " << name << ": " << Ms(p.seconds) << " (" << pct << "), "
        << HumanBytes(p.memory.total()) << " per rank\n";
  }
  {
    // Where a micro-batch's time goes, operator by operator.
    ASSIGN_OR_RETURN(auto stages, BreakdownGptStep(a.config, a.batch, T, par, profile));
    for (size_t s = 0; s < stages.size(); ++s) {
      if (stages.size() > 2 && s > 0 && s + 1 < stages.size()) continue;  // middles repeat
      const GptStage gs =
          ParallelGpt::StageOf(a.config, par.pp, static_cast<int>(s), par.tp, 0, par.stage_layers);
      const int blocks = (gs.last_layer < 0 ? a.config.layers : gs.last_layer) - gs.first_layer;
      out << "per operator, one micro-batch"
          << (stages.size() > 1 ? " on stage " + std::to_string(s) : "")
          << " (compute + tp collectives; block operators once per block, x" << blocks << "):\n";
      for (const OpCost& c : stages[s]) {
        char line[160];
        std::snprintf(line, sizeof line, "  %-24s %10s + %10s\n", c.name.c_str(),
                      Ms(c.compute).c_str(), Ms(c.comm).c_str());
        out << line;
      }
    }
  }
  if (a.describe) {
    // Every operator of each stage with its placements and the
    // redistributions inserted between them.
    ASSIGN_OR_RETURN(Mesh mesh, par.MakeMesh());
    const int64_t rows = static_cast<int64_t>(a.batch) / par.dp / par.micro_batches * T;
    for (int s = 0; s < par.pp; ++s) {
      const GptStage stage = ParallelGpt::StageOf(a.config, par.pp, s, par.tp, 0, par.stage_layers);
      ASSIGN_OR_RETURN(std::unique_ptr<OpGpt> ops,
                       ParallelGpt::StageOps(a.config, par, mesh, stage));
      if (par.pp > 1) out << "stage " << s << ":\n";
      out << ops->Describe(rows);
    }
  }
  if (!a.why.empty()) {
    ASSIGN_OR_RETURN(ParallelConfig alt, ParseAlternative(a.why));
    alt.bucket_bytes = options.bucket_bytes;
    auto p = PredictGptStep(a.config, a.batch, T, alt, profile);
    if (!p.ok()) {
      out << "why not " << a.why << ": it cannot run: " << p.status().message() << "\n";
    } else {
      char pct[32];
      std::snprintf(pct, sizeof pct, "%+.1f%%", 100 * (p->seconds / r.predicted.seconds - 1));
      out << "why not " << a.why << ": predicted " << p->ToString() << "\n  " << pct
          << " step time against the chosen plan";
      if (budget > 0 && p->memory.total() > budget) {
        out << "; and it needs " << HumanBytes(p->memory.total()) << " per rank, over the "
            << HumanBytes(budget) << " budget";
      }
      out << "\n  where the time goes (alternative / chosen): compute " << Ms(p->compute) << " / "
          << Ms(r.predicted.compute) << ", tp collectives " << Ms(p->tp_comm) << " / "
          << Ms(r.predicted.tp_comm) << ", bubble " << Ms(p->bubble) << " / "
          << Ms(r.predicted.bubble) << ", gradient sums " << Ms(p->dp_comm) << " / "
          << Ms(r.predicted.dp_comm) << ", update " << Ms(p->optimizer) << " / "
          << Ms(r.predicted.optimizer) << "\n";
    }
  }
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
  cmd->add_option("--why", a->why,
                  "compare with another configuration: pp=,dp=,tp=,zero=,micro_batches=,"
                  "recompute=,strategy=megatron|megatron_sp|data_parallel|FILE");
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
