#!/usr/bin/env python3
"""PyTorch's tokens/s for the GPT training step train_gpt runs: the same
model (the functional GPT-2 of tests/parity/gpt_parity.py), batch, sequence,
threads, AdamW with clipping, on random tokens.
Usage: torch_gpt.py LAYERS HEADS EMBED SEQ BATCH VOCAB THREADS STEPS"""
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "parity"))
from gpt_parity import forward  # noqa: E402


def main():
    L, NH, C, T, B, V, threads, steps = map(int, sys.argv[1:9])
    torch.set_num_threads(threads)
    torch.manual_seed(1)
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
    for v in p.values():
        v.requires_grad_(True)
    opt = torch.optim.AdamW(list(p.values()), lr=3e-4, weight_decay=0.1)
    cfg = {"layers": L, "heads": NH, "embed": C}
    idx = torch.randint(0, min(V, 256), (B, T))
    targets = torch.randint(0, min(V, 256), (B, T))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        _, loss = forward(p, idx, targets, cfg)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(p.values()), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    timed = times[1:] if len(times) > 1 else times
    print(f"torch: {B * T * len(timed) / sum(timed):.0f} tokens/s "
          f"(mean of {len(timed)} steps after the first; torch {torch.__version__})")


if __name__ == "__main__":
    main()
