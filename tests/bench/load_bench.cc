// Loading and repairing from training's checkpoints: GPT-2 124M (L12 C768
// H12 V50257, weights and Adam moments, 1.4 GiB) saved sliced by 4
// in-process ranks (dp2 x tp2, ZeRO-1), then
//   load:   a trainer on another mesh reads it, each rank only its own
//           byte ranges, resharding on load (LoadGpt + ShardOptimizerState):
//           tp4 on 4 ranks, and 1 rank (everything);
//   save:   the sliced save with redundancy none, replicas:2, parity:2
//           (what the redundancy costs at save time);
//   repair: one data file deleted, rebuilt by RepairNativeCheckpoint from
//           replicas and from parity.
// Prints medians of 3 (seconds) and leaves DIR/none (the plain save) and
// the lost file's size for the script's peers.
//   load_bench DIR
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "ckpt/native.h"
#include "ckpt/repair.h"
#include "formats/native_files.h"
#include "runtime/comm/inprocess.h"
#include "runtime/kernels.h"
#include "runtime/model/gpt_checkpoint.h"
#include "runtime/model/parallel_gpt.h"

using namespace tessera;

namespace {

const GptConfig kConfig{.layers = 12, .heads = 12, .embed = 768, .context = 256, .vocab = 50257};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Status Clean(Env* env, const std::string& path) {
  if (env->FileExists(path)) RETURN_IF_ERROR(DeleteRecursively(env, path));
  sync();
  return Status::Ok();
}

// Saves on dp2 x tp2 + ZeRO with `redundancy` into `path`; the save's time.
Result<double> Save(const std::string& path, const std::string& redundancy) {
  Env* env = Env::Default();
  RETURN_IF_ERROR(Clean(env, path));
  double seconds = 0;
  RETURN_IF_ERROR(RunInProcess(4, [&](Communicator& world) -> Status {
    ASSIGN_OR_RETURN(auto trainer,
                     ParallelGpt::Create(kConfig, {.dp = 2, .tp = 2, .zero = 1}, world));
    RETURN_IF_ERROR(trainer->Init(1));
    ASSIGN_OR_RETURN(Strategy strategy, trainer->strategy());
    SlicedWriteOptions options;
    ASSIGN_OR_RETURN(options.redundancy, Redundancy::Parse(redundancy));
    RETURN_IF_ERROR(world.Barrier());
    const auto t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(auto writer, SlicedCheckpointWriter::Create(env, world, path, strategy,
                                                                 {0, {}, "load_bench"}, options));
    const Status wrote = trainer->WriteSliced(*writer, strategy);
    const Status committed = writer->Commit();
    RETURN_IF_ERROR(wrote);
    RETURN_IF_ERROR(committed);
    RETURN_IF_ERROR(world.Barrier());
    if (world.rank() == 0) seconds = Since(t0);
    return Status::Ok();
  }));
  return seconds;
}

// A trainer on `parallel` over `ranks` loads `path`; the load's time.
Result<double> Load(const std::string& path, int ranks, ParallelConfig parallel) {
  double seconds = 0;
  RETURN_IF_ERROR(RunInProcess(ranks, [&](Communicator& world) -> Status {
    ASSIGN_OR_RETURN(auto trainer, ParallelGpt::Create(kConfig, parallel, world));
    RETURN_IF_ERROR(world.Barrier());
    const auto t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(auto reader, OpenNativeCheckpoint(Env::Default(), path));
    RETURN_IF_ERROR(LoadGpt(*reader, &trainer->model()));
    RETURN_IF_ERROR(trainer->ShardOptimizerState());
    RETURN_IF_ERROR(world.Barrier());
    if (world.rank() == 0) seconds = Since(t0);
    return Status::Ok();
  }));
  return seconds;
}

Result<double> Repair(const std::string& path, const std::string& lost) {
  Env* env = Env::Default();
  RETURN_IF_ERROR(env->DeleteFile(JoinPath(path, lost)));
  sync();
  const auto t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(RepairReport report, RepairNativeCheckpoint(env, path, {}));
  const double seconds = Since(t0);
  if (!report.ok() || report.rebuilt.size() != 1) {
    return InternalError("repair of " + path + " did not rebuild exactly " + lost);
  }
  return seconds;
}

Status Run(const std::string& dir) {
  std::vector<double> load_tp4, load_one, save_none, save_rep, save_par, rep_rep, rep_par;
  for (int round = 0; round < 3; ++round) {
    ASSIGN_OR_RETURN(double s, Save(dir + "/none", "none"));
    save_none.push_back(s);
    ASSIGN_OR_RETURN(s, Load(dir + "/none", 4, {.dp = 1, .tp = 4}));
    load_tp4.push_back(s);
    ASSIGN_OR_RETURN(s, Load(dir + "/none", 1, {}));
    load_one.push_back(s);
    ASSIGN_OR_RETURN(s, Save(dir + "/replicas", "replicas:2"));
    save_rep.push_back(s);
    ASSIGN_OR_RETURN(s, Repair(dir + "/replicas", "data-00001.tsr"));
    rep_rep.push_back(s);
    ASSIGN_OR_RETURN(s, Save(dir + "/parity", "parity:2"));
    save_par.push_back(s);
    ASSIGN_OR_RETURN(s, Repair(dir + "/parity", "data-00001.tsr"));
    rep_par.push_back(s);
  }
  ASSIGN_OR_RETURN(uint64_t lost, Env::Default()->GetFileSize(dir + "/parity/data-00001.tsr"));
  std::printf(
      "load_tp4 %.3f\nload_one %.3f\nsave_none %.3f\nsave_replicas %.3f\n"
      "save_parity %.3f\nrepair_replicas %.3f\nrepair_parity %.3f\nlost_bytes %llu\n",
      Median(load_tp4), Median(load_one), Median(save_none), Median(save_rep), Median(save_par),
      Median(rep_rep), Median(rep_par), static_cast<unsigned long long>(lost));
  RETURN_IF_ERROR(Clean(Env::Default(), dir + "/replicas"));
  return Clean(Env::Default(), dir + "/parity");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: load_bench DIR\n");
    return 2;
  }
  kernels::SetComputeThreads(1);
  const Status s = Run(argv[1]);
  if (!s.ok()) {
    std::fprintf(stderr, "load_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
