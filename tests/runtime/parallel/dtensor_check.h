// Shared by the in-process and the mpirun Redistribute tests: one random
// case (meshes, layouts, bytes; the same on every rank for the same seed),
// and the check of one rank's redistributed shard against the definition.
#ifndef TESSERA_TESTS_PARALLEL_DTENSOR_CHECK_H_
#define TESSERA_TESTS_PARALLEL_DTENSOR_CHECK_H_

#include <random>
#include <string>
#include <vector>

#include "runtime/parallel/dtensor.h"
#include "tests/transform/random_layout.h"

namespace tessera::testing {

struct RedistributeCase {
  Mesh src_mesh, dst_mesh;
  Layout from, to;
  std::vector<char> full;
  std::string ToString() const {
    return src_mesh.ToString() + " " + tessera::ToString(from) + " -> " + dst_mesh.ToString() +
           " " + tessera::ToString(to);
  }
};

inline RedistributeCase RandomRedistributeCase(std::mt19937_64& rng, int64_t world) {
  RedistributeCase c;
  c.src_mesh = RandomMeshOfSize(rng, world, {"dp", "tp", "pp"});
  c.dst_mesh = RandomMeshOfSize(rng, world, {"a", "b", "c"});
  const DType dtype =
      std::vector<DType>{DType::kF32, DType::kBF16, DType::kI64, DType::kU8}[Uniform(rng, 0, 3)];
  const std::vector<int64_t> shape = RandomShape(rng, 3, 13);
  c.from = RandomLayout(rng, c.src_mesh, shape, dtype);
  c.to = RandomLayout(rng, c.dst_mesh, shape, dtype);
  c.full.resize(NumElements(c.from) * DTypeSize(dtype));
  for (char& b : c.full) b = static_cast<char>(rng());
  return c;
}

// Collective: redistributes this rank's shard of `full` and compares the
// result with the target shard cut from `full`.
inline Status CheckRedistribute(Communicator& comm, const Mesh& sm, const Layout& from,
                                const Mesh& dm, const Layout& to, const std::vector<char>& full,
                                RedistributeStats* stats = nullptr) {
  ASSIGN_OR_RETURN(DTensor t, DTensor::FromFull(sm, from, full.data(), comm.rank()));
  ASSIGN_OR_RETURN(DTensor r, Redistribute(t, dm, to, comm, stats));
  ASSIGN_OR_RETURN(DTensor want, DTensor::FromFull(dm, to, full.data(), comm.rank()));
  if (r.local() != want.local() || r.holds() != want.holds() || r.box() != want.box()) {
    return InternalError("rank " + std::to_string(comm.rank()) + " got the wrong shard");
  }
  return Status::Ok();
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_PARALLEL_DTENSOR_CHECK_H_
