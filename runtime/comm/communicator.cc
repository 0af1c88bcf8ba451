#include "runtime/comm/communicator.h"

#include <vector>

namespace tessera {

Status Request::Wait() {
  if (impl_ == nullptr) return FailedPreconditionError("wait on a request that is not pending");
  Status s = impl_->Wait();
  impl_.reset();
  return s;
}

Status WaitAll(std::span<Request> requests) {
  Status first;
  for (Request& r : requests) {
    if (!r.pending()) continue;
    Status s = r.Wait();
    if (first.ok() && !s.ok()) first = std::move(s);
  }
  return first;
}

Status Communicator::AllGather(const void* send, int64_t count, void* recv, DType dtype) {
  return AllGatherV(send, count, recv, std::vector<int64_t>(size(), count), dtype);
}

Status Communicator::Gather(const void* send, int64_t count, void* recv, DType dtype, int root) {
  return GatherV(send, count, recv, std::vector<int64_t>(size(), count), dtype, root);
}

Status Communicator::Scatter(const void* send, void* recv, int64_t count, DType dtype, int root) {
  return ScatterV(send, std::vector<int64_t>(size(), count), recv, count, dtype, root);
}

Status Communicator::AllToAll(const void* send, void* recv, int64_t count, DType dtype) {
  const std::vector<int64_t> counts(size(), count);
  return AllToAllV(send, counts, recv, counts, dtype);
}

}  // namespace tessera
