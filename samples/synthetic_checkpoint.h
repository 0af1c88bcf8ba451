// A checkpoint whose values are computed, not stored: element i of tensor t
// is a deterministic function of (seed, t's name, i). It reads like any
// other checkpoint, so writing it out through ckpt/ makes test and
// benchmark checkpoints of any size in constant memory.
#ifndef TESSERA_SAMPLES_SYNTHETIC_CHECKPOINT_H_
#define TESSERA_SAMPLES_SYNTHETIC_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"

namespace tessera::samples {

class SyntheticCheckpoint : public CheckpointReader {
 public:
  // Tensors as `strategy` lists them (the layouts are recorded; values do
  // not depend on them).
  SyntheticCheckpoint(Strategy strategy, uint64_t seed, int64_t step = 0);

  const std::string& path() const override { return path_; }
  std::string_view format() const override { return "synthetic"; }
  const Strategy& strategy() const override { return strategy_; }
  const CheckpointMeta& meta() const override { return meta_; }
  TensorStorage Storage(size_t) const override { return {}; }
  Status ReadRegion(size_t index, const Box& region, void* dst,
                    const std::vector<int64_t>& dst_extents, const Box& dst_box) const override;

 private:
  std::string path_;
  Strategy strategy_;
  CheckpointMeta meta_;
  std::vector<uint64_t> keys_;  // per tensor
};

}  // namespace tessera::samples

#endif  // TESSERA_SAMPLES_SYNTHETIC_CHECKPOINT_H_
