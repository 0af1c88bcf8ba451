// Trains a GPT-2 style model on a text file (byte by byte) or a token file,
// on one rank or over a pp x dp x tp mesh of several (pipeline stages, data
// parallel, Megatron tensor parallel, ZeRO-1):
//   train_gpt --data data/corpus.txt --steps 50 [--layers 4 --heads 4
//             --embed 256 --context 256 --batch 8] [--save DIR --save-every N]
//             [--resume] [--threads N] [--export DIR --export-dtype bf16]
//   train_gpt --ranks 4 [--dp 2 --tp 2 | --pp 2 --micro-batches 4] [--zero 1] ...
//                                          (4 ranks as threads)
//   mpirun -np 4 train_gpt [--tp 2] [--pp 2] [--zero 1] ...   (4 processes)
// Logs the loss and tokens/s of every step (rank 0). With --save it writes
// native checkpoints DIR/step-<N> (parameters, Adam moments, step, data
// position, config) and keeps DIR/latest on the newest: merged (whole
// tensors in one data file, every rank writing its own pieces at their
// places in it) or, with --save-mode sliced, every rank writing its own
// pieces (tp slices, ZeRO shards; replicas take turns) into a data file of
// its own; with --async-save in the background while training goes on,
// and with --redundancy replicas:K / parity:G / rs:K+M (sliced) what
// rebuilds lost files (done at load, and said);
// --hosts (or TESSERA_HOSTS) gives in-process ranks fake hosts, so that
// host-aware placement can be tried on one machine;
// --keep N removes all but the newest N; --resume continues
// from DIR/latest when there is one, bit for bit as if never stopped on the
// same ranks, and on any other mesh (on resume each rank reads only its own
// slices).
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "ckpt/ops.h"
#include "ckpt/repair.h"
#include "core/byte_size.h"
#include "formats/native_files.h"
#include "runtime/comm/launch.h"
#include "runtime/comm/mpi.h"
#include "runtime/cost/calibration.h"
#include "runtime/kernels.h"
#include "runtime/model/gpt.h"
#include "runtime/model/gpt_checkpoint.h"
#include "runtime/model/gpt_search.h"
#include "runtime/model/parallel_gpt.h"
#include "runtime/train/async_checkpoint.h"
#include "runtime/train/data.h"

using namespace tessera;

namespace {

std::string ConfigString(const GptConfig& c, int batch, int seq, uint64_t seed) {
  return "layers=" + std::to_string(c.layers) + " heads=" + std::to_string(c.heads) +
         " embed=" + std::to_string(c.embed) + " context=" + std::to_string(c.context) +
         " vocab=" + std::to_string(c.vocab) + " batch=" + std::to_string(batch) +
         " seq=" + std::to_string(seq) + " seed=" + std::to_string(seed);
}

// After a load: what any rank's reads had to work around (a lost or
// corrupt file read through copies or parity) is said, and rank 0 rebuilds
// those files on disk so the checkpoint is whole again (collective).
Status RepairAfterLoad(Env* env, const CheckpointReader& checkpoint, Communicator& world,
                       bool talk) {
  const std::vector<std::string> mine = checkpoint.Recoveries();
  for (const std::string& line : mine) {
    std::fprintf(stderr, "train_gpt: rank %d: loading %s: %s\n", world.rank(),
                 checkpoint.path().c_str(), line.c_str());
  }
  int any = mine.empty() ? 0 : 1;
  RETURN_IF_ERROR(world.AllReduce(&any, &any, 1, DType::kI32, ReduceOp::kMax));
  if (any == 0) return Status::Ok();
  if (world.rank() == 0) {
    Result<RepairReport> fixed = RepairNativeCheckpoint(env, checkpoint.path(), {});
    if (!fixed.ok()) {
      std::fprintf(stderr, "train_gpt: repairing %s: %s\n", checkpoint.path().c_str(),
                   fixed.status().ToString().c_str());
    } else {
      for (const std::string& line : fixed->rebuilt) {
        if (talk) std::printf("repaired %s: rebuilt %s\n", checkpoint.path().c_str(), line.c_str());
      }
      for (const std::string& line : fixed->failed) {
        std::fprintf(stderr, "train_gpt: %s: cannot rebuild %s\n", checkpoint.path().c_str(),
                     line.c_str());
      }
    }
  }
  return world.Barrier();
}

int Fail(const Status& s) {
  std::fprintf(stderr, "train_gpt: %s\n", s.ToString().c_str());
  return 1;
}

// --fault-kill POINT:STEP:RANK, for the fault tests: rank RANK kills its
// own process (SIGKILL, as a crashed host would die) at POINT of step STEP
// (under tessera-run only in the first attempt, TESSERA_RESTART_COUNT=0):
// "step" as the step begins, or a point of a sliced save (see
// SlicedWriteOptions::fault_hook: write, redundancy, commit, rename,
// committed).
struct FaultKill {
  std::string point;
  int64_t step = -1;
  int rank = -1;
  bool hang = false;  // --fault-hang: stop there for ever (a hung rank) instead
  static Result<FaultKill> Parse(const std::string& text) {
    FaultKill f;
    if (text.empty()) return f;
    const size_t a = text.find(':'), b = text.rfind(':');
    const Status usage = InvalidArgumentError("--fault-kill '" + text + "': use POINT:STEP:RANK");
    if (a == std::string::npos || a == b) return usage;
    try {
      f.point = text.substr(0, a);
      f.step = std::stoll(text.substr(a + 1, b - a - 1));
      f.rank = std::stoi(text.substr(b + 1));
    } catch (...) {
      return usage;
    }
    if (f.point != "step" && f.point != "write" && f.point != "redundancy" && f.point != "commit" &&
        f.point != "rename" && f.point != "committed") {
      return InvalidArgumentError(
          "--fault-kill '" + text +
          "': POINT is step, write, redundancy, commit, rename or committed");
    }
    return f;
  }
  void At(std::string_view point, int64_t step, int rank) const {
    // Under a launcher, only in the job's first attempt: the restarted job
    // runs through.
    static const bool restarted = [] {
      const char* n = std::getenv("TESSERA_RESTART_COUNT");
      return n != nullptr && std::atoi(n) > 0;
    }();
    if (restarted) return;
    if (point == this->point && step == this->step && rank == this->rank) {
      std::fprintf(stderr, "train_gpt: --fault-%s: rank %d %s at %s of step %lld\n",
                   hang ? "hang" : "kill", rank, hang ? "hangs" : "kills itself",
                   std::string(point).c_str(), static_cast<long long>(step));
      std::fflush(stderr);
      if (hang) {
        while (true) pause();
      }
      kill(getpid(), SIGKILL);
    }
  }
};

struct Options {
  GptConfig config;
  std::string data, save, export_dir, export_dtype, save_mode = "merged", strategy_out;
  FaultKill fault;
  Redundancy redundancy;
  std::vector<std::string> hosts;  // --hosts: one per rank; empty: the real ones
  int batch = 8, seq = 0, steps = 20, save_every = 0, keep = 0;
  uint64_t seed = 1;
  AdamWConfig adam;
  float max_norm = 1.0f;
  bool resume = false, quiet = false, async_save = false, print_ops = false;
  std::string dataset_strategy = "data_parallel";  // or full_batch
  ParallelConfig parallel;
  // --auto-parallel: the search's mode; the machine's profile (empty:
  // calibrate now); the per-rank memory budget.
  std::string auto_parallel, profile, calibrate_out;
  int64_t rank_memory = 0;
};

// --auto-parallel: the configuration the search predicts fastest for this
// job's ranks, the same on every rank (the search is deterministic).
Result<ParallelConfig> AutoParallel(const Options& o, Communicator& world) {
  MachineProfile profile;
  if (!o.profile.empty()) {
    ASSIGN_OR_RETURN(profile, MachineProfile::Load(o.profile));
  } else {
    ASSIGN_OR_RETURN(profile, CalibrateMachine(world));
  }
  SearchOptions search;
  ASSIGN_OR_RETURN(search.mode, ParseSearchMode(o.auto_parallel));
  if (o.auto_parallel == "propagate") search.fixed = o.parallel.op_strategy;
  search.rank_memory = o.rank_memory;
  search.bucket_bytes = o.parallel.bucket_bytes;
  ASSIGN_OR_RETURN(SearchResult r,
                   SearchGptParallel(o.config, o.batch, o.seq, world.size(), profile, search));
  if (world.rank() == 0 && !o.quiet) {
    std::printf("auto-parallel (%s, profile %s, %lld configurations costed): %s\n  predicted %s\n",
                o.auto_parallel.c_str(), profile.name.c_str(), static_cast<long long>(r.candidates),
                r.name.c_str(), r.predicted.ToString().c_str());
    for (const auto& [name, p] : r.alternatives) {
      std::printf("  runner-up %s: step %.3g ms (%+.1f%%), %s per rank\n", name.c_str(),
                  p.seconds * 1e3, 100 * (p.seconds / r.predicted.seconds - 1),
                  HumanBytes(p.memory.total()).c_str());
    }
  }
  return r.parallel;
}

// The whole run on one rank; rank 0 talks.
Status Train(const Options& o, Communicator& world) {
  const bool talk = world.rank() == 0 && !o.quiet;
  const bool first = world.rank() == 0;
  Env* env = Env::Default();
  if (!o.calibrate_out.empty()) {
    ASSIGN_OR_RETURN(MachineProfile profile, CalibrateMachine(world));
    if (first) RETURN_IF_ERROR(WriteFileAtomically(env, o.calibrate_out, profile.ToJson()));
    if (talk) std::printf("calibrated: %s", profile.ToJson().c_str());
    return Status::Ok();
  }
  ParallelConfig parallel = o.parallel;
  if (!o.auto_parallel.empty()) {
    ASSIGN_OR_RETURN(parallel, AutoParallel(o, world));
  }
  if (parallel.dp == 0) parallel.dp = world.size() / (parallel.tp * parallel.pp);
  ASSIGN_OR_RETURN(std::unique_ptr<ParallelGpt> trainer,
                   ParallelGpt::Create(o.config, parallel, world));
  if (o.batch % parallel.dp != 0) {
    return InvalidArgumentError("--batch " + std::to_string(o.batch) + " is not a multiple of dp " +
                                std::to_string(parallel.dp));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<TokenSource> tokens, OpenTokens(env, o.data));
  ASSIGN_OR_RETURN(TokenLoader loader,
                   TokenLoader::Create(std::move(tokens), o.batch, o.seq, o.seed));
  const std::string config_text = ConfigString(o.config, o.batch, o.seq, o.seed);
  Gpt& model = trainer->model();  // this rank's stage
  ASSIGN_OR_RETURN(std::vector<ParamInfo> all_params, Gpt::Params(o.config));
  int64_t num_params = 0;  // of the whole model, every stage
  for (const ParamInfo& p : all_params) num_params += p.numel;

  if (o.print_ops && first) {
    ASSIGN_OR_RETURN(const std::string ops, trainer->DescribeOps(o.batch, o.seq));
    std::fputs(ops.empty() ? "no operator strategy: every rank runs the whole model on its rows\n"
                           : ops.c_str(),
               stdout);
  }
  if (!o.strategy_out.empty()) {
    ASSIGN_OR_RETURN(Strategy strategy, trainer->strategy());
    if (first) RETURN_IF_ERROR(SaveStrategyFile(env, o.strategy_out, strategy));
  }
  trainer->Init(o.seed);
  // The checkpoint `latest` names (or, when it names none that is
  // complete, the newest complete one before). Committed checkpoints newer
  // than it belong to an abandoned run (killed between a commit and the
  // update of `latest`, or rolled back): this run's saves replace them.
  const Result<std::string> from = o.resume && env->IsDirectory(o.save)
                                       ? ResumeCheckpoint(env, o.save)
                                       : Result<std::string>(NotFoundError("no --resume"));
  if (from.ok()) {
    // Every rank reads the checkpoint (the config first, then the tensors).
    ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> checkpoint,
                     OpenCheckpoint(env, JoinPath(o.save, *from)));
    const auto& saved = checkpoint->meta().metadata;
    const auto it = saved.find("config");
    if (it == saved.end() || it->second != config_text) {
      return InvalidArgumentError("checkpoint '" + checkpoint->path() + "' was trained with '" +
                                  (it == saved.end() ? std::string("?") : it->second) + "', not '" +
                                  config_text + "'");
    }
    RETURN_IF_ERROR(LoadGpt(*checkpoint, &model));
    RETURN_IF_ERROR(RepairAfterLoad(env, *checkpoint, world, talk));
    trainer->ShardOptimizerState();
    const auto pos = saved.find("data.position");
    ASSIGN_OR_RETURN(DataPosition position,
                     DataPosition::Parse(pos == saved.end() ? "" : pos->second));
    RETURN_IF_ERROR(loader.Restore(position));
    if (talk) {
      std::printf("resumed from step %lld (%s, data position %s)\n",
                  static_cast<long long>(model.step()), checkpoint->path().c_str(),
                  position.ToString().c_str());
      ASSIGN_OR_RETURN(const auto committed, CommittedSteps(env, o.save));
      std::string abandoned;
      for (const auto& [step, name] : committed) {
        if (step > model.step()) abandoned += (abandoned.empty() ? "" : ", ") + name;
      }
      if (!abandoned.empty()) {
        std::printf("newer than latest, from an abandoned run, replaced when saved again: %s\n",
                    abandoned.c_str());
      }
    }
  }
  if (const std::string advice = kernels::BlasCoreAdvice(); !advice.empty() && talk) {
    std::fprintf(stderr, "%s\n", advice.c_str());
  }
  if (talk) {
    std::printf("model: %s, %lld parameters (OpenBLAS core %s)\n", config_text.c_str(),
                static_cast<long long>(num_params), kernels::BlasCoreName().c_str());
    if (world.size() > 1) {
      std::printf("ranks: %d (%s), dp=%d zero=%d, buckets of %lld KiB\n", world.size(),
                  std::string(world.backend()).c_str(), parallel.dp, parallel.zero,
                  static_cast<long long>(parallel.bucket_bytes >> 10));
      if (parallel.tp > 1) {
        std::printf("tensor parallel: tp=%d (operator strategy %s)\n", parallel.tp,
                    ParallelGpt::StrategyFileOf(parallel).source.c_str());
      }
      if (parallel.pp > 1) {
        std::printf("pipeline: pp=%d stages, %d micro-batches per dp rank (1F1B)\n", parallel.pp,
                    trainer->micro_batches());
      }
    }
  }

  const FaultKill& fault = o.fault;
  SlicedWriteOptions save_options;
  save_options.redundancy = o.redundancy;
  save_options.merged = o.save_mode == "merged";
  if (!o.hosts.empty()) {
    if (static_cast<int>(o.hosts.size()) != world.size()) {
      return InvalidArgumentError("--hosts names " + std::to_string(o.hosts.size()) +
                                  " hosts for " + std::to_string(world.size()) + " ranks");
    }
    save_options.hosts = o.hosts;
  }
  save_options.native.overwrite = from.ok();  // see above: abandoned checkpoints
  save_options.fault_hook = [&fault, &world](std::string_view point, int64_t step) {
    fault.At(point, step, world.rank());
  };
  // A rank holding part of the model gathers it to rank 0 for an export.
  const bool gather = parallel.pp > 1 || parallel.tp > 1;
  AsyncSlicedSave async(env, world);
  if (o.async_save && !o.save.empty() && o.steps > model.step()) {
    // The snapshot arena now, so that no save's stall pays for fresh memory.
    ASSIGN_OR_RETURN(Strategy strategy, trainer->strategy());
    RETURN_IF_ERROR(async.Prepare(strategy, save_options).status());
  }
  // Commits the async save in flight when every rank has written it (with
  // `wait`, waits for that) and says so.
  auto poll = [&](bool wait) -> Status {
    ASSIGN_OR_RETURN(bool committed, async.Poll(wait));
    if (committed && talk) {
      const AsyncSaveStats& st = async.last();
      std::printf(
          "saved %s (async: training stalled %.1f ms, written in the background in "
          "%.1f ms, commit %.1f ms; redundancy %s)\n",
          st.path.c_str(), st.stall_seconds * 1e3, st.background_seconds * 1e3,
          st.commit_seconds * 1e3, st.redundancy.c_str());
    }
    return Status::Ok();
  };
  std::vector<int32_t> inputs(o.batch * o.seq), targets(o.batch * o.seq);
  double total_seconds = 0, comm_at_first = 0;
  int64_t timed_steps = 0;
  float loss_value = 0;
  Heartbeat heartbeat = Heartbeat::FromEnv();
  while (model.step() < o.steps) {
    fault.At("step", model.step() + 1, world.rank());
    RETURN_IF_ERROR(heartbeat.Beat(model.step() + 1));
    const auto t0 = std::chrono::steady_clock::now();
    float norm = 0;
    float loss = 0;
    if (o.dataset_strategy == "full_batch") {  // every rank reads the batch; Step takes its rows
      RETURN_IF_ERROR(loader.NextBatch(inputs.data(), targets.data()));
      ASSIGN_OR_RETURN(loss, trainer->Step(inputs.data(), targets.data(), o.batch, o.seq, o.adam,
                                           o.max_norm, &norm));
    } else {  // data_parallel: each replica reads its own rows only
      const int rows = o.batch / parallel.dp;
      RETURN_IF_ERROR(
          loader.NextBatchRows(trainer->dp_rank() * rows, rows, inputs.data(), targets.data()));
      ASSIGN_OR_RETURN(loss, trainer->StepRows(inputs.data(), targets.data(), o.batch, o.seq,
                                               o.adam, o.max_norm, &norm));
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    loss_value = loss;
    if (model.step() > 1) {  // the first step warms caches and allocations
      total_seconds += seconds;
      ++timed_steps;
    } else {
      comm_at_first = trainer->comm_seconds();
    }
    if (talk) {
      std::printf("step %5lld/%d  loss %.9g  norm %.4f  %8.0f tok/s  %7.1f ms\n",
                  static_cast<long long>(model.step()), o.steps, loss, norm,
                  o.batch * o.seq / seconds, seconds * 1e3);
      std::fflush(stdout);
    }
    const bool last = model.step() == o.steps;
    if (async.in_flight()) RETURN_IF_ERROR(poll(false));
    if (!o.save.empty() && ((o.save_every > 0 && model.step() % o.save_every == 0) || last)) {
      const std::string name = "step-" + std::to_string(model.step());
      const std::map<std::string, std::string> metadata = {
          {"config", config_text}, {"data.position", loader.position().ToString()}};
      if (o.async_save) {
        // The stall: copying this rank's pieces; the rest runs beside training.
        RETURN_IF_ERROR(poll(true));  // at most one save in flight
        ASSIGN_OR_RETURN(Strategy strategy, trainer->strategy());
        RETURN_IF_ERROR(async.Start(
            o.save, name, strategy,
            {model.step(), metadata, "tessera train_gpt (" + o.save_mode + ", async)"},
            save_options,
            [&](const std::vector<PieceToWrite>& mine) {
              return trainer->SlicedPieces(strategy, mine);
            },
            o.keep));
        continue;
      }
      // Every rank writes its own pieces (replicas take turns), into its
      // own data file (sliced) or at their places in the one file (merged);
      // nothing is gathered. Rank 0 commits, then points `latest` at it.
      ASSIGN_OR_RETURN(Strategy strategy, trainer->strategy());
      RETURN_IF_ERROR(env->CreateDirs(o.save));
      ASSIGN_OR_RETURN(
          std::unique_ptr<SlicedCheckpointWriter> writer,
          SlicedCheckpointWriter::Create(
              env, world, o.save + "/" + name, strategy,
              {model.step(), metadata, "tessera train_gpt (" + o.save_mode + ")"}, save_options));
      const Status wrote = trainer->WriteSliced(*writer, strategy);
      const Status committed = writer->Commit();  // collective: every rank gets here
      RETURN_IF_ERROR(wrote);
      RETURN_IF_ERROR(committed);
      RETURN_IF_ERROR(PointLatest(env, world, o.save, name, o.keep));
      if (talk && save_options.merged) {
        std::printf("saved %s/%s (merged, written by %d ranks)\n", o.save.c_str(), name.c_str(),
                    world.size());
      } else if (talk) {
        std::printf("saved %s/%s (sliced over %d ranks, redundancy %s)\n", o.save.c_str(),
                    name.c_str(), world.size(), writer->plan().Describe().c_str());
      }
    }
  }
  RETURN_IF_ERROR(poll(true));  // the last save, if still being written
  Gpt full;
  if (!o.export_dir.empty() && gather) {
    RETURN_IF_ERROR(trainer->GatherOptimizerState());
    RETURN_IF_ERROR(trainer->GatherModel(&full));
  }
  if (!o.export_dir.empty() && first) {
    const SaveGptOptions options{.weights_dtype = *ParseDType(o.export_dtype),
                                 .optimizer_state = false};
    const std::string name = "step-" + std::to_string(model.step());
    RETURN_IF_ERROR(SaveGpt(env, gather ? full : model, o.export_dir, name,
                            {{"config", config_text}}, options));
    if (talk) {
      std::printf("exported %s weights to %s/%s\n", o.export_dtype.c_str(), o.export_dir.c_str(),
                  name.c_str());
    }
  }
  if (model.step() > 0) {
    // What the ranks hold (the largest of each figure over the ranks:
    // pipeline stages differ), and this process's peak resident set.
    const MemoryUse m = trainer->Memory();
    double figures[] = {static_cast<double>(m.parameters),    static_cast<double>(m.gradients),
                        static_cast<double>(m.optimizer),     static_cast<double>(m.activations),
                        static_cast<double>(m.communication), static_cast<double>(m.total())};
    RETURN_IF_ERROR(world.AllReduce(figures, figures, 6, DType::kF64, ReduceOp::kMax));
    struct rusage usage {};
    getrusage(RUSAGE_SELF, &usage);
    if (first && !o.quiet) {
      auto mib = [](double b) { return b / (1 << 20); };
      std::printf(
          "memory per rank (largest): parameters %.2f MiB, gradients %.2f MiB, optimizer "
          "%.2f MiB, activations %.2f MiB (peak of a step), communication buffers %.2f "
          "MiB, total %.2f MiB; peak RSS %.1f MiB (%s)\n",
          mib(figures[0]), mib(figures[1]), mib(figures[2]), mib(figures[3]), mib(figures[4]),
          mib(figures[5]), usage.ru_maxrss / 1024.0,
          world.size() > 1 && !LaunchedByMpirun() ? "the process, every in-process rank"
                                                  : "rank 0's process");
    }
  }
  if (timed_steps > 0 && first) {
    // Model FLOPs per token: 6 per parameter (forward + backward) plus the
    // attention products, 12 * layers * seq * embed.
    const double flops_per_token =
        6.0 * num_params + 12.0 * o.config.layers * o.seq * o.config.embed;
    const double tokens_per_s = o.batch * o.seq * timed_steps / total_seconds;
    std::printf(
        "done: step %lld, loss %.4f, %.0f tokens/s, %.1f GFLOP/s "
        "(mean of %lld steps after the first)\n",
        static_cast<long long>(model.step()), loss_value, tokens_per_s,
        tokens_per_s * flops_per_token / 1e9, static_cast<long long>(timed_steps));
    if (world.size() > 1) {
      std::printf("communication: %.1f%% of the step time on rank 0\n",
                  100.0 * (trainer->comm_seconds() - comm_at_first) / total_seconds);
    }
  }
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  // See BetterBlasCore: restart once with the faster OpenBLAS kernels.
  if (const std::string core = kernels::BetterBlasCore(); !core.empty()) {
    setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
    execv("/proc/self/exe", argv);  // on failure, go on with what we have
  }
  CLI::App app{"Train a GPT-2 style model on a text or token file, on one or more ranks"};
  Options o;
  o.config = {.layers = 4, .heads = 4, .embed = 256, .context = 256, .vocab = kByteVocab};
  o.data = "data/corpus.txt";
  o.export_dtype = "f32";
  o.adam = {.lr = 3e-4f, .weight_decay = 0.1f};
  o.parallel.dp = 0;  // all ranks
  int threads = -1, ranks = 0;
  double bucket_mib = 25;
  app.add_option("--data", o.data,
                 "text file (one token per byte) or token file (llm.c's uint16/uint32 .bin)")
      ->check(CLI::ExistingFile);
  app.add_option("--layers", o.config.layers)->check(CLI::PositiveNumber);
  app.add_option("--heads", o.config.heads)->check(CLI::PositiveNumber);
  app.add_option("--embed", o.config.embed)->check(CLI::PositiveNumber);
  app.add_option("--context", o.config.context, "longest sequence")->check(CLI::PositiveNumber);
  app.add_option("--vocab", o.config.vocab, "vocabulary (>= 256; bytes use the first 256)")
      ->check(CLI::Range(kByteVocab, 1 << 20));
  app.add_option("--batch", o.batch, "global batch (split over dp)")->check(CLI::PositiveNumber);
  app.add_option("--seq", o.seq, "sequence length (default: the context)");
  app.add_option("--steps", o.steps, "train until this step")->check(CLI::NonNegativeNumber);
  app.add_option("--lr", o.adam.lr);
  app.add_option("--weight-decay", o.adam.weight_decay);
  app.add_option("--max-norm", o.max_norm, "gradient clipping (0: none)");
  app.add_option("--seed", o.seed, "initialisation and data order");
  app.add_option("--threads", threads,
                 "compute threads per rank (default: all cores on one rank, 1 with several)");
  app.add_option("--ranks", ranks, "ranks as threads of this process (not under mpirun)")
      ->check(CLI::PositiveNumber);
  app.add_option("--dp", o.parallel.dp, "data-parallel ranks (default: ranks / (pp tp))")
      ->check(CLI::PositiveNumber);
  app.add_option("--pp", o.parallel.pp, "pipeline stages (consecutive blocks of layers)")
      ->check(CLI::PositiveNumber);
  app.add_option("--tp", o.parallel.tp,
                 "tensor-parallel ranks (Megatron: heads, MLP and vocabulary split; "
                 "a divisor of --heads)")
      ->check(CLI::PositiveNumber);
  std::string op_strategy;
  app.add_option("--op-strategy", op_strategy,
                 "operator strategy file (JSON, \"format\": \"tessera.op_strategy\"; its mesh, "
                 "zero, micro_batches and stage_layers apply unless given here)");
  app.add_flag("--sequence-parallel", o.parallel.sequence_parallel,
               "Megatron's sequence parallelism with --tp (layer norms and residuals cut by rows)");
  app.add_option("--dataset-strategy", o.dataset_strategy,
                 "data_parallel: each data-parallel replica reads only its rows of the batch; "
                 "full_batch: every rank reads the whole batch and keeps its rows")
      ->check(CLI::IsMember({"data_parallel", "full_batch"}));
  std::string recompute = "none";
  app.add_option("--recompute", recompute,
                 "activation recompute of every block: none, full (keep each block's input, "
                 "run it again in backward) or selective (the attention core only)")
      ->check(CLI::IsMember({"none", "full", "selective"}));
  app.add_flag("--print-op-strategy", o.print_ops,
               "print each operator's strategy, the redistributions inserted between them and "
               "the parameters' layouts (with --steps 0: print only)");
  app.add_option("--micro-batches", o.parallel.micro_batches,
                 "micro-batches per step and dp rank under --pp (default: pp)")
      ->check(CLI::PositiveNumber);
  app.add_option("--zero", o.parallel.zero, "1: shard the optimizer states over dp (ZeRO-1)")
      ->check(CLI::Range(0, 1));
  app.add_option("--bucket-mib", bucket_mib, "gradient bucket size for the dp reduction")
      ->check(CLI::PositiveNumber);
  app.add_option("--save", o.save, "checkpoint directory");
  app.add_option("--save-every", o.save_every, "save every N steps (and at the end)");
  app.add_option("--keep", o.keep,
                 "keep the newest N checkpoints in --save (and the one latest names); 0: all")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--async-save", o.async_save,
               "saves written in the background: training stalls only to copy each rank's "
               "pieces to host memory (sliced unless --save-mode merged is given)");
  app.add_option("--save-mode", o.save_mode,
                 "merged: whole tensors in one data file, every rank writing its pieces at "
                 "their places in it; sliced: every rank writes its own pieces (replicas take "
                 "turns) to its own file. Nothing is gathered either way")
      ->check(CLI::IsMember({"merged", "sliced"}));
  std::string redundancy = "none";
  app.add_option("--redundancy", redundancy,
                 "sliced saves: replicas:K (each piece in K files, on K ranks, on different "
                 "hosts first), parity:G (XOR parity per G data files), rs:K+M (Reed-Solomon: M "
                 "parity files per K data files, any M rebuilt; no host holds more than M of a "
                 "group), replicas combined with one of the others comma-separated, or none; "
                 "lost or corrupt files are rebuilt at load and by ckpt verify --repair");
  std::string hosts = std::getenv("TESSERA_HOSTS") != nullptr ? std::getenv("TESSERA_HOSTS") : "";
  app.add_option("--hosts", hosts,
                 "testing: the host of each rank, comma-separated (a,a,b,b), recorded in "
                 "sliced checkpoints and used to place copies and parity; default "
                 "$TESSERA_HOSTS, else each process's hostname");
  std::string fault_kill, fault_hang, backend = "auto", master;
  int rank = -1, world_size = -1;
  app.add_option("--backend", backend,
                 "auto (mpi under mpirun, gloo under a rank table: tessera-run, torchrun's "
                 "variables; else inprocess), inprocess, mpi or gloo")
      ->check(CLI::IsMember({"auto", "inprocess", "mpi", "gloo"}));
  app.add_option("--rank", rank, "this process's rank (gloo; else TESSERA_RANK or RANK)");
  app.add_option("--world-size", world_size,
                 "processes in the job (gloo; else TESSERA_WORLD_SIZE)");
  app.add_option(
      "--master", master,
      "host:port of rank 0's rendezvous (gloo; else TESSERA_MASTER or MASTER_ADDR/PORT)");
  app.add_option("--fault-kill", fault_kill,
                 "testing: POINT:STEP:RANK kills that rank's process (SIGKILL) at POINT of step "
                 "STEP (step, write, redundancy, commit, rename)");
  app.add_option("--fault-hang", fault_hang,
                 "testing: POINT:STEP:RANK stops that rank for ever at POINT of step STEP (a hung "
                 "rank: its heartbeat stops, its peers wait)");
  app.add_option("--strategy-out", o.strategy_out,
                 "write the layouts of this run's checkpoints (its strategy, JSON) here, for "
                 "ckpt reshard --strategy; with --steps 0 nothing else is done");
  app.add_flag("--resume", o.resume, "continue from the --save directory's latest checkpoint");
  app.add_option("--export", o.export_dir,
                 "at the end, write the weights alone (no optimizer state) as a checkpoint here");
  app.add_option("--export-dtype", o.export_dtype, "dtype of the exported weights")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  app.add_option("--auto-parallel", o.auto_parallel,
                 "choose the parallel configuration (mesh, operator strategies, micro-batches, "
                 "ZeRO, recompute, pipeline stages) by a cost-model search: fast (among data "
                 "parallelism, Megatron and Megatron-SP), exact (every operator's own choice) or "
                 "propagate (exact, keeping what --op-strategy FILE sets)")
      ->check(CLI::IsMember({"fast", "exact", "propagate"}));
  std::string rank_memory;
  app.add_option("--rank-memory", rank_memory,
                 "--auto-parallel: memory per rank the configuration must fit (2GiB; default: "
                 "the profile's device memory)");
  app.add_option("--profile", o.profile,
                 "--auto-parallel: machine profile (JSON, \"format\": \"tessera.machine_profile\"; "
                 "default: measure this machine at start-up)")
      ->check(CLI::ExistingFile);
  app.add_option("--calibrate", o.calibrate_out,
                 "measure this machine (matrix products, memory, the ranks' collectives) and "
                 "write its profile here, then exit");
  app.add_flag("--quiet", o.quiet, "log only the summary");
  CLI11_PARSE(app, argc, argv);
  o.parallel.recompute = *ParseRecompute(recompute);  // CLI11 checked it
  if (!rank_memory.empty()) {
    Result<int64_t> bytes = ParseByteSize(rank_memory);
    if (!bytes.ok()) return Fail(bytes.status());
    o.rank_memory = *bytes;
  }
  if (!o.auto_parallel.empty()) {
    if ((o.auto_parallel == "propagate") != !op_strategy.empty()) {
      return Fail(InvalidArgumentError(
          o.auto_parallel == "propagate"
              ? "--auto-parallel propagate completes --op-strategy FILE: give one"
              : "--op-strategy fixes the strategy: use --auto-parallel propagate"));
    }
    for (const char* flag : {"--dp", "--tp", "--pp", "--zero", "--micro-batches", "--recompute",
                             "--sequence-parallel"}) {
      if (app.count(flag) > 0) {
        return Fail(InvalidArgumentError(std::string("--auto-parallel chooses ") + (flag + 2) +
                                         ": drop " + flag));
      }
    }
  } else if (!rank_memory.empty() || !o.profile.empty()) {
    return Fail(InvalidArgumentError("--rank-memory and --profile are for --auto-parallel"));
  }
  if (o.seq <= 0) o.seq = o.config.context;
  if (o.seq > o.config.context) {
    return Fail(InvalidArgumentError("--seq is longer than --context"));
  }
  if (o.resume && o.save.empty()) return Fail(InvalidArgumentError("--resume needs --save DIR"));
  if (o.async_save && app.count("--save-mode") == 0) o.save_mode = "sliced";
  o.parallel.bucket_bytes = static_cast<int64_t>(bucket_mib * (1 << 20));
  if (!op_strategy.empty()) {
    if (o.parallel.sequence_parallel) {
      return Fail(
          InvalidArgumentError("--op-strategy says every operator's strategy: drop "
                               "--sequence-parallel"));
    }
    Result<OpStrategyFile> file = OpStrategyFile::Load(op_strategy);
    if (!file.ok()) return Fail(file.status());
    // The file's settings, unless given on the command line (then they
    // must agree: ParallelConfig::Validate names the file).
    for (auto [flag, from, to] :
         {std::tuple{"--pp", file->pp, &o.parallel.pp},
          {"--dp", file->dp, &o.parallel.dp},
          {"--tp", file->tp, &o.parallel.tp},
          {"--micro-batches", file->micro_batches, &o.parallel.micro_batches},
          {"--zero", file->zero, &o.parallel.zero}}) {
      if (!from.has_value()) continue;
      if (app.count(flag) == 0) {
        *to = *from;
      } else if (*to != *from) {
        return Fail(InvalidArgumentError(op_strategy + " sets " + std::string(flag + 2) + " " +
                                         std::to_string(*from) + " but " + flag + " is " +
                                         std::to_string(*to)));
      }
    }
    o.parallel.stage_layers = file->stage_layers;
    if (!file->dataset_strategy.empty()) {
      if (app.count("--dataset-strategy") > 0 && o.dataset_strategy != file->dataset_strategy) {
        return Fail(InvalidArgumentError(op_strategy + " sets dataset_strategy " +
                                         file->dataset_strategy + " but --dataset-strategy is " +
                                         o.dataset_strategy));
      }
      o.dataset_strategy = file->dataset_strategy;
    }
    o.parallel.op_strategy = std::make_shared<const OpStrategyFile>(std::move(*file));
  }
  if (Result<Redundancy> r = Redundancy::Parse(redundancy); r.ok()) {
    o.redundancy = *r;
  } else {
    return Fail(r.status());
  }
  for (size_t at = 0; !hosts.empty() && at <= hosts.size();) {
    const size_t comma = std::min(hosts.find(',', at), hosts.size());
    o.hosts.push_back(hosts.substr(at, comma - at));
    if (o.hosts.back().empty())
      return Fail(InvalidArgumentError("--hosts '" + hosts + "': an empty host name"));
    at = comma + 1;
  }
  if (!fault_kill.empty() && !fault_hang.empty()) {
    return Fail(InvalidArgumentError("give --fault-kill or --fault-hang, not both"));
  }
  if (Result<FaultKill> f = FaultKill::Parse(fault_kill.empty() ? fault_hang : fault_kill);
      f.ok()) {
    o.fault = *f;
    o.fault.hang = !fault_hang.empty();
  } else {
    return Fail(f.status());
  }
  // The rank table from flags, as the environment would give it.
  if (rank >= 0) setenv("TESSERA_RANK", std::to_string(rank).c_str(), 1);
  if (world_size >= 0) setenv("TESSERA_WORLD_SIZE", std::to_string(world_size).c_str(), 1);
  if (!master.empty()) setenv("TESSERA_MASTER", master.c_str(), 1);
  if (!o.redundancy.none() && o.save_mode != "sliced") {
    return Fail(InvalidArgumentError("--redundancy needs --save-mode sliced (or --async-save)"));
  }

  LaunchOptions launch;
  launch.ranks = ranks;
  launch.backend = *ParseCommBackend(backend);
  if (LaunchedByMpirun() && ranks > 0) {
    return Fail(InvalidArgumentError("--ranks starts threads; under mpirun use -np instead"));
  }
  if (ranks > 1 && threads > 1) {
    // The kernels' pool and OpenBLAS's thread count are per process.
    return Fail(InvalidArgumentError("--threads above 1 needs one rank per process (mpirun)"));
  }
  // Several ranks share the cores: one compute thread each unless told.
  Result<RankTable> table = RankTableFromEnv();
  const bool several = ranks > 1 || LaunchedByMpirun() || (table.ok() && table->world_size > 1);
  kernels::SetComputeThreads(threads >= 0 ? threads : several ? 1 : 0);
  if (Status s = LaunchRanks(launch, [&](Communicator& world) { return Train(o, world); });
      !s.ok()) {
    return Fail(s);
  }
  return 0;
}
