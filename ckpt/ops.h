// File-to-file operations the CLI and trainers call: open any checkpoint,
// and write one under a new strategy with an atomic commit.
#ifndef TESSERA_CKPT_OPS_H_
#define TESSERA_CKPT_OPS_H_

#include <memory>
#include <string>

#include "ckpt/checkpoint.h"
#include "ckpt/native.h"
#include "ckpt/transform.h"

namespace tessera {

// Opens a checkpoint, recognising its format from its content.
Result<std::unique_ptr<CheckpointReader>> OpenCheckpoint(Env* env, const std::string& path);

struct WriteOptions {
  NativeWriteOptions native;
  TransformOptions transform;
};

// Writes every tensor of `src` under `dst` (completed with CompleteStrategy
// by the caller or not: tensors `dst` leaves out stay whole) to `out_path`,
// committed atomically; on any failure nothing is left at `out_path` and
// the temporary directory is removed.
Result<TransformStats> WriteTransformed(Env* env, const CheckpointReader& src, const Strategy& dst,
                                        const std::string& out_path, const WriteOptions& options);

}  // namespace tessera

#endif  // TESSERA_CKPT_OPS_H_
