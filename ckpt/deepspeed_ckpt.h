// DeepSpeed ZeRO checkpoints (stages 1, 2 and 3, fp16/fp32 and the bf16
// optimizer's files) behind the checkpoint reader, format "deepspeed":
// the tensors zero_to_fp32.py reassembles, and the optimizer's moments,
// each whole on a one-rank mesh and read in place from the ranks' flat
// partitions (nothing is loaded whole, so a conversion stays within the
// writer's memory budget whatever the model's size).
//
// The path is a directory with a `latest` file naming the tag directory
// (global_stepN), or the tag directory itself, holding
//   [bf16_]zero_pp_rank_<d>_mp_rank_00_optim_states.pt   one per dp rank d
//   mp_rank_00_model_states.pt                           stages 1 and 2
//   zero_pp_rank_<d>_mp_rank_00_model_states.pt          stage 3
// Tensors (names as in the model's state dict, from `param_shapes`):
//   <param>                    the fp32 master weights: stages 1/2 cut the
//                              concatenation of a group's parameters into
//                              equal dp partitions (alignment padding at the
//                              end); stage 3 cuts each parameter into dp
//                              parts of ceil(numel / dp) elements
//   optimizer.<param>.<key>    each per-element state of the optimizer
//                              (Adam's exp_avg, exp_avg_sq), cut as the
//                              weights are
//   <buffer>                   the model's buffers, as stored
//   <frozen param>             frozen parameters (frozen_param_fragments)
//   <alias>                    shared parameters (shared_params), the
//                              bytes of the parameter they share
// The rest (global_steps, the ZeRO stage, the loss scaler's state, the
// DeepSpeed config object's fields) is the metadata, "deepspeed.<path>".
// Model-parallel DeepSpeed checkpoints (tensor or pipeline parallel:
// mp_rank_01 and up, PipelineEngine's layer files), mixture-of-experts
// ones (expp_rank_* files, groups partitioned over different data-parallel
// sizes) and universal ones (latest_universal) are refused by name. Reads
// verify the zip records' CRC-32s.
#ifndef TESSERA_CKPT_DEEPSPEED_CKPT_H_
#define TESSERA_CKPT_DEEPSPEED_CKPT_H_

#include <memory>
#include <string>

#include "ckpt/checkpoint.h"

namespace tessera {

bool IsDeepSpeedCheckpoint(Env* env, const std::string& path);

Result<std::unique_ptr<CheckpointReader>> OpenDeepSpeedCheckpoint(Env* env,
                                                                  const std::string& path);

}  // namespace tessera

#endif  // TESSERA_CKPT_DEEPSPEED_CKPT_H_
