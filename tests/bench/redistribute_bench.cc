// Redistribute (runtime/parallel/dtensor.h) beside the one collective that does the
// same job on the same ranks, to measure what planning, packing and
// unpacking cost on top of the bytes moved:
//   rows split over the ranks -> replicated   beside AllGather
//   columns split -> rows split               beside AllToAll (equal blocks)
// of a 64 MiB f32 matrix [4096, 4096]; and the GPT's LinearOp (runtime/
// parallel/operators.h) with the conversions OpGpt inserts around it,
// forward and backward of x [2048, 1024] @ w [1024, 1024], beside the same
// products and collectives written out by hand:
//   row-parallel ((dp,tp),(tp,-))          beside sgemm + AllReduce
//   column-parallel ((dp,-),(-,tp)), x arriving cut by rows (Megatron-SP)
//                                          beside AllGather + sgemm + ReduceScatter
//   redistribute_bench inprocess N
//   mpirun -np N redistribute_bench mpi
// And a GPT activation's redistribution with its plan built once beside
// planned on every call.
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
#include "runtime/comm/mpi.h"
#include "runtime/kernels.h"
#include "runtime/parallel/dtensor.h"
#include "runtime/parallel/operators.h"

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

// The GPT's linear operator (runtime/parallel/operators.h: LinearOp with
// its placements' conversions, as OpGpt runs it) forward + backward beside
// the hand-written equivalent.
Status Linears(Communicator& comm) {
  constexpr int64_t M = 2048, K = 1024, N = 1024;
  const int p = comm.size();
  const DimAxes none, dp{"dp"}, tp{"tp"};
  ASSIGN_OR_RETURN(LinearOp row, LinearOp::Create("row", {{{dp, tp}, {tp, none}}}, K, N, 1, 1));
  ASSIGN_OR_RETURN(LinearOp col,
                   LinearOp::Create("column", {{{dp, none}, {none, tp}}}, K, N, 1, 1));
  OpContext ctx(p > 1 ? &comm : nullptr);
  const int64_t kl = K / p, nl = N / p, ml = M / p;
  std::vector<float> w(kl * N, 0.01f), dw(kl * N, 0.0f), b(N, 0.0f), db(N, 0.0f);
  std::vector<float> wc(K * nl, 0.01f), dwc(K * nl, 0.0f), bc(nl, 0.0f), dbc(nl, 0.0f);
  // x as each operator receives it: its own columns (row), cut by rows (column).
  std::vector<float> xr(M * kl, 0.5f), xc(ml * K, 0.5f), dyr(M * N, 0.5f), dyc(M * nl, 0.5f);
  std::vector<float> y(M * N), dx(M * K), gathered, resolved, scattered;
  std::vector<float> out(M * N), xfull(M * K), dxl(M * kl), dxf(M * K), dxs(ml * K);
  const Placement whole{-1}, rows{0};
  const Pair cases[] = {
      {"row ((dp,tp),(tp,-))",
       [&]() -> Status {
         Act x{xr.data(), M, K, row.info().inputs[0]}, out_act{y.data(), M, N, row.info().output};
         row.Forward(ctx, x, w.data(), b.data(), &out_act);
         RETURN_IF_ERROR(ctx.Convert(out_act, whole, &resolved, "row", "output").status());
         Act dy{dyr.data(), M, N, whole}, dxa{dx.data(), M, K, row.InputGradient()};
         row.Backward(ctx, x, w.data(), dy, &dxa, dw.data(), db.data());
         return Status::Ok();
       },
       [&]() -> Status {
         kernels::MatmulForward(out.data(), xr.data(), w.data(), b.data(), M, kl, N);
         RETURN_IF_ERROR(
             comm.AllReduce(out.data(), out.data(), M * N, DType::kF32, ReduceOp::kSum));
         kernels::MatmulBackward(dxl.data(), dw.data(), db.data(), dyr.data(), xr.data(), w.data(),
                                 M, kl, N);
         return Status::Ok();
       },
       "sgemm+AllReduce"},
      {"column, x by rows",
       [&]() -> Status {
         Act x{xc.data(), M, K, rows};
         ASSIGN_OR_RETURN(Act xin, ctx.Convert(x, col.info().inputs[0], &gathered, "column", "x"));
         Act out_act{y.data(), M, N, col.info().output};
         col.Forward(ctx, xin, wc.data(), bc.data(), &out_act);
         Act dy{dyc.data(), M, N, col.info().output}, dxa{dx.data(), M, K, col.InputGradient()};
         col.Backward(ctx, xin, wc.data(), dy, &dxa, dwc.data(), dbc.data());
         return ctx.Convert(dxa, rows, &scattered, "column", "x gradient").status();
       },
       [&]() -> Status {
         RETURN_IF_ERROR(comm.AllGather(xc.data(), ml * K, xfull.data(), DType::kF32));
         kernels::MatmulForward(out.data(), xfull.data(), wc.data(), bc.data(), M, K, nl);
         kernels::MatmulBackward(dxf.data(), dwc.data(), dbc.data(), dyc.data(), xfull.data(),
                                 wc.data(), M, K, nl);
         return comm.ReduceScatter(dxf.data(), dxs.data(), ml * K, DType::kF32, ReduceOp::kSum);
       },
       "AllGather+sgemm+ReduceScatter"},
  };
  return TimePairs(
      comm, cases,
      "  LinearOp %-20s %d ranks (%s): fwd+bwd %8.2f ms   %-29s %8.2f ms   ratio %.2fx\n");
}

// A redistribution as a training step repeats it (an activation [rows,
// cols] by columns -> by rows over the ranks, as OpGpt's Redistribute
// edges): its plan built once and run (RedistributionPlan, what OpContext
// does) beside planning it on every call (RedistributeInto, what OpContext
// did before); 50 calls a timed run.
Status Plans(Communicator& comm) {
  ASSIGN_OR_RETURN(Mesh mesh, Mesh::Create({"tp"}, {comm.size()}));
  for (const auto& [r, c] : {std::pair<int64_t, int64_t>{1024, 128}, {4096, 512}}) {
    const Layout cols = Placement{1}.ToLayout(r, c), rows = Placement{0}.ToLayout(r, c);
    std::vector<float> full(r * c, 1.0f);
    ASSIGN_OR_RETURN(DTensor t, DTensor::FromFull(mesh, cols, full.data(), comm.rank()));
    ASSIGN_OR_RETURN(RedistributionPlan plan,
                     RedistributionPlan::Create(mesh, cols, mesh, rows, comm.rank()));
    std::vector<char> dst(plan.dst_bytes()), send, recv;
    DTensor out;
    const std::string what = "[" + std::to_string(r) + ", " + std::to_string(c) + "] cols->rows";
    const Pair pair{what.c_str(),
                    [&]() -> Status {
                      for (int i = 0; i < 50; ++i) {
                        RETURN_IF_ERROR(plan.Run(t.local().data(), dst.data(), comm, &send, &recv));
                      }
                      return Status::Ok();
                    },
                    [&]() -> Status {
                      for (int i = 0; i < 50; ++i) {
                        RETURN_IF_ERROR(RedistributeInto(t, mesh, rows, comm, &out));
                      }
                      return Status::Ok();
                    },
                    "planned each call"};
    RETURN_IF_ERROR(TimePairs(
        comm, std::span<const Pair>(&pair, 1),
        "  plan reuse %-24s %d ranks (%s): 50 calls %7.2f ms   %-17s %7.2f ms   ratio %.2fx\n"));
  }
  return Status::Ok();
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
  RETURN_IF_ERROR(Linears(comm));
  return Plans(comm);
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
