"""SYNTHESIZED Megatron-LM legacy checkpoints (--ckpt-format torch): Megatron
cannot run here, so this generator follows its writer code
(megatron/training/checkpointing.py: get_checkpoint_name, generate_state_dict,
the tracker file; the legacy model's state_dict_for_save_checkpoint and
megatron.core GPTModel's state dict; v0.12 names):

* <root>/latest_checkpointed_iteration.txt ("100"), <root>/iter_0000100/
  mp_rank_TT/model_optim_rng.pt (pipeline size 1) or mp_rank_TT_PPP/...;
* each file torch.save({'args': argparse.Namespace, 'checkpoint_version':
  3.0, 'iteration', 'model' or 'model0'.., 'optimizer', 'opt_param_scheduler',
  'rng_state'}) by Debian's PyTorch 1.13;
* a GPT cut as Megatron cuts it: embeddings and the output layer by
  vocabulary rows, QKV and fc1 by rows (fc1 as [gate; up] per rank with
  swiglu), the attention projection and fc2 by columns, norms and the
  row-parallel biases replicated; layers split evenly over pipeline stages
  and virtual chunks (chunk v of stage p holds layers
  v * L/vp + p * L/(pp*vp) ...), numbered from 0 in each chunk.

`model(family, ...)` gives the unsharded tensors under the names Tessera
should report (global layer numbers)."""
import argparse
import collections
import os

import torch


def model(family="mcore", layers=4, hidden=8, heads=2, ffn=16, vocab=16, seq=12, swiglu=False,
          seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g)
    fc1 = 2 * ffn if swiglu else ffn
    out = collections.OrderedDict()
    if family == "mcore":
        out["embedding.word_embeddings.weight"] = r(vocab, hidden)
        out["embedding.position_embeddings.weight"] = r(seq, hidden)
        for i in range(layers):
            p = f"decoder.layers.{i}."
            out[p + "self_attention.linear_qkv.layer_norm_weight"] = r(hidden)
            out[p + "self_attention.linear_qkv.weight"] = r(3 * hidden, hidden)
            out[p + "self_attention.linear_qkv.bias"] = r(3 * hidden)
            out[p + "self_attention.linear_proj.weight"] = r(hidden, hidden)
            out[p + "self_attention.linear_proj.bias"] = r(hidden)
            out[p + "mlp.linear_fc1.layer_norm_weight"] = r(hidden)
            out[p + "mlp.linear_fc1.weight"] = r(fc1, hidden)
            out[p + "mlp.linear_fc1.bias"] = r(fc1)
            out[p + "mlp.linear_fc2.weight"] = r(hidden, ffn)
            out[p + "mlp.linear_fc2.bias"] = r(hidden)
        out["decoder.final_layernorm.weight"] = r(hidden)
        out["output_layer.weight"] = r(vocab, hidden)
    else:
        out["language_model.embedding.word_embeddings.weight"] = r(vocab, hidden)
        out["language_model.embedding.position_embeddings.weight"] = r(seq, hidden)
        for i in range(layers):
            p = f"language_model.encoder.layers.{i}."
            out[p + "input_norm.weight"] = r(hidden)
            out[p + "input_norm.bias"] = r(hidden)
            out[p + "self_attention.query_key_value.weight"] = r(3 * hidden, hidden)
            out[p + "self_attention.query_key_value.bias"] = r(3 * hidden)
            out[p + "self_attention.dense.weight"] = r(hidden, hidden)
            out[p + "self_attention.dense.bias"] = r(hidden)
            out[p + "post_attention_norm.weight"] = r(hidden)
            out[p + "post_attention_norm.bias"] = r(hidden)
            out[p + "mlp.dense_h_to_4h.weight"] = r(fc1, hidden)
            out[p + "mlp.dense_h_to_4h.bias"] = r(fc1)
            out[p + "mlp.dense_4h_to_h.weight"] = r(hidden, ffn)
            out[p + "mlp.dense_4h_to_h.bias"] = r(hidden)
        out["language_model.encoder.final_norm.weight"] = r(hidden)
        out["language_model.encoder.final_norm.bias"] = r(hidden)
        out["language_model.output_layer.weight"] = r(vocab, hidden)
    return out


ROWS = ("word_embeddings.weight", "output_layer.weight", "query_key_value.weight",
        "query_key_value.bias", "linear_qkv.weight", "linear_qkv.bias")
FC1 = ("dense_h_to_4h.weight", "dense_h_to_4h.bias", "linear_fc1.weight", "linear_fc1.bias")
COLUMNS = ("self_attention.dense.weight", "linear_proj.weight", "dense_4h_to_h.weight",
           "linear_fc2.weight")


def cut(name, t, tp, rank, swiglu):
    if name.endswith(FC1) and swiglu:
        gate, up = t.chunk(2)
        return torch.cat([gate.chunk(tp)[rank], up.chunk(tp)[rank]]).clone()
    if name.endswith(ROWS) or name.endswith(FC1):
        return t.chunk(tp)[rank].clone()
    if name.endswith(COLUMNS):
        return t.chunk(tp, dim=1)[rank].clone()
    return t.clone()


def chunk_of(name, layers, pp, vp):
    """(pipeline rank, virtual chunk, local name) of a global name."""
    per = layers // (pp * vp)
    parts = name.split(".")
    if "layers" in parts:
        k = parts.index("layers")
        i = int(parts[k + 1])
        v, rest = divmod(i, layers // vp)
        p, local = divmod(rest, per)
        parts[k + 1] = str(local)
        return p, v, ".".join(parts)
    if "embedding" in parts:
        return 0, 0, name
    return pp - 1, vp - 1, name


def nest(family, flat):
    """The state dict as the family's model saves it: megatron.core flat;
    legacy nested (language_model -> embedding/encoder/output_layer)."""
    if family == "mcore":
        return flat
    out = collections.OrderedDict()
    for name, t in flat.items():
        rest = name[len("language_model."):]
        head, tail = rest.split(".", 1)
        lm = out.setdefault("language_model", collections.OrderedDict())
        if head == "encoder":
            lm.setdefault("encoder", collections.OrderedDict())[tail] = t
        else:
            d = lm.setdefault(head, collections.OrderedDict())
            *path, last = tail.split(".")
            for k in path:
                d = d.setdefault(k, collections.OrderedDict())
            d[last] = t
    return out


def write(root, full, family="mcore", tp=1, pp=1, vp=1, swiglu=False, layers=4, iteration=100,
          version=3.0, gated_flag="swiglu"):
    """swiglu: fc1 is gated, said by args.<gated_flag> (swiglu, quick_geglu or
    gated_linear_unit); version None: no checkpoint_version key."""
    it = os.path.join(root, f"iter_{iteration:07d}")
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(iteration))
    g = torch.Generator().manual_seed(7)
    for p in range(pp):
        for t in range(tp):
            chunks = [collections.OrderedDict() for _ in range(vp)]
            for name, tensor in full.items():
                cp, cv, local = chunk_of(name, layers, pp, vp)
                if cp == p:
                    chunks[cv][local] = cut(name, tensor, tp, t, swiglu)
            for c in chunks:  # TE's extra state: left out by readers
                if family == "mcore":
                    c["decoder.layers.0.self_attention.core_attention._extra_state"] = \
                        torch.zeros(4, dtype=torch.uint8)
            args = argparse.Namespace(
                tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                virtual_pipeline_model_parallel_size=vp if vp > 1 else None, num_layers=layers,
                padded_vocab_size=full[next(n for n in full if "word_emb" in n)].shape[0],
                ckpt_format="torch", use_distributed_optimizer=False, lr=3e-4)
            setattr(args, gated_flag, swiglu)
            state = {"args": args, "iteration": iteration}
            if version is not None:
                state["checkpoint_version"] = version
            if vp == 1:
                state["model"] = nest(family, chunks[0])
            else:
                for v in range(vp):
                    state[f"model{v}"] = nest(family, chunks[v])
            state["optimizer"] = {"optimizer": {"state": {0: {"exp_avg": torch.randn(5, generator=g)}},
                                                "param_groups": [{"lr": 3e-4, "params": [0]}]},
                                  "fp32_from_fp16_params": [[torch.randn(5, generator=g)]]}
            state["opt_param_scheduler"] = {"num_steps": iteration}
            state["rng_state"] = [{"random_rng_state": (3, (1, 2), None),
                                   "torch_rng_state": torch.zeros(8, dtype=torch.uint8),
                                   "rng_tracker_states": b"x"}]
            d = os.path.join(it, f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else ""))
            os.makedirs(d, exist_ok=True)
            torch.save(state, os.path.join(d, "model_optim_rng.pt"))
