// Diff: compare the contents of two checkpoints tensor by tensor, whatever
// their layouts or formats (a sliced checkpoint equals its merge).
#ifndef TESSERA_CKPT_DIFF_H_
#define TESSERA_CKPT_DIFF_H_

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/transform.h"

namespace tessera {

struct DiffOptions {
  // Elements differ when |a - b| > atol + rtol * |b| (numpy.allclose); NaNs
  // are equal to NaNs. The defaults demand bit-identical values.
  double atol = 0;
  double rtol = 0;
  int threads = 0;
  int64_t memory_budget = kDefaultMemoryBudget;
};

struct TensorDiff {
  std::string name;
  std::string problem;  // "missing in B", "shape [..] vs [..]", ...; empty if compared
  int64_t elements = 0;
  int64_t differing = 0;  // beyond the tolerance
  double max_abs = 0;
  double max_rel = 0;
  bool ok() const { return problem.empty() && differing == 0; }
};

struct DiffReport {
  std::vector<TensorDiff> tensors;  // A's order, then tensors only in B
  bool ok() const;
};

Result<DiffReport> DiffCheckpoints(const CheckpointReader& a, const CheckpointReader& b,
                                   const DiffOptions& options);

}  // namespace tessera

#endif  // TESSERA_CKPT_DIFF_H_
