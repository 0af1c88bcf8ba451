#include "runtime/comm/inprocess.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include "runtime/comm/comm_util.h"
#include "runtime/comm/reduce.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

// State shared by every rank and group of one in-process world. One mutex
// and one condition variable serve all of it: ranks only hold the lock to
// post and to meet, never while copying data.
struct World {
  explicit World(int size, CommOptions opts) : options(std::move(opts)), finished(size, false) {}
  CommOptions options;
  std::mutex mu;
  std::condition_variable cv;
  Status aborted;              // non-OK once the world is down
  std::vector<bool> finished;  // by world rank: the rank's thread returned

  // Takes the world down (the first reason wins) and wakes every waiter.
  // Called with mu held; returns the reason the world is down.
  Status AbortLocked(Status why) {
    if (aborted.ok()) aborted = std::move(why);
    cv.notify_all();
    return aborted;
  }
};

// A posted point-to-point operation's completion.
struct P2PState {
  bool done = false;
  bool claimed = false;  // a peer is copying into/out of the buffer
  Status status;
};

struct Message {  // a send nobody has received yet (data copied)
  int src, tag;
  int64_t count;
  DType dtype;
  std::vector<char> data;
};
struct PostedRecv {
  int src, tag;
  int64_t count;
  DType dtype;
  void* buf;
  std::shared_ptr<P2PState> state;
};

struct Group;

// One collective's arguments as rank r posted them.
struct Slot {
  CollectiveArgs args;
  const void* send = nullptr;
  void* recv = nullptr;
  std::span<const int64_t> counts, counts2;
  int color = 0, key = 0;
};

struct Group {
  Group(std::shared_ptr<World> w, std::vector<int> members)
      : world(std::move(w)),
        world_ranks(std::move(members)),
        slots(world_ranks.size()),
        arrived_mask(world_ranks.size(), false),
        split_result(world_ranks.size()),
        inbox(world_ranks.size()),
        posted(world_ranks.size()) {}
  int size() const { return static_cast<int>(world_ranks.size()); }

  std::shared_ptr<World> world;
  std::vector<int> world_ranks;  // member i is world rank world_ranks[i]
  // The current collective round (guarded by world->mu).
  std::vector<Slot> slots;
  std::vector<bool> arrived_mask;
  int arrived = 0, departed = 0;
  // Bumped (release) by the last rank to arrive / to leave; waiters spin on
  // them before sleeping on the condition variable.
  std::atomic<int64_t> enter_generation{0}, exit_generation{0};
  Status round_status;
  std::vector<std::pair<std::shared_ptr<Group>, int>> split_result;
  // Point-to-point, by destination rank.
  std::vector<std::list<Message>> inbox;
  std::vector<std::list<PostedRecv>> posted;

  std::span<const CollectiveArgs> ArgsOfRound() {
    round_args.resize(slots.size());
    for (size_t i = 0; i < slots.size(); ++i) round_args[i] = slots[i].args;
    return round_args;
  }
  std::vector<CollectiveArgs> round_args;
};

// Waits briefly for `gen` to move past `seen`, without sleeping: peers
// usually arrive within microseconds, far sooner than a futex wake-up.
// Yields after the first spins so oversubscribed ranks still progress.
bool SpinUntilChanged(const std::atomic<int64_t>& gen, int64_t seen) {
  for (int i = 0; i < 2000; ++i) {
    if (gen.load(std::memory_order_acquire) != seen) return true;
    if (i >= 64) std::this_thread::yield();
  }
  return gen.load(std::memory_order_acquire) != seen;
}

class InProcessCommunicator;

class InProcessRequest : public Request::Impl {
 public:
  // peer_world_rank: the sender of a receive (-1 for a send).
  InProcessRequest(std::shared_ptr<Group> g, std::shared_ptr<P2PState> s, int rank,
                   std::string what, int peer_world_rank = -1)
      : group_(std::move(g)),
        state_(std::move(s)),
        rank_(rank),
        what_(std::move(what)),
        peer_world_rank_(peer_world_rank) {}
  Status Wait() override;

 private:
  std::shared_ptr<Group> group_;
  std::shared_ptr<P2PState> state_;
  int rank_;
  std::string what_;
  int peer_world_rank_;
};

class InProcessCommunicator : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Group> group, int rank)
      : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string_view backend() const override { return "inprocess"; }

  Status Barrier() override {
    Slot s;
    s.args = {CollectiveKind::kBarrier};
    return Run(s, [](const std::vector<Slot>&, int) {});
  }

  Status Broadcast(void* buf, int64_t count, DType dtype, int root) override {
    Slot s;
    s.args = {CollectiveKind::kBroadcast, count, dtype, ReduceOp::kSum, root};
    s.recv = buf;
    return Run(s, [&](const std::vector<Slot>& all, int r) {
      if (r != root) Copy(buf, all[root].recv, count, dtype);
    });
  }

  Status AllReduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    RETURN_IF_ERROR(CheckReduction(dtype, op));
    Slot s;
    s.args = {CollectiveKind::kAllReduce, count, dtype, op};
    s.send = send;
    s.recv = recv;
    return Run(s, [&](const std::vector<Slot>& all, int r) {
      // Rank r reduces chunk r of the vector and writes it to every rank.
      const int n = size();
      const int64_t begin = count * r / n, end = count * (r + 1) / n;
      if (begin == end) return;
      const int64_t esize = DTypeSize(dtype);
      std::vector<const void*> in(n);
      for (int i = 0; i < n; ++i) in[i] = At(all[i].send, begin, esize);
      void* mine = At(recv, begin, esize);
      ReduceRankOrder(dtype, op, in, mine, end - begin);
      for (int i = 0; i < n; ++i) {
        if (i != r) Copy(At(all[i].recv, begin, esize), mine, end - begin, dtype);
      }
    });
  }

  Status AllGatherV(const void* send, int64_t count, void* recv, std::span<const int64_t> counts,
                    DType dtype) override {
    RETURN_IF_ERROR(CheckCounts("allgather", counts, size(), rank_, count));
    Slot s;
    s.args = VArgs(CollectiveKind::kAllGather, counts, dtype);
    s.send = send;
    s.recv = recv;
    s.counts = counts;
    return Run(s,
               [&](const std::vector<Slot>& all, int) { Concatenate(all, counts, dtype, recv); });
  }

  Status ReduceScatter(const void* send, void* recv, int64_t recv_count, DType dtype,
                       ReduceOp op) override {
    RETURN_IF_ERROR(CheckReduction(dtype, op));
    Slot s;
    s.args = {CollectiveKind::kReduceScatter, recv_count, dtype, op};
    s.send = send;
    s.recv = recv;
    return Run(s, [&](const std::vector<Slot>& all, int r) {
      const int64_t esize = DTypeSize(dtype);
      std::vector<const void*> in(size());
      for (int i = 0; i < size(); ++i) in[i] = At(all[i].send, r * recv_count, esize);
      ReduceRankOrder(dtype, op, in, recv, recv_count);
    });
  }

  Status GatherV(const void* send, int64_t count, void* recv, std::span<const int64_t> counts,
                 DType dtype, int root) override {
    RETURN_IF_ERROR(CheckCounts("gather", counts, size(), rank_, count));
    Slot s;
    s.args = VArgs(CollectiveKind::kGather, counts, dtype, root);
    s.send = send;
    s.recv = recv;
    s.counts = counts;
    return Run(s, [&](const std::vector<Slot>& all, int r) {
      if (r == root) Concatenate(all, counts, dtype, recv);
    });
  }

  Status ScatterV(const void* send, std::span<const int64_t> counts, void* recv, int64_t count,
                  DType dtype, int root) override {
    RETURN_IF_ERROR(CheckCounts("scatter", counts, size(), rank_, count));
    Slot s;
    s.args = VArgs(CollectiveKind::kScatter, counts, dtype, root);
    s.send = send;
    s.counts = counts;
    return Run(s, [&](const std::vector<Slot>& all, int r) {
      const int64_t offset = std::accumulate(counts.begin(), counts.begin() + r, int64_t{0});
      Copy(recv, At(all[root].send, offset, DTypeSize(dtype)), count, dtype);
    });
  }

  Status AllToAllV(const void* send, std::span<const int64_t> send_counts, void* recv,
                   std::span<const int64_t> recv_counts, DType dtype) override {
    RETURN_IF_ERROR(CheckCounts("alltoall", send_counts, size(), -1, 0));
    RETURN_IF_ERROR(CheckCounts("alltoall", recv_counts, size(), -1, 0));
    Slot s;
    s.args = {CollectiveKind::kAllToAll, 0, dtype};
    s.send = send;
    s.recv = recv;
    s.counts = send_counts;
    s.counts2 = recv_counts;
    return Run(s, [&](const std::vector<Slot>& all, int r) {
      const int64_t esize = DTypeSize(dtype);
      int64_t offset = 0;
      for (int i = 0; i < size(); ++i) {
        const auto& sc = all[i].counts;
        const int64_t from = std::accumulate(sc.begin(), sc.begin() + r, int64_t{0});
        Copy(At(recv, offset, esize), At(all[i].send, from, esize), recv_counts[i], dtype);
        offset += recv_counts[i];
      }
    });
  }

  Status Send(const void* buf, int64_t count, DType dtype, int peer, int tag) override {
    ASSIGN_OR_RETURN(Request req, ISend(buf, count, dtype, peer, tag));
    return req.Wait();
  }
  Status Recv(void* buf, int64_t count, DType dtype, int peer, int tag) override {
    ASSIGN_OR_RETURN(Request req, IRecv(buf, count, dtype, peer, tag));
    return req.Wait();
  }
  Result<Request> ISend(const void* buf, int64_t count, DType dtype, int peer, int tag) override;
  Result<Request> IRecv(void* buf, int64_t count, DType dtype, int peer, int tag) override;

  Result<std::unique_ptr<Communicator>> Split(int color, int key) override {
    Slot s;
    s.args = {CollectiveKind::kSplit};
    s.color = color;
    s.key = key;
    std::pair<std::shared_ptr<Group>, int> mine;
    RETURN_IF_ERROR(
        Run(s, [&](const std::vector<Slot>&, int r) { mine = group_->split_result[r]; }));
    if (mine.first == nullptr) return std::unique_ptr<Communicator>();
    auto comm = std::make_unique<InProcessCommunicator>(std::move(mine.first), mine.second);
    comm->set_name(name_ + "/" + std::to_string(color));
    return std::unique_ptr<Communicator>(std::move(comm));
  }

 private:
  static void* At(void* p, int64_t elems, int64_t esize) {
    return static_cast<char*>(p) + elems * esize;
  }
  static const void* At(const void* p, int64_t elems, int64_t esize) {
    return static_cast<const char*>(p) + elems * esize;
  }
  static void Copy(void* dst, const void* src, int64_t count, DType dtype) {
    if (count > 0 && dst != src) std::memcpy(dst, src, count * DTypeSize(dtype));
  }
  // recv = every rank's send block (counts[i] elements) in rank order.
  static void Concatenate(const std::vector<Slot>& all, std::span<const int64_t> counts,
                          DType dtype, void* recv) {
    int64_t offset = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      Copy(At(recv, offset, DTypeSize(dtype)), all[i].send, counts[i], dtype);
      offset += counts[i];
    }
  }

  std::string Where() const {
    return "rank " + std::to_string(rank_) + " of '" + name_ + "' (inprocess, " +
           std::to_string(size()) + " ranks)";
  }

  // The ranks of this group that have not arrived, or have finished.
  std::string Missing(bool finished_only) const {
    std::string out;
    World& w = *group_->world;
    for (int i = 0; i < size(); ++i) {
      if (group_->arrived_mask[i]) continue;
      if (finished_only && !w.finished[group_->world_ranks[i]]) continue;
      out += (out.empty() ? "" : ", ") + std::to_string(i);
    }
    return out;
  }

  // Posts this rank's slot, meets the others, runs `body(all_slots, rank)`
  // and waits until every rank is done reading the others' buffers.
  template <typename Body>
  Status Run(Slot slot, Body body) {
    RETURN_IF_ERROR(CheckCount(slot.args, name_));
    Group& g = *group_;
    World& w = *g.world;
    std::unique_lock<std::mutex> lock(w.mu);
    if (!w.aborted.ok()) return w.aborted;
    g.slots[rank_] = slot;
    g.arrived_mask[rank_] = true;
    const int64_t generation = g.enter_generation.load(std::memory_order_relaxed);
    if (++g.arrived == size()) {
      g.round_status = CheckAgreement(g.ArgsOfRound(), name_);
      if (g.round_status.ok() && slot.args.kind == CollectiveKind::kAllToAll) {
        std::vector<std::vector<int64_t>> sends, recvs;
        for (const Slot& sl : g.slots) {
          sends.emplace_back(sl.counts.begin(), sl.counts.end());
          recvs.emplace_back(sl.counts2.begin(), sl.counts2.end());
        }
        g.round_status = CheckAllToAllCounts(sends, recvs);
      }
      if (g.round_status.ok() && slot.args.kind == CollectiveKind::kSplit) MakeSplit(g);
      g.arrived = 0;
      std::fill(g.arrived_mask.begin(), g.arrived_mask.end(), false);
      g.enter_generation.store(generation + 1, std::memory_order_release);
      w.cv.notify_all();
      lock.unlock();
    } else {
      lock.unlock();
      if (!SpinUntilChanged(g.enter_generation, generation)) {
        lock.lock();
        const auto deadline = Clock::now() + w.options.timeout;
        while (g.enter_generation.load(std::memory_order_acquire) == generation) {
          if (!w.aborted.ok()) return w.aborted;
          const std::string gone = Missing(/*finished_only=*/true);
          if (!gone.empty()) {
            return w.AbortLocked(AbortedError(Where() + ": " +
                                              std::string(KindName(slot.args.kind)) + ": rank(s) " +
                                              gone + " already finished"));
          }
          if (w.cv.wait_until(lock, deadline) == std::cv_status::timeout &&
              g.enter_generation.load(std::memory_order_acquire) == generation) {
            return w.AbortLocked(DeadlineExceededError(
                Where() + ": " + std::string(KindName(slot.args.kind)) + " of " +
                std::to_string(slot.args.count) + " " + std::string(DTypeName(slot.args.dtype)) +
                " waited " + FormatDuration(w.options.timeout) + " for rank(s) " + Missing(false)));
          }
        }
        lock.unlock();
      }
    }
    // Published by the last arrival before its release store.
    const Status status = g.round_status;
    if (status.ok()) body(g.slots, rank_);
    // Everyone has arrived, so everyone gets here without blocking: this
    // wait needs no timeout.
    lock.lock();
    const int64_t exit_generation = g.exit_generation.load(std::memory_order_relaxed);
    if (++g.departed == size()) {
      g.departed = 0;
      g.exit_generation.store(exit_generation + 1, std::memory_order_release);
      w.cv.notify_all();
    } else {
      lock.unlock();
      if (!SpinUntilChanged(g.exit_generation, exit_generation)) {
        lock.lock();
        w.cv.wait(lock, [&] {
          return g.exit_generation.load(std::memory_order_acquire) != exit_generation;
        });
      }
    }
    return status.ok() ? status : status.Annotate(Where());
  }

  // Called by the last rank to arrive at a Split, under the lock.
  static void MakeSplit(Group& g) {
    std::map<int, std::vector<int>> by_color;
    for (int i = 0; i < g.size(); ++i) {
      g.split_result[i] = {nullptr, -1};
      if (g.slots[i].color >= 0) by_color[g.slots[i].color].push_back(i);
    }
    for (auto& [color, members] : by_color) {
      std::stable_sort(members.begin(), members.end(),
                       [&](int a, int b) { return g.slots[a].key < g.slots[b].key; });
      std::vector<int> world_ranks;
      for (int m : members) world_ranks.push_back(g.world_ranks[m]);
      auto child = std::make_shared<Group>(g.world, std::move(world_ranks));
      for (int i = 0; i < static_cast<int>(members.size()); ++i) {
        g.split_result[members[i]] = {child, i};
      }
    }
  }

  Status CheckPeer(int peer, int tag) const {
    if (peer < 0 || peer >= size() || peer == rank_) {
      return InvalidArgumentError(Where() + ": peer " + std::to_string(peer) +
                                  " is not another rank of the communicator");
    }
    if (tag < 0) return InvalidArgumentError(Where() + ": negative tag");
    return Status::Ok();
  }

  std::shared_ptr<Group> group_;
  int rank_;
};

std::string Mismatch(int rank, int peer, int tag, int64_t want, DType wd, int64_t got, DType gd) {
  return "rank " + std::to_string(rank) + " expected " + std::to_string(want) + " " +
         std::string(DTypeName(wd)) + " from rank " + std::to_string(peer) + " (tag " +
         std::to_string(tag) + ") but rank " + std::to_string(peer) + " sent " +
         std::to_string(got) + " " + std::string(DTypeName(gd));
}

Result<Request> InProcessCommunicator::ISend(const void* buf, int64_t count, DType dtype, int peer,
                                             int tag) {
  RETURN_IF_ERROR(CheckPeer(peer, tag));
  Group& g = *group_;
  World& w = *g.world;
  std::unique_lock<std::mutex> lock(w.mu);
  if (!w.aborted.ok()) return w.aborted;
  auto& posted = g.posted[peer];
  auto it = std::find_if(posted.begin(), posted.end(),
                         [&](const PostedRecv& p) { return p.src == rank_ && p.tag == tag; });
  auto done = std::make_shared<P2PState>();
  done->done = true;
  if (it != posted.end()) {  // the receiver is waiting: copy straight in
    PostedRecv recv = std::move(*it);
    posted.erase(it);
    if (recv.count != count || recv.dtype != dtype) {
      recv.state->status =
          InvalidArgumentError(Mismatch(peer, rank_, tag, recv.count, recv.dtype, count, dtype));
      recv.state->done = true;
      w.cv.notify_all();
      return Request(std::make_unique<InProcessRequest>(group_, done, rank_, "send"));
    }
    recv.state->claimed = true;
    lock.unlock();
    if (count > 0) std::memcpy(recv.buf, buf, count * DTypeSize(dtype));
    lock.lock();
    recv.state->done = true;
    w.cv.notify_all();
  } else {  // nobody waits yet: keep a copy, so the sender can go on
    Message m{rank_, tag, count, dtype, {}};
    m.data.assign(static_cast<const char*>(buf),
                  static_cast<const char*>(buf) + count * DTypeSize(dtype));
    g.inbox[peer].push_back(std::move(m));
  }
  return Request(std::make_unique<InProcessRequest>(group_, done, rank_, "send"));
}

Result<Request> InProcessCommunicator::IRecv(void* buf, int64_t count, DType dtype, int peer,
                                             int tag) {
  RETURN_IF_ERROR(CheckPeer(peer, tag));
  Group& g = *group_;
  World& w = *g.world;
  std::unique_lock<std::mutex> lock(w.mu);
  if (!w.aborted.ok()) return w.aborted;
  auto state = std::make_shared<P2PState>();
  const std::string what = "receive of " + std::to_string(count) + " " +
                           std::string(DTypeName(dtype)) + " from rank " + std::to_string(peer) +
                           " (tag " + std::to_string(tag) + ")";
  auto& inbox = g.inbox[rank_];
  auto it = std::find_if(inbox.begin(), inbox.end(),
                         [&](const Message& m) { return m.src == peer && m.tag == tag; });
  if (it != inbox.end()) {
    Message m = std::move(*it);
    inbox.erase(it);
    lock.unlock();
    state->done = true;
    if (m.count != count || m.dtype != dtype) {
      state->status =
          InvalidArgumentError(Mismatch(rank_, peer, tag, count, dtype, m.count, m.dtype));
    } else if (!m.data.empty()) {
      std::memcpy(buf, m.data.data(), m.data.size());
    }
  } else {
    g.posted[rank_].push_back(PostedRecv{peer, tag, count, dtype, buf, state});
  }
  return Request(
      std::make_unique<InProcessRequest>(group_, state, rank_, what, g.world_ranks[peer]));
}

Status InProcessRequest::Wait() {
  World& w = *group_->world;
  std::unique_lock<std::mutex> lock(w.mu);
  const auto deadline = Clock::now() + w.options.timeout;
  while (!state_->done) {
    if (state_->claimed) {  // a sender is copying in; that always finishes
      w.cv.wait(lock);
      continue;
    }
    Status fail = w.aborted;
    if (fail.ok() && peer_world_rank_ >= 0 && w.finished[peer_world_rank_]) {
      fail = AbortedError("rank " + std::to_string(rank_) + ": " + what_ +
                          ": the sender already finished");
    }
    if (fail.ok() && Clock::now() >= deadline) {
      fail = w.AbortLocked(DeadlineExceededError("rank " + std::to_string(rank_) + ": " + what_ +
                                                 ": nothing arrived within " +
                                                 FormatDuration(w.options.timeout)));
    }
    if (!fail.ok()) {  // withdraw the receive so nobody writes the buffer later
      for (auto& list : group_->posted) {
        list.remove_if([&](const PostedRecv& p) { return p.state == state_; });
      }
      return fail;
    }
    w.cv.wait_until(lock, deadline);
  }
  return state_->status;
}

struct MadeWorld {
  std::shared_ptr<World> world;
  std::vector<std::unique_ptr<Communicator>> comms;
};

Result<MadeWorld> MakeWorld(int size, const CommOptions& options) {
  if (size < 1 || size > 4096) {
    return InvalidArgumentError("in-process world size " + std::to_string(size) +
                                " is outside [1, 4096]");
  }
  MadeWorld made;
  made.world = std::make_shared<World>(size, options);
  std::vector<int> ranks(size);
  std::iota(ranks.begin(), ranks.end(), 0);
  auto group = std::make_shared<Group>(made.world, ranks);
  for (int r = 0; r < size; ++r) {
    made.comms.push_back(std::make_unique<InProcessCommunicator>(group, r));
  }
  return made;
}

}  // namespace

Result<std::vector<std::unique_ptr<Communicator>>> CreateInProcessWorld(
    int size, const CommOptions& options) {
  ASSIGN_OR_RETURN(MadeWorld made, MakeWorld(size, options));
  return std::move(made.comms);
}

Status RunInProcess(int size, const std::function<Status(Communicator&)>& fn,
                    const CommOptions& options) {
  ASSIGN_OR_RETURN(MadeWorld made, MakeWorld(size, options));
  World& world = *made.world;
  std::vector<Status> results(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      Status s = fn(*made.comms[r]);
      std::lock_guard<std::mutex> lock(world.mu);
      world.finished[r] = true;
      if (!s.ok()) {
        (void)world.AbortLocked(
            AbortedError("rank " + std::to_string(r) + " failed: " + s.ToString()));
      }
      results[r] = std::move(s);
      world.cv.notify_all();  // peers waiting on this rank see it finished
    });
  }
  for (auto& t : threads) t.join();
  // The root cause: the first failure that is not a consequence of another.
  for (int pass = 0; pass < 2; ++pass) {
    for (int r = 0; r < size; ++r) {
      if (results[r].ok()) continue;
      if (pass == 0 && results[r].code() == StatusCode::kAborted) continue;
      return results[r].Annotate("rank " + std::to_string(r));
    }
  }
  return Status::Ok();
}

}  // namespace tessera
