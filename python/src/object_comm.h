// A Communicator over any Python object with `barrier()` and
// `allgather_object(obj) -> list` (torch.distributed's group, mpi4py's
// comm through a two-line adapter, tessera.torch.TorchComm): what a trainer
// already has, so that save_shards needs no second network. Every
// collective is one all-gather of byte strings, which is enough for the
// few small messages a sliced save exchanges (the plan's records, the
// temporary's name, the commit's outcome); tensor data never goes through
// it. Point-to-point and Split are refused.
#ifndef TESSERA_PYTHON_OBJECT_COMM_H_
#define TESSERA_PYTHON_OBJECT_COMM_H_

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "runtime/comm/communicator.h"

namespace tessera::python {

class ObjectCommunicator final : public Communicator {
 public:
  // Collective (one all-gather): learns the world size and checks that
  // every process passed a distinct rank below it. Call with the GIL held.
  static Result<std::unique_ptr<ObjectCommunicator>> Create(pybind11::object comm, int rank);
  ~ObjectCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "python"; }

  // Every method takes the GIL itself: callers may have released it.
  Status Barrier() override;
  Status Broadcast(void* buf, int64_t count, DType dtype, int root) override;
  Status AllReduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override;
  Status AllGatherV(const void* send, int64_t count, void* recv, std::span<const int64_t> counts,
                    DType dtype) override;
  Status ReduceScatter(const void* send, void* recv, int64_t recv_count, DType dtype,
                       ReduceOp op) override;
  Status GatherV(const void* send, int64_t count, void* recv, std::span<const int64_t> counts,
                 DType dtype, int root) override;
  Status ScatterV(const void* send, std::span<const int64_t> counts, void* recv, int64_t count,
                  DType dtype, int root) override;
  Status AllToAllV(const void* send, std::span<const int64_t> send_counts, void* recv,
                   std::span<const int64_t> recv_counts, DType dtype) override;
  Status Send(const void* buf, int64_t count, DType dtype, int peer, int tag) override;
  Status Recv(void* buf, int64_t count, DType dtype, int peer, int tag) override;
  Result<Request> ISend(const void* buf, int64_t count, DType dtype, int peer, int tag) override;
  Result<Request> IRecv(void* buf, int64_t count, DType dtype, int peer, int tag) override;
  Result<std::unique_ptr<Communicator>> Split(int color, int key) override;

 private:
  ObjectCommunicator(pybind11::object comm, int rank, int size);
  // Every rank's `mine`, by rank.
  Result<std::vector<std::string>> Exchange(const void* mine, size_t bytes);

  pybind11::object comm_;
  int rank_, size_;
};

}  // namespace tessera::python

#endif  // TESSERA_PYTHON_OBJECT_COMM_H_
