#!/usr/bin/env python3
"""PyTorch's tokens/s for the GPT training step train_gpt runs: the same
model (the functional GPT-2 of tests/parity/gpt_parity.py), batch, sequence,
threads, AdamW with clipping, on random tokens.
Usage: torch_gpt.py LAYERS HEADS EMBED SEQ BATCH VOCAB THREADS STEPS"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "parity"))
from gpt_parity import forward, init_params  # noqa: E402


def main():
    L, NH, C, T, B, V, threads, steps = map(int, sys.argv[1:9])
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    p = init_params(L, C, T, V)
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
