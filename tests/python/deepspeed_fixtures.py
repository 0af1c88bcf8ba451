"""SYNTHESIZED DeepSpeed ZeRO checkpoints: DeepSpeed cannot be installed
here, so these files are written by this generator, which follows
DeepSpeed's writer code (deepspeed/runtime/engine.py _save_checkpoint and
_save_zero_checkpoint, runtime/zero/stage_1_and_2.py and stage3.py
state_dict, runtime/bf16_optimizer.py state_dict; v0.16):

* the files and their names: <dir>/latest (the tag), <tag>/mp_rank_00_model_states.pt
  (stages 1/2) or <tag>/zero_pp_rank_<d>_mp_rank_00_model_states.pt (stage 3),
  <tag>/[bf16_]zero_pp_rank_<d>_mp_rank_00_optim_states.pt;
* the objects, pickled by Debian's PyTorch 1.13 torch.save with stand-in
  classes under DeepSpeed's real module and class names
  (deepspeed.runtime.zero.config.ZeroStageEnum, an IntEnum;
  deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler;
  deepspeed.runtime.config.DeepSpeedConfig);
* the partitioning: stages 1/2 flatten each parameter group, pad it to a
  multiple of 2 x dp (nccl_start_alignment_factor x dp) and cut it into dp
  equal partitions, the last rank's saved without its padding (the bf16
  optimizer keeps it); stage 3 cuts every parameter into dp parts of
  ceil(numel / dp) elements, the last zero-padded, each rank's flat group
  the concatenation of its parts. The optimizer's moments (Adam exp_avg,
  exp_avg_sq) are partitioned as the fp32 weights are (padded, or lean in an
  elastic checkpoint's list of group states).

`reference(tag_dir)` is an independent NumPy re-implementation of
zero_to_fp32.py's arithmetic (torch.load of every file, concatenation and
narrowing per group for stages 1/2, per-parameter zipping for stage 3),
applied to the weights and, the same way, to the moments.
"""
import collections
import enum
import math
import os
import sys
import types

import numpy as np
import torch


def _module(name):
    if name not in sys.modules:
        sys.modules[name] = types.ModuleType(name)
    return sys.modules[name]


class ZeroStageEnum(enum.IntEnum):
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3


class DynamicLossScaler:
    def __init__(self, scale):
        self.cur_scale = scale
        self.cur_iter = 7
        self.last_overflow_iter = -1
        self.scale_factor = 2.0
        self.scale_window = 1000
        self.min_scale = 1
        self.delayed_shift = 1
        self.cur_hysteresis = 1
        self.consecutive_hysteresis = False
        self.raise_error_at_min_scale = True
        self.dtype = torch.float16


class DeepSpeedConfig:
    def __init__(self, stage, dp):
        self.train_batch_size = 8 * dp
        self.gradient_accumulation_steps = 1
        self.zero_config = {"stage": stage, "overlap_comm": True}
        self.optimizer_name = "adam"
        self.optimizer_params = {"lr": 1e-3, "betas": [0.9, 0.999]}


for _cls, _mod in [(ZeroStageEnum, "deepspeed.runtime.zero.config"),
                   (DynamicLossScaler, "deepspeed.runtime.fp16.loss_scaler"),
                   (DeepSpeedConfig, "deepspeed.runtime.config")]:
    parts = _mod.split(".")
    for i in range(1, len(parts) + 1):
        _module(".".join(parts[:i]))
    _cls.__module__ = _mod
    setattr(sys.modules[_mod], _cls.__name__, _cls)

DS_VERSION = "0.16.4"


def model(seed=0, sizes=((7, 5), (5,), (3, 7), (3,), (11,))):
    """A small model: parameter groups (names -> fp32 tensors), odd sizes so
    that partitions cut parameters and groups need padding."""
    g = torch.Generator().manual_seed(seed)
    names = ["h.0.fc.weight", "h.0.fc.bias", "h.0.proj.weight", "h.0.proj.bias", "ln_f.weight"]
    params = collections.OrderedDict(
        (n, torch.randn(*s, generator=g)) for n, s in zip(names, sizes))
    # Two groups, as a weight-decay split makes them.
    groups = [[n for n in names if n.endswith("weight")], [n for n in names if n.endswith("bias")]]
    return params, groups


def _moments(params, g):
    return {k: {n: torch.randn(p.shape, generator=g).abs() * s for n, p in params.items()}
            for k, s in (("exp_avg", 1e-2), ("exp_avg_sq", 1e-4))}


def write(root, stage, dp, params, groups, *, bf16=False, elastic=False, buffers=None,
          frozen=None, shared=None, tag="global_step7", seed=1):
    """Writes a ZeRO checkpoint of `params` (fp32 masters) with Adam moments
    under root/tag and root/latest; returns the moments (name -> key -> tensor)."""
    g = torch.Generator().manual_seed(seed)
    moments = _moments(params, g)
    buffers = buffers or {}
    frozen = frozen or {}
    shared = shared or {}
    d = os.path.join(root, tag)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(root, "latest"), "w") as f:
        f.write(tag)
    config = DeepSpeedConfig(stage, dp)
    if stage <= 2:
        _write_zero12(d, stage, dp, params, groups, moments, bf16, elastic, config)
    else:
        _write_zero3(d, dp, params, groups, moments, config)
    _write_models(d, stage, dp, params, groups, buffers, frozen, shared, config)
    return moments


def _write_zero12(d, stage, dp, params, groups, moments, bf16, elastic, config):
    align = 2 * dp
    fp32, states, paddings = [[] for _ in range(dp)], [[] for _ in range(dp)], []
    for gi, names in enumerate(groups):
        flat = torch.cat([params[n].reshape(-1) for n in names])
        padded = math.ceil(flat.numel() / align) * align
        part = padded // dp
        pad = padded - flat.numel()
        paddings.append(pad)

        def cut(t, r, lean):
            full = torch.cat([t, torch.zeros(pad, dtype=t.dtype)])
            piece = full[r * part:(r + 1) * part].clone()
            if lean and r == dp - 1:
                piece = piece[:part - pad].clone()
            return piece
        flat_m = {k: torch.cat([moments[k][n].reshape(-1) for n in names]) for k in moments}
        for r in range(dp):
            fp32[r].append(cut(flat, r, not bf16))
            st = {"step": torch.tensor(7.0)}
            st.update({k: cut(v, r, elastic) for k, v in flat_m.items()})
            states[r].append(st)
    for r in range(dp):
        if elastic:
            base = states[r]
        else:
            base = {"state": {gi: s for gi, s in enumerate(states[r])},
                    "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8,
                                      "weight_decay": 0.0, "params": [gi]}
                                     for gi in range(len(groups))]}
        osd = {"clip_grad": 1.0, "base_optimizer_state": base,
               "single_partition_of_fp32_groups": fp32[r],
               "group_paddings": [p if r == dp - 1 else 0 for p in paddings],
               "partition_count": [dp] * len(groups), "ds_version": DS_VERSION,
               "param_slice_mappings": []}
        if not bf16:
            osd = dict({"loss_scaler": DynamicLossScaler(65536.0), "dynamic_loss_scale": True,
                        "overflow": False}, **osd)
            osd["zero_stage"] = ZeroStageEnum(stage)
        name = f"{'bf16_' if bf16 else ''}zero_pp_rank_{r}_mp_rank_00_optim_states.pt"
        torch.save({"optimizer_state_dict": osd, "ds_config": config, "ds_version": DS_VERSION},
                   os.path.join(d, name))


def _parts(t, dp):
    """Stage 3's cut of one parameter: dp parts of ceil(numel / dp), zero-padded."""
    n = t.numel()
    part = math.ceil(n / dp)
    full = torch.cat([t.reshape(-1), torch.zeros(part * dp - n, dtype=t.dtype)])
    return [full[r * part:(r + 1) * part].clone() for r in range(dp)]


def _write_zero3(d, dp, params, groups, moments, config):
    for r in range(dp):
        flats, state = [], {}
        for gi, names in enumerate(groups):
            flats.append(torch.cat([_parts(params[n], dp)[r] for n in names]))
            state[gi] = {"step": torch.tensor(7.0)}
            for k in moments:
                state[gi][k] = torch.cat([_parts(moments[k][n], dp)[r] for n in names])
        osd = {"zero_stage": ZeroStageEnum.weights, "loss_scaler": DynamicLossScaler(1.0),
               "dynamic_loss_scale": False, "overflow": False, "partition_count": dp,
               "optimizer_state_dict": {"state": state, "param_groups": [
                   {"lr": 1e-3, "params": [gi]} for gi in range(len(groups))]},
               "fp32_flat_groups": flats}
        torch.save({"optimizer_state_dict": osd, "ds_config": config, "ds_version": DS_VERSION},
                   os.path.join(d, f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))


def _write_models(d, stage, dp, params, groups, buffers, frozen, shared, config):
    shapes = [collections.OrderedDict((n, params[n].shape) for n in names) for names in groups]
    save_frozen = stage >= 2
    for r in range(dp if stage == 3 else 1):
        module = collections.OrderedDict()
        for n, p in params.items():
            module[n] = torch.empty(0) if stage == 3 else p.half()
        for n, b in buffers.items():
            module[n] = b
        fragments = None
        if save_frozen:
            fragments = collections.OrderedDict(
                (n, _parts(t, dp)[r] if stage == 3 else t) for n, t in frozen.items())
        state = dict(module=module, buffer_names=list(buffers), optimizer=None,
                     param_shapes=shapes,
                     frozen_param_shapes=collections.OrderedDict(
                         (n, t.shape) for n, t in frozen.items()) if save_frozen else None,
                     shared_params=dict(shared), frozen_param_fragments=fragments,
                     lr_scheduler=None, data_sampler=None, random_ltd=None,
                     sparse_tensor_module_names=set(), skipped_steps=0, global_steps=7,
                     global_samples=56, dp_world_size=dp, mp_world_size=1, ds_config=config,
                     ds_version=DS_VERSION)
        name = "mp_rank_00_model_states.pt" if stage <= 2 else \
            f"zero_pp_rank_{r}_mp_rank_00_model_states.pt"
        torch.save(state, os.path.join(d, name))


def _np(t):
    return t.detach().contiguous().numpy()


def reference(tag_dir):
    """zero_to_fp32's arithmetic in NumPy: name -> array for the fp32
    weights, the frozen parameters, the buffers and the shared aliases, and
    "optimizer.<name>.<key>" for the moments."""
    files = sorted(os.listdir(tag_dir))
    optim = [f for f in files if f.endswith("_optim_states.pt")]
    optim.sort(key=lambda f: int(f.split("zero_pp_rank_")[1].split("_")[0]))
    sds = [torch.load(os.path.join(tag_dir, f), weights_only=False)["optimizer_state_dict"]
           for f in optim]
    stage = int(sds[0].get("zero_stage", 1))
    world = sds[0]["partition_count"]
    world = max(world) if isinstance(world, list) else world
    assert world == len(sds)
    models = [f for f in files if f.endswith("_model_states.pt")]
    models.sort(key=lambda f: int(f.split("zero_pp_rank_")[1].split("_")[0]) if stage == 3 else 0)
    ms = [torch.load(os.path.join(tag_dir, f), weights_only=False) for f in models]
    out = collections.OrderedDict()
    for b in ms[0]["buffer_names"]:
        out[b] = _np(ms[0]["module"][b])
    frozen = ms[0]["frozen_param_shapes"] or {}
    for n, shape in frozen.items():
        numel = int(np.prod(shape))
        if stage <= 2:
            out[n] = _np(ms[0]["frozen_param_fragments"][n])
        else:
            cat = np.concatenate([_np(m["frozen_param_fragments"][n]) for m in ms])
            out[n] = cat[:numel].reshape(tuple(shape))

    def state_of(sd, gi):
        if stage == 3:
            return sd["optimizer_state_dict"]["state"][gi]
        base = sd["base_optimizer_state"]
        return base[gi] if isinstance(base, list) else base["state"][gi]
    keys = ["exp_avg", "exp_avg_sq"]
    if stage <= 2:
        key = "single_partition_of_fp32_groups"
        for gi, shapes in enumerate(ms[0]["param_shapes"]):
            sizes = [_np(sd[key][gi]).size for sd in sds]
            flats = {"": np.concatenate([_np(sd[key][gi]) for sd in sds])}
            for k in keys:  # the moments' partitions cut where the weights' are
                flats[k] = np.concatenate([_np(state_of(sd, gi)[k])[:s] for sd, s in zip(sds, sizes)])
            offset = 0
            for n, shape in shapes.items():
                numel = int(np.prod(shape))
                for k, flat in flats.items():
                    out[n if not k else f"optimizer.{n}.{k}"] = \
                        flat[offset:offset + numel].reshape(tuple(shape))
                offset += numel
            align = 2 * world
            assert math.ceil(offset / align) == math.ceil(flats[""].size / align)
    else:
        shapes = collections.OrderedDict((n, s) for g in ms[0]["param_shapes"] for n, s in g.items())
        flats = {"": [np.concatenate([_np(t) for t in sd["fp32_flat_groups"]]) for sd in sds]}
        for k in keys:
            flats[k] = [np.concatenate([_np(state_of(sd, gi)[k])
                                        for gi in range(len(sd["fp32_flat_groups"]))]) for sd in sds]
        offset = 0
        for n, shape in shapes.items():
            numel = int(np.prod(shape))
            part = math.ceil(numel / world)
            for k, per_rank in flats.items():
                cat = np.concatenate([f[offset:offset + part] for f in per_rank])
                out[n if not k else f"optimizer.{n}.{k}"] = cat[:numel].reshape(tuple(shape))
            offset += part
        assert offset == flats[""][0].size
    for alias, target in ms[0]["shared_params"].items():
        if target in out:
            out[alias] = out[target]
    return out
