#include "runtime/comm/nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "runtime/comm/comm_util.h"
#include "runtime/comm/reduce.h"
#include "runtime/comm/rendezvous.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

Status CudaOk(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::Ok();
  return IOError(what + ": CUDA error: " + cudaGetErrorString(e));
}

Status NcclOk(ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess || r == ncclInProgress) return Status::Ok();
  return IOError(what + ": NCCL error: " + ncclGetErrorString(r));
}

// NCCL's type for `dtype`, or false when NCCL has none (i16/u16: moved as
// bytes, not reducible).
bool NcclType(DType dtype, ncclDataType_t* out) {
  switch (dtype) {
    case DType::kF32:
      *out = ncclFloat32;
      return true;
    case DType::kF64:
      *out = ncclFloat64;
      return true;
    case DType::kF16:
      *out = ncclFloat16;
      return true;
    case DType::kBF16:
      *out = ncclBfloat16;
      return true;
    case DType::kI8:
      *out = ncclInt8;
      return true;
    case DType::kU8:
    case DType::kBool:
      *out = ncclUint8;
      return true;
    case DType::kI32:
      *out = ncclInt32;
      return true;
    case DType::kU32:
      *out = ncclUint32;
      return true;
    case DType::kI64:
      *out = ncclInt64;
      return true;
    case DType::kU64:
      *out = ncclUint64;
      return true;
    case DType::kI16:
    case DType::kU16:
      return false;
  }
  return false;
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int device, int rank, int size, CommOptions options,
                   std::string name)
      : comm_(comm), device_(device), rank_(rank), size_(size), options_(std::move(options)) {
    set_name(std::move(name));
  }
  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (comm_ != nullptr) {
      if (aborted_) {
        ncclCommAbort(comm_);
      } else {
        ncclCommDestroy(comm_);
      }
    }
  }

  Status Init() {
    RETURN_IF_ERROR(CudaOk(cudaSetDevice(device_), Where()));
    RETURN_IF_ERROR(CudaOk(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), Where()));
    return CudaOk(cudaMalloc(&scratch_, 16), Where());
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "nccl"; }

  Status Barrier() override {
    const CollectiveArgs args{CollectiveKind::kBarrier};
    return Run(args, [&] {
      return ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_);
    });
  }

  Status Broadcast(void* buf, int64_t count, DType dtype, int root) override {
    const CollectiveArgs args{CollectiveKind::kBroadcast, count, dtype, ReduceOp::kSum, root};
    RETURN_IF_ERROR(CheckRoot(root, args));
    return Run(args, [&] {
      return ncclBroadcast(buf, buf, Bytes(count, dtype), ncclUint8, root, comm_, stream_);
    });
  }

  Status AllReduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    const CollectiveArgs args{CollectiveKind::kAllReduce, count, dtype, op};
    ncclDataType_t type;
    ncclRedOp_t nop;
    RETURN_IF_ERROR(Reduction(dtype, op, args, &type, &nop));
    return Run(args, [&] { return ncclAllReduce(send, recv, count, type, nop, comm_, stream_); });
  }

  Status AllGather(const void* send, int64_t count, void* recv, DType dtype) override {
    const CollectiveArgs args{CollectiveKind::kAllGather, count * size_, dtype};
    return Run(args, [&] {
      return ncclAllGather(send, recv, Bytes(count, dtype), ncclUint8, comm_, stream_);
    });
  }

  Status AllGatherV(const void* send, int64_t count, void* recv, std::span<const int64_t> counts,
                    DType dtype) override {
    RETURN_IF_ERROR(CheckCounts("allgather", counts, size_, rank_, count));
    const CollectiveArgs args = VArgs(CollectiveKind::kAllGather, counts, dtype);
    // Every rank sends its block to every rank.
    return Grouped(args, [&]() -> ncclResult_t {
      int64_t offset = 0;
      for (int peer = 0; peer < size_; ++peer) {
        ncclResult_t r = Exchange(send, count, At(recv, offset, dtype), counts[peer], dtype, peer);
        if (r != ncclSuccess) return r;
        offset += counts[peer];
      }
      return ncclSuccess;
    });
  }

  Status ReduceScatter(const void* send, void* recv, int64_t recv_count, DType dtype,
                       ReduceOp op) override {
    const CollectiveArgs args{CollectiveKind::kReduceScatter, recv_count, dtype, op};
    ncclDataType_t type;
    ncclRedOp_t nop;
    RETURN_IF_ERROR(Reduction(dtype, op, args, &type, &nop));
    return Run(
        args, [&] { return ncclReduceScatter(send, recv, recv_count, type, nop, comm_, stream_); });
  }

  Status GatherV(const void* send, int64_t count, void* recv, std::span<const int64_t> counts,
                 DType dtype, int root) override {
    RETURN_IF_ERROR(CheckCounts("gather", counts, size_, rank_, count));
    const CollectiveArgs args = VArgs(CollectiveKind::kGather, counts, dtype, root);
    RETURN_IF_ERROR(CheckRoot(root, args));
    return Grouped(args, [&]() -> ncclResult_t {
      if (rank_ != root)
        return ncclSend(send, Bytes(count, dtype), ncclUint8, root, comm_, stream_);
      int64_t offset = 0;
      for (int peer = 0; peer < size_; ++peer) {
        ncclResult_t r = Exchange(peer == root ? send : nullptr, peer == root ? count : 0,
                                  At(recv, offset, dtype), counts[peer], dtype, peer);
        if (r != ncclSuccess) return r;
        offset += counts[peer];
      }
      return ncclSuccess;
    });
  }

  Status ScatterV(const void* send, std::span<const int64_t> counts, void* recv, int64_t count,
                  DType dtype, int root) override {
    RETURN_IF_ERROR(CheckCounts("scatter", counts, size_, rank_, count));
    const CollectiveArgs args = VArgs(CollectiveKind::kScatter, counts, dtype, root);
    RETURN_IF_ERROR(CheckRoot(root, args));
    return Grouped(args, [&]() -> ncclResult_t {
      if (rank_ != root)
        return ncclRecv(recv, Bytes(count, dtype), ncclUint8, root, comm_, stream_);
      int64_t offset = 0;
      for (int peer = 0; peer < size_; ++peer) {
        ncclResult_t r =
            Exchange(At(send, offset, dtype), counts[peer], peer == root ? recv : nullptr,
                     peer == root ? count : 0, dtype, peer);
        if (r != ncclSuccess) return r;
        offset += counts[peer];
      }
      return ncclSuccess;
    });
  }

  Status AllToAllV(const void* send, std::span<const int64_t> send_counts, void* recv,
                   std::span<const int64_t> recv_counts, DType dtype) override {
    RETURN_IF_ERROR(CheckCounts("alltoall", send_counts, size_, -1, 0));
    RETURN_IF_ERROR(CheckCounts("alltoall", recv_counts, size_, -1, 0));
    const CollectiveArgs args{CollectiveKind::kAllToAll, 0, dtype};
    return Grouped(args, [&]() -> ncclResult_t {
      int64_t so = 0, ro = 0;
      for (int peer = 0; peer < size_; ++peer) {
        ncclResult_t r = Exchange(At(send, so, dtype), send_counts[peer], At(recv, ro, dtype),
                                  recv_counts[peer], dtype, peer);
        if (r != ncclSuccess) return r;
        so += send_counts[peer];
        ro += recv_counts[peer];
      }
      return ncclSuccess;
    });
  }

  Status Send(const void* buf, int64_t count, DType dtype, int peer, int tag) override {
    RETURN_IF_ERROR(CheckPeer(peer, tag));
    const CollectiveArgs args{CollectiveKind::kBroadcast, count, dtype, ReduceOp::kSum, peer};
    return Run(args,
               [&] { return ncclSend(buf, Bytes(count, dtype), ncclUint8, peer, comm_, stream_); });
  }
  Status Recv(void* buf, int64_t count, DType dtype, int peer, int tag) override {
    RETURN_IF_ERROR(CheckPeer(peer, tag));
    const CollectiveArgs args{CollectiveKind::kBroadcast, count, dtype, ReduceOp::kSum, peer};
    return Run(args,
               [&] { return ncclRecv(buf, Bytes(count, dtype), ncclUint8, peer, comm_, stream_); });
  }
  // Non-blocking collectives: enqueued on the stream (NCCL runs them while
  // the host goes on), waited for by their event.
  Result<Request> IAllReduce(const void* send, void* recv, int64_t count, DType dtype,
                             ReduceOp op) override {
    const CollectiveArgs args{CollectiveKind::kAllReduce, count, dtype, op};
    ncclDataType_t type;
    ncclRedOp_t nop;
    RETURN_IF_ERROR(Reduction(dtype, op, args, &type, &nop));
    return Async(args, [&] { return ncclAllReduce(send, recv, count, type, nop, comm_, stream_); });
  }
  Result<Request> IReduceScatter(const void* send, void* recv, int64_t recv_count, DType dtype,
                                 ReduceOp op) override {
    const CollectiveArgs args{CollectiveKind::kReduceScatter, recv_count, dtype, op};
    ncclDataType_t type;
    ncclRedOp_t nop;
    RETURN_IF_ERROR(Reduction(dtype, op, args, &type, &nop));
    return Async(
        args, [&] { return ncclReduceScatter(send, recv, recv_count, type, nop, comm_, stream_); });
  }
  Result<Request> IAllGather(const void* send, int64_t count, void* recv, DType dtype) override {
    const CollectiveArgs args{CollectiveKind::kAllGather, count * size_, dtype};
    return Async(args, [&] {
      return ncclAllGather(send, recv, Bytes(count, dtype), ncclUint8, comm_, stream_);
    });
  }
  Result<Request> IAllToAll(const void* send, void* recv, int64_t count, DType dtype) override {
    const CollectiveArgs args{CollectiveKind::kAllToAll, count * size_, dtype};
    return Async(args, [&]() -> ncclResult_t {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      ncclResult_t inner = ncclSuccess;
      for (int peer = 0; peer < size_ && inner == ncclSuccess; ++peer) {
        inner = Exchange(At(send, peer * count, dtype), count, At(recv, peer * count, dtype), count,
                         dtype, peer);
      }
      r = ncclGroupEnd();
      return inner != ncclSuccess ? inner : r;
    });
  }

  // NCCL point-to-point runs on the stream: the operation is complete when
  // this returns, and the request is already done.
  Result<Request> ISend(const void* buf, int64_t count, DType dtype, int peer, int tag) override {
    RETURN_IF_ERROR(Send(buf, count, dtype, peer, tag));
    return Request();
  }
  Result<Request> IRecv(void* buf, int64_t count, DType dtype, int peer, int tag) override {
    RETURN_IF_ERROR(Recv(buf, count, dtype, peer, tag));
    return Request();
  }

  Result<std::unique_ptr<Communicator>> Split(int color, int key) override {
    RETURN_IF_ERROR(CudaOk(cudaSetDevice(device_), Where()));
    ncclComm_t out = nullptr;
    RETURN_IF_ERROR(
        NcclOk(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &out, nullptr),
               Where() + ": split"));
    if (out == nullptr) return std::unique_ptr<Communicator>();
    int rank = 0, size = 0;
    RETURN_IF_ERROR(NcclOk(ncclCommUserRank(out, &rank), Where()));
    RETURN_IF_ERROR(NcclOk(ncclCommCount(out, &size), Where()));
    auto comm = std::make_unique<NcclCommunicator>(out, device_, rank, size, options_,
                                                   name_ + "/" + std::to_string(color));
    RETURN_IF_ERROR(comm->Init());
    return std::unique_ptr<Communicator>(std::move(comm));
  }

  std::string Where() const {
    return "rank " + std::to_string(rank_) + " of '" + name_ + "' (nccl, " + std::to_string(size_) +
           " ranks, device " + std::to_string(device_) + ")";
  }

 private:
  static size_t Bytes(int64_t count, DType dtype) {
    return static_cast<size_t>(count * DTypeSize(dtype));
  }
  static void* At(void* p, int64_t elems, DType dtype) {
    return p == nullptr ? nullptr : static_cast<char*>(p) + elems * DTypeSize(dtype);
  }
  static const void* At(const void* p, int64_t elems, DType dtype) {
    return static_cast<const char*>(p) + elems * DTypeSize(dtype);
  }

  // One send and one receive with `peer` inside a group (a copy on the
  // stream for this rank itself).
  ncclResult_t Exchange(const void* send, int64_t send_count, void* recv, int64_t recv_count,
                        DType dtype, int peer) {
    if (peer == rank_) {
      if (send_count > 0 && cudaMemcpyAsync(recv, send, Bytes(send_count, dtype),
                                            cudaMemcpyDeviceToDevice, stream_) != cudaSuccess) {
        return ncclUnhandledCudaError;
      }
      return ncclSuccess;
    }
    if (send_count > 0) {
      ncclResult_t r = ncclSend(send, Bytes(send_count, dtype), ncclUint8, peer, comm_, stream_);
      if (r != ncclSuccess) return r;
    }
    if (recv_count > 0)
      return ncclRecv(recv, Bytes(recv_count, dtype), ncclUint8, peer, comm_, stream_);
    return ncclSuccess;
  }

  Status Reduction(DType dtype, ReduceOp op, const CollectiveArgs& args, ncclDataType_t* type,
                   ncclRedOp_t* nop) const {
    RETURN_IF_ERROR(CheckReduction(dtype, op));
    if (!NcclType(dtype, type)) {
      return UnimplementedError(Where() + ": " + DescribeArgs(args) + ": NCCL cannot reduce " +
                                std::string(DTypeName(dtype)));
    }
    switch (op) {
      case ReduceOp::kSum:
        *nop = dtype == DType::kBool ? ncclMax : ncclSum;
        break;
      case ReduceOp::kMax:
        *nop = ncclMax;
        break;
      case ReduceOp::kMin:
        *nop = ncclMin;
        break;
      case ReduceOp::kAvg:
        *nop = ncclAvg;
        break;
    }
    return Status::Ok();
  }

  Status CheckRoot(int root, const CollectiveArgs& args) const {
    if (root >= 0 && root < size_) return Status::Ok();
    return InvalidArgumentError(Where() + ": " + DescribeArgs(args) + ": root " +
                                std::to_string(root) + " is not a rank");
  }
  Status CheckPeer(int peer, int tag) const {
    if (peer < 0 || peer >= size_ || peer == rank_ || tag < 0) {
      return InvalidArgumentError(Where() + ": peer " + std::to_string(peer) + " (tag " +
                                  std::to_string(tag) + ") is not another rank");
    }
    return Status::Ok();
  }

  template <typename Enqueue>
  Status Grouped(const CollectiveArgs& args, Enqueue enqueue) {
    return Run(args, [&]() -> ncclResult_t {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      ncclResult_t inner = enqueue();
      r = ncclGroupEnd();
      return inner != ncclSuccess ? inner : r;
    });
  }

  // Enqueues on the stream.
  template <typename Enqueue>
  Status Issue(const CollectiveArgs& args, Enqueue enqueue) {
    RETURN_IF_ERROR(CheckCount(args, name_));
    if (aborted_) return AbortedError(Where() + ": the communicator was aborted after an error");
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      return CudaOk(e, Where() + ": " + DescribeArgs(args));
    }
    if (ncclResult_t r = enqueue(); r != ncclSuccess && r != ncclInProgress) {
      return NcclOk(r, Where() + ": " + DescribeArgs(args));
    }
    return Status::Ok();
  }

  // Waits until `query` (cudaStreamQuery, cudaEventQuery) says done,
  // polling NCCL's async error and the deadline.
  template <typename Query>
  Status Poll(const CollectiveArgs& args, Query query) {
    // The message is built only on failure: this is the path of every call.
    auto what = [&] { return Where() + ": " + DescribeArgs(args); };
    const auto deadline = Clock::now() + options_.timeout;
    while (true) {
      const cudaError_t q = query();
      if (q == cudaSuccess) return Status::Ok();
      if (q != cudaErrorNotReady) return CudaOk(q, what());
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        aborted_ = true;
        return NcclOk(async, what() + " (a peer failed)");
      }
      if (Clock::now() >= deadline) {
        aborted_ = true;
        ncclCommAbort(comm_);
        comm_ = nullptr;
        return DeadlineExceededError(what() + " did not complete within " +
                                     FormatDuration(options_.timeout));
      }
      std::this_thread::yield();
    }
  }

  // Enqueues on the stream and waits for it.
  template <typename Enqueue>
  Status Run(const CollectiveArgs& args, Enqueue enqueue) {
    RETURN_IF_ERROR(Issue(args, enqueue));
    return Poll(args, [&] { return cudaStreamQuery(stream_); });
  }

  // A collective enqueued on the stream, complete when the event recorded
  // after it is.
  class NcclRequest : public Request::Impl {
   public:
    NcclRequest(NcclCommunicator* comm, CollectiveArgs args, cudaEvent_t event)
        : comm_(comm), args_(args), event_(event) {}
    ~NcclRequest() override {
      if (event_ == nullptr) return;
      cudaEventSynchronize(event_);  // never waited: the buffers are still written
      cudaEventDestroy(event_);
    }
    Status Wait() override {
      Status s = comm_->Poll(args_, [&] { return cudaEventQuery(event_); });
      cudaEventDestroy(event_);
      event_ = nullptr;
      return s;
    }

   private:
    NcclCommunicator* comm_;
    CollectiveArgs args_;
    cudaEvent_t event_;
  };

  template <typename Enqueue>
  Result<Request> Async(const CollectiveArgs& args, Enqueue enqueue) {
    RETURN_IF_ERROR(Issue(args, enqueue));
    cudaEvent_t event = nullptr;
    RETURN_IF_ERROR(CudaOk(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), Where()));
    if (cudaError_t e = cudaEventRecord(event, stream_); e != cudaSuccess) {
      cudaEventDestroy(event);
      return CudaOk(e, Where() + ": " + DescribeArgs(args));
    }
    return Request(std::make_unique<NcclRequest>(this, args, event));
  }

  ncclComm_t comm_;
  int device_, rank_, size_;
  CommOptions options_;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  bool aborted_ = false;
};

Result<std::unique_ptr<Communicator>> JoinNccl(const ncclUniqueId& id, int rank, int size,
                                               int device, const CommOptions& options,
                                               const std::string& name) {
  const std::string where =
      "rank " + std::to_string(rank) + " (nccl, device " + std::to_string(device) + ")";
  RETURN_IF_ERROR(CudaOk(cudaSetDevice(device), where));
  ncclComm_t comm = nullptr;
  RETURN_IF_ERROR(NcclOk(ncclCommInitRank(&comm, size, id, rank), where + ": ncclCommInitRank"));
  auto out = std::make_unique<NcclCommunicator>(comm, device, rank, size, options, name);
  RETURN_IF_ERROR(out->Init());
  return std::unique_ptr<Communicator>(std::move(out));
}

}  // namespace

Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator& bootstrap, int device,
                                                             const CommOptions& options) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (bootstrap.rank() == 0) {
    RETURN_IF_ERROR(NcclOk(ncclGetUniqueId(&id), "rank 0 (nccl): ncclGetUniqueId"));
  }
  RETURN_IF_ERROR(bootstrap.Broadcast(&id, sizeof(id), DType::kU8, 0));
  return JoinNccl(id, bootstrap.rank(), bootstrap.size(), device, options, bootstrap.name());
}

Result<std::unique_ptr<Communicator>> CreateNcclCommunicatorFromTable(const RankTable& table,
                                                                      int device,
                                                                      const CommOptions& options) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (table.rank == 0) {
    RETURN_IF_ERROR(NcclOk(ncclGetUniqueId(&id), "rank 0 (nccl): ncclGetUniqueId"));
  }
  const std::string mine =
      table.rank == 0 ? std::string(reinterpret_cast<const char*>(&id), sizeof(id)) : std::string();
  ASSIGN_OR_RETURN(std::vector<std::string> blobs,
                   RendezvousAllGather(table, mine, options.timeout));
  if (blobs[0].size() != sizeof(id)) {
    return DataLossError("rank " + std::to_string(table.rank) +
                         " (nccl): rendezvous gave a unique id of " +
                         std::to_string(blobs[0].size()) + " bytes");
  }
  std::memcpy(&id, blobs[0].data(), sizeof(id));
  return JoinNccl(id, table.rank, table.world_size, device, options, "world");
}

int CudaDeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

Result<DeviceBuffer> DeviceBuffer::Allocate(int64_t bytes) {
  DeviceBuffer b;
  RETURN_IF_ERROR(CudaOk(cudaMalloc(&b.ptr_, std::max<int64_t>(bytes, 1)),
                         "allocating " + std::to_string(bytes) + " bytes of device memory"));
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

Status DeviceBuffer::CopyFromHost(const void* src, int64_t bytes) {
  if (bytes > bytes_)
    return InvalidArgumentError("copy of " + std::to_string(bytes) +
                                " bytes into a device buffer of " + std::to_string(bytes_));
  if (bytes == 0) return Status::Ok();
  return CudaOk(cudaMemcpy(ptr_, src, bytes, cudaMemcpyHostToDevice), "copy to device");
}

Status DeviceBuffer::CopyToHost(void* dst, int64_t bytes) const {
  if (bytes > bytes_)
    return InvalidArgumentError("copy of " + std::to_string(bytes) +
                                " bytes out of a device buffer of " + std::to_string(bytes_));
  if (bytes == 0) return Status::Ok();
  return CudaOk(cudaMemcpy(dst, ptr_, bytes, cudaMemcpyDeviceToHost), "copy to host");
}

}  // namespace tessera
