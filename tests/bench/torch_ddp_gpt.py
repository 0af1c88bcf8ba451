#!/usr/bin/env python3
"""PyTorch DDP (gloo, N processes, 1 thread each) tokens/s for the GPT
training step that train_gpt runs data-parallel: the same functional GPT-2
(tests/parity/gpt_parity.py) wrapped in a module, the global batch split
over the processes, AdamW with clipping.
Usage: torch_ddp_gpt.py LAYERS HEADS EMBED SEQ BATCH VOCAB PROCESSES STEPS"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "parity"))
from gpt_parity import forward, init_params  # noqa: E402


class Gpt(torch.nn.Module):
    def __init__(self, L, C, T, V):
        super().__init__()
        torch.manual_seed(1)
        p = init_params(L, C, T, V)
        self.names = list(p)
        self.params = torch.nn.ParameterList([torch.nn.Parameter(v) for v in p.values()])

    def forward(self, idx, targets, cfg):
        p = dict(zip(self.names, self.params))
        return forward(p, idx, targets, cfg)[1]


def run(rank, world, args, port, result):
    L, NH, C, T, B, V, _, steps = args
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = torch.nn.parallel.DistributedDataParallel(Gpt(L, C, T, V))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    cfg = {"layers": L, "heads": NH, "embed": C}
    g = torch.Generator().manual_seed(7)
    idx = torch.randint(0, min(V, 256), (B, T), generator=g)
    targets = torch.randint(0, min(V, 256), (B, T), generator=g)
    local = B // world
    idx, targets = idx[rank * local:(rank + 1) * local], targets[rank * local:(rank + 1) * local]
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = model(idx, targets, cfg)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        timed = times[1:] if len(times) > 1 else times
        result.put(B * T * len(timed) / sum(timed))
    dist.destroy_process_group()


def main():
    args = list(map(int, sys.argv[1:9]))
    world = args[6]
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=run, args=(r, world, args, port, result)) for r in range(world)]
    for p in procs:
        p.start()
    tokens = result.get()
    for p in procs:
        p.join()
    print(f"torch-ddp: {tokens:.0f} tokens/s ({world} gloo processes, torch {torch.__version__})")


if __name__ == "__main__":
    main()
