#include "samples/gpt/train_options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <tuple>

#include "core/byte_size.h"
#include "runtime/comm/mpi.h"
#include "runtime/kernels.h"
#include "runtime/matmul_library.h"
#include "runtime/train/data.h"

namespace tessera {
namespace {

// The flags read as text, checked once all are parsed.
struct Flags {
  int threads = -1, ranks = 0, rank = -1, world_size = -1;
  double bucket_mib = 25, offload_bucket_mib = 4, comm_timeout = 300;
  std::string op_strategy, recompute = "none", redundancy = "none", rank_memory;
  std::string cp_algo = "ring", offload = "none";
  std::string hosts, fault_kill, fault_hang, backend = "auto", master;
};

void AddModelFlags(CLI::App* app, Options* o) {
  app->add_option("--data", o->data,
                  "text file (one token per byte) or token file (llm.c's uint16/uint32 .bin)")
      ->check(CLI::ExistingFile);
  app->add_option("--layers", o->config.layers)->check(CLI::PositiveNumber);
  app->add_option("--heads", o->config.heads)->check(CLI::PositiveNumber);
  app->add_option("--embed", o->config.embed)->check(CLI::PositiveNumber);
  app->add_option("--context", o->config.context, "longest sequence")->check(CLI::PositiveNumber);
  app->add_option("--vocab", o->config.vocab, "vocabulary (>= 256; bytes use the first 256)")
      ->check(CLI::Range(kByteVocab, 1 << 20));
  app->add_flag("--untied-head", o->config.untied,
                "an output projection of its own (lm_head.weight) instead of wte's transpose; "
                "with parameter servers holding wte, workers pull only their batch's rows");
  app->add_option("--batch", o->batch, "global batch (split over dp)")->check(CLI::PositiveNumber);
  app->add_option("--seq", o->seq, "sequence length (default: the context)");
  app->add_option("--steps", o->steps, "train until this step")->check(CLI::NonNegativeNumber);
  app->add_option("--lr", o->adam.lr);
  app->add_option("--weight-decay", o->adam.weight_decay);
  app->add_option("--max-norm", o->max_norm, "gradient clipping (0: none)");
  app->add_option("--seed", o->seed, "initialisation and data order");
}

void AddParallelFlags(CLI::App* app, Options* o, Flags* f) {
  app->add_option("--threads", f->threads,
                  "compute threads per rank (default: all cores on one rank, 1 with several)");
  app->add_option("--matmul-library", o->matmul_library,
                  "the matrix products' library (default: the --profile's matmul_library, which "
                  "--calibrate measures, else openblas); every rank must use the same")
      ->check(CLI::IsMember(MatmulLibraryNames()));
  app->add_option("--ranks", f->ranks, "ranks as threads of this process (not under mpirun)")
      ->check(CLI::PositiveNumber);
  app->add_option("--dp", o->parallel.dp, "data-parallel ranks (default: ranks / (pp tp))")
      ->check(CLI::PositiveNumber);
  app->add_option("--pp", o->parallel.pp, "pipeline stages (consecutive blocks of layers)")
      ->check(CLI::PositiveNumber);
  app->add_option("--tp", o->parallel.tp,
                  "tensor-parallel ranks (Megatron: heads, MLP and vocabulary split; "
                  "a divisor of --heads)")
      ->check(CLI::PositiveNumber);
  app->add_option("--cp", o->parallel.cp,
                  "context-parallel ranks: every sequence cut over them, attention crossing "
                  "them by --cp-algo (parameters replicated, gradients averaged over dp x cp)")
      ->check(CLI::PositiveNumber);
  app->add_option("--cp-algo", f->cp_algo,
                  "attention under --cp: ring (keys and values passed round the cp ranks, an "
                  "online softmax, the zigzag split; T a multiple of 2 cp) or ulysses (all-to-all "
                  "to a cut by heads; heads a multiple of tp x cp)")
      ->check(CLI::IsMember({"ring", "ulysses"}));
  app->add_option("--op-strategy", f->op_strategy,
                  "operator strategy file (JSON, \"format\": \"tessera.op_strategy\"; its mesh, "
                  "zero, micro_batches and stage_layers apply unless given here)");
  app->add_flag(
      "--sequence-parallel", o->parallel.sequence_parallel,
      "Megatron's sequence parallelism with --tp (layer norms and residuals cut by rows)");
  app->add_option("--dataset-strategy", o->dataset_strategy,
                  "data_parallel: each data-parallel replica reads only its rows of the batch; "
                  "full_batch: every rank reads the whole batch and keeps its rows; sequence: "
                  "each rank reads only its rows and, under --cp, its positions of them")
      ->check(CLI::IsMember({"data_parallel", "full_batch", "sequence"}));
  app->add_option("--recompute", f->recompute,
                  "activation recompute of every block: none, full (keep each block's input, "
                  "run it again in backward) or selective (the attention core only)")
      ->check(CLI::IsMember({"none", "full", "selective"}));
  app->add_flag("--print-op-strategy", o->print_ops,
                "print each operator's strategy, the redistributions inserted between them and "
                "the parameters' layouts (with --steps 0: print only)");
  app->add_option("--micro-batches", o->parallel.micro_batches,
                  "micro-batches per step and dp rank under --pp (default: pp)")
      ->check(CLI::PositiveNumber);
  app->add_option("--virtual-stages", o->parallel.virtual_stages,
                  "chunks of layers per pipeline stage: interleaved 1F1B, chunk c of stage s "
                  "runs layer group c pp + s (default 1)")
      ->check(CLI::PositiveNumber);
  app->add_option("--micro-batch-interleave", o->parallel.micro_batch_interleave,
                  "multi-copy: cut each micro-batch into N copies of whole sequences whose "
                  "tensor-parallel collectives overlap the other copies' compute (tp > 1; "
                  "default 1)")
      ->check(CLI::PositiveNumber);
  app->add_option("--offload", f->offload,
                  "optimizer: keep Adam's moments (this rank's ZeRO shard) in a file under "
                  "--offload-dir, streamed through the update bucket by bucket; "
                  "optimizer,params: the weights too, in memory a block (or the embeddings) "
                  "at a time while the next is read (none: in memory)")
      ->check([](const std::string& s) {
        const Result<OffloadKinds> k = ParseOffload(s);
        return k.ok() ? std::string() : std::string(k.status().message());
      });
  app->add_option("--offload-bucket-mib", f->offload_bucket_mib,
                  "--offload: MiB of each of m and v a streamed bucket holds (three resident; "
                  "default 4)")
      ->check(CLI::PositiveNumber);
  app->add_option("--offload-dir", o->parallel.offload_dir,
                  "directory of the offload files (a local disk; created files are scratch)");
  app->add_option("--ps-servers", o->parallel.ps_servers,
                  "parameter servers: ranks [0, S) hold the parameters --ps-params names and "
                  "their Adam moments, the other ranks are data-parallel workers pushing "
                  "gradients and pulling weights (default: TESSERA_PS_SERVERS, else 0)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--ps-params", o->parallel.ps_params,
                  "with --ps-servers: all (default) or parameter names and patterns, "
                  "comma-separated ('*' one dot-free part: 'wte,h.*.mlp.c_fc.*')");
  app->add_option("--ps-staleness", o->parallel.ps_staleness,
                  "with --ps-servers: asynchronous, a worker up to K steps ahead of the slowest "
                  "(each push its own update; default: synchronous)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--zero", o->parallel.zero, "1: shard the optimizer states over dp (ZeRO-1)")
      ->check(CLI::Range(0, 1));
  app->add_option("--bucket-mib", f->bucket_mib, "gradient bucket size for the dp reduction")
      ->check(CLI::PositiveNumber);
  app->add_option("--auto-parallel", o->auto_parallel,
                  "choose the parallel configuration (mesh, operator strategies, micro-batches, "
                  "ZeRO, recompute, pipeline stages) by a cost-model search: fast (among data "
                  "parallelism, Megatron and Megatron-SP), exact (every operator's own choice) or "
                  "propagate (exact, keeping what --op-strategy FILE sets)")
      ->check(CLI::IsMember({"fast", "exact", "propagate"}));
  app->add_option("--rank-memory", f->rank_memory,
                  "memory per rank (2GiB): the job refuses to start when the accounted peak "
                  "would exceed it and stops when a step's account does; --auto-parallel "
                  "searches within it (default there: the profile's device memory), offloading "
                  "to --offload-dir when nothing else fits");
  app->add_option(
         "--profile", o->profile,
         "machine profile (JSON, \"format\": \"tessera.machine_profile\"; --calibrate writes "
         "one): the matrix products' library it chose, and the figures --auto-parallel and "
         "--rank-memory price with (default there: measure this machine at start-up)")
      ->check(CLI::ExistingFile);
  app->add_option("--calibrate", o->calibrate_out,
                  "measure this machine (matrix products, memory, the ranks' collectives) and "
                  "write its profile here, then exit");
}

void AddCheckpointFlags(CLI::App* app, Options* o, Flags* f) {
  app->add_option("--save", o->save, "checkpoint directory");
  app->add_option("--save-every", o->save_every, "save every N steps (and at the end)");
  app->add_option("--keep", o->keep,
                  "keep the newest N checkpoints in --save (and the one latest names); 0: all")
      ->check(CLI::NonNegativeNumber);
  app->add_flag("--async-save", o->async_save,
                "saves written in the background: training stalls only to copy each rank's "
                "pieces to host memory (sliced unless --save-mode merged is given)");
  app->add_option("--save-mode", o->save_mode,
                  "merged: whole tensors in one data file, every rank writing its pieces at "
                  "their places in it; sliced: every rank writes its own pieces (replicas take "
                  "turns) to its own file. Nothing is gathered either way")
      ->check(CLI::IsMember({"merged", "sliced"}));
  app->add_option("--redundancy", f->redundancy,
                  "sliced saves: replicas:K (each piece in K files, on K ranks, on different "
                  "hosts first), parity:G (XOR parity per G data files), rs:K+M (Reed-Solomon: M "
                  "parity files per K data files, any M rebuilt; no host holds more than M of a "
                  "group), replicas combined with one of the others comma-separated, or none; "
                  "lost or corrupt files are rebuilt at load and by ckpt verify --repair");
  app->add_option("--hosts", f->hosts,
                  "testing: the host of each rank, comma-separated (a,a,b,b), recorded in "
                  "sliced checkpoints and used to place copies and parity; default "
                  "$TESSERA_HOSTS, else each process's hostname");
  app->add_option("--strategy-out", o->strategy_out,
                  "write the layouts of this run's checkpoints (its strategy, JSON) here, for "
                  "ckpt reshard --strategy; with --steps 0 nothing else is done");
  app->add_flag("--resume", o->resume, "continue from the --save directory's latest checkpoint");
  app->add_option("--export", o->export_dir,
                  "at the end, write the weights alone (no optimizer state) as a checkpoint here");
  app->add_option("--export-dtype", o->export_dtype, "dtype of the exported weights")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
}

void AddLaunchFlags(CLI::App* app, Options* o, Flags* f) {
  app->add_option("--backend", f->backend,
                  "auto (mpi under mpirun, gloo under a rank table: tessera-run, torchrun's "
                  "variables; else inprocess), inprocess, mpi or gloo")
      ->check(CLI::IsMember({"auto", "inprocess", "mpi", "gloo"}));
  app->add_option("--rank", f->rank, "this process's rank (gloo; else TESSERA_RANK or RANK)");
  app->add_option("--world-size", f->world_size,
                  "processes in the job (gloo; else TESSERA_WORLD_SIZE)");
  app->add_option(
      "--master", f->master,
      "host:port of rank 0's rendezvous (gloo; else TESSERA_MASTER or MASTER_ADDR/PORT)");
  app->add_option("--comm-timeout", f->comm_timeout,
                  "seconds any collective, message or rendezvous may wait before the job fails "
                  "naming what it waited for (default 300)")
      ->check(CLI::PositiveNumber);
  app->add_option("--fault-kill", f->fault_kill,
                  "testing: POINT:STEP:RANK kills that rank's process (SIGKILL) at POINT of step "
                  "STEP (step, write, redundancy, commit, rename)");
  app->add_option("--fault-hang", f->fault_hang,
                  "testing: POINT:STEP:RANK stops that rank for ever at POINT of step STEP (a hung "
                  "rank: its heartbeat stops, its peers wait)");
  app->add_option("--fault-stall", o->fault.stall,
                  "testing: with --fault-hang, that rank stops SECONDS and then goes on (a "
                  "stalled worker)")
      ->check(CLI::PositiveNumber);
  app->add_option("--trace", o->trace,
                  "write each rank's timeline to PREFIX.rank<R>.json (Chrome trace events: "
                  "compute per operator, collectives, pipeline sends and waits, optimizer, "
                  "checkpoint I/O); view with ui.perfetto.dev or chrome://tracing")
      ->type_name("PREFIX");
  app->add_flag("--quiet", o->quiet, "log only the summary");
}

// --auto-parallel: what it chooses may not be set by hand as well.
Status CheckAutoParallel(const CLI::App& app, const Flags& f, Options* o) {
  if (!f.rank_memory.empty()) {
    ASSIGN_OR_RETURN(o->rank_memory, ParseByteSize(f.rank_memory));
  }
  if (o->auto_parallel.empty()) return Status::Ok();
  if ((o->auto_parallel == "propagate") != !f.op_strategy.empty()) {
    return InvalidArgumentError(
        o->auto_parallel == "propagate"
            ? "--auto-parallel propagate completes --op-strategy FILE: give one"
            : "--op-strategy fixes the strategy: use --auto-parallel propagate");
  }
  for (const char* flag : {"--dp", "--tp", "--pp", "--cp", "--cp-algo", "--zero", "--micro-batches",
                           "--recompute", "--sequence-parallel"}) {
    if (app.count(flag) > 0) {
      return InvalidArgumentError(std::string("--auto-parallel chooses ") + (flag + 2) + ": drop " +
                                  flag);
    }
  }
  return Status::Ok();
}

// --op-strategy FILE: its settings, unless given on the command line (then
// they must agree: ParallelConfig::Validate names the file).
Status ApplyStrategyFile(const CLI::App& app, const std::string& path, Options* o) {
  if (o->parallel.sequence_parallel) {
    return InvalidArgumentError(
        "--op-strategy says every operator's strategy: drop --sequence-parallel");
  }
  ASSIGN_OR_RETURN(OpStrategyFile file, OpStrategyFile::Load(path));
  for (auto [flag, from, to] :
       {std::tuple{"--pp", file.pp, &o->parallel.pp},
        {"--dp", file.dp, &o->parallel.dp},
        {"--tp", file.tp, &o->parallel.tp},
        {"--cp", file.cp, &o->parallel.cp},
        {"--micro-batches", file.micro_batches, &o->parallel.micro_batches},
        {"--virtual-stages", file.virtual_stages, &o->parallel.virtual_stages},
        {"--micro-batch-interleave", file.micro_batch_interleave,
         &o->parallel.micro_batch_interleave},
        {"--zero", file.zero, &o->parallel.zero}}) {
    if (!from.has_value()) continue;
    if (app.count(flag) == 0) {
      *to = *from;
    } else if (*to != *from) {
      return InvalidArgumentError(path + " sets " + std::string(flag + 2) + " " +
                                  std::to_string(*from) + " but " + flag + " is " +
                                  std::to_string(*to));
    }
  }
  if (file.cp_algo.has_value()) {
    if (app.count("--cp-algo") > 0 && o->parallel.cp_algo != *file.cp_algo) {
      return InvalidArgumentError(path + " sets cp_algo " + std::string(CpAlgoName(*file.cp_algo)) +
                                  " but --cp-algo is " +
                                  std::string(CpAlgoName(o->parallel.cp_algo)));
    }
    o->parallel.cp_algo = *file.cp_algo;
  }
  if (file.offload.has_value()) {
    const OffloadKinds flag{o->parallel.offload_optimizer, o->parallel.offload_params};
    if (app.count("--offload") > 0 && flag != *file.offload) {
      return InvalidArgumentError(path + " sets offload " + file.offload->Name() +
                                  " but --offload is " + flag.Name());
    }
    o->parallel.offload_optimizer = file.offload->optimizer;
    o->parallel.offload_params = file.offload->params;
  }
  if (!file.offload_dir.empty()) {
    if (app.count("--offload-dir") > 0 && o->parallel.offload_dir != file.offload_dir) {
      return InvalidArgumentError(path + " sets offload_dir " + file.offload_dir +
                                  " but --offload-dir is " + o->parallel.offload_dir);
    }
    o->parallel.offload_dir = file.offload_dir;
  }
  if (file.ps_servers.has_value()) {
    if (app.count("--ps-servers") > 0 && o->parallel.ps_servers != *file.ps_servers) {
      return InvalidArgumentError(path + " sets ps_servers " + std::to_string(*file.ps_servers) +
                                  " but --ps-servers is " + std::to_string(o->parallel.ps_servers));
    }
    o->parallel.ps_servers = *file.ps_servers;
  }
  if (!file.ps_params.empty()) {
    if (app.count("--ps-params") > 0 && o->parallel.ps_params != file.ps_params) {
      return InvalidArgumentError(path + " sets ps_params " + file.ps_params +
                                  " but --ps-params is " + o->parallel.ps_params);
    }
    o->parallel.ps_params = file.ps_params;
  }
  if (file.ps_staleness.has_value()) {
    if (app.count("--ps-staleness") > 0 && o->parallel.ps_staleness != *file.ps_staleness) {
      return InvalidArgumentError(path + " sets ps_staleness " +
                                  std::to_string(*file.ps_staleness) + " but --ps-staleness is " +
                                  std::to_string(o->parallel.ps_staleness));
    }
    o->parallel.ps_staleness = *file.ps_staleness;
  }
  o->parallel.stage_layers = file.stage_layers;
  if (!file.dataset_strategy.empty()) {
    if (app.count("--dataset-strategy") > 0 && o->dataset_strategy != file.dataset_strategy) {
      return InvalidArgumentError(path + " sets dataset_strategy " + file.dataset_strategy +
                                  " but --dataset-strategy is " + o->dataset_strategy);
    }
    o->dataset_strategy = file.dataset_strategy;
  }
  o->parallel.op_strategy = std::make_shared<const OpStrategyFile>(std::move(file));
  return Status::Ok();
}

// Saves: the redundancy, the hosts it places copies on, the fault points.
Status CheckSaves(const Flags& f, Options* o) {
  ASSIGN_OR_RETURN(o->redundancy, Redundancy::Parse(f.redundancy));
  for (size_t at = 0; !f.hosts.empty() && at <= f.hosts.size();) {
    const size_t comma = std::min(f.hosts.find(',', at), f.hosts.size());
    o->hosts.push_back(f.hosts.substr(at, comma - at));
    if (o->hosts.back().empty()) {
      return InvalidArgumentError("--hosts '" + f.hosts + "': an empty host name");
    }
    at = comma + 1;
  }
  if (!f.fault_kill.empty() && !f.fault_hang.empty()) {
    return InvalidArgumentError("give --fault-kill or --fault-hang, not both");
  }
  const double stall = o->fault.stall;
  ASSIGN_OR_RETURN(o->fault, FaultKill::Parse(f.fault_kill.empty() ? f.fault_hang : f.fault_kill));
  o->fault.hang = !f.fault_hang.empty();
  o->fault.stall = stall;
  if (stall > 0 && !o->fault.hang) return InvalidArgumentError("--fault-stall needs --fault-hang");
  if (o->async_save && (o->parallel.offload_optimizer || o->parallel.offload_params)) {
    return InvalidArgumentError(
        "--async-save with --offload " +
        OffloadKinds{o->parallel.offload_optimizer, o->parallel.offload_params}.Name() +
        ": the async snapshot would hold the offloaded state in memory; save synchronously "
        "(drop --async-save)");
  }
  if (!o->redundancy.none() && o->save_mode != "sliced") {
    return InvalidArgumentError("--redundancy needs --save-mode sliced (or --async-save)");
  }
  return Status::Ok();
}

// Parameter servers: --ps-servers, else the launcher's TESSERA_PS_SERVERS.
Status CheckServers(const CLI::App& app, Options* o) {
  ParallelConfig& par = o->parallel;
  if (app.count("--ps-servers") == 0 &&
      (par.op_strategy == nullptr || !par.op_strategy->ps_servers.has_value())) {
    ASSIGN_OR_RETURN(int64_t n, EnvInt(kEnvPsServers, 0, 1 << 20));
    if (n >= 0) par.ps_servers = static_cast<int>(n);
  }
  ASSIGN_OR_RETURN(const int64_t replaceable, EnvInt(kEnvPsReplaceable, 0, 1));
  ASSIGN_OR_RETURN(const int64_t rejoin, EnvInt(kEnvPsRejoin, 1, 1 << 20));
  o->ps_replaceable = replaceable == 1;
  o->ps_rejoin = rejoin > 0 ? static_cast<int>(rejoin) : 0;
  return RefuseWithServers(*o);
}

// How the ranks start: the rank table from flags, as the environment would
// give it; one compute thread a rank where several share the cores.
Status CheckLaunch(const Flags& f, Options* o) {
  ExportRankTable(f.rank, f.world_size, f.master);
  o->launch.ranks = f.ranks;
  o->launch.comm.timeout = std::chrono::milliseconds(static_cast<int64_t>(f.comm_timeout * 1000));
  o->launch.backend = *ParseCommBackend(f.backend);  // CLI11 checked it
  if (LaunchedByMpirun() && f.ranks > 0) {
    return InvalidArgumentError("--ranks starts threads; under mpirun use -np instead");
  }
  if (f.ranks > 1 && f.threads > 1) {
    // The kernels' pool and OpenBLAS's thread count are per process.
    return InvalidArgumentError("--threads above 1 needs one rank per process (mpirun)");
  }
  Result<RankTable> table = RankTableFromEnv();
  const bool several = f.ranks > 1 || LaunchedByMpirun() || (table.ok() && table->world_size > 1);
  o->compute_threads = f.threads >= 0 ? f.threads : several ? 1 : 0;
  return Status::Ok();
}

Status Resolve(const CLI::App& app, const Flags& f, Options* o) {
  o->parallel.recompute = *ParseRecompute(f.recompute);  // CLI11 checked it
  o->parallel.cp_algo = *ParseCpAlgo(f.cp_algo);
  const OffloadKinds offload = *ParseOffload(f.offload);  // CLI11 checked it
  o->parallel.offload_optimizer = offload.optimizer;
  o->parallel.offload_params = offload.params;
  RETURN_IF_ERROR(CheckAutoParallel(app, f, o));
  if (o->seq <= 0) o->seq = o->config.context;
  if (o->seq > o->config.context) return InvalidArgumentError("--seq is longer than --context");
  if (o->resume && o->save.empty()) return InvalidArgumentError("--resume needs --save DIR");
  if (o->async_save && app.count("--save-mode") == 0) o->save_mode = "sliced";
  o->parallel.bucket_bytes = static_cast<int64_t>(f.bucket_mib * (1 << 20));
  o->parallel.offload_bucket_bytes = static_cast<int64_t>(f.offload_bucket_mib * (1 << 20));
  if (!f.op_strategy.empty()) RETURN_IF_ERROR(ApplyStrategyFile(app, f.op_strategy, o));
  RETURN_IF_ERROR(CheckServers(app, o));
  RETURN_IF_ERROR(CheckSaves(f, o));
  return CheckLaunch(f, o);
}

}  // namespace

Status RefuseWithServers(const Options& o) {
  if (o.parallel.ps_servers == 0) return Status::Ok();
  if (!o.auto_parallel.empty()) {
    return InvalidArgumentError(
        "--ps-servers with --auto-parallel: the search does not place "
        "parameter servers; choose one or the other");
  }
  if (o.async_save) {
    return InvalidArgumentError(
        "--ps-servers with --async-save: the servers save with the "
        "workers, synchronously (drop --async-save)");
  }
  if (!o.ps_replaceable && o.ps_rejoin == 0) return Status::Ok();
  const std::string policy = std::string(o.ps_rejoin > 0 ? kEnvPsRejoin : kEnvPsReplaceable) +
                             " (tessera-run --ps-replace-workers)";
  if (o.parallel.ps_staleness < 0) {
    return InvalidArgumentError(
        policy + ": workers are replaced in asynchronous mode only (--ps-staleness K)");
  }
  if (!o.export_dir.empty()) {
    return InvalidArgumentError(policy +
                                ": --export needs every worker at one round; export the servers' "
                                "last checkpoint instead (ckpt convert)");
  }
  return Status::Ok();  // (the world must be Gloo's: TrainWithServers checks)
}

int ParseOptions(int argc, char** argv, Options* o) {
  CLI::App app{"Train a GPT-2 style model on a text or token file, on one or more ranks"};
  o->config = {.layers = 4, .heads = 4, .embed = 256, .context = 256, .vocab = kByteVocab};
  o->data = "data/corpus.txt";
  o->export_dtype = "f32";
  o->adam = {.lr = 3e-4f, .weight_decay = 0.1f};
  o->parallel.dp = 0;  // all ranks
  Flags f;
  if (const char* hosts = std::getenv("TESSERA_HOSTS")) f.hosts = hosts;
  AddModelFlags(&app, o);
  AddParallelFlags(&app, o, &f);
  AddCheckpointFlags(&app, o, &f);
  AddLaunchFlags(&app, o, &f);
  CLI11_PARSE(app, argc, argv);
  if (Status s = Resolve(app, f, o); !s.ok()) {
    std::fprintf(stderr, "train_gpt: %s\n", s.ToString().c_str());
    return 1;
  }
  return -1;
}

}  // namespace tessera
