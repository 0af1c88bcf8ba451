// ckpt plan: show how tensors move from one strategy to another.
#include <iostream>

#include "cli/verbs.h"
#include "transform/reshard_plan.h"
#include "transform/strategy.h"

namespace tessera::cli {
namespace {

struct PlanArgs {
  std::string src, dst, mesh;
  bool verbose = false;
  bool one_per_group = false;
};

Status RunPlan(const PlanArgs& a, std::ostream& out) {
  ASSIGN_OR_RETURN(Strategy src, LoadStrategyFile(Env::Default(), a.src));
  Strategy dst;
  if (!a.dst.empty()) {
    ASSIGN_OR_RETURN(dst, LoadStrategyFile(Env::Default(), a.dst));
  } else if (!a.mesh.empty()) {
    ASSIGN_OR_RETURN(Mesh mesh, Mesh::Parse(a.mesh));
    ASSIGN_OR_RETURN(dst, WithMesh(src, mesh));
  } else {
    return InvalidArgumentError("give --dst-strategy FILE or --mesh axis=size,...");
  }
  PlanOptions options;
  options.one_per_replica_group = a.one_per_group;
  ASSIGN_OR_RETURN(ReshardPlan plan, PlanReshard(src, dst, options));
  out << "source " << src.mesh().ToString() << " (" << src.world_size() << " ranks) -> "
      << "destination " << dst.mesh().ToString() << " (" << dst.world_size() << " ranks)\n";
  out << DescribePlan(plan, a.verbose);
  return Status::Ok();
}

}  // namespace

CLI::App* AddPlanVerb(CLI::App& app, std::function<int()>* run) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand("plan", "Plan a reshard between two strategies and show it");
  cmd->add_option("--src-strategy,src", args->src, "source strategy (JSON)")->required();
  cmd->add_option("--dst-strategy,dst", args->dst, "destination strategy (JSON)");
  cmd->add_option("--mesh", args->mesh,
                  "destination: the source's split axes on this mesh, e.g. dp=2,tp=4");
  cmd->add_flag("--verbose,-v", args->verbose, "list every copy");
  cmd->add_flag("--one-per-replica-group", args->one_per_group,
                "plan each distinct destination shard once (what a file writer needs)");
  cmd->callback([args, run] { *run = [args] { return Report(RunPlan(*args, std::cout)); }; });
  return cmd;
}

}  // namespace tessera::cli
