// The collective test suite every backend runs (in-process from Catch2,
// MPI under mpirun from a plain main). Catch2 assertions are not
// thread-safe, so the suite reports failures as strings instead.
#ifndef TESSERA_TESTS_COMM_COLLECTIVE_SUITE_H_
#define TESSERA_TESTS_COMM_COLLECTIVE_SUITE_H_

#include <string>
#include <vector>

#include "runtime/comm/communicator.h"

namespace tessera::testing {

struct SuiteOptions {
  // Floating-point reductions of non-integer data must equal the rank-order
  // left fold bit for bit (in-process, deterministic MPI); otherwise they
  // are compared with a relative tolerance.
  bool bitwise_order = true;
  // The backend reports mismatched collective arguments (in-process, MPI
  // with CommOptions::check).
  bool reports_mismatch = true;
  // The backend reduces i16/u16 (NCCL does not).
  bool reduces_16bit_ints = true;
};

// Runs every collective over every dtype, several counts and roots, the
// point-to-point calls and Split on `comm`. Returns the failures, each
// prefixed with the rank; empty when all passed. Stops early (with a
// failure) when a call returns an unexpected error, since the ranks may then
// be out of step.
std::vector<std::string> RunCollectiveSuite(Communicator& comm, const SuiteOptions& options);

// MeshCommunicators over a mesh with world size comm.size() (8: pp2 dp2
// tp2, 4: dp2 tp2, 2: dp2 tp1, 1: tp1): every set of axes has the right
// members, ranks and neighbours, and an allreduce within it sums the right
// ranks.
std::vector<std::string> RunMeshSuite(Communicator& comm);

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_COMM_COLLECTIVE_SUITE_H_
