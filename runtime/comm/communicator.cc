#include "runtime/comm/communicator.h"

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

}  // namespace tessera
