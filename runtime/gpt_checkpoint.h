// Saving and resuming a single-process GPT through ckpt/ (the native
// format): every parameter, its Adam moments ("optimizer.<name>.exp_avg",
// "optimizer.<name>.exp_avg_sq", the names make_checkpoint and the sliced
// checkpoints use), the step, and caller metadata (config, data position).
#ifndef TESSERA_RUNTIME_GPT_CHECKPOINT_H_
#define TESSERA_RUNTIME_GPT_CHECKPOINT_H_

#include <map>
#include <string>

#include "ckpt/checkpoint.h"
#include "core/env.h"
#include "runtime/gpt.h"

namespace tessera {

// Writes a complete checkpoint at `root`/`name` (atomic: built aside,
// renamed into place), then points `root`/latest at it.
Status SaveGpt(Env* env, const Gpt& model, const std::string& root, const std::string& name,
               const std::map<std::string, std::string>& metadata);

// Loads parameters, moments and step from an open checkpoint (OpenCheckpoint
// takes a directory, or a root with `latest`; check reader.meta() first) into
// `model`, whose config must give the same names and shapes; a missing
// tensor or another shape is an error naming it.
Status LoadGpt(const CheckpointReader& reader, Gpt* model);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_GPT_CHECKPOINT_H_
