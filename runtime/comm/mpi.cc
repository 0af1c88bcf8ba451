#include "runtime/comm/mpi.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "runtime/comm/comm_util.h"
#include "runtime/comm/reduce.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

// f16/bf16 reductions: MPI has no such types; they travel as MPI_UINT16_T
// and reduce through these ops (reduce.h's pairwise step).
template <DType kType, ReduceOp kOp>
void HalfOp(void* in, void* inout, int* len, MPI_Datatype*) {
  PairwiseReduce(kType, kOp)(inout, in, inout, static_cast<size_t>(*len));
}

MPI_Op g_half_ops[2][3];  // [f16, bf16][sum, max, min]
bool g_half_ops_ready = false;

void FinalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

Status InitMpi(MpiThreadLevel level) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  static const int kLevels[] = {MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED, MPI_THREAD_SERIALIZED,
                                MPI_THREAD_MULTIPLE};
  static const char* kNames[] = {"single", "funneled", "serialized", "multiple"};
  const int requested = kLevels[static_cast<int>(level)];
  int initialized = 0, finalized = 0, provided = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) return FailedPreconditionError("MPI was already finalized in this process");
  if (!initialized) {
    if (MPI_Init_thread(nullptr, nullptr, requested, &provided) != MPI_SUCCESS) {
      return IOError("MPI_Init_thread failed");
    }
    std::atexit(FinalizeAtExit);
    MPI_Op_create(&HalfOp<DType::kF16, ReduceOp::kSum>, 1, &g_half_ops[0][0]);
    MPI_Op_create(&HalfOp<DType::kF16, ReduceOp::kMax>, 1, &g_half_ops[0][1]);
    MPI_Op_create(&HalfOp<DType::kF16, ReduceOp::kMin>, 1, &g_half_ops[0][2]);
    MPI_Op_create(&HalfOp<DType::kBF16, ReduceOp::kSum>, 1, &g_half_ops[1][0]);
    MPI_Op_create(&HalfOp<DType::kBF16, ReduceOp::kMax>, 1, &g_half_ops[1][1]);
    MPI_Op_create(&HalfOp<DType::kBF16, ReduceOp::kMin>, 1, &g_half_ops[1][2]);
    g_half_ops_ready = true;
  } else {
    MPI_Query_thread(&provided);
    if (!g_half_ops_ready) {
      return FailedPreconditionError(
          "MPI was initialized outside Tessera; create the "
          "Tessera MPI world first");
    }
  }
  if (provided < requested) {
    const int got = static_cast<int>(std::find(std::begin(kLevels), std::end(kLevels), provided) -
                                     std::begin(kLevels));
    return FailedPreconditionError(std::string("MPI provides thread level ") +
                                   (got < 4 ? kNames[got] : "?") + ", Tessera asked for " +
                                   kNames[static_cast<int>(level)]);
  }
  return Status::Ok();
}

MPI_Datatype MpiType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kF64:
      return MPI_DOUBLE;
    case DType::kF16:
    case DType::kBF16:
    case DType::kU16:
      return MPI_UINT16_T;
    case DType::kI8:
      return MPI_INT8_T;
    case DType::kU8:
    case DType::kBool:
      return MPI_UINT8_T;
    case DType::kI16:
      return MPI_INT16_T;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kU32:
      return MPI_UINT32_T;
    case DType::kI64:
      return MPI_INT64_T;
    case DType::kU64:
      return MPI_UINT64_T;
  }
  return MPI_BYTE;
}

// The MPI op computing `op` on `dtype` (avg is a sum, divided afterwards).
MPI_Op MpiOp(DType dtype, ReduceOp op) {
  const int which = op == ReduceOp::kMax ? 1 : op == ReduceOp::kMin ? 2 : 0;
  if (dtype == DType::kF16) return g_half_ops[0][which];
  if (dtype == DType::kBF16) return g_half_ops[1][which];
  if (dtype == DType::kBool) return which == 2 ? MPI_LAND : MPI_LOR;
  return which == 1 ? MPI_MAX : which == 2 ? MPI_MIN : MPI_SUM;
}

// Shared by a world communicator and everything split from it: the
// watchdog over calls in flight.
class MpiWorld {
 public:
  // A blocking point-to-point call in progress (collectives use the
  // communicator's CollectiveSlot below).
  struct InFlight {
    Clock::time_point start;
    const void* comm;
    std::string (*where)(const void* comm);
    const char* what;  // owned by the caller
    InFlight* prev = nullptr;
    InFlight* next = nullptr;
  };

  // A communicator's collective in flight. MPI orders the collectives of a
  // communicator, so each has at most one: the calling thread only flips
  // `seq` (odd while running; two atomic stores per call, no lock, no
  // clock read) and the watchdog notes when it first saw each odd value.
  struct CollectiveSlot {
    std::atomic<uint64_t> seq{0};
    CollectiveArgs args;  // written before seq turns odd
    const void* comm = nullptr;
    std::string (*where)(const void* comm) = nullptr;
    uint64_t seen = 0;  // watchdog only
    Clock::time_point seen_at;
    CollectiveSlot* prev = nullptr;
    CollectiveSlot* next = nullptr;
  };
  void Register(CollectiveSlot* s) { Link(slots_, s); }
  void Unregister(CollectiveSlot* s) { Unlink(slots_, s); }

  explicit MpiWorld(CommOptions options) : options_(std::move(options)) {
    watchdog_ = std::thread([this] { Watch(); });
  }
  ~MpiWorld() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
  }
  const CommOptions& options() const { return options_; }

  void Begin(InFlight* f) { Link(head_, f); }
  void End(InFlight* f) { Unlink(head_, f); }

 private:
  void Watch() {
    const auto period = std::clamp(options_.timeout / 8, std::chrono::milliseconds(10),
                                   std::chrono::milliseconds(500));
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, period);
      const auto now = Clock::now();
      for (const InFlight* p = head_; p != nullptr; p = p->next) {
        if (now - p->start >= options_.timeout) Fire(lock, p->where(p->comm), p->what);
      }
      for (CollectiveSlot* c = slots_; c != nullptr; c = c->next) {
        const uint64_t seq = c->seq.load(std::memory_order_acquire);
        if ((seq & 1) == 0) continue;
        if (seq != c->seen) {  // a new call: its clock starts now (within a period)
          c->seen = seq;
          c->seen_at = now;
          continue;
        }
        if (now - c->seen_at < options_.timeout) continue;
        const std::string what = DescribeArgs(c->args);
        if (c->seq.load(std::memory_order_acquire) != seq) continue;  // just finished
        Fire(lock, c->where(c->comm), what);
      }
    }
  }

  // Intrusive doubly linked lists under mu_: registering allocates nothing.
  template <typename Node>
  void Link(Node*& head, Node* n) {
    std::lock_guard<std::mutex> lock(mu_);
    n->prev = nullptr;
    n->next = head;
    if (head != nullptr) head->prev = n;
    head = n;
  }
  template <typename Node>
  void Unlink(Node*& head, Node* n) {
    std::lock_guard<std::mutex> lock(mu_);
    if (n->prev != nullptr) n->prev->next = n->next;
    if (n->next != nullptr) n->next->prev = n->prev;
    if (head == n) head = n->next;
  }

  [[noreturn]] void Fire(std::unique_lock<std::mutex>& lock, const std::string& where,
                         const std::string& what) {
    Status s = DeadlineExceededError(where + ": " + what + " did not complete within " +
                                     FormatDuration(options_.timeout) +
                                     "; a peer died, is stuck, or called a different collective");
    lock.unlock();
    if (options_.on_timeout) options_.on_timeout(s);
    MPI_Abort(MPI_COMM_WORLD, 70);
    std::abort();  // MPI_Abort does not return; be sure
  }

  CommOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  InFlight* head_ = nullptr;
  CollectiveSlot* slots_ = nullptr;
  bool stop_ = false;
  std::thread watchdog_;
};

// Registers a blocking point-to-point call with the watchdog for its
// duration.
class Watched {
 public:
  template <typename Comm>
  Watched(MpiWorld& world, const Comm* comm, const std::string& what)
      : world_(world),
        f_{Clock::now(), comm, [](const void* c) { return static_cast<const Comm*>(c)->Where(); },
           what.c_str()} {
    world_.Begin(&f_);
  }
  ~Watched() { world_.End(&f_); }
  Watched(const Watched&) = delete;
  Watched& operator=(const Watched&) = delete;

 private:
  MpiWorld& world_;
  MpiWorld::InFlight f_;
};

// Marks a collective in flight on the communicator's slot for its duration.
class CollectiveWatch {
 public:
  CollectiveWatch(MpiWorld::CollectiveSlot& slot, const CollectiveArgs& args) : slot_(slot) {
    slot_.args = args;
    slot_.seq.store(slot_.seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }
  ~CollectiveWatch() {
    slot_.seq.store(slot_.seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }
  CollectiveWatch(const CollectiveWatch&) = delete;
  CollectiveWatch& operator=(const CollectiveWatch&) = delete;

 private:
  MpiWorld::CollectiveSlot& slot_;
};

std::vector<int> ToInts(std::span<const int64_t> v) { return {v.begin(), v.end()}; }
std::vector<int> Displacements(std::span<const int64_t> counts) {
  std::vector<int> d(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + static_cast<int>(counts[i - 1]);
  return d;
}

class MpiRequest;

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(std::shared_ptr<MpiWorld> world, MPI_Comm comm, std::string name)
      : world_(std::move(world)), comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    set_name(std::move(name));
    slot_.comm = this;
    slot_.where = [](const void* c) { return static_cast<const MpiCommunicator*>(c)->Where(); };
    world_->Register(&slot_);
  }
  ~MpiCommunicator() override {
    world_->Unregister(&slot_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "mpi"; }

  Status Barrier() override {
    const CollectiveArgs args{CollectiveKind::kBarrier};
    RETURN_IF_ERROR(Check(args));
    CollectiveWatch w(slot_, args);
    return Ok(MPI_Barrier(comm_), args);
  }

  Status Broadcast(void* buf, int64_t count, DType dtype, int root) override {
    const CollectiveArgs args{CollectiveKind::kBroadcast, count, dtype, ReduceOp::kSum, root};
    RETURN_IF_ERROR(Check(args));
    CollectiveWatch w(slot_, args);
    return Chunked(
        count,
        [&](int64_t off, int n) {
          return MPI_Bcast(static_cast<char*>(buf) + off * DTypeSize(dtype), n, MpiType(dtype),
                           root, comm_);
        },
        args);
  }

  Status AllReduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    RETURN_IF_ERROR(CheckReduction(dtype, op));
    const CollectiveArgs args{CollectiveKind::kAllReduce, count, dtype, op};
    RETURN_IF_ERROR(Check(args));
    if (FoldInRankOrder(dtype)) {
      return DeterministicAllReduce(send, recv, count, dtype, op, args);
    }
    CollectiveWatch w(slot_, args);
    const int64_t esize = DTypeSize(dtype);
    RETURN_IF_ERROR(Chunked(
        count,
        [&](int64_t off, int n) {
          void* out = static_cast<char*>(recv) + off * esize;
          const void* in =
              send == recv ? MPI_IN_PLACE : static_cast<const char*>(send) + off * esize;
          return MPI_Allreduce(in, out, n, MpiType(dtype), MpiOp(dtype, op), comm_);
        },
        args));
    if (op == ReduceOp::kAvg) DivideInPlace(dtype, recv, count, size_);
    return Status::Ok();
  }

  Status AllGather(const void* send, int64_t count, void* recv, DType dtype) override {
    const CollectiveArgs args{CollectiveKind::kAllGather, count * size_, dtype};
    RETURN_IF_ERROR(CheckFits(count * size_, args));
    if (world_->options().check) {
      RETURN_IF_ERROR(
          Check(VArgs(CollectiveKind::kAllGather, std::vector<int64_t>(size_, count), dtype)));
    }
    CollectiveWatch w(slot_, args);
    return Ok(MPI_Allgather(send, static_cast<int>(count), MpiType(dtype), recv,
                            static_cast<int>(count), MpiType(dtype), comm_),
              args);
  }

  Status AllGatherV(const void* send, int64_t count, void* recv, std::span<const int64_t> counts,
                    DType dtype) override {
    RETURN_IF_ERROR(CheckCounts("allgather", counts, size_, rank_, count));
    const CollectiveArgs args = VArgs(CollectiveKind::kAllGather, counts, dtype);
    RETURN_IF_ERROR(CheckFits(args.count, args));
    RETURN_IF_ERROR(Check(args));
    CollectiveWatch w(slot_, args);
    const auto c = ToInts(counts), d = Displacements(counts);
    return Ok(MPI_Allgatherv(send, static_cast<int>(count), MpiType(dtype), recv, c.data(),
                             d.data(), MpiType(dtype), comm_),
              args);
  }

  Status ReduceScatter(const void* send, void* recv, int64_t recv_count, DType dtype,
                       ReduceOp op) override {
    RETURN_IF_ERROR(CheckReduction(dtype, op));
    const CollectiveArgs args{CollectiveKind::kReduceScatter, recv_count, dtype, op};
    RETURN_IF_ERROR(CheckFits(recv_count * size_, args));
    RETURN_IF_ERROR(Check(args));
    CollectiveWatch w(slot_, args);
    if (FoldInRankOrder(dtype) || size_ <= world_->options().fold_reduce_scatter_ranks) {
      // Every rank's block r lands here; fold them in rank order.
      std::vector<char> blocks(recv_count * size_ * DTypeSize(dtype));
      RETURN_IF_ERROR(
          Ok(MPI_Alltoall(send, static_cast<int>(recv_count), MpiType(dtype), blocks.data(),
                          static_cast<int>(recv_count), MpiType(dtype), comm_),
             args));
      FoldBlocks(blocks.data(), size_, recv_count, dtype, op, recv);
      return Status::Ok();
    }
    RETURN_IF_ERROR(Ok(MPI_Reduce_scatter_block(send, recv, static_cast<int>(recv_count),
                                                MpiType(dtype), MpiOp(dtype, op), comm_),
                       args));
    if (op == ReduceOp::kAvg) DivideInPlace(dtype, recv, recv_count, size_);
    return Status::Ok();
  }

  Status GatherV(const void* send, int64_t count, void* recv, std::span<const int64_t> counts,
                 DType dtype, int root) override {
    RETURN_IF_ERROR(CheckCounts("gather", counts, size_, rank_, count));
    const CollectiveArgs args = VArgs(CollectiveKind::kGather, counts, dtype, root);
    RETURN_IF_ERROR(CheckFits(args.count, args));
    RETURN_IF_ERROR(CheckRoot(root, args));
    RETURN_IF_ERROR(Check(args));
    CollectiveWatch w(slot_, args);
    const auto c = ToInts(counts), d = Displacements(counts);
    return Ok(MPI_Gatherv(send, static_cast<int>(count), MpiType(dtype), recv, c.data(), d.data(),
                          MpiType(dtype), root, comm_),
              args);
  }

  Status ScatterV(const void* send, std::span<const int64_t> counts, void* recv, int64_t count,
                  DType dtype, int root) override {
    RETURN_IF_ERROR(CheckCounts("scatter", counts, size_, rank_, count));
    const CollectiveArgs args = VArgs(CollectiveKind::kScatter, counts, dtype, root);
    RETURN_IF_ERROR(CheckFits(args.count, args));
    RETURN_IF_ERROR(CheckRoot(root, args));
    RETURN_IF_ERROR(Check(args));
    CollectiveWatch w(slot_, args);
    const auto c = ToInts(counts), d = Displacements(counts);
    return Ok(MPI_Scatterv(send, c.data(), d.data(), MpiType(dtype), recv, static_cast<int>(count),
                           MpiType(dtype), root, comm_),
              args);
  }

  Status AllToAllV(const void* send, std::span<const int64_t> send_counts, void* recv,
                   std::span<const int64_t> recv_counts, DType dtype) override {
    RETURN_IF_ERROR(CheckCounts("alltoall", send_counts, size_, -1, 0));
    RETURN_IF_ERROR(CheckCounts("alltoall", recv_counts, size_, -1, 0));
    const CollectiveArgs args{CollectiveKind::kAllToAll, 0, dtype};
    const int64_t total_send = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
    const int64_t total_recv = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
    RETURN_IF_ERROR(CheckFits(std::max(total_send, total_recv), args));
    RETURN_IF_ERROR(Check(args));
    if (world_->options().check) RETURN_IF_ERROR(CheckAllToAll(send_counts, recv_counts));
    CollectiveWatch w(slot_, args);
    const auto sc = ToInts(send_counts), sd = Displacements(send_counts);
    const auto rc = ToInts(recv_counts), rd = Displacements(recv_counts);
    return Ok(MPI_Alltoallv(send, sc.data(), sd.data(), MpiType(dtype), recv, rc.data(), rd.data(),
                            MpiType(dtype), comm_),
              args);
  }

  Status Send(const void* buf, int64_t count, DType dtype, int peer, int tag) override {
    RETURN_IF_ERROR(CheckPeer(count, peer, tag));
    const std::string what = P2PWhat("send to", count, dtype, peer, tag);
    Watched w(*world_, this, what);
    return P2POk(MPI_Send(buf, static_cast<int>(count), MpiType(dtype), peer, tag, comm_), what);
  }

  Status Recv(void* buf, int64_t count, DType dtype, int peer, int tag) override {
    RETURN_IF_ERROR(CheckPeer(count, peer, tag));
    const std::string what = P2PWhat("receive from", count, dtype, peer, tag);
    MPI_Status st;
    Watched w(*world_, this, what);
    const int rc = MPI_Recv(buf, static_cast<int>(count), MpiType(dtype), peer, tag, comm_, &st);
    return CheckReceived(rc, st, count, dtype, what);
  }

  Result<Request> ISend(const void* buf, int64_t count, DType dtype, int peer, int tag) override;
  Result<Request> IRecv(void* buf, int64_t count, DType dtype, int peer, int tag) override;

  // MPI's non-blocking collectives. The deterministic allreduce takes two
  // collectives in turn (an alltoall, the fold, an allgather), which one
  // MPI request cannot: it runs on the default lane (a thread and a
  // duplicate communicator, communicator.h), as does a call of more than
  // 2^31-1 elements.
  Result<Request> IAllReduce(const void* send, void* recv, int64_t count, DType dtype,
                             ReduceOp op) override;
  Result<Request> IReduceScatter(const void* send, void* recv, int64_t recv_count, DType dtype,
                                 ReduceOp op) override;
  Result<Request> IAllGather(const void* send, int64_t count, void* recv, DType dtype) override;
  Result<Request> IAllToAll(const void* send, void* recv, int64_t count, DType dtype) override;

  Result<std::unique_ptr<Communicator>> Split(int color, int key) override {
    const CollectiveArgs args{CollectiveKind::kSplit};
    RETURN_IF_ERROR(Check(args));
    MPI_Comm out = MPI_COMM_NULL;
    {
      CollectiveWatch w(slot_, args);
      RETURN_IF_ERROR(
          Ok(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &out), args));
    }
    if (out == MPI_COMM_NULL) return std::unique_ptr<Communicator>();
    return std::unique_ptr<Communicator>(
        std::make_unique<MpiCommunicator>(world_, out, name_ + "/" + std::to_string(color)));
  }

  // Used by requests.
  MpiWorld& world() { return *world_; }
  std::string Where() const {
    std::string s = "rank " + std::to_string(rank_) + " of '" + name_ + "' (mpi, " +
                    std::to_string(size_) + " ranks";
    if (name_ != "world") s += ", world rank " + std::to_string(world_rank_);
    return s + ")";
  }

  Status Ok(int rc, const CollectiveArgs& args) const {
    if (rc == MPI_SUCCESS) return Status::Ok();
    return IOError(Where() + ": " + DescribeArgs(args) + ": " + ErrorString(rc));
  }
  Status P2POk(int rc, const std::string& what) const {
    if (rc == MPI_SUCCESS) return Status::Ok();
    int cls = 0;
    MPI_Error_class(rc, &cls);
    const std::string msg = Where() + ": " + what + ": " + ErrorString(rc);
    return cls == MPI_ERR_TRUNCATE ? InvalidArgumentError(msg + " (the sender sent more)")
                                   : IOError(msg);
  }
  Status CheckReceived(int rc, const MPI_Status& st, int64_t count, DType dtype,
                       const std::string& what) {
    if (rc != MPI_SUCCESS) return P2POk(rc, what);
    int got = 0;
    MPI_Get_count(&st, MpiType(dtype), &got);
    if (got != count) {
      return InvalidArgumentError(Where() + ": " + what + ": rank " +
                                  std::to_string(st.MPI_SOURCE) + " sent " + std::to_string(got) +
                                  " elements");
    }
    return Status::Ok();
  }

 private:
  static std::string P2PWhat(const char* verb, int64_t count, DType dtype, int peer, int tag) {
    return std::string(verb) + " rank " + std::to_string(peer) + " of " + std::to_string(count) +
           " " + std::string(DTypeName(dtype)) + " (tag " + std::to_string(tag) + ")";
  }

  static std::string ErrorString(int rc) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    return std::string(text, len);
  }

  // MPI counts are int: a larger vector goes in chunks where the collective
  // allows it, else is refused.
  template <typename Fn>
  Status Chunked(int64_t count, Fn fn, const CollectiveArgs& args) const {
    constexpr int64_t kMax = INT_MAX / 2;
    int64_t off = 0;
    do {
      const int64_t n = std::min(kMax, count - off);
      RETURN_IF_ERROR(Ok(fn(off, static_cast<int>(n)), args));
      off += n;
    } while (off < count);
    return Status::Ok();
  }
  Status CheckFits(int64_t count, const CollectiveArgs& args) const {
    if (count <= INT_MAX) return Status::Ok();
    return InvalidArgumentError(Where() + ": " + DescribeArgs(args) +
                                ": more than 2^31-1 elements in one call; split it");
  }
  Status CheckRoot(int root, const CollectiveArgs& args) const {
    if (root >= 0 && root < size_) return Status::Ok();
    return InvalidArgumentError(Where() + ": " + DescribeArgs(args) + ": root " +
                                std::to_string(root) + " is not a rank");
  }
  Status CheckPeer(int64_t count, int peer, int tag) const {
    if (peer < 0 || peer >= size_ || peer == rank_) {
      return InvalidArgumentError(Where() + ": peer " + std::to_string(peer) +
                                  " is not another rank of the communicator");
    }
    if (tag < 0) return InvalidArgumentError(Where() + ": negative tag");
    if (count > INT_MAX) return InvalidArgumentError(Where() + ": message over 2^31-1 elements");
    return Status::Ok();
  }

  // With CommOptions::check: every rank shares its arguments first.
  Status Check(const CollectiveArgs& args) {
    RETURN_IF_ERROR(CheckCount(args, name_));
    if (!world_->options().check) return Status::Ok();
    int64_t mine[6] = {
        static_cast<int64_t>(args.kind), args.count, static_cast<int64_t>(args.dtype),
        static_cast<int64_t>(args.op),   args.root,  static_cast<int64_t>(args.counts_hash)};
    std::vector<int64_t> all(6 * size_);
    {
      const CollectiveArgs check_args{CollectiveKind::kAllGather, 6, DType::kI64};
      CollectiveWatch w(slot_, args);
      RETURN_IF_ERROR(
          Ok(MPI_Allgather(mine, 6, MPI_INT64_T, all.data(), 6, MPI_INT64_T, comm_), check_args));
    }
    std::vector<CollectiveArgs> by_rank(size_);
    for (int r = 0; r < size_; ++r) {
      const int64_t* a = &all[6 * r];
      by_rank[r] = {static_cast<CollectiveKind>(a[0]),
                    a[1],
                    static_cast<DType>(a[2]),
                    static_cast<ReduceOp>(a[3]),
                    static_cast<int>(a[4]),
                    static_cast<uint64_t>(a[5])};
    }
    Status s = CheckAgreement(by_rank, name_);
    return s.ok() ? s : s.Annotate(Where());
  }

  // With CommOptions::check: what each rank sends j matches what j expects.
  Status CheckAllToAll(std::span<const int64_t> send_counts, std::span<const int64_t> recv_counts) {
    std::vector<int64_t> expect(size_);
    const CollectiveArgs args{CollectiveKind::kAllToAll, 1, DType::kI64};
    RETURN_IF_ERROR(
        Ok(MPI_Alltoall(send_counts.data(), 1, MPI_INT64_T, expect.data(), 1, MPI_INT64_T, comm_),
           args));
    int bad = -1;  // a sender whose count differs from ours
    for (int i = 0; i < size_; ++i) {
      if (expect[i] != recv_counts[i]) bad = i;
    }
    int any = bad >= 0 ? 1 : 0, any_all = 0;
    RETURN_IF_ERROR(Ok(MPI_Allreduce(&any, &any_all, 1, MPI_INT, MPI_MAX, comm_), args));
    if (!any_all) return Status::Ok();
    if (bad < 0) {
      return InvalidArgumentError(Where() + ": alltoall: per-rank counts disagree on another rank");
    }
    return InvalidArgumentError(Where() + ": alltoall: rank " + std::to_string(bad) + " sends " +
                                std::to_string(expect[bad]) + " elements to rank " +
                                std::to_string(rank_) + " but rank " + std::to_string(rank_) +
                                " expects " + std::to_string(recv_counts[bad]));
  }

  // CommOptions::deterministic: floating-point reductions take the
  // in-process order (integers are exact in any order).
  bool FoldInRankOrder(DType dtype) const {
    return world_->options().deterministic && IsFloatingPoint(dtype) && size_ > 1;
  }

  // The in-process algorithm over MPI: rank r folds chunk r of every rank
  // in rank order (alltoall), then everyone gathers the chunks.
  Status DeterministicAllReduce(const void* send, void* recv, int64_t count, DType dtype,
                                ReduceOp op, const CollectiveArgs& args) {
    RETURN_IF_ERROR(CheckFits(count, args));
    CollectiveWatch w(slot_, args);
    const int64_t esize = DTypeSize(dtype);
    const std::vector<int64_t> chunk = RankChunks(count, size_);
    const std::vector<int64_t> from_each(size_, chunk[rank_]);
    std::vector<char> blocks(chunk[rank_] * size_ * esize);
    const auto sc = ToInts(chunk), sd = Displacements(chunk);
    const auto rc = ToInts(from_each), rd = Displacements(from_each);
    RETURN_IF_ERROR(Ok(MPI_Alltoallv(send, sc.data(), sd.data(), MpiType(dtype), blocks.data(),
                                     rc.data(), rd.data(), MpiType(dtype), comm_),
                       args));
    FoldBlocks(blocks.data(), size_, chunk[rank_], dtype, op,
               static_cast<char*>(recv) + sd[rank_] * esize);
    return Ok(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, sc.data(), sd.data(),
                             MpiType(dtype), comm_),
              args);
  }

  std::shared_ptr<MpiWorld> world_;
  MpiWorld::CollectiveSlot slot_;
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1, world_rank_ = 0;
};

class MpiRequest : public Request::Impl {
 public:
  MpiRequest(MpiCommunicator* comm, MPI_Request req, std::string what, int64_t count, DType dtype,
             bool is_recv)
      : comm_(comm),
        req_(req),
        what_(std::move(what)),
        count_(count),
        dtype_(dtype),
        is_recv_(is_recv) {}
  ~MpiRequest() override {
    if (req_ != MPI_REQUEST_NULL) {  // never waited: do not leave MPI writing into freed memory
      MPI_Cancel(&req_);
      MPI_Request_free(&req_);
    }
  }
  Status Wait() override {
    MPI_Status st;
    int rc;
    {
      Watched w(comm_->world(), comm_, what_);
      rc = MPI_Wait(&req_, &st);
    }
    return is_recv_ ? comm_->CheckReceived(rc, st, count_, dtype_, what_) : comm_->P2POk(rc, what_);
  }

 private:
  MpiCommunicator* comm_;
  MPI_Request req_;
  std::string what_;
  int64_t count_;
  DType dtype_;
  bool is_recv_;
};

// A non-blocking collective: MPI's request and what remains to do once it
// completes (the fold of a reduce-scatter's blocks, an average's division).
class MpiCollectiveRequest : public Request::Impl {
 public:
  MpiCollectiveRequest(MpiCommunicator* comm, MPI_Request req, CollectiveArgs args,
                       std::vector<char> scratch, std::function<void(std::vector<char>&)> finish)
      : comm_(comm),
        req_(req),
        args_(args),
        scratch_(std::move(scratch)),
        finish_(std::move(finish)) {}
  // MPI cannot cancel a collective: one never waited for is completed here,
  // so MPI does not write into freed memory.
  ~MpiCollectiveRequest() override {
    if (req_ != MPI_REQUEST_NULL) MPI_Wait(&req_, MPI_STATUS_IGNORE);
  }
  // Polls with short sleeps rather than MPI_Wait, which spins: the waiting
  // thread (a copy whose collective is in flight) leaves the core to the
  // compute it overlaps, and still drives MPI's progress every poll.
  Status Wait() override {
    int rc, done = 0;
    {
      Watched w(comm_->world(), comm_, DescribeArgs(args_) + " (non-blocking)");
      while ((rc = MPI_Test(&req_, &done, MPI_STATUS_IGNORE)) == MPI_SUCCESS && !done) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
    RETURN_IF_ERROR(comm_->Ok(rc, args_));
    if (finish_) finish_(scratch_);
    return Status::Ok();
  }

 private:
  MpiCommunicator* comm_;
  MPI_Request req_;
  CollectiveArgs args_;
  std::vector<char> scratch_;
  std::function<void(std::vector<char>&)> finish_;
};

Result<Request> MpiCommunicator::IAllReduce(const void* send, void* recv, int64_t count,
                                            DType dtype, ReduceOp op) {
  if (FoldInRankOrder(dtype) || count > INT_MAX) {
    return Communicator::IAllReduce(send, recv, count, dtype, op);
  }
  RETURN_IF_ERROR(CheckReduction(dtype, op));
  const CollectiveArgs args{CollectiveKind::kAllReduce, count, dtype, op};
  RETURN_IF_ERROR(Check(args));
  MPI_Request req;
  RETURN_IF_ERROR(
      Ok(MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(count),
                        MpiType(dtype), MpiOp(dtype, op), comm_, &req),
         args));
  std::function<void(std::vector<char>&)> finish;
  if (op == ReduceOp::kAvg) {
    const int n = size_;
    finish = [=](std::vector<char>&) { DivideInPlace(dtype, recv, count, n); };
  }
  return Request(std::make_unique<MpiCollectiveRequest>(this, req, args, std::vector<char>(),
                                                        std::move(finish)));
}

Result<Request> MpiCommunicator::IReduceScatter(const void* send, void* recv, int64_t recv_count,
                                                DType dtype, ReduceOp op) {
  if (recv_count * size_ > INT_MAX) {
    return Communicator::IReduceScatter(send, recv, recv_count, dtype, op);
  }
  RETURN_IF_ERROR(CheckReduction(dtype, op));
  const CollectiveArgs args{CollectiveKind::kReduceScatter, recv_count, dtype, op};
  RETURN_IF_ERROR(Check(args));
  MPI_Request req;
  const int n = size_;
  if (FoldInRankOrder(dtype) || size_ <= world_->options().fold_reduce_scatter_ranks) {
    // As the blocking call: every rank's block r lands here, folded in rank
    // order once it has.
    std::vector<char> blocks(recv_count * size_ * DTypeSize(dtype));
    RETURN_IF_ERROR(
        Ok(MPI_Ialltoall(send, static_cast<int>(recv_count), MpiType(dtype), blocks.data(),
                         static_cast<int>(recv_count), MpiType(dtype), comm_, &req),
           args));
    return Request(std::make_unique<MpiCollectiveRequest>(
        this, req, args, std::move(blocks),
        [=](std::vector<char>& b) { FoldBlocks(b.data(), n, recv_count, dtype, op, recv); }));
  }
  RETURN_IF_ERROR(Ok(MPI_Ireduce_scatter_block(send, recv, static_cast<int>(recv_count),
                                               MpiType(dtype), MpiOp(dtype, op), comm_, &req),
                     args));
  std::function<void(std::vector<char>&)> finish;
  if (op == ReduceOp::kAvg) {
    finish = [=](std::vector<char>&) { DivideInPlace(dtype, recv, recv_count, n); };
  }
  return Request(std::make_unique<MpiCollectiveRequest>(this, req, args, std::vector<char>(),
                                                        std::move(finish)));
}

Result<Request> MpiCommunicator::IAllGather(const void* send, int64_t count, void* recv,
                                            DType dtype) {
  if (count * size_ > INT_MAX) return Communicator::IAllGather(send, count, recv, dtype);
  const CollectiveArgs args{CollectiveKind::kAllGather, count * size_, dtype};
  if (world_->options().check) {
    RETURN_IF_ERROR(
        Check(VArgs(CollectiveKind::kAllGather, std::vector<int64_t>(size_, count), dtype)));
  }
  MPI_Request req;
  RETURN_IF_ERROR(Ok(MPI_Iallgather(send, static_cast<int>(count), MpiType(dtype), recv,
                                    static_cast<int>(count), MpiType(dtype), comm_, &req),
                     args));
  return Request(
      std::make_unique<MpiCollectiveRequest>(this, req, args, std::vector<char>(), nullptr));
}

Result<Request> MpiCommunicator::IAllToAll(const void* send, void* recv, int64_t count,
                                           DType dtype) {
  if (count * size_ > INT_MAX) return Communicator::IAllToAll(send, recv, count, dtype);
  const CollectiveArgs args{CollectiveKind::kAllToAll, 0, dtype};
  RETURN_IF_ERROR(Check(args));
  MPI_Request req;
  RETURN_IF_ERROR(Ok(MPI_Ialltoall(send, static_cast<int>(count), MpiType(dtype), recv,
                                   static_cast<int>(count), MpiType(dtype), comm_, &req),
                     args));
  return Request(
      std::make_unique<MpiCollectiveRequest>(this, req, args, std::vector<char>(), nullptr));
}

Result<Request> MpiCommunicator::ISend(const void* buf, int64_t count, DType dtype, int peer,
                                       int tag) {
  RETURN_IF_ERROR(CheckPeer(count, peer, tag));
  std::string what = P2PWhat("send to", count, dtype, peer, tag);
  MPI_Request req;
  RETURN_IF_ERROR(
      P2POk(MPI_Isend(buf, static_cast<int>(count), MpiType(dtype), peer, tag, comm_, &req), what));
  return Request(std::make_unique<MpiRequest>(this, req, std::move(what), count, dtype, false));
}

Result<Request> MpiCommunicator::IRecv(void* buf, int64_t count, DType dtype, int peer, int tag) {
  RETURN_IF_ERROR(CheckPeer(count, peer, tag));
  std::string what = P2PWhat("receive from", count, dtype, peer, tag);
  MPI_Request req;
  RETURN_IF_ERROR(
      P2POk(MPI_Irecv(buf, static_cast<int>(count), MpiType(dtype), peer, tag, comm_, &req), what));
  return Request(std::make_unique<MpiRequest>(this, req, std::move(what), count, dtype, true));
}

}  // namespace

Result<std::unique_ptr<Communicator>> CreateMpiWorld(const CommOptions& options,
                                                     MpiThreadLevel level) {
  RETURN_IF_ERROR(InitMpi(level));
  MPI_Comm comm;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &comm) != MPI_SUCCESS) return IOError("MPI_Comm_dup failed");
  auto world = std::make_shared<MpiWorld>(options);
  return std::unique_ptr<Communicator>(std::make_unique<MpiCommunicator>(world, comm, "world"));
}

[[noreturn]] void AbortMpiJob(int code) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

bool LaunchedByMpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr ||
         std::getenv("PMI_RANK") != nullptr;
}

}  // namespace tessera
