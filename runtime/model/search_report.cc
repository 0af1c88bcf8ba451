#include "runtime/model/search_report.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/byte_size.h"

namespace tessera {
namespace {

std::string Ms(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f ms", s * 1e3);
  return buf;
}

std::string Percent(double ours, double theirs) {
  char pct[32];
  std::snprintf(pct, sizeof pct, "%+.1f%%", 100 * (ours / theirs - 1));
  return pct;
}

}  // namespace

std::string SearchReport(const SearchResult& r, int64_t budget) {
  std::ostringstream out;
  out << "  predicted " << r.predicted.ToString() << "\n";
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
    out << "  runner-up " << name << ": " << Ms(p.seconds) << " ("
        << Percent(p.seconds, r.predicted.seconds) << "), " << HumanBytes(p.memory.total())
        << " per rank\n";
  }
  return out.str();
}

Result<std::string> BreakdownReport(const GptConfig& config, int B, int T,
                                    const ParallelConfig& par, const MachineProfile& profile) {
  ASSIGN_OR_RETURN(auto stages, BreakdownGptStep(config, B, T, par, profile));
  std::ostringstream out;
  for (size_t s = 0; s < stages.size(); ++s) {
    if (stages.size() > 2 && s > 0 && s + 1 < stages.size()) continue;  // middles repeat
    const GptStage gs = ParallelGpt::StageOf(config, par, static_cast<int>(s));
    const int blocks = (gs.last_layer < 0 ? config.layers : gs.last_layer) - gs.first_layer;
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
  return out.str();
}

Result<std::string> DescribePlan(const GptConfig& config, int B, int T, const ParallelConfig& par) {
  ASSIGN_OR_RETURN(Mesh mesh, par.MakeMesh());
  const int64_t rows = static_cast<int64_t>(B) / par.dp / par.micro_batches * T / par.cp;
  std::string out;
  for (int s = 0; s < par.pp; ++s) {
    for (int c = 0; c < par.virtual_stages; ++c) {
      const GptStage stage = ParallelGpt::ChunkOf(config, par, s, c);
      ASSIGN_OR_RETURN(const GptGraph graph, ParallelGpt::StageGraph(config, par, mesh, stage));
      if (par.pp > 1) {
        out += "stage " + std::to_string(s) +
               (par.virtual_stages > 1 ? " chunk " + std::to_string(c) : "") + ":\n";
      }
      out += graph.Describe(rows);
    }
  }
  return out;
}

// "pp=2,dp=2,cp=2,tp=2,zero=1,micro_batches=4,virtual_stages=2,
// micro_batch_interleave=2,recompute=selective,cp_algo=ring,
// strategy=megatron|megatron_sp|data_parallel|FILE": a configuration to
// compare with the search's.
namespace {

// `key`=`value` of a configuration into `p` (a strategy name or file into
// `strategy`).
Status SetKey(const std::string& key, const std::string& value, ParallelConfig* p,
              std::string* strategy) {
  int* number = key == "pp"                       ? &p->pp
                : key == "dp"                     ? &p->dp
                : key == "tp"                     ? &p->tp
                : key == "cp"                     ? &p->cp
                : key == "zero"                   ? &p->zero
                : key == "micro_batches"          ? &p->micro_batches
                : key == "virtual_stages"         ? &p->virtual_stages
                : key == "micro_batch_interleave" ? &p->micro_batch_interleave
                : key == "ps_servers"             ? &p->ps_servers
                : key == "ps_staleness"           ? &p->ps_staleness
                                                  : nullptr;
  if (number != nullptr) {
    try {
      *number = std::stoi(value);
    } catch (...) {
      return InvalidArgumentError("--why: " + key + " '" + value + "' is not a number");
    }
  } else if (key == "recompute") {
    ASSIGN_OR_RETURN(p->recompute, ParseRecompute(value));
  } else if (key == "cp_algo") {
    ASSIGN_OR_RETURN(p->cp_algo, ParseCpAlgo(value));
  } else if (key == "strategy") {
    *strategy = value;
  } else if (key == "offload") {
    // In --why the kinds join with '+' (',' separates the keys); params
    // alone means both, as parameter offload needs the optimizer's.
    std::string kinds = value;
    std::replace(kinds.begin(), kinds.end(), '+', ',');
    ASSIGN_OR_RETURN(const OffloadKinds k, ParseOffload(kinds));
    p->offload_optimizer = k.optimizer || k.params;
    p->offload_params = k.params;
  } else {
    return InvalidArgumentError("--why: unknown key '" + key +
                                "' (pp, dp, cp, tp, zero, micro_batches, virtual_stages, "
                                "micro_batch_interleave, recompute, cp_algo, offload, ps_servers, "
                                "strategy)");
  }
  return Status::Ok();
}

}  // namespace

Result<ParallelConfig> ParseParallelConfig(const std::string& text) {
  ParallelConfig p;
  std::string strategy;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      return InvalidArgumentError("--why '" + text + "': '" + item + "' is not key=value");
    }
    RETURN_IF_ERROR(SetKey(item.substr(0, eq), item.substr(eq + 1), &p, &strategy));
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

std::string WhyNotReport(const std::string& label, const Result<StepPrediction>& p,
                         const StepPrediction& chosen, int64_t budget) {
  if (!p.ok()) return "why not " + label + ": it cannot run: " + p.status().message() + "\n";
  std::ostringstream out;
  out << "why not " << label << ": predicted " << p->ToString() << "\n  "
      << Percent(p->seconds, chosen.seconds) << " step time against the chosen plan";
  if (budget > 0 && p->memory.total() > budget) {
    out << "; and it needs " << HumanBytes(p->memory.total()) << " per rank, over the "
        << HumanBytes(budget) << " budget";
  }
  out << "\n  where the time goes (alternative / chosen): compute " << Ms(p->compute) << " / "
      << Ms(chosen.compute) << ", tp collectives " << Ms(p->tp_comm) << " / " << Ms(chosen.tp_comm)
      << ", bubble " << Ms(p->bubble) << " / " << Ms(chosen.bubble) << ", gradient sums "
      << Ms(p->dp_comm) << " / " << Ms(chosen.dp_comm) << ", update " << Ms(p->optimizer) << " / "
      << Ms(chosen.optimizer) << "\n";
  return out.str();
}

}  // namespace tessera
