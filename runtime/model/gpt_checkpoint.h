// Saving and resuming a single-process GPT through ckpt/ (the native
// format): every parameter, its Adam moments ("optimizer.<name>.exp_avg",
// "optimizer.<name>.exp_avg_sq", the names make_checkpoint and the sliced
// checkpoints use), the step, and caller metadata (config, data position).
#ifndef TESSERA_RUNTIME_MODEL_GPT_CHECKPOINT_H_
#define TESSERA_RUNTIME_MODEL_GPT_CHECKPOINT_H_

#include <map>
#include <string>

#include "ckpt/checkpoint.h"
#include "core/env.h"
#include "runtime/model/gpt.h"

namespace tessera {

struct SaveGptOptions {
  // The dtype parameters are stored in (f32, bf16, f16, f64): narrower ones
  // round to nearest even and suit exports, not resuming.
  DType weights_dtype = DType::kF32;
  // false: parameters only (an export); the Adam moments are left out.
  bool optimizer_state = true;
  // Replace a checkpoint of the same name (a resumed run's, left by an
  // abandoned one) instead of failing.
  bool overwrite = false;
};

// Writes a complete checkpoint of a whole model (not a tp slice: gather it
// first) at `root`/`name` (atomic: built aside, renamed into place), then
// points `root`/latest at it.
Status SaveGpt(Env* env, const Gpt& model, const std::string& root, const std::string& name,
               const std::map<std::string, std::string>& metadata,
               const SaveGptOptions& options = {});

// Region `region` (over p.split_shape(), inside p.box) of tensor `name` of
// `reader`, as f32 into `out` (its extents, row-major): the checks LoadGpt
// makes (the shape, a floating dtype), errors naming the tensor.
Status ReadGptRegion(const CheckpointReader& reader, const std::string& name, const ParamInfo& p,
                     const Box& region, float* out);
// Whether `reader` holds optimizer state (an export has none).
bool HasOptimizerState(const CheckpointReader& reader);

// Loads parameters, moments and step from an open checkpoint (OpenCheckpoint
// takes a directory, or a root with `latest`; check reader.meta() first) into
// `model`, whose config must give the same names and shapes; a missing
// tensor or another shape is an error naming it. A pipeline stage or tp
// slice reads only its own tensors and boxes, whatever layout they were
// saved with (reshard on load). Tensors stored in f16,
// bf16 or f64 are widened (or rounded) to f32. A checkpoint without any
// optimizer state (an export) loads the parameters and starts the optimizer
// afresh: zero moments, step 0.
Status LoadGpt(const CheckpointReader& reader, Gpt* model);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_GPT_CHECKPOINT_H_
