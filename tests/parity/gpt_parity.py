#!/usr/bin/env python3
"""The PyTorch reference for the GPT parity test (tests/parity/gpt_parity.cc).

Reads the initial weights, tokens and hyper-parameters from a safetensors
file written by the C++ side, defines the same GPT-2 model in PyTorch
(Debian's python3-torch), runs forward/backward/AdamW for the requested
steps, and writes the step-0 logits and gradients and the loss of every
step to a safetensors file. safetensors is read and written here with
numpy from the spec (8-byte length, JSON header, packed data), so the
exchange does not depend on the C++ reader.
"""
import json
import math
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

DTYPES = {"F32": np.float32, "I32": np.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, v in header.items():
        begin, end = v["data_offsets"]
        out[name] = np.frombuffer(data[begin:end], dtype=DTYPES[v["dtype"]]).reshape(v["shape"])
    return meta, out


def write_safetensors(path, tensors):
    header, chunks, offset = {}, [], 0
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        chunks.append(arr.tobytes())
        offset += arr.nbytes
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)


def init_params(L, C, T, V):
    """GPT-2's parameters in checkpoint order with a GPT-2-like init (for the
    benchmarks; the parity test reads its weights from the C++ side)."""
    p = {"wte": torch.randn(V, C) * 0.02, "wpe": torch.randn(T, C) * 0.01}
    for i in range(L):
        h = f"h.{i}."
        for name, shape in [("ln_1.weight", (C,)), ("ln_1.bias", (C,)),
                            ("attn.c_attn.weight", (C, 3 * C)), ("attn.c_attn.bias", (3 * C,)),
                            ("attn.c_proj.weight", (C, C)), ("attn.c_proj.bias", (C,)),
                            ("ln_2.weight", (C,)), ("ln_2.bias", (C,)),
                            ("mlp.c_fc.weight", (C, 4 * C)), ("mlp.c_fc.bias", (4 * C,)),
                            ("mlp.c_proj.weight", (4 * C, C)), ("mlp.c_proj.bias", (C,))]:
            p[h + name] = torch.randn(*shape) * 0.02 if len(shape) == 2 else (
                torch.ones(shape) if name.endswith("ln_1.weight") or name.endswith("ln_2.weight")
                else torch.zeros(shape))
    p["ln_f.weight"], p["ln_f.bias"] = torch.ones(C), torch.zeros(C)
    return p


def forward(p, idx, targets, cfg):
    L, NH, C = cfg["layers"], cfg["heads"], cfg["embed"]
    B, T = idx.shape
    hs = C // NH
    x = p["wte"][idx] + p["wpe"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(L):
        h = f"h.{i}."
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], 1e-5)
        qkv = a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"]
        m = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], 1e-5)
        m = F.gelu(m @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"], approximate="tanh")
        x = x + m @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    # GPT-2 ties the output projection to wte; --untied-head has its own.
    logits = x @ p.get("lm_head.weight", p["wte"]).T
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
    return logits, loss


def main():
    meta, t = read_safetensors(sys.argv[1])
    cfg = {k: int(meta[k]) for k in ("layers", "heads", "embed", "steps")}
    lr, wd, clip = float(meta["lr"]), float(meta["weight_decay"]), float(meta["max_norm"])
    idx = torch.from_numpy(t.pop("tokens").astype(np.int64))
    targets = torch.from_numpy(t.pop("targets").astype(np.int64))
    p = {name: torch.tensor(arr, requires_grad=True) for name, arr in t.items()}
    decay = [v for v in p.values() if v.dim() >= 2]
    no_decay = [v for v in p.values() if v.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.999), eps=1e-8)
    out, losses = {}, []
    for step in range(cfg["steps"]):
        opt.zero_grad()
        logits, loss = forward(p, idx, targets, cfg)
        loss.backward()
        if step == 0:
            out["logits"] = logits.detach().numpy()
            for name, v in p.items():
                out["grad." + name] = v.grad.numpy().copy()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(list(p.values()), clip)
        opt.step()
        losses.append(loss.item())
    out["loss"] = np.array(losses, dtype=np.float32)
    write_safetensors(sys.argv[2], out)


if __name__ == "__main__":
    main()
