// Megatron-LM's legacy checkpoints (--ckpt-format torch) behind the
// checkpoint reader, format "megatron": the model's tensors merged across
// tensor- and pipeline-parallel ranks (and virtual-pipeline chunks), each
// whole on a one-rank mesh and read in place from the rank files, so that
// `ckpt convert` gives the tp1/pp1 model and `ckpt reshard` any other
// layout.
//
// The path is a checkpoint directory (latest_checkpointed_iteration.txt
// names iter_NNNNNNN or release) or the iteration directory itself,
// holding mp_rank_TT/model_optim_rng.pt (pipeline size 1) or
// mp_rank_TT_PPP/model_optim_rng.pt, each {args, iteration, model or
// model0..model<v-1>, optimizer, rng_state, ...}. The sizes come from
// args (tensor_model_parallel_size, pipeline_model_parallel_size, and
// swiglu, quick_geglu or gated_linear_unit for a gated fc1).
//
// Names are the model's state-dict keys (legacy `language_model.encoder.
// layers.N...` or megatron.core `decoder.layers.N...`) with N the global
// layer number: the chunks, in the order virtual stage then pipeline rank,
// number their layers one after the other. How each tensor is cut over
// tensor-parallel ranks is this table, matched on the name's end
// (docs in ckpt/README.md):
//
//   rows (dim 0)    word_embeddings.weight, word_embeddings_for_head.weight,
//                   output_layer.weight (the padded vocabulary kept),
//                   query_key_value.{weight,bias}, linear_qkv.{weight,bias}
//                   (heads, or query groups, whole on a rank: checkpoint
//                   version >= 1), dense_h_to_4h.{weight,bias},
//                   linear_fc1.{weight,bias}
//   gated rows      the same fc1 tensors with a gated linear unit (args.swiglu,
//                   quick_geglu or gated_linear_unit): each rank holds
//                   [its gate rows; its up rows], merged as [gate; up]
//   columns (dim 1) self_attention.dense.weight, linear_proj.weight,
//                   dense_4h_to_h.weight, linear_fc2.weight
//   replicated      norms (*norm.{weight,bias}, layer_norm_{weight,bias}),
//                   position_embeddings.weight, the row-parallel layers'
//                   biases (self_attention.dense.bias, dense_4h_to_h.bias,
//                   linear_proj.bias, linear_fc2.bias): tensor-parallel rank 0's
//
// A tensor not in the table is refused by name when the tensor-parallel
// size is over 1 (it could be cut in a way the table does not know), and so
// are MoE experts (cut by expert_tensor_parallel_size) and Mamba mixers;
// so is a layer stack other than the decoder's (multi-token prediction, a
// vision model) across pipeline stages, and checkpoint version 0 (or none:
// Megatron reads a missing version as 0) with tensor parallelism. TE's
// `_extra_state` entries are left out. The optimizer state, whose flat
// per-rank layout needs the model's parameter order, is not read (its
// tensors are counted in the metadata). Expert parallelism is refused by
// name. The rest of the objects (args' fields, the iteration) is the
// metadata, "megatron.<path>".
#ifndef TESSERA_CKPT_MEGATRON_CKPT_H_
#define TESSERA_CKPT_MEGATRON_CKPT_H_

#include <memory>
#include <string>

#include "ckpt/checkpoint.h"

namespace tessera {

bool IsMegatronCheckpoint(Env* env, const std::string& path);

Result<std::unique_ptr<CheckpointReader>> OpenMegatronCheckpoint(Env* env, const std::string& path);

}  // namespace tessera

#endif  // TESSERA_CKPT_MEGATRON_CKPT_H_
