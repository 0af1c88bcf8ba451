// Redistribute (runtime/parallel/dtensor.h) beside the one collective that does the
// same job on the same ranks, to measure what planning, packing and
// unpacking cost on top of the bytes moved:
//   rows split over the ranks -> replicated   beside AllGather
//   columns split -> rows split               beside AllToAll (equal blocks)
// of a 64 MiB f32 matrix [4096, 4096]; and ParallelMatMul (runtime/
// parallel_ops.h), forward and backward of x [2048, 1024] @ w [1024, 1024],
// beside the same products and collectives written out by hand (what
// runtime/model/gpt.cc does for its tensor-parallel layers):
//   row-parallel ((-,r),(r,-))               beside sgemm + AllReduce
//   column-parallel ((-,-),(-,r)), x arriving cut by rows
//                                            beside AllGather + sgemm
//   redistribute_bench inprocess N
//   mpirun -np N redistribute_bench mpi
// Median of 5 timed calls each (after one warm-up), slowest rank.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "runtime/comm/inprocess.h"
#include "runtime/comm/mesh_comms.h"
#include "runtime/comm/mpi.h"
#include "runtime/kernels.h"
#include "runtime/parallel/dtensor.h"
#include "runtime/parallel/parallel_ops.h"

using namespace tessera;

namespace {

constexpr int64_t kN = 4096;

// Median over 5 runs of the slowest rank's seconds.
Result<double> Time(Communicator& comm, const std::function<Status()>& fn) {
  RETURN_IF_ERROR(fn());  // warm-up
  std::vector<double> times;
  for (int i = 0; i < 5; ++i) {
    RETURN_IF_ERROR(comm.Barrier());
    const auto t0 = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(fn());
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    RETURN_IF_ERROR(comm.AllReduce(&s, &s, 1, DType::kF64, ReduceOp::kMax));
    times.push_back(s);
  }
  std::sort(times.begin(), times.end());
  return times[2];
}

// Our way and the peer's way of doing the same job.
struct Pair {
  const char* what;
  std::function<Status()> ours, peer;
  const char* peer_name;
};

// Times both sides of every pair; rank 0 prints each with `format`
// (what, ranks, backend, ours ms, peer name, peer ms, ratio).
Status TimePairs(Communicator& comm, std::span<const Pair> pairs, const char* format) {
  for (const Pair& pair : pairs) {
    ASSIGN_OR_RETURN(double ours, Time(comm, pair.ours));
    ASSIGN_OR_RETURN(double peer, Time(comm, pair.peer));
    if (comm.rank() == 0) {
      std::printf(format, pair.what, comm.size(), std::string(comm.backend()).c_str(), ours * 1e3,
                  pair.peer_name, peer * 1e3, ours / peer);
    }
  }
  return Status::Ok();
}

// ParallelMatMul forward + backward beside the hand-written equivalent.
Status MatMuls(Communicator& comm, const Mesh& mesh) {
  constexpr int64_t M = 2048, K = 1024, N = 1024;
  const int p = comm.size();
  ASSIGN_OR_RETURN(MeshCommunicators comms, MeshCommunicators::Create(comm, mesh));
  ASSIGN_OR_RETURN(MatMulStrategy row_s, MatMulStrategy::Parse("((-,r),(r,-))"));
  ASSIGN_OR_RETURN(MatMulStrategy col_s, MatMulStrategy::Parse("((-,-),(-,r))"));
  ASSIGN_OR_RETURN(ParallelMatMul row, ParallelMatMul::Create(comms, row_s, M, K, N));
  ASSIGN_OR_RETURN(ParallelMatMul col, ParallelMatMul::Create(comms, col_s, M, K, N));
  const int64_t kl = K / p, nl = N / p, ml = M / p;
  std::vector<float> w(kl * N, 0.01f), dw(kl * N, 0.0f), wc(K * nl, 0.01f), dwc(K * nl, 0.0f);
  // x as each operator receives it: its own columns (row), cut by rows (column).
  std::vector<char> xr(M * kl * 4), xc(ml * K * 4), dyr(M * N * 4), dyc(M * nl * 4);
  for (auto* v : {&xr, &xc, &dyr, &dyc}) {
    for (size_t i = 0; i < v->size() / 4; ++i) reinterpret_cast<float*>(v->data())[i] = 0.5f;
  }
  Layout x_rows = Layout::Replicated({M, K}, DType::kF32);
  x_rows.dim_axes = {{"r"}, {}};
  ASSIGN_OR_RETURN(DTensor x1, DTensor::FromLocal(mesh, row.x_layout(), comm.rank(), xr));
  ASSIGN_OR_RETURN(DTensor dy1, DTensor::FromLocal(mesh, row.y_layout(), comm.rank(), dyr));
  ASSIGN_OR_RETURN(DTensor x2, DTensor::FromLocal(mesh, x_rows, comm.rank(), xc));
  ASSIGN_OR_RETURN(DTensor dy2, DTensor::FromLocal(mesh, col.y_layout(), comm.rank(), dyc));
  DTensor y, dx;
  std::vector<float> out(M * N), xfull(M * K), dxl(M * kl), dxf(M * K), part(M * kl);
  auto f = [](std::vector<char>& v) { return reinterpret_cast<float*>(v.data()); };
  const Pair cases[] = {
      {"row ((-,r),(r,-))",
       [&]() -> Status {
         RETURN_IF_ERROR(row.Forward(x1, w.data(), &y));
         return row.Backward(x1, w.data(), dy1, &dx, dw.data());
       },
       [&]() -> Status {
         kernels::MatmulForward(out.data(), f(xr), w.data(), nullptr, M, kl, N);
         RETURN_IF_ERROR(
             comm.AllReduce(out.data(), out.data(), M * N, DType::kF32, ReduceOp::kSum));
         kernels::MatmulBackward(dxl.data(), dw.data(), nullptr, f(dyr), f(xr), w.data(), M, kl, N);
         return Status::Ok();
       },
       "sgemm+AllReduce"},
      {"column, x by rows",
       [&]() -> Status {
         RETURN_IF_ERROR(col.Forward(x2, wc.data(), &y));
         return col.Backward(x2, wc.data(), dy2, &dx, dwc.data());
       },
       [&]() -> Status {
         RETURN_IF_ERROR(comm.AllGather(xc.data(), ml * K, xfull.data(), DType::kF32));
         kernels::MatmulForward(out.data(), xfull.data(), wc.data(), nullptr, M, K, nl);
         kernels::MatmulBackward(dxf.data(), dwc.data(), nullptr, f(dyc), xfull.data(), wc.data(),
                                 M, K, nl);
         RETURN_IF_ERROR(
             comm.AllReduce(dxf.data(), dxf.data(), M * K, DType::kF32, ReduceOp::kSum));
         return Status::Ok();
       },
       "AllGather+sgemm"},
  };
  return TimePairs(
      comm, cases,
      "  MatMul %-19s %d ranks (%s): fwd+bwd %8.2f ms   %-15s %8.2f ms   ratio %.2fx\n");
}

Status Run(Communicator& comm) {
  const int p = comm.size();
  ASSIGN_OR_RETURN(Mesh mesh, Mesh::Create({"r"}, {p}));
  const Layout whole = Layout::Replicated({kN, kN}, DType::kF32);
  Layout rows = whole, cols = whole;
  rows.dim_axes = {{"r"}, {}};
  cols.dim_axes = {{}, {"r"}};
  const int64_t shard = kN * kN / p;  // floats per rank (kN divisible by p here)
  std::vector<char> local(shard * 4, 1);
  ASSIGN_OR_RETURN(DTensor by_rows, DTensor::FromLocal(mesh, rows, comm.rank(), local));
  ASSIGN_OR_RETURN(DTensor by_cols, DTensor::FromLocal(mesh, cols, comm.rank(), local));
  std::vector<float> a(shard, 1.0f), b(kN * kN);
  DTensor out_whole, out_rows;  // reused across calls, as a training loop would
  const Pair rows_[] = {
      {"rows -> replicated",
       [&] { return RedistributeInto(by_rows, mesh, whole, comm, &out_whole); },
       [&] { return comm.AllGather(a.data(), shard, b.data(), DType::kF32); }, "AllGather"},
      {"columns -> rows", [&] { return RedistributeInto(by_cols, mesh, rows, comm, &out_rows); },
       [&] { return comm.AllToAll(a.data(), b.data(), shard / p, DType::kF32); }, "AllToAll"},
  };
  RETURN_IF_ERROR(TimePairs(
      comm, rows_, "  %-20s %d ranks (%s): Redistribute %8.2f ms   %-9s %8.2f ms   ratio %.2fx\n"));
  return MatMuls(comm, mesh);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  Status s;
  if (mode == "inprocess" && argc > 2) {
    s = RunInProcess(std::atoi(argv[2]), Run);
  } else if (mode == "mpi") {
    auto world = CreateMpiWorld({});
    s = world.ok() ? Run(**world) : world.status();
  } else {
    std::fprintf(stderr,
                 "usage: redistribute_bench inprocess N | mpirun -np N redistribute_bench mpi\n");
    return 2;
  }
  if (!s.ok()) {
    std::fprintf(stderr, "redistribute_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
