#include "runtime/comm/gloo.h"

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <vector>

#include "runtime/comm/comm_util.h"
#include "runtime/comm/kv_store.h"
#include "runtime/comm/reduce.h"
#include "runtime/comm/tcp.h"

namespace tessera {
namespace {

using std::chrono::milliseconds;

// Slots of our own messages (Gloo's collectives build theirs from small
// prefixes in the top byte).
constexpr uint64_t kP2pSlot = uint64_t{0xF0} << 56;
constexpr uint64_t kGatherSlot = uint64_t{0xF1} << 56;
constexpr uint64_t kScatterSlot = uint64_t{0xF2} << 56;
// A slot nothing is ever sent on: the sentinels' (see PairWatch).
constexpr uint64_t kSentinelSlot = uint64_t{0xF3} << 56;
// Allreduces up to this many bytes use Gloo's bcube algorithm, larger ones its ring.
constexpr size_t kBcubeBelow = size_t{256} << 10;

// Gloo's rendezvous store over our key-value store.
class KvGlooStore : public gloo::rendezvous::Store {
 public:
  KvGlooStore(std::shared_ptr<KvClient> kv, milliseconds timeout)
      : kv_(std::move(kv)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Throw(kv_->Set(key, std::string(data.begin(), data.end())));
  }
  std::vector<char> get(const std::string& key) override {
    Result<std::string> v = kv_->Get(key, timeout_);
    Throw(v.status());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const milliseconds& timeout) override {
    for (const std::string& k : keys) Throw(kv_->Get(k, timeout).status());
  }

 private:
  static void Throw(const Status& s) {
    if (!s.ok()) throw gloo::IoException(s.message());
  }
  std::shared_ptr<KvClient> kv_;
  milliseconds timeout_;
};

// A Gloo exception as an error of `where` (this rank, communicator, call):
// a timeout is DeadlineExceeded, anything else (a peer's connection
// closed or reset) Aborted.
Status FromGlooError(const std::string& where, const std::exception& e, milliseconds timeout) {
  const std::string m = e.what();
  if (m.find("imed out") != std::string::npos) {
    return DeadlineExceededError(where + ": timed out after " + FormatDuration(timeout) +
                                 " (a peer did not arrive): " + m);
  }
  return AbortedError(where + ": " + m + " (a peer left or failed)");
}

// The pairwise reduction as Gloo's reduce function.
gloo::AllreduceOptions::Func GlooReduceFn(DType dtype, ReduceOp op) {
  PairwiseReduceFn fn = PairwiseReduce(dtype, op);
  return [fn](void* c, const void* a, const void* b, size_t n) { fn(c, a, b, n); };
}

// Gloo's typed setters, by element size (the reduce function knows the dtype).
template <typename Opts>
void SetReduceOutput(Opts& opts, void* p, int64_t count, int64_t element_size) {
  switch (element_size) {
    case 1:
      opts.template setOutput<uint8_t>(static_cast<uint8_t*>(p), count);
      break;
    case 2:
      opts.template setOutput<uint16_t>(static_cast<uint16_t*>(p), count);
      break;
    case 4:
      opts.template setOutput<uint32_t>(static_cast<uint32_t*>(p), count);
      break;
    default:
      opts.template setOutput<uint64_t>(static_cast<uint64_t*>(p), count);
      break;
  }
}

// Gloo's TCP pair, when its peer's connection closes or resets, fails
// the receives queued on it, but not the message it is partway through
// reading, nor the unbound-buffer sends it has started or queued for
// writing (tcp::Pair::signalException fails only bound buffers among
// those): a wait on one would last the whole timeout, and a Gloo timeout
// fails every pair of the context. So each pair a wait uses
// gets a sentinel: a receive posted on a slot nothing is sent on, which
// stays queued until the pair fails and is then failed with it. The
// watch looks, every kPeriod while point-to-point waits are under way,
// whether their pairs' sentinels have failed (abortWaitRecv then
// waitRecv: the wait's predicate rethrows the pair's error before it
// honours the abort, so this answers without blocking), and ends those
// waits (UnboundBuffer::abortWait*), which then fail naming the peer.
// Gloo honours an abort before a completion it has already counted, so
// an ended wait asks again (GlooRequest::Await): a message that did
// arrive before its pair failed is then taken, one that did not is ended
// again at the watch's next look. Safe for the caller's buffer: a failed
// pair has closed its socket under its lock, so nothing more is read
// into it or written from it. One watch per world; its thread starts
// with the first wait and sleeps while no wait is under way.
struct Sentinel {
  std::unique_ptr<gloo::transport::UnboundBuffer> buf;
  bool failed = false;  // the pair had failed when it was posted

  bool PairFailed() {
    if (failed) return true;
    try {
      buf->abortWaitRecv();
      buf->waitRecv(nullptr, milliseconds(1));
    } catch (const std::exception&) {
      return true;
    }
    return false;
  }
};

class GlooRequest;

class PairWatch {
 public:
  static constexpr milliseconds kPeriod{50};

  ~PairWatch() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // Registers a wait for its duration.
  class Watching {
   public:
    Watching(PairWatch& watch, GlooRequest* req) : watch_(watch), req_(req) { watch_.Add(req_); }
    ~Watching() { watch_.Remove(req_); }
    Watching(const Watching&) = delete;
    Watching& operator=(const Watching&) = delete;

   private:
    PairWatch& watch_;
    GlooRequest* req_;
  };

 private:
  void Add(GlooRequest* req);  // may throw (the thread's start, memory)
  void Remove(GlooRequest* req) {
    std::lock_guard lock(mu_);
    waits_.erase(std::find(waits_.begin(), waits_.end(), req));
  }
  void Loop();

  std::mutex mu_;  // held while a wait's pair is asked and the wait ended
  std::condition_variable cv_;
  std::vector<GlooRequest*> waits_;
  bool stop_ = false;
  std::thread thread_;
};

// A point-to-point message: an 8-byte header with the byte count, then the
// bytes (one dummy byte when empty, so that every message has a data part
// and no posted receive is left waiting), both on the same slot (Gloo keeps
// their order). A receiver expecting more than was sent fails naming peer
// and tag instead of taking a short message. A message longer than the
// receive posted for it is refused by Gloo itself, which ends the process
// (GLOO_ENFORCE on its transport thread): Gloo has no truncation error.
class GlooRequest : public Request::Impl {
 public:
  GlooRequest(bool send, size_t bytes, milliseconds timeout, std::string what,
              std::shared_ptr<PairWatch> watch)
      : send_(send),
        header_(bytes),
        bytes_(bytes),
        timeout_(timeout),
        what_(std::move(what)),
        watch_(std::move(watch)) {}

  // Posts the header and the data (called once, right after construction).
  void Post(gloo::Context& ctx, void* buf, int peer, uint64_t slot,
            std::shared_ptr<Sentinel> sentinel) {
    peer_ = peer;
    sentinel_ = std::move(sentinel);
    head_ = ctx.createUnboundBuffer(&header_, sizeof(header_));
    data_ = bytes_ > 0 ? ctx.createUnboundBuffer(buf, bytes_) : ctx.createUnboundBuffer(&dummy_, 1);
    if (send_) {
      head_->send(peer, slot);
      data_->send(peer, slot);
    } else {
      head_->recv(peer, slot);
      data_->recv(peer, slot);
    }
  }

  Status Wait() override {
    std::optional<PairWatch::Watching> watching;
    try {
      watching.emplace(*watch_, this);
    } catch (const std::exception& e) {
      return InternalError(what_ + ": cannot watch the wait: " + e.what());
    }
    Status s = WaitBoth();
    if (s.code() == StatusCode::kAborted && peer_closed_) {
      return AbortedError(what_ + ": the connection to rank " + std::to_string(peer_) +
                          " closed with the message unfinished (the peer left or failed)");
    }
    return s;
  }

  // Whether the pair to the peer has failed (its connection closed or
  // reset). Called by the watch with the wait under way.
  bool PeerClosed() { return sentinel_->PairFailed(); }
  // Ends the waits on both parts (Wait then fails naming the peer).
  void AbortWait() {
    peer_closed_ = true;
    if (send_) {
      head_->abortWaitSend();
      data_->abortWaitSend();
    } else {
      head_->abortWaitRecv();
      data_->abortWaitRecv();
    }
  }

 private:
  // One part's wait; asked again (twice at most) when the watch ended it,
  // so that a completion Gloo had already counted is not lost to the abort.
  bool Await(gloo::transport::UnboundBuffer& part) {
    for (int ask = 0; ask < 3; ++ask) {
      if (send_ ? part.waitSend(timeout_) : part.waitRecv(timeout_)) return true;
      if (!peer_closed_) return false;
    }
    return false;
  }

  Status WaitBoth() {
    try {
      if (send_) {
        if (!Await(*head_) || !Await(*data_)) return AbortedError(what_ + ": aborted");
        return Status::Ok();
      }
      if (!Await(*head_)) return AbortedError(what_ + ": aborted");
      // The data part always comes (shorter than posted, when the counts
      // differ): take it, so that the pair stays in step.
      const bool got = Await(*data_);
      if (header_ != bytes_) {
        return InvalidArgumentError(what_ + ": the message has " + std::to_string(header_) +
                                    " bytes, " + std::to_string(bytes_) + " were expected");
      }
      if (!got) return AbortedError(what_ + ": aborted");
    } catch (const std::exception& e) {
      return FromGlooError(what_, e, timeout_);
    }
    return Status::Ok();
  }

  bool send_;
  uint64_t header_;  // sent, or received into
  size_t bytes_;
  char dummy_ = 0;  // the data part of an empty message
  milliseconds timeout_;
  std::string what_;
  std::shared_ptr<PairWatch> watch_;    // shared: a request may outlive
  std::shared_ptr<Sentinel> sentinel_;  // its communicator and world
  int peer_ = -1;
  std::atomic<bool> peer_closed_{false};
  std::unique_ptr<gloo::transport::UnboundBuffer> head_, data_;
};

void PairWatch::Add(GlooRequest* req) {
  std::lock_guard lock(mu_);
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  waits_.push_back(req);
  if (waits_.size() == 1) cv_.notify_one();
}

void PairWatch::Loop() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    if (waits_.empty()) cv_.wait(lock, [&] { return stop_ || !waits_.empty(); });
    cv_.wait_for(lock, kPeriod, [&] { return stop_; });
    for (GlooRequest* req : waits_) {
      if (req->PeerClosed()) req->AbortWait();
    }
  }
}

// What every communicator of one world shares.
struct GlooWorld {
  std::unique_ptr<KvServer> server;  // rank 0 only
  std::shared_ptr<KvClient> kv;
  std::unique_ptr<KvGlooStore> store;
  std::shared_ptr<gloo::transport::Device> device;
  CommOptions options;
  int world_rank = 0;
  // Of the world's point-to-point waits (shared with their requests).
  std::shared_ptr<PairWatch> watch = std::make_shared<PairWatch>();
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<GlooWorld> world, std::shared_ptr<gloo::rendezvous::Context> ctx,
                   std::string id)
      : world_(std::move(world)),
        ctx_(std::move(ctx)),
        id_(std::move(id)),
        sentinels_(ctx_->size) {}

  int rank() const override { return ctx_->rank; }
  int size() const override { return ctx_->size; }
  std::string_view backend() const override { return "gloo"; }

  Status Barrier() override {
    RETURN_IF_ERROR(Agree({CollectiveKind::kBarrier}));
    return Run("barrier", [&] {
      gloo::BarrierOptions opts(ctx_);
      opts.setTimeout(timeout());
      gloo::barrier(opts);
    });
  }

  Status Broadcast(void* buf, int64_t count, DType dtype, int root) override {
    const CollectiveArgs args{CollectiveKind::kBroadcast, count, dtype, ReduceOp::kSum, root};
    RETURN_IF_ERROR(CheckCount(args, name()));
    RETURN_IF_ERROR(CheckRoot(root));
    RETURN_IF_ERROR(Agree(args));
    if (count == 0 || size() == 1) return Status::Ok();
    return Run(DescribeArgs(args), [&] {
      gloo::BroadcastOptions opts(ctx_);
      opts.setOutput<uint8_t>(static_cast<uint8_t*>(buf), Bytes(count, dtype));
      opts.setRoot(root);
      opts.setTimeout(timeout());
      gloo::broadcast(opts);
    });
  }

  Status AllReduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    const CollectiveArgs args{CollectiveKind::kAllReduce, count, dtype, op};
    RETURN_IF_ERROR(CheckCount(args, name()));
    RETURN_IF_ERROR(CheckReduction(dtype, op));
    RETURN_IF_ERROR(Agree(args));
    return Reduce(send, recv, count, dtype, op, DescribeArgs(args));
  }

  Status AllGatherV(const void* send, int64_t count, void* recv, std::span<const int64_t> counts,
                    DType dtype) override {
    RETURN_IF_ERROR(CheckCounts("allgatherv", counts, size(), rank(), count));
    RETURN_IF_ERROR(Agree(VArgs(CollectiveKind::kAllGather, counts, dtype)));
    return GatherAll(send, count, recv, counts, dtype);
  }

  Status ReduceScatter(const void* send, void* recv, int64_t recv_count, DType dtype,
                       ReduceOp op) override {
    const CollectiveArgs args{CollectiveKind::kReduceScatter, recv_count, dtype, op};
    RETURN_IF_ERROR(CheckCount(args, name()));
    RETURN_IF_ERROR(CheckReduction(dtype, op));
    RETURN_IF_ERROR(Agree(args));
    if (recv_count == 0) return Status::Ok();
    const size_t block = Bytes(recv_count, dtype);
    if (size() == 1) {
      if (send != recv) std::memcpy(recv, send, block);
      return Status::Ok();
    }
    // Gloo 2022 has no untyped reduce-scatter. Every rank's block r comes
    // here in one alltoall and is folded in rank order (deterministic, as
    // in-process): (n-1)/n of the buffer moved, as a ring's reduce-scatter,
    // its n - 1 messages in flight at once (a ring's steps follow one
    // another). An allreduce keeping our block moves twice that and, on 2
    // ranks, takes 5.4 ms at 512 KiB where this takes 1.6-3.2 (comm_bench
    // gloo); measured on 2 and 4 ranks only.
    return FoldScatter(send, std::vector<int64_t>(size(), recv_count), recv, dtype, op,
                       DescribeArgs(args));
  }

  Status GatherV(const void* send, int64_t count, void* recv, std::span<const int64_t> counts,
                 DType dtype, int root) override {
    RETURN_IF_ERROR(CheckCounts("gatherv", counts, size(), rank(), count));
    RETURN_IF_ERROR(CheckRoot(root));
    RETURN_IF_ERROR(Agree(VArgs(CollectiveKind::kGather, counts, dtype, root)));
    if (rank() != root) {
      if (count == 0) return Status::Ok();
      return Wait(PostSend(const_cast<void*>(send), Bytes(count, dtype), root, kGatherSlot,
                           "gatherv to rank " + std::to_string(root)));
    }
    std::vector<Request> pending;
    char* at = static_cast<char*>(recv);
    for (int r = 0; r < size(); ++r) {
      const size_t bytes = Bytes(counts[r], dtype);
      if (r == root) {
        if (bytes > 0) std::memcpy(at, send, bytes);
      } else if (bytes > 0) {
        ASSIGN_OR_RETURN(Request q, PostRecv(at, bytes, r, kGatherSlot,
                                             "gatherv from rank " + std::to_string(r)));
        pending.push_back(std::move(q));
      }
      at += bytes;
    }
    return WaitAll(pending);
  }

  Status ScatterV(const void* send, std::span<const int64_t> counts, void* recv, int64_t count,
                  DType dtype, int root) override {
    RETURN_IF_ERROR(CheckCounts("scatterv", counts, size(), rank(), count));
    RETURN_IF_ERROR(CheckRoot(root));
    RETURN_IF_ERROR(Agree(VArgs(CollectiveKind::kScatter, counts, dtype, root)));
    if (rank() != root) {
      if (count == 0) return Status::Ok();
      return Wait(PostRecv(recv, Bytes(count, dtype), root, kScatterSlot,
                           "scatterv from rank " + std::to_string(root)));
    }
    std::vector<Request> pending;
    const char* at = static_cast<const char*>(send);
    for (int r = 0; r < size(); ++r) {
      const size_t bytes = Bytes(counts[r], dtype);
      if (r == root) {
        if (bytes > 0) std::memcpy(recv, at, bytes);
      } else if (bytes > 0) {
        ASSIGN_OR_RETURN(Request q, PostSend(const_cast<char*>(at), bytes, r, kScatterSlot,
                                             "scatterv to rank " + std::to_string(r)));
        pending.push_back(std::move(q));
      }
      at += bytes;
    }
    return WaitAll(pending);
  }

  Status AllToAllV(const void* send, std::span<const int64_t> send_counts, void* recv,
                   std::span<const int64_t> recv_counts, DType dtype) override {
    RETURN_IF_ERROR(CheckCounts("alltoallv send", send_counts, size(), -1, 0));
    RETURN_IF_ERROR(CheckCounts("alltoallv recv", recv_counts, size(), -1, 0));
    if (world_->options.check) {
      // Every rank's send and receive counts, so that every rank reaches the
      // same verdict (a rank that alone saw a mismatch would leave its
      // peers in the exchange).
      RETURN_IF_ERROR(Agree({CollectiveKind::kAllToAll, 0, dtype}));
      std::vector<int64_t> mine(send_counts.begin(), send_counts.end());
      mine.insert(mine.end(), recv_counts.begin(), recv_counts.end());
      std::vector<int64_t> all(2 * static_cast<size_t>(size()) * size());
      RETURN_IF_ERROR(GatherAll(mine.data(), 2 * size(), all.data(),
                                std::vector<int64_t>(size(), 2 * size()), DType::kI64));
      std::vector<std::vector<int64_t>> sends(size()), recvs(size());
      for (int r = 0; r < size(); ++r) {
        const int64_t* at = all.data() + 2 * static_cast<size_t>(size()) * r;
        sends[r].assign(at, at + size());
        recvs[r].assign(at + size(), at + 2 * size());
      }
      Status s = CheckAllToAllCounts(sends, recvs);
      if (!s.ok())
        return s.Annotate("rank " + std::to_string(rank()) + " on '" + name() + "': alltoallv");
    }
    const int64_t total = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
    return Exchange(send, send_counts, recv, recv_counts, dtype,
                    "alltoallv of " + std::to_string(total) + " " + std::string(DTypeName(dtype)));
  }

  Status Send(const void* buf, int64_t count, DType dtype, int peer, int tag) override {
    RETURN_IF_ERROR(CheckPeer(peer, tag));
    return Wait(PostSend(const_cast<void*>(buf), Bytes(count, dtype), peer, kP2pSlot + tag,
                         P2pWhat("send to", peer, tag)));
  }
  Status Recv(void* buf, int64_t count, DType dtype, int peer, int tag) override {
    RETURN_IF_ERROR(CheckPeer(peer, tag));
    return Wait(PostRecv(buf, Bytes(count, dtype), peer, kP2pSlot + tag,
                         P2pWhat("receive from", peer, tag)));
  }
  Result<Request> ISend(const void* buf, int64_t count, DType dtype, int peer, int tag) override {
    RETURN_IF_ERROR(CheckPeer(peer, tag));
    return PostSend(const_cast<void*>(buf), Bytes(count, dtype), peer, kP2pSlot + tag,
                    P2pWhat("send to", peer, tag));
  }
  Result<Request> IRecv(void* buf, int64_t count, DType dtype, int peer, int tag) override {
    RETURN_IF_ERROR(CheckPeer(peer, tag));
    return PostRecv(buf, Bytes(count, dtype), peer, kP2pSlot + tag,
                    P2pWhat("receive from", peer, tag));
  }

  // A group of `size` formed by name over this world's rendezvous (see
  // ConnectGlooGroup), this rank its member `rank`.
  Result<std::unique_ptr<Communicator>> Group(const std::string& group, int rank, int size,
                                              milliseconds connect) {
    return ConnectGroup(world_, group, rank, size, connect);
  }

  // Whether member `rank` of `group` has registered its address (Gloo's
  // full-mesh rendezvous key "<prefix>/rank_<rank>").
  Result<bool> MemberWaiting(const std::string& group, int rank) {
    return world_->kv->Has("g/" + group + "/rank_" + std::to_string(rank));
  }

  // A key of the rendezvous store (SetGlooKey, HasGlooKey), apart from
  // the rendezvous' own.
  Status SetKey(const std::string& key, const std::string& value) {
    return world_->kv->Set("k/" + key, value);
  }
  Result<bool> HasKey(const std::string& key) { return world_->kv->Has("k/" + key); }
  Result<std::string> GetKey(const std::string& key, milliseconds timeout) {
    return world_->kv->Get("k/" + key, timeout);
  }
  Result<int64_t> AddKey(const std::string& key, int64_t delta) {
    return world_->kv->Add("k/" + key, delta);
  }

  // Members of `group` on world `world` (its store and device), connected.
  // `connect`: the longest the pairs' connection may take (0: the
  // world's timeout), when the peers are known to be waiting.
  static Result<std::unique_ptr<Communicator>> ConnectGroup(
      std::shared_ptr<GlooWorld> world, const std::string& group, int rank, int size,
      milliseconds connect = milliseconds(0)) {
    if (group.empty() || size < 1 || rank < 0 || rank >= size) {
      return InvalidArgumentError("gloo group '" + group + "': rank " + std::to_string(rank) +
                                  " of " + std::to_string(size) + " (a name, 0 <= rank < size)");
    }
    const std::string prefix = "g/" + group;
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    const milliseconds limit = connect.count() > 0 ? connect : world->options.timeout;
    try {
      ctx->setTimeout(limit);
      gloo::rendezvous::PrefixStore store(prefix, *world->store);
      ctx->connectFullMesh(store, world->device);
      ctx->setTimeout(world->options.timeout);  // (the group's calls pass their own)
    } catch (const std::exception& e) {
      const std::string where = "rank " + std::to_string(rank) + " of group '" + group +
                                "': connecting to its " + std::to_string(size - 1) + " peer(s)";
      if (std::string(e.what()).find("was not set within") != std::string::npos) {
        return DeadlineExceededError(where + ": a member did not come within " +
                                     FormatDuration(world->options.timeout) + " (" + e.what() +
                                     ")");
      }
      return FromGlooError(where, e, limit);
    }
    auto out = std::make_unique<GlooCommunicator>(std::move(world), ctx, prefix);
    out->set_name(group);
    RETURN_IF_ERROR(out->Barrier());
    return std::unique_ptr<Communicator>(std::move(out));
  }

  Result<std::unique_ptr<Communicator>> Split(int color, int key) override {
    RETURN_IF_ERROR(Agree({CollectiveKind::kSplit}));
    int32_t mine[2] = {color, key};
    std::vector<int32_t> all(2 * static_cast<size_t>(size()));
    std::vector<int64_t> counts(size(), 2);
    RETURN_IF_ERROR(GatherAll(mine, 2, all.data(), counts, DType::kI32));
    const std::string id = id_ + "." + std::to_string(splits_++);
    if (color < 0) return std::unique_ptr<Communicator>();
    std::vector<std::pair<int32_t, int>> members;  // (key, old rank)
    for (int r = 0; r < size(); ++r) {
      if (all[2 * r] == color) members.push_back({all[2 * r + 1], r});
    }
    std::sort(members.begin(), members.end());
    int new_rank = 0;
    while (members[new_rank].second != rank()) ++new_rank;
    auto ctx =
        std::make_shared<gloo::rendezvous::Context>(new_rank, static_cast<int>(members.size()));
    const std::string prefix = id + "/" + std::to_string(color);
    RETURN_IF_ERROR(Run("split (color " + std::to_string(color) + ")", [&] {
      ctx->setTimeout(timeout());
      gloo::rendezvous::PrefixStore store(prefix, *world_->store);
      ctx->connectFullMesh(store, world_->device);
    }));
    auto out = std::make_unique<GlooCommunicator>(world_, ctx, prefix);
    out->set_name(name() + "/" + std::to_string(color));
    // Every member has read its peers' addresses before anyone goes on.
    RETURN_IF_ERROR(out->Barrier());
    return std::unique_ptr<Communicator>(std::move(out));
  }

 private:
  milliseconds timeout() const { return world_->options.timeout; }
  static size_t Bytes(int64_t count, DType dtype) {
    return static_cast<size_t>(count * DTypeSize(dtype));
  }
  std::string Where() const {
    return "rank " + std::to_string(rank()) +
           (name() == "world" ? "" : " (world rank " + std::to_string(world_->world_rank) + ")") +
           " on '" + name() + "'";
  }

  // Runs a Gloo call, turning its exceptions into errors that name this
  // rank, the communicator and the call.
  template <typename F>
  Status Run(const std::string& what, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      return FromGlooError(Where() + ": " + what, e, timeout());
    }
    return Status::Ok();
  }

  // The allreduce, its arguments checked.
  Status Reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
                const std::string& what) {
    if (count == 0) return Status::Ok();
    if (send != recv) std::memcpy(recv, send, Bytes(count, dtype));
    if (size() == 1) return Status::Ok();
    if (world_->options.deterministic) return FoldAllReduce(recv, count, dtype, op, what);
    RETURN_IF_ERROR(Run(what, [&] {
      gloo::AllreduceOptions opts(ctx_);
      SetReduceOutput(opts, recv, count, DTypeSize(dtype));
      opts.setReduceFunction(GlooReduceFn(dtype, op));
      opts.setTimeout(timeout());
      // Gloo's ring takes 3x longer than its bcube below a few hundred KiB
      // (4 KiB on 2 ranks: 3.9 ms against 1.2 ms here; torch's gloo group,
      // 1.3 ms); above, the ring is faster (64 MiB: 55 ms against 92 ms).
      opts.setAlgorithm(Bytes(count, dtype) <= kBcubeBelow
                            ? gloo::AllreduceOptions::Algorithm::BCUBE
                            : gloo::AllreduceOptions::Algorithm::RING);
      gloo::allreduce(opts);
    }));
    if (op == ReduceOp::kAvg) DivideInPlace(dtype, recv, count, size());
    return Status::Ok();
  }

  // An allreduce as a reduce-scatter (one alltoallv, every rank's block
  // folded in rank order, as in-process) and an allgatherv: deterministic,
  // moving 2(n-1)/n of the buffer where gathering every rank's whole buffer
  // moves n-1 times it. Not Gloo's default path: on 2 ranks it measured
  // the same as Gloo's own allreduce from 64 KiB to 16 MiB (comm_bench).
  Status FoldAllReduce(void* buf, int64_t count, DType dtype, ReduceOp op,
                       const std::string& what) {
    const std::vector<int64_t> counts = RankChunks(count, size());
    std::vector<char> folded(Bytes(counts[rank()], dtype));
    RETURN_IF_ERROR(FoldScatter(buf, counts, folded.data(), dtype, op, what));
    return GatherAll(folded.data(), counts[rank()], buf, counts, dtype, what);
  }

  // A reduce-scatter of `send`, cut into `counts` blocks in rank order:
  // every rank's block r comes to rank r in one alltoallv and is folded
  // there in rank order into `out` (counts[rank()] elements).
  Status FoldScatter(const void* send, std::span<const int64_t> counts, void* out, DType dtype,
                     ReduceOp op, const std::string& what) {
    const int64_t mine = counts[rank()];
    std::vector<char> blocks(Bytes(mine, dtype) * size());
    RETURN_IF_ERROR(
        Exchange(send, counts, blocks.data(), std::vector<int64_t>(size(), mine), dtype, what));
    FoldBlocks(blocks.data(), size(), mine, dtype, op, out);
    return Status::Ok();
  }

  // An alltoallv, the arguments already checked; `what` names it in errors.
  Status Exchange(const void* send, std::span<const int64_t> send_counts, void* recv,
                  std::span<const int64_t> recv_counts, DType dtype, const std::string& what) {
    const int64_t es = DTypeSize(dtype);
    std::vector<int64_t> sb(size()), rb(size());
    for (int r = 0; r < size(); ++r) {
      sb[r] = send_counts[r] * es;
      rb[r] = recv_counts[r] * es;
    }
    // Gloo's alltoallv wants buffers even when they are empty.
    char dummy_send = 0, dummy_recv = 0;
    const int64_t st = std::accumulate(sb.begin(), sb.end(), int64_t{0});
    const int64_t rt = std::accumulate(rb.begin(), rb.end(), int64_t{0});
    if (size() == 1) {
      if (st > 0 && send != recv) std::memcpy(recv, send, static_cast<size_t>(st));
      return Status::Ok();
    }
    return Run(what, [&] {
      gloo::AlltoallvOptions opts(ctx_);
      opts.setInput<uint8_t>(st > 0 ? static_cast<uint8_t*>(const_cast<void*>(send))
                                    : reinterpret_cast<uint8_t*>(&dummy_send),
                             sb);
      opts.setOutput<uint8_t>(
          rt > 0 ? static_cast<uint8_t*>(recv) : reinterpret_cast<uint8_t*>(&dummy_recv), rb);
      opts.setTimeout(timeout());
      gloo::alltoallv(opts);
    });
  }

  // With CommOptions::check: every rank's arguments, compared.
  Status Agree(const CollectiveArgs& args) {
    if (!world_->options.check || size() == 1) return Status::Ok();
    std::vector<CollectiveArgs> all(size());
    RETURN_IF_ERROR(Run("argument check of " + DescribeArgs(args), [&] {
      gloo::AllgathervOptions opts(ctx_);
      opts.setInput<uint8_t>(reinterpret_cast<uint8_t*>(const_cast<CollectiveArgs*>(&args)),
                             sizeof(CollectiveArgs));
      opts.setOutput<uint8_t>(reinterpret_cast<uint8_t*>(all.data()),
                              std::vector<size_t>(size(), sizeof(CollectiveArgs)));
      opts.setTimeout(timeout());
      gloo::allgatherv(opts);
    }));
    return CheckAgreement(all, name());
  }

  // An allgatherv; `what` names it in errors (by default, itself).
  Status GatherAll(const void* send, int64_t count, void* recv, std::span<const int64_t> counts,
                   DType dtype, const std::string& what = "") {
    std::vector<size_t> bytes(size());
    size_t total = 0;
    for (int r = 0; r < size(); ++r) total += bytes[r] = Bytes(counts[r], dtype);
    if (total == 0) return Status::Ok();
    if (size() == 1) {
      std::memcpy(recv, send, total);
      return Status::Ok();
    }
    char dummy = 0;
    return Run(!what.empty() ? what
                             : "allgatherv of " + std::to_string(total / DTypeSize(dtype)) + " " +
                                   std::string(DTypeName(dtype)),
               [&] {
                 gloo::AllgathervOptions opts(ctx_);
                 opts.setInput<uint8_t>(count > 0 ? static_cast<uint8_t*>(const_cast<void*>(send))
                                                  : reinterpret_cast<uint8_t*>(&dummy),
                                        Bytes(count, dtype));
                 opts.setOutput<uint8_t>(static_cast<uint8_t*>(recv), bytes);
                 opts.setTimeout(timeout());
                 gloo::allgatherv(opts);
               });
  }

  Status CheckRoot(int root) const {
    if (root < 0 || root >= size()) {
      return InvalidArgumentError(Where() + ": root " + std::to_string(root) + " out of range");
    }
    return Status::Ok();
  }
  Status CheckPeer(int peer, int tag) const {
    if (peer < 0 || peer >= size() || peer == rank() || tag < 0) {
      return InvalidArgumentError(Where() + ": peer " + std::to_string(peer) + ", tag " +
                                  std::to_string(tag) + " (peers are the other ranks, tags >= 0)");
    }
    return Status::Ok();
  }
  std::string P2pWhat(const char* verb, int peer, int tag) const {
    return Where() + ": " + verb + " rank " + std::to_string(peer) + " (tag " +
           std::to_string(tag) + ")";
  }

  Result<Request> PostSend(void* buf, size_t bytes, int peer, uint64_t slot, std::string what) {
    return Post(true, buf, bytes, peer, slot, std::move(what));
  }
  Result<Request> PostRecv(void* buf, size_t bytes, int peer, uint64_t slot, std::string what) {
    return Post(false, buf, bytes, peer, slot, std::move(what));
  }
  Result<Request> Post(bool send, void* buf, size_t bytes, int peer, uint64_t slot,
                       std::string what) {
    auto req = std::make_unique<GlooRequest>(send, bytes, timeout(), what, world_->watch);
    try {
      req->Post(*ctx_, buf, peer, slot, SentinelOf(peer));
    } catch (const std::exception& e) {
      return FromGlooError(what, e, timeout());  // `what` names rank and communicator
    }
    return Request(std::move(req));
  }
  static Status Wait(Result<Request> r) {
    if (!r.ok()) return r.status();
    return r->Wait();
  }
  // The pair to `peer`'s sentinel, posted with its first message.
  std::shared_ptr<Sentinel> SentinelOf(int peer) {
    std::lock_guard lock(sentinels_mu_);
    std::shared_ptr<Sentinel>& s = sentinels_[peer];
    if (s == nullptr) {
      s = std::make_shared<Sentinel>();
      s->buf = ctx_->createUnboundBuffer(nullptr, 0);
      try {
        s->buf->recv(peer, kSentinelSlot, 0, 0);
      } catch (const std::exception&) {
        s->failed = true;
      }
    }
    return s;
  }

  std::shared_ptr<GlooWorld> world_;
  std::shared_ptr<gloo::rendezvous::Context> ctx_;
  std::string id_;  // unique over the world: the store prefix of its splits
  int splits_ = 0;
  std::mutex sentinels_mu_;
  std::vector<std::shared_ptr<Sentinel>> sentinels_;  // by peer
};

// The interface Gloo binds to: GLOO_SOCKET_IFNAME / TESSERA_GLOO_IFNAME
// (as torch does), else the local address that routes to the master.
Result<gloo::transport::tcp::attr> DeviceAttr(const RankTable& table, const std::string& master) {
  gloo::transport::tcp::attr attr;
  for (const char* var : {"TESSERA_GLOO_IFNAME", "GLOO_SOCKET_IFNAME"}) {
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') {
      attr.iface = v;
      return attr;
    }
  }
  ASSIGN_OR_RETURN(attr.hostname, tcp::LocalAddressToward(master, table.master_port));
  // A master name that resolves to loopback (Debian's "127.0.1.1 <host>")
  // would hand the other hosts an address they cannot reach: use a real
  // interface then, unless the master is loopback on purpose.
  if (tcp::IsLoopback(attr.hostname) && !tcp::IsLoopback(master)) {
    Result<std::string> real = tcp::NonLoopbackAddress();
    if (real.ok()) attr.hostname = *real;
  }
  return attr;
}

// Every rank says it arrived (with its world size) and waits for the
// others. Whoever times out names the ranks that never came; rank 0 then
// posts its verdict and keeps the store up until the ranks that did come
// have read it (or 2 s), so that they report the same ranks.
Status Join(KvClient& kv, const RankTable& t, const std::string& who, milliseconds timeout) {
  RETURN_IF_ERROR(kv.Set("joined/" + std::to_string(t.rank), std::to_string(t.world_size)));
  const auto deadline = tcp::Clock::now() + timeout;
  std::vector<bool> seen(t.world_size, false);
  int present = 0;
  while (true) {
    std::string missing;
    for (int r = 0; r < t.world_size; ++r) {
      if (seen[r]) continue;
      ASSIGN_OR_RETURN(bool has, kv.Has("joined/" + std::to_string(r)));
      if (!has) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        continue;
      }
      ASSIGN_OR_RETURN(std::string size, kv.Get("joined/" + std::to_string(r), timeout));
      if (size != std::to_string(t.world_size)) {
        return InvalidArgumentError(who + ": rank " + std::to_string(r) + " has world size " +
                                    size);
      }
      seen[r] = true;
      ++present;
    }
    if (missing.empty()) return Status::Ok();
    if (t.rank != 0) {
      ASSIGN_OR_RETURN(bool failed, kv.Has("rendezvous/failed"));
      if (failed) {
        ASSIGN_OR_RETURN(std::string why, kv.Get("rendezvous/failed", timeout));
        (void)kv.Add("rendezvous/acks", 1);
        return DeadlineExceededError(who + ": " + why);
      }
    }
    if (tcp::Clock::now() >= deadline) {
      const std::string why = "rank(s) " + missing + " did not join the rendezvous at " +
                              t.master_host + ":" + std::to_string(t.master_port) + " within " +
                              FormatDuration(timeout);
      if (t.rank == 0) {
        (void)kv.Set("rendezvous/failed", why);
        const auto grace = tcp::Clock::now() + std::chrono::seconds(2);
        while (tcp::Clock::now() < grace) {
          Result<int64_t> acks = kv.Add("rendezvous/acks", 0);
          if (!acks.ok() || *acks >= present - 1) break;
          std::this_thread::sleep_for(milliseconds(10));
        }
      } else {
        (void)kv.Add("rendezvous/acks", 1);
      }
      return DeadlineExceededError(who + ": " + why);
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
}

}  // namespace

namespace {

// Gloo's TCP pairs write with writev(), so a write to a peer that died
// raises SIGPIPE, whose default action kills this rank before the error
// can be returned (seen in comm_gloo_test deadpeer: one run in 7 under
// load). A process that left SIGPIPE at its default gets it ignored, so the
// write fails with EPIPE and Gloo's error names the peer; a handler the
// program installed itself is kept. (Python ignores SIGPIPE already.)
void IgnoreSigpipeUnlessHandled() {
  struct sigaction current = {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    struct sigaction ignore = {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, nullptr);
  }
}

}  // namespace

namespace {

// `world`'s client of rank 0's rendezvous store, reached at `host` (rank 0
// itself: loopback) on the table's master port.
Status ConnectRendezvous(GlooWorld& world, const std::string& host, const RankTable& t,
                         const std::string& who) {
  Result<std::unique_ptr<KvClient>> kv =
      KvClient::Connect(host, t.master_port, world.options.timeout);
  if (!kv.ok()) {
    return kv.status().Annotate(who + ": rank 0's rendezvous at " + t.master_host + ":" +
                                std::to_string(t.master_port));
  }
  world.kv = std::move(*kv);
  world.store = std::make_unique<KvGlooStore>(world.kv, world.options.timeout);
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Communicator>> CreateGlooWorld(const RankTable& table,
                                                      const CommOptions& options) {
  IgnoreSigpipeUnlessHandled();
  auto world = std::make_shared<GlooWorld>();
  world->options = options;
  world->world_rank = table.rank;
  const std::string who =
      "gloo rank " + std::to_string(table.rank) + " of " + std::to_string(table.world_size);
  RankTable t = table;
  if (t.world_size > 1 && (t.master_port <= 0 || (t.rank != 0 && t.master_host.empty()))) {
    return InvalidArgumentError(who +
                                ": no master address (set MASTER_ADDR and MASTER_PORT, "
                                "TESSERA_MASTER=host:port, or --master)");
  }
  if (t.rank == 0) {
    Result<std::unique_ptr<KvServer>> server =
        KvServer::Start(t.world_size > 1 ? t.master_port : 0);
    if (!server.ok()) return server.status().Annotate(who + ": the rendezvous on the master port");
    world->server = std::move(*server);
    t.master_port = world->server->port();
    if (t.master_host.empty() || t.world_size == 1) t.master_host = "127.0.0.1";
  }
  RETURN_IF_ERROR(ConnectRendezvous(*world, t.rank == 0 ? "127.0.0.1" : t.master_host, t, who));
  RETURN_IF_ERROR(Join(*world->kv, t, who, options.timeout));
  ASSIGN_OR_RETURN(gloo::transport::tcp::attr attr, DeviceAttr(t, t.master_host));
  auto ctx = std::make_shared<gloo::rendezvous::Context>(t.rank, t.world_size);
  try {
    world->device = gloo::transport::tcp::CreateDevice(attr);
    ctx->setTimeout(options.timeout);
    gloo::rendezvous::PrefixStore store("w", *world->store);
    ctx->connectFullMesh(store, world->device);
  } catch (const std::exception& e) {
    return AbortedError(who + ": connecting to the other ranks: " + e.what());
  }
  auto out = std::make_unique<GlooCommunicator>(world, ctx, "w");
  RETURN_IF_ERROR(out->Barrier());
  return std::unique_ptr<Communicator>(std::move(out));
}

namespace {

// `world` as Gloo's, for `what` ("gloo group 'x'"); InvalidArgument for
// another backend.
Result<GlooCommunicator*> GlooWorldOf(Communicator& world, const std::string& what) {
  auto* gloo = dynamic_cast<GlooCommunicator*>(&world);
  if (gloo == nullptr) {
    return InvalidArgumentError(what + ": communicator '" + world.name() + "' is " +
                                std::string(world.backend()) + "'s, not Gloo's");
  }
  return gloo;
}

}  // namespace

Result<std::unique_ptr<Communicator>> ConnectGlooGroup(Communicator& world,
                                                       const std::string& group, int rank, int size,
                                                       std::chrono::milliseconds connect) {
  ASSIGN_OR_RETURN(GlooCommunicator * gloo, GlooWorldOf(world, "gloo group '" + group + "'"));
  return gloo->Group(group, rank, size, connect);
}

Result<bool> GlooGroupMemberWaiting(Communicator& world, const std::string& group, int rank) {
  ASSIGN_OR_RETURN(GlooCommunicator * gloo, GlooWorldOf(world, "gloo group '" + group + "'"));
  return gloo->MemberWaiting(group, rank);
}

Status SetGlooKey(Communicator& comm, const std::string& key, const std::string& value) {
  ASSIGN_OR_RETURN(GlooCommunicator * gloo, GlooWorldOf(comm, "gloo store key '" + key + "'"));
  return gloo->SetKey(key, value);
}

Result<bool> HasGlooKey(Communicator& comm, const std::string& key) {
  ASSIGN_OR_RETURN(GlooCommunicator * gloo, GlooWorldOf(comm, "gloo store key '" + key + "'"));
  return gloo->HasKey(key);
}

Result<std::string> GetGlooKey(Communicator& comm, const std::string& key,
                               std::chrono::milliseconds timeout) {
  ASSIGN_OR_RETURN(GlooCommunicator * gloo, GlooWorldOf(comm, "gloo store key '" + key + "'"));
  return gloo->GetKey(key, timeout);
}

Result<int64_t> AddGlooKey(Communicator& comm, const std::string& key, int64_t delta) {
  ASSIGN_OR_RETURN(GlooCommunicator * gloo, GlooWorldOf(comm, "gloo store key '" + key + "'"));
  return gloo->AddKey(key, delta);
}

Result<std::unique_ptr<Communicator>> JoinGlooGroup(const RankTable& table,
                                                    const std::string& group, int rank, int size,
                                                    const CommOptions& options) {
  IgnoreSigpipeUnlessHandled();
  const std::string who = "gloo rank " + std::to_string(table.rank) + " joining group '" + group +
                          "' as its rank " + std::to_string(rank);
  if (table.master_host.empty() || table.master_port <= 0) {
    return InvalidArgumentError(who +
                                ": no master address (set MASTER_ADDR and MASTER_PORT, "
                                "TESSERA_MASTER=host:port, or --master)");
  }
  auto world = std::make_shared<GlooWorld>();
  world->options = options;
  world->world_rank = table.rank;
  RETURN_IF_ERROR(ConnectRendezvous(*world, table.master_host, table, who));
  ASSIGN_OR_RETURN(gloo::transport::tcp::attr attr, DeviceAttr(table, table.master_host));
  try {
    world->device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return AbortedError(who + ": " + e.what());
  }
  return GlooCommunicator::ConnectGroup(std::move(world), group, rank, size);
}

}  // namespace tessera
