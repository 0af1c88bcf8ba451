// Parameter servers: both sides of a synchronous step (the placement is
// ps_placement.h's). World ranks [0, S) are servers, S + w is worker w.
//
// A step, per worker: a header (step n, or stop), then its gradient of
// every placed piece to the piece's server, in messages of at most
// `message floats` (tags name the message, so the backends' matching
// needs no ordering between them). Per server: each message's W
// contributions folded in worker order (((g0 + g1) + g2) ...) and divided
// by W, as the in-process all-reduce averages, so a job whose fold order
// matches data parallelism's gives its bits. Then one all-reduce over the
// world of each piece's and each worker-held parameter's squared gradient
// norm (each slot filled by one rank, so the sum is exact) and of the
// loss: every rank sums the slots in the model's parameter order, as
// Gpt::GradSquaredNorm does, and clips with the same factor. Each server
// runs AdamW on its pieces and sends the new values to every worker; the
// workers update their own parameters meanwhile (moments of those only).
//
// Failures: a worker that fails sends "abort" (its destructor path), and a
// server that gets it stops with an error naming that worker; every wait
// is bounded by the communicator's timeout.
#ifndef TESSERA_RUNTIME_MODEL_PARAM_SERVER_H_
#define TESSERA_RUNTIME_MODEL_PARAM_SERVER_H_

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/launch.h"
#include "runtime/cost/memory_use.h"
#include "runtime/model/gpt.h"
#include "runtime/model/ps_placement.h"
#include "runtime/train/optim.h"
#include "runtime/train/sliced_checkpoint.h"

namespace tessera {

// What both sides agree on: the placement, cut into messages.
//
// The embedding served by rows: with an untied head (GptConfig::untied)
// and wte on the servers, a worker needs only the rows of wte its batch
// uses. Each step's header then carries, per server, how many distinct
// token ids of the worker's rows fall in that server's rows; the ids
// follow and the server answers with those rows; after backward the
// worker pushes those rows' gradients only. The server folds them in
// worker order into its whole piece (zero elsewhere: the dense fold's
// numbers) and runs the same dense AdamW over every row, whose moments
// decay each step whether a row was used or not. Nothing of wte is
// pulled back: the next step asks for its own rows. Between steps a
// worker gives the table's pages back.
class PsProtocol {
 public:
  // `config`: the model's (its head and width say whether and how rows
  // are served).
  PsProtocol(PsPlacement placement, int workers, const GptConfig& config);
  const PsPlacement& placement() const { return placement_; }
  int servers() const { return placement_.servers(); }
  int workers() const { return workers_; }
  struct Message {
    size_t piece;
    int64_t offset, count;  // in the flat parameter vector
    int server;
    bool rows = false;  // of the embedding served by rows: never sent whole
  };
  // The parameter served by rows (an index into the model's parameters,
  // -1: none) and its row's floats.
  int64_t served() const { return served_; }
  int64_t row_floats() const { return row_floats_; }
  const std::vector<Message>& messages() const { return messages_; }
  int64_t largest_message() const { return largest_; }
  // The norm's slots: one per piece, then one per worker-held parameter,
  // then the loss; and the order they are summed in (the model's).
  int64_t slots() const { return static_cast<int64_t>(norm_order_.size()) + 1; }
  int64_t loss_slot() const { return slots() - 1; }
  int64_t LocalSlot(size_t k) const { return static_cast<int64_t>(placement_.pieces().size() + k); }
  double SumNorms(const std::vector<double>& slots) const;

  // Headers {command, step, payload bytes}; a save's payload (the
  // checkpoint's metadata) follows from the first worker.
  static constexpr int kHeaderWords = 3;
  static constexpr int kTagHeader = 1, kTagPayload = 2;
  static constexpr int kTagRowIds = 3, kTagRows = 4, kTagRowGrads = 5;
  // A replacement's handshake with a server (PsClient::Rejoin): a tag of
  // its own, so that a header sent on the same group is never taken for it.
  static constexpr int kTagJoin = 6;
  int PushTag(size_t message) const { return 7 + static_cast<int>(message); }
  int PullTag(size_t message) const { return 7 + static_cast<int>(messages_.size() + message); }
  enum Command : int64_t { kStep = 1, kStop = 2, kAbort = 3, kSave = 4, kPullAll = 5 };

 private:
  PsPlacement placement_;
  int workers_;
  std::vector<Message> messages_;
  int64_t largest_ = 0;
  std::vector<int64_t> norm_order_;
  int64_t served_ = -1, row_floats_ = 0;
};

// Where a peer is reached: a communicator and the peer's rank in it (the
// world's, or the group a replacement worker formed with a server).
struct PsLink {
  Communicator* comm;
  int rank;
};

// A server: its pieces' weights, gradients and Adam moments.
class PsServer {
 public:
  // `world`: every rank (servers first), which must outlive the server.
  static Result<std::unique_ptr<PsServer>> Create(const GptConfig& config, PsPlacement placement,
                                                  Communicator& world);
  // The same initial values as Gpt::Init(seed) gives the whole model.
  Status Init(uint64_t seed);
  // This server's pieces, their moments and the step from a checkpoint of
  // any layout (a parameter-server job's of any S, data parallelism's,
  // ...); an export (no moments) starts Adam afresh at step 0.
  Status Load(const CheckpointReader& reader);
  // What the workers ask next: a step, a save (with its metadata), or to
  // stop. Errors name the worker that aborted, stopped alone or disagreed.
  struct Asked {
    PsProtocol::Command command;
    int64_t step = 0;
    std::map<std::string, std::string> metadata;  // a save's
    int worker = -1;                              // an asynchronous step's
  };
  Result<Asked> Next();
  // Asynchronous mode (ParallelConfig::ps_staleness): Next then takes the
  // workers' headers one at a time in a fixed round (worker 0, 1, ...); a
  // step is one worker's (Asked::worker) and StepAsync applies it alone. A
  // save, export or stop is asked by every worker at the start of a round.
  //
  // `replaceable` (over Gloo): a worker whose link breaks (it died) is
  // dropped from the round instead of failing the job, the others going
  // on. A process started in its place (PsClient::Rejoin) is taken back
  // without stopping anyone: at a round boundary each server that finds
  // it waiting sends it its step and its pieces' weights and goes on; once
  // it has every server's, it says so (a key in the world's rendezvous
  // store) and pushes; each server takes it into its rounds at its next
  // boundary after that. So the servers' rounds it joins at may differ (by
  // at most what the staleness lets servers drift apart), and so may the
  // steps it pushes from: a server learns the difference from its first
  // push. A worker that stalls is waited for, and one that stops on an
  // error (kAbort) fails the job, as before. Workers stop when they are
  // done, each at its own round (a replacement pushed fewer); the server
  // stops with the last. With every worker dead and none finished, the
  // server waits for a replacement up to `replacement_timeout`. Saves and
  // exports still need every live worker at one round.
  void SetAsynchronous(bool replaceable = false,
                       std::chrono::milliseconds replacement_timeout = std::chrono::minutes(5)) {
    async_ = true;
    replaceable_ = replaceable;
    replacement_timeout_ = replacement_timeout;
    std::vector<float>().swap(scratch_);  // a push lands in the gradient buffer: no fold
  }
  // Workers dropped (their link broke) and admitted again so far.
  int dropped() const { return dropped_; }
  int admitted() const { return admitted_; }
  // After Next said kStep in asynchronous mode: that worker's (already
  // clipped) gradient received and AdamW applied to every piece (update
  // number step * W + worker + 1 of the run). After the round's last live
  // worker, the weights go to every live worker: each one's reply to its
  // push of that step, holding every live worker's push up to it.
  Status StepAsync(int worker, const AdamWConfig& adam);
  // After Next said kStep: the step's fold, norm, update and replies.
  Status Step(const AdamWConfig& adam, float max_norm);
  // After Next said kPullAll: every piece's weights to every worker (what
  // a step's pull sends, the rows of a served embedding too).
  Status SendAll();
  // After Next said kSave: this server's pieces of PsStrategy into
  // `writer` (the world's sliced save; its Commit is collective).
  Status WriteSliced(SlicedCheckpointWriter& writer, const Strategy& strategy) const;
  int64_t step() const { return step_; }
  double last_loss() const { return loss_; }
  // Its weights, gradients, moments and the fold's receive buffers.
  MemoryUse Memory() const;
  const PsProtocol& protocol() const { return protocol_; }
  // The pieces this server holds (indices into the placement's pieces()),
  // and one's weights (which 0), Adam exp_avg (1) or exp_avg_sq (2); empty
  // for a piece held elsewhere.
  const std::vector<size_t>& pieces() const { return pieces_; }
  std::span<float> PieceData(size_t piece, int which);
  std::span<const float> PieceData(size_t piece, int which) const {
    return const_cast<PsServer*>(this)->PieceData(piece, which);
  }
  // Bytes received and sent in the last step.
  int64_t bytes_per_step() const;

 private:
  PsServer(const GptConfig& config, PsProtocol protocol, Communicator& world)
      : config_(config), protocol_(std::move(protocol)), world_(world) {}
  GptConfig config_;
  PsProtocol protocol_;
  Communicator& world_;
  int server_ = 0;
  std::vector<size_t> messages_;   // this server's, in order
  std::vector<int64_t> local_;     // each message's first element in the buffers below
  std::vector<size_t> pieces_;     // this server's
  std::vector<int64_t> piece_at_;  // by piece index: its first element here (-1: elsewhere)
  std::vector<float> weights_, grads_, m_, v_, scratch_;
  std::vector<ParamInfo> params_;  // the whole model's
  // The embedding served by rows: this server's piece of it (-1: none),
  // each worker's ids this step, and the rows sent back.
  int64_t row_piece_ = -1;
  bool async_ = false;
  int turn_ = 0;  // asynchronous: the worker whose header comes next
  // Each worker's link: the world (rank S + w), or the group its
  // replacement formed with this server (rank 1).
  std::vector<PsLink> links_;
  PsLink WorldLink(int w) { return {&world_, protocol_.servers() + w}; }
  // Asynchronous and replaceable: each worker's state, the group its
  // replacement formed with this server (weights sent, not yet started or
  // started), the restart number a replacement is looked for above, and
  // the difference between the steps a replacement pushes and this
  // server's rounds (adopt: learnt from its next push).
  bool replaceable_ = false;
  std::chrono::milliseconds replacement_timeout_{0};
  bool worker_aborted_ = false;  // the last RecvHeader's worker sent kAbort
  enum : char { kLive = 0, kDead = 1, kFinished = 2 };
  std::vector<char> gone_;
  std::vector<std::unique_ptr<Communicator>> rejoined_;
  std::vector<int> incarnation_;
  std::vector<int64_t> offset_;
  std::vector<char> adopt_;
  int stepped_ = 0;  // workers whose push this round applied
  int dropped_ = 0, admitted_ = 0;
  // A broken link to worker w (Aborted, not the worker's own kAbort) in
  // replaceable mode: w dropped and true; false for any other error (the
  // job fails on it).
  bool Drop(int w, const Status& s);
  // The next live worker from `w` on (W when none is left this round).
  int NextLive(int w) const;
  // The end of a round when the turn passes the last live worker: the
  // step counted and its weights sent (every push of it applied).
  Status EndRound();
  // At a round boundary: replacements looked for, sent their weights,
  // taken into the rounds once started.
  Status Admit();
  // With no live worker and none finished: Admit until one is back, or
  // fail after replacement_timeout_.
  Status AwaitReplacement();
  // A replacement that started, into the rounds (its group as its link).
  void TakeIn(int w);
  // Every worker finished: each replacement sent its weights but not yet
  // started is claimed (PsRejoinStartKey): closed to it, or, where it
  // claimed first, taken in; true when one was (the server goes on).
  Result<bool> ClosePending();
  // This server's weights to worker w (its pieces' messages).
  Status SendTo(int w, std::vector<Request>* sends);
  // The headers of workers [from, W) received into `headers` (worker w's
  // at w * kHeaderWords) and checked: one command, the expected step.
  // `first`: the first live worker, whose header is the request.
  Result<Asked> Collect(std::vector<int64_t>& headers, int first, int from);
  // Worker w's header into `header` (kHeaderWords); an error names the
  // worker when it cannot be received or says the worker aborted.
  Status RecvHeader(int w, int64_t* header);
  std::string Where() const;  // "parameter server k at step n: "
  std::vector<int64_t> row_counts_;
  std::vector<std::vector<int64_t>> row_ids_;
  std::vector<std::vector<float>> row_out_;
  int64_t rows_peak_ = 0;  // floats of the row buffers at their largest
  Status ServeRows();
  Status FoldRows();
  int64_t step_ = 0;
  double loss_ = 0;
};

// The name of the group (ConnectGlooGroup) in which restart `restart` of
// worker `worker` rejoins server `server` (asynchronous, replaceable), and
// the store key that says its fate once it has every server's weights:
// "started", or "closed" by a server whose other workers had finished.
// Whoever adds 1 first to the key's ".claim" decides and sets it.
std::string PsRejoinGroup(int worker, int restart, int server);
std::string PsRejoinStartKey(int worker, int restart);

// Sends `command`'s header to servers [0, servers) of `world`; every send
// is tried, the first failure returned.
Status SendPsHeaders(Communicator& world, int servers, PsProtocol::Command command, int64_t step,
                     int64_t payload);
// A worker that fails before it has a PsClient (which says it when
// destroyed) tells the servers so: they stop instead of waiting for it.
inline Status AbortServers(Communicator& world, int servers) {
  return SendPsHeaders(world, servers, PsProtocol::kAbort, 0, 0);
}

// A worker's side: pushes the placed gradients, takes part in the norm,
// updates its own parameters, receives the placed ones.
class PsClient {
 public:
  // `world` as for PsServer; `model`: the worker's (the whole model, whose
  // parameter list the placement was made from).
  static Result<std::unique_ptr<PsClient>> Create(PsPlacement placement, Communicator& world,
                                                  const Gpt& model);
  const PsProtocol& protocol() const { return protocol_; }
  // Before forward: tells the servers a step begins and, with the
  // embedding served by rows, fetches the rows of wte the `n` tokens use
  // into the model's wte.
  Status Begin(Gpt& model, const int32_t* tokens, int64_t n);
  // After the step (and Init, Load): the served rows' pages given back,
  // their gradients zero again. A no-op unless rows are served.
  void ReleaseRows(Gpt& model);
  // Bytes of the served table a worker does not hold (its weights and
  // gradients, each), and the most it held of them at once (rows and
  // their transfer buffers), for Memory().
  int64_t served_bytes() const;
  int64_t rows_peak_bytes() const { return rows_peak_ * static_cast<int64_t>(sizeof(float)); }
  // After forward and backward, with the worker-held parameters' gradients
  // already averaged over the workers and `loss` the workers' mean: the
  // rest of the step. Returns the loss; `norm` gets the gradient norm.
  Result<float> Exchange(Gpt& model, double loss, const AdamWConfig& adam, float max_norm,
                         float* norm);
  // The moments of the worker-held parameters (zero at Init): exp_avg
  // (which 1) or exp_avg_sq (2), the placement's local() parameters one
  // after another.
  void ZeroMoments();
  const std::vector<float>& LocalMoments(int which) const { return which == 1 ? m_ : v_; }
  std::vector<float>& LocalMoments(int which) { return which == 1 ? m_ : v_; }
  int64_t moment_bytes() const;
  // Tells every server the job is done (or, `failed`, that this worker
  // stopped on an error). Once.
  Status Stop(bool failed);
  // The end of a worker that did not fail: asynchronous, its stop posted,
  // every push in flight answered (the newest reply installed in `model`),
  // the stop delivered; synchronous, Stop(false).
  Status Finish(Gpt& model);
  // Every served parameter's current weights into `model` (the rows of a
  // served embedding too: the whole table, for an export).
  Status PullAll(Gpt& model);
  // Asks the servers to join a save of step `step` (the first worker's
  // `metadata` goes to them); then every rank of the world writes.
  Status RequestSave(int64_t step, const std::map<std::string, std::string>& metadata);
  // This worker's pieces of PsStrategy (the parameters the workers keep
  // and their moments: what the plan gives it) into `writer`.
  Status WriteSliced(SlicedCheckpointWriter& writer, const Strategy& strategy,
                     const Gpt& model) const;
  // The moments of the worker-held parameters from a checkpoint of any
  // layout (the weights are LoadGpt's); zero for an export.
  Status LoadMoments(const CheckpointReader& reader, const Gpt& model);

  // Asynchronous mode with staleness K (ParallelConfig::ps_staleness):
  // every parameter on the servers, no rows served. Keeps K + 1 pushes in
  // flight, each with its gradient and its reply's buffer (2 (K + 1) P
  // floats). InvalidArgument when the placement leaves this worker
  // parameters of its own or serves rows.
  Status SetAsynchronous(int staleness, const Gpt& model);
  bool asynchronous() const { return staleness_ >= 0; }
  // Before step s's forward: the replies of this worker's pushes up to
  // s - 1 - K waited for, the newest installed as the model's weights.
  // A reply to push n comes when every worker's push n is applied, so
  // step s sees every update of steps <= s - 1 - K (stale synchronous
  // parallelism's bound) and a worker starts step s only when the slowest
  // has finished step s - 1 - K: at most K steps apart.
  Status AwaitStale(Gpt& model);
  // After step s's backward: the gradient clipped by its own norm (`norm`
  // gets it) and pushed with step s's header, the reply's receive posted;
  // the model's step becomes s.
  Status PushAsync(Gpt& model, float max_norm, float* norm);
  // Every push in flight answered, the newest reply installed (before a
  // save, an export or the stop).
  Status Drain(Gpt& model);
  int64_t async_bytes() const;
  // A process started in place of asynchronous worker `worker` of
  // `workers` that died (`restart`: its restart number, as the launcher
  // counts them), outside the world: registers with every server's group
  // at once (through the world's rendezvous: `table` is the world's rank
  // table) and receives from each, when it reaches a round boundary, its
  // step and its pieces' weights into `model`; then claims its start (the
  // start key): null when a server whose other workers had all finished
  // closed the job to it first. The model's step becomes the largest of
  // the servers' steps (joined_at() has each). Then AwaitStale,
  // PushAsync, Drain and Finish as any asynchronous worker (over Gloo
  // only).
  static Result<std::unique_ptr<PsClient>> Rejoin(PsPlacement placement, int workers,
                                                  const RankTable& table, int worker, int restart,
                                                  Gpt& model, int staleness,
                                                  const CommOptions& options);
  // A replacement's: the round each server sent its weights at.
  const std::vector<int64_t>& joined_at() const { return joined_at_; }
  ~PsClient();

 private:
  PsClient(PsProtocol protocol, Communicator* world)
      : protocol_(std::move(protocol)), world_(world) {
    if (world != nullptr) {
      for (int s = 0; s < protocol_.servers(); ++s) servers_.push_back({world, s});
    }
  }
  PsProtocol protocol_;
  Communicator* world_;  // null for a replacement (Rejoin)
  // Each server's link: the world (rank s), or a replacement's group with
  // it (rank 0).
  std::vector<PsLink> servers_;
  std::vector<std::unique_ptr<Communicator>> groups_;  // a replacement's, by server
  std::vector<int64_t> joined_at_;
  int worker_ = 0;
  struct Local {
    int64_t offset, count;  // in the flat parameter vector
    int64_t at;             // in m_ and v_
    bool decay;
  };
  std::vector<Local> local_;  // the worker-held parameters, in order
  std::vector<float> m_, v_;
  // The embedding served by rows: this step's distinct ids per server, and
  // the rows received (then their gradients sent) per server.
  std::vector<std::vector<int64_t>> ids_;
  std::vector<std::vector<float>> rows_;
  int64_t served_offset_ = 0, served_numel_ = 0;
  int64_t rows_peak_ = 0;
  bool stopped_ = false;
  // Asynchronous mode: push s in slot s % (K + 1); pushes oldest_ ..
  // newest_ in flight.
  struct Slot {
    std::array<int64_t, PsProtocol::kHeaderWords> header{};
    std::vector<float> grads, weights;
    std::vector<Request> sends, recvs;  // (after the buffers: destroyed first)
  };
  int staleness_ = -1;
  std::vector<Slot> slots_;
  int64_t oldest_ = 1, newest_ = 0;
  Status Await(Gpt& model, int64_t upto);
  // Every served parameter's weights from its server (or from server
  // `server` alone: its pieces) into `model`.
  Status ReceiveWeights(Gpt& model, int server = -1);
  Status SendHeaders(PsProtocol::Command command, int64_t step, int64_t payload);
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_PARAM_SERVER_H_
