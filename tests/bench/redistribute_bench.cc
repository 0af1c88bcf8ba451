// Redistribute (runtime/dtensor.h) beside the one collective that does the
// same job on the same ranks, to measure what planning, packing and
// unpacking cost on top of the bytes moved:
//   rows split over the ranks -> replicated   beside AllGather
//   columns split -> rows split               beside AllToAll (equal blocks)
// of a 64 MiB f32 matrix [4096, 4096].
//   redistribute_bench inprocess N
//   mpirun -np N redistribute_bench mpi
// Median of 5 timed calls each (after one warm-up), slowest rank.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "runtime/comm/inprocess.h"
#include "runtime/comm/mpi.h"
#include "runtime/dtensor.h"

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
  struct Row {
    const char* what;
    std::function<Status()> ours, peer;
    const char* peer_name;
  };
  const Row rows_[] = {
      {"rows -> replicated",
       [&] { return RedistributeInto(by_rows, mesh, whole, comm, &out_whole); },
       [&] { return comm.AllGather(a.data(), shard, b.data(), DType::kF32); }, "AllGather"},
      {"columns -> rows", [&] { return RedistributeInto(by_cols, mesh, rows, comm, &out_rows); },
       [&] { return comm.AllToAll(a.data(), b.data(), shard / p, DType::kF32); }, "AllToAll"},
  };
  for (const Row& r : rows_) {
    ASSIGN_OR_RETURN(double ours, Time(comm, r.ours));
    ASSIGN_OR_RETURN(double peer, Time(comm, r.peer));
    if (comm.rank() == 0) {
      std::printf("  %-20s %d ranks (%s): Redistribute %8.2f ms   %-9s %8.2f ms   ratio %.2fx\n",
                  r.what, p, std::string(comm.backend()).c_str(), ours * 1e3, r.peer_name,
                  peer * 1e3, ours / peer);
    }
  }
  return Status::Ok();
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
    std::fprintf(stderr, "usage: redistribute_bench inprocess N | mpirun -np N redistribute_bench mpi\n");
    return 2;
  }
  if (!s.ok()) {
    std::fprintf(stderr, "redistribute_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
