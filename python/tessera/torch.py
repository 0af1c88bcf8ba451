"""PyTorch helpers for tessera (imported on first use of `tessera.torch`).

Names follow train_gpt and the ckpt tools, so checkpoints move between a
PyTorch trainer, train_gpt and the CLI: a model's parameters and buffers by
their state-dict names, and Adam's moments as `optimizer.<param>.exp_avg` and
`optimizer.<param>.exp_avg_sq` (torch keys them by parameter index). Adam's
step count is the checkpoint's step.

numpy <-> torch conversions share memory (no copies) for CPU tensors; bf16,
which numpy lacks, travels as uint16 raw bits.

torch 1.13's ShardedTensor is not supported: under Python 3.11 importing
torch.distributed._shard fails unless the standard library's dataclasses is
patched, which a library must not do behind its user's back.
"""

import numpy as np
import torch

__all__ = ["to_numpy", "from_numpy", "named_tensors", "load_named", "TorchComm"]


def to_numpy(t):
    """A numpy view of a CPU tensor (bf16 as uint16 bits), no copy when contiguous."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def from_numpy(a, dtype=None):
    """A torch tensor over the numpy array's memory (no copy). `dtype="bf16"`
    (or torch.bfloat16) reads uint16 raw bits as bfloat16. A read-only array
    (a zero-copy read) is copied, since torch tensors are writable."""
    if not a.flags.writeable:
        a = a.copy()
    if dtype in ("bf16", torch.bfloat16):
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _param_names(model):
    return {id(p): n for n, p in model.named_parameters()}


def named_tensors(model, optimizer=None):
    """{name: numpy array} of a model's state dict and, when given, its Adam
    moments (`optimizer.<param>.exp_avg` / `.exp_avg_sq`), sharing memory."""
    out = {n: to_numpy(t) for n, t in model.state_dict().items()}
    if optimizer is not None:
        names = _param_names(model)
        for group in optimizer.param_groups:
            for p in group["params"]:
                state = optimizer.state.get(p, {})
                for key in ("exp_avg", "exp_avg_sq"):
                    if key in state:
                        out[f"optimizer.{names[id(p)]}.{key}"] = to_numpy(state[key])
    return out


def load_named(model, tensors, optimizer=None, step=None):
    """Copies named arrays (load_shards' or a reader's) into a model and, when
    given, an Adam-style optimizer's state (exp_avg, exp_avg_sq, and step: the
    checkpoint's). Every model tensor must be present; moments are optional."""
    with torch.no_grad():
        for name, t in model.state_dict(keep_vars=True).items():
            if name not in tensors:
                raise KeyError(f"tensor '{name}' of the model is not in what was loaded")
            src = from_numpy(np.ascontiguousarray(tensors[name]),
                             torch.bfloat16 if t.dtype == torch.bfloat16 else None)
            if tuple(src.shape) != tuple(t.shape):
                src = src.reshape(t.shape)
            t.copy_(src)
    if optimizer is None:
        return
    names = _param_names(model)
    for group in optimizer.param_groups:
        for p in group["params"]:
            n = names[id(p)]
            keys = [f"optimizer.{n}.exp_avg", f"optimizer.{n}.exp_avg_sq"]
            if not all(k in tensors for k in keys):
                continue
            state = optimizer.state[p]
            for key, k in zip(("exp_avg", "exp_avg_sq"), keys):
                state[key] = from_numpy(np.array(tensors[k], copy=True)).reshape(p.shape).to(p.dtype)
            state["step"] = torch.tensor(float(step or 0))


class TorchComm:
    """save_shards' comm over torch.distributed (a process group; default: the
    world). For async saves while training uses the default group, pass a
    group of its own: dist.new_group(backend="gloo")."""

    def __init__(self, group=None):
        import torch.distributed as dist
        self._dist = dist
        self.group = group

    def barrier(self):
        self._dist.barrier(group=self.group)

    def allgather_object(self, obj):
        out = [None] * self._dist.get_world_size(group=self.group)
        self._dist.all_gather_object(out, obj, group=self.group)
        return out
