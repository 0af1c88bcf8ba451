// Communicator: the collectives and point-to-point messages every parallel
// strategy of the runtime is built from. Three backends implement it: Open
// MPI (mpi.h), in-process ranks as threads (inprocess.h) and NCCL on GPUs
// (nccl.h). Buffers are host memory except for NCCL, where they are device
// memory.
//
// Conventions, the same for every backend:
//  - Counts are in elements of `dtype`, never bytes.
//  - Every rank of the communicator must call a collective with matching
//    arguments (same op, count, dtype, root). A mismatch is reported as
//    InvalidArgument naming the ranks and their arguments (always in-process;
//    under MPI when CommOptions::check is set), otherwise it is caught by the
//    timeout. Collectives never hang forever: each takes at most
//    CommOptions::timeout, then fails (in-process, NCCL) or aborts the job
//    with the rank and collective named (MPI, which cannot cancel a
//    collective).
//  - The "V" variants pack the per-rank blocks contiguously in rank order;
//    `counts[r]` is the number of elements of rank r.
//  - send == recv is allowed where noted (in-place).
//  - Reductions: sum, max, min, avg over numeric dtypes. f16 and bf16 are
//    accumulated in f32 and rounded once. bool: sum and max are logical or,
//    min is logical and; avg is rejected. Integer avg truncates toward zero.
//    With the in-process backend, and with MPI and Gloo when
//    CommOptions::deterministic is set, each element is the left fold over
//    ranks in rank order (((x0 + x1) + x2) + ...), so the backends agree
//    bit for bit; otherwise MPI and Gloo use the library's algorithm
//    (faster, order not specified), except for ReduceScatter (see
//    fold_reduce_scatter_ranks; Gloo's always folds in rank order).
#ifndef TESSERA_RUNTIME_COMM_COMMUNICATOR_H_
#define TESSERA_RUNTIME_COMM_COMMUNICATOR_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "core/status.h"

namespace tessera {

enum class ReduceOp : uint8_t { kSum, kMax, kMin, kAvg };

std::string_view ReduceOpName(ReduceOp op);
Result<ReduceOp> ParseReduceOp(std::string_view name);

struct CommOptions {
  // The longest any collective or wait may take.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // MPI: verify before each collective that all ranks pass matching
  // arguments (one extra small allreduce). In-process always checks; NCCL
  // checks through its bootstrap communicator only at creation.
  bool check = false;
  // MPI and Gloo: reduce floating-point data in rank order (bitwise equal
  // to the in-process backend) instead of the library's own order.
  bool deterministic = false;
  // MPI: a ReduceScatter over at most this many ranks is an Alltoall and a
  // fold in rank order (the deterministic path) whatever `deterministic`
  // says; beyond it MPI's own MPI_Reduce_scatter_block. On this VM's Open
  // MPI 4.1 the library's took 2-3.5x as long on 2 and 4 ranks (512 KiB-2
  // MiB, BENCHMARKS.md "Collectives"); past a few ranks a rank's n - 1
  // messages would cost more latency than its log n steps. Every rank of
  // a job must pass the same value (as for `deterministic`): ranks that
  // disagree call different MPI collectives and wait for ever.
  int fold_reduce_scatter_ranks = 8;
  // MPI: called from the watchdog thread with the error just before the job
  // is aborted after a timeout (say, to print it). Must not call MPI.
  std::function<void(const Status&)> on_timeout;
};

// A pending non-blocking operation (a send, a receive or a collective).
// Move-only; Wait() once. Its buffers must stay alive and untouched until
// Wait returns.
class Request {
 public:
  class Impl {
   public:
    virtual ~Impl() = default;
    virtual Status Wait() = 0;
  };
  Request() = default;
  explicit Request(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

  bool pending() const { return impl_ != nullptr; }
  // Blocks until the operation completes (or fails or times out).
  Status Wait();

 private:
  std::unique_ptr<Impl> impl_;
};

// Waits for every request (all of them, even after a failure) and returns
// the first error.
Status WaitAll(std::span<Request> requests);

class AsyncLane;

class Communicator {
 public:
  Communicator();
  virtual ~Communicator();

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "mpi", "inprocess" or "nccl".
  virtual std::string_view backend() const = 0;
  // A label used in error messages ("world", "tp", "dp+tp", ...).
  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }

  virtual Status Barrier() = 0;
  virtual Status Broadcast(void* buf, int64_t count, DType dtype, int root) = 0;
  // In-place allowed.
  virtual Status AllReduce(const void* send, void* recv, int64_t count, DType dtype,
                           ReduceOp op) = 0;
  // recv holds size() * count elements, rank r's block at r * count.
  // (The uniform collectives default to their "V" forms; backends override
  // them where the library has a faster uniform call.)
  virtual Status AllGather(const void* send, int64_t count, void* recv, DType dtype);
  // count == counts[rank()].
  virtual Status AllGatherV(const void* send, int64_t count, void* recv,
                            std::span<const int64_t> counts, DType dtype) = 0;
  // send holds size() * recv_count elements; rank r receives the reduction
  // of block r.
  virtual Status ReduceScatter(const void* send, void* recv, int64_t recv_count, DType dtype,
                               ReduceOp op) = 0;
  // recv (at root only) holds size() * count elements.
  virtual Status Gather(const void* send, int64_t count, void* recv, DType dtype, int root);
  virtual Status GatherV(const void* send, int64_t count, void* recv,
                         std::span<const int64_t> counts, DType dtype, int root) = 0;
  // send (at root only) holds size() * count elements.
  virtual Status Scatter(const void* send, void* recv, int64_t count, DType dtype, int root);
  virtual Status ScatterV(const void* send, std::span<const int64_t> counts, void* recv,
                          int64_t count, DType dtype, int root) = 0;
  // send and recv hold size() * count elements; block j of send goes to
  // rank j, block i of recv came from rank i.
  virtual Status AllToAll(const void* send, void* recv, int64_t count, DType dtype);
  virtual Status AllToAllV(const void* send, std::span<const int64_t> send_counts, void* recv,
                           std::span<const int64_t> recv_counts, DType dtype) = 0;

  // Non-blocking collectives: the same arguments and results as the
  // blocking ones (CommOptions::deterministic keeps its rank-order fold),
  // completed by Request::Wait or WaitAll. Every rank issues its collectives
  // (blocking and non-blocking) on a communicator in the same order; several
  // may be in flight at once, from one thread or from threads taking turns.
  // By default a backend runs them one after another on a thread of its own
  // over a duplicate of this communicator (made by the first call, a
  // collective Split), so they progress while the caller computes: the
  // in-process and Gloo backends. MPI issues MPI's non-blocking collectives
  // (they progress inside MPI calls, and in the Wait), NCCL enqueues on its
  // stream.
  virtual Result<Request> IAllReduce(const void* send, void* recv, int64_t count, DType dtype,
                                     ReduceOp op);
  virtual Result<Request> IReduceScatter(const void* send, void* recv, int64_t recv_count,
                                         DType dtype, ReduceOp op);
  virtual Result<Request> IAllGather(const void* send, int64_t count, void* recv, DType dtype);
  virtual Result<Request> IAllToAll(const void* send, void* recv, int64_t count, DType dtype);

  // Tagged point-to-point (tag >= 0). Counts must match exactly. Send may
  // return before the receiver posted its receive, or may wait for it: code
  // that needs both directions at once uses ISend/IRecv.
  virtual Status Send(const void* buf, int64_t count, DType dtype, int peer, int tag) = 0;
  virtual Status Recv(void* buf, int64_t count, DType dtype, int peer, int tag) = 0;
  virtual Result<Request> ISend(const void* buf, int64_t count, DType dtype, int peer, int tag) = 0;
  virtual Result<Request> IRecv(void* buf, int64_t count, DType dtype, int peer, int tag) = 0;

  // Collective: ranks passing the same color form a new communicator,
  // ordered by (key, old rank). A negative color joins none: the result is
  // then nullptr.
  virtual Result<std::unique_ptr<Communicator>> Split(int color, int key) = 0;

 protected:
  std::string name_ = "world";

 private:
  // The default non-blocking collectives' thread and duplicate
  // communicator (it runs nothing on this one).
  Result<AsyncLane*> Lane();
  std::unique_ptr<AsyncLane> lane_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COMM_COMMUNICATOR_H_
