// Redistribute under mpirun: the same random redistributions as the
// in-process test (one seed for all ranks), each checked on every rank
// against the definition; exit 0 when every rank's results were right.
#include <cstdio>
#include <cstdlib>
#include <random>

#include "runtime/comm/mpi.h"
#include "tests/runtime/parallel/dtensor_check.h"

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
  int all = failures;
  if (!comm.AllReduce(&failures, &all, 1, DType::kI32, ReduceOp::kSum).ok()) return 1;
  std::printf("rank %d: %d redistributions, %s\n", comm.rank(), cases, all == 0 ? "ok" : "FAILED");
  return all == 0 ? 0 : 1;
}
