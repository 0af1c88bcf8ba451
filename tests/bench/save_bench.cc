// Saving from training: a GPT-2 124M model (L12 C768 H12 V50257, 1.5 GiB of
// weights and Adam moments) trained on 4 in-process ranks (dp2 x tp2,
// ZeRO-1), saved
//   sliced: every rank writes its own pieces (SlicedCheckpointWriter), and
//   merged: whole tensors in one data file, every rank writing its own
//           pieces at their planned offsets (SlicedWriteOptions::merged),
//           and, once, as the baseline the merged save is judged against:
//           moments and slices gathered on rank 0, which writes alone
//           (GatherOptimizerState + GatherModel + SaveGpt: "merged_gather"),
//   async:  a sliced save in the background (AsyncSlicedSave): the stall
//           (each rank copying its pieces) and the time to the commit,
//   rs:     the sliced and the async save again with --redundancy rs:4+2
//           (one Reed-Solomon group of the 4 data files, 2 parity files
//           encoded with ISA-L by two ranks after the data phase),
//   async merged: the merged save in the background,
// each through commit and fsync, alternating within each of 5 rounds.
// Prints the median of 5 saves of each (the
// async saver is kept between them, as in training, its snapshot arena
// made before the first save as train_gpt does ("prepare"); the first
// save's stall is printed apart as "stall_first")
// (every save into a fresh directory, the previous removed and the page
// cache written back first), and leaves the last sliced save in DIR for the
// script to copy with cp (the floor for moving those bytes).
//   save_bench DIR
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "runtime/comm/inprocess.h"
#include "runtime/kernels.h"
#include "runtime/model/gpt_checkpoint.h"
#include "runtime/model/parallel_gpt.h"
#include "runtime/train/async_checkpoint.h"

using namespace tessera;

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Times {
  std::vector<double> sliced, merged, stall, async, sliced_rs, stall_rs, async_rs, stall_merged,
      async_merged;
  double stall_first = 0, prepare = 0, merged_gather = 0;
};

Status Run(Communicator& world, const std::string& dir, Times* times) {
  const GptConfig config{.layers = 12, .heads = 12, .embed = 768, .context = 256, .vocab = 50257};
  ASSIGN_OR_RETURN(auto trainer, ParallelGpt::Create(config, {.dp = 2, .tp = 2, .zero = 1}, world));
  RETURN_IF_ERROR(trainer->Init(1));
  ASSIGN_OR_RETURN(Strategy strategy, trainer->strategy());
  Env* env = Env::Default();
  auto clean = [&](const std::string& path) -> Status {
    if (world.rank() == 0 && env->FileExists(path)) RETURN_IF_ERROR(DeleteRecursively(env, path));
    if (world.rank() == 0) sync();
    return world.Barrier();
  };
  auto now = [] { return std::chrono::steady_clock::now(); };
  AsyncSlicedSave save(env, world);  // kept, as a training run keeps it
  SlicedWriteOptions none, rs, merged;
  ASSIGN_OR_RETURN(rs.redundancy, Redundancy::Parse("rs:4+2"));
  merged.merged = true;
  {
    // As train_gpt --async-save does at start-up: the snapshot arena made
    // and faulted in before the first save; timed to the end of the
    // faulting, which training does not wait for.
    const auto t = now();
    RETURN_IF_ERROR(save.Prepare(strategy, none).status());
    save.WaitPrepared();  // its pages faulted in (in training: beside the first steps)
    double prepare = std::chrono::duration<double>(now() - t).count();
    RETURN_IF_ERROR(world.AllReduce(&prepare, &prepare, 1, DType::kF64, ReduceOp::kMax));
    if (world.rank() == 0) times->prepare = prepare;
  }
  // A sliced save into `path`; its seconds.
  auto sliced = [&](const std::string& path, const SlicedWriteOptions& options) -> Result<double> {
    RETURN_IF_ERROR(clean(path));
    const auto t0 = now();
    {
      ASSIGN_OR_RETURN(auto writer, SlicedCheckpointWriter::Create(env, world, path, strategy,
                                                                   {0, {}, "save_bench"}, options));
      const Status wrote = trainer->WriteSliced(*writer, strategy);
      const Status committed = writer->Commit();
      RETURN_IF_ERROR(wrote);
      RETURN_IF_ERROR(committed);
    }
    RETURN_IF_ERROR(world.Barrier());
    return std::chrono::duration<double>(now() - t0).count();
  };
  // An async save into `root`/step-1: its stall (the slowest rank's) and
  // its seconds to the commit.
  auto async = [&](const std::string& root, const SlicedWriteOptions& options,
                   double* stall) -> Result<double> {
    RETURN_IF_ERROR(clean(root + "/step-1"));
    const auto t2 = now();
    RETURN_IF_ERROR(save.Start(root, "step-1", strategy, {0, {}, "save_bench"}, options,
                               [&](const std::vector<PieceToWrite>& mine) {
                                 return trainer->SlicedPieces(strategy, mine);
                               }));
    *stall = std::chrono::duration<double>(now() - t2).count();
    RETURN_IF_ERROR(world.AllReduce(stall, stall, 1, DType::kF64, ReduceOp::kMax));
    RETURN_IF_ERROR(save.Poll(/*wait=*/true).status());
    return std::chrono::duration<double>(now() - t2).count();
  };
  for (int round = 0; round < 5; ++round) {
    // The saves side by side, their order turning each round (a save runs
    // slower right after another's writeback).
    double ts = 0, ts_rs = 0, tm = 0;
    for (int i = 0; i < 3; ++i) {
      switch ((i + round) % 3) {
        case 0: {
          ASSIGN_OR_RETURN(ts, sliced(dir + "/sliced", none));
          break;
        }
        case 1: {
          ASSIGN_OR_RETURN(ts_rs, sliced(dir + "/sliced-rs", rs));
          break;
        }
        default: {
          ASSIGN_OR_RETURN(tm, sliced(dir + "/merged", merged));
          break;
        }
      }
    }
    if (round == 0) {  // the merged save by gathering on rank 0 (6-10 s): once, as the baseline
      const std::string m = dir + "/merged-gather";
      RETURN_IF_ERROR(clean(m));
      const auto t1 = now();
      RETURN_IF_ERROR(trainer->GatherOptimizerState());
      Gpt full;
      RETURN_IF_ERROR(trainer->GatherModel(&full));
      if (world.rank() == 0) RETURN_IF_ERROR(SaveGpt(env, full, dir, "merged-gather", {}));
      RETURN_IF_ERROR(trainer->ShardOptimizerState());
      RETURN_IF_ERROR(world.Barrier());
      times->merged_gather = std::chrono::duration<double>(now() - t1).count();
      RETURN_IF_ERROR(clean(m));
    }
    double stall = 0, stall_rs = 0, stall_m = 0, ta = 0, ta_rs = 0, ta_m = 0;
    for (int i = 0; i < 3; ++i) {
      switch ((i + round) % 3) {
        case 0: {
          ASSIGN_OR_RETURN(ta, async(dir + "/async", none, &stall));
          break;
        }
        case 1: {
          ASSIGN_OR_RETURN(ta_rs, async(dir + "/async-rs", rs, &stall_rs));
          break;
        }
        default: {
          ASSIGN_OR_RETURN(ta_m, async(dir + "/async-merged", merged, &stall_m));
          break;
        }
      }
    }
    RETURN_IF_ERROR(clean(dir + "/sliced-rs"));
    RETURN_IF_ERROR(clean(dir + "/merged"));
    RETURN_IF_ERROR(clean(dir + "/async-rs/step-1"));
    RETURN_IF_ERROR(clean(dir + "/async-merged/step-1"));
    if (world.rank() == 0) {
      if (round == 0) times->stall_first = stall;  // the first async save: without rs
      times->sliced.push_back(ts);
      times->merged.push_back(tm);
      times->stall.push_back(stall);
      times->async.push_back(ta);
      times->sliced_rs.push_back(ts_rs);
      times->stall_rs.push_back(stall_rs);
      times->async_rs.push_back(ta_rs);
      times->stall_merged.push_back(stall_m);
      times->async_merged.push_back(ta_m);
    }
  }
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: save_bench DIR\n");
    return 2;
  }
  kernels::SetComputeThreads(1);
  Times t;
  const Status s = RunInProcess(4, [&](Communicator& world) { return Run(world, argv[1], &t); });
  if (!s.ok()) {
    std::fprintf(stderr, "save_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf(
      "sliced %.3f\nmerged %.3f\nmerged_gather %.3f\nstall %.4f\nstall_first %.4f\n"
      "async %.3f\nsliced_rs %.3f\nstall_rs %.4f\nasync_rs %.3f\nstall_merged %.4f\n"
      "async_merged %.3f\nprepare %.3f\n",
      Median(t.sliced), Median(t.merged), t.merged_gather, Median(t.stall), t.stall_first,
      Median(t.async), Median(t.sliced_rs), Median(t.stall_rs), Median(t.async_rs),
      Median(t.stall_merged), Median(t.async_merged), t.prepare);
  return 0;
}
