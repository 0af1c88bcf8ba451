// What one pipeline stage does on one rank for one micro-batch, in the
// units a machine profile (machine_profile.h) prices: the matrix products'
// flops, the bytes of copies, each kernel's units and the collectives over
// the stage's tensor-parallel group; and what it holds: the activations a
// micro-batch keeps from its forward to its backward, and the buffers the
// micro-batches share (each at its largest). The model says what goes in
// (runtime/model/gpt_work.h for the GPT); this header only adds work up
// and prices it.
#ifndef TESSERA_RUNTIME_COST_STAGE_WORK_H_
#define TESSERA_RUNTIME_COST_STAGE_WORK_H_

#include <array>
#include <cstdint>

#include "runtime/cost/machine_profile.h"
#include "runtime/kernels.h"

namespace tessera {

// The buffers shared by a stage's micro-batches and blocks are named by
// the model (GptBuffer); a stage has at most this many.
inline constexpr int kSharedBuffers = 32;

struct StageWork {
  // Forward + backward (+ recompute) of one micro-batch.
  double flops = 0;                  // matrix products
  double bytes = 0;                  // memory traffic of copies (slices, packing)
  double kernel[kKernelCount] = {};  // units of each element-wise and attention kernel
  // Collectives over the stage's tensor-parallel group, by kind
  // (CollectiveKind's order): how many, and their bytes summed, each sized
  // as MachineProfile::CollectiveSeconds takes it.
  std::array<int, kCollectiveKinds> comm_count{};
  std::array<double, kCollectiveKinds> comm_bytes{};
  // Activations one micro-batch keeps from its forward to its backward.
  int64_t slot_bytes = 0;
  // Buffers shared by the micro-batches and blocks, each at its largest.
  int64_t shared[kSharedBuffers] = {};
  // Parameter gradients summed over the tensor-parallel group once per
  // step (floats).
  int64_t tp_sum_floats = 0;
  // Context parallelism (runtime/parallel/context_parallel.h): attention's
  // exchanges over the cp group, by kind as above (Ulysses' all-to-alls,
  // ring attention's sends of key/value blocks and their gradients), the
  // kernel units computed while ring transfers are in flight (what hides
  // them), and the exchanges' buffers (at their largest).
  std::array<int, kCollectiveKinds> cp_count{};
  std::array<double, kCollectiveKinds> cp_bytes{};
  double cp_hiding[kKernelCount] = {};
  int64_t cp_buffer_bytes = 0;

  int64_t shared_bytes() const;
  // One collective of `bytes`.
  void AddCollective(CollectiveKind kind, double bytes);
  // Adds `o`: sums, shared buffers at the larger of the two.
  void Add(const StageWork& o);
  // Adds `o` n times (identical blocks).
  void AddTimes(const StageWork& o, int64_t n);
};

// Shared buffer `id` at least `bytes`.
void Grow(StageWork* w, int id, int64_t bytes);
// The work `now` holds beyond `before`: flops, bytes, kernel units and
// collectives (what an operator adds, for a per-operator breakdown).
StageWork Since(const StageWork& now, const StageWork& before);

// Seconds of the stage's arithmetic on one rank: the products, the copies
// and every kernel's units.
double ComputeSeconds(const StageWork& w, const MachineProfile& p);
// Seconds of its collectives over a group of `group` ranks, neighbours in
// the rank order (a mesh's innermost axis).
double GroupCommSeconds(const StageWork& w, const MachineProfile& p, int group);
// Seconds of its cp exchanges not hidden (over `cp` ranks `stride` apart:
// the tp ranks between): Ulysses' all-to-alls whole, ring transfers less
// the attention compute they overlap.
double CpCommSeconds(const StageWork& w, const MachineProfile& p, int cp, int stride);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COST_STAGE_WORK_H_
