// The NCCL backend (built with -DTESSERA_WITH_NCCL=ON; CUDA and NCCL from
// /usr/local/cuda). Buffers are device memory. Each communicator owns a
// CUDA stream; a call enqueues its NCCL kernels on that stream and returns
// when they have finished, so callers see the same blocking semantics as
// the other backends. A call that has not finished within
// CommOptions::timeout aborts the NCCL communicator (ncclCommAbort) and
// returns DeadlineExceeded naming the rank and collective; asynchronous
// NCCL errors (a peer that died) are returned the same way.
//
// Differences from the host backends, by NCCL's design: point-to-point
// messages between two ranks match in posting order (tags are checked to
// be non-negative but not used for matching); i16/u16 reductions are not
// supported; argument mismatches are caught by the timeout only.
#ifndef TESSERA_RUNTIME_COMM_NCCL_H_
#define TESSERA_RUNTIME_COMM_NCCL_H_

#include <cstdint>
#include <memory>

#include "runtime/comm/communicator.h"

namespace tessera {

// Collective over `bootstrap` (MPI, in-process, any backend): rank 0 creates
// NCCL's unique id and broadcasts it through `bootstrap`; every rank then
// binds CUDA device `device` and joins. The result has bootstrap's rank and
// size.
Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator& bootstrap, int device,
                                                             const CommOptions& options = {});

// The same without MPI: rank and world size from the rank table (launch.h,
// RankTableFromEnv) and the unique id handed out by rank 0 through the TCP
// rendezvous at TESSERA_MASTER (rendezvous.h).
struct RankTable;
Result<std::unique_ptr<Communicator>> CreateNcclCommunicatorFromTable(
    const RankTable& table, int device, const CommOptions& options = {});

// The number of CUDA devices this process sees (0 when there is no driver).
int CudaDeviceCount();

// Device memory for tests and the runtime: allocated on the current device.
class DeviceBuffer {
 public:
  static Result<DeviceBuffer> Allocate(int64_t bytes);
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  ~DeviceBuffer();

  void* data() const { return ptr_; }
  int64_t bytes() const { return bytes_; }
  Status CopyFromHost(const void* src, int64_t bytes);
  Status CopyToHost(void* dst, int64_t bytes) const;

 private:
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COMM_NCCL_H_
