// Trains a GPT-2 style model on a text file (byte by byte) or a token file,
// on one rank or over a pp x dp x tp mesh of several (pipeline stages, data
// parallel, operator-level tensor parallel, ZeRO-1):
//   train_gpt --data data/corpus.txt --steps 50 [--layers 4 --heads 4
//             --embed 256 --context 256 --batch 8] [--save DIR --save-every N]
//             [--resume] [--threads N] [--export DIR --export-dtype bf16]
//   train_gpt --ranks 4 [--dp 2 --tp 2 | --pp 2 --micro-batches 4] [--zero 1] ...
//                                          (4 ranks as threads)
//   mpirun -np 4 train_gpt [--tp 2] [--pp 2] [--zero 1] ...   (4 processes)
// llm.c's shape: configure (the flags in train_options.h, the search when
// --auto-parallel), resume, then loop { step; log; save }, then report.
// Logs the loss and tokens/s of every step (rank 0). With --save it writes
// native checkpoints DIR/step-<N> (parameters, Adam moments, step, data
// position, config) and keeps DIR/latest on the newest: merged (whole
// tensors in one data file, every rank writing its own pieces at their
// places in it) or, with --save-mode sliced, every rank writing its own
// pieces (tp slices, ZeRO shards; replicas take turns) into a data file of
// its own; with --async-save in the background while training goes on,
// and with --redundancy replicas:K / parity:G / rs:K+M (sliced) what
// rebuilds lost files (done at load, and said); --keep N removes all but
// the newest N; --resume continues from DIR/latest when there is one, bit
// for bit as if never stopped on the same ranks, and on any other mesh (on
// resume each rank reads only its own slices).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/byte_size.h"
#include "core/trace.h"
#include "formats/native_files.h"
#include "runtime/comm/gloo.h"
#include "runtime/comm/launch.h"
#include "runtime/comm/mpi.h"
#include "runtime/comm/ms_roles.h"
#include "runtime/comm/traced.h"
#include "runtime/cost/calibration.h"
#include "runtime/kernels.h"
#include "runtime/matmul.h"
#include "runtime/model/gpt.h"
#include "runtime/model/gpt_checkpoint.h"
#include "runtime/model/gpt_predict.h"
#include "runtime/model/matmul_choice.h"
#include "runtime/model/parallel_gpt.h"
#include "runtime/model/param_server.h"
#include "runtime/model/ps_placement.h"
#include "runtime/model/search_report.h"
#include "runtime/train/async_checkpoint.h"
#include "runtime/train/data.h"
#include "runtime/train/resume.h"
#include "samples/gpt/train_options.h"

using namespace tessera;

namespace {

std::string ConfigString(const GptConfig& c, int batch, int seq, uint64_t seed) {
  return "layers=" + std::to_string(c.layers) + " heads=" + std::to_string(c.heads) +
         " embed=" + std::to_string(c.embed) + " context=" + std::to_string(c.context) +
         " vocab=" + std::to_string(c.vocab) + " batch=" + std::to_string(batch) +
         " seq=" + std::to_string(seq) + " seed=" + std::to_string(seed) +
         (c.untied ? " head=untied" : "");
}

int Fail(const Status& s) {
  std::fprintf(stderr, "train_gpt: %s\n", s.ToString().c_str());
  return 1;
}

// The matrix products' library: --matmul-library, else the profile's
// (which --calibrate chose), else OpenBLAS.
Status UseMatmulLibrary(const Options& o) {
  std::optional<MatmulLibrary> library;
  if (!o.matmul_library.empty()) {
    ASSIGN_OR_RETURN(library, ParseMatmulLibrary(o.matmul_library));
  } else if (!o.profile.empty()) {
    ASSIGN_OR_RETURN(const MachineProfile profile, MachineProfile::Load(o.profile));
    library = profile.matmul_library;
  }
  kernels::SetMatmulLibrary(library.value_or(MatmulLibrary::kOpenBlas));
  return Status::Ok();
}

// --calibrate: this machine's profile, written by rank 0.
Status Calibrate(const Options& o, Communicator& world) {
  // The disk offload would use: --offload-dir's, else TMPDIR's or /tmp.
  const char* tmp = std::getenv("TMPDIR");
  const std::string disk = !o.parallel.offload_dir.empty() ? o.parallel.offload_dir
                           : tmp != nullptr && *tmp != 0   ? std::string(tmp)
                                                           : "/tmp";
  // The matrix products' library first (unless the flag fixed it): the
  // rest is measured with the one chosen.
  std::vector<std::pair<MatmulLibrary, double>> libraries;
  if (o.matmul_library.empty()) {
    ASSIGN_OR_RETURN(libraries, ChooseMatmulLibrary(world));
  }
  ASSIGN_OR_RETURN(MachineProfile profile, CalibrateMachine(world, disk));
  profile.matmul_library = kernels::CurrentMatmulLibrary();
  profile.matmul_libraries = std::move(libraries);
  if (world.rank() == 0) {
    RETURN_IF_ERROR(WriteFileAtomically(Env::Default(), o.calibrate_out, profile.ToJson()));
    if (!o.quiet) std::printf("calibrated: %s", profile.ToJson().c_str());
  }
  return Status::Ok();
}

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
  if (search.mode == SearchMode::kPropagate) search.fixed = o.parallel.op_strategy;
  search.rank_memory = o.rank_memory;
  search.bucket_bytes = o.parallel.bucket_bytes;
  // Offload is the search's to choose where nothing else fits, when the
  // job has a directory for it and did not choose itself.
  if (!o.parallel.offload_optimizer) search.offload_dir = o.parallel.offload_dir;
  ASSIGN_OR_RETURN(SearchResult r,
                   SearchGptParallel(o.config, o.batch, o.seq, world.size(), profile, search));
  if (world.rank() == 0 && !o.quiet) {
    const int64_t budget = search.rank_memory > 0 ? search.rank_memory : profile.memory_bytes;
    std::printf("auto-parallel (%s, profile %s, %lld configurations costed): %s\n%s",
                o.auto_parallel.c_str(), profile.name.c_str(), static_cast<long long>(r.candidates),
                r.name.c_str(), SearchReport(r, budget).c_str());
  }
  return r.parallel;
}

// --rank-memory, before anything is allocated: the cost model's account of
// the rank that holds the most (the runtime's own figures, category by
// category) must fit, or the job does not start; the error names the
// categories and what offload would bring the peak to.
Status CheckRankMemory(const Options& o, const ParallelConfig& par) {
  if (o.rank_memory <= 0) return Status::Ok();
  // Memory does not depend on the machine's speeds: any profile does.
  MachineProfile profile;
  if (!o.profile.empty()) {
    ASSIGN_OR_RETURN(profile, MachineProfile::Load(o.profile));
  } else {
    profile.matmul_flops = 1e11;
    profile.memory_bandwidth = 1e10;
  }
  ASSIGN_OR_RETURN(const StepPrediction p, PredictGptStep(o.config, o.batch, o.seq, par, profile));
  if (p.server_memory.total() > o.rank_memory) {
    return ResourceExhaustedError("--rank-memory " + HumanBytes(o.rank_memory) +
                                  ": the accounted peak of a parameter server is " +
                                  p.server_memory.ToString() + "; use more --ps-servers");
  }
  if (p.memory.total() <= o.rank_memory) return Status::Ok();
  std::string msg = "--rank-memory " + HumanBytes(o.rank_memory) + ": the accounted peak of a " +
                    "rank (stage " + std::to_string(p.memory_stage) + ") is " + p.memory.ToString();
  for (const OffloadKinds kinds : {OffloadKinds{true, false}, OffloadKinds{true, true}}) {
    if (par.offload_optimizer >= kinds.optimizer && par.offload_params >= kinds.params) continue;
    ParallelConfig off = par;
    off.offload_optimizer = kinds.optimizer;
    off.offload_params = kinds.params;
    if (off.offload_dir.empty()) off.offload_dir = ".";  // a prediction writes nothing
    const Result<StepPrediction> q = PredictGptStep(o.config, o.batch, o.seq, off, profile);
    if (q.ok()) {
      msg += "; with --offload " + kinds.Name() + ": " + HumanBytes(q->memory.total());
    }
  }
  return ResourceExhaustedError(msg);
}

// What a rank trains: its stage of the model, its batches, and the settings
// a checkpoint is checked against.
struct Job {
  ParallelConfig parallel;
  std::unique_ptr<ParallelGpt> trainer;
  std::unique_ptr<TokenLoader> loader;
  std::string config_text;
  int64_t num_params = 0;  // of the whole model, every stage
  bool resumed = false;
};

// The job's batches from --data (what every rank, server or replacement
// reads or counts through).
Result<std::unique_ptr<TokenLoader>> OpenLoader(const Options& o) {
  ASSIGN_OR_RETURN(std::unique_ptr<TokenSource> tokens, OpenTokens(Env::Default(), o.data));
  ASSIGN_OR_RETURN(TokenLoader loader,
                   TokenLoader::Create(std::move(tokens), o.batch, o.seq, o.seed));
  return std::make_unique<TokenLoader>(std::move(loader));
}

// The parallel configuration, the model's stage on this rank, its data.
// `servers`: with parameter servers, the whole world (`world` is the
// workers').
Result<Job> Configure(const Options& o, Communicator& world, Communicator* servers) {
  Job job;
  job.parallel = o.parallel;
  if (!o.auto_parallel.empty()) {
    ASSIGN_OR_RETURN(job.parallel, AutoParallel(o, world));
    if (o.parallel.offload_optimizer) {  // chosen by hand: kept
      job.parallel.offload_optimizer = o.parallel.offload_optimizer;
      job.parallel.offload_params = o.parallel.offload_params;
    }
    job.parallel.offload_dir = o.parallel.offload_dir;
    job.parallel.offload_bucket_bytes = o.parallel.offload_bucket_bytes;
  }
  ParallelConfig& par = job.parallel;
  if (par.dp == 0) par.dp = world.size() / (par.tp * par.pp * par.cp);
  RETURN_IF_ERROR(CheckSequenceCut(par.cp_algo, o.seq, par.cp, "h.*.attn.attention"));
  RETURN_IF_ERROR(CheckRankMemory(o, par));
  Result<std::unique_ptr<ParallelGpt>> trainer = ParallelGpt::Create(o.config, par, world);
  Status connected = trainer.status();
  if (connected.ok() && servers != nullptr) connected = (*trainer)->ConnectServers(*servers);
  if (!connected.ok()) {
    // No client to tell the servers: told here, so none waits for us.
    if (servers != nullptr && (!trainer.ok() || (*trainer)->ps() == nullptr)) {
      (void)AbortServers(*servers, par.ps_servers);
    }
    return connected;
  }
  job.trainer = std::move(trainer).value();
  if (o.batch % par.dp != 0) {
    return InvalidArgumentError("--batch " + std::to_string(o.batch) + " is not a multiple of dp " +
                                std::to_string(par.dp));
  }
  Env* env = Env::Default();
  ASSIGN_OR_RETURN(job.loader, OpenLoader(o));
  job.config_text = ConfigString(o.config, o.batch, o.seq, o.seed);
  ASSIGN_OR_RETURN(std::vector<ParamInfo> all_params, Gpt::Params(o.config));
  for (const ParamInfo& p : all_params) job.num_params += p.numel;
  const bool first = world.rank() == 0;
  if (o.print_ops && first) {
    ASSIGN_OR_RETURN(const std::string ops, job.trainer->DescribeOps(o.batch, o.seq));
    std::fputs(ops.empty() ? "no operator strategy: every rank runs the whole model on its rows\n"
                           : ops.c_str(),
               stdout);
  }
  if (!o.strategy_out.empty()) {
    ASSIGN_OR_RETURN(Strategy strategy, job.trainer->strategy());
    if (first) RETURN_IF_ERROR(SaveStrategyFile(env, o.strategy_out, strategy));
  }
  RETURN_IF_ERROR(job.trainer->Init(o.seed));
  return job;
}

// What loading had to work around, and what was rebuilt, said.
void SayRepairs(const RepairNotes& notes, const std::string& path, int rank, bool talk) {
  for (const std::string& line : notes.recovered) {
    std::fprintf(stderr, "train_gpt: rank %d: loading %s: %s\n", rank, path.c_str(), line.c_str());
  }
  if (!notes.repair.ok()) {
    std::fprintf(stderr, "train_gpt: repairing %s: %s\n", path.c_str(),
                 notes.repair.ToString().c_str());
  }
  for (const std::string& line : notes.rebuilt) {
    if (talk) std::printf("repaired %s: rebuilt %s\n", path.c_str(), line.c_str());
  }
  for (const std::string& line : notes.failed) {
    std::fprintf(stderr, "train_gpt: %s: cannot rebuild %s\n", path.c_str(), line.c_str());
  }
}

// --resume: every rank reads the checkpoint `latest` names (the config
// first, then the tensors); files it had to read around are rebuilt.
Status Resume(const Options& o, Communicator& world, Job& job, bool talk) {
  if (!o.resume) return Status::Ok();
  Env* env = Env::Default();
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> checkpoint,
                   OpenResumeCheckpoint(env, o.save, job.config_text));
  if (checkpoint == nullptr) return Status::Ok();  // nothing saved yet: a fresh start
  Gpt& model = job.trainer->model();
  RETURN_IF_ERROR(job.trainer->Load(*checkpoint));
  ASSIGN_OR_RETURN(const RepairNotes notes, RepairAfterLoad(env, *checkpoint, world));
  SayRepairs(notes, checkpoint->path(), world.rank(), talk);
  ASSIGN_OR_RETURN(const DataPosition position, SavedDataPosition(*checkpoint));
  RETURN_IF_ERROR(job.loader->Restore(position));
  job.resumed = true;
  if (!talk) return Status::Ok();
  std::printf("resumed from step %lld (%s, data position %s)\n",
              static_cast<long long>(model.step()), checkpoint->path().c_str(),
              position.ToString().c_str());
  ASSIGN_OR_RETURN(const std::vector<std::string> abandoned,
                   AbandonedCheckpoints(env, o.save, model.step()));
  std::string names;
  for (const std::string& name : abandoned) names += (names.empty() ? "" : ", ") + name;
  if (!names.empty()) {
    std::printf("newer than latest, from an abandoned run, replaced when saved again: %s\n",
                names.c_str());
  }
  return Status::Ok();
}

void SaySetup(const Job& job, Communicator& world) {
  if (const std::string advice = kernels::BlasCoreAdvice(); !advice.empty()) {
    std::fprintf(stderr, "%s\n", advice.c_str());
  }
  const ParallelConfig& par = job.parallel;
  std::printf("model: %s, %lld parameters (matrix products: %s)\n", job.config_text.c_str(),
              static_cast<long long>(job.num_params),
              kernels::DescribeMatmulLibrary(kernels::CurrentMatmulLibrary()).c_str());
  if (world.size() == 1) return;
  std::printf("ranks: %d (%s), dp=%d zero=%d, buckets of %lld KiB\n", world.size(),
              std::string(world.backend()).c_str(), par.dp, par.zero,
              static_cast<long long>(par.bucket_bytes >> 10));
  if (par.tp > 1) {
    std::printf("tensor parallel: tp=%d (operator strategy %s)\n", par.tp,
                ParallelGpt::StrategyFileOf(par).source.c_str());
  }
  if (par.micro_batch_interleave > 1) {
    std::printf(
        "multi-copy: %d copies per micro-batch, tensor-parallel collectives overlapping "
        "the next copy's compute\n",
        par.micro_batch_interleave);
  }
  if (par.pp > 1) {
    if (par.virtual_stages > 1) {
      std::printf(
          "pipeline: pp=%d stages x %d chunks, %d micro-batches per dp rank (interleaved 1F1B)\n",
          par.pp, par.virtual_stages, job.trainer->micro_batches());
    } else {
      std::printf("pipeline: pp=%d stages, %d micro-batches per dp rank (1F1B)\n", par.pp,
                  job.trainer->micro_batches());
    }
  }
}

// How a save is written (workers and parameter servers alike): after a
// resume, committed checkpoints newer than the one resumed from belong to
// an abandoned run, and this run's saves replace them.
// `job_ranks`: the job's ranks when `world` is its first ranks only (the
// parameter servers saving alone; 0: the world's), --hosts naming one host
// for each.
Result<SlicedWriteOptions> SaveOptions(const Options& o, Communicator& world, bool resumed,
                                       int job_ranks = 0) {
  SlicedWriteOptions options;
  options.redundancy = o.redundancy;
  options.merged = o.save_mode == "merged";
  if (!o.hosts.empty()) {
    const int ranks = job_ranks > 0 ? job_ranks : world.size();
    if (static_cast<int>(o.hosts.size()) != ranks) {
      return InvalidArgumentError("--hosts names " + std::to_string(o.hosts.size()) +
                                  " hosts for " + std::to_string(ranks) + " ranks");
    }
    options.hosts.assign(o.hosts.begin(), o.hosts.begin() + world.size());
  }
  options.native.overwrite = resumed;
  options.fault_hook = [&o, &world](std::string_view point, int64_t step) {
    o.fault.At(point, step, world.rank());
  };
  return options;
}

// A sliced checkpoint of step `step` written by `writers` (each its
// pieces through `write`), committed and pointed at by `latest`. Returns
// its redundancy plan, described.
Result<std::string> SaveSliced(const Options& o, Communicator& writers, const Strategy& strategy,
                               const SlicedWriteOptions& options, int64_t step,
                               const std::map<std::string, std::string>& metadata,
                               const std::function<Status(SlicedCheckpointWriter&)>& write) {
  Env* env = Env::Default();
  const std::string name = "step-" + std::to_string(step);
  RETURN_IF_ERROR(env->CreateDirs(o.save));
  ASSIGN_OR_RETURN(std::unique_ptr<SlicedCheckpointWriter> writer,
                   SlicedCheckpointWriter::Create(
                       env, writers, o.save + "/" + name, strategy,
                       {step, metadata, "tessera train_gpt (" + o.save_mode + ")"}, options));
  const Status wrote = write(*writer);
  const Status committed = writer->Commit();  // collective: every writer gets here
  RETURN_IF_ERROR(wrote);
  RETURN_IF_ERROR(committed);
  RETURN_IF_ERROR(PointLatest(env, writers, o.save, name, o.keep));
  return writer->plan().Describe();
}

// Checkpoints during training: every rank writes its own pieces (replicas
// take turns), into its own data file (sliced) or at their places in the
// one file (merged); nothing is gathered. Rank 0 commits, then points
// `latest` at it. With --async-save the rank's pieces are copied out and
// written in the background, one save in flight at a time.
class Saver {
 public:
  Saver(const Options& o, Communicator& world, Job& job, bool talk)
      : o_(o), world_(world), job_(job), talk_(talk), async_(Env::Default(), world) {}

  Status Prepare() {
    ASSIGN_OR_RETURN(options_, SaveOptions(o_, world_, job_.resumed));
    if (o_.async_save && !o_.save.empty() && o_.steps > job_.trainer->step()) {
      // The snapshot arena now, so that no save's stall pays for fresh memory.
      ASSIGN_OR_RETURN(Strategy strategy, job_.trainer->strategy());
      RETURN_IF_ERROR(async_.Prepare(strategy, options_).status());
    }
    return Status::Ok();
  }

  // After each step: commits an async save that every rank has written,
  // and saves when --save-every (or the last step) says so.
  Status AfterStep() {
    const int64_t step = job_.trainer->step();
    if (async_.in_flight()) RETURN_IF_ERROR(Poll(false));
    const bool due = (o_.save_every > 0 && step % o_.save_every == 0) || step == o_.steps;
    // (Replaceable parameter-server workers: the servers save alone.)
    if (o_.save.empty() || !due || o_.ps_replaceable) return Status::Ok();
    const std::string name = "step-" + std::to_string(step);
    const std::map<std::string, std::string> metadata = {
        {"config", job_.config_text}, {"data.position", job_.loader->position().ToString()}};
    TraceSpan span("checkpoint", (o_.async_save ? "save (async) " : "save ") + name);
    return o_.async_save ? SaveAsync(name, metadata) : SaveNow(name, metadata);
  }

  // The last save, if still being written.
  Status Finish() { return Poll(true); }

 private:
  // Commits the async save in flight when every rank has written it (with
  // `wait`, waits for that) and says so.
  Status Poll(bool wait) {
    ASSIGN_OR_RETURN(bool committed, async_.Poll(wait));
    if (committed && talk_) {
      const AsyncSaveStats& st = async_.last();
      std::printf(
          "saved %s (async: training stalled %.1f ms, written in the background in "
          "%.1f ms, commit %.1f ms; redundancy %s)\n",
          st.path.c_str(), st.stall_seconds * 1e3, st.background_seconds * 1e3,
          st.commit_seconds * 1e3, st.redundancy.c_str());
    }
    return Status::Ok();
  }

  // The stall: copying this rank's pieces; the rest runs beside training.
  Status SaveAsync(const std::string& name, const std::map<std::string, std::string>& metadata) {
    RETURN_IF_ERROR(Poll(true));  // at most one save in flight
    ASSIGN_OR_RETURN(Strategy strategy, job_.trainer->strategy());
    ParallelGpt& trainer = *job_.trainer;
    return async_.Start(
        o_.save, name, strategy,
        {trainer.step(), metadata, "tessera train_gpt (" + o_.save_mode + ", async)"}, options_,
        [&](const std::vector<PieceToWrite>& mine) { return trainer.SlicedPieces(strategy, mine); },
        o_.keep);
  }

  Status SaveNow(const std::string& name, const std::map<std::string, std::string>& metadata) {
    ASSIGN_OR_RETURN(Strategy strategy, job_.trainer->strategy());
    // With parameter servers the world writes it: they join now.
    RETURN_IF_ERROR(job_.trainer->RequestServerSave(metadata));
    ASSIGN_OR_RETURN(const std::string plan,
                     SaveSliced(o_, world_, strategy, options_, job_.trainer->step(), metadata,
                                [&](SlicedCheckpointWriter& writer) {
                                  return job_.trainer->WriteSliced(writer, strategy);
                                }));
    if (talk_ && options_.merged) {
      std::printf("saved %s/%s (merged, written by %d ranks%s)\n", o_.save.c_str(), name.c_str(),
                  world_.size(), o_.parallel.ps_servers > 0 ? ", servers and workers" : "");
    } else if (talk_) {
      std::printf("saved %s/%s (sliced over %d ranks, redundancy %s)\n", o_.save.c_str(),
                  name.c_str(), world_.size(), plan.c_str());
    }
    return Status::Ok();
  }

  const Options& o_;
  Communicator& world_;
  Job& job_;
  const bool talk_;
  SlicedWriteOptions options_;
  AsyncSlicedSave async_;
};

// Seconds and losses over the run, for the log and the report.
struct Progress {
  double total_seconds = 0, comm_at_first = 0;
  int64_t plans_at_first = 0;
  int64_t timed_steps = 0;
  float loss = 0;
};

// One training step on this rank's rows: from the whole batch every rank
// reads (full_batch), or from its replica's rows alone (data_parallel).
Status Step(const Options& o, Job& job, std::vector<int32_t>& inputs, std::vector<int32_t>& targets,
            float* loss, float* norm) {
  ParallelGpt& trainer = *job.trainer;
  if (o.dataset_strategy == "full_batch") {
    RETURN_IF_ERROR(job.loader->NextBatch(inputs.data(), targets.data()));
    ASSIGN_OR_RETURN(*loss, trainer.Step(inputs.data(), targets.data(), o.batch, o.seq, o.adam,
                                         o.max_norm, norm));
    return Status::Ok();
  }
  const int rows = o.batch / job.parallel.dp;
  if (o.dataset_strategy == "sequence") {
    // Only this rank's positions of its rows, from the file (Configure
    // checked that the sequence cuts).
    RETURN_IF_ERROR(job.loader->NextBatchShare(trainer.dp_rank() * rows, rows,
                                               trainer.sequence_split(o.seq).Runs(), inputs.data(),
                                               targets.data()));
    ASSIGN_OR_RETURN(*loss, trainer.StepLocal(inputs.data(), targets.data(), o.batch, o.seq, o.adam,
                                              o.max_norm, norm));
    return Status::Ok();
  }
  RETURN_IF_ERROR(
      job.loader->NextBatchRows(trainer.dp_rank() * rows, rows, inputs.data(), targets.data()));
  ASSIGN_OR_RETURN(*loss, trainer.StepRows(inputs.data(), targets.data(), o.batch, o.seq, o.adam,
                                           o.max_norm, norm));
  return Status::Ok();
}

void Log(const Options& o, int64_t step, float loss, float norm, double seconds) {
  std::printf("step %5lld/%d  loss %.9g  norm %.4f  %8.0f tok/s  %7.1f ms\n",
              static_cast<long long>(step), o.steps, loss, norm, o.batch * o.seq / seconds,
              seconds * 1e3);
  std::fflush(stdout);
}

// --export: the weights alone, gathered to rank 0 from every stage and tp
// slice where ranks hold parts of the model.
Status Export(const Options& o, Job& job, Communicator& world, bool talk) {
  if (o.export_dir.empty()) return Status::Ok();
  const bool gather = job.parallel.pp > 1 || job.parallel.tp > 1;
  Gpt full;
  if (gather) {
    RETURN_IF_ERROR(job.trainer->GatherOptimizerState());
    RETURN_IF_ERROR(job.trainer->GatherModel(&full));
  } else {
    RETURN_IF_ERROR(job.trainer->MaterializeOptimizerState());  // offloaded weights
  }
  if (world.rank() != 0) return Status::Ok();
  const SaveGptOptions options{.weights_dtype = *ParseDType(o.export_dtype),
                               .optimizer_state = false};
  const Gpt& model = job.trainer->model();
  const std::string name = "step-" + std::to_string(model.step());
  RETURN_IF_ERROR(SaveGpt(Env::Default(), gather ? full : model, o.export_dir, name,
                          {{"config", job.config_text}}, options));
  if (talk) {
    std::printf("exported %s weights to %s/%s\n", o.export_dtype.c_str(), o.export_dir.c_str(),
                name.c_str());
  }
  return Status::Ok();
}

// What the ranks hold (the largest of each figure over the ranks: pipeline
// stages differ), this process's peak resident set, and the throughput.
// With replaceable parameter-server workers the report is rank 0's own
// (the workers' communicator may hold a dead rank: no collective).
Status Report(const Options& o, Job& job, Communicator& world, const Progress& p) {
  const bool first = world.rank() == 0, alone = o.ps_replaceable;
  const int64_t step = job.trainer->step();
  auto mib = [](double b) { return b / (1 << 20); };
  if (step > 0) {
    const MemoryUse m = job.trainer->Memory();
    double figures[] = {static_cast<double>(m.parameters),
                        static_cast<double>(m.gradients),
                        static_cast<double>(m.optimizer),
                        static_cast<double>(m.activations),
                        static_cast<double>(m.communication),
                        static_cast<double>(m.total()),
                        static_cast<double>(m.offloaded_parameters),
                        static_cast<double>(m.offloaded_optimizer)};
    if (!alone) RETURN_IF_ERROR(world.AllReduce(figures, figures, 8, DType::kF64, ReduceOp::kMax));
    struct rusage usage {};
    getrusage(RUSAGE_SELF, &usage);
    if (first && !o.quiet) {
      std::printf(
          "memory per rank (largest): parameters %.2f MiB, gradients %.2f MiB, optimizer "
          "%.2f MiB, activations %.2f MiB (peak of a step), communication buffers %.2f "
          "MiB, total %.2f MiB%s; peak RSS %.1f MiB (%s)\n",
          mib(figures[0]), mib(figures[1]), mib(figures[2]), mib(figures[3]), mib(figures[4]),
          mib(figures[5]),
          figures[6] + figures[7] > 0
              ? (" (on disk: parameters " + HumanBytes(static_cast<int64_t>(figures[6])) +
                 ", optimizer " + HumanBytes(static_cast<int64_t>(figures[7])) + ")")
                    .c_str()
              : "",
          usage.ru_maxrss / 1024.0,
          world.size() > 1 && world.backend() == "inprocess" ? "the process, every in-process rank"
                                                             : "this rank's process");
    }
  }
  // Optimizer offload: the disk bytes rank 0 moved, beside 2 (m + v) a
  // step (each read and written once; the first step reads none).
  if (const OffloadedMoments* off = job.trainer->offloaded();
      off != nullptr && first && !o.quiet && step > 0) {
    std::printf(
        "offload: %.1f MiB read and %.1f MiB written in %lld steps on rank 0 (m + v: %.1f "
        "MiB), %.1f MiB resident\n",
        mib(off->bytes_read()), mib(off->bytes_written()),
        static_cast<long long>(p.timed_steps + 1), mib(2.0 * off->floats() * 4),
        mib(off->resident_bytes()));
  }
  // Parameter offload: the same for the weights (each unit read in every
  // forward and backward it is needed in, written after the update), and
  // the most of them in memory at once beside the largest unit.
  if (const OffloadedWeights* w = job.trainer->offloaded_weights();
      w != nullptr && first && !o.quiet && step > 0) {
    int64_t all = 0, largest = 0;
    for (int u = 0; u < w->units(); ++u) {
      all += w->unit_bytes(u);
      largest = std::max(largest, w->unit_bytes(u));
    }
    std::printf(
        "weights offload: %.1f MiB read and %.1f MiB written in %lld steps on rank 0 (weights: "
        "%.1f MiB in %d units, the largest %.1f MiB), at most %.1f MiB resident\n",
        mib(w->bytes_read()), mib(w->bytes_written()), static_cast<long long>(p.timed_steps + 1),
        mib(all), w->units(), mib(largest), mib(w->peak_resident_bytes()));
  }
  // What each rank read of a token file (a text file is read whole into
  // memory): its share under --dataset-strategy sequence.
  if (const int64_t mine = job.loader->bytes_read(); step > 0 && world.size() > 1 && !alone) {
    std::vector<int64_t> all(world.size());
    RETURN_IF_ERROR(world.AllGather(&mine, 1, all.data(), DType::kI64));
    if (first && !o.quiet && all[0] > 0) {
      std::string list;
      for (int64_t b : all) list += (list.empty() ? "" : " ") + std::to_string(b);
      std::printf("token file bytes read per rank: %s\n", list.c_str());
    }
  }
  if (p.timed_steps == 0 || !first) return Status::Ok();
  // Model FLOPs per token: 6 per parameter (forward + backward) plus the
  // attention products, 12 * layers * seq * embed.
  const double flops_per_token =
      6.0 * job.num_params + 12.0 * o.config.layers * o.seq * o.config.embed;
  const double tokens_per_s = o.batch * o.seq * p.timed_steps / p.total_seconds;
  std::printf(
      "done: step %lld, loss %.4f, %.0f tokens/s, %.1f GFLOP/s "
      "(mean of %lld steps after the first)\n",
      static_cast<long long>(step), p.loss, tokens_per_s, tokens_per_s * flops_per_token / 1e9,
      static_cast<long long>(p.timed_steps));
  if (world.size() > 1) {
    std::printf("communication: %.1f%% of the step time on rank 0\n",
                100.0 * (job.trainer->comm_seconds() - p.comm_at_first) / p.total_seconds);
  }
  if (job.trainer->plans_built() > 0) {
    std::printf("redistribution plans built on rank 0: %lld in the first step, %lld after\n",
                static_cast<long long>(p.plans_at_first),
                static_cast<long long>(job.trainer->plans_built() - p.plans_at_first));
  }
  return Status::Ok();
}

// The whole run on one rank; rank 0 talks. With parameter servers,
// `world` is the workers' and `servers` everyone's.
Status TrainOn(const Options& o, Communicator& world, Communicator* servers = nullptr) {
  if (!o.calibrate_out.empty()) return Calibrate(o, world);
  const bool talk = world.rank() == 0 && !o.quiet;
  ASSIGN_OR_RETURN(Job job, Configure(o, world, servers));
  RETURN_IF_ERROR(Resume(o, world, job, talk));
  if (talk) SaySetup(job, world);
  // The world saves: with parameter servers, servers and workers together.
  Communicator& everyone = servers != nullptr ? *servers : world;
  Saver saver(o, everyone, job, talk);
  RETURN_IF_ERROR(saver.Prepare());
  std::vector<int32_t> inputs(o.batch * o.seq), targets(o.batch * o.seq);
  Progress progress;
  Heartbeat heartbeat = Heartbeat::FromEnv();
  while (job.trainer->step() < o.steps) {
    o.fault.At("step", job.trainer->step() + 1, everyone.rank());
    RETURN_IF_ERROR(heartbeat.Beat(job.trainer->step() + 1));
    const auto t0 = std::chrono::steady_clock::now();
    float loss = 0, norm = 0;
    {
      TraceSpan span("step", "step " + std::to_string(job.trainer->step() + 1));
      RETURN_IF_ERROR(Step(o, job, inputs, targets, &loss, &norm));
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    progress.loss = loss;
    if (job.trainer->step() > 1) {  // the first step warms caches and allocations
      progress.total_seconds += seconds;
      ++progress.timed_steps;
    } else {
      progress.comm_at_first = job.trainer->comm_seconds();
      progress.plans_at_first = job.trainer->plans_built();
    }
    if (talk) Log(o, job.trainer->step(), loss, norm, seconds);
    // The budget holds step after step, by the runtime's own account.
    if (o.rank_memory > 0) {
      const MemoryUse m = job.trainer->Memory();
      if (m.total() > o.rank_memory) {
        return ResourceExhaustedError("rank " + std::to_string(world.rank()) + ", step " +
                                      std::to_string(job.trainer->step()) +
                                      ": the accounted memory " + m.ToString() +
                                      " exceeds --rank-memory " + HumanBytes(o.rank_memory));
      }
    }
    RETURN_IF_ERROR(saver.AfterStep());
  }
  RETURN_IF_ERROR(saver.Finish());
  RETURN_IF_ERROR(Export(o, job, world, talk));  // (a served table pulled whole)
  RETURN_IF_ERROR(job.trainer->StopServers(/*failed=*/false));
  return Report(o, job, world, progress);
}

// With replaceable workers the servers save alone (every parameter and
// moment is theirs; a worker holds its step and data position, both the
// round's): at each round --save-every names, and the last. The data
// position is the one the workers' loaders reach after that many batches.
class ServerSaves {
 public:
  // `job_ranks`: servers and workers.
  ServerSaves(const Options& o, Communicator& servers, int job_ranks, const PsServer& server)
      : o_(o), servers_(servers), job_ranks_(job_ranks), server_(server) {}

  Status Prepare(const std::vector<ParamInfo>& params, const PsPlacement& placement,
                 const CheckpointReader* resumed) {
    if (o_.save.empty()) return Status::Ok();
    ASSIGN_OR_RETURN(strategy_, PsStrategy(params, placement, servers_.size()));
    ASSIGN_OR_RETURN(options_, SaveOptions(o_, servers_, resumed != nullptr, job_ranks_));
    ASSIGN_OR_RETURN(loader_, OpenLoader(o_));
    if (resumed != nullptr) {
      ASSIGN_OR_RETURN(const DataPosition position, SavedDataPosition(*resumed));
      RETURN_IF_ERROR(loader_->Restore(position));
    }
    at_ = server_.step();
    return Status::Ok();
  }

  // After each request served: the rounds since, each saved if due.
  Status AfterRound() {
    if (loader_ == nullptr) return Status::Ok();
    while (at_ < server_.step()) {
      RETURN_IF_ERROR(loader_->NextBatchRows(0, 0, nullptr, nullptr));
      ++at_;
      const bool due = (o_.save_every > 0 && at_ % o_.save_every == 0) || at_ == o_.steps;
      if (!due || at_ > o_.steps) continue;
      const std::map<std::string, std::string> metadata = {
          {"config", ConfigString(o_.config, o_.batch, o_.seq, o_.seed)},
          {"data.position", loader_->position().ToString()}};
      RETURN_IF_ERROR(SaveSliced(o_, servers_, strategy_, options_, at_, metadata,
                                 [&](SlicedCheckpointWriter& writer) {
                                   return server_.WriteSliced(writer, strategy_);
                                 })
                          .status());
      if (servers_.rank() == 0 && !o_.quiet) {
        std::printf("saved %s/step-%lld (sliced over the %d servers)\n", o_.save.c_str(),
                    static_cast<long long>(at_), servers_.size());
        std::fflush(stdout);
      }
    }
    return Status::Ok();
  }

 private:
  const Options& o_;
  Communicator& servers_;
  const int job_ranks_;
  const PsServer& server_;
  Strategy strategy_;
  SlicedWriteOptions options_;
  std::unique_ptr<TokenLoader> loader_;
  int64_t at_ = 0;
};

// A parameter server's run: its pieces initialised as every worker's
// model is (or from the checkpoint --resume finds), then what the workers
// ask, step by step: a step, a save (the world writes it), or the end.
// `servers`: the servers' own communicator (their saves with replaceable
// workers).
Status Serve(const Options& o, Communicator& world, Communicator& servers, PsPlacement placement) {
  Env* env = Env::Default();
  ASSIGN_OR_RETURN(std::vector<ParamInfo> params, Gpt::Params(o.config));
  ASSIGN_OR_RETURN(const Strategy strategy, PsStrategy(params, placement, world.size()));
  ASSIGN_OR_RETURN(std::unique_ptr<PsServer> server, PsServer::Create(o.config, placement, world));
  const std::string config_text = ConfigString(o.config, o.batch, o.seq, o.seed);
  std::unique_ptr<CheckpointReader> checkpoint;
  if (o.resume) {
    ASSIGN_OR_RETURN(checkpoint, OpenResumeCheckpoint(env, o.save, config_text));
    if (checkpoint != nullptr) RETURN_IF_ERROR(server->Load(*checkpoint));
  }
  const bool resumed = checkpoint != nullptr;
  if (!resumed) RETURN_IF_ERROR(server->Init(o.seed));
  if (o.parallel.ps_staleness >= 0) {
    server->SetAsynchronous(o.ps_replaceable, o.launch.comm.timeout);
  }
  ServerSaves saves(o, servers, world.size(), *server);
  if (o.ps_replaceable) RETURN_IF_ERROR(saves.Prepare(params, placement, checkpoint.get()));
  checkpoint.reset();
  ASSIGN_OR_RETURN(const SlicedWriteOptions options, SaveOptions(o, world, resumed));
  Heartbeat heartbeat = Heartbeat::FromEnv();
  while (true) {
    o.fault.At("step", server->step() + 1, world.rank());
    RETURN_IF_ERROR(heartbeat.Beat(server->step() + 1));
    ASSIGN_OR_RETURN(const PsServer::Asked asked, server->Next());
    RETURN_IF_ERROR(saves.AfterRound());
    if (asked.command == PsProtocol::kStop) break;
    if (asked.command == PsProtocol::kStep) {
      RETURN_IF_ERROR(asked.worker >= 0 ? server->StepAsync(asked.worker, o.adam)
                                        : server->Step(o.adam, o.max_norm));
      RETURN_IF_ERROR(saves.AfterRound());
      continue;
    }
    if (asked.command == PsProtocol::kPullAll) {  // an export
      RETURN_IF_ERROR(server->SendAll());
      continue;
    }
    // A save: the same checkpoint the workers write, with their metadata.
    RETURN_IF_ERROR(SaveSliced(o, world, strategy, options, server->step(), asked.metadata,
                               [&](SlicedCheckpointWriter& writer) {
                                 return server->WriteSliced(writer, strategy);
                               })
                        .status());
  }
  {  // its summary, as a worker's "done:" line (also under --quiet)
    const MemoryUse m = server->Memory();
    std::printf("parameter server %d: %lld steps served, holds %s, %s in and out a step%s\n",
                world.rank(), static_cast<long long>(server->step()), m.ToString().c_str(),
                HumanBytes(server->bytes_per_step()).c_str(),
                o.ps_replaceable
                    ? (", " + std::to_string(server->dropped()) + " worker(s) dropped, " +
                       std::to_string(server->admitted()) + " replacement(s) taken back")
                          .c_str()
                    : "");
  }
  return Status::Ok();
}

// Parameter servers (--ps-servers S): ranks [0, S) serve, the rest train
// as data-parallel workers over a communicator of their own. Every rank
// checks the configuration first, so a bad one stops all of them alike.
Status TrainWithServers(const Options& o, Communicator& world) {
  const int S = o.parallel.ps_servers, N = world.size();
  // Every rank must have been given the same servers and parameters.
  const int64_t mine[2] = {S, static_cast<int64_t>(std::hash<std::string>{}(o.parallel.ps_params))};
  std::vector<int64_t> all(2 * static_cast<size_t>(N));
  RETURN_IF_ERROR(world.AllGather(mine, 2, all.data(), DType::kI64));
  for (int r = 0; r < N; ++r) {
    if (all[2 * r] != S) {
      return InvalidArgumentError("--ps-servers: rank " + std::to_string(r) + " was given " +
                                  std::to_string(all[2 * r]) + " servers, rank " +
                                  std::to_string(world.rank()) + " " + std::to_string(S) +
                                  " (TESSERA_PS_SERVERS differs between the processes)");
    }
    if (all[2 * r + 1] != mine[1]) {
      return InvalidArgumentError("--ps-params: rank " + std::to_string(r) + " was given other " +
                                  "parameters than rank " + std::to_string(world.rank()) + " ('" +
                                  o.parallel.ps_params + "')");
    }
  }
  if (S >= N) {
    return InvalidArgumentError("--ps-servers " + std::to_string(S) + " of " + std::to_string(N) +
                                " ranks leaves no worker (ranks = servers + workers)");
  }
  ParallelConfig par = o.parallel;
  if (par.dp == 0) par.dp = N - S;
  RETURN_IF_ERROR(par.Validate(N - S));
  // What a worker would refuse, every rank refuses (no server waits for a
  // worker that never comes).
  RETURN_IF_ERROR(CheckSequenceCut(par.cp_algo, o.seq, par.cp, "h.*.attn.attention"));
  RETURN_IF_ERROR(par.ValidateLayers(o.config));
  RETURN_IF_ERROR(CheckRankMemory(o, par));
  ASSIGN_OR_RETURN(std::vector<ParamInfo> params, Gpt::Params(o.config));
  ASSIGN_OR_RETURN(PsPlacement placement, PsPlacement::Create(params, S, par.ps_params));
  const bool server = world.rank() < S;
  ASSIGN_OR_RETURN(std::unique_ptr<Communicator> group, world.Split(server ? 0 : 1, world.rank()));
  group->set_name(server ? "servers" : "workers");
  if (o.ps_replaceable) {
    // Replacements join through the world's rendezvous: Gloo's.
    RETURN_IF_ERROR(HasGlooKey(world, "ps.replaceable")
                        .status()
                        .Annotate(std::string(kEnvPsReplaceable) +
                                  " (tessera-run "
                                  "--ps-replace-workers): a replacement joins over Gloo"));
  }
  if (server) return Serve(o, world, *group, std::move(placement));
  if (group->rank() == 0 && !o.quiet) {
    std::printf("parameter servers: %d of %d ranks (%d workers)\n%s", S, N, N - S,
                placement.Describe().c_str());
    const bool served = std::any_of(placement.pieces().begin(), placement.pieces().end(),
                                    [](const PsPiece& p) { return p.name == "wte"; });
    if (served && o.config.untied) {
      std::printf("wte served by rows (an untied head): a worker fetches its batch's rows\n");
    }
    if (par.ps_staleness >= 0) {
      std::printf(
          "asynchronous: each worker's push is its own update, a worker up to %d steps "
          "ahead of the slowest (the losses below are worker 0's rows)\n",
          par.ps_staleness);
    }
  }
  return TrainOn(o, *group, &world);
}

// A process started in place of an asynchronous worker that died
// (TESSERA_PS_REJOIN = n under tessera-run --ps-replace-workers): outside
// the world (whose pairs to the dead rank are gone for good), it trains as
// that worker on a communicator of its own, its rows of each batch, after
// the servers sent it their weights (PsClient::Rejoin). It neither saves
// (the servers do) nor reports the world's figures.
Status Replace(const Options& o) {
  ASSIGN_OR_RETURN(const RankTable table, RankTableFromEnv());
  const int S = o.parallel.ps_servers, W = table.world_size - S, w = table.rank - S;
  const std::string who = "replacement " + std::to_string(o.ps_rejoin) + " of worker " +
                          std::to_string(w) + " (rank " + std::to_string(table.rank) + ")";
  if (S <= 0 || w < 0) {
    return InvalidArgumentError(std::string(kEnvPsRejoin) + ": rank " + std::to_string(table.rank) +
                                " is not a parameter-server worker (--ps-servers " +
                                std::to_string(S) + ")");
  }
  if (o.batch % W != 0) {
    return InvalidArgumentError(who + ": --batch " + std::to_string(o.batch) +
                                " is not a multiple of the " + std::to_string(W) + " workers");
  }
  LaunchOptions alone = o.launch;
  alone.backend = CommBackend::kInProcess;
  alone.ranks = 1;
  return LaunchRanks(alone, [&](Communicator& own) -> Status {
    ParallelConfig par = o.parallel;
    par.dp = 1;
    ASSIGN_OR_RETURN(std::unique_ptr<ParallelGpt> trainer, ParallelGpt::Create(o.config, par, own));
    Result<bool> joined = trainer->RejoinServers(table, W, w, o.ps_rejoin, o.launch.comm);
    if (!joined.ok()) return joined.status().Annotate(who);
    if (!*joined) {
      std::printf("%s: the servers had finished (their other workers done): nothing to do\n",
                  who.c_str());
      return Status::Ok();
    }
    // Its loader where the worker's was: past the batches of the steps
    // before the one it resumes at.
    ASSIGN_OR_RETURN(std::unique_ptr<TokenLoader> loader, OpenLoader(o));
    for (int64_t s = 0; s < trainer->step(); ++s) {
      RETURN_IF_ERROR(loader->NextBatchRows(0, 0, nullptr, nullptr));
    }
    const std::vector<int64_t>& rounds = trainer->ps()->joined_at();
    std::string sent;
    for (int64_t r : rounds) sent += (sent.empty() ? "" : ", ") + std::to_string(r);
    std::printf("%s: joined the servers (their weights of rounds %s), training from step %lld\n",
                who.c_str(), sent.c_str(), static_cast<long long>(trainer->step() + 1));
    std::fflush(stdout);
    const int rows = o.batch / W;
    std::vector<int32_t> inputs(static_cast<size_t>(rows) * o.seq), targets(inputs.size());
    Heartbeat heartbeat = Heartbeat::FromEnv();
    while (trainer->step() < o.steps) {
      // (No --fault-* here: a fault stops the rank's first process only.)
      RETURN_IF_ERROR(heartbeat.Beat(trainer->step() + 1));
      const auto t0 = std::chrono::steady_clock::now();
      RETURN_IF_ERROR(loader->NextBatchRows(w * rows, rows, inputs.data(), targets.data()));
      float norm = 0;
      ASSIGN_OR_RETURN(const float loss, trainer->StepLocal(inputs.data(), targets.data(), rows,
                                                            o.seq, o.adam, o.max_norm, &norm));
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (w == 0 && !o.quiet) Log(o, trainer->step(), loss, norm, seconds);
    }
    // (Started, it is in every server's rounds: each takes its stop.)
    RETURN_IF_ERROR(trainer->StopServers(/*failed=*/false));
    std::printf("%s: done at step %lld\n", who.c_str(), static_cast<long long>(trainer->step()));
    return Status::Ok();
  });
}

Status Run(const Options& o, Communicator& world) {
  RETURN_IF_ERROR(kernels::SameMatmulLibrary(world));
  if (o.parallel.ps_servers > 0 && o.calibrate_out.empty()) return TrainWithServers(o, world);
  return TrainOn(o, world);
}

// With --trace, the run recorded on this rank's timeline (its collectives
// through a traced communicator), written to PREFIX.rank<R>.json even when
// the run fails.
Status Train(const Options& o, Communicator& world) {
  if (o.trace.empty()) return Run(o, world);
  Trace trace(world.rank());
  Status run;
  {
    ScopedTrace scoped(&trace);
    std::unique_ptr<Communicator> traced = TracedCommunicator(world);
    run = Run(o, *traced);
  }
  const std::string path = o.trace + ".rank" + std::to_string(world.rank()) + ".json";
  Status written = WriteFileAtomically(Env::Default(), path, trace.Json());
  return run.ok() ? written : run;
}

}  // namespace

int main(int argc, char** argv) {
  // See BetterBlasCore: restart once with the faster OpenBLAS kernels.
  if (const std::string core = kernels::BetterBlasCore(); !core.empty()) {
    setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
    execv("/proc/self/exe", argv);  // on failure, go on with what we have
  }
  Options o;
  if (const int rc = ParseOptions(argc, argv, &o); rc >= 0) return rc;
  // MindSpore's parameter-server variables (MS_ROLE, ...): the scheduler
  // numbers the processes; a server or worker then runs as that rank.
  if (Result<MsRoles> ms = MsRolesFromEnv(); ms.ok()) {
    if (ms->role == "MS_SCHED") {
      Result<std::string> table = RunMsScheduler(*ms, o.launch.comm.timeout);
      if (!table.ok()) return Fail(table.status());
      if (!o.quiet) std::printf("MS_SCHED: every process has its rank (%s)\n", table->c_str());
      return 0;
    }
    if (o.parallel.ps_servers != 0 && o.parallel.ps_servers != ms->servers) {
      return Fail(InvalidArgumentError("--ps-servers " + std::to_string(o.parallel.ps_servers) +
                                       " but MS_SERVER_NUM=" + std::to_string(ms->servers)));
    }
    o.parallel.ps_servers = ms->servers;
    // (Refused before joining: the other roles are not kept waiting.)
    if (Status s = RefuseWithServers(o); !s.ok()) return Fail(s);
    Result<int> rank = JoinMsRoles(*ms, o.launch.comm.timeout);
    if (!rank.ok()) return Fail(rank.status());
    if (o.compute_threads == 0) o.compute_threads = 1;  // one rank of several per process
  } else if (ms.status().code() != StatusCode::kNotFound) {
    return Fail(ms.status());
  }
  if (Status s = UseMatmulLibrary(o); !s.ok()) return Fail(s);
  kernels::SetComputeThreads(o.compute_threads);
  if (o.ps_rejoin > 0) {
    if (Status s = Replace(o); !s.ok()) return Fail(s);
    return 0;
  }
  if (Status s = LaunchRanks(o.launch, [&](Communicator& world) { return Train(o, world); });
      !s.ok()) {
    if (o.parallel.ps_servers > 0 && s.code() == StatusCode::kDeadlineExceeded) {
      // Which role a rank that never came has.
      const int S = o.parallel.ps_servers;
      s = Status(s.code(),
                 s.message() + " (with --ps-servers " + std::to_string(S) + ": rank" +
                     (S == 1 ? " 0 is the parameter server"
                             : "s 0-" + std::to_string(S - 1) + " are parameter servers") +
                     ", the others workers)");
    }
    return Fail(s);
  }
  return 0;
}
