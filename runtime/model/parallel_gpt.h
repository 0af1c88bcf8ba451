// Training a GPT over a pp x dp x tp mesh of ranks: data parallelism with
// gradient buckets, ZeRO-1 (optimizer states sharded over dp), 1F1B
// pipeline stages and Megatron tensor parallelism, in any combination. Every
// rank runs the same program with its own Communicator (in-process threads
// or MPI processes, runtime/comm/launch.h).
//
// Data parallel: every rank is given the same global batch [B, T] and takes
// its rows [r B/dp, (r+1) B/dp). Gradients are averaged over dp in buckets
// of about `bucket_bytes` (one collective per bucket instead of one per
// tensor), so every rank applies the same update and the replicas stay
// bitwise identical. The loss is the mean over the global batch, as a
// single process computes it.
//
// ZeRO-1 (`zero = 1`): each rank keeps the Adam moments of its dp-th of
// every tensor (dimension 0 cut as torch.chunk cuts it: the layout's
// `opt_axes = [dp]`, exactly what a checkpoint records). Gradients are
// reduce-scattered per bucket instead of all-reduced, the norm for clipping
// is summed over the shards, each rank updates its own rows, and the new
// parameters are all-gathered.
//
// Pipeline parallel (pp > 1): the blocks are cut into pp consecutive
// stages (stage s holds layers [s L / pp, (s+1) L / pp)); the first stage
// also holds the embeddings, the last ln_f and the output projection with a
// copy of the tied wte, whose gradient is summed with the first stage's so
// both stay equal. Each dp rank's rows are cut into `micro_batches`
// micro-batches run in the 1F1B schedule (warm-up forwards, then one
// forward and one backward alternately, then the remaining backwards);
// activations go forward and their gradients back with tagged non-blocking
// sends. The loss, the gradient norm for clipping and the update equal the
// single-process step's: the loss gradient of each micro-batch is scaled by
// 1/micro_batches.
//
// Interleaved (virtual_stages V > 1, Megatron's virtual pipeline stages):
// the layers are cut into pp x V groups and stage s holds groups s,
// pp + s, ..., each a chunk run by its own operators over the stage's one
// Gpt (the embeddings stay on the first chunk of stage 0, ln_f and the
// tied wte's copy on the last chunk of stage pp - 1). Activations go round
// the ring of stages V times (interleaved 1F1B, runtime/parallel/
// pipeline.h); the bubble shrinks V-fold for more activations in flight.
// Every parameter's layout records the stage that holds it, so a
// checkpoint saved under one V loads under another, or another pp.
//
// Multi-copy (micro_batch_interleave N > 1): each micro-batch's rows run
// as N copies taking turns, one copy's tensor-parallel collectives in
// flight while the next copy computes (runtime/model/multi_copy.h).
//
// Context parallel (cp > 1): each rank of a replica holds its positions of
// every sequence (the zigzag chunks for ring attention, a contiguous chunk
// for Ulysses) through every operator; attention exchanges keys and values
// (ring) or heads (Ulysses) over the cp group. Each rank's loss is the mean
// over its positions, so averaging over dp x cp gives the global mean and
// its gradient: cp is data parallelism for everything but attention.
//
// Tensor parallel (tp > 1) and any other operator-level parallelism: the
// stage runs as OpGpt, operators with shard strategies (Megatron's without
// a strategy file, with sequence parallelism on request); each rank's Gpt
// holds its parameters cut as the strategy says. A parameter every tp rank
// holds gets the same gradient on each (or a partial one, summed over tp by
// OpGpt), so replicas stay equal. Under ZeRO-1 each tp slice is sharded
// over dp further, as the optimizer state's layout (split over tp, opt
// [dp]) says.
#ifndef TESSERA_RUNTIME_MODEL_PARALLEL_GPT_H_
#define TESSERA_RUNTIME_MODEL_PARALLEL_GPT_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/comm/mesh_comms.h"
#include "runtime/cost/memory_use.h"
#include "runtime/model/gpt.h"
#include "runtime/model/gpt_graph.h"
#include "runtime/model/op_gpt.h"
#include "runtime/model/param_server.h"
#include "runtime/model/ps_placement.h"
#include "runtime/model/stage_runner.h"
#include "runtime/parallel/pipeline.h"
#include "runtime/train/offload.h"
#include "runtime/train/sliced_checkpoint.h"
#include "transform/strategy.h"

namespace tessera {

struct ParallelConfig {
  int dp = 1, tp = 1, pp = 1;
  // Context parallelism (runtime/parallel/context_parallel.h): every
  // sequence cut over cp ranks, attention crossing them by `cp_algo`.
  // Parameters are replicated over cp and their gradients averaged over
  // dp x cp (ZeRO-1 shards over dp x cp).
  int cp = 1;
  CpAlgo cp_algo = CpAlgo::kRing;
  int zero = 0;           // 0: every dp rank holds the whole optimizer state; 1: ZeRO-1
  int micro_batches = 0;  // per step and dp rank under pp > 1 (0: pp)
  int64_t bucket_bytes = int64_t{25} << 20;
  // Chunks of layers per pipeline stage (interleaved 1F1B, Megatron's
  // virtual pipeline stages): chunk c of stage s holds layer group
  // c x pp + s of pp x virtual_stages equal groups.
  int virtual_stages = 1;
  // Multi-copy (multi_copy.h, MindSpore's MicroBatchInterleaved): each
  // micro-batch's rows cut into this many copies of whole sequences whose
  // tensor-parallel collectives overlap each other's compute. Needs tp > 1.
  int micro_batch_interleave = 1;
  // Layers per pipeline stage (empty: as even as possible); with
  // virtual_stages > 1, per layer group (pp x virtual_stages counts, in
  // the order the groups run).
  std::vector<int> stage_layers;
  // The operators' shard strategies (runtime/model/op_gpt.h). Without a
  // file, tp > 1 runs Megatron's strategy (OpGpt::Megatron), with
  // sequence parallelism when `sequence_parallel`.
  std::shared_ptr<const OpStrategyFile> op_strategy;
  bool sequence_parallel = false;
  // Activation recompute of every block: none, full or selective (the
  // strategy file's "recompute" entries override it per block).
  Recompute recompute = Recompute::kNone;
  // Optimizer-state offload (runtime/train/offload.h): this rank's Adam
  // moments (its ZeRO-1 shard under zero 1) in a file under offload_dir,
  // streamed through the update bucket by bucket: three buckets of
  // offload_bucket_bytes of each of m and v resident.
  bool offload_optimizer = false;
  // Parameter offload (with offload_optimizer): this rank's weights in a
  // file under offload_dir too, in memory a unit at a time (the stage's
  // parameters outside its blocks, then each block) while the next one is
  // read (OffloadedWeights). Not with virtual stages or multi-copy.
  bool offload_params = false;
  std::string offload_dir;
  int64_t offload_bucket_bytes = int64_t{4} << 20;
  // Parameter servers (runtime/model/param_server.h): with ps_servers S >
  // 0 the ranks given to ParallelGpt are the workers (dp of them), and the
  // parameters `ps_params` names ("all", or names and patterns) live on S
  // server ranks of the world (ConnectServers). Data parallelism only: tp,
  // pp, cp 1, zero 0, no offload.
  int ps_servers = 0;
  std::string ps_params = "all";
  // Asynchronous parameter servers with bounded staleness K (>= 0; -1:
  // synchronous). Each worker's push is its own AdamW update, clipped by
  // its own norm and applied in a fixed round of the workers; a worker
  // computes step s on the weights after every worker's push s - 1 - K,
  // so it runs at most K steps ahead of the slowest (K = 0: a step waits
  // for the previous one's round). Every parameter on the servers, no
  // served rows; deterministic (the round fixes the order).
  int ps_staleness = -1;
  // The mesh "pp=P,dp=D,tp=T", with cp: "pp=P,dp=D,cp=C,tp=T" (ranks
  // row-major: tp fastest, as Megatron's tp-cp-dp-pp).
  Result<Mesh> MakeMesh() const;
  Status Validate(int world_size) const;
  Status ValidateServers() const;
  // That `config`'s layers cut into the stages (and chunks) asked for;
  // errors say what would.
  Status ValidateLayers(const GptConfig& config) const;
};

class ParallelGpt {
 public:
  // Collective over `world` (its size must be dp * tp * pp), which must
  // outlive the result.
  static Result<std::unique_ptr<ParallelGpt>> Create(const GptConfig& config,
                                                     const ParallelConfig& parallel,
                                                     Communicator& world);

  const ParallelConfig& parallel() const { return parallel_; }
  // This rank's pipeline stage (its pp coordinate) and the layers it holds.
  int stage() const { return stage_; }
  int micro_batches() const { return micro_batches_; }
  // What stage `s` holds under `parallel` for a model of `config`, tp
  // slice tp_rank: its layers (per stage as `stage_layers` says, else as
  // even as possible), as one range or, with virtual stages, as its chunks.
  static GptStage StageOf(const GptConfig& config, const ParallelConfig& parallel, int s,
                          int tp_rank = 0);
  // Chunk c of stage s (virtual stage c x pp + s) as a stage of its own:
  // what its operators run. The stage itself when virtual_stages is 1.
  static GptStage ChunkOf(const GptConfig& config, const ParallelConfig& parallel, int s, int c,
                          int tp_rank = 0);
  // The layer groups [begin, end) of the virtual stages, in order.
  static std::vector<std::pair<int, int>> LayerGroups(const GptConfig& config,
                                                      const ParallelConfig& parallel);
  // What this rank holds, after a step: its peak (buffers are kept at
  // their largest for the next step).
  MemoryUse Memory() const;
  // Whether `parallel` runs each stage's Gpt whole, without operators
  // (tp = 1, no strategy file, no recompute, one chunk per stage).
  static bool RunsWhole(const ParallelConfig& parallel);
  // The operators' graph of stage `gs` (its tp rank's) as `parallel` makes
  // it, recompute set, whether or not the stage runs it (RunsWhole).
  static Result<GptGraph> StageGraph(const GptConfig& config, const ParallelConfig& parallel,
                                     const Mesh& mesh, const GptStage& gs);
  // The strategy file the operators run (the file, or the Megatron preset).
  static OpStrategyFile StrategyFileOf(const ParallelConfig& parallel);
  // Every stage's operators with their strategies and the redistributions
  // between them (OpGpt::Describe) for a global batch of B x T, and the
  // parameters' layouts; empty without operators.
  Result<std::string> DescribeOps(int B, int T) const;
  const MeshCommunicators& comms() const { return comms_; }
  // This rank's replica of its stage's parameters. Under
  // ZeRO-1 its adam_m/adam_v are empty between GatherOptimizerState calls;
  // the shards live here.
  Gpt& model() { return model_; }
  const Gpt& model() const { return model_; }
  int64_t step() const { return model_.step(); }

  // GPT-2 initialisation, the same on every rank (errors: the offload
  // file's).
  Status Init(uint64_t seed);

  // One training step on the global batch (the same tokens on every rank).
  // B must be a multiple of dp. Returns the global mean loss; `norm` (if
  // not null) receives the gradient norm before clipping.
  Result<float> Step(const int32_t* tokens, const int32_t* targets, int B, int T,
                     const AdamWConfig& adam, float max_norm, float* norm);
  // The same step from this replica's rows only (`tokens`, `targets`: its
  // [B / dp, T], rows [dp_rank B/dp, (dp_rank+1) B/dp) of the global batch
  // of B): for a dataset read per replica (dataset_strategy data_parallel).
  Result<float> StepRows(const int32_t* tokens, const int32_t* targets, int B, int T,
                         const AdamWConfig& adam, float max_norm, float* norm);
  // The same from this rank's share only: its [B / dp] rows, each holding
  // only its T / cp positions (sequence_split(T), in that order), for a
  // dataset read per rank (dataset_strategy sequence). StepRows when cp = 1.
  Result<float> StepLocal(const int32_t* tokens, const int32_t* targets, int B, int T,
                          const AdamWConfig& adam, float max_norm, float* norm);
  // Parameter servers (parallel().ps_servers > 0): collective over
  // `world`, whose ranks [0, S) serve (PsServer) and the rest are this
  // job's workers in order; it must outlive this object. Before Init.
  Status ConnectServers(Communicator& world);
  // Instead of ConnectServers, in a process started in place of
  // asynchronous worker `worker` of `workers` that died (replacement
  // `restart`): joins the servers through the world's rank table `table`
  // (PsClient::Rejoin; this object's ranks are the replacement's own, dp
  // 1) and takes their weights (every one is theirs) and step: instead of
  // Init too. False when the servers had finished (their other workers
  // done) and closed the job to it: nothing to train.
  Result<bool> RejoinServers(const RankTable& table, int workers, int worker, int restart,
                             const CommOptions& options);
  const PsClient* ps() const { return ps_.get(); }
  // Tells the servers this worker is done (`failed`: on an error). A no-op
  // without servers.
  Status StopServers(bool failed);
  // Asks the servers to join a save of this step (PsClient::RequestSave);
  // then every rank of the world writes its pieces (WriteSliced) to the
  // world's SlicedCheckpointWriter of strategy().
  // Asynchronous: every push in flight answered first.
  Status RequestServerSave(const std::map<std::string, std::string>& metadata);
  // This rank's replica (its dp coordinate): which rows of a batch it reads.
  int dp_rank() const { return dp_rank_; }
  // Its cp coordinate: which positions of each sequence it holds
  // (sequence_split()).
  int cp_rank() const { return cp_rank_; }
  // The positions of a sequence of T tokens this rank holds.
  SequenceSplit sequence_split(int T) const {
    return SequenceSplit::Of(parallel_.cp_algo, T, parallel_.cp, cp_rank_);
  }

  // Seconds this rank has spent in the collectives of Step (reductions,
  // the loss, the norm, ZeRO's gathers) and waiting for pipeline
  // neighbours, for the communication share.
  double comm_seconds() const;
  // Redistributions this rank's operators planned so far: each distinct
  // one (an edge's placements and shape) once, reused by every later call.
  int64_t plans_built() const;

  // The layout of every parameter and optimizer state on the mesh, named as
  // checkpoints name them ("wte", "optimizer.wte.exp_avg", ...). With
  // parameter servers (once connected), PsStrategy: the world's layouts.
  Result<Strategy> strategy() const;
  // The same without a job: the layouts `parallel` gives `config`'s
  // parameters and optimizer states (for a plan made on paper).
  static Result<Strategy> StrategyOf(const GptConfig& config, const ParallelConfig& parallel);

  // Collective. Under ZeRO-1, assembles the whole Adam moments into
  // model().adam_m/adam_v on every rank (for a merged save); a no-op
  // otherwise.
  Status GatherOptimizerState();
  // Collective, after GatherOptimizerState: the whole model (every stage's
  // and tp slice's parameters and moments, and the step) assembled into
  // `*full` on world rank 0, for a merged save; `full` is ignored on the
  // other ranks.
  Status GatherModel(Gpt* full);
  // For a sliced save (not collective): `pieces` of `strategy` (this
  // rank's, from the writer's plan) with where their bytes live in this
  // rank's model (parameters from its tp slice, moments from its ZeRO
  // shard), so nothing is gathered. They stay valid until the next Step.
  Result<std::vector<LocalPiece>> SlicedPieces(const Strategy& strategy,
                                               const std::vector<PieceToWrite>& pieces) const;
  // Writes SlicedPieces into `writer` (whose Commit is collective). With
  // the optimizer offloaded, from the offload tier within its memory: the
  // weights a unit at a time, the moments streamed from their file
  // (WritePieceFrom: a bounded buffer, hashed as it streams).
  Status WriteSliced(SlicedCheckpointWriter& writer, const Strategy& strategy);
  // With the optimizer offloaded: reads this rank's moments back into
  // memory (model().adam_m/adam_v, or the ZeRO shard) for a save or a
  // gather, until the next Step, and with the parameters offloaded, every
  // weight (a no-op otherwise). SlicedPieces and an export need it.
  Status MaterializeOptimizerState();
  // The offload files, when the optimizer (and the parameters) are
  // offloaded (else null).
  const OffloadedMoments* offloaded() const { return offload_.get(); }
  const OffloadedWeights* offloaded_weights() const { return offload_weights_.get(); }
  // Loads this rank's parameters, moments and step from `reader` (LoadGpt,
  // then ShardOptimizerState). With the optimizer offloaded, within the
  // offload tier's memory: each unit's weights while it is in memory, the
  // moments (this rank's ZeRO shard) read in row blocks of at most 16 MiB
  // straight into the offload file.
  Status Load(const CheckpointReader& reader);
  // After the model's moments were loaded or gathered: keeps this rank's
  // shard under ZeRO-1 and frees the rest (local, not collective).
  // Offloaded, the moments go to the offload file instead (errors name it),
  // and with the parameters offloaded, the loaded weights to theirs (loaded
  // right after Init or MaterializeOptimizerState, when no unit is in
  // flight).
  Status ShardOptimizerState();

 private:
  // Where a piece of a sliced save lives on this rank: its parameter,
  // which of the weights (0), exp_avg (1) or exp_avg_sq (2), its first
  // element (in the weights; in the moments, the model's or the ZeRO
  // shard's, which is the offload file's order) and count.
  struct PieceSource {
    const ParamInfo* param;
    int which;
    int64_t begin, count;
  };
  Result<PieceSource> Locate(const Strategy& strategy, const PieceToWrite& piece) const;
  // Where this rank's ZeRO shard of one parameter lies.
  struct Shard {
    const ParamInfo* param;
    int64_t begin = 0;                    // first element of this rank's shard in the parameter
    std::vector<int64_t> starts, counts;  // each dp rank's first element and count
    int64_t offset = 0;                   // of this rank's shard in shard_m_/shard_v_
  };
  struct Bucket {
    std::vector<size_t> params;   // indices into model_.params(), in order
    int64_t begin = 0, end = 0;   // the flat range they cover (contiguous)
    std::vector<int64_t> counts;  // ZeRO: elements per dp rank over the bucket
    int64_t max_count = 0;
  };

  ParallelGpt(Gpt model, ParallelConfig parallel, MeshCommunicators comms)
      : model_(std::move(model)), parallel_(parallel), comms_(std::move(comms)) {}
  // Stage s, tp slice t, cut as this model's parameters are.
  GptStage Stage(int s, int t) const;
  Status Build();
  // The layout of parameter `p` (of a stage `stage`; its optimizer state's
  // when `optimizer`) on the mesh: what strategy() records.
  static Layout LayoutOf(const ParallelConfig& parallel, const ParamInfo& p, int stage,
                         bool optimizer);
  // Forward and backward of this rank's rows [first row, + rows) in
  // micro-batches (1F1B over the stages); returns the sum of the
  // micro-batches' mean losses on the last stage, 0 elsewhere.
  Result<double> RunPipeline(const int32_t* tokens, const int32_t* targets, int rows, int T);
  Status ReduceTiedEmbedding();
  Status ReduceGradients();
  Result<double> ShardedSquaredNorm();
  Status ShardedUpdate(const AdamWConfig& adam, float clip);
  // The update with the moments streamed from the offload file.
  Status OffloadedUpdate(const AdamWConfig& adam, float clip);
  // Frees the moments MaterializeOptimizerState read back.
  void ReleaseOptimizerState();
  // This rank's moments in memory: its ZeRO shard's, or the model's.
  std::pair<std::vector<float>&, std::vector<float>&> Moments() {
    if (parallel_.zero == 1) return {shard_m_, shard_v_};
    return {model_.adam_m(), model_.adam_v()};
  }
  // Empties the vectors and returns their memory.
  static void Free(std::initializer_list<std::vector<float>*> vectors);
  // ZeRO-1: every rank's updated rows of the weights to every rank.
  Status GatherShardWeights();
  // The same unit after unit, with the parameters offloaded: each unit's
  // shards in rounds through the gather buffers while it is in memory.
  Status GatherUnitWeights();

  Gpt model_;
  // What runs the stage, one per chunk: its operators (ops_, when there
  // are) or the Gpt whole.
  std::vector<std::unique_ptr<StageRunner>> runners_;
  std::vector<OpGpt*> ops_;
  std::shared_ptr<const std::map<std::string, int>> tp_dims_;
  ParallelConfig parallel_;
  MeshCommunicators comms_;
  Communicator* dp_ = nullptr;
  // The ranks that average gradients and shard ZeRO: dp, or dp x cp.
  Communicator* data_ = nullptr;
  Communicator* cp_ = nullptr;
  Communicator* pp_ = nullptr;
  Communicator* tp_ = nullptr;
  Communicator* tp_pp_ = nullptr;
  int dp_rank_ = 0;
  int cp_rank_ = 0;
  int data_rank_ = 0;  // in data_
  int stage_ = 0;
  std::vector<int32_t> local_tokens_, local_targets_;  // Step's share under cp
  int micro_batches_ = 1;
  PipelineSchedule schedule_{1, 0, 1};  // this stage's, from Build
  // First and last stage ranks of the same dp and tp coordinates: they
  // sum the tied embedding's gradient (null elsewhere and when pp = 1).
  std::unique_ptr<Communicator> tied_;
  std::vector<float> recv_x_, recv_dy_;      // one micro-batch's [b,T,C]
  std::vector<std::vector<float>> send_dx_;  // DxSendBuffers(M x chunks), in turn

  std::vector<Bucket> buckets_;
  std::vector<Shard> shards_;  // ZeRO: one per parameter
  std::vector<float> shard_m_, shard_v_, send_, recv_;
  double comm_seconds_ = 0;
  std::unique_ptr<OffloadedMoments> offload_;
  // The offloaded moments' segments in the file's order: a parameter's, or
  // its ZeRO shard's (`at` in the file, `n` long, `weight` its first
  // element in the weights and gradients).
  struct OffloadSegment {
    int64_t at, n, weight;
    bool decay;
    int unit;  // of its weights
  };
  std::vector<OffloadSegment> offload_segments_;
  std::unique_ptr<OffloadedWeights> offload_weights_;
  // Parameter servers: where the parameters live, and the workers' side.
  std::unique_ptr<PsPlacement> ps_placement_;
  std::unique_ptr<PsClient> ps_;
  // FailedPrecondition naming `what` when ps_servers is set but
  // ConnectServers has not run.
  Status ServersConnected(const char* what) const;
  std::vector<std::vector<size_t>> unit_params_;  // each unit's parameters (indices)
  bool order_learned_ = false;                    // the units' order of a step, for prefetching
  bool materialized_ = false;                     // the offloaded moments are in memory too
  bool moments_zero_ = false;  // the offloaded moments are zero (not yet written)
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_PARALLEL_GPT_H_
