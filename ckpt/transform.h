// Transform: every tensor of a checkpoint, re-laid out by a destination
// strategy, streamed from a reader to a writer under a memory budget.
// `ckpt merge`, `split`, `reshard` and `convert` are this one loop with
// different destination strategies and writers.
#ifndef TESSERA_CKPT_TRANSFORM_H_
#define TESSERA_CKPT_TRANSFORM_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "ckpt/checkpoint.h"
#include "transform/strategy.h"

namespace tessera {

inline constexpr int64_t kDefaultMemoryBudget = int64_t{256} << 20;

struct TransformOptions {
  int threads = 0;  // <= 0: one per core
  // Bytes of tensor data held in memory at once, over all threads.
  int64_t memory_budget = kDefaultMemoryBudget;
  // Called with (bytes done, bytes total) as pieces complete, from worker
  // threads but never concurrently.
  std::function<void(int64_t, int64_t)> progress;
};

struct TransformStats {
  int64_t tensors = 0;
  int64_t pieces = 0;  // written
  int64_t bytes = 0;   // raw bytes written
  double seconds = 0;
};

// The destination strategy for every tensor of `src`, in `src`'s order:
// `dst`'s layout where `dst` names the tensor, whole (replicated) on `dst`'s
// mesh otherwise. A tensor `dst` names that `src` lacks is an error naming it.
Result<Strategy> CompleteStrategy(const Strategy& src, const Strategy& dst);
// Every tensor whole on a one-rank mesh: what `ckpt merge` writes.
Strategy MergedStrategy(const Strategy& src);

// Copies every tensor of `src` into `out`, which was created with `dst`
// (a complete strategy: same tensors as `src`, same order). Each distinct
// destination shard is written once, by the lowest rank of its replica
// group, in pieces no larger than the budget allows; the budget bounds
// memory whatever the checkpoint's size. Does not commit `out`.
Result<TransformStats> Transform(const CheckpointReader& src, const Strategy& dst,
                                 CheckpointWriter& out, const TransformOptions& options);

// Cuts `box` into row-major slabs of at most `max_bytes` each (at least one
// element per slab), in order.
std::vector<Box> SplitBox(const Box& box, int64_t element_size, int64_t max_bytes);

}  // namespace tessera

#endif  // TESSERA_CKPT_TRANSFORM_H_
