// Redistribute and ParallelMatMul under mpirun: the same random
// redistributions as the in-process test (one seed for all ranks) and every
// MatMul strategy and input layout on a dp x tp mesh (dp2 x tp2 on 4
// processes, tp over all of them otherwise), each checked on every rank
// against the definition; exit 0 when every rank's results were right.
#include <cstdio>
#include <cstdlib>
#include <random>

#include "runtime/comm/mpi.h"
#include "tests/runtime/parallel/dtensor_check.h"
#include "tests/runtime/parallel/matmul_check.h"

using namespace tessera;

int main(int argc, char** argv) {
  const int cases = argc > 1 ? std::atoi(argv[1]) : 40;
  auto world = CreateMpiWorld({.timeout = std::chrono::seconds(120), .check = true});
  if (!world.ok()) {
    std::fprintf(stderr, "%s\n", world.status().ToString().c_str());
    return 1;
  }
  Communicator& comm = **world;
  std::mt19937_64 rng(20261123);
  int failures = 0;
  for (int i = 0; i < cases; ++i) {
    const testing::RedistributeCase c = testing::RandomRedistributeCase(rng, comm.size());
    const Status s = testing::CheckRedistribute(comm, c.src_mesh, c.from, c.dst_mesh, c.to, c.full);
    if (!s.ok()) {
      ++failures;
      std::fprintf(stderr, "case %d (%s): %s\n", i, c.ToString().c_str(), s.ToString().c_str());
    }
  }
  const int dp = comm.size() % 2 == 0 ? 2 : 1;
  const Status matmuls = [&]() -> Status {
    ASSIGN_OR_RETURN(Mesh mesh, Mesh::Create({"dp", "tp"}, {dp, comm.size() / dp}));
    ASSIGN_OR_RETURN(MeshCommunicators comms, MeshCommunicators::Create(comm, mesh));
    return testing::CheckAllMatMuls(comms, testing::MakeMatMulData(6, 10, 7, 13));
  }();
  if (!matmuls.ok()) {
    ++failures;
    std::fprintf(stderr, "matmul: %s\n", matmuls.ToString().c_str());
  }
  int all = failures;
  if (!comm.AllReduce(&failures, &all, 1, DType::kI32, ReduceOp::kSum).ok()) return 1;
  std::printf("rank %d: %d redistributions, %zu MatMul strategies on dp%d x tp%d, %s\n",
              comm.rank(), cases, testing::MatMulStrategies().size(), dp, comm.size() / dp,
              all == 0 ? "ok" : "FAILED");
  return all == 0 ? 0 : 1;
}
