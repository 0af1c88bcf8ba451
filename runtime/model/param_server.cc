#include "runtime/model/param_server.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <thread>

#include "core/pages.h"
#include "core/trace.h"
#include "runtime/comm/comm_util.h"
#include "runtime/comm/gloo.h"
#include "runtime/model/gpt_checkpoint.h"

namespace tessera {
namespace {

std::string WorkerName(int w, int servers) {
  return "worker " + std::to_string(w) + " (rank " + std::to_string(servers + w) + ")";
}

// Waits for every send and then every receive (timed as `what`: the
// wait for the servers' answer); the first error.
Status WaitSentAndReceived(std::vector<Request>& sends, std::vector<Request>& recvs,
                           const char* what) {
  Status sent = WaitAll(sends);
  Status received;
  {
    TraceSpan span("ps", what);
    received = WaitAll(recvs);
  }
  return sent.ok() ? received : sent;
}

}  // namespace

PsProtocol::PsProtocol(PsPlacement placement, int workers, const GptConfig& config)
    : placement_(std::move(placement)), workers_(workers) {
  const std::vector<PsPiece>& pieces = placement_.pieces();
  if (config.untied) {  // wte on the servers is served by rows
    for (const PsPiece& p : pieces) {
      if (p.name == "wte") served_ = static_cast<int64_t>(p.param);
    }
    row_floats_ = config.embed;
  }
  // Each message at most PsMessageFloats: the server's fold buffers hold
  // one per worker whatever a piece's size, and tags stay below 32767.
  const int64_t size = PsMessageFloats(placement_);
  for (size_t i = 0; i < pieces.size(); ++i) {
    for (int64_t at = 0; at < pieces[i].count; at += size) {
      const int64_t n = std::min(size, pieces[i].count - at);
      messages_.push_back({i, pieces[i].offset + at, n, pieces[i].server,
                           static_cast<int64_t>(pieces[i].param) == served_});
      largest_ = std::max(largest_, n);
    }
  }
  // The norm's order: the model's parameters, each by its pieces or its
  // worker-held slot.
  size_t piece = 0, local = 0;
  const std::vector<size_t>& locals = placement_.local();
  while (piece < pieces.size() || local < locals.size()) {
    if (local == locals.size() || (piece < pieces.size() && pieces[piece].param < locals[local])) {
      norm_order_.push_back(static_cast<int64_t>(piece++));
    } else {
      norm_order_.push_back(LocalSlot(local++));
    }
  }
}

double PsProtocol::SumNorms(const std::vector<double>& slots) const {
  double sum = 0;
  for (int64_t s : norm_order_) sum += slots[s];
  return sum;
}

Result<std::unique_ptr<PsServer>> PsServer::Create(const GptConfig& config, PsPlacement placement,
                                                   Communicator& world) {
  const int servers = placement.servers();
  if (world.rank() >= servers) return InternalError("PsServer::Create on a worker rank");
  const int workers = world.size() - servers;
  if (workers < 1) {
    return InvalidArgumentError("--ps-servers " + std::to_string(servers) + " of " +
                                std::to_string(world.size()) + " ranks leaves no worker");
  }
  std::unique_ptr<PsServer> s(
      new PsServer(config, PsProtocol(std::move(placement), workers, config), world));
  s->server_ = world.rank();
  int64_t at = 0;
  const auto& messages = s->protocol_.messages();
  s->piece_at_.assign(s->protocol_.placement().pieces().size(), -1);
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].server != s->server_) continue;
    const size_t piece = messages[i].piece;
    if (s->piece_at_[piece] < 0) {  // a piece's messages are consecutive
      s->piece_at_[piece] = at;
      s->pieces_.push_back(piece);
    }
    s->messages_.push_back(i);
    s->local_.push_back(at);
    at += messages[i].count;
  }
  ASSIGN_OR_RETURN(s->params_, Gpt::Params(config));
  for (size_t piece : s->pieces_) {
    if (static_cast<int64_t>(s->protocol_.placement().pieces()[piece].param) ==
        s->protocol_.served()) {
      s->row_piece_ = static_cast<int64_t>(piece);
    }
  }
  for (int w = 0; w < workers; ++w) s->links_.push_back(s->WorldLink(w));
  s->gone_.assign(workers, 0);
  s->rejoined_.resize(workers);
  s->incarnation_.assign(workers, 0);
  s->offset_.assign(workers, 0);
  s->adopt_.assign(workers, 0);
  s->weights_.assign(at, 0.0f);
  s->grads_.assign(at, 0.0f);
  s->m_.assign(at, 0.0f);
  s->v_.assign(at, 0.0f);
  s->scratch_.assign(static_cast<size_t>(workers - 1) * s->protocol_.largest_message(), 0.0f);
  return s;
}

Status PsServer::Init(uint64_t seed) {
  // Each piece's part of its parameter's initialisation: the numbers every
  // worker's Gpt::Init gives it, without the whole model made here.
  for (size_t i : pieces_) {
    const PsPiece& piece = protocol_.placement().pieces()[i];
    const ParamInfo& p = params_[piece.param];
    Gpt::InitialValues(config_, seed, p, piece.offset - p.offset, PieceData(i, 0));
  }
  std::fill(m_.begin(), m_.end(), 0.0f);
  std::fill(v_.begin(), v_.end(), 0.0f);
  step_ = 0;
  return Status::Ok();
}

std::string PsServer::Where() const {
  return "parameter server " + std::to_string(server_) + " at step " + std::to_string(step_) + ": ";
}

Status PsServer::RecvHeader(int w, int64_t* header) {
  const int S = protocol_.servers();
  worker_aborted_ = false;
  const PsLink& link = links_[w];
  Status s = link.comm->Recv(header, PsProtocol::kHeaderWords, DType::kI64, link.rank,
                             PsProtocol::kTagHeader);
  if (!s.ok()) {
    return Status(s.code(), "parameter server " + std::to_string(server_) + ": waiting for " +
                                WorkerName(w, S) + ": " + s.message());
  }
  if (header[0] == PsProtocol::kAbort) {
    worker_aborted_ = true;
    return AbortedError(Where() + WorkerName(w, S) + " stopped on an error");
  }
  return Status::Ok();
}

Result<PsServer::Asked> PsServer::Next() {
  const int W = protocol_.workers();
  std::vector<int64_t> headers(static_cast<size_t>(W) * PsProtocol::kHeaderWords);
  if (!async_) return Collect(headers, 0, 0);
  // Asynchronous: this turn's worker alone; a step is its own.
  const int S = protocol_.servers();
  for (;;) {
    const int w = NextLive(turn_);
    if (w == W) {  // the round's last live worker dropped or stopped
      RETURN_IF_ERROR(EndRound());
      if (NextLive(0) == W) RETURN_IF_ERROR(AwaitReplacement());
      if (NextLive(0) == W) {  // all finished: unless a replacement started meanwhile
        ASSIGN_OR_RETURN(const bool taken, ClosePending());
        if (!taken) return Asked{PsProtocol::kStop, step_, {}};
      }
      continue;
    }
    turn_ = w;
    int64_t* h = &headers[static_cast<size_t>(w) * PsProtocol::kHeaderWords];
    const Status got = RecvHeader(w, h);
    if (!got.ok()) {
      if (!Drop(w, got)) return got;
      turn_ = w + 1;
      continue;
    }
    if (h[0] == PsProtocol::kStep) {
      // A replacement numbers its steps from the round it chose: its first
      // push here says by how much that differs from this server's.
      if (adopt_[w]) offset_[w] = h[1] - (step_ + 1);
      adopt_[w] = 0;
      if (h[1] != step_ + 1 + offset_[w]) {
        return InvalidArgumentError(Where() + WorkerName(w, S) + " pushes step " +
                                    std::to_string(h[1]) + ", expected " +
                                    std::to_string(step_ + 1 + offset_[w]));
      }
      return Asked{PsProtocol::kStep, step_ + 1, {}, w};
    }
    if (replaceable_ && h[0] == PsProtocol::kStop) {
      // Workers finish at rounds of their own here (a replacement pushed
      // fewer): the others go on; the job ends with the last.
      gone_[w] = kFinished;
      turn_ = w + 1;
      continue;
    }
    if (w != NextLive(0)) {
      return AbortedError(Where() + WorkerName(w, S) + " asks for command " + std::to_string(h[0]) +
                          " while worker " + std::to_string(NextLive(0)) +
                          " stepped (a worker stopped while others go on?)");
    }
    return Collect(headers, w, w + 1);  // a save, export or stop: every worker's
  }
}

Status PsServer::AwaitReplacement() {
  if (std::count(gone_.begin(), gone_.end(), kFinished) > 0) return Status::Ok();
  const auto deadline = std::chrono::steady_clock::now() + replacement_timeout_;
  while (NextLive(0) == protocol_.workers()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      return AbortedError(Where() + "every worker is gone, and none was replaced within " +
                          FormatDuration(replacement_timeout_));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    RETURN_IF_ERROR(Admit());
  }
  return Status::Ok();
}

int PsServer::NextLive(int w) const {
  const int W = protocol_.workers();
  while (w < W && gone_[w]) ++w;
  return w;
}

bool PsServer::Drop(int w, const Status& s) {
  if (!replaceable_ || s.code() != StatusCode::kAborted || worker_aborted_) return false;
  gone_[w] = kDead;
  ++dropped_;
  rejoined_[w].reset();
  links_[w] = WorldLink(w);
  return true;
}

Status PsServer::EndRound() {
  turn_ = 0;
  if (stepped_ > 0) {
    // A round done: its weights (every live worker's push of step n in)
    // are every worker's reply to its push n.
    stepped_ = 0;
    ++step_;
    RETURN_IF_ERROR(SendAll());
  }
  return Admit();
}

std::string PsRejoinGroup(int worker, int restart, int server) {
  return "ps.worker" + std::to_string(worker) + ".restart" + std::to_string(restart) + ".server" +
         std::to_string(server);
}

std::string PsRejoinStartKey(int worker, int restart) {
  return "ps.worker" + std::to_string(worker) + ".restart" + std::to_string(restart) + ".start";
}

namespace {

// Replacement `restart` of worker `worker` claimed as `mine` ("started"
// by the replacement, "closed" by a server stopping): whoever adds 1 to
// the start key's ".claim" first sets it, and every party reads it.
// True when the replacement starts.
Result<bool> ClaimStart(Communicator& comm, int worker, int restart, const char* mine,
                        std::chrono::milliseconds timeout) {
  const std::string start = PsRejoinStartKey(worker, restart);
  ASSIGN_OR_RETURN(const int64_t claim, AddGlooKey(comm, start + ".claim", 1));
  if (claim == 1) RETURN_IF_ERROR(SetGlooKey(comm, start, mine));
  ASSIGN_OR_RETURN(const std::string fate, GetGlooKey(comm, start, timeout));
  return fate == "started";
}

}  // namespace

Status PsServer::Admit() {
  const int W = protocol_.workers();
  for (int w = 0; w < W; ++w) {
    if (gone_[w] != kDead) continue;
    // Its replacement: the newest of the next few restarts waiting (one
    // that died after registering left its key behind, one that died
    // before left a gap). A newer one also replaces one that was sent its
    // weights but never started.
    constexpr int kRestartsLooked = 8;
    int found = -1;
    for (int k = incarnation_[w] + 1; k <= incarnation_[w] + kRestartsLooked; ++k) {
      ASSIGN_OR_RETURN(bool waiting,
                       GlooGroupMemberWaiting(world_, PsRejoinGroup(w, k, server_), 1));
      if (waiting) found = k;
    }
    if (found >= 0) {
      rejoined_[w].reset();
      incarnation_[w] = found;
      // (It is waiting: a few seconds are plenty, unless it died since.)
      Result<std::unique_ptr<Communicator>> group = ConnectGlooGroup(
          world_, PsRejoinGroup(w, found, server_), 0, 2, std::chrono::seconds(10));
      if (!group.ok()) continue;  // it died meanwhile: the next restart is looked for
      // This server's round and its weights, then on without waiting: the
      // replacement starts pushing when every server has sent it theirs
      // (the start key), each server taking it into its rounds at its next
      // boundary after that.
      links_[w] = {group->get(), 1};
      const int64_t mine = step_;
      Status s = (*group)->Send(&mine, 1, DType::kI64, 1, PsProtocol::kTagJoin);
      std::vector<Request> sends;
      if (s.ok()) s = SendTo(w, &sends);
      const Status sent = WaitAll(sends);
      links_[w] = WorldLink(w);
      if (!s.ok() || !sent.ok()) continue;  // it died again
      rejoined_[w] = std::move(*group);
    }
    if (!rejoined_[w]) continue;
    // Started (its claim won and it said so): into the rounds from here.
    const std::string start = PsRejoinStartKey(w, incarnation_[w]);
    ASSIGN_OR_RETURN(const bool decided, HasGlooKey(world_, start));
    if (!decided) continue;
    ASSIGN_OR_RETURN(const std::string fate, GetGlooKey(world_, start, replacement_timeout_));
    if (fate == "started") TakeIn(w);
  }
  return Status::Ok();
}

void PsServer::TakeIn(int w) {
  links_[w] = {rejoined_[w].get(), 1};
  gone_[w] = kLive;
  adopt_[w] = 1;
  ++admitted_;
}

Result<bool> PsServer::ClosePending() {
  bool taken = false;
  for (int w = 0; w < protocol_.workers(); ++w) {
    if (gone_[w] != kDead || !rejoined_[w]) continue;
    // The first to claim decides, for the replacement and every server:
    // it starts (and every server takes it in) or the job is closed to it.
    ASSIGN_OR_RETURN(const bool started,
                     ClaimStart(world_, w, incarnation_[w], "closed", replacement_timeout_));
    if (started) {
      TakeIn(w);
      taken = true;
    } else {
      rejoined_[w].reset();
    }
  }
  return taken;
}

Status PsServer::SendTo(int w, std::vector<Request>* sends) {
  const auto& messages = protocol_.messages();
  const PsLink& link = links_[w];
  for (size_t k = 0; k < messages_.size(); ++k) {
    ASSIGN_OR_RETURN(Request r,
                     link.comm->ISend(weights_.data() + local_[k], messages[messages_[k]].count,
                                      DType::kF32, link.rank, protocol_.PullTag(messages_[k])));
    sends->push_back(std::move(r));
  }
  return Status::Ok();
}

Result<PsServer::Asked> PsServer::Collect(std::vector<int64_t>& headers, int first, int from) {
  const int S = protocol_.servers(), W = protocol_.workers();
  constexpr int kWords = PsProtocol::kHeaderWords;
  // Every (live) worker's header: all the same command for step n + 1 (a
  // save: for step n), or all stop.
  for (int w = from; w < W; ++w) {
    if (gone_[w]) continue;
    const Status got = RecvHeader(w, &headers[kWords * w]);
    if (!got.ok() && !Drop(w, got)) return got;
  }
  const std::string where = Where();
  Asked request{
      static_cast<PsProtocol::Command>(headers[kWords * first]), headers[kWords * first + 1], {}};
  row_counts_.assign(W, 0);
  if (request.command == PsProtocol::kStep) {
    for (int w = 0; w < W; ++w) row_counts_[w] = headers[kWords * w + 2];
  }
  for (int w = 0; w < W; ++w) {
    if (gone_[w]) continue;
    const int64_t cmd = headers[kWords * w], step = headers[kWords * w + 1];
    if (cmd != request.command) {
      return AbortedError(where + WorkerName(w, S) + " asks for command " + std::to_string(cmd) +
                          ", worker " + std::to_string(first) + " for " +
                          std::to_string(request.command) +
                          " (a worker stopped while others go on?)");
    }
    const int64_t expected = (cmd == PsProtocol::kStep ? step_ + 1 : step_) + offset_[w];
    if (cmd != PsProtocol::kStop && step != expected) {
      return InvalidArgumentError(where + WorkerName(w, S) + " asks for step " +
                                  std::to_string(step) +
                                  " (the workers and servers resumed from different checkpoints?)");
    }
  }
  if (request.command == PsProtocol::kSave && first == 0 && headers[2] > 0) {
    std::string payload(static_cast<size_t>(headers[2]), '\0');
    RETURN_IF_ERROR(links_[0].comm->Recv(payload.data(), headers[2], DType::kU8, links_[0].rank,
                                         PsProtocol::kTagPayload));
    // "key\0value\0" pairs.
    for (size_t at = 0; at < payload.size();) {
      const size_t k = payload.find('\0', at), v = payload.find('\0', k + 1);
      if (k == std::string::npos || v == std::string::npos) {
        return DataLossError(where + "a malformed save request from worker 0");
      }
      request.metadata[payload.substr(at, k - at)] = payload.substr(k + 1, v - k - 1);
      at = v + 1;
    }
  }
  return request;
}

Status PsServer::Step(const AdamWConfig& adam, float max_norm) {
  const int S = protocol_.servers(), W = protocol_.workers();
  const auto& messages = protocol_.messages();
  std::vector<double> slots(protocol_.slots(), 0.0);
  {
    RETURN_IF_ERROR(ServeRows());
    TraceSpan span("ps", "fold the workers' gradients");
    const float inv = static_cast<float>(W);
    for (size_t k = 0; k < messages_.size(); ++k) {
      const PsProtocol::Message& msg = messages[messages_[k]];
      if (msg.rows) continue;  // FoldRows
      float* acc = grads_.data() + local_[k];
      std::vector<Request> requests;
      ASSIGN_OR_RETURN(Request first, world_.IRecv(acc, msg.count, DType::kF32, S,
                                                   protocol_.PushTag(messages_[k])));
      requests.push_back(std::move(first));
      for (int w = 1; w < W; ++w) {
        float* in = scratch_.data() + static_cast<int64_t>(w - 1) * protocol_.largest_message();
        ASSIGN_OR_RETURN(Request r, world_.IRecv(in, msg.count, DType::kF32, S + w,
                                                 protocol_.PushTag(messages_[k])));
        requests.push_back(std::move(r));
      }
      RETURN_IF_ERROR(WaitAll(requests));
      for (int w = 1; w < W; ++w) {
        const float* in =
            scratch_.data() + static_cast<int64_t>(w - 1) * protocol_.largest_message();
        for (int64_t j = 0; j < msg.count; ++j) acc[j] = acc[j] + in[j];
      }
      if (W > 1) {
        for (int64_t j = 0; j < msg.count; ++j) acc[j] = acc[j] / inv;
      }
    }
    RETURN_IF_ERROR(FoldRows());
  }
  // Each piece's squared norm in one sum over it (its messages lie end to
  // end): a whole parameter's is then GradSquaredNorm's, bit for bit.
  for (size_t i : pieces_) {
    const std::span<const float> g{grads_.data() + piece_at_[i],
                                   static_cast<size_t>(protocol_.placement().pieces()[i].count)};
    slots[i] = SquaredNorm(g.data(), static_cast<int64_t>(g.size()));
  }
  RETURN_IF_ERROR(
      world_.AllReduce(slots.data(), slots.data(), protocol_.slots(), DType::kF64, ReduceOp::kSum));
  loss_ = slots[protocol_.loss_slot()];
  const double total = std::sqrt(protocol_.SumNorms(slots));
  const float clip = max_norm > 0 ? ClipFactor(total, max_norm) : 1.0f;
  ++step_;
  std::vector<Request> sends;
  {
    TraceSpan span("ps", "AdamW on the served pieces");
    for (size_t k = 0; k < messages_.size(); ++k) {
      const PsProtocol::Message& msg = messages[messages_[k]];
      const int64_t at = local_[k];
      if (clip != 1.0f) Scale(grads_.data() + at, msg.count, clip);
      AdamWUpdate(weights_.data() + at, grads_.data() + at, m_.data() + at, v_.data() + at,
                  msg.count, step_, adam, protocol_.placement().pieces()[msg.piece].decay);
      for (int w = 0; w < W && !msg.rows; ++w) {
        ASSIGN_OR_RETURN(Request r, world_.ISend(weights_.data() + at, msg.count, DType::kF32,
                                                 S + w, protocol_.PullTag(messages_[k])));
        sends.push_back(std::move(r));
      }
    }
  }
  return WaitAll(sends);
}

Status PsServer::StepAsync(int worker, const AdamWConfig& adam) {
  const int W = protocol_.workers();
  const auto& messages = protocol_.messages();
  std::vector<Request> requests;
  const PsLink& link = links_[worker];
  Status received;
  for (size_t k = 0; k < messages_.size() && received.ok(); ++k) {
    Result<Request> r = link.comm->IRecv(grads_.data() + local_[k], messages[messages_[k]].count,
                                         DType::kF32, link.rank, protocol_.PushTag(messages_[k]));
    received = r.status();
    if (r.ok()) requests.push_back(std::move(*r));
  }
  const Status waited = WaitAll(requests);
  if (received.ok()) received = waited;
  requests.clear();
  turn_ = worker + 1;
  if (!received.ok()) {
    // A worker that died mid-push: its update is not applied.
    if (!Drop(worker, received)) return received;
    return NextLive(turn_) == W ? EndRound() : Status::Ok();
  }
  // Update step_ * W + worker + 1: every push one AdamW step (a dropped
  // worker's numbers left out).
  const int64_t update = step_ * W + worker + 1;
  {
    TraceSpan span("ps", "AdamW on the served pieces (one worker's push)");
    for (size_t k = 0; k < messages_.size(); ++k) {
      const PsProtocol::Message& msg = messages[messages_[k]];
      const int64_t at = local_[k];
      AdamWUpdate(weights_.data() + at, grads_.data() + at, m_.data() + at, v_.data() + at,
                  msg.count, update, adam, protocol_.placement().pieces()[msg.piece].decay);
    }
  }
  ++stepped_;
  return NextLive(turn_) == W ? EndRound() : Status::Ok();
}

std::span<float> PsServer::PieceData(size_t piece, int which) {
  if (piece >= piece_at_.size() || piece_at_[piece] < 0) return {};
  std::vector<float>& v = which == 0 ? weights_ : which == 1 ? m_ : v_;
  return {v.data() + piece_at_[piece],
          static_cast<size_t>(protocol_.placement().pieces()[piece].count)};
}

Status PsServer::ServeRows() {
  if (row_piece_ < 0) return Status::Ok();
  TraceSpan span("ps", "serve the embedding's rows");
  const int S = protocol_.servers(), W = protocol_.workers();
  const PsPiece& piece = protocol_.placement().pieces()[row_piece_];
  const int64_t C = protocol_.row_floats(), rows = piece.row_end - piece.row_begin;
  const float* table = weights_.data() + piece_at_[row_piece_];
  row_ids_.resize(W);
  row_out_.resize(W);
  std::vector<Request> sends;
  int64_t held = 0;
  for (int w = 0; w < W; ++w) {
    const int64_t n = row_counts_[w];
    if (n < 0 || n > rows) {
      return DataLossError("parameter server " + std::to_string(server_) + ": " + WorkerName(w, S) +
                           " asks for " + std::to_string(n) + " of its " + std::to_string(rows) +
                           " rows of " + piece.name);
    }
    row_ids_[w].resize(n);
    row_out_[w].resize(n * C);
    held += n * C;
    if (n == 0) continue;
    RETURN_IF_ERROR(world_.Recv(row_ids_[w].data(), n, DType::kI64, S + w, PsProtocol::kTagRowIds));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = row_ids_[w][i] - piece.row_begin;
      if (row < 0 || row >= rows) {
        return DataLossError("parameter server " + std::to_string(server_) + ": " +
                             WorkerName(w, S) + " asks for row " + std::to_string(row_ids_[w][i]) +
                             " of " + piece.name + ", not one of its rows [" +
                             std::to_string(piece.row_begin) + ", " +
                             std::to_string(piece.row_end) + ")");
      }
      std::copy_n(table + row * C, C, row_out_[w].data() + i * C);
    }
    ASSIGN_OR_RETURN(Request r, world_.ISend(row_out_[w].data(), n * C, DType::kF32, S + w,
                                             PsProtocol::kTagRows));
    sends.push_back(std::move(r));
  }
  rows_peak_ = std::max(rows_peak_, held);
  return WaitAll(sends);
}

Status PsServer::FoldRows() {
  if (row_piece_ < 0) return Status::Ok();
  // The dense fold's numbers: each worker's rows added in worker order to
  // zero (a row no worker used stays zero), then the mean.
  const int S = protocol_.servers(), W = protocol_.workers();
  const PsPiece& piece = protocol_.placement().pieces()[row_piece_];
  const int64_t C = protocol_.row_floats();
  float* acc = grads_.data() + piece_at_[row_piece_];
  std::fill(acc, acc + piece.count, 0.0f);
  for (int w = 0; w < W; ++w) {
    const int64_t n = row_counts_[w];
    if (n == 0) continue;
    std::vector<float>& in = row_out_[w];  // its rows went out: the buffer is free
    RETURN_IF_ERROR(world_.Recv(in.data(), n * C, DType::kF32, S + w, PsProtocol::kTagRowGrads));
    for (int64_t i = 0; i < n; ++i) {
      float* row = acc + (row_ids_[w][i] - piece.row_begin) * C;
      const float* g = in.data() + i * C;
      for (int64_t j = 0; j < C; ++j) row[j] = row[j] + g[j];
    }
  }
  if (W > 1) {
    const float inv = static_cast<float>(W);
    for (int64_t j = 0; j < piece.count; ++j) acc[j] = acc[j] / inv;
  }
  return Status::Ok();
}

Status PsServer::SendAll() {
  const int W = protocol_.workers();
  std::vector<std::vector<Request>> sends(W);
  std::vector<Status> posted(W);
  for (int w = 0; w < W; ++w) {
    if (!gone_[w]) posted[w] = SendTo(w, &sends[w]);
  }
  for (int w = 0; w < W; ++w) {
    const Status sent = WaitAll(sends[w]);
    const Status s = posted[w].ok() ? sent : posted[w];
    if (!s.ok() && !Drop(w, s)) return s;
  }
  return Status::Ok();
}

MemoryUse PsServer::Memory() const {
  auto bytes = [](const std::vector<float>& v) {
    return static_cast<int64_t>(v.capacity() * sizeof(float));
  };
  MemoryUse m;
  m.parameters = bytes(weights_);
  m.gradients = bytes(grads_);
  m.optimizer = bytes(m_) + bytes(v_);
  m.communication = bytes(scratch_) + rows_peak_ * static_cast<int64_t>(sizeof(float));
  return m;
}

int64_t PsServer::bytes_per_step() const {
  // In: each worker's gradients; out: the new values to each worker; a
  // served embedding's rows as the last step asked for them (ids in, rows
  // out, their gradients in).
  const auto& messages = protocol_.messages();
  int64_t dense = 0;
  for (size_t k : messages_) {
    if (!messages[k].rows) dense += messages[k].count;
  }
  int64_t rows = 0;
  for (int64_t n : row_counts_) rows += n * (8 + 8 * protocol_.row_floats());
  return 2 * static_cast<int64_t>(protocol_.workers()) * dense * 4 + rows;
}

Result<std::unique_ptr<PsClient>> PsClient::Create(PsPlacement placement, Communicator& world,
                                                   const Gpt& model) {
  const std::vector<ParamInfo>& params = model.params();
  const int servers = placement.servers();
  if (world.rank() < servers) return InternalError("PsClient::Create on a server rank");
  const int workers = world.size() - servers;
  std::unique_ptr<PsClient> c(
      new PsClient(PsProtocol(std::move(placement), workers, model.config()), &world));
  if (c->protocol_.served() >= 0) {
    const ParamInfo& p = params[c->protocol_.served()];
    c->served_offset_ = p.offset;
    c->served_numel_ = p.numel;
  }
  c->ids_.resize(servers);
  c->rows_.resize(servers);
  c->worker_ = world.rank() - servers;
  int64_t at = 0;
  for (size_t i : c->protocol_.placement().local()) {
    const ParamInfo& p = params[i];
    c->local_.push_back({p.offset, p.numel, at, p.decay});
    at += p.numel;
  }
  c->m_.assign(at, 0.0f);
  c->v_.assign(at, 0.0f);
  return c;
}

void PsClient::ZeroMoments() {
  std::fill(m_.begin(), m_.end(), 0.0f);
  std::fill(v_.begin(), v_.end(), 0.0f);
}

int64_t PsClient::moment_bytes() const {
  return static_cast<int64_t>((m_.capacity() + v_.capacity()) * sizeof(float));
}

Result<float> PsClient::Exchange(Gpt& model, double loss, const AdamWConfig& adam, float max_norm,
                                 float* norm) {
  const int S = protocol_.servers();
  const auto& messages = protocol_.messages();
  const int64_t step = model.step() + 1;
  std::vector<Request> sends, recvs;
  float* grads = model.grads().data();
  float* weights = model.weights().data();
  {
    TraceSpan span("ps", "push gradients");
    const int64_t C = protocol_.row_floats();
    for (int s = 0; s < S; ++s) {  // the served rows' gradients, in Begin's order
      const std::vector<int64_t>& ids = ids_[s];
      if (ids.empty()) continue;
      std::vector<float>& out = rows_[s];
      for (size_t i = 0; i < ids.size(); ++i) {
        std::copy_n(grads + served_offset_ + ids[i] * C, C, out.data() + i * C);
      }
      ASSIGN_OR_RETURN(Request r, world_->ISend(out.data(), static_cast<int64_t>(ids.size()) * C,
                                                DType::kF32, s, PsProtocol::kTagRowGrads));
      sends.push_back(std::move(r));
    }
    for (size_t i = 0; i < messages.size(); ++i) {
      const PsProtocol::Message& msg = messages[i];
      if (msg.rows) continue;
      ASSIGN_OR_RETURN(Request r, world_->ISend(grads + msg.offset, msg.count, DType::kF32,
                                                msg.server, protocol_.PushTag(i)));
      sends.push_back(std::move(r));
    }
  }
  // The norm's slots: this worker's own parameters (the same on every
  // worker: the first one says them) and the loss.
  std::vector<double> slots(protocol_.slots(), 0.0);
  if (worker_ == 0) {
    for (size_t k = 0; k < local_.size(); ++k) {
      slots[protocol_.LocalSlot(k)] = SquaredNorm(grads + local_[k].offset, local_[k].count);
    }
    slots[protocol_.loss_slot()] = loss;
  }
  Status reduced =
      world_->AllReduce(slots.data(), slots.data(), protocol_.slots(), DType::kF64, ReduceOp::kSum);
  if (!reduced.ok()) {
    (void)WaitAll(sends);
    return reduced;
  }
  const double total = std::sqrt(protocol_.SumNorms(slots));
  if (norm != nullptr) *norm = static_cast<float>(total);
  const float clip = max_norm > 0 ? ClipFactor(total, max_norm) : 1.0f;
  for (size_t i = 0; i < messages.size(); ++i) {
    const PsProtocol::Message& msg = messages[i];
    if (msg.rows) continue;  // the next step asks for its own rows
    Result<Request> r = world_->IRecv(weights + msg.offset, msg.count, DType::kF32, msg.server,
                                      protocol_.PullTag(i));
    if (!r.ok()) {
      (void)WaitAll(sends);
      (void)WaitAll(recvs);
      return r.status();
    }
    recvs.push_back(std::move(*r));
  }
  {
    TraceSpan span("optimizer", "AdamW (the workers' own parameters)");
    for (const Local& p : local_) {
      if (clip != 1.0f) Scale(grads + p.offset, p.count, clip);
      AdamWUpdate(weights + p.offset, grads + p.offset, m_.data() + p.at, v_.data() + p.at, p.count,
                  step, adam, p.decay);
    }
  }
  RETURN_IF_ERROR(WaitSentAndReceived(sends, recvs, "pull weights"));
  model.set_step(step);
  ReleaseRows(model);
  return static_cast<float>(slots[protocol_.loss_slot()]);
}

Status PsClient::Begin(Gpt& model, const int32_t* tokens, int64_t n) {
  const int S = protocol_.servers();
  for (std::vector<int64_t>& ids : ids_) ids.clear();
  if (protocol_.served() >= 0) {
    // This step's distinct ids, each to the server of its rows.
    std::vector<int64_t> all(tokens, tokens + n);
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    for (const PsPiece& piece : protocol_.placement().pieces()) {
      if (static_cast<int64_t>(piece.param) != protocol_.served()) continue;
      const auto lo = std::lower_bound(all.begin(), all.end(), piece.row_begin);
      const auto hi = std::lower_bound(all.begin(), all.end(), piece.row_end);
      ids_[piece.server].assign(lo, hi);
    }
  }
  const int64_t step = model.step() + 1;
  const int64_t C = protocol_.row_floats();
  // (Declared before the requests that read them: destroyed after.)
  std::vector<std::array<int64_t, PsProtocol::kHeaderWords>> headers(S);
  std::vector<Request> sends, recvs;
  int64_t held = 0;
  for (int s = 0; s < S; ++s) {
    const int64_t count = static_cast<int64_t>(ids_[s].size());
    headers[s] = {PsProtocol::kStep, step, count};
    ASSIGN_OR_RETURN(Request h, world_->ISend(headers[s].data(), PsProtocol::kHeaderWords,
                                              DType::kI64, s, PsProtocol::kTagHeader));
    sends.push_back(std::move(h));
    if (count == 0) continue;
    rows_[s].resize(count * C);
    held += count * C;
    ASSIGN_OR_RETURN(Request ids,
                     world_->ISend(ids_[s].data(), count, DType::kI64, s, PsProtocol::kTagRowIds));
    sends.push_back(std::move(ids));
    ASSIGN_OR_RETURN(Request rows, world_->IRecv(rows_[s].data(), count * C, DType::kF32, s,
                                                 PsProtocol::kTagRows));
    recvs.push_back(std::move(rows));
  }
  // Rows in the table (touched pages only) and the buffers they came in.
  rows_peak_ = std::max(rows_peak_, 2 * held);
  RETURN_IF_ERROR(WaitSentAndReceived(sends, recvs, "pull the embedding's rows"));
  float* table = model.weights().data() + served_offset_;
  for (int s = 0; s < S; ++s) {
    for (size_t i = 0; i < ids_[s].size(); ++i) {
      std::copy_n(rows_[s].data() + i * C, C, table + ids_[s][i] * C);
    }
  }
  return Status::Ok();
}

void PsClient::ReleaseRows(Gpt& model) {
  if (protocol_.served() < 0) return;
  const int64_t C = protocol_.row_floats();
  float* grads = model.grads().data() + served_offset_;
  // The rows' gradients zeroed (the pages at the table's ends may stay),
  // then every whole page of the table and its gradients given back.
  for (const std::vector<int64_t>& ids : ids_) {
    for (int64_t id : ids) std::fill_n(grads + id * C, C, 0.0f);
  }
  const int64_t bytes = served_numel_ * static_cast<int64_t>(sizeof(float));
  (void)ReturnPages(model.weights().data() + served_offset_, bytes);
  (void)ReturnPages(grads, bytes);
}

int64_t PsClient::served_bytes() const {
  return served_numel_ * static_cast<int64_t>(sizeof(float));
}

Status PsClient::PullAll(Gpt& model) {
  RETURN_IF_ERROR(SendHeaders(PsProtocol::kPullAll, model.step(), 0));
  return ReceiveWeights(model);
}

Status PsClient::ReceiveWeights(Gpt& model, int server) {
  const auto& messages = protocol_.messages();
  std::vector<Request> recvs;
  for (size_t i = 0; i < messages.size(); ++i) {
    const PsProtocol::Message& msg = messages[i];
    if (server >= 0 && msg.server != server) continue;
    const PsLink& link = servers_[msg.server];
    ASSIGN_OR_RETURN(Request r, link.comm->IRecv(model.weights().data() + msg.offset, msg.count,
                                                 DType::kF32, link.rank, protocol_.PullTag(i)));
    recvs.push_back(std::move(r));
  }
  return WaitAll(recvs);
}

namespace {

// `header` (kHeaderWords, alive until `sends` complete) posted to every
// server of `servers` at once; the first failure to post returned, every
// post tried.
Status PostHeaders(std::span<const PsLink> servers, const int64_t* header,
                   std::vector<Request>* sends) {
  Status first;
  for (const PsLink& link : servers) {
    if (link.comm == nullptr) continue;  // a replacement that never reached that server
    Result<Request> r = link.comm->ISend(header, PsProtocol::kHeaderWords, DType::kI64, link.rank,
                                         PsProtocol::kTagHeader);
    if (r.ok()) {
      sends->push_back(std::move(*r));
    } else if (first.ok()) {
      first = r.status();
    }
  }
  return first;
}

// `command`'s header to every server of `servers`, posted to all at once
// (one after another, a worker's stop could wait on a server that first
// waits for another worker, who waits on this worker's next server: with
// replaced workers the servers' rounds differ); every send is tried, the
// first failure returned.
Status SendHeadersTo(std::span<const PsLink> servers, PsProtocol::Command command, int64_t step,
                     int64_t payload) {
  const int64_t header[PsProtocol::kHeaderWords] = {command, step, payload};
  std::vector<Request> sends;
  const Status posted = PostHeaders(servers, header, &sends);
  const Status sent = WaitAll(sends);
  return posted.ok() ? sent : posted;
}

}  // namespace

Status SendPsHeaders(Communicator& world, int servers, PsProtocol::Command command, int64_t step,
                     int64_t payload) {
  std::vector<PsLink> links;
  for (int s = 0; s < servers; ++s) links.push_back({&world, s});
  return SendHeadersTo(links, command, step, payload);
}

Status PsClient::SendHeaders(PsProtocol::Command command, int64_t step, int64_t payload) {
  return SendHeadersTo(servers_, command, step, payload);
}

Status PsClient::Stop(bool failed) {
  if (stopped_) return Status::Ok();
  stopped_ = true;
  return SendHeaders(failed ? PsProtocol::kAbort : PsProtocol::kStop, 0, 0);
}

Status PsClient::Finish(Gpt& model) {
  if (!asynchronous()) return Stop(/*failed=*/false);
  if (stopped_) return Status::Ok();
  stopped_ = true;
  // The stop goes out before the last replies are awaited: a server whose
  // rounds run behind another's (replaced workers join each at its own
  // round) may need it to end the round that answers another worker,
  // whose own stop the other server needs before it answers this one.
  // Each server reads it after this worker's last push (one tag, in order).
  std::array<int64_t, PsProtocol::kHeaderWords> header = {PsProtocol::kStop, 0, 0};
  std::vector<Request> sends;
  const Status posted = PostHeaders(servers_, header.data(), &sends);
  const Status drained = Await(model, newest_);
  const Status sent = WaitAll(sends);
  return !posted.ok() ? posted : !drained.ok() ? drained : sent;
}

Status PsClient::RequestSave(int64_t step, const std::map<std::string, std::string>& metadata) {
  std::string payload;
  if (worker_ == 0) {
    for (const auto& [k, v] : metadata) payload += k + '\0' + v + '\0';
  }
  RETURN_IF_ERROR(SendHeaders(PsProtocol::kSave, step, static_cast<int64_t>(payload.size())));
  for (int s = 0; s < protocol_.servers() && !payload.empty(); ++s) {
    RETURN_IF_ERROR(servers_[s].comm->Send(payload.data(), static_cast<int64_t>(payload.size()),
                                           DType::kU8, servers_[s].rank, PsProtocol::kTagPayload));
  }
  return Status::Ok();
}

namespace {

// Tensor `name` of a PsStrategy: its parameter (index in `params`) and
// which of the weights (0), exp_avg (1) or exp_avg_sq (2).
Result<std::pair<size_t, int>> PsTensor(const std::vector<ParamInfo>& params,
                                        const std::string& name) {
  std::string param = name;
  int which = 0;
  if (param.rfind("optimizer.", 0) == 0) {
    const bool sq = param.size() > 11 && param.compare(param.size() - 11, 11, ".exp_avg_sq") == 0;
    const size_t tail = sq ? 11 : 8;
    param = param.substr(10, param.size() - 10 - tail);
    which = sq ? 2 : 1;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].name == param) return std::pair<size_t, int>{i, which};
  }
  return InternalError("a parameter-server checkpoint's tensor '" + name +
                       "' is no parameter of the model");
}

}  // namespace

Status PsClient::WriteSliced(SlicedCheckpointWriter& writer, const Strategy& strategy,
                             const Gpt& model) const {
  for (const PieceToWrite& piece : writer.Pieces()) {
    const TensorStrategy& t = strategy.tensors()[piece.tensor];
    ASSIGN_OR_RETURN(const auto found, PsTensor(model.params(), t.name));
    const auto [param, which] = found;
    const ParamInfo& p = model.params()[param];
    const float* data = model.weights().data() + p.offset;
    if (which > 0) {
      auto it = std::find_if(local_.begin(), local_.end(),
                             [&](const Local& l) { return l.offset == p.offset; });
      if (it == local_.end()) return InternalError("a worker asked to write " + t.name);
      data = (which == 1 ? m_ : v_).data() + it->at;
    }
    RETURN_IF_ERROR(writer.WritePiece(piece.tensor, piece.box, data));
  }
  return Status::Ok();
}

Status PsClient::LoadMoments(const CheckpointReader& reader, const Gpt& model) {
  ZeroMoments();
  if (!HasOptimizerState(reader)) return Status::Ok();
  const std::vector<size_t>& locals = protocol_.placement().local();
  for (size_t k = 0; k < locals.size(); ++k) {
    const ParamInfo& p = model.params()[locals[k]];
    for (int which = 1; which <= 2; ++which) {
      const std::string name = "optimizer." + p.name + (which == 1 ? ".exp_avg" : ".exp_avg_sq");
      RETURN_IF_ERROR(
          ReadGptRegion(reader, name, p, p.box, (which == 1 ? m_ : v_).data() + local_[k].at));
    }
  }
  return Status::Ok();
}

Status PsServer::WriteSliced(SlicedCheckpointWriter& writer, const Strategy& strategy) const {
  for (const PieceToWrite& piece : writer.Pieces()) {
    const TensorStrategy& t = strategy.tensors()[piece.tensor];
    ASSIGN_OR_RETURN(const auto found, PsTensor(params_, t.name));
    const auto [param, which] = found;
    // The piece of this server that the planned box is.
    const std::vector<PsPiece>& pieces = protocol_.placement().pieces();
    size_t mine = pieces.size();
    for (size_t i : pieces_) {
      if (pieces[i].param == param && pieces[i].row_begin == piece.box[0].begin &&
          pieces[i].row_end == piece.box[0].end) {
        mine = i;
      }
    }
    if (mine == pieces.size()) {
      return InternalError("parameter server " + std::to_string(server_) +
                           " asked to write a piece of " + t.name + " it does not hold");
    }
    RETURN_IF_ERROR(writer.WritePiece(piece.tensor, piece.box, PieceData(mine, which).data()));
  }
  return Status::Ok();
}

Status PsServer::Load(const CheckpointReader& reader) {
  const bool moments = HasOptimizerState(reader);
  const std::vector<PsPiece>& pieces = protocol_.placement().pieces();
  for (size_t i : pieces_) {
    const PsPiece& piece = pieces[i];
    const ParamInfo& p = params_[piece.param];
    Box region = p.box;
    region[0] = {piece.row_begin, piece.row_end};
    for (int which = 0; which <= 2; ++which) {
      std::span<float> out = PieceData(i, which);
      if (which > 0 && !moments) {
        std::fill(out.begin(), out.end(), 0.0f);
        continue;
      }
      const std::string name =
          which == 0 ? p.name : "optimizer." + p.name + (which == 1 ? ".exp_avg" : ".exp_avg_sq");
      RETURN_IF_ERROR(ReadGptRegion(reader, name, p, region, out.data()));
    }
  }
  step_ = moments ? reader.meta().step : 0;
  return Status::Ok();
}

Status PsClient::SetAsynchronous(int staleness, const Gpt& model) {
  if (!protocol_.placement().local().empty()) {
    return InvalidArgumentError(
        "--ps-staleness: asynchronous workers keep no parameter of their own; '" +
        model.params()[protocol_.placement().local()[0]].name +
        "' is not on the servers (use --ps-params all)");
  }
  if (protocol_.served() >= 0) {
    return InvalidArgumentError(
        "--ps-staleness: the embedding served by rows (--untied-head) is synchronous only");
  }
  staleness_ = staleness;
  slots_.resize(static_cast<size_t>(staleness) + 1);
  const size_t n = model.weights().size();
  for (Slot& slot : slots_) {
    slot.grads.assign(n, 0.0f);
    slot.weights.assign(n, 0.0f);
  }
  return Status::Ok();
}

int64_t PsClient::async_bytes() const {
  int64_t floats = 0;
  for (const Slot& slot : slots_) floats += slot.grads.size() + slot.weights.size();
  return floats * static_cast<int64_t>(sizeof(float));
}

Status PsClient::Await(Gpt& model, int64_t upto) {
  const auto& messages = protocol_.messages();
  const size_t n = slots_.size();
  while (oldest_ <= newest_ && oldest_ <= upto) {
    Slot& slot = slots_[static_cast<size_t>(oldest_) % n];
    RETURN_IF_ERROR(WaitSentAndReceived(slot.sends, slot.recvs, "pull weights"));
    slot.sends.clear();
    slot.recvs.clear();
    if (oldest_ == upto || oldest_ == newest_) {  // the newest of those awaited
      for (const PsProtocol::Message& msg : messages) {
        std::copy_n(slot.weights.data() + msg.offset, msg.count,
                    model.weights().data() + msg.offset);
      }
    }
    ++oldest_;
  }
  return Status::Ok();
}

Status PsClient::AwaitStale(Gpt& model) {
  const int64_t step = model.step() + 1;
  return Await(model, step - 1 - staleness_);
}

Status PsClient::Drain(Gpt& model) { return Await(model, newest_); }

Status PsClient::PushAsync(Gpt& model, float max_norm, float* norm) {
  const int64_t step = model.step() + 1;
  Slot& slot = slots_[static_cast<size_t>(step) % slots_.size()];
  if (!slot.sends.empty() || !slot.recvs.empty()) {
    return InternalError("asynchronous push " + std::to_string(step) + ": its slot is in flight");
  }
  // This worker's gradient is one update: clipped by its own norm.
  const double total = std::sqrt(model.GradSquaredNorm());
  if (norm != nullptr) *norm = static_cast<float>(total);
  const float clip = max_norm > 0 ? ClipFactor(total, max_norm) : 1.0f;
  const std::vector<float>& grads = model.grads();
  if (clip == 1.0f) {
    std::copy(grads.begin(), grads.end(), slot.grads.begin());
  } else {
    for (size_t i = 0; i < grads.size(); ++i) slot.grads[i] = grads[i] * clip;
  }
  slot.header = {PsProtocol::kStep, step, 0};
  TraceSpan span("ps", "push gradients (asynchronous)");
  const auto& messages = protocol_.messages();
  Status posted;
  for (int s = 0; s < protocol_.servers() && posted.ok(); ++s) {
    Result<Request> h =
        servers_[s].comm->ISend(slot.header.data(), PsProtocol::kHeaderWords, DType::kI64,
                                servers_[s].rank, PsProtocol::kTagHeader);
    posted = h.status();
    if (h.ok()) slot.sends.push_back(std::move(*h));
  }
  for (size_t i = 0; i < messages.size() && posted.ok(); ++i) {
    const PsProtocol::Message& msg = messages[i];
    const PsLink& link = servers_[msg.server];
    Result<Request> r = link.comm->ISend(slot.grads.data() + msg.offset, msg.count, DType::kF32,
                                         link.rank, protocol_.PushTag(i));
    posted = r.status();
    if (r.ok()) slot.sends.push_back(std::move(*r));
    Result<Request> q = link.comm->IRecv(slot.weights.data() + msg.offset, msg.count, DType::kF32,
                                         link.rank, protocol_.PullTag(i));
    if (posted.ok()) posted = q.status();
    if (q.ok()) slot.recvs.push_back(std::move(*q));
  }
  if (oldest_ > newest_) oldest_ = step;
  newest_ = step;
  model.set_step(step);
  return posted;
}

Result<std::unique_ptr<PsClient>> PsClient::Rejoin(PsPlacement placement, int workers,
                                                   const RankTable& table, int worker, int restart,
                                                   Gpt& model, int staleness,
                                                   const CommOptions& options) {
  const int S = placement.servers();
  std::unique_ptr<PsClient> c(
      new PsClient(PsProtocol(std::move(placement), workers, model.config()), nullptr));
  c->worker_ = worker;
  RETURN_IF_ERROR(c->SetAsynchronous(staleness, model));
  // Registered with every server at once, each answering at its next
  // round boundary (one after another would let a server that answered
  // wait for this worker's push while the next one, its workers held back
  // by it, never reaches a boundary).
  c->servers_.resize(S);
  c->groups_.resize(S);
  c->joined_at_.assign(S, -1);
  std::vector<Status> joined(S);
  std::vector<std::thread> threads;
  for (int s = 0; s < S; ++s) {
    threads.emplace_back([&, s] {
      joined[s] = [&]() -> Status {
        ASSIGN_OR_RETURN(c->groups_[s],
                         JoinGlooGroup(table, PsRejoinGroup(worker, restart, s), 1, 2, options));
        c->servers_[s] = {c->groups_[s].get(), 0};
        RETURN_IF_ERROR(
            c->groups_[s]->Recv(&c->joined_at_[s], 1, DType::kI64, 0, PsProtocol::kTagJoin));
        return c->ReceiveWeights(model, s);
      }()
                               .Annotate("worker " + std::to_string(worker) + " rejoining server " +
                                         std::to_string(s));
    });
  }
  for (std::thread& t : threads) t.join();
  // No server takes it into its rounds before it starts: none would take
  // a stop (its destructor's) until then.
  c->stopped_ = true;
  for (const Status& st : joined) RETURN_IF_ERROR(st);
  // Start, unless a server that saw its other workers finish closed the
  // job to it first (the first claim decides for everyone).
  ASSIGN_OR_RETURN(const bool started,
                   ClaimStart(*c->groups_[0], worker, restart, "started", options.timeout));
  if (!started) return std::unique_ptr<PsClient>();
  c->stopped_ = false;
  model.set_step(*std::max_element(c->joined_at_.begin(), c->joined_at_.end()));
  return c;
}

PsClient::~PsClient() {
  (void)Stop(/*failed=*/true);
  // A worker that failed with pushes in flight: their receives are still
  // posted into the slots and a server may yet send into them, so the
  // buffers are left allocated (the job is ending on that error).
  if (oldest_ <= newest_) (void)new std::vector<Slot>(std::move(slots_));
}

}  // namespace tessera
