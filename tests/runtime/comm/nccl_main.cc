// The collective suite over NCCL on the GPUs this machine has (world size =
// the number of processes; with one GPU, 1). The suite works on host
// buffers, so a staging adapter copies them to device memory around each
// NCCL call. Exits 77 (CTest: skipped) when no CUDA device is visible.
//   comm_nccl_test          bootstrap through an in-process world of 1
//   comm_nccl_test mpi      bootstrap through MPI (under mpirun)
//   comm_nccl_test table    the rank table from TESSERA_RANK/WORLD_SIZE/MASTER
//                           (defaults: rank 0 of 1) and the TCP rendezvous
#include <cstdio>
#include <numeric>
#include <string>

#include "runtime/comm/inprocess.h"
#include "runtime/comm/launch.h"
#include "runtime/comm/mpi.h"
#include "runtime/comm/nccl.h"
#include "tests/runtime/comm/collective_suite.h"

using namespace tessera;

namespace {

class HostStaging : public Communicator {
 public:
  explicit HostStaging(std::unique_ptr<Communicator> inner) : c_(std::move(inner)) {
    set_name(c_->name());
  }
  int rank() const override { return c_->rank(); }
  int size() const override { return c_->size(); }
  std::string_view backend() const override { return c_->backend(); }

  Status Barrier() override { return c_->Barrier(); }
  Status Broadcast(void* buf, int64_t count, DType d, int root) override {
    ASSIGN_OR_RETURN(DeviceBuffer b, Up(buf, count, d));
    RETURN_IF_ERROR(c_->Broadcast(b.data(), count, d, root));
    return b.CopyToHost(buf, count * DTypeSize(d));
  }
  Status AllReduce(const void* send, void* recv, int64_t count, DType d, ReduceOp op) override {
    ASSIGN_OR_RETURN(DeviceBuffer s, Up(send, count, d));
    if (send == recv) {
      RETURN_IF_ERROR(c_->AllReduce(s.data(), s.data(), count, d, op));
      return s.CopyToHost(recv, count * DTypeSize(d));
    }
    ASSIGN_OR_RETURN(DeviceBuffer r, Up(nullptr, count, d));
    RETURN_IF_ERROR(c_->AllReduce(s.data(), r.data(), count, d, op));
    return r.CopyToHost(recv, count * DTypeSize(d));
  }
  Status AllGather(const void* send, int64_t count, void* recv, DType d) override {
    ASSIGN_OR_RETURN(DeviceBuffer s, Up(send, count, d));
    ASSIGN_OR_RETURN(DeviceBuffer r, Up(nullptr, count * size(), d));
    RETURN_IF_ERROR(c_->AllGather(s.data(), count, r.data(), d));
    return r.CopyToHost(recv, count * size() * DTypeSize(d));
  }
  Status AllGatherV(const void* send, int64_t count, void* recv, std::span<const int64_t> counts,
                    DType d) override {
    const int64_t total = Sum(counts);
    ASSIGN_OR_RETURN(DeviceBuffer s, Up(send, count, d));
    ASSIGN_OR_RETURN(DeviceBuffer r, Up(nullptr, total, d));
    RETURN_IF_ERROR(c_->AllGatherV(s.data(), count, r.data(), counts, d));
    return r.CopyToHost(recv, total * DTypeSize(d));
  }
  Status ReduceScatter(const void* send, void* recv, int64_t count, DType d, ReduceOp op) override {
    ASSIGN_OR_RETURN(DeviceBuffer s, Up(send, count * size(), d));
    ASSIGN_OR_RETURN(DeviceBuffer r, Up(nullptr, count, d));
    RETURN_IF_ERROR(c_->ReduceScatter(s.data(), r.data(), count, d, op));
    return r.CopyToHost(recv, count * DTypeSize(d));
  }
  Status GatherV(const void* send, int64_t count, void* recv, std::span<const int64_t> counts,
                 DType d, int root) override {
    const int64_t total = Sum(counts);
    ASSIGN_OR_RETURN(DeviceBuffer s, Up(send, count, d));
    ASSIGN_OR_RETURN(DeviceBuffer r, Up(nullptr, total, d));
    RETURN_IF_ERROR(c_->GatherV(s.data(), count, r.data(), counts, d, root));
    return rank() == root ? r.CopyToHost(recv, total * DTypeSize(d)) : Status::Ok();
  }
  Status ScatterV(const void* send, std::span<const int64_t> counts, void* recv, int64_t count,
                  DType d, int root) override {
    ASSIGN_OR_RETURN(DeviceBuffer s, Up(rank() == root ? send : nullptr, Sum(counts), d));
    ASSIGN_OR_RETURN(DeviceBuffer r, Up(nullptr, count, d));
    RETURN_IF_ERROR(c_->ScatterV(s.data(), counts, r.data(), count, d, root));
    return r.CopyToHost(recv, count * DTypeSize(d));
  }
  Status AllToAllV(const void* send, std::span<const int64_t> sc, void* recv,
                   std::span<const int64_t> rc, DType d) override {
    ASSIGN_OR_RETURN(DeviceBuffer s, Up(send, Sum(sc), d));
    ASSIGN_OR_RETURN(DeviceBuffer r, Up(nullptr, Sum(rc), d));
    RETURN_IF_ERROR(c_->AllToAllV(s.data(), sc, r.data(), rc, d));
    return r.CopyToHost(recv, Sum(rc) * DTypeSize(d));
  }
  Status Send(const void* buf, int64_t count, DType d, int peer, int tag) override {
    ASSIGN_OR_RETURN(DeviceBuffer s, Up(buf, count, d));
    return c_->Send(s.data(), count, d, peer, tag);
  }
  Status Recv(void* buf, int64_t count, DType d, int peer, int tag) override {
    ASSIGN_OR_RETURN(DeviceBuffer r, Up(nullptr, count, d));
    RETURN_IF_ERROR(c_->Recv(r.data(), count, d, peer, tag));
    return r.CopyToHost(buf, count * DTypeSize(d));
  }
  // The non-blocking collectives of the NCCL communicator itself (not the
  // default lane): device buffers up front, the result copied down once
  // the request completes.
  Result<Request> IAllReduce(const void* send, void* recv, int64_t count, DType d,
                             ReduceOp op) override {
    ASSIGN_OR_RETURN(DeviceBuffer s, Up(send, count, d));
    ASSIGN_OR_RETURN(DeviceBuffer r, Up(nullptr, count, d));
    ASSIGN_OR_RETURN(Request q, c_->IAllReduce(s.data(), r.data(), count, d, op));
    return Staged(std::move(q), std::move(s), std::move(r), recv, count * DTypeSize(d));
  }
  Result<Request> IReduceScatter(const void* send, void* recv, int64_t count, DType d,
                                 ReduceOp op) override {
    ASSIGN_OR_RETURN(DeviceBuffer s, Up(send, count * size(), d));
    ASSIGN_OR_RETURN(DeviceBuffer r, Up(nullptr, count, d));
    ASSIGN_OR_RETURN(Request q, c_->IReduceScatter(s.data(), r.data(), count, d, op));
    return Staged(std::move(q), std::move(s), std::move(r), recv, count * DTypeSize(d));
  }
  Result<Request> IAllGather(const void* send, int64_t count, void* recv, DType d) override {
    ASSIGN_OR_RETURN(DeviceBuffer s, Up(send, count, d));
    ASSIGN_OR_RETURN(DeviceBuffer r, Up(nullptr, count * size(), d));
    ASSIGN_OR_RETURN(Request q, c_->IAllGather(s.data(), count, r.data(), d));
    return Staged(std::move(q), std::move(s), std::move(r), recv, count * size() * DTypeSize(d));
  }
  Result<Request> IAllToAll(const void* send, void* recv, int64_t count, DType d) override {
    ASSIGN_OR_RETURN(DeviceBuffer s, Up(send, count * size(), d));
    ASSIGN_OR_RETURN(DeviceBuffer r, Up(nullptr, count * size(), d));
    ASSIGN_OR_RETURN(Request q, c_->IAllToAll(s.data(), r.data(), count, d));
    return Staged(std::move(q), std::move(s), std::move(r), recv, count * size() * DTypeSize(d));
  }
  Result<Request> ISend(const void* buf, int64_t count, DType d, int peer, int tag) override {
    RETURN_IF_ERROR(Send(buf, count, d, peer, tag));
    return Request();
  }
  Result<Request> IRecv(void* buf, int64_t count, DType d, int peer, int tag) override {
    RETURN_IF_ERROR(Recv(buf, count, d, peer, tag));
    return Request();
  }
  Result<std::unique_ptr<Communicator>> Split(int color, int key) override {
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> sub, c_->Split(color, key));
    if (sub == nullptr) return sub;
    return std::unique_ptr<Communicator>(std::make_unique<HostStaging>(std::move(sub)));
  }

 private:
  class StagedRequest : public Request::Impl {
   public:
    StagedRequest(Request inner, DeviceBuffer send, DeviceBuffer recv, void* host, int64_t bytes)
        : inner_(std::move(inner)),
          send_(std::move(send)),
          recv_(std::move(recv)),
          host_(host),
          bytes_(bytes) {}
    Status Wait() override {
      RETURN_IF_ERROR(inner_.Wait());
      return recv_.CopyToHost(host_, bytes_);
    }

   private:
    Request inner_;
    DeviceBuffer send_, recv_;
    void* host_;
    int64_t bytes_;
  };
  static Request Staged(Request q, DeviceBuffer s, DeviceBuffer r, void* host, int64_t bytes) {
    return Request(
        std::make_unique<StagedRequest>(std::move(q), std::move(s), std::move(r), host, bytes));
  }
  static int64_t Sum(std::span<const int64_t> v) {
    return std::accumulate(v.begin(), v.end(), int64_t{0});
  }
  // A device buffer of `count` elements, filled from `host` when given.
  static Result<DeviceBuffer> Up(const void* host, int64_t count, DType d) {
    ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Allocate(count * DTypeSize(d)));
    if (host != nullptr) RETURN_IF_ERROR(b.CopyFromHost(host, count * DTypeSize(d)));
    return b;
  }
  std::unique_ptr<Communicator> c_;
};

int RunSuite(Result<std::unique_ptr<Communicator>> nccl, int device) {
  if (!nccl.ok()) {
    std::fprintf(stderr, "%s\n", nccl.status().ToString().c_str());
    return 1;
  }
  HostStaging staged(std::move(*nccl));
  auto failures = testing::RunCollectiveSuite(staged, {.bitwise_order = staged.size() == 1,
                                                       .reports_mismatch = false,
                                                       .reduces_16bit_ints = false});
  // NCCL refuses them by name.
  int16_t x = 1;
  Status s = staged.AllReduce(&x, &x, 1, DType::kI16, ReduceOp::kSum);
  if (s.code() != StatusCode::kUnimplemented) failures.push_back("i16 reduce: " + s.ToString());
  auto mesh = testing::RunMeshSuite(staged);
  failures.insert(failures.end(), mesh.begin(), mesh.end());
  for (const auto& f : failures) std::fprintf(stderr, "FAIL %s\n", f.c_str());
  std::printf("rank %d (nccl, %d ranks, device %d): %s\n", staged.rank(), staged.size(), device,
              failures.empty() ? "ok" : "FAILED");
  return failures.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (CudaDeviceCount() == 0) {
    std::printf("no CUDA device visible: skipped\n");
    return 77;
  }
  const std::string mode = argc > 1 ? argv[1] : "";
  const CommOptions options{.timeout = std::chrono::seconds(60)};
  if (mode == "mpi") {
    auto world = CreateMpiWorld();
    if (!world.ok()) return 1;
    const int device = (*world)->rank() % CudaDeviceCount();
    return RunSuite(CreateNcclCommunicator(**world, device, options), device);
  }
  if (mode == "table") {
    if (getenv("TESSERA_RANK") == nullptr) {
      setenv("TESSERA_RANK", "0", 1);
      setenv("TESSERA_WORLD_SIZE", "1", 1);
    }
    auto table = RankTableFromEnv();
    if (!table.ok()) {
      std::fprintf(stderr, "%s\n", table.status().ToString().c_str());
      return 1;
    }
    const int device = table->rank % CudaDeviceCount();
    return RunSuite(CreateNcclCommunicatorFromTable(*table, device, options), device);
  }
  auto world = CreateInProcessWorld(1);
  if (!world.ok()) return 1;
  return RunSuite(CreateNcclCommunicator(*(*world)[0], 0, options), 0);
}
